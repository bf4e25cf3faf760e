"""Helpers for the Serve tests: a tiny registered model and image payloads."""
from __future__ import annotations

import base64
import io
from pathlib import Path

EXPERIMENT = "serve-tests"


def tiny_checkpoint(directory: Path, seed: int) -> Path:
    """A ``hardpos-tiny`` checkpoint with random weights from ``seed``."""
    import torch

    from hardpos.config import ModelConfig
    from hardpos.models.clip import load_model, save_checkpoint

    torch.manual_seed(seed)
    loaded = load_model(ModelConfig(arch="hardpos-tiny"))
    return save_checkpoint(loaded.model, loaded.model_cfg, directory, {"arch": "hardpos-tiny", "seed": seed})


def register_checkpoint(tracking_uri: str, name: str, ckpt: Path, metrics: dict[str, float] | None = None,
                        alias: str = "champion") -> str:
    """Log ``ckpt`` as the artifact ``model`` of a new run, register it under ``name`` and
    point ``alias`` at the new version. Returns the version.

    Uses :func:`hardpos.models.pyfunc.log_model` when the training helper's module exists,
    else plain MLflow artifacts (``model.resolve_source`` finds the checkpoint below them).
    """
    from mlflow.tracking import MlflowClient

    from hardpos import tracking

    client = MlflowClient(tracking_uri)
    exp_id = tracking.ensure_experiment(EXPERIMENT, tracking_uri)
    run = client.create_run(exp_id, run_name=f"{name}-{ckpt.name}")
    run_id = run.info.run_id
    for key, value in (metrics or {}).items():
        client.log_metric(run_id, key, value)
    client.log_artifacts(run_id, str(ckpt), "model")
    client.set_terminated(run_id)
    try:
        client.get_registered_model(name)
    except Exception:  # noqa: BLE001 - not registered yet
        client.create_registered_model(name)
    version = client.create_model_version(name, source=f"{run.info.artifact_uri}/model", run_id=run_id)
    for key, value in (metrics or {}).items():
        client.set_model_version_tag(name, version.version, f"metric.{key}", f"{value:.6g}")
    client.set_registered_model_alias(name, alias, version.version)
    return str(version.version)


def png_bytes(seed: int, size: int = 48, mode: str = "RGB") -> bytes:
    """A small deterministic PNG (random pixels)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    arr = rng.integers(0, 256, size=(size, size, 3), dtype=np.uint8)
    img = Image.fromarray(arr, "RGB").convert(mode)
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def bomb_png(width: int, height: int, rows: int = 0) -> bytes:
    """A PNG whose header claims ``width`` x ``height`` RGB pixels: a decompression bomb.

    ``rows`` rows of real (zero) pixel data are included, zlib-compressed (a whole 5000 x
    5000 image of zeros is ~75 MB decoded but ~75 kB on the wire); 0 gives a header-only file.
    """
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    raw = (b"\x00" + b"\x00" * (3 * width)) * rows
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def broken_checkpoint(directory: Path, good: Path) -> Path:
    """A copy of checkpoint ``good`` whose weights file is garbage: it is registered and
    found like any version, but loading it fails (a model that cannot load)."""
    import shutil

    from hardpos.models.source import WEIGHTS_NAME

    shutil.copytree(good, directory)
    (directory / WEIGHTS_NAME).write_bytes(b"this is not a safetensors file")
    return directory
