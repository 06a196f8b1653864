"""Finish-time fairness metrics: the contention sweep, rho per job, its summary figures and Jain's index over
tenants, each checked by hand; the sweep also against a brute-force count on random intervals."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from builders import cluster, job, run
from corral.core.job import JobPhase, JobSpec
from corral.core.status import JobStatus
from corral.policies.registry import make_policy
from corral.sim.metrics import SUMMARY_KEYS, jain_index, job_rhos, mean_contention, per_tenant, summarize


def finished(spec: JobSpec, end: float) -> JobStatus:
    return JobStatus(spec=spec, phase=JobPhase.FINISHED, first_start_s=spec.submit_s, end_s=end)


# -- the contention sweep -----------------------------------------------------------------------------------
def test_mean_contention_by_hand() -> None:
    # a [0, 10], b [5, 15], c [5, 6]. Open intervals: 1 on [0, 5), 3 on [5, 6), 2 on [6, 10), 1 on [10, 15).
    # a: (5x1 + 1x3 + 4x2) / 10 = 1.6; b: (1x3 + 4x2 + 5x1) / 10 = 1.6; c: 3 for its whole second.
    got = mean_contention(np.array([0.0, 5.0, 5.0]), np.array([10.0, 15.0, 6.0]))
    assert got.tolist() == pytest.approx([1.6, 1.6, 3.0])


def test_a_zero_length_interval_gets_the_count_at_its_instant() -> None:
    # b has no length at t=5, inside a: two intervals are open there (a and b itself).
    got = mean_contention(np.array([0.0, 5.0]), np.array([10.0, 5.0]))
    assert got.tolist() == pytest.approx([1.0, 2.0])


def _brute(submit: list[float], end: list[float]) -> list[float]:
    out = []
    for s, e in zip(submit, end, strict=True):
        if e == s:
            out.append(1 + sum(1 for s2, e2 in zip(submit, end, strict=True) if s2 <= s < e2))
            continue
        # The count is piecewise constant between consecutive interval ends: integrate it exactly.
        cuts = sorted({s, e, *(x for x in (*submit, *end) if s < x < e)})
        area = 0.0
        for lo, hi in itertools.pairwise(cuts):
            area += (hi - lo) * sum(1 for s2, e2 in zip(submit, end, strict=True) if s2 <= lo < e2)
        out.append(area / (e - s))
    return out


@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 30)), min_size=1, max_size=30))
def test_mean_contention_matches_a_brute_force_count(pairs: list[tuple[int, int]]) -> None:
    submit = [float(s) for s, _ in pairs]
    end = [float(s + length) for s, length in pairs]
    assert mean_contention(np.array(submit), np.array(end)).tolist() == pytest.approx(_brute(submit, end))


# -- rho per job ----------------------------------------------------------------------------------------------
def test_rho_of_two_jobs_sharing_one_gpu() -> None:
    # One GPU, FIFO: a runs 0-100, b (submitted at 0) 100-200. G = 1.
    #   a: 2 jobs contend over [0, 100] -> N = 2, T_id = 100 x max(1, 1 x 2 / 1) = 200 -> rho 100 / 200 = 0.5
    #   b: 2 over [0, 100), 1 over [100, 200) -> N = 1.5, T_id = 150 -> rho 200 / 150 = 1.3333
    result = run([job("a", duration=100), job("b", duration=100)], cluster(nodes=1, gpus=1), make_policy("fifo"))
    assert job_rhos(result.jobs, 1).tolist() == pytest.approx([0.5, 4 / 3])
    s = result.summary
    assert (s["max_rho"], s["p50_rho"], s["p90_rho"], s["p99_rho"]) == (1.3333, 0.9167, 1.25, 1.325)
    assert s["jain_rho_tenants"] == 1.0  # one tenant


def test_a_job_narrower_than_its_share_has_t_id_equal_to_its_duration() -> None:
    # 2 jobs contend on 8 GPUs: a 1-GPU job's share is 4 GPUs, so T_id = duration and rho = JCT / duration;
    # the 8-GPU job gets 4 of its 8 GPUs in the ideal world: T_id = 2 x duration.
    jobs = [finished(job("one", duration=100), 150.0), finished(job("eight", gpus=8, duration=100), 100.0)]
    assert job_rhos(jobs, 8).tolist() == pytest.approx([1.5, 0.5])


def test_jobs_without_rho() -> None:
    # A rejected job never contends and has no rho; nor has a job that did not finish, or one with no work.
    rejected = JobStatus(spec=job("r", gpus=64), phase=JobPhase.REJECTED, reason="too big")
    pending = JobStatus(spec=job("p", submit=5))
    empty = finished(job("e", duration=0), 0.0)
    ok = finished(job("ok", duration=10), 10.0)
    rho = job_rhos([rejected, pending, empty, ok], 1)
    assert math.isnan(rho[0]) and math.isnan(rho[1]) and math.isnan(rho[2])
    # ok contends over [0, 10] with p (pending from 5 to the end of the window, t=10): N = 1.5, T_id = 15.
    assert rho[3] == pytest.approx(10 / 15)


# -- per tenant and Jain's index ----------------------------------------------------------------------------
def test_jain_index() -> None:
    assert jain_index(np.array([2.0, 2.0, 2.0])) == pytest.approx(1.0)
    assert jain_index(np.array([1.0, 3.0])) == pytest.approx(16 / 20)
    assert jain_index(np.array([1.0, 0.0, 0.0, 0.0])) == pytest.approx(1 / 4)
    assert jain_index(np.array([])) == 0.0


def test_fairness_per_tenant() -> None:
    # A cluster so large that every T_id is the job's duration: rho = JCT / duration.
    # x1: 1.0, x2: 1.0 -> tenant x mean 1.0, max 1.0; y1: 3.0 -> tenant y 3.0. Jain over (1, 3) = 0.8.
    jobs = [
        finished(job("x1", duration=10, tenant="x"), 10.0),
        finished(job("x2", duration=20, tenant="x"), 20.0),
        finished(job("y1", duration=10, tenant="y"), 30.0),
    ]
    rows = per_tenant(jobs, 1000)
    assert [(r["tenant"], r["mean_rho"], r["max_rho"]) for r in rows] == [("x", 1.0, 1.0), ("y", 3.0, 3.0)]
    assert list(rows[0]) == [
        "tenant", "jobs", "finished", "rejected", "avg_jct_s", "p95_jct_s", "avg_queueing_s", "gpu_hours",
        "mean_rho", "max_rho",
    ]  # fmt: skip
    assert "mean_rho" not in per_tenant(jobs)[0]  # without the cluster's size there is no T_id
    summary = summarize(jobs, 0.0, 1000)
    assert summary["jain_rho_tenants"] == 0.8
    assert summary["max_rho"] == 3.0 and summary["p50_rho"] == 1.0


def test_summary_keys_and_an_empty_replay() -> None:
    summary = summarize([], 0.0, 8)
    assert list(summary) == list(SUMMARY_KEYS)
    assert all(summary[k] == 0.0 for k in ("max_rho", "p50_rho", "p90_rho", "p99_rho", "jain_rho_tenants"))
