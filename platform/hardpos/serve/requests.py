"""Request validation for the scoring service: HTTP bodies, JSON payloads, images, captions.

Every function either returns clean values or raises :class:`~hardpos.serve.errors.ServingError`
with the status and a message naming the offending field (400 bad input, 413 over a limit,
415 multipart unavailable); none answers a client mistake with a 500. Pure functions, tested
without Ray; the async body readers take any Starlette-like ``Request``.

* :func:`read_body`, :func:`read_multipart` -- the raw body under ``max_body_bytes``.
* :func:`parse_json_body`, :func:`parse_score_payload`, :func:`parse_compare_payload`,
  :func:`parse_batch_payload`, :func:`parse_flag` -- JSON payloads (the HTTP layer parses
  them itself instead of FastAPI's generic 422, so each mistake names its field).
* :func:`decode_base64_image`, :func:`check_image_header`, :func:`open_image` -- byte and
  pixel limits checked *before* pixels are decoded (decompression bombs: a 100-byte PNG
  claiming 50k x 50k pixels is refused from its header).
* :func:`validate_caption`, :func:`validate_captions`, :func:`check_token_lengths`.
"""
from __future__ import annotations

import base64
import binascii
import io
import json
import warnings
from typing import Any, Sequence

from PIL import Image, UnidentifiedImageError

from hardpos.serve.config import ServingLimits
from hardpos.serve.errors import ServingError, bad_request

# --------------------------------------------------------------------------- images


def decode_base64_image(data: Any, limits: ServingLimits, field: str = "image_b64") -> bytes:
    """Base64 text (optionally a ``data:image/...;base64,`` URL) -> image bytes.

    The decoded size is estimated from the text length first, so a huge payload is refused
    (413) without allocating it twice. Only inline data is accepted: a URL is refused (400),
    the service never fetches anything on a client's behalf.
    """
    if data is None:
        raise bad_request(f"{field} is missing: send the image as base64 text (or as a multipart file)")
    if not isinstance(data, str):
        raise bad_request(f"{field} must be a base64 string, got {type(data).__name__}")
    text = data.strip()
    if text.startswith("data:"):
        head, sep, rest = text.partition(",")
        if not sep or ";base64" not in head:
            raise bad_request(f"{field}: a data URL must look like data:image/png;base64,<data>")
        text = rest
    elif text.lower().startswith(("http://", "https://", "ftp://", "file:", "s3://", "gs://")):
        raise bad_request(f"{field}: URLs are not fetched by this service; send the image bytes as base64")
    if not text:
        raise bad_request(f"{field} is empty")
    # Whitespace/newlines (MIME-style wrapping) are tolerated; everything else must be base64.
    text = "".join(text.split())
    if len(text) * 3 // 4 > limits.max_image_bytes + 3:
        raise ServingError(413, f"{field}: image is about {len(text) * 3 // 4} bytes; the limit is {limits.max_image_bytes} bytes")
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        try:  # URL-safe alphabet (-_) is common from browsers and JS clients
            raw = base64.urlsafe_b64decode(text) if ("-" in text or "_" in text) and "+" not in text and "/" not in text else None
        except (binascii.Error, ValueError):
            raw = None
        if raw is None:
            raise bad_request(f"{field} is not valid base64: {exc}") from None
    if not raw:
        raise bad_request(f"{field} decodes to zero bytes")
    return raw


def check_image_header(raw: bytes, limits: ServingLimits, field: str = "image") -> tuple[int, int]:
    """Cheap checks that decode no pixels: byte size (413), format from the header (400 when
    not an image), width x height against ``max_image_pixels`` (413: the decompression-bomb
    guard). Returns (width, height). The HTTP ingress runs this; the model replica decodes."""
    return _open_checked(raw, limits, field, decode=False).size


def open_image(raw: bytes, limits: ServingLimits, field: str = "image"):
    """Decode ``raw`` into an RGB :class:`PIL.Image.Image`, refusing oversized or bogus input.

    Order matters: byte size (413), then the header only (format allowlist, 400 when not an
    image), then width x height against ``max_image_pixels`` (413, before any pixel is
    decoded: the decompression-bomb guard), then the actual decode (400 when truncated or
    corrupt). Multi-frame images use their first frame.
    """
    return _open_checked(raw, limits, field, decode=True)


def _open_checked(raw: bytes, limits: ServingLimits, field: str, decode: bool = False):
    if len(raw) > limits.max_image_bytes:
        raise ServingError(413, f"{field} is {len(raw)} bytes; the limit is {limits.max_image_bytes} bytes")
    with warnings.catch_warnings():
        # Pillow's own bomb check warns between MAX_IMAGE_PIXELS and 2x: make it an error.
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        try:
            img = Image.open(io.BytesIO(raw), formats=[f.upper() for f in limits.formats])
        except UnidentifiedImageError:
            raise bad_request(
                f"{field}: the bytes are not a decodable image (accepted formats: {', '.join(limits.formats)})") from None
        except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
            raise ServingError(413, f"{field}: refused as a decompression bomb ({exc})") from None
        except Exception as exc:  # noqa: BLE001 - any header parse failure is the client's bytes
            raise bad_request(f"{field}: the bytes are not a readable image ({type(exc).__name__}: {exc})") from None
        width, height = img.size
        if width <= 0 or height <= 0:
            raise bad_request(f"{field}: image has an empty size {width}x{height}")
        if width * height > limits.max_image_pixels:
            raise ServingError(
                413, f"{field} is {width}x{height} = {width * height} pixels; the limit is {limits.max_image_pixels} pixels")
        if not decode:
            return img  # header parsed, no pixels decoded
        try:
            img.seek(0)
            img.load()
            rgb = img.convert("RGB")
        except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
            raise ServingError(413, f"{field}: refused as a decompression bomb ({exc})") from None
        except Exception as exc:  # noqa: BLE001 - truncated / corrupt pixel data
            raise bad_request(f"{field}: the image data is truncated or corrupt ({type(exc).__name__}: {exc})") from None
    return rgb


# --------------------------------------------------------------------------- captions


def validate_caption(value: Any, limits: ServingLimits, field: str) -> str:
    """One caption: a non-empty string of at most ``max_caption_chars`` characters."""
    if value is None:
        raise bad_request(f"{field} is missing")
    if not isinstance(value, str):
        raise bad_request(f"{field} must be a string, got {type(value).__name__}")
    if not value.strip():
        raise bad_request(f"{field} is an empty caption")
    if len(value) > limits.max_caption_chars:
        raise bad_request(f"{field} is too long: {len(value)} characters; the limit is {limits.max_caption_chars}")
    return value


def validate_captions(captions: Any, limits: ServingLimits, field: str = "captions") -> list[str]:
    """A caption list: present, a list, 1..``max_captions`` strings, each valid."""
    if captions is None:
        raise bad_request(f"{field} is missing: give a list of 1..{limits.max_captions} caption strings")
    if isinstance(captions, str) or not isinstance(captions, (list, tuple)):
        raise bad_request(f"{field} must be a list of strings, got {type(captions).__name__}")
    if len(captions) == 0:
        raise bad_request(f"{field} is empty: give 1..{limits.max_captions} captions")
    if len(captions) > limits.max_captions:
        raise bad_request(f"too many captions: {len(captions)} in {field}; the limit is {limits.max_captions}")
    return [validate_caption(c, limits, f"{field}[{i}]") for i, c in enumerate(captions)]


def token_count(tokenizer: Any, text: str) -> int | None:
    """Tokens ``text`` needs including start/end tokens, or None if the tokenizer cannot say."""
    encode = getattr(tokenizer, "encode", None)
    if encode is None:
        return None
    try:
        ids = encode(text)
    except Exception:  # noqa: BLE001 - HF tokenizers etc. have other signatures
        return None
    sot = getattr(tokenizer, "sot_token_id", None)
    return len(ids) + (2 if sot is not None else 0)


def check_token_lengths(tokenizer: Any, captions: Sequence[str], context_length: int, field: str = "captions") -> None:
    """400 for a caption that would be truncated by the model (scores would silently be of
    a shorter caption). Tokenizers that cannot count are not checked."""
    for i, caption in enumerate(captions):
        n = token_count(tokenizer, caption)
        if n is not None and n > context_length:
            raise bad_request(f"{field}[{i}] is too long: {n} tokens; this model's context length is {context_length}")


# --------------------------------------------------------------------------- request payloads
# The HTTP layer parses JSON itself (instead of letting FastAPI answer 422 with a generic
# schema dump) so each listed mistake gets 400 and a message naming the exact field.

SCORE_FIELDS = {"image_b64", "captions", "softmax"}
COMPARE_FIELDS = {"image_b64", "caption", "hard_negative", "hard_positive"}
BATCH_FIELDS = {"items", "softmax"}
BATCH_ITEM_FIELDS = {"image_b64", "captions"}


def _check_object(payload: Any, allowed: set[str], where: str) -> dict[str, Any]:
    if not isinstance(payload, dict):
        raise bad_request(f"{where} must be a JSON object, got {type(payload).__name__}")
    unknown = sorted(set(payload) - allowed)
    if unknown:
        raise bad_request(f"{where}: unknown field(s) {', '.join(map(repr, unknown))}; allowed: {', '.join(sorted(allowed))}")
    return payload


def parse_flag(value: Any, field: str) -> bool:
    """A boolean field (JSON true/false; multipart 'true'/'false'/'1'/'0')."""
    if value is None:
        return False
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "1", "yes", "false", "0", "no", ""):
        return value.strip().lower() in ("true", "1", "yes")
    raise bad_request(f"{field} must be a boolean, got {value!r}"[:300])


def parse_json_body(body: bytes) -> Any:
    """Request bytes -> JSON value; 400 naming the position of a syntax error."""
    if not body.strip():
        raise bad_request("the request body is empty: send a JSON object")
    try:
        return json.loads(body)
    except UnicodeDecodeError:
        raise bad_request("the request body is not UTF-8 JSON") from None
    except json.JSONDecodeError as exc:
        raise bad_request(f"the request body is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None


def parse_score_payload(payload: Any, limits: ServingLimits) -> tuple[bytes, list[str], bool]:
    """``{"image_b64", "captions", "softmax"?}`` -> (image bytes, captions, softmax)."""
    payload = _check_object(payload, SCORE_FIELDS, "request")
    captions = validate_captions(payload.get("captions"), limits)
    image = decode_base64_image(payload.get("image_b64"), limits)
    return image, captions, parse_flag(payload.get("softmax"), "softmax")


def parse_compare_payload(payload: Any, limits: ServingLimits) -> tuple[bytes, list[str]]:
    """``{"image_b64", "caption", "hard_negative", "hard_positive"?}`` -> (image, [c, n(, p)])."""
    payload = _check_object(payload, COMPARE_FIELDS, "request")
    texts = [validate_caption(payload.get("caption"), limits, "caption"),
             validate_caption(payload.get("hard_negative"), limits, "hard_negative")]
    if payload.get("hard_positive") is not None:
        texts.append(validate_caption(payload["hard_positive"], limits, "hard_positive"))
    return decode_base64_image(payload.get("image_b64"), limits), texts


def parse_batch_payload(payload: Any, limits: ServingLimits) -> tuple[list[tuple[bytes, list[str]] | ServingError], bool]:
    """``{"items": [{"image_b64", "captions"}, ...], "softmax"?}``.

    The envelope must be valid (400 otherwise); each item is parsed on its own and a bad
    item becomes a :class:`ServingError` in its slot (a per-row reject), so one bad row
    neither fails nor silently drops the others.
    """
    payload = _check_object(payload, BATCH_FIELDS, "request")
    items = payload.get("items")
    if items is None:
        raise bad_request(f"items is missing: give a list of 1..{limits.max_batch_items} {{image_b64, captions}} objects")
    if not isinstance(items, list):
        raise bad_request(f"items must be a list, got {type(items).__name__}")
    if not items:
        raise bad_request("items is empty")
    if len(items) > limits.max_batch_items:
        raise bad_request(f"too many items: {len(items)}; the limit is {limits.max_batch_items}")
    parsed: list[tuple[bytes, list[str]] | ServingError] = []
    for i, item in enumerate(items):
        try:
            item = _check_object(item, BATCH_ITEM_FIELDS, f"items[{i}]")
            caps = validate_captions(item.get("captions"), limits, f"items[{i}].captions")
            parsed.append((decode_base64_image(item.get("image_b64"), limits, f"items[{i}].image_b64"), caps))
        except ServingError as exc:
            parsed.append(exc)
    return parsed, parse_flag(payload.get("softmax"), "softmax")


# --------------------------------------------------------------------------- HTTP bodies


def is_multipart(request: Any) -> bool:
    """Whether ``request`` declares a ``multipart/form-data`` body."""
    return request.headers.get("content-type", "").lower().startswith("multipart/form-data")


def _check_declared_length(request: Any, limit: int) -> None:
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise ServingError(413, f"request body is {declared} bytes; the limit is {limit} bytes")


async def read_body(request: Any, limit: int) -> bytes:
    """The whole body, refused (413) once it passes ``limit`` bytes: from the declared
    Content-Length before reading anything, else while streaming (never buffered past it)."""
    _check_declared_length(request, limit)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ServingError(413, f"request body is over the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


async def read_multipart(request: Any, limits: ServingLimits, text_fields: tuple[str, ...]) -> dict[str, Any]:
    """A multipart form -> ``{"image": bytes, <each of text_fields>: str | list | None}``.

    The image is the file field ``image`` (413 over ``max_image_bytes``, 400 when missing or
    empty); ``captions`` may be repeated fields or one JSON list; any other field is a 400.
    415 when the server cannot parse multipart at all (python-multipart missing).
    """
    _check_declared_length(request, limits.max_body_bytes)
    try:
        form = await request.form(max_files=1, max_fields=limits.max_captions + 8)
    except AssertionError as exc:  # starlette: python-multipart is not installed
        raise ServingError(415, f"multipart uploads are not available on this server ({exc}); send JSON with image_b64") from None
    except Exception as exc:  # noqa: BLE001 - malformed multipart body
        raise bad_request(f"malformed multipart body: {type(exc).__name__}: {exc}") from None
    try:
        upload = form.get("image")
        if upload is None or isinstance(upload, str):
            raise bad_request("multipart: the image file field 'image' is missing")
        raw = await upload.read(limits.max_image_bytes + 1)
        if len(raw) > limits.max_image_bytes:
            raise ServingError(413, f"image is over the limit of {limits.max_image_bytes} bytes")
        if not raw:
            raise bad_request("multipart: the image file is empty")
        out: dict[str, Any] = {"image": raw}
        for field in text_fields:
            values = form.getlist(field)
            if any(not isinstance(v, str) for v in values):
                raise bad_request(f"multipart: {field} must be text fields, not files")
            if field == "captions":
                if len(values) == 1 and values[0].lstrip().startswith("["):
                    try:
                        values = json.loads(values[0])
                    except json.JSONDecodeError as exc:
                        raise bad_request(f"multipart: captions is not a valid JSON list: {exc.msg}") from None
                out[field] = values if values else None
            else:
                out[field] = values[0] if values else None
        unknown = sorted(set(form.keys()) - {"image", *text_fields})
        if unknown:
            raise bad_request(f"multipart: unknown field(s) {', '.join(map(repr, unknown))}")
        return out
    finally:
        await form.close()
