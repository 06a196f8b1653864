"""Placing a waiting job by preempting running ones: the planning step SRTF and Tiresias share.

A policy names the running jobs it would preempt, most expendable first, as a :class:`Victims` for the round;
:meth:`Victims.place` frees them one by one in the planner until the job fits, then keeps running every
candidate whose GPUs the placement does not use. Nothing is preempted unless the job fits: a failed attempt
leaves the planner as it found it. :func:`place_by_preempting` does the same for one job and a list of ids.

A round can place thousands of jobs this way (Tiresias, when a burst of new jobs in the top queue meets a
cluster held by demoted ones), each walking the candidates from the most expendable. :class:`Victims` keeps
that walk short: a victim taken by one job leaves the sequence instead of being stepped over by every later
walk, what each walk asks of a candidate (its job, GPU types, whether a put-back restores it exactly) is worked
out once per round, and a candidate passed over once (on GPU types the job cannot use) is not passed over again
when that would change nothing more.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from corral.core.job import FULL_GPU_MILLI, JobClass, JobSpec, JobView, mem_given
from corral.core.placement import Placement
from corral.policies.framework.contract import allowed_types
from corral.policies.framework.placement import PlacementStrategy, place
from corral.policies.framework.planner import Planner
from corral.policies.framework.view import ClusterView


class _Victim:
    """One candidate, and what the walks ask of it, worked out once for the round (the view does not change)."""

    __slots__ = ("job", "pass_types", "rank", "settled")

    def __init__(self, view: ClusterView, rank: Any, job_id: str) -> None:
        self.rank = rank
        job = self.job = view.job(job_id)
        held = job.placement
        # The GPU types it holds when a put-back restores exactly what releasing it frees (else None): a job that
        # may use none of those types passes it over instead of releasing it (see Victims.place).
        self.pass_types: frozenset[int] | None = None
        if held is not None and _restored_as_taken(job.spec, held):
            gpu_type = view.topology.gpu_type
            self.pass_types = frozenset(gpu_type[g] for g in held.gpus)
        self.settled = False  # passed over already, so that passing it over again changes nothing


class Victims:
    """The running jobs a round may preempt, most expendable first: ``source`` yields ``(rank, job_id)`` with
    ranks never increasing, and each :meth:`place` walks those ranked above its bound.

    The source is read only as far as the walks go; a job taken as a victim leaves the sequence."""

    __slots__ = ("_order", "_source", "_types", "_view")

    def __init__(self, view: ClusterView, source: Iterator[tuple[Any, str]]) -> None:
        self._view = view
        self._source: Iterator[tuple[Any, str]] | None = source
        self._order: list[_Victim] = []  # read from the source so far, not taken, in order
        # (GPU types asked for, memory) -> the type indices a job may use, and as a set (a round asks thousands)
        self._types: dict[tuple[tuple[str, ...], int | None], tuple[tuple[int, ...], frozenset[int]]] = {}

    def _more(self) -> bool:
        """Read one more candidate from the source (False when it has none left)."""
        if self._source is None:
            return False
        got = next(self._source, None)
        if got is None:
            self._source = None
            return False
        self._order.append(_Victim(self._view, got[0], got[1]))
        return True

    def first_rank(self) -> Any | None:
        """The rank of the most expendable candidate not taken yet (None when none is left)."""
        if not self._order and not self._more():
            return None
        return self._order[0].rank

    def place(
        self, planner: Planner, spec: JobSpec, strategy: PlacementStrategy, above: Any
    ) -> tuple[Placement, list[JobView]] | None:
        """Free the candidates ranked above ``above``, in order, until ``spec`` fits.

        Returns the placement and the jobs that must be preempted for it (they leave the candidates), or ``None``
        when even every candidate together is not enough."""
        view = self._view
        kind = (spec.gpu_types, spec.gpu_mem_mib)
        got = self._types.get(kind)
        if got is None:
            types = allowed_types(view, spec)
            got = self._types[kind] = (types, frozenset(types))
        types, allowed = got
        whole, need = spec.gpu_milli == 1000, spec.num_gpus
        # A victim on GPU types the job may not use frees nothing it could take (placements look at its types
        # only) and is always put back: it is passed over, and only marked as a release and a take back would mark
        # it (Planner.pass_over). As a release would, the first candidate lets the job try to fit even when it is
        # passed over; after that, passing over changes nothing a try looks at, so it would only repeat the last.
        every_type = len(types) == len(view.topology.type_names)
        # Under a quota, the tenant's own guaranteed jobs free quota wherever they run: never passed over.
        quota = view.tenants.get(spec.tenant)
        quota_tenant = (
            spec.tenant
            if spec.job_class is JobClass.GUARANTEED and quota is not None and quota.quota_gpus is not None
            else None
        )
        passed: list[JobView] = []
        passed_victims: list[_Victim] = []
        released: list[tuple[int, _Victim]] = []  # (position in the order, victim)
        placement = None
        tried = False
        order = self._order
        i = 0
        while True:
            if i == len(order) and not self._more():
                break
            victim = order[i]
            if not victim.rank > above:
                break
            pass_types = victim.pass_types
            if (
                not every_type
                and pass_types is not None
                and pass_types.isdisjoint(allowed)
                and not (
                    quota_tenant is not None
                    and victim.job.spec.tenant == quota_tenant
                    and victim.job.job_class is JobClass.GUARANTEED
                )
            ):
                if not victim.settled:
                    passed.append(victim.job)
                    passed_victims.append(victim)
                i += 1
                if tried:
                    continue
            else:
                planner.release(victim.job)
                released.append((i, victim))
                i += 1
            tried = True
            # Within its tenant's quota too: freeing the tenant's own jobs frees quota (Tiresias and SRTF preempt
            # a lower-priority job of the same tenant for a job its quota holds back, as without quotas).
            if quota_tenant is not None and not planner.quota_allows(spec):
                continue
            # A whole-GPU job fits as soon as enough GPUs of one type are free: only then try to place it.
            if whole:
                for t in types:
                    if planner.type_free(t) >= need:
                        break
                else:
                    continue
            placement = place(planner, spec, strategy, types)
            if placement is not None:
                break
        if passed:
            planner.pass_over(passed)
            for victim in passed_victims:
                victim.settled = planner.passed_over(victim.job)
        if placement is None:
            for _, victim in released:  # put back what was tentatively freed
                planner.take_back(victim.job)
            return None
        used = set(placement.gpus)
        spare = [(at, victim) for at, victim in released if used.isdisjoint(_held(victim).gpus)]
        # Victims whose GPUs the job does not use are put back (freed for nothing: they keep running), in order;
        # but where the job needed the quota they held, the least expendable of them are put back while the
        # quota allows and the others are preempted for the quota.
        keep = {id(victim) for victim in _keepable(planner, spec, [victim for _, victim in spare])}
        needed: list[JobView] = []
        gone: list[int] = []
        for at, victim in released:
            if id(victim) in keep:
                planner.take_back(victim.job)
                continue
            gone.append(at)
            needed.append(victim.job)
        for at in reversed(gone):  # from the end, so that the earlier positions stay put
            del order[at]
        return placement, needed


def place_on_free(view: ClusterView, planner: Planner, spec: JobSpec, strategy: PlacementStrategy) -> Placement | None:
    """Where ``spec`` fits on what the planner has free (its tenant's quota allowing), or ``None``: for a victim
    that can move to GPUs the round left idle instead of waiting for the next round."""
    if not planner.quota_allows(spec):
        return None
    types = allowed_types(view, spec)
    if spec.gpu_milli == FULL_GPU_MILLI and not any(planner.type_free(t) >= spec.num_gpus for t in types):
        return None
    return place(planner, spec, strategy, types)


def place_by_preempting(
    view: ClusterView,
    planner: Planner,
    spec: JobSpec,
    strategy: PlacementStrategy,
    candidates: Iterable[str],
    taken: set[str],
) -> tuple[Placement, list[JobView]] | None:
    """Free ``candidates`` (running job ids, in order; those in ``taken`` are skipped) until ``spec`` fits: one
    :meth:`Victims.place` (a round that places many jobs keeps one :class:`Victims` instead).

    Returns the placement and the jobs that must be preempted for it (their ids are added to ``taken``), or
    ``None`` when even every candidate together is not enough."""
    victims = Victims(view, ((1, job_id) for job_id in candidates if job_id not in taken))
    found = victims.place(planner, spec, strategy, 0)
    if found is not None:
        taken.update(job.spec.job_id for job in found[1])
    return found


def _held(victim: _Victim) -> Placement:
    held = victim.job.placement
    assert held is not None
    return held


def _keepable(planner: Planner, spec: JobSpec, spare: list[_Victim]) -> list[_Victim]:
    """Of the victims whose GPUs ``spec``'s placement does not use (in order, most expendable first), those that
    can go on running: all of them, unless putting back those of ``spec``'s tenant (guaranteed jobs, under a
    quota) would take the tenant over its quota again; then of those, the least expendable that fit."""
    tenant = planner.view.tenants.get(spec.tenant)
    if spec.job_class is not JobClass.GUARANTEED or tenant is None or tenant.quota_gpus is None:
        return spare
    own = [v for v in spare if v.job.spec.tenant == spec.tenant and v.job.job_class is JobClass.GUARANTEED]
    room = tenant.quota_gpus * FULL_GPU_MILLI - planner.tenant_guaranteed_milli(spec.tenant)
    if sum(v.job.spec.gpu_demand_milli for v in own) <= room:
        return spare
    owned = {id(v) for v in own}
    kept: set[int] = set()
    for v in reversed(own):
        if v.job.spec.gpu_demand_milli <= room:
            room -= v.job.spec.gpu_demand_milli
            kept.add(id(v))
    return [v for v in spare if id(v) in kept or id(v) not in owned]


def _restored_as_taken(spec: JobSpec, placement: Placement) -> bool:
    """Does taking ``placement``'s GPUs back for ``spec`` (``Planner.take``, as a put-back does) give exactly what
    releasing it freed? (Not for an opportunistic or packed placement, or a memory reservation of its own.)"""
    return (
        not placement.opportunistic
        and placement.gpu_milli == spec.gpu_milli
        and mem_given(spec, placement) == (spec.gpu_mem_mib or 0)
    )
