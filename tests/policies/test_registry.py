"""The policy registry and options from strings: what the CLI's --policy flag goes through."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from typing import Any, Literal

import pytest

from corral.core.errors import ConfigError
from corral.core.options import build_config, coerce, config_fields, option, type_label
from corral.policies import registry
from corral.policies.baseline import FifoPolicy, SjfPolicy, SrtfPolicy
from corral.policies.framework.contract import BasePolicy, PolicyConfig
from corral.policies.framework.placement import PlacementStrategy
from corral.policies.registry import (
    BUILTIN_POLICIES,
    make_policy,
    parse_policy_spec,
    policy_class,
    policy_names,
    register_policy,
)


def test_builtin_policies_are_registered() -> None:
    assert {"fifo", "sjf", "srtf"} <= set(policy_names())
    assert policy_names() == sorted(policy_names())
    assert (policy_class("fifo"), policy_class("sjf"), policy_class("srtf")) == (FifoPolicy, SjfPolicy, SrtfPolicy)


@pytest.mark.parametrize("name", sorted(BUILTIN_POLICIES))
def test_each_table_entry_is_the_policy_of_that_name(name: str) -> None:
    cls = policy_class(name)
    assert issubclass(cls, BasePolicy) and cls.name == name
    module, _, attr = BUILTIN_POLICIES[name].partition(":")
    assert (cls.__module__, cls.__name__) == (module, attr)


def test_the_table_imports_only_the_policy_asked_for() -> None:
    code = (
        "import sys\n"
        "from corral.policies.registry import policy_class\n"
        "policy_class('fifo')\n"
        "print(sorted(m for m in sys.modules if m.startswith('corral.policies.')))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    assert "corral.policies.baseline" in out
    for other in ("tiresias", "themis", "gandiva", "antman", "hived", "iadeep"):
        assert f"corral.policies.{other}" not in out


def test_a_policy_from_outside_registers_by_decorator(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "_REGISTERED", {})

    @register_policy
    class Outside(FifoPolicy):
        name = "outside"

    assert "outside" in policy_names() and policy_class("outside") is Outside
    assert type(make_policy("outside:backfill=true")) is Outside


@pytest.mark.parametrize(
    ("spec", "cls", "options"),
    [
        ("fifo", FifoPolicy, {"placement": PlacementStrategy.CONSOLIDATED, "backfill": False}),
        ("fifo:placement=spread,backfill=true", FifoPolicy, {"placement": PlacementStrategy.SPREAD, "backfill": True}),
        (
            "fifo: placement = first-fit , backfill=yes ",
            FifoPolicy,
            {"placement": PlacementStrategy.FIRST_FIT, "backfill": True},
        ),
        ("fifo:", FifoPolicy, {"backfill": False}),
        ("sjf", SjfPolicy, {"backfill": True}),
        ("sjf:backfill=0", SjfPolicy, {"backfill": False}),
        ("srtf", SrtfPolicy, {"preempt": True, "backfill": True}),
        ("srtf:preempt=off,backfill=no", SrtfPolicy, {"preempt": False, "backfill": False}),
    ],
)
def test_make_policy_sets_options(spec: str, cls: type[BasePolicy], options: dict[str, Any]) -> None:
    p = make_policy(spec, seed=7)
    assert type(p) is cls
    assert p.seed == 7
    for name, value in options.items():
        assert getattr(p.config, name) == value


def test_describe() -> None:
    assert make_policy("fifo:placement=spread,backfill=true").describe() == "fifo(placement=spread, backfill=True)"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("nope", "unknown policy 'nope'; known policies: "),
        ("fifo:bogus=1", "policy 'fifo' has no option 'bogus' (its options: backfill, placement)"),
        ("srtf:preemt=false", "policy 'srtf' has no option 'preemt' (its options: backfill, placement, preempt)"),
        ("fifo:backfill=maybe", "option backfill: expected bool, got 'maybe'"),
        (
            "fifo:placement=diagonal",
            "option placement: expected consolidated|strict|spread|first-fit|fgd, got 'diagonal'",
        ),
        ("fifo:backfill", "policy spec 'fifo:backfill': expected key=value, got 'backfill'"),
        ("fifo:=true", "expected key=value"),
        (":backfill=true", "has no policy name"),
        ("", "has no policy name"),
    ],
)
def test_bad_specs_raise_config_error(spec: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        make_policy(spec)
    assert message in str(info.value)


def test_unknown_policy_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError) as info:
        make_policy("lifo")
    for name in ("fifo", "sjf", "srtf"):
        assert name in str(info.value)


def test_parse_policy_spec() -> None:
    assert parse_policy_spec("srtf:placement=spread, preempt=false") == (
        "srtf",
        {"placement": "spread", "preempt": "false"},
    )
    assert parse_policy_spec("fifo") == ("fifo", {})


@dataclass(frozen=True, slots=True)
class Everything(PolicyConfig):
    count: int = option(1, "an int")
    ratio: float = option(0.5, "a float")
    label: str = option("x", "a str")
    mode: Literal["a", "b"] = option("a", "a literal")
    names: tuple[str, ...] = option((), "a tuple")
    limit: int | None = option(None, "optional")
    strategy: PlacementStrategy = option(PlacementStrategy.SPREAD, "an enum")


@pytest.mark.parametrize(
    ("field", "raw", "value"),
    [
        ("count", " 42 ", 42),
        ("ratio", "1e-3", 0.001),
        ("label", " hi ", "hi"),
        ("mode", "b", "b"),
        ("names", "A100/V100", ("A100", "V100")),
        ("names", "", ()),
        ("limit", "none", None),
        ("limit", "", None),
        ("limit", "3", 3),
        ("strategy", "first-fit", PlacementStrategy.FIRST_FIT),
    ],
)
def test_coerce(field: str, raw: str, value: Any) -> None:
    tp = {name: tp for name, tp, _, _ in config_fields(Everything)}[field]
    assert coerce(field, tp, raw) == value


@pytest.mark.parametrize(
    ("field", "raw", "expected"),
    [
        ("count", "1.5", "expected int"),
        ("ratio", "fast", "expected float"),
        ("mode", "c", "expected a|b"),
        ("limit", "lots", "expected int"),
        ("strategy", "best", "expected consolidated|strict|spread|first-fit"),
    ],
)
def test_coerce_errors(field: str, raw: str, expected: str) -> None:
    tp = {name: tp for name, tp, _, _ in config_fields(Everything)}[field]
    with pytest.raises(ConfigError, match=f"option {field}: {expected}, got {raw!r}"):
        coerce(field, tp, raw)


def test_config_fields_and_labels() -> None:
    fields = {name: (type_label(tp), default, help) for name, tp, default, help in config_fields(Everything)}
    assert fields["count"] == ("int", 1, "an int")
    assert fields["names"] == ("str/...", (), "a tuple")
    assert fields["limit"] == ("int", None, "optional")
    assert fields["mode"][0] == "a|b"


def test_build_config_accepts_dashes() -> None:
    @dataclass(frozen=True, slots=True)
    class Dashed(PolicyConfig):
        max_jobs: int = option(5, "")

    assert build_config(Dashed, {"max-jobs": "9"}, "policy 'x'") == Dashed(9)


def test_register_policy_guards() -> None:
    class Nameless(BasePolicy):
        pass

    with pytest.raises(TypeError, match="non-empty `name`"):
        register_policy(Nameless)

    class Impostor(BasePolicy):
        name = "fifo"

    with pytest.raises(TypeError, match="two policies are named 'fifo'"):
        register_policy(Impostor)
    assert policy_class("fifo") is FifoPolicy
    assert register_policy(FifoPolicy) is FifoPolicy  # registering the same class again is harmless
