"""Placing a waiting job by preempting running ones: the planning step SRTF and Tiresias share.

A policy names the running jobs it would preempt, most expendable first; :func:`place_by_preempting` frees them
one by one in the planner until the job fits, then keeps running every candidate whose GPUs the placement does
not use. Nothing is preempted unless the job fits: a failed attempt leaves the planner as it found it.
"""

from __future__ import annotations

from collections.abc import Iterable

from corral.core.job import JobSpec, JobView, mem_given
from corral.core.placement import Placement
from corral.policies.base import allowed_types
from corral.policies.placement import PlacementStrategy, place
from corral.policies.planner import Planner
from corral.policies.view import ClusterView


def place_by_preempting(
    view: ClusterView,
    planner: Planner,
    spec: JobSpec,
    strategy: PlacementStrategy,
    candidates: Iterable[str],
    taken: set[str],
) -> tuple[Placement, list[JobView]] | None:
    """Free ``candidates`` (running job ids, in order; those in ``taken`` are skipped) until ``spec`` fits.

    Returns the placement and the jobs that must be preempted for it (their ids are added to ``taken``), or
    ``None`` when even every candidate together is not enough."""
    types = allowed_types(view, spec)
    whole = spec.gpu_milli == 1000
    # A victim on GPU types the job may not use frees nothing it could take (placements look at its types only)
    # and is always put back: it is passed over, and only marked as a release and a take back would mark it. As
    # a release would, it still lets the job try to fit, but only if nothing was tried since the job's types last
    # changed (the same state gives the same answer).
    gpu_type = view.topology.gpu_type
    every_type = len(types) == len(view.topology.type_names)
    passed: list[JobView] = []
    victims: list[JobView] = []
    placement = None
    fresh = True  # nothing tried since the job's GPU types last changed
    for victim_id in candidates:
        if victim_id in taken:
            continue
        victim = view.job(victim_id)
        held = victim.placement
        if (
            not every_type
            and held is not None
            and gpu_type[held.gpus[0]] not in types
            and all(gpu_type[g] not in types for g in held.gpus)
            and _restored_as_taken(victim.spec, held)
        ):
            passed.append(victim)
            if not fresh:
                continue
        else:
            planner.release(victim)
            victims.append(victim)
            fresh = True
        # A whole-GPU job fits as soon as enough GPUs of one type are free: only then try to place it.
        if whole and not any(planner.type_free(t) >= spec.num_gpus for t in types):
            continue
        placement = place(planner, spec, strategy, types)
        if placement is not None:
            break
        fresh = False
    if passed:
        planner.pass_over(passed)
    if placement is None:
        for victim in victims:  # put back what was tentatively freed
            assert victim.placement is not None
            planner.take(victim.spec, list(victim.placement.gpus))
        return None
    used = set(placement.gpus)
    needed: list[JobView] = []
    for victim in victims:
        assert victim.placement is not None
        if used.isdisjoint(victim.placement.gpus):
            planner.take(victim.spec, list(victim.placement.gpus))  # freed for nothing: it keeps running
            continue
        taken.add(victim.spec.job_id)
        needed.append(victim)
    return placement, needed


def _restored_as_taken(spec: JobSpec, placement: Placement) -> bool:
    """Does taking ``placement``'s GPUs back for ``spec`` (``Planner.take``, as a put-back does) give exactly what
    releasing it freed? (Not for an opportunistic or packed placement, or a memory reservation of its own.)"""
    return (
        not placement.opportunistic
        and placement.gpu_milli == spec.gpu_milli
        and mem_given(spec, placement) == (spec.gpu_mem_mib or 0)
    )
