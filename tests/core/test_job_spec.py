"""JobSpec, JobStatus, Placement, Tenant and Decision: validation at the edge, with the job named."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest

from corral.core.decisions import Decision, Launch, Preempt, Reject
from corral.core.errors import CorralError, JobSpecError
from corral.core.job import JobClass, JobPhase, JobSpec
from corral.core.placement import Placement
from corral.core.status import JobStatus
from corral.core.tenant import Tenant


def spec(**overrides: Any) -> JobSpec:
    fields: dict[str, Any] = {"job_id": "job-7", "submit_s": 0.0, "num_gpus": 1, "duration_s": 10.0}
    fields.update(overrides)
    return JobSpec(**fields)


@pytest.mark.parametrize(
    ("overrides", "mentions"),
    [
        ({"num_gpus": 0}, "num_gpus"),
        ({"num_gpus": -2}, "num_gpus"),
        ({"num_gpus": 1.5}, "num_gpus"),
        ({"num_gpus": 2.0}, "num_gpus"),  # a float, even integral, is not a GPU count
        ({"num_gpus": True}, "num_gpus"),  # bool is an int subclass, but not a count
        ({"num_gpus": "2"}, "num_gpus"),
        ({"gpu_milli": 0}, "gpu_milli"),
        ({"gpu_milli": -1}, "gpu_milli"),
        ({"gpu_milli": 1001}, "gpu_milli"),
        ({"gpu_milli": 500.0}, "gpu_milli"),
        ({"num_gpus": 2, "gpu_milli": 500}, "fractional share"),
        ({"num_gpus": 8, "gpu_milli": 999}, "num_gpus == 1"),
        ({"duration_s": -1.0}, "duration_s"),
        ({"duration_s": -1e-9}, "duration_s"),
        ({"duration_s": math.nan}, "duration_s"),
        ({"duration_s": math.inf}, "duration_s"),  # a job that never ends would never free its GPUs
        ({"submit_s": math.nan}, "submit_s"),
        ({"submit_s": math.inf}, "submit_s"),
        ({"gpu_mem_mib": -1}, "gpu_mem_mib"),
        # Wrong types, named the same way in the pure and the compiled build (checked before __init__ converts).
        ({"submit_s": "5"}, "submit_s"),
        ({"submit_s": None}, "submit_s"),
        ({"duration_s": "10"}, "duration_s"),
        ({"duration_s": True}, "duration_s"),
        ({"tenant": 3}, "tenant"),
        ({"model": 5}, "model"),
        ({"job_class": "guaranteed"}, "job_class"),
        ({"priority": 1.5}, "priority"),
        ({"gpu_types": ["V100"]}, "gpu_types"),
        ({"gpu_types": ("V100", 2)}, "gpu_types"),
        ({"gpu_mem_mib": 1.5}, "gpu_mem_mib"),
        ({"batch_size": "32"}, "batch_size"),
    ],
)
def test_invalid_spec_raises_naming_the_job(overrides: dict[str, Any], mentions: str) -> None:
    with pytest.raises(JobSpecError) as info:
        spec(**overrides)
    message = str(info.value)
    assert "'job-7'" in message
    assert mentions in message
    # A user error, not a crash: part of the CorralError hierarchy (and a ValueError for generic callers).
    assert isinstance(info.value, CorralError)
    assert isinstance(info.value, ValueError)


def test_empty_job_id_is_rejected() -> None:
    with pytest.raises(JobSpecError, match="job_id"):
        spec(job_id="")
    with pytest.raises(JobSpecError, match="job_id"):
        spec(job_id=7)


def test_arguments_bind_as_python_binds_them() -> None:
    assert JobSpec("a", 1.0, 2, 5.0, "t") == JobSpec(job_id="a", submit_s=1.0, num_gpus=2, duration_s=5.0, tenant="t")
    # Python's own binding errors (worded differently by the compiled build), naming the argument.
    with pytest.raises(TypeError, match="'gpus'"):
        JobSpec(job_id="a", submit_s=0.0, num_gpus=1, gpus=1)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="'job_id'"):
        JobSpec("a", 0.0, 1, job_id="b")  # type: ignore[misc]
    with pytest.raises(TypeError, match="'num_gpus'"):
        JobSpec(job_id="a", submit_s=0.0)  # type: ignore[call-arg]


def test_times_are_stored_as_floats_copies_and_pickles_go_through_the_checks() -> None:
    import copy
    import pickle

    s = spec(submit_s=5, duration_s=10)
    assert (s.submit_s, s.duration_s) == (5.0, 10.0)
    assert type(s.submit_s) is float and type(s.duration_s) is float  # as the compiled build stores them
    full = JobSpec("b", 1.5, 1, 2.0, "t", 500, "resnet50", JobClass.OPPORTUNISTIC, 3, ("V100",), 1024, 64)
    for twin in (copy.copy(full), pickle.loads(pickle.dumps(full)), dataclasses.replace(full)):
        assert twin == full and type(twin) is JobSpec
    assert dataclasses.replace(full, tenant="u").tenant == "u"
    with pytest.raises(JobSpecError, match="num_gpus"):
        dataclasses.replace(full, num_gpus=0)


@pytest.mark.parametrize(
    "change",
    [{}, {"submit_s": 7}, {"tenant": "u"}, {"model": "bert"}, {"job_class": JobClass.GUARANTEED}],
    ids=["nothing", "submit_s", "tenant", "model", "job_class"],
)
def test_replaced_gives_what_dataclasses_replace_gives(change: dict[str, Any]) -> None:
    full = JobSpec("b", 1.5, 1, 2.0, "t", 500, "resnet50", JobClass.OPPORTUNISTIC, 3, ("V100",), 1024, 64)
    got = full.replaced(**change)
    assert got == dataclasses.replace(full, **change) and type(got) is JobSpec
    assert type(got.submit_s) is float
    assert spec().replaced(model="bert").model == "bert"  # from no model to one
    assert full.replaced(model=None) == full  # None keeps the field: a model is not taken away here


def test_replaced_checks_the_new_spec_naming_the_field() -> None:
    # (A value of the wrong type is a TypeError from the compiled core's own check of the argument, unnamed.)
    with pytest.raises(JobSpecError, match="submit_s"):
        spec().replaced(submit_s=math.nan)
    with pytest.raises(JobSpecError, match="submit_s"):
        spec().replaced(submit_s=math.inf)


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"duration_s": 0.0},
        {"duration_s": None},
        {"num_gpus": 1, "gpu_milli": 1},
        {"num_gpus": 1, "gpu_milli": 1000},
        {"num_gpus": 64, "gpu_milli": 1000},
        {"submit_s": -5.0},
        {"gpu_mem_mib": 0},
    ],
)
def test_valid_specs(overrides: dict[str, Any]) -> None:
    s = spec(**overrides)
    assert s.job_id == "job-7"


@pytest.mark.parametrize(("num_gpus", "milli", "demand"), [(1, 1000, 1000), (4, 1000, 4000), (1, 250, 250)])
def test_gpu_demand_milli(num_gpus: int, milli: int, demand: int) -> None:
    assert spec(num_gpus=num_gpus, gpu_milli=milli).gpu_demand_milli == demand


def test_spec_defaults_and_frozen() -> None:
    s = spec()
    assert (s.tenant, s.gpu_milli, s.job_class, s.priority, s.gpu_types, s.gpu_mem_mib) == (
        "default",
        1000,
        JobClass.GUARANTEED,
        0,
        (),
        None,
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.num_gpus = 2  # type: ignore[misc]


@pytest.mark.parametrize(
    ("phase", "terminal"),
    [(JobPhase.PENDING, False), (JobPhase.RUNNING, False), (JobPhase.FINISHED, True), (JobPhase.REJECTED, True)],
)
def test_terminal_phases(phase: JobPhase, terminal: bool) -> None:
    assert phase.is_terminal is terminal


def test_status_derived_fields() -> None:
    status = JobStatus(spec(submit_s=5.0, duration_s=100.0))
    assert status.job_id == "job-7"
    assert status.phase is JobPhase.PENDING
    assert status.remaining_work_s == 100.0
    assert status.jct_s is None
    status.work_done_s = 40.0
    assert status.remaining_work_s == 60.0
    status.work_done_s = 150.0  # never negative, even if the model overshoots
    assert status.remaining_work_s == 0.0
    status.end_s = 125.0
    assert status.jct_s == 120.0
    assert JobStatus(spec(duration_s=None)).remaining_work_s is None


# -- Placement ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("gpus", "milli", "mentions"),
    [
        ((), 1000, "at least one GPU"),
        ((1, 2, 1), 1000, "twice"),
        ((0,), 0, "1..1000"),
        ((0,), -5, "1..1000"),
        ((0,), 1001, "1..1000"),
        ((0,), 500.0, "1..1000"),
        ([0, 1], 1000, "tuple of GPU indices"),
        ((0, 1.0), 1000, "tuple of GPU indices"),
    ],
)
def test_invalid_placement(gpus: tuple[int, ...], milli: int, mentions: str) -> None:
    with pytest.raises(JobSpecError, match=mentions.replace(".", r"\.")):
        Placement(gpus, milli)


def test_placement_fields() -> None:
    p = Placement((3, 4, 5))
    assert p.num_gpus == 3
    assert p.gpu_milli == 1000
    assert Placement((2,), 1).gpu_milli == 1
    assert Placement((0, 1)) == Placement((0, 1), 1000)  # value semantics: decisions compare by content


# -- Tenant ---------------------------------------------------------------------------------------------------
def test_tenant_validation() -> None:
    assert Tenant("t").quota_gpus is None
    assert Tenant("t", 0).quota_gpus == 0
    with pytest.raises(JobSpecError, match=r"'t'.*quota_gpus"):
        Tenant("t", -1)
    with pytest.raises(JobSpecError, match="name"):
        Tenant("")


# -- Decision -------------------------------------------------------------------------------------------------
def test_decision_truthiness_and_length() -> None:
    assert not Decision.NOTHING
    assert len(Decision.NOTHING) == 0
    d = Decision((Preempt("a"), Launch("b", Placement((0,))), Reject("c", "too big")), wake_at_s=5.0)
    assert d
    assert len(d) == 3
    assert d.wake_at_s == 5.0
    assert not Decision((), wake_at_s=1.0)  # a wake-up alone is not an action


def test_placement_types_are_checked_and_copies_go_through_the_checks() -> None:
    import copy
    import pickle

    with pytest.raises(JobSpecError, match="opportunistic"):
        Placement((0,), 500, None, 1)  # type: ignore[arg-type]
    with pytest.raises(JobSpecError, match="memory"):
        Placement((0,), 500, 10.5)  # type: ignore[arg-type]
    p = Placement((3, 1), 0, 2048, opportunistic=True)
    for twin in (copy.copy(p), pickle.loads(pickle.dumps(p)), dataclasses.replace(p)):
        assert twin == p and type(twin) is Placement
    with pytest.raises(JobSpecError, match=r"0\.\.1000"):
        dataclasses.replace(p, gpu_milli=-1)
