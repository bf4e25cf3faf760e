"""The one error every configuration problem raises, and the one way to raise it."""
from __future__ import annotations

import dataclasses
from typing import Any


class ConfigError(ValueError):
    """A configuration file or override is invalid; the message starts with the key path.

    ``ConfigError("must be >= 1, got 0", key="steps")`` reads ``steps must be >= 1, got 0``
    (``key: reason`` when the reason is not a "must ..." rule); :func:`from_dict` re-raises it
    with the section's path in front (``pretrain.steps must be ...``).  Without ``key`` the
    message is taken as written (it names the key itself).
    """

    def __init__(self, message: str, key: str | None = None) -> None:
        self.key = key
        self.reason = message
        if key:
            message = f"{key} {message}" if message.startswith("must ") else f"{key}: {message}"
        super().__init__(message)

    def __reduce__(self):  # keep ``key`` through pickling (Ray ships exceptions between processes)
        return (ConfigError, (self.reason, self.key))


def require(ok: bool, key: str, rule: str, value: Any = dataclasses.MISSING) -> None:
    """Raise ``ConfigError(f"{rule}, got {value!r}", key)`` unless ``ok``: the one way a config
    dataclass's ``__post_init__`` reports a bad value (``rule`` reads "must be ...", ``key`` is
    relative to that dataclass)."""
    if not ok:
        raise ConfigError(rule if value is dataclasses.MISSING else f"{rule}, got {value!r}", key=key)
