"""A scratch overlay on the read-only view, for planning several placements within one scheduling round.

A policy that launches five jobs in one round must not give two of them the same GPU, and a policy that
considers preempting a job must see that job's GPUs as free while it plans. The view cannot change during a
round, so the policy plans on a :class:`Planner`: it reads through to the view and records its own tentative
takes and releases in small dictionaries. Nothing here touches the engine; the policy turns what it planned
into a :class:`~corral.core.decisions.Decision` and the engine applies (and re-checks) it.

The overlay answers the same index queries as the view (nodes by free count, nodes with any free GPU, partly
taken GPUs by free share), merging its few changed entries into the view's indexes, so planning stays cheap
however large the cluster.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator

from corral.core.job import FULL_GPU_MILLI, JobClass, JobSpec, JobView, mem_given
from corral.core.placement import Placement
from corral.policies.view import ClusterView


class Planner:
    __slots__ = ("_gpu_mem", "_gpu_milli", "_node_free", "_tenant", "_type_free", "topo", "view")

    def __init__(self, view: ClusterView) -> None:
        self.view = view
        self.topo = view.topology
        self._gpu_milli: dict[int, int] = {}
        self._gpu_mem: dict[int, int] = {}
        self._node_free: dict[int, int] = {}
        self._type_free: dict[int, int] = {}
        self._tenant: dict[str, int] = {}

    # -- reads ------------------------------------------------------------------------------------------------
    def type_free(self, t: int) -> int:
        got = self._type_free.get(t)
        return self.view.free_gpus(t) if got is None else got

    def total_free(self) -> int:
        return sum(self.type_free(t) for t in range(len(self.topo.type_names)))

    def has_partial(self) -> bool:
        """Is any GPU partly taken (so a fractional request might fit where no GPU is entirely free)?"""
        if any(0 < m < FULL_GPU_MILLI for m in self._gpu_milli.values()):
            return True
        return any(self.view.partial_gpus(t) for t in range(len(self.topo.type_names)))

    def node_free(self, node: int) -> int:
        got = self._node_free.get(node)
        return self.view.node_free(node) if got is None else got

    def gpu_free_milli(self, gpu: int) -> int:
        got = self._gpu_milli.get(gpu)
        return self.view.gpu_free_milli(gpu) if got is None else got

    def gpu_free_mem_mib(self, gpu: int) -> int:
        got = self._gpu_mem.get(gpu)
        return self.view.gpu_free_mem_mib(gpu) if got is None else got

    def node_free_gpus(self, node: int) -> list[int]:
        """Entirely free GPUs on ``node``, ascending."""
        if node not in self._node_free:
            return sorted(self.view.node_free_gpus(node))
        return [g for g in self.topo.node_gpus(node) if self.gpu_free_milli(g) == FULL_GPU_MILLI]

    def nodes_with_free(self, t: int, count: int) -> Iterator[int]:
        """Nodes of type ``t`` with exactly ``count`` entirely free GPUs."""
        changed = self._node_free
        for node in self.view.nodes_with_free(t, count):
            if node not in changed:
                yield node
        if changed:
            node_type = self.topo.node_type
            yield from sorted(n for n, c in changed.items() if c == count and node_type[n] == t)

    def nodes_with_any_free(self, t: int) -> Iterator[int]:
        """Nodes of type ``t`` with at least one entirely free GPU, by node index."""
        changed = self._node_free
        base = (n for n in self.view.nodes_with_any_free(t) if n not in changed)
        if not changed:
            return base
        node_type = self.topo.node_type
        extra = sorted(n for n, c in changed.items() if c > 0 and node_type[n] == t)
        return heapq.merge(base, extra)

    def partial_gpus(self, t: int, at_least: int = 1, descending: bool = False) -> Iterator[tuple[int, int]]:
        """``(free_milli, gpu)`` for partly taken GPUs of type ``t`` with at least ``at_least`` free."""
        changed = self._gpu_milli
        base_seq = self.view.partial_gpus(t)
        base_iter = reversed(base_seq) if descending else iter(base_seq)
        base = (e for e in base_iter if e[1] not in changed and e[0] >= at_least)
        if not changed:
            return base
        gpu_type = self.topo.gpu_type
        extra = sorted(
            ((m, g) for g, m in changed.items() if 0 < m < FULL_GPU_MILLI and m >= at_least and gpu_type[g] == t),
            reverse=descending,
        )
        return heapq.merge(base, extra, reverse=descending)

    def tenant_guaranteed_milli(self, tenant: str) -> int:
        got = self._tenant.get(tenant)
        return self.view.tenant_guaranteed_milli(tenant) if got is None else got

    def quota_allows(self, spec: JobSpec) -> bool:
        """Would launching ``spec`` keep its tenant's guaranteed jobs within quota?"""
        if spec.job_class is not JobClass.GUARANTEED:
            return True
        tenant = self.view.tenants.get(spec.tenant)
        if tenant is None or tenant.quota_gpus is None:
            return True
        used = self.tenant_guaranteed_milli(spec.tenant)
        return used + spec.gpu_demand_milli <= tenant.quota_gpus * FULL_GPU_MILLI

    # -- tentative changes ------------------------------------------------------------------------------------
    def take(self, spec: JobSpec, gpus: list[int], *, mem_mib: int | None = None) -> Placement:
        """Record that ``spec`` takes ``gpus`` at its share (reserving ``mem_mib`` on each, default: the spec's
        figure); returns the placement to launch it with."""
        milli = spec.gpu_milli
        mem = mem_mib if mem_mib is not None else spec.gpu_mem_mib or 0
        for g in gpus:
            self._set(g, self.gpu_free_milli(g) - milli, self.gpu_free_mem_mib(g) - mem)
        if spec.job_class is JobClass.GUARANTEED:
            self._tenant[spec.tenant] = self.tenant_guaranteed_milli(spec.tenant) + spec.gpu_demand_milli
        return Placement(tuple(sorted(gpus)), milli, mem_mib)

    def untake(self, spec: JobSpec, placement: Placement) -> None:
        """Undo a :meth:`take` of ``placement`` (its share, memory and quota use)."""
        mem = mem_given(spec, placement)
        milli = placement.gpu_milli
        for g in placement.gpus:
            self._set(g, self.gpu_free_milli(g) + milli, self.gpu_free_mem_mib(g) + mem)
        if spec.job_class is JobClass.GUARANTEED:
            self._tenant[spec.tenant] = self.tenant_guaranteed_milli(spec.tenant) - placement.num_gpus * milli

    def hide(self, gpu: int) -> int:
        """Plan as if ``gpu`` had no free share (to look for a placement elsewhere); returns what it had, for
        :meth:`unhide`."""
        had = self.gpu_free_milli(gpu)
        self._set(gpu, 0, self.gpu_free_mem_mib(gpu))
        return had

    def unhide(self, gpu: int, milli: int) -> None:
        self._set(gpu, milli, self.gpu_free_mem_mib(gpu))

    def add_memory(self, gpu: int, mib: int) -> None:
        """Plan ``mib`` more free memory on ``gpu`` (negative: less), e.g. an opportunistic job's cap changing."""
        self._gpu_mem[gpu] = self.gpu_free_mem_mib(gpu) + mib

    def release(self, job: JobView) -> None:
        """Plan as if running ``job`` had been preempted (its GPUs back)."""
        placement = job.placement
        if placement is None:
            return
        spec = job.spec
        mem = mem_given(spec, placement)
        if placement.opportunistic:  # held no allocation: only its memory comes back
            for g in placement.gpus:
                self._gpu_mem[g] = self.gpu_free_mem_mib(g) + mem
            return
        for g in placement.gpus:
            self._set(g, self.gpu_free_milli(g) + placement.gpu_milli, self.gpu_free_mem_mib(g) + mem)
        if job.job_class is JobClass.GUARANTEED:
            # What it holds, which is less than it asked for when it runs packed (see ClusterState.launch).
            held = spec.num_gpus * placement.gpu_milli
            self._tenant[spec.tenant] = self.tenant_guaranteed_milli(spec.tenant) - held

    def _set(self, gpu: int, milli: int, mem: int) -> None:
        old = self.gpu_free_milli(gpu)
        self._gpu_milli[gpu] = milli
        self._gpu_mem[gpu] = mem
        if (old == FULL_GPU_MILLI) != (milli == FULL_GPU_MILLI):
            delta = 1 if milli == FULL_GPU_MILLI else -1
            node = self.topo.gpu_node[gpu]
            t = self.topo.gpu_type[gpu]
            self._node_free[node] = self.node_free(node) + delta
            self._type_free[t] = self.type_free(t) + delta
