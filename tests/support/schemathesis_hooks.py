"""Schemathesis hooks for fuzzing the scoring API (``SCHEMATHESIS_HOOKS=tests.support.schemathesis_hooks``).

The OpenAPI document says an image is base64 (``format: byte``) or an uploaded file
(``format: binary``) holding an image; no JSON Schema can say "bytes that decode as a PNG",
so the fuzzer is told what such bytes are: a few real images (PNG, JPEG, GIF, grey and
RGBA), as base64 for JSON bodies and as files for multipart uploads. Everything else in
a request is generated from the schema alone.
"""
from __future__ import annotations

import base64
import io

import numpy as np
import schemathesis
from hypothesis import strategies as st
from PIL import Image
from schemathesis.transport.serialization import Binary  # what schemathesis sends as a file


def _images() -> list[bytes]:
    rng = np.random.default_rng(0)
    out = []
    for fmt, mode, size in (("PNG", "RGB", 8), ("JPEG", "RGB", 16), ("GIF", "P", 8), ("PNG", "L", 5), ("PNG", "RGBA", 3)):
        arr = rng.integers(0, 256, size=(size, size, 3), dtype=np.uint8)
        buf = io.BytesIO()
        Image.fromarray(arr, "RGB").convert(mode).save(buf, format=fmt)
        out.append(buf.getvalue())
    return out


IMAGES = _images()


schemathesis.openapi.format("byte", st.sampled_from([base64.b64encode(raw).decode("ascii") for raw in IMAGES]))
schemathesis.openapi.format("binary", st.sampled_from(IMAGES).map(Binary))
