"""The training input pipeline: triplet files or web-scale shards -> Ray Dataset -> model-ready batches.

Driver side (:func:`build_datasets`):
    read the source with :func:`hardpos.data.captions.training.read_rows` (local or s3://; a file, a
    folder or a glob): triplet parquet/jsonl with one image path per row, parquet with the
    image bytes inline, or webdataset ``.tar`` shards -> one row schema -> deterministic
    train/val split by a hash of the row's image identity (its path, or a hash of its
    bytes; so a resumed run, and every caption of one image, always land on the same side)
    -> ``map_batches`` (:class:`Preprocess`): fetch + decode + open_clip preprocessing +
    tokenisation on CPU in Ray Data tasks.  Ray Train's default ``DataConfig`` then hands
    each worker an equal shard (``streaming_split(equal=True)``).

Images a row only names (local, s3://, http(s)://) are fetched by a thread pool inside the
decode task, so the GETs of a batch overlap instead of running one at a time.

Each row's caption, hard negative and hard positive are tokenised once, together, in the
Ray Data task (full context length, int32); the training worker only trims the padding
columns of its batch (:func:`to_model_batch`).

Augmentation is seeded per row: the train transform runs under a torch/random/numpy seed
derived from ``(seed, epoch, row identity, caption)`` (:func:`row_seed`), so the same run
seed gives the same augmented tensors whichever task or block a row lands in.  The decode
tasks do not know the training loop's epoch, so ``epoch`` is 0 for every pass: a row gets
the same augmentation in every epoch of a run.

Bad rows never crash a run and are never lost silently: an image that is missing, not
decodable, a corrupt shard sample, or a row without an image/caption comes out with
``ok=False`` and its reason in ``error``; the worker masks it out of the loss
(``row_mask``) and counts it (``data/skipped_rows``, reported per epoch).
"""
from __future__ import annotations

import concurrent.futures as cf
import contextlib
import dataclasses
import functools
import hashlib
import os
import random
import zlib
from typing import Any, Callable, Iterator

import numpy as np
from ray import cloudpickle

from hardpos import storage
from hardpos.data.captions import SourceError
from hardpos.data.captions.training import fetch_all, read_rows
from hardpos.data.triplets import resolve_image
from hardpos.train.config import DataConfig


class DataError(ValueError):
    """A training data source is missing, unreadable, or lacks required columns."""




# --------------------------------------------------------------------------- reading
def _base_dir(path: str) -> str:
    """The folder relative image paths of ``path`` are resolved against."""
    p = path.rstrip("/")
    if p.lower().endswith((".parquet", ".jsonl", ".json")):
        return p.rsplit("/", 1)[0] if storage.is_s3(p) else os.path.dirname(os.path.abspath(p))
    return p if storage.is_s3(p) else os.path.abspath(p)


def read_triplets_dataset(path: str, *, limit: int | None = None):
    """A Ray Dataset of training rows (:data:`hardpos.data.captions.training.ROW_COLUMNS`: ``key``,
    ``image``, ``image_bytes``, the three texts, ``kind``, ``error``) from any supported
    source; raises :class:`DataError` naming the file for bad input (before rows are read)."""
    return _read(path, limit=limit)[0]


def _read(path: str, *, limit: int | None = None) -> tuple[Any, str]:
    try:
        return read_rows(path, limit=limit, filesystem_for=functools.partial(storage.arrow_filesystem, for_workers=True))
    except SourceError as exc:
        hint = " (for the embedded default, run `hardpos world` first)" if "not found" in str(exc) else ""
        raise DataError(f"{exc}{hint}") from exc


def split_of(image: Any, val_fraction: float) -> bool:
    """True when the row belongs to the validation split (stable across runs and hosts)."""
    if val_fraction <= 0:
        return False
    h = zlib.crc32(str(image).encode("utf-8")) / 2**32
    return h < val_fraction


# --------------------------------------------------------------------------- preprocessing
def _rows_where(ds: Any, keep: Callable[[Any], list[bool]]) -> Any:
    """The rows of the Ray dataset ``ds`` for which ``keep(table)`` (one bool per row of a
    pyarrow batch) is true. A batch mask, not ``Dataset.filter`` with a row function: that has
    Ray Data warn on the console that an expression would be faster, and these predicates (a
    hash of the key, a text check) are no expression. Arrow batches keep every column's type."""
    return ds.map_batches(functools.partial(_take_rows, keep), batch_format="pyarrow")


def _take_rows(keep: Callable[[Any], list[bool]], table: Any) -> Any:
    import pyarrow as pa  # lazy: pyarrow comes with Ray Data; this runs in its tasks

    return table.filter(pa.array(keep(table), type=pa.bool_()))


def _in_split(frac: float, val: bool, table: Any) -> list[bool]:
    return [split_of(key, frac) == val for key in table.column("key").to_pylist()]


def _has_positive_of(kinds: frozenset, table: Any) -> list[bool]:
    return [_clean_text(p) is not None and k in kinds
            for p, k in zip(table.column("hard_positive").to_pylist(), table.column("kind").to_pylist())]


def _clean_text(value: Any) -> str | None:
    if value is None or (isinstance(value, float) and value != value):
        return None
    text = str(value)
    return text if text.strip() else None


def row_seed(seed: int, epoch: int, key: Any, caption: Any) -> int:
    """The augmentation seed of one row: a hash of (run seed, epoch, image identity,
    caption), the same on every host and in every block layout (63 bits)."""
    digest = hashlib.blake2b(f"{seed}\x1f{epoch}\x1f{key}\x1f{caption}".encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


@contextlib.contextmanager
def seeded(seed: int | None) -> Iterator[None]:
    """Run the body with torch, ``random`` and numpy's global generators seeded by ``seed``
    (restored afterwards; the transforms of torchvision/open_clip/timm draw from these).
    ``seed=None``: unchanged generators."""
    if seed is None:
        yield
        return
    import torch  # lazy: see Preprocess.__getstate__

    py_state, np_state = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        random.seed(seed)
        np.random.seed(seed & 0xFFFFFFFF)
        try:
            yield
        finally:
            random.setstate(py_state)
            np.random.set_state(np_state)


class Preprocess:
    """Ray Data batch UDF: fetch + decode + preprocess images, tokenise the three texts.

    Input: rows of :func:`read_triplets_dataset` (``image`` paths and/or inline
    ``image_bytes``; ``key``, ``error`` optional).  Output columns (numpy): ``image`` float32
    [b, 3, H, W]; ``text_tokens``, ``neg_tokens``, ``pos_tokens`` int32 [b, context];
    ``has_neg``, ``has_pos``, ``ok`` bool [b]; ``error`` str ("" when ok).  Rows that fail
    keep their slot with ``ok=False``.

    ``seed``: None leaves ``preprocess`` on the process's generators (the val transform is
    deterministic anyway); an int runs it per row under :func:`row_seed` (seed, ``epoch``,
    key, caption).  ``fetch_threads``: concurrent image GETs per batch.
    ``positive_kinds``: keep only the hard positives of rows whose ``kind`` is one of these
    (the others' ``has_pos`` is False: the row trains as one without a positive); None: all.
    """

    def __init__(self, preprocess: Callable, tokenizer: Callable, image_size: int, base_dir: str,
                 image_root: str | None = None, *, seed: int | None = None, epoch: int = 0,
                 fetch_threads: int = 16, positive_kinds: list[str] | None = None) -> None:
        self.positive_kinds = None if positive_kinds is None else frozenset(positive_kinds)
        self.preprocess = preprocess
        self.tokenizer = tokenizer
        self.image_size = image_size
        self.base_dir = base_dir
        self.image_root = image_root
        self.seed = seed
        self.epoch = epoch
        self.fetch_threads = fetch_threads

    # Ray ships this UDF inside the dataset to processes that never call it (the Ray Train
    # controller, its dataset manager and split coordinator, the tasks that count and split the
    # rows): unpickled as objects, the open_clip transforms and tokenizer make each of them import
    # open_clip, torchvision and torch (about 4.5 s of a 2-core machine, per process, per run).
    # As bytes they are loaded where the UDF runs, on its first batch; this module itself imports
    # torch and open_clip only inside the functions that use them.
    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        if "_callables" not in state:
            state["_callables"] = cloudpickle.dumps((state.pop("preprocess"), state.pop("tokenizer")))
        return state

    def _load_callables(self) -> None:
        if "_callables" in self.__dict__:
            self.preprocess, self.tokenizer = cloudpickle.loads(self.__dict__.pop("_callables"))

    def _resolve(self, image: Any) -> str | None:
        text = _clean_text(image)
        if text is None:
            return None
        return resolve_image(text, self.base_dir, self.image_root)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        import torch  # lazy: see __getstate__

        self._load_callables()
        n = len(batch["caption"])
        images = np.zeros((n, 3, self.image_size, self.image_size), dtype=np.float32)
        ok = np.ones(n, dtype=bool)
        errors = [""] * n
        captions = [_clean_text(c) for c in batch["caption"]]
        negs = [_clean_text(c) for c in batch["hard_negative"]]
        poss = [_clean_text(c) for c in batch["hard_positive"]]
        if self.positive_kinds is not None:
            kinds = list(batch["kind"]) if "kind" in batch else [None] * n
            poss = [p if kinds[i] in self.positive_kinds else None for i, p in enumerate(poss)]
        blobs = list(batch["image_bytes"]) if "image_bytes" in batch else [None] * n
        # Only real bytes are image data: a null cell can arrive as None, NaN or np.float32(nan)
        # (a row-wise filter turns an all-null binary column into float32), never bytes(nan).
        blobs = [bytes(b) if isinstance(b, (bytes, bytearray, memoryview)) else None for b in blobs]
        keys = list(batch["key"]) if "key" in batch else list(batch["image"])
        source_errors = list(batch["error"]) if "error" in batch else [""] * n
        todo = []
        for i in range(n):
            if source_errors[i]:
                ok[i], errors[i] = False, str(source_errors[i])
            elif captions[i] is None:
                ok[i], errors[i] = False, "no caption"
            else:
                todo.append(i)
        uris = []
        for i in todo:
            try:
                uris.append(None if blobs[i] is not None else self._resolve(batch["image"][i]))
            except ValueError:
                uris.append(None)
        with cf.ThreadPoolExecutor(max_workers=self.fetch_threads) if len(todo) > 1 else contextlib.nullcontext() as pool:
            decoded = fetch_all(uris, [blobs[i] for i in todo], pool)
        for i, img in zip(todo, decoded):
            where = _clean_text(batch["image"][i]) or keys[i]
            if isinstance(img, Exception):
                ok[i], errors[i] = False, f"image {where!r}: {type(img).__name__}: {img}"[:300]
                continue
            try:
                with seeded(None if self.seed is None else row_seed(self.seed, self.epoch, keys[i], captions[i])):
                    pixels = self.preprocess(img)
                images[i] = pixels.numpy() if isinstance(pixels, torch.Tensor) else np.asarray(pixels)
            except Exception as exc:  # noqa: BLE001 - any bad image is a counted skip, never a crash
                ok[i], errors[i] = False, f"image {where!r}: {type(exc).__name__}: {exc}"[:300]
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
                   num_cpus: float = 1.0, seed: int = 0) -> Datasets:
    """Lazy train/val Ray Datasets (fetch + decode + preprocess + tokenise in Ray Data tasks).

    Rows that only name their images (text and paths, no pixels) are materialised in the
    object store once; rows with inline image bytes (parquet-inline, webdataset shards)
    are streamed from their files every epoch instead (the object store need not hold the
    corpus), and counting them costs one extra read pass.  Images are decoded lazily,
    every epoch.  ``env``: environment variables for the decode tasks (e.g. the S3
    endpoint).  ``num_cpus``: CPUs per decode task.  ``seed``: the run's seed; the train
    transform's augmentation derives from it per row (:func:`row_seed`).
    """
    base = _base_dir(cfg.train_path)
    raw, layout = _read(cfg.train_path, limit=cfg.limit)
    frac = cfg.val_fraction if cfg.val_path is None else 0.0
    if frac > 0:
        train_raw = _rows_where(raw, functools.partial(_in_split, frac, False))
        val_raw = _rows_where(raw, functools.partial(_in_split, frac, True))
        val_base = base
    elif cfg.val_path is not None:
        train_raw, val_raw, val_base = raw, read_triplets_dataset(cfg.val_path), _base_dir(cfg.val_path)
    else:
        train_raw, val_raw, val_base = raw, None, base
    if layout == "files":
        # Materialise the (small, text-only) triplet rows once: every epoch then re-runs only
        # the decode/preprocess step, not the file read and split filter, and counts are free.
        train_raw = train_raw.materialize()
        val_raw = val_raw.materialize() if val_raw is not None else None
    train_rows = train_raw.count()
    val_rows = val_raw.count() if val_raw is not None else 0
    if train_rows == 0:
        raise DataError(f"{cfg.train_path}: no training rows (after holding out val_fraction={frac})")
    if cfg.positive_kinds is not None and layout == "files":
        kinds = frozenset(cfg.positive_kinds)
        kept = _rows_where(train_raw, functools.partial(_has_positive_of, kinds)).count()
        if kept == 0:
            raise DataError(f"{cfg.train_path}: no training row has a hard positive of kind {sorted(kinds)} "
                            f"(data.positive_kinds; the triplets' kind column names each positive's kind)")

    def mapped(ds, base_dir: str, pp: Callable, row_seeds: int | None):
        # An instance (not the class) runs as plain Ray Data tasks: an actor pool would
        # hold CPUs the training workers need on a small machine.
        udf = Preprocess(preprocess=pp, tokenizer=tokenizer, image_size=image_size, base_dir=base_dir,
                         image_root=cfg.image_root, seed=row_seeds, fetch_threads=cfg.fetch_threads,
                         positive_kinds=cfg.positive_kinds)
        remote_args: dict[str, Any] = {"num_cpus": num_cpus}
        if env:
            remote_args["runtime_env"] = {"env_vars": env}
        return ds.map_batches(udf, batch_size=batch_size, batch_format="numpy", **remote_args)

    train = mapped(train_raw, base, preprocess_train, seed)
    val = mapped(val_raw, val_base, preprocess_val, None) if val_raw is not None and val_rows > 0 else None
    return Datasets(train=train, val=val, train_rows=train_rows, val_rows=val_rows)


# --------------------------------------------------------------------------- worker side
def to_model_batch(batch: dict[str, Any], batch_size: int, device: Any = "cpu") -> dict[str, Any]:
    """A numpy batch from ``DataIterator.iter_batches`` -> fixed-size torch inputs + masks.

    Pads to ``batch_size`` rows (``row_mask`` False on padding and failed rows) so every
    rank gathers the same shapes, and trims the token columns to the batch's longest text.
    """
    import torch  # lazy: see Preprocess.__getstate__

    from hardpos.models.clip import trim_tokens

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
