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
``CORRAL_RUN_SECRET``
    A random secret of this run (64 hex digits), made by the agent at launch and kept in the run's record
    (mode 0600) so that it survives a restart of the agent. The job's :class:`Hello` carries it: the agent drops a
    connection whose hello names a run with a wrong or missing secret, so a process can speak only for its own
    run. (Without ``run_as``, every job is the same Unix user, which may read another job's environment from
    ``/proc``; see the trust model in ``docs/live.md``.)
``CUDA_VISIBLE_DEVICES``
    The GPUs the job may use (NVML indices), or empty on stand-in GPUs. On real GPUs ``CUDA_DEVICE_ORDER`` is
    ``PCI_BUS_ID`` too, so that CUDA numbers the GPUs as NVML does.

Nothing else of the server's environment reaches a job: corral's tokens, the variables the configuration names
(``token_env``, ``admin_token_env``) and the server's own settings stay with the server. A job's environment is,
in this order (a later one wins):

1. from the server's environment, the harmless variables :data:`PASSED_ENV` (``PATH``, ``LANG``, ``LANGUAGE``,
   ``TZ``, ``TMPDIR``) and those starting with :data:`PASSED_ENV_PREFIXES` (``LC_``), where set;
2. ``HOME``, ``USER`` and ``LOGNAME`` of the Unix user the run runs as (the tenant's ``run_as`` user, else the
   server's);
3. the ``env`` its submitter gave in the request (``CORRAL_*`` names are refused there);
4. the variables above.

Gangs across nodes
------------------
A job that needs more GPUs than one node has runs as a *gang*: one process per node, each started by that
node's agent (with its own channel to it, as above), training together with ``torch.distributed``. Besides the
variables above (``CORRAL_GPUS`` names this node's GPUs), each gets the variables :func:`gang_env` builds, the
same on every node but for ``NODE_RANK``; a one-node job gets none of them. Ranks are ordered by node id (several
stand-in nodes on one machine share an address):

``MASTER_ADDR``, ``MASTER_PORT``
    Address of the first node (rank 0) and a free port there, for ``torch.distributed``'s rendezvous.
``WORLD_SIZE``
    Nodes x GPUs per node: the world of a one-process-per-GPU launch (``torchrun --nproc_per_node
    $LOCAL_WORLD_SIZE``).
``NNODES``, ``NODE_RANK``
    How many nodes the gang has, and which one this is (0 to ``NNODES - 1``).
``LOCAL_WORLD_SIZE``
    GPUs per node.
``CORRAL_GANG_ADDR``, ``CORRAL_GANG_PORT``
    Where :mod:`corral.job`'s gang store listens (on rank 0's node, another port than ``MASTER_PORT``): a small
    key-value store (``torch.distributed.TCPStore``) that rank 0's process hosts and through which the ranks
    agree on the step at which each directive applies. Their presence is what makes a job a gang member.

So ``torchrun --nnodes $NNODES --node_rank $NODE_RANK --nproc_per_node $LOCAL_WORLD_SIZE --master_addr
$MASTER_ADDR --master_port $MASTER_PORT train.py`` works, and so does a script that runs one process per node
and calls ``torch.distributed.init_process_group(rank=NODE_RANK, world_size=NNODES, ...)``. :mod:`corral.job`
numbers the gang's processes as ``NODE_RANK`` of ``NNODES``, or, for a process with ``LOCAL_RANK`` (one of several
on its node: torchrun sets it for each worker, with ``RANK`` and ``WORLD_SIZE``), as ``RANK`` of ``WORLD_SIZE``;
only the process of ``LOCAL_RANK`` 0 (or without one) talks to the agent.

Every rank of a gang obeys each directive at the same step, or data-parallel training would deadlock (one rank
paused or gone inside a collective the others wait in). The controller sends the same directive, with the same
``seq`` (a number that identifies the directive among the job's directives: a per-job counter), to every
rank's agent; they reach the ranks at slightly different times, and possibly not all of them. The ranks agree through
the gang store on the step (:mod:`corral.job.gang`): the first rank to receive a directive proposes a step a little
ahead, every rank applies the directive at the agreed step, whether its own agent's copy came early, late or
never. Rank 0 writes the gang's checkpoints (with every rank's random generator states) to the shared
``CORRAL_CHECKPOINT_DIR``; on checkpoint-and-exit the other ranks wait until rank 0's checkpoint is complete, then
each sends :class:`Checkpointed` naming it and exits with :data:`EXIT_PREEMPTED`, so the gang's run is
checkpointed once any rank says :class:`Checkpointed` (rank 0 says it first). Every rank resumes from it. A
directive without ``seq`` sent to a gang is still agreed, but as many times as it arrives (a warning says so).

Exit codes
----------
``0``: the job finished. :data:`EXIT_PREEMPTED` (75, ``EX_TEMPFAIL``): the job saved a checkpoint on request and
exited; it will be started again. Anything else, or death by a signal the agent did not send: the job failed.

Local channel
-------------
The job connects to ``CORRAL_AGENT_SOCKET`` (a Unix stream socket) and both sides send messages as JSON
objects, one per line (UTF-8, ``\\n``-terminated), each with a ``"type"``. The first message from the job is a
:class:`Hello` with the run's secret (``CORRAL_RUN_SECRET``). If the connection breaks (the controller
restarted), the library keeps training and reconnects now and then; the agent matches the new connection to the
job by ``job_id``, ``run`` and secret.

Every message is checked where it is read (:func:`decode`): known type, known fields, each of its type (a JSON
``true`` is not an integer), numbers finite and in range (:data:`MAX_COUNT`, :data:`MAX_MIB`,
:data:`MAX_SECONDS`), text at most :data:`MAX_TEXT_CHARS` characters (:data:`MAX_PATH_CHARS` for a path). The agent
drops a bad message, counts it against the run that sent it, and disconnects a run after
:data:`MAX_BAD_MESSAGES` of them (the job keeps running; it is then stopped and paused by signals only). A line
longer than :data:`MAX_MESSAGE_BYTES` ends the connection.

Job to agent: :class:`Hello`, :class:`StepReport`, :class:`Paused`, :class:`Resumed`, :class:`Checkpointed`.
Agent to job: :class:`Pause`, :class:`Resume`, :class:`Checkpoint`, :class:`SetBatchSize`, :class:`SetLimits`.
Directives take effect at the job's next step boundary (between two mini-batches). Every directive has a ``seq``
field, the directive's number: ``None`` (left out) for a one-node job; for a gang, the same number on every
rank's copy of the same directive, so that the ranks know it for one (see "Gangs across nodes").
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, asdict, dataclass, fields
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
ENV_RUN_SECRET = "CORRAL_RUN_SECRET"

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
    ENV_RUN_SECRET,
)

# Gang jobs across nodes (see "Gangs across nodes" above; built by :func:`gang_env`).
ENV_MASTER_ADDR = "MASTER_ADDR"
ENV_MASTER_PORT = "MASTER_PORT"
ENV_WORLD_SIZE = "WORLD_SIZE"
ENV_NNODES = "NNODES"
ENV_NODE_RANK = "NODE_RANK"
ENV_LOCAL_WORLD_SIZE = "LOCAL_WORLD_SIZE"
ENV_GANG_ADDR = "CORRAL_GANG_ADDR"
ENV_GANG_PORT = "CORRAL_GANG_PORT"
ENV_LOCAL_RANK = "LOCAL_RANK"  # set by torchrun for each worker, never by the agent
ENV_RANK = "RANK"  # likewise

GANG_ENV = (
    ENV_MASTER_ADDR,
    ENV_MASTER_PORT,
    ENV_WORLD_SIZE,
    ENV_NNODES,
    ENV_NODE_RANK,
    ENV_LOCAL_WORLD_SIZE,
    ENV_GANG_ADDR,
    ENV_GANG_PORT,
)

# What a job gets of the server's environment (see "Environment" above): nothing that could hold a secret.
PASSED_ENV = ("PATH", "LANG", "LANGUAGE", "TZ", "TMPDIR")
PASSED_ENV_PREFIXES = ("LC_",)
USER_ENV = ("HOME", "USER", "LOGNAME")


def passed_env(server_env: Mapping[str, str]) -> dict[str, str]:
    """The part of the server's environment a job gets: :data:`PASSED_ENV` and :data:`PASSED_ENV_PREFIXES`."""
    return {
        name: value for name, value in server_env.items() if name in PASSED_ENV or name.startswith(PASSED_ENV_PREFIXES)
    }


# -- exit codes -----------------------------------------------------------------------------------------------
EXIT_FINISHED = 0
EXIT_PREEMPTED = 75  # EX_TEMPFAIL from sysexits.h: "try again later"

DEFAULT_GRACE_S = 30.0
DEFAULT_REPORT_INTERVAL_S = 1.0
MAX_MESSAGE_BYTES = 64 * 1024  # a longer line is a protocol error; the receiver drops the connection
MAX_BAD_MESSAGES = 100  # the agent disconnects a run that sent more bad messages than this
SECRET_BYTES = 32  # a run secret is this many random bytes, as hex

# Bounds of a message's fields (:func:`decode`): generous for any real job, small enough that nothing downstream
# overflows or has to guess (a step count, a pid, a batch size all fit; a memory figure of up to 1 PiB).
MAX_COUNT = 2**53  # steps, runs, pids, batch sizes: integers a float holds exactly
MAX_MIB = 2**30
MAX_SECONDS = 1e9  # about 31 years
MAX_TEXT_CHARS = 1024  # a job id, a reason, a mode name, a secret
MAX_PATH_CHARS = 4096  # PATH_MAX


# -- messages -------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Hello:
    """Job to agent, first on every connection: who is speaking, and the run's secret (``CORRAL_RUN_SECRET``) to
    prove it. :class:`corral.job`'s channel fills ``secret`` in. ``checkpoints``: the job writes checkpoints it
    resumes from (``corral.job`` with a checkpoint directory), so it can be moved to other GPUs without losing its
    progress; a run that never says so is kept where it is suspended."""

    job_id: str
    run: int
    pid: int
    secret: str = ""
    checkpoints: bool = False
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
    ``None`` when the job does not run its steps through ``Job.train_step``). ``steps_left`` is how many steps the
    job still has to do, when it knows (``Job(total_steps=...)``): the start-time estimates of the jobs waiting
    for its GPUs read it."""

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
    steps_left: int | None = None
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
    seq: int | None = None
    type: ClassVar[str] = "pause"


@dataclass(frozen=True, slots=True)
class Resume:
    """Agent to job: go on after :class:`Pause`."""

    seq: int | None = None
    type: ClassVar[str] = "resume"


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """Agent to job: at the next step boundary save a checkpoint to ``CORRAL_CHECKPOINT_DIR`` and exit with
    :data:`EXIT_PREEMPTED` (preemption or migration). ``SIGTERM`` to the job's main process asks the same."""

    reason: str = ""
    seq: int | None = None
    type: ClassVar[str] = "checkpoint"


@dataclass(frozen=True, slots=True)
class SetBatchSize:
    """Agent to job: use this batch size from the next step on (the job's ``on_batch_size`` hook applies it)."""

    batch_size: int
    seq: int | None = None
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
    seq: int | None = None
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


# -- checking what arrives -------------------------------------------------------------------------------------
_Check = Callable[[object], object]  # returns the value (an int as a float where a float is expected) or raises


class _Bad(Exception):
    """A field's value is not what it should be: ``expected`` says what it should be."""

    def __init__(self, expected: str) -> None:
        super().__init__(expected)
        self.expected = expected


def _integer(low: int, high: int) -> _Check:
    def check(value: object) -> object:
        # bool is an int in Python, but a JSON true is not a count
        if type(value) is not int or not low <= value <= high:
            raise _Bad(f"an integer from {low} to {high}")
        return value

    return check


def _seconds(value: object) -> object:
    # Compared before any conversion: float() of a huge JSON integer would overflow; NaN fails both comparisons.
    if (type(value) is not int and type(value) is not float) or not 0 <= value <= MAX_SECONDS:
        raise _Bad(f"a finite number of seconds from 0 to {MAX_SECONDS:g}")
    return float(value)


def _text(max_chars: int, *, printable: bool = False) -> _Check:
    def check(value: object) -> object:
        if not isinstance(value, str) or len(value) > max_chars:
            raise _Bad(f"a string of at most {max_chars} characters")
        try:
            value.encode("utf-8")  # JSON can carry a lone surrogate, which is no text and no file name
        except UnicodeEncodeError:
            raise _Bad("valid Unicode text") from None
        if printable and not value.isprintable():
            raise _Bad("printable text")
        return value

    return check


def _flag(value: object) -> object:
    if type(value) is not bool:
        raise _Bad("true or false")
    return value


def _optional(check: _Check) -> _Check:
    def optional(value: object) -> object:
        return None if value is None else check(value)

    return optional


_ID = _text(MAX_TEXT_CHARS)
_RUN = _integer(0, MAX_COUNT)
_STEP = _integer(0, MAX_COUNT)
_MIB = _integer(0, MAX_MIB)
_SEQ = _optional(_integer(0, MAX_COUNT))  # a directive's number (gangs), or None

# Every field of every message, with its check (a test asserts that each message's fields are all here).
_FIELDS: dict[type[Any], dict[str, _Check]] = {
    Hello: {
        "job_id": _ID,
        "run": _RUN,
        "pid": _integer(0, MAX_COUNT),
        "secret": _text(MAX_TEXT_CHARS),
        "checkpoints": _flag,
    },
    StepReport: {
        "job_id": _ID,
        "run": _RUN,
        "step": _STEP,
        "steps": _STEP,
        "step_time_s": _seconds,
        "busy_s": _seconds,
        "mem_peak_mib": _MIB,
        "mem_cap_mib": _optional(_MIB),
        "batch_size": _optional(_integer(1, MAX_COUNT)),
        "mem_need_mib": _optional(_MIB),
        "mem_mode": _optional(_text(64, printable=True)),
        "steps_left": _optional(_STEP),
    },
    Paused: {"job_id": _ID, "run": _RUN, "step": _STEP, "evicted": _flag, "took_s": _optional(_seconds)},
    Resumed: {"job_id": _ID, "run": _RUN, "step": _STEP, "took_s": _optional(_seconds)},
    Checkpointed: {"job_id": _ID, "run": _RUN, "step": _STEP, "path": _text(MAX_PATH_CHARS)},
    Pause: {"reason": _text(MAX_TEXT_CHARS), "evict": _flag, "seq": _SEQ},
    Resume: {"seq": _SEQ},
    Checkpoint: {"reason": _text(MAX_TEXT_CHARS), "seq": _SEQ},
    SetBatchSize: {"batch_size": _integer(1, MAX_COUNT), "seq": _SEQ},
    SetLimits: {"gpu_milli": _optional(_integer(0, 1000)), "mem_mib": _optional(_MIB), "seq": _SEQ},
}


def _shown(value: object) -> str:
    """A bad value as an error message shows it: cut short, since it comes from the other side."""
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def decode(line: bytes | str) -> Message:
    """Parse and check one line (see "Local channel" above); raises :class:`~corral.core.errors.InputError`
    naming the message type, the field and what was expected."""
    if len(line) > MAX_MESSAGE_BYTES:
        raise InputError(f"message of {len(line)} bytes exceeds {MAX_MESSAGE_BYTES}", file="<channel>")
    try:
        body = json.loads(line)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise InputError(f"message is not JSON: {e}", file="<channel>") from None
    if not isinstance(body, dict):
        raise InputError("message is not a JSON object", file="<channel>")
    kind = body.pop("type", None)
    cls = _TYPES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise InputError(
            f"unknown message type {_shown(repr(kind))}; expected one of {sorted(_TYPES)}", file="<channel>"
        )
    checks = _FIELDS[cls]
    unknown = set(body) - set(checks)
    if unknown:
        shown = sorted(_shown(repr(name)) for name in unknown)[:5]
        raise InputError(f"{kind} message: unknown fields {shown}", file="<channel>")
    values: dict[str, object] = {}
    for f in fields(cls):
        if f.name not in body:
            if f.default is MISSING:
                raise InputError(f"{kind} message: missing field {f.name!r}", file="<channel>", column=f.name)
            continue
        try:
            values[f.name] = checks[f.name](body[f.name])
        except _Bad as e:
            raise InputError(
                f"{kind} message: bad value",
                file="<channel>",
                column=f.name,
                expected=e.expected,
                got=_shown(body[f.name]),
            ) from None
    message: Message = cls(**values)
    return message


# -- gangs ----------------------------------------------------------------------------------------------------
def gang_env(
    nodes: Sequence[str], node_rank: int, gpus_per_node: int, master_port: int, gang_port: int
) -> dict[str, str]:
    """The gang variables (:data:`GANG_ENV`, see "Gangs across nodes") for the process of rank ``node_rank`` of a
    gang on ``nodes``: the nodes' addresses in rank order (by node id; stand-in nodes on one machine repeat one
    address), ``gpus_per_node`` GPUs each, ``torch.distributed``'s rendezvous at ``master_port`` and
    :mod:`corral.job`'s gang store at ``gang_port``, both on ``nodes[0]``. The agent adds them to the contract's
    variables of each rank; raises ``ValueError`` on arguments no gang can have."""
    if not nodes or any(not isinstance(a, str) or not a.strip() for a in nodes):
        raise ValueError(f"a gang needs at least one node address, each a non-empty string; got {list(nodes)!r}")
    if not 0 <= node_rank < len(nodes):
        raise ValueError(f"node_rank {node_rank} is not a rank of a gang of {len(nodes)} nodes")
    if gpus_per_node < 1:
        raise ValueError(f"gpus_per_node must be at least 1, not {gpus_per_node}")
    for name, port in (("master_port", master_port), ("gang_port", gang_port)):
        if not 1 <= port <= 65535:
            raise ValueError(f"{name} {port} is not a TCP port (1 to 65535)")
    if master_port == gang_port:
        raise ValueError(f"master_port and gang_port must differ (both {master_port})")
    first = nodes[0].strip()
    return {
        ENV_MASTER_ADDR: first,
        ENV_MASTER_PORT: str(master_port),
        ENV_WORLD_SIZE: str(len(nodes) * gpus_per_node),
        ENV_NNODES: str(len(nodes)),
        ENV_NODE_RANK: str(node_rank),
        ENV_LOCAL_WORLD_SIZE: str(gpus_per_node),
        ENV_GANG_ADDR: first,
        ENV_GANG_PORT: str(gang_port),
    }
