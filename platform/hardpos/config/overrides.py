"""``dotted.key=value`` overrides: parsing them and setting them in a config's plain data
(list items by index, lists copied from the stage's default first)."""
from __future__ import annotations

import re
from typing import Any

import yaml

from hardpos.config.errors import ConfigError
from hardpos.config.fields import default_instance as _default_instance
from hardpos.config.fields import field_default as _field_default
from hardpos.config.fields import field_type as _field_type
from hardpos.config.fields import item_type as _item_type
from hardpos.config.fields import plain as _plain


def parse_override(item: str) -> tuple[str, Any]:
    """``"a.b=1"`` -> ``("a.b", 1)``; the value is parsed as YAML."""
    if "=" not in item:
        raise ConfigError(f"override {item!r} is not of the form dotted.key=value")
    key, raw = item.split("=", 1)
    key = key.strip()
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override {item!r} has an empty key")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw  # e.g. "a: b" style strings: keep verbatim
    return key, value


def set_dotted(data: dict[str, Any], key: str, value: Any, *, cls: type | None = None) -> None:
    """Set ``key`` (dotted; integer parts index lists) in the plain ``data`` of a config.

    With ``cls`` (the dataclass ``data`` will build), a list that ``data`` does not hold yet
    is first copied from the stage's default, so ``variants.1.w_neg=0.5`` edits the second
    default variant.  An index outside the list is a :class:`ConfigError` naming the list
    and its length.  Without ``cls`` (plain dicts, e.g. a sweep's trial overrides) integer
    parts still index lists already in ``data``.
    """
    parts = key.split(".")
    node: Any = data
    tp: Any = cls  # the declared type of ``node`` when known
    default: Any = _default_instance(cls) if cls is not None else None  # the stage's value of ``node``
    for depth, part in enumerate(parts):
        where = ".".join(parts[:depth]) or "config"
        last = depth == len(parts) - 1
        if isinstance(node, list):
            index = _list_index(part, node, where)
            if last:
                node[index] = value
                return
            child, child_tp = node[index], _item_type(tp)
            child_default = None
        else:
            field_tp = _field_type(tp, part)
            field_default = _field_default(tp, default, part)
            if last:
                node[part] = value
                return
            child = node.get(part)
            if child is None:
                # a list must exist before an index can address it: copy the stage's default
                child = _plain(field_default) if isinstance(field_default, (list, tuple)) else {}
                node[part] = child
            child_tp, child_default = field_tp, field_default
        if not isinstance(child, (dict, list)):
            raise ConfigError(f"override {key!r}: {_join_path(parts[:depth + 1])!r} is neither a section nor a list")
        node, tp, default = child, child_tp, child_default


def _join_path(parts: list[str]) -> str:
    return ".".join(parts)


def _list_index(part: str, items: list, where: str) -> int:
    if not re.fullmatch(r"\d+", part):
        raise ConfigError(f"{where} is a list: address its items by index ({where}.0 ...), not {part!r}")
    index = int(part)
    if index >= len(items):
        raise ConfigError(f"{where}: index {index} is out of range, the list has {len(items)} item(s)"
                          + (f" (0..{len(items) - 1})" if items else ""))
    return index
