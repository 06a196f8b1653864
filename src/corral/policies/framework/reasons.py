"""Why a waiting job did not start this round, in a few words a person reads in ``corral jobs`` (Slurm's reason
column): the check that refused it, with the figures that made it refuse.

A reason is worked out only for a job the round examined and left waiting (a policy asks for it where its walk gives
up on the job), from the round's :class:`~corral.policies.framework.planner.Planner`: what was free after the jobs
the round placed before it. It costs a few index lookups (the largest free count on one node is found from the free
count buckets, never by scanning nodes), so a round that examines thousands of jobs can afford it.
"""

from __future__ import annotations

from collections.abc import Sequence

from corral.core.job import FULL_GPU_MILLI, JobSpec
from corral.core.wording import plural
from corral.policies.framework.placement import PlacementStrategy
from corral.policies.framework.planner import Planner


def quota_reason(planner: Planner, spec: JobSpec) -> str:
    """The job's tenant has no room left under its quota for it."""
    tenant = planner.view.tenants.get(spec.tenant)
    quota = tenant.quota_gpus if tenant is not None else None
    used = planner.tenant_guaranteed_milli(spec.tenant) / FULL_GPU_MILLI
    return f"tenant {spec.tenant} at quota {used:g}/{quota} GPUs"


def largest_free_on_a_node(planner: Planner, types: Sequence[int]) -> int:
    """The most entirely free GPUs on any one node of ``types``."""
    best = 0
    for t in types:
        for count in range(planner.view.max_node_gpus(t), best, -1):
            if planner.first_with_free(t, count) is not None:
                best = count
                break
    return best


def fit_reason(planner: Planner, spec: JobSpec, types: Sequence[int], strategy: PlacementStrategy) -> str:
    """Why ``spec`` found no GPUs this round (its quota allowing it)."""
    kind = f" of type {'|'.join(spec.gpu_types)}" if spec.gpu_types else ""
    if spec.gpu_milli < FULL_GPU_MILLI:
        mem = f" and {spec.gpu_mem_mib} MiB" if spec.gpu_mem_mib else ""
        return f"waiting for a GPU{kind} with {spec.gpu_milli} milli-GPU{mem} free"
    n = spec.num_gpus
    free = max((planner.type_free(t) for t in types), default=0)
    if free < n:
        if n == 1:
            return f"waiting for a free GPU{kind}"
        return f"waiting for {n} GPUs{kind}: {free} free"
    largest = largest_free_on_a_node(planner, types)
    node_gpus = max((planner.view.max_node_gpus(t) for t in types), default=0)
    gpus = plural(n, "GPU")
    if strategy is PlacementStrategy.STRICT and node_gpus:
        fewest = -(-n // node_gpus)
        where = "one node" if fewest == 1 else f"{fewest} nodes"
        return f"waiting for {gpus}{kind} on {where} (largest free: {largest})"
    if spec.gpu_mem_mib:
        return f"waiting for {gpus}{kind} with {spec.gpu_mem_mib} MiB free each: {free} free, too little memory"
    return f"waiting for {gpus}{kind}: {free} free, none placeable (largest free on a node: {largest})"


def blocked_reason(planner: Planner, spec: JobSpec, types: Sequence[int], strategy: PlacementStrategy) -> str:
    """Why ``spec`` waits: its tenant's quota if that refused it, else where it would not fit."""
    if not planner.quota_allows(spec):
        return quota_reason(planner, spec)
    return fit_reason(planner, spec, types, strategy)
