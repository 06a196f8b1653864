"""The engine: one event loop for simulation and live mode.

Each turn takes every event due at the earliest time, applies them to the cluster state (a submitted job is
admitted or rejected; a finished job frees its GPUs), then, if anything changed, asks the policy for a decision
and applies it action by action: first to :class:`ClusterState` (which checks invariants), then to the executor
(which carries it out and, in simulation, schedules the job's completion). Nothing in here knows whether time
is virtual.

A ``Resize`` (a share or memory change in place) and an ``Upgrade`` (an opportunistic job made guaranteed) are
applied to the state and then told to the executor with the placement the job had, so that it can re-rate the
job (and migrate it, when an upgrade moves it).

A ``SetBatchSize`` is recorded by the state (pending or running job) and, for a running job whose batch size
changed, told to the executor (:class:`~corral.engine.executor.BatchSizeExecutor`), which re-rates it; an
executor without that seam makes the engine refuse the decision before anything changes.

A completion is acted on only if it is current: the job is still in the run it was predicted for (its run
epoch; a preemption makes older predictions stale) and the executor has not re-predicted it since
(:meth:`Executor.is_current`; the simulator re-predicts when a packed neighbour starts or stops). A preemption
followed by a launch of the same job in one decision is a migration (or, on the same GPUs, a change of share);
the state and the executor take the two in that order.

Arrivals can be streamed: :meth:`Engine.feed` takes an iterator of job specs sorted by submission time and keeps
only the next one in the event queue, so a million-job replay never holds a million pending events.

Nodes (both modes; whoever notices schedules the event, ``engine.schedule(t, NodeLost(name, reason))``). A
``NodeLost`` of a node that is up: every running job with a GPU there is stopped on all its nodes and requeued from
its last checkpoint (:class:`~corral.engine.executor.NodeLossExecutor`, else the executor's ``preempt``), each told
to the policy through ``on_job_changed`` as for a preemption; every pending job suspended to that node's host
memory loses that state; then the node's GPUs leave the state, and the policy hears ``on_nodes_changed``. A
``NodeJoined`` of a node that is down brings its GPUs back and tells the policy the same way. Either is followed by a
round. The loss or return of a node already in that state changes nothing (a flapping report), so the live
controller may report one twice. The decision log records both (``node-lost NAME requeued JOB...``,
``node-joined NAME``), so that a parity test compares them too. Cost: the lost node's own jobs and GPUs, nothing
else.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

from mypy_extensions import mypyc_attr

from corral.core.decisions import Action, Decision, Launch, Preempt, Reject, Resize, SetBatchSize, Upgrade
from corral.core.errors import InvariantViolation, JobSpecError
from corral.core.events import (
    DemandChanged,
    Event,
    JobCancelled,
    JobFailed,
    JobFinished,
    JobInterrupted,
    JobSubmitted,
    NodeJoined,
    NodeLost,
    TelemetryReported,
    TimerFired,
)
from corral.core.job import JobPhase, JobSpec
from corral.core.placement import Placement
from corral.core.status import JobStatus
from corral.core.telemetry import Telemetry
from corral.engine.clock import Clock
from corral.engine.event_queue import EventQueue
from corral.engine.executor import BatchSizeExecutor, Executor, NodeLossExecutor
from corral.engine.state import ClusterState
from corral.policies.framework.contract import BasePolicy


@dataclass(frozen=True, slots=True)
class NodeChanged:
    """A node lost (``up`` False, with the jobs its loss requeued, in order) or back: a decision-log entry."""

    node: str
    up: bool
    requeued: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class LoggedAction:
    """One applied action, or a node lost or back, for the decision log (parity tests compare these between
    modes)."""

    time_s: float
    action: Action | NodeChanged

    # Written out (a test checks it against the fields): the compiled core runs a dataclass's generated __init__ as
    # interpreted code, and a decision log holds one per action (issue 20; setup.py).
    def __init__(self, time_s: float, action: Action | NodeChanged) -> None:
        object.__setattr__(self, "time_s", time_s)
        object.__setattr__(self, "action", action)

    def render(self) -> str:
        a = self.action
        if isinstance(a, NodeChanged):
            if a.up:
                return f"{self.time_s:.3f} node-joined {a.node}"
            return f"{self.time_s:.3f} node-lost {a.node} requeued {' '.join(a.requeued) or '-'}"
        if isinstance(a, Launch):
            gpus = " ".join(map(str, a.placement.gpus))
            return f"{self.time_s:.3f} launch {a.job_id} gpus={gpus} milli={a.placement.gpu_milli}"
        if isinstance(a, Preempt):
            return f"{self.time_s:.3f} {'suspend' if a.suspend else 'preempt'} {a.job_id}" + (
                " downgrade" if a.downgrade else ""
            )
        if isinstance(a, Resize):
            parts = [f"{self.time_s:.3f} resize {a.job_id}"]
            if a.gpu_milli is not None:
                parts.append(f"milli={a.gpu_milli}")
            if a.mem_mib is not None:
                parts.append(f"mem={a.mem_mib}")
            return " ".join(parts)
        if isinstance(a, Upgrade):
            gpus = " ".join(map(str, a.placement.gpus))
            return f"{self.time_s:.3f} upgrade {a.job_id} gpus={gpus} milli={a.placement.gpu_milli}"
        if isinstance(a, SetBatchSize):
            return f"{self.time_s:.3f} batch {a.job_id} size={a.batch_size}"
        return f"{self.time_s:.3f} reject {a.job_id} {a.reason}"


@mypyc_attr(allow_interpreted_subclasses=True)  # tests wrap its steps in a subclass
class Engine:
    def __init__(
        self,
        state: ClusterState,
        policy: BasePolicy,
        executor: Executor,
        clock: Clock,
        *,
        record_decisions: bool = False,
    ) -> None:
        self.state = state
        self.policy = policy
        self.executor = executor
        self.clock = clock
        self.queue = EventQueue()
        self.decision_log: list[LoggedAction] | None = [] if record_decisions else None
        self._arrivals: Iterator[JobSpec] | None = None
        self._timers: set[float] = set()
        self.rounds = 0
        self.on_submitted: Callable[[int], None] | None = None  # progress hook: number of jobs submitted
        # Observer of every change to a job (the live controller marks it for its durable store).
        self.on_change: Callable[[JobStatus, float], None] | None = None
        # Called after each round with the reasons the policy gave for the jobs it left waiting (live: the API).
        self.on_waiting: Callable[[Mapping[str, str]], None] | None = None
        # Called after each round with its wall time in seconds (live: the round latency metric). None in a replay:
        # it costs a clock read per round only where someone reads it.
        self.on_round: Callable[[float], None] | None = None
        # Called after each round, its decision applied, with the round's time (a replay's invariant checks; tests).
        self.after_round: Callable[[float], None] | None = None
        self.submitted = 0
        self._batch_executor = executor if isinstance(executor, BatchSizeExecutor) else None
        self._loss_executor = executor if isinstance(executor, NodeLossExecutor) else None
        executor.bind(self)

    # -- EventSink ------------------------------------------------------------------------------------------
    def schedule(self, time_s: float, event: Event) -> None:
        self.queue.push(time_s, event)

    def observe_rate(self, job_id: str, rate: float) -> None:
        self.state.observe_rate(job_id, rate)

    def report(self, job_id: str, telemetry: Telemetry) -> None:
        job = self.state.report(job_id, telemetry)
        self.policy.on_telemetry(job, self.clock.now())

    def reported(self, job_id: str, telemetry: Telemetry, now_s: float) -> None:
        """Live mode: a running job's own measurement, taken at ``now_s``. Recorded at once, and for a policy that
        reads telemetry a round follows at ``now_s`` (the simulator's executor reports from inside a
        ``DemandChanged``, which calls for that round itself). Without it, a policy whose checks had all settled
        (AntMan's coordinator once every share is set) would not hear of a slowdown until something else
        happened."""
        self.report(job_id, telemetry)
        if self.policy.needs_telemetry:
            self.queue.push(now_s, TelemetryReported(job_id, self.state.job(job_id).run_epoch))

    # -- input ----------------------------------------------------------------------------------------------
    def submit(self, spec: JobSpec) -> None:
        self.queue.push(max(spec.submit_s, self.clock.now()), JobSubmitted(spec))

    def feed(self, jobs: Iterable[JobSpec]) -> None:
        """Stream jobs sorted by ``submit_s``; only the next arrival is queued at any time.

        The order check compares each job with the one fed before it; jobs given to :meth:`submit` meanwhile
        are independent of the stream."""
        if self._arrivals is not None:
            raise RuntimeError("the engine is already being fed a stream of jobs")
        self._arrivals = iter(jobs)
        self._next_arrival(None)

    def _next_arrival(self, previous: JobSpec | None) -> None:
        if self._arrivals is None:
            return
        spec = next(self._arrivals, None)
        if spec is None:
            self._arrivals = None
            return
        if previous is not None and spec.submit_s < previous.submit_s:
            raise JobSpecError(
                f"jobs must be fed in submission order: {spec.job_id!r} (submitted at {spec.submit_s}) comes "
                f"after {previous.job_id!r} (submitted at {previous.submit_s})"
            )
        self.queue.push(spec.submit_s, JobSubmitted(spec))

    def restore(self, record: JobStatus, now_s: float) -> JobStatus:
        """Take back a job known from before a restart (live recovery; see :meth:`ClusterState.restore`)."""
        job = self.state.restore(record, now_s)
        # The policy has seen none of this job's history: it rebuilds what it keeps about it from the job itself.
        self.policy.on_job_restored(self.state, job, now_s)
        if self.on_change is not None:
            self.on_change(job, now_s)
        return job

    def _changed(self, job: JobStatus, before: Placement | None, now: float) -> None:
        self.policy.on_job_changed(job, before, now)
        if self.on_change is not None:
            self.on_change(job, now)

    # -- the loop -------------------------------------------------------------------------------------------
    def run(self, until_s: float | None = None) -> None:
        """Process events until none are left (or until ``until_s``)."""
        # The turn, inlined (as in _turn), and the queue's heap read directly rather than through its methods: this
        # loop runs once per instant of a million-job replay, and its inner loop once per event. ``self._handle`` is
        # called as a method, not through a local bound method: compiled, that is a direct call (a subclass's
        # override included), where a bound method goes through Python's calling convention (issue 20).
        heap = self.queue._heap
        heappop = heapq.heappop
        advance = self.clock.advance_to
        while heap:
            now = heap[0][0]
            if until_s is not None and now > until_s:
                break
            advance(now)
            changed = False
            while heap and heap[0][0] == now:
                changed |= self._handle(heappop(heap)[3], now)
            if changed:
                self._round(now)

    def run_before(self, time_s: float) -> None:
        """Process every event due strictly before ``time_s`` (an event for ``time_s`` can still be scheduled and
        will be ordered with the others of that instant: the simulator streams node events this way)."""
        queue = self.queue
        while queue:
            now = queue.peek_time()
            if now >= time_s:
                break
            self._turn(now)

    def _turn(self, now: float) -> None:
        """Every event due at ``now``, then a round if anything changed."""
        queue = self.queue
        self.clock.advance_to(now)
        changed = False
        while queue and queue.peek_time() == now:
            _, event = queue.pop()
            changed |= self._handle(event, now)
        if changed:
            self._round(now)

    def _handle(self, event: Event, now: float) -> bool:
        if type(event) is JobFinished:
            job = self.state.job(event.job_id)
            if event.after_stop and job.phase is JobPhase.PENDING and job.run_epoch == event.run_epoch:
                self.state.finish_preempted(event.job_id, now)
                self._changed(job, None, now)
                return True
            if job.phase is not JobPhase.RUNNING or job.run_epoch != event.run_epoch:
                return False  # stale: the job was preempted after this completion was predicted
            if not self.executor.is_current(event):
                return False  # stale: re-predicted since (its speed changed while it ran)
            before = job.placement
            self.state.finish(event.job_id, now)
            self.executor.finished(job, now)
            self._changed(job, before, now)
            return True
        # Checked most frequent first (a replay has one submission, one demand change and one finish per job).
        if type(event) is JobSubmitted:
            spec = event.job
            self.submitted += 1
            if self.on_submitted is not None and not self.submitted & 1023:
                self.on_submitted(self.submitted)
            self._next_arrival(spec)
            job = self.state.add(spec, now)
            reason = self.policy.admit(self.state, spec)
            self._changed(job, None, now)
            if reason is not None:
                self._apply(Reject(spec.job_id, reason), now)
                return False
            return True
        if type(event) is DemandChanged:
            job = self.state.job(event.job_id)
            if job.phase is not JobPhase.RUNNING or job.run_epoch != event.run_epoch:
                return False
            if not self.executor.is_current(event):
                return False
            self.executor.demand_changed(job, now)
            # News only to a policy that reads telemetry: others see nothing new, so no round for them.
            return self.policy.needs_telemetry
        if type(event) is JobFailed or type(event) is JobInterrupted:
            job = self.state.job(event.job_id)
            if (
                type(event) is JobFailed
                and event.after_stop
                and job.phase is JobPhase.PENDING
                and job.run_epoch == event.run_epoch
            ):
                self.state.fail_preempted(event.job_id, now, event.reason)
                self._changed(job, None, now)
                return True
            if job.phase is not JobPhase.RUNNING or job.run_epoch != event.run_epoch:
                return False  # stale: the run was already preempted, cancelled or replaced
            before = job.placement
            if type(event) is JobFailed:
                self.state.fail(event.job_id, now, event.reason)
                self.executor.finished(job, now)
            else:
                work = self.executor.preempt(job, now)  # what the run achieved; its process is already gone
                self.state.preempt(event.job_id, now, work)
            self._changed(job, before, now)
            return True
        if type(event) is JobCancelled:
            job = self.state.job(event.job_id)
            if job.phase.is_terminal:
                return False
            before = job.placement
            if job.phase is JobPhase.RUNNING:
                self.executor.cancel(job, now)
            self.state.cancel(event.job_id, now, event.reason)
            self._changed(job, before, now)
            return True
        if type(event) is TelemetryReported:
            job = self.state.job(event.job_id)
            # Recorded when it came (Engine.reported); a round only while that run still runs.
            return job.phase is JobPhase.RUNNING and job.run_epoch == event.run_epoch
        if type(event) is TimerFired:
            self._timers.discard(now)
            for job_id in self.policy.on_timer(self.state, now):
                self.state.requeue(job_id)
            return True
        if type(event) is NodeLost:
            return self._node_lost(event, now)
        if type(event) is NodeJoined:
            state = self.state
            node = state.node_index(event.node)
            if state.node_up(node):
                return False  # up already: a repeated report
            state.join_node(node, now)
            if self.decision_log is not None:
                self.decision_log.append(LoggedAction(now, NodeChanged(event.node, True)))
            self.policy.on_nodes_changed(state, (node,), now)
            return True
        raise InvariantViolation(f"unknown event {event!r}")

    def _node_lost(self, event: NodeLost, now: float) -> bool:
        """Requeue the lost node's jobs, drop what was suspended there, take its GPUs out (module docstring)."""
        state, executor, lost = self.state, self.executor, self._loss_executor
        node = state.node_index(event.node)
        if not state.node_up(node):
            return False  # down already: a repeated report
        requeued: list[str] = []
        for job in state.jobs_on_node(node):
            job_id = job.spec.job_id
            before = job.placement
            # The run is gone on this node: the executor stops the rest of the gang and says where it restarts from.
            work = lost.run_lost(job, now, event.node) if lost is not None else executor.preempt(job, now)
            state.requeue_lost(job_id, now, work)
            requeued.append(job_id)
            self._changed(job, before, now)
        for job in state.suspended_on_node(node):
            work = lost.suspended_lost(job, now, event.node) if lost is not None else job.work_done_s
            state.forget_suspended(job.spec.job_id, work)
            if self.on_change is not None:
                self.on_change(job, now)  # no phase change: the policy reads suspended_from from the view
        state.lose_node(node, now)
        if self.decision_log is not None:
            self.decision_log.append(LoggedAction(now, NodeChanged(event.node, False, tuple(requeued))))
        self.policy.on_nodes_changed(state, (node,), now)
        return True

    def _round(self, now: float) -> None:
        self.rounds += 1
        timed = self.on_round
        t0 = time.perf_counter() if timed is not None else 0.0
        decision = self.policy.schedule(self.state, now)
        for action in decision.actions:
            self._apply(action, now)
        waiting = decision.waiting
        if waiting:
            self.state.note_waiting(waiting)
            if self.on_waiting is not None:
                self.on_waiting(waiting)
        self._wake(decision, now)
        if timed is not None:
            timed(time.perf_counter() - t0)
        if self.after_round is not None:
            self.after_round(now)

    def _wake(self, decision: Decision, now: float) -> None:
        wake = decision.wake_at_s
        if wake is not None and wake > now and wake not in self._timers:
            self._timers.add(wake)
            self.queue.push(wake, TimerFired("policy"))

    def _apply(self, action: Action, now: float) -> None:
        state, executor = self.state, self.executor
        before: Placement | None = None  # the placement the job held before the action
        if type(action) is Launch:
            job = state.launch(action.job_id, action.placement, now)
            executor.launch(job, now)
        elif type(action) is Preempt:
            job = state.job(action.job_id)
            if job.phase is not JobPhase.RUNNING:
                raise InvariantViolation(f"cannot preempt job {action.job_id!r}: it is {job.phase.value}")
            before = job.placement
            work = executor.preempt(job, now, suspend=action.suspend)
            state.preempt(action.job_id, now, work, suspend=action.suspend, downgrade=action.downgrade)
        elif type(action) is Resize:
            before = state.resize(action.job_id, now, action.gpu_milli, action.mem_mib)
            job = state.job(action.job_id)
            executor.resized(job, now, before)
        elif type(action) is Upgrade:
            before = state.upgrade(action.job_id, action.placement, now)
            job = state.job(action.job_id)
            executor.resized(job, now, before)
        elif type(action) is SetBatchSize:
            batch_executor = self._batch_executor
            if batch_executor is None and action.job_id in state:
                known = state.job(action.job_id)
                if known.phase is JobPhase.RUNNING and known.batch_size != action.batch_size:
                    raise InvariantViolation(
                        f"cannot set the batch size of running job {action.job_id!r}: the executor "
                        f"({type(executor).__name__}) has no batch_size_changed()"
                    )
            had = state.set_batch_size(action.job_id, action.batch_size)
            job = state.job(action.job_id)
            before = job.placement  # unchanged
            if job.phase is JobPhase.RUNNING and had != job.batch_size:
                assert batch_executor is not None
                batch_executor.batch_size_changed(job, now, had)
        elif type(action) is Reject:
            job = state.reject(action.job_id, action.reason, now)
        else:
            raise InvariantViolation(f"unknown action {action!r}")
        if self.decision_log is not None:
            self.decision_log.append(LoggedAction(now, action))
        self._changed(job, before, now)
