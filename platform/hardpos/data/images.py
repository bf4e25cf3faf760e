"""Fetching and decoding one image: a local path, ``s3://`` or ``http(s)://`` URI -> RGB PIL image.

Kept apart from :mod:`hardpos.data.captions.training` (Ray Data readers) so that what a logged MLflow
model imports to score an image does not import Ray: a model served by ``mlflow models serve``
installs only its logged requirements.
"""
from __future__ import annotations

import io
import urllib.error
import urllib.request

from PIL import Image

from hardpos import storage

HTTP_TIMEOUT_S = 30.0


def fetch_bytes(uri: str) -> bytes:
    """The bytes at ``uri``: a local path, ``s3://`` or ``http(s)://`` (raises on any failure;
    a missing local or S3 object, or an HTTP 404/410, is FileNotFoundError)."""
    if uri.startswith(("http://", "https://")):
        try:
            with urllib.request.urlopen(uri, timeout=HTTP_TIMEOUT_S) as resp:  # noqa: S310 - the user's own URLs
                return resp.read()
        except urllib.error.HTTPError as exc:
            if exc.code in (404, 410):
                raise FileNotFoundError(f"{uri}: HTTP {exc.code}") from exc
            raise
    return storage.read_bytes(uri)


def decode_rgb(data: bytes) -> Image.Image:
    """Decoded RGB PIL image (the full decode happens here: truncated data raises)."""
    img = Image.open(io.BytesIO(data))
    img.load()
    return img.convert("RGB")


def load_image(uri: str, crop: tuple[int, int, int, int] | None = None) -> Image.Image:
    """A decoded RGB PIL image from a local path, s3:// or http(s):// URI, cropped to ``crop``
    = (x, y, w, h) when given: the one image loader of the package (training, evaluation,
    retention, the explorer, the logged model). Raises on any failure; a missing image is
    FileNotFoundError."""
    img = decode_rgb(fetch_bytes(str(uri)))
    if crop is not None:
        x, y, w, h = crop
        img = img.crop((x, y, x + w, y + h))
    return img
