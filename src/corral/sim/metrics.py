"""Metrics of a replay: per-job records, the summary, utilization over time, per-tenant figures.

Definitions (the names are the keys of ``summary.json``):

- JCT (job completion time) = end - submit, over finished jobs; percentiles use linear interpolation
  (numpy's default).
- queueing = seconds a job spent pending, summed over every wait (before its first start and after each
  preemption); ``avg_queueing_s`` is over finished jobs.
- makespan = last completion - first submission.
- ``gpu_alloc_util`` = mean fraction of the cluster's GPUs allocated (shares count: half a GPU is 0.5) over
  the makespan window.
- unschedulable = rejected on admission (a job that can never fit), each with a reason in ``jobs.csv``.

Finish-time fairness (Themis, NSDI'20 §3.2), computed for every policy so that they can be compared:

- ``rho`` of a finished job = JCT / T_id, its time in the shared cluster over its time alone on an equal share.
  T_id = ``duration_s * max(1, demand / (G / N))``: ``duration_s`` is the job's run time alone (consolidated, on
  speed-1.0 GPUs; see ``corral.sim.perf``), ``demand`` its GPUs (``num_gpus * gpu_milli / 1000``: equal to
  ``num_gpus`` for whole-GPU jobs), ``G`` the cluster's GPUs, and ``N`` the *time-averaged* number of
  contending jobs over the job's own lifetime [submit, end]. A job that needs no more than its 1/N share runs
  at full speed (T_id = duration); a wider gang gets only G/N GPUs, so its ideal run stretches by
  demand / (G/N). Themis defines N as the number of contending *apps*; here each job is an app, and a job
  contends from its submission until it ends (pending or running; a job rejected on admission never
  contends). N is averaged because it changes while the job waits and runs: all the N are computed at once in
  O(n log n) from a sweep over submissions and ends (the contention count as a step function and its prefix
  integral). rho = 1 is the ideal (no slower than alone on its share); rho < 1 can happen when a job got more
  than its 1/N share. Jobs without a positive duration (none in a replay) have no rho.
- ``max_rho``, ``p50_rho``, ``p90_rho``, ``p99_rho``: over finished jobs (linear interpolation).
- ``jain_rho_tenants``: Jain's fairness index (sum x)^2 / (n * sum x^2) over the tenants' mean rho (``x`` = one
  tenant's mean rho over its finished jobs; ``n`` = tenants with at least one). 1 means every tenant fared
  alike; 1/n means one tenant took all the unfairness. 0.0 when no job finished (like the other figures).
- ``tenants.csv`` adds ``mean_rho`` and ``max_rho`` per tenant; ``jobs.csv`` adds each job's ``rho``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from corral.core.job import FULL_GPU_MILLI, JobPhase, JobStatus

SUMMARY_KEYS = (
    "jobs_total",
    "jobs_finished",
    "jobs_unschedulable",
    "jobs_unfinished",
    "avg_jct_s",
    "p50_jct_s",
    "p95_jct_s",
    "p99_jct_s",
    "avg_queueing_s",
    "makespan_s",
    "gpu_alloc_util",
    "preemptions",
    "max_rho",
    "p50_rho",
    "p90_rho",
    "p99_rho",
    "jain_rho_tenants",
)


def _round(x: float) -> float:
    # Fixed precision keeps output files byte-identical across runs and readable.
    return round(float(x), 3)


@dataclass(frozen=True, slots=True)
class Window:
    start_s: float
    end_s: float

    @property
    def length_s(self) -> float:
        return max(0.0, self.end_s - self.start_s)


def window_of(jobs: Sequence[JobStatus]) -> Window:
    if not jobs:
        return Window(0.0, 0.0)
    start = min(j.spec.submit_s for j in jobs)
    ends = [j.end_s for j in jobs if j.end_s is not None]
    return Window(start, max(ends) if ends else start)


def jct_stats(jcts: np.ndarray) -> dict[str, float]:
    if not len(jcts):
        return {"avg_jct_s": 0.0, "p50_jct_s": 0.0, "p95_jct_s": 0.0, "p99_jct_s": 0.0}
    p50, p95, p99 = np.percentile(jcts, [50, 95, 99])
    return {
        "avg_jct_s": _round(jcts.mean()),
        "p50_jct_s": _round(p50),
        "p95_jct_s": _round(p95),
        "p99_jct_s": _round(p99),
    }


def mean_contention(submit_s: np.ndarray, end_s: np.ndarray) -> np.ndarray:
    """For each interval [submit, end], the time-averaged number of intervals open during it (itself included).

    The count of open intervals is a step function that changes only at submissions and ends; its prefix
    integral at those points gives every average at once: O(n log n). An interval of zero length gets the count
    at its instant, itself included.
    """
    n = len(submit_s)
    if not n:
        return np.zeros(0)
    points, inverse = np.unique(np.concatenate((submit_s, end_s)), return_inverse=True)
    change = np.bincount(inverse, weights=np.concatenate((np.ones(n), -np.ones(n))), minlength=len(points))
    count = np.cumsum(change)  # open intervals on [points[k], points[k + 1])
    area = np.concatenate(([0.0], np.cumsum(count[:-1] * np.diff(points))))  # integral from points[0] to points[k]
    i_start, i_end = inverse[:n], inverse[n:]
    length = end_s - submit_s
    with np.errstate(invalid="ignore", divide="ignore"):
        avg = (area[i_end] - area[i_start]) / length
    return np.where(length > 0, avg, count[i_start] + 1.0)  # a zero-length interval's own +1 and -1 cancel


def job_rhos(jobs: Sequence[JobStatus], num_gpus: int) -> np.ndarray:
    """Finish-time fairness rho = JCT / T_id for each job, in order; NaN where undefined (a job that did not
    finish, or has no positive duration). See the module docstring for T_id and N."""
    n = len(jobs)
    rho = np.full(n, np.nan)
    if not n or num_gpus <= 0:
        return rho
    horizon = window_of(jobs).end_s
    contends = [i for i, j in enumerate(jobs) if j.phase is not JobPhase.REJECTED]
    submit = np.fromiter((jobs[i].spec.submit_s for i in contends), float, len(contends))
    end = np.fromiter((horizon if (e := jobs[i].end_s) is None else e for i in contends), float, len(contends))
    contention = mean_contention(submit, np.maximum(end, submit))
    for k, i in enumerate(contends):
        job = jobs[i]
        d = job.spec.duration_s
        if job.phase is not JobPhase.FINISHED or job.end_s is None or d is None or d <= 0:
            continue
        demand = job.spec.gpu_demand_milli / FULL_GPU_MILLI
        ideal = d * max(1.0, demand * contention[k] / num_gpus)
        rho[i] = (job.end_s - job.spec.submit_s) / ideal
    return rho


def jain_index(values: np.ndarray) -> float:
    """Jain's fairness index (sum x)^2 / (n sum x^2): 1 when all are equal, 1/n when one holds everything."""
    if not len(values):
        return 0.0
    squares = float(np.sum(values * values))
    return float(np.sum(values)) ** 2 / (len(values) * squares) if squares > 0 else 1.0


def _tenant_means(jobs: Sequence[JobStatus], rho: np.ndarray) -> dict[str, tuple[float, float]]:
    """``tenant -> (mean rho, max rho)`` over the tenant's jobs that have a rho."""
    groups: dict[str, list[float]] = {}
    for job, r in zip(jobs, rho.tolist(), strict=True):
        if not math.isnan(r):
            groups.setdefault(job.spec.tenant, []).append(r)
    return {t: (sum(v) / len(v), max(v)) for t, v in groups.items()}


def rho_stats(jobs: Sequence[JobStatus], rho: np.ndarray) -> dict[str, float]:
    got = rho[~np.isnan(rho)]
    if not len(got):
        return {"max_rho": 0.0, "p50_rho": 0.0, "p90_rho": 0.0, "p99_rho": 0.0, "jain_rho_tenants": 0.0}
    p50, p90, p99 = np.percentile(got, [50, 90, 99])
    means = np.array([m for m, _ in _tenant_means(jobs, rho).values()])
    return {
        "max_rho": _round_rho(got.max()),
        "p50_rho": _round_rho(p50),
        "p90_rho": _round_rho(p90),
        "p99_rho": _round_rho(p99),
        "jain_rho_tenants": round(jain_index(means), 6),
    }


def _round_rho(x: float) -> float:
    return round(float(x), 4)


def summarize(jobs: Sequence[JobStatus], alloc_area_milli_s: float, num_gpus: int) -> dict[str, Any]:
    finished = [j for j in jobs if j.phase is JobPhase.FINISHED]
    rejected = sum(1 for j in jobs if j.phase is JobPhase.REJECTED)
    jcts = np.fromiter((j.end_s - j.spec.submit_s for j in finished if j.end_s is not None), float, len(finished))
    queued = np.fromiter((j.queued_s for j in finished), float, len(finished))
    win = window_of(jobs)
    capacity = num_gpus * FULL_GPU_MILLI * win.length_s
    out: dict[str, Any] = {
        "jobs_total": len(jobs),
        "jobs_finished": len(finished),
        "jobs_unschedulable": rejected,
        "jobs_unfinished": len(jobs) - len(finished) - rejected,
    }
    out.update(jct_stats(jcts))
    out["avg_queueing_s"] = _round(queued.mean()) if len(queued) else 0.0
    out["makespan_s"] = _round(win.length_s)
    out["gpu_alloc_util"] = round(alloc_area_milli_s / capacity, 6) if capacity > 0 else 0.0
    out["preemptions"] = sum(j.preemptions for j in jobs)
    out.update(rho_stats(jobs, job_rhos(jobs, num_gpus)))
    return out


def per_tenant(jobs: Sequence[JobStatus], num_gpus: int | None = None) -> list[dict[str, Any]]:
    """One row per tenant, by name. With ``num_gpus`` (the cluster's, needed for T_id), also ``mean_rho`` and
    ``max_rho`` over the tenant's finished jobs (0.0 when none finished)."""
    groups: dict[str, list[JobStatus]] = {}
    for job in jobs:
        groups.setdefault(job.spec.tenant, []).append(job)
    fairness = _tenant_means(jobs, job_rhos(jobs, num_gpus)) if num_gpus is not None else None
    rows = []
    for tenant in sorted(groups):
        members = groups[tenant]
        finished = [j for j in members if j.phase is JobPhase.FINISHED]
        jcts = np.fromiter((j.end_s - j.spec.submit_s for j in finished if j.end_s is not None), float)
        queued = np.fromiter((j.queued_s for j in finished), float)
        gpu_s = sum(j.executed_s * j.spec.gpu_demand_milli for j in members) / FULL_GPU_MILLI
        row: dict[str, Any] = {
            "tenant": tenant,
            "jobs": len(members),
            "finished": len(finished),
            "unschedulable": sum(1 for j in members if j.phase is JobPhase.REJECTED),
            "avg_jct_s": _round(jcts.mean()) if len(jcts) else 0.0,
            "p95_jct_s": _round(np.percentile(jcts, 95)) if len(jcts) else 0.0,
            "avg_queueing_s": _round(queued.mean()) if len(queued) else 0.0,
            "gpu_hours": _round(gpu_s / 3600.0),
        }
        if fairness is not None:
            mean_rho, max_rho = fairness.get(tenant, (0.0, 0.0))
            row["mean_rho"] = _round_rho(mean_rho)
            row["max_rho"] = _round_rho(max_rho)
        rows.append(row)
    return rows


def utilization_bins(
    times_s: Sequence[float], alloc_milli: Sequence[int], window: Window, num_gpus: int, bin_s: float | None = None
) -> tuple[float, list[tuple[float, float]]]:
    """Time-weighted mean allocated fraction in fixed bins over ``window``: ``(bin_s, [(start_s, frac)...])``.

    ``times_s``/``alloc_milli`` are the change points (allocation from each time until the next). The bin width
    defaults to a round number of minutes giving at most about 1,000 bins.
    """
    length = window.length_s
    if bin_s is None:
        bin_s = 60.0
        while length / bin_s > 1000:
            bin_s *= 2 if bin_s < 3600 else 1.5
    bins = max(1, int(np.ceil(length / bin_s))) if length > 0 else 1
    area = np.zeros(bins)
    t = np.asarray(times_s, float)
    a = np.asarray(alloc_milli, float)
    if len(t):
        ends = np.append(t[1:], max(window.end_s, t[-1]))
        for s, e, v in zip(t, ends, a, strict=True):
            if v == 0 or e <= s:
                continue
            s = max(s, window.start_s)
            e = min(e, window.end_s)
            if e <= s:
                continue
            b0 = int((s - window.start_s) // bin_s)
            b1 = min(bins - 1, int((e - window.start_s) // bin_s))
            if b0 == b1:
                area[b0] += v * (e - s)
                continue
            area[b0] += v * (window.start_s + (b0 + 1) * bin_s - s)
            area[b0 + 1 : b1] += v * bin_s
            area[b1] += v * (e - (window.start_s + b1 * bin_s))
    frac = area / (num_gpus * FULL_GPU_MILLI * bin_s)
    return bin_s, [(_round(window.start_s + i * bin_s), round(float(f), 6)) for i, f in enumerate(frac)]
