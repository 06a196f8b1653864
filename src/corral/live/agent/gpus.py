"""GPU discovery and sampling for a node's agent.

Real GPUs are found through NVML (the ``pynvml`` module of the ``nvidia-ml-py`` package, an optional dependency
imported only when needed). On a machine without GPUs, ``corral serve --gpus N`` declares N *stand-in* GPUs:
jobs run on the CPU with an empty ``CUDA_VISIBLE_DEVICES``, and everything else (scheduling, preemption, the
job channel) works as on real GPUs, so corral can be tried anywhere.

NVML sits behind this module alone: :func:`discover_gpus` and :class:`GpuSampler` are the seam, and tests put
a small fake ``pynvml`` in ``sys.modules``. The agent samples each job's own GPU memory and SM use
(:meth:`GpuSampler.processes`) for AntMan's local coordinator (OSDI'20 §3.3), next to what the job measures of
its mini-batches.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from corral.core.errors import ConfigError

log = logging.getLogger("corral.live.agent.gpus")

MAX_STAND_IN_GPUS = 4096
STAND_IN_NAME = "stand-in"
_STAND_IN_HINT = "`corral serve --gpus N` declares N stand-in GPUs to try corral on a machine without GPUs"

# Words in NVML product names that say nothing about the model ("NVIDIA GeForce RTX 4090" -> "RTX-4090").
_VENDOR_WORDS = frozenset({"nvidia", "tesla", "geforce", "quadro"})


@dataclass(frozen=True, slots=True)
class GpuInfo:
    """One GPU of a node: its NVML index, product name and memory; ``uuid`` is ``None`` for a stand-in."""

    index: int
    name: str
    mem_mib: int
    uuid: str | None
    stand_in: bool

    @property
    def type_name(self) -> str:
        """A short type name for the scheduler's cluster model, e.g. ``H100-80GB`` for an "NVIDIA H100 80GB
        HBM3", ``V100-16GB`` for a "Tesla V100-SXM2-16GB"; ``stand-in`` for a stand-in."""
        if self.stand_in:
            return STAND_IN_NAME
        return f"{_model_token(self.name)}-{round(self.mem_mib / 1024)}GB"


@dataclass(frozen=True, slots=True)
class GpuSample:
    """What NVML says about one GPU right now: ``sm_util`` is the fraction of time a kernel ran over NVML's last
    sample period (0..1, like :attr:`corral.core.telemetry.Telemetry.sm_util`), ``mem_used_mib`` the memory in
    use by all processes. Both ``None`` on a stand-in or when NVML could not answer."""

    index: int
    sm_util: float | None
    mem_used_mib: int | None


@dataclass(frozen=True, slots=True)
class ProcessSample:
    """What NVML says about one process on one GPU: the GPU memory it holds (its CUDA context included) and the
    fraction of NVML's last sample period in which its kernels ran (``None`` when NVML has no utilisation sample
    for it, as between two of NVML's sampling instants)."""

    index: int
    pid: int
    mem_used_mib: int | None
    sm_util: float | None


def _model_token(name: str) -> str:
    """The model part of an NVML product name: vendor words dropped, then the words up to and including the
    first one with a digit, each cut at its first '-' (form-factor suffixes like ``-SXM4-80GB``)."""
    words = [w for w in name.split() if w.lower() not in _VENDOR_WORDS]
    model: list[str] = []
    for word in words:
        model.append(word.split("-", 1)[0] or word)
        if re.search(r"\d", word):
            break
    token = "-".join(model) if model else (name.strip() or "gpu")
    return re.sub(r"[^A-Za-z0-9_.-]", "", token) or "gpu"


def _text(value: Any) -> str:
    # Old pynvml releases return bytes, new ones str.
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _import_nvml() -> ModuleType:
    try:
        return importlib.import_module("pynvml")
    except ImportError:
        raise ConfigError(
            f"no NVIDIA GPU found: nvidia-ml-py is not installed (pip install 'nvidia-ml-py'); {_STAND_IN_HINT}"
        ) from None


def stand_in_gpus(count: int, *, mem_mib: int = 16384) -> list[GpuInfo]:
    """``count`` stand-in GPUs of ``mem_mib`` each; raises :class:`ConfigError` on a bad count."""
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_STAND_IN_GPUS:
        raise ConfigError(f"--gpus: expected a number of stand-in GPUs from 1 to {MAX_STAND_IN_GPUS}, got {count!r}")
    if isinstance(mem_mib, bool) or not isinstance(mem_mib, int) or mem_mib <= 0:
        raise ConfigError(f"stand-in GPU memory: expected a positive number of MiB, got {mem_mib!r}")
    return [GpuInfo(index=i, name=STAND_IN_NAME, mem_mib=mem_mib, uuid=None, stand_in=True) for i in range(count)]


def discover_gpus(stand_in: int | None = None, *, stand_in_mem_mib: int = 16384) -> list[GpuInfo]:
    """The GPUs of this machine, in NVML order; or, with ``stand_in=N``, N stand-in GPUs.

    Raises :class:`ConfigError` when no GPU can be found (NVML missing or failing, or zero devices), saying why
    and how to declare stand-ins instead."""
    if stand_in is not None:
        return stand_in_gpus(stand_in, mem_mib=stand_in_mem_mib)
    nvml = _import_nvml()
    try:
        nvml.nvmlInit()
    except Exception as e:  # pynvml.NVMLError and friends: no driver, no device, permission
        raise ConfigError(
            f"no NVIDIA GPU found: NVML could not start ({_text(e) or type(e).__name__}); {_STAND_IN_HINT}"
        ) from None
    try:
        count = int(nvml.nvmlDeviceGetCount())
        found: list[GpuInfo] = []
        for i in range(count):
            handle = nvml.nvmlDeviceGetHandleByIndex(i)
            name = _text(nvml.nvmlDeviceGetName(handle))
            total = int(nvml.nvmlDeviceGetMemoryInfo(handle).total)
            uuid = _text(nvml.nvmlDeviceGetUUID(handle))
            found.append(GpuInfo(index=i, name=name, mem_mib=total // (1024 * 1024), uuid=uuid, stand_in=False))
    except Exception as e:
        raise ConfigError(
            f"no NVIDIA GPU found: NVML failed while listing GPUs ({_text(e)}); {_STAND_IN_HINT}"
        ) from None
    finally:
        with contextlib.suppress(Exception):  # a library that failed half-way: nothing more to say
            nvml.nvmlShutdown()
    if not found:
        raise ConfigError(f"no NVIDIA GPU found: NVML reports 0 devices; {_STAND_IN_HINT}")
    return found


class GpuSampler:
    """Samples utilisation and memory of a node's GPUs through NVML; stand-ins give ``None`` fields.

    NVML is started on the first :meth:`sample` that needs it and stopped by :meth:`close`. A GPU NVML cannot
    read gives ``None`` fields (logged once), never an exception. Thread-safe."""

    def __init__(self, gpus: Sequence[GpuInfo]) -> None:
        self._gpus = tuple(gpus)
        self._lock = threading.Lock()
        self._nvml: ModuleType | None = None
        self._handles: dict[int, Any] = {}
        self._warned: set[int] = set()
        self._util_seen: dict[int, int] = {}  # per GPU: the timestamp of the newest process sample read (µs)

    def _start(self) -> ModuleType:
        if self._nvml is None:
            nvml = _import_nvml()
            try:
                nvml.nvmlInit()
            except Exception as e:
                raise ConfigError(f"NVML could not start ({_text(e) or type(e).__name__})") from None
            self._nvml = nvml
        return self._nvml

    def sample(self) -> list[GpuSample]:
        """One sample per GPU, in the order the sampler was given them."""
        with self._lock:
            out: list[GpuSample] = []
            for gpu in self._gpus:
                if gpu.stand_in:
                    out.append(GpuSample(gpu.index, None, None))
                    continue
                try:
                    nvml = self._start()
                    handle = self._handles.get(gpu.index)
                    if handle is None:
                        handle = self._handles[gpu.index] = nvml.nvmlDeviceGetHandleByIndex(gpu.index)
                    util = nvml.nvmlDeviceGetUtilizationRates(handle)
                    mem = nvml.nvmlDeviceGetMemoryInfo(handle)
                    out.append(GpuSample(gpu.index, float(util.gpu) / 100.0, int(mem.used) // (1024 * 1024)))
                except Exception as e:  # ConfigError from _start, NVMLError from a call
                    if gpu.index not in self._warned:
                        self._warned.add(gpu.index)
                        log.warning("NVML cannot sample GPU %d (%s): %s", gpu.index, gpu.name, _text(e))
                    out.append(GpuSample(gpu.index, None, None))
            return out

    def processes(self) -> list[ProcessSample]:
        """The processes on each real GPU, with their memory (``nvmlDeviceGetComputeRunningProcesses``) and SM
        use since the previous call (``nvmlDeviceGetProcessUtilization``). Stand-ins and GPUs NVML cannot read
        give nothing (logged once)."""
        with self._lock:
            out: list[ProcessSample] = []
            for gpu in self._gpus:
                if gpu.stand_in:
                    continue
                try:
                    nvml = self._start()
                    handle = self._handles.get(gpu.index)
                    if handle is None:
                        handle = self._handles[gpu.index] = nvml.nvmlDeviceGetHandleByIndex(gpu.index)
                    used: dict[int, int | None] = {}
                    for proc in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
                        mem = getattr(proc, "usedGpuMemory", None)
                        used[int(proc.pid)] = int(mem) // (1024 * 1024) if isinstance(mem, int) else None
                    sm = self._process_util(nvml, handle, gpu.index)
                except Exception as e:
                    if gpu.index not in self._warned:
                        self._warned.add(gpu.index)
                        log.warning("NVML cannot list the processes of GPU %d (%s): %s", gpu.index, gpu.name, _text(e))
                    continue
                for pid in sorted(set(used) | set(sm)):
                    out.append(ProcessSample(gpu.index, pid, used.get(pid), sm.get(pid)))
            return out

    def _process_util(self, nvml: ModuleType, handle: Any, index: int) -> dict[int, float]:
        """SM use per pid over the samples NVML took since the last call (their mean), from
        ``nvmlDeviceGetProcessUtilization``; empty when NVML has no new sample (it raises NotFound then)."""
        since = self._util_seen.get(index, 0)
        try:
            samples = nvml.nvmlDeviceGetProcessUtilization(handle, since)
        except Exception:  # NVMLError_NotFound: no sample since `since`; any other error: no figure this time
            return {}
        sums: dict[int, list[float]] = {}
        latest = since
        for sample in samples:
            stamp = int(getattr(sample, "timeStamp", 0))
            if stamp <= since:
                continue
            latest = max(latest, stamp)
            acc = sums.setdefault(int(sample.pid), [0.0, 0.0])
            acc[0] += float(sample.smUtil)
            acc[1] += 1.0
        self._util_seen[index] = latest
        return {pid: min(1.0, total / count / 100.0) for pid, (total, count) in sums.items()}

    def close(self) -> None:
        """Stop NVML if this sampler started it; idempotent."""
        with self._lock:
            if self._nvml is not None:
                with contextlib.suppress(Exception):
                    self._nvml.nvmlShutdown()
                self._nvml = None
                self._handles.clear()
