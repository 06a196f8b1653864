"""Placements: which GPUs a job holds, and at what share of each.

GPUs are numbered densely 0..G-1 across the cluster (see :class:`corral.core.cluster.Topology`), so a placement
is a sorted tuple of GPU indices plus the share taken on each. Integers keep the simulator's hot path cheap.

Two layers share a GPU (AntMan, OSDI'20 §4):

- an ordinary placement *allocates* ``gpu_milli`` of each GPU: the shares allocated on a GPU add up to at most
  1000, and guaranteed jobs' allocations count against their tenant's quota;
- an *opportunistic* placement (``opportunistic=True``) allocates nothing. The job runs on what the allocated
  jobs leave unused, and ``gpu_milli`` is the cap on its compute share that the node's coordinator sets (0 = paused,
  its memory kept). A guaranteed job may be placed on such a GPU at any time; the opportunistic jobs there are
  shrunk, suspended or preempted to make room, never the other way round.

``mem_mib`` is the GPU memory given on each GPU: for an ordinary placement, what is reserved for the job (``None``:
the job spec's ``gpu_mem_mib``, or nothing when that is unknown); for an opportunistic one, its memory cap. What
is given on a GPU, over both layers, never exceeds the GPU's memory.
"""

from __future__ import annotations

from dataclasses import dataclass

from corral.core.errors import JobSpecError


@dataclass(frozen=True, slots=True)
class Placement:
    gpus: tuple[int, ...]
    gpu_milli: int = 1000
    mem_mib: int | None = None
    opportunistic: bool = False

    def __post_init__(self) -> None:
        if not self.gpus:
            raise JobSpecError("a placement needs at least one GPU")
        if len(set(self.gpus)) != len(self.gpus):
            raise JobSpecError(f"a placement lists a GPU twice: {self.gpus}")
        low = 0 if self.opportunistic else 1  # an opportunistic job at share 0 is paused, not gone
        if not low <= self.gpu_milli <= 1000:
            raise JobSpecError(f"placement share must be in {low}..1000 milli-GPU, got {self.gpu_milli}")
        if self.mem_mib is not None and self.mem_mib < 0:
            raise JobSpecError(f"placement memory must be >= 0 MiB, got {self.mem_mib}")

    @property
    def num_gpus(self) -> int:
        return len(self.gpus)
