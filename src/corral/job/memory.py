"""GPU memory inside the job: the degradation ladder that lets a training step fit under a cap, and eviction.

AntMan (OSDI'20 §3.1, "dynamic memory scaling") makes a job that is given less GPU memory slow down instead of
failing with out-of-memory: tensors that do not fit stay in host memory. corral's job-side library does the same
at the level a Python library can reach, as a *ladder* of ways to run one training step, each needing less
device memory than the one before and each giving the same parameter update:

1. ``full``: the whole batch in one forward and backward pass.
2. ``micro2``, ``micro4``, ... ``microK``: the batch split into micro-batches whose gradients are accumulated
   (each micro-batch's mean loss weighted by its share of the batch, so the summed gradient is the full batch's);
   activations then scale with the micro-batch, not the batch.
3. ``microK+act-host``: also the activations autograd saves for the backward pass kept in pinned host memory
   (``torch.autograd.graph.save_on_cpu``) and copied back as the backward pass needs them.
4. ``microK+act-host+opt-host``: also the optimizer's state (Adam's moments: twice the model) kept in host
   memory, and the optimizer step run there on host copies of the parameters and gradients (as ZeRO-Offload
   does, Ren et al., ATC'21), the parameters copied back after.

A step that raises out-of-memory is run again one rung down (its partial gradients discarded first). When the cap
changes the ladder uses what it measured: it moves straight down to a rung whose measured peak fits a smaller
cap, and when the cap grows it climbs back one rung per step while the rung above fits (or has not been seen to
fail at a cap this large). What the job needs with no degradation (the ``full`` rung's peak) is reported to the
scheduler as its memory need.

Same update: micro-batching changes nothing for losses that are a mean over samples and models without
batch-dependent layers; BatchNorm computes its statistics per micro-batch, and dropout draws its masks per
micro-batch, so such models get an update of the same expectation, not the same numbers.

Eviction (:class:`Residency`) moves the model's parameters, buffers and gradients and the optimizer's state to
pinned host memory and gives the GPU memory back (Gandiva's suspend, OSDI'18 §3.1, keeps a suspended job's state
in host memory so that resuming it is cheap); restoring copies the same tensors back, bit for bit, into the same
``Parameter`` objects, so the optimizer and the script's references stay valid.

Everything device-specific goes through :class:`~corral.job.device.Device`, so the ladder runs on a CPU with
:class:`~corral.job.device.SimulatedDevice` in tests, and on a GPU with the real allocator.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from corral.job.device import Device
from corral.job.pipeline import (
    DEFAULT_GBPS,
    CopyPipeline,
    PendingRestore,
    first_group_bytes,
    leaf_modules,
    plan_groups,
)

if TYPE_CHECKING:
    import torch

logger = logging.getLogger("corral.job")

DEFAULT_MAX_MICRO_BATCHES = 16

PEAK_FIRST_STEPS = 3
"""Steps of a rung whose peak memory is read after each: a first step needs less (the optimizer makes its state
in it), so the ladder learns a rung's need from its first few steps."""
PEAK_READ_EVERY_S = 0.5
"""After those, the allocator's peak is read at most this often. A read costs tens of microseconds (torch builds
and flattens the allocator's whole statistics dictionary): read and reset at every step it cost 60% of a 1 ms step
on an H100 (docs/measurements.md). The allocator's peak counter keeps the maximum in between, so no peak is
missed, only learnt up to this much later."""


# -- the ladder -----------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Rung:
    """One way to run a training step (see the module docstring)."""

    micro_batches: int
    activations_on_host: bool = False
    optimizer_on_host: bool = False

    @property
    def name(self) -> str:
        words = ["full" if self.micro_batches == 1 else f"micro{self.micro_batches}"]
        if self.activations_on_host:
            words.append("act-host")
        if self.optimizer_on_host:
            words.append("opt-host")
        return "+".join(words)


def build_rungs(max_micro_batches: int = DEFAULT_MAX_MICRO_BATCHES) -> tuple[Rung, ...]:
    """The ladder, best first: micro-batch counts doubling up to ``max_micro_batches``, then activations and then
    the optimizer state in host memory (each rung keeps what the previous one did)."""
    if max_micro_batches < 1:
        raise ValueError(f"max_micro_batches must be >= 1, got {max_micro_batches}")
    rungs: list[Rung] = []
    k = 1
    while k < max_micro_batches:
        rungs.append(Rung(k))
        k *= 2
    rungs.append(Rung(max_micro_batches))
    rungs.append(Rung(max_micro_batches, activations_on_host=True))
    rungs.append(Rung(max_micro_batches, activations_on_host=True, optimizer_on_host=True))
    return tuple(rungs)


class LadderExhausted(Exception):
    """Even the last rung of the ladder does not fit the cap."""


class Ladder:
    """Which rung to use, from the cap and what each rung was seen to need. Pure bookkeeping, no torch.

    ``peak_mib[i]``: the device memory rung ``i`` peaked at when it last ran. ``failed_at[i]``: the largest cap
    (MiB; ``math.inf`` for the whole device) under which rung ``i`` ran out of memory; it is not tried again
    under a cap that small.
    """

    def __init__(self, rungs: Sequence[Rung]) -> None:
        if not rungs:
            raise ValueError("a ladder needs at least one rung")
        self.rungs = tuple(rungs)
        self.index = 0
        self.cap_mib: int | None = None
        self.peak_mib: dict[int, int] = {}
        self.failed_at: dict[int, float] = {}

    @property
    def rung(self) -> Rung:
        return self.rungs[self.index]

    @property
    def need_mib(self) -> int | None:
        """What the job needs with no degradation: the top rung's measured peak, else a lower bound (a cap it was
        seen not to fit), else ``None``."""
        if 0 in self.peak_mib:
            return self.peak_mib[0]
        failed = self.failed_at.get(0)
        return int(failed) + 1 if failed is not None and math.isfinite(failed) else None

    def may_fit(self, i: int) -> bool:
        """Whether rung ``i`` may fit under the current cap, from what was measured (unknown: it may)."""
        cap = math.inf if self.cap_mib is None else self.cap_mib
        if self.failed_at.get(i, -1.0) >= cap:
            return False
        peak = self.peak_mib.get(i)
        return peak is None or peak <= cap

    def _first_fit_below(self, i: int) -> int | None:
        return next((j for j in range(i + 1, len(self.rungs)) if self.may_fit(j)), None)

    def set_cap(self, cap_mib: int | None) -> None:
        """A new cap: a smaller one moves down at once to a rung that may fit (no out-of-memory needed to find
        out); a larger one lets :meth:`succeeded` climb."""
        self.cap_mib = cap_mib
        if not self.may_fit(self.index):
            below = self._first_fit_below(self.index)
            self.index = below if below is not None else len(self.rungs) - 1

    def succeeded(self, i: int, peak_mib: int) -> None:
        """Rung ``i`` ran a step, peaking at ``peak_mib``; climb one rung if the one above may fit. A rung's peak
        is the most it was seen to need (a first step, before the optimizer has made its state, needs less)."""
        self.peak_mib[i] = max(peak_mib, self.peak_mib.get(i, 0))
        if self.index == i and i > 0 and self.may_fit(i - 1):
            self.index = i - 1

    def ran_out(self, i: int) -> None:
        """Rung ``i`` ran out of memory: go down. Raises :class:`LadderExhausted` below the last rung."""
        cap = math.inf if self.cap_mib is None else float(self.cap_mib)
        self.failed_at[i] = max(self.failed_at.get(i, -1.0), cap)
        self.peak_mib.pop(i, None)  # what it measured before no longer fits what it does
        below = self._first_fit_below(i)
        if below is None:
            raise LadderExhausted(f"no rung of the memory ladder fits a cap of {self.cap_mib} MiB")
        self.index = below


# -- batches ---------------------------------------------------------------------------------------------------
def batch_len(batch: Any) -> int:
    """The number of samples in ``batch``: the first dimension of its first tensor (depth first through tuples,
    lists and dicts)."""
    import torch

    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else 1
    items: Iterator[Any]
    if isinstance(batch, dict):
        items = iter(batch.values())
    elif isinstance(batch, tuple | list):
        items = iter(batch)
    else:
        items = iter(())
    for item in items:
        n = batch_len(item)
        if n:
            return n
    return 0


def split_batch(batch: Any, parts: int) -> list[Any]:
    """``batch`` cut into at most ``parts`` micro-batches along the first dimension of every tensor (tuples,
    lists and dicts are walked; other values are given to every micro-batch as they are). Empty parts are left
    out, so a batch of 3 split 4 ways gives 3 micro-batches."""
    import torch

    n = batch_len(batch)
    parts = max(1, min(parts, n))
    if parts == 1:
        return [batch]

    def cut(x: Any) -> list[Any]:
        if isinstance(x, torch.Tensor) and x.dim() and x.shape[0] == n:
            return list(torch.tensor_split(x, parts))
        if isinstance(x, dict):
            cols = {k: cut(v) for k, v in x.items()}
            return [{k: cols[k][i] for k in x} for i in range(parts)]
        if isinstance(x, tuple | list):
            cols_l = [cut(v) for v in x]
            return [_rebuild(x, [c[i] for c in cols_l]) for i in range(parts)]
        return [x] * parts

    return cut(batch)


def _rebuild(like: tuple[Any, ...] | list[Any], items: list[Any]) -> Any:
    if isinstance(like, list):
        return items
    if hasattr(like, "_fields"):  # a namedtuple
        return type(like)(*items)
    return tuple(items)


# -- where the state lives -------------------------------------------------------------------------------------
class _Slot:
    """One tensor of the job's state that was moved to the host, and how to put it back."""

    __slots__ = ("device", "holder", "key", "kind")

    def __init__(self, kind: str, holder: Any, key: Any, device: torch.device) -> None:
        self.kind = kind  # "param" (holder: Parameter), "grad" (holder: Parameter), "item" (holder: dict, key)
        self.holder = holder
        self.key = key
        self.device = device


class Residency:
    """The job's model and optimizer, and moving their tensors between the device and host memory.

    Also the :class:`~corral.job.device.TensorSource` a :class:`~corral.job.device.SimulatedDevice` counts."""

    def __init__(self, model: Any, optimizer: Any, device: Device) -> None:
        self.model = model
        self.optimizer = optimizer
        self.device = device
        self._evicted: list[_Slot] | None = None  # what evict() moved, until restore(); None: not evicted
        self._pending: PendingRestore | None = None  # a pipelined restore not yet settled
        self.copy_gbps = DEFAULT_GBPS
        """Bandwidth between host and device memory, as the last eviction measured it (GB/s): sizes the groups
        of a pipelined restore."""
        self._opt_on_host: list[_Slot] = []
        self._opt_host_mode = False

    @property
    def evicted(self) -> bool:
        return self._evicted is not None

    @property
    def optimizer_on_host(self) -> bool:
        return self._opt_host_mode

    # TensorSource
    def parameters(self) -> Iterator[torch.Tensor]:
        if self.model is not None:
            yield from self.model.parameters()
        elif self.optimizer is not None:
            for group in self.optimizer.param_groups:
                yield from group["params"]

    def tensors(self) -> Iterator[torch.Tensor]:
        import torch

        for p in self.parameters():
            yield p
            if p.grad is not None:
                yield p.grad
        if self.model is not None:
            yield from self.model.buffers()
        if self.optimizer is not None:
            for state in self.optimizer.state.values():
                for v in state.values():
                    if isinstance(v, torch.Tensor):
                        yield v

    # moving
    def _move_param(self, p: torch.Tensor, out: list[_Slot]) -> None:
        dev = self.device
        if not dev.is_host(p.data):
            out.append(_Slot("param", p, None, p.device))
            p.data = dev.to_host(p.data)
        if p.grad is not None and not dev.is_host(p.grad):
            out.append(_Slot("grad", p, None, p.grad.device))
            p.grad = dev.to_host(p.grad)

    def _move_items(self, holder: dict[Any, Any], out: list[_Slot]) -> None:
        import torch

        dev = self.device
        for k, v in list(holder.items()):
            if isinstance(v, torch.Tensor) and not dev.is_host(v):
                out.append(_Slot("item", holder, k, v.device))
                holder[k] = dev.to_host(v)

    def _optimizer_items(self, out: list[_Slot]) -> None:
        if self.optimizer is not None:
            for state in self.optimizer.state.values():
                self._move_items(state, out)

    def _put_back(
        self, slots: list[_Slot], to_device: Callable[[torch.Tensor, torch.device], torch.Tensor] | None = None
    ) -> None:
        put = self.device.to_device if to_device is None else to_device
        # Parameters first: a gradient may only be set on a parameter already on its device.
        for slot in sorted(slots, key=lambda s: s.kind != "param"):
            if slot.kind == "param":
                slot.holder.data = put(slot.holder.data, slot.device)
            elif slot.kind == "grad":
                slot.holder.grad = put(slot.holder.grad, slot.device)
            else:
                slot.holder[slot.key] = put(slot.holder[slot.key], slot.device)
        slots.clear()

    def evict(self) -> None:
        """Move everything to host memory and release the device's cached memory (idempotent)."""
        if self._evicted is not None:
            return
        self.settle()
        t0 = time.perf_counter()
        moved: list[_Slot] = []
        for p in self.parameters():
            self._move_param(p, moved)
        if self.model is not None:
            for module in self.model.modules():
                self._move_items(module._buffers, moved)
        self._optimizer_items(moved)
        self.device.synchronize()  # the copies must land before the device memory they read is reused
        took = time.perf_counter() - t0
        nbytes = sum(_slot_bytes(slot) for slot in moved)
        if took > 0 and nbytes >= 1 << 20:  # too little moved says more about fixed costs than bandwidth
            self.copy_gbps = nbytes / took / 1e9
        self._evicted = moved
        self.device.release_cached()

    @property
    def pending(self) -> bool:
        """A pipelined restore's copies may still be on their way (until :meth:`settle`)."""
        return self._pending is not None

    def restore(self, *, pipelined: bool = False) -> None:
        """Move back what :meth:`evict` moved (idempotent). With ``pipelined``, on a device that can (a GPU) and
        with the model known, in layer groups on a side stream that the next step's layers wait for each
        (:mod:`corral.job.pipeline`): the call returns once the copies are queued; :meth:`settle` at the next
        boundary. Otherwise every copy has landed when it returns."""
        if self._evicted is None:
            return
        slots, self._evicted = self._evicted, None
        pipe = self.device.pipeline() if pipelined and self.model is not None else None
        if pipe is None:
            self._put_back(slots)
            self.device.synchronize()
            return
        self._pending = self._restore_in_groups(slots, pipe)

    def _restore_in_groups(self, slots: list[_Slot], pipe: CopyPipeline) -> PendingRestore:
        modules = leaf_modules(self.model)
        owner: dict[int, int] = {}  # id of a parameter or of a module's buffer dict -> its module's index
        for i, module in enumerate(modules):
            for param in module._parameters.values():
                if param is not None:
                    owner.setdefault(id(param), i)
            owner[id(module._buffers)] = i
        per_module: list[list[_Slot]] = [[] for _ in modules]
        grads: list[_Slot] = []
        loose: list[_Slot] = []  # parameters outside any module (used directly): needed before anything runs
        optimizer: list[_Slot] = []  # the optimizer's state: needed at optimizer.step() only
        for slot in slots:
            at = owner.get(id(slot.holder))
            if slot.kind == "grad":
                grads.append(slot)
            elif at is not None:
                per_module[at].append(slot)
            else:
                (loose if slot.kind == "param" else optimizer).append(slot)
        pending = PendingRestore(pipe)
        # Gradients first, waited for at once: a script may zero them in place (zero_grad(set_to_none=False))
        # before the forward pass and its hooks. They are set on their parameters at the end: a gradient may only
        # be set on a parameter already on its device.
        pipe.prepare([(_slot_tensor(slot), slot.device) for slot in slots])
        with pipe.copying():
            landed = [(slot, pipe.copy(slot.holder.grad, slot.device)) for slot in grads]
            self._put_back(loose, pipe.copy)
        if landed or loose:
            pipe.wait(pipe.mark())
        parents = _parents(self.model)
        sizes = [sum(_slot_bytes(slot) for slot in group) for group in per_module]
        for group in plan_groups(sizes, first_group_bytes(self.copy_gbps)):
            members = [i for i in group if per_module[i]]
            if not members:
                continue
            with pipe.copying():
                self._put_back([slot for i in members for slot in per_module[i]], pipe.copy)
            event = pipe.mark()
            for i in members:
                pending.wait_before(modules[i], event)
                # Its parent too (not the model itself): a block may read a child's parameters without calling
                # the child (nn.MultiheadAttention reads out_proj.weight itself). The wait is on the stream, so
                # whichever hook fires first orders everything after it.
                parent = parents.get(id(modules[i]))
                if parent is not None and parent is not self.model:
                    pending.wait_before(parent, event)
        if optimizer:
            with pipe.copying():
                self._put_back(optimizer, pipe.copy)
            if self.optimizer is not None:
                pending.wait_before_step(self.optimizer, pipe.mark())
        for slot, grad in landed:
            slot.holder.grad = grad
        return pending

    def settle(self) -> None:
        """A pipelined restore's copies are all waited for, its unused hooks removed (no-op when none is)."""
        if self._pending is not None:
            self._pending.settle()
            self._pending = None

    def optimizer_to_host(self) -> None:
        """Keep the optimizer's state in host memory from now on (idempotent)."""
        if not self._opt_host_mode:
            self.settle()  # the state may still be on its way back from a pipelined restore
            self._opt_host_mode = True
            self._optimizer_items(self._opt_on_host)
            self.device.synchronize()
            self.device.release_cached()

    def optimizer_to_device(self) -> None:
        """Bring the optimizer's state back next to its parameters (idempotent)."""
        if not self._opt_host_mode:
            return
        self._opt_host_mode = False
        self._put_back(self._opt_on_host)
        if self.optimizer is None:
            return
        import torch

        dev = self.device
        # State first made in host memory (an optimizer's first step on this rung) joins its parameter. Scalars
        # stay where they are: Adam keeps its step count on the CPU on purpose.
        for param, state in self.optimizer.state.items():
            if dev.is_host(param):
                continue
            for k, v in list(state.items()):
                if isinstance(v, torch.Tensor) and v.dim() > 0 and dev.is_host(v):
                    state[k] = dev.to_device(v, param.device)

    def host_optimizer_step(self) -> None:
        """Run the optimizer step in host memory: parameters and gradients copied to the host, stepped there
        (the state is there already), the parameters copied back; gradients are dropped (they were consumed)."""
        self.settle()
        moved: list[_Slot] = []
        for p in self.parameters():
            if p.grad is not None:
                self._move_param(p, moved)
        self.device.synchronize()
        self.optimizer.step()
        # New state (on a first step) was made next to the host parameters: it stays there, as this rung wants.
        self._optimizer_items(self._opt_on_host)
        params = [s for s in moved if s.kind == "param"]
        for s in moved:
            if s.kind == "grad":
                s.holder.grad = None
        self._put_back(params)


def _parents(model: Any) -> dict[int, Any]:
    """id of each submodule of ``model`` -> the module it is registered in."""
    return {id(child): module for module in model.modules() for child in module.children()}


def _slot_tensor(slot: _Slot) -> torch.Tensor:
    """The host tensor ``slot`` holds while evicted."""
    if slot.kind == "param":
        return slot.holder.data  # type: ignore[no-any-return]
    if slot.kind == "grad":
        return slot.holder.grad  # type: ignore[no-any-return]
    return slot.holder[slot.key]  # type: ignore[no-any-return]


def _slot_bytes(slot: _Slot) -> int:
    t = _slot_tensor(slot)
    return int(t.nelement() * t.element_size())


# -- running a step ----------------------------------------------------------------------------------------------
LossFn = Callable[[Any], "torch.Tensor"]


class ElasticStep:
    """Runs training steps down the ladder. Owned by :class:`~corral.job.loop.Job` (``Job.train_step``)."""

    def __init__(self, residency: Residency, device: Device, *, max_micro_batches: int) -> None:
        self.residency = residency
        self.device = device
        self.ladder = Ladder(build_rungs(max_micro_batches))
        self.steps_retried = 0
        """Steps that ran out of memory and were run again lower down the ladder."""
        self.partial_updates = 0
        """Optimizer steps that ran out of memory part way (see :meth:`run`)."""
        # The peak window: the rung whose steps the allocator's peak counter covers since it was last reset (None:
        # reset it at the next step); the rung whose reads are counted, how many, and when the last one was.
        self._window_rung: int | None = None
        self._counted_rung: int | None = None
        self._rung_reads = 0
        self._last_read = 0.0

    def set_cap(self, cap_mib: int | None) -> None:
        self.ladder.set_cap(cap_mib)
        self._rung_reads = 0  # a new cap may let the ladder climb: read at the next steps, not 0.5 s later

    @property
    def rung(self) -> Rung:
        return self.ladder.rung

    def run(self, batch: Any, loss_fn: LossFn, *, before_step: Callable[[], object] | None = None) -> torch.Tensor:
        """One training step on ``batch``: gradients of ``loss_fn`` (which must return the *mean* loss of the
        micro-batch it is given), accumulated over micro-batches as the ladder says, then ``before_step()``
        (gradient clipping, ...) and the optimizer step. Returns the batch's mean loss (detached).

        An out-of-memory error in the forward or backward pass (or found before the update by the device's
        check) reruns the step one rung down; below the last rung it propagates. One inside ``optimizer.step()``
        cannot be rerun (the update may be partial): it is logged, counted in :attr:`partial_updates`, and the
        next steps run with the optimizer in host memory.
        """
        residency = self.residency
        optimizer = residency.optimizer
        if optimizer is None:
            raise RuntimeError("Job.train_step needs the optimizer: pass Job(optimizer=...)")
        dev = self.device
        n = batch_len(batch)
        while True:
            index = self.ladder.index
            rung = self.ladder.rung
            if rung.optimizer_on_host:
                residency.optimizer_to_host()
            else:
                residency.optimizer_to_device()
            if self._window_rung != index:  # a new rung, or a retry after running out: measure from here
                dev.reset_step_peak()
                self._window_rung = index
            out_of_memory: BaseException | None = None
            loss_sum: torch.Tensor | None = None
            try:
                optimizer.zero_grad(set_to_none=True)
                with dev.activations(rung.activations_on_host):
                    for chunk in split_batch(batch, rung.micro_batches):
                        weight = batch_len(chunk) / n if n else 1.0
                        loss = loss_fn(chunk)
                        (loss * weight if weight != 1.0 else loss).backward()  # type: ignore[no-untyped-call]
                        part = loss.detach() * weight if weight != 1.0 else loss.detach()  # no kernel for * 1
                        loss_sum = part if loss_sum is None else loss_sum + part
                        del loss
                dev.check_fits()
            except dev.oom_errors as e:
                out_of_memory = e
            if out_of_memory is not None:
                loss_sum = None
                self._window_rung = None
                optimizer.zero_grad(set_to_none=True)
                dev.release_cached()
                try:
                    self.ladder.ran_out(index)
                except LadderExhausted:
                    out_of_memory.add_note(f"corral.job: the memory ladder is exhausted ({rung.name} did not fit)")
                    raise out_of_memory from None
                self.steps_retried += 1
                logger.info("corral.job: out of memory at %s, running the step at %s", rung.name, self.ladder.rung.name)
                del out_of_memory
                continue
            if before_step is not None:
                before_step()
            self._optimizer_step(rung)
            self._read_peak(index)
            assert loss_sum is not None
            return loss_sum

    def _read_peak(self, index: int) -> None:
        """Tell the ladder rung ``index``'s peak after its first steps, then at most every
        :data:`PEAK_READ_EVERY_S` (the counter spans the steps in between, all on this rung)."""
        if index != self._counted_rung:
            self._counted_rung, self._rung_reads = index, 0
        now = time.monotonic()
        if self._rung_reads < PEAK_FIRST_STEPS or now - self._last_read >= PEAK_READ_EVERY_S:
            self._rung_reads += 1
            self._last_read = now
            self._window_rung = None
            self.ladder.succeeded(index, self.device.step_peak_mib())

    def _optimizer_step(self, rung: Rung) -> None:
        if rung.optimizer_on_host:
            self.residency.host_optimizer_step()
            return
        try:
            self.residency.optimizer.step()
        except self.device.oom_errors:
            self.partial_updates += 1
            logger.warning(
                "corral.job: out of memory inside optimizer.step(): this step's update may be partial; the next "
                "steps keep the optimizer state in host memory"
            )
            self.residency.optimizer.zero_grad(set_to_none=True)
            self.device.release_cached()
            ladder = self.ladder
            cap = math.inf if ladder.cap_mib is None else float(ladder.cap_mib)
            last = len(ladder.rungs) - 1
            for i in range(ladder.index, last):
                ladder.failed_at[i] = max(ladder.failed_at.get(i, -1.0), cap)
            ladder.index = last
