"""Placements: which GPUs a job holds, and at what share of each.

GPUs are numbered densely 0..G-1 across the cluster (see :class:`corral.core.cluster.Topology`), so a placement
is a sorted tuple of GPU indices plus the share taken on each. Integers keep the simulator's hot path cheap.
"""

from __future__ import annotations

from dataclasses import dataclass

from corral.core.errors import JobSpecError


@dataclass(frozen=True, slots=True)
class Placement:
    gpus: tuple[int, ...]
    gpu_milli: int = 1000

    def __post_init__(self) -> None:
        if not self.gpus:
            raise JobSpecError("a placement needs at least one GPU")
        if len(set(self.gpus)) != len(self.gpus):
            raise JobSpecError(f"a placement lists a GPU twice: {self.gpus}")
        if not 0 < self.gpu_milli <= 1000:
            raise JobSpecError(f"placement share must be in 1..1000 milli-GPU, got {self.gpu_milli}")

    @property
    def num_gpus(self) -> int:
        return len(self.gpus)
