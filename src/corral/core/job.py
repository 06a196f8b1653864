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
from abc import abstractmethod
from dataclasses import dataclass
from enum import StrEnum

from mypy_extensions import trait

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
    """What was submitted. Immutable: a change of mind is a new job.

    Checked as it is made, each bad field named with the job (:class:`~corral.core.errors.JobSpecError`): the
    check runs in ``__new__``, on the arguments as given, before ``__init__`` stores them. In the compiled core
    (``setup.py``) ``__init__`` is compiled and converts each argument to its field's type itself, with a
    ``TypeError`` that names no field: the check comes first so that a bad type is reported as the user's error,
    the same in either build. Times are stored as floats (an integer ``submit_s`` becomes ``5.0``), as compiled.
    """

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

    # The same parameters as __init__, untyped: Python (or the compiled build) binds the arguments, and the checks
    # see them as given. Type checkers read __init__'s types.
    def __new__(
        cls,
        job_id: object,
        submit_s: object,
        num_gpus: object,
        duration_s: object = None,
        tenant: object = "default",
        gpu_milli: object = FULL_GPU_MILLI,
        model: object = None,
        job_class: object = JobClass.GUARANTEED,
        priority: object = 0,
        gpu_types: object = (),
        gpu_mem_mib: object = None,
        batch_size: object = None,
    ) -> JobSpec:
        _check_spec(
            job_id,
            submit_s,
            num_gpus,
            duration_s,
            tenant,
            gpu_milli,
            model,
            job_class,
            priority,
            gpu_types,
            gpu_mem_mib,
            batch_size,
        )
        return object.__new__(cls)

    # Written out (a test checks it against the fields): compiled, the one dataclasses generates would run as
    # interpreted code, and every job of a trace makes one (issue 20).
    def __init__(
        self,
        job_id: str,
        submit_s: float,
        num_gpus: int,
        duration_s: float | None = None,
        tenant: str = "default",
        gpu_milli: int = FULL_GPU_MILLI,
        model: str | None = None,
        job_class: JobClass = JobClass.GUARANTEED,
        priority: int = 0,
        gpu_types: tuple[str, ...] = (),
        gpu_mem_mib: int | None = None,
        batch_size: int | None = None,
    ) -> None:
        object.__setattr__(self, "job_id", job_id)
        object.__setattr__(self, "submit_s", float(submit_s))
        object.__setattr__(self, "num_gpus", num_gpus)
        object.__setattr__(self, "duration_s", None if duration_s is None else float(duration_s))
        object.__setattr__(self, "tenant", tenant)
        object.__setattr__(self, "gpu_milli", gpu_milli)
        object.__setattr__(self, "model", model)
        object.__setattr__(self, "job_class", job_class)
        object.__setattr__(self, "priority", priority)
        object.__setattr__(self, "gpu_types", gpu_types)
        object.__setattr__(self, "gpu_mem_mib", gpu_mem_mib)
        object.__setattr__(self, "batch_size", batch_size)

    def __reduce__(self) -> tuple[type[JobSpec], tuple[object, ...]]:
        # Copies and pickles go through the constructor (checked again): compiled, a JobSpec cannot be made empty
        # and filled in.
        return JobSpec, (
            self.job_id,
            self.submit_s,
            self.num_gpus,
            self.duration_s,
            self.tenant,
            self.gpu_milli,
            self.model,
            self.job_class,
            self.priority,
            self.gpu_types,
            self.gpu_mem_mib,
            self.batch_size,
        )

    def replaced(
        self,
        *,
        submit_s: float | None = None,
        tenant: str | None = None,
        model: str | None = None,
        job_class: JobClass | None = None,
    ) -> JobSpec:
        """This spec with the given fields changed (None: kept; so a model can be given here, not taken away), made
        and checked as any new spec: what ``dataclasses.replace`` gives, which passes every field by keyword, at a
        fifth of its cost compiled (0.48 against 2.57 us) and 60% of it in pure Python (the trace filters change a
        field of every job: issue 20)."""
        # Positional, in field order: job_id, submit_s, num_gpus, duration_s, tenant, gpu_milli, model, job_class,
        # priority, gpu_types, gpu_mem_mib, batch_size.
        return JobSpec(
            self.job_id,
            self.submit_s if submit_s is None else submit_s,
            self.num_gpus,
            self.duration_s,
            self.tenant if tenant is None else tenant,
            self.gpu_milli,
            self.model if model is None else model,
            self.job_class if job_class is None else job_class,
            self.priority,
            self.gpu_types,
            self.gpu_mem_mib,
            self.batch_size,
        )

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


def _real(x: object) -> bool:
    """An int or a float, not a bool (a float field takes an int, as a typed call does)."""
    t = type(x)
    # Exact types first: every spec asks twice, and ``int | float`` is built anew at each call (issue 20).
    return t is float or t is int or (t is not bool and isinstance(x, (int, float)))


def _check_spec(
    job_id: object,
    submit: object,
    num_gpus: object,
    duration: object,
    tenant: object,
    gpu_milli: object,
    model: object,
    job_class: object,
    priority: object,
    types: object,
    mem: object,
    batch: object,
) -> None:
    """Fail at the edge with the job named: a bad spec deep inside the engine would be a confusing bug. Counts are
    exact ints (not bools, not floats, even integral ones)."""
    if not isinstance(job_id, str) or not job_id:
        raise JobSpecError(f"a job needs a non-empty string job_id, got {job_id!r}")
    if type(num_gpus) is not int or num_gpus < 1:
        raise JobSpecError(f"job {job_id!r}: num_gpus must be an integer >= 1, got {num_gpus!r}")
    if type(gpu_milli) is not int or not 0 < gpu_milli <= FULL_GPU_MILLI:
        raise JobSpecError(f"job {job_id!r}: gpu_milli must be an integer in 1..1000, got {gpu_milli!r}")
    if num_gpus > 1 and gpu_milli != FULL_GPU_MILLI:
        raise JobSpecError(f"job {job_id!r}: a fractional share (gpu_milli={gpu_milli}) needs num_gpus == 1")
    if duration is not None and not (_real(duration) and 0 <= duration < math.inf):  # type: ignore[operator]
        raise JobSpecError(f"job {job_id!r}: duration_s must be finite and >= 0, got {duration!r}")
    if not _real(submit) or not math.isfinite(submit):  # type: ignore[arg-type]
        raise JobSpecError(f"job {job_id!r}: submit_s must be finite, got {submit!r}")
    if not isinstance(tenant, str):
        raise JobSpecError(f"job {job_id!r}: tenant must be a string, got {tenant!r}")
    if model is not None and not isinstance(model, str):
        raise JobSpecError(f"job {job_id!r}: model must be a string or None, got {model!r}")
    if not isinstance(job_class, JobClass):
        raise JobSpecError(f"job {job_id!r}: job_class must be a JobClass, got {job_class!r}")
    if type(priority) is not int:
        raise JobSpecError(f"job {job_id!r}: priority must be an integer, got {priority!r}")
    if not isinstance(types, tuple) or not all(isinstance(t, str) for t in types):
        raise JobSpecError(f"job {job_id!r}: gpu_types must be a tuple of GPU type names, got {types!r}")
    if mem is not None and (type(mem) is not int or mem < 0):
        raise JobSpecError(f"job {job_id!r}: gpu_mem_mib must be an integer >= 0, got {mem!r}")
    if batch is not None and (type(batch) is not int or batch < 1):
        raise JobSpecError(f"job {job_id!r}: batch_size must be an integer >= 1, got {batch!r}")


@trait
class JobView:
    """What a policy may read of a job. Policies get this, never a writable
    :class:`~corral.core.status.JobStatus`, which names it as its base: an interface (a mypyc ``trait``), not a
    ``Protocol``, for the reason :mod:`corral.policies.framework.view` gives (a compiled policy reads these
    directly, not through Python's attribute lookup)."""

    __slots__ = ()  # in plain Python a base without slots would give every job record a dictionary

    @property
    @abstractmethod
    def spec(self) -> JobSpec: ...
    @property
    @abstractmethod
    def phase(self) -> JobPhase: ...
    @property
    @abstractmethod
    def placement(self) -> Placement | None: ...
    @property
    @abstractmethod
    def executed_s(self) -> float: ...
    @property
    @abstractmethod
    def work_done_s(self) -> float: ...
    @property
    @abstractmethod
    def last_start_s(self) -> float | None: ...
    @property
    @abstractmethod
    def queued_since_s(self) -> float: ...
    @property
    @abstractmethod
    def preemptions(self) -> int: ...
    @property
    @abstractmethod
    def suspended_from(self) -> Placement | None: ...
    @property
    @abstractmethod
    def movable(self) -> bool: ...
    @property
    @abstractmethod
    def observed_rate(self) -> float | None: ...
    @property
    @abstractmethod
    def job_class(self) -> JobClass: ...
    @property
    @abstractmethod
    def telemetry(self) -> Telemetry | None: ...
    @property
    @abstractmethod
    def batch_size(self) -> int | None: ...
