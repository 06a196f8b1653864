"""Config options: a field whose type is not a plain class repeats it in ``option(..., annotation=...)``, which the
option parser reads (a dataclass compiled by mypyc keeps only ``tuple`` or ``type`` for such a field)."""

from __future__ import annotations

import dataclasses
import types
import typing
from enum import Enum

import pytest

import corral
from corral.core.errors import ConfigError
from corral.core.options import build_config, config_fields, option
from corral.policies.registry import policy_class, policy_names
from corral.sim.perf import PerfModel

CONFIGS = sorted({policy_class(name).Config for name in policy_names()} | {PerfModel}, key=lambda c: c.__qualname__)


def plain(tp: object) -> bool:
    return isinstance(tp, type) and not isinstance(tp, types.GenericAlias)


@pytest.mark.skipif(corral.compiled(), reason="compiled dataclasses keep no generic types; the pure run checks this")
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.__qualname__)
def test_every_field_that_is_not_a_plain_class_carries_its_annotation(config: type) -> None:
    hints = typing.get_type_hints(config)
    for f in dataclasses.fields(config):
        given = f.metadata.get("type")
        if given is not None:
            assert given == hints[f.name], f"{config.__qualname__}.{f.name}: annotation= differs from its type"
        else:
            assert plain(hints[f.name]), f"{config.__qualname__}.{f.name} ({hints[f.name]}) needs annotation="


@dataclasses.dataclass(frozen=True)
class _Example:
    thresholds: tuple[float, ...] = option((1.0,), "a tuple", annotation=tuple[float, ...])
    limit: float | None = option(None, "maybe a float", annotation=float | None)


def test_the_parser_reads_the_repeated_annotation() -> None:
    fields = {name: tp for name, tp, _, _ in config_fields(_Example)}
    assert fields == {"thresholds": tuple[float, ...], "limit": float | None}
    built = build_config(_Example, {"thresholds": "2/3.5", "limit": "none"}, "example")
    assert built == _Example(thresholds=(2.0, 3.5), limit=None)
    with pytest.raises(ConfigError, match="limit"):
        build_config(_Example, {"limit": "soon"}, "example")


def test_enums_are_plain() -> None:
    class Colour(Enum):
        RED = "red"

    assert plain(Colour) and plain(float) and not plain(tuple[float, ...]) and not plain(float | None)
