"""Jobs: what a user asked for (:class:`JobSpec`, frozen), its class and phase, and what a policy may read of one
(:class:`JobView`). Where a job stands, the engine's mutable record of it, is :class:`corral.core.status.JobStatus`.

A job is a gang: it needs all of its ``num_gpus`` GPUs at once, each at the same share ``gpu_milli``
(1000 = a whole GPU; openb's GPU-sharing pods ask for less). ``duration_s`` is the job's *work*: how long it runs
alone, consolidated, on a GPU of speed 1.0. Traces know it; the live controller usually does not (``None``), and
only oracle policies (SJF, SRTF) may look at it.

Batch size (``batch_size``): the mini-batch size the job trains with, when known. ``None`` means the model's
reference batch size (:attr:`corral.workloads.models.ModelTraits.ref_batch`): the one at which ``duration_s`` was
measured. Work is counted in *reference-batch seconds*: at another batch size a job makes progress at its
goodput there relative to the reference (throughput in samples/s times per-sample statistical efficiency; see
:mod:`corral.workloads.models` and ``docs/simulator.md``), so a policy that changes a job's batch size
(``SetBatchSize``, IADeep's tuner) changes how fast it finishes. The batch size in use is
``JobStatus.batch_size`` (:mod:`corral.core.status`): the last ``SetBatchSize``, else the spec's.

Phases are explicit and exclusive: a job is in exactly one :class:`JobPhase` at any time. The engine's cluster
state is the only code that changes a phase.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from corral.core.errors import JobSpecError
from corral.core.placement import Placement
from corral.core.telemetry import Telemetry

FULL_GPU_MILLI = 1000


class JobClass(StrEnum):
    """AntMan's two kinds of job (OSDI'20 §4): inside a tenant's quota, or on spare resources."""

    GUARANTEED = "guaranteed"
    OPPORTUNISTIC = "opportunistic"


class JobPhase(StrEnum):
    PENDING = "pending"  # submitted (or preempted) and waiting for GPUs
    RUNNING = "running"  # holds its GPUs
    FINISHED = "finished"  # completed its work
    REJECTED = "rejected"  # can never run here (too big for the cluster or its quota); see JobStatus.reason
    FAILED = "failed"  # live mode: its process ended in error (see JobStatus.reason); a replay never fails a job
    CANCELLED = "cancelled"  # live mode: a user cancelled it, pending or running

    @property
    def is_terminal(self) -> bool:
        return self in _TERMINAL


_TERMINAL = frozenset((JobPhase.FINISHED, JobPhase.REJECTED, JobPhase.FAILED, JobPhase.CANCELLED))


@dataclass(frozen=True, slots=True)
class JobSpec:
    """What was submitted. Immutable: a change of mind is a new job."""

    job_id: str
    submit_s: float
    num_gpus: int
    duration_s: float | None = None
    tenant: str = "default"
    gpu_milli: int = FULL_GPU_MILLI
    model: str | None = None
    job_class: JobClass = JobClass.GUARANTEED
    priority: int = 0
    gpu_types: tuple[str, ...] = ()  # allowed GPU types; empty means any
    gpu_mem_mib: int | None = None  # GPU memory needed on each GPU, when known
    batch_size: int | None = None  # mini-batch size it starts with; None: its model's reference batch size

    def __post_init__(self) -> None:
        # Fail at the edge with the job named: a bad spec deep inside the engine would be a confusing bug.
        if not self.job_id:
            raise JobSpecError("a job needs a non-empty job_id")
        if type(self.num_gpus) is not int or self.num_gpus < 1:
            raise JobSpecError(f"job {self.job_id!r}: num_gpus must be an integer >= 1, got {self.num_gpus!r}")
        if type(self.gpu_milli) is not int or not 0 < self.gpu_milli <= FULL_GPU_MILLI:
            raise JobSpecError(f"job {self.job_id!r}: gpu_milli must be an integer in 1..1000, got {self.gpu_milli!r}")
        if self.num_gpus > 1 and self.gpu_milli != FULL_GPU_MILLI:
            raise JobSpecError(
                f"job {self.job_id!r}: a fractional share (gpu_milli={self.gpu_milli}) needs num_gpus == 1"
            )
        if self.duration_s is not None and not 0 <= self.duration_s < math.inf:
            raise JobSpecError(f"job {self.job_id!r}: duration_s must be finite and >= 0, got {self.duration_s!r}")
        if math.isnan(self.submit_s) or math.isinf(self.submit_s):
            raise JobSpecError(f"job {self.job_id!r}: submit_s must be finite, got {self.submit_s!r}")
        if self.gpu_mem_mib is not None and self.gpu_mem_mib < 0:
            raise JobSpecError(f"job {self.job_id!r}: gpu_mem_mib must be >= 0, got {self.gpu_mem_mib!r}")
        if self.batch_size is not None and (type(self.batch_size) is not int or self.batch_size < 1):
            raise JobSpecError(f"job {self.job_id!r}: batch_size must be an integer >= 1, got {self.batch_size!r}")

    @property
    def gpu_demand_milli(self) -> int:
        """Total GPU share asked for, in milli-GPUs (4 whole GPUs = 4000)."""
        return self.num_gpus * self.gpu_milli


def mem_given(spec: JobSpec, placement: Placement) -> int:
    """GPU memory ``placement`` gives its job on each GPU: the placement's own figure (a reservation, or an
    opportunistic job's cap), else the spec's ``gpu_mem_mib``, else none. What the engine's state counts."""
    if placement.mem_mib is not None:
        return placement.mem_mib
    return spec.gpu_mem_mib or 0


class JobView(Protocol):
    """What a policy may read of a job. Policies get this, never a writable
    :class:`~corral.core.status.JobStatus`."""

    @property
    def spec(self) -> JobSpec: ...
    @property
    def phase(self) -> JobPhase: ...
    @property
    def placement(self) -> Placement | None: ...
    @property
    def executed_s(self) -> float: ...
    @property
    def work_done_s(self) -> float: ...
    @property
    def last_start_s(self) -> float | None: ...
    @property
    def queued_since_s(self) -> float: ...
    @property
    def preemptions(self) -> int: ...
    @property
    def suspended_from(self) -> Placement | None: ...
    @property
    def movable(self) -> bool: ...
    @property
    def observed_rate(self) -> float | None: ...
    @property
    def job_class(self) -> JobClass: ...
    @property
    def telemetry(self) -> Telemetry | None: ...
    @property
    def batch_size(self) -> int | None: ...
