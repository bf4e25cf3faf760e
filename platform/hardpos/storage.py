"""One storage layer for local paths and ``s3://`` URIs.

* Every S3 read, write, listing and delete goes through one stack: pyarrow's
  ``S3FileSystem`` (the AWS SDK's standard credential chain; its "standard" retry
  strategy for throttling and transient errors). Ray Data and Ray Train read the same
  filesystem objects (:func:`arrow_filesystem`; ``for_workers=True`` when it travels to
  processes that do not share the driver's environment). boto3 stays installed for
  MLflow alone: MLflow's S3 artifact repository is built on it.
* :func:`expand` is the one reading of "a file, a folder of files, or a glob" for every input.
* The S3 endpoint (MinIO, moto, ...) comes from ``$HARDPOS_S3_ENDPOINT_URL``, else the
  standard ``$AWS_ENDPOINT_URL_S3`` / ``$AWS_ENDPOINT_URL``; region from
  ``$AWS_REGION`` / ``$AWS_DEFAULT_REGION`` (default us-east-1).
* Missing keys raise :class:`FileNotFoundError`, missing buckets and refused access
  :class:`StorageError`, both naming the URI.
* :func:`worker_env` is the one place that decides what a Ray worker's ``runtime_env``
  gets from the driver: where things are (endpoints, region, caches, credential *files*),
  never a secret.

Nothing here touches the network at import time.
"""
from __future__ import annotations

import functools
import glob
import hashlib
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import urlparse


class StorageError(RuntimeError):
    """A storage operation failed for a reason other than a missing key."""


# --------------------------------------------------------------------------- worker environment
#: What Ray workers need to reach the same S3 endpoint, model caches and MLflow store as the
#: driver: locations and switches only. Credentials reach a worker through the standard AWS
#: chain on its node (an instance role, a mounted credentials file named by
#: ``AWS_SHARED_CREDENTIALS_FILE`` / ``AWS_PROFILE``, or the cluster's own environment),
#: never through ``runtime_env``, which the dashboard and job metadata show to anyone.
WORKER_ENV = ("HARDPOS_S3_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_REGION", "AWS_DEFAULT_REGION",
              "AWS_PROFILE", "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE", "AWS_CA_BUNDLE",
              "HF_HOME", "HF_HUB_CACHE", "HF_HUB_OFFLINE", "HF_ENDPOINT", "HARDPOS_CACHE_DIR")
TRACKING_ENV = ("MLFLOW_TRACKING_URI",)
#: Names that hold a secret (checked on every forwarded variable, whatever the allow-list says).
SECRET_NAME = re.compile(r"SECRET|TOKEN|PASSWORD|PASSWD|ACCESS_KEY|PRIVATE_KEY|API_KEY|_AUTH$", re.IGNORECASE)


def worker_env(include_tracking: bool = True) -> dict[str, str]:
    """The driver's environment variables a Ray worker gets (for ``runtime_env.env_vars``):
    :data:`WORKER_ENV` (plus ``MLFLOW_TRACKING_URI`` when ``include_tracking``) that are set,
    never a name matching :data:`SECRET_NAME`, nor a URI with a password in it."""
    names = WORKER_ENV + (TRACKING_ENV if include_tracking else ())
    env = {k: os.environ[k] for k in names if os.environ.get(k)}
    return {k: v for k, v in env.items() if not SECRET_NAME.search(k) and not _has_password(v)}


def _has_password(value: str) -> bool:
    parsed = urlparse(value) if "://" in value else None
    return bool(parsed and parsed.password)


# --------------------------------------------------------------------------- uris
def is_s3(uri: str | os.PathLike) -> bool:
    return str(uri).startswith("s3://")


def split_s3(uri: str) -> tuple[str, str]:
    """``s3://bucket/a/b`` -> ``("bucket", "a/b")``."""
    parsed = urlparse(str(uri))
    if parsed.scheme != "s3" or not parsed.netloc:
        raise StorageError(f"not an s3:// URI: {uri!r}")
    return parsed.netloc, parsed.path.lstrip("/")


def join(base: str | os.PathLike, *parts: str) -> str:
    """Join path parts under a local directory or an s3:// prefix."""
    base = str(base)
    if is_s3(base):
        out = base.rstrip("/")
        for part in parts:
            out = f"{out}/{str(part).strip('/')}"
        return out
    return str(Path(base, *parts))


def endpoint_url() -> str | None:
    return (
        os.environ.get("HARDPOS_S3_ENDPOINT_URL")
        or os.environ.get("AWS_ENDPOINT_URL_S3")
        or os.environ.get("AWS_ENDPOINT_URL")
        or None
    )


def region() -> str:
    return os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"


# --------------------------------------------------------------------------- filesystems
def _pafs():
    import pyarrow.fs  # lazy: pyarrow costs ~1 s, which `hardpos --help` or a local-only job need not pay

    return pyarrow.fs


def _s3_kwargs(*, with_keys: bool) -> dict[str, Any]:
    pafs = _pafs()

    kwargs: dict[str, Any] = {"region": region(), "connect_timeout": 10, "request_timeout": 60,
                              "retry_strategy": pafs.AwsStandardS3RetryStrategy(max_attempts=8)}
    endpoint = endpoint_url()
    if endpoint:
        parsed = urlparse(endpoint)
        kwargs["endpoint_override"] = parsed.netloc or endpoint
        kwargs["scheme"] = parsed.scheme or "https"
        if with_keys and os.environ.get("AWS_ACCESS_KEY_ID"):
            kwargs.update(access_key=os.environ["AWS_ACCESS_KEY_ID"],
                          secret_key=os.environ.get("AWS_SECRET_ACCESS_KEY"),
                          session_token=os.environ.get("AWS_SESSION_TOKEN"))
    return kwargs


@functools.lru_cache(maxsize=8)
def _s3_filesystem(endpoint: str | None, region_name: str):
    return _pafs().S3FileSystem(**_s3_kwargs(with_keys=False))


def s3_filesystem():
    """The driver's S3 filesystem for the configured endpoint and region (cached per endpoint)."""
    return _s3_filesystem(endpoint_url(), region())


def _s3_path(uri: str) -> str:
    bucket, key = split_s3(uri)
    return f"{bucket}/{key}".rstrip("/")


def _bucket_exists(bucket: str) -> bool:
    # only asked on the error path: a HEAD of a missing key answers 404 with no body, the
    # same whether the key or the whole bucket is missing
    pafs = _pafs()
    try:
        return s3_filesystem().get_file_info(bucket).type != pafs.FileType.NotFound
    except OSError:
        return True  # cannot tell: report the key as missing, the narrower claim


def _raise_for(exc: Exception, uri: str) -> None:
    """Re-raise a pyarrow S3 error as FileNotFoundError / StorageError naming ``uri``.

    pyarrow reports a missing key (or bucket) as FileNotFoundError and every other S3 failure
    as an OSError whose text carries the AWS error name (``NO_SUCH_BUCKET``, ``ACCESS_DENIED``...)."""
    if isinstance(exc, FileNotFoundError):
        if _bucket_exists(split_s3(uri)[0]):
            raise FileNotFoundError(f"no such object: {uri}") from exc
        raise StorageError(f"bucket does not exist: {uri} (NoSuchBucket)") from exc
    text = str(exc)
    if "NO_SUCH_BUCKET" in text or "NoSuchBucket" in text:
        raise StorageError(f"bucket does not exist: {uri} (NoSuchBucket)") from exc
    for code in ("ACCESS_DENIED", "AccessDenied", "INVALID_ACCESS_KEY_ID", "InvalidAccessKeyId",
                 "SIGNATURE_DOES_NOT_MATCH", "SignatureDoesNotMatch", "HTTP response code 403"):
        if code in text:
            raise StorageError(f"access denied to {uri}: check AWS credentials ({code})") from exc
    raise StorageError(f"S3 error on {uri}: {text}") from exc


def arrow_filesystem(uri: str, *, for_workers: bool = False) -> tuple[Any, str]:
    """(pyarrow filesystem, path inside it) for Ray Data / Ray Train ``storage_filesystem``.

    for_workers: the filesystem is pickled into Ray tasks and actors, which run in processes
        that did not inherit the driver's environment. With an S3 endpoint override
        (MinIO/moto-style setups) and credentials in the driver's environment it then carries
        them; on AWS proper nothing is embedded and each node's own credential chain is used.
    """
    pafs = _pafs()
    if is_s3(uri):
        fs = pafs.S3FileSystem(**_s3_kwargs(with_keys=True)) if for_workers else s3_filesystem()
        return fs, _s3_path(uri)
    return pafs.LocalFileSystem(), str(Path(uri).resolve())


def has_glob(uri: str) -> bool:
    """True when ``uri`` holds a glob character (``*``, ``?``, ``[``)."""
    return any(ch in uri for ch in "*?[")


def _glob_pattern(glob_uri: str) -> re.Pattern:
    """``glob_uri`` as a regex with the local glob's meaning: ``*`` and ``?`` stay inside one
    path segment, ``**`` spans segments (``**/`` also matches none), ``[...]`` is a class."""
    out, i = [], 0
    while i < len(glob_uri):
        if glob_uri.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif glob_uri.startswith("**", i):
            out.append(".*")
            i += 2
        elif glob_uri[i] == "*":
            out.append("[^/]*")
            i += 1
        elif glob_uri[i] == "?":
            out.append("[^/]")
            i += 1
        elif glob_uri[i] == "[" and "]" in glob_uri[i + 2:]:
            end = glob_uri.index("]", i + 2)
            body = glob_uri[i + 1:end]
            out.append("[" + ("^" + body[1:] if body.startswith("!") else body) + "]")
            i = end + 1
        else:
            out.append(re.escape(glob_uri[i]))
            i += 1
    return re.compile("".join(out))


def expand(uri: str | os.PathLike, suffixes: tuple[str, ...] = ()) -> list[str]:
    """The files ``uri`` names, sorted: the file itself; every file below a folder or prefix
    whose name ends in one of ``suffixes`` (case-insensitive; all files when empty); or a
    glob's matching files (``*`` within one folder, ``**`` across folders; the same on s3).

    Raises FileNotFoundError when ``uri`` (not a glob) does not exist. An empty result (a glob
    matching nothing, a folder without such files) is the caller's to name.
    """
    uri = str(uri)
    if has_glob(uri):
        if is_s3(uri):
            prefix = uri[:min(uri.index(ch) for ch in "*?[" if ch in uri)].rsplit("/", 1)[0]
            pattern = _glob_pattern(uri)
            return sorted(f for f in list_files(prefix) if pattern.fullmatch(f))
        return sorted(f for f in glob.glob(uri, recursive=True) if os.path.isfile(f))
    if is_s3(uri):
        below = list(list_files(uri.rstrip("/") + "/"))
        if not below:
            if not exists(uri):
                raise FileNotFoundError(f"not found: {uri}")
            return [uri]
    elif os.path.isfile(uri):
        return [uri]
    elif not os.path.isdir(uri):
        raise FileNotFoundError(f"not found: {uri}")
    else:
        below = list(list_files(uri))
    wanted = tuple(s.lower() for s in suffixes)
    return [f for f in below if not wanted or f.lower().endswith(wanted)]


# --------------------------------------------------------------------------- read / write
def read_bytes(uri: str | os.PathLike) -> bytes:
    uri = str(uri)
    if is_s3(uri):
        try:
            with s3_filesystem().open_input_stream(_s3_path(uri)) as stream:
                return stream.read()
        except OSError as exc:  # FileNotFoundError included: mapped to clear errors
            _raise_for(exc, uri)
    path = Path(uri)
    if not path.is_file():
        raise FileNotFoundError(f"no such file: {uri}")
    return path.read_bytes()


def write_bytes(uri: str | os.PathLike, data: bytes) -> str:
    """Write atomically (local: temp file + rename; S3 puts are atomic)."""
    uri = str(uri)
    if is_s3(uri):
        try:
            with s3_filesystem().open_output_stream(_s3_path(uri)) as stream:
                stream.write(data)
        except OSError as exc:
            _raise_for(exc, uri)
        return uri
    path = Path(uri)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return uri


def read_head(uri: str | os.PathLike, n: int) -> bytes:
    """The first ``n`` bytes of a file (fewer when it is shorter); on S3 one ranged GET."""
    uri = str(uri)
    if is_s3(uri):
        try:
            with s3_filesystem().open_input_file(_s3_path(uri)) as handle:
                return handle.read(n)
        except OSError as exc:
            _raise_for(exc, uri)
    with open(uri, "rb") as fh:
        return fh.read(n)


def delete(uri: str | os.PathLike) -> None:
    """Remove one file; a missing file is not an error."""
    uri = str(uri)
    if is_s3(uri):
        try:
            s3_filesystem().delete_file(_s3_path(uri))
        except FileNotFoundError:
            pass
        except OSError as exc:
            _raise_for(exc, uri)
        return
    try:
        os.remove(uri)
    except FileNotFoundError:
        pass


def upload_file(local_path: str | os.PathLike, uri: str) -> str:
    """Copy one local file to ``uri`` (local or s3://), streamed (a multipart upload on S3:
    the file is never whole in memory); returns ``uri``."""
    uri = str(uri)
    if not is_s3(uri):
        Path(uri).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(local_path, uri)
        return uri
    pafs = _pafs()
    try:
        pafs.copy_files(str(Path(local_path).resolve()), _s3_path(uri), source_filesystem=pafs.LocalFileSystem(),
                        destination_filesystem=s3_filesystem())
    except OSError as exc:
        _raise_for(exc, uri)
    return uri


def read_text(uri: str | os.PathLike, encoding: str = "utf-8") -> str:
    data = read_bytes(uri)
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as exc:
        raise StorageError(f"{uri}: not valid {encoding} text (byte {exc.start}: {data[exc.start:exc.start + 4]!r})") from exc


def write_text(uri: str | os.PathLike, text: str) -> str:
    return write_bytes(uri, text.encode("utf-8"))


def read_json(uri: str | os.PathLike) -> Any:
    text = read_text(uri)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise StorageError(f"{uri}: not valid JSON: {exc}") from exc


def write_json(uri: str | os.PathLike, obj: Any) -> str:
    return write_text(uri, json.dumps(obj, indent=2, sort_keys=False, default=_json_default) + "\n")


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "item"):  # numpy / torch scalars
        return obj.item()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def parse_jsonl(text: str, uri: str, error: type[Exception] = StorageError) -> list[dict]:
    """JSON-lines text -> one dict per non-blank line; ``error(message)`` names the bad line."""
    records = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise error(f"{uri}: line {n} is not JSON: {exc}") from exc
        if not isinstance(record, dict):
            raise error(f"{uri}: line {n} is not a JSON object")
        records.append(record)
    return records


def exists(uri: str | os.PathLike) -> bool:
    uri = str(uri)
    if is_s3(uri):
        pafs = _pafs()
        try:  # a key, or a prefix with objects below it (S3 has no folders)
            return s3_filesystem().get_file_info(_s3_path(uri)).type != pafs.FileType.NotFound
        except OSError as exc:
            _raise_for(exc, uri)
    return Path(uri).exists()


def list_files(uri: str | os.PathLike, suffix: str | None = None) -> Iterator[str]:
    """All files below a directory/prefix (recursive), as full URIs, sorted."""
    uri = str(uri)
    if is_s3(uri):
        pafs = _pafs()
        try:
            infos = s3_filesystem().get_file_info(pafs.FileSelector(_s3_path(uri), recursive=True, allow_not_found=True))
        except OSError as exc:
            _raise_for(exc, uri)
        out = [f"s3://{info.path}" for info in infos if info.type == pafs.FileType.File]
    else:
        root = Path(uri)
        out = [str(p) for p in root.rglob("*") if p.is_file()] if root.is_dir() else []
    return iter(sorted(u for u in out if suffix is None or u.endswith(suffix)))


def makedirs(uri: str | os.PathLike) -> None:
    """Create a local directory (S3 prefixes need nothing)."""
    if not is_s3(uri):
        Path(uri).mkdir(parents=True, exist_ok=True)


def upload_dir(local_dir: str | os.PathLike, uri: str) -> list[str]:
    """Copy a local directory tree to ``uri`` (local or s3://); returns written URIs."""
    local_dir = Path(local_dir)
    written = []
    for path in sorted(p for p in local_dir.rglob("*") if p.is_file()):
        rel = path.relative_to(local_dir).as_posix()
        written.append(upload_file(path, join(uri, rel)))
    return written


def download_dir(uri: str, local_dir: str | os.PathLike) -> Path:
    """Copy every file under ``uri`` into ``local_dir`` (keeps relative paths)."""
    local_dir = Path(local_dir)
    base = str(uri).rstrip("/")
    files = list(list_files(base))
    if not files:
        raise FileNotFoundError(f"nothing found under {uri}")
    for file_uri in files:
        rel = file_uri[len(base) + 1:]
        dest = local_dir / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(read_bytes(file_uri))
    return local_dir


def local_copy(uri: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> Path:
    """A local path for ``uri``: the path itself when local, else a cached download."""
    uri = str(uri)
    if not is_s3(uri):
        path = Path(uri)
        if not path.exists():
            raise FileNotFoundError(f"no such file: {uri}")
        return path
    cache = Path(cache_dir or os.environ.get("HARDPOS_CACHE_DIR") or Path(tempfile.gettempdir()) / "hardpos-cache")
    bucket, key = split_s3(uri)
    dest = cache / hashlib.sha1(uri.encode()).hexdigest()[:16] / Path(key).name
    if not dest.exists():
        data = read_bytes(uri)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(dest.name + f".tmp-{os.getpid()}")
        tmp.write_bytes(data)
        os.replace(tmp, dest)
    return dest
