"""Several nodes' agents as the controller's one agent, and a gang's ranks as one run.

The controller speaks to one :class:`~corral.live.controller.AgentLike`: it launches, stops, pauses and resizes a
job's *run* and hears back when the run started and exited. On one machine that is the node's
:class:`~corral.live.agent.Agent` itself. Across machines it is a :class:`Nodes`: the GPUs of every node in one
numbering (node by node, in node order), each request routed to the agents of the nodes the run holds GPUs on,
and the reports of those agents folded back into the run's:

- a job whose GPUs are on one node runs as today, on that node's agent;
- a job whose GPUs span nodes runs as a *gang*, one process per node, each given the gang environment
  (:func:`corral.core.contract.gang_env`: ``MASTER_ADDR``, ``MASTER_PORT``, ``WORLD_SIZE``, ``NNODES``, ``NODE_RANK``,
  ...; ranks in node order, so by node id). Every directive goes to every rank; the ranks agree among themselves
  on the step where they obey it (corral.job). The run has *started* once every rank has, and has *exited* once
  every rank has; a rank that fails or vanishes takes the others down (a gang with a rank missing would only
  hang in its next collective), and the run's exit is the first failure's, else a preemption's, else a finish.
  Rank 0 speaks for the gang: its hello, step reports, checkpoints and NVML figures are the run's.
- A node whose agent is lost (its machine or its Ray actor died) ends its ranks as gone, which ends their runs;
  the controller hears :class:`NodeDown` and turns it into the engine's ``NodeLost``. A node that comes back is
  :meth:`Nodes.rejoin`-ed with a new agent and the controller hears :class:`NodeUp`.

Each node's agent is reached through a :class:`NodeAgent`: an in-process :class:`~corral.live.agent.Agent`
(:class:`~corral.live.transport.inprocess.LocalNode`, for several agents on one machine) or a Ray actor
(``corral.live.transport.ray``): the same requests and reports, carried by either.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

from corral.core import contract
from corral.core.errors import ConfigError
from corral.live.agent import (
    AgentReport,
    JobMeasured,
    JobReported,
    JobSaid,
    LaunchRequest,
    ProcessExited,
    ProcessStarted,
)
from corral.live.agent.gpus import GpuInfo

log = logging.getLogger("corral.live.nodes")


# -- what the controller hears besides a run's reports ------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class NodeDown:
    """A node's agent is gone (its machine, its Ray node or its actor died): its GPUs leave the cluster."""

    node: str
    reason: str


@dataclass(frozen=True, slots=True)
class NodeUp:
    """A node that was down has an agent again: its GPUs join the cluster."""

    node: str


NodeReport = AgentReport | NodeDown | NodeUp


class NodeAgent(Protocol):
    """One node's agent as :class:`Nodes` reaches it. ``gpus`` are the node's, numbered from 0; ``address`` is
    where the node's processes can be reached by the other ranks of a gang (``MASTER_ADDR``)."""

    @property
    def name(self) -> str: ...
    @property
    def address(self) -> str: ...
    @property
    def gpus(self) -> tuple[GpuInfo, ...]: ...
    def start(self, on_report: Callable[[AgentReport], None], on_lost: Callable[[str], None]) -> None: ...
    def close(self) -> None: ...
    def launch(self, req: LaunchRequest) -> None: ...
    def preempt(self, job_id: str, run: int, *, seq: int | None = None) -> None: ...
    def cancel(self, job_id: str, run: int) -> None: ...
    def pause(self, job_id: str, run: int, *, evict: bool = False, seq: int | None = None) -> None: ...
    def resume(self, job_id: str, run: int, *, seq: int | None = None) -> None: ...
    def send(self, job_id: str, run: int, message: contract.SetBatchSize | contract.SetLimits) -> bool: ...
    def adopt(self, job_id: str, run: int) -> bool: ...
    def free_ports(self, count: int) -> list[int]: ...
    def log_path(self, job_id: str) -> Path: ...
    def read_log(self, job_id: str, offset: int, size: int) -> tuple[bytes, int]: ...


def free_local_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct TCP ports free on this machine now (the OS picks them; held together so they differ)."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@dataclass(slots=True)
class _Run:
    """One run of a job as :class:`Nodes` sees it: the nodes of its ranks (rank order) and what each said."""

    job_id: str
    run: int
    nodes: tuple[int, ...]
    started: dict[int, ProcessStarted] = field(default_factory=dict)
    exited: dict[int, ProcessExited] = field(default_factory=dict)
    broken: bool = False  # a rank failed or vanished: the others are being stopped
    directives: int = 0  # directives sent to the gang so far (their ``seq``)

    @property
    def leader(self) -> int:
        return self.nodes[0]


class Nodes:
    """The agents of several nodes behind the controller's one-agent interface. See the module docstring."""

    def __init__(
        self,
        nodes: Sequence[NodeAgent],
        on_report: Callable[[NodeReport], None] | None = None,
        *,
        absent: Collection[str] = (),
    ) -> None:
        if not nodes:
            raise ConfigError("a cluster needs at least one node with GPUs")
        names = [n.name for n in nodes]
        if len(set(names)) != len(names):
            raise ConfigError(f"two nodes have the same name: {sorted(names)}")
        self._nodes: list[NodeAgent] = list(nodes)
        self._on_report = on_report
        self._lock = threading.RLock()
        self._runs: dict[tuple[str, int], _Run] = {}
        self._leader_of: dict[str, int] = {}  # each job's latest run's rank-0 node (where its log is)
        # Nodes declared to join later, not here yet: down from the start (the controller tells the engine before
        # its first round), and :meth:`rejoin` when they come.
        self._down: set[int] = {i for i, n in enumerate(self._nodes) if n.name in set(absent)}
        gpus: list[GpuInfo] = []
        self._offset: list[int] = []
        self._node_of: list[int] = []
        for i, node in enumerate(self._nodes):
            self._offset.append(len(gpus))
            for g in node.gpus:
                self._node_of.append(i)
                gpus.append(replace(g, index=len(gpus)))
        self._gpus = tuple(gpus)

    # -- the cluster -------------------------------------------------------------------------------------------
    def bind(self, on_report: Callable[[NodeReport], None]) -> None:
        """Where reports go (the controller's inbox); set before :meth:`start`."""
        self._on_report = on_report

    @property
    def gpus(self) -> tuple[GpuInfo, ...]:
        """Every node's GPUs in one numbering, node after node (``index`` is the position in this tuple)."""
        return self._gpus

    @property
    def node_names(self) -> tuple[str, ...]:
        return tuple(n.name for n in self._nodes)

    def node_gpus(self) -> list[tuple[str, tuple[GpuInfo, ...]]]:
        """``(node name, its GPUs in the global numbering)`` for each node, in order (the cluster model's nodes)."""
        return [
            (n.name, self._gpus[self._offset[i] : self._offset[i] + len(n.gpus)]) for i, n in enumerate(self._nodes)
        ]

    def node_of_gpu(self, gpu: int) -> str:
        return self._nodes[self._node_of[gpu]].name

    def down_nodes(self) -> tuple[str, ...]:
        """The nodes down now (lost, or declared and not come yet)."""
        with self._lock:
            return tuple(self._nodes[i].name for i in sorted(self._down))

    def is_down(self, node: str) -> bool:
        return self.node_names.index(node) in self._down

    def start(self) -> None:
        for i, node in enumerate(self._nodes):
            node.start(self._reporter(i), self._loser(i))

    def close(self) -> None:
        for node in self._nodes:
            try:
                node.close()
            except Exception:
                log.exception("closing node %s", node.name)

    def _reporter(self, i: int) -> Callable[[AgentReport], None]:
        return lambda report: self._from_node(i, report)

    def _loser(self, i: int) -> Callable[[str], None]:
        return lambda reason: self.lose(i, reason)

    # -- requests (the controller's thread) ----------------------------------------------------------------------
    def launch(self, req: LaunchRequest) -> None:
        by_node: dict[int, list[int]] = {}
        for g in req.gpus:
            by_node.setdefault(self._node_of[g], []).append(g - self._offset[self._node_of[g]])
        order = tuple(sorted(by_node))  # ranks by node order (node id order)
        run = _Run(req.job_id, req.run, order)
        with self._lock:
            self._runs[(req.job_id, req.run)] = run
            self._leader_of[req.job_id] = order[0]
        down = [self._nodes[i].name for i in order if i in self._down]
        if down:
            self._fail_run(run, f"node {', '.join(down)} is down")
            return
        if len(order) == 1:
            (i,) = order
            self._nodes[i].launch(replace(req, gpus=tuple(by_node[i])))
            return
        leader = self._nodes[order[0]]
        master_port, gang_port = leader.free_ports(2)
        addresses = [self._nodes[i].address for i in order]
        total = len(req.gpus)
        for rank, i in enumerate(order):
            env = dict(req.env)
            env.update(contract.gang_env(addresses, rank, len(by_node[i]), master_port, gang_port))
            # A gang placed unevenly (2 GPUs here, 1 there) still has one world: all its GPUs.
            env[contract.ENV_WORLD_SIZE] = str(total)
            self._nodes[i].launch(replace(req, gpus=tuple(by_node[i]), env=env))

    def _each(self, job_id: str, run_no: int, what: Callable[[NodeAgent], object]) -> None:
        with self._lock:
            run = self._runs.get((job_id, run_no))
            nodes = run.nodes if run is not None else ()
        for i in nodes:
            if i not in self._down and (run is None or i not in run.exited):
                try:
                    what(self._nodes[i])
                except Exception:
                    log.exception("node %s: request for job %s run %d failed", self._nodes[i].name, job_id, run_no)

    def _seq(self, job_id: str, run: int) -> int | None:
        """The number of a directive to a gang: the same on every rank's copy, so that the ranks know it for one
        (``contract``, "Gangs across nodes"); ``None`` for a one-node run."""
        with self._lock:
            record = self._runs.get((job_id, run))
            if record is None or len(record.nodes) == 1:
                return None
            record.directives += 1
            return record.directives

    def preempt(self, job_id: str, run: int) -> None:
        seq = self._seq(job_id, run)
        self._each(job_id, run, lambda n: n.preempt(job_id, run, seq=seq))

    def cancel(self, job_id: str, run: int) -> None:
        self._each(job_id, run, lambda n: n.cancel(job_id, run))

    def pause(self, job_id: str, run: int, *, evict: bool = False) -> None:
        seq = self._seq(job_id, run)
        self._each(job_id, run, lambda n: n.pause(job_id, run, evict=evict, seq=seq))

    def resume(self, job_id: str, run: int) -> None:
        seq = self._seq(job_id, run)
        self._each(job_id, run, lambda n: n.resume(job_id, run, seq=seq))

    def send(self, job_id: str, run: int, message: contract.SetBatchSize | contract.SetLimits) -> bool:
        seq = self._seq(job_id, run)
        if seq is not None:
            message = replace(message, seq=seq)
        sent: list[bool] = []
        self._each(job_id, run, lambda n: sent.append(n.send(job_id, run, message)))
        return bool(sent) and all(sent)

    def adopt(self, job_id: str, run: int, gpus: Sequence[int] | None = None) -> bool:
        """Take back a run after a controller restart: the agent of each node of the run (the nodes of ``gpus``,
        the GPUs it was placed on; else every node) adopts its rank. A gang with a rank missing cannot go on (its
        ranks would wait for the lost one forever): its other ranks are stopped and the run is reported not
        adopted, so the controller requeues the job from its checkpoint."""
        if gpus is not None:
            expected = sorted({self._node_of[g] for g in gpus if 0 <= g < len(self._node_of)})
        else:
            expected = list(range(len(self._nodes)))
        with self._lock:  # reports of the adopted ranks wait until the run is known
            held = []
            for i in expected:
                if i in self._down:
                    continue
                try:
                    if self._nodes[i].adopt(job_id, run):
                        held.append(i)
                except Exception:
                    log.exception("node %s: cannot adopt job %s run %d", self._nodes[i].name, job_id, run)
            if gpus is None:
                expected = held
            if not held:
                return False
            if held == expected:
                self._runs[(job_id, run)] = _Run(job_id, run, tuple(expected))
                self._leader_of[job_id] = expected[0]
                return True
        for i in held:  # a broken gang: stop what is left of it
            self._nodes[i].cancel(job_id, run)
        return False

    def log_path(self, job_id: str) -> Path:
        """The log of the job's latest run's rank 0 (each rank logs on its own node)."""
        return self._nodes[self._leader_of.get(job_id, 0)].log_path(job_id)

    def read_log(self, job_id: str, offset: int, size: int) -> tuple[bytes, int]:
        """A chunk of the log of the job's latest run's rank 0, read by that node's agent."""
        return self._nodes[self._leader_of.get(job_id, 0)].read_log(job_id, offset, size)

    # -- node loss -----------------------------------------------------------------------------------------------
    def lose(self, i: int, reason: str) -> None:
        """Node ``i``'s agent is gone: its ranks end as vanished (ending their runs), and the controller hears
        :class:`NodeDown`. Idempotent."""
        with self._lock:
            if i in self._down:
                return
            self._down.add(i)
            hit = [r for r in self._runs.values() if i in r.nodes and i not in r.exited]
        name = self._nodes[i].name
        log.warning("node %s lost: %s", name, reason)
        self._emit(NodeDown(name, reason))
        for run in hit:
            self._from_node(i, ProcessExited(run.job_id, run.run, None, None, None, f"node {name} lost: {reason}"))

    def rejoin(self, name: str, node: NodeAgent) -> None:
        """A node that was down has an agent again (the same GPUs, by count and type)."""
        i = self.node_names.index(name)
        old = self._nodes[i]
        if i not in self._down:
            raise ConfigError(f"node {name} is not down")
        if [(g.type_name, g.mem_mib) for g in node.gpus] != [(g.type_name, g.mem_mib) for g in old.gpus]:
            raise ConfigError(f"node {name} came back with other GPUs than it had; restart corral to use them")
        self._nodes[i] = node
        node.start(self._reporter(i), self._loser(i))
        with self._lock:
            self._down.discard(i)
        self._emit(NodeUp(name))

    # -- reports (agents' threads) -------------------------------------------------------------------------------
    def _emit(self, report: NodeReport) -> None:
        if self._on_report is not None:
            self._on_report(report)

    def _from_node(self, i: int, report: AgentReport) -> None:
        with self._lock:
            run = self._runs.get((report.job_id, report.run))
        if run is None or len(run.nodes) == 1:
            if isinstance(report, ProcessExited):
                with self._lock:
                    self._runs.pop((report.job_id, report.run), None)
            self._emit(report)
            return
        if isinstance(report, ProcessStarted):
            with self._lock:
                run.started[i] = report
                ready = len(run.started) == len(run.nodes) and not run.exited
            if ready:
                self._emit(run.started[run.leader])
        elif isinstance(report, ProcessExited):
            self._rank_exited(run, i, report)
        elif isinstance(report, JobReported | JobSaid | JobMeasured) and i == run.leader:
            self._emit(report)  # rank 0 speaks for the gang

    def _rank_exited(self, run: _Run, i: int, report: ProcessExited) -> None:
        with self._lock:
            if i in run.exited:
                return
            run.exited[i] = report
            finished = report.exit_code == contract.EXIT_FINISHED
            stop_others = not finished and not run.broken and report.requested is None
            if stop_others:
                run.broken = True
            done = len(run.exited) == len(run.nodes)
            if done:
                self._runs.pop((run.job_id, run.run), None)
        if stop_others:  # a failed or vanished rank: the others would hang in their next collective
            self._each(run.job_id, run.run, lambda n: n.cancel(run.job_id, run.run))
        if done:
            self._emit(_gang_exit(run, [self._nodes[k].name for k in run.nodes]))

    def _fail_run(self, run: _Run, detail: str) -> None:
        with self._lock:
            self._runs.pop((run.job_id, run.run), None)
        self._emit(ProcessExited(run.job_id, run.run, None, None, None, f"cannot start the job: {detail}"))


def _gang_exit(run: _Run, names: Sequence[str]) -> ProcessExited:
    """The exit of a gang's run from its ranks' exits (``run.exited`` is in the order they came): the first
    failure's (a code other than finished or preempted, or a death), else a preemption's, else a finish."""
    rank_of = {node: rank for rank, node in enumerate(run.nodes)}
    exits = list(run.exited.items())

    def failed(e: ProcessExited) -> bool:
        return e.exit_code not in (contract.EXIT_FINISHED, contract.EXIT_PREEMPTED)

    node, e = next(
        (x for x in exits if failed(x[1])),
        next((x for x in exits if x[1].exit_code == contract.EXIT_PREEMPTED), exits[0]),
    )
    rank = rank_of[node]
    detail = f"rank {rank} on node {names[rank]}" + (f": {e.detail}" if e.detail else "")
    return ProcessExited(run.job_id, run.run, e.exit_code, e.signal, exits[0][1].requested, detail)
