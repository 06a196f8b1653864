"""Forecast: when will each waiting job start? The live cluster's state, run forward in the simulator.

The live controller and the simulator run the same engine and the same policy code, so an estimate of when a
pending job starts is a replay: a :class:`Snapshot` of the controller's state (the cluster and the nodes that are
down, every running job with its placement and the service it has had, the queue, the tenants and their quotas,
the policy with its configuration) is restored into a fresh :class:`~corral.engine.state.ClusterState` and a fresh
policy, exactly as the controller itself restores them after a restart (:meth:`Engine.restore`, the policy's
``on_job_restored``), and run on a virtual clock from the snapshot's time until every job that was pending has
started, or the horizon passes. No new arrivals are assumed (Slurm's ``squeue --start`` assumes the same): a job
submitted later with a higher priority can move an estimate back, which the accuracy report then shows.

What the replay needs and the live cluster does not know is how long each job will still run. :class:`Durations`
gives it, per job, as three figures (a low, a middle and a high remaining time):

- **known**: the job said how long it runs (``expected_duration_s`` at submission): remaining = expected minus
  the time it has held GPUs, the same in all three;
- **learned**: from the jobs that finished on this cluster, as Tiresias' Gittins index learns its distribution
  (NSDI'19 §3.2): the durations longer than what the job has run so far, less that, at their 25th, 50th and 75th
  percentiles (the remaining time of a job that has already run ``a`` seconds, conditioned on ``d > a``). Used once
  :data:`MIN_HISTORY` finished jobs are longer than ``a``;
- **assumed**: fewer finished jobs than that: a job that has run ``a`` seconds runs about as long again (``a/2``,
  ``a``, ``2a``); one that has not run yet takes the prior :data:`PRIOR_S` (15 min, 1 h, 4 h).

The replay runs once per figure (once when every duration is known), on the neutral performance model (every job
at its solo speed, no restore cost: the live cluster's own speeds are what the jobs' held times already measured),
and a job's estimate is its start in the middle run, with the earliest and latest of the three as its range.
Each run is bounded in wall time (``wall_limit_s``); what it has not reached by then is reported as beyond the
horizon. It never touches the live controller: the snapshot is a copy, taken on the controller's loop thread in a
few milliseconds, and the replay runs in another process (:mod:`corral.live.controller.estimates`).
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from corral.core.cluster import Cluster, Topology
from corral.core.events import NodeLost, TimerFired
from corral.core.job import JobPhase
from corral.core.status import JobStatus
from corral.engine.clock import VirtualClock
from corral.engine.loop import Engine
from corral.engine.state import ClusterState
from corral.policies.framework.contract import BasePolicy, PolicyConfig
from corral.sim.executor import SimExecutor
from corral.sim.perf import PerfModel

MIN_HISTORY = 5  # finished jobs longer than a job's attained time, before their distribution is used for it
PRIOR_S = (900.0, 3600.0, 14400.0)  # a job with nothing to go by: 15 min, 1 h, 4 h
HORIZON_S = 30 * 86400.0  # how far ahead a forecast looks
WALL_LIMIT_S = 30.0  # wall seconds one forecast run may take
_FIRST_WINDOW_S = 60.0  # the replay runs in windows that double, checking after each whether it is done
_MAX_WINDOW_S = 6 * 3600.0

Basis = Literal["known", "learned", "assumed"]


@dataclass(frozen=True, slots=True)
class Remaining:
    """Seconds a job still runs: low, middle and high figures, and what they are based on."""

    low_s: float
    mid_s: float
    high_s: float
    basis: Basis

    def pick(self, scenario: int) -> float:
        return (self.low_s, self.mid_s, self.high_s)[scenario]


class Durations:
    """How long jobs run here: the durations (seconds held) of jobs that finished, and the rules of the module
    docstring for a job's remaining time."""

    def __init__(self, finished_s: Iterable[float], *, prior_s: tuple[float, float, float] = PRIOR_S) -> None:
        self._sorted = sorted(d for d in finished_s if d >= 0 and math.isfinite(d))
        self._prior = prior_s

    def __len__(self) -> int:
        return len(self._sorted)

    def remaining(self, attained_s: float, expected_s: float | None = None) -> Remaining:
        a = max(0.0, attained_s)
        if expected_s is not None and expected_s > a:
            left = expected_s - a
            return Remaining(left, left, left, "known")
        xs = self._sorted
        lo = bisect.bisect_right(xs, a)  # the durations longer than what it has run
        if len(xs) - lo >= MIN_HISTORY:
            q1, q2, q3 = (_quantile(xs, lo, p) - a for p in (0.25, 0.5, 0.75))
            return Remaining(q1, q2, q3, "learned")
        if a > 0:
            return Remaining(a / 2, a, 2 * a, "assumed")
        low, mid, high = self._prior
        return Remaining(low, mid, high, "assumed")


def _quantile(xs: Sequence[float], lo: int, p: float) -> float:
    """The ``p`` quantile of the sorted ``xs[lo:]``, linearly interpolated (as ``statistics.quantiles``'
    inclusive method)."""
    n = len(xs) - lo
    at = p * (n - 1)
    i = int(at)
    if i + 1 >= n:
        return xs[lo + n - 1]
    return xs[lo + i] + (xs[lo + i + 1] - xs[lo + i]) * (at - i)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The live state a forecast starts from (copies: the controller goes on meanwhile). ``jobs``: every job
    pending or running, in submission order; ``expected_s``: the durations jobs said they take; ``history_s``: the
    durations of jobs that finished here; ``down_nodes``: nodes lost (their GPUs take no jobs)."""

    cluster: Cluster
    policy: type[BasePolicy]
    config: PolicyConfig
    seed: int
    now_s: float
    jobs: tuple[JobStatus, ...]
    expected_s: Mapping[str, float]
    history_s: tuple[float, ...] = ()
    down_nodes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Estimate:
    """When a pending job is expected to start (Unix seconds, like the snapshot's time), with the range over the
    low and high duration figures, and the GPUs it would start on (the middle run's); ``made_s``: the forecast's
    time. ``start_s`` is ``None`` when it does not start within the horizon (or the forecast ran out of time
    first)."""

    job_id: str
    start_s: float | None
    earliest_s: float | None
    latest_s: float | None
    made_s: float
    gpus: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Forecast:
    """The estimates of one forecast, for the jobs pending at ``made_s``; ``basis`` counts the jobs whose
    remaining time was known, learned or assumed; ``cut_short``: a run hit its wall-time limit."""

    made_s: float
    took_s: float
    estimates: Mapping[str, Estimate]
    basis: Mapping[str, int]
    runs: int
    cut_short: bool = False


def forecast(snapshot: Snapshot, *, horizon_s: float = HORIZON_S, wall_limit_s: float = WALL_LIMIT_S) -> Forecast:
    """Estimate when each job pending in ``snapshot`` starts (see the module docstring)."""
    began = time.perf_counter()
    now = snapshot.now_s
    durations = Durations(snapshot.history_s)
    remaining: dict[str, Remaining] = {}
    for job in snapshot.jobs:
        remaining[job.spec.job_id] = durations.remaining(attained(job, now), snapshot.expected_s.get(job.spec.job_id))
    basis = Counter(r.basis for r in remaining.values())
    targets = {j.spec.job_id for j in snapshot.jobs if j.phase is JobPhase.PENDING}
    scenarios = (1,) if basis.keys() <= {"known"} else (1, 0, 2)
    starts: list[dict[str, tuple[float, tuple[int, ...]]]] = []
    cut_short = False
    for scenario in scenarios:
        got, cut = _run(snapshot, remaining, scenario, targets, now + horizon_s, time.perf_counter() + wall_limit_s)
        starts.append(got)
        cut_short |= cut
    estimates = {}
    for job_id in targets:
        mid = starts[0].get(job_id)
        times = [s[job_id][0] for s in starts if job_id in s]
        unbounded = len(times) < len(starts)  # some run did not see it start
        estimates[job_id] = Estimate(
            job_id,
            mid[0] if mid is not None else None,
            min(times) if times else None,
            None if unbounded else max(times),
            now,
            mid[1] if mid is not None else (),
        )
    counts: dict[str, int] = dict(basis.items())
    return Forecast(now, time.perf_counter() - began, estimates, counts, len(starts), cut_short)


def attained(job: JobStatus, now: float) -> float:
    """The job's progress, in seconds at its solo speed, its current run included: live, the time it has held GPUs
    (:class:`~corral.live.controller.executor.LiveExecutor` counts it so); in a replay, its work done."""
    held = job.work_done_s
    if job.phase is JobPhase.RUNNING and job.last_start_s is not None:
        held += max(0.0, now - job.last_start_s)
    return held


def _run(
    snapshot: Snapshot,
    remaining: Mapping[str, Remaining],
    scenario: int,
    targets: set[str],
    until_s: float,
    deadline: float,
) -> tuple[dict[str, tuple[float, tuple[int, ...]]], bool]:
    """One replay from the snapshot with the ``scenario``'s durations: when (and where) each target started, and
    whether the wall-time deadline cut it short."""
    now = snapshot.now_s
    cluster = snapshot.cluster
    topo = Topology(cluster)
    policy = snapshot.policy(snapshot.config, seed=snapshot.seed)
    # A forecast reads start times only: no utilization timelines.
    state = ClusterState(topo, cluster.tenants, queue_key=policy.queue_key, timeline=False)
    executor = SimExecutor(topo, PerfModel.neutral(), telemetry=policy.needs_telemetry, timeline=False)
    engine = Engine(state, policy, executor, VirtualClock(now))
    for node in snapshot.down_nodes:
        engine.schedule(now, NodeLost(node, "down when the forecast was made"))
    if snapshot.down_nodes:
        engine.run(until_s=now)
    started: dict[str, tuple[float, tuple[int, ...]]] = {}

    def seen(job: JobStatus, at: float) -> None:
        job_id = job.spec.job_id
        if job.phase is JobPhase.RUNNING and job_id in targets and job_id not in started and job.placement:
            started[job_id] = (at, job.placement.gpus)

    for job in snapshot.jobs:
        held = attained(job, now)
        spec = dataclasses.replace(job.spec, duration_s=held + remaining[job.spec.job_id].pick(scenario))
        copy = dataclasses.replace(job, spec=spec, work_done_s=held)
        restored = engine.restore(copy, now)
        if restored.phase is JobPhase.RUNNING:
            executor.launch(restored, now)

    def in_time(_round_s: float) -> None:
        # After every round: a window of a long replay can take minutes, so the limit is checked here, not only
        # between windows. The engine is dropped afterwards: stopping it mid-window leaves nothing behind.
        if time.perf_counter() > deadline:
            raise _OutOfTime

    engine.on_change = seen
    engine.on_round = in_time
    engine.schedule(now, TimerFired("forecast"))
    t, window = now, _FIRST_WINDOW_S
    try:
        while engine.queue and len(started) < len(targets) and t < until_s:
            in_time(0.0)
            t = min(t + window, until_s)
            engine.run(until_s=t)
            window = min(2 * window, _MAX_WINDOW_S)
    except _OutOfTime:
        return started, True
    return started, False


class _OutOfTime(Exception):
    """A forecast's replay ran past its wall-time limit."""
