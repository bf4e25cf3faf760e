"""The training input pipeline: triplet files -> Ray Dataset -> model-ready batches.

Driver side (:func:`build_datasets`):
    read parquet/jsonl (local or s3://, via ``storage.arrow_filesystem``) -> check columns
    -> deterministic train/val split by a hash of the image path (so a resumed run, and
    every caption of one image, always land on the same side) -> ``map_batches``
    (:class:`Preprocess`): decode + open_clip preprocessing + tokenisation on CPU in Ray
    Data tasks.  Ray Train's default ``DataConfig`` then hands each worker an equal shard
    (``streaming_split(equal=True)``).

Each row's caption, hard negative and hard positive are tokenised once, together, in the
Ray Data task (full context length, int32); the training worker only trims the padding
columns of its batch (:func:`to_model_batch`).

Bad rows never crash a run and are never lost silently: an image that is missing, not
decodable, or a row without an image/caption comes out with ``ok=False`` and its reason
in ``error``; the worker masks it out of the loss (``row_mask``) and counts it
(``data/skipped_rows``, reported per epoch).
"""
from __future__ import annotations

import dataclasses
import io
import os
import zlib
from typing import Any, Callable

import numpy as np

from hardpos.config import require

REQUIRED_COLUMNS = ("image", "caption")
TEXT_COLUMNS = ("caption", "hard_negative", "hard_positive")


class DataError(ValueError):
    """A training data source is missing, unreadable, or lacks required columns."""


@dataclasses.dataclass
class DataConfig:
    """Where the triplets come from and how they are split and shuffled.

    train_path: triplet file (.parquet / .jsonl) or a folder of parquet files; local or s3://.
    val_path: a separate validation triplet file; None -> hold out ``val_fraction`` of
        ``train_path`` (by a stable hash of the image path).
    val_fraction: share of ``train_path`` held out for the per-epoch validation loss when
        ``val_path`` is None (0 disables validation).
    image_root: folder relative image paths are resolved against (None: the triplet
        file's own folder).
    limit: use only the first N rows of ``train_path`` (None: all); for smoke runs.
    shuffle_buffer: rows in each worker's local shuffle buffer (0: no shuffling).
    decode_cpus: CPUs each Ray Data decode/preprocess task asks for; None: 1, or the CPUs
        the training workers (and a sweep's trial driver) leave free when that is less, so
        a decode task can always be scheduled (see ``hardpos.train.trainer.decode_task_cpus``).
    """

    train_path: str = "outputs/world/finetune.parquet"
    val_path: str | None = None
    val_fraction: float = 0.05
    image_root: str | None = None
    limit: int | None = None
    shuffle_buffer: int = 512
    decode_cpus: float | None = None

    def __post_init__(self) -> None:
        require(self.decode_cpus is None or self.decode_cpus > 0, "decode_cpus",
                "must be > 0 (or null for automatic)", self.decode_cpus)
        require(0.0 <= self.val_fraction < 1.0, "val_fraction", "must be in [0, 1)", self.val_fraction)
        require(self.shuffle_buffer >= 0, "shuffle_buffer", "must be >= 0", self.shuffle_buffer)


# --------------------------------------------------------------------------- reading
def _base_dir(path: str) -> str:
    """The folder relative image paths of ``path`` are resolved against."""
    from hardpos import storage

    p = path.rstrip("/")
    if p.lower().endswith((".parquet", ".jsonl", ".json")):
        return p.rsplit("/", 1)[0] if storage.is_s3(p) else os.path.dirname(os.path.abspath(p))
    return p if storage.is_s3(p) else os.path.abspath(p)


def worker_filesystem(uri: str) -> tuple[Any, str]:
    """``storage.arrow_filesystem`` for use inside Ray tasks/actors.

    With an S3 endpoint override (MinIO/moto-style dev setups) and credentials in the
    driver's environment, the filesystem carries them explicitly: Ray Data read tasks and
    Ray Train's controller run in processes that did not inherit the driver's environment.
    On AWS proper, nothing is embedded and each node's own credential chain is used.
    """
    from urllib.parse import urlparse

    from hardpos import storage

    fs, path = storage.arrow_filesystem(uri)
    key = os.environ.get("AWS_ACCESS_KEY_ID")
    if storage.is_s3(uri) and storage.endpoint_url() and key:
        import pyarrow.fs as pafs

        endpoint = urlparse(storage.endpoint_url() or "")
        fs = pafs.S3FileSystem(access_key=key, secret_key=os.environ.get("AWS_SECRET_ACCESS_KEY"),
                               session_token=os.environ.get("AWS_SESSION_TOKEN"), region=storage.region(),
                               endpoint_override=endpoint.netloc or None, scheme=endpoint.scheme or "https")
    return fs, path


def read_triplets_dataset(path: str, *, limit: int | None = None):
    """A Ray Dataset of triplet rows (columns checked; missing N/P columns become null)."""
    import ray.data

    from hardpos import storage

    if not storage.exists(path):
        raise DataError(f"training data not found: {path} (for the embedded default, run `hardpos world` first)")
    fs, fs_path = worker_filesystem(path)
    low = path.lower().rstrip("/")
    try:
        if low.endswith((".jsonl", ".json")):
            ds = ray.data.read_json(fs_path, filesystem=fs)
        else:
            ds = ray.data.read_parquet(fs_path, filesystem=fs)
        columns = ds.columns() or []
    except Exception as exc:  # noqa: BLE001 - pyarrow/Ray raise many types
        raise DataError(f"{path}: not a readable triplet file: {exc}") from exc
    missing = [c for c in REQUIRED_COLUMNS if c not in columns]
    if missing:
        raise DataError(f"{path}: lacks column(s) {missing}; has {columns}")
    if limit is not None:
        ds = ds.limit(limit)
    keep = [c for c in (*TEXT_COLUMNS, "image") if c in columns]
    ds = ds.select_columns(keep)
    for col in TEXT_COLUMNS:
        if col not in columns:  # e.g. an HN-only file: every row lacks a positive
            ds = ds.add_column(col, lambda df: [None] * len(df), batch_format="pandas")
    return ds


def split_of(image: Any, val_fraction: float) -> bool:
    """True when the row belongs to the validation split (stable across runs and hosts)."""
    if val_fraction <= 0:
        return False
    h = zlib.crc32(str(image).encode("utf-8")) / 2**32
    return h < val_fraction


# --------------------------------------------------------------------------- preprocessing
def _clean_text(value: Any) -> str | None:
    if value is None or (isinstance(value, float) and value != value):
        return None
    text = str(value)
    return text if text.strip() else None


def load_image(uri: str):
    """A decoded RGB PIL image from a local path or s3:// URI (raises on any failure)."""
    from PIL import Image

    from hardpos import storage

    data = storage.read_bytes(uri)
    img = Image.open(io.BytesIO(data))
    img.load()
    return img.convert("RGB")


class Preprocess:
    """Ray Data batch UDF: decode + preprocess images, tokenise the three texts.

    Output columns (numpy): ``image`` float32 [b, 3, H, W]; ``text_tokens``,
    ``neg_tokens``, ``pos_tokens`` int32 [b, context]; ``has_neg``, ``has_pos``, ``ok``
    bool [b]; ``error`` str ("" when ok).  Rows that fail keep their slot with ``ok=False``.
    """

    def __init__(self, preprocess: Callable, tokenizer: Callable, image_size: int, base_dir: str,
                 image_root: str | None = None) -> None:
        self.preprocess = preprocess
        self.tokenizer = tokenizer
        self.image_size = image_size
        self.base_dir = base_dir
        self.image_root = image_root

    def _resolve(self, image: str) -> str:
        from hardpos.data.triplets import resolve_image

        return resolve_image(image, self.base_dir, self.image_root)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        import torch

        n = len(batch["caption"])
        images = np.zeros((n, 3, self.image_size, self.image_size), dtype=np.float32)
        ok = np.ones(n, dtype=bool)
        errors = [""] * n
        captions = [_clean_text(c) for c in batch["caption"]]
        negs = [_clean_text(c) for c in batch["hard_negative"]]
        poss = [_clean_text(c) for c in batch["hard_positive"]]
        for i, image in enumerate(batch["image"]):
            if captions[i] is None:
                ok[i], errors[i] = False, "no caption"
                continue
            try:
                if _clean_text(image) is None:
                    raise ValueError("no image path")
                pixels = self.preprocess(load_image(self._resolve(str(image))))
                images[i] = pixels.numpy() if isinstance(pixels, torch.Tensor) else np.asarray(pixels)
            except Exception as exc:  # noqa: BLE001 - any bad image is a counted skip, never a crash
                ok[i], errors[i] = False, f"image {image!r}: {type(exc).__name__}: {exc}"[:300]
        # One tokenizer call for all three texts of every row (missing ones as "").
        tokens = self.tokenizer([t or "" for t in captions + negs + poss]).numpy().astype(np.int32)
        return {
            "image": images,
            "text_tokens": tokens[:n],
            "neg_tokens": tokens[n:2 * n],
            "pos_tokens": tokens[2 * n:],
            "has_neg": np.array([t is not None for t in negs], dtype=bool),
            "has_pos": np.array([t is not None for t in poss], dtype=bool),
            "ok": ok,
            "error": np.array(errors, dtype=object),
        }


@dataclasses.dataclass
class Datasets:
    """What the driver hands to the TorchTrainer, plus the counts the schedule needs."""

    train: Any
    val: Any | None
    train_rows: int
    val_rows: int


def build_datasets(cfg: DataConfig, preprocess_train: Callable, preprocess_val: Callable, tokenizer: Callable,
                   image_size: int, *, batch_size: int = 64, env: dict[str, str] | None = None,
                   num_cpus: float = 1.0) -> Datasets:
    """Lazy train/val Ray Datasets (decode + preprocess + tokenise in Ray Data tasks).

    The triplet rows themselves (text and image paths, no pixels) are materialised in the
    object store once; images are decoded lazily, every epoch (fresh augmentation).
    ``env``: environment variables for the decode tasks (e.g. the S3 endpoint).
    ``num_cpus``: CPUs per decode task.
    """
    base = _base_dir(cfg.train_path)
    raw = read_triplets_dataset(cfg.train_path, limit=cfg.limit)
    frac = cfg.val_fraction if cfg.val_path is None else 0.0
    if frac > 0:
        train_raw = raw.filter(lambda row: not split_of(row["image"], frac))
        val_raw = raw.filter(lambda row: split_of(row["image"], frac))
        val_base = base
    elif cfg.val_path is not None:
        train_raw, val_raw, val_base = raw, read_triplets_dataset(cfg.val_path), _base_dir(cfg.val_path)
    else:
        train_raw, val_raw, val_base = raw, None, base
    # Materialise the (small, text-only) triplet rows once: every epoch then re-runs only
    # the decode/preprocess step, not the file read and split filter, and counts are free.
    train_raw = train_raw.materialize()
    val_raw = val_raw.materialize() if val_raw is not None else None
    train_rows = train_raw.count()
    val_rows = val_raw.count() if val_raw is not None else 0
    if train_rows == 0:
        raise DataError(f"{cfg.train_path}: no training rows (after holding out val_fraction={frac})")

    def mapped(ds, base_dir: str, pp: Callable):
        # An instance (not the class) runs as plain Ray Data tasks: an actor pool would
        # hold CPUs the training workers need on a small machine.
        udf = Preprocess(preprocess=pp, tokenizer=tokenizer, image_size=image_size, base_dir=base_dir,
                         image_root=cfg.image_root)
        remote_args: dict[str, Any] = {"num_cpus": num_cpus}
        if env:
            remote_args["runtime_env"] = {"env_vars": env}
        return ds.map_batches(udf, batch_size=batch_size, batch_format="numpy", **remote_args)

    train = mapped(train_raw, base, preprocess_train)
    val = mapped(val_raw, val_base, preprocess_val) if val_raw is not None and val_rows > 0 else None
    return Datasets(train=train, val=val, train_rows=train_rows, val_rows=val_rows)


# --------------------------------------------------------------------------- worker side
def to_model_batch(batch: dict[str, Any], batch_size: int, device: Any = "cpu") -> dict[str, Any]:
    """A numpy batch from ``DataIterator.iter_batches`` -> fixed-size torch inputs + masks.

    Pads to ``batch_size`` rows (``row_mask`` False on padding and failed rows) so every
    rank gathers the same shapes, and trims the token columns to the batch's longest text.
    """
    import torch

    from hardpos.model import trim_tokens

    n = len(batch["ok"])
    if n > batch_size:
        raise ValueError(f"batch of {n} rows exceeds the configured batch_size {batch_size}")
    pad = batch_size - n

    def padded(x: torch.Tensor) -> torch.Tensor:
        if pad == 0:
            return x
        return torch.cat([x, torch.zeros((pad, *x.shape[1:]), dtype=x.dtype)])

    ok = padded(torch.as_tensor(batch["ok"]).bool())
    has_neg = padded(torch.as_tensor(batch["has_neg"]).bool()) & ok
    has_pos = padded(torch.as_tensor(batch["has_pos"]).bool()) & ok
    text = torch.as_tensor(batch["text_tokens"]).long()
    neg = torch.as_tensor(batch["neg_tokens"]).long()
    pos = torch.as_tensor(batch["pos_tokens"]).long()
    # Trim once over all three so the text tower runs one [3B, L] call per step.
    length = trim_tokens(torch.cat([text, neg, pos])).shape[1]
    out = {
        "images": padded(torch.as_tensor(batch["image"]).float()),
        "text_tokens": padded(text[:, :length]),
        "neg_tokens": padded(neg[:, :length]),
        "pos_tokens": padded(pos[:, :length]),
        "row_mask": ok,
        "neg_mask": has_neg,
        "pos_mask": has_pos,
    }
    out = {k: v.to(device, non_blocking=True) for k, v in out.items()}
    out["skipped"] = int(n - int(torch.as_tensor(batch["ok"]).sum()))
    return out
