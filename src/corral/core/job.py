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
from typing import Any, Protocol

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

    def __new__(cls, *args: Any, **kwargs: Any) -> JobSpec:
        _check_spec(_bind_spec(args, kwargs))
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
        return JobSpec, tuple([getattr(self, name) for name in _SPEC_FIELDS])

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


_SPEC_FIELDS = (
    "job_id",
    "submit_s",
    "num_gpus",
    "duration_s",
    "tenant",
    "gpu_milli",
    "model",
    "job_class",
    "priority",
    "gpu_types",
    "gpu_mem_mib",
    "batch_size",
)
_SPEC_REQUIRED = 3  # the first three fields have no default


def _bind_spec(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The arguments of ``JobSpec(...)`` by field name (as Python binds them to ``__init__``'s parameters)."""
    if len(args) > len(_SPEC_FIELDS):
        raise TypeError(f"JobSpec() takes at most {len(_SPEC_FIELDS)} arguments ({len(args)} given)")
    given = dict(zip(_SPEC_FIELDS[: len(args)], args, strict=True))
    for name, value in kwargs.items():
        if name not in _SPEC_FIELDS:
            raise TypeError(f"JobSpec() got an unexpected keyword argument {name!r}")
        if name in given:
            raise TypeError(f"JobSpec() got multiple values for argument {name!r}")
        given[name] = value
    missing = [name for name in _SPEC_FIELDS[:_SPEC_REQUIRED] if name not in given]
    if missing:
        raise TypeError(f"JobSpec() missing required argument(s): {', '.join(missing)}")
    return given


def _is_int(x: object) -> bool:
    return type(x) is int  # bool is an int subclass, but not a count


def _is_real(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def _check_spec(f: dict[str, Any]) -> None:
    """Fail at the edge with the job named: a bad spec deep inside the engine would be a confusing bug."""
    job_id = f["job_id"]
    if not isinstance(job_id, str) or not job_id:
        raise JobSpecError(f"a job needs a non-empty string job_id, got {job_id!r}")
    num_gpus = f["num_gpus"]
    if not _is_int(num_gpus) or num_gpus < 1:
        raise JobSpecError(f"job {job_id!r}: num_gpus must be an integer >= 1, got {num_gpus!r}")
    gpu_milli = f.get("gpu_milli", FULL_GPU_MILLI)
    if not _is_int(gpu_milli) or not 0 < gpu_milli <= FULL_GPU_MILLI:
        raise JobSpecError(f"job {job_id!r}: gpu_milli must be an integer in 1..1000, got {gpu_milli!r}")
    if num_gpus > 1 and gpu_milli != FULL_GPU_MILLI:
        raise JobSpecError(f"job {job_id!r}: a fractional share (gpu_milli={gpu_milli}) needs num_gpus == 1")
    duration = f.get("duration_s")
    if duration is not None and not (_is_real(duration) and 0 <= duration < math.inf):
        raise JobSpecError(f"job {job_id!r}: duration_s must be finite and >= 0, got {duration!r}")
    submit = f["submit_s"]
    if not _is_real(submit) or math.isnan(submit) or math.isinf(submit):
        raise JobSpecError(f"job {job_id!r}: submit_s must be finite, got {submit!r}")
    for name in ("tenant", "model"):
        value = f.get(name, "")
        if value is None and name == "model":
            continue
        if not isinstance(value, str):
            raise JobSpecError(f"job {job_id!r}: {name} must be a string, got {value!r}")
    job_class = f.get("job_class", JobClass.GUARANTEED)
    if not isinstance(job_class, JobClass):
        raise JobSpecError(f"job {job_id!r}: job_class must be a JobClass, got {job_class!r}")
    priority = f.get("priority", 0)
    if not _is_int(priority):
        raise JobSpecError(f"job {job_id!r}: priority must be an integer, got {priority!r}")
    types = f.get("gpu_types", ())
    if not isinstance(types, tuple) or not all(isinstance(t, str) for t in types):
        raise JobSpecError(f"job {job_id!r}: gpu_types must be a tuple of GPU type names, got {types!r}")
    mem = f.get("gpu_mem_mib")
    if mem is not None and (not _is_int(mem) or mem < 0):
        raise JobSpecError(f"job {job_id!r}: gpu_mem_mib must be an integer >= 0, got {mem!r}")
    batch = f.get("batch_size")
    if batch is not None and (not _is_int(batch) or batch < 1):
        raise JobSpecError(f"job {job_id!r}: batch_size must be an integer >= 1, got {batch!r}")


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
