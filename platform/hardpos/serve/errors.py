"""Errors of the scoring service and the two checks that produce them outside request
parsing: bearer auth and the classification of a model that cannot be loaded.

Status codes: 400 bad input, 401 missing/wrong bearer token, 404 unknown model,
413 image over the byte/pixel limit, 415 multipart unavailable, 503 model not loaded /
overloaded / timed out. Every refusal is a :class:`ServingError`, so the HTTP layer never
answers 500 for a client's mistake.
"""
from __future__ import annotations

import hashlib
import hmac
from typing import Any

from hardpos.models.uri import ModelNotFoundError

class ServingError(Exception):
    """A request the service refuses: ``status`` (HTTP code) and a specific ``message``."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = int(status)
        self.message = message

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status, "detail": self.message}


def bad_request(message: str) -> ServingError:
    """A 400 with ``message`` (which names the offending field)."""
    return ServingError(400, message)


def token_digest(token: str) -> str:
    """sha256 hex of ``token``: the only form in which a bearer token is kept."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def check_bearer(authorization: str | None, expected_digest: str | None) -> None:
    """401 unless ``authorization`` is ``Bearer <token>`` with sha256(token) == expected.

    ``expected_digest`` None means auth is off. Only the digest is kept in memory and in the
    Serve config, compared in constant time.
    """
    if not expected_digest:
        return
    if not authorization:
        raise ServingError(401, "missing bearer token: send 'Authorization: Bearer <token>'")
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise ServingError(401, "malformed Authorization header: expected 'Bearer <token>'")
    if not hmac.compare_digest(token_digest(token.strip()), expected_digest):
        raise ServingError(401, "invalid bearer token")


def classify_load_error(source: str, exc: BaseException) -> ServingError:
    """A model that cannot be loaded: 404 when it does not exist (unknown registered model,
    alias, version, path or tag), 503 when it exists but cannot be loaded."""
    text = f"{type(exc).__name__}: {exc}"
    code = getattr(exc, "error_code", "") or ""
    lowered = text.lower()
    missing = (
        isinstance(exc, (FileNotFoundError, ModelNotFoundError))
        or "RESOURCE_DOES_NOT_EXIST" in str(code)
        or any(s in lowered for s in ("not found", "does not exist", "no such", "unknown model", "not registered"))
    )
    if missing:
        return ServingError(404, f"model {source!r} not found: {text}"[:2000])
    return ServingError(503, f"model {source!r} could not be loaded: {text}"[:2000])


