"""The checks stages share, run before any heavy work, in order of cost.

A user's first mistakes (a missing or empty file, a wrong column, a dead server, weights that
cannot be fetched offline) should cost seconds and one line, not a minute of retries and three
tracebacks. Each check here raises :class:`hardpos.config.ConfigError` whose message names the
key, its value and the fix (:func:`fail`); the CLI prints it as one line and exits 2.

Each stage composes them in its own ``check(cfg)`` (``hardpos/stages/<stage>.py``), which
:func:`hardpos.runtime.execute` calls before anything is started or written, cheapest first
(so the first problem reported is the one that costs nothing to find):

1. the config itself (already checked by the loader and the dataclasses' ``__post_init__``);
2. local / ``s3://`` inputs: they exist, are not empty, and their head has the expected schema
   (parquet footer, the first jsonl line, the first rows' image paths): here;
3. servers the stage will need: an S3 endpoint override, an LLM endpoint (here), the MLflow
   tracking server (:func:`hardpos.tracking.check_tracking`) -- one TCP/HTTP probe each with a
   ~2 s timeout;
4. model weights: the architecture exists, a pretrained tag is known for it, and weights that
   are not in the local cache can be fetched (:func:`hardpos.models.weights.check_model`).
"""
from __future__ import annotations

import json
import os
import socket
from typing import Any, Iterable, Sequence
from urllib.parse import urlparse

from hardpos import storage
from hardpos.config import ConfigError

PROBE_TIMEOUT_S = 2.0


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
    and rows unless ``allow_empty``; and when its first rows name local images, at least one of
    them exists: a wrong ``image_root`` misses them all, while a file with a few missing or
    corrupt images (which the readers count and skip) passes.
    """
    files = input_files(key, value, suffixes=(".parquet", ".jsonl", ".json", ".tar"), what=what)
    if all(f.lower().endswith(".tar") for f in files):
        return  # webdataset shards: the reader checks their first sample's members
    names: list[str] = []
    rows = 0
    for f in files:
        if f.lower().endswith(".parquet"):
            names, n = parquet_head(key, f)
            rows += n
        elif f.lower().endswith((".jsonl", ".json")):
            row = jsonl_head(key, f)
            if row is not None:
                names = list(row)
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
    if not image_column or image_column not in names:
        return
    base = image_root or (os.path.dirname(os.path.abspath(files[0])) if not storage.is_s3(files[0]) else None)
    if base is None or storage.is_s3(base):
        return
    local = [im for im in head_images(files[0], image_column) if "://" not in im]
    resolved = [im if os.path.isabs(im) else os.path.join(base, im) for im in local]
    if resolved and not any(os.path.exists(r) for r in resolved):
        fail(key, value, f"none of the first {len(resolved)} rows' images exist (e.g. {local[0]!r}: {resolved[0]})",
             "set image_root to the folder the image paths are relative to, or fix the paths")


#: how many leading rows' image paths :func:`check_table` looks at
IMAGE_SAMPLE = 16


def head_images(path: str, column: str, n: int = IMAGE_SAMPLE) -> list[str]:
    """The non-empty string values of ``column`` in the first ``n`` rows of a parquet or jsonl file."""
    if path.lower().endswith(".parquet"):
        # lazy: pyarrow.parquet only for parquet inputs
        import pyarrow.parquet as pq

        fs, fs_path = storage.arrow_filesystem(path)
        with fs.open_input_file(fs_path) as handle:
            pf = pq.ParquetFile(handle)
            if pf.metadata.num_row_groups == 0:
                return []
            values = pf.read_row_group(0, columns=[column]).column(0).slice(0, n).to_pylist()
    else:
        fs, fs_path = storage.arrow_filesystem(path)
        with fs.open_input_stream(fs_path) as handle:
            head = handle.read(1 << 20).decode("utf-8", errors="replace")
        values = []
        for line in head.splitlines():
            if line.strip() and len(values) < n:
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    break  # a line cut by the 1 MB head, or bad JSON: the reader names it
                values.append(row.get(column) if isinstance(row, dict) else None)
    return [v for v in values if isinstance(v, str) and v]


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


def check_endpoint(key: str, url: str | None) -> None:
    """An HTTP(S) service (an LLM endpoint) accepts connections."""
    if not url:
        return
    problem = reachable(url)
    if problem is not None:
        fail(key, url, f"does not answer ({problem})", "start the server, or fix the URL")


# --------------------------------------------------------------------------- shared by stages
TRIPLET_COLUMNS = (("caption",), ("image", "image_bytes", "jpg", "png"))


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
