"""The live controller: the engine on a wall clock, a durable store, and agents that run real processes.

It is the simulator's :class:`~corral.engine.loop.Engine` with the same :class:`~corral.engine.state.ClusterState`
and the same policies; only the executor and the clock differ. :class:`LiveExecutor` turns the engine's
decisions into process actions (start, checkpoint-and-exit, pause, resume, stop) for a node's agent, and the
controller turns what agents report (a process started, exited, measured its steps) back into engine events.

One thread runs the loop; everything else talks to it through an inbox:

- the API's threads commit a submission to the store, then post it; reads come from the store (and, for the
  cluster view, from a snapshot the loop thread builds on request);
- the agent's threads post their reports;
- each turn of the loop takes what is in the inbox, runs every engine event now due (a scheduling round when
  anything changed), writes every changed job and process state to the store in one transaction, commits it,
  and only then sends the agent the actions of the turn. So the store always knows at least what the agent was
  asked to do: after a ``kill -9`` nothing the API accepted is lost and no process is started twice.

A job's *process* is kept apart from its engine phase (:class:`~corral.live.records.ProcessState`): a
preempted job is PENDING at once, while its process may still be saving a checkpoint; the agent starts the
job's next run only after that process has exited. Processes are numbered by run (``CORRAL_RUN``), which is
not the engine's run epoch: a suspended job resumed in place keeps its process and its run number.

Recovery (:meth:`Controller.recover`, called by :meth:`Controller.start`): every job not in a terminal phase is
taken back. A running job whose process the agent can still see is reattached and keeps running; one whose
process is gone goes back to the queue with its progress and restarts from its last checkpoint.

Several machines (``corral serve --ray``): the agent is a :class:`~corral.live.nodes.Nodes`, the agents of the
Ray cluster's GPU nodes behind one interface (:mod:`corral.live.transport.ray` carries the calls), and the cluster
model has a node per machine (:func:`cluster_for_nodes`). A job across nodes is one run of a gang to the
controller. A machine lost or back comes in as :class:`~corral.live.nodes.NodeDown`/``NodeUp`` and goes to the
engine as ``NodeLost``/``NodeJoined``, which requeues the jobs that had a rank there
(:meth:`LiveExecutor.run_lost`).

The same class runs on a :class:`~corral.engine.clock.VirtualClock` with a
:class:`~corral.live.virtual.VirtualAgent` (:meth:`Controller.run_virtual`): the parity test replays a trace
through the controller and through the simulator and compares the decision logs.
"""

from __future__ import annotations

import logging
import math
import os
import queue
import signal
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from corral.core import contract
from corral.core.cluster import Cluster, Topology
from corral.core.errors import CorralError, InvariantViolation
from corral.core.events import (
    JobCancelled,
    JobFailed,
    JobFinished,
    JobInterrupted,
    JobSubmitted,
    NodeJoined,
    NodeLost,
    TimerFired,
)
from corral.core.job import FULL_GPU_MILLI, JobClass, JobPhase, JobSpec
from corral.core.status import JobStatus
from corral.core.telemetry import Telemetry
from corral.core.tenant import Tenant
from corral.core.wording import gpus
from corral.engine.clock import Clock, VirtualClock, WallClock
from corral.engine.loop import Engine
from corral.engine.state import ClusterState
from corral.live.agent import (
    AgentReport,
    JobMeasured,
    JobReported,
    JobSaid,
    LaunchRequest,
    ProcessExited,
    ProcessStarted,
)
from corral.live.controller import lifecycle
from corral.live.controller.baseline import UNDEGRADED, Baselines, Placing
from corral.live.controller.cluster import cluster_for, cluster_for_nodes
from corral.live.controller.estimates import Estimator
from corral.live.controller.executor import AgentLike, ExecutorLinks, LiveExecutor
from corral.live.controller.stats import LiveStats
from corral.live.nodes import NodeDown, NodeReport, Nodes, NodeUp
from corral.live.records import (
    ClusterSnapshot,
    GpuJob,
    GpuSnapshot,
    InvalidRequest,
    JobEnded,
    JobRecord,
    JobRequest,
    NeverFits,
    NodeSnapshot,
    NoSuchJob,
    ProcessPhase,
    ProcessState,
    TenantSnapshot,
    UnknownTenant,
    new_job_id,
)
from corral.live.store import JobEvent, Store
from corral.policies.framework.contract import BasePolicy

if TYPE_CHECKING:
    from corral.live.config import ServeConfig

log = logging.getLogger("corral.live.controller")

T = TypeVar("T")


@dataclass(slots=True)
class _Item:
    """One thing for the loop: a submission, a cancellation, an agent report, or a call from another thread."""

    kind: str
    payload: Any = None
    done: threading.Event | None = None
    result: Any = None
    error: BaseException | None = None


@dataclass(slots=True)
class _Pending:
    """What a turn has changed and not yet committed."""

    jobs: dict[str, JobStatus] = field(default_factory=dict)
    notes: list[tuple[float, str, str, str]] = field(default_factory=list)
    commands: list[Callable[[], object]] = field(default_factory=list)


class Controller:
    """The engine, its store and its agent. See the module docstring."""

    def __init__(
        self,
        *,
        cluster: Cluster,
        policy: BasePolicy,
        store: Store,
        agent: AgentLike,
        clock: Clock | None = None,
        gpu_order: Sequence[int] | None = None,
        grace_s: float = contract.DEFAULT_GRACE_S,
        record_decisions: bool = False,
        config: ServeConfig | None = None,
        machines: Mapping[str, tuple[str, ...]] | None = None,
    ) -> None:
        self.config = config
        # With several machines: each machine's engine nodes (a machine with two GPU types is two engine nodes).
        self.machines: dict[str, tuple[str, ...]] = dict(machines or {})
        self._closers: list[Callable[[], None]] = []
        self.cluster_spec = cluster
        self.topology = Topology(cluster)
        self.policy = policy
        self.store = store
        self.agent = agent
        self.clock: Clock = clock if clock is not None else WallClock()
        self.grace_s = grace_s
        self.gpu_order = list(gpu_order) if gpu_order is not None else list(range(self.topology.num_gpus))
        self.state = ClusterState(self.topology, cluster.tenants, queue_key=policy.queue_key)
        self.executor = LiveExecutor(
            ExecutorLinks(
                agent=lambda: self.agent,
                process=self.process,
                command=self.command,
                note=self.note,
                launch_request=self.launch_request,
                set_movable=self.state.set_movable,
                report=self.deliver,
            )
        )
        self.engine = Engine(self.state, policy, self.executor, self.clock, record_decisions=record_decisions)
        self.engine.on_change = self._changed
        self.engine.on_waiting = self._note_waiting
        self.stats = LiveStats()  # round latencies and job events, for GET /metrics
        # Told each turn's job events once they are committed (corral serve prints them); on the loop thread.
        self.on_events: Callable[[list[JobEvent]], None] | None = None
        self.on_report: Callable[[NodeReport], None] | None = None  # each agent report as it comes (the dashboard)
        self.engine.on_round = self.stats.observe_round
        self._tenants = {t.name: t for t in cluster.tenants}
        self._inbox: queue.Queue[_Item] = queue.Queue()
        self._turn_changes = _Pending()
        self._proc: dict[str, ProcessState] = {}
        self._requests: dict[str, JobRequest] = {}
        self._seq: dict[str, int] = {}
        self._phase: dict[str, JobPhase] = {}
        self._telemetry: dict[str, Telemetry] = {}  # each running job's latest, with its baseline (ObservedTelemetry)
        self.baselines = Baselines()  # each job's step time alone, measured: its slowdown (loop thread only)
        self._waiting: dict[str, str] = {}  # why each pending job waits, as the last round that examined it said
        self._measured: dict[str, JobMeasured] = {}  # the agent's latest NVML figures per job (loop thread only)
        # Each running job's last word on how many steps it has left (Job(total_steps=...)), with its step time and
        # when it said so: (run, steps left, step time s, time): the estimates' remaining time (loop thread only).
        self._progress: dict[str, tuple[int, int, float, float]] = {}
        self._telemetry_lock = threading.Lock()
        self._submit_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._agent_started = False
        self._turn_now = 0.0  # the time of the turn in progress: what its notes are stamped with
        self._declared = False  # trace jobs fed on a virtual clock say their durations (see feed)
        # Start-time estimates: a forecast of the queue in a worker process (inline on a virtual clock).
        self.estimator = Estimator(
            self,
            interval_s=config.estimate_interval_s if config is not None else 0.0,
            in_process=isinstance(self.clock, VirtualClock),
        )

    # ------------------------------------------------------------------------------------------------------
    # Construction from a serve configuration
    # ------------------------------------------------------------------------------------------------------
    @classmethod
    def from_config(cls, config: ServeConfig) -> Controller:
        from corral.live.agent import Agent
        from corral.live.agent.gpus import discover_gpus
        from corral.policies.registry import make_policy

        tenants = [Tenant(t.name, t.quota_gpus) for t in config.tenants]
        policy = make_policy(config.policy)
        state_dir = Path(config.state_dir)
        state_dir.mkdir(parents=True, exist_ok=True)
        holder: list[Controller] = []

        def deliver(report: NodeReport) -> None:
            holder[0].deliver(report)

        agent: AgentLike
        machines: dict[str, tuple[str, ...]] = {}
        closers: list[Callable[[], None]] = []
        if config.ray is None:  # the embedded default: this machine, its agent in this process, no Ray
            gpus = discover_gpus(config.gpus, stand_in_mem_mib=config.stand_in_mem_mib)
            cluster, order = cluster_for(gpus, tenants)
            agent = Agent(state_dir, gpus, deliver, warm=config.warm_starts)
        else:
            from corral.live.config import parse_expected_node
            from corral.live.transport.ray import RayCluster, RayOptions

            ray_cluster = RayCluster(
                RayOptions(
                    config.ray,
                    str(state_dir),
                    checkpoint_dir=str(config.checkpoint_dir) if config.checkpoint_dir is not None else None,
                    stand_in_mem_mib=config.stand_in_mem_mib,
                    expect=tuple(parse_expected_node(spec) for spec in config.ray_expect),
                    warm=config.warm_starts,
                )
            )
            found = ray_cluster.connect()
            nodes = Nodes(found, deliver, absent=ray_cluster.absent_names)
            ray_cluster.on_node_back = nodes.rejoin
            closers.append(ray_cluster.close)
            cluster, order, machines = cluster_for_nodes(nodes.node_gpus(), tenants)
            agent = nodes
        store = Store(state_dir / "corral.db")
        controller = cls(
            cluster=cluster,
            policy=policy,
            store=store,
            agent=agent,
            gpu_order=order,
            grace_s=config.grace_s,
            config=config,
            machines=machines,
        )
        controller._closers.extend(closers)
        holder.append(controller)
        return controller

    # ------------------------------------------------------------------------------------------------------
    # Life cycle
    # ------------------------------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the agent, take back what the store knows, and run the loop in a thread."""
        if self._thread is not None:
            return
        self.agent.start()
        self._agent_started = True
        if isinstance(self.agent, Nodes):
            # Nodes not here at start-up (declared to join later): lost before anything is placed or restored.
            now = self.clock.now()
            for machine in self.agent.down_nodes():
                for node in self.machines.get(machine, (machine,)):
                    self.engine.schedule(now, NodeLost(node, "not joined yet"))
        self.recover()
        self._stop.clear()
        self._thread = threading.Thread(target=self._serve, name="corral-controller", daemon=True)
        self._thread.start()
        self.estimator.start()

    def stop(self) -> None:
        """Stop the loop and the agent. Job processes keep running: the next start reattaches them."""
        self.estimator.stop()
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            self._inbox.put(_Item("wake"))
            thread.join(timeout=10)
        if self._agent_started:
            self.agent.close()
            self._agent_started = False
        for close in self._closers:
            try:
                close()
            except Exception:
                log.exception("stopping the controller")
        self._closers.clear()

    def recover(self) -> None:
        """Take back every unfinished job from the store (see the module docstring). Runs before the loop."""
        now = self._turn_now = self.clock.now()
        changes = self._turn_changes
        for rec in self.store.unfinished():
            job_id, proc, status = rec.job_id, rec.process, rec.status
            self._requests[job_id] = rec.request
            self._seq[job_id] = rec.seq
            self._proc[job_id] = proc
            self._adopt_earlier(job_id, proc, status)
            alive = proc.phase is not ProcessPhase.NONE and self._adopt(job_id, proc.run, status)
            if status.phase.is_terminal:  # cancelled or failed while its process was being stopped
                if alive:
                    run = proc.run
                    self.command(partial(self.agent.cancel, job_id, run))
                else:
                    if proc.phase is not ProcessPhase.NONE:  # gone while no controller watched
                        lifecycle.move(job_id, proc, ProcessPhase.NONE)
                    changes.jobs[job_id] = status
                continue
            if not alive and proc.phase is not ProcessPhase.NONE:
                lifecycle.move(job_id, proc, ProcessPhase.NONE)
            if status.phase is JobPhase.RUNNING and proc.phase in (ProcessPhase.RUNNING, ProcessPhase.STARTING):
                try:
                    job = self.engine.restore(status, now)
                except InvariantViolation as e:  # the machine or the quotas changed while we were down
                    log.warning("job %s cannot keep its GPUs after the restart (%s); requeued", job_id, e)
                    run = proc.run
                    self.command(partial(self.agent.preempt, job_id, run))
                    lifecycle.stop(job_id, proc, "preempt")
                    job = self.engine.restore(_requeued(status, now), now)
                self.note(job_id, "reattached" if job.phase is JobPhase.RUNNING else "requeued", f"run {proc.run}")
                continue
            if status.phase is JobPhase.RUNNING:  # its process is gone: back to the queue, from its checkpoint
                status = _requeued(status, now)
                self.note(
                    job_id, "requeued", f"run {proc.run} was gone after the restart; restarts from its checkpoint"
                )
            if proc.phase is ProcessPhase.STOPPING:
                run = proc.run
                self.command(partial(self.agent.preempt, job_id, run))
            elif proc.phase is not ProcessPhase.PAUSED:
                status.suspended_from = None
            self.engine.restore(status, now)
        # A round soon after, even if nothing else happens: the restored queue may fit now.
        self.engine.schedule(now, TimerFired("restart"))
        self._flush(now)

    def _adopt_earlier(self, job_id: str, proc: ProcessState, status: JobStatus) -> None:
        """Take back the job's earlier runs whose exit was not heard (``proc.earlier``), before its latest one, so
        that the latest waits for them on its GPUs: an exit recorded while no controller ran is reported now (one
        that finished the job's work finishes the job); one still alive is asked again to checkpoint and exit
        (the request made before the restart may never have reached it); one with nothing left is forgotten."""
        for run in list(proc.earlier):
            if not self._adopt(job_id, run, None):
                proc.earlier.remove(run)
                continue
            stop = self.agent.cancel if status.phase.is_terminal else self.agent.preempt
            self.command(partial(stop, job_id, run))

    def _adopt(self, job_id: str, run: int, status: JobStatus | None) -> bool:
        """Ask the agent to take back a run; several nodes' agents are told the GPUs it held, where known (a gang
        needs all its ranks back, or none); an earlier run's (``status`` None) are looked for on every node."""
        agent = self.agent
        held = None if status is None else status.placement if status.placement is not None else status.suspended_from
        if isinstance(agent, Nodes) and held is not None:
            return agent.adopt(job_id, run, gpus=[self.gpu_order[g] for g in held.gpus])
        return agent.adopt(job_id, run)

    # ------------------------------------------------------------------------------------------------------
    # The loop
    # ------------------------------------------------------------------------------------------------------
    def _serve(self) -> None:
        while not self._stop.is_set():
            queue_ = self.engine.queue
            timeout = 0.5
            if queue_:
                timeout = min(timeout, max(0.0, queue_.peek_time() - self.clock.now()))
            items: list[_Item] = []
            try:
                items.append(self._inbox.get(timeout=timeout))
                while True:
                    items.append(self._inbox.get_nowait())
            except queue.Empty:
                pass
            try:
                self._turn(self.clock.now(), items)
            except Exception:  # a bug outside any one item (committing the turn): keep serving, say so loudly
                self.failed_items += 1
                log.exception("controller turn failed")
                for item in items:
                    if item.done is not None and not item.done.is_set():
                        item.error = CorralError("the controller failed on this request; see its log")
                        item.done.set()

    failed_items: int = 0
    """Inbox items and engine events whose handling raised (each logged with its traceback): a bug to look at;
    the other items of the same turn were applied all the same."""

    def _turn(self, now: float, items: Iterable[_Item]) -> None:
        """Apply the inbox's items, run the engine's due events, commit, act. Each item, and each engine event, is
        applied or fails on its own: an exception while handling one (a bug: bad input stops at the edge, see
        :func:`corral.core.contract.decode`) is logged with its traceback, counted in :attr:`failed_items` and
        handed to the item's waiter, and never takes the turn's other items (other tenants' submissions and
        reports) with it. An accepted submission is never dropped: it is in the store before it is queued, the
        engine takes it in this very turn, and one that the engine could not take ends REJECTED with the reason,
        instead of staying pending unseen."""
        self._turn_now = now
        # Engine events due before this turn (a policy's timer, the restart's round) happened before what the items
        # report, which is stamped now: run them first. Else a round they trigger, run after the items, could
        # preempt a job whose process the items say has already ended, and its end would be dropped as stale.
        self._run_engine(now, before=True)
        waiting = []  # answered after the turn is committed: a cancel's caller then reads the ended job
        submitted: list[JobSpec] = []
        cancels: list[str] = []
        for item in items:
            try:
                if item.kind == "submit":
                    spec, request = item.payload
                    self._requests[spec.job_id] = request
                    submitted.append(spec)
                    # Due now (not at the clock's later reading, as Engine.submit would), so that the engine
                    # takes it in this turn and the check below can tell a job the engine failed to take.
                    self.engine.schedule(max(spec.submit_s, now), JobSubmitted(spec))
                elif item.kind == "cancel":
                    cancels.append(item.payload)
                elif item.kind == "report":
                    self._on_report(item.payload, now)
                elif item.kind == "node":
                    self._on_node(item.payload, now)
            except Exception as e:
                self.failed_items += 1
                log.exception(
                    "controller: a %s item failed (%r); the turn's other items go on", item.kind, item.payload
                )
                item.error = e
            if item.done is not None:
                waiting.append(item)
        self._run_engine(now)
        if cancels:  # after the submissions: a job cancelled right after it was submitted is known by now
            for job_id in cancels:
                if job_id in self.state:  # else it ended already (the API checked that it exists)
                    self.engine.schedule(now, JobCancelled(job_id, "cancelled by a user"))
            self._run_engine(now)
        queue_ = self.engine.queue
        if queue_ and queue_.peek_time() <= now:
            log.error("controller: engine events still due after repeated failures; the next turn takes them")
        else:
            for spec in submitted:
                if spec.submit_s <= now and spec.job_id not in self.state:  # it failed: say so, durably
                    lost = JobStatus(spec=spec, phase=JobPhase.REJECTED, queued_since_s=spec.submit_s)
                    lost.reason = "the scheduler failed to take this job (a bug; see the server's log)"
                    lost.end_s = now
                    self._turn_changes.jobs[spec.job_id] = lost
                    self.note(spec.job_id, JobPhase.REJECTED.value, lost.reason)
        self._flush(now)
        for item in waiting:
            if item.kind == "call":
                try:
                    item.result = item.payload()
                except BaseException as e:  # handed back to the caller's thread
                    item.error = e
            assert item.done is not None
            item.done.set()

    def _run_engine(self, now: float, *, before: bool = False) -> None:
        """Run the engine's due events (part of :meth:`_turn`). An event whose handling raises has been taken off
        the queue: running again goes on with the next one, so one bad event costs only itself; the round that
        the events handled before it called for is asked for again (a timer now). The retries are bounded: a
        policy that fails every round is logged every turn."""
        for _ in range(len(self.engine.queue) + 2):
            try:
                if before:
                    self.engine.run_before(now)
                else:
                    self.engine.run(until_s=now)
                return
            except Exception:
                self.failed_items += 1
                log.exception("controller: an engine event failed; the turn's other events go on")
                self.engine.schedule(now, TimerFired("after a failed event"))

    def _flush(self, now: float) -> None:
        """Commit the turn's changes, then act on them (the durability rule)."""
        changes, self._turn_changes = self._turn_changes, _Pending()
        if changes.jobs or changes.notes:
            with self.store.transaction():
                for job_id, job in changes.jobs.items():
                    proc = self.process(job_id)
                    if job_id in self._seq:
                        self.store.update(job, proc)
                    else:  # a job fed straight to the engine (virtual-clock runs)
                        seq = self.store.next_seq()
                        self._seq[job_id] = seq
                        self.store.insert(seq, self._request_of(job.spec), job, proc)
                for t, job_id, kind, detail in changes.notes:
                    self.store.log(t, job_id, kind, detail)
            if changes.notes:
                self._told([JobEvent(*note) for note in changes.notes])
        for command in changes.commands:
            try:
                command()
            except Exception:
                log.exception("agent command failed")
        for job_id, job in changes.jobs.items():  # forget what no longer takes part (the store has it)
            if job.phase.is_terminal and self.process(job_id).phase is ProcessPhase.NONE:
                self._forget(job_id)

    def _told(self, events: list[JobEvent]) -> None:
        """Job events just committed: counted for the metrics, handed to the listener (``on_events``)."""
        for e in events:
            self.stats.count_event(e.kind)
        if self.on_events is not None:
            try:
                self.on_events(events)
            except Exception:  # a listener's failure (a closed terminal) must not stop the scheduler
                log.exception("controller: the job events listener failed")

    def _forget(self, job_id: str) -> None:
        self._proc.pop(job_id, None)
        self._requests.pop(job_id, None)
        self._phase.pop(job_id, None)
        self._measured.pop(job_id, None)
        self._progress.pop(job_id, None)
        self.baselines.forget(job_id)
        with self._telemetry_lock:
            self._telemetry.pop(job_id, None)

    # -- virtual clock ------------------------------------------------------------------------------------------
    def feed(self, jobs: Iterable[JobSpec], *, declared: bool = False) -> None:
        """Virtual-clock runs: stream trace jobs to the engine (they are written to the store as they arrive).
        ``declared``: each job's request says its trace duration as the duration it expects (what a user gives
        with ``corral submit --expect``), for the start-time estimates."""
        self._declared = declared
        self.engine.feed(jobs)

    def run_virtual(
        self,
        *,
        turns: int | None = None,
        node_events: Iterable[tuple[float, NodeLost | NodeJoined]] = (),
        after_turn: Callable[[float], None] | None = None,
    ) -> None:
        """Run to the end on a virtual clock, with an agent that reports in virtual time (see
        :class:`~corral.live.virtual.VirtualAgent`): each step goes to the earliest engine event or agent
        report, exactly as :meth:`Engine.run` goes from event to event.

        ``turns`` stops after that many turns, as a ``kill -9`` between two turns would (restart tests: a new
        controller on the same store and agent then takes over). ``node_events`` (in time order) are nodes lost and
        back, given to the engine as the simulator gives them (:func:`corral.sim.runner.simulate`): once everything
        before their time is done, and only while something is left to do. ``after_turn(t)`` is called after each
        turn (the estimate benchmarks make their forecasts there, at virtual times)."""
        agent = self.agent
        next_report = getattr(agent, "next_report_s", None)
        due = getattr(agent, "reports_due", None)
        if next_report is None or due is None:
            raise CorralError("run_virtual needs an agent that reports in virtual time (VirtualAgent)")
        self.recover()
        events = iter(node_events)
        upcoming = next(events, None)
        done = 0
        while turns is None or done < turns:
            t_engine = self.engine.queue.peek_time() if self.engine.queue else math.inf
            t_agent = next_report()
            t = min(t_engine, math.inf if t_agent is None else t_agent)
            if upcoming is not None and upcoming[0] <= t:
                t_node, event = upcoming
                upcoming = next(events, None)
                state = self.state
                if t == math.inf and (not state.num_pending or not state.down_nodes()):
                    upcoming = None  # nothing left to do, and no job waits for a node to come back
                else:
                    self.engine.schedule(t_node, event)
                continue
            if t == math.inf:
                break
            done += 1
            self.clock.advance_to(t)
            items = [_Item("report", r) for r in due(t)]
            self._turn(t, items)
            if after_turn is not None:
                after_turn(t)

    # ------------------------------------------------------------------------------------------------------
    # Helpers for the executor (loop thread only)
    # ------------------------------------------------------------------------------------------------------
    def process(self, job_id: str) -> ProcessState:
        proc = self._proc.get(job_id)
        if proc is None:
            proc = self._proc[job_id] = ProcessState()
        return proc

    def command(self, action: Callable[[], object]) -> None:
        self._turn_changes.commands.append(action)

    def note(self, job_id: str, kind: str, detail: str = "") -> None:
        self._turn_changes.notes.append((self._turn_now, job_id, kind, detail))
        job = self.state.job(job_id) if job_id in self.state else None
        if job is not None:
            self._turn_changes.jobs[job_id] = job

    def launch_request(self, job: JobStatus, run: int) -> LaunchRequest:
        request = self._request_of(job.spec)
        placement = job.placement
        assert placement is not None
        tenant = job.spec.tenant
        tenant_config = self.config.tenant(tenant) if self.config is not None else None
        return LaunchRequest(
            job_id=job.spec.job_id,
            run=run,
            command=request.command,
            cwd=request.cwd,
            env=request.env,
            gpus=tuple(self.gpu_order[g] for g in placement.gpus),
            tenant=tenant,
            run_as=tenant_config.run_as if tenant_config is not None else None,
            gpu_milli=placement.gpu_milli,
            mem_mib=placement.mem_mib,
            grace_s=self.grace_s,
            warm=request.warm,
        )

    def _request_of(self, spec: JobSpec) -> JobRequest:
        request = self._requests.get(spec.job_id)
        if request is None:  # a trace job fed on a virtual clock: it has no command of its own
            request = self._requests[spec.job_id] = JobRequest(
                command=("true",),
                tenant=spec.tenant,
                num_gpus=spec.num_gpus,
                gpu_milli=spec.gpu_milli,
                opportunistic=spec.job_class is JobClass.OPPORTUNISTIC,
                name=spec.job_id,
                expected_duration_s=spec.duration_s if self._declared else None,
            )
        return request

    def _changed(self, job: JobStatus, now: float) -> None:
        job_id = job.spec.job_id
        self._turn_changes.jobs[job_id] = job
        before = self._phase.get(job_id)
        if job.phase is not before:
            self._phase[job_id] = job.phase
            if job.phase.is_terminal:
                self._turn_changes.notes.append((now, job_id, job.phase.value, job.reason or ""))
                self.baselines.forget(job_id)
            with self._telemetry_lock:
                if job.phase is not JobPhase.RUNNING:
                    self._telemetry.pop(job_id, None)
                if job.phase is not JobPhase.PENDING:
                    self._waiting.pop(job_id, None)

    def _note_waiting(self, reasons: Mapping[str, str]) -> None:
        """The reasons a round gave for the jobs it left waiting (shown by the API; not stored: the next round
        gives them again)."""
        with self._telemetry_lock:
            for job_id, reason in reasons.items():
                if self._phase.get(job_id) is JobPhase.PENDING:
                    self._waiting[job_id] = reason

    # ------------------------------------------------------------------------------------------------------
    # Agent reports
    # ------------------------------------------------------------------------------------------------------
    def deliver(self, report: NodeReport) -> None:
        """Called from the agent's threads (a node's loss or return, with several nodes, too)."""
        if self.on_report is not None:
            self.on_report(report)
        if isinstance(report, NodeDown | NodeUp):
            self._inbox.put(_Item("node", report))
        else:
            self._inbox.put(_Item("report", report))

    def _on_node(self, report: NodeDown | NodeUp, now: float) -> None:
        """A machine lost or back: the engine's ``NodeLost``/``NodeJoined`` for each of its engine nodes (the
        engine requeues the jobs that had a GPU there; see :meth:`LiveExecutor.run_lost`)."""
        for node in self.machines.get(report.node, (report.node,)):
            if isinstance(report, NodeDown):
                self.engine.schedule(now, NodeLost(node, report.reason))
            else:
                self.engine.schedule(now, NodeJoined(node))
        what = (
            f"node {report.node} lost: {report.reason}" if isinstance(report, NodeDown) else f"node {report.node} back"
        )
        log.warning("%s", what)

    def _on_report(self, report: AgentReport, now: float) -> None:
        job_id = report.job_id
        if isinstance(report, JobSaid):  # history, even from a run that has since ended (its exit may come first)
            message = report.message
            if isinstance(message, contract.Hello):
                self._hello(job_id, report.run, message)
                return
            if isinstance(message, contract.Checkpointed):
                self.note(job_id, "checkpointed", f"run {report.run} at step {message.step}")
            elif isinstance(message, contract.Paused):
                how = "state in host memory" if message.evicted else "GPU memory kept"
                took = f", {message.took_s * 1000:.0f} ms" if message.took_s is not None else ""
                self.note(job_id, "paused", f"run {report.run} at step {message.step} ({how}{took})")
            elif isinstance(message, contract.Resumed):
                took = f" (state restored in {message.took_s * 1000:.0f} ms)" if message.took_s is not None else ""
                self.note(job_id, "resumed", f"run {report.run} at step {message.step}{took}")
            return
        proc = self._proc.get(job_id)
        if proc is not None and isinstance(report, ProcessExited) and report.run < proc.run:
            self._earlier_run_exited(job_id, proc, report, now)
            return
        if proc is None or proc.run != report.run:
            return  # an earlier run's news, or a job already forgotten
        job = self.state.job(job_id) if job_id in self.state else None
        if isinstance(report, ProcessStarted):
            if proc.phase is ProcessPhase.STARTING:
                lifecycle.move(job_id, proc, ProcessPhase.RUNNING)
            proc.pid = report.pid
            self.note(job_id, "started", f"run {report.run}, pid {report.pid}")
        elif isinstance(report, ProcessExited):
            if proc.phase is ProcessPhase.NONE:  # its end was heard already (an agent told twice): nothing new
                log.warning("job %s: run %d reported ended twice; the second ignored", job_id, report.run)
                return
            self._on_exit(job_id, proc, job, report, now)
        elif isinstance(report, JobMeasured):
            self._measured[job_id] = report
        elif isinstance(report, JobReported) and job is not None and job.phase is JobPhase.RUNNING:
            measured = self._measured.get(job_id)
            if measured is not None and measured.run != report.run:
                measured = None  # an earlier run's processes
            tel = _telemetry(report.report, now, measured)
            if report.report.steps_left is not None:
                self._progress[job_id] = (report.run, report.report.steps_left, tel.step_time_s, now)
            shown = self._observed(job, report, tel)  # before the engine reacts: on the placement the steps ran on
            self.engine.reported(job_id, tel, now)  # the policies get the report as it is (observation only)
            with self._telemetry_lock:
                self._telemetry[job_id] = shown

    def _observed(self, job: JobStatus, report: JobReported, tel: Telemetry) -> Telemetry:
        """The report as the API, ``/metrics`` and the dashboard see it: with the job's measured baseline and
        slowdown (:mod:`corral.live.controller.baseline`). Costs a look at the jobs on its GPUs."""
        placement = job.placement
        if placement is None:
            return tel
        step = report.report
        placing = Placing(report.run, placement.gpus, placement.gpu_milli, step.batch_size)
        alone = self._alone(job.spec.job_id, placement.gpus)
        return self.baselines.observe(
            job.spec.job_id, tel, placing, alone=alone, undegraded=step.mem_mode in UNDEGRADED
        )

    def _alone(self, job_id: str, gpus: tuple[int, ...]) -> bool:
        """Whether no other job runs on any of ``gpus``, as the engine's GPU tables say: no other holder, and no
        opportunistic job with a share above 0 (one at 0 is paused). Costs the jobs on those GPUs."""
        state = self.state
        for g in gpus:
            if any(other != job_id for other in state.gpu_jobs(g)):
                return False
            for other in state.gpu_opportunistic_jobs(g):
                if other != job_id:
                    p = state.job(other).placement
                    if p is not None and p.gpu_milli > 0:
                        return False
        return True

    def _hello(self, job_id: str, run: int, hello: contract.Hello) -> None:
        """A job (re)connected: note whether it can be moved (it checkpoints), and tell it the limits it has now,
        which may have changed since it started (a resize sent while it was not connected yet, or while the
        controller was down, never reached it)."""
        proc = self._proc.get(job_id)
        job = self.state.job(job_id) if job_id in self.state else None
        if proc is None or proc.run != run or job is None or job.phase.is_terminal:
            return
        if job.movable != hello.checkpoints:
            self.state.set_movable(job_id, hello.checkpoints)
            self._turn_changes.jobs[job_id] = job
        if job.phase is not JobPhase.RUNNING:
            return
        placement = job.placement
        assert placement is not None
        limits = contract.SetLimits(
            gpu_milli=placement.gpu_milli if placement.opportunistic else FULL_GPU_MILLI, mem_mib=placement.mem_mib
        )
        self.command(partial(self.agent.send, job_id, run, limits))

    def _earlier_run_exited(self, job_id: str, proc: ProcessState, report: ProcessExited, now: float) -> None:
        """An earlier run of a job ended after its next run was launched (a run paused or asked to stop, then moved
        elsewhere, that exited on its own). If it finished the job's work (exit 0), the job is finished: its
        newer run is stopped, not left to do the work again."""
        self.note(job_id, "exited", f"run {report.run}: {_exit_words(report)}")
        job = self.state.job(job_id) if job_id in self.state else None
        if report.run in proc.earlier:
            proc.earlier.remove(report.run)
            if job is not None:
                self._turn_changes.jobs[job_id] = job
        if job is None or job.phase.is_terminal or report.exit_code != contract.EXIT_FINISHED:
            return
        if proc.phase is not ProcessPhase.NONE:
            self.executor.stop_run(job_id, proc)
        if job.phase is JobPhase.RUNNING:
            self.engine.schedule(now, JobFinished(job_id, job.run_epoch))
        else:
            self.engine.schedule(now, JobFinished(job_id, job.run_epoch, after_stop=True))

    def _on_exit(
        self, job_id: str, proc: ProcessState, job: JobStatus | None, report: ProcessExited, now: float
    ) -> None:
        was = lifecycle.exited(job_id, proc, report.exit_code, report.signal)
        how = _exit_words(report)
        self.note(job_id, "exited", f"run {report.run}: {how}")
        if job is None:
            return
        if job.phase is JobPhase.RUNNING and was in (ProcessPhase.RUNNING, ProcessPhase.STARTING):
            epoch = job.run_epoch
            if was is ProcessPhase.STARTING and report.exit_code is None and report.signal is None:
                # It never started (no such working directory, ...): starting it again would fail the same way.
                self.engine.schedule(now, JobFailed(job_id, epoch, f"could not start: {report.detail}"))
            elif report.exit_code == contract.EXIT_FINISHED:
                self.engine.schedule(now, JobFinished(job_id, epoch))
            elif report.exit_code == contract.EXIT_PREEMPTED or (report.exit_code is None and report.signal is None):
                self.engine.schedule(now, JobInterrupted(job_id, epoch, how))
            else:
                self.engine.schedule(now, JobFailed(job_id, epoch, how))
        elif job.phase is JobPhase.PENDING and report.exit_code == contract.EXIT_FINISHED and job.preemptions:
            # It completed before it reached the step boundary where it would have stopped.
            self.engine.schedule(now, JobFinished(job_id, job.run_epoch, after_stop=True))
        elif (
            job.phase is JobPhase.PENDING
            and was in (ProcessPhase.PAUSED, ProcessPhase.STOPPING)
            and job.preemptions
            and _failed(report, asked=was is ProcessPhase.STOPPING)
        ):
            # Suspended or preempted, but its run failed (an error code, even once asked to stop: the contract's
            # rule; or a signal the agent did not send), e.g. it ended in the turn that preempted it: it failed.
            self.engine.schedule(now, JobFailed(job_id, job.run_epoch, how, after_stop=True))
        elif job.phase is JobPhase.PENDING and was is ProcessPhase.PAUSED:
            job.suspended_from = None  # its paused process is gone: the next launch restarts from a checkpoint
        if job.phase.is_terminal:
            self._turn_changes.jobs[job_id] = job

    # ------------------------------------------------------------------------------------------------------
    # The API's side (any thread)
    # ------------------------------------------------------------------------------------------------------
    def submit(self, request: JobRequest) -> JobRecord:
        """Check a request, commit it, and queue it for the loop. Raises a :class:`~corral.live.records.BadRequest`,
        changing nothing."""
        self._check(request)
        with self._submit_lock:
            seq = self.store.next_seq()  # the order of submission, kept inside; the id users see is opaque
            job_id = new_job_id()
            while self.store.has(job_id):
                job_id = new_job_id()
            spec = request.spec(job_id, self.clock.now())
            status = JobStatus(spec=spec, queued_since_s=spec.submit_s)
            submitted = JobEvent(spec.submit_s, spec.job_id, "submitted", _describe(request))
            with self.store.transaction():
                self.store.insert(seq, request, status, ProcessState())
                self.store.log(submitted.time_s, submitted.job_id, submitted.kind, submitted.detail)
            self._seq[spec.job_id] = seq
            self._told([submitted])  # before the engine hears of it: its other events come after
        self._inbox.put(_Item("submit", (spec, request)))
        return self.job(spec.job_id)

    def check(self, request: JobRequest) -> None:
        """Refuse a request the controller would refuse at submission (a :class:`BadRequest`), changing nothing."""
        self._check(request)

    def _check(self, request: JobRequest) -> None:
        tenant = self._tenants.get(request.tenant)
        if tenant is None:
            raise UnknownTenant(f"unknown tenant {request.tenant!r}; tenants here: {', '.join(sorted(self._tenants))}")
        if not request.command or not all(isinstance(a, str) and a and "\0" not in a for a in request.command):
            raise InvalidRequest("command must be a non-empty list of non-empty strings without NUL characters")
        n, milli = request.num_gpus, request.gpu_milli
        if type(n) is not int or n < 1:
            raise InvalidRequest(f"num_gpus must be an integer >= 1, got {n!r}")
        total = self.topology.num_gpus
        if n > total:
            raise NeverFits(f"the job asks for {n} GPUs; this cluster has {total}")
        # A job larger than a node runs as a gang across nodes, on GPUs of one type (see capacity_reason).
        largest = max(self.topology.type_num_gpus)
        if n > largest:
            raise NeverFits(f"the job asks for {n} GPUs; this cluster has at most {largest} of one type")
        if type(milli) is not int or not 1 <= milli <= FULL_GPU_MILLI:
            raise InvalidRequest(f"gpu_milli must be an integer in 1..1000, got {milli!r}")
        if n > 1 and milli != FULL_GPU_MILLI:
            raise InvalidRequest("a fractional GPU share (gpu_milli < 1000) needs num_gpus == 1")
        if request.gpu_mem_mib is not None:
            most = max(self.topology.gpu_mem_mib)
            if type(request.gpu_mem_mib) is not int or not 0 <= request.gpu_mem_mib <= most:
                raise InvalidRequest(f"gpu_mem_mib must be an integer in 0..{most}, got {request.gpu_mem_mib!r}")
        if not request.opportunistic and tenant.quota_gpus is not None and n * milli > tenant.quota_gpus * 1000:
            raise NeverFits(
                f"tenant {tenant.name!r} has a quota of {gpus(tenant.quota_gpus)}; a guaranteed job of "
                f"{gpus(n * milli / 1000)} could never start (submit it as opportunistic to run on spare GPUs)",
            )
        if not os.path.isdir(request.cwd):
            raise InvalidRequest(f"working directory {request.cwd!r} does not exist on the server")
        for key, value in request.env.items():
            if not key or "=" in key or "\0" in key or not isinstance(value, str) or "\0" in value:
                raise InvalidRequest(f"environment variable {key!r}: names and values must be plain strings")
            if key in contract.ALL_ENV:
                raise InvalidRequest(f"environment variable {key!r} is set by corral (see corral.core.contract)")
        if request.name is not None and len(request.name) > 200:
            raise InvalidRequest("name is longer than 200 characters")

    def cancel(self, job_id: str) -> JobRecord:
        record = self.job(job_id)
        if record.phase.is_terminal:
            raise JobEnded(f"job {job_id} already ended ({record.phase.value})")
        done = threading.Event()
        self._inbox.put(_Item("cancel", job_id, done=done))
        done.wait(timeout=5)
        return self.job(job_id)

    def job(self, job_id: str) -> JobRecord:
        record = self.store.get(job_id)
        if record is None:
            raise NoSuchJob(f"no job {job_id!r}")
        return self._with_telemetry(record)

    def jobs(
        self,
        *,
        tenant: str | None = None,
        phases: Iterable[JobPhase] | None = None,
        limit: int | None = None,
        after: str | None = None,
        newest_first: bool = False,
    ) -> list[JobRecord]:
        """Jobs in submission order (or newest first), filtered; a page of ``limit`` after the job ``after``
        (see :meth:`Store.jobs`)."""
        records = self.store.jobs(tenant=tenant, phases=phases, limit=limit, after=after, newest_first=newest_first)
        return [self._with_telemetry(r) for r in records]

    def events(self, job_id: str) -> list[JobEvent]:
        self.job(job_id)
        return self.store.events(job_id)

    def events_after(self, after: int, limit: int, tenant: str | None = None) -> list[tuple[int, JobEvent]]:
        """Every job's events after position ``after`` (see :meth:`Store.events_after`), committed ones only."""
        return self.store.events_after(after, limit, tenant=tenant)

    def log_path(self, job_id: str) -> Path:
        return self.agent.log_path(job_id)

    def read_log(self, job_id: str, offset: int, size: int) -> tuple[bytes, int]:
        """Up to ``size`` bytes of the job's log from ``offset`` and the log's size, read by the agent of the node
        that holds it (through Ray on another machine)."""
        return self.agent.read_log(job_id, offset, size)

    def waiting_reasons(self) -> dict[str, str]:
        """Why each pending job waits, as the last round that examined it said (a copy; any thread)."""
        with self._telemetry_lock:
            return dict(self._waiting)

    def _with_telemetry(self, record: JobRecord) -> JobRecord:
        """The stored record with what is kept in memory only: its latest telemetry, why it waits and when it is
        expected to start."""
        pending = record.phase is JobPhase.PENDING
        with self._telemetry_lock:
            tel = self._telemetry.get(record.job_id)
            why = self._waiting.get(record.job_id) if pending else None
        estimate = self.estimator.estimate(record.job_id) if pending else None
        if tel is None and why is None and estimate is None:
            return record
        return JobRecord(record.seq, record.request, record.status, record.process, tel, why, estimate)

    def request_of(self, job_id: str) -> JobRequest | None:
        """The request a job was submitted with (loop thread)."""
        return self._requests.get(job_id)

    def seconds_left(self, job_id: str, now: float) -> float | None:
        """How long a running job of ``corral.job`` with ``total_steps`` still runs, from its last step report:
        the steps it had left at its step time, less the time since (loop thread). ``None`` if it never said."""
        said = self._progress.get(job_id)
        proc = self._proc.get(job_id)
        if said is None or proc is None or said[0] != proc.run:
            return None  # an earlier run's word: its progress since the checkpoint is not known
        _, steps_left, step_s, at = said
        return max(0.0, steps_left * step_s - max(0.0, now - at))

    def call(self, fn: Callable[[], T], timeout_s: float = 10.0) -> T:
        """Run ``fn`` on the loop thread (where the engine's state may be read) and return its result."""
        if self._thread is None or threading.current_thread() is self._thread:
            return fn()
        item = _Item("call", fn, done=threading.Event())
        self._inbox.put(item)
        if not item.done or not item.done.wait(timeout_s):
            raise CorralError("the controller did not answer in time")
        if item.error is not None:
            raise item.error
        result: T = item.result
        return result

    def wait_idle(self, timeout_s: float = 10.0) -> bool:
        """(Tests.) Wait until no engine event is due and no job is starting or stopping."""
        import time

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:

            def idle() -> bool:
                q = self.engine.queue
                due = bool(q) and q.peek_time() <= self.clock.now()
                busy = any(p.phase in (ProcessPhase.STARTING, ProcessPhase.STOPPING) for p in self._proc.values())
                return not due and not busy and self._inbox.empty()

            if self.call(idle):
                return True
            time.sleep(0.02)
        return False

    def cluster(self) -> ClusterSnapshot:
        return self.call(self._cluster_snapshot)

    def tenants(self) -> list[TenantSnapshot]:
        return self.call(self._tenant_snapshot)

    def _cluster_snapshot(self) -> ClusterSnapshot:
        topo, state = self.topology, self.state
        per_gpu: list[list[GpuJob]] = [[] for _ in range(topo.num_gpus)]
        running_by: dict[str, int] = {}
        pending_by: dict[str, int] = {}
        for job in state.running():
            p = job.placement
            assert p is not None
            running_by[job.spec.tenant] = running_by.get(job.spec.tenant, 0) + 1
            for g in p.gpus:
                per_gpu[g].append(GpuJob(job.spec.job_id, job.spec.tenant, p.gpu_milli, p.opportunistic))
        for _shape, entries in state.pending_groups():  # unordered: cheaper than the merged queue order
            for entry in entries:
                tenant = entry[2].spec.tenant
                pending_by[tenant] = pending_by.get(tenant, 0) + 1
        gpus = self.agent.gpus
        by_index = {g.index: g for g in gpus}
        out = []
        for g in range(topo.num_gpus):
            info = by_index[self.gpu_order[g]]
            measured = state.gpu_sm_used(g)
            out.append(
                GpuSnapshot(
                    index=info.index,
                    node=topo.node_names[topo.gpu_node[g]],
                    type_name=info.type_name,
                    mem_mib=info.mem_mib,
                    stand_in=info.stand_in,
                    allocated_milli=FULL_GPU_MILLI - state.gpu_free_milli(g),
                    jobs=tuple(per_gpu[g]),
                    sm_util=measured / FULL_GPU_MILLI if per_gpu[g] else None,
                    mem_used_mib=state.gpu_mem_used_mib(g) if per_gpu[g] else None,
                )
            )
        return ClusterSnapshot(
            policy=self.policy.describe(),
            gpus=tuple(out),
            allocated_gpus=state.allocated_milli / FULL_GPU_MILLI,
            num_gpus=topo.num_gpus,
            pending=state.num_pending,
            running=state.num_running,
            pending_by_tenant=pending_by,
            running_by_tenant=running_by,
            nodes=tuple(
                NodeSnapshot(name, "alive" if state.node_up(i) else "lost", topo.node_num_gpus[i])
                for i, name in enumerate(topo.node_names)
            ),
        )

    def _tenant_snapshot(self) -> list[TenantSnapshot]:
        counts: dict[str, list[float]] = {t: [0.0, 0.0, 0, 0] for t in self._tenants}
        for job in self.state.running():
            c = counts.setdefault(job.spec.tenant, [0.0, 0.0, 0, 0])
            p = job.placement
            assert p is not None
            share = p.num_gpus * p.gpu_milli / FULL_GPU_MILLI
            if p.opportunistic:
                c[1] += share
            elif job.job_class is JobClass.GUARANTEED:
                c[0] += share
            c[2] += 1
        for _shape, entries in self.state.pending_groups():  # unordered: cheaper than the merged queue order
            for entry in entries:
                counts.setdefault(entry[2].spec.tenant, [0.0, 0.0, 0, 0])[3] += 1
        return [
            TenantSnapshot(
                name=name,
                quota_gpus=self._tenants[name].quota_gpus if name in self._tenants else None,
                guaranteed_gpus=c[0],
                opportunistic_gpus=c[1],
                running=int(c[2]),
                pending=int(c[3]),
            )
            for name, c in counts.items()
        ]


# -- small helpers ------------------------------------------------------------------------------------------------
def _requeued(status: JobStatus, now: float) -> JobStatus:
    """A running job whose process is gone, as the pending job it becomes (its time held counted up to now)."""
    last = status.last_start_s if status.last_start_s is not None else now
    status.executed_s += max(0.0, now - last)
    status.work_done_s += max(0.0, now - last)
    status.phase = JobPhase.PENDING
    status.placement = None
    status.suspended_from = None
    status.preemptions += 1
    status.queued_since_s = now
    status.telemetry = None
    status.observed_rate = None
    return status


def _describe(request: JobRequest) -> str:
    kind = "opportunistic" if request.opportunistic else "guaranteed"
    share = f"{request.num_gpus} GPU(s)" if request.gpu_milli == FULL_GPU_MILLI else f"{request.gpu_milli} milli-GPU"
    return f"{kind}, {share}, tenant {request.tenant}"


def _failed(report: ProcessExited, *, asked: bool = False) -> bool:
    """Did the run fail, as the contract says (:mod:`corral.core.contract`, "Exit codes"): an exit code other than
    finished (0) and preempted (75), whether or not it was asked to stop, or death by a signal the agent did not
    send (one after the agent asked it to stop is the agent's own SIGTERM or SIGKILL). ``asked``: the controller
    had asked this run to stop (its process was stopping, which the store keeps across a restart); a SIGTERM or
    SIGKILL is then that stop even when the agent that reports the exit is not the one that sent it (the
    controller was killed and restarted in between, and the new agent adopted the run: found by the chaos test)."""
    if report.exit_code is not None:
        return report.exit_code not in (contract.EXIT_FINISHED, contract.EXIT_PREEMPTED)
    if report.signal is None or report.requested is not None:
        return False
    return not (asked and report.signal in (signal.SIGTERM, signal.SIGKILL))


def _exit_words(report: ProcessExited) -> str:
    if report.exit_code is not None:
        words = f"exited with code {report.exit_code}"
    elif report.signal is not None:
        try:
            name = signal.Signals(report.signal).name
        except ValueError:
            name = f"signal {report.signal}"
        words = f"killed by {name}"
    else:
        words = "process gone without an exit record"
    if report.requested:
        words += f" (asked to stop: {report.requested})"
    if report.detail and report.exit_code is None and report.signal is None:
        words += f": {report.detail}"
    return words


def _telemetry(report: contract.StepReport, now: float, measured: JobMeasured | None = None) -> Telemetry:
    """A job's step report, with what NVML measured of its processes, as the engine's telemetry (what AntMan's
    local coordinator reads, OSDI'20 §3.3).

    SM use: NVML's per-process figure on real GPUs; else (stand-in GPUs, or no NVML sample yet) the busy
    fraction of the job's steps, which a duty cycle lowers as NVML's figure would. Memory: the larger of the
    allocator's peak the job reports and what NVML sees the job's processes hold (their CUDA contexts too,
    which the allocator does not count). Need: what the job measured with no degradation, when it knows."""
    step = report.step_time_s if report.step_time_s > 0 and math.isfinite(report.step_time_s) else 1e-9
    busy = min(1.0, max(0.0, report.busy_s / step)) if math.isfinite(report.busy_s) else 0.0
    mem = max(0, int(report.mem_peak_mib))
    sm = busy
    if measured is not None:
        if measured.mem_used_mib is not None:
            mem = max(mem, measured.mem_used_mib)
        if measured.sm_util is not None:
            sm = min(1.0, max(0.0, measured.sm_util))
    need = mem if report.mem_need_mib is None else max(mem, int(report.mem_need_mib))
    return Telemetry(
        time_s=now,
        step_time_s=step,
        solo_step_time_s=None,
        mem_peak_mib=mem,
        mem_mean_mib=mem,
        mem_need_mib=need,
        sm_util=sm,
    )
