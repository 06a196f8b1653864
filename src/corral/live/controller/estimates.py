"""Estimated start times for the live queue, and their accuracy: :mod:`corral.sim.forecast` fed by the controller.

Every ``estimate_interval_s`` (a serve setting; 0 turns the timer off) and on request (``POST /v1/estimates``),
:class:`Estimator` takes a :class:`~corral.sim.forecast.Snapshot` of the controller on its loop thread (copies of
the pending and running jobs, the durations jobs said they take or, for a running ``corral.job`` job with
``total_steps``, the steps it reported left at its step time, the nodes that are down: a few milliseconds at
thousands of jobs), reads the durations of the jobs that finished here from the store, and runs the forecast in a
worker process. The controller's loop never waits for it, and the forecast's CPU time is not taken from the loop
(a thread would share the interpreter's lock with it); the worker is started once, on the first forecast, and
kept. On a virtual clock (tests, ``benchmarks/bench_estimate.py``) the forecast runs inline instead.

The latest forecast is kept in memory: the API shows each pending job's estimate (``estimated_start``), and
``POST /v1/jobs/test`` (``corral submit --test-only``) runs one forecast with the proposed job added to the queue,
submitted now, to say where and when it would start, without submitting it.

Accuracy (``GET /v1/estimates/accuracy``, ``corral whatif accuracy``): the store keeps, for each job, the first
and the latest estimate of its first start (the ``estimates`` table), and compares them with when it really
started. Only first starts are judged: a job requeued after a preemption gets estimates too, but its next start
is not recorded apart from its others.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import multiprocessing
import os
import statistics
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

from corral.core.job import JobPhase
from corral.core.status import JobStatus

if TYPE_CHECKING:
    from corral.live.controller.controller import Controller
    from corral.live.records import JobRequest
    from corral.policies.framework.contract import BasePolicy
    from corral.sim.forecast import Estimate, Forecast, Snapshot

log = logging.getLogger(__name__)

HORIZON_S = 30 * 86400.0  # as corral.sim.forecast's defaults (not imported here: it loads the simulator)
WALL_LIMIT_S = 30.0
HISTORY_JOBS = 2000  # finished jobs whose durations the forecast learns from (the most recent)
# A real start "within" an estimate's range may be this much outside it: a live start comes a turn of the loop (and
# the process's spawn) after the round that decided it, which the forecast's rounds do not model.
RANGE_SLACK_S = 1.0
TEST_JOB_ID = "(test-only)"  # the id a test-only job has in its forecast: not a valid job id, so never a real one


@dataclass(frozen=True, slots=True)
class Accuracy:
    """How far estimates of first starts were from the real ones (seconds), over ``jobs`` jobs that started:
    for the first estimate each job got and for the latest before it started; ``within``: the share of latest
    estimates whose range held the real start (give or take :data:`RANGE_SLACK_S`)."""

    jobs: int
    first_median_s: float | None
    first_p90_s: float | None
    last_median_s: float | None
    last_p90_s: float | None
    last_bias_s: float | None  # mean of estimated - actual: > 0, estimates too late
    within: float | None


class Estimator:
    """The controller's start-time estimates (see the module docstring)."""

    def __init__(
        self,
        controller: Controller,
        *,
        interval_s: float = 0.0,
        horizon_s: float = HORIZON_S,
        wall_limit_s: float = WALL_LIMIT_S,
        in_process: bool = False,
    ) -> None:
        self._c = controller
        self.interval_s = interval_s
        self.horizon_s = horizon_s
        self.wall_limit_s = wall_limit_s
        self.in_process = in_process
        self._latest: Forecast | None = None
        self._lock = threading.Lock()  # guards _latest
        self._run_lock = threading.Lock()  # one forecast at a time
        self._pool: ProcessPoolExecutor | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- life cycle -------------------------------------------------------------------------------------------
    def start(self) -> None:
        """Refresh every ``interval_s`` in a background thread (nothing with 0)."""
        if self.interval_s <= 0 or self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._every, name="corral-estimates", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the timer. A forecast under way is not waited for (its thread is a daemon, and it records nothing
        once stopped): stopping the server must not wait for a long queue's forecast."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=1.0)
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    def _every(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.refresh()
            except Exception:  # a bug in the forecast: the controller goes on, the log says so
                if self._stop.is_set():
                    return  # stopped under it (its worker shut down): nothing went wrong
                log.exception("estimating start times failed")

    # -- forecasts --------------------------------------------------------------------------------------------
    @property
    def latest(self) -> Forecast | None:
        with self._lock:
            return self._latest

    def estimate(self, job_id: str) -> Estimate | None:
        """The latest estimate for a pending job, if any."""
        latest = self.latest
        return None if latest is None else latest.estimates.get(job_id)

    def refresh(self) -> Forecast:
        """Run a forecast of the queue now, keep it and record it for accuracy; returns it."""
        with self._run_lock:
            snapshot = self._snapshot()
            result = self._forecast(snapshot)
            if self._stop.is_set():
                return result  # the controller stopped meanwhile: its store may be closed
            with self._lock:
                self._latest = result
            # Only first starts are judged (see the module docstring): jobs that never ran.
            never = {j.spec.job_id for j in snapshot.jobs if j.first_start_s is None}
            self._c.store.record_estimates(
                result.made_s,
                [
                    (e.job_id, e.start_s, e.earliest_s if e.earliest_s is not None else e.start_s, e.latest_s)
                    for e in result.estimates.values()
                    if e.start_s is not None and e.job_id in never
                ],
            )
            return result

    def test_only(self, request: JobRequest) -> Estimate:
        """When and where a job of ``request`` would start if it were submitted now."""
        with self._run_lock:
            snapshot = self._snapshot(extra=request)
            result = self._forecast(snapshot)
        return result.estimates[TEST_JOB_ID]

    def _forecast(self, snapshot: Snapshot) -> Forecast:
        # The one place the live side uses the simulator: the what-if features are replays of the live state.
        from corral.sim.forecast import forecast

        if self.in_process:
            return forecast(snapshot, horizon_s=self.horizon_s, wall_limit_s=self.wall_limit_s)
        if self._pool is None:
            # spawn, not fork: the controller has threads (the loop, the API's, the agent's) and locks they hold.
            self._pool = ProcessPoolExecutor(
                1, mp_context=multiprocessing.get_context("spawn"), initializer=_leave_with, initargs=(os.getpid(),)
            )
        future = self._pool.submit(forecast, snapshot, horizon_s=self.horizon_s, wall_limit_s=self.wall_limit_s)
        return future.result(timeout=3 * self.wall_limit_s + 60)  # three runs, and the worker's start

    def _snapshot(self, extra: JobRequest | None = None) -> Snapshot:
        """The controller's state, copied on its loop thread; the finished jobs' durations from the store."""
        from corral.sim.forecast import Snapshot, attained

        history = tuple(self._c.store.finished_durations(HISTORY_JOBS))
        c = self._c

        def take() -> Snapshot:
            now = c.clock.now()
            jobs: list[JobStatus] = []
            expected: dict[str, float] = {}
            for job in c.state.jobs():
                if job.phase is not JobPhase.PENDING and job.phase is not JobPhase.RUNNING:
                    continue  # ended this turn: the controller forgets it once it is committed
                jobs.append(copy.copy(job))  # its nested values (spec, placements, telemetry) are frozen
                job_id = job.spec.job_id
                left = c.seconds_left(job_id, now) if job.phase is JobPhase.RUNNING else None
                request = c.request_of(job_id)
                if left is not None:  # what the job measured beats what its user guessed
                    expected[job_id] = attained(job, now) + max(left, 1e-3)
                elif request is not None and request.expected_duration_s is not None:
                    expected[job_id] = request.expected_duration_s
            if extra is not None:  # a test-only job, submitted now
                jobs.append(JobStatus(spec=extra.spec(TEST_JOB_ID, now), phase=JobPhase.PENDING, queued_since_s=now))
                if extra.expected_duration_s is not None:
                    expected[TEST_JOB_ID] = extra.expected_duration_s
            jobs.sort(key=lambda j: j.spec.submit_s)  # submission order, as the engine took them
            topo = c.topology
            down = tuple(topo.node_names[n] for n in sorted(c.state.down_nodes()))
            policy = c.policy
            return Snapshot(
                c.cluster_spec, type(policy), policy.config, policy.seed, now, tuple(jobs), expected, history, down
            )

        return c.call(take)

    # -- another policy on the same queue ---------------------------------------------------------------------
    def whatif(self, policy: BasePolicy) -> QueueWhatif:
        """The queue's start times under the server's policy and under ``policy``, from one snapshot (how they
        would move if the server switched now)."""
        with self._run_lock:
            snapshot = self._snapshot()
            now = self._forecast(snapshot)
            other = self._forecast(dataclasses.replace(snapshot, policy=type(policy), config=policy.config))
        tenant_of = {j.spec.job_id: j.spec.tenant for j in snapshot.jobs}
        return QueueWhatif(now, other, moves(now, other, tenant_of))

    # -- accuracy ---------------------------------------------------------------------------------------------
    def accuracy(self) -> Accuracy:
        """Estimates of first starts against the real ones, from the store."""
        rows = self._c.store.estimate_outcomes()
        first = [abs(r.first_start_s - r.actual_s) for r in rows]
        last = [r.last_start_s - r.actual_s for r in rows]
        inside = [
            r.last_low_s - RANGE_SLACK_S <= r.actual_s <= r.last_high_s + RANGE_SLACK_S
            for r in rows
            if r.last_high_s is not None
        ]
        return Accuracy(
            jobs=len(rows),
            first_median_s=_median(first),
            first_p90_s=_p90(first),
            last_median_s=_median([abs(e) for e in last]),
            last_p90_s=_p90([abs(e) for e in last]),
            last_bias_s=statistics.fmean(last) if last else None,
            within=sum(inside) / len(inside) if inside else None,
        )


@dataclass(frozen=True, slots=True)
class TenantMove:
    """How a tenant's pending jobs' starts would move under another policy: their median wait from the forecast's
    time under each (``None``: no job of it has an estimate), and how many would start earlier or later (by more
    than :data:`RANGE_SLACK_S`); ``tenant`` is ``None`` for every tenant together."""

    tenant: str | None
    pending: int
    wait_now_s: float | None
    wait_other_s: float | None
    earlier: int
    later: int


@dataclass(frozen=True, slots=True)
class QueueWhatif:
    now: Forecast
    other: Forecast
    tenants: tuple[TenantMove, ...]


def moves(now: Forecast, other: Forecast, tenant_of: Mapping[str, str]) -> tuple[TenantMove, ...]:
    """Per tenant (then all together), the waits under two forecasts of the same queue."""
    groups: dict[str | None, list[str]] = {}
    for job_id in now.estimates:
        groups.setdefault(tenant_of[job_id], []).append(job_id)
        groups.setdefault(None, []).append(job_id)
    out = []
    for tenant in [*sorted(t for t in groups if t is not None), None]:
        ids = groups.get(tenant, [])
        if tenant is None and len(groups) <= 2:
            continue  # one tenant: its row says it all
        waits_now, waits_other, earlier, later = [], [], 0, 0
        for job_id in ids:
            a, b = now.estimates[job_id].start_s, other.estimates[job_id].start_s
            if a is not None:
                waits_now.append(a - now.made_s)
            if b is not None:
                waits_other.append(b - other.made_s)
            if a is not None and b is not None:
                earlier += b < a - RANGE_SLACK_S
                later += b > a + RANGE_SLACK_S
        out.append(TenantMove(tenant, len(ids), _median(waits_now), _median(waits_other), earlier, later))
    return tuple(out)


def _leave_with(parent: int) -> None:
    """(In the forecast worker.) Exit within a second of the controller's process: after a ``kill -9`` of
    ``corral serve`` nothing would tell the worker (it holds its own end of the task queue's pipe), and it would
    stay for good."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(0)

    threading.Thread(target=watch, name="corral-forecast-parent", daemon=True).start()


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _p90(xs: list[float]) -> float | None:
    if not xs:
        return None
    if len(xs) == 1:
        return xs[0]
    return statistics.quantiles(xs, n=10, method="inclusive")[-1]
