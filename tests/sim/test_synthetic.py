"""The synthetic trace generator: determinism, the contract every trace keeps, and fidelity to a like-trace."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from corral.core.errors import ConfigError
from corral.core.job import JobClass, JobSpec
from corral.sim.traces import Trace, synthesize
from corral.sim.traces.synthetic import DEFAULT_GPUS


def _check_contract(trace: Trace, n: int) -> None:
    assert len(trace) == n
    assert [job.job_id for job in trace.jobs] == [f"syn-{i}" for i in range(n)]
    submits = [job.submit_s for job in trace.jobs]
    assert submits == sorted(submits) and (not submits or submits[0] == 0.0)
    for job in trace.jobs:
        # Plain Python numbers, never numpy scalars (they would leak into JSON reports and slow everything).
        assert type(job.num_gpus) is int and job.num_gpus >= 1
        assert type(job.submit_s) is float and type(job.duration_s) is float
        assert job.duration_s >= 1.0


def test_same_seed_same_trace_different_seed_different() -> None:
    a, b, c = synthesize(2_000, seed=7), synthesize(2_000, seed=7), synthesize(2_000, seed=8)
    assert a.jobs == b.jobs and a.notes == b.notes
    assert a.jobs != c.jobs
    _check_contract(a, 2_000)


def test_defaults_resemble_philly() -> None:
    trace = synthesize(20_000, seed=1)
    _check_contract(trace, 20_000)
    durations = np.array([job.duration_s for job in trace.jobs])
    assert 700 < np.median(durations) < 1_100  # lognormal with median 900 s
    assert durations.max() <= 60 * 86_400
    gpus = Counter(job.num_gpus for job in trace.jobs)
    assert set(gpus) <= set(DEFAULT_GPUS)
    assert abs(gpus[1] / 20_000 - 0.7) < 0.02 and gpus[16] > 0
    tenants = Counter(job.tenant for job in trace.jobs)
    assert len(tenants) == 10 and tenants.most_common(1)[0][0] == "tenant-00"
    rate = (len(trace) - 1) / trace.jobs[-1].submit_s * 3600
    assert 95 < rate < 105  # 100 jobs per hour by default


def test_rate_and_tenant_count_options() -> None:
    trace = synthesize(5_000, seed=3, jobs_per_hour=1_000.0, tenants=3)
    rate = (len(trace) - 1) / trace.jobs[-1].submit_s * 3600
    assert 950 < rate < 1_050
    assert {job.tenant for job in trace.jobs} == {"tenant-00", "tenant-01", "tenant-02"}


def _like() -> Trace:
    # Two tenants 3:1; shapes with distinct durations, so each synthetic job can be traced back to its source.
    # Arrivals: bursts of 4 jobs 1 s apart, then 1 hour of quiet.
    jobs: list[JobSpec] = []
    for i in range(400):
        burst, k = divmod(i, 4)
        jobs.append(
            JobSpec(
                job_id=f"j{i}",
                submit_s=burst * 3_600.0 + k,
                num_gpus=(1, 2, 4, 8)[i % 4],
                duration_s=100.0 + i if i % 50 else 0.2,  # a few sub-second jobs, raised to 1 s
                tenant="big" if i % 4 else "small",
                gpu_milli=1000,
                model=f"m{i % 3}",
                job_class=JobClass.OPPORTUNISTIC if i % 5 == 0 else JobClass.GUARANTEED,
                priority=i % 5,
            )
        )
    return Trace(jobs=jobs, source="like.csv")


def test_like_bootstraps_whole_job_shapes() -> None:
    like = _like()
    shapes = {(max(1.0, j.duration_s or 0.0), j.num_gpus, j.model, j.job_class, j.priority) for j in like.jobs}
    trace = synthesize(3_000, seed=5, like=like)
    _check_contract(trace, 3_000)
    assert {(j.duration_s, j.num_gpus, j.model, j.job_class, j.priority) for j in trace.jobs} <= shapes
    assert min(job.duration_s or 0.0 for job in trace.jobs) == 1.0
    assert any("raised to 1 s" in note for note in trace.notes)
    tenants = Counter(job.tenant for job in trace.jobs)
    assert set(tenants) == {"big", "small"} and 2.6 < tenants["big"] / tenants["small"] < 3.4
    # Poisson at the like-trace's average rate: 399 gaps over 99 h 3 s.
    like_rate = 399 / (99 * 3_600 + 3) * 3_600
    rate = (len(trace) - 1) / trace.jobs[-1].submit_s * 3_600
    assert abs(rate / like_rate - 1) < 0.06


def test_like_with_fewer_tenants() -> None:
    trace = synthesize(500, seed=5, like=_like(), tenants=1)
    assert {job.tenant for job in trace.jobs} == {"big"}
    with pytest.raises(ConfigError, match="only 2 tenants"):
        synthesize(10, seed=5, like=_like(), tenants=3)


def test_trace_arrivals_keep_the_bursts() -> None:
    like = _like()
    trace = synthesize(4_000, seed=11, like=like, arrival="trace")
    _check_contract(trace, 4_000)
    gaps = np.diff([job.submit_s for job in trace.jobs])
    # Only the like-trace's gaps occur, in its proportions: 3 in 4 are 1 s, 1 in 4 is about an hour.
    assert set(np.round(gaps).tolist()) <= {1.0, 3_597.0}
    assert 0.7 < np.mean(gaps == 1.0) < 0.8
    poisson = synthesize(4_000, seed=11, like=like, arrival="poisson")
    assert np.mean(np.diff([job.submit_s for job in poisson.jobs]) < 2.0) < 0.1  # Poisson has no bursts
    scaled = synthesize(4_000, seed=11, like=like, arrival="trace", jobs_per_hour=100.0)
    rate = (len(scaled) - 1) / scaled.jobs[-1].submit_s * 3_600
    assert rate == pytest.approx(100.0)


def test_like_philly_rate_and_tenants() -> None:
    # A small Philly-like trace with the real VC names but made-up numbers: tenants come from like.
    like = Trace(
        jobs=[
            JobSpec(job_id=str(i), submit_s=60.0 * i, num_gpus=1, duration_s=10.0, tenant="6214e9") for i in range(61)
        ],
        source="tiny",
    )
    trace = synthesize(1_000, seed=0, like=like)
    assert {job.tenant for job in trace.jobs} == {"6214e9"}
    assert "60 jobs/hour" in trace.notes[0]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_jobs": -1}, "num_jobs"),
        ({"arrival": "trace"}, "needs like"),
        ({"arrival": "uniform"}, "arrival"),
        ({"jobs_per_hour": 0.0}, "jobs_per_hour"),
        ({"tenants": 0}, "tenants"),
        ({"like": Trace(jobs=[JobSpec(job_id="a", submit_s=0.0, num_gpus=1)], source="x")}, "known duration"),
        ({"like": Trace(jobs=[JobSpec(job_id="a", submit_s=0.0, num_gpus=1, duration_s=5.0)], source="x")}, "spans"),
    ],
)
def test_bad_arguments(kwargs: dict[str, object], match: str) -> None:
    args: dict[str, object] = {"num_jobs": 10, "seed": 0, **kwargs}
    with pytest.raises(ConfigError, match=match):
        synthesize(**args)  # type: ignore[arg-type]


def test_zero_jobs() -> None:
    assert len(synthesize(0, seed=0)) == 0
    assert len(synthesize(0, seed=0, like=_like(), arrival="trace")) == 0
