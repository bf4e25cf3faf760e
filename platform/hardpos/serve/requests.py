"""Request parsing for the scoring service: HTTP bodies, JSON payloads, images, captions.

Every function either returns clean values or raises :class:`~hardpos.serve.errors.ServingError`
with the status and a message naming the offending field (400 bad input, 413 over a limit,
415 multipart unavailable); none answers a client mistake with a 500. Pure functions, tested
without Ray; the async body readers take any Starlette-like ``Request``.

* :func:`read_body`, :func:`read_multipart` -- the raw body under ``max_body_bytes``.
* :func:`parse_json_body` -- bytes -> JSON (400 naming the JSON mistake).
* :func:`parse_score_payload`, :func:`parse_compare_payload`, :func:`parse_batch_payload` --
  a JSON body (or a multipart form's fields) validated by the request models of
  :mod:`hardpos.serve.schemas`, the same models ``/docs`` shows; a pydantic error becomes a
  400 naming the field path (:func:`validate`). The image is then decoded here.
* :func:`decode_base64_image`, :func:`check_image_header`, :func:`open_image` -- byte and
  pixel limits checked *before* pixels are decoded (decompression bombs: a 100-byte PNG
  claiming 50k x 50k pixels is refused from its header).
* :func:`check_token_lengths` -- captions the model would truncate.
"""
from __future__ import annotations

import base64
import binascii
import io
import json
import string
import sys
import warnings
from typing import Any, Container, Sequence

from PIL import Image, UnidentifiedImageError

from pydantic import BaseModel, ValidationError

from hardpos.serve.config import ServingLimits
from hardpos.serve.errors import ServingError, bad_request
from hardpos.serve.schemas import (BatchItem, BatchRequest, CompareForm, CompareRequest, RejectedItem, ScoreForm,
                                   ScoreRequest, list_fields, validation_message)

# --------------------------------------------------------------------------- images


_BASE64_CHARS = frozenset(string.ascii_letters + string.digits + "+/=-_")

def decode_base64_image(data: str, limits: ServingLimits, field: str = "image_b64") -> bytes:
    """Base64 text (optionally a ``data:image/...;base64,`` URL) -> image bytes.

    ``data`` is a string already (the request model checked that). The decoded size is
    estimated from the text length first, so a huge payload is refused (413) without
    allocating it twice. Only inline data is accepted: a URL is refused (400), the service
    never fetches anything on a client's behalf.
    """
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
            # our words, not binascii's (they differ between Python versions)
            reason = ("characters outside the base64 alphabet" if set(text) - _BASE64_CHARS else
                      "its length or '=' padding is wrong (base64 comes in groups of 4 characters)")
            raise bad_request(f"{field} is not valid base64: {reason}") from None
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


def check_token_lengths(tokenizer: Any, captions: Sequence[str], context_length: int, field: str = "captions",
                        checked: Container[str] = ()) -> None:
    """400 for a caption that would be truncated by the model (scores would silently be of
    a shorter caption). Tokenizers that cannot count are not checked. Captions in ``checked``
    are not tokenized again: the serving paths pass the model's text-embedding cache, which
    holds only captions that passed this check on that model (tokenizing one costs about 20
    us, which a fixed set of captions would pay on every request)."""
    for i, caption in enumerate(captions):
        if caption in checked:
            continue
        n = token_count(tokenizer, caption)
        if n is not None and n > context_length:
            raise bad_request(f"{field}[{i}] is too long: {n} tokens; this model's context length is {context_length}")


# --------------------------------------------------------------------------- request payloads


def parse_flag_query(values: Sequence[str], name: str) -> bool:
    """A boolean query parameter given as ``values`` (every occurrence): absent -> False,
    ``true`` / ``false`` once -> that; anything else (``1``, ``null``, empty, repeated) is a
    400 naming it, as the OpenAPI document's ``type: boolean`` says."""
    if not values:
        return False
    if len(values) > 1:
        raise bad_request(f"query parameter {name} is given {len(values)} times; give it once")
    if values[0] not in ("true", "false"):
        shown = values[0] if len(values[0]) <= 40 else values[0][:40] + "..."
        raise bad_request(f"query parameter {name} must be true or false, got {shown!r}")
    return values[0] == "true"


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
    except RecursionError:
        raise bad_request("the request body is not usable JSON: it is nested too deeply") from None
    except ValueError as exc:  # an integer longer than Python's int-string limit (4300 digits)
        limit = getattr(sys, "get_int_max_str_digits", lambda: 4300)()
        why = f"a number has more than {limit} digits" if "digits" in str(exc) else str(exc)
        raise bad_request(f"the request body is not usable JSON: {why}"[:300]) from None


def validate(model: type[BaseModel], payload: Any, limits: ServingLimits, root: str = "request") -> Any:
    """``payload`` as a ``model`` instance, checked against ``limits``; else a 400 naming each
    mistake's field path (``root`` names the body itself)."""
    try:
        return model.model_validate(payload, context={"limits": limits})
    except ValidationError as exc:
        raise bad_request(validation_message(exc.errors(), model, root, limits=limits)) from None


def parse_score_payload(payload: Any, limits: ServingLimits, image: bytes | None = None) -> tuple[bytes, list[str], bool]:
    """:class:`~hardpos.serve.schemas.ScoreRequest` ``{"image_b64", "captions", "softmax"?}`` ->
    (image bytes, captions, softmax). With ``image`` (a multipart upload's file), ``payload``
    is the form's other fields (:class:`~hardpos.serve.schemas.ScoreForm`)."""
    if image is not None:
        form = validate(ScoreForm, payload, limits, "multipart form")
        return image, form.captions, form.softmax
    request = validate(ScoreRequest, payload, limits)
    return decode_base64_image(request.image_b64, limits), request.captions, request.softmax


def parse_compare_payload(payload: Any, limits: ServingLimits, image: bytes | None = None) -> tuple[bytes, list[str]]:
    """:class:`~hardpos.serve.schemas.CompareRequest` ``{"image_b64", "caption", "hard_negative",
    "hard_positive"?}`` -> (image, [c, n(, p)]); with ``image``, ``payload`` is a multipart
    form's other fields (:class:`~hardpos.serve.schemas.CompareForm`)."""
    if image is None:
        request = validate(CompareRequest, payload, limits)
        image = decode_base64_image(request.image_b64, limits)
    else:
        request = validate(CompareForm, payload, limits, "multipart form")
    texts = [request.caption, request.hard_negative]
    return image, texts + ([request.hard_positive] if request.hard_positive is not None else [])


def parse_batch_payload(payload: Any, limits: ServingLimits) -> tuple[list[tuple[bytes, list[str]] | ServingError], bool]:
    """:class:`~hardpos.serve.schemas.BatchRequest` ``{"items": [{"image_b64", "captions"}, ...],
    "softmax"?}``.

    The envelope must be valid (400 otherwise); each item is checked on its own and a bad
    item becomes a :class:`ServingError` in its slot (a per-item reject), so one bad item
    neither fails nor silently drops the others.
    """
    request = validate(BatchRequest, payload, limits)
    parsed: list[tuple[bytes, list[str]] | ServingError] = []
    for i, item in enumerate(request.items):
        if isinstance(item, RejectedItem):
            parsed.append(bad_request(validation_message(item.errors, BatchItem, prefix=("items", i), limits=limits)))
            continue
        try:
            parsed.append((decode_base64_image(item.image_b64, limits, f"items[{i}].image_b64"), item.captions))
        except ServingError as exc:
            parsed.append(exc)
    return parsed, request.softmax


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


async def read_multipart(request: Any, limits: ServingLimits, form_model: type[BaseModel]) -> tuple[bytes, dict[str, Any]]:
    """A multipart upload -> (the file field ``image``'s bytes, the other fields).

    The image: 413 over ``max_image_bytes``, 400 when missing or empty. The other fields are
    text, returned for ``form_model`` to validate (unknown ones included, so it names them):
    a list field (``captions``) is repeated, one entry per field (a single field: one entry),
    or sent once as a JSON list (a field starting with ``[`` or ``{`` is read as JSON); an
    empty field counts as not sent. 415 when the server cannot parse multipart at all (python-multipart
    missing).
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
        lists, fields = list_fields(form_model), {}
        for name in dict.fromkeys(k for k in form.keys() if k != "image"):
            values = form.getlist(name)
            if any(not isinstance(v, str) for v in values):
                raise bad_request(f"multipart: {name} must be text fields, not files")
            if name in lists:
                if len(values) == 1 and values[0].lstrip().startswith(("[", "{")):
                    try:  # one field holding JSON: a list (a JSON object there: the form model names the mistake)
                        values = json.loads(values[0])
                    except (ValueError, RecursionError) as exc:
                        raise bad_request(f"multipart: {name} is not valid JSON: {getattr(exc, 'msg', exc)}") from None
                fields[name] = values  # else: repeated fields, one entry each (one field: one entry)
            elif values != [""]:
                fields[name] = values[0] if len(values) == 1 else values
        return raw, fields
    finally:
        await form.close()
