"""Caption text normalisation shared by the validator and the conjunct-swap check.

Contract: pure functions over ``str``; comparison forms only (lower case, whitespace
collapsed, one trailing period dropped). The accepted text a caller keeps is never
produced here. Re-exported by :mod:`hardpos.data.validate`.
"""
from __future__ import annotations

import re

_TOKEN = re.compile(r"[\w']+|[^\w\s]", re.UNICODE)
_WORD = re.compile(r"[\w']+", re.UNICODE)


def normalise(text: str) -> str:
    """Lower case, whitespace collapsed, one trailing period dropped, space before final punctuation."""
    text = " ".join(text.split()).lower()
    text = re.sub(r"\s*\.+$", "", text)
    return text.strip()


def tokens(text: str) -> list[str]:
    """Normalised tokens: words and punctuation marks, lower case, trailing period dropped."""
    return _TOKEN.findall(normalise(text))


def words(text: str) -> list[str]:
    """Normalised words only (punctuation dropped); "an" is folded to "a"."""
    return ["a" if w == "an" else w for w in _WORD.findall(normalise(text))]
