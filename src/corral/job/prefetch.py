"""Checkpoint prefetch (issue 19, PipeSwitch's overlap of transfer with start-up): a run that resumes reads
``corral-state.pt`` on a background thread from the moment ``corral.job`` is imported (:func:`prefetch_from_env`;
a warm-started run: from the moment its worker is handed the job, :mod:`corral.live.agent.zygote`), while the
script imports and builds its model; the restore takes it (:func:`claim_prefetch`, :meth:`Prefetch.take`) if the
file is still the one read, and otherwise reads the file itself, after a log line that says why. The state is byte
for byte what :func:`corral.job.checkpoint.read_state` gives. By default only a checkpoint the page cache does not
hold is read ahead (:func:`in_page_cache`): one this node has just written reads fast, and a second thread copying
it competes with the start-up for the same cores.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from corral.core import contract
from corral.core.errors import CorralError
from corral.job import checkpoint
from corral.job.checkpoint import STATE_NAME, CheckpointStore

if TYPE_CHECKING:
    import torch

logger = logging.getLogger("corral.job")


PREFETCH_MIN_BYTES = 64 * 1024 * 1024
"""A smaller state file is not prefetched: read in a few milliseconds, there is little to overlap (a 6 MB one:
within the noise either way, ``benchmarks/bench_prefetch.py``, docs/job-library.md)."""
PIN_MIN_BYTES = 64 * 1024
"""Smaller storages (an optimizer's step counts, biases) are not pinned: their copies gain nothing from it."""
_READ_CHUNK = 16 * 1024 * 1024  # bytes per read: the pinning can stop between storages, the lock is free in each

FileIdentity = tuple[int, int, int, int, int]
"""What says a file is the same one: device, inode, size, modification and change times (ns). A checkpoint's files
are never rewritten in place (each save makes a new directory), so a match is the file that was read."""


def file_identity(path: Path) -> FileIdentity:
    return _identity(os.stat(path))


def _identity(st: os.stat_result) -> FileIdentity:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class _Unusable(Exception):
    """The prefetch cannot give this state (the message says why); the restore reads the file itself."""


class _PinFailed(Exception):
    """Pinned host memory could not be had (the message says why); the rest goes to ordinary memory."""


class Prefetch:
    """The state file of a checkpoint (``corral-state.pt``), read on a background thread while the job's run starts
    (issue 19: a migrating job's checkpoint is read into host memory while its new run starts), and handed to the
    restore by :meth:`take` if the file is still the one that was read.

    How, so that the thread leaves the script's own start-up alone (a plain ``torch.load`` holds the interpreter
    lock while it reads the file, which stalls the script's imports): ``torch.load`` with ``mmap=True`` unpickles
    the structure (milliseconds) and lays each storage over the file's mapping; the thread then reads each
    storage's bytes from the file (``os.preadv``, which releases the lock, 16 MiB at a time) into host memory of
    its own, at the offset the mapping gives (``/proc/self/maps``), and puts views of those copies in the state in
    place of the mapped ones (views keep sharing their storage). The mapping's pages are never touched (a file cut
    short under it would kill the process with ``SIGBUS``; a short read is an error). The result is a state equal,
    byte for byte, to what :func:`~corral.job.checkpoint.read_state` gives, holding nothing of the mapping.

    On a machine with CUDA and one GPU visible to the job (``pin=None``; with several, pinned memory allocated
    before the script picks its device would make a CUDA context on the first) the storages of at least
    :data:`PIN_MIN_BYTES` go to pinned (page-locked) host memory, so that ``load_state_dict``'s copies to the GPU
    are DMA copies; :meth:`take` then stops the thread after the storage under way rather than wait, and reads
    what is left into ordinary memory itself. ``pinned_alloc`` (a size in bytes to an ``UntypedStorage``) replaces
    the pinned allocation (tests on a CPU). The script's own files in the checkpoint directory (its ``save``
    hook's) are read ahead by the kernel (``posix_fadvise(WILLNEED)``), into the page cache only.

    Nothing the thread meets is lost: an error is kept and logged by :meth:`take`, which then lets the restore read
    the file normally (a failure to pin: the rest goes to ordinary memory)."""

    def __init__(
        self,
        state_path: Path,
        *,
        pin: bool | None = None,
        pinned_alloc: Callable[[int], Any] | None = None,
    ) -> None:
        self.path = Path(state_path)
        self.identity = file_identity(self.path)  # before the read: a change after it began shows in take()
        self.pid = os.getpid()
        self.read_s: float | None = None
        """How long the thread took to read the file into host memory (``None`` until it has)."""
        self.pinned = 0
        """How many storages were read into pinned host memory."""
        self._pin = pin
        self._pinned_alloc = pinned_alloc
        self._state: dict[str, Any] | None = None
        self._copies: dict[int, Any] = {}  # a mapped storage's address -> its copy in host memory
        self._why: str | None = None  # why the state cannot be used (the thread's error)
        self._pin_error: str | None = None
        self._stop = threading.Event()
        self._t0 = time.perf_counter()
        self._thread = threading.Thread(target=self._run, name="corral-checkpoint-prefetch", daemon=True)
        self._thread.start()

    def done(self) -> bool:
        """Whether the thread has finished (read, or failed)."""
        return not self._thread.is_alive()

    def _run(self) -> None:
        _advise(self.path)  # the kernel reads ahead while torch opens the file and unpickles
        pinning = False
        try:
            self._state = checkpoint.read_state(self.path, mmap=True)
            pinning = self._should_pin()
            self._read_tree(self._state, pin=pinning)
        except _PinFailed as e:  # kept, and logged by take(), which reads the rest into ordinary memory
            self._pin_error = str(e)
        except BaseException as e:  # kept, and logged by take(); the restore then reads the file itself
            self._state = None
            self._why = str(e) if isinstance(e, _Unusable) else f"reading it failed: {type(e).__name__}: {e}"
            return
        self.read_s = time.perf_counter() - self._t0
        _read_ahead(self.path.parent, skip=self.path.name)

    def _should_pin(self) -> bool:
        if self._pin is not None:
            return self._pin
        import torch

        # With several GPUs visible, pinned memory allocated before the script picks its device would make a CUDA
        # context on the first one (torchrun's ranks all on GPU 0): only a job of one visible GPU gets it.
        return bool(torch.cuda.is_available()) and torch.cuda.device_count() == 1

    def _read_tree(self, root: dict[str, Any], *, pin: bool) -> None:
        """Replace, in place (an ``OrderedDict``'s ``_metadata`` stays), each tensor of the state that is still a
        view of the file's mapping by a view of a copy of its storage read from the file, each storage read once.
        With ``pin`` (the thread's pass on a GPU machine) large storages go to pinned memory, and :meth:`take` may
        stop the pass between two storages. Raises :class:`_Unusable` for a tensor it cannot copy so (a subclass
        such as ``Parameter``, a sparse or quantized one) or a file it cannot read as mapped."""
        import torch

        copied = {copy.data_ptr() for copy in self._copies.values()}
        fd = os.open(self.path, os.O_RDONLY)
        try:
            if _identity(os.fstat(fd)) != self.identity:
                raise _Unusable(f"{self.path} changed after the prefetch began")
            mapped = _mappings(self.identity, os.path.realpath(self.path))
            stack: list[dict[Any, Any] | list[Any]] = [root]
            while stack:
                node = stack.pop()
                keys: Iterable[Any] = list(node) if isinstance(node, dict) else range(len(node))
                for key in keys:
                    value = node[key]
                    if isinstance(value, dict | list):
                        stack.append(value)
                    elif isinstance(value, torch.Tensor) and value.untyped_storage().data_ptr() not in copied:
                        if pin and self._stop.is_set():
                            return
                        node[key] = self._copied(value, pin, fd, mapped, copied)
        finally:
            os.close(fd)

    def _copied(
        self, value: torch.Tensor, pin: bool, fd: int, mapped: list[tuple[int, int, int]], copied: set[int]
    ) -> torch.Tensor:
        import ctypes

        import torch

        if not (
            type(value) is torch.Tensor
            and value.device.type == "cpu"
            and value.layout == torch.strided
            and not value.is_quantized
            and not value.is_conj()
            and not value.is_neg()
        ):
            raise _Unusable(f"it holds a tensor the prefetch does not copy ({type(value).__name__}, {value.layout})")
        storage = value.untyped_storage()
        source, nbytes = storage.data_ptr(), storage.nbytes()
        copy = self._copies.get(source)
        if copy is None:
            where = next((off + source - lo for lo, hi, off in mapped if lo <= source and source + nbytes <= hi), None)
            if where is None and nbytes:
                raise _Unusable(f"a storage of {nbytes} bytes is not in the mapping of {self.path}")
            if pin and nbytes >= PIN_MIN_BYTES:
                alloc = self._pinned_alloc or (
                    lambda n: torch.empty(n, dtype=torch.uint8, pin_memory=True).untyped_storage()
                )
                try:
                    copy = alloc(nbytes)
                except Exception as e:
                    raise _PinFailed(f"{type(e).__name__}: {e}") from None
                self.pinned += 1
            else:
                copy = torch.empty(nbytes, dtype=torch.uint8).untyped_storage()
            if nbytes:
                assert where is not None
                target = memoryview((ctypes.c_char * nbytes).from_address(copy.data_ptr())).cast("B")
                done = 0
                while done < nbytes:
                    got = os.preadv(fd, [target[done : done + _READ_CHUNK]], where + done)
                    if got <= 0:
                        raise _Unusable(f"{self.path} ended {nbytes - done} bytes early: cut short after it was opened")
                    done += got
            self._copies[source] = copy
            copied.add(copy.data_ptr())
        out = torch.empty(0, dtype=value.dtype).set_(copy, value.storage_offset(), value.size(), value.stride())
        if value.requires_grad:
            out.requires_grad_(True)
        return out

    def take(self, state_path: Path) -> dict[str, Any] | None:
        """The prefetched state if it is that of ``state_path`` as the file is now, else ``None`` with a line in
        the job's log saying why (the restore then reads the file normally). Waits for the read to end (under way:
        never longer than reading anew), not for the pinning (stopped after the storage under way: what is left is
        read here, into ordinary memory)."""
        self._stop.set()  # only the pinning pass looks at it
        self._thread.join()
        state, self._state = self._state, None
        why = self._why
        if why is None:
            try:
                now = file_identity(state_path)
            except OSError as e:
                now = None
                why = f"cannot look at {state_path}: {e}"
            if now is not None and now != self.identity:
                if os.path.abspath(state_path) != os.path.abspath(self.path):
                    why = f"it read {self.path}, and the job restores {state_path}"
                else:
                    why = f"{state_path} changed after the prefetch began"
        if self._pin_error is not None:
            logger.warning(
                "corral.job: checkpoint prefetch: pinning the state in host memory failed after %d storages (%s); "
                "the rest is in ordinary memory",
                self.pinned,
                self._pin_error,
            )
        if why is None and state is not None:
            try:
                self._read_tree(state, pin=False)  # what the pinning pass left, if it stopped early
            except Exception as e:
                why = str(e) if isinstance(e, _Unusable) else f"reading it failed: {type(e).__name__}: {e}"
        self._copies = {}
        if why is not None or state is None:
            logger.warning("corral.job: checkpoint prefetch not used (%s): reading %s again", why, state_path)
            return None
        return state


def _mappings(identity: FileIdentity, real_path: str) -> list[tuple[int, int, int]]:
    """The address ranges of this process mapped from the file of ``identity`` (its inode, and its device or its
    path: some filesystems show another device number in the maps than in ``stat``), each with its offset in the
    file: (start, end, offset)."""
    found = []
    inode = f" {identity[1]} "
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                if inode not in line:
                    continue
                fields = line.split(maxsplit=5)
                if len(fields) < 6 or not fields[4].isdigit() or int(fields[4]) != identity[1]:
                    continue
                major, _, minor = fields[3].partition(":")
                if os.makedev(int(major, 16), int(minor, 16)) != identity[0] and fields[5].strip() != real_path:
                    continue
                low, _, high = fields[0].partition("-")
                found.append((int(low, 16), int(high, 16), int(fields[2], 16)))
    except (OSError, ValueError) as e:
        raise _Unusable(f"cannot read this process's memory map: {e}") from None
    return found


def _advise(path: Path) -> None:
    """Ask the kernel to read the file at ``path`` into the page cache, without waiting for it."""
    advise = getattr(os, "posix_fadvise", None)
    if advise is None:
        return
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        try:
            advise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
        finally:
            os.close(fd)


def _read_ahead(directory: Path, skip: str) -> None:
    """Ask the kernel to read the files of ``directory`` (but ``skip``) into the page cache, without waiting."""
    with contextlib.suppress(OSError):
        for entry in os.scandir(directory):
            if entry.name != skip and entry.is_file(follow_symlinks=False):
                _advise(Path(entry.path))


_prefetch: Prefetch | None = None
_prefetch_lock = threading.Lock()


def prefetch_checkpoint(
    checkpoint_dir: str | os.PathLike[str],
    *,
    min_bytes: int = PREFETCH_MIN_BYTES,
    if_cached: bool = True,
    pin: bool | None = None,
) -> Prefetch | None:
    """Start reading the latest checkpoint's state under ``checkpoint_dir`` in the background, for the next
    :class:`~corral.job.Job` of this process to restore from; the :class:`Prefetch`, or ``None`` when there is
    nothing worth reading ahead: no checkpoint, one saved without objects' state, a state file smaller than
    ``min_bytes``, or (without ``if_cached``) one the page cache holds already (the script's own files are still
    read ahead into the page cache). Idempotent: a prefetch of the same file under way is returned. ``corral.job``
    calls it on import with ``CORRAL_CHECKPOINT_DIR`` (:func:`prefetch_from_env`); a script that passes
    ``Job(checkpoint_dir=...)`` may call it itself, before it builds its model. Raises :class:`CheckpointError` for a
    pointer that names no checkpoint."""
    global _prefetch
    latest = CheckpointStore(checkpoint_dir).latest()
    if latest is None:
        return None
    state_path = latest / STATE_NAME
    with _prefetch_lock:
        current = _prefetch
        if current is not None and current.pid == os.getpid():
            with contextlib.suppress(OSError):
                if file_identity(state_path) == current.identity:
                    return current
        _prefetch = None
        try:
            if os.stat(state_path).st_size >= min_bytes and (if_cached or not in_page_cache(state_path)):
                _prefetch = Prefetch(state_path, pin=pin)
                return _prefetch
        except FileNotFoundError:  # saved without objects' state: nothing to prefetch but the script's files
            pass
        _read_ahead(latest, skip="")
        return None


def in_page_cache(path: Path, probes: int = 16) -> bool:
    """Whether the file at ``path`` looks wholly in the page cache: ``probes`` pages spread over it can each be read
    without waiting (``preadv`` with ``RWF_NOWAIT``). False where that cannot be asked (another system, a filesystem
    without it): a file that may have to come from a disk or a network is the one worth reading ahead."""
    flag = getattr(os, "RWF_NOWAIT", None)
    if flag is None:
        return False
    page = bytearray(4096)
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        for i in range(probes):
            offset = (max(size - len(page), 0) * i // max(probes - 1, 1)) // len(page) * len(page)
            try:
                got = os.preadv(fd, [page], offset, flag)
            except OSError:  # not cached (EAGAIN), or the filesystem cannot say (EOPNOTSUPP)
                return False
            if got < min(len(page), size - offset):
                return False
        return True
    finally:
        os.close(fd)


def prefetch_from_env(env: Mapping[str, str]) -> Prefetch | None:
    """The checkpoint prefetch of a run, started from its environment (:mod:`corral.job.env`): of the checkpoint in
    ``CORRAL_CHECKPOINT_DIR`` whose state file is at least ``CORRAL_CHECKPOINT_PREFETCH_MIN_MIB``, when
    ``CORRAL_CHECKPOINT_PREFETCH`` is ``auto`` (the default) and the file is not in the page cache, or when it is
    ``1``. Never raises: what stops it (a malformed variable, an unreadable checkpoint) is
    :class:`~corral.job.Job`'s to report when it is created; anything else is logged."""
    from corral.job.env import checkpoint_prefetch, checkpoint_prefetch_min_mib

    try:
        directory = env.get(contract.ENV_CHECKPOINT_DIR, "").strip()
        mode = checkpoint_prefetch(env)
        if not directory or mode == "0":
            return None
        min_bytes = checkpoint_prefetch_min_mib(env) * 1024 * 1024
        return prefetch_checkpoint(directory, min_bytes=min_bytes, if_cached=mode == "1")
    except (CorralError, OSError):
        return None  # Job() reads the same environment and directory, and says what is wrong with them
    except Exception as e:
        logger.warning("corral.job: checkpoint prefetch not started: %s: %s", type(e).__name__, e)
        return None


def pending_prefetch() -> Prefetch | None:
    """The prefetch this process has started and no :class:`~corral.job.Job` has taken yet, if any."""
    current = _prefetch
    return current if current is not None and current.pid == os.getpid() else None


def claim_prefetch() -> Prefetch | None:
    """:func:`pending_prefetch`, which no one else will get (a Job's restore takes it, used or not)."""
    global _prefetch
    with _prefetch_lock:
        current, _prefetch = pending_prefetch(), None
    return current
