"""The typed messages between the controller and a node's agent: what the controller asks (:class:`LaunchRequest`;
stop, pause and resume are plain calls) and what the agent reports back (:data:`AgentReport`), in the order things
happened for each run (``ProcessStarted`` before anything the job says, ``ProcessExited`` last)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from corral.core import contract

StopRequest = Literal["preempt", "cancel"]


@dataclass(frozen=True, slots=True)
class LaunchRequest:
    """Start run ``run`` of job ``job_id`` of ``tenant``: ``command`` in ``cwd`` on the agent's GPUs ``gpus``
    (indices into :attr:`Agent.gpus`), as the Unix user ``run_as`` when given (the agent must be root), else as
    the agent's user. The job's environment is the contract's (:mod:`corral.core.contract`): a few harmless
    variables of the agent's, the user's ``HOME``/``USER``/``LOGNAME``, then ``env``, then the contract's
    variables."""

    job_id: str
    run: int
    command: tuple[str, ...]
    cwd: str
    env: Mapping[str, str]
    gpus: tuple[int, ...]
    gpu_milli: int = 1000
    mem_mib: int | None = None
    grace_s: float = contract.DEFAULT_GRACE_S
    tenant: str = field(kw_only=True)  # required, by name (after the fields that were positional before it)
    run_as: str | None = field(default=None, kw_only=True)
    warm: bool = field(default=False, kw_only=True)  # fork it from the warm workers (corral.live.agent.zygote)


@dataclass(frozen=True, slots=True)
class ProcessStarted:
    """The run's shim is running; ``pid`` is its pid, which is also the id of the run's process group."""

    job_id: str
    run: int
    pid: int
    started_at: float


@dataclass(frozen=True, slots=True)
class ProcessExited:
    """The run is over (or never started). ``exit_code``/``signal`` are the job's main process's, from the
    shim's ``exit.json``; both are ``None`` when there is no such record: the whole process group was killed
    (by the agent after a grace period, or from outside), the process ended while no agent watched and left
    nothing, or the run could not start. ``requested`` is ``"preempt"`` or ``"cancel"`` when the agent had been
    asked to stop this run. ``detail`` says what happened in words (which signal, when the agent knows it)."""

    job_id: str
    run: int
    exit_code: int | None
    signal: int | None
    requested: StopRequest | None
    detail: str


@dataclass(frozen=True, slots=True)
class JobReported:
    """A step report the job sent over the channel."""

    job_id: str
    run: int
    report: contract.StepReport


@dataclass(frozen=True, slots=True)
class JobSaid:
    """Anything else the job sent over the channel (its hello, paused, resumed, checkpointed)."""

    job_id: str
    run: int
    message: contract.Paused | contract.Resumed | contract.Checkpointed | contract.Hello


@dataclass(frozen=True, slots=True)
class JobMeasured:
    """What NVML measured of a run's processes on its GPUs, sampled by the agent every report interval:
    ``mem_used_mib`` the most GPU memory its processes hold on any one of its GPUs (CUDA contexts included),
    ``sm_util`` their SM use, averaged over its GPUs; ``None`` where NVML gave no figure."""

    job_id: str
    run: int
    mem_used_mib: int | None
    sm_util: float | None


AgentReport = ProcessStarted | ProcessExited | JobReported | JobSaid | JobMeasured
