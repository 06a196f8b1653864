"""A scratch overlay on the read-only view, for planning several placements within one scheduling round.

A policy that launches five jobs in one round must not give two of them the same GPU, and a policy that
considers preempting a job must see that job's GPUs as free while it plans. The view cannot change during a
round, so the policy plans on a :class:`Planner`: it reads through to the view and records its own tentative
takes and releases in small dictionaries. Nothing here touches the engine; the policy turns what it planned
into a :class:`~corral.core.decisions.Decision` and the engine applies (and re-checks) it.

The overlay answers the same index queries as the view (nodes by free count, nodes with any free GPU, partly
taken GPUs by free share), merging its changed entries into the view's indexes, so planning stays cheap however
large the cluster. The changed entries are indexed too (sorted per free count, per type), and the view's entries
that the plan has changed are skipped once for the round, not at every query: a round that plans thousands of
launches or preemptions (an idle cluster filled from a long queue) costs about as much per placement as a round
that plans one.
"""

from __future__ import annotations

import heapq
from bisect import insort
from collections.abc import Collection, Iterable, Iterator
from typing import Any, NamedTuple

from mypy_extensions import mypyc_attr

from corral.core.job import FULL_GPU_MILLI, JobClass, JobSpec, JobView, mem_given
from corral.core.placement import Placement
from corral.core.sorted_groups import remove_sorted
from corral.policies.framework.view import ClusterView


class PlannerCheckpoint(NamedTuple):
    """A copy of a :class:`Planner`'s changed entries and their indexes (see :meth:`Planner.checkpoint`)."""

    gpu_milli: dict[int, int]
    gpu_mem: dict[int, int]
    node_free: dict[int, int]
    type_free: dict[int, int]
    tenant: dict[str, int]
    by_count: dict[tuple[int, int], list[int]]
    any_changed: dict[int, list[int]] | None
    partial: dict[int, list[tuple[int, int]]]
    num_partial: int
    base_nodes: dict[tuple[int, int], list[Any]]


_OVERRIDES: dict[type, tuple[bool, bool]] = {}


def _overrides(cls: type[Planner]) -> tuple[bool, bool]:
    """Does planner class ``cls`` override ``nodes_with_free``, and ``_set``?"""
    got = _OVERRIDES.get(cls)
    if got is None:
        got = _OVERRIDES[cls] = (cls.nodes_with_free is not Planner.nodes_with_free, cls._set is not Planner._set)
    return got


@mypyc_attr(allow_interpreted_subclasses=True)  # subclassed by users' own policies (Python: setup.py)
class Planner:
    __slots__ = (
        "_any_changed",
        "_base_nodes",
        "_by_count",
        "_gpu_mem",
        "_gpu_milli",
        "_node_free",
        "_num_partial",
        "_own_nodes",
        "_own_set",
        "_partial",
        "_tenant",
        "_type_free",
        "_view_partial",
        "topo",
        "view",
    )

    def __init__(self, view: ClusterView) -> None:
        self.view = view
        self.topo = view.topology
        self._gpu_milli: dict[int, int] = {}
        self._gpu_mem: dict[int, int] = {}
        self._node_free: dict[int, int] = {}
        self._type_free: dict[int, int] = {}
        self._tenant: dict[str, int] = {}
        # Indexes over the changed entries (only ever added to in a round: a changed node or GPU stays changed).
        self._by_count: dict[tuple[int, int], list[int]] = {}  # (type, free count) -> changed nodes, ascending
        # type -> changed nodes with a free GPU, ascending; built when first asked for (first-fit placements only)
        self._any_changed: dict[int, list[int]] | None = None
        self._partial: dict[int, list[tuple[int, int]]] = {}  # type -> changed partly taken (free, GPU), ascending
        self._num_partial = 0  # changed GPUs partly taken
        # (type, free count) -> [the view's nodes of that bucket, how many of its first ones the plan changed]
        self._base_nodes: dict[tuple[int, int], list[Any]] = {}
        self._view_partial: bool | None = None  # does the view have a partly taken GPU? (asked once a round)
        # Does a subclass list nodes (nodes_with_free) or keep its entries (_set) its own way? Asked once per class,
        # not at every query (two lookups in the class hierarchy each time, issue 20); a policy makes a planner a round.
        self._own_nodes, self._own_set = _overrides(type(self))

    # -- reads ------------------------------------------------------------------------------------------------
    def type_free(self, t: int) -> int:
        got = self._type_free.get(t)
        return self.view.free_gpus(t) if got is None else got

    def total_free(self) -> int:
        # type_free() over the types, inlined: asked once per job a round examines.
        got, view = self._type_free, self.view
        total = 0
        for t in range(len(self.topo.type_names)):
            n = got.get(t)
            total += view.free_gpus(t) if n is None else n
        return total

    def has_partial(self) -> bool:
        """Is any GPU partly taken (so a fractional request might fit where no GPU is entirely free)?"""
        if self._num_partial:
            return True
        if self._view_partial is None:
            self._view_partial = any(self.view.partial_gpus(t) for t in range(len(self.topo.type_names)))
        return self._view_partial

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
        """Nodes of type ``t`` with exactly ``count`` entirely free GPUs: the view's (in its order) that the plan
        left alone, then those the plan changed to ``count``, by node index."""
        changed = self._node_free
        key = (t, count)
        if not changed:
            for node in self.view.nodes_with_free(t, count):
                if node not in changed:  # the caller may plan while it iterates
                    yield node
        else:
            cached = self._base_nodes.get(key)
            if cached is None:
                cached = self._base_nodes[key] = [list(self.view.nodes_with_free(t, count)), 0]
            base: list[int] = cached[0]
            i = cached[1]
            end = len(base)
            while i < end and base[i] in changed:  # a changed node stays changed: skip it for the rest of the round
                i += 1
            cached[1] = i
            while i < end:
                node = base[i]
                if node not in changed:
                    yield node
                i += 1
        extra = self._by_count.get(key)
        if extra:
            yield from list(extra)

    def first_with_free(self, t: int, count: int, skip: Collection[int] = ()) -> int | None:
        """The first node :meth:`nodes_with_free` yields that is not in ``skip`` (``None`` when none is): what a
        placement asks for most, so it is answered without a generator."""
        if self._own_nodes:  # a subclass lists nodes its own way
            return next((node for node in self.nodes_with_free(t, count) if node not in skip), None)
        changed = self._node_free
        key = (t, count)
        if not changed:
            for node in self.view.nodes_with_free(t, count):
                if node not in skip:
                    return node
            return None
        cached = self._base_nodes.get(key)
        if cached is None:
            cached = self._base_nodes[key] = [list(self.view.nodes_with_free(t, count)), 0]
        base: list[int] = cached[0]
        i: int = cached[1]
        end = len(base)
        while i < end and base[i] in changed:  # as in nodes_with_free: skipped for the rest of the round
            i += 1
        cached[1] = i
        while i < end:
            node = base[i]
            if node not in changed and node not in skip:
                return node
            i += 1
        for node in self._by_count.get(key, ()):
            if node not in skip:
                return node
        return None

    def nodes_with_any_free(self, t: int) -> Iterator[int]:
        """Nodes of type ``t`` with at least one entirely free GPU, by node index."""
        changed = self._node_free
        base = (n for n in self.view.nodes_with_any_free(t) if n not in changed)
        if not changed:
            return base
        any_changed = self._any_changed
        if any_changed is None:
            any_changed = self._any_changed = {}
            node_type = self.topo.node_type
            for node in sorted(changed):
                if changed[node] > 0:
                    any_changed.setdefault(node_type[node], []).append(node)
        return heapq.merge(base, list(any_changed.get(t, ())))

    def partial_gpus(self, t: int, at_least: int = 1, descending: bool = False) -> Iterator[tuple[int, int]]:
        """``(free_milli, gpu)`` for partly taken GPUs of type ``t`` with at least ``at_least`` free."""
        changed = self._gpu_milli
        base_seq = self.view.partial_gpus(t)
        base_iter = reversed(base_seq) if descending else iter(base_seq)
        base = (e for e in base_iter if e[1] not in changed and e[0] >= at_least)
        if not changed:
            return base
        extra = [e for e in self._partial.get(t, ()) if e[0] >= at_least]
        if descending:
            extra.reverse()
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

    # -- checkpoints ------------------------------------------------------------------------------------------
    def checkpoint(self) -> PlannerCheckpoint:
        """Everything planned so far, to come back to with :meth:`rollback` (see
        :meth:`corral.policies.framework.round.Round.checkpoint`). A copy of the changed entries and their indexes:
        it costs what the round has changed, not the cluster's size."""
        return PlannerCheckpoint(
            dict(self._gpu_milli),
            dict(self._gpu_mem),
            dict(self._node_free),
            dict(self._type_free),
            dict(self._tenant),
            {key: list(nodes) for key, nodes in self._by_count.items()},
            None if self._any_changed is None else {t: list(nodes) for t, nodes in self._any_changed.items()},
            {t: list(entries) for t, entries in self._partial.items()},
            self._num_partial,
            {key: [cached[0], cached[1]] for key, cached in self._base_nodes.items()},
        )

    def rollback(self, cp: PlannerCheckpoint) -> None:
        """Forget everything planned since ``cp`` was taken: the planner is as it was then, its query order
        included (a node changed since then and changed back is the view's again, not a changed one). ``cp`` may be
        rolled back to again."""
        self._gpu_milli = dict(cp.gpu_milli)
        self._gpu_mem = dict(cp.gpu_mem)
        self._node_free = dict(cp.node_free)
        self._type_free = dict(cp.type_free)
        self._tenant = dict(cp.tenant)
        self._by_count = {key: list(nodes) for key, nodes in cp.by_count.items()}
        self._any_changed = None if cp.any_changed is None else {t: list(n) for t, n in cp.any_changed.items()}
        self._partial = {t: list(entries) for t, entries in cp.partial.items()}
        self._num_partial = cp.num_partial
        # A cached bucket's skipped prefix only grows, and the view does not change within a round: the prefix as it
        # was at the checkpoint is right again (the lists themselves are the view's, shared).
        self._base_nodes = {key: [cached[0], cached[1]] for key, cached in cp.base_nodes.items()}

    # -- tentative changes ------------------------------------------------------------------------------------
    def take(self, spec: JobSpec, gpus: list[int], *, mem_mib: int | None = None) -> Placement:
        """Record that ``spec`` takes ``gpus`` at its share (reserving ``mem_mib`` on each, default: the spec's
        figure); returns the placement to launch it with."""
        self._take(spec, gpus, mem_mib)
        return Placement(tuple(sorted(gpus)), spec.gpu_milli, mem_mib)

    def take_back(self, job: JobView) -> None:
        """Undo a :meth:`release` of running ``job`` (a victim that is not needed after all): record what a
        :meth:`take` of its GPUs for its spec would (exactly what the release freed, unless it runs packed or
        opportunistically or has memory of its own), without building a placement: a round that preempts
        thousands of jobs puts thousands back."""
        placement = job.placement
        assert placement is not None
        self._take(job.spec, placement.gpus, None)

    def _take(self, spec: JobSpec, gpus: Iterable[int], mem_mib: int | None) -> None:
        mem = mem_mib if mem_mib is not None else spec.gpu_mem_mib or 0
        self._shift(gpus, -spec.gpu_milli, -mem)
        if spec.job_class is JobClass.GUARANTEED:
            self._tenant[spec.tenant] = self.tenant_guaranteed_milli(spec.tenant) + spec.gpu_demand_milli

    def untake(self, spec: JobSpec, placement: Placement) -> None:
        """Undo a :meth:`take` of ``placement`` (its share, memory and quota use)."""
        mem = mem_given(spec, placement)
        milli = placement.gpu_milli
        self._shift(placement.gpus, milli, mem)
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
        self._shift(placement.gpus, placement.gpu_milli, mem)
        if job.job_class is JobClass.GUARANTEED:
            # What it holds, which is less than it asked for when it runs packed (see ClusterState.launch).
            held = spec.num_gpus * placement.gpu_milli
            self._tenant[spec.tenant] = self.tenant_guaranteed_milli(spec.tenant) - held

    def pass_over(self, jobs: list[JobView]) -> None:
        """Mark the GPUs of running ``jobs`` as :meth:`release` then a :meth:`take` of the same share and memory
        would (a victim considered and put back, see ``preemption.place_by_preempting``), without freeing
        anything. It matters for the order only: a changed node comes after the view's nodes of its free count
        (see :meth:`nodes_with_free`), and a node is changed once one of its GPUs came entirely free in between."""
        topo = self.topo
        gpu_node = topo.gpu_node
        marked_milli, marked_mem, marked_node = self._gpu_milli, self._gpu_mem, self._node_free
        freed: dict[int, int] = {}
        for job in jobs:
            placement = job.placement
            assert placement is not None
            for g in placement.gpus:
                if g in marked_milli and g in marked_mem and gpu_node[g] in marked_node:
                    continue  # marked already: marking again changes nothing
                freed[g] = freed.get(g, 0) + placement.gpu_milli
        for g, milli in freed.items():
            free = self.gpu_free_milli(g)
            self._set(g, free, self.gpu_free_mem_mib(g))
            node = topo.gpu_node[g]
            if free != FULL_GPU_MILLI and free + milli == FULL_GPU_MILLI and node not in self._node_free:
                t = topo.gpu_type[g]
                count = self._node_free[node] = self.view.node_free(node)
                insort(self._by_count.setdefault((t, count), []), node)
                if count > 0 and self._any_changed is not None:
                    insort(self._any_changed.setdefault(t, []), node)

    def passed_over(self, job: JobView) -> bool:
        """Would :meth:`pass_over` of running ``job`` change nothing, now or later in the round? So when its GPUs and
        their nodes are all marked (a changed entry stays changed for the rest of the round)."""
        placement = job.placement
        assert placement is not None
        gpu_node = self.topo.gpu_node
        marked_milli, marked_mem, marked_node = self._gpu_milli, self._gpu_mem, self._node_free
        return all(g in marked_milli and g in marked_mem and gpu_node[g] in marked_node for g in placement.gpus)

    def _set(self, gpu: int, milli: int, mem: int) -> None:
        delta = self._set_gpu(gpu, milli, mem)
        if delta:
            self._move(self.topo.gpu_node[gpu], self.topo.gpu_type[gpu], delta)

    def _set_gpu(self, gpu: int, milli: int, mem: int) -> int:
        """Plan ``gpu`` with ``milli`` free share and ``mem`` free memory; returns how many more entirely free GPUs
        its node has (-1, 0 or 1), for the caller to re-file the node (:meth:`_move`)."""
        t = self.topo.gpu_type[gpu]
        was = self._gpu_milli.get(gpu)
        old = self.view.gpu_free_milli(gpu) if was is None else was
        if was is not None and 0 < was < FULL_GPU_MILLI:
            remove_sorted(self._partial[t], (was, gpu))
            self._num_partial -= 1
        if 0 < milli < FULL_GPU_MILLI:
            insort(self._partial.setdefault(t, []), (milli, gpu))
            self._num_partial += 1
        self._gpu_milli[gpu] = milli
        self._gpu_mem[gpu] = mem
        if (old == FULL_GPU_MILLI) != (milli == FULL_GPU_MILLI):
            return 1 if milli == FULL_GPU_MILLI else -1
        return 0

    def _shift(self, gpus: Iterable[int], milli: int, mem: int) -> None:
        """Give each of ``gpus`` ``milli`` more free share and ``mem`` more free memory (negative: less).

        Each node is re-filed once, by its GPUs' net change, not once per GPU (issue 20: an 8-GPU gang moved its node
        through eight buckets): the indexes are sorted, so where a node ends up does not depend on the path."""
        if self._own_set:  # a subclass keeps its entries its own way: GPU by GPU, through it
            for g in gpus:
                self._set(g, self.gpu_free_milli(g) + milli, self.gpu_free_mem_mib(g) + mem)
            return
        moved: dict[int, int] = {}
        gpu_node = self.topo.gpu_node
        for g in gpus:
            delta = self._set_gpu(g, self.gpu_free_milli(g) + milli, self.gpu_free_mem_mib(g) + mem)
            if delta:
                node = gpu_node[g]
                moved[node] = moved.get(node, 0) + delta
        node_type = self.topo.node_type
        for node, delta in moved.items():
            if delta:
                self._move(node, node_type[node], delta)

    def _move(self, node: int, t: int, delta: int) -> None:
        """``node`` (of type ``t``) has ``delta`` more entirely free GPUs: re-file it in the free-count indexes."""
        node_free, any_changed = self._node_free, self._any_changed
        before = node_free.get(node)
        if before is None:
            before = self.view.node_free(node)
        else:
            remove_sorted(self._by_count[(t, before)], node)  # by bisection: buckets hold hundreds of nodes
            if before > 0 and any_changed is not None:
                remove_sorted(any_changed[t], node)
        after = node_free[node] = before + delta
        insort(self._by_count.setdefault((t, after), []), node)
        if after > 0 and any_changed is not None:
            insort(any_changed.setdefault(t, []), node)
        self._type_free[t] = self.type_free(t) + delta
