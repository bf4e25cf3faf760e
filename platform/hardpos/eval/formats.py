"""The benchmark formats HardPos reads, in one place: their files, how a path's format is told,
and a subset of items written back in the format it came in.

Every reader of benchmark files takes its formats from here: the evaluate stage's loaders
(:mod:`hardpos.eval.benchmarks`), the checks before a job starts
(:func:`hardpos.eval.benchmarks.check_benchmarks`), ``hardpos audit``
(:mod:`hardpos.audit.blind`) and ``hardpos debias``. The kinds are
:data:`hardpos.eval.spec.BENCHMARK_KINDS`.

What a path of each kind may be (:func:`subset_files`):

* ``replace``       the paper's release folder (``data/`` + ``swapped_data/``, each with
                    ``vl_checklist_{attributes,relations}.json``; positives from the swapped
                    files); or ONE half of it alone (a folder holding ``vl_checklist_*.json``,
                    e.g. ``swapped_data/``) or one such file: the file's ``true_caption``
                    against its ``false_caption``, no positives (in the swapped half the
                    "caption" is the paper's hard positive).
* ``swap``          ARO VG-Attribution: ``data/`` + ``swapped_data/`` with
                    ``visual_genome_attribution.json``; or one half, or the file alone (no positives).
* ``sugarcrepe``    a folder of the seven category files, or one category file.
* ``sugarcrepe_pp`` a folder of the five category files, or one category file.
* ``triplets``      a triplet file (parquet / jsonl), or webdataset / inline-image parquet shards.

:func:`detect_kind` tells them apart from the path (a ``.json`` file by its content).
:func:`write_subset` writes the items a selection kept in the same layout, so the evaluate
stage reads the result with the same kind, unchanged.
"""
from __future__ import annotations

import re
from collections.abc import Collection
from typing import Any

from hardpos import storage
from hardpos.data.triplets import TripletFileError, read_triplets, write_triplets
from hardpos.eval.items import BenchmarkError, read_json

REPLACE_SUBSETS = ("attributes", "relations")
SUGARCREPE_CATEGORIES = ("add_att", "add_obj", "replace_att", "replace_obj", "replace_rel", "swap_att", "swap_obj")
SUGARCREPE_PP_CATEGORIES = ("replace_att", "replace_obj", "replace_rel", "swap_att", "swap_obj")
SWAP_FILE = "visual_genome_attribution.json"
#: the file suffixes read as triplet files
TRIPLET_SUFFIXES = (".parquet", ".jsonl")


def replace_file(subset: str) -> str:
    """The REPLACE release's file name of a subset."""
    return f"vl_checklist_{subset}.json"


def subset_of_file(uri: str) -> str:
    """A benchmark file's subset: ``vl_checklist_attributes.json`` -> ``attributes``,
    ``replace_att.json`` -> ``replace_att`` (the file name without ``.json`` otherwise)."""
    stem = re.sub(r"\.json$", "", uri.rstrip("/").rsplit("/", 1)[-1], flags=re.IGNORECASE)
    return stem[len("vl_checklist_"):] if stem.startswith("vl_checklist_") else stem


# --------------------------------------------------------------------------- the files of a kind
def _half(path: str, names: Collection[str]) -> list[str]:
    """The files of ``names`` present directly in the folder ``path``."""
    return [n for n in names if storage.exists(storage.join(path, n))]


def subset_files(kind: str, path: str) -> list[tuple[str, str, str | None]]:
    """``(subset, file, paired file or None)`` for every file a benchmark of ``kind`` at ``path``
    reads, in the order its items are read. The paired file (REPLACE / SWAP ``swapped_data``)
    holds the hard positives; None: the benchmark has none. Raises :class:`BenchmarkError`
    when the path holds none of the kind's files (files that must exist but do not are named
    by the loader that opens them)."""
    is_file = path.lower().endswith(".json")
    if kind in ("replace", "swap"):
        names = [replace_file(s) for s in REPLACE_SUBSETS] if kind == "replace" else [SWAP_FILE]
        subset = (lambda n: subset_of_file(n)) if kind == "replace" else (lambda n: "swap")
        if is_file:
            return [(subset(path) if kind == "replace" else "swap", path, None)]
        if any(storage.exists(storage.join(path, "data", n)) for n in names):  # the release's two halves
            return [(subset(n), storage.join(path, "data", n), storage.join(path, "swapped_data", n)) for n in names]
        found = _half(path, names)
        if not found:
            raise BenchmarkError(f"{path}: no {' / '.join(names)} in it, nor in {path}/data/ "
                                 f"(a {kind} benchmark: the release folder, one half of it, or one file)")
        return [(subset(n), storage.join(path, n), None) for n in found]
    if kind in ("sugarcrepe", "sugarcrepe_pp"):
        if is_file:
            return [(subset_of_file(path), path, None)]
        cats = SUGARCREPE_CATEGORIES if kind == "sugarcrepe" else SUGARCREPE_PP_CATEGORIES
        return [(c, storage.join(path, f"{c}.json"), None) for c in cats]
    raise BenchmarkError(f"{kind!r} benchmarks are not read file by file")


# --------------------------------------------------------------------------- telling formats apart
def json_kind(doc: Any) -> str | None:
    """The benchmark kind of a parsed ``.json`` benchmark file, or None: a list of rows with
    ``true_caption`` / ``false_caption`` is REPLACE (SWAP when they carry ``bbox_x``), a list
    with ``caption2`` SugarCrepe++, ``{index: {caption, negative_caption}}`` SugarCrepe."""
    if isinstance(doc, list) and doc and isinstance(doc[0], dict):
        row = doc[0]
        if "true_caption" in row and "false_caption" in row:
            return "swap" if "bbox_x" in row else "replace"
        if "caption2" in row and "negative_caption" in row:
            return "sugarcrepe_pp"
        return None
    if isinstance(doc, dict) and doc:
        row = next(iter(doc.values()))
        if isinstance(row, dict) and "caption" in row and "negative_caption" in row:
            return "sugarcrepe"
    return None


def _json_file_kind(uri: str) -> str | None:
    try:
        return json_kind(storage.read_json(uri))
    except (storage.StorageError, FileNotFoundError):
        return None


def detect_kind(path: str) -> str | None:
    """The benchmark kind of ``path`` (local or s3://), or None when it is none of them.

    ``.parquet`` / ``.jsonl`` / ``.tar`` / a glob: ``triplets``; a ``.json`` file: by its
    content (:func:`json_kind`); a folder: the release layouts of :func:`subset_files`
    (``data/`` + ``swapped_data/``, one half, the category files), else a folder of triplet
    shards."""
    low = path.lower().rstrip("/")
    if low.endswith(TRIPLET_SUFFIXES + (".tar",)) or storage.has_glob(path):
        return "triplets"
    if low.endswith(".json"):
        return _json_file_kind(path)
    if not storage.exists(path):
        return None
    for kind, names in (("replace", [replace_file(s) for s in REPLACE_SUBSETS]), ("swap", [SWAP_FILE])):
        if any(storage.exists(storage.join(path, "data", n)) for n in names) or _half(path, names):
            return kind
    for cat in SUGARCREPE_CATEGORIES:  # a category file written empty says nothing: the next one
        uri = storage.join(path, f"{cat}.json")
        found = _json_file_kind(uri) if storage.exists(uri) else None
        if found:
            return found
    # lazy: a folder of shards is told by its files' layout, read through the inline reader's helpers
    from hardpos.eval.inline import is_inline_source

    try:
        return "triplets" if is_inline_source(path) else None
    except BenchmarkError:
        return None


# --------------------------------------------------------------------------- writing a subset back
def _out_name(kind: str, path: str, uri: str, out_dir: str) -> str:
    """Where ``uri`` (one of the files of the benchmark at ``path``) goes under ``out_dir``:
    its place relative to ``path`` (``data/x.json``), or its name for a single file."""
    if uri == path:
        return storage.join(out_dir, path.rstrip("/").rsplit("/", 1)[-1])
    rel = uri[len(path.rstrip("/")) + 1:]
    return storage.join(out_dir, rel)


def write_subset(kind: str, path: str, keep: Collection[str], out_dir: str) -> str:
    """Write the items of the benchmark at ``path`` whose item ids are in ``keep`` under
    ``out_dir``, in the input's own layout (file names, folders, row format; rows in their
    input order); returns the path to give the evaluate stage (with the same ``kind``).

    Item ids are the loaders' (``<subset>/<row>`` for REPLACE, ``swap/<row>``,
    ``<category>/<key>`` for SugarCrepe, ``<category>/<id>`` for SugarCrepe++, the row number
    for a triplet file). Raises :class:`BenchmarkError` for a kind that cannot be written
    (triplet shards)."""
    keep = set(keep)
    if kind == "triplets":
        if not path.lower().endswith(TRIPLET_SUFFIXES):
            raise BenchmarkError(f"{path}: only a triplet file (.parquet / .jsonl) can be written back as a subset, "
                                 "not shards")
        try:
            rows = read_triplets(path)
        except TripletFileError as exc:
            raise BenchmarkError(str(exc)) from exc
        out = _out_name(kind, path, path, out_dir)
        write_triplets([r for i, r in enumerate(rows) if str(i) in keep], out)
        return out
    files = subset_files(kind, path)
    for subset, uri, paired in files:
        for src in (uri, paired):
            if src is None:
                continue
            doc = read_json(src)
            if kind in ("replace", "swap"):
                kept: Any = [r for i, r in enumerate(doc) if f"{subset}/{i}" in keep]
            elif kind == "sugarcrepe":
                kept = {k: r for k, r in doc.items() if f"{subset}/{k}" in keep}
            else:
                kept = [r for r in doc if f"{subset}/{r['id']}" in keep]
            storage.write_json(_out_name(kind, path, src, out_dir), kept)
    return _out_name(kind, path, path, out_dir) if path.lower().endswith(".json") else out_dir
