"""No secret in any record: the one redaction every recorded config, URI and log line goes through.

A tracking URI (``postgresql://user:PASSWORD@db/mlflow``, ``https://user:TOKEN@mlflow``), an
S3 endpoint or an LLM endpoint may carry a credential, and request headers (``Authorization``)
are one. Whatever HardPos *records* -- MLflow params and tags, ``config.yaml`` and
``summary.json``, the tracking journal under ``<output_dir>/tracking``, its console log lines --
goes through :func:`redact` (structures) or :func:`redact_text` (free text) first, so the
credential reads ``***`` there. The job itself keeps using the real value.

What is replaced:

* the password of a URI's user-info (``scheme://user:***@host``; the user name stays, it says
  which account was used);
* the value of a query parameter whose name is a secret's (``?password=***``, ``&token=***``,
  ``X-Amz-Signature=***``);
* the value of a mapping key that names a secret (``Authorization``, ``Cookie``, ``X-Api-Key``,
  ``*_PASSWORD``, ``*_SECRET_ACCESS_KEY``, ...). A key ending in ``_env`` names an environment
  variable (``api_key_env``), which is not a secret, and stays.

Pure functions, no imports beyond the standard library: safe anywhere, at any time.
"""
from __future__ import annotations

import logging
import re
from typing import Any

MASK = "***"

# scheme://user:password@  (the password stops at the last '@' before the path)
_USERINFO = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.\-]*://[^:/?#@\s'\"]*:)(?P<pw>[^/?#\s'\"]*)@")
_SECRET_PARAM = (r"password|passwd|pwd|secret|token|access_token|auth_token|api_key|apikey|api-key|key|sig|"
                 r"signature|x-amz-signature|x-amz-credential|x-amz-security-token|client_secret")
_QUERY = re.compile(rf"(?P<head>[?&;](?:{_SECRET_PARAM})=)(?P<value>[^&;#\s'\"]*)", re.IGNORECASE)
# A mapping key that names a secret (normalised: lower case, '_' -> '-').
_SECRET_KEY = re.compile(
    r"((x-)?(proxy-)?(authorization|cookie|set-cookie|token|api-key|apikey|auth-token|access-token|password|passwd|secret)"
    r"|.*-(password|passwd|secret|secret-key|secret-access-key|session-token|api-key|auth-token|access-token|private-key))",
)


def redact_text(text: str) -> str:
    """``text`` with every URI password and secret query value replaced by ``***``."""
    if "://" not in text and "=" not in text:
        return text
    text = _USERINFO.sub(lambda m: f"{m['head']}{MASK}@", text)
    return _QUERY.sub(lambda m: f"{m['head']}{MASK}" if m["value"] else m[0], text)


def secret_key(key: Any) -> bool:
    """True when a mapping key names a secret (its value is never recorded)."""
    name = str(key).strip().lower().replace("_", "-")
    return not name.endswith("-env") and _SECRET_KEY.fullmatch(name) is not None


def redact(obj: Any) -> Any:
    """A copy of ``obj`` (dicts, lists, tuples, strings, anything else as is) with secrets
    replaced by ``***``: values under secret keys, URI passwords and secret query values
    inside every string. Safe on what is already redacted."""
    if isinstance(obj, str):
        return redact_text(obj)
    if isinstance(obj, dict):
        return {k: (MASK if secret_key(k) and v not in (None, "") else redact(v)) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(redact(v) for v in obj)
    return obj


def is_redacted(uri: str | None) -> bool:
    """True when ``uri`` holds a redacted credential (it cannot be used to connect)."""
    return bool(uri) and redact_text(uri) == uri and f":{MASK}@" in uri


class RedactFormatter(logging.Formatter):
    """A formatter whose output (message, exception and stack text included) is redacted."""

    def format(self, record: logging.LogRecord) -> str:
        return redact_text(super().format(record))
