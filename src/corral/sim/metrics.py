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
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
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
    return out


def per_tenant(jobs: Iterable[JobStatus]) -> list[dict[str, Any]]:
    groups: dict[str, list[JobStatus]] = {}
    for job in jobs:
        groups.setdefault(job.spec.tenant, []).append(job)
    rows = []
    for tenant in sorted(groups):
        members = groups[tenant]
        finished = [j for j in members if j.phase is JobPhase.FINISHED]
        jcts = np.fromiter((j.end_s - j.spec.submit_s for j in finished if j.end_s is not None), float)
        queued = np.fromiter((j.queued_s for j in finished), float)
        gpu_s = sum(j.executed_s * j.spec.gpu_demand_milli for j in members) / FULL_GPU_MILLI
        rows.append(
            {
                "tenant": tenant,
                "jobs": len(members),
                "finished": len(finished),
                "unschedulable": sum(1 for j in members if j.phase is JobPhase.REJECTED),
                "avg_jct_s": _round(jcts.mean()) if len(jcts) else 0.0,
                "p95_jct_s": _round(np.percentile(jcts, 95)) if len(jcts) else 0.0,
                "avg_queueing_s": _round(queued.mean()) if len(queued) else 0.0,
                "gpu_hours": _round(gpu_s / 3600.0),
            }
        )
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
