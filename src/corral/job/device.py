"""The device seam of the job-side library: how a step's busy time and the job's memory are measured, how a GPU
memory cap is applied, and how tensors move between the GPU and host memory.

The step loop (:mod:`corral.job.loop`), the duty cycle (:mod:`corral.job.throttle`) and the memory ladder
(:mod:`corral.job.memory`) never touch CUDA themselves: they call a :class:`Device`. Two implementations:

- :class:`TorchDevice`, the default, for real jobs. It never imports torch itself: it looks at ``sys.modules``
  to see whether the script uses torch and has initialised CUDA, so a job that does not use torch pays nothing.
  On CUDA it times each step with CUDA events (the GPU's own busy time, AntMan OSDI'20 §3.3 reads mini-batch
  times), applies a memory cap with the caching allocator's per-process limit
  (``torch.cuda.set_per_process_memory_fraction``) plus ``torch.cuda.empty_cache``, keeps activations in pinned
  host memory with ``torch.autograd.graph.save_on_cpu``, and copies tensors to pinned host memory and back for
  eviction. On a CPU (stand-in GPUs) every step is all busy and nothing needs moving.
- :class:`SimulatedDevice`, the seam that lets the memory logic run on a CPU: a model of one GPU's memory that
  counts what a training step keeps "on the device" (parameters, gradients, optimizer state, activations saved
  for the backward pass) and raises PyTorch's own ``torch.OutOfMemoryError`` when that passes the cap, as the
  CUDA caching allocator does. Tests use it with real PyTorch on the CPU; ``examples/train_mlp.py`` can use it
  on stand-in GPUs so that a memory cap has a visible effect there.
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol

from corral.job.pipeline import Destinations

if TYPE_CHECKING:
    import torch

    from corral.job.pipeline import CopyPipeline

_MIB = 1 << 20

SAMPLE_EVERY_S = 0.02
"""An unthrottled CUDA job times one step in this many seconds with CUDA events (at most 50 a second): its reports
average a second or more of steps, so a sample per 20 ms is plenty, and the events' cost per second is bounded
whatever the step time."""


def module_loaded(name: str) -> bool:
    """Whether the script has imported module ``name`` (so using it costs no import)."""
    return sys.modules.get(name) is not None


def cuda_initialized() -> bool:
    """Whether the script has initialised CUDA (without importing torch, or initialising CUDA, if not)."""
    if not module_loaded("torch"):
        return False
    import torch

    return bool(torch.cuda.is_initialized())  # type: ignore[no-untyped-call]


def mib(nbytes: int) -> int:
    """Bytes as MiB, rounded up."""
    return -(-nbytes // _MIB)


class Device(Protocol):
    """What the job-side library asks of the device. Calls come from the training thread only.

    Timing and limits (the step loop): :meth:`begin_step`, :meth:`end_step`, :meth:`peak_mem_mib`,
    :meth:`apply_limits`. Memory (the degradation ladder and eviction): the rest.
    """

    oom_errors: tuple[type[BaseException], ...]
    """The exceptions that mean "out of device memory" (``torch.OutOfMemoryError``)."""

    def begin_step(self) -> None:
        """A step starts now (after the boundary's own work)."""

    def end_step(self, wall_s: float, exact: bool) -> float:
        """The step that began at the last :meth:`begin_step` ended, ``wall_s`` seconds later; return its busy
        time in seconds (at most ``wall_s`` where the device cannot tell). With ``exact`` the device waits for
        the step's work to finish to time it (a throttled job idles anyway); without, it may return an earlier
        step's figure rather than stall the pipeline."""
        ...

    def peak_mem_mib(self) -> int:
        """The device memory the job peaked at since the previous call (MiB, rounded up; 0 on a CPU). Called once
        per report, not per step."""
        ...

    def apply_limits(self, gpu_milli: int | None, mem_mib: int | None) -> int | None:
        """The scheduler set a compute share and/or memory cap (``None``: not set); apply the cap and return the
        memory cap now in force (MiB), or ``None`` when none is applied."""
        ...

    def attach(self, tensors: TensorSource) -> None:
        """The job's model and optimizer, for a device that must know what the job keeps in device memory."""

    def reset_step_peak(self) -> None:
        """Start measuring one step's peak memory."""

    def step_peak_mib(self) -> int:
        """The peak since :meth:`reset_step_peak` (MiB; 0 where the device cannot tell)."""
        ...

    def activations(self, offload: bool) -> AbstractContextManager[object]:
        """A context for a forward and backward pass: with ``offload``, the tensors autograd saves for the
        backward pass are kept in (pinned) host memory and brought back when needed."""
        ...

    def check_fits(self) -> None:
        """Raise an out-of-memory error now if the job already holds more than its cap (called before the
        optimizer updates anything, so a step that cannot fit fails before it changes the model)."""

    def is_host(self, t: torch.Tensor) -> bool:
        """Whether ``t`` lives in host memory (nothing to evict)."""
        ...

    def to_host(self, t: torch.Tensor) -> torch.Tensor:
        """A host-memory copy of device tensor ``t`` (pinned where the device allows, so copies back are fast)."""
        ...

    def to_device(self, t: torch.Tensor, like: torch.device) -> torch.Tensor:
        """Host tensor ``t`` back on device ``like``."""
        ...

    def synchronize(self) -> None:
        """Wait until the copies and kernels issued so far have finished."""

    def release_cached(self) -> None:
        """Give the memory the allocator caches but does not use back to the GPU."""

    def pipeline(self) -> CopyPipeline | None:
        """A side stream for a pipelined restore (:mod:`corral.job.pipeline`), or ``None`` where copies cannot
        overlap computation (a CPU job)."""
        ...


class TensorSource(Protocol):
    """Where a device finds the tensors a job keeps: its parameters and buffers, gradients and optimizer state."""

    def tensors(self) -> Iterator[torch.Tensor]: ...

    def parameters(self) -> Iterator[torch.Tensor]: ...


class TorchDevice:
    """The default device: CUDA events, the caching allocator's limit and statistics, pinned host memory.

    Nothing CUDA-related happens until the script has initialised CUDA itself; a memory cap that arrives before
    that is applied at the first boundary after. On a CPU-only job every method is a cheap no-op: busy time is
    the wall time, memory is 0, tensors are already in host memory.

    Memory figures are the caching allocator's *reserved* memory (``torch.cuda.max_memory_reserved``): that is
    what the job takes from the GPU, and what the per-process limit caps; what its tensors use (allocated) is
    less, by the allocator's cache and fragmentation. Reading a peak resets the allocator's peak counters, once
    per report, and once per step under :meth:`~corral.job.loop.Job.train_step`: a script that reads
    ``torch.cuda.max_memory_reserved`` itself sees the peak since then.
    """

    def __init__(self) -> None:
        import_oom: tuple[type[BaseException], ...] = ()
        if module_loaded("torch"):
            import torch

            import_oom = (torch.OutOfMemoryError,)
        self.oom_errors = import_oom
        self._cuda = False  # the script uses CUDA (checked until it does)
        self._cuda_up: Callable[[], bool] | None = None  # torch.cuda.is_initialized, once torch is imported
        self._pending_cap: int | None = None  # a cap to apply once CUDA is up
        self._cap_mib: int | None = None
        self._events: deque[tuple[Any, Any]] = deque()  # (start, end) CUDA events not yet read
        self._start: Any = None
        self._last_busy_s: float | None = None
        self._exact = False  # the last step was timed exactly (a throttled job): time every step
        self._side: _CudaPipeline | None = None  # the side stream of pipelined restores, made at the first
        self._report_peak = 0  # bytes, since the last report
        self._step_peak = 0  # bytes, since the last reset_step_peak
        self._sampled_at = -math.inf  # perf_counter of the last step whose CUDA events were recorded

    # -- CUDA detection -----------------------------------------------------------------------------------------
    def _probe(self) -> bool:
        if self._cuda:
            return True
        # Asked at every boundary of a job that has not initialised CUDA (a CPU job, forever): keep it to a call.
        cuda_up = self._cuda_up
        if cuda_up is None:
            if not module_loaded("torch"):
                return False
            import torch

            cuda_up = self._cuda_up = torch.cuda.is_initialized
        if cuda_up():
            import torch

            self._cuda = True
            self.oom_errors = (torch.OutOfMemoryError,)
            if self._pending_cap is not None:
                self._set_cap(self._pending_cap)
        return self._cuda

    # -- timing --------------------------------------------------------------------------------------------------
    def begin_step(self) -> None:
        if not self._cuda and not self._probe():
            return
        # Events are timed on one step every SAMPLE_EVERY_S (every step of a throttled job, whose duty cycle
        # needs each step's busy time): creating, recording, querying and reading two events costs about 24 us
        # (H100), which is 2.5% of a 1 ms step if paid at every one.
        now = time.perf_counter()
        if not self._exact and now - self._sampled_at < SAMPLE_EVERY_S:
            return
        self._sampled_at = now
        import torch

        self._start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        self._start.record()

    def end_step(self, wall_s: float, exact: bool) -> float:
        self._exact = exact
        start, self._start = self._start, None
        if start is None:  # a CPU job, or a step between samples: the latest step timed stands for it
            return wall_s if self._last_busy_s is None else self._last_busy_s
        import torch

        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end.record()
        if exact:
            end.synchronize()
            self._events.clear()
            # The GPU's own time: it may run past the CPU's wall time, which only covers queueing the work.
            busy = float(start.elapsed_time(end)) / 1000.0
            self._last_busy_s = busy
            return busy
        # Without waiting: read the oldest steps whose events have completed, keep the rest for later.
        self._events.append((start, end))
        while self._events and self._events[0][1].query():
            s, e = self._events.popleft()
            self._last_busy_s = float(s.elapsed_time(e)) / 1000.0
        while len(self._events) > 64:  # a pipeline this deep never drains: forget the oldest
            self._events.popleft()
        return self._last_busy_s if self._last_busy_s is not None else wall_s

    # -- memory statistics ---------------------------------------------------------------------------------------
    def _read_peak(self) -> None:
        """Fold the allocator's peak counter (one per device) into the report's and the step window's peaks, and
        reset it: the two windows overlap (a report may fall inside a step window), so each keeps its own max."""
        import torch

        peak = 0
        for index in range(torch.cuda.device_count()):
            peak = max(peak, torch.cuda.max_memory_reserved(index))
            torch.cuda.reset_peak_memory_stats(index)
        self._report_peak = max(self._report_peak, peak)
        self._step_peak = max(self._step_peak, peak)

    def peak_mem_mib(self) -> int:
        if not self._probe():  # a CPU job, or one that does not use torch: nothing to measure
            return 0
        self._read_peak()
        peak, self._report_peak = self._report_peak, 0
        return mib(peak)

    def reset_step_peak(self) -> None:
        if self._probe():
            self._read_peak()
            self._step_peak = 0

    def step_peak_mib(self) -> int:
        if not self._cuda:
            return 0
        self._read_peak()
        return mib(self._step_peak)

    # -- limits ---------------------------------------------------------------------------------------------------
    def apply_limits(self, gpu_milli: int | None, mem_mib: int | None) -> int | None:
        if mem_mib is None:
            return self._cap_mib
        if not self._probe():
            self._pending_cap = mem_mib
            return None
        self._set_cap(mem_mib)
        return self._cap_mib

    def _set_cap(self, mem_mib: int) -> None:
        import torch

        for index in range(torch.cuda.device_count()):
            total = torch.cuda.get_device_properties(index).total_memory
            # The allocator's limit covers the tensors it hands out; the CUDA context (a few hundred MiB) comes
            # on top and is part of the scheduler's margin.
            torch.cuda.set_per_process_memory_fraction(min(1.0, mem_mib * _MIB / total), index)
        torch.cuda.empty_cache()  # cached blocks above the new cap go back to the GPU now
        self._cap_mib = mem_mib
        self._pending_cap = None

    # -- moving state -----------------------------------------------------------------------------------------------
    def attach(self, tensors: TensorSource) -> None:
        pass  # the CUDA allocator knows what the job holds

    def activations(self, offload: bool) -> AbstractContextManager[object]:
        if offload and self._cuda:
            from torch.autograd.graph import save_on_cpu

            return save_on_cpu(pin_memory=True)
        return contextlib.nullcontext()

    def check_fits(self) -> None:
        pass  # the allocator raises by itself when an allocation does not fit

    def is_host(self, t: torch.Tensor) -> bool:
        return not t.is_cuda

    def to_host(self, t: torch.Tensor) -> torch.Tensor:
        if not t.is_cuda:
            return t
        import torch

        host = torch.empty(t.size(), dtype=t.dtype, layout=t.layout, pin_memory=True)
        return host.copy_(t, non_blocking=True)

    def to_device(self, t: torch.Tensor, like: torch.device) -> torch.Tensor:
        if like.type == "cpu":
            return t
        return t.to(like, non_blocking=True)

    def synchronize(self) -> None:
        if self._probe():
            import torch

            torch.cuda.synchronize()

    def release_cached(self) -> None:
        if self._probe():
            import torch

            torch.cuda.empty_cache()

    def pipeline(self) -> CopyPipeline | None:
        if not self._probe():
            return None
        if self._side is None:
            self._side = _CudaPipeline()
        return self._side


class _CudaPipeline:
    """Copies on a side stream of the current device; events the compute (current) stream waits for."""

    def __init__(self) -> None:
        import torch

        self._torch = torch
        self._side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
        self._compute = torch.cuda.current_stream()
        self._ready = Destinations()

    def prepare(self, sources: list[tuple[torch.Tensor, torch.device]]) -> None:
        # Every destination allocated before the first copy is queued: an allocation the caching allocator must
        # ask the driver for (cudaMalloc, after an eviction emptied the cache) may wait for the copies queued
        # before it, which would make the pipelined copies synchronous for the CPU.
        with self._torch.cuda.stream(self._side):
            self._ready.fill(sources)

    def copying(self) -> AbstractContextManager[object]:
        return self._torch.cuda.stream(self._side)

    def copy(self, t: torch.Tensor, like: torch.device) -> torch.Tensor:
        ready = self._ready.take(t)
        out = t.to(like, non_blocking=True) if ready is None else ready.copy_(t, non_blocking=True)
        # Made on the side stream, used on the compute stream: the allocator must not reuse its memory before
        # the compute stream is done with it, should it ever be freed.
        out.record_stream(self._compute)
        return out

    def mark(self) -> object:
        event = self._torch.cuda.Event()  # type: ignore[no-untyped-call]
        event.record(self._side)
        return event

    def wait(self, event: object) -> None:
        self._torch.cuda.current_stream().wait_event(event)  # type: ignore[arg-type]

    def finish(self) -> None:
        self._torch.cuda.current_stream().wait_stream(self._side)


class _Saved:
    """An activation saved for the backward pass, counted on the simulated device while it lives."""

    __slots__ = ("device", "key", "tensor")

    def __init__(self, device: SimulatedDevice, key: int, tensor: torch.Tensor) -> None:
        self.device = device
        self.key = key
        self.tensor = tensor

    def __del__(self) -> None:  # autograd frees saved tensors after the backward pass: so does the count
        self.device._drop_activation(self.key)


class SimulatedDevice:
    """A model of one GPU's memory for a job that runs on the CPU.

    What it counts as held "on the device", in bytes of the real tensors: the attached model's parameters and
    buffers, their gradients, the optimizer's state, and the activations autograd saves for the backward pass
    (each storage once, parameters excluded, released when autograd frees them), except tensors moved to "host
    memory" through :meth:`to_host` (and activations kept on the host with ``offload``). When that total would
    pass ``capacity_mib`` or the cap the scheduler set, it raises ``torch.OutOfMemoryError`` with a message in
    the CUDA allocator's words, at the point where a GPU would have failed: while the forward pass saves an
    activation, or at :meth:`check_fits` before the optimizer step. Busy time is the wall time.
    """

    def __init__(self, capacity_mib: int) -> None:
        import torch

        if capacity_mib <= 0:
            raise ValueError(f"SimulatedDevice: capacity_mib must be > 0, got {capacity_mib}")
        self.capacity_mib = capacity_mib
        self.oom_errors: tuple[type[BaseException], ...] = (torch.OutOfMemoryError,)
        self.cap_mib: int | None = None
        self._source: TensorSource | None = None
        # host-memory storages, by address (weak: a storage freed is forgotten, so its address can be reused)
        self._host: weakref.WeakValueDictionary[int, torch.UntypedStorage] = weakref.WeakValueDictionary()
        self._act: dict[int, list[int]] = {}  # storage pointer -> [bytes, references]
        self._act_bytes = 0
        self._param_ptrs: set[int] = set()
        self._static_bytes = 0
        self.pipeline_log: list[tuple[str, object]] = []
        """The operations of pipelined restores, in order (:class:`_LoggedPipeline`)."""
        self._report_peak = 0
        self._step_peak = 0
        self.ooms = 0
        """How many out-of-memory errors it raised."""

    # -- what is held ------------------------------------------------------------------------------------------
    def attach(self, tensors: TensorSource) -> None:
        self._source = tensors
        self._recount()

    def held_bytes(self) -> int:
        """Bytes held on the simulated device right now."""
        self._recount()
        return self._held()

    def _held(self) -> int:
        return self._static_bytes + self._act_bytes

    def _recount(self) -> None:
        """Count the state tensors (parameters, buffers, gradients, optimizer state) held on the device."""
        total = 0
        seen: set[int] = set()
        if self._source is not None:
            for t in self._source.tensors():
                storage = t.untyped_storage()
                ptr = storage.data_ptr()
                if ptr in seen or self._host.get(ptr) is storage:
                    continue
                seen.add(ptr)
                total += storage.nbytes()
            self._param_ptrs = {p.untyped_storage().data_ptr() for p in self._source.parameters()}
        self._static_bytes = total
        self._note()

    def _limit_bytes(self) -> int:
        limit = self.capacity_mib if self.cap_mib is None else min(self.cap_mib, self.capacity_mib)
        return limit * _MIB

    def _note(self) -> None:
        held = self._held()
        self._step_peak = max(self._step_peak, held)
        self._report_peak = max(self._report_peak, held)

    def _oom(self, trying: int) -> None:
        import torch

        self.ooms += 1
        limit = self._limit_bytes()
        tried = f"Tried to allocate {mib(trying)} MiB. " if trying else ""
        raise torch.OutOfMemoryError(
            f"CUDA out of memory (simulated device). {tried}The device has {self.capacity_mib} MiB, this process "
            f"may use {mib(limit)} MiB and holds {mib(self._held())} MiB."
        )

    # -- activations ---------------------------------------------------------------------------------------------
    def _pack(self, t: torch.Tensor) -> object:
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr in self._param_ptrs or self._host.get(ptr) is storage:
            return t  # a parameter (counted as state) or a host tensor: nothing new on the device
        entry = self._act.get(ptr)
        if entry is None:
            nbytes = storage.nbytes()
            if self._held() + nbytes > self._limit_bytes():
                self._oom(nbytes)
            self._act[ptr] = [nbytes, 1]
            self._act_bytes += nbytes
            self._note()
        else:
            entry[1] += 1
        return _Saved(self, ptr, t)

    def _drop_activation(self, key: int) -> None:
        entry = self._act.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] <= 0:
            del self._act[key]
            self._act_bytes -= entry[0]

    @staticmethod
    def _unpack(packed: object) -> torch.Tensor:
        if isinstance(packed, _Saved):
            return packed.tensor
        return packed  # type: ignore[return-value]

    def _pack_to_host(self, t: torch.Tensor) -> object:
        if t.untyped_storage().data_ptr() in self._param_ptrs:
            return t
        return self.to_host(t)

    def _unpack_from_host(self, packed: object) -> torch.Tensor:
        return packed.clone()  # type: ignore[attr-defined, no-any-return]

    def activations(self, offload: bool) -> AbstractContextManager[object]:
        from torch.autograd.graph import saved_tensors_hooks

        self._recount()
        if offload:
            return saved_tensors_hooks(self._pack_to_host, self._unpack_from_host)
        return saved_tensors_hooks(self._pack, self._unpack)

    def check_fits(self) -> None:
        if self.held_bytes() > self._limit_bytes():
            self._oom(0)

    # -- timing, peaks, limits --------------------------------------------------------------------------------------
    def begin_step(self) -> None:
        pass

    def end_step(self, wall_s: float, exact: bool) -> float:
        return wall_s

    def peak_mem_mib(self) -> int:
        held = self.held_bytes()
        peak, self._report_peak = self._report_peak, held
        return mib(peak)

    def reset_step_peak(self) -> None:
        self._step_peak = self.held_bytes()

    def step_peak_mib(self) -> int:
        self._recount()
        return mib(self._step_peak)

    def apply_limits(self, gpu_milli: int | None, mem_mib: int | None) -> int | None:
        if mem_mib is not None:
            self.cap_mib = mem_mib
        return self.cap_mib

    # -- moving state ----------------------------------------------------------------------------------------------
    def is_host(self, t: torch.Tensor) -> bool:
        storage = t.untyped_storage()
        return self._host.get(storage.data_ptr()) is storage

    def to_host(self, t: torch.Tensor) -> torch.Tensor:
        host = t.detach().clone()
        storage = host.untyped_storage()
        self._host[storage.data_ptr()] = storage
        return host

    def to_device(self, t: torch.Tensor, like: torch.device) -> torch.Tensor:
        return t.detach().clone()

    def synchronize(self) -> None:
        pass

    def release_cached(self) -> None:
        self._recount()

    def pipeline(self) -> CopyPipeline | None:
        return _LoggedPipeline(self)


class _LoggedPipeline:
    """A pipelined restore on the simulated device: copies at once (there is one stream, the CPU), and every
    operation appended to the device's :attr:`SimulatedDevice.pipeline_log` so that tests can check its order
    against the forward pass: ``("copy", tensor)``, ``("mark", n)``, ``("wait", n)``, ``("finish", None)``."""

    def __init__(self, device: SimulatedDevice) -> None:
        self._device = device
        self._marks = 0
        self.ready = Destinations()  # as the CUDA pipeline's: a copy lands in the destination prepared for it

    def prepare(self, sources: list[tuple[torch.Tensor, torch.device]]) -> None:
        self.ready.fill(sources)
        self._device.pipeline_log.append(("prepare", len(sources)))

    def copying(self) -> AbstractContextManager[object]:
        return contextlib.nullcontext()

    def copy(self, t: torch.Tensor, like: torch.device) -> torch.Tensor:
        ready = self.ready.take(t)
        out = self._device.to_device(t, like) if ready is None else ready.copy_(t)
        self._device.pipeline_log.append(("copy", out))
        return out

    def mark(self) -> object:
        self._marks += 1
        self._device.pipeline_log.append(("mark", self._marks))
        return self._marks

    def wait(self, event: object) -> None:
        self._device.pipeline_log.append(("wait", event))

    def finish(self) -> None:
        self._device.pipeline_log.append(("finish", None))
