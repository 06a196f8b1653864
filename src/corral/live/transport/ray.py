"""corral's node agents on a Ray cluster: Ray supplies the processes, the nodes, their liveness and the calls;
corral decides which GPUs a job gets.

One agent per GPU node is a named, detached Ray actor (:class:`AgentActor`, named ``corral-agent-<node>`` in the
``corral`` namespace) pinned to its node by hard node affinity, which reserves all of that node's GPUs so that Ray
places nothing else on them. Inside it runs the node's ordinary :class:`~corral.live.agent.Agent`: the shim, a
process group per run, the Unix-socket channel with ``corral.job``, logs and NVML sampling, exactly as on one
machine. Job processes are never placed by Ray (no placement groups, no Ray GPU ids): the agent sets
``CUDA_VISIBLE_DEVICES`` for each run from the GPUs corral chose.

The controller side (:class:`RayNode`, one per agent actor, and :class:`RayCluster`, which finds the nodes and
watches them) carries the requests of :class:`~corral.live.nodes.NodeAgent` as actor calls and brings the
agent's reports back by a long-poll call per agent (:meth:`AgentActor.poll`), all outstanding polls gathered with
``ray.wait`` on one thread. A call that fails because the actor died, or Ray reporting the node not alive, is the
node lost (:meth:`corral.live.nodes.Nodes.lose`); a node that is alive again (the same ``corral.node`` label, or
the same Ray node) gets its agent back and rejoins.

After a ``kill -9`` of the controller the agent actors live on (they are detached): the next controller finds them
by name and reattaches their runs. A second controller on the same cluster is refused while the first one's
lease (a small named actor it renews every second) is fresh.

Ray is an optional dependency (``pip install 'corral[ray]'``): this module imports it only when called.
"""

from __future__ import annotations

import logging
import os
import platform
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from corral.core import contract
from corral.core.errors import ConfigError
from corral.live.agent import AgentReport, LaunchRequest
from corral.live.agent.gpus import GpuInfo

log = logging.getLogger("corral.live.transport.ray")

NAMESPACE = "corral"
AGENT_PREFIX = "corral-agent-"
LEASE_NAME = "corral-controller"
NODE_LABEL = "corral.node"  # a Ray node label naming the node for corral (racks: "corral.rack")
RACK_LABEL = "corral.rack"
POLL_S = 1.0  # how long one long-poll call waits for reports
WATCH_S = 1.0  # how often the nodes' liveness is checked
LEASE_S = 5.0  # a controller lease older than this may be taken over
CALL_TIMEOUT_S = 30.0


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ConfigError("corral serve --ray needs Ray: pip install 'corral[ray]'") from None
    return ray


# -- the actor's side ---------------------------------------------------------------------------------------------
class AgentActor:
    """The body of one node's agent actor (made a Ray actor class by :func:`agent_actor_class`)."""

    def __init__(
        self,
        node: str,
        state_dir: str,
        stand_in_gpus: int,
        stand_in_mem_mib: int,
        report_s: float,
        checkpoint_dir: str | None,
        warm: bool = False,
    ) -> None:
        from corral.live.agent import Agent
        from corral.live.agent.gpus import discover_gpus

        try:
            gpus = discover_gpus(None)  # NVML is the truth for the GPUs a node has
        except ConfigError:
            gpus = discover_gpus(stand_in_gpus, stand_in_mem_mib=stand_in_mem_mib)
        self._node = node
        self._cond = threading.Condition()
        self._reports: list[AgentReport] = []
        self._agent = Agent(
            Path(state_dir),
            gpus,
            self._collect,
            report_interval_s=report_s,
            checkpoint_root=Path(checkpoint_dir) if checkpoint_dir else None,
            warm=warm,  # its zygote runs beside it on its node, with the node's Python
        )
        self._agent.start()

    def _collect(self, report: AgentReport) -> None:
        with self._cond:
            self._reports.append(report)
            self._cond.notify_all()

    def info(self) -> dict[str, Any]:
        ray = _ray()
        return {
            "node": self._node,
            "node_id": ray.get_runtime_context().get_node_id(),
            "address": ray.util.get_node_ip_address(),
            "hostname": socket.gethostname(),
            "gpus": self._agent.gpus,
            "python": platform.python_version(),
            "ray": ray.__version__,
            "pid": os.getpid(),
        }

    def poll(self, timeout_s: float) -> list[AgentReport]:
        """The reports since the last poll, waiting up to ``timeout_s`` for one (a long poll)."""
        with self._cond:
            if not self._reports:
                self._cond.wait(timeout_s)
            out, self._reports = self._reports, []
        return out

    def launch(self, req: LaunchRequest) -> None:
        self._agent.launch(req)

    def preempt(self, job_id: str, run: int, seq: int | None) -> None:
        self._agent.preempt(job_id, run, seq=seq)

    def cancel(self, job_id: str, run: int) -> None:
        self._agent.cancel(job_id, run)

    def pause(self, job_id: str, run: int, evict: bool, seq: int | None) -> None:
        self._agent.pause(job_id, run, evict=evict, seq=seq)

    def resume(self, job_id: str, run: int, seq: int | None) -> None:
        self._agent.resume(job_id, run, seq=seq)

    def send(self, job_id: str, run: int, message: contract.SetBatchSize | contract.SetLimits) -> bool:
        return self._agent.send(job_id, run, message)

    def adopt(self, job_id: str, run: int) -> bool:
        return self._agent.adopt(job_id, run)

    def free_ports(self, count: int) -> list[int]:
        from corral.live.nodes import free_local_ports

        return free_local_ports(count, "0.0.0.0")

    def log_path(self, job_id: str) -> str:
        return str(self._agent.log_path(job_id))

    def read_log(self, job_id: str, offset: int, size: int) -> tuple[bytes, int]:
        return self._agent.read_log(job_id, offset, size)

    def shutdown(self) -> None:
        """Stop the agent (job processes keep running) and end the actor."""
        self._agent.close()
        _ray().actor.exit_actor()


def agent_actor_class() -> Any:
    return _ray().remote(AgentActor)


class Lease:
    """The controller's claim on a Ray cluster (one corral controller per cluster)."""

    def __init__(self) -> None:
        self._holder: dict[str, Any] | None = None
        self._renewed = 0.0

    def claim(self, holder: dict[str, Any], force_after_s: float) -> dict[str, Any] | None:
        """Take the lease for ``holder``; returns the other live holder instead when it is still fresh."""
        now = time.time()
        other = self._holder
        if other is not None and other.get("id") != holder.get("id"):
            fresh = now - self._renewed < force_after_s
            if fresh and not _dead_here(other):
                return other
        self._holder, self._renewed = holder, now
        return None

    def renew(self, holder_id: str) -> bool:
        if self._holder is None or self._holder.get("id") != holder_id:
            return False
        self._renewed = time.time()
        return True

    def release(self, holder_id: str) -> None:
        if self._holder is not None and self._holder.get("id") == holder_id:
            self._holder = None


def _dead_here(holder: dict[str, Any]) -> bool:
    """Whether a lease holder was a process on this machine that is gone (a restart after ``kill -9`` need not wait
    for the lease to go stale)."""
    if holder.get("hostname") != socket.gethostname():
        return False
    try:
        os.kill(int(holder["pid"]), 0)
    except ProcessLookupError:
        return True
    except (OSError, KeyError, ValueError):
        return False
    return False


def _check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Fail at once, naming the address, when nothing listens there (Ray itself would retry for minutes)."""
    hostport = address.split("://", 1)[-1]
    host, _, port_text = hostport.rpartition(":")
    try:
        port = int(port_text)
    except ValueError:
        raise ConfigError(
            f"--ray {address!r}: expected HOST:PORT (the Ray head's GCS address), auto, or local:NxG"
        ) from None
    try:
        with socket.create_connection((host or "127.0.0.1", port), timeout=timeout_s):
            pass
    except OSError as e:
        raise ConfigError(f"cannot reach the Ray cluster at {address!r}: {e.strerror or e}") from None


# -- the controller's side ----------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class RayOptions:
    """How to reach the Ray cluster and what to put on it."""

    address: str  # "auto", an address, or "local:NxG"
    state_dir: str  # each agent's state directory is STATE_DIR/nodes/NODE on its node
    checkpoint_dir: str | None = None  # a directory every node shares (default: STATE_DIR/checkpoints)
    stand_in_mem_mib: int = 16384
    report_interval_s: float = contract.DEFAULT_REPORT_INTERVAL_S
    # Nodes that may join later: (corral.node label, GPU count, GPU type or None for the present nodes' one type)
    expect: tuple[tuple[str, int, str | None], ...] = ()
    warm: bool = False  # each node's agent keeps a zygote for warm starts (corral.live.agent.zygote)


class RayNode:
    """One node's agent actor, as :class:`corral.live.nodes.Nodes` reaches it."""

    def __init__(self, cluster: RayCluster, name: str, node_id: str, actor: Any, info: dict[str, Any]) -> None:
        self._cluster = cluster
        self._name = name
        self.node_id = node_id
        self.actor = actor
        self._address = str(info["address"])
        self._gpus = tuple(info["gpus"])
        self.on_report: Callable[[AgentReport], None] | None = None
        self.on_lost: Callable[[str], None] | None = None
        self.lost = False

    @classmethod
    def absent(cls, cluster: RayCluster, name: str, gpus: tuple[GpuInfo, ...]) -> RayNode:
        """A node declared to join later (``ray_expect``), not alive yet: no actor, lost from the start. When a Ray
        node with its label is alive, :meth:`RayCluster._watch_nodes` starts its agent and it rejoins."""
        node = cls(cluster, name, "", None, {"address": "", "gpus": gpus})
        node.lost = True
        return node

    @property
    def name(self) -> str:
        return self._name

    @property
    def address(self) -> str:
        return self._address

    @property
    def gpus(self) -> tuple[GpuInfo, ...]:
        return self._gpus

    def start(self, on_report: Callable[[AgentReport], None], on_lost: Callable[[str], None]) -> None:
        self.on_report, self.on_lost = on_report, on_lost
        self._cluster.watch(self)

    def close(self) -> None:
        self._cluster.unwatch(self)

    def _call(self, method: str, *args: Any) -> Any:
        """A call whose answer the controller needs now (a dead actor is the node lost)."""
        ray = _ray()
        try:
            return ray.get(getattr(self.actor, method).remote(*args), timeout=CALL_TIMEOUT_S)
        except ray.exceptions.RayActorError as e:
            self._cluster.lost(self, f"its agent died ({type(e).__name__})")
            raise ConfigError(f"node {self._name}: its agent is gone") from None

    def _tell(self, method: str, *args: Any) -> None:
        """A call whose answer is a report that comes later: sent, and watched for failure."""
        self._cluster.track(self, getattr(self.actor, method).remote(*args))

    def launch(self, req: LaunchRequest) -> None:
        self._tell("launch", req)

    def preempt(self, job_id: str, run: int, *, seq: int | None = None) -> None:
        self._tell("preempt", job_id, run, seq)

    def cancel(self, job_id: str, run: int) -> None:
        self._tell("cancel", job_id, run)

    def pause(self, job_id: str, run: int, *, evict: bool = False, seq: int | None = None) -> None:
        self._tell("pause", job_id, run, evict, seq)

    def resume(self, job_id: str, run: int, *, seq: int | None = None) -> None:
        self._tell("resume", job_id, run, seq)

    def send(self, job_id: str, run: int, message: contract.SetBatchSize | contract.SetLimits) -> bool:
        return bool(self._call("send", job_id, run, message))

    def adopt(self, job_id: str, run: int) -> bool:
        return bool(self._call("adopt", job_id, run))

    def free_ports(self, count: int) -> list[int]:
        return list(self._call("free_ports", count))

    def log_path(self, job_id: str) -> Path:
        """Where the job's log is on the node (readable here only where the node shares this file system)."""
        return Path(self._call("log_path", job_id))

    def read_log(self, job_id: str, offset: int, size: int) -> tuple[bytes, int]:
        """A chunk of the job's log, read by the node's agent (logs stay on their node)."""
        data, total = self._call("read_log", job_id, offset, size)
        return bytes(data), int(total)


class RayCluster:
    """The controller's connection to a Ray cluster: finds the GPU nodes, starts or finds their agents, carries
    their reports and watches their liveness. See the module docstring."""

    def __init__(self, options: RayOptions) -> None:
        self.options = options
        self._local: Any = None  # a ray.cluster_utils.Cluster started by us (``local:NxG``)
        self._lock = threading.Lock()
        self._watched: dict[str, RayNode] = {}  # by node name
        self._polls: dict[Any, RayNode] = {}
        self._calls: dict[Any, RayNode] = {}
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._holder_id = f"{socket.gethostname()}:{os.getpid()}:{time.time_ns()}"
        self._lease: Any = None
        self.on_node_back: Callable[[str, RayNode], None] | None = None
        self._refused: set[str] = set()
        self._absent: tuple[str, ...] = ()  # Ray node ids refused as a node's return (other GPUs): not tried again
        self._owns_ray = False

    # -- connecting ------------------------------------------------------------------------------------------
    def connect(self) -> list[RayNode]:
        """Join (or start) the Ray cluster, claim it for this controller, and return an agent for each node with
        GPUs, in node order (by ``corral.node`` label, else by Ray node id)."""
        address = self.options.address
        if address.startswith("local:"):
            # Keep the whole local cluster on the loopback interface (Ray otherwise binds to the machine's
            # address): read by Ray when it is imported, so set before that.
            os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
            self._start_local(address[len("local:") :])
            address = self._local.address
        if address != "auto":
            _check_reachable(address)
        ray = _ray()
        self._owns_ray = not ray.is_initialized()  # else this process joined already (an embedding program)
        try:
            ray.init(
                address=address,
                namespace=NAMESPACE,
                logging_level="ERROR",
                log_to_driver=False,
                ignore_reinit_error=True,
            )
        except (ConnectionError, RuntimeError, ValueError) as e:
            self.close()
            raise ConfigError(f"cannot join the Ray cluster at {address!r}: {e}") from None
        self._claim()
        nodes = []
        for info in self._gpu_nodes():
            nodes.append(self._agent_on(info))
        present = len(nodes)
        try:
            nodes += self._expected(nodes)
        except ConfigError:
            self.close()
            raise
        if not present:
            self.close()
            raise ConfigError(
                "the Ray cluster has no alive node with GPUs (corral places its agents on nodes whose Ray "
                "resources include GPU)"
            )
        self._check_versions([n for n in nodes if n.actor is not None])
        self._thread = threading.Thread(target=self._serve, name="corral-ray", daemon=True)
        self._thread.start()
        return nodes

    @property
    def absent_names(self) -> tuple[str, ...]:
        """The declared nodes not alive when :meth:`connect` looked (lost until they come)."""
        return self._absent

    def _expected(self, present: list[RayNode]) -> list[RayNode]:
        """A stand-in :class:`RayNode` for each declared node that is not alive: its GPUs copied from a present
        GPU of its type, so that the cluster model has them (lost) and the node rejoins when it comes with the
        same GPUs."""
        names = {n.name for n in present}
        by_type: dict[str, GpuInfo] = {}
        for node in present:
            for g in node.gpus:
                by_type.setdefault(g.type_name, g)
        out = []
        for name, count, type_name in self.options.expect:
            if name in names:
                continue  # here already
            if type_name is None:
                if len(by_type) != 1:
                    raise ConfigError(
                        f"expected node {name}: say its GPU type (NAME:GPUS:TYPE); the nodes present have "
                        f"{sorted(by_type) or 'none'}"
                    )
                type_name = next(iter(by_type))
            template = by_type.get(type_name)
            if template is None:
                raise ConfigError(
                    f"expected node {name}: no node present has GPU type {type_name!r} (its memory is unknown); "
                    f"present: {sorted(by_type)}"
                )
            gpus = tuple(replace(template, index=i) for i in range(count))
            out.append(RayNode.absent(self, name, gpus))
            names.add(name)
        self._absent = tuple(n.name for n in out)
        return out

    def _start_local(self, shape: str) -> None:
        try:
            n_text, g_text = shape.lower().split("x")
            n, g = int(n_text), int(g_text)
        except ValueError:
            raise ConfigError(f"--ray local:{shape}: expected local:NxG, e.g. local:3x2") from None
        if not (1 <= n <= 16 and 1 <= g <= 64):
            raise ConfigError(f"--ray local:{shape}: 1..16 nodes of 1..64 GPUs")
        from ray.cluster_utils import Cluster

        cluster = Cluster(
            initialize_head=True,
            head_node_args={"num_cpus": 1, "num_gpus": 0, "node_ip_address": "127.0.0.1"},
        )
        self._local = cluster
        for i in range(n):
            cluster.add_node(num_cpus=1, num_gpus=g, node_ip_address="127.0.0.1", labels={NODE_LABEL: f"node{i}"})

    def _claim(self) -> None:
        ray = _ray()
        lease_cls = ray.remote(Lease)
        lease = lease_cls.options(
            name=LEASE_NAME, namespace=NAMESPACE, lifetime="detached", get_if_exists=True, num_cpus=0
        ).remote()
        holder = {"id": self._holder_id, "hostname": socket.gethostname(), "pid": os.getpid()}
        other = ray.get(lease.claim.remote(holder, LEASE_S), timeout=CALL_TIMEOUT_S)
        if other is not None:
            self.close()
            raise ConfigError(
                f"another corral controller (pid {other.get('pid')} on {other.get('hostname')}) manages this Ray "
                "cluster; one controller per cluster"
            )
        self._lease = lease

    def _gpu_nodes(self) -> list[dict[str, Any]]:
        ray = _ray()
        out = []
        for n in ray.nodes():
            if not n.get("Alive") or not n.get("Resources", {}).get("GPU"):
                continue
            labels = n.get("Labels") or {}
            name = labels.get(NODE_LABEL) or f"node-{n['NodeID'][:12]}"
            out.append({"name": name, "node_id": n["NodeID"], "gpus": int(n["Resources"]["GPU"])})
        return sorted(out, key=lambda x: (x["name"], x["node_id"]))

    def _agent_on(self, info: dict[str, Any]) -> RayNode:
        """The agent actor of a node: found by name if it lives (a restarted controller), else started there."""
        ray = _ray()
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        name = info["name"]
        state_dir = str(Path(self.options.state_dir) / "nodes" / name)
        actor = (
            agent_actor_class()
            .options(
                name=AGENT_PREFIX + name,
                namespace=NAMESPACE,
                lifetime="detached",
                get_if_exists=True,
                num_cpus=0,
                num_gpus=info["gpus"],  # the whole node's GPUs: Ray places nothing else on them
                max_concurrency=64,  # the long poll and the requests run side by side
                scheduling_strategy=NodeAffinitySchedulingStrategy(info["node_id"], soft=False),
            )
            .remote(
                name,
                state_dir,
                info["gpus"],
                self.options.stand_in_mem_mib,
                self.options.report_interval_s,
                self.options.checkpoint_dir or str(Path(self.options.state_dir) / "checkpoints"),
                self.options.warm,
            )
        )
        try:
            actor_info = ray.get(actor.info.remote(), timeout=120)
        except ray.exceptions.RayActorError as e:
            raise ConfigError(f"node {name}: the corral agent could not start there: {e}") from None
        if actor_info["node_id"] != info["node_id"]:  # a live agent of the same name on an older Ray node
            ray.kill(actor)
            return self._agent_on(info)
        return RayNode(self, name, info["node_id"], actor, actor_info)

    def _check_versions(self, nodes: list[RayNode]) -> None:
        """Every node runs the controller's Python (major.minor: the agents unpickle its requests) and Ray."""
        ray = _ray()
        mine = (platform.python_version().rsplit(".", 1)[0], ray.__version__)
        for node in nodes:
            info = ray.get(node.actor.info.remote(), timeout=CALL_TIMEOUT_S)
            theirs = (str(info["python"]).rsplit(".", 1)[0], str(info["ray"]))
            if theirs != mine:
                self.close()
                raise ConfigError(
                    f"node {node.name} runs Python {theirs[0]} and Ray {theirs[1]}; this controller runs Python "
                    f"{mine[0]} and Ray {mine[1]}: every node needs the same Python (major.minor) and Ray"
                )

    # -- watching ------------------------------------------------------------------------------------------------
    def watch(self, node: RayNode) -> None:
        with self._lock:
            self._watched[node.name] = node
            if node.actor is None:  # declared, not here yet: watched for its arrival
                node.lost = True
                return
            node.lost = False
            self._polls[node.actor.poll.remote(POLL_S)] = node

    def unwatch(self, node: RayNode) -> None:
        with self._lock:
            if self._watched.get(node.name) is node:
                del self._watched[node.name]

    def track(self, node: RayNode, ref: Any) -> None:
        with self._lock:
            self._calls[ref] = node

    def lost(self, node: RayNode, reason: str) -> None:
        with self._lock:
            if node.lost or self._stop.is_set() or self._watched.get(node.name) is not node:
                return  # already known, or no longer watched (closing)
            node.lost = True
            self._polls = {r: n for r, n in self._polls.items() if n is not node}
        if node.on_lost is not None:
            node.on_lost(reason)

    def _serve(self) -> None:
        ray = _ray()
        next_watch = 0.0
        while not self._stop.is_set():
            with self._lock:
                refs = list(self._polls) + list(self._calls)
            if refs:
                # Wake on the first answer (a report to pass on now), then take every other one already in.
                ready, rest = ray.wait(refs, num_returns=1, timeout=0.2, fetch_local=True)
                if ready and rest:
                    more, _ = ray.wait(rest, num_returns=len(rest), timeout=0, fetch_local=True)
                    ready += more
            else:
                ready = []
                self._stop.wait(0.2)
            for ref in ready:
                self._answer(ref)
            if time.monotonic() >= next_watch:
                next_watch = time.monotonic() + WATCH_S
                self._watch_nodes()

    def _answer(self, ref: Any) -> None:
        ray = _ray()
        with self._lock:
            node = self._polls.pop(ref, None)
            polled = node is not None
            if node is None:
                node = self._calls.pop(ref, None)
        if node is None or node.lost:
            return
        try:
            result = ray.get(ref)
        except ray.exceptions.RayActorError as e:
            self.lost(node, f"its agent died ({type(e).__name__})")
            return
        except Exception:
            log.exception("node %s: a call failed", node.name)
            result = None
        if polled:
            for report in result or ():
                if node.on_report is not None:
                    node.on_report(report)
            with self._lock:
                if self._watched.get(node.name) is node and not node.lost:
                    self._polls[node.actor.poll.remote(POLL_S)] = node

    def _watch_nodes(self) -> None:
        """Ray's word on which nodes are alive: a watched node that is not is lost; a lost one alive again (or a
        new Ray node with its name) gets an agent and comes back."""
        try:
            alive = {n["name"]: n for n in self._gpu_nodes()}
        except Exception:
            log.exception("cannot list the Ray cluster's nodes")
            return
        with self._lock:
            watched = dict(self._watched)
        for name, node in watched.items():
            info = alive.get(name)
            if not node.lost and (info is None or info["node_id"] != node.node_id):
                self.lost(node, "Ray reports the node not alive")
        for name, node in watched.items():
            info = alive.get(name)
            if node.lost and info is not None and self.on_node_back is not None:
                if info["node_id"] in self._refused:
                    continue
                try:
                    back = self._agent_on(info)
                except Exception:
                    log.exception("node %s is back but its agent could not start", name)
                    continue
                try:
                    self.on_node_back(name, back)
                except ConfigError as e:  # other GPUs than the cluster model has for it: said once, not used
                    log.error("node %s is alive but not used: %s", name, e)
                    self._refused.add(info["node_id"])
        if self._lease is not None:
            self._lease.renew.remote(self._holder_id)

    def close(self, *, stop_agents: bool = False) -> None:
        """Stop watching; with ``stop_agents`` (or a local cluster of ours) stop the agents too. Job processes
        on an external cluster keep running: the next controller reattaches them."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        ray = sys.modules.get("ray")
        if ray is None:
            return
        if self._lease is not None:
            try:
                ray.get(self._lease.release.remote(self._holder_id), timeout=5)
            except Exception:
                log.debug("lease release failed", exc_info=True)
            self._lease = None
        if self._owns_ray and ray.is_initialized():
            ray.shutdown()
        if self._local is not None:
            self._local.shutdown()
            self._local = None
