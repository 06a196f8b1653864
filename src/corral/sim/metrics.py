"""Metrics of a replay: per-job records, the summary, utilization over time, per-tenant figures.

Definitions (the names are the keys of ``summary.json``):

- JCT (job completion time) = end - submit, over finished jobs; percentiles use linear interpolation
  (numpy's default; means and percentiles are numpy's, bit for bit, computed without it: :mod:`corral.sim.stats`).
- queueing = seconds a job spent pending, summed over every wait (before its first start and after each
  preemption); ``avg_queueing_s`` is over finished jobs.
- makespan = last completion - first submission.
- ``gpu_alloc_util`` = mean fraction of the cluster's GPUs allocated (shares count: half a GPU is 0.5) over
  the makespan window.
- rejected = refused on admission (a job that can never fit), each with a reason in ``jobs.csv`` (its status
  there is ``rejected`` too: one word in every output).

Node failures (``--node-failures``, ``--node-failure-rate``; :mod:`corral.sim.failures`), all 0 in a replay without:

- ``node_failures``: nodes lost during the replay (a node lost twice counts twice);
- ``jobs_requeued_by_failures``: runs stopped and requeued because a node they held a GPU of was lost (a job
  requeued twice counts twice); each also counts in ``preemptions``;
- ``lost_work_gpu_h``: GPU-hours of work those losses undid (progress since each job's last checkpoint, see
  ``corral.sim.perf``, times its GPUs; suspended state lost with a node included);
- ``down_gpu_h``: GPU-hours of capacity down, over the makespan window. ``gpu_alloc_util`` keeps counting every
  GPU, up or down, so that replays with and without failures compare on one scale.

Finish-time fairness (Themis, NSDI'20 §3.2), computed for every policy so that they can be compared:

- ``rho`` of a finished job = JCT / T_id, its time in the shared cluster over its time alone on an equal share.
  T_id = ``duration_s / v * max(1, demand / (G / N))``: ``duration_s`` is the job's work (its run time alone,
  consolidated, on speed-1.0 GPUs; see ``corral.sim.perf``), ``v`` the speed of the GPUs it ran on (below),
  ``demand`` its GPUs (``num_gpus * gpu_milli / 1000``: equal to ``num_gpus`` for whole-GPU jobs), ``G`` the
  cluster's GPUs, and ``N`` the *time-averaged* number of contending jobs over the job's own lifetime
  [submit, end]. A job that needs no more than its 1/N share runs at full speed (T_id = duration / v); a wider
  gang gets only G/N GPUs, so its ideal run stretches by demand / (G/N).
  ``v`` is the speed of the GPU type the job ran on, as the performance model counts it (``GpuType.speed``, or
  1.0 for every type with ``--perf gpu_speed=false``): the time alone runs on the same GPUs as the job's own
  runs, so a job alone on a cluster of speed-2.0 GPUs has rho 1, not 0.5, and a job is neither flattered by fast
  GPUs nor blamed for slow ones. A job that ran on types of several speeds (preempted on one, resumed on
  another) gets their harmonic mean weighted by the work done on each (``SimExecutor.job_speeds``): its time
  alone splits its duration between the types as its work was split, each part at its type's speed. On a
  cluster of speed-1.0 GPUs v = 1 exactly, and T_id is what it was before v existed.
  Themis defines N as the number of contending *apps*; here each job is an app, and a job
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

GPU sharing (AntMan, OSDI'20 §6 reports memory and SM utilization, guaranteed jobs' slowdown and opportunistic
jobs' progress), computed for every policy from what the simulated executor measured (``corral.sim.executor``):

- ``gpu_sm_util``: mean fraction of the cluster's GPU time that kernels kept busy (*used*, not allocated: a
  whole GPU allocated to a job that keeps it 40% busy counts 0.4), over the makespan window;
- ``gpu_mem_util``: mean fraction of the cluster's GPU memory in use (each job's mean footprint over a
  mini-batch, within its cap), over the window;
- slowdown of a job = seconds it ran / seconds the same progress would have taken alone on the same GPUs
  (1.0 = never slowed by a neighbour). ``g_slowdown_p50``/``_p99``/``_max``: over jobs submitted as guaranteed
  that ran;
- ``opp_jobs``, ``opp_finished``, ``opp_avg_jct_s``, ``opp_p99_jct_s``: jobs submitted as opportunistic;
  ``opp_throughput``: their progress while running as a fraction of what they would have made alone (total solo
  seconds / total run seconds); ``upgrades``: opportunistic jobs made guaranteed;
- ``quota_shortfall_gpu_h``: summed over tenants with a quota, GPU-hours of ``min(quota - held, pending
  guaranteed demand)`` (``corral.engine.state``): promised capacity a tenant asked for and did not get. 0 means no
  tenant's guaranteed jobs waited below its quota. ``tenants.csv`` adds ``quota_gpus``, ``quota_use`` (mean
  held / quota) and ``shortfall_gpu_h`` per tenant.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from corral.core.job import FULL_GPU_MILLI, JobClass, JobPhase
from corral.core.status import JobStatus
from corral.sim.stats import fsum_pairwise, mean, percentiles

SUMMARY_KEYS = (
    "jobs_total",
    "jobs_finished",
    "jobs_rejected",
    "jobs_unfinished",
    "avg_jct_s",
    "p50_jct_s",
    "p95_jct_s",
    "p99_jct_s",
    "avg_queueing_s",
    "makespan_s",
    "gpu_alloc_util",
    "preemptions",
    "node_failures",
    "jobs_requeued_by_failures",
    "lost_work_gpu_h",
    "down_gpu_h",
    "max_rho",
    "p50_rho",
    "p90_rho",
    "p99_rho",
    "jain_rho_tenants",
    "gpu_sm_util",
    "gpu_mem_util",
    "g_slowdown_p50",
    "g_slowdown_p99",
    "g_slowdown_max",
    "opp_jobs",
    "opp_finished",
    "opp_avg_jct_s",
    "opp_p99_jct_s",
    "opp_throughput",
    "upgrades",
    "quota_shortfall_gpu_h",
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
    """From the first submission to the last end (to the first submission when nothing ended)."""
    if not jobs:
        return Window(0.0, 0.0)
    start = math.inf
    end: float | None = None
    for j in jobs:  # one pass (a million-job replay's metrics made four of these, issue 20)
        s = j.spec.submit_s
        if s < start:
            start = s
        e = j.end_s
        if e is not None and (end is None or e > end):
            end = e
    return Window(start, start if end is None else end)


def jct_stats(jcts: Sequence[float]) -> dict[str, float]:
    if not len(jcts):
        return {"avg_jct_s": 0.0, "p50_jct_s": 0.0, "p95_jct_s": 0.0, "p99_jct_s": 0.0}
    p50, p95, p99 = percentiles(jcts, (50, 95, 99))
    return {
        "avg_jct_s": _round(mean(jcts)),
        "p50_jct_s": _round(p50),
        "p95_jct_s": _round(p95),
        "p99_jct_s": _round(p99),
    }


def mean_contention(submit_s: Sequence[float], end_s: Sequence[float]) -> array[float]:
    """For each interval [submit, end] (end >= submit), the time-averaged number of intervals open during it (itself
    included).

    The count of open intervals is a step function that changes only at submissions and ends; its prefix integral
    at those points gives every average at once: one sweep over the points in time order, O(n log n) for the sort
    of the ends (the submissions of a replay come sorted: then they are not sorted again). An interval of zero
    length gets the count at its instant, itself included. The arithmetic is numpy's ``unique``/``cumsum`` version's
    (which this replaced, issue 20), operation for operation, so the figures are the same to the last bit: the
    prefix integral is summed in time order, point by point.
    """
    n = len(submit_s)
    out = array("d", bytes(8 * n))
    if not n:
        return out
    sorted_submits = all(submit_s[i] <= submit_s[i + 1] for i in range(n - 1))
    by_submit: Sequence[int] = range(n) if sorted_submits else sorted(range(n), key=submit_s.__getitem__)
    by_end = sorted(range(n), key=end_s.__getitem__)
    area_at_start = array("d", bytes(8 * n))
    i = j = 0  # next submission, next end, in time order
    count = 0  # intervals open since the last point (its own changes included)
    area = 0.0  # the integral of count from the first point to the current one
    # The next submission's and the next end's times, each read once (issue 20: the sweep read each three times).
    s_next = submit_s[by_submit[0]]
    e_next = end_s[by_end[0]]
    point = min(s_next, e_next)
    while j < n:
        nxt = e_next if i == n else min(s_next, e_next)
        if nxt != point:
            area += count * (nxt - point)
            point = nxt
        # Every change at this point first, then the figures of the intervals that start or end at it.
        starts = i
        while i < n and s_next == point:
            i += 1
            if i < n:
                s_next = submit_s[by_submit[i]]
        ends = j
        while j < n and e_next == point:
            j += 1
            if j < n:
                e_next = end_s[by_end[j]]
        count += (i - starts) - (j - ends)
        for k in range(starts, i):
            area_at_start[by_submit[k]] = area
        for k in range(ends, j):
            job = by_end[k]
            length = point - submit_s[job]  # its end is this point
            # A zero-length interval's own +1 and -1 cancel in the count at its instant.
            out[job] = (area - area_at_start[job]) / length if length > 0 else count + 1.0
    return out


def job_rhos(
    jobs: Sequence[JobStatus],
    num_gpus: int,
    speeds: Mapping[str, float] | None = None,
    window: Window | None = None,
) -> array[float]:
    """Finish-time fairness rho = JCT / T_id for each job, in order; NaN where undefined (a job that did not
    finish, or has no positive duration). See the module docstring for T_id and N. ``speeds``: job id -> the
    speed ``v`` of the GPUs it ran on (``SimExecutor.job_speeds``); 1.0 for a job not in it. ``window``:
    ``window_of(jobs)``, when the caller has it already."""
    n = len(jobs)
    rho = array("d", [math.nan]) * n
    if not n or num_gpus <= 0:
        return rho
    horizon = (window if window is not None else window_of(jobs)).end_s
    # Indices and times in arrays, not lists (8 bytes a job, not 36), filled by appending (the compiled build would
    # make a generator a list first): this is the peak of a million-job replay's memory (issue 20).
    contends, submit, end = array("q"), array("d"), array("d")
    for i, job in enumerate(jobs):
        if job.phase is not JobPhase.REJECTED:
            contends.append(i)
            s = job.spec.submit_s
            submit.append(s)
            end.append(max(horizon if (e := job.end_s) is None else e, s))
    contention = mean_contention(submit, end)
    del submit, end
    for k, i in enumerate(contends):
        job = jobs[i]
        d = job.spec.duration_s
        if job.phase is not JobPhase.FINISHED or job.end_s is None or d is None or d <= 0:
            continue
        demand = job.spec.gpu_demand_milli / FULL_GPU_MILLI
        speed = speeds.get(job.spec.job_id, 1.0) if speeds else 1.0
        ideal = d / speed * max(1.0, demand * contention[k] / num_gpus)
        rho[i] = (job.end_s - job.spec.submit_s) / ideal
    return rho


def jain_index(values: Sequence[float]) -> float:
    """Jain's fairness index (sum x)^2 / (n sum x^2): 1 when all are equal, 1/n when one holds everything."""
    if not len(values):
        return 0.0
    squares = fsum_pairwise([x * x for x in values])
    return fsum_pairwise(values) ** 2 / (len(values) * squares) if squares > 0 else 1.0


def _mean_rho(rhos: list[float]) -> float:
    """A tenant's mean rho, summed in job order: the same figure in the summary's Jain index and in tenants.csv."""
    return sum(rhos, 0.0) / len(rhos)


def _tenant_means(jobs: Sequence[JobStatus], rho: Sequence[float]) -> dict[str, float]:
    """``tenant -> mean rho`` over the tenant's jobs that have a rho."""
    groups: dict[str, list[float]] = {}
    for job, r in zip(jobs, rho, strict=True):
        if not math.isnan(r):
            groups.setdefault(job.spec.tenant, []).append(r)
    return {t: _mean_rho(v) for t, v in groups.items()}


def rho_stats(jobs: Sequence[JobStatus], rho: Sequence[float]) -> dict[str, float]:
    got = [r for r in rho if not math.isnan(r)]
    if not got:
        return {"max_rho": 0.0, "p50_rho": 0.0, "p90_rho": 0.0, "p99_rho": 0.0, "jain_rho_tenants": 0.0}
    p50, p90, p99 = percentiles(got, (50, 90, 99))
    means = list(_tenant_means(jobs, rho).values())
    return {
        "max_rho": _round_rho(max(got)),
        "p50_rho": _round_rho(p50),
        "p90_rho": _round_rho(p90),
        "p99_rho": _round_rho(p99),
        "jain_rho_tenants": round(jain_index(means), 6),
    }


def _round_rho(x: float) -> float:
    return round(float(x), 4)


@dataclass(frozen=True, slots=True)
class Failures:
    """What node losses did in a replay, for :func:`summarize` (see the module docstring)."""

    node_failures: int = 0
    requeued: int = 0
    lost_work_gpu_s: float = 0.0
    down_gpu_s: float = 0.0


def summarize(
    jobs: Sequence[JobStatus],
    alloc_area_milli_s: float,
    num_gpus: int,
    usage: Usage | None = None,
    failures: Failures | None = None,
    rho: Sequence[float] | None = None,
    window: Window | None = None,
) -> dict[str, Any]:
    """Every key of :data:`SUMMARY_KEYS`; the measured-use ones are 0 without ``usage``, the node-failure ones
    without ``failures``. ``rho``: :func:`job_rhos` of these jobs, when the caller has it already (a replay needs it
    for :func:`per_tenant` too, and it costs a pass over every job); ``window``: ``window_of(jobs)``, likewise."""
    finished: list[JobStatus] = []
    rejected = preemptions = 0
    for j in jobs:
        phase = j.phase
        if phase is JobPhase.FINISHED:
            finished.append(j)
        elif phase is JobPhase.REJECTED:
            rejected += 1
        preemptions += j.preemptions
    jcts = [j.end_s - j.spec.submit_s for j in finished if j.end_s is not None]
    queued = [j.queued_s for j in finished]
    win = window if window is not None else window_of(jobs)
    capacity = num_gpus * FULL_GPU_MILLI * win.length_s
    out: dict[str, Any] = {
        "jobs_total": len(jobs),
        "jobs_finished": len(finished),
        "jobs_rejected": rejected,
        "jobs_unfinished": len(jobs) - len(finished) - rejected,
    }
    out.update(jct_stats(jcts))
    out["avg_queueing_s"] = _round(mean(queued)) if queued else 0.0
    out["makespan_s"] = _round(win.length_s)
    out["gpu_alloc_util"] = round(alloc_area_milli_s / capacity, 6) if capacity > 0 else 0.0
    out["preemptions"] = preemptions
    f = failures if failures is not None else Failures()
    out["node_failures"] = f.node_failures
    out["jobs_requeued_by_failures"] = f.requeued
    out["lost_work_gpu_h"] = _round(f.lost_work_gpu_s / 3600.0)
    out["down_gpu_h"] = _round(f.down_gpu_s / 3600.0)
    if rho is None:
        rho = job_rhos(jobs, num_gpus, usage.job_speeds if usage is not None else None, win)
    out.update(rho_stats(jobs, rho))
    out.update(sharing_stats(jobs, usage if usage is not None else Usage(0.0, 0.0, 1, {}, {}), num_gpus, win))
    return out


class _TenantSums:
    """What :func:`per_tenant` gathers for one tenant in its one pass over the jobs, in job order."""

    __slots__ = ("finished", "gpu_milli_s", "jcts", "jobs", "queued", "rejected", "rhos")

    def __init__(self) -> None:
        self.jobs = 0
        self.finished = 0
        self.rejected = 0
        self.jcts: list[float] = []
        self.queued: list[float] = []
        self.gpu_milli_s = 0.0
        self.rhos: list[float] = []


def per_tenant(
    jobs: Sequence[JobStatus],
    num_gpus: int | None = None,
    speeds: Mapping[str, float] | None = None,
    rho: Sequence[float] | None = None,
) -> list[dict[str, Any]]:
    """One row per tenant, by name. With ``num_gpus`` (the cluster's, needed for T_id), also ``mean_rho`` and
    ``max_rho`` over the tenant's finished jobs (0.0 when none finished); ``speeds`` as for :func:`job_rhos`;
    ``rho``: ``job_rhos(jobs, num_gpus, speeds)`` when the caller has it already."""
    if num_gpus is not None and rho is None:
        rho = job_rhos(jobs, num_gpus, speeds)
    # One pass over the jobs (issue 20: it was one per figure); every sum still runs in job order.
    sums: dict[str, _TenantSums] = {}
    for i, job in enumerate(jobs):
        spec = job.spec
        t = sums.get(spec.tenant)
        if t is None:
            t = sums[spec.tenant] = _TenantSums()
        t.jobs += 1
        phase = job.phase
        if phase is JobPhase.FINISHED:
            t.finished += 1
            end = job.end_s
            if end is not None:
                t.jcts.append(end - spec.submit_s)
            t.queued.append(job.queued_s)
        elif phase is JobPhase.REJECTED:
            t.rejected += 1
        t.gpu_milli_s += job.executed_s * spec.gpu_demand_milli
        if rho is not None:
            r = rho[i]
            if not math.isnan(r):
                t.rhos.append(r)
    rows = []
    for tenant in sorted(sums):
        t = sums[tenant]
        jcts, queued = t.jcts, t.queued
        row: dict[str, Any] = {
            "tenant": tenant,
            "jobs": t.jobs,
            "finished": t.finished,
            "rejected": t.rejected,
            "avg_jct_s": _round(mean(jcts)) if jcts else 0.0,
            "p95_jct_s": _round(percentiles(jcts, (95,))[0]) if jcts else 0.0,
            "avg_queueing_s": _round(mean(queued)) if queued else 0.0,
            "gpu_hours": _round(t.gpu_milli_s / FULL_GPU_MILLI / 3600.0),
        }
        if num_gpus is not None:
            rhos = t.rhos
            row["mean_rho"] = _round_rho(_mean_rho(rhos)) if rhos else 0.0
            row["max_rho"] = _round_rho(max(rhos)) if rhos else 0.0
        rows.append(row)
    return rows


def utilization_bins(
    times_s: Sequence[float], alloc_milli: Sequence[float], window: Window, num_gpus: int, bin_s: float | None = None
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
    bins = max(1, math.ceil(length / bin_s)) if length > 0 else 1
    area = [0.0] * bins
    t = [float(x) for x in times_s]
    a = [float(x) for x in alloc_milli]
    if t:
        ends = [*t[1:], max(window.end_s, t[-1])]
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
            full = v * bin_s
            for b in range(b0 + 1, b1):
                area[b] += full
            area[b1] += v * (e - (window.start_s + b1 * bin_s))
    capacity = num_gpus * FULL_GPU_MILLI * bin_s
    return bin_s, [(_round(window.start_s + i * bin_s), round(x / capacity, 6)) for i, x in enumerate(area)]


@dataclass(frozen=True, slots=True)
class Usage:
    """What the executor measured and the state integrated, for :func:`sharing_stats`."""

    sm_area: float  # SM-busy GPU x s
    mem_area_mib_s: float  # memory in use, MiB x s
    total_mem_mib: int  # the cluster's GPU memory
    job_times: dict[str, list[float]]  # job -> [run_s, solo_s]
    tenant_areas: dict[str, tuple[int, float, float]]  # tenant with quota -> (quota GPUs, held, shortfall) milli x s
    job_speeds: dict[str, float] = field(default_factory=dict)  # job -> speed of the GPUs it ran on (for rho)


def job_slowdown(times: list[float] | None) -> float | None:
    """Run seconds over solo seconds, or None for a job that made no progress while running."""
    if times is None or times[1] <= 0:
        return None
    return times[0] / times[1]


def sharing_stats(
    jobs: Sequence[JobStatus], usage: Usage, num_gpus: int, window: Window | None = None
) -> dict[str, Any]:
    """The GPU-sharing part of the summary (see the module docstring); ``window``: ``window_of(jobs)``, when the
    caller has it already."""
    win = window if window is not None else window_of(jobs)
    length = win.length_s
    out: dict[str, Any] = {
        "gpu_sm_util": round(usage.sm_area / (num_gpus * length), 6) if length > 0 else 0.0,
        "gpu_mem_util": round(usage.mem_area_mib_s / (usage.total_mem_mib * length), 6) if length > 0 else 0.0,
    }
    slow = [
        x
        for j in jobs
        if j.spec.job_class is JobClass.GUARANTEED and (x := job_slowdown(usage.job_times.get(j.spec.job_id)))
    ]
    if slow:
        p50, p99 = percentiles(slow, (50, 99))
        out.update(g_slowdown_p50=_round_rho(p50), g_slowdown_p99=_round_rho(p99), g_slowdown_max=_round_rho(max(slow)))
    else:
        out.update(g_slowdown_p50=0.0, g_slowdown_p99=0.0, g_slowdown_max=0.0)
    opp = [j for j in jobs if j.spec.job_class is JobClass.OPPORTUNISTIC]
    done = [j for j in opp if j.phase is JobPhase.FINISHED and j.end_s is not None]
    jcts = [j.end_s - j.spec.submit_s for j in done if j.end_s is not None]
    run = solo = 0.0
    for j in opp:
        times = usage.job_times.get(j.spec.job_id)
        if times is not None:
            run += times[0]
            solo += times[1]
    out["opp_jobs"] = len(opp)
    out["opp_finished"] = len(done)
    out["opp_avg_jct_s"] = _round(mean(jcts)) if jcts else 0.0
    out["opp_p99_jct_s"] = _round(percentiles(jcts, (99,))[0]) if jcts else 0.0
    out["opp_throughput"] = _round_rho(solo / run) if run > 0 else 0.0
    out["upgrades"] = sum(1 for j in opp if j.upgraded)
    short = sum((area for _, _, area in usage.tenant_areas.values()), 0.0)
    out["quota_shortfall_gpu_h"] = _round(short / FULL_GPU_MILLI / 3600.0)
    return out


def tenant_quota_columns(rows: list[dict[str, Any]], usage: Usage, window: Window) -> None:
    """Add ``quota_gpus``, ``quota_use`` and ``shortfall_gpu_h`` to per-tenant rows (blank without a quota)."""
    length = window.length_s
    for row in rows:
        got = usage.tenant_areas.get(row["tenant"])
        if got is None:
            row.update(quota_gpus="", quota_use="", shortfall_gpu_h="")
            continue
        quota, held, short = got
        capacity = quota * FULL_GPU_MILLI * length
        row["quota_gpus"] = quota
        row["quota_use"] = round(held / capacity, 6) if capacity > 0 else 0.0
        row["shortfall_gpu_h"] = _round(short / FULL_GPU_MILLI / 3600.0)
