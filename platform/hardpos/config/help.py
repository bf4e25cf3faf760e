"""``--help`` for a stage: every key with its type, value, allowed values and doc.

The docs are the dataclasses' own docstrings (``name: doc`` lines), as litgpt's configs
carry theirs; nothing is written twice.
"""
from __future__ import annotations

import dataclasses
import inspect
import re
import textwrap
import types
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

from hardpos.config.fields import field_default as _field_default
from hardpos.config.fields import item_type as _item_type


_DOC_ITEM = re.compile(r"^([A-Za-z_]\w*(?:\s*[/,]\s*[A-Za-z_]\w*)*)\s*:\s+(\S.*)$")


def field_docs(cls: type) -> dict[str, str]:
    """``{field: doc}`` from the ``name: doc`` lines of ``cls``'s docstrings (its own and its
    dataclass bases'; a subclass's line wins).  ``a / b: doc`` or ``a, b: doc`` documents both;
    lines indented below an item continue it; a blank or unindented other line ends it."""
    names = {f.name for f in dataclasses.fields(cls)}
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        text = klass.__dict__.get("__doc__")
        if not text or not dataclasses.is_dataclass(klass):
            continue
        current: list[str] = []
        for line in inspect.cleandoc(text).splitlines():  # the summary line may be an item too
            match = _DOC_ITEM.match(line)
            if match:
                current = [match.group(2).strip()]
                for name in re.split(r"\s*[/,]\s*", match.group(1)):
                    docs[name] = current  # shared list: continuation lines reach every name
            elif current and line[:1].isspace() and line.strip():
                current.append(line.strip())
            else:
                current = []
    return {name: " ".join(parts) for name, parts in docs.items() if name in names}


def doc_problems(cls: type, prefix: str = "") -> list[str]:
    """The keys of config class ``cls`` (sections and list items included) whose ``--help``
    text would not be their own: a key with no doc line, or a section documented by a line
    shared with other keys (``benchmarks / world_dir / retention: ...`` once showed the
    world_dir text under ``retention.*``). Plain keys may share a line that speaks of each
    (``metric / mode: ...``). Empty when every key documents itself."""
    problems: list[str] = []
    docs = field_docs(cls)
    shared: set[str] = set()
    for klass in cls.__mro__:
        text = klass.__dict__.get("__doc__")
        if text and dataclasses.is_dataclass(klass):
            for line in inspect.cleandoc(text).splitlines():
                match = _DOC_ITEM.match(line)
                names = re.split(r"\s*[/,]\s*", match.group(1)) if match else []
                if len(names) > 1:
                    shared.update(names)
    hints = get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        key, tp = f"{prefix}{f.name}", hints[f.name]
        section = _section_type(tp)
        if f.name not in docs:
            problems.append(f"{key}: no doc line")
        elif section is not None and f.name in shared:
            problems.append(f"{key}: a section documented by a line shared with other keys")
        if section is not None:
            problems += doc_problems(section, f"{key}.")
        item = _item_type(tp)
        if item is not None and dataclasses.is_dataclass(item):
            problems += doc_problems(item, f"{key}.<i>.")
    return problems


def _section_type(tp: Any) -> Any:
    if get_origin(tp) in (Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        tp = args[0] if len(args) == 1 else tp
    return tp if isinstance(tp, type) and dataclasses.is_dataclass(tp) else None


def type_name(tp: Any) -> str:
    """A readable type: ``int``, ``str | None``, ``list[Variant]``, ``one of 'a', 'b'``."""
    origin = get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(map(repr, get_args(tp)))
    if origin in (Union, types.UnionType):
        return " | ".join(type_name(a) for a in get_args(tp))
    if tp is type(None):
        return "None"
    if origin is not None:
        args = get_args(tp)
        name = getattr(origin, "__name__", str(origin).replace("typing.", ""))
        return f"{name}[{', '.join(type_name(a) for a in args)}]" if args else name
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _wrap(doc: str, width: int) -> list[str]:
    # no breaks inside words: URIs and keys (models:/hardpos-clip@champion) stay whole
    return textwrap.wrap(doc, width=width, initial_indent=" " * 6, subsequent_indent=" " * 6,
                         break_on_hyphens=False, break_long_words=False)


def describe_config(cfg: Any, prefix: str = "", *, width: int = 100) -> list[str]:
    """``--help`` lines for the config instance ``cfg``: ``  key: type = value`` per key, the
    values being ``cfg``'s (the stage's defaults, or a file's), then the field's doc.

    Sections recurse (``pretrain.lr``); a list of sections lists every item by index
    (``variants.1.w_neg``; docs on the first item only), an empty one its item keys as
    ``<i>`` with the item class's defaults.
    """
    lines: list[str] = []
    cls = type(cfg)
    hints = get_type_hints(cls)
    docs = field_docs(cls)

    def doc_lines(name: str) -> list[str]:
        doc = docs.get(name)
        return _wrap(doc, width) if doc else []

    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        tp, value, key = hints[f.name], getattr(cfg, f.name), f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value):
            lines.append(f"  {key}.*: {type_name(type(value))} section")
            summary = (inspect.getdoc(type(value)) or "").split("\n\n")[0].replace("\n", " ")
            lines.extend(doc_lines(f.name) or _wrap(summary, width))
            lines.extend(describe_config(value, prefix=f"{key}.", width=width))
            continue
        item_tp = _item_type(tp)
        if item_tp is None or not dataclasses.is_dataclass(item_tp):
            lines.append(f"  {key}: {type_name(tp)} = {value!r}")
        elif value:
            lines.append(f"  {key}: {type_name(tp)} ({len(value)} item(s); one key of one item: {key}.<i>.<key>=...)")
        else:
            lines.append(f"  {key}: {type_name(tp)} = [] (give the list in YAML or as {key}=[{{...}}, ...])")
        lines.extend(doc_lines(f.name))
        if item_tp is not None and dataclasses.is_dataclass(item_tp):
            if value:
                for i, item in enumerate(value):
                    sub = describe_config(item, prefix=f"{key}.{i}.", width=width)
                    lines.extend(sub if i == 0 else [line for line in sub if line.startswith("  " + key)])
            else:  # nothing to index yet: the keys an item has (give the list in YAML or as [...])
                item_hints, item_docs = get_type_hints(item_tp), field_docs(item_tp)
                for g in dataclasses.fields(item_tp):
                    default = _field_default(item_tp, None, g.name)
                    shown = "<required>" if default is None and g.default is dataclasses.MISSING else repr(default)
                    lines.append(f"  {key}.<i>.{g.name}: {type_name(item_hints[g.name])} = {shown}")
                    if item_docs.get(g.name):
                        lines.extend(_wrap(item_docs[g.name], width))
    return lines
