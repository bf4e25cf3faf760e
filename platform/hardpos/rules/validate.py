"""Caption validator shared by the rule engine and the LLM generation stage.

``validate(original, candidate, kind)`` accepts or rejects one generated caption with a
machine-readable reason (one of :data:`REASONS`).  It is a pure function: no randomness,
no I/O beyond reading the shipped lexicon once, cheap enough to run on every generated row
(a SWAP candidate takes well under 1 ms).

Checks, in this order (the first failing one is the reason):

``non_text``        the candidate is not a string (bytes, numbers, dicts ...), or holds
                    control characters / U+FFFD, or has no letter at all.
``empty``           None, or nothing left after stripping whitespace/quotes.
``chatter``         the LLM talked instead of answering: several non-empty lines, a
                    leading "Sure"/"Here is"/"Output:"/"Caption:", quotes or backticks
                    around the answer, bullets/markdown, an explanation ("->",
                    "replaced", "(synonym ...)", "Note:") that the original does not have.
``identical``       equal to the original after normalisation (case, whitespace,
                    trailing period).
``non_english``     the candidate brings words that are no English: letters of another
                    script, or two or more new words of which at least half no English
                    dictionary knows (:func:`hardpos.rules.english.non_english`).
``length``          word-count ratio candidate/original outside
                    [:data:`MIN_LENGTH_RATIO`, :data:`MAX_LENGTH_RATIO`] (and more than
                    :data:`LENGTH_SLACK_WORDS` words apart, so 1-2 word captions may grow
                    by a word or two).
``too_many_edits``  REPLACE kinds: more than one contiguous word/phrase differs, or the
                    changed phrase is longer than :data:`MAX_REPLACE_SPAN` words.
``not_a_swap``      SWAP kinds: the multiset of words differs (a/an count as one word;
                    so do "antelope"/"antelopes" right after a count above one) or the
                    word order is unchanged.
``not_conjunct_swap``  SWAP positives ("swap" / "swap_positive") only: the words are a
                    permutation of the original's but not two whole coordinated phrases
                    exchanged (see :func:`is_conjunct_swap`).  Moving modifiers or nouns
                    between phrases ("blue bathroom with white towels" -> "white bathroom
                    with blue towels") is a hard *negative*.
``meaning_kept``    SWAP negatives ("swap_negative") only: the candidate IS a whole-conjunct
                    swap ("a cat and a dog" -> "a dog and a cat"), which keeps the meaning,
                    so it cannot be a hard negative.
``agreement``       a determiner that the candidate's new noun does not agree with, and
                    that the original did not already have: "a skis", "a broccoli",
                    "a pair of kite", "a plate of carrot", "two lady" (see
                    :mod:`hardpos.rules.english`).

Modes (``validate(..., mode=)``, one of :data:`MODES`):

``strict``  (the platform's default) every check above.
``paper``   the paper's release, which kept its completions as generated, less what is never a
            caption: ``non_text``, ``empty``, ``chatter``, ``identical``, over-length output
            (``length`` when the candidate is longer than :data:`MAX_LENGTH_RATIO` times the
            original, beyond :data:`LENGTH_SLACK_WORDS`), ``non_english`` and ``agreement``. No
            edit-shape or conjunct check: multi-word REPLACE edits stay accepted, as the paper
            prints them. A raw completion that runs on past its first line ("a dog and a
            cat\n\nInput: a bird") is cut to its first line, which is then judged; the accepted
            text is that line with whitespace collapsed. The bundled ``paper`` prompts
            validate this way.

Normalisation for comparison: lower case, whitespace collapsed, a trailing period
dropped, punctuation split off words.  The accepted ``text`` keeps the candidate's own
case and punctuation, with whitespace collapsed.

The SWAP-positive check takes its word classes (nouns, people and animals, adjectives,
function words) from the shipped lexicon, loaded on first use and cached.

The checks lean on three modules, one idea each: :mod:`hardpos.rules.textnorm` (normalisation:
:func:`~hardpos.rules.textnorm.normalise`, :func:`~hardpos.rules.textnorm.words`),
:mod:`hardpos.rules.wordclasses` (the lexicon's word classes and token predicates) and
:mod:`hardpos.rules.conjuncts` (:func:`~hardpos.rules.conjuncts.is_conjunct_swap`);
this module holds the checks, in order.
"""
from __future__ import annotations

import difflib
import re
import unicodedata
from collections import Counter
from dataclasses import dataclass

from hardpos.rules.english import new_problems, non_english
from hardpos.rules.conjuncts import is_conjunct_swap
from hardpos.rules.textnorm import fold_counted_plurals, normalise, words

__all__ = ["KINDS", "LENGTH_SLACK_WORDS", "MAX_LENGTH_RATIO", "MAX_REPLACE_SPAN", "MIN_LENGTH_RATIO", "MODES", "REASONS",
           "Verdict", "validate"]


MODES = ("strict", "paper")

REASONS = ("empty", "identical", "chatter", "too_many_edits", "not_a_swap", "not_conjunct_swap", "meaning_kept",
           "length", "non_text", "non_english", "agreement")

#: kinds and the edit shape each one must have: a SWAP positive must exchange whole conjuncts,
#: a SWAP negative only has to permute the words (it is usually a binding swap)
KINDS = {
    "replace": "replace",
    "swap": "conjunct_swap",
    "replace_negative": "replace",
    "swap_negative": "swap",
    "replace_positive": "replace",
    "swap_positive": "conjunct_swap",
}

MIN_LENGTH_RATIO = 0.5
MAX_LENGTH_RATIO = 2.0
LENGTH_SLACK_WORDS = 2
#: longest phrase (in words, on either side) one REPLACE edit may change
MAX_REPLACE_SPAN = 4


@dataclass(frozen=True)
class Verdict:
    """The validator's answer.

    accepted: True when the candidate passes every check.
    reason:   one of :data:`REASONS` when rejected, None when accepted.
    text:     the cleaned candidate (whitespace collapsed) when accepted, else None.
    """

    accepted: bool
    reason: str | None
    text: str | None


_QUOTES = "\"'`\u201c\u201d\u2018\u2019\u00ab\u00bb"
_LEADING_CHATTER = re.compile(
    r"^\s*(sure|certainly|of course|okay|ok|absolutely|here\s+is|here's|here\s+are|"
    r"i\s+(have|replaced|swapped|changed|would|will|can|cannot|can't|am|'m)|i'm|as an ai|sorry|"
    r"output|answer|result|response|rewritten|rephrased|paraphrase[ds]?|new caption|modified caption|"
    r"caption|sentence|hard (positive|negative)|positive|negative|swapped|replaced)\b",
    re.IGNORECASE,
)
# prefixes like "Output:", "A:", "Caption 1:" even when the word is not in the list above
_LABEL_PREFIX = re.compile(r"^\s*[A-Za-z][A-Za-z ]{0,24}\d*\s*:\s")
_EXPLANATION = re.compile(
    r"(->|=>|\u2192|\*\*|^\s*[-*#]\s|^\s*\d+[.)]\s|\b(replaced|replacing|synonym|swapped|swapping|"
    r"explanation|original caption|note that|note:|because|meaning-preserving|i changed)\b)",
    re.IGNORECASE,
)


def _reject(reason: str) -> Verdict:
    assert reason in REASONS
    return Verdict(False, reason, None)


def _is_chatter(original: str, cand: str) -> bool:
    lines = [line for line in cand.splitlines() if line.strip()]
    if len(lines) > 1:
        return True
    stripped = cand.strip()
    orig = original.strip()
    # a quoted answer ('"a man strolling."'); quotes the original itself has are fine
    if stripped[:1] in _QUOTES and orig[:1] not in _QUOTES:
        return True
    if stripped.rstrip(".")[-1:] in _QUOTES and orig.rstrip(".")[-1:] not in _QUOTES:
        return True
    orig_low = original.lower()
    if _LEADING_CHATTER.match(stripped) and not _LEADING_CHATTER.match(original.strip()):
        return True
    if _LABEL_PREFIX.match(stripped) and ":" not in original:
        return True
    for match in _EXPLANATION.finditer(stripped):
        if match.group(0).strip().lower() not in orig_low:
            return True
    if "(" in stripped and "(" not in original:
        return True
    return False


def _edit_shape_replace(orig_words: list[str], cand_words: list[str]) -> str | None:
    """None when the candidate differs from the original by one contiguous phrase.

    Works on words (punctuation dropped), so "red, shiny" -> "blue" is one phrase.
    """
    ops = [op for op in difflib.SequenceMatcher(a=orig_words, b=cand_words, autojunk=False).get_opcodes()
           if op[0] != "equal"]
    if not ops:
        return "identical"  # only punctuation differs: no word was replaced
    if len(ops) > 1:
        return "too_many_edits"
    _, a0, a1, b0, b1 = ops[0]
    if a1 - a0 > MAX_REPLACE_SPAN or b1 - b0 > MAX_REPLACE_SPAN:
        return "too_many_edits"
    return None


def validate(original: str, candidate: object, kind: str, mode: str = "strict") -> Verdict:
    """Accept or reject ``candidate`` as a ``kind`` edit of ``original``.

    kind: "replace" | "swap" (hard positives); "replace_negative" | "swap_negative" (LLM
    hard negatives, same edit-shape rules); "replace_positive"/"swap_positive" are aliases.
    mode: "strict" (every check) or "paper" (no edit-shape or conjunct check, a run-on completion
    cut to its first line; see the module docstring).
    Raises ValueError for an unknown kind or mode, or a non-string original (caller bugs, not rows).
    """
    if kind not in KINDS:
        raise ValueError(f"unknown validation kind {kind!r}; expected one of {sorted(KINDS)}")
    if mode not in MODES:
        raise ValueError(f"unknown validation mode {mode!r}; expected one of {MODES}")
    if not isinstance(original, str):
        raise ValueError(f"original caption must be a string, got {type(original).__name__}")
    shape = KINDS[kind]
    if candidate is None:
        return _reject("empty")
    if not isinstance(candidate, str):
        return _reject("non_text")
    if any(unicodedata.category(ch) in ("Cc", "Cs", "Co") and ch not in "\n\r\t" for ch in candidate) or "\ufffd" in candidate:
        return _reject("non_text")
    if not candidate.strip().strip(_QUOTES).strip():
        return _reject("empty")
    if not any(ch.isalpha() for ch in candidate):
        return _reject("non_text")
    if mode == "paper":
        # a raw completion that runs on ("...\n\nInput: a cat") ends at its first line
        candidate = next(line for line in candidate.splitlines() if line.strip())
    if _is_chatter(original, candidate):
        return _reject("chatter")
    text = " ".join(candidate.split())
    if normalise(text) == normalise(original):
        return _reject("identical")
    if non_english(original, text):
        return _reject("non_english")
    n_orig, n_cand = len(words(original)), len(words(text))
    if mode == "paper":  # the release's filter: over-length only, then as generated
        if n_orig and n_cand - n_orig > LENGTH_SLACK_WORDS and n_cand / n_orig > MAX_LENGTH_RATIO:
            return _reject("length")
        return _agreement(original, text) or Verdict(True, None, text)
    if n_orig and abs(n_cand - n_orig) > LENGTH_SLACK_WORDS and not (
        MIN_LENGTH_RATIO <= n_cand / n_orig <= MAX_LENGTH_RATIO
    ):
        return _reject("length")
    if shape in ("swap", "conjunct_swap"):
        wo, wc = words(original), words(text)
        same_words = Counter(wo) == Counter(wc) or (  # "two antelope(s)": one noun either way
            Counter(fold_counted_plurals(wo)) == Counter(fold_counted_plurals(wc)))
        if not same_words or fold_counted_plurals(wo) == fold_counted_plurals(wc):
            return _reject("not_a_swap")
        if shape == "conjunct_swap" and not is_conjunct_swap(original, text):
            return _reject("not_conjunct_swap")
        if shape == "swap" and is_conjunct_swap(original, text):
            # exchanging two whole conjuncts keeps the meaning: a hard positive, never a negative
            return _reject("meaning_kept")
    else:
        problem = _edit_shape_replace(words(original), words(text))
        if problem:
            return _reject(problem)
    return _agreement(original, text) or Verdict(True, None, text)


def _agreement(original: str, text: str) -> Verdict | None:
    """Every mode's last check: no determiner the new words disagree with (None when none)."""
    return _reject("agreement") if new_problems(original, text) else None
