"""Options: typed config dataclasses whose fields carry help text, and their values from strings.

A policy's config (:class:`corral.policies.framework.contract.PolicyConfig`) and the simulator's performance model
(:class:`corral.sim.perf.PerfModel`) are frozen dataclasses whose fields are made with :func:`option` (or carry a
``help`` entry in their metadata). From them the CLI builds its ``--policy NAME:key=value`` parsing, its flags and
the ``corral policies`` listing: :func:`config_fields` lists the fields, :func:`type_label` names a field's type
for people, :func:`coerce` turns the text of one option into a value of its type, :func:`build_config` makes the
whole config, each failure a :class:`~corral.core.errors.ConfigError` that says what was expected.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from enum import Enum
from typing import Any, Literal

from corral.core.errors import ConfigError


def option(default: Any, help: str, *, annotation: Any = None) -> Any:
    """A config field with help text (shown by ``corral policies`` and ``--help``).

    ``annotation`` repeats the field's type where it is not a plain class (``tuple[float, ...]``,
    ``float | None``): a dataclass compiled by mypyc (the compiled core, ``setup.py``) keeps only ``tuple`` and
    ``type`` as those fields' types, from which no value can be parsed. tests/core/test_options.py checks that it
    is given where needed and matches the annotation."""
    metadata: dict[str, Any] = {"help": help}
    if annotation is not None:
        metadata["type"] = annotation
    return dataclasses.field(default=default, metadata=metadata)


def config_fields(config_cls: type[Any]) -> list[tuple[str, Any, Any, str]]:
    """``(name, type, default, help)`` for each field of a config dataclass (a policy's, the perf model's)."""
    hints = typing.get_type_hints(config_cls)
    return [
        (f.name, f.metadata.get("type", hints[f.name]), f.default, str(f.metadata.get("help", "")))
        for f in dataclasses.fields(config_cls)
    ]


def type_label(tp: Any) -> str:
    if isinstance(tp, type) and issubclass(tp, Enum):
        return "|".join(str(m.value) for m in tp)
    if typing.get_origin(tp) is Literal:
        return "|".join(str(a) for a in typing.get_args(tp))
    if typing.get_origin(tp) is tuple:
        return f"{type_label(typing.get_args(tp)[0])}/..."
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        return " or ".join(type_label(a) for a in typing.get_args(tp) if a is not type(None))
    return getattr(tp, "__name__", str(tp))


def coerce(name: str, tp: Any, raw: str) -> Any:
    """Turn the text of an option into a value of the field's type, or a ConfigError saying what was expected."""
    text = raw.strip()
    try:
        if tp is bool:
            low = text.lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise ValueError
        if tp is int:
            return int(text)
        if tp is float:
            return float(text)
        if tp is str:
            return text
        if isinstance(tp, type) and issubclass(tp, Enum):
            return tp(text)
        if typing.get_origin(tp) is Literal:
            for arg in typing.get_args(tp):
                if str(arg) == text:
                    return arg
            raise ValueError
        if typing.get_origin(tp) is tuple:
            (inner, *_rest) = typing.get_args(tp)
            return tuple(coerce(name, inner, part) for part in text.split("/") if part.strip())
        if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
            args = [a for a in typing.get_args(tp) if a is not type(None)]
            if type(None) in typing.get_args(tp) and text.lower() in ("", "none"):
                return None
            for arg in args:
                try:
                    return coerce(name, arg, text)
                except ConfigError:
                    continue
            raise ValueError
    except ValueError:
        raise ConfigError(f"option {name}: expected {type_label(tp)}, got {raw!r}") from None
    raise ConfigError(f"option {name}: unsupported option type {tp!r}")


C = typing.TypeVar("C")


def build_config(config_cls: type[C], options: Mapping[str, str], policy: str) -> C:
    """An instance of the dataclass ``config_cls`` from text options, checked and typed field by field."""
    fields = {name: tp for name, tp, _, _ in config_fields(config_cls)}
    values: dict[str, Any] = {}
    for key, raw in options.items():
        name = key.strip().replace("-", "_")
        if name not in fields:
            known = ", ".join(sorted(fields)) or "none"
            raise ConfigError(f"{policy} has no option {key!r} (its options: {known})")
        values[name] = coerce(name, fields[name], raw)
    try:
        return config_cls(**values)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{policy}: {exc}") from None
