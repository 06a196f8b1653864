"""Trace filters: what each keeps, how it moves times, that it never changes its input, and its note."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest

from corral.core.errors import ConfigError
from corral.core.job import JobClass, JobSpec
from corral.sim.traces import Trace, drop_shorter_than, head, sample, scale_load, select_tenants, window
from corral.sim.traces.filters import assign_tenants, make_opportunistic
from corral.sim.workload import WorkloadSpec, build_trace
from corral.workloads.data import data_file


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


# --------------------------------------------------------------------------------------------------------
# assign_tenants, make_opportunistic
# --------------------------------------------------------------------------------------------------------


def _untenanted(n: int, named_every: int = 0) -> Trace:
    """``n`` jobs of tenant "default", except every ``named_every``-th one (if > 0), which is tenant "vc"; every
    fifth job is opportunistic."""
    jobs = [
        JobSpec(
            job_id=f"j{i}",
            submit_s=float(i),
            num_gpus=1,
            duration_s=10.0,
            tenant="vc" if named_every and i % named_every == 0 else "default",
            job_class=JobClass.OPPORTUNISTIC if i % 5 == 0 else JobClass.GUARANTEED,
        )
        for i in range(n)
    ]
    return Trace(jobs=jobs, source="test", notes=["read"])


def _tenants(trace: Trace) -> list[str]:
    return [job.tenant for job in trace.jobs]


def test_assign_tenants_is_seeded_and_skewed() -> None:
    trace = _untenanted(4_000)
    a, b, c = assign_tenants(trace, 4, seed=1), assign_tenants(trace, 4, seed=1), assign_tenants(trace, 4, seed=2)
    assert _tenants(a) == _tenants(b) != _tenants(c)
    counts = Counter(_tenants(a))
    assert set(counts) == {"t0", "t1", "t2", "t3"} and sum(counts.values()) == 4_000
    # Zipf weights 1/rank: shares 12/25, 6/25, 4/25, 3/25 (1,920, 960, 640, 480 of 4,000).
    for name, expected in (("t0", 1_920), ("t1", 960), ("t2", 640), ("t3", 480)):
        assert abs(counts[name] - expected) < 120, (name, counts)
    note = a.notes[-1]
    assert a.notes[:-1] == ["read"]
    assert "4,000 of 4,000 jobs" in note and "seed 1" in note
    assert ", ".join(f"{t} {counts[t]:,}" for t in ("t0", "t1", "t2", "t3")) in note
    # The input is untouched; nothing but the tenant changes.
    assert set(_tenants(trace)) == {"default"}
    assert [dataclasses.replace(job, tenant="default") for job in a.jobs] == trace.jobs


def test_assign_tenants_keeps_named_tenants() -> None:
    trace = _untenanted(30, named_every=3)
    out = assign_tenants(trace, 2, seed=0)
    for before, after in zip(trace.jobs, out.jobs, strict=True):
        if before.tenant == "vc":
            assert after is before  # shared, not copied
        else:
            assert after.tenant in ("t0", "t1")
    assert "20 of 30 jobs" in out.notes[-1]
    assert _tenants(assign_tenants(trace, 1, seed=5)).count("t0") == 20


def test_assign_tenants_without_default_jobs_says_so() -> None:
    trace = _trace()  # tenants t0, t1, t2 from the file
    out = assign_tenants(trace, 4, seed=0)
    assert _tenants(out) == _tenants(trace)
    assert "no job has tenant 'default'" in out.notes[-1]


@pytest.mark.parametrize(("count", "seed"), [(0, 0), (-2, 0), (4, -1)])
def test_assign_tenants_bad_arguments(count: int, seed: int) -> None:
    with pytest.raises(ConfigError, match="assign_tenants"):
        assign_tenants(_untenanted(5), count, seed)


def test_make_opportunistic_is_seeded_and_counts() -> None:
    trace = _untenanted(5_000)  # 1,000 opportunistic already, 4,000 guaranteed
    a, b, c = (make_opportunistic(trace, 0.25, seed=s) for s in (3, 3, 4))
    classes = [[job.job_class for job in t.jobs] for t in (a, b, c)]
    assert classes[0] == classes[1] != classes[2]
    changed = [i for i, (x, y) in enumerate(zip(trace.jobs, a.jobs, strict=True)) if x.job_class != y.job_class]
    assert 900 < len(changed) < 1_100
    assert all(trace.jobs[i].job_class is JobClass.GUARANTEED for i in changed)
    assert all(a.jobs[i] is trace.jobs[i] for i in range(len(trace.jobs)) if i not in set(changed))
    # Already-opportunistic jobs stay so.
    assert all(a.jobs[i].job_class is JobClass.OPPORTUNISTIC for i in range(0, 5_000, 5))
    note = a.notes[-1]
    assert f"{len(changed):,} of 4,000 guaranteed jobs made opportunistic" in note
    assert "1,000 were already" in note and f"now {len(changed) + 1_000:,} of 5,000" in note
    assert trace.jobs[1].job_class is JobClass.GUARANTEED  # the input is untouched


def test_make_opportunistic_extremes_and_bad_fractions() -> None:
    trace = _untenanted(50)
    assert all(x is y for x, y in zip(trace.jobs, make_opportunistic(trace, 0.0, seed=0).jobs, strict=True))
    assert {job.job_class for job in make_opportunistic(trace, 1.0, seed=0).jobs} == {JobClass.OPPORTUNISTIC}
    for bad in (-0.1, 1.5, float("nan")):
        with pytest.raises(ConfigError, match="fraction must be in"):
            make_opportunistic(trace, bad, seed=0)


def test_random_filters_draw_independent_streams() -> None:
    # sample and make_opportunistic with the same seed and fraction must not pick the same jobs.
    trace = _untenanted(1_000)
    kept = set(_ids(sample(trace, 0.5, seed=0)))
    made = {
        job.job_id for job in make_opportunistic(trace, 0.5, seed=0).jobs if job.job_class is JobClass.OPPORTUNISTIC
    }
    made -= {f"j{i}" for i in range(0, 1_000, 5)}
    assert kept != made and 0.3 < len(kept & made) / len(made) < 0.7


def test_build_trace_applies_tenants_then_classes_after_the_limit() -> None:
    # The Tiresias trace names no tenants: --tenants selects "default" before any are assigned.
    spec = WorkloadSpec(fmt="tiresias", path=str(data_file("tiresias", "60_job.csv")), seed=3)
    out = build_trace(dataclasses.replace(spec, tenants=("default",), limit=20, assign_tenants=3, opportunistic=0.5))
    assert len(out) == 20
    assert [n.split(" ")[0] for n in out.notes[-4:]] == ["select_tenants", "head", "tenants:", "opportunistic"]
    assert "20 of 20 jobs had tenant 'default'" in out.notes[-2] and "of 20 guaranteed" in out.notes[-1]
    assert set(_tenants(out)) <= {"t0", "t1", "t2"}
    # The class draw does not depend on whether tenants were assigned.
    plain = build_trace(dataclasses.replace(spec, limit=20, opportunistic=0.5))
    assert [j.job_class for j in plain.jobs] == [j.job_class for j in out.jobs]
