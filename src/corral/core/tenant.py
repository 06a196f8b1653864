"""Tenants: the teams that share a cluster, each with an optional GPU quota.

A quota is the number of whole GPUs a tenant is promised for its guaranteed jobs (AntMan's "resource
guarantee", HiveD's virtual cluster size). ``None`` means the tenant has no promise and no cap.
"""

from __future__ import annotations

from dataclasses import dataclass

from corral.core.errors import JobSpecError


@dataclass(frozen=True, slots=True)
class Tenant:
    name: str
    quota_gpus: int | None = None

    def __post_init__(self) -> None:
        if not self.name:
            raise JobSpecError("a tenant needs a non-empty name")
        if self.quota_gpus is not None and self.quota_gpus < 0:
            raise JobSpecError(f"tenant {self.name!r}: quota_gpus must be >= 0, got {self.quota_gpus}")
