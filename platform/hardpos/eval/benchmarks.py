"""Benchmark loaders: every format becomes one :class:`Benchmark` of scored items.

An item is one image (optionally cropped to a box) with a true caption, a hard negative
and, where the benchmark has one, a hard positive. Loaders only read annotation files;
images are opened later by the evaluator (which counts missing/corrupt ones).

Formats (``BenchmarkSpec.kind``; what a path of each may be, one file or half of a release
included, is :mod:`hardpos.eval.formats`, the one list of formats):

* ``replace``    the paper's release: ``<path>/data/vl_checklist_{attributes,relations}.json``
                 paired row by row with ``<path>/swapped_data/...`` (same image and hard
                 negative; the swapped file's ``true_caption`` is the hard positive). Every
                 row's ``image_id``, ``false_caption`` and ``image_path`` must agree, else
                 :class:`BenchmarkError`. Subsets ``attributes`` and ``relations``; the
                 benchmark's figures are their unweighted mean. One half alone (or one file)
                 has no positives.
* ``swap``       ARO VG-Attribution: ``<path>/data/visual_genome_attribution.json`` paired
                 with ``<path>/swapped_data/visual_genome_attribution.json`` (fields
                 ``image_path, bbox_x, bbox_y, bbox_w, bbox_h, true_caption, false_caption,
                 attributes``); the image is cropped to the box. One subset, ``swap``.
* ``sugarcrepe`` ``<path>/{add_att,add_obj,replace_att,replace_obj,replace_rel,swap_att,
                 swap_obj}.json`` (``{index: {filename, caption, negative_caption}}``), or one
                 of them; no positives; subsets are the categories, figures their unweighted mean.
* ``sugarcrepe_pp`` SugarCrepe++: ``<path>/{replace_att,replace_obj,replace_rel,swap_att,
                 swap_obj}.json`` (lists of ``{id, filename, caption, caption2,
                 negative_caption}``), or one of them; ``caption2`` (a paraphrase) is the hard
                 positive; loader and text-only metric in :mod:`hardpos.eval.sugarcrepe_pp`.
* ``triplets``   a triplet file (the triplet row contract; parquet or jsonl): ``image, caption,
                 hard_negative, hard_positive`` (+ optional ``subset``, else ``kind``, used as the subset,
                 optional ``bbox`` ``[x, y, w, h]``), read by
                 :func:`hardpos.data.triplets.read_triplets`. Item ids are row numbers.
                 Rows without a hard negative cannot be scored and are rejected (listed,
                 with a reason); a null positive is allowed (the item counts for
                 orig_acc and the s_c/s_n means only).
                 Also webdataset ``.tar`` shards and parquet with the image bytes inline
                 (a file, folder or glob; read by Ray Data, images cached to files:
                 :mod:`hardpos.eval.inline`).

Relative image paths resolve against ``spec.image_root`` or, when that is None, the
benchmark file's folder (``<path>`` for folder kinds).

``spec.limit`` keeps the first N items *of every subset* for REPLACE (N attributes + N
relations) and SugarCrepe (N per category), so a quick run still covers every subset; the
first N items overall for SWAP and triplet files.
"""
from __future__ import annotations

from typing import Any

from hardpos import preflight, storage
from hardpos.data.triplets import TripletFileError, read_triplets, resolve_image
from hardpos.eval import sugarcrepe_pp
from hardpos.eval.formats import subset_files
from hardpos.eval.items import Benchmark, BenchmarkError, Item, image_root_of, read_json
from hardpos.eval.spec import BENCHMARK_KINDS, TABLE_KINDS, BenchmarkSpec

# --------------------------------------------------------------------------- helpers
def _require(row: Any, fields: tuple[str, ...], uri: str, index: int) -> None:
    if not isinstance(row, dict):
        raise BenchmarkError(f"{uri} row {index}: expected an object, got {type(row).__name__}")
    missing = [f for f in fields if f not in row]
    if missing:
        raise BenchmarkError(f"{uri} row {index}: missing field(s) {', '.join(missing)}")


def _limit(items: list[Item], limit: int | None) -> list[Item]:
    return items if limit is None else items[:limit]


# --------------------------------------------------------------------------- REPLACE / SWAP
def pair_rows(orig: list, swapped: list, *, keys: tuple[str, ...], orig_uri: str, swapped_uri: str) -> None:
    """Fail loudly unless ``swapped`` is ``orig`` row by row on ``keys`` (the paper's pairing)."""
    if not isinstance(orig, list) or not isinstance(swapped, list):
        raise BenchmarkError(f"{orig_uri} / {swapped_uri}: expected JSON lists of rows")
    if len(orig) != len(swapped):
        raise BenchmarkError(f"{orig_uri} has {len(orig)} rows but {swapped_uri} has {len(swapped)}: not a row-by-row pair")
    for i, (a, b) in enumerate(zip(orig, swapped)):
        _require(a, keys + ("true_caption",), orig_uri, i)
        _require(b, keys + ("true_caption",), swapped_uri, i)
        for key in keys:
            if a[key] != b[key]:
                raise BenchmarkError(
                    f"pairing mismatch at row {i}: {key} is {a[key]!r} in {orig_uri} but {b[key]!r} in {swapped_uri}"
                )


def _folder(spec: BenchmarkSpec) -> str:
    """The folder a benchmark's relative image paths default to: ``spec.path``, or the folder
    of a single file."""
    if spec.path.lower().endswith(".json"):
        return spec.path.rsplit("/", 1)[0] if "/" in spec.path else "."
    return spec.path


def _release_rows(spec: BenchmarkSpec, keys: tuple[str, ...]) -> list[tuple[str, list, list | None]]:
    """(subset, rows, paired swapped rows or None) of a REPLACE / SWAP path: the release's two
    halves checked row by row (:func:`pair_rows`), or one half / one file alone."""
    out = []
    for subset, o_uri, s_uri in subset_files(spec.kind, spec.path):
        orig = read_json(o_uri)
        if s_uri is None:
            if not isinstance(orig, list):
                raise BenchmarkError(f"{o_uri}: expected a JSON list of rows")
            for i, row in enumerate(orig):
                _require(row, keys + ("true_caption",), o_uri, i)
            out.append((subset, orig, None))
            continue
        swapped = read_json(s_uri)
        pair_rows(orig, swapped, keys=keys, orig_uri=o_uri, swapped_uri=s_uri)
        out.append((subset, orig, swapped))
    return out


def load_replace(spec: BenchmarkSpec) -> Benchmark:
    items: list[Item] = []
    root = image_root_of(spec, _folder(spec))
    halves = _release_rows(spec, ("image_id", "false_caption", "image_path"))
    for subset, orig, swapped in halves:
        rows = orig if spec.limit is None else orig[: spec.limit]
        for i, a in enumerate(rows):
            items.append(Item(f"{subset}/{i}", subset, resolve_image(a["image_path"], root),
                              a["true_caption"], a["false_caption"], swapped[i]["true_caption"] if swapped else None))
    has_pos = any(s is not None for _, _, s in halves)
    return Benchmark(spec.name, "replace", items, aggregate="mean_of_subsets", has_positives=has_pos)


def load_swap(spec: BenchmarkSpec) -> Benchmark:
    box = ("bbox_x", "bbox_y", "bbox_w", "bbox_h")
    ((_, orig, swapped),) = _release_rows(spec, ("image_path", "false_caption") + box)
    root = image_root_of(spec, _folder(spec))
    items = []
    for i, a in enumerate(orig):
        crop = tuple(float(a[k]) for k in box)
        if crop[2] <= 0 or crop[3] <= 0:
            raise BenchmarkError(f"{spec.path} row {i}: empty bounding box {crop}")
        items.append(Item(f"swap/{i}", "swap", resolve_image(a["image_path"], root),
                          a["true_caption"], a["false_caption"], swapped[i]["true_caption"] if swapped else None,
                          crop))  # type: ignore[arg-type]
    return Benchmark(spec.name, "swap", _limit(items, spec.limit), has_positives=swapped is not None)


# --------------------------------------------------------------------------- SugarCrepe
def load_sugarcrepe(spec: BenchmarkSpec) -> Benchmark:
    items: list[Item] = []
    root = image_root_of(spec, _folder(spec))
    for cat, uri, _ in subset_files("sugarcrepe", spec.path):
        data = read_json(uri)
        if not isinstance(data, dict):
            raise BenchmarkError(f"{uri}: expected {{index: {{filename, caption, negative_caption}}}}")
        rows = list(data.items()) if spec.limit is None else list(data.items())[: spec.limit]
        for key, row in rows:
            _require(row, ("filename", "caption", "negative_caption"), uri, key)
            items.append(Item(f"{cat}/{key}", cat, resolve_image(row["filename"], root),
                              row["caption"], row["negative_caption"], None))
    return Benchmark(spec.name, "sugarcrepe", items, aggregate="mean_of_subsets", has_positives=False)


# --------------------------------------------------------------------------- triplet files
def read_triplet_rows(uri: str) -> list[dict[str, Any]]:
    """Rows of a parquet or jsonl triplet file (local or s3://), read by the platform's one
    triplet reader (:func:`hardpos.data.triplets.read_triplets`)."""
    try:
        return read_triplets(uri)
    except TripletFileError as exc:
        raise BenchmarkError(str(exc)) from exc


def load_triplets(spec: BenchmarkSpec) -> Benchmark:
    # lazy: hardpos.eval.inline reads through Ray Data (seconds to import), which only webdataset
    # shards and inline-image parquet need
    from hardpos.eval.inline import is_inline_source, load_inline_triplets

    if is_inline_source(spec.path):  # webdataset shards / parquet with image bytes
        return load_inline_triplets(spec)
    rows = read_triplet_rows(spec.path)
    base = spec.path.rsplit("/", 1)[0] if "/" in spec.path else "."
    items, rejected = [], []
    for i, row in enumerate(rows):
        reason = None
        if not row.get("image"):
            reason = "no_image"
        elif not row.get("caption"):
            reason = "no_caption"
        elif not row.get("hard_negative"):
            reason = "no_negative"
        if reason:
            rejected.append({"row": i, "reason": reason, "caption": row.get("caption")})
            continue
        bbox = row.get("bbox")
        crop = tuple(float(v) for v in bbox) if bbox else None
        # the subset: a ``subset`` column (the world's replace_attribute / replace_relation / swap), else the kind
        subset = row.get("subset") or row.get("kind") or "all"
        items.append(Item(str(i), str(subset), resolve_image(row["image"], base, spec.image_root),
                          row["caption"], row["hard_negative"], row.get("hard_positive") or None, crop))  # type: ignore[arg-type]
    has_pos = any(it.positive is not None for it in items)
    return Benchmark(spec.name, "triplets", _limit(items, spec.limit), has_positives=has_pos, rejected=rejected)


LOADERS = {"replace": load_replace, "swap": load_swap, "sugarcrepe": load_sugarcrepe, "sugarcrepe_pp": sugarcrepe_pp.load,
           "triplets": load_triplets}
assert set(LOADERS) == set(BENCHMARK_KINDS)


def load_benchmark(spec: BenchmarkSpec) -> Benchmark:
    """Load ``spec`` into items (no images are opened). Raises :class:`BenchmarkError`."""
    if spec.kind not in LOADERS:
        raise BenchmarkError(f"benchmark {spec.name!r}: unknown kind {spec.kind!r}; kinds: {', '.join(LOADERS)}")
    if not spec.path:
        raise BenchmarkError(f"benchmark {spec.name!r}: path is empty")
    if spec.limit is not None and spec.limit < 0:
        raise BenchmarkError(f"benchmark {spec.name!r}: limit must be >= 0")
    bench = LOADERS[spec.kind](spec)
    ids = [it.item_id for it in bench.items]
    if len(set(ids)) != len(ids):
        raise BenchmarkError(f"benchmark {spec.name!r}: item ids are not unique")
    return bench


# --------------------------------------------------------------------------- before a job starts
def check_spec(key: str, spec: BenchmarkSpec, allow_empty: bool) -> None:
    """One benchmark spec, before any work (``key``: its config key, for the message): a
    table kind's file exists, is not empty and has a caption column; any other kind's file or
    folder exists. Raises :class:`hardpos.config.ConfigError` (through :mod:`hardpos.preflight`)."""
    if not spec.path:
        return  # the stage names a missing path itself
    if spec.kind in TABLE_KINDS:
        preflight.check_table(f"{key}.path", spec.path, columns=(("caption",),), what=f"{spec.kind} benchmark file",
                              allow_empty=allow_empty, image_root=spec.image_root)
    elif not spec.path.startswith(("hf://", "http://", "https://")) and not storage.exists(spec.path):
        preflight.fail(f"{key}.path", spec.path, f"{spec.kind} benchmark not found", "check the path (a file or folder)")


def check_benchmarks(specs: list[BenchmarkSpec], world_dir: str | None, allow_empty: bool) -> None:
    """The benchmarks a model is scored on (the evaluate and interpolate stages): the world
    folder exists, and each benchmark passes :func:`check_spec`."""
    if world_dir and not storage.exists(world_dir):
        preflight.fail("world_dir", world_dir, "world folder not found", "run `hardpos world` first, or fix the path")
    for spec in specs:
        check_spec(f"benchmarks.{spec.name}", spec, allow_empty=allow_empty)
