"""Prompt templates as data: load them, decide which apply to a caption, render chat messages.

A prompt file (YAML) holds ``prompts: [...]`` entries (see
``hardpos/resources/prompts/paper.yaml`` for the documented format) and may
``include:`` another file (relative to itself, or a bundled name) whose prompts come
first. ``load_prompts("paper")`` loads a bundled file; any other value is a local path
or s3:// URI. Everything here is pure and picklable, so Ray workers get the templates
by value.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from pathlib import Path
from typing import Any

import yaml

from hardpos.config import ConfigError

PROMPTS_DIR = Path(__file__).resolve().parent.parent / "resources" / "prompts"
BUNDLED = ("paper", "with_negatives")
POLARITIES = ("positive", "negative")
_WORD = re.compile(r"[A-Za-z0-9']+")


@dataclasses.dataclass(frozen=True)
class When:
    """Which captions a prompt applies to (all conditions must hold).

    contains_word: the caption must contain this whole word (case-insensitive).
    max_words: the caption must have FEWER words than this (the paper's SWAP: < 15).
    min_words: the caption must have at least this many words.
    """

    contains_word: str | None = None
    max_words: int | None = None
    min_words: int | None = None

    def matches(self, caption: str) -> bool:
        words = [w.lower() for w in _WORD.findall(caption)]
        if self.contains_word and self.contains_word.lower() not in words:
            return False
        if self.max_words is not None and len(words) >= self.max_words:
            return False
        if self.min_words is not None and len(words) < self.min_words:
            return False
        return True


@dataclasses.dataclass(frozen=True)
class PromptTemplate:
    """One generation request kind.

    kind: the validator kind of its outputs ("replace", "swap", "replace_negative", ...).
    polarity: "positive" (hard positive) or "negative" (hard negative).
    user: the final user turn; ``{caption}`` is replaced by the caption.
    system: optional system message.
    few_shot: (user, assistant) example turns sent before the final turn.
    when: applicability conditions.
    """

    kind: str
    polarity: str
    user: str
    system: str | None = None
    few_shot: tuple[tuple[str, str], ...] = ()
    when: When = When()

    def applies(self, caption: str) -> bool:
        return self.when.matches(caption)

    def messages(self, caption: str) -> list[dict[str, str]]:
        """OpenAI-style chat messages for one caption."""
        out: list[dict[str, str]] = []
        if self.system:
            out.append({"role": "system", "content": self.system})
        for user, assistant in self.few_shot:
            out.append({"role": "user", "content": user})
            out.append({"role": "assistant", "content": assistant})
        # str.replace, not str.format: captions and few-shot text may hold braces.
        out.append({"role": "user", "content": self.user.replace("{caption}", caption)})
        return out

    def prompt_text(self, caption: str) -> str:
        """A plain-text rendering (for engines run with the chat template off)."""
        parts = []
        if self.system:
            parts.append(self.system)
        for user, assistant in self.few_shot:
            parts.append(f"{user}\n{assistant}")
        parts.append(self.user.replace("{caption}", caption))
        return "\n\n".join(parts) + "\n"


def _parse_entry(entry: Any, where: str) -> PromptTemplate:
    if not isinstance(entry, dict):
        raise ConfigError(f"{where}: each prompt must be a mapping, got {entry!r}")
    unknown = set(entry) - {"kind", "polarity", "user", "system", "few_shot", "when"}
    if unknown:
        raise ConfigError(f"{where}: unknown prompt key(s) {sorted(unknown)}")
    kind, polarity, user = entry.get("kind"), entry.get("polarity", "positive"), entry.get("user")
    if not isinstance(kind, str) or not kind:
        raise ConfigError(f"{where}: 'kind' must be a non-empty string")
    if polarity not in POLARITIES:
        raise ConfigError(f"{where} ({kind}): polarity must be one of {POLARITIES}, got {polarity!r}")
    if not isinstance(user, str) or "{caption}" not in user:
        raise ConfigError(f"{where} ({kind}): 'user' must be a string containing {{caption}}")
    shots = []
    for i, shot in enumerate(entry.get("few_shot") or []):
        if not isinstance(shot, dict) or not isinstance(shot.get("user"), str) or not isinstance(shot.get("assistant"), str):
            raise ConfigError(f"{where} ({kind}): few_shot[{i}] must have string 'user' and 'assistant'")
        shots.append((shot["user"], shot["assistant"]))
    when_raw = entry.get("when") or {}
    if not isinstance(when_raw, dict) or set(when_raw) - {"contains_word", "max_words", "min_words"}:
        raise ConfigError(f"{where} ({kind}): 'when' accepts contains_word, max_words, min_words; got {when_raw!r}")
    system = entry.get("system")
    if system is not None and not isinstance(system, str):
        raise ConfigError(f"{where} ({kind}): 'system' must be a string")
    return PromptTemplate(kind=kind, polarity=polarity, user=user, system=system, few_shot=tuple(shots),
                          when=When(**when_raw))


def _read_prompt_file(source: str) -> tuple[str, str]:
    """(text, origin) of a bundled name or a path/URI."""
    from hardpos import storage

    if source in BUNDLED or source.removesuffix(".yaml") in BUNDLED:
        name = source.removesuffix(".yaml") + ".yaml"
        return (PROMPTS_DIR / name).read_text(encoding="utf-8"), f"bundled:{name}"
    try:
        return storage.read_text(source), source
    except FileNotFoundError as exc:
        raise ConfigError(f"prompt file not found: {source} (bundled names: {', '.join(BUNDLED)})") from exc


def load_prompts(source: str = "paper", kinds: list[str] | None = None, _depth: int = 0) -> list[PromptTemplate]:
    """Load prompt templates from a bundled name ("paper", "with_negatives") or a YAML path/URI.

    ``kinds`` keeps only those kinds (in file order); an unknown kind is a ConfigError.
    Duplicate kinds are an error (a request is identified by caption_id + kind).
    """
    if _depth > 4:
        raise ConfigError(f"prompt file includes nest too deeply at {source}")
    text, origin = _read_prompt_file(source)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{origin}: not valid YAML: {exc}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("prompts", []), list):
        raise ConfigError(f"{origin}: expected a mapping with a 'prompts' list")
    templates: list[PromptTemplate] = []
    include = data.get("include")
    if include:
        if origin.startswith("bundled:") or include in BUNDLED:
            inc = include
        else:
            from hardpos import storage

            base = origin.rsplit("/", 1)[0] if "/" in origin else "."
            inc = storage.join(base, include)
        templates.extend(load_prompts(inc, None, _depth + 1))
    templates.extend(_parse_entry(e, f"{origin} prompts[{i}]") for i, e in enumerate(data.get("prompts") or []))
    seen: set[str] = set()
    for t in templates:
        if t.kind in seen:
            raise ConfigError(f"{origin}: kind {t.kind!r} is defined twice")
        seen.add(t.kind)
    if kinds:
        missing = [k for k in kinds if k not in seen]
        if missing:
            raise ConfigError(f"kinds {missing} are not in {origin} (it has {sorted(seen)})")
        templates = [t for t in templates if t.kind in kinds]
    if not templates:
        raise ConfigError(f"{origin}: no prompts selected")
    return templates


def fingerprint(templates: list[PromptTemplate]) -> str:
    """A short stable hash of the templates (recorded in the resume manifest)."""
    blob = json.dumps([dataclasses.asdict(t) for t in templates], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]
