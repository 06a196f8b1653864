"""The device seam of the job-side library: how a step's busy time and the job's memory are measured, and where
GPU limits are applied.

The step loop itself only reads ``time.perf_counter`` and calls a :class:`Device` at each boundary, so the same
logic runs on a CPU-only machine (tests, stand-in GPUs) and on a real GPU. :class:`TorchDevice`, the default,
finds out lazily whether the script uses CUDA: it never imports torch itself, it looks at ``sys.modules``, so a
job that does not use torch pays nothing and the library imports without it.

Planned (not done yet): CUDA events around the step for the GPU's busy time, and applying a memory cap
(emptying the cache, a per-process memory fraction). Until then :meth:`TorchDevice.end_step` returns the wall
time and :meth:`TorchDevice.apply_limits` applies nothing (reports no cap in force).
"""

from __future__ import annotations

import math
import sys
from typing import Protocol

_MIB = 1 << 20


def module_loaded(name: str) -> bool:
    """Whether the script has imported module ``name`` (so using it costs no import)."""
    return sys.modules.get(name) is not None


def cuda_initialized() -> bool:
    """Whether the script has initialised CUDA (without importing torch, or initialising CUDA, if not)."""
    if not module_loaded("torch"):
        return False
    import torch

    return bool(torch.cuda.is_initialized())  # type: ignore[no-untyped-call]


class Device(Protocol):
    """What the step loop asks of the device at each boundary. Calls come from the training thread only."""

    def begin_step(self) -> None:
        """A step starts now (after the boundary's own work)."""

    def end_step(self, wall_s: float) -> float:
        """The step that began at the last :meth:`begin_step` ended, ``wall_s`` seconds later; return its busy
        time in seconds (the device's own work; at most ``wall_s`` where the device cannot tell)."""
        ...

    def peak_mem_mib(self) -> int:
        """The device memory the job's allocator peaked at since the previous call (MiB, rounded up; 0 on a CPU).
        Called once per report, not per step."""
        ...

    def apply_limits(self, gpu_milli: int | None, mem_mib: int | None) -> int | None:
        """The scheduler set a compute share and/or memory cap (``None``: not set); return the memory cap now in
        force (MiB), or ``None`` when none is applied."""
        ...


class TorchDevice:
    """The default device: wall time as busy time; the CUDA caching allocator's peak when the script has
    initialised CUDA, else 0.

    Reading the peak resets it (``torch.cuda.reset_peak_memory_stats``) so that each report covers only its own
    steps; a script that reads ``torch.cuda.max_memory_allocated`` itself sees the peak since the last report.
    """

    def begin_step(self) -> None:
        pass

    def end_step(self, wall_s: float) -> float:
        return wall_s

    def peak_mem_mib(self) -> int:
        if not cuda_initialized():  # a CPU job, or one that does not use torch: nothing to measure
            return 0
        import torch

        peak = 0
        for index in range(torch.cuda.device_count()):
            peak = max(peak, torch.cuda.max_memory_allocated(index))
            torch.cuda.reset_peak_memory_stats(index)
        return math.ceil(peak / _MIB)

    def apply_limits(self, gpu_milli: int | None, mem_mib: int | None) -> int | None:
        return None  # recorded by the Job; acting on them (duty cycle, memory cap) is planned
