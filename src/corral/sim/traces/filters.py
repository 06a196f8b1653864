"""Trace filters: pure functions from a :class:`~corral.sim.traces.Trace` to a new one.

Each returns a new Trace (the input is never changed) whose ``notes`` end with a sentence saying what the
filter did, so a report can show exactly how the replayed jobs differ from the file. ``skipped`` is carried
over unchanged: it accounts for rows of the file, not for jobs a filter chose to leave out.

Memory: jobs are frozen, so a filter that keeps a job as it is shares the same object with its input; only the
filters that move submit times (:func:`window`, :func:`scale_load`) or change a field (:func:`assign_models`,
:func:`assign_tenants`, :func:`make_opportunistic`) build new JobSpecs, and only for the jobs they change.

Randomness: every random filter takes a ``seed``. :func:`assign_tenants` and :func:`make_opportunistic` seed
their generator with ``(seed, a constant of their own)`` rather than ``seed`` alone, so that one run seed used
by several filters gives each an independent stream (with a bare ``seed`` both would read the same uniforms,
and which jobs a fraction picks would be tied to which jobs :func:`sample` kept).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from typing import TYPE_CHECKING

from corral.core.errors import ConfigError
from corral.core.job import JobClass, JobSpec
from corral.core.wording import plural
from corral.sim.traces.trace import Trace
from corral.workloads.models import draw_models, parse_mix

DEFAULT_TENANT = "default"  # JobSpec's tenant when a trace names none (openb, tiresias)

# Second words of the seeds of the filters that draw with (seed, stream): any fixed, distinct constants.
_STREAM_TENANTS = 1
_STREAM_OPPORTUNISTIC = 2

if TYPE_CHECKING:
    import numpy as np

# numpy is imported by the filters that draw, not with the module: a replay that draws nothing does not load it
# (issue 20: a 200-job replay's time is mostly imports).


def _rng(seed: int, stream: int, who: str) -> np.random.Generator:
    # numpy's SeedSequence takes non-negative integers only; say so here rather than with numpy's ValueError.
    if type(seed) is not int or seed < 0:
        raise ConfigError(f"{who}: seed must be an integer >= 0, got {seed!r}")
    import numpy as np

    return np.random.default_rng([seed, stream])


def _derive(trace: Trace, jobs: list[JobSpec], note: str) -> Trace:
    return Trace(jobs=jobs, source=trace.source, skipped=Counter(trace.skipped), notes=[*trace.notes, note])


def _shift(jobs: list[JobSpec], offset: float) -> list[JobSpec]:
    if offset == 0.0:
        return jobs
    return [job.replaced(submit_s=job.submit_s - offset) for job in jobs]


def window(trace: Trace, start_s: float | None = None, end_s: float | None = None) -> Trace:
    """Keep the jobs submitted in ``[start_s, end_s)`` (an open side when None), then shift their submit times
    so the first kept job arrives at 0: a replay of a slice of a long trace should not start with an empty
    cluster idling until the slice begins.
    """
    if start_s is not None and end_s is not None and end_s < start_s:
        raise ConfigError(f"window: end_s ({end_s:g}) must not be before start_s ({start_s:g})")
    lo = -math.inf if start_s is None else start_s
    hi = math.inf if end_s is None else end_s
    kept = [job for job in trace.jobs if lo <= job.submit_s < hi]
    offset = kept[0].submit_s if kept else 0.0
    span = f"[{'' if start_s is None else f'{start_s:g}'}, {'' if end_s is None else f'{end_s:g}'}) s"
    note = (
        f"window {span}: kept {len(kept):,} of {plural(len(trace.jobs), 'job')};"
        f" submit times shifted by {-offset:g} s so the first kept job arrives at 0"
    )
    return _derive(trace, _shift(kept, offset), note)


def select_tenants(trace: Trace, tenants: Iterable[str]) -> Trace:
    """Keep the jobs of the given tenants. Tenants absent from the trace are named in the note (a typo would
    otherwise quietly give a smaller trace)."""
    wanted = set(tenants)
    kept = [job for job in trace.jobs if job.tenant in wanted]
    present = {job.tenant for job in kept}
    absent = sorted(wanted - present)
    note = f"select_tenants {', '.join(sorted(wanted))}: kept {len(kept):,} of {plural(len(trace.jobs), 'job')}"
    if absent:
        note += f"; not in the trace: {', '.join(absent)}"
    return _derive(trace, kept, note)


def drop_shorter_than(trace: Trace, seconds: float) -> Trace:
    """Drop jobs whose duration is below ``seconds`` (Philly has 7,654 jobs under a minute, many of them
    failures at start-up). Jobs of unknown duration are kept: there is nothing to say they are short."""
    kept = [job for job in trace.jobs if job.duration_s is None or job.duration_s >= seconds]
    dropped = len(trace.jobs) - len(kept)
    note = f"drop_shorter_than {seconds:g} s: dropped {dropped:,} of {plural(len(trace.jobs), 'job')}"
    return _derive(trace, kept, note)


def sample(trace: Trace, fraction: float, seed: int) -> Trace:
    """Keep each job independently with probability ``fraction`` (a Bernoulli draw per job from
    ``numpy.random.default_rng(seed)``: same seed, same sample). Order and times are unchanged."""
    if not 0.0 <= fraction <= 1.0:
        raise ConfigError(f"sample: fraction must be in [0, 1], got {fraction!r}")
    import numpy as np

    keep = np.random.default_rng(seed).random(len(trace.jobs)) < fraction
    kept = [job for job, k in zip(trace.jobs, keep.tolist(), strict=True) if k]
    note = f"sample {fraction:g} (seed {seed}): kept {len(kept):,} of {plural(len(trace.jobs), 'job')}"
    return _derive(trace, kept, note)


def scale_load(trace: Trace, factor: float) -> Trace:
    """Divide the time between arrivals by ``factor``: each job's submit time becomes
    ``first + (submit_s - first) / factor``. A factor above 1 packs the same jobs into less time, so the load
    goes up; below 1 it goes down. Durations are unchanged."""
    if not (factor > 0.0 and math.isfinite(factor)):
        raise ConfigError(f"scale_load: factor must be a finite number > 0, got {factor!r}")
    if not trace.jobs or factor == 1.0:
        jobs = list(trace.jobs)
    else:
        first = trace.jobs[0].submit_s
        jobs = [job.replaced(submit_s=first + (job.submit_s - first) / factor) for job in trace.jobs]
    note = f"scale_load x{factor:g}: inter-arrival times divided by {factor:g} (load x{factor:g})"
    return _derive(trace, jobs, note)


def head(trace: Trace, n: int) -> Trace:
    """Keep the first ``n`` jobs in submission order."""
    if n < 0:
        raise ConfigError(f"head: n must be >= 0, got {n!r}")
    kept = trace.jobs[:n]
    note = f"head {n:,}: kept the first {len(kept):,} of {plural(len(trace.jobs), 'job')}"
    return _derive(trace, kept, note)


def assign_models(trace: Trace, mix: str, seed: int) -> Trace:
    """Give every job without a model one drawn from ``mix`` (see :func:`corral.workloads.models.parse_mix`), with a
    generator seeded by ``seed``. Jobs that name a model keep it. Model-aware policies (Tiresias' placement,
    Gandiva's packing) and the performance model's per-model spread penalty read it."""
    weights = parse_mix(mix)
    missing = [i for i, job in enumerate(trace.jobs) if job.model is None]
    if not missing:
        return _derive(trace, list(trace.jobs), "models: every job names its model (from the trace)")
    drawn = draw_models(len(missing), weights, seed)
    jobs = list(trace.jobs)
    for i, model in zip(missing, drawn, strict=True):
        jobs[i] = jobs[i].replaced(model=model)
    counts = Counter(drawn)
    shown = ", ".join(f"{name} {counts[name]:,}" for name in sorted(counts))
    note = (
        f"models: {len(missing):,} of {plural(len(jobs), 'job')} had none and were given one drawn from "
        f"{'the default mix' if mix.strip().lower() == 'default' else repr(mix)} (seed {seed}): {shown}"
    )
    return _derive(trace, jobs, note)


def assign_tenants(trace: Trace, count: int, seed: int) -> Trace:
    """Give every job of tenant ``"default"`` (what readers use when a trace names no tenant, as openb does)
    one of ``count`` tenants ``t0`` .. ``t{count-1}``, drawn independently per job with Zipf weights
    ``1/(k+1)`` for ``t<k>``: with 4 tenants, shares of about 48%, 24%, 16% and 12%.

    Why skewed: real multi-tenant clusters are uneven (Philly's busiest virtual cluster submitted half of the
    trace's jobs, the smallest of its 11 large ones 0.5%), and quota experiments need tenants that use more
    than their share beside tenants that leave theirs idle; a uniform split would make every tenant alike. The
    weights are the ones :func:`~corral.sim.traces.synthetic.synthesize` gives its made-up tenants, so both
    ways of getting tenants skew alike.

    The i-th "default" job in submission order gets the i-th draw of ``numpy.random.default_rng([seed, 1])``
    (see the module's note on seeds): the same trace, count and seed give the same tenants. Jobs that already
    name a tenant keep it (a name such as ``t0`` already in the trace is simply shared). The note gives the
    count per tenant.
    """
    if type(count) is not int or count < 1:
        raise ConfigError(f"assign_tenants: count must be an integer >= 1, got {count!r}")
    rng = _rng(seed, _STREAM_TENANTS, "assign_tenants")
    missing = [i for i, job in enumerate(trace.jobs) if job.tenant == DEFAULT_TENANT]
    if not missing:
        note = f"tenants: no job has tenant {DEFAULT_TENANT!r}; every job keeps its own (assign_tenants {count})"
        return _derive(trace, list(trace.jobs), note)
    names = [f"t{k}" for k in range(count)]
    import numpy as np

    zipf = 1.0 / np.arange(1, count + 1)
    drawn = rng.choice(count, size=len(missing), p=zipf / zipf.sum()).tolist()
    jobs = list(trace.jobs)
    for i, k in zip(missing, drawn, strict=True):
        jobs[i] = jobs[i].replaced(tenant=names[k])
    counts = Counter(drawn)
    shown = ", ".join(f"{names[k]} {counts[k]:,}" for k in range(count))
    note = (
        f"tenants: {len(missing):,} of {plural(len(jobs), 'job')} had tenant {DEFAULT_TENANT!r} and were given one of"
        f" {plural(count, 'tenant')} drawn with Zipf weights 1/rank (seed {seed}): {shown}"
    )
    return _derive(trace, jobs, note)


def make_opportunistic(trace: Trace, fraction: float, seed: int) -> Trace:
    """Make each guaranteed job opportunistic (AntMan's job on spare resources, OSDI'20 §4) independently with
    probability ``fraction``; jobs that are opportunistic already stay so. For traces that have no classes of
    their own, such as Philly, where an AntMan experiment needs a configurable share of opportunistic jobs.

    Every job gets a uniform draw from ``numpy.random.default_rng([seed, 2])`` by its position in the trace,
    whatever its class, so a job's fate does not depend on the classes of the jobs before it; a guaranteed
    job whose draw is below ``fraction`` changes class. The note gives the counts.
    """
    if not (isinstance(fraction, int | float) and 0.0 <= fraction <= 1.0):
        raise ConfigError(f"make_opportunistic: fraction must be in [0, 1], got {fraction!r}")
    draws = _rng(seed, _STREAM_OPPORTUNISTIC, "make_opportunistic").random(len(trace.jobs)).tolist()
    jobs = list(trace.jobs)
    already = changed = 0
    for i, (job, u) in enumerate(zip(trace.jobs, draws, strict=True)):
        if job.job_class is JobClass.OPPORTUNISTIC:
            already += 1
        elif u < fraction:
            jobs[i] = job.replaced(job_class=JobClass.OPPORTUNISTIC)
            changed += 1
    guaranteed = len(jobs) - already
    note = (
        f"opportunistic {fraction:g} (seed {seed}): {changed:,} of {plural(guaranteed, 'guaranteed job')} made"
        f" opportunistic; {already:,} {'was' if already == 1 else 'were'} already; now {changed + already:,} of"
        f" {len(jobs):,} opportunistic"
    )
    return _derive(trace, jobs, note)
