"""Checkpoints of the job-side library: an atomic store that keeps the latest checkpoint directory, the random
number generators' states, and the fast-forward of a data loader to a position inside an epoch.

Store layout, inside ``CORRAL_CHECKPOINT_DIR``::

    latest                       # one line: the name of the current checkpoint directory
    ckpt-000001234-<token>/      # the checkpoint of global step 1234
        corral-job.json          # position (epoch, step), batch size, random generator states
        corral-state.pt          # state_dict() of the model, optimizer, scheduler, ... (when the helper saves them)
        ...                      # whatever the script's own ``save(path)`` hook wrote

A checkpoint is written into a hidden temporary directory, flushed to disk, renamed into place, and only then
does ``latest`` (itself replaced atomically with ``os.replace``) point at it; older checkpoint directories and
leftover temporaries are removed afterwards. A kill at any moment leaves either the old checkpoint or the new one
current, never a partial one. Only names this module creates are ever removed from the directory.

Random generator states are kept as JSON (no pickle): Python's ``random``, NumPy's legacy global generator when
the script imported NumPy, torch's CPU generator and CUDA generators when the script imported torch (CUDA only
once initialised), and any ``torch.Generator`` the data loader holds (``DataLoader(generator=...)`` or its
sampler's). Generators the script creates itself (``numpy.random.default_rng``, its own ``torch.Generator``) are
not found; the script saves those in its hooks.

The checkpoint a resuming run reads may already be on its way: :mod:`corral.job.prefetch` reads it ahead.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import random
import re
import secrets
import shutil
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from corral.core.errors import CorralError
from corral.job.device import cuda_initialized, module_loaded

if TYPE_CHECKING:
    import torch

logger = logging.getLogger("corral.job")

POINTER_NAME = "latest"
META_NAME = "corral-job.json"
STATE_NAME = "corral-state.pt"
FORMAT = 1
_CKPT_RE = re.compile(r"^ckpt-\d{9,}-[0-9a-f]+-\d+$")
_TMP_PREFIX = ".tmp-ckpt-"
_POINTER_TMP_PREFIX = ".latest-"


class CheckpointError(CorralError):
    """A checkpoint that cannot be used: unreadable, or not matching what the script asks to restore."""


class Stateful(Protocol):
    """Anything with ``state_dict()`` / ``load_state_dict()``: a model, an optimizer, an LR scheduler, a
    ``GradScaler``..."""

    def state_dict(self) -> Any: ...

    def load_state_dict(self, state_dict: Any, /) -> Any: ...


# -- the store --------------------------------------------------------------------------------------------------
class CheckpointStore:
    """The latest checkpoint directory under ``root``, replaced atomically."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def latest(self) -> Path | None:
        """The current checkpoint directory, or ``None`` when there is none."""
        try:
            name = (self.root / POINTER_NAME).read_text().strip()
        except FileNotFoundError:
            return None
        except OSError as e:
            raise CheckpointError(f"{self.root / POINTER_NAME}: cannot read the checkpoint pointer: {e}") from None
        path = self.root / name
        if not _CKPT_RE.match(name) or not path.is_dir():
            raise CheckpointError(f"{self.root / POINTER_NAME} names {name!r}, which is not a checkpoint directory")
        return path

    def save(self, write: Callable[[Path], None], *, step: int) -> Path:
        """Call ``write(tmp_dir)`` to fill a fresh directory, then make it the latest checkpoint; returns its path.
        If ``write`` raises, nothing changes (the exception propagates)."""
        self.root.mkdir(parents=True, exist_ok=True)
        token = f"{secrets.token_hex(4)}-{os.getpid()}"
        tmp = self.root / f"{_TMP_PREFIX}{token}"
        tmp.mkdir()
        try:
            write(tmp)
            _fsync_tree(tmp)
            final = self.root / f"ckpt-{step:09d}-{token}"
            os.rename(tmp, final)
            _fsync_dir(self.root)
            pointer_tmp = self.root / f"{_POINTER_TMP_PREFIX}{token}"
            with open(pointer_tmp, "w") as f:
                f.write(final.name + "\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(pointer_tmp, self.root / POINTER_NAME)
            _fsync_dir(self.root)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self._remove_others(keep=final.name)
        return final

    def _remove_others(self, keep: str) -> None:
        for entry in self.root.iterdir():
            name = entry.name
            if name == keep:
                continue
            if _CKPT_RE.match(name) or name.startswith(_TMP_PREFIX):
                shutil.rmtree(entry, ignore_errors=True)
            elif name.startswith(_POINTER_TMP_PREFIX):
                with contextlib.suppress(OSError):
                    entry.unlink()


def _fsync_tree(root: Path) -> None:
    for dirpath, _dirnames, filenames in os.walk(root):
        for name in filenames:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(Path(dirpath))


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError:  # some filesystems do not fsync directories; the rename is still atomic
        pass
    finally:
        os.close(fd)


# -- helper state (model, optimizer, scheduler, ...) -------------------------------------------------------------
def save_state(path: Path, objects: dict[str, Stateful]) -> None:
    import torch

    torch.save({name: obj.state_dict() for name, obj in objects.items()}, path)


def read_state(path: Path, *, mmap: bool = False) -> dict[str, Any]:
    """What :func:`save_state` wrote to ``path``, tensors on the CPU (``weights_only`` loading, so the file holds
    only tensors and plain data). The one reader of the state file: the normal restore calls it, and the prefetch
    thread (:class:`Prefetch`) with ``mmap`` (the tensors are then views of the file's mapping, until it copies
    them out)."""
    import torch

    try:
        saved = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: missing; the checkpoint was saved without model/optimizer state") from None
    except Exception as e:
        raise CheckpointError(f"{path}: cannot load: {e}") from None
    if not isinstance(saved, dict):
        raise CheckpointError(f"{path}: holds a {type(saved).__name__}, not the state of named objects")
    return saved


def load_state(path: Path, objects: dict[str, Stateful], saved: dict[str, Any] | None = None) -> None:
    """Load each object's state from ``path``, written by :func:`save_state` (or from ``saved``, what
    :func:`read_state` gave for it ahead of time: a checkpoint prefetch). Tensors are loaded to the CPU first
    (``load_state_dict`` copies them to where the object's own tensors are)."""
    if saved is None:
        saved = read_state(path)
    missing = sorted(set(objects) - set(saved))
    if missing:
        raise CheckpointError(f"{path}: holds no state for {missing} (it has {sorted(saved)})")
    for name, obj in objects.items():
        obj.load_state_dict(saved[name])


# -- random generators -------------------------------------------------------------------------------------------
@dataclass(slots=True)
class RngState:
    """A snapshot of the random generators a training script draws from (see the module docstring): the global
    ones, and (``generators``, ``None`` until captured) those of a data loader, which may be captured later, once
    the loader exists."""

    python: tuple[Any, ...]
    numpy: tuple[Any, ...] | None = None
    torch_cpu: torch.Tensor | None = None
    torch_cuda: list[torch.Tensor] | None = None
    generators: list[torch.Tensor] | None = None

    @classmethod
    def capture(cls, generators: list[torch.Generator] | None = None) -> RngState:
        """The global generators now, and ``generators`` if given."""
        state = cls(python=random.getstate())
        np = sys.modules.get("numpy")
        if np is not None:
            state.numpy = np.random.get_state()
        if module_loaded("torch"):
            import torch

            state.torch_cpu = torch.get_rng_state()
            if cuda_initialized():
                state.torch_cuda = torch.cuda.get_rng_state_all()
        if generators is not None:
            state.capture_generators(generators)
        return state

    def capture_generators(self, generators: list[torch.Generator]) -> None:
        self.generators = [g.get_state() for g in generators]

    def restore(self, generators: list[torch.Generator] | None = None) -> None:
        """Set the global generators (and ``generators``, if given) back to this state."""
        random.setstate(self.python)
        if self.numpy is not None:
            import numpy as np

            np.random.set_state(self.numpy)
        if self.torch_cpu is not None:
            import torch

            torch.set_rng_state(self.torch_cpu)
            if self.torch_cuda is not None and torch.cuda.is_available():
                torch.cuda.set_rng_state_all(self.torch_cuda)
        if generators is not None:
            self.restore_generators(generators)

    def restore_generators(self, generators: list[torch.Generator]) -> None:
        saved = self.generators or []
        if len(saved) != len(generators):
            logger.warning(
                "corral.job: the checkpoint has %d data loader generator state(s) but the loader has %d; they are "
                "not restored (the data order may differ from an uninterrupted run)",
                len(saved),
                len(generators),
            )
            return
        for g, s in zip(generators, saved, strict=True):
            g.set_state(s)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"python": [self.python[0], list(self.python[1]), self.python[2]]}
        if self.numpy is not None:
            name, keys, pos, has_gauss, cached = self.numpy
            out["numpy"] = [str(name), [int(k) for k in keys], int(pos), int(has_gauss), float(cached)]
        if self.torch_cpu is not None:
            out["torch"] = _b64(self.torch_cpu)
        if self.torch_cuda is not None:
            out["cuda"] = [_b64(t) for t in self.torch_cuda]
        if self.generators is not None:
            out["generators"] = [_b64(t) for t in self.generators]
        return out

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> RngState:
        version, internal, gauss = body["python"]
        state = cls(python=(version, tuple(internal), gauss))
        if "numpy" in body:
            import numpy as np

            name, keys, pos, has_gauss, cached = body["numpy"]
            state.numpy = (name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached)
        if "torch" in body:
            state.torch_cpu = _unb64(body["torch"])
        if "cuda" in body:
            state.torch_cuda = [_unb64(s) for s in body["cuda"]]
        if "generators" in body:
            state.generators = [_unb64(s) for s in body["generators"]]
        return state


def _b64(t: torch.Tensor) -> str:
    return base64.b64encode(t.cpu().numpy().tobytes()).decode("ascii")


def _unb64(text: str) -> torch.Tensor:
    import torch

    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8).clone()


# -- data position -----------------------------------------------------------------------------------------------
def loader_generators(loader: object) -> list[torch.Generator]:
    """The ``torch.Generator`` objects a data loader (or its sampler) draws from, in a fixed order, each once."""
    if not module_loaded("torch"):
        return []
    import torch

    sampler = getattr(loader, "sampler", None)
    batch_sampler = getattr(loader, "batch_sampler", None)
    candidates = (
        getattr(loader, "generator", None),
        getattr(sampler, "generator", None),
        getattr(getattr(batch_sampler, "sampler", None), "generator", None),
    )
    found: list[torch.Generator] = []
    for c in candidates:
        if isinstance(c, torch.Generator) and all(c is not f for f in found):
            found.append(c)
    return found


def fast_forward(it: Iterator[Any], batches: int) -> int:
    """Advance ``it`` past ``batches`` items; returns how many it had (fewer if it ran out).

    A single-process ``DataLoader`` over a map-style dataset is advanced by drawing the indices from its sampler
    without loading the samples (the order is the sampler's alone); any other iterator, a loader with worker
    processes included, yields and discards its items.
    """
    if batches <= 0:
        return 0
    if _is_index_skippable(it):
        advance: Callable[[], Any] = it._next_index  # type: ignore[attr-defined]
        done = 0
        try:
            for _ in range(batches):
                advance()
                done += 1
        except StopIteration:
            pass
        it._num_yielded += done  # type: ignore[attr-defined]
        return done
    done = 0
    for _ in range(batches):
        try:
            next(it)
        except StopIteration:
            break
        done += 1
    return done


def _is_index_skippable(it: object) -> bool:
    if not module_loaded("torch"):
        return False
    from torch.utils.data import dataloader

    single = getattr(dataloader, "_SingleProcessDataLoaderIter", None)
    kind = getattr(dataloader, "_DatasetKind", None)
    return (
        single is not None
        and kind is not None
        and type(it) is single
        and getattr(it, "_dataset_kind", None) == kind.Map
        and callable(getattr(it, "_next_index", None))
        and isinstance(getattr(it, "_num_yielded", None), int)
    )


def read_meta(path: Path) -> dict[str, Any]:
    try:
        body = json.loads((path / META_NAME).read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path / META_NAME}: cannot read: {e}") from None
    if not isinstance(body, dict) or body.get("format") != FORMAT:
        raise CheckpointError(f"{path / META_NAME}: not a corral checkpoint of format {FORMAT}")
    return body


def write_meta(path: Path, body: dict[str, Any]) -> None:
    (path / META_NAME).write_text(json.dumps({"format": FORMAT, **body}, separators=(",", ":")))
