"""Builders for tests: clusters, jobs, states, planners and small simulations in one line each.

Defaults are chosen so a test states only what matters to it::

    c = cluster(nodes=2, gpus=4)                         # 2 nodes x 4 GPUs of type "gpu", one rack
    c = cluster(gpus=[4, 2], types=["A", "B"])           # node 0: 4 x A, node 1: 2 x B
    c = cluster(nodes=1, gpus=8, gpus_per_switch=4)      # two PCIe switches of 4
    j = job("a", gpus=2, duration=100, submit=0)
    s = state(c); occupy(s, [0, 1])                      # GPUs 0 and 1 taken by filler jobs
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from corral.core.cluster import Cluster, GpuType, NodeSpec, Topology
from corral.core.decisions import Decision
from corral.core.events import Event
from corral.core.job import JobClass, JobSpec
from corral.core.placement import Placement
from corral.core.telemetry import Telemetry
from corral.core.tenant import Tenant
from corral.engine.state import ClusterState, QueueKey, submission_order
from corral.policies.framework.contract import BasePolicy
from corral.policies.framework.view import ClusterView
from corral.sim.perf import PerfModel
from corral.sim.runner import SimulationResult, simulate
from corral.sim.traces import Trace

DEFAULT_MEM_MIB = 16 * 1024


def cluster(
    nodes: int | None = None,
    gpus: int | Sequence[int] = 4,
    types: Sequence[str] | None = None,
    *,
    gpus_per_switch: int | Sequence[int | None] | None = None,
    racks: Sequence[str] | None = None,
    mem: Mapping[str, int] | None = None,
    speed: Mapping[str, float] | None = None,
    tenants: Mapping[str, int | None] | None = None,
    name: str = "test",
) -> Cluster:
    """A cluster of ``nodes`` nodes. ``gpus``, ``types``, ``gpus_per_switch`` and ``racks`` are one value for
    every node or one value per node; GPU types are defined (16 GiB, speed 1.0 unless ``mem``/``speed`` say
    otherwise) in order of first appearance."""
    counts = [gpus] * (nodes if nodes is not None else 1) if isinstance(gpus, int) else list(gpus)
    n = len(counts)
    if nodes is not None and nodes != n:
        raise ValueError(f"nodes={nodes} but {n} per-node GPU counts")
    type_names = list(types) if types is not None else ["gpu"] * n
    if len(type_names) != n:
        raise ValueError("one GPU type per node")
    switches = list(gpus_per_switch) if isinstance(gpus_per_switch, Sequence) else [gpus_per_switch] * n
    rack_names = list(racks) if racks is not None else ["rack-0"] * n
    mem = mem or {}
    speed = speed or {}
    gpu_types = tuple(GpuType(t, mem.get(t, DEFAULT_MEM_MIB), speed.get(t, 1.0)) for t in dict.fromkeys(type_names))
    node_specs = tuple(
        NodeSpec(f"n{i}", type_names[i], counts[i], rack=rack_names[i], gpus_per_switch=switches[i]) for i in range(n)
    )
    tenant_specs = tuple(Tenant(t, q) for t, q in (tenants or {}).items())
    return Cluster(name, gpu_types, node_specs, tenant_specs)


def job(
    job_id: str,
    gpus: int = 1,
    duration: float | None = 100.0,
    submit: float = 0.0,
    *,
    milli: int = 1000,
    tenant: str = "default",
    types: Iterable[str] = (),
    mem: int | None = None,
    opportunistic: bool = False,
    **extra: Any,
) -> JobSpec:
    return JobSpec(
        job_id=job_id,
        submit_s=float(submit),
        num_gpus=gpus,
        duration_s=None if duration is None else float(duration),
        tenant=tenant,
        gpu_milli=milli,
        job_class=JobClass.OPPORTUNISTIC if opportunistic else JobClass.GUARANTEED,
        gpu_types=tuple(types),
        gpu_mem_mib=mem,
        **extra,
    )


def state(c: Cluster, queue_key: QueueKey = submission_order) -> ClusterState:
    return ClusterState(Topology(c), c.tenants, queue_key=queue_key)


_filler = 0


def occupy(
    s: ClusterState, gpus: Iterable[int] | Mapping[int, int], *, mem: int | None = None, now: float = 0.0
) -> list[str]:
    """Launch one filler job per GPU (opportunistic, so quotas are untouched); returns their ids.

    ``gpus`` is a collection of GPUs to take whole, or a mapping ``gpu -> milli`` to take a share of each."""
    global _filler
    shares = dict(gpus) if isinstance(gpus, Mapping) else dict.fromkeys(gpus, 1000)
    ids = []
    for g, milli in shares.items():
        _filler += 1
        jid = f"filler-{_filler}"
        s.add(job(jid, milli=milli, mem=mem, opportunistic=True), now)
        s.launch(jid, Placement((g,), milli), now)
        ids.append(jid)
    return ids


def run(
    jobs: Sequence[JobSpec],
    c: Cluster,
    policy: BasePolicy,
    *,
    perf: PerfModel | None = None,
) -> SimulationResult:
    """Replay ``jobs`` with the decision log on and every invariant checked after every round."""
    return simulate(Trace(list(jobs), "test"), c, policy, perf=perf, record_decisions=True, check_invariants=True)


def checked(policy: BasePolicy) -> BasePolicy:
    """``policy``, made again (from its config and seed: pass a new one) as an instance of a subclass of its class
    whose ``schedule`` calls the policy's own ``check()`` (its picture, checked from scratch) before every round;
    ``policy`` itself if it has no ``check``. A subclass, not a ``schedule`` set on the instance: a compiled policy
    (setup.py) has no instance dictionary to set it in."""
    if not callable(getattr(policy, "check", None)):
        return policy
    return _checked_class(type(policy))(policy.config, seed=policy.seed)


@cache
def _checked_class(cls: type[BasePolicy]) -> type[BasePolicy]:
    def schedule(self: Any, view: ClusterView, now_s: float) -> Decision:
        self.check()
        return cls.schedule(self, view, now_s)

    return type(f"Checked{cls.__name__}", (cls,), {"schedule": schedule, "__module__": __name__})


def log(result: SimulationResult) -> list[str]:
    assert result.decision_log is not None
    return [entry.render() for entry in result.decision_log]


def spans(result: SimulationResult) -> dict[str, tuple[float | None, float | None]]:
    """``job_id -> (first start, end)``."""
    return {j.job_id: (j.first_start_s, j.end_s) for j in result.jobs}


@dataclass
class EventSink:
    """An executor's sink that keeps the events it schedules and ignores rates and telemetry (executor tests)."""

    events: list[tuple[float, Event]] = field(default_factory=list)

    def schedule(self, time_s: float, event: Event) -> None:
        self.events.append((time_s, event))

    def observe_rate(self, job_id: str, rate: float) -> None:
        pass

    def report(self, job_id: str, telemetry: Telemetry) -> None:
        pass
