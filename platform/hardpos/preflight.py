"""Cheap checks a stage runs before any heavy work, in order of cost.

A user's first mistakes (a missing or empty file, a wrong column, a dead server, weights that
cannot be fetched offline) should cost seconds and one line, not a minute of retries and three
tracebacks. Each check here raises :class:`hardpos.config.ConfigError` whose message names the
key, its value and the fix; the CLI prints it as one line and exits 2.

The order a stage's ``preflight(cfg)`` follows (cheapest first, so the first problem reported
is the one that costs nothing to find):

1. the config itself (already checked by the loader and the dataclasses' ``__post_init__``);
2. local / ``s3://`` inputs: they exist, are not empty, and their head has the expected schema
   (parquet footer, the first jsonl line, a COCO json's keys);
3. servers the stage will need: the MLflow tracking server (when ``tracking.required``), an
   S3 endpoint override, an LLM endpoint -- one TCP/HTTP probe each with a ~2 s timeout;
4. model weights: the architecture exists, a pretrained tag is known for it, and weights that
   are not in the local cache can be fetched (``HF_HUB_OFFLINE`` or a failed 2 s probe of the
   hub host means they cannot, reported at once instead of after the hub client's retries).
"""
from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any, Iterable, Sequence
from urllib.parse import urlparse

from hardpos import bases, storage, tracking
from hardpos.config import ConfigError, TrackingConfig

PROBE_TIMEOUT_S = 2.0
HUB_HOST = "huggingface.co"
TRUTHY = ("1", "true", "yes", "on")


def fail(key: str, value: Any, problem: str, fix: str) -> None:
    """Raise the one-line error every check uses: ``key=value: problem; fix``."""
    error = ConfigError(f"{key}={value}: {problem}; {fix}")
    error.key = key  # the message names it already; callers may still ask which key failed
    raise error


# --------------------------------------------------------------------------- 2. inputs
def input_files(key: str, value: str, *, suffixes: Sequence[str], what: str) -> list[str]:
    """The files ``value`` names (a file, a folder of ``suffixes`` files, or a glob).

    Missing path, a glob matching nothing or an empty folder are errors naming ``key``."""
    if not value:
        fail(key, repr(value), f"no {what} given", f"set {key}=<path>")
    path = str(value)
    try:
        files = storage.expand(path, tuple(suffixes))
    except FileNotFoundError:
        fail(key, value, f"{what} not found", "check the path, or create it first")
    if storage.has_glob(path) and not files:
        fail(key, value, "the glob matches no files", f"check the pattern, or point {key} at a file")
    if not files:
        fail(key, value, f"folder holds no {'/'.join(suffixes)} files", f"point {key} at a {what}")
    return files
    if not storage.exists(path):
        fail(key, value, f"{what} not found", f"check the path, or create it first")
    if storage.is_s3(path) or os.path.isfile(path):
        return [path]
    files = sorted(u for u in storage.list_files(path) if u.lower().endswith(tuple(suffixes)))
    if not files:
        fail(key, value, f"folder holds no {'/'.join(suffixes)} files", f"point {key} at a {what}")
    return files


def parquet_head(key: str, path: str) -> tuple[list[str], int]:
    """(column names, row count) of a parquet file from its footer; unreadable -> error."""
    # lazy: pyarrow.parquet only for parquet inputs
    import pyarrow.parquet as pq

    fs, fs_path = storage.arrow_filesystem(path)
    try:
        with fs.open_input_file(fs_path) as handle:
            meta = pq.ParquetFile(handle).metadata
            return list(meta.schema.names), meta.num_rows
    except Exception as exc:  # noqa: BLE001 - pyarrow raises several types for a corrupt file
        fail(key, path, f"not a readable parquet file ({str(exc).splitlines()[0][:120]})",
             "rewrite it, or point the key at another file")
    raise AssertionError("unreachable")


def jsonl_head(key: str, path: str) -> dict | None:
    """The first non-blank line of a jsonl file as a dict (None: the file has no rows)."""
    fs, fs_path = storage.arrow_filesystem(path)
    with fs.open_input_stream(fs_path) as handle:
        head = handle.read(1 << 20)
    for line in head.decode("utf-8", errors="replace").splitlines():
        if line.strip():
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                fail(key, path, f"first line is not JSON ({exc.msg})", "write one JSON object per line")
            if not isinstance(row, dict):
                fail(key, path, "first line is not a JSON object", "write one JSON object per line")
            return row
    return None


def check_table(key: str, value: str, *, columns: Sequence[Sequence[str]], what: str, allow_empty: bool = False,
                image_root: str | None = None, image_column: str | None = "image") -> None:
    """A parquet/jsonl input exists, has each column group of ``columns`` (one of each group),
    and rows unless ``allow_empty``; its first row's image path (when relative or local) exists.
    """
    files = input_files(key, value, suffixes=(".parquet", ".jsonl", ".json", ".tar"), what=what)
    if all(f.lower().endswith(".tar") for f in files):
        return  # webdataset shards: the reader checks their first sample's members
    names: list[str] = []
    rows, first = 0, None
    for f in files:
        if f.lower().endswith(".parquet"):
            names, n = parquet_head(key, f)
            rows += n
        elif f.lower().endswith((".jsonl", ".json")):
            row = jsonl_head(key, f)
            if row is not None:
                names, first = list(row), first or row
                rows += 1
        if rows and names:
            break
    if rows == 0:
        if allow_empty:
            return
        fail(key, value, f"{what} has no rows", f"give a non-empty {what}, or allow_empty=true to run on nothing")
    for group in columns:
        if not any(c in names for c in group):
            want = group[0] if len(group) == 1 else " or ".join(group)
            fail(key, value, f"lacks column {want!r} (has {names})", f"rename the column to {group[0]!r}")
    if image_column and image_column in names and first is None and files[0].lower().endswith(".parquet"):
        first = first_parquet_row(files[0], image_column)
    image = (first or {}).get(image_column) if image_column else None
    if isinstance(image, str) and image and "://" not in image:
        base = image_root or (os.path.dirname(os.path.abspath(files[0])) if not storage.is_s3(files[0]) else None)
        if base is not None and not storage.is_s3(base):
            resolved = image if os.path.isabs(image) else os.path.join(base, image)
            if not os.path.exists(resolved):
                fail(key, value, f"the first row's image {image!r} does not exist ({resolved})",
                     "set image_root to the folder the image paths are relative to, or fix the paths")


def first_parquet_row(path: str, column: str) -> dict:
    """The first row's ``column`` of a parquet file (one row group's column is read)."""
    # lazy: pyarrow.parquet only for parquet inputs
    import pyarrow.parquet as pq

    fs, fs_path = storage.arrow_filesystem(path)
    with fs.open_input_file(fs_path) as handle:
        pf = pq.ParquetFile(handle)
        if pf.metadata.num_row_groups == 0:
            return {}
        col = pf.read_row_group(0, columns=[column]).column(0)
        value = col[0].as_py() if len(col) else None
    return {column: value if isinstance(value, str) else None}


def check_coco(key: str, value: str) -> None:
    """A COCO-style json file has ``images`` and ``annotations``."""
    input_files(key, value, suffixes=(".json",), what="COCO json file")
    try:
        doc = json.loads(storage.read_text(value))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        fail(key, value, f"not JSON ({exc})", "give a COCO captions json file")
    missing = [k for k in ("images", "annotations") if not isinstance(doc, dict) or k not in doc]
    if missing:
        fail(key, value, f"lacks COCO key(s) {missing}", "give a COCO captions json (images + annotations)")


# --------------------------------------------------------------------------- 3. servers
def reachable(url: str, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """None when a TCP connection to ``url``'s host:port opens within ``timeout_s``, else why not."""
    parsed = urlparse(url if "://" in url else f"//{url}")
    host = parsed.hostname
    if not host:
        return "no host in the URL"
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return None
    except OSError as exc:
        return str(exc) or type(exc).__name__


def check_tracking(cfg: TrackingConfig, key: str = "tracking.tracking_uri") -> None:
    """A database tracking URI has its driver installed; a required, enabled http(s)
    tracking server answers (one probe, <= ~2 s)."""
    if not cfg.enabled:
        return
    uri = tracking.resolve_tracking_uri(cfg.tracking_uri)
    problem = tracking.missing_database_driver(uri)
    if problem is not None:
        fail(key, uri, problem[0], problem[1])
    if not cfg.required:
        return
    if not uri.startswith(("http://", "https://")):
        return
    problem = tracking.probe(uri, min(PROBE_TIMEOUT_S, cfg.request_timeout_s))
    if problem is not None:
        fail(key, uri, f"the MLflow tracking server does not answer ({problem})",
             "start it or fix the URI; tracking.required=false records the run locally for `hardpos track replay`, "
             "tracking.enabled=false turns tracking off")


def check_s3_endpoint(uris: Iterable[str | None]) -> None:
    """When any of ``uris`` is ``s3://`` and an endpoint override is set, it accepts connections."""
    if not any(u and storage.is_s3(u) for u in uris):
        return
    endpoint = storage.endpoint_url()
    if not endpoint:
        return
    problem = reachable(endpoint)
    if problem is not None:
        fail("HARDPOS_S3_ENDPOINT_URL", endpoint, f"the S3 endpoint does not answer ({problem})",
             "start it, or fix HARDPOS_S3_ENDPOINT_URL / AWS_ENDPOINT_URL")


def check_s3_inputs(checks: Iterable[tuple[str, str | None]]) -> None:
    """The S3 endpoint answers before the inputs of ``checks`` ((key, uri) pairs) are read."""
    check_s3_endpoint(u for _, u in checks)


def check_endpoint(key: str, url: str | None) -> None:
    """An HTTP(S) service (an LLM endpoint) accepts connections."""
    if not url:
        return
    problem = reachable(url)
    if problem is not None:
        fail(key, url, f"does not answer ({problem})", "start the server, or fix the URL")


# --------------------------------------------------------------------------- 4. weights
def hub_offline() -> bool:
    """True when the Hugging Face Hub cannot be reached: HF_HUB_OFFLINE is set, or one TCP
    probe of the hub host (``HF_ENDPOINT`` when set) fails within ``PROBE_TIMEOUT_S``."""
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in TRUTHY:
        return True
    return reachable(os.environ.get("HF_ENDPOINT") or f"https://{HUB_HOST}") is not None


def _cached(repo_file: tuple[str, str] | None, url: str | None) -> bool:
    """Whether open_clip would find these weights without the network."""
    if repo_file is not None:
        # lazy: huggingface_hub only to read its cache index
        from huggingface_hub import try_to_load_from_cache

        repo, filename = repo_file
        found = try_to_load_from_cache(repo, filename)
        if isinstance(found, str) and os.path.exists(found):
            return True
    if url:
        cache = Path(os.path.expanduser("~/.cache/clip"))
        return (cache / os.path.basename(urlparse(url).path)).exists()
    return False


def weights_message(arch: str, tag: str) -> str:
    """The one line for weights that cannot be fetched (shared with :mod:`hardpos.model`)."""
    return (f"could not fetch the {tag!r} weights of {arch}: no network? pass a local file, an s3:// checkpoint or "
            "an hf-hub: id in a local cache; HF_HUB_OFFLINE=1 makes this fail at once")


def check_model(key: str, arch: str, pretrained: str | None) -> None:
    """``arch`` is a known architecture; ``pretrained`` exists (a path / s3 object), is a tag of
    ``arch``, or an ``hf-hub:`` id -- and weights not in the local cache can be fetched."""
    # lazy: open_clip and hardpos.model import torch (seconds); only model-loading stages need them
    import open_clip
    from open_clip import pretrained as oc_pretrained

    from hardpos.model import HF_HUB_PREFIX, is_hf_hub, register_model_configs

    register_model_configs()
    if not is_hf_hub(arch) and arch not in open_clip.list_models() and not (pretrained and _is_checkpoint(pretrained)):
        close = [m for m in open_clip.list_models() if m.lower().startswith(arch.lower()[:5])][:6]
        fail(f"{key}.arch", arch, "unknown architecture",
             f"use one of open_clip.list_models() (e.g. {', '.join(close) or 'ViT-B-32, RN50'}), hardpos-tiny, "
             "or hf-hub:<org>/<name>")
    if not pretrained:
        return
    if pretrained.startswith(bases.SCHEME):
        try:
            bases.resolve(pretrained)
        except FileNotFoundError:
            fail(f"{key}.pretrained", pretrained, "no such shipped base",
                 f"use one of {bases.shipped() or '(none ship)'} (in {bases.BASES_DIR})")
        return
    if storage.is_s3(pretrained) or pretrained.startswith(("runs:/", "models:/")):
        return  # checked by the S3/tracking probes; the download itself names what is missing
    if is_hf_hub(pretrained):
        repo = pretrained[len(HF_HUB_PREFIX):]
        if not _cached((repo, "open_clip_config.json"), None) and hub_offline():
            fail(f"{key}.pretrained", pretrained, "not in the local Hugging Face cache and the hub cannot be reached",
                 "download it on a machine with network (HF_HOME is the cache), or pass a local file")
        return
    if "/" in pretrained or pretrained.endswith((".pt", ".pth", ".bin", ".safetensors")) or Path(pretrained).exists():
        if not Path(pretrained).expanduser().exists():
            fail(f"{key}.pretrained", pretrained, "no such file or folder", "pass an existing checkpoint path")
        return
    if is_hf_hub(arch):
        return  # the model module explains a tag given with an hf-hub: architecture
    cfg = oc_pretrained.get_pretrained_cfg(arch, pretrained)
    if not cfg:
        tags = oc_pretrained.list_pretrained_tags_by_model(arch)
        fail(f"{key}.pretrained", pretrained, f"not a pretrained tag of {arch}",
             f"use one of {tags or ['(none: pass a checkpoint path)']}")
    parts = (cfg.get("hf_hub") or "").rstrip("/").split("/")
    repo = "/".join(parts[:2]) if len(parts) >= 2 else None
    names = ["/".join(parts[2:])] if len(parts) > 2 else ["open_clip_model.safetensors", "open_clip_pytorch_model.bin"]
    if any(_cached((repo, n), None) for n in names if repo) or _cached(None, cfg.get("url")):
        return
    if hub_offline():
        error = ConfigError(f"{key}.pretrained={pretrained}: {weights_message(arch, pretrained)}")
        error.key = f"{key}.pretrained"
        raise error


def _is_checkpoint(pretrained: str) -> bool:
    """A local checkpoint folder or an hf-hub/MLflow/S3 source carries its own architecture."""
    return (pretrained.startswith(("hf-hub:", "runs:/", "models:/", bases.SCHEME)) or storage.is_s3(pretrained)
            or Path(pretrained).expanduser().is_dir())


# --------------------------------------------------------------------------- per stage
TRIPLET_COLUMNS = (("caption",), ("image", "image_bytes", "jpg", "png"))
BENCHMARK_TABLE_KINDS = ("triplets",)


def _tracking_of(cfg: Any) -> TrackingConfig | None:
    return getattr(cfg, "tracking", None)


def train(cfg: Any) -> None:
    """The train stage: triplet files, S3 endpoint, tracking server, then weights."""
    data = cfg.data
    check_s3_endpoint([data.train_path, data.val_path, cfg.model.pretrained, cfg.output_dir])
    check_table("data.train_path", data.train_path, columns=TRIPLET_COLUMNS, what="triplet file",
                allow_empty=cfg.allow_empty, image_root=data.image_root)
    if data.val_path:
        check_table("data.val_path", data.val_path, columns=TRIPLET_COLUMNS, what="triplet file",
                    allow_empty=True, image_root=data.image_root)
    for i, spec in enumerate(cfg.eval_benchmarks):
        benchmark(f"eval_benchmarks.{i}", spec, allow_empty=cfg.allow_empty)
    check_tracking(cfg.tracking)
    check_model("model", cfg.model.arch, cfg.model.pretrained)


def benchmark(key: str, spec: Any, allow_empty: bool) -> None:
    """One benchmark spec: its file exists, is not empty and has the kind's columns."""
    if not spec.path:
        return  # the stage names a missing path itself
    if spec.kind in BENCHMARK_TABLE_KINDS:
        check_table(f"{key}.path", spec.path, columns=(("caption",),), what=f"{spec.kind} benchmark file",
                    allow_empty=allow_empty, image_root=spec.image_root)
    elif not spec.path.startswith(("hf://", "http://", "https://")) and not storage.exists(spec.path):
        fail(f"{key}.path", spec.path, f"{spec.kind} benchmark not found", "check the path (a file or folder)")


def evaluate(cfg: Any) -> None:
    """The evaluate stage: benchmark files, servers, then the model's weights."""
    specs = list(cfg.benchmarks)
    check_s3_endpoint([s.path for s in specs] + [cfg.model.pretrained, cfg.world_dir, cfg.output_dir])
    if cfg.world_dir and not storage.exists(cfg.world_dir):
        fail("world_dir", cfg.world_dir, "world folder not found", "run `hardpos world` first, or fix the path")
    for spec in specs:
        benchmark(f"benchmarks.{spec.name}", spec, allow_empty=cfg.allow_empty)
    check_tracking(cfg.tracking)
    check_model("model", cfg.model.arch, cfg.model.pretrained)


def interpolate(cfg: Any) -> None:
    """The interpolate stage: like evaluate, for both endpoints of the mix."""
    check_s3_endpoint([s.path for s in cfg.benchmarks] + [cfg.base.pretrained, cfg.finetuned.pretrained, cfg.world_dir])
    if cfg.world_dir and not storage.exists(cfg.world_dir):
        fail("world_dir", cfg.world_dir, "world folder not found", "run `hardpos world` first, or fix the path")
    for spec in cfg.benchmarks:
        benchmark(f"benchmarks.{spec.name}", spec, allow_empty=cfg.allow_empty)
    check_tracking(cfg.tracking)
    check_model("base", cfg.base.arch, cfg.base.pretrained)
    check_model("finetuned", cfg.finetuned.arch, cfg.finetuned.pretrained)


def caption_rows_present(key: str, files: Sequence[str]) -> bool:
    """Whether any of the caption ``files`` holds a row (parquet footers, text heads, COCO json)."""
    for f in files:
        low = f.lower()
        if low.endswith(".parquet"):
            if parquet_head(key, f)[1] > 0:
                return True
        elif low.endswith(".json"):
            try:
                doc = json.loads(storage.read_text(f))
            except (json.JSONDecodeError, UnicodeDecodeError):
                return True  # the reader names the bad JSON itself
            rows = doc.get("annotations", doc) if isinstance(doc, dict) else doc
            if rows:
                return True
        else:
            fs, fs_path = storage.arrow_filesystem(f)
            with fs.open_input_stream(fs_path) as handle:
                text = handle.read(1 << 16).decode("utf-8", errors="replace")
            lines = [ln for ln in text.splitlines() if ln.strip()]
            if len(lines) > (1 if low.endswith((".tsv", ".csv")) else 0):  # a header alone is no row
                return True
    return False


def generate(cfg: Any) -> None:
    """The generate stage: the caption source (exists, formats, not empty), the LLM endpoint
    for engine.kind=http, the tracking server."""
    # lazy: the stage module imports Ray Data; only generate needs its source helpers
    from hardpos.data.captions import CaptionSourceError
    from hardpos.generate import source
    from hardpos.stages.generate import resolve_input

    check_s3_endpoint([cfg.input, cfg.output_dir])
    if not storage.exists(cfg.input) and not storage.has_glob(cfg.input):
        fail("input", cfg.input, "caption source not found", "check the path (a file, a folder, a glob or a world folder)")
    uri, _ = resolve_input(cfg)
    try:
        files = source.resolve_source(uri).files
    except (CaptionSourceError, FileNotFoundError, ValueError) as exc:
        fail("input", cfg.input, str(exc).splitlines()[0], "give jsonl/parquet/json/tsv/csv captions of one format")
    if not cfg.allow_empty and not caption_rows_present("input", files):
        fail("input", cfg.input, "the caption source has no captions",
             "give a non-empty file, or allow_empty=true to run on nothing")
    if cfg.engine.kind == "http":
        check_endpoint("engine.http.url", cfg.engine.http.url)
    check_tracking(cfg.tracking)


def sweep(cfg: Any) -> None:
    """The sweep stage: the trials' shared train config (file + overrides) loads, and its
    inputs and weights pass the train stage's checks; then the sweep's tracking server."""
    # lazy: the sweep stage module imports Ray Tune
    from hardpos.config import from_dict
    from hardpos.stages.sweep import base_train_dict
    from hardpos.train.config import TrainConfig

    base = from_dict(TrainConfig, base_train_dict(cfg))
    check_s3_endpoint([base.data.train_path, base.data.val_path, base.model.pretrained, cfg.output_dir])
    sweep_data(base, allow_empty=cfg.allow_empty)
    check_tracking(cfg.tracking)
    check_model("train_overrides.model", base.model.arch, base.model.pretrained)


def sweep_data(base: Any, allow_empty: bool = False) -> None:
    """What every trial of a sweep reads (its triplet files and per-epoch benchmarks), checked
    once by the sweep before the first trial instead of failing in each trial. ``base``: the
    trials' shared train config, its paths already absolute."""
    data = base.data
    check_table("train_overrides.data.train_path", data.train_path, columns=TRIPLET_COLUMNS, what="triplet file",
                allow_empty=allow_empty, image_root=data.image_root)
    if data.val_path:
        check_table("train_overrides.data.val_path", data.val_path, columns=TRIPLET_COLUMNS, what="triplet file",
                    allow_empty=True, image_root=data.image_root)
    for i, spec in enumerate(base.eval_benchmarks):
        benchmark(f"train_overrides.eval_benchmarks.{i}", spec, allow_empty=allow_empty)


def world(cfg: Any) -> None:
    """The world stage reads nothing: only the tracking server."""
    check_s3_endpoint([cfg.output_dir])
    check_tracking(cfg.tracking)


def audit(cfg: Any) -> None:
    """The audit stage: every source exists (its format and contents are read by the stage,
    before any classifier is fitted), then the tracking server."""
    paths = ([("input", cfg.input)] if cfg.input else []) + [(f"inputs.{i}.path", s.path) for i, s in enumerate(cfg.inputs)]
    check_s3_endpoint([p for _, p in paths] + [cfg.output_dir])
    for key, path in paths:
        if path and not storage.exists(path):
            fail(key, path, "source not found", "give a triplet file, a caption file with negatives or a benchmark folder")
    check_tracking(cfg.tracking)


STAGES = {"train": train, "evaluate": evaluate, "interpolate": interpolate, "generate": generate, "world": world,
          "sweep": sweep, "audit": audit}


def run_checks(stage: str, cfg: Any) -> None:
    """The stage's checks (see the module doc); stages without a table entry get the tracking
    probe only. Raises :class:`ConfigError` with one line naming key, value and fix."""
    check = STAGES.get(stage)
    if check is not None:
        check(cfg)
    elif _tracking_of(cfg) is not None:
        check_tracking(_tracking_of(cfg))
