"""The scheduler-to-job contract: every environment variable, exit code and message between a node's agent and
the jobs it runs. This module is the one place where the contract is written down; the agent
(:mod:`corral.live.agent`) and the job-side library (:mod:`corral.job`) both read it from here.

A job is a process (typically a PyTorch training script) that the agent starts in its own process group, with
its stdout and stderr in a log file. A job that does not use :mod:`corral.job` still runs: it sees the
environment below and is preempted by a signal (``SIGTERM`` to its main process, a grace period, then
``SIGKILL`` to its process group), and suspended by ``SIGSTOP``/``SIGCONT`` to its process group.

Environment
-----------
Set by the agent for every job:

``CORRAL_JOB_ID``
    The job's id (as the API and ``corral jobs`` show it).
``CORRAL_RUN``
    The run number: 1 for the first start, one more for each restart after a preemption (the engine's run
    epoch). A message carrying another run's number is ignored by both sides.
``CORRAL_AGENT_SOCKET``
    Path of the agent's Unix stream socket (the local channel below). Absent when no agent listens (a job run
    by hand); the library then runs without a scheduler.
``CORRAL_CHECKPOINT_DIR``
    A directory kept across the job's runs: the job writes its checkpoint here when preempted and reads it back
    on the next run. Created by the agent.
``CORRAL_GPU_MILLI``
    The job's share of each of its GPUs, in milli-GPU (1000 = whole). For an opportunistic job it is a compute
    share cap.
``CORRAL_GPU_MEM_MIB``
    The GPU memory the job may use on each GPU, when the scheduler set one (absent otherwise).
``CORRAL_STAND_IN``
    ``1`` when the job's GPUs are stand-ins declared with ``corral serve --gpus N`` on a machine without GPUs:
    ``CUDA_VISIBLE_DEVICES`` is then empty and the job runs on the CPU. ``0`` on real GPUs.
``CORRAL_GPUS``
    The GPUs the scheduler gave the job, as the agent numbers them (comma-separated); on real GPUs the same as
    ``CUDA_VISIBLE_DEVICES``.
``CORRAL_GRACE_S``
    Seconds the job has, after a preemption request, to checkpoint and exit before it is killed.
``CORRAL_REPORT_INTERVAL_S``
    How often the library sends a step report (it aggregates the steps in between).
``CUDA_VISIBLE_DEVICES``
    The GPUs the job may use (NVML indices), or empty on stand-in GPUs.

Exit codes
----------
``0``: the job finished. :data:`EXIT_PREEMPTED` (75, ``EX_TEMPFAIL``): the job saved a checkpoint on request and
exited; it will be started again. Anything else, or death by a signal the agent did not send: the job failed.

Local channel
-------------
The job connects to ``CORRAL_AGENT_SOCKET`` (a Unix stream socket) and both sides send messages as JSON
objects, one per line (UTF-8, ``\\n``-terminated), each with a ``"type"``. The first message from the job is a
:class:`Hello`. If the connection breaks (the controller restarted), the library keeps training and reconnects
now and then; the agent matches the new connection to the job by ``job_id`` and ``run``.

Job to agent: :class:`Hello`, :class:`StepReport`, :class:`Paused`, :class:`Resumed`, :class:`Checkpointed`.
Agent to job: :class:`Pause`, :class:`Resume`, :class:`Checkpoint`, :class:`SetBatchSize`, :class:`SetLimits`.
Directives take effect at the job's next step boundary (between two mini-batches).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from typing import Any, ClassVar

from corral.core.errors import InputError

# -- environment variables ------------------------------------------------------------------------------------
ENV_JOB_ID = "CORRAL_JOB_ID"
ENV_RUN = "CORRAL_RUN"
ENV_AGENT_SOCKET = "CORRAL_AGENT_SOCKET"
ENV_CHECKPOINT_DIR = "CORRAL_CHECKPOINT_DIR"
ENV_GPU_MILLI = "CORRAL_GPU_MILLI"
ENV_GPU_MEM_MIB = "CORRAL_GPU_MEM_MIB"
ENV_STAND_IN = "CORRAL_STAND_IN"
ENV_GPUS = "CORRAL_GPUS"
ENV_GRACE_S = "CORRAL_GRACE_S"
ENV_REPORT_INTERVAL_S = "CORRAL_REPORT_INTERVAL_S"

ALL_ENV = (
    ENV_JOB_ID,
    ENV_RUN,
    ENV_AGENT_SOCKET,
    ENV_CHECKPOINT_DIR,
    ENV_GPU_MILLI,
    ENV_GPU_MEM_MIB,
    ENV_STAND_IN,
    ENV_GPUS,
    ENV_GRACE_S,
    ENV_REPORT_INTERVAL_S,
)

# -- exit codes -----------------------------------------------------------------------------------------------
EXIT_FINISHED = 0
EXIT_PREEMPTED = 75  # EX_TEMPFAIL from sysexits.h: "try again later"

DEFAULT_GRACE_S = 30.0
DEFAULT_REPORT_INTERVAL_S = 1.0
MAX_MESSAGE_BYTES = 64 * 1024  # a longer line is a protocol error; the receiver drops the connection


# -- messages -------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Hello:
    """Job to agent, first on every connection: who is speaking."""

    job_id: str
    run: int
    pid: int
    type: ClassVar[str] = "hello"


@dataclass(frozen=True, slots=True)
class StepReport:
    """Job to agent, every ``CORRAL_REPORT_INTERVAL_S``: what the steps since the last report measured.

    ``step`` is the count of steps done in this run; ``steps`` how many this report covers; ``step_time_s`` their
    mean wall time (including any idle the job's duty cycle added); ``busy_s`` their mean busy time (the step's
    own work); ``mem_peak_mib`` the GPU memory the job's caching allocator reserved at its peak over them (0 on a CPU);
    ``mem_cap_mib`` the cap the job applied, if any; ``batch_size`` the batch size in use, if the job told the
    library. ``mem_need_mib`` is the peak the job measured with no degradation (full batch, everything on the
    GPU), when it knows it: above ``mem_peak_mib`` when a cap made it degrade; ``mem_mode`` names the rung of the
    degradation ladder in use (``"full"``, ``"micro4"``, ``"micro8+act-host"``, ``"micro8+act-host+opt-host"``;
    ``None`` when the job does not run its steps through ``Job.train_step``)."""

    job_id: str
    run: int
    step: int
    steps: int
    step_time_s: float
    busy_s: float
    mem_peak_mib: int
    mem_cap_mib: int | None = None
    batch_size: int | None = None
    mem_need_mib: int | None = None
    mem_mode: str | None = None
    type: ClassVar[str] = "step"


@dataclass(frozen=True, slots=True)
class Paused:
    """Job to agent: the job stopped at a step boundary and waits for :class:`Resume`. With ``evicted`` it moved
    its model and optimizer state to host memory and gave its GPU memory back, which took ``took_s`` seconds;
    otherwise its GPU memory is kept."""

    job_id: str
    run: int
    step: int
    evicted: bool = False
    took_s: float | None = None
    type: ClassVar[str] = "paused"


@dataclass(frozen=True, slots=True)
class Resumed:
    """Job to agent: the job goes on after a pause; ``took_s`` is how long restoring an evicted job's state to
    the GPU took (``None`` after a pause that kept memory)."""

    job_id: str
    run: int
    step: int
    took_s: float | None = None
    type: ClassVar[str] = "resumed"


@dataclass(frozen=True, slots=True)
class Checkpointed:
    """Job to agent: a checkpoint of step ``step`` is saved at ``path``; the job exits with
    :data:`EXIT_PREEMPTED` right after."""

    job_id: str
    run: int
    step: int
    path: str
    type: ClassVar[str] = "checkpointed"


@dataclass(frozen=True, slots=True)
class Pause:
    """Agent to job: stop at the next step boundary and wait for :class:`Resume` (or :class:`Checkpoint`). GPU
    memory is kept, unless ``evict``: then the job moves its model and optimizer state to (pinned) host memory
    and releases its GPU memory, so that the GPU can be given to another job, and moves it back on
    :class:`Resume` (Gandiva's suspend, OSDI'18 §3.1; AntMan's eviction, OSDI'20 §3.3). A job that does not use
    the library is suspended with ``SIGSTOP`` instead and keeps its memory either way."""

    reason: str = ""
    evict: bool = False
    type: ClassVar[str] = "pause"


@dataclass(frozen=True, slots=True)
class Resume:
    """Agent to job: go on after :class:`Pause`."""

    type: ClassVar[str] = "resume"


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """Agent to job: at the next step boundary save a checkpoint to ``CORRAL_CHECKPOINT_DIR`` and exit with
    :data:`EXIT_PREEMPTED` (preemption or migration). ``SIGTERM`` to the job's main process asks the same."""

    reason: str = ""
    type: ClassVar[str] = "checkpoint"


@dataclass(frozen=True, slots=True)
class SetBatchSize:
    """Agent to job: use this batch size from the next step on (the job's ``on_batch_size`` hook applies it)."""

    batch_size: int
    type: ClassVar[str] = "batch_size"


@dataclass(frozen=True, slots=True)
class SetLimits:
    """Agent to job: a new compute share (milli-GPU; 0 pauses, memory kept) and/or GPU memory cap (MiB); ``None``
    leaves one as it is. Applied at the next step boundary (AntMan, OSDI'20 §3): the share by a duty cycle
    (after each step the job idles so that busy / (busy + idle) equals it), the cap by the allocator's
    per-process limit, releasing cached memory, and (for steps run through ``Job.train_step``) the degradation
    ladder of :mod:`corral.job.memory`."""

    gpu_milli: int | None = None
    mem_mib: int | None = None
    type: ClassVar[str] = "limits"


Message = Hello | StepReport | Paused | Resumed | Checkpointed | Pause | Resume | Checkpoint | SetBatchSize | SetLimits

_TYPES: dict[str, type[Any]] = {
    cls.type: cls
    for cls in (Hello, StepReport, Paused, Resumed, Checkpointed, Pause, Resume, Checkpoint, SetBatchSize, SetLimits)
}


def encode(message: Message) -> bytes:
    """One message as a line of JSON."""
    body = asdict(message)
    body["type"] = message.type
    return json.dumps(body, separators=(",", ":")).encode() + b"\n"


def decode(line: bytes | str) -> Message:
    """Parse one line; raises :class:`~corral.core.errors.InputError` naming what is wrong."""
    if len(line) > MAX_MESSAGE_BYTES:
        raise InputError(f"message of {len(line)} bytes exceeds {MAX_MESSAGE_BYTES}", file="<channel>")
    try:
        body = json.loads(line)
    except (ValueError, UnicodeDecodeError) as e:
        raise InputError(f"message is not JSON: {e}", file="<channel>") from None
    if not isinstance(body, dict):
        raise InputError("message is not a JSON object", file="<channel>")
    kind = body.pop("type", None)
    cls = _TYPES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise InputError(f"unknown message type {kind!r}; expected one of {sorted(_TYPES)}", file="<channel>")
    names = {f.name for f in fields(cls)}
    unknown = set(body) - names
    if unknown:
        raise InputError(f"{kind} message: unknown fields {sorted(unknown)}", file="<channel>")
    try:
        message: Message = cls(**body)
    except TypeError as e:
        raise InputError(f"{kind} message: {e}", file="<channel>") from None
    return message
