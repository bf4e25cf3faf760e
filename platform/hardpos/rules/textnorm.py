"""Caption text normalisation and word n-gram features.

Contract: pure functions over ``str``; comparison forms only (lower case, whitespace
collapsed, one trailing period dropped). The accepted text a caller keeps is never
produced here. Used by :mod:`hardpos.rules.validate` and :mod:`hardpos.rules.conjuncts`;
:func:`features` (word n-grams with sentence boundaries) is what the n-gram balance of the
rules' picks (:mod:`hardpos.rules.balance`) and the blind text models
(:mod:`hardpos.audit.text_models`) both read a caption as.
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


#: counts above one: the noun right after them is plural whether or not it takes an "s"
#: ("two antelope" / "two antelopes", "three sheep")
PLURAL_COUNTS = frozenset({"two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve",
                           "dozen", "dozens", "hundreds", "several", "many", "multiple", "numerous"})


def fold_counted_plurals(toks: list[str]) -> list[str]:
    """``toks`` with the plural "s" of a word right after a count above one dropped, so a swap
    that fixes number agreement ("three giraffes and two antelope" -> "two antelopes and three
    giraffes") compares equal word for word. Comparison form only."""
    out = list(toks)
    for k in range(1, len(out)):
        w = out[k]
        if out[k - 1] in PLURAL_COUNTS and len(w) > 3 and w.endswith("s") and not w.endswith("ss"):
            out[k] = w[:-1]
    return out


_PUNCT = re.compile(r"([,.;:!?\"()])")


def features(text: str, ngrams: int) -> list[str]:
    """The word n-grams (1..``ngrams``) of ``text``: lower case, punctuation split off words
    (CLIP's tokenizer reads "yak." and "yak ." alike, so the audit must too), with sentence
    boundaries ``<s>`` / ``</s>``."""
    toks = ["<s>", *_PUNCT.sub(r" \1 ", text.lower()).split(), "</s>"]
    return [" ".join(toks[i:i + n]) for n in range(1, ngrams + 1) for i in range(len(toks) - n + 1)]
