"""The error hierarchy and how an input error locates the problem: file:line, column, expected, got."""

from __future__ import annotations

import pytest

from corral.core.errors import (
    ClusterSpecError,
    ConfigError,
    CorralError,
    InputError,
    InvariantViolation,
    JobSpecError,
    TraceError,
)


def test_message_has_every_part() -> None:
    err = TraceError("bad GPU count", file="jobs.csv", line=17, column="num_gpus", expected="an integer >= 1", got="x")
    text = str(err)
    assert text == "jobs.csv:17: bad GPU count; column 'num_gpus'; expected an integer >= 1; got 'x'"
    assert (err.file, err.line, err.column, err.expected, err.got) == (
        "jobs.csv",
        17,
        "num_gpus",
        "an integer >= 1",
        "x",
    )
    assert err.message == "bad GPU count"


@pytest.mark.parametrize(
    ("kwargs", "text"),
    [
        ({}, "<input>: oops"),
        ({"file": "c.toml"}, "c.toml: oops"),
        ({"line": 3}, "<input>:3: oops"),
        ({"file": "c.toml", "column": "gpus"}, "c.toml: oops; column 'gpus'"),
        ({"expected": "> 0", "got": "-1"}, "<input>: oops; expected > 0; got '-1'"),
        ({"file": "f", "line": 0, "got": ""}, "f:0: oops; got ''"),
    ],
)
def test_partial_locations(kwargs: dict[str, object], text: str) -> None:
    assert str(InputError("oops", **kwargs)) == text  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("cls", "parents"),
    [
        (ConfigError, (CorralError,)),
        (JobSpecError, (CorralError, ValueError)),
        (InputError, (CorralError,)),
        (TraceError, (InputError, CorralError)),
        (ClusterSpecError, (InputError, CorralError)),
        (InvariantViolation, (CorralError,)),
    ],
)
def test_hierarchy(cls: type[Exception], parents: tuple[type[Exception], ...]) -> None:
    assert all(issubclass(cls, p) for p in parents)


def test_invariant_violation_is_not_an_input_error() -> None:
    assert not issubclass(InvariantViolation, InputError)
