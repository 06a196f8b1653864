"""A run's processes and their records on disk, as the agent sees them: pidfds and ``/proc`` to watch a process,
the shim's ``pid``/``exit.json``/``secret`` records to know a run after a restart, and the job's log and
directories, created private (0600/0700) and never through a link an untrusted user could have put there."""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import signal
import stat
import time
from pathlib import Path

from corral.core import contract

log = logging.getLogger("corral.live.agent")

PRIVATE_FILE = 0o600


def signame(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def open_pidfd(pid: int) -> int | None:
    """A pidfd for ``pid``, or ``None`` where the kernel or Python has none; ``ProcessLookupError`` if gone."""
    pidfd_open = getattr(os, "pidfd_open", None)
    if pidfd_open is None:
        return None
    try:
        fd: int = pidfd_open(pid)
    except ProcessLookupError:
        raise
    except OSError as e:
        if e.errno in (errno.ENOSYS, errno.EPERM, errno.EINVAL):
            return None
        raise
    return fd


def proc_stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start ticks) of ``pid``, or ``None`` if there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            rest = f.read().rsplit(b")", 1)[1].split()
        return rest[0].decode(), int(rest[19])
    except (OSError, IndexError, ValueError):
        return None


def is_alive(pid: int, ticks: int | None) -> bool:
    """Whether ``pid`` is a live (not zombie) process that started at ``ticks``."""
    st = proc_stat(pid)
    return st is not None and st[0] not in ("Z", "X", "x") and (ticks is None or st[1] == ticks)


def read_exit(run_dir: Path) -> tuple[int | None, int | None] | None:
    """(exit_code, signal) from the shim's ``exit.json``, or ``None`` if there is none (or it is unreadable)."""
    try:
        body = json.loads((run_dir / "exit.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(body, dict):
        return None
    code, sig = body.get("exit_code"), body.get("signal")
    return (code if isinstance(code, int) else None, sig if isinstance(sig, int) else None)


def read_secret(run_dir: Path) -> str | None:
    """The run's channel secret, from its record; ``None`` when there is none (a run of an earlier corral)."""
    try:
        secret = (run_dir / "secret").read_text(encoding="ascii").strip()
    except (OSError, ValueError):
        return None
    return secret or None


def read_pid(path: Path) -> tuple[int, int] | None:
    """(pid, start ticks) from a ``pid`` record."""
    try:
        pid, ticks = path.read_text().split()
        return int(pid), int(ticks)
    except (OSError, ValueError):
        return None


def describe_exit(code: int | None, sig: int | None) -> str:
    if sig is not None:
        return f"killed by signal {sig} ({signame(sig)})"
    if code == contract.EXIT_PREEMPTED:
        return f"exited with code {code} (checkpointed on request)"
    if code == 127:
        return "exited with code 127 (command not found)"
    if code == 126:
        return "exited with code 126 (command cannot be executed)"
    return f"exited with code {code}"


def open_log(path: Path, owner: tuple[int, int] | None = None) -> int:
    """An append-only descriptor of a job's log, created 0600 (and given to ``owner``, a run_as user, so that it
    may read its own log). Never follows a symbolic link: a log is a file the agent made, in its own directory."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, PRIVATE_FILE)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, f"{path} is not a regular file")
        if owner is not None and (st.st_uid, st.st_gid) != owner:
            os.fchown(fd, *owner)
        if stat.S_IMODE(st.st_mode) != PRIVATE_FILE:
            os.fchmod(fd, PRIVATE_FILE)
    except OSError:
        os.close(fd)
        raise
    return fd


def write_marker(path: Path, text: str) -> None:
    try:
        fd = open_log(path)
        with open(fd, "a", encoding="utf-8", errors="replace") as f:
            f.write(f"=== corral: {text} ===\n")
    except OSError as e:
        log.warning("cannot write to the log %s: %s", path, e)


def now_text() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime())


def ensure_dir(path: Path, mode: int, owner: tuple[int, int] | None = None, *, top: bool = False) -> None:
    """``path`` as a directory with ``mode`` (and ``owner``), whether it existed or not. Its parent is the
    agent's own (no one else can put a link there); a link or file in its place is an error, never followed, but
    for the ``top`` (the state directory itself, which its administrator may have made a link)."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, mode)
    st = os.stat(path) if top else os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise OSError(errno.ENOTDIR, f"{path} is not a directory")
    if owner is not None and (st.st_uid, st.st_gid) != owner:
        os.chown(path, *owner, follow_symlinks=top)
    if stat.S_IMODE(st.st_mode) != mode:
        os.chmod(path, mode)


def give_tree(path: Path, owner: tuple[int, int]) -> None:
    """Give the directory tree at ``path`` (a checkpoint directory written by runs as another user) to
    ``owner``, through directory descriptors that never follow a link (the tree's owner could swap one in)."""
    os.chown(path, *owner, follow_symlinks=False)
    for _, dirs, files, dir_fd in os.fwalk(path, follow_symlinks=False):
        for name in (*dirs, *files):
            with contextlib.suppress(FileNotFoundError):
                os.chown(name, *owner, dir_fd=dir_fd, follow_symlinks=False)


def read_chunk(path: Path, offset: int, size: int) -> tuple[bytes, int]:
    """Up to ``size`` bytes of the file at ``path`` from byte ``offset``, and the file's size now (``b"", 0``
    when it does not exist yet): how a job's log is read, by whichever node holds it."""
    try:
        with path.open("rb") as f:
            total = os.fstat(f.fileno()).st_size
            if offset >= total:
                return b"", total
            f.seek(offset)
            return f.read(size), total
    except FileNotFoundError:
        return b"", 0
