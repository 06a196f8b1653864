"""The wrapper process between a node's agent and one run of a job.

Run as ``python -I -S shim.py RUN_DIR [--user UID:GID:GROUPS] -- COMMAND...`` by :mod:`corral.live.agent`, in a
new session and process group (its pid is the group id), with stdout and stderr already in the job's log and the
job's environment set. It uses the standard library only and imports nothing of corral, so it starts in a few
milliseconds and keeps working while the controller restarts.

With ``--user`` (a tenant's ``run_as``; the shim then runs as root), the shim itself stays root and only the job's
process takes that uid, gid and supplementary groups (``GROUPS``: comma-separated gids, possibly none), and
enters the working directory again as that user, so that a directory the user may not enter is refused as it
would be from a shell. The shim keeps writing its records as root, in a run directory the job cannot write: a
job cannot forge its exit or point the agent's signals at another process.

It leaves a record in RUN_DIR that outlives both itself and the agent, so a restarted agent can tell what
happened (each file written atomically, mode 0600):

``pid``
    ``"<shim pid> <start time>"``, written once the shim forwards signals; the start time (field 22 of
    ``/proc/<pid>/stat``, clock ticks since boot) tells a live shim from a reused pid.
``child``
    The pid of the job's main process.
``exit.json``
    ``{"exit_code": int|null, "signal": int|null, "ended_at": unix_time}`` once the main process has ended.
    Absent if the whole group was killed (``SIGKILL``): the agent then knows from its own records.

``SIGTERM``, ``SIGINT`` and ``SIGHUP`` are forwarded to the main process (handled, not ignored: ignored signals
would be inherited by the job). ``SIGSTOP``/``SIGCONT`` to the group stop and continue both. The shim exits with
the main process's code, or 128 + the signal that killed it. A command that cannot be executed gets a message
in the log and code 127 (not found) or 126 (not executable), as a shell would.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import sys
import time

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
EXIT_NOT_FOUND = 127
EXIT_NOT_EXECUTABLE = 126
EXIT_USAGE = 2


def start_ticks(pid: int | str = "self") -> int:
    """Field 22 of ``/proc/<pid>/stat``: when the process started, in clock ticks since boot."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    # The command name (field 2) is in parentheses and may itself contain ') '; fields after it follow the last ')'.
    return int(stat.rsplit(b")", 1)[1].split()[19])


def write_atomic(path: str, text: str) -> None:
    """Write ``text`` to ``path`` (mode 0600) so a reader sees the old file or the whole new one, never a part.
    (No fsync: the record must survive the agent or the shim dying, not the machine, which takes the job with
    it.)"""
    tmp = f"{path}.tmp.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with open(fd, "w", encoding="utf-8") as f:
        os.fchmod(fd, 0o600)  # a left-over file of the same name keeps its mode through O_TRUNC
        f.write(text)
    os.replace(tmp, path)


def parse_user(text: str) -> tuple[int, int, list[int]]:
    """``UID:GID:GROUPS`` (``GROUPS`` comma-separated, possibly empty) as numbers; ``ValueError`` if malformed."""
    uid, gid, groups = text.split(":")
    return int(uid), int(gid), [int(g) for g in groups.split(",") if g]


def _spawn_as(command: list[str], user: tuple[int, int, list[int]], defaults: list[signal.Signals]) -> int:
    """Start ``command`` as ``user`` (fork, drop privileges, enter the working directory again, exec); raises
    ``OSError`` as ``posix_spawnp`` would when it cannot be executed, :class:`_NotAsUser` saying why when the user
    cannot be taken or may not enter the working directory. (``posix_spawn`` cannot change the user.)"""
    uid, gid, groups = user
    cwd = os.getcwd()
    err_r, err_w = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:  # the child: only async-signal-safe-ish work, and never return into the shim's code
        step = "setgroups"
        try:
            os.close(err_r)
            for signum in (*FORWARDED, *defaults):
                signal.signal(signum, signal.SIG_DFL)
            os.setgroups(groups)
            step = "setgid"
            os.setgid(gid)
            step = "setuid"
            os.setuid(uid)
            step = "chdir"
            os.chdir(cwd)  # the permission check of a shell's cd, now as the user
            step = "exec"
            os.execvpe(command[0], command, os.environ)
        except OSError as e:
            os.write(err_w, f"{step} {e.errno or 0}".encode())
        finally:
            os._exit(EXIT_NOT_EXECUTABLE)
    os.close(err_w)
    report = b""
    while chunk := os.read(err_r, 64):
        report += chunk
    os.close(err_r)
    if not report:
        return pid  # exec succeeded: the pipe closed on it
    os.waitpid(pid, 0)
    step, _, number = report.decode().partition(" ")
    code = int(number or 0)
    if step == "exec":
        raise OSError(code, os.strerror(code))
    if step == "chdir":
        raise _NotAsUser(f"user {uid} cannot enter the working directory {cwd!r}: {os.strerror(code)}")
    raise _NotAsUser(f"cannot become uid {uid} gid {gid} ({step}): {os.strerror(code)}")


class _NotAsUser(Exception):
    """The job's process could not take its user, or that user may not enter the working directory."""


class _Forwarder:
    """Forwards signals to the main process; a signal that comes before it exists is delivered right after."""

    def __init__(self) -> None:
        self.child: int | None = None
        self.pending: list[int] = []

    def __call__(self, signum: int, frame: object) -> None:
        if self.child is None:
            self.pending.append(signum)
            return
        try:  # noqa: SIM105 - contextlib would cost start-up time
            os.kill(self.child, signum)
        except ProcessLookupError:  # already gone; waitpid will tell
            pass

    def started(self, child: int) -> None:
        self.child = child
        while self.pending:
            self(self.pending.pop(0), None)


def _record_exit(run_dir: str, exit_code: int | None, signum: int | None) -> None:
    body = {"exit_code": exit_code, "signal": signum, "ended_at": time.time()}
    write_atomic(os.path.join(run_dir, "exit.json"), json.dumps(body) + "\n")


def main(argv: list[str]) -> int:
    user: tuple[int, int, list[int]] | None = None
    try:
        if len(argv) >= 5 and argv[2] == "--user":
            user = parse_user(argv[3])
            del argv[2:4]
    except ValueError:
        user = None
        argv = []
    if len(argv) < 4 or argv[2] != "--":
        print("usage: shim.py RUN_DIR [--user UID:GID:GROUPS] -- COMMAND [ARG...]", file=sys.stderr)
        return EXIT_USAGE
    run_dir, command = argv[1], argv[3:]
    forward = _Forwarder()
    for signum in FORWARDED:
        signal.signal(signum, forward)
    # Written once the handlers are in place: the agent holds back a SIGTERM until it sees this file.
    write_atomic(os.path.join(run_dir, "pid"), f"{os.getpid()} {start_ticks()}\n")
    # The interpreter ignores SIGPIPE and SIGXFSZ; the job must start with the defaults, as from a shell.
    defaults = [s for s in (getattr(signal, "SIGPIPE", None), getattr(signal, "SIGXFSZ", None)) if s is not None]
    try:
        if user is None:
            child = os.posix_spawnp(command[0], command, os.environ, setsigdef=defaults, setsigmask=())
        else:
            child = _spawn_as(command, user, defaults)
    except _NotAsUser as e:
        print(f"corral: cannot run {command[0]!r}: {e}", file=sys.stderr, flush=True)
        _record_exit(run_dir, EXIT_NOT_EXECUTABLE, None)
        return EXIT_NOT_EXECUTABLE
    except OSError as e:
        code = EXIT_NOT_FOUND if e.errno in (errno.ENOENT, errno.ENOTDIR) else EXIT_NOT_EXECUTABLE
        what = "command not found" if code == EXIT_NOT_FOUND else "cannot execute"
        print(f"corral: cannot run {command[0]!r}: {e.strerror} ({what})", file=sys.stderr, flush=True)
        _record_exit(run_dir, code, None)
        return code
    return wait_for(run_dir, child, forward)


def wait_for(run_dir: str, child: int, forward: _Forwarder) -> int:
    """Record the job's main process ``child``, forward signals to it, wait for it and record its end; the shim's
    exit code (also the warm shims' of :mod:`corral.live.agent.zygote`)."""
    write_atomic(os.path.join(run_dir, "child"), f"{child}\n")
    forward.started(child)
    # waitpid is retried on EINTR by Python itself (PEP 475) after the forwarding handler ran.
    _, status = os.waitpid(child, 0)
    if os.WIFSIGNALED(status):
        killer = os.WTERMSIG(status)
        _record_exit(run_dir, None, killer)
        return 128 + killer
    code = os.WEXITSTATUS(status)
    _record_exit(run_dir, code, None)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv))
