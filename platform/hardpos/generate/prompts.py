"""Prompt templates as data: load them, decide which apply to a caption, render requests.

A prompt file (YAML) holds ``prompts: [...]`` entries (see
``hardpos/resources/prompts/paper.yaml`` for the documented format) and may
``include:`` another file (relative to itself, or a bundled name) whose prompts come
first. Bundled files (:data:`BUNDLED`):

* ``paper``          the paper's release: raw (non-chat) prompts verbatim, its few-shot
                     SWAP examples, per-kind token limits and sampling
* ``chat``           the same two kinds worded as chat turns (instruction-tuned models)
* ``with_negatives`` ``chat`` plus LLM hard-negative kinds

Any other value is a local path or s3:// URI. A template renders either chat messages
(``prompt_mode: chat``) or one raw prompt string (``prompt_mode: raw``), carries its own
decoding settings (:class:`Sampling`, overriding the job's ``engine.sampling`` field by
field) and says how its completion is post-processed before validation
(:func:`postprocess`). Everything here is pure and picklable, so Ray workers get the
templates by value.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from pathlib import Path
from typing import Any

import yaml

from hardpos import storage
from hardpos.config import ConfigError
from hardpos.rules.validate import MODES as VALIDATION_MODES

PROMPTS_DIR = Path(__file__).resolve().parent.parent / "resources" / "prompts"
BUNDLED = ("paper", "chat", "with_negatives")
POLARITIES = ("positive", "negative")
PROMPT_MODES = ("chat", "raw")
POSTPROCESS = ("none", "first_line")
SAMPLING_KEYS = ("max_tokens", "temperature", "top_p", "top_k", "stop")
# PromptTemplate fields added after runs were first fingerprinted (see fingerprint())
_LATER_FIELDS = ("prompt_mode", "prompt", "sampling", "postprocess", "validation")
_WORD = re.compile(r"[A-Za-z0-9']+")


@dataclasses.dataclass(frozen=True)
class When:
    """Which captions a prompt applies to (all conditions must hold).

    contains_word: the caption must contain this whole word (case-insensitive).
    max_words: the caption must have FEWER words than this (the bundled SWAP prompts: < 15).
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
class Sampling:
    """A template's own decoding settings; None leaves a field to the job's ``engine.sampling``.

    max_tokens: most tokens generated (the paper: 30 for REPLACE, 20 for SWAP).
    temperature: sampling temperature (0 = greedy).
    top_p: nucleus sampling mass, in (0, 1].
    top_k: sample from the k most likely tokens only (>= 1); sent to vLLM and to HTTP
        endpoints as ``top_k`` (vLLM's OpenAI server accepts it; the OpenAI API does not).
    stop: strings that end generation (not included in the output).
    """

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stop: tuple[str, ...] | None = None

    def overrides(self) -> dict[str, Any]:
        """The fields this template sets (stop as a list, as the engines send it)."""
        out = {k: getattr(self, k) for k in SAMPLING_KEYS if getattr(self, k) is not None}
        if "stop" in out:
            out["stop"] = list(out["stop"])
        return out


def postprocess(text: str | None, mode: str) -> str | None:
    """A completion as the validator should see it. Pure.

    "none": unchanged (the paper's release keeps ``generated_text`` as is).
    "first_line": the first line with any non-space character, else the text unchanged
    (an empty or blank completion stays what it is, so the validator still calls it empty).
    """
    if mode not in POSTPROCESS:
        raise ValueError(f"postprocess must be one of {POSTPROCESS}, got {mode!r}")
    if text is None or mode == "none":
        return text
    return next((line for line in text.splitlines() if line.strip()), text)


@dataclasses.dataclass(frozen=True)
class PromptTemplate:
    """One generation request kind.

    kind: the validator kind of its outputs ("replace", "swap", "replace_negative", ...).
    polarity: "positive" (hard positive) or "negative" (hard negative).
    user: chat mode: the final user turn; ``{caption}`` is replaced by the caption.
    system: chat mode: optional system message.
    few_shot: chat mode: (user, assistant) example turns sent before the final turn.
    when: applicability conditions.
    prompt_mode: "chat" (messages) or "raw" (one plain prompt string, no chat template).
    prompt: raw mode: the whole prompt (few-shot examples written into it) with ``{caption}``.
    sampling: this kind's decoding settings (see :class:`Sampling`).
    postprocess: what of the completion the validator sees (see :func:`postprocess`).
    validation: the validator's mode for this kind's outputs: "strict" (default: every
        check) or "paper" (only non-text, empty, identical and over-length output are
        rejected, as the paper's release filtered; see :func:`hardpos.rules.validate.validate`).
    """

    kind: str
    polarity: str
    user: str | None = None
    system: str | None = None
    few_shot: tuple[tuple[str, str], ...] = ()
    when: When = When()
    prompt_mode: str = "chat"
    prompt: str | None = None
    sampling: Sampling = Sampling()
    postprocess: str = "none"
    validation: str = "strict"

    @property
    def raw(self) -> bool:
        return self.prompt_mode == "raw"

    def applies(self, caption: str) -> bool:
        return self.when.matches(caption)

    def raw_prompt(self, caption: str) -> str:
        """Raw mode: the prompt string for one caption, exactly as the model gets it.

        The caption is put in and the result stripped, as the paper's release does
        (``TEMPLATE.format(example=caption).strip()``).
        """
        if not self.raw:
            raise ValueError(f"prompt kind {self.kind!r} is a chat template; use messages()")
        # str.replace, not str.format: captions may hold braces.
        return self.prompt.replace("{caption}", caption).strip()

    def messages(self, caption: str) -> list[dict[str, str]]:
        """OpenAI-style chat messages for one caption.

        A raw template becomes one user turn holding its raw prompt, for callers that can
        only send chat requests; the engines send raw templates as raw prompts instead.
        """
        if self.raw:
            return [{"role": "user", "content": self.raw_prompt(caption)}]
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
        """A plain-text rendering: a raw template's own prompt; for a chat template, its
        turns joined by blank lines (for engines run with the chat template off)."""
        if self.raw:
            return self.raw_prompt(caption)
        parts = []
        if self.system:
            parts.append(self.system)
        for user, assistant in self.few_shot:
            parts.append(f"{user}\n{assistant}")
        parts.append(self.user.replace("{caption}", caption))
        return "\n\n".join(parts) + "\n"


_ENTRY_KEYS = {"kind", "polarity", "user", "system", "few_shot", "when", "prompt_mode", "prompt", "sampling",
               "postprocess", "validation"}


def _parse_sampling(raw: Any, where: str) -> Sampling:
    if raw is None:
        return Sampling()
    if not isinstance(raw, dict) or set(raw) - set(SAMPLING_KEYS):
        raise ConfigError(f"{where}: 'sampling' accepts {', '.join(SAMPLING_KEYS)}; got {raw!r}")
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if value is None:
            continue
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if key in ("max_tokens", "top_k") and not (number and isinstance(value, int) and value >= 1):
            raise ConfigError(f"{where}: sampling.{key} must be an integer >= 1, got {value!r}")
        if key == "temperature" and not (number and value >= 0):
            raise ConfigError(f"{where}: sampling.temperature must be a number >= 0, got {value!r}")
        if key == "top_p" and not (number and 0 < value <= 1):
            raise ConfigError(f"{where}: sampling.top_p must be in (0, 1], got {value!r}")
        if key == "stop":
            if isinstance(value, str):
                value = [value]
            if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
                raise ConfigError(f"{where}: sampling.stop must be a non-empty string or a list of them, got {value!r}")
            value = tuple(value)
        elif key in ("temperature", "top_p"):
            value = float(value)
        out[key] = value
    return Sampling(**out)


def _parse_entry(entry: Any, where: str) -> PromptTemplate:
    if not isinstance(entry, dict):
        raise ConfigError(f"{where}: each prompt must be a mapping, got {entry!r}")
    unknown = set(entry) - _ENTRY_KEYS
    if unknown:
        raise ConfigError(f"{where}: unknown prompt key(s) {sorted(unknown)}")
    kind, polarity = entry.get("kind"), entry.get("polarity", "positive")
    if not isinstance(kind, str) or not kind:
        raise ConfigError(f"{where}: 'kind' must be a non-empty string")
    where = f"{where} ({kind})"
    if polarity not in POLARITIES:
        raise ConfigError(f"{where}: polarity must be one of {POLARITIES}, got {polarity!r}")
    mode = entry.get("prompt_mode", "chat")
    if mode not in PROMPT_MODES:
        raise ConfigError(f"{where}: prompt_mode must be one of {PROMPT_MODES}, got {mode!r}")
    post = entry.get("postprocess", "none")
    if post not in POSTPROCESS:
        raise ConfigError(f"{where}: postprocess must be one of {POSTPROCESS}, got {post!r}")
    validation = entry.get("validation", "strict")
    if validation not in VALIDATION_MODES:
        raise ConfigError(f"{where}: validation must be one of {VALIDATION_MODES}, got {validation!r}; "
                          "'paper' rejects only empty, identical, non-text and over-length output")
    when_raw = entry.get("when") or {}
    if not isinstance(when_raw, dict) or set(when_raw) - {"contains_word", "max_words", "min_words"}:
        raise ConfigError(f"{where}: 'when' accepts contains_word, max_words, min_words; got {when_raw!r}")
    common = dict(kind=kind, polarity=polarity, when=When(**when_raw), prompt_mode=mode,
                  sampling=_parse_sampling(entry.get("sampling"), where), postprocess=post, validation=validation)
    if mode == "raw":
        misplaced = sorted({"user", "system", "few_shot"} & set(entry))
        if misplaced:
            raise ConfigError(f"{where}: {misplaced} are chat fields; a raw prompt holds its instructions and "
                              "few-shot examples in 'prompt'")
        prompt = entry.get("prompt")
        if not isinstance(prompt, str) or "{caption}" not in prompt:
            raise ConfigError(f"{where}: a raw template needs 'prompt', a string containing {{caption}}")
        return PromptTemplate(prompt=prompt, **common)
    if "prompt" in entry:
        raise ConfigError(f"{where}: 'prompt' is the raw-mode field; a chat template uses 'user' "
                          "(or set prompt_mode: raw)")
    user = entry.get("user")
    if not isinstance(user, str) or "{caption}" not in user:
        raise ConfigError(f"{where}: 'user' must be a string containing {{caption}}")
    shots = []
    for i, shot in enumerate(entry.get("few_shot") or []):
        if not isinstance(shot, dict) or not isinstance(shot.get("user"), str) or not isinstance(shot.get("assistant"), str):
            raise ConfigError(f"{where}: few_shot[{i}] must have string 'user' and 'assistant'")
        shots.append((shot["user"], shot["assistant"]))
    system = entry.get("system")
    if system is not None and not isinstance(system, str):
        raise ConfigError(f"{where}: 'system' must be a string")
    return PromptTemplate(user=user, system=system, few_shot=tuple(shots), **common)


def _read_prompt_file(source: str) -> tuple[str, str]:
    """(text, origin) of a bundled name or a path/URI."""
    if source in BUNDLED or source.removesuffix(".yaml") in BUNDLED:
        name = source.removesuffix(".yaml") + ".yaml"
        return (PROMPTS_DIR / name).read_text(encoding="utf-8"), f"bundled:{name}"
    try:
        return storage.read_text(source), source
    except FileNotFoundError as exc:
        raise ConfigError(f"prompt file not found: {source} (bundled names: {', '.join(BUNDLED)})") from exc


def load_prompts(source: str = "paper", kinds: list[str] | None = None, _depth: int = 0) -> list[PromptTemplate]:
    """Load prompt templates from a bundled name (:data:`BUNDLED`) or a YAML path/URI.

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
    """A short stable hash of the templates (recorded in the resume manifest).

    Fields at their defaults are left out, so a field added to :class:`PromptTemplate`
    later does not change the fingerprint of the templates that do not use it (and so
    does not stop their runs from resuming).
    """
    defaults = {f.name: f.default for f in dataclasses.fields(PromptTemplate)
                if f.default is not dataclasses.MISSING}
    blob = json.dumps([{k: v for k, v in dataclasses.asdict(t).items()
                        if not (k in _LATER_FIELDS and getattr(t, k) == defaults[k])} for t in templates],
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]
