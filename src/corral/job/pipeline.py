"""Pipelined restore: an evicted job's state goes back to the GPU in layer groups while its first step computes.

Opt-in (``Job(pipelined_restore=True)``): measured on an H100 it was not faster than a plain restore yet
(docs/measurements.md, section 4). Queuing the copies takes the CPU longer than the copies take the GPU (ResNet-50:
24 ms for ~800 tensors, against 15 ms of copying), with the destinations allocated ahead
(:meth:`CopyPipeline.prepare`) and with the allocator's cache kept alike; one contiguous buffer per group, one copy
each (as PipeSwitch transmits), is the next step.

PipeSwitch (OSDI'20, §4.2 "pipelined model transmission") observed that a model's layers run in order, so the
first layers can compute while the later ones are still on their way to the GPU. Here: when an evicted job
resumes, :meth:`~corral.job.memory.Residency.restore` copies the parameters, buffers and gradients of each group
of consecutive modules on a side stream and records an event after the group; a one-shot forward pre-hook on
each of the group's modules (and on the block it sits in, below the model itself: ``nn.MultiheadAttention``
reads its ``out_proj``'s weight without calling it) makes the compute stream wait for that event only (a wait on
the GPU, not on the CPU), so the step's kernels are queued at once and each layer starts as soon as its own group
has landed. Gradients go first and are waited for at once (a script may zero them in place before the forward
pass); the optimizer's state goes last (it is needed only at ``optimizer.step()``). The restore call itself
returns after queuing the copies; the next boundary (:meth:`PendingRestore.settle`) makes sure all has landed and
removes the hooks left unused.

**Groups** (:func:`plan_groups`), by PipeSwitch's reasoning: a group per layer pays a per-group cost (an event,
a wait, a hook call; :data:`GROUP_OVERHEAD_S`) many times, one group for the whole model overlaps nothing. The
first group is the smallest whose copy takes at least :data:`OVERHEAD_FACTOR` times the per-group cost (so that
cost is at most 1/OVERHEAD_FACTOR of the copy time), and each later group may be twice the one before it: the
first layers start computing after a short copy, the number of groups grows with the logarithm of the model's
size (a ResNet-50 in 4-5 groups), and while group k computes, group k+1 (at most twice its size) is copied.
The copy bandwidth is the one the job's last eviction measured (bytes over seconds), or :data:`DEFAULT_GBPS`.

**Order**: modules are grouped in registration order (``model.modules()``), which is the forward order for
sequential models and most others. Correctness never depends on it: every module waits for its own group's
event, so a module that runs out of order only waits longer. A parameter used outside its module's forward (a
tied weight read directly by the loss) is the one case the hooks may not cover: it is safe only once some
hook has waited for its group or a later one (the side stream copies in order); such a job turns pipelining off
with ``Job(pipelined_restore=False)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

GROUP_OVERHEAD_S = 30e-6
"""A group's own cost on the GPU and the CPU: record an event, make the compute stream wait for it, a hook call
(H100 order of magnitude; the benchmark `benchmarks/gpu_restore.py` prints the restore with and without groups)."""
OVERHEAD_FACTOR = 20
"""The first group's copy takes at least this many times :data:`GROUP_OVERHEAD_S` (overhead <= 5% per group)."""
DEFAULT_GBPS = 20.0
"""Host-to-GPU bandwidth from pinned memory assumed before the job's first eviction has measured one (GB/s)."""


class Destinations:
    """The destinations :meth:`CopyPipeline.prepare` allocated, each found again by the host tensor it is for.

    Keyed by the source's memory (address, dtype, shape), never by its Python object: ``param.data`` makes a new
    tensor object at every access, so the ``id`` of the one seen at ``prepare`` may be reused by another by the
    time of the copy (on an H100, 2026-11-28, that put a gradient into a convolution's weight: a size mismatch).
    Evicted tensors are separate host allocations, so their addresses differ while they live; tensors of no
    elements may share one, and any destination of their shape serves each."""

    __slots__ = ("_by_source",)

    def __init__(self) -> None:
        self._by_source: dict[tuple[int, object, tuple[int, ...]], torch.Tensor] = {}

    @staticmethod
    def _key(t: torch.Tensor) -> tuple[int, object, tuple[int, ...]]:
        return (t.data_ptr(), t.dtype, tuple(t.shape))

    def fill(self, sources: list[tuple[torch.Tensor, torch.device]]) -> None:
        """Allocate a destination like each source on its device (replacing any left from before)."""
        import torch

        self._by_source = {self._key(t): torch.empty_like(t, device=like) for t, like in sources}

    def take(self, t: torch.Tensor) -> torch.Tensor | None:
        """The destination allocated for ``t`` (once), or None when there is none."""
        return self._by_source.pop(self._key(t), None)

    def __len__(self) -> int:
        """Destinations allocated and not taken yet."""
        return len(self._by_source)


class CopyPipeline(Protocol):
    """A side stream for copies, with events the compute stream can wait for (a device's half of the work)."""

    def prepare(self, sources: list[tuple[torch.Tensor, torch.device]]) -> None:
        """The destinations of the copies to come (host tensor, device), allocated now, before any is queued."""

    def copying(self) -> AbstractContextManager[object]:
        """The side stream made current, for a batch of :meth:`copy` (entered once per group: switching streams
        costs the CPU microseconds per switch)."""
        ...

    def copy(self, t: torch.Tensor, like: torch.device) -> torch.Tensor:
        """``t`` (in host memory) copied to ``like``, inside :meth:`copying`, after the copies queued before."""
        ...

    def mark(self) -> object:
        """An event after the copies queued so far."""
        ...

    def wait(self, event: object) -> None:
        """The compute stream waits for ``event`` before its next work (the CPU does not wait)."""
        ...

    def finish(self) -> None:
        """The compute stream waits for every copy queued (the end of a restore)."""
        ...


def first_group_bytes(gbps: float) -> int:
    """The smallest first group: its copy takes :data:`OVERHEAD_FACTOR` x :data:`GROUP_OVERHEAD_S` at ``gbps``."""
    return max(1, int(OVERHEAD_FACTOR * GROUP_OVERHEAD_S * gbps * 1e9))


def plan_groups(sizes: Sequence[int], first_bytes: int) -> list[range]:
    """Consecutive groups of the modules whose state is ``sizes`` bytes each (in forward order): the first at
    least ``first_bytes``, each later one closed once it holds at least twice the one before it (a module is
    never split; modules of 0 bytes join the group they fall in). Every module is in exactly one group."""
    groups: list[range] = []
    start, held, target = 0, 0, max(1, first_bytes)
    for i, size in enumerate(sizes):
        held += size
        if held >= target:
            groups.append(range(start, i + 1))
            start, target, held = i + 1, 2 * held, 0
    if start < len(sizes):
        if groups and held < target // 4:  # a small tail joins the group before it rather than costing one more
            groups[-1] = range(groups[-1].start, len(sizes))
        else:
            groups.append(range(start, len(sizes)))
    return groups


class PendingRestore:
    """What a pipelined restore left behind until the next boundary: the hooks that have not fired yet."""

    def __init__(self, pipe: CopyPipeline) -> None:
        self._pipe = pipe
        self._handles: list[Any] = []

    def wait_before(self, module: Any, event: object) -> None:
        """``module``'s next forward waits for ``event`` (once: the hook removes itself)."""
        pipe, handles = self._pipe, self._handles
        handle: Any = None

        def hook(_module: Any, _args: Any) -> None:
            pipe.wait(event)
            handle.remove()

        handle = module.register_forward_pre_hook(hook)
        handles.append(handle)

    def wait_before_step(self, optimizer: Any, event: object) -> None:
        """The optimizer's next ``step()`` waits for ``event`` (the state it updates)."""
        pipe = self._pipe
        fired = False

        # torch iterates over the optimizer's hooks without a copy: this one cannot remove itself, so it waits
        # once and is removed at settle().
        def hook(_optimizer: Any, _args: Any, _kwargs: Any) -> None:
            nonlocal fired
            if not fired:
                fired = True
                pipe.wait(event)

        self._handles.append(optimizer.register_step_pre_hook(hook))

    def settle(self) -> None:
        """Every copy has been waited for by the compute stream; the hooks that did not fire are removed
        (removing a fired one again is a no-op)."""
        self._pipe.finish()
        for handle in self._handles:
            handle.remove()
        self._handles.clear()


def leaf_modules(model: Any) -> list[Any]:
    """The modules that hold parameters or buffers themselves, in registration order."""
    return [m for m in model.modules() if m._parameters or m._buffers]
