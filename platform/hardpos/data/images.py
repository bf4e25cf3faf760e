"""Fetching and decoding one image: a local path, ``s3://`` or ``http(s)://`` URI -> RGB PIL image.

Kept apart from :mod:`hardpos.data.sources` (Ray Data readers) so that what a logged MLflow
model imports to score an image does not import Ray: a model served by ``mlflow models serve``
installs only its logged requirements.
"""
from __future__ import annotations

import io
import urllib.request

from PIL import Image

from hardpos import storage

HTTP_TIMEOUT_S = 30.0


def fetch_bytes(uri: str) -> bytes:
    """The bytes at ``uri``: a local path, ``s3://`` or ``http(s)://`` (raises on any failure;
    a missing local/S3 object is FileNotFoundError)."""
    if uri.startswith(("http://", "https://")):
        with urllib.request.urlopen(uri, timeout=HTTP_TIMEOUT_S) as resp:  # noqa: S310 - the user's own URLs
            return resp.read()
    return storage.read_bytes(uri)


def decode_rgb(data: bytes) -> Image.Image:
    """Decoded RGB PIL image (the full decode happens here: truncated data raises)."""
    img = Image.open(io.BytesIO(data))
    img.load()
    return img.convert("RGB")


def load_image(uri: str) -> Image.Image:
    """A decoded RGB PIL image from a local path, s3:// or http(s):// URI (raises on any failure)."""
    return decode_rgb(fetch_bytes(uri))
