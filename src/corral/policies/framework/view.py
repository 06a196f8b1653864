"""The read-only view of the cluster that policies decide from: the seam between policies and the engine.

The engine's ``ClusterState`` implements this interface; policies only ever see it through this type, so mypy
stops a policy from writing to the state. The view exposes the engine's indexes (nodes bucketed by free GPU
count, fractional GPUs sorted by free share, the pending queue in policy order) so that a policy can answer
"where does this job fit?" without scanning every GPU or every job: a full Philly replay makes hundreds of
thousands of such queries.

Contract (see :mod:`corral.policies.framework.contract`): the view does not change during a ``schedule`` call, and
what it returns must not be mutated.

Nodes can be down (lost; see :mod:`corral.engine.state`). Every count and index here is over the nodes that are
up: a down node is in no bucket, its GPUs count in no free total and read as having no free share or memory.
``topology`` and ``max_node_gpus`` describe the whole cluster, up or down; ``node_up``, ``down_nodes`` and
``up_gpus`` say what is up now. A policy that keeps structures of its own about nodes hears of each change through
``on_nodes_changed`` (:mod:`corral.policies.framework.contract`).

An interface that ``ClusterState`` names as its base (a mypyc ``trait``: in plain Python, a base class with
abstract methods), not a ``Protocol`` it matches by shape: in the compiled core (``setup.py``) a policy's call
through a Protocol is a generic Python call (a method looked up by name, its arguments boxed), and through a
trait a direct call into the engine's compiled state. A replay makes hundreds of thousands of these calls: full
Philly under FIFO 3.6% faster, under AntMan 8.5% (issue 20). mypy checks a policy against it as before.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Collection, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

from mypy_extensions import trait

from corral.core.cluster import Topology
from corral.core.job import JobView
from corral.core.tenant import Tenant


class PendingShape(NamedTuple):
    """What decides whether a pending job fits, besides the cluster: jobs of one shape fit or fail alike.

    ``size`` is the number of GPUs for whole-GPU jobs and the share (milli-GPU) for fractional ones; a job of
    a larger size with the same other fields cannot fit where a smaller one failed. ``quota_tenant`` is the
    tenant for guaranteed jobs of tenants with a quota (their fit also depends on that tenant's usage), else
    ``None``.
    """

    whole: bool
    gpu_types: tuple[str, ...]
    gpu_mem_mib: int | None
    size: int
    quota_tenant: str | None


# A pending queue entry: (policy queue key, arrival sequence number, job). Entries sort in queue order.
PendingEntry = tuple[tuple[Any, ...], int, JobView]


@trait
class ClusterView:
    @property
    @abstractmethod
    def topology(self) -> Topology: ...

    @property
    @abstractmethod
    def tenants(self) -> Mapping[str, Tenant]: ...

    @abstractmethod
    def job(self, job_id: str) -> JobView: ...

    @abstractmethod
    def pending(self) -> Iterator[JobView]:
        """Pending jobs in the policy's queue order (``Policy.queue_key``, then submission order)."""
        ...

    @property
    @abstractmethod
    def num_pending(self) -> int: ...

    @abstractmethod
    def pending_groups(self) -> Iterator[tuple[PendingShape, Sequence[PendingEntry]]]:
        """The pending queue split by :class:`PendingShape`, each group in queue order. Lets a round skip every
        job of a shape that cannot fit without looking at them one by one (see ``policies.framework.queues``)."""
        ...

    @abstractmethod
    def running(self) -> Iterator[JobView]:
        """Running jobs in the order they were launched."""
        ...

    @property
    @abstractmethod
    def num_running(self) -> int: ...

    # --- nodes up and down ---------------------------------------------------------------------------------
    @abstractmethod
    def node_up(self, node: int) -> bool:
        """Is ``node`` up (not lost)?"""
        ...

    @abstractmethod
    def down_nodes(self) -> Collection[int]:
        """The nodes that are down now, in the order they went down."""
        ...

    @abstractmethod
    def up_gpus(self, gpu_type: int) -> int:
        """GPUs of ``gpu_type`` on nodes that are up: the type's capacity now (``topology.type_num_gpus`` counts
        every node)."""
        ...

    # --- whole GPUs (share 1000 free), per GPU type index -------------------------------------------------
    @abstractmethod
    def free_gpus(self, gpu_type: int) -> int:
        """Number of entirely free GPUs of this type (on nodes that are up)."""
        ...

    @abstractmethod
    def node_free(self, node: int) -> int:
        """Number of entirely free GPUs on ``node``."""
        ...

    @abstractmethod
    def node_free_gpus(self, node: int) -> Collection[int]:
        """The entirely free GPUs on ``node``."""
        ...

    @abstractmethod
    def nodes_with_free(self, gpu_type: int, count: int) -> Collection[int]:
        """Nodes of ``gpu_type`` with exactly ``count`` entirely free GPUs (deterministic order)."""
        ...

    @abstractmethod
    def nodes_with_any_free(self, gpu_type: int) -> Sequence[int]:
        """Nodes of ``gpu_type`` with at least one entirely free GPU, by node index."""
        ...

    @abstractmethod
    def max_node_gpus(self, gpu_type: int) -> int:
        """The most GPUs any node of ``gpu_type`` has, up or down (0 when the type has no nodes)."""
        ...

    # --- shares and memory ---------------------------------------------------------------------------------
    @abstractmethod
    def gpu_free_milli(self, gpu: int) -> int: ...

    @abstractmethod
    def gpu_free_mem_mib(self, gpu: int) -> int: ...

    @abstractmethod
    def partial_gpus(self, gpu_type: int) -> Sequence[tuple[int, int]]:
        """``(free_milli, gpu)`` for GPUs of ``gpu_type`` that are partly taken, sorted ascending."""
        ...

    @abstractmethod
    def gpu_jobs(self, gpu: int) -> Collection[str]:
        """Jobs holding a share of ``gpu``."""
        ...

    # --- tenants -------------------------------------------------------------------------------------------
    @abstractmethod
    def tenant_guaranteed_milli(self, tenant: str) -> int:
        """Milli-GPUs held by ``tenant``'s guaranteed jobs (what its quota bounds)."""
        ...

    # --- the opportunistic layer and measured use (see corral.core.placement, corral.core.telemetry) -----------
    @abstractmethod
    def gpu_opportunistic_jobs(self, gpu: int) -> Collection[str]:
        """Jobs running opportunistically on ``gpu`` (they allocate none of it)."""
        ...

    @abstractmethod
    def gpu_opportunistic_milli(self, gpu: int) -> int:
        """The sum of the opportunistic jobs' compute-share caps on ``gpu``."""
        ...

    @abstractmethod
    def gpu_sm_used(self, gpu: int) -> int:
        """Measured SM use of ``gpu`` in milli (sum over its jobs' latest telemetry; 0 without any)."""
        ...

    @abstractmethod
    def gpu_mem_used_mib(self, gpu: int) -> int:
        """Measured peak GPU memory in use on ``gpu`` (sum over its jobs' latest telemetry)."""
        ...

    @abstractmethod
    def gpus_by_sm_used(self, gpu_type: int) -> Sequence[tuple[int, int]]:
        """``(sm_used_milli, gpu)`` for every GPU of ``gpu_type``, least used first."""
        ...
