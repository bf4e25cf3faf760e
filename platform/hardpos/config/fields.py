"""What a config dataclass declares: field types, list item types, the stage's defaults,
alternative key spellings.  Shared by loading, ``key=value`` overrides and ``--help``."""
from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Union, get_args, get_origin, get_type_hints


def unwrap_optional(tp: Any) -> Any:
    if get_origin(tp) in (Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return tp


def field_type(tp: Any, name: str) -> Any:
    tp = unwrap_optional(tp)
    if tp is not None and dataclasses.is_dataclass(tp):
        return unwrap_optional(get_type_hints(tp).get(name))
    return None


def item_type(tp: Any) -> Any:
    tp = unwrap_optional(tp)
    if get_origin(tp) in (list, tuple, typing.Sequence):
        args = get_args(tp)
        return unwrap_optional(args[0]) if args else None
    return None


def default_instance(cls: Any) -> Any:
    """``cls()`` when it can be built from its defaults alone, else None."""
    try:
        return cls()
    except Exception:  # required fields, or defaults that do not validate: no defaults to offer
        return None


def field_default(tp: Any, instance: Any, name: str) -> Any:
    """The value of field ``name`` in the stage's default of the section (``instance``), else
    the field's own default; None when there is none."""
    if instance is not None and hasattr(instance, name) and dataclasses.is_dataclass(instance):
        return getattr(instance, name)
    tp = unwrap_optional(tp)
    if tp is None or not dataclasses.is_dataclass(tp):
        return None
    for f in dataclasses.fields(tp):
        if f.name == name:
            if f.default is not dataclasses.MISSING:
                return f.default
            if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
                return f.default_factory()  # type: ignore[misc]
    return None


def plain(value: Any) -> Any:
    """A default value as the plain data a YAML file would hold."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value
