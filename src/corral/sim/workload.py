"""A workload from options: read (or synthesize) a trace, then apply the user's filters in a fixed order.

The CLI and the benchmarks describe a workload with a :class:`WorkloadSpec` and call :func:`build_trace`, so
"what was replayed" is one value that can be printed and reproduced. Filters apply in this order:

1. tenants (``--tenants``: the trace's own tenant names, so before any are assigned), time window, minimum
   duration, sample, load scaling, job limit (so that ``--limit`` counts the jobs actually replayed);
2. tenants assigned to the jobs of tenant "default" (``assign_tenants``), then a fraction of the guaranteed
   jobs made opportunistic (``opportunistic``): both after the jobs are chosen, so their notes count the
   jobs replayed, and tenants first, so the class draw is the same with or without them (each has its own
   random stream, see :mod:`corral.sim.traces.filters`);
3. models drawn for the jobs that have none (when asked).

Quotas are the cluster's business, not the trace's: see :func:`corral.sim.clusters.with_quotas`.
"""

from __future__ import annotations

from dataclasses import dataclass

from corral.core.errors import ConfigError
from corral.sim.collector import relaxed_collector
from corral.sim.traces import (
    FORMATS,
    Trace,
    assign_models,
    drop_shorter_than,
    head,
    read_trace,
    sample,
    scale_load,
    select_tenants,
    window,
)
from corral.sim.traces.filters import assign_tenants, make_opportunistic
from corral.sim.traces.openb import PendingMode

ALL_FORMATS = (*FORMATS, "synthetic")


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    fmt: str
    path: str | None = None
    columns: str | None = None
    skip_invalid: bool = False
    seed: int = 0
    openb_pending: PendingMode = "drop"
    # synthetic
    jobs: int | None = None
    arrival: str = "poisson"
    jobs_per_hour: float | None = None
    fit_to: str | None = None  # "FORMAT:PATH" of a trace to fit distributions to
    # filters
    tenants: tuple[str, ...] = ()
    start_s: float | None = None
    end_s: float | None = None
    min_duration_s: float | None = None
    sample: float | None = None
    scale_load: float | None = None
    limit: int | None = None
    assign_tenants: int | None = None  # give jobs of tenant "default" one of t0..t{N-1} (None: leave them)
    opportunistic: float | None = None  # make this fraction of guaranteed jobs opportunistic (None: leave them)
    model_mix: str | None = None  # draw a model for each job without one from this mix (None: leave them)


def _read(spec: WorkloadSpec) -> Trace:
    if spec.fmt not in ALL_FORMATS:
        raise ConfigError(f"unknown trace format {spec.fmt!r}; expected one of {', '.join(ALL_FORMATS)}")
    if spec.fmt != "synthetic":
        if spec.path is None:
            raise ConfigError(f"the {spec.fmt} format needs --trace PATH")
        return read_trace(
            spec.path,
            spec.fmt,
            columns=spec.columns,
            skip_invalid=spec.skip_invalid,
            pending=spec.openb_pending,
        )
    like = None
    if spec.fit_to is not None:
        fmt, sep, path = spec.fit_to.partition(":")
        if not sep or fmt not in FORMATS:
            raise ConfigError(
                f"--fit-to expects FORMAT:PATH with FORMAT one of {', '.join(FORMATS)}, got {spec.fit_to!r}"
            )
        like = read_trace(path, fmt, skip_invalid=spec.skip_invalid)
    if spec.jobs is None:
        raise ConfigError("the synthetic format needs --jobs N")
    arrival = spec.arrival
    if arrival not in ("poisson", "trace"):
        raise ConfigError(f"--arrival must be poisson or trace, got {arrival!r}")
    from corral.sim.traces.synthetic import synthesize  # with numpy, only when synthesizing (issue 20)

    return synthesize(
        spec.jobs,
        seed=spec.seed,
        arrival="trace" if arrival == "trace" else "poisson",
        like=like,
        jobs_per_hour=spec.jobs_per_hour,
    )


@relaxed_collector()  # a trace is a container per job, and none in a cycle (corral.sim.collector)
def build_trace(spec: WorkloadSpec) -> Trace:
    trace = _read(spec)
    if spec.tenants:
        trace = select_tenants(trace, spec.tenants)
    if spec.start_s is not None or spec.end_s is not None:
        trace = window(trace, spec.start_s, spec.end_s)
    if spec.min_duration_s is not None:
        trace = drop_shorter_than(trace, spec.min_duration_s)
    if spec.sample is not None:
        trace = sample(trace, spec.sample, spec.seed)
    if spec.scale_load is not None:
        trace = scale_load(trace, spec.scale_load)
    if spec.limit is not None and spec.fmt != "synthetic":
        trace = head(trace, spec.limit)
    if spec.assign_tenants is not None:
        trace = assign_tenants(trace, spec.assign_tenants, spec.seed)
    if spec.opportunistic is not None:
        trace = make_opportunistic(trace, spec.opportunistic, spec.seed)
    if spec.model_mix is not None:
        trace = assign_models(trace, spec.model_mix, spec.seed)
    return trace
