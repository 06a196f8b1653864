"""Pending queues for policies: walking the engine's queue in order while skipping, wholesale, every job that cannot
fit this round (:class:`PendingWalk`, :class:`StrictBlocks`), and queues a policy keeps by a key of its own
(:class:`KeyedQueue`: per tenant, per class, per virtual cluster).

Whether a job fits depends on its :class:`~corral.policies.framework.view.PendingShape` (size, share, GPU types,
memory, and its tenant when the tenant has a quota), not on which job it is: every placement strategy finds GPUs
whenever enough are free. So once a job fails, every pending job of the same kind and at least its size fails too,
this round. :class:`PendingWalk` merges the engine's per-shape groups (each already in queue order) and drops a
blocked group without visiting its jobs: a round costs O(groups + jobs launched), not O(queue), which is what keeps
a backfilling scheduler fast when thousands of jobs wait.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, ItemsView, Iterable, Iterator, Sequence
from typing import Any, Generic, TypeVar

from corral.core.job import JobView
from corral.core.sorted_groups import Group, add_entry, remove_entry
from corral.policies.framework.view import ClusterView, PendingEntry, PendingShape


class PendingWalk:
    """Iterate ``(shape, job)`` over the pending queue in queue order; :meth:`block` prunes as it goes."""

    __slots__ = ("_blocked_fit", "_blocked_quota", "_heap")

    def __init__(self, view: ClusterView) -> None:
        heap: list[tuple[tuple[Any, ...], int, PendingShape, JobView, Iterator[PendingEntry]]] = []
        for shape, entries in view.pending_groups():
            it = iter(entries)
            key, seq, job = next(it)
            heap.append((key, seq, shape, job, it))
        heapq.heapify(heap)
        self._heap = heap
        self._blocked_fit: dict[tuple[bool, tuple[str, ...], int | None], int] = {}
        self._blocked_quota: dict[str, int] = {}

    def block(self, shape: PendingShape, *, quota: bool = False) -> None:
        """A job of ``shape`` did not fit (or, with ``quota``, its tenant had no room): skip every job that
        cannot fit either."""
        if quota and shape.quota_tenant is not None:
            demand = shape.size * (1 if not shape.whole else 1000)
            old = self._blocked_quota.get(shape.quota_tenant)
            self._blocked_quota[shape.quota_tenant] = demand if old is None else min(old, demand)
            return
        kind = (shape.whole, shape.gpu_types, shape.gpu_mem_mib)
        old_size = self._blocked_fit.get(kind)
        self._blocked_fit[kind] = shape.size if old_size is None else min(old_size, shape.size)

    def _is_blocked(self, shape: PendingShape) -> bool:
        limit = self._blocked_fit.get((shape.whole, shape.gpu_types, shape.gpu_mem_mib))
        if limit is not None and shape.size >= limit:
            return True
        if shape.quota_tenant is not None:
            cap = self._blocked_quota.get(shape.quota_tenant)
            demand = shape.size * (1 if not shape.whole else 1000)
            if cap is not None and demand >= cap:
                return True
        return False

    def __iter__(self) -> Iterator[tuple[PendingShape, JobView]]:
        heap = self._heap
        while heap:
            _key, _seq, shape, job, it = heap[0]
            if self._is_blocked(shape):
                heapq.heappop(heap)  # the whole group goes: none of its jobs can fit this round
                continue
            yield shape, job
            nxt = next(it, None)
            if nxt is None:
                heapq.heappop(heap)
            else:
                heapq.heapreplace(heap, (nxt[0], nxt[1], shape, nxt[2], it))


class StrictBlocks:
    """What a failed *strict* placement rules out for the rest of a round.

    :meth:`PendingWalk.block` assumes that when a job of some size fails, every larger one fails too: true when a
    job may take GPUs on any nodes, not under strict consolidation, where a job waits for the fewest nodes its
    size allows. There a larger job may need more nodes and fit where a smaller one did not (on 2x8 with 7 GPUs
    free on each node, an 8-GPU job must have one whole node and waits; a 9-GPU job takes two and starts). What
    does hold: a job of the same kind needing as many nodes and at least as many GPUs fails too."""

    __slots__ = ("_min_size", "_view")

    def __init__(self, view: ClusterView) -> None:
        self._view = view
        self._min_size: dict[tuple[tuple[str, ...], int | None, int], int] = {}

    def _span(self, shape: PendingShape, types: Sequence[int]) -> int:
        """The fewest nodes a job of ``shape`` can have on nodes of ``types``."""
        node_gpus = max((self._view.max_node_gpus(t) for t in types), default=0)
        return -(-shape.size // node_gpus) if node_gpus else 0

    def blocked(self, shape: PendingShape, types: Sequence[int]) -> bool:
        if not self._min_size:  # nothing blocked yet: the common case, answered without working out the span
            return False
        limit = self._min_size.get((shape.gpu_types, shape.gpu_mem_mib, self._span(shape, types)))
        return limit is not None and shape.size >= limit

    def block(self, shape: PendingShape, types: Sequence[int]) -> None:
        key = (shape.gpu_types, shape.gpu_mem_mib, self._span(shape, types))
        old = self._min_size.get(key)
        self._min_size[key] = shape.size if old is None else min(old, shape.size)


K = TypeVar("K", bound=Hashable)


class KeyedQueue(Generic[K]):
    """Pending jobs filed under a key of the policy's choosing (a tenant, a job class, a virtual cluster, a shape),
    each key's jobs in the order of their entries.

    An entry is a tuple that sorts in the policy's queue order and ends with the job's id (``(submit_s, seq,
    job_id)``); the policy keeps the key and entry a job was filed under, so it adds and removes a job in
    O(log n) without searching. Keys with no job left are dropped, so ``groups`` lists only keys with jobs."""

    __slots__ = ("entry", "groups")

    def __init__(self) -> None:
        self.groups: dict[K, Group] = {}  # key -> entries, sorted (corral.core.sorted_groups)
        self.entry: dict[str, tuple[K, tuple[Any, ...]]] = {}  # job -> (its key, its entry)

    def __len__(self) -> int:
        return len(self.entry)

    def __bool__(self) -> bool:
        return bool(self.entry)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self.entry

    def add(self, key: K, entry: tuple[Any, ...]) -> None:
        """File the job ``entry[-1]`` under ``key`` (it must not be filed already)."""
        job_id = entry[-1]
        if job_id in self.entry:
            raise ValueError(f"job {job_id!r} is queued already (under {self.entry[job_id][0]!r})")
        add_entry(self.groups, key, entry)
        self.entry[job_id] = (key, entry)

    def remove(self, job_id: str) -> K | None:
        """Take ``job_id`` out of its queue; returns the key it was under (``None`` if it was queued nowhere)."""
        got = self.entry.pop(job_id, None)
        if got is None:
            return None
        key, entry = got
        remove_entry(self.groups, key, entry)
        return key

    def key_of(self, job_id: str) -> K | None:
        got = self.entry.get(job_id)
        return None if got is None else got[0]

    def get(self, key: K) -> Sequence[tuple[Any, ...]]:
        """The entries under ``key``, in order (empty if none)."""
        got: Sequence[tuple[Any, ...]] = self.groups.get(key, ())
        return got

    def items(self) -> ItemsView[K, Group]:
        return self.groups.items()

    def merged(self, keys: Iterable[K] | None = None) -> Iterator[tuple[Any, ...]]:
        """The entries under ``keys`` (default: every key) merged into one queue order."""
        groups = self.groups
        chosen = groups.values() if keys is None else [groups[k] for k in keys if k in groups]
        return heapq.merge(*chosen)
