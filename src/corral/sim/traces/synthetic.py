"""Synthetic traces: as many jobs as asked, shaped like a real trace or like Philly by default.

Every random number comes from one ``numpy.random.default_rng(seed)``, drawn in a fixed order, so the same
arguments give the same trace on every machine. The work is vectorised with numpy and the JobSpecs are built
in one loop over plain Python values (``ndarray.tolist()``), so a million jobs take a few seconds and a few
hundred MiB.

Job shapes (duration, GPU count and everything else a job asks for):

- ``like`` given: a bootstrap of its jobs. Each synthetic job copies the duration, ``num_gpus``,
  ``gpu_milli``, model, class, priority, GPU types and GPU memory of a job of ``like`` drawn uniformly with
  replacement. Resampling whole jobs, rather than fitting each distribution on its own, keeps what a fit
  would lose: the exact mix of GPU counts, the multi-modal and heavy-tailed durations of real traces, and the
  link between size and length (big jobs in Philly also tend to run long). The price is that a small ``like``
  trace (60 jobs) only has 60 shapes to offer. Durations below 1 s are raised to 1 s.
- no ``like``: durations are lognormal with a median of 15 minutes and a log-standard-deviation of 2.0
  (Philly's are 19 minutes and 2.16), capped at 60 days (Philly's longest job ran 53); GPU counts are 1, 2, 4,
  8, 16 with probabilities 0.7, 0.1, 0.1, 0.08, 0.02; whole GPUs, guaranteed class, no model.

Tenants: with ``like`` and no ``tenants``, drawn with the frequencies of ``like``'s tenants; with
``tenants=k`` too, from its ``k`` busiest tenants, with their relative frequencies. Without ``like``, ``k``
tenants (default 10) named ``tenant-00``..., with Zipf weights 1/rank, a skew like Philly's, where one virtual
cluster submits half the jobs.

Arrivals (the first job arrives at 0):

- ``"poisson"``: exponential inter-arrival times at ``jobs_per_hour`` (default: ``like``'s average rate,
  jobs over its span; without ``like``, 100 per hour).
- ``"trace"`` (needs ``like``): a block bootstrap of ``like``'s inter-arrival gaps. Gaps are copied in runs
  of consecutive gaps (about a day's worth of jobs per run) from random places in ``like``, so the bursts and
  the day/night rhythm inside each run survive, which resampling single gaps would destroy; only where runs
  meet is the rhythm broken, so the diurnal shape is kept approximately. With ``jobs_per_hour`` given, the
  gaps are scaled so the mean rate is that.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Literal

import numpy as np
import numpy.typing as npt

from corral.core.errors import ConfigError
from corral.core.job import JobSpec
from corral.core.wording import plural
from corral.sim.collector import relaxed_collector
from corral.sim.traces.trace import Trace

Arrival = Literal["poisson", "trace"]

DEFAULT_JOBS_PER_HOUR = 100.0
DEFAULT_TENANTS = 10
DEFAULT_MEDIAN_S = 15 * 60.0
DEFAULT_LOG_SIGMA = 2.0
DEFAULT_MAX_S = 60 * 86400.0
DEFAULT_GPUS = {1: 0.7, 2: 0.1, 4: 0.1, 8: 0.08, 16: 0.02}
MIN_DURATION_S = 1.0

_DAY_S = 86400.0


def synthesize(
    num_jobs: int,
    *,
    seed: int,
    arrival: Arrival = "poisson",
    like: Trace | None = None,
    jobs_per_hour: float | None = None,
    tenants: int | None = None,
) -> Trace:
    """A trace of ``num_jobs`` jobs ``syn-0``, ``syn-1``, ... in submission order (see the module doc)."""
    if num_jobs < 0:
        raise ConfigError(f"synthesize: num_jobs must be >= 0, got {num_jobs!r}")
    if arrival not in ("poisson", "trace"):
        raise ConfigError(f"synthesize: arrival must be 'poisson' or 'trace', got {arrival!r}")
    if jobs_per_hour is not None and not (jobs_per_hour > 0 and math.isfinite(jobs_per_hour)):
        raise ConfigError(f"synthesize: jobs_per_hour must be a finite number > 0, got {jobs_per_hour!r}")
    if tenants is not None and tenants < 1:
        raise ConfigError(f"synthesize: tenants must be >= 1, got {tenants!r}")
    if arrival == "trace" and like is None:
        raise ConfigError("synthesize: arrival='trace' replays the gaps of a trace, so it needs like=<trace>")

    rng = np.random.default_rng(seed)
    notes: list[str] = []
    if like is None:
        jobs = _default_jobs(rng, num_jobs, jobs_per_hour, tenants, notes)
        source = f"synthetic(seed={seed}, arrival={arrival})"
    else:
        jobs = _like_jobs(rng, num_jobs, arrival, like, jobs_per_hour, tenants, notes)
        source = f"synthetic(seed={seed}, arrival={arrival}, like={like.source})"
    return Trace(jobs=jobs, source=source, skipped=Counter(), notes=notes)


def _poisson_submits(rng: np.random.Generator, n: int, jobs_per_hour: float) -> npt.NDArray[np.float64]:
    gaps = rng.exponential(3600.0 / jobs_per_hour, size=n)
    return _submits_from_gaps(gaps)


def _submits_from_gaps(gaps: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """Submit times: the first job at 0, job ``i`` after the first ``i`` gaps (the last gap is unused)."""
    submits = np.empty(len(gaps), dtype=np.float64)
    if len(gaps):
        submits[0] = 0.0
        np.cumsum(gaps[:-1], out=submits[1:])
    return submits


def _default_jobs(
    rng: np.random.Generator,
    n: int,
    jobs_per_hour: float | None,
    tenants: int | None,
    notes: list[str],
) -> list[JobSpec]:
    rate = DEFAULT_JOBS_PER_HOUR if jobs_per_hour is None else jobs_per_hour
    k = DEFAULT_TENANTS if tenants is None else tenants
    submits = _poisson_submits(rng, n, rate)
    durations = rng.lognormal(math.log(DEFAULT_MEDIAN_S), DEFAULT_LOG_SIGMA, size=n)
    np.clip(durations, MIN_DURATION_S, DEFAULT_MAX_S, out=durations)
    sizes = np.array(list(DEFAULT_GPUS), dtype=np.int64)
    weights = np.array(list(DEFAULT_GPUS.values()))
    gpus = rng.choice(sizes, size=n, p=weights / weights.sum())
    zipf = 1.0 / np.arange(1, k + 1)
    tenant_idx = rng.choice(k, size=n, p=zipf / zipf.sum())
    width = max(2, len(str(k - 1)))
    names = [f"tenant-{t:0{width}d}" for t in range(k)]
    tenant_names = [names[t] for t in tenant_idx.tolist()]
    with relaxed_collector():
        # job_id, submit_s, num_gpus, duration_s, tenant: by position, as read_philly does (issue 20)
        jobs = [
            JobSpec(f"syn-{i}", s, g, d, t)
            for i, (s, d, g, t) in enumerate(
                zip(submits.tolist(), durations.tolist(), gpus.tolist(), tenant_names, strict=True)
            )
        ]
    notes.append(
        f"synthetic: {plural(n, 'job')} with Philly-like defaults: Poisson arrivals at {rate:g} jobs/hour; durations"
        f" lognormal, median {DEFAULT_MEDIAN_S:g} s, log-sd {DEFAULT_LOG_SIGMA:g}, clipped to"
        f" [{MIN_DURATION_S:g}, {DEFAULT_MAX_S:g}] s; GPU counts {DEFAULT_GPUS};"
        f" {plural(k, 'tenant')} with Zipf weights"
    )
    return jobs


def _like_jobs(
    rng: np.random.Generator,
    n: int,
    arrival: Arrival,
    like: Trace,
    jobs_per_hour: float | None,
    tenants: int | None,
    notes: list[str],
) -> list[JobSpec]:
    # Only jobs with a known duration can lend their shape: a synthetic job must have one.
    pool = [job for job in like.jobs if job.duration_s is not None]
    if not pool:
        raise ConfigError(f"synthesize: the trace {like.source} has no job with a known duration to imitate")

    # --- tenants: like's, with their frequencies (only the k busiest when tenants=k)
    counts = Counter(job.tenant for job in like.jobs).most_common()
    if tenants is not None:
        if tenants > len(counts):
            raise ConfigError(
                f"synthesize: tenants={tenants}, but the trace {like.source} has only {len(counts)} tenants"
            )
        counts = counts[:tenants]
    names = [name for name, _ in counts]
    freq = np.array([c for _, c in counts], dtype=np.float64)

    # --- arrivals
    span = like.jobs[-1].submit_s - like.jobs[0].submit_s if like.jobs else 0.0
    like_rate = (len(like.jobs) - 1) / span * 3600.0 if span > 0 else None
    if arrival == "poisson":
        rate = jobs_per_hour if jobs_per_hour is not None else like_rate
        if rate is None:
            raise ConfigError(
                f"synthesize: the trace {like.source} spans no time, so it has no arrival rate; give jobs_per_hour"
            )
        submits = _poisson_submits(rng, n, rate)
        how = f"Poisson arrivals at {rate:g} jobs/hour"
    else:
        gaps_like = np.diff(np.array([job.submit_s for job in like.jobs], dtype=np.float64))
        if like_rate is None or len(gaps_like) == 0:
            raise ConfigError(f"synthesize: the trace {like.source} spans no time, so it has no gaps to replay")
        # A run is about one day of like's jobs, so each run carries a whole day/night cycle.
        block = int(min(len(gaps_like), max(1, round(like_rate * _DAY_S / 3600.0))))
        n_blocks = -(-n // block) if n else 0
        starts = rng.integers(0, len(gaps_like), size=n_blocks)
        # Circular indexing: a run that starts near the end wraps to the start instead of being cut short.
        idx = (starts[:, None] + np.arange(block)[None, :]).ravel()[:n] % len(gaps_like)
        gaps = gaps_like[idx]
        if jobs_per_hour is not None and len(gaps) > 1 and gaps[:-1].sum() > 0:
            gaps *= (3600.0 / jobs_per_hour) / gaps[:-1].mean()
        submits = _submits_from_gaps(gaps)
        how = (
            f"arrivals replay the inter-arrival gaps of {like.source} in runs of {block:,} consecutive gaps"
            f" (about a day)" + ("" if jobs_per_hour is None else f", scaled to {jobs_per_hour:g} jobs/hour")
        )

    # --- shapes: bootstrap whole jobs; then tenants drawn on their own
    pick = rng.integers(0, len(pool), size=n)
    tenant_idx = rng.choice(len(names), size=n, p=freq / freq.sum())
    shapes = [
        (
            max(MIN_DURATION_S, job.duration_s or 0.0),
            job.num_gpus,
            job.gpu_milli,
            job.model,
            job.job_class,
            job.priority,
            job.gpu_types,
            job.gpu_mem_mib,
        )
        for job in pool
    ]
    raised = sum(1 for job in pool if (job.duration_s or 0.0) < MIN_DURATION_S)
    jobs: list[JobSpec] = []
    append = jobs.append
    with relaxed_collector():
        for i, (s, p, t) in enumerate(zip(submits.tolist(), pick.tolist(), tenant_idx.tolist(), strict=True)):
            d, g, m, model, cls, prio, types, mem = shapes[p]
            append(
                JobSpec(
                    job_id=f"syn-{i}",
                    submit_s=s,
                    num_gpus=g,
                    duration_s=d,
                    tenant=names[t],
                    gpu_milli=m,
                    model=model,
                    job_class=cls,
                    priority=prio,
                    gpu_types=types,
                    gpu_mem_mib=mem,
                )
            )
    notes.append(
        f"synthetic: {plural(n, 'job')} shaped like {like.source}: each copies the duration, GPUs and other"
        f" demands of one of its {plural(len(pool), 'job')} drawn at random (bootstrap); {how}; tenants drawn with"
        f" the frequencies of its {plural(len(names), ('busiest ' if tenants is not None else '') + 'tenant')}"
        + (f"; {raised:,} of its durations under {MIN_DURATION_S:g} s raised to {MIN_DURATION_S:g} s" if raised else "")
    )
    return jobs
