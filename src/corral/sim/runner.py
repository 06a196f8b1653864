"""Run one replay: a trace, a cluster, a policy and a performance model in, a :class:`SimulationResult` out.

This is the library entry point the CLI, the benchmarks and the tests share.

Node failures (``node_events``, from :mod:`corral.sim.failures`) are streamed to the engine one at a time, like
arrivals: the engine runs every event before the next failure's time, then the failure is scheduled and ordered
with the events of its instant (node events first). The stream may be endless (failures drawn at a rate): it is
no longer read once nothing is left to do (no event queued, and no job waiting for a node to come back), so the
failures after the last job ends neither run nor count.

Progress (``on_progress``) counts jobs done, finished or rejected, not jobs submitted: a count of submissions
stops while the last jobs drain, which on a busy trace is most of the replay. It is read by a timer thread
rather than reported by the engine, so that the engine's loop does no work per event for it: the thread reads
three counters (jobs submitted, pending, running) every ``progress_every_s`` and the replay runs as fast with it
as without.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from corral.core.cluster import Cluster, Topology
from corral.core.errors import InputError
from corral.core.status import JobStatus
from corral.engine.clock import VirtualClock
from corral.engine.loop import Engine, LoggedAction
from corral.engine.state import ClusterState
from corral.policies.framework.contract import BasePolicy
from corral.sim.collector import relaxed_collector
from corral.sim.executor import SimExecutor
from corral.sim.failures import NodeEvent
from corral.sim.metrics import (
    Failures,
    Usage,
    Window,
    job_rhos,
    per_tenant,
    summarize,
    tenant_quota_columns,
    window_of,
)
from corral.sim.perf import PerfModel
from corral.sim.traces import Trace


@dataclass(slots=True)
class SimulationResult:
    policy: str
    cluster: str
    trace: str
    jobs: list[JobStatus]
    summary: dict[str, Any]
    tenants: list[dict[str, Any]]
    # The timelines are None where simulate(record_timelines=False) kept none.
    timeline_s: Any  # array('d') of change times
    timeline_milli: Any  # array('q') of allocated milli-GPUs from each change time on
    window: Window
    num_gpus: int
    decision_log: list[LoggedAction] | None = None
    wall_s: float = 0.0
    rounds: int = 0
    notes: list[str] = field(default_factory=list)
    usage: Usage | None = None
    timeline_sm: Any = None  # array('d'): measured SM-busy GPUs from each change time of ``timeline_use_s`` on
    timeline_mem_mib: Any = None  # array('d'): GPU memory in use (MiB)
    timeline_use_s: Any = None  # array('d')
    timeline_queue_s: Any = None  # array('d'): the queue's change times (record_queue=True), else None
    timeline_queue: Any = None  # array('q'): jobs pending from each of them on
    rho: Any = None  # array('d'): each job's finish-time fairness, as metrics.job_rhos (NaN where undefined)


@relaxed_collector()  # the replay and its metrics make no reference cycles (corral.sim.collector)
def simulate(
    trace: Trace,
    cluster: Cluster,
    policy: BasePolicy,
    *,
    perf: PerfModel | None = None,
    record_decisions: bool = False,
    on_progress: Callable[[int], None] | None = None,
    progress_every_s: float = 0.5,
    check_invariants: bool = False,
    node_events: Iterable[tuple[float, NodeEvent]] | None = None,
    after_round: Callable[[ClusterState, float], None] | None = None,
    record_queue: bool = False,
    record_timelines: bool = True,
) -> SimulationResult:
    """Replay ``trace`` on ``cluster`` under ``policy`` in virtual time until every job finished or was rejected.

    ``on_progress(n)`` is called with the number of jobs done (finished or rejected) so far, every
    ``progress_every_s`` seconds from a timer thread while the replay runs, then once more from the calling
    thread when it has ended (``len(trace)``, less any job a lost node left unfinished; see the module docstring).
    ``check_invariants`` re-verifies the whole state after every round (slow; for tests).
    ``node_events``: nodes lost and joined, in time order (see the module docstring).
    ``after_round(state, now)`` is called after every round, once its decision is applied (after the invariants
    are checked, with ``check_invariants``): tests check there what a round must leave behind (the conformance
    suite's work conservation, ``tests/policies/test_contract.py``).
    ``record_queue`` keeps the queue's length over time, every wait counted (the report's queue length plot).
    ``record_timelines=False`` keeps no allocation and measured-use change points (``utilization.csv`` and the
    report's plots need them; the summary does not): about 100 MB less at a million jobs, and a little faster.
    """
    started = time.perf_counter()
    for spec in trace.jobs:
        if spec.duration_s is None:
            raise InputError(f"job {spec.job_id!r} has no duration; a replay needs one per job", file=trace.source)
    topo = Topology(cluster)
    state = ClusterState(topo, cluster.tenants, queue_key=policy.queue_key, timeline=record_timelines)
    if record_queue:
        state.record_queue()
    executor = SimExecutor(topo, perf, telemetry=policy.needs_telemetry, timeline=record_timelines)
    engine = Engine(state, policy, executor, VirtualClock(), record_decisions=record_decisions)
    engine.feed(trace.jobs)
    if check_invariants or after_round is not None:

        def checked_round(now: float) -> None:
            if check_invariants:
                state.check_invariants()
            if after_round is not None:
                after_round(state, now)

        engine.after_round = checked_round
    with _ProgressTimer(engine, on_progress, progress_every_s):
        _replay(engine, state, node_events)
    if on_progress is not None:
        on_progress(_jobs_done(engine))
    jobs = list(state.jobs())
    win = window_of(jobs)
    sm_area, mem_area = executor.usage_areas(win.end_s)
    areas = {}
    for tenant in cluster.tenants:
        if tenant.quota_gpus is not None:
            held, short = state.tenant_areas(tenant.name, win.end_s)
            areas[tenant.name] = (tenant.quota_gpus, held, short)
    usage = Usage(sm_area, mem_area, sum(topo.gpu_mem_mib), executor.job_times, areas, executor.job_speeds())
    failures = Failures(
        state.node_failures,
        state.failure_requeues,
        executor.lost_work_gpu_s,
        state.down_gpu_area(win.start_s, win.end_s),
    )
    rho = job_rhos(jobs, topo.num_gpus, usage.job_speeds, win)  # once, for the summary, the tenants and jobs.csv
    summary = summarize(jobs, state.allocated_area(win.end_s), topo.num_gpus, usage, failures, rho, win)
    tenants = per_tenant(jobs, topo.num_gpus, usage.job_speeds, rho)
    if areas:
        tenant_quota_columns(tenants, usage, win)
    return SimulationResult(
        policy=policy.describe(),
        cluster=cluster.name,
        trace=trace.source,
        jobs=jobs,
        summary=summary,
        tenants=tenants,
        timeline_s=state.timeline_s if record_timelines else None,
        timeline_milli=state.timeline_milli if record_timelines else None,
        window=win,
        num_gpus=topo.num_gpus,
        decision_log=engine.decision_log,
        wall_s=time.perf_counter() - started,
        rounds=engine.rounds,
        notes=list(trace.notes),
        usage=usage,
        timeline_sm=executor.timeline_sm if record_timelines else None,
        timeline_mem_mib=executor.timeline_mem_mib if record_timelines else None,
        timeline_use_s=executor.timeline_s if record_timelines else None,
        timeline_queue_s=state.timeline_queue_s,
        timeline_queue=state.timeline_queue if record_queue else None,
        rho=rho,
    )


def _jobs_done(engine: Engine) -> int:
    """Jobs finished or rejected so far: every job submitted is pending (suspended and requeued jobs included),
    running, or done. Read from another thread it may be off by the jobs of the turn under way, never below 0."""
    state = engine.state
    return max(0, engine.submitted - state.num_pending - state.num_running)


class _ProgressTimer:
    """While open, calls ``on_progress(jobs done)`` every ``every_s`` seconds from a daemon thread.

    The thread only reads counters (under the GIL each read is atomic, and a count one turn stale is good enough
    for a progress bar), so the engine is not slowed by a hook in its loop."""

    def __init__(self, engine: Engine, on_progress: Callable[[int], None] | None, every_s: float) -> None:
        self._engine = engine
        self._on_progress = on_progress
        self._every_s = every_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> None:
        if self._on_progress is not None:
            self._thread = threading.Thread(target=self._tick, name="corral-progress", daemon=True)
            self._thread.start()

    def __exit__(self, *exc: object) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()

    def _tick(self) -> None:
        assert self._on_progress is not None
        while not self._stop.wait(self._every_s):
            self._on_progress(_jobs_done(self._engine))


def _replay(engine: Engine, state: ClusterState, node_events: Iterable[tuple[float, NodeEvent]] | None) -> None:
    """Run the engine to the end, streaming ``node_events`` into it (see the module docstring)."""
    if node_events is not None:
        last = -math.inf
        for time_s, event in node_events:
            if time_s < last:
                raise InputError(f"node events must come in time order: {event!r} at {time_s} after {last}")
            last = time_s
            engine.run_before(time_s)
            if not engine.queue and (not state.num_pending or not state.down_nodes()):
                break  # nothing left to do, and no job waits for a node to come back
            engine.schedule(time_s, event)
    engine.run()
