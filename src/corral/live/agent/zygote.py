"""Warm starts (issue 19, after PipeSwitch's standby workers): a process that has imported torch forks each warm
job's run, so the job skips the interpreter's start and ``import torch``.

A cold run starts a fresh Python through the shim (:mod:`corral.live.agent.shim`): seconds before its first step,
most of them importing torch (``benchmarks/bench_submit.py --torch``). A warm run is forked from this *zygote*, a
process the agent starts once, which imports the modules a training script needs (``torch``, ``torch.nn``,
``torch.optim``, ``corral.job``; whatever of them is installed) and then waits on a Unix socket. For each warm run
the agent sends the run's directory, command, environment and working directory, and its log as a file
descriptor; the zygote forks, and the child becomes the run's shim exactly as a cold one would be: its own session
and process group, stdout and stderr in the job's log, the shim's records (``pid``, ``child``, ``exit.json``), its
signals forwarded, its exit code the job's. The shim then forks the job's process, which takes the job's
environment, working directory and ``sys.argv``, starts reading the checkpoint it resumes from in the background
(the checkpoint prefetch of :mod:`corral.job.checkpoint`, unless ``CORRAL_CHECKPOINT_PREFETCH=0``), and runs the
script (or ``-m`` module) as ``__main__``, with the already imported modules at hand.

Why a fork server rather than a pool of workers that wait for a job (PipeSwitch): every run gets a fresh copy of
the warm process, so nothing one job does can reach another (a used worker is never reused, by construction), and
there is no pool to refill: the next fork is ready at once. What fork cannot give is a warm CUDA context (CUDA does
not survive a fork): a warm job creates its context itself, as a cold one does; on a GPU that is the part of the
start-up that stays (docs/live.md, "Warm starts").

What differs from a cold start, and why a job must opt in (``--warm``): the interpreter was started by the agent,
so what Python and torch read once at start-up came from the zygote's environment, not the job's (``PYTHON*``
variables other than ``PYTHONPATH``, which is applied; ``OMP_NUM_THREADS`` and the like, which torch read on import:
the job's own values are set in ``os.environ`` but the thread pools are the zygote's); and modules the zygote
imported are imported already (a script that patches something before ``import torch`` runs after it). The
command must be ``PYTHON [-u] SCRIPT ARGS...`` or ``PYTHON [-u] -m MODULE ARGS...`` with ``PYTHON`` the zygote's
own interpreter; the agent checks that (:func:`warm_form`) and starts any other command cold, saying so in its log.

The zygote is single-threaded (fork and threads do not mix) and never runs job code itself. It exits when the agent
closes it or when its parent (the agent) is gone. Run as ``python -m corral.live.agent.zygote SOCKET``.
"""

from __future__ import annotations

import array
import contextlib
import importlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from corral.live.agent import shim

WARM_MODULES = ("torch", "torch.nn", "torch.optim", "corral.job")
"""What the zygote imports before it serves: a training script's heaviest imports; then it makes an optimizer
once (:func:`_warm_up`), whose first construction imports much more."""
MAX_REQUEST = 1 << 20


@dataclass(frozen=True)
class WarmCommand:
    """A command a warm run can take: a script and its arguments, or ``-m`` a module and its arguments."""

    module: str | None
    script: str | None
    args: tuple[str, ...]
    unbuffered: bool


def warm_form(command: Sequence[str], env: Mapping[str, str], python: str) -> WarmCommand | str:
    """``command`` as a :class:`WarmCommand` when the zygote (running ``python``) can run it, else the reason it
    cannot (a sentence for the job's log)."""
    if not command:
        return "the command is empty"
    found = shutil.which(command[0], path=env.get("PATH", os.defpath))
    if found is None or os.path.realpath(found) != os.path.realpath(python):
        return f"{command[0]!r} is not the warm workers' interpreter {python}"
    return warm_argv(command)


def warm_argv(command: Sequence[str]) -> WarmCommand | str:
    """The form of a warm command, ``PROGRAM [-u] SCRIPT ARGS...`` or ``PROGRAM [-u] -m MODULE ARGS...``, without
    asking which program ``PROGRAM`` is (the API checks this much at submission; the agent, the interpreter)."""
    if len(command) < 2:
        return "the command is not PYTHON SCRIPT or PYTHON -m MODULE"
    rest = list(command[1:])
    unbuffered = False
    if rest and rest[0] == "-u":
        unbuffered, rest = True, rest[1:]
    if len(rest) >= 2 and rest[0] == "-m":
        return WarmCommand(rest[1], None, tuple(rest[2:]), unbuffered)
    if rest and not rest[0].startswith("-"):
        return WarmCommand(None, rest[0], tuple(rest[1:]), unbuffered)
    return "only -u, then a script or -m MODULE, may follow the interpreter in a warm command"


# ==============================================================================================================
# The agent's end
# ==============================================================================================================
class ZygoteUnavailable(OSError):
    """The zygote forked nothing for this request (see :meth:`Zygote.spawn`)."""


class Zygote:
    """The agent's handle on its zygote: started with :meth:`start`, asked for runs with :meth:`spawn`, stopped
    with :meth:`close`. The zygote gets only the harmless part of the agent's environment (a job is forked from its
    memory, so nothing secret may be in it), and ``PYTHONPATH`` if the agent has one (to import corral)."""

    def __init__(self, python: str, socket_path: Path, log_path: Path) -> None:
        self.python = python
        self.socket_path = socket_path
        self._log_path = log_path
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        from corral.core import contract

        # A socket left by a zygote that died with an earlier agent would read as ready until the new one binds.
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        env = contract.passed_env(os.environ)
        if "PYTHONPATH" in os.environ:
            env["PYTHONPATH"] = os.environ["PYTHONPATH"]
        with open(self._log_path, "ab") as log:
            self._proc = subprocess.Popen(
                [self.python, "-m", "corral.live.agent.zygote", str(self.socket_path)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd="/",
                start_new_session=True,
                close_fds=True,
            )

    def ready(self) -> bool:
        """Whether it serves (its imports done, its socket bound); False once it has died."""
        return self._proc is not None and self._proc.poll() is None and self.socket_path.exists()

    def wait_ready(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while not self.ready():
            if self._proc is None or self._proc.poll() is not None or time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        return True

    def spawn(self, run_dir: Path, command: Sequence[str], env: Mapping[str, str], cwd: str, log_fd: int) -> int:
        """Fork the run's shim; its pid. :class:`ZygoteUnavailable` when nothing was forked (the zygote is not
        there, or said it could not): the run may start cold. Another ``OSError`` (the answer lost after the
        request went out) leaves it unknown whether a shim was forked: the run must not start a second time."""
        request = {"run_dir": str(run_dir), "command": list(command), "env": dict(env), "cwd": cwd}
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(10.0)
            try:
                conn.connect(str(self.socket_path))
            except OSError as e:
                raise ZygoteUnavailable(f"the warm workers' socket: {e}") from None
            conn.sendmsg(
                [json.dumps(request).encode() + b"\n"],
                [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [log_fd]))],
            )
            with conn.makefile("rb") as answers:
                line = answers.readline(MAX_REQUEST)
        if not line:
            raise OSError("the warm workers closed the connection without an answer")
        answer = json.loads(line)
        if "pid" not in answer:
            raise ZygoteUnavailable(f"the warm workers could not start it: {answer.get('error')}")
        return int(answer["pid"])

    def close(self) -> None:
        """Stop the zygote (the runs it forked live on: they are in sessions of their own)."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()


# ==============================================================================================================
# The zygote
# ==============================================================================================================
def serve(path: str) -> None:
    """Import the warm modules, then fork a shim for each request on the socket at ``path`` until the socket is
    closed or the parent is gone."""
    for name in WARM_MODULES:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    _warm_up()
    parent = os.getppid()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    old = os.umask(0o177)
    try:
        listener.bind(path)
    finally:
        os.umask(old)
    listener.listen(16)
    listener.settimeout(1.0)
    signal.signal(signal.SIGCHLD, _reap)  # the shims it forks are the agent's to watch, the zygote's to reap
    print(f"corral zygote {os.getpid()}: {', '.join(m for m in WARM_MODULES if m in sys.modules)} imported", flush=True)
    while os.getppid() == parent:
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            continue
        except OSError:
            break
        with conn:
            conn.settimeout(10.0)
            try:
                answer = _fork_shim(conn, listener)
            except (OSError, ValueError, KeyError) as e:
                answer = {"error": f"{type(e).__name__}: {e}"}
            with contextlib.suppress(OSError):
                conn.sendall(json.dumps(answer).encode() + b"\n")


def _warm_up() -> None:
    """Make an optimizer once, on a CPU layer: its first construction imports much more of torch (torch._dynamo,
    sympy: over 800 modules, 1.3 s on the 2-core development machine), which every job would pay again; and save
    and load a tensor once, as a resuming job's restore (and its checkpoint prefetch) does first thing. It computes
    nothing, so no thread pool is started (fork and threads do not mix)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return
    with contextlib.suppress(Exception):
        layer = torch.nn.Linear(1, 1)
        for make in (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW):
            make(layer.parameters(), lr=0.1)
    with contextlib.suppress(Exception):
        import io

        buffer = io.BytesIO()
        torch.save({"weight": torch.zeros(1)}, buffer)
        buffer.seek(0)
        torch.load(buffer, map_location="cpu", weights_only=True)


def _reap(_signum: int, _frame: object) -> None:
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass


def _receive(conn: socket.socket) -> tuple[dict[str, object], int]:
    """One request: a JSON line and the log's file descriptor sent with it."""
    fds = array.array("i")
    data = b""
    while not data.endswith(b"\n"):
        msg, ancdata, _flags, _addr = conn.recvmsg(65536, socket.CMSG_SPACE(fds.itemsize))
        if not msg:
            raise ValueError("the request ended early")
        data += msg
        for level, kind, payload in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
        if len(data) > MAX_REQUEST:
            raise ValueError("the request is too long")
    if len(fds) != 1:
        for fd in fds:
            os.close(fd)
        raise ValueError("a request carries exactly one file descriptor, the job's log")
    return json.loads(data), fds[0]


def _fork_shim(conn: socket.socket, listener: socket.socket) -> dict[str, object]:
    request, log_fd = _receive(conn)
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        # The answer waits until the child leads its own session: the agent signals the run's process group by
        # its pid as soon as it has the pid (a cold shim's Popen returns after its setsid as well).
        ready_r, ready_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.close(ready_r)
                listener.close()
                conn.close()
                os.setsid()
                os.close(ready_w)
                code = _shim(request, log_fd)
            except BaseException:
                with contextlib.suppress(Exception):
                    traceback.print_exc()
            finally:
                os._exit(code)
        os.close(ready_w)
        try:
            os.read(ready_r, 1)  # returns at the child's close (or its death)
        finally:
            os.close(ready_r)
        return {"pid": pid, "ticks": shim.start_ticks(pid)}
    finally:
        os.close(log_fd)


# ==============================================================================================================
# In the forked shim
# ==============================================================================================================
def _shim(request: Mapping[str, object], log_fd: int) -> int:
    """Become the run's shim (as :func:`corral.live.agent.shim.main` is for a cold run), fork the job, wait. Called
    in the forked child once it leads its own session and process group (which the agent signals as a whole)."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # its own waitpid must see the job's exit
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    run_dir = str(request["run_dir"])
    env = {str(k): str(v) for k, v in dict(request["env"]).items()}  # type: ignore[call-overload]
    command = [str(x) for x in request["command"]]  # type: ignore[attr-defined]
    os.environ.clear()
    os.environ.update(env)
    os.chdir(str(request["cwd"]))
    forward = shim._Forwarder()
    for signum in shim.FORWARDED:
        signal.signal(signum, forward)
    shim.write_atomic(os.path.join(run_dir, "pid"), f"{os.getpid()} {shim.start_ticks()}\n")
    form = warm_form(command, env, sys.executable)
    if isinstance(form, str):  # the agent checked; a request that still fails is a bug of the agent's
        print(f"corral: cannot run {command[0]!r} warm: {form}", file=sys.stderr, flush=True)
        shim._record_exit(run_dir, shim.EXIT_NOT_EXECUTABLE, None)
        return shim.EXIT_NOT_EXECUTABLE
    sys.stdout.flush()
    sys.stderr.flush()
    child = os.fork()
    if child == 0:
        os._exit(_job(form, env))
    return shim.wait_for(run_dir, child, forward)


def _job(form: WarmCommand, env: Mapping[str, str]) -> int:
    """Run the job as Python would run ``form`` (in the forked job process): its exit code."""
    import runpy
    import threading

    # Signals as a fresh interpreter has them: SIGINT raises KeyboardInterrupt, SIGTERM and SIGHUP kill,
    # SIGPIPE and SIGXFSZ are ignored (Python's own start-up ignores them).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)
    for name in ("SIGPIPE", "SIGXFSZ"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_IGN)
    if form.unbuffered or env.get("PYTHONUNBUFFERED"):
        sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
        sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)
    _prefetch(env)
    extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if form.script is not None:
        sys.path[:0] = [os.path.dirname(os.path.abspath(form.script)), *extra]
        sys.argv = [form.script, *form.args]
    else:
        sys.path[:0] = [os.getcwd(), *extra]
        sys.argv = ["-m", *form.args]  # run_module puts the module's file name in argv[0]
    code = 0
    try:
        if form.script is not None:
            runpy.run_path(form.script, run_name="__main__")
        else:
            assert form.module is not None
            runpy.run_module(form.module, run_name="__main__", alter_sys=True)
    except SystemExit as e:
        code = _exit_code(e.code)
    except KeyboardInterrupt:
        traceback.print_exc()
        code = -1  # as the interpreter does since 3.8: die of SIGINT, once the rest below is done
    except BaseException:
        traceback.print_exc()
        code = 1
    # As the interpreter ends: wait for the job's non-daemon threads, run its atexit functions, flush.
    with contextlib.suppress(Exception):
        threading._shutdown()  # type: ignore[attr-defined]
    import atexit

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    if code == -1:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    return code


def _prefetch(env: Mapping[str, str]) -> None:
    """Start the job's checkpoint prefetch (:func:`corral.job.prefetch.prefetch_from_env`) before its script
    runs: the checkpoint is read while the script imports and builds its model (the script's own ``import
    corral.job`` runs nothing again: the zygote imported it, with no checkpoint directory in its environment)."""
    try:
        from corral.job.prefetch import prefetch_from_env
    except Exception as e:  # corral.job cannot be imported here: the script will say so itself if it needs it
        print(f"corral: checkpoint prefetch not started: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        return
    prefetch_from_env(env)


def _exit_code(value: object) -> int:
    """``sys.exit(value)``'s exit code, as the interpreter computes it (a message goes to stderr, code 1)."""
    if value is None:
        return 0
    if isinstance(value, int):
        return value & 0xFF
    print(value, file=sys.stderr)
    return 1


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: python -m corral.live.agent.zygote SOCKET", file=sys.stderr)
        sys.exit(2)
    serve(sys.argv[1])
