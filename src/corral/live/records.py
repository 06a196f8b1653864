"""What live mode keeps about a job besides the engine's :class:`~corral.core.status.JobStatus`: the command a user
submitted (:class:`JobRequest`), and the process side of its current run (:class:`ProcessState`). A
:class:`JobRecord` is both together, as the durable store holds it and the API shows it.

Also the (de)serialization of ``JobStatus`` to plain JSON-able dicts for the store: every field the engine needs
to take a job back after a restart (its spec, phase, placement, run epoch and counters).
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from corral.core.errors import CorralError
from corral.core.job import FULL_GPU_MILLI, JobClass, JobPhase, JobSpec
from corral.core.placement import Placement
from corral.core.status import JobStatus
from corral.core.telemetry import Telemetry

if TYPE_CHECKING:
    from corral.sim.forecast import Estimate

MAX_COMMAND_ARGS = 4096
MAX_NAME_CHARS = 200

# Job ids: 8 characters from an alphabet without look-alikes (no 0/o, 1/l/i), drawn from the OS's randomness
# (31**8, about 8.5e11 ids). Not a counter: a sequential id would tell every tenant how many jobs the others
# submitted between two of its own. Nothing is scheduled by id, so this randomness is no scheduling choice.
JOB_ID_ALPHABET = "abcdefghjkmnpqrstuvwxyz23456789"
JOB_ID_CHARS = 8


def new_job_id() -> str:
    """A fresh opaque job id (the caller makes sure it is not taken)."""
    return "".join(secrets.choice(JOB_ID_ALPHABET) for _ in range(JOB_ID_CHARS))


@dataclass(frozen=True, slots=True)
class JobRequest:
    """A job as a user submits it: a command to run on ``num_gpus`` GPUs (checked by the controller)."""

    command: tuple[str, ...]
    tenant: str
    num_gpus: int = 1
    gpu_milli: int = FULL_GPU_MILLI
    opportunistic: bool = False
    name: str | None = None
    cwd: str = "."
    env: Mapping[str, str] = field(default_factory=dict)
    gpu_mem_mib: int | None = None
    priority: int = 0
    warm: bool = False  # start from the agent's warm workers (corral.live.agent.zygote) when it can
    expected_duration_s: float | None = None  # how long the user says it runs (start-time estimates use it)

    def to_json(self) -> dict[str, Any]:
        return {
            "command": list(self.command),
            "tenant": self.tenant,
            "num_gpus": self.num_gpus,
            "gpu_milli": self.gpu_milli,
            "opportunistic": self.opportunistic,
            "name": self.name,
            "cwd": self.cwd,
            "env": dict(self.env),
            "gpu_mem_mib": self.gpu_mem_mib,
            "priority": self.priority,
            "warm": self.warm,
            "expected_duration_s": self.expected_duration_s,
        }

    def spec(self, job_id: str, submit_s: float) -> JobSpec:
        """The engine's job for this request, with ``job_id``, submitted at ``submit_s``."""
        return JobSpec(
            job_id=job_id,
            submit_s=submit_s,
            num_gpus=self.num_gpus,
            tenant=self.tenant,
            gpu_milli=self.gpu_milli,
            job_class=JobClass.OPPORTUNISTIC if self.opportunistic else JobClass.GUARANTEED,
            priority=self.priority,
            gpu_mem_mib=self.gpu_mem_mib,
        )

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> JobRequest:
        return cls(
            command=tuple(d["command"]),
            tenant=d["tenant"],
            num_gpus=d["num_gpus"],
            gpu_milli=d["gpu_milli"],
            opportunistic=d["opportunistic"],
            name=d.get("name"),
            cwd=d["cwd"],
            env=dict(d.get("env") or {}),
            gpu_mem_mib=d.get("gpu_mem_mib"),
            priority=d.get("priority", 0),
            warm=bool(d.get("warm", False)),  # absent in a store written before warm starts
            expected_duration_s=d.get("expected_duration_s"),  # absent before start-time estimates
        )


class ProcessPhase(StrEnum):
    """Where the process of a job's latest run stands (kept apart from the engine's phase: a preempted job is
    PENDING while its process may still be saving its checkpoint)."""

    NONE = "none"  # no process: never started, or its last one exited
    STARTING = "starting"  # launch committed; the agent starts it (after its GPUs' previous occupants exit)
    RUNNING = "running"
    PAUSED = "paused"  # suspended (Gandiva time slicing): alive, GPU memory kept, not stepping
    STOPPING = "stopping"  # asked to checkpoint and exit (preemption), or to stop (cancel)


@dataclass(slots=True)
class ProcessState:
    """The process side of a job: which run has (or had) a process, in what state, and how the last one ended."""

    run: int = 0
    phase: ProcessPhase = ProcessPhase.NONE
    pid: int | None = None
    exit_code: int | None = None
    exit_signal: int | None = None
    stopping_for: str | None = None  # "preempt" or "cancel" while STOPPING
    # Earlier runs asked to stop when the next one was launched (a resume or a move elsewhere, a relaunch before
    # the preempted run exited) whose exit has not been heard: adopted again after a restart, so that one that
    # finishes the job's work is heard, and none is left running beside the next.
    earlier: list[int] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "run": self.run,
            "phase": self.phase.value,
            "pid": self.pid,
            "exit_code": self.exit_code,
            "exit_signal": self.exit_signal,
            "stopping_for": self.stopping_for,
            "earlier": list(self.earlier),
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ProcessState:
        return cls(
            run=d["run"],
            phase=ProcessPhase(d["phase"]),
            pid=d.get("pid"),
            exit_code=d.get("exit_code"),
            exit_signal=d.get("exit_signal"),
            stopping_for=d.get("stopping_for"),
            earlier=[int(r) for r in d.get("earlier", ())],
        )


@dataclass(frozen=True, slots=True)
class JobRecord:
    """One job as the store holds it and the API shows it."""

    seq: int  # its place in submission order: internal, never shown (it would count other tenants' jobs)
    request: JobRequest
    status: JobStatus
    process: ProcessState
    telemetry: Telemetry | None = None  # the latest report (not durable: reports are frequent and re-sent)
    wait_reason: str | None = None  # why it waits, from the last round that examined it (not durable either)
    estimate: Estimate | None = None  # when it is expected to start (pending jobs; the latest forecast's)

    @property
    def job_id(self) -> str:
        return self.status.spec.job_id

    @property
    def phase(self) -> JobPhase:
        return self.status.phase


class BadRequest(CorralError):
    """A request the controller (or the API) refuses, changing nothing. Its class says why, in the domain's terms;
    only the API says which HTTP status that is (:data:`corral.live.api.errors.HTTP_STATUS`)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class Malformed(BadRequest):
    """The request cannot be read at all (not JSON, not UTF-8, a bad header)."""


class NotYours(BadRequest):
    """The caller may not act for this tenant (its token is another tenant's)."""


class NotFound(BadRequest):
    """Something the request names does not exist (or is another tenant's, which looks the same)."""


class UnknownTenant(NotFound):
    """The request names a tenant this server does not have."""


class NoSuchJob(NotFound):
    """The request names a job this server does not have."""


class JobEnded(BadRequest):
    """The request conflicts with the job's state: it has already ended."""


class TooLarge(BadRequest):
    """The request is larger than this server accepts."""


class InvalidRequest(BadRequest):
    """A value out of range, or not allowed here (a variable corral sets, a missing working directory)."""


class NeverFits(InvalidRequest):
    """The job could never run here: more GPUs than the cluster (or one GPU type) has, or a guaranteed job above
    its tenant's quota."""


@dataclass(frozen=True, slots=True)
class GpuJob:
    """One job on a GPU, as ``corral cluster`` shows it."""

    job_id: str
    tenant: str
    gpu_milli: int
    opportunistic: bool


@dataclass(frozen=True, slots=True)
class GpuSnapshot:
    index: int
    node: str
    type_name: str
    mem_mib: int
    stand_in: bool
    allocated_milli: int  # share given to ordinary (guaranteed or whole-GPU) placements
    jobs: tuple[GpuJob, ...]
    sm_util: float | None  # measured (NVML, or the jobs' reports on stand-ins); None when nothing measured it
    mem_used_mib: int | None


@dataclass(frozen=True, slots=True)
class NodeSnapshot:
    """One node of the cluster: ``alive``, or ``lost`` (its agent or machine gone; its GPUs out of the cluster
    until it comes back)."""

    name: str
    state: str
    num_gpus: int


@dataclass(frozen=True, slots=True)
class ClusterSnapshot:
    policy: str
    gpus: tuple[GpuSnapshot, ...]
    allocated_gpus: float
    num_gpus: int
    pending: int
    running: int
    # The same counts per tenant, so that a tenant's view can show its own and nobody else's.
    pending_by_tenant: Mapping[str, int] = field(default_factory=dict)
    running_by_tenant: Mapping[str, int] = field(default_factory=dict)
    nodes: tuple[NodeSnapshot, ...] = ()


@dataclass(frozen=True, slots=True)
class TenantSnapshot:
    name: str
    quota_gpus: int | None
    guaranteed_gpus: float  # held by its guaranteed jobs (what counts against the quota)
    opportunistic_gpus: float  # shares capped for its opportunistic jobs
    running: int
    pending: int


# -- JobStatus <-> JSON ---------------------------------------------------------------------------------------
def spec_to_json(spec: JobSpec) -> dict[str, Any]:
    return {
        "job_id": spec.job_id,
        "submit_s": spec.submit_s,
        "num_gpus": spec.num_gpus,
        "duration_s": spec.duration_s,
        "tenant": spec.tenant,
        "gpu_milli": spec.gpu_milli,
        "model": spec.model,
        "job_class": spec.job_class.value,
        "priority": spec.priority,
        "gpu_types": list(spec.gpu_types),
        "gpu_mem_mib": spec.gpu_mem_mib,
    }


def spec_from_json(d: Mapping[str, Any]) -> JobSpec:
    return JobSpec(
        job_id=d["job_id"],
        submit_s=d["submit_s"],
        num_gpus=d["num_gpus"],
        duration_s=d.get("duration_s"),
        tenant=d["tenant"],
        gpu_milli=d["gpu_milli"],
        model=d.get("model"),
        job_class=JobClass(d["job_class"]),
        priority=d.get("priority", 0),
        gpu_types=tuple(d.get("gpu_types") or ()),
        gpu_mem_mib=d.get("gpu_mem_mib"),
    )


def placement_to_json(p: Placement | None) -> dict[str, Any] | None:
    if p is None:
        return None
    return {"gpus": list(p.gpus), "gpu_milli": p.gpu_milli, "mem_mib": p.mem_mib, "opportunistic": p.opportunistic}


def placement_from_json(d: Mapping[str, Any] | None) -> Placement | None:
    if d is None:
        return None
    return Placement(tuple(d["gpus"]), d["gpu_milli"], d.get("mem_mib"), bool(d.get("opportunistic", False)))


_COUNTERS = (
    "first_start_s",
    "last_start_s",
    "end_s",
    "executed_s",
    "work_done_s",
    "queued_s",
    "queued_since_s",
    "preemptions",
    "run_epoch",
    "reason",
    "upgraded",
)


def status_to_json(job: JobStatus) -> dict[str, Any]:
    d: dict[str, Any] = {name: getattr(job, name) for name in _COUNTERS}
    d["spec"] = spec_to_json(job.spec)
    d["phase"] = job.phase.value
    d["placement"] = placement_to_json(job.placement)
    d["suspended_from"] = placement_to_json(job.suspended_from)
    d["movable"] = job.movable
    for k, v in d.items():  # JSON has no inf/nan; none should ever be here
        if isinstance(v, float) and not math.isfinite(v):
            raise ValueError(f"job {job.spec.job_id!r}: field {k} is {v}")
    return d


def status_from_json(d: Mapping[str, Any]) -> JobStatus:
    job = JobStatus(spec=spec_from_json(d["spec"]), phase=JobPhase(d["phase"]))
    for name in _COUNTERS:
        setattr(job, name, d[name])
    job.placement = placement_from_json(d.get("placement"))
    job.suspended_from = placement_from_json(d.get("suspended_from"))
    # A record from before corral knew: not movable until its run says it checkpoints (the safe side).
    job.movable = bool(d.get("movable", False))
    return job
