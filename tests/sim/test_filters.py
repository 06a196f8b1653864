"""Trace filters: what each keeps, how it moves times, that it never changes its input, and its note."""

from __future__ import annotations

from collections import Counter

import pytest

from corral.core.errors import ConfigError
from corral.core.job import JobSpec
from corral.sim.trace import Trace
from corral.sim.traces import drop_shorter_than, head, sample, scale_load, select_tenants, window


def _trace(n: int = 10) -> Trace:
    # Job i arrives at 100 + 10 i, runs 5 i seconds, belongs to tenant "t<i % 3>".
    jobs = [
        JobSpec(job_id=f"j{i}", submit_s=100.0 + 10 * i, num_gpus=1 + i % 2, duration_s=5.0 * i, tenant=f"t{i % 3}")
        for i in range(n)
    ]
    return Trace(jobs=jobs, source="test", skipped=Counter({"bad duration": 2}), notes=["read"])


def _ids(trace: Trace) -> list[str]:
    return [job.job_id for job in trace.jobs]


def test_window_keeps_half_open_range_and_rebases() -> None:
    trace = _trace()
    out = window(trace, start_s=120.0, end_s=160.0)
    assert _ids(out) == ["j2", "j3", "j4", "j5"]
    assert [job.submit_s for job in out.jobs] == [0.0, 10.0, 20.0, 30.0]
    assert out.jobs[0].duration_s == trace.jobs[2].duration_s
    assert out.notes == ["read", out.notes[-1]]
    assert "kept 4 of 10 jobs" in out.notes[-1] and "shifted by -120 s" in out.notes[-1]
    assert out.skipped == trace.skipped and out.skipped is not trace.skipped
    # The input is untouched.
    assert trace.jobs[2].submit_s == 120.0 and trace.notes == ["read"]


def test_window_open_sides() -> None:
    trace = _trace()
    assert _ids(window(trace, end_s=120.0)) == ["j0", "j1"]
    after = window(trace, start_s=175.0)
    assert _ids(after) == ["j8", "j9"] and after.jobs[0].submit_s == 0.0
    assert len(window(trace, start_s=1e9)) == 0
    with pytest.raises(ConfigError):
        window(trace, start_s=10.0, end_s=5.0)


def test_select_tenants_names_absent_ones() -> None:
    trace = _trace()
    out = select_tenants(trace, ["t1", "nobody"])
    assert _ids(out) == ["j1", "j4", "j7"]
    assert "kept 3 of 10" in out.notes[-1] and "not in the trace: nobody" in out.notes[-1]
    assert out.jobs[0] is trace.jobs[1]  # frozen jobs are shared, not copied


def test_drop_shorter_than_keeps_unknown_durations() -> None:
    trace = _trace(4)
    trace.jobs.append(JobSpec(job_id="unknown", submit_s=200.0, num_gpus=1))
    out = drop_shorter_than(trace, 10.0)
    assert _ids(out) == ["j2", "j3", "unknown"]
    assert "dropped 2 of 5" in out.notes[-1]


def test_sample_is_seeded() -> None:
    trace = _trace(2_000)
    a, b, c = sample(trace, 0.25, seed=1), sample(trace, 0.25, seed=1), sample(trace, 0.25, seed=2)
    assert _ids(a) == _ids(b) != _ids(c)
    assert 400 < len(a) < 600
    assert [job.submit_s for job in a.jobs] == sorted(job.submit_s for job in a.jobs)
    assert len(sample(trace, 0.0, seed=0)) == 0 and len(sample(trace, 1.0, seed=0)) == 2_000
    with pytest.raises(ConfigError):
        sample(trace, 1.5, seed=0)


def test_scale_load_compresses_gaps() -> None:
    trace = _trace(4)
    out = scale_load(trace, 2.0)
    assert [job.submit_s for job in out.jobs] == [100.0, 105.0, 110.0, 115.0]
    assert [job.duration_s for job in out.jobs] == [job.duration_s for job in trace.jobs]
    slower = scale_load(trace, 0.5)
    assert [job.submit_s for job in slower.jobs] == [100.0, 120.0, 140.0, 160.0]
    assert "x2" in out.notes[-1]
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ConfigError):
            scale_load(trace, bad)


def test_head() -> None:
    trace = _trace()
    assert _ids(head(trace, 3)) == ["j0", "j1", "j2"]
    assert len(head(trace, 100)) == 10 and len(head(trace, 0)) == 0
    assert "first 3 of 10" in head(trace, 3).notes[-1]
    with pytest.raises(ConfigError):
        head(trace, -1)


def test_filters_compose_and_record_every_step() -> None:
    out = head(scale_load(select_tenants(window(_trace(30), 150.0), ["t0"]), 10.0), 3)
    assert len(out) == 3
    assert len(out.notes) == 5 and out.notes[0] == "read"
    # window: j5 at 0; tenant t0: j6, j9, j12 at 10, 40, 70; scale x10 around the first: 10, 13, 16.
    assert [job.submit_s for job in out.jobs] == [10.0, 13.0, 16.0]
