"""The node agent: starts, signals, pauses and watches the processes of the jobs placed on one node, and carries
the local channel between those jobs and the controller (AntMan's local coordinator sits on top of it).

One agent runs per node; on one machine it lives inside the controller process. The controller calls its
methods (:meth:`Agent.launch`, :meth:`Agent.preempt`, ...), which return at once, and hears back through one
callback, ``on_report``, called from the agent's thread with :data:`AgentReport` values in the order things
happened for each run (``ProcessStarted`` before anything the job says, ``ProcessExited`` last).

How a run is carried out (the job-side view is in :mod:`corral.core.contract`):

- each run gets ``STATE_DIR/runs/<job>/<run>/``; the process started is the shim (:mod:`corral.live.agent.shim`), in a
  new session whose group id is its pid, and the shim starts the job's command and leaves ``pid``, ``child`` and
  ``exit.json`` records there (the agent adds ``launch.json``, ``secret`` and ``spawned``, the shim's pid as soon
  as it is known), so a restarted agent can :meth:`~Agent.adopt` a run that outlived it;
- the job's output goes to ``STATE_DIR/tenants/<tenant>/logs/<job>.log``, appended across runs with a marker line
  per start and end; its checkpoints to ``STATE_DIR/tenants/<tenant>/checkpoints/<job>/``;
- the job's environment is the contract's (:mod:`corral.core.contract`, "Environment"): a short allow-list of
  the server's variables, its user's ``HOME``/``USER``/``LOGNAME``, its request's ``env`` and the contract's
  variables, never the server's tokens or settings;
- the channel authenticates each run: the agent makes a random secret per run (kept in the run's record, so a
  restarted agent still knows it), gives it to the job in ``CORRAL_RUN_SECRET`` and drops a connection whose
  hello names a run with another secret, or comes from another Unix user than the run's. A bad message from an
  identified run is dropped and counted; after :data:`~corral.core.contract.MAX_BAD_MESSAGES` the run is
  disconnected for good (it keeps running, controlled by signals);
- a preemption asks the job to checkpoint (a :class:`~corral.core.contract.Checkpoint` over the channel when the
  job is connected, else ``SIGTERM`` to its main process) and ``SIGKILL`` s the process group after the run's
  grace period; when the shim is gone, whatever is left of its group is killed too, so nothing lingers on a GPU;
- a launch waits until the job's previous run and every process being stopped on its GPUs have exited, so a
  preempted job's memory is free before the next one starts.

Files and directories (see the trust model in ``docs/live.md``): every file the agent writes is 0600 and every
directory 0700, also in a state directory that existed before (:meth:`Agent.start` tightens it). A tenant with a
``run_as`` user (the server is root) gets its runs started as that user (the shim drops privileges for the job's
process only, and keeps writing the run's records as root), its checkpoint directories owned by that user and its
log files readable by it. Then the state directory, ``tenants/``, the tenant's own directory and its ``logs/``
and ``checkpoints/`` become 0711 (others may pass through, not list), and the channel's socket 0666 (each run
proves who it is with its secret); everything else stays 0700/0600, and each of those users can read only its own
tenant's files.

One thread does all the waiting (a selector over the channel socket, its connections and a pidfd per process,
with a 0.2 s ``/proc`` poll where pidfds are not available) and all the spawning, so reports come out in order.
Public methods only change state under a lock and wake that thread.

Job ids reach file names escaped (:func:`safe_name`): any character outside ``[A-Za-z0-9._-]`` becomes ``%XX``,
and a leading dot too, so an id like ``../x`` can never leave the state directory.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import logging
import math
import os
import pwd
import secrets
import selectors
import shlex
import signal
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from corral.core import contract
from corral.core.errors import ConfigError, InputError
from corral.live.agent.gpus import GpuInfo, GpuSampler, ProcessSample
from corral.live.agent.messages import (
    AgentReport,
    JobMeasured,
    JobReported,
    JobSaid,
    LaunchRequest,
    ProcessExited,
    ProcessStarted,
    StopRequest,
)
from corral.live.agent.processes import (
    PRIVATE_FILE,
    describe_exit,
    ensure_dir,
    give_tree,
    is_alive,
    now_text,
    open_log,
    open_pidfd,
    proc_stat,
    read_chunk,
    read_exit,
    read_pid,
    read_secret,
    signame,
    write_marker,
)
from corral.live.agent.shim import start_ticks, write_atomic
from corral.live.agent.zygote import Zygote, ZygoteUnavailable, warm_form

log = logging.getLogger("corral.live.agent")

SHIM_PATH = Path(__file__).with_name("shim.py")
POLL_S = 0.2  # how often a process is looked at in /proc when pidfds are not available
_READY_POLL_S = 0.01  # how often a held-back SIGTERM looks for its shim to be ready (its first ~0.1 s only)
_MAX_SOCKET_PATH = 100  # sun_path holds 108 bytes; keep a margin
_MAX_OUTBUF = 1 << 20  # a job that reads none of its directives for this long is dropped
_SAFE_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")
_MAX_NAME = 200
_MAX_UNIDENTIFIED = 64  # connections that have not said hello yet; beyond this the oldest is closed
_LOG_EVERY_S = 10.0  # a repeated complaint about one run is logged at most this often
_TENANTS = "tenants"
_PRIVATE_DIR = 0o700
_PASSAGE_DIR = 0o711  # others may pass through (to their own files), not list

# Popen objects of processes left running by a closed agent: kept referenced so the interpreter does not warn
# that they are "still running" when the objects are collected (they are meant to outlive the agent).
_DETACHED: list[subprocess.Popen[bytes]] = []


def safe_name(job_id: str) -> str:
    """``job_id`` as one safe file name: ``[A-Za-z0-9._-]`` kept, every other byte ``%XX``, a leading dot escaped
    (no ``.``/``..``), ids too long for a file name cut and suffixed with a hash. Distinct ids give distinct
    names. Raises ``ValueError`` for an empty id."""
    if not isinstance(job_id, str) or not job_id:
        raise ValueError(f"a job id must be a non-empty string, got {job_id!r}")
    name = "".join(c if c in _SAFE_CHARS else "".join(f"%{b:02X}" for b in c.encode()) for c in job_id)
    if name.startswith("."):
        name = "%2E" + name[1:]
    if len(name) > _MAX_NAME:
        name = name[: _MAX_NAME - 17] + "~" + hashlib.sha256(job_id.encode()).hexdigest()[:16]
    return name


# -- internal state -------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class _User:
    """Who a run runs as: its Unix user's name, ids and home; ``switch`` when the shim must change to it."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]
    home: str | None
    switch: bool


@dataclass(slots=True, eq=False)
class _Conn:
    sock: socket.socket
    peer_uid: int | None = None  # the connecting process's uid (SO_PEERCRED), where the system tells
    accepted_at: float = 0.0
    inbuf: bytearray = field(default_factory=bytearray)
    outbuf: bytearray = field(default_factory=bytearray)
    key: tuple[str, int] | None = None
    writing: bool = False  # registered for EVENT_WRITE
    dead: bool = False  # to be closed by the loop thread


@dataclass(slots=True, eq=False)
class _Run:
    job_id: str
    run: int
    gpus: tuple[int, ...]
    grace_s: float
    req: LaunchRequest | None  # None for an adopted run
    tenant: str
    secret: str | None  # what its hello must carry; None (a run of an older agent, adopted): no hello accepted
    uid: int  # the Unix user its job runs as: a hello from another one is refused
    state: Literal["pending", "spawning", "running"] = "pending"
    adopted: bool = False
    pid: int | None = None  # the shim's, = the process group id
    ticks: int | None = None  # the shim's start time
    popen: subprocess.Popen[bytes] | None = None
    pidfd: int | None = None
    registered: bool = False  # pidfd in the selector
    requested: StopRequest | None = None
    stop_seq: int | None = None  # the ``seq`` of the Checkpoint directive that asks it to stop (a gang's rank)
    term_deferred: bool = False  # SIGTERM held back until the shim forwards signals (its pid file exists)
    kill_at: float | None = None  # time.monotonic() deadline for SIGKILL
    killed: bool = False
    paused_by: Literal["channel", "signal"] | None = None
    held: bool = False  # paused before it started: not spawned until resumed; paused once up if already spawning
    # The controller's last word on pausing it, and the seq of its last resume: a job paused over the channel by an
    # earlier agent that reconnects after this one was told to resume it says Paused, and is sent Resume again.
    told: Literal["pause", "resume"] | None = None
    resume_seq: int | None = None
    conn: _Conn | None = None
    bad_messages: int = 0  # bad messages received from it, over all its connections
    cut_off: bool = False  # disconnected for sending too many: its hellos are refused

    @property
    def key(self) -> tuple[str, int]:
        return (self.job_id, self.run)


def _peer_uid(sock: socket.socket) -> int | None:
    """The uid of the process at the other end of a Unix socket (Linux ``SO_PEERCRED``), or ``None``."""
    option = getattr(socket, "SO_PEERCRED", None)
    if option is None:
        return None
    try:
        _, uid, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, option, struct.calcsize("3i")))
    except (OSError, struct.error):
        return None
    return int(uid)


def _user_named(name: str) -> _User:
    """A run_as user as the shim takes it: uid, primary gid, every group it belongs to, home."""
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        raise _SpawnError(f"the run_as user {name!r} does not exist on this node") from None
    if pw.pw_uid == 0:
        raise _SpawnError(f"the run_as user {name!r} is root; a tenant's jobs must run unprivileged")
    groups = tuple(sorted(set(os.getgrouplist(name, pw.pw_gid))))
    return _User(name, pw.pw_uid, pw.pw_gid, groups, pw.pw_dir or None, switch=True)


def _own_user() -> _User:
    """The agent's own user (runs of tenants without run_as run as it)."""
    uid, gid = os.geteuid(), os.getegid()
    try:
        pw = pwd.getpwuid(uid)
    except KeyError:  # no passwd entry (a container): what the environment says
        env_user = os.environ.get("USER") or os.environ.get("LOGNAME") or str(uid)
        return _User(env_user, uid, gid, (), os.environ.get("HOME"), switch=False)
    return _User(pw.pw_name, uid, gid, (), pw.pw_dir or None, switch=False)


class _Complaints:
    """Log lines about one run (or one claimed run) at most every :data:`_LOG_EVERY_S`, saying how many were
    held back meanwhile: a job that floods the channel must not flood the server's log too."""

    def __init__(self) -> None:
        self._last: dict[tuple[str, object, int], tuple[float, int]] = {}

    def warn(self, key: tuple[str, object, int], message: str, *args: object, level: int = logging.WARNING) -> None:
        now = time.monotonic()
        last, held = self._last.get(key, (-math.inf, 0))
        if now - last < _LOG_EVERY_S:
            self._last[key] = (last, held + 1)
            return
        if len(self._last) > 4096:  # keys can come from claims of unknown runs: keep it bounded
            self._last.clear()
        self._last[key] = (now, 0)
        if held:
            message += f" ({held} more like it in the last {now - last:.0f} s)"
        log.log(level, message, *args)

    def forget(self, job_id: str, run: int) -> None:
        for key in [k for k in self._last if k[1:] == (job_id, run)]:
            del self._last[key]


# -- the agent ------------------------------------------------------------------------------------------------
class Agent:
    """The agent of one node. See the module docstring; every public method is thread-safe and returns at once
    (:meth:`start` and :meth:`close` excepted), and none raises into the controller for a job's sake."""

    def __init__(
        self,
        state_dir: Path,
        gpus: Sequence[GpuInfo],
        on_report: Callable[[AgentReport], None],
        *,
        report_interval_s: float = contract.DEFAULT_REPORT_INTERVAL_S,
        python: str = sys.executable,
        sampler: GpuSampler | None = None,
        checkpoint_root: Path | None = None,
        warm: bool = False,
    ) -> None:
        self._state_dir = Path(state_dir).absolute()
        # Where checkpoints live: the state directory, or a directory every node shares (a gang's rank 0 writes
        # the checkpoint that every rank, on whichever nodes the job runs next, resumes from).
        self._checkpoint_root = Path(checkpoint_root).absolute() if checkpoint_root is not None else self._state_dir
        self._gpus = tuple(gpus)
        # NVML sampling of the jobs' processes, on real GPUs only (stand-ins have nothing to sample).
        if sampler is None and any(not g.stand_in for g in self._gpus):
            sampler = GpuSampler(self._gpus)
        self._sampler = sampler
        self._sampler_thread: threading.Thread | None = None
        self._sampler_stop = threading.Event()
        self._on_report = on_report
        self._report_interval_s = report_interval_s
        self._python = python
        self._lock = threading.RLock()
        self._runs: dict[tuple[str, int], _Run] = {}
        self._pending: list[tuple[str, int]] = []  # launch order
        self._finished: set[tuple[str, int]] = set()  # reported as exited; later requests for them are no-ops
        self._outbox: list[AgentReport] = []
        self._conns: set[_Conn] = set()
        self._selector: selectors.BaseSelector | None = None
        self._listener: socket.socket | None = None
        self._listener_ino: int | None = None
        self._wake_r = self._wake_w = -1
        self._thread: threading.Thread | None = None
        self._closing = False
        self._closed = False
        self._socket_path = self._choose_socket_path()
        # Warm starts (corral.live.agent.zygote): the process runs that ask for one are forked from.
        zygote_socket = self._socket_path.with_name(self._socket_path.stem + ".zygote.sock")
        self._zygote = Zygote(python, zygote_socket, self._state_dir / "zygote.log") if warm else None
        self._own_user = _own_user()
        self._tenant_of: dict[str, str] = {}  # job id -> tenant, for the paths of its files
        self._open_tenants: set[str] = set()  # tenants whose run_as users may pass through to their files
        self._complaints = _Complaints()

    # -- paths ------------------------------------------------------------------------------------------------
    @property
    def gpus(self) -> tuple[GpuInfo, ...]:
        return self._gpus

    @property
    def state_dir(self) -> Path:
        return self._state_dir

    @property
    def socket_path(self) -> Path:
        """The channel's Unix socket: ``STATE_DIR/agent.sock``, or a short path in the temp directory when that
        one is too long for a Unix socket address."""
        return self._socket_path

    def tenant_dir(self, tenant: str) -> Path:
        """``STATE_DIR/tenants/<tenant>``: the tenant's ``logs/`` and ``checkpoints/``."""
        return self._state_dir / _TENANTS / safe_name(tenant)

    def log_path(self, job_id: str, tenant: str | None = None) -> Path:
        """The job's log: ``STATE_DIR/tenants/<tenant>/logs/<job>.log``. Without ``tenant``, the one the agent
        knows for the job (from its launches, or the log already there)."""
        name = f"{safe_name(job_id)}.log"
        tenant = tenant or self._tenant(job_id, "logs", name)
        if tenant is None:
            return self._state_dir / "logs" / name  # where an earlier corral kept it (if it did)
        return self.tenant_dir(tenant) / "logs" / name

    def read_log(self, job_id: str, offset: int, size: int) -> tuple[bytes, int]:
        """Up to ``size`` bytes of the job's log from ``offset``, and the log's size: how the controller reads a
        log on this node, whichever machine it runs on."""
        return read_chunk(self.log_path(job_id), offset, size)

    def checkpoint_dir(self, job_id: str, tenant: str | None = None) -> Path:
        """The job's checkpoint directory, kept across its runs: ``STATE_DIR/tenants/<tenant>/checkpoints/<job>``
        (``tenant`` as for :meth:`log_path`)."""
        name = safe_name(job_id)
        tenant = tenant or self._tenant(job_id, "checkpoints", name)
        if tenant is None:
            return self._state_dir / "checkpoints" / name  # where an earlier corral kept it (if it did)
        return self._checkpoints_of(tenant) / name

    def _checkpoints_of(self, tenant: str) -> Path:
        """A tenant's checkpoint directory: under the state directory, or under the shared checkpoint root."""
        return self._checkpoint_root / _TENANTS / safe_name(tenant) / "checkpoints"

    def _tenant(self, job_id: str, sub: str, name: str) -> str | None:
        tenant = self._tenant_of.get(job_id)
        if tenant is not None:
            return tenant
        with contextlib.suppress(OSError):  # a job of an earlier server life: look for its file
            for entry in os.scandir(self._state_dir / _TENANTS):
                if os.path.lexists(os.path.join(entry.path, sub, name)):
                    # a directory's name is the tenant's name: tenant names need no escaping (see config)
                    self._tenant_of[job_id] = entry.name
                    return entry.name
        return None

    def run_dir(self, job_id: str, run: int) -> Path:
        return self._state_dir / "runs" / safe_name(job_id) / str(int(run))

    def _choose_socket_path(self) -> Path:
        path = self._state_dir / "agent.sock"
        if len(os.fsencode(path)) <= _MAX_SOCKET_PATH:
            return path
        digest = hashlib.sha256(os.fsencode(self._state_dir)).hexdigest()[:16]
        short = Path(tempfile.gettempdir()) / f"corral-{os.getuid()}-{digest}.sock"
        if len(os.fsencode(short)) > _MAX_SOCKET_PATH:
            raise ConfigError(f"state directory {self._state_dir} is too long a path for the agent's Unix socket")
        return short

    # -- lifecycle --------------------------------------------------------------------------------------------
    def start(self) -> None:
        """Create the state directories, listen on the channel socket (replacing a stale one), start the thread.
        Raises :class:`ConfigError` if another agent already listens there or the directory is unusable."""
        with self._lock:
            if self._closed or self._thread is not None:
                raise RuntimeError("an Agent is started once")
            try:
                self._make_private()
                self._listener = self._bind()
                self._listener_ino = os.stat(self._socket_path).st_ino
            except OSError as e:
                raise ConfigError(f"the agent cannot use its state directory {self._state_dir}: {e}") from None
            self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
            self._selector = selectors.DefaultSelector()
            self._selector.register(self._listener, selectors.EVENT_READ, ("listen", None))
            self._selector.register(self._wake_r, selectors.EVENT_READ, ("wake", None))
            if self._zygote is not None:
                self._zygote.start()  # ready in about a second (it imports torch); runs before that start cold
            self._thread = threading.Thread(target=self._loop, name="corral-agent", daemon=True)
            self._thread.start()
            if self._sampler is not None:
                self._sampler_thread = threading.Thread(target=self._sample_loop, name="corral-nvml", daemon=True)
                self._sampler_thread.start()

    def _make_private(self) -> None:
        """The state directory 0700 and its files 0600, also when it existed before with looser modes (the store's
        database, the admin token and the server file are made by others before the agent starts: tightened here
        too). Tenants' directories become passable again when one of their run_as runs starts or is adopted."""
        sd = self._state_dir
        sd.mkdir(parents=True, exist_ok=True, mode=_PRIVATE_DIR)
        ensure_dir(sd, _PRIVATE_DIR, top=True)
        euid = os.geteuid()
        for entry in os.scandir(sd):
            st = entry.stat(follow_symlinks=False)
            if euid not in (0, st.st_uid):
                continue
            if stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) != PRIVATE_FILE:
                os.chmod(entry.path, PRIVATE_FILE)
            elif stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) != _PRIVATE_DIR:
                os.chmod(entry.path, _PRIVATE_DIR)  # runs/, tenants/, and an earlier corral's logs/, checkpoints/
        ensure_dir(sd / "runs", _PRIVATE_DIR)
        ensure_dir(sd / _TENANTS, _PRIVATE_DIR)
        for entry in os.scandir(sd / _TENANTS):
            if entry.is_dir(follow_symlinks=False):
                for sub in ("", "logs", "checkpoints"):
                    with contextlib.suppress(FileNotFoundError):
                        ensure_dir(Path(entry.path, sub), _PRIVATE_DIR)

    def _open_for(self, tenant: str) -> None:
        """Let a run_as tenant's user pass through to its own checkpoints and logs and reach the channel's socket
        (see the module docstring); nothing becomes listable or readable by it that is not its own."""
        if tenant in self._open_tenants:
            return
        tdir = self.tenant_dir(tenant)
        ensure_dir(self._state_dir, _PASSAGE_DIR, top=True)
        for path in (self._state_dir / _TENANTS, tdir, tdir / "logs", tdir / "checkpoints"):
            ensure_dir(path, _PASSAGE_DIR)
        os.chmod(self._socket_path, 0o666)  # anyone may connect; a run's secret says who may speak
        self._open_tenants.add(tenant)

    def _bind(self) -> socket.socket:
        path = str(self._socket_path)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            pass
        else:
            if not stat.S_ISSOCK(st.st_mode):
                raise ConfigError(f"{path} exists and is not a socket; remove it or use another state directory")
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.settimeout(1.0)
                probe.connect(path)
            except OSError:
                os.unlink(path)  # stale: left by an agent that is gone
            else:
                raise ConfigError(f"another corral agent is listening on {path}")
            finally:
                probe.close()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(path)
            os.chmod(path, 0o600)  # only the agent's user may talk to it
            listener.listen(128)
            listener.setblocking(False)
        except OSError:
            listener.close()
            raise
        return listener

    def close(self) -> None:
        """Stop the thread and close the channel; job processes are left running (a restarted controller adopts
        them). Launches not yet spawned are forgotten, and so are pending kills. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = self._closing = True
            self._wake()
        self._sampler_stop.set()
        if self._zygote is not None:
            self._zygote.close()
        if self._sampler_thread is not None:
            self._sampler_thread.join(timeout=10.0)
        if self._sampler is not None:
            self._sampler.close()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=10.0)
            if thread.is_alive():
                log.warning("the agent's thread did not stop within 10 s (an on_report callback blocking?)")
        with self._lock:
            for conn in list(self._conns):
                self._close_conn(conn)
            for run in self._runs.values():
                if run.pidfd is not None:
                    self._unwatch(run)
                if run.popen is not None:
                    _DETACHED.append(run.popen)
                    run.popen = None
            self._runs.clear()
            self._pending.clear()
            if self._selector is not None:
                self._selector.close()
            if self._listener is not None:
                self._listener.close()
                with contextlib.suppress(OSError):  # unlink it only if it is still ours
                    if os.stat(self._socket_path).st_ino == self._listener_ino:
                        os.unlink(self._socket_path)
            for fd in (self._wake_r, self._wake_w):
                if fd >= 0:
                    os.close(fd)
            self._wake_r = self._wake_w = -1

    def _wake(self) -> None:
        if self._wake_w >= 0:
            with contextlib.suppress(BlockingIOError):
                os.write(self._wake_w, b"\0")

    # -- controller-facing requests ---------------------------------------------------------------------------
    def launch(self, req: LaunchRequest) -> None:
        """Start a run as soon as its job's previous run and every process being stopped on its GPUs have exited;
        then report :class:`ProcessStarted`. Problems are reported as :class:`ProcessExited`, never raised."""
        with self._lock:
            if self._closed:
                log.warning("launch of job %r run %d on a closed agent ignored", req.job_id, req.run)
                return
            key = (req.job_id, req.run)
            if key in self._runs or key in self._finished:
                log.warning("job %r run %d was already launched here; duplicate launch ignored", req.job_id, req.run)
                return
            problem = self._check(req)
            if problem is not None:
                self._report_exit(req.job_id, req.run, None, None, None, f"cannot start the job: {problem}")
                return
            secret = secrets.token_hex(contract.SECRET_BYTES)
            uid = self._own_user.uid  # until the spawn resolves its run_as user
            self._runs[key] = _Run(
                req.job_id, req.run, tuple(req.gpus), float(req.grace_s), req, req.tenant, secret, uid
            )
            self._tenant_of[req.job_id] = req.tenant
            self._pending.append(key)
            self._wake()

    def _check(self, req: LaunchRequest) -> str | None:
        try:
            safe_name(req.job_id)
        except ValueError as e:
            return str(e)
        if not isinstance(req.tenant, str) or not req.tenant or not all(c in _SAFE_CHARS for c in req.tenant):
            return f"the tenant must be a name of letters, digits, '.', '_' or '-', got {req.tenant!r}"
        if req.tenant.startswith("."):
            return f"a tenant name cannot start with a dot, got {req.tenant!r}"
        if req.run_as is not None and (not isinstance(req.run_as, str) or not req.run_as):
            return f"run_as must be a user name, got {req.run_as!r}"
        if isinstance(req.run, bool) or not isinstance(req.run, int) or req.run < 0:
            return f"run must be a non-negative integer, got {req.run!r}"
        if not req.command or not all(isinstance(a, str) and "\0" not in a for a in req.command):
            return f"the command must be a non-empty list of strings, got {req.command!r}"
        if not req.command[0]:
            return "the command's program name is empty"
        bad = [g for g in req.gpus if not 0 <= g < len(self._gpus)]
        if bad or len(set(req.gpus)) != len(req.gpus):
            return f"GPUs {list(req.gpus)} are not distinct indices of this node's {len(self._gpus)} GPUs"
        if not req.grace_s >= 0:
            return f"grace_s must be >= 0, got {req.grace_s!r}"
        return None

    def preempt(self, job_id: str, run: int, *, seq: int | None = None) -> None:
        """Ask the run to checkpoint and exit (:class:`~corral.core.contract.Checkpoint` if connected, else
        ``SIGTERM``); ``SIGKILL`` its group after its grace period. Its exit comes with ``requested="preempt"``."""
        self._stop(job_id, run, "preempt", seq)

    def cancel(self, job_id: str, run: int) -> None:
        """Stop the run (``SIGTERM``, then ``SIGKILL`` after its grace period); a launch not yet spawned is
        dropped. Its exit comes with ``requested="cancel"``."""
        self._stop(job_id, run, "cancel")

    def _stop(self, job_id: str, run_no: int, how: StopRequest, seq: int | None = None) -> None:
        with self._lock:
            run = self._lookup(job_id, run_no, how)
            if run is None:
                return
            if seq is not None:
                run.stop_seq = seq
            if run.state == "pending":
                self._pending.remove(run.key)
                del self._runs[run.key]
                word = "preempted" if how == "preempt" else "cancelled"
                self._report_exit(job_id, run_no, None, None, how, f"{word} before it started")
                self._wake()  # a launch may have waited on this one
                return
            if run.requested in ("cancel", how):
                return  # already being stopped at least as hard
            first = run.requested is None
            run.requested = how
            if run.state == "running":
                self._begin_stop(run, signal_only=not first)

    def _begin_stop(self, run: _Run, *, signal_only: bool = False) -> None:
        """Ask a running process to stop (lock held) and set its kill deadline."""
        asked = False
        if run.requested == "preempt" and not signal_only:
            asked = self._send(run, contract.Checkpoint(reason="preempt", seq=run.stop_seq))
        if not asked:
            self._signal_shim(run, signal.SIGTERM)
        if run.paused_by == "signal":  # a stopped group cannot act on SIGTERM
            self._signal_group(run, signal.SIGCONT)
            run.paused_by = None
        deadline = time.monotonic() + run.grace_s
        run.kill_at = deadline if run.kill_at is None else min(run.kill_at, deadline)
        self._wake()

    def pause(self, job_id: str, run: int, *, evict: bool = False, seq: int | None = None) -> None:
        """Pause the run: :class:`~corral.core.contract.Pause` if connected (at a step boundary; with ``evict``
        the job moves its state to host memory and gives its GPU memory back, else keeps it), else ``SIGSTOP`` to
        its process group (GPU memory kept either way). A run whose launch still waits is held: not started until
        resumed."""
        with self._lock:
            r = self._lookup(job_id, run, "pause")
            if r is None or r.paused_by is not None or r.requested is not None:
                return
            r.told = "pause"
            if r.state != "running":
                # Its launch waits (for the job's previous run to exit, or for GPUs being freed), or its process
                # is being started: it must not run while the controller counts it paused.
                r.held = True
                return
            if self._send(r, contract.Pause(reason="evict" if evict else "pause", evict=evict, seq=seq)):
                r.paused_by = "channel"
            elif self._signal_group(r, signal.SIGSTOP):
                r.paused_by = "signal"

    def resume(self, job_id: str, run: int, *, seq: int | None = None) -> None:
        """Resume a paused run: :class:`~corral.core.contract.Resume` if it was paused over the channel and is
        still connected, else ``SIGCONT`` to its process group."""
        with self._lock:
            r = self._lookup(job_id, run, "resume")
            if r is None:
                return
            r.told, r.resume_seq = "resume", seq
            if r.held:
                r.held = False
                self._wake()  # it may start now
                return
            if r.state != "running":
                return
            if not (r.paused_by == "channel" and self._send(r, contract.Resume(seq=seq))):
                self._signal_group(r, signal.SIGCONT)
            r.paused_by = None

    def send(self, job_id: str, run: int, message: contract.SetBatchSize | contract.SetLimits) -> bool:
        """Send a directive to a connected job; ``False`` if the run is not connected."""
        with self._lock:
            r = self._runs.get((job_id, run))
            return r is not None and r.state == "running" and self._send(r, message)

    def _lookup(self, job_id: str, run: int, what: str, *, running: bool = False) -> _Run | None:
        r = self._runs.get((job_id, run))
        if r is None:
            if (job_id, run) not in self._finished:
                log.warning("%s: job %r run %d is not known to this agent", what, job_id, run)
                if what in ("preempt", "cancel"):
                    # The controller waits for an exit: say there is nothing to wait for.
                    how: StopRequest = "preempt" if what == "preempt" else "cancel"
                    self._report_exit(job_id, run, None, None, how, "no such process on this node")
            return None
        if running and r.state != "running":
            log.warning("%s: job %r run %d has not started yet; ignored", what, job_id, run)
            return None
        return r

    def processes(self) -> list[tuple[str, int]]:
        """The runs the agent is responsible for: waiting to start, running, or being stopped."""
        with self._lock:
            return list(self._runs)

    # -- adopting runs after a restart ------------------------------------------------------------------------
    def adopt(self, job_id: str, run: int, grace_s: float | None = None) -> bool:
        """Take over a run started by an earlier agent. If it ended, report its exit at once; if its shim still
        runs (same pid and start time), watch it and report its exit later; ``True`` in both cases. ``False``
        when there is no live process and no record (the controller requeues the job from its checkpoint).
        ``grace_s`` defaults to the one the run was launched with."""
        try:
            rd = self.run_dir(job_id, run)
        except ValueError:
            return False
        with self._lock:
            key = (job_id, run)
            if key in self._runs:
                return True
            record = read_exit(rd)
            pid_rec = read_pid(rd / "pid") or read_pid(rd / "spawned")
            launched = self._read_launch(rd)
            tenant = launched.get("tenant")
            if isinstance(tenant, str) and tenant:
                self._tenant_of[job_id] = tenant
            if record is None and pid_rec is not None and is_alive(*pid_rec):
                pid, ticks = pid_rec
                try:
                    pidfd = open_pidfd(pid)
                except ProcessLookupError:
                    pidfd = None
                    alive = False
                else:
                    alive = is_alive(pid, ticks)  # again: the pidfd must be for the shim, not a reused pid
                if alive:
                    gpus = tuple(int(g) for g in launched.get("gpus", ()))
                    grace = grace_s if grace_s is not None else float(launched.get("grace_s", contract.DEFAULT_GRACE_S))
                    uid = launched.get("uid")
                    r = _Run(
                        job_id,
                        run,
                        gpus,
                        grace,
                        None,
                        tenant if isinstance(tenant, str) and tenant else "",
                        read_secret(rd),
                        uid if type(uid) is int else self._own_user.uid,
                        state="running",
                        adopted=True,
                        pid=pid,
                        ticks=ticks,
                    )
                    r.pidfd = pidfd
                    if launched.get("run_as") is not None and r.tenant:
                        try:  # its job reconnects, and checkpoints, through the passable directories
                            self._open_for(r.tenant)
                        except OSError as e:
                            log.warning("job %r run %d: cannot open its tenant's directories: %s", job_id, run, e)
                    st = proc_stat(pid)
                    if st is not None and st[0] == "T":
                        r.paused_by = "signal"
                    self._runs[key] = r
                    self._finished.discard(key)
                    self._wake()
                    return True
                if pidfd is not None:
                    os.close(pidfd)
                record = read_exit(rd)  # it may have ended between the two looks
            if record is None:
                return False
            if pid_rec is not None and is_alive(*pid_rec):  # exit recorded, shim finishing: clear its group
                self._kill_group(pid_rec[0])
            code, sig = record
            detail = describe_exit(code, sig) + " (while no agent watched)"
            write_marker(self.log_path(job_id), f"run {run} ended {now_text()}: {detail}")
            self._report_exit(job_id, run, code, sig, None, detail)
            return True

    @staticmethod
    def _read_launch(rd: Path) -> dict[str, Any]:
        try:
            body = json.loads((rd / "launch.json").read_text())
        except (OSError, ValueError):
            return {}
        return body if isinstance(body, dict) else {}

    # -- signals and the channel (lock held) ------------------------------------------------------------------
    def _signal_shim(self, run: _Run, signum: int) -> bool:
        """Signal the shim (it forwards SIGTERM/SIGINT/SIGHUP to the job's main process). A SIGTERM that comes
        before the shim has its handlers would kill it, leaving no record: it is held back until then."""
        if run.pid is None:
            return False
        if signum == signal.SIGTERM and not self._shim_ready(run):
            run.term_deferred = True
            self._wake()
            return True
        try:
            if run.pidfd is not None:  # immune to pid reuse
                signal.pidfd_send_signal(run.pidfd, signum)
            else:
                os.kill(run.pid, signum)
        except (ProcessLookupError, PermissionError) as e:
            log.info("job %r run %d: %s not delivered (%s)", run.job_id, run.run, signame(signum), e)
            return False
        return True

    def _shim_ready(self, run: _Run) -> bool:
        return (self.run_dir(run.job_id, run.run) / "pid").exists()

    def _signal_group(self, run: _Run, signum: int) -> bool:
        if run.pid is None:
            return False
        try:
            os.killpg(run.pid, signum)
        except (ProcessLookupError, PermissionError) as e:
            log.info("job %r run %d: %s to its group not delivered (%s)", run.job_id, run.run, signame(signum), e)
            return False
        return True

    @staticmethod
    def _kill_group(pgid: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)

    def _send(self, run: _Run, message: contract.Message) -> bool:
        conn = run.conn
        if conn is None or conn.dead:
            return False
        data = contract.encode(message)
        if conn.outbuf:
            conn.outbuf += data
        else:
            try:
                sent = conn.sock.send(data, socket.MSG_NOSIGNAL)
            except BlockingIOError:
                sent = 0
            except OSError as e:
                log.info("job %r run %d: channel lost while sending (%s)", run.job_id, run.run, e)
                self._mark_dead(conn)
                return False
            if sent < len(data):
                conn.outbuf += data[sent:]
        if len(conn.outbuf) > _MAX_OUTBUF:
            log.warning("job %r run %d reads none of its directives; channel dropped", run.job_id, run.run)
            self._mark_dead(conn)
            return False
        if conn.outbuf:
            self._wake()
        return True

    def _mark_dead(self, conn: _Conn) -> None:
        conn.dead = True
        if conn.key is not None:
            r = self._runs.get(conn.key)
            if r is not None and r.conn is conn:
                r.conn = None
        self._wake()

    # -- reports (lock held) ----------------------------------------------------------------------------------
    def _report_exit(
        self, job_id: str, run: int, code: int | None, sig: int | None, requested: StopRequest | None, detail: str
    ) -> None:
        self._finished.add((job_id, run))
        self._outbox.append(ProcessExited(job_id, run, code, sig, requested, detail))
        self._wake()

    def _flush_reports(self) -> None:
        with self._lock:
            batch, self._outbox = self._outbox, []
        for report in batch:
            try:
                self._on_report(report)
            except Exception:
                log.exception("on_report failed on %r", report)

    # -- NVML sampling ----------------------------------------------------------------------------------------
    def _sample_loop(self) -> None:
        """Its own thread: NVML calls take milliseconds, which the channel's thread should not wait for."""
        sampler = self._sampler
        assert sampler is not None
        while not self._sampler_stop.wait(self._report_interval_s):
            try:
                samples = sampler.processes()
            except Exception:
                log.exception("agent: NVML sampling failed")
                continue
            if samples:
                self.measured(samples)

    def measured(self, samples: Sequence[ProcessSample]) -> None:
        """Attribute NVML's per-process samples to runs (a process belongs to the run whose process group it is
        in; NVML reports pids of this machine's PID namespace) and report each run's figures."""
        by_group: dict[int, list[ProcessSample]] = {}
        for sample in samples:
            try:
                pgid = os.getpgid(sample.pid)
            except OSError:  # gone since, or another PID namespace's
                continue
            by_group.setdefault(pgid, []).append(sample)
        with self._lock:
            for run in self._runs.values():
                mine = by_group.get(run.pid) if run.state == "running" and run.pid is not None else None
                if not mine:
                    continue
                per_gpu_mem: dict[int, int] = {}
                per_gpu_sm: dict[int, float] = {}
                for sample in mine:
                    if sample.mem_used_mib is not None:
                        per_gpu_mem[sample.index] = per_gpu_mem.get(sample.index, 0) + sample.mem_used_mib
                    if sample.sm_util is not None:
                        per_gpu_sm[sample.index] = per_gpu_sm.get(sample.index, 0.0) + sample.sm_util
                self._outbox.append(
                    JobMeasured(
                        run.job_id,
                        run.run,
                        max(per_gpu_mem.values()) if per_gpu_mem else None,
                        min(1.0, sum(per_gpu_sm.values()) / len(run.gpus or (0,))) if per_gpu_sm else None,
                    )
                )
            self._wake()

    # -- the thread -------------------------------------------------------------------------------------------
    def _loop(self) -> None:
        selector = self._selector
        assert selector is not None
        while True:
            with self._lock:
                if self._closing:
                    return
                self._sync_selector(selector)
                timeout = self._next_timeout()
            try:
                events = selector.select(timeout)
            except OSError as e:  # pragma: no cover - a selector that fails is a bug to see, not to spin on
                log.exception("agent selector failed: %s", e)
                time.sleep(POLL_S)
                continue
            for key, mask in events:
                kind, obj = key.data
                try:
                    if kind == "wake":
                        with contextlib.suppress(BlockingIOError):
                            while os.read(self._wake_r, 4096):
                                pass
                    elif kind == "listen":
                        self._accept()
                    elif kind == "conn":
                        self._on_conn_event(obj, mask)
                    elif kind == "proc":
                        with self._lock:
                            if obj.key in self._runs and self._runs[obj.key] is obj:
                                self._ended(obj)
                except Exception:
                    log.exception("agent: error handling %s event", kind)
            try:
                self._tick()
                self._spawn_ready()
            except Exception:
                log.exception("agent: error in its loop")
            self._flush_reports()

    def _sync_selector(self, selector: selectors.BaseSelector) -> None:
        for conn in list(self._conns):
            if conn.dead:
                self._close_conn(conn)
            elif bool(conn.outbuf) != conn.writing:
                conn.writing = bool(conn.outbuf)
                events = selectors.EVENT_READ | (selectors.EVENT_WRITE if conn.writing else 0)
                selector.modify(conn.sock, events, ("conn", conn))
        for run in self._runs.values():
            if run.pidfd is not None and not run.registered:
                selector.register(run.pidfd, selectors.EVENT_READ, ("proc", run))
                run.registered = True

    def _next_timeout(self) -> float | None:
        now = time.monotonic()
        timeout: float | None = None
        for run in self._runs.values():
            if run.kill_at is not None:
                wait = max(0.0, run.kill_at - now)
                timeout = wait if timeout is None else min(timeout, wait)
            if run.state == "running" and run.pidfd is None:
                timeout = POLL_S if timeout is None else min(timeout, POLL_S)
            if run.term_deferred:
                timeout = _READY_POLL_S if timeout is None else min(timeout, _READY_POLL_S)
        return timeout

    def _tick(self) -> None:
        with self._lock:
            now = time.monotonic()
            for run in list(self._runs.values()):
                if run.state != "running":
                    continue
                if run.term_deferred and not run.killed and self._shim_ready(run):
                    run.term_deferred = False
                    self._signal_shim(run, signal.SIGTERM)
                if run.kill_at is not None and run.kill_at <= now:
                    run.kill_at = None
                    run.killed = True
                    log.info("job %r run %d did not exit within %.1f s; killing it", run.job_id, run.run, run.grace_s)
                    self._signal_group(run, signal.SIGKILL)
                if run.pidfd is None and run.pid is not None and not is_alive(run.pid, run.ticks):
                    self._ended(run)

    # -- spawning ---------------------------------------------------------------------------------------------
    def _may_start(self, run: _Run) -> bool:
        if run.held:
            return False  # paused before it started
        gpus = set(run.gpus)
        for other in self._runs.values():
            if other is run:
                continue
            if other.job_id == run.job_id and other.run < run.run:
                return False  # the job's previous run is still here
            if other.requested is not None and other.state != "pending" and gpus.intersection(other.gpus):
                return False  # a process being stopped still holds one of the GPUs
        return True

    def _spawn_ready(self) -> None:
        with self._lock:
            ready = [self._runs[k] for k in self._pending if self._may_start(self._runs[k])]
            for run in ready:
                self._pending.remove(run.key)
                run.state = "spawning"
        for run in ready:
            self._spawn(run)

    def _warm_start(self, req: LaunchRequest, user: _User, env: Mapping[str, str]) -> bool | str:
        """Whether run ``req`` starts warm (forked from the zygote): True, False (not asked for), or why it starts
        cold although asked (a sentence for its log)."""
        if not req.warm:
            return False
        if self._zygote is None:
            return "this agent has no warm workers (warm_starts is off)"
        if user.switch:
            return f"it runs as user {user.name!r}; the warm workers run as {self._own_user.name!r}"
        if not self._zygote.ready():
            return "the warm workers are not ready yet (importing torch)"
        form = warm_form(req.command, env, self._zygote.python)
        return form if isinstance(form, str) else True

    def _job_env(self, req: LaunchRequest, user: _User, secret: str) -> dict[str, str]:
        """The job's environment, as :mod:`corral.core.contract` ("Environment") says: nothing else of the
        agent's own (its tokens, the variables the configuration names, its settings) reaches a job."""
        env = contract.passed_env(os.environ)
        env.update(USER=user.name, LOGNAME=user.name)
        if user.home is not None:
            env["HOME"] = user.home
        env.update(req.env)
        for name in contract.ALL_ENV:
            env.pop(name, None)  # only the agent sets these (the controller refuses them in requests too)
        gpus = [self._gpus[i] for i in req.gpus]
        stand_in = any(g.stand_in for g in gpus) if gpus else any(g.stand_in for g in self._gpus)
        env[contract.ENV_JOB_ID] = req.job_id
        env[contract.ENV_RUN] = str(req.run)
        env[contract.ENV_RUN_SECRET] = secret
        env[contract.ENV_AGENT_SOCKET] = str(self._socket_path)
        env[contract.ENV_CHECKPOINT_DIR] = str(self.checkpoint_dir(req.job_id, req.tenant))
        env[contract.ENV_GPU_MILLI] = str(req.gpu_milli)
        if req.mem_mib is not None:
            env[contract.ENV_GPU_MEM_MIB] = str(req.mem_mib)
        env[contract.ENV_STAND_IN] = "1" if stand_in else "0"
        env[contract.ENV_GPUS] = ",".join(str(i) for i in req.gpus)
        env[contract.ENV_GRACE_S] = str(float(req.grace_s))
        env[contract.ENV_REPORT_INTERVAL_S] = str(float(self._report_interval_s))
        if stand_in:
            env["CUDA_VISIBLE_DEVICES"] = ""
        else:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g.index) for g in gpus)
            env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # CUDA's default order is not NVML's; make the indices agree
        return env

    def _user_of(self, req: LaunchRequest) -> _User:
        if req.run_as is None:
            return self._own_user
        if os.geteuid() != 0:
            raise _SpawnError(f"run_as user {req.run_as!r}: the server must run as root to start jobs as another user")
        return _user_named(req.run_as)

    def _prepare(self, req: LaunchRequest, user: _User) -> None:
        """The run's directories and its tenant's, with their modes and owners (see the module docstring)."""
        sd = self._state_dir
        tdir = self.tenant_dir(req.tenant)
        for path in (sd / "runs", sd / "runs" / safe_name(req.job_id), self.run_dir(req.job_id, req.run)):
            ensure_dir(path, _PRIVATE_DIR)
        ensure_dir(sd / _TENANTS, _PRIVATE_DIR if not self._open_tenants else _PASSAGE_DIR)
        passage = _PASSAGE_DIR if user.switch else _PRIVATE_DIR
        for path in (tdir, tdir / "logs", tdir / "checkpoints"):
            ensure_dir(path, passage)
        if self._checkpoint_root != sd:
            root = self._checkpoint_root
            root.mkdir(parents=True, exist_ok=True)
            ensure_dir(root, _PRIVATE_DIR if not user.switch else _PASSAGE_DIR, top=True)
            ensure_dir(root / _TENANTS, _PRIVATE_DIR if not self._open_tenants else _PASSAGE_DIR)
            for path in (self._checkpoints_of(req.tenant).parent, self._checkpoints_of(req.tenant)):
                ensure_dir(path, passage)
        if user.switch:
            self._open_for(req.tenant)
        ckpt = self.checkpoint_dir(req.job_id, req.tenant)
        legacy = sd / "checkpoints" / safe_name(req.job_id)
        if not os.path.lexists(ckpt) and legacy.is_dir() and not legacy.is_symlink():
            os.rename(legacy, ckpt)  # kept by an earlier corral, before checkpoints were per tenant
        owner = (user.uid, user.gid)
        with contextlib.suppress(FileExistsError):
            os.mkdir(ckpt, _PRIVATE_DIR)
        st = os.lstat(ckpt)
        if not stat.S_ISDIR(st.st_mode):
            raise _SpawnError(f"{ckpt} is not a directory")
        if (st.st_uid, st.st_gid) != owner and (user.switch or os.geteuid() == 0):
            give_tree(ckpt, owner)  # the tenant's run_as user changed (or came, or went): its checkpoints follow
        if stat.S_IMODE(st.st_mode) != _PRIVATE_DIR:
            os.chmod(ckpt, _PRIVATE_DIR)

    def _spawn(self, run: _Run) -> None:
        """Start a run's shim (lock not held: starting a process takes milliseconds)."""
        req = run.req
        assert req is not None
        rd = self.run_dir(req.job_id, req.run)
        log_path = self.log_path(req.job_id, req.tenant)
        popen: subprocess.Popen[bytes] | None = None
        warm_pid = 0
        try:
            if not os.path.isdir(req.cwd):
                raise _SpawnError(f"working directory {req.cwd!r} does not exist")
            user = self._user_of(req)
            run.uid = user.uid  # (the loop thread's own: only it reads this, for the channel)
            self._prepare(req, user)
            for stale in ("exit.json", "pid", "child", "spawned"):
                with contextlib.suppress(FileNotFoundError):
                    (rd / stale).unlink()
            assert run.secret is not None
            launched = {
                "job_id": req.job_id,
                "run": req.run,
                "tenant": req.tenant,
                "run_as": req.run_as,
                "uid": user.uid,
                "command": list(req.command),
                "cwd": req.cwd,
                "gpus": list(req.gpus),
                "grace_s": req.grace_s,
                "launched_at": time.time(),
            }
            write_atomic(str(rd / "secret"), run.secret + "\n")
            write_atomic(str(rd / "launch.json"), json.dumps(launched) + "\n")
            env = self._job_env(req, user, run.secret)
            gpus_text = ",".join(str(i) for i in req.gpus) or "none"
            shim = [self._python, "-I", "-S", str(SHIM_PATH), str(rd)]
            if user.switch:
                shim += ["--user", f"{user.uid}:{user.gid}:{','.join(map(str, user.groups))}"]
            log_fd = open_log(log_path, (user.uid, user.gid) if user.switch else None)
            warm = self._warm_start(req, user, env)
            with open(log_fd, "ab") as logf:
                what = f"run {req.run} started {now_text()} on GPUs {gpus_text}: {shlex.join(req.command)}"
                logf.write(f"=== corral: {what} ===\n".encode(errors="replace"))
                if isinstance(warm, str):
                    logf.write(f"=== corral: started cold, not warm: {warm} ===\n".encode(errors="replace"))
                logf.flush()
                if warm is True:
                    assert self._zygote is not None
                    try:
                        warm_pid = self._zygote.spawn(rd, req.command, env, req.cwd, logf.fileno())
                    except ZygoteUnavailable as e:  # nothing was forked: this run starts cold all the same
                        log.warning("job %r run %d: warm start failed, starting it cold: %s", req.job_id, req.run, e)
                        logf.write(f"=== corral: started cold, not warm: the warm workers failed ({e}) ===\n".encode())
                        logf.flush()
                        warm = "failed"
                if warm is not True:
                    popen = subprocess.Popen(
                        [*shim, "--", *req.command],
                        cwd=req.cwd,
                        env=env,
                        stdin=subprocess.DEVNULL,
                        stdout=logf,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                        close_fds=True,
                    )
        except (_SpawnError, OSError, ValueError, subprocess.SubprocessError) as e:
            detail = f"cannot start the job: {e}"
            log.warning("job %r run %d: %s", req.job_id, req.run, detail)
            write_marker(log_path, f"run {req.run} not started: {detail}")
            with self._lock:
                self._runs.pop(run.key, None)
                self._report_exit(req.job_id, req.run, None, None, run.requested, detail)
            return
        started_at = time.time()
        pidfd: int | None
        if popen is not None:
            pid = popen.pid
            ticks = start_ticks(pid)  # our unreaped child: /proc/<pid> is there
        else:  # forked by the zygote, which reaps it: it may be gone already (the /proc poll then finds it ended)
            pid = warm_pid
            try:
                ticks = start_ticks(pid)
            except OSError:
                ticks = 0
        # The shim writes its own ``pid`` record once it forwards signals; this one closes the window before.
        with contextlib.suppress(OSError):
            write_atomic(str(rd / "spawned"), f"{pid} {ticks}\n")
        try:
            pidfd = open_pidfd(pid)
        except ProcessLookupError:
            pidfd = None
        with self._lock:
            run.state, run.pid, run.ticks, run.popen, run.pidfd = "running", pid, ticks, popen, pidfd
            self._outbox.append(ProcessStarted(req.job_id, req.run, pid, started_at))
            if run.requested is not None:  # stopped while it was being started
                self._begin_stop(run)
            elif run.held:  # paused while it was being started: before it says hello, a stopped group
                run.held = False
                if self._signal_group(run, signal.SIGSTOP):
                    run.paused_by = "signal"

    # -- process exit (lock held) -----------------------------------------------------------------------------
    def _unwatch(self, run: _Run) -> None:
        if run.pidfd is None:
            return
        if run.registered and self._selector is not None:
            with contextlib.suppress(KeyError, ValueError, OSError):
                self._selector.unregister(run.pidfd)
        os.close(run.pidfd)
        run.pidfd = None
        run.registered = False

    def _ended(self, run: _Run) -> None:
        """The shim is gone (or a zombie): clear its group, read its record, report."""
        assert run.pid is not None
        self._unwatch(run)
        # While the shim is an unreaped zombie its pid cannot be reused, so this reaches only its own group.
        self._kill_group(run.pid)
        status: int | None = None
        if run.popen is not None:
            status = run.popen.wait()
        else:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(run.pid, os.WNOHANG)  # ours after all (adopted within the same process)
        record = read_exit(self.run_dir(run.job_id, run.run))
        code: int | None = None
        sig: int | None = None
        if record is not None:
            code, sig = record
            detail = describe_exit(code, sig)
        elif run.killed:
            detail = f"killed (SIGKILL to its process group) {run.grace_s:g} s after the {run.requested} request"
        elif status is not None and status < 0:
            detail = f"its process group was killed by {signame(-status)}; no exit record"
        elif status is not None:
            detail = f"the corral shim failed with code {status} and left no exit record; see the job's log"
        else:
            detail = "its process ended without an exit record (its process group was killed)"
        if run.killed and record is not None:
            detail += f" (killed {run.grace_s:g} s after the {run.requested} request)"
        if run.conn is not None:
            self._mark_dead(run.conn)
        del self._runs[run.key]
        self._complaints.forget(run.job_id, run.run)
        write_marker(self.log_path(run.job_id), f"run {run.run} ended {now_text()}: {detail}")
        self._report_exit(run.job_id, run.run, code, sig, run.requested, detail)

    # -- the channel (loop thread) ----------------------------------------------------------------------------
    def _accept(self) -> None:
        assert self._listener is not None and self._selector is not None
        while True:
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                log.warning("agent socket: accept failed: %s", e)
                return
            sock.setblocking(False)
            conn = _Conn(sock, _peer_uid(sock), time.monotonic())
            with self._lock:
                unidentified = [c for c in self._conns if c.key is None and not c.dead]
                if len(unidentified) >= _MAX_UNIDENTIFIED:  # a job opening connections it never uses: bounded
                    oldest = min(unidentified, key=lambda c: c.accepted_at)
                    self._complaints.warn(
                        ("unidentified", "", 0),
                        "agent channel: %d connections have not said hello; closing the oldest",
                        len(unidentified),
                    )
                    self._close_conn(oldest)
                self._conns.add(conn)
                self._selector.register(sock, selectors.EVENT_READ, ("conn", conn))

    def _close_conn(self, conn: _Conn) -> None:
        self._conns.discard(conn)
        if self._selector is not None:
            with contextlib.suppress(KeyError, ValueError, OSError):
                self._selector.unregister(conn.sock)
        conn.sock.close()
        if conn.key is not None:
            r = self._runs.get(conn.key)
            if r is not None and r.conn is conn:
                r.conn = None

    def _drop(self, conn: _Conn, why: str) -> None:
        who = f"job {conn.key[0]!r} run {conn.key[1]}" if conn.key else "an unidentified connection"
        key = ("drop", *conn.key) if conn.key else ("drop", "", 0)
        self._complaints.warn(key, "agent channel: dropping %s: %s", who, why)
        with self._lock:
            self._close_conn(conn)

    def _on_conn_event(self, conn: _Conn, mask: int) -> None:
        if conn.dead or conn.sock.fileno() < 0:
            return
        if mask & selectors.EVENT_WRITE:
            with self._lock:
                try:
                    sent = conn.sock.send(conn.outbuf, socket.MSG_NOSIGNAL) if conn.outbuf else 0
                except BlockingIOError:
                    sent = 0
                except OSError:
                    self._close_conn(conn)
                    return
                del conn.outbuf[:sent]
        if not mask & selectors.EVENT_READ:
            return
        try:
            data = conn.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:  # the job closed its end (it exited, or reconnects later)
            with self._lock:
                self._close_conn(conn)
            return
        conn.inbuf += data
        while True:
            end = conn.inbuf.find(b"\n")
            if end < 0:
                if len(conn.inbuf) > contract.MAX_MESSAGE_BYTES:
                    self._drop(conn, f"a message longer than {contract.MAX_MESSAGE_BYTES} bytes")
                return
            line = bytes(conn.inbuf[:end])
            del conn.inbuf[: end + 1]
            if not line.strip():
                continue
            try:
                message = contract.decode(line)
            except InputError as e:
                if conn.key is None:  # not even a hello: nobody to count it against
                    self._drop(conn, str(e))
                    return
                if not self._bad_message(conn, str(e)):
                    return
                continue
            if not self._on_message(conn, message):
                return

    def _on_message(self, conn: _Conn, message: contract.Message) -> bool:
        """Handle one message; ``False`` if the connection was dropped."""
        if conn.key is None:
            if not isinstance(message, contract.Hello):
                self._drop(conn, f"the first message must be a hello, got {message.type!r}")
                return False
            with self._lock:
                run = self._runs.get((message.job_id, message.run))
                if run is None or run.state != "running":
                    self._complaints.warn(
                        ("not here", message.job_id, message.run),
                        "agent channel: hello from job %r run %d, which is not running here",
                        message.job_id,
                        message.run,
                        level=logging.INFO,
                    )
                    self._close_conn(conn)
                    return False
                refused = self._refusal(run, conn, message)
                if refused is not None:
                    # Not counted against the run: anyone can claim to be it, and must not get it cut off.
                    self._complaints.warn(
                        ("hello", run.job_id, run.run),
                        "agent channel: refused a hello as job %r run %d: %s",
                        run.job_id,
                        run.run,
                        refused,
                    )
                    self._close_conn(conn)
                    return False
                if run.conn is not None and run.conn is not conn:  # the job reconnected: the old one is stale
                    self._mark_dead(run.conn)
                run.conn = conn
                conn.key = run.key
                self._outbox.append(JobSaid(run.job_id, run.run, message))
            return True
        if isinstance(
            message, contract.Pause | contract.Resume | contract.Checkpoint | contract.SetBatchSize | contract.SetLimits
        ):
            return self._bad_message(conn, f"a job may not send the directive {message.type!r}")
        with self._lock:
            run = self._runs.get(conn.key)
            if run is None or run.conn is not conn:
                self._close_conn(conn)
                return False
            if isinstance(message, contract.Hello):
                return self._bad_message(conn, "a second hello")
            if (message.job_id, message.run) != run.key:
                return self._bad_message(
                    conn, f"a {message.type} message for job {message.job_id!r} run {message.run}, not its own"
                )
            if isinstance(message, contract.StepReport):
                self._outbox.append(JobReported(run.job_id, run.run, message))
                return True
            if isinstance(message, contract.Paused) and run.told == "resume":
                # Paused by an earlier agent (or before this agent's resume reached it) and said so on reconnecting,
                # after the controller asked for it to run: a SIGCONT does not end a pause at a step boundary.
                self._send(run, contract.Resume(seq=run.resume_seq))
            elif isinstance(message, contract.Paused) and run.paused_by is None:
                run.paused_by = "channel"
            elif isinstance(message, contract.Resumed) and run.paused_by == "channel":
                run.paused_by = None
            self._outbox.append(JobSaid(run.job_id, run.run, message))
            marker = _pause_marker(message, run.run)
        if marker is not None:  # in the job's log too, where its user reads why its output stopped and went on
            write_marker(self.log_path(run.job_id), marker)
        return True

    def _refusal(self, run: _Run, conn: _Conn, hello: contract.Hello) -> str | None:
        """Why a hello may not speak for ``run`` (lock held), or ``None``: it must carry the run's secret and
        come from the run's Unix user (or root)."""
        if run.cut_off:
            return f"the run sent more than {contract.MAX_BAD_MESSAGES} bad messages and is disconnected for good"
        if run.secret is None:
            return "the run has no secret on record (started by an earlier corral); it is controlled by signals"
        # Compared in constant time, as bytes (the decoded text is valid Unicode: see contract.decode).
        if not hmac.compare_digest(hello.secret.encode(), run.secret.encode()):
            return "wrong secret" if hello.secret else "no secret"
        if conn.peer_uid is not None and conn.peer_uid not in (run.uid, 0):
            return f"it comes from uid {conn.peer_uid}; the run's job runs as uid {run.uid}"
        return None

    def _bad_message(self, conn: _Conn, why: str) -> bool:
        """Count a bad message from an identified connection against its run and drop it; cut the run off after
        :data:`~corral.core.contract.MAX_BAD_MESSAGES`. ``False`` if the connection was dropped."""
        with self._lock:
            run = self._runs.get(conn.key) if conn.key is not None else None
            if run is None or run.conn is not conn:
                self._close_conn(conn)
                return False
            run.bad_messages += 1
            self._complaints.warn(
                ("bad", run.job_id, run.run),
                "agent channel: job %r run %d sent a bad message (%d so far), dropped: %s",
                run.job_id,
                run.run,
                run.bad_messages,
                why,
            )
            if run.bad_messages <= contract.MAX_BAD_MESSAGES:
                return True
            run.cut_off = True
            what = f"more than {contract.MAX_BAD_MESSAGES} bad messages (the last: {why})"
            log.warning("agent channel: job %r run %d disconnected for good: %s", run.job_id, run.run, what)
            write_marker(
                self.log_path(run.job_id),
                f"run {run.run} disconnected from the agent for good: {what}; it is controlled by signals now",
            )
            self._close_conn(conn)
            return False

    def bad_messages(self, job_id: str, run: int) -> int:
        """How many bad messages the run sent over the channel (0 for a run not here)."""
        with self._lock:
            r = self._runs.get((job_id, run))
            return 0 if r is None else r.bad_messages


def _pause_marker(message: contract.Message, run: int) -> str | None:
    """The line a pause or a resume writes in the job's log (``None`` for other messages)."""
    if isinstance(message, contract.Paused):
        how = "its state moved to host memory" if message.evicted else "its GPU memory kept"
        return f"run {run} paused at step {message.step} {now_text()}: {how}"
    if isinstance(message, contract.Resumed):
        return f"run {run} resumed at step {message.step} {now_text()}"
    return None


class _SpawnError(Exception):
    """A launch that cannot start, with the reason in words."""
