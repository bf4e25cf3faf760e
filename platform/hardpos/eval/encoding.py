"""Encoding for the evaluator: open images (:func:`hardpos.data.images.load_image`), pick the arithmetic, encode images and captions.

:func:`encode_image_keys` decodes + preprocesses images in a small thread pool one batch
ahead of the model; :func:`encode_captions` batches captions in token-length order so each
batch is trimmed to its own longest caption. Both return L2-normalised float32 features on
the CPU, computed in ``precision`` (see :func:`precision_context`). The evaluator
(:mod:`hardpos.eval.evaluator`) and the Serve pair scoring (:mod:`hardpos.eval.pairs`) encode
through these.
"""
from __future__ import annotations

import concurrent.futures as cf
import contextlib
import logging
import time
from typing import Callable, Sequence

import torch

from hardpos.data.images import load_image
from hardpos.eval.items import Crop
from hardpos.eval.spec import PRECISIONS, Precision
from hardpos.models.clip import encode_image, encode_text, trim_tokens

ImageKey = tuple[str, Crop | None]
PROGRESS_EVERY_S = 10.0  # a progress line at most this often while encoding images

progress = logging.getLogger("hardpos.eval")


# --------------------------------------------------------------------------- images
def _load_preprocessed(key: ImageKey, preprocess: Callable) -> "torch.Tensor | str":
    """The preprocessed tensor, or an error string (never raises)."""
    try:
        return preprocess(load_image(*key))
    except FileNotFoundError:
        return "missing"
    except Exception as exc:  # noqa: BLE001 - any decode error means "corrupt": reported, not raised
        return f"corrupt: {type(exc).__name__}: {exc}"[:300]


def check_precision(precision: str) -> str:
    """``precision`` if it is one of :data:`PRECISIONS`, else a ValueError naming the choices."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    return precision


@contextlib.contextmanager
def _ieee_fp32_on_cuda():
    """Switch TF32 off for cuBLAS matmuls and cuDNN convolutions, restoring the previous
    settings afterwards. cuDNN convs (the ViT patch embedding) use TF32 by default, so
    plain fp32 on an Ampere+ GPU is not fp32 without this. Uses the ``fp32_precision``
    flags where torch has them: mixing them with the legacy ``allow_tf32`` flags makes
    torch raise when anything reads the flags later."""
    cudnn, matmul = torch.backends.cudnn, torch.backends.cuda.matmul
    if hasattr(matmul, "fp32_precision") and hasattr(cudnn, "conv"):
        flags = [matmul, cudnn.conv, cudnn.rnn]
        saved = [f.fp32_precision for f in flags]
        try:
            for f in flags:
                f.fp32_precision = "ieee"
            yield
        finally:
            for f, value in zip(flags, saved):
                f.fp32_precision = value
    else:  # older torch: the legacy flags
        saved_legacy = (matmul.allow_tf32, cudnn.allow_tf32)
        try:
            matmul.allow_tf32 = cudnn.allow_tf32 = False
            yield
        finally:
            matmul.allow_tf32, cudnn.allow_tf32 = saved_legacy


def precision_context(device: "torch.device | str", precision: str = "fp32"):
    """The context every encoder forward pass of the evaluator runs in.

    ``fp32``: no autocast (and no TF32 on CUDA); ``bf16`` / ``fp16``: ``torch.autocast`` on
    ``device``'s type with that dtype (CPU autocast is allowed: slow on most CPUs, but it
    makes the low-precision path testable anywhere). Raises ValueError for other values.
    """
    check_precision(precision)
    device = torch.device(device)
    if precision == "fp32":
        return _ieee_fp32_on_cuda() if device.type == "cuda" else contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16 if precision == "bf16" else torch.float16)


def encode_image_keys(model, preprocess: Callable, keys: Sequence[ImageKey], *, device="cpu", batch_size: int = 256,
                      num_threads: int = 4, precision: Precision = "fp32") -> tuple["torch.Tensor", dict[int, str]]:
    """L2-normalised features [len(keys), D] (float32, CPU; computed in ``precision``) and
    ``{index: error}`` for keys whose image could not be read (their rows are zero)."""
    device = torch.device(device)
    check_precision(precision)
    feats: torch.Tensor | None = None
    failures: dict[int, str] = {}
    chunks = [list(range(i, min(i + batch_size, len(keys)))) for i in range(0, len(keys), batch_size)]
    with cf.ThreadPoolExecutor(max_workers=max(1, num_threads)) as pool:
        def submit(chunk):
            return [pool.submit(_load_preprocessed, keys[i], preprocess) for i in chunk]

        pending = submit(chunks[0]) if chunks else []
        started = last = time.perf_counter()
        for n, chunk in enumerate(chunks):
            if time.perf_counter() - last >= PROGRESS_EVERY_S:
                last = time.perf_counter()
                progress.info("encoding images: %d/%d (%.1f images/s)", chunk[0], len(keys),
                              chunk[0] / (last - started))
            loaded = [f.result() for f in pending]
            pending = submit(chunks[n + 1]) if n + 1 < len(chunks) else []  # decode ahead of the model
            ok_idx, tensors = [], []
            for i, value in zip(chunk, loaded):
                if isinstance(value, str):
                    failures[i] = value
                else:
                    ok_idx.append(i)
                    tensors.append(value)
            if not tensors:
                continue
            with torch.no_grad(), precision_context(device, precision):
                out = encode_image(model, torch.stack(tensors).to(device), normalize=True)
            out = out.float().cpu()
            if feats is None:
                feats = torch.zeros(len(keys), out.shape[1])
            feats[ok_idx] = out
    if feats is None:
        feats = torch.zeros(len(keys), 1)
    return feats, failures


def encode_captions(model, tokenizer: Callable, captions: Sequence[str], *, device="cpu", batch_size: int = 256,
                    precision: Precision = "fp32") -> "torch.Tensor":
    """L2-normalised text features [len(captions), D] (float32, CPU; computed in
    ``precision``), in input order.

    Captions are batched in token-length order so every batch is trimmed to its own
    longest caption; the result is identical to encoding each at full context length.
    """
    device = torch.device(device)
    check_precision(precision)
    if not captions:
        return torch.zeros(0, 1)
    tokens = tokenizer(list(captions))
    order = torch.argsort((tokens != 0).sum(dim=1), stable=True)
    feats: torch.Tensor | None = None
    for start in range(0, len(order), batch_size):
        idx = order[start:start + batch_size]
        with torch.no_grad(), precision_context(device, precision):
            out = encode_text(model, trim_tokens(tokens[idx]).to(device), normalize=True)
        out = out.float().cpu()
        if feats is None:
            feats = torch.zeros(len(captions), out.shape[1])
        feats[idx] = out
    assert feats is not None
    return feats


@contextlib.contextmanager
def eval_mode(model):
    """Put ``model`` in eval mode and restore its previous mode afterwards (training
    calls the evaluator mid-epoch; it must get its model back as it gave it)."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)

