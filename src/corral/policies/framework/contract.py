"""The policy contract and the default hooks.

A policy is an object with one required method, ``schedule(view, now_s) -> Decision``, and optional hooks with
neutral defaults, in the spirit of the Kubernetes scheduling framework:

- ``queue_key(job)``: the order of the pending queue (the engine keeps the queue sorted by it; it is evaluated
  when a job enters the queue, on submission or after a preemption);
- ``admit(view, spec)``: ``None`` if the job could ever run here, else the reason it never can;
- ``on_job_changed(job, before, now_s)``: told after every change the engine made to a job (submission, launch,
  preemption, resize, upgrade, batch size, finish), with ``before`` the placement the job held just before it
  (``None`` when it held none: a submission or a launch), so a policy that keeps its own indexes (SRTF's running
  jobs by remaining time, Tiresias' attained service, the GPUs each job ran on) reads where the job was from the
  change itself instead of keeping a shadow copy of every placement;
- ``on_timer(view, now_s)``: called when a wake-up the policy asked for (``Decision.wake_at_s``) comes due, before
  that instant's round. It returns the pending jobs whose ``queue_key`` it changed (Tiresias' promotion of a
  starving job), and the engine files them again under their new key; the default changes nothing;
- ``on_job_restored(view, job, now_s)``: told, instead of ``on_job_changed``, of each job the live controller takes
  back after a restart (:meth:`corral.engine.loop.Engine.restore`), in its phase then (running, or pending:
  queued, suspended or preempted). A policy that keeps its own state about jobs rebuilds it here from the job
  and the view, since it has seen none of the job's history; the default treats it as a change;
- ``on_nodes_changed(view, nodes, now_s)``: told after nodes went down (lost) or came back up (joined), with the
  nodes whose state changed (read ``view.node_up(n)`` for each), before that instant's round. The jobs that ran
  on a lost node were requeued just before, each told through ``on_job_changed`` as after any preemption; the
  view already shows the change (a down node's GPUs are in no free index and read as full). A policy that keeps
  structures of its own about nodes, cells or GPUs (HiveD's cells, AntMan's open GPUs, memos of what could not be
  placed) brings them up to date here; the default does nothing, which is right for a policy that reads capacity
  from the view each round;
- ``on_telemetry(job, now_s)``: told after a running job's telemetry was recorded (``job.telemetry``), for
  policies that act on measurements (AntMan's local coordinator); it may be called while a decision is being
  applied (the simulator reports the new speeds of the jobs an action affects), so it only takes note: the
  policy acts in its next ``schedule`` call.

Contract:

1. The view is read-only. A policy reads it and returns actions; the engine applies them.
2. Calls never overlap.
3. Same view, same time, same seed: same decision. Randomness only from ``self.rng`` (seeded by the run).
4. "Cannot place now" is an answer (leave the job pending); an exception is a bug.
5. Down nodes: nothing may be placed on a GPU of a down node (the engine refuses it). ``admit`` judges a job against
   the whole cluster, up or down (``topology``): a job that only lost nodes could hold stays pending until they
   are back, it is not rejected, since the node may come back (and one that never returns leaves it unfinished).

Each policy has a frozen config dataclass (a :class:`PolicyConfig`) whose fields carry ``help`` metadata (made
with :func:`corral.core.options.option`); the CLI builds its options and its ``corral policies`` listing from them
(:mod:`corral.core.options`).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Collection, Sequence
from typing import Any, ClassVar

from mypy_extensions import mypyc_attr

from corral.core.decisions import Decision
from corral.core.job import FULL_GPU_MILLI, JobClass, JobSpec, JobView
from corral.core.placement import Placement
from corral.core.wording import gpus
from corral.policies.framework.view import ClusterView


@mypyc_attr(allow_interpreted_subclasses=True)  # the configs of users' own policies (Python: setup.py)
@dataclasses.dataclass(frozen=True, slots=True)
class PolicyConfig:
    """Base of every policy's options. Subclasses add fields made with :func:`corral.core.options.option`."""

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled as a call of its constructor (the live controller's forecasts send a config to another process):
        # the compiled core's frozen dataclasses (setup.py) cannot be unpickled field by field.
        return (type(self), tuple(getattr(self, f.name) for f in dataclasses.fields(self)))


@mypyc_attr(allow_interpreted_subclasses=True)  # users' own policies and tests' (Python: setup.py)
class BasePolicy:
    """Neutral defaults for every hook. Subclasses set ``name``, ``summary`` and ``Config``."""

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    Config: ClassVar[type[PolicyConfig]] = PolicyConfig
    # Does the policy read jobs' models (Tiresias' placement sensitivity, Gandiva's packing)? A replay then draws
    # a model for each job that has none (see ``corral.sim.traces.assign_models``).
    needs_models: ClassVar[bool] = False
    # Does the policy read telemetry (``JobView.telemetry``)? The simulator then models and reports it.
    needs_telemetry: ClassVar[bool] = False
    # Does the policy need every job's duration (an oracle: SJF, SRTF)? It rejects a job without one, so it cannot
    # run live jobs, which have none; ``corral serve`` refuses it at start-up.
    needs_durations: ClassVar[bool] = False

    def __init__(self, config: PolicyConfig | None = None, *, seed: int = 0) -> None:
        self.config = config if config is not None else self.Config()
        self.seed = seed
        self.rng = random.Random(seed)

    # -- hooks ------------------------------------------------------------------------------------------------
    def queue_key(self, job: JobView) -> tuple[Any, ...]:
        return (job.spec.submit_s,)

    def admit(self, view: ClusterView, spec: JobSpec) -> str | None:
        return capacity_reason(view, spec)

    def schedule(self, view: ClusterView, now_s: float) -> Decision:
        raise NotImplementedError

    def on_job_changed(self, job: JobView, before: Placement | None, now_s: float) -> None:
        return None

    def on_job_restored(self, view: ClusterView, job: JobView, now_s: float) -> None:
        self.on_job_changed(job, None, now_s)

    def on_timer(self, view: ClusterView, now_s: float) -> Collection[str]:
        return ()

    def on_nodes_changed(self, view: ClusterView, nodes: Sequence[int], now_s: float) -> None:
        return None

    def on_telemetry(self, job: JobView, now_s: float) -> None:
        return None

    def describe(self) -> str:
        fields = ", ".join(f"{f.name}={getattr(self.config, f.name)}" for f in dataclasses.fields(self.config))
        return f"{self.name}({fields})" if fields else self.name


def allowed_types(view: ClusterView, spec: JobSpec) -> tuple[int, ...]:
    """GPU type indices a job may run on: its requested types, with enough memory for it."""
    topo = view.topology
    # Most jobs accept every type: answered without calling into the (interpreted) topology, twice per job.
    idx = topo.type_indices(spec.gpu_types) if spec.gpu_types else topo.all_types
    need = spec.gpu_mem_mib
    if need:
        idx = tuple(t for t in idx if topo.type_mem_mib[t] >= need)
    return idx


def capacity_reason(view: ClusterView, spec: JobSpec) -> str | None:
    """Why ``spec`` can never run on this cluster (ignoring what else is running), or ``None``.

    A gang runs on GPUs of one type (a job spread over two GPU models would run at the slower one's pace and is
    not what users ask for), so the test is against the largest single type that the job accepts.
    """
    topo = view.topology
    types_ok = allowed_types(view, spec)
    if not types_ok:
        what = f"GPU types {'|'.join(spec.gpu_types)}" if spec.gpu_types else "GPUs"
        if spec.gpu_mem_mib:
            what += f" with {spec.gpu_mem_mib} MiB"
        return f"needs {what}; the cluster has {', '.join(topo.type_names)}"
    most = max(topo.type_num_gpus[t] for t in types_ok)
    if spec.num_gpus > most:
        kind = f" of type {'|'.join(spec.gpu_types)}" if spec.gpu_types else ""
        return f"needs {gpus(spec.num_gpus)}{kind}; the cluster has at most {most} of one type"
    tenant = view.tenants.get(spec.tenant)
    quota = tenant.quota_gpus if tenant is not None else None
    if spec.job_class is JobClass.GUARANTEED and quota is not None and spec.gpu_demand_milli > quota * FULL_GPU_MILLI:
        asked = gpus(spec.gpu_demand_milli / FULL_GPU_MILLI, "guaranteed GPU")
        return f"needs {asked}; tenant {spec.tenant!r} has a quota of {quota}"
    return None
