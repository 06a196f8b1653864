"""A guaranteed and an opportunistic training job on ONE GPU, with and without corral's coordinator (issue 6).

Four phases, each a fresh set of processes:

- ``a``: the guaranteed job alone (its solo step time: the reference for its slowdown);
- ``b``: the opportunistic job alone (its solo throughput);
- ``c``: both at the same time, both at full share, no coordinator (what plain co-location costs);
- ``d``: both under corral's coordinator: the guaranteed job starts alone (so the coordinator learns its step
  time), then the opportunistic one joins, and AntMan's local coordinator (:mod:`corral.policies.antman.coordinator`)
  sets its compute share and memory cap from the jobs' step reports and NVML.

Phase ``d`` runs one of two ways, and the output says which:

- ``stack`` (the default when FastAPI and uvicorn are installed): the real live stack. ``corral serve`` with the
  ``antman`` policy on the machine's real GPU, tenants ``alice`` (quota 1, the guaranteed job) and ``bob``
  (quota 0, the opportunistic job), both submitted through :class:`corral.live.client.Client`; the controller's
  own agent starts them, samples NVML, feeds the policy, and sends the shares and caps it decides.
- ``loop``: corral's real :class:`~corral.live.agent.Agent` starts the two jobs and the SAME
  :class:`~corral.policies.antman.coordinator.LocalCoordinator` decides in a small loop here, fed with the controller's
  own conversion of step reports and NVML samples to telemetry (no HTTP server, no global scheduler).

The jobs are this file run with ``--worker``: a training script that uses ``corral.job`` (``Job(model=...,
optimizer=...)``, ``job.loop``, ``job.train_step``), so that the shares and caps the coordinator sends are
applied by the library (duty cycle, memory fraction, degradation ladder). Each worker syncs at the end of every
step (``loss.item()``) and writes one record per step (end time, step time, share, cap, ladder rung).

What is reported:

- the guaranteed job's median step time in each phase, and its slowdown (median step time / solo median step
  time, phase ``a``) without (``c``) and with (``d``) the coordinator: target at most 1.05 with it;
- the opportunistic job's throughput (samples/s) as a fraction of its solo throughput (phase ``b``);
- GPU utilization sampled with NVML (``pynvml``) every ``--nvml-period`` seconds: the share of time a kernel ran
  (``nvmlDeviceGetUtilizationRates().gpu``), memory-controller busy time (``.memory``), memory used, and on
  Hopper and later the GPM metrics SM utilization, SM occupancy and DRAM bandwidth utilization; means over each
  phase's window, set against phase ``a``.

Warm-up is excluded: each phase's window starts ``--warmup-seconds`` after the later job's first step (and skips
each job's first ``--warmup-steps`` steps); phase ``d`` is also reported from ``--settle-seconds`` after the
opportunistic job's first step, once the coordinator has found its share. Medians over every step in a window.

Without CUDA (or with ``--smoke``) everything runs on the CPU with tiny models, stand-in GPUs and
:class:`~corral.job.device.SimulatedDevice` for memory caps, to check the code paths: a CPU smoke run, not a GPU
figure.

    python benchmarks/gpu_colocation.py                        # on a GPU machine: about 6-7 minutes
    python benchmarks/gpu_colocation.py --json out.json
    python benchmarks/gpu_colocation.py --coordinator loop     # phase d without the HTTP server
    python benchmarks/gpu_colocation.py --phases a,d --guaranteed-model transformer
    python benchmarks/gpu_colocation.py --smoke                # CPU smoke run (about 1 minute)
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import json
import math
import os
import platform
import queue
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from corral.core.telemetry import Telemetry
    from corral.live.agent import Agent, AgentReport
    from corral.policies.antman.coordinator import Plan

ROOT = Path(__file__).resolve().parent.parent
SMOKE_NOTE = "CPU smoke run: not a GPU figure"
TARGET_SLOWDOWN = 1.05
MIB = 1 << 20
ENV_PREFIX = "CORRAL_"
MODELS = ("resnet50", "resnet18", "transformer", "bert-base", "tiny-cnn", "tiny-mlp")


# ==============================================================================================================
# Machine information and NVML sampling (shared with gpu_memory.py and bench_job_overhead.py)
# ==============================================================================================================
def cuda_available() -> bool:
    """Whether torch sees a CUDA GPU (without creating a CUDA context in this process)."""
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def _nvml() -> Any | None:
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:
        return None
    return pynvml


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def machine_info(*, smoke: bool, torch_cuda: bool = False, gpu: int = 0) -> dict[str, Any]:
    """What the figures were measured on. ``torch_cuda``: ask torch for the GPU's properties too (this creates a
    CUDA context: only in a process that uses the GPU itself)."""
    info: dict[str, Any] = {
        "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "smoke": smoke,
    }
    try:
        import torch

        info["torch"] = torch.__version__
        info["cuda_runtime"] = torch.version.cuda
        if torch_cuda and torch.cuda.is_available():
            props = torch.cuda.get_device_properties(gpu)
            info["gpu"] = props.name
            info["gpu_mem_mib"] = props.total_memory // MIB
            info["sms"] = props.multi_processor_count
    except ImportError:
        info["torch"] = None
    try:
        import torchvision

        info["torchvision"] = torchvision.__version__
    except ImportError:
        info["torchvision"] = None
    nvml = _nvml()
    if nvml is not None:
        try:
            info["driver"] = _text(nvml.nvmlSystemGetDriverVersion())
            if nvml.nvmlDeviceGetCount() > gpu:
                handle = nvml.nvmlDeviceGetHandleByIndex(gpu)
                info.setdefault("gpu", _text(nvml.nvmlDeviceGetName(handle)))
                info.setdefault("gpu_mem_mib", int(nvml.nvmlDeviceGetMemoryInfo(handle).total) // MIB)
        except Exception as e:  # NVML errors: the figures still stand without these
            info["nvml_error"] = repr(e)
    return info


def machine_lines(info: dict[str, Any]) -> list[str]:
    """``info`` in two lines, for the top of a report."""
    gpu = info.get("gpu")
    where = f"GPU: {gpu} ({info.get('gpu_mem_mib')} MiB, driver {info.get('driver', '?')})" if gpu else "GPU: none"
    lines = [
        f"{where} | torch {info.get('torch')} (CUDA {info.get('cuda_runtime')}) | torchvision "
        f"{info.get('torchvision')} | Python {info.get('python')} | {info.get('cpus')} CPUs | {info['date_utc']} UTC"
    ]
    if info.get("smoke"):
        lines.append(f"*** {SMOKE_NOTE} ***")
    return lines


@dataclass(slots=True)
class NvmlSample:
    t: float  # time.time()
    gpu_util: float | None  # % of the period a kernel ran
    mem_util: float | None  # % of the period device memory was read or written
    mem_used_mib: float | None
    sm_util: float | None = None  # GPM (Hopper+): % of SMs busy
    sm_occupancy: float | None = None  # GPM: % of the warps an SM can hold
    dram_bw_util: float | None = None  # GPM: % of peak DRAM bandwidth


class NvmlSampler:
    """Samples one GPU with NVML on a thread every ``period_s`` (``available`` is False without NVML: a CPU run).

    NVML's utilization rates are themselves averages over the driver's own sample period (1/6 s to 1 s by
    product), so a period of a few tenths of a second reads every value the driver has. GPM metrics are taken
    between consecutive samples where the GPU supports them (Hopper and later)."""

    _GPM = (("sm_util", "NVML_GPM_METRIC_SM_UTIL"), ("sm_occupancy", "NVML_GPM_METRIC_SM_OCCUPANCY"),
            ("dram_bw_util", "NVML_GPM_METRIC_DRAM_BW_UTIL"))  # fmt: skip

    def __init__(self, index: int = 0, period_s: float = 0.2) -> None:
        self.period_s = period_s
        self.samples: list[NvmlSample] = []
        self.gpm = False
        self.reason = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nv = _nvml()
        self._handle: Any = None
        self._gpm_samples: list[Any] = []
        if self._nv is None:
            self.reason = "no NVML (pynvml missing or no driver)"
            return
        try:
            self._handle = self._nv.nvmlDeviceGetHandleByIndex(index)
        except Exception as e:
            self.reason = f"NVML has no GPU {index}: {e!r}"
            self._nv = None
            return
        with contextlib.suppress(Exception):
            nv = self._nv
            if (
                all(hasattr(nv, name) for _, name in self._GPM)
                and nv.nvmlGpmQueryDeviceSupport(self._handle).isSupportedDevice
            ):
                self._gpm_samples = [nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()]
                nv.nvmlGpmSampleGet(self._handle, self._gpm_samples[0])
                self.gpm = True

    @property
    def available(self) -> bool:
        return self._nv is not None

    def start(self) -> NvmlSampler:
        if self.available and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="nvml-sampler", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._nv is not None:
            for s in self._gpm_samples:
                with contextlib.suppress(Exception):
                    self._nv.nvmlGpmSampleFree(s)
            self._gpm_samples = []

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            with contextlib.suppress(Exception):
                self.samples.append(self.sample())

    def sample(self) -> NvmlSample:
        nv, h = self._nv, self._handle
        assert nv is not None
        gpu = mem = used = None
        with contextlib.suppress(Exception):
            rates = nv.nvmlDeviceGetUtilizationRates(h)
            gpu, mem = float(rates.gpu), float(rates.memory)
        with contextlib.suppress(Exception):
            used = int(nv.nvmlDeviceGetMemoryInfo(h).used) / MIB
        s = NvmlSample(time.time(), gpu, mem, used)
        if self.gpm:
            with contextlib.suppress(Exception):
                first, second = self._gpm_samples
                nv.nvmlGpmSampleGet(h, second)
                request = nv.c_nvmlGpmMetricsGet_t()
                request.version = nv.NVML_GPM_METRICS_GET_VERSION
                request.numMetrics = len(self._GPM)
                request.sample1, request.sample2 = first, second
                for i, (_, name) in enumerate(self._GPM):
                    request.metrics[i].metricId = getattr(nv, name)
                nv.nvmlGpmMetricsGet(request)
                for i, (attr, _) in enumerate(self._GPM):
                    metric = request.metrics[i]
                    if metric.nvmlReturn == 0 and math.isfinite(float(metric.value)):
                        setattr(s, attr, float(metric.value))
                self._gpm_samples = [second, first]
        return s

    def summary(self, t0: float, t1: float) -> dict[str, float | int | None] | None:
        """Means of each figure over the samples taken in ``[t0, t1]``; ``None`` without NVML."""
        if not self.available:
            return None
        inside = [s for s in self.samples if t0 <= s.t <= t1]
        out: dict[str, float | int | None] = {"samples": len(inside), "period_s": self.period_s}
        for name in ("gpu_util", "mem_util", "mem_used_mib", "sm_util", "sm_occupancy", "dram_bw_util"):
            values = [v for v in (getattr(s, name) for s in inside) if v is not None]
            out[name] = round(statistics.fmean(values), 2) if values else None
        used = [s.mem_used_mib for s in inside if s.mem_used_mib is not None]
        out["mem_used_max_mib"] = round(max(used)) if used else None
        return out


def write_json(path: str | None, result: dict[str, Any], *, quiet: bool = False) -> None:
    if path:
        Path(path).write_text(json.dumps(result, indent=2, default=str) + "\n", encoding="utf-8")
        if not quiet:
            print(f"results written to {path}")


# ==============================================================================================================
# Workloads (shared with gpu_memory.py): a model, a few synthetic batches, and the loss of a micro-batch
# ==============================================================================================================
@dataclass(slots=True)
class Workload:
    name: str
    model: Any
    batches: list[Any]
    loss_fn: Callable[[Any], Any]
    batch: int


def pick_device(wanted: str) -> torch.device:
    import torch

    if wanted == "cuda" or (wanted == "auto" and torch.cuda.is_available()):
        if os.environ.get("CUDA_VISIBLE_DEVICES") == "":  # a stand-in GPU: the agent hides the real ones
            return torch.device("cpu")
        return torch.device("cuda")
    return torch.device("cpu")


def build_workload(name: str, batch: int, device: torch.device, *, precision: str = "bf16", sets: int = 4) -> Workload:
    """A model on ``device`` and ``sets`` batches of random data (rotated, never zeros: METHOD). ``precision``
    ``bf16`` runs the forward pass under autocast on CUDA (as most training does); the loss is in float32."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    cuda = device.type == "cuda"
    channels_last = False
    tokens = 0  # > 0: the inputs are token ids below it (a language model), not floats
    if name in ("resnet50", "resnet18"):
        try:
            import torchvision
        except ImportError:
            raise SystemExit(f"--model {name} needs torchvision (or choose --model transformer)") from None
        model = getattr(torchvision.models, name)(num_classes=1000)
        shape, classes, channels_last = (3, 224, 224), 1000, cuda
    elif name == "transformer":
        layer = nn.TransformerEncoderLayer(1024, 16, 4096, dropout=0.0, batch_first=True, norm_first=True)
        model = nn.Sequential(nn.TransformerEncoder(layer, 12, enable_nested_tensor=False), nn.Linear(1024, 1000))
        shape, classes = (512, 1024), 1000
    elif name == "bert-base":  # BERT-base's shape: 30,522-token embedding, 12 layers of 768, 12 heads, FF 3,072
        layer = nn.TransformerEncoderLayer(768, 12, 3072, dropout=0.0, batch_first=True, activation="gelu")
        encoder = nn.TransformerEncoder(layer, 12, enable_nested_tensor=False)
        model = nn.Sequential(nn.Embedding(30522, 768), encoder, nn.Linear(768, 2))
        shape, classes, tokens = (128,), 2, 30522
    elif name == "tiny-cnn":
        model = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(16, 32, 3, stride=2, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(32, 10),
        )
        shape, classes = (3, 32, 32), 10
    elif name == "tiny-mlp":  # activation-heavy: few parameters, wide activations (memory caps bite on a CPU)
        model = nn.Sequential(nn.Linear(16, 2048), nn.ReLU(), nn.Linear(2048, 10))
        shape, classes = (16,), 10
    else:
        raise SystemExit(f"unknown model {name!r}; one of {', '.join(MODELS)}")
    model = model.to(device)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    batches = []
    for _ in range(sets):
        x = (
            torch.randint(0, tokens, (batch, *shape), generator=g)
            if tokens
            else torch.randn(batch, *shape, generator=g)
        )
        y = torch.randint(0, classes, (batch,), generator=g)
        x = x.to(device)
        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        batches.append((x, y.to(device)))
    autocast = cuda and precision == "bf16"

    def loss_fn(b: Any) -> Any:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            out = model(b[0])
        if out.dim() == 3:  # the transformer: one prediction per sequence, from its mean token
            out = out.mean(dim=1)
        return F.cross_entropy(out.float(), b[1])

    return Workload(name, model, batches, loss_fn, batch)


class Rotate:
    """An endless iterable over a few batches (``job.loop`` takes any iterable)."""

    def __init__(self, batches: Sequence[Any]) -> None:
        self.batches = batches

    def __iter__(self) -> Iterator[Any]:
        i = 0
        while True:
            yield self.batches[i % len(self.batches)]
            i += 1


# ==============================================================================================================
# The worker: a training script that uses corral.job
# ==============================================================================================================
def worker_main(ns: argparse.Namespace) -> None:
    """Train ``ns.model`` under ``corral.job`` until ``ns.seconds`` after its first step, ``ns.steps`` steps, or
    ``ns.stop_file`` exists; write one record per step to ``ns.out`` (JSON) at the end."""
    import torch

    from corral.core import contract
    from corral.job import Job
    from corral.job.device import SimulatedDevice

    started = time.time()
    device = pick_device(ns.device)
    if device.type == "cpu":
        torch.set_num_threads(ns.threads)
    else:
        torch.backends.cudnn.benchmark = True
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    w = build_workload(ns.model, ns.batch, device, precision=ns.precision)
    optimizer = torch.optim.SGD(w.model.parameters(), lr=0.01, momentum=0.9)
    simulated = None
    if device.type == "cpu" and ns.simulated_gpu_mib:
        simulated = SimulatedDevice(capacity_mib=ns.simulated_gpu_mib)
    cuda = device.type == "cuda"
    rows: list[list[Any]] = []
    reserved_max = 0
    stop_file = Path(ns.stop_file) if ns.stop_file else None
    first: float | None = None
    why = "steps"
    # No checkpoints: a benchmark's job has nothing to resume, and saving one would only cost time at the end.
    env = {k: v for k, v in os.environ.items() if k != contract.ENV_CHECKPOINT_DIR}
    job = Job(model=w.model, optimizer=optimizer, batch_size=w.batch, device=simulated, env=env, verbose=False)
    # A job the coordinator paused (share 0) never reaches its own deadline: past it, ask the library to stop it at
    # its boundary (where it waits), as a preemption would, and count that as the end of the run.
    time_up = threading.Event()
    timer: threading.Timer | None = None

    def stop_paused() -> None:
        time_up.set()
        job.request_checkpoint(reason="the benchmark's time is up")

    try:
        with job:
            prev = time.time()
            for batch in job.loop(Rotate(w.batches)):
                loss = job.train_step(batch, w.loss_fn)
                loss.item()  # wait for the GPU: the step ends when its work has run
                now = time.time()
                rows.append([round(now, 6), round(now - prev, 6), job.gpu_milli, job.mem_cap_mib, job.mem_mode])
                prev = now
                if cuda:
                    reserved_max = max(reserved_max, torch.cuda.memory_reserved())
                if first is None:
                    first = now
                    if ns.seconds and not job.standalone:
                        timer = threading.Timer(ns.seconds + ns.grace, stop_paused)
                        timer.daemon = True
                        timer.start()
                if ns.steps and len(rows) >= ns.steps:
                    break
                if ns.seconds and now - first >= ns.seconds:
                    why = "seconds"
                    break
                if stop_file is not None and stop_file.exists():
                    why = "stop file"
                    break
    except SystemExit as e:
        if not (time_up.is_set() and e.code == contract.EXIT_PREEMPTED):
            raise
        why = "time up while paused"
    finally:
        if timer is not None:
            timer.cancel()
        result = {
            "role": ns.role,
            "model": ns.model,
            "batch": w.batch,
            "device": str(device),
            "pid": os.getpid(),
            "standalone": job.standalone,
            "job_id": job.job_id,
            "started": started,
            "ended": time.time(),
            "stopped_by": why,
            "peak_reserved_mib": reserved_max // MIB,
            "columns": ["end", "step_s", "share_milli", "cap_mib", "rung"],
            "steps": rows,
        }
        if ns.out:
            tmp = Path(ns.out + ".tmp")
            tmp.write_text(json.dumps(result), encoding="utf-8")
            tmp.replace(ns.out)
    print(f"worker {ns.role}: {len(rows)} steps on {device}, stopped by {why}", flush=True)


def worker_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="the training job the benchmark runs (corral.job)")
    p.add_argument("--worker", action="store_true")
    p.add_argument("--role", default="job")
    p.add_argument("--model", default="resnet50", choices=MODELS)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--precision", default="bf16", choices=("bf16", "fp32"))
    p.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"))
    p.add_argument("--threads", type=int, default=1, help="CPU threads (CPU runs)")
    p.add_argument("--seconds", type=float, default=0.0, help="stop this long after the first step")
    p.add_argument("--steps", type=int, default=0, help="stop after this many steps")
    p.add_argument("--stop-file", help="stop when this file exists")
    p.add_argument("--grace", type=float, default=5.0, help="under an agent: stop a paused job this long after "
                   "--seconds")  # fmt: skip
    p.add_argument("--simulated-gpu-mib", type=int, default=0, help="CPU runs: model a GPU of this many MiB")
    p.add_argument("--out", help="write the per-step records here (JSON)")
    return p


# ==============================================================================================================
# What a worker wrote, and the figures of a window of it
# ==============================================================================================================
@dataclass(slots=True)
class Series:
    role: str
    batch: int
    ends: list[float]
    step_s: list[float]
    shares: list[int | None]
    caps: list[int | None]
    rungs: list[str | None]
    peak_reserved_mib: int = 0
    info: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path) -> Series:
        data = json.loads(path.read_text(encoding="utf-8"))
        return cls.from_dict(data)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Series:
        rows = data["steps"]
        info = {k: v for k, v in data.items() if k != "steps"}
        return cls(
            role=data["role"],
            batch=int(data["batch"]),
            ends=[r[0] for r in rows],
            step_s=[r[1] for r in rows],
            shares=[r[2] for r in rows],
            caps=[r[3] for r in rows],
            rungs=[r[4] for r in rows],
            peak_reserved_mib=int(data.get("peak_reserved_mib") or 0),
            info=info,
        )

    @property
    def first(self) -> float:
        return self.ends[0] if self.ends else math.nan

    @property
    def last(self) -> float:
        return self.ends[-1] if self.ends else math.nan

    def indices(self, t0: float, t1: float, skip: int = 0) -> list[int]:
        """Steps that began at or after ``t0`` and ended by ``t1``, leaving out the first ``skip`` steps."""
        return [i for i in range(skip, len(self.ends)) if self.ends[i] - self.step_s[i] >= t0 and self.ends[i] <= t1]


def window_stats(s: Series, t0: float, t1: float, skip: int = 0) -> dict[str, Any] | None:
    """Median, p90 and mean step time, throughput and the shares and rungs seen over ``[t0, t1]`` (``None`` for an
    empty window). Throughput counts the steps done inside the window over its length, so a job paused for part
    of it is charged for the pause."""
    span = t1 - t0
    if not span > 0:
        return None
    idx = s.indices(t0, t1, skip)
    times = sorted(s.step_s[i] for i in idx)
    shares = [s.shares[i] if s.shares[i] is not None else 1000 for i in idx]
    rungs: dict[str, int] = {}
    for i in idx:
        key = s.rungs[i] or "-"
        rungs[key] = rungs.get(key, 0) + 1
    return {
        "steps": len(idx),
        "window_s": round(span, 3),
        "median_step_ms": round(statistics.median(times) * 1e3, 3) if times else None,
        "p90_step_ms": round(times[min(len(times) - 1, int(0.9 * len(times)))] * 1e3, 3) if times else None,
        "mean_step_ms": round(statistics.fmean(times) * 1e3, 3) if times else None,
        "samples_per_s": round(len(idx) * s.batch / span, 2),
        "median_share_milli": statistics.median(shares) if shares else None,
        "rungs": rungs,
    }


def share_changes(s: Series, since: float) -> list[list[float | int | None]]:
    """``[seconds after since, share, cap]`` at each step where the share or the cap changed."""
    out: list[list[float | int | None]] = []
    last: tuple[int | None, int | None] | None = None
    for t, share, cap in zip(s.ends, s.shares, s.caps, strict=True):
        if (share, cap) != last:
            out.append([round(t - since, 2), share, cap])
            last = (share, cap)
    return out


# ==============================================================================================================
# The coordinator loop of mode "loop": the real agent, the real LocalCoordinator
# ==============================================================================================================
GUARANTEED, OPPORTUNISTIC = "guaranteed", "opportunistic"


class CoordinatorLoop:
    """AntMan's local coordinator over one GPU with one guaranteed job (a holder) and one opportunistic job (a
    guest), as the ``antman`` policy runs it (observe each holder report, then one :meth:`LocalCoordinator.step`
    when something changed or a check is due), but without the global scheduler. ``send(job_id, limits)`` and
    ``evict(job_id)`` carry its decisions out (to the agent). Times are seconds on any monotonic clock."""

    def __init__(
        self,
        *,
        gpu_mem_mib: int,
        guaranteed_mem_mib: int,
        guest_need_mib: int,
        send: Callable[[str, Any], object],
        evict: Callable[[str], object],
        control_interval_s: float,
        start_milli: int = 100,
        slowdown_threshold: float = 0.05,
        mem_margin_mib: int = 512,
    ) -> None:
        from corral.policies.antman.coordinator import CoordinatorConfig, LocalCoordinator

        self.coordinator = LocalCoordinator(
            CoordinatorConfig(
                slowdown_threshold=slowdown_threshold,
                control_interval_s=control_interval_s,
                mem_margin_mib=mem_margin_mib,
            )
        )
        self.gpu_mem_mib = gpu_mem_mib
        self.reserved_mib = min(guaranteed_mem_mib, gpu_mem_mib)
        self.guest_need_mib = guest_need_mib
        self.start_milli = start_milli
        self.send = send
        self.evict_fn = evict
        self.guest_placed = False
        self.guest_evicted = False
        self.share = 0
        self.cap = 0
        self.telemetry: dict[str, Telemetry] = {}
        self.measured: dict[str, Any] = {}
        self.dirty = False
        self.log: list[tuple[float, str, str]] = []  # (time, job, what): every decision carried out

    # -- jobs coming --------------------------------------------------------------------------------------------
    def place_guest(self, now: float) -> tuple[int, int]:
        """The opportunistic job joins: its first share (``start_milli`` beside a holder) and memory cap (its
        need, or what the holder's reservation leaves less the margin), as the ``antman`` policy places it."""
        margin = self.coordinator.config.mem_margin_mib
        free = self.gpu_mem_mib - self.reserved_mib
        self.share = self.start_milli
        self.cap = max(0, min(self.guest_need_mib, free - margin))
        self.guest_placed = True
        self.coordinator.touched(OPPORTUNISTIC, now)
        self.log.append((now, OPPORTUNISTIC, f"placed at {self.share} milli, {self.cap} MiB"))
        return self.share, self.cap

    def guest_gone(self) -> None:
        self.guest_placed = False
        self.coordinator.forget(OPPORTUNISTIC)

    # -- what the jobs say --------------------------------------------------------------------------------------
    def report(self, report: AgentReport, now: float) -> None:
        """One report from the agent (step reports, NVML samples, hello)."""
        from corral.core import contract
        from corral.live.agent import JobMeasured, JobReported, JobSaid
        from corral.live.controller.controller import _telemetry as live_telemetry  # the controller's own conversion

        if isinstance(report, JobMeasured):
            self.measured[report.job_id] = report
        elif isinstance(report, JobReported):
            tel = live_telemetry(report.report, now, self.measured.get(report.job_id))
            self.telemetry[report.job_id] = tel
            if report.job_id == GUARANTEED:
                active = self.guest_placed and not self.guest_evicted and self.share > 0
                if self.coordinator.observe(GUARANTEED, tel, guest_active=active):
                    self.coordinator.reset(OPPORTUNISTIC)
            self.dirty = True
        elif isinstance(report, JobSaid) and isinstance(report.message, contract.Hello):
            # A job that (re)connects is told its limits, as the controller does on hello.
            if report.job_id == OPPORTUNISTIC and self.guest_placed:
                self.send(OPPORTUNISTIC, contract.SetLimits(gpu_milli=self.share, mem_mib=self.cap))
            elif report.job_id == GUARANTEED:
                self.send(GUARANTEED, contract.SetLimits(gpu_milli=1000, mem_mib=self.reserved_mib))

    # -- one control step ---------------------------------------------------------------------------------------
    def control(self, now: float) -> Plan | None:
        """Run the coordinator if something changed or a check is due, and carry out its plan."""
        from corral.core import contract
        from corral.policies.antman.coordinator import GpuSnapshot, Guest, Holder, Snapshot

        due = self.coordinator.pop_due(now)
        if not (self.dirty or due):
            return None
        self.dirty = False
        guest = self.guest_placed and not self.guest_evicted
        gtel = self.telemetry.get(OPPORTUNISTIC)
        need = gtel.mem_need_mib if gtel is not None else self.guest_need_mib
        snap = Snapshot(
            gpus={0: GpuSnapshot(self.gpu_mem_mib, (GUARANTEED,), (OPPORTUNISTIC,) if guest else ())},
            holders={GUARANTEED: Holder(GUARANTEED, (0,), self.reserved_mib, self.telemetry.get(GUARANTEED))},
            guests={OPPORTUNISTIC: Guest(OPPORTUNISTIC, (0,), self.share, 1000, self.cap, need, gtel is not None)}
            if guest
            else {},
            focus=(GUARANTEED, OPPORTUNISTIC) if guest else (GUARANTEED,),
        )
        plan = self.coordinator.step(now, snap)
        if not plan:
            return plan
        if GUARANTEED in plan.reservations:
            self.reserved_mib = plan.reservations[GUARANTEED]
            self.send(GUARANTEED, contract.SetLimits(gpu_milli=1000, mem_mib=self.reserved_mib))
            self.log.append((now, GUARANTEED, f"reservation {self.reserved_mib} MiB"))
        if OPPORTUNISTIC in plan.evict:
            self.guest_evicted = True
            self.share = 0
            self.evict_fn(OPPORTUNISTIC)
            self.log.append((now, OPPORTUNISTIC, f"evicted: {plan.why.get(OPPORTUNISTIC, '')}"))
            return plan
        share = plan.shares.get(OPPORTUNISTIC)
        cap = plan.mem_caps.get(OPPORTUNISTIC)
        if share is not None or cap is not None:
            self.share = self.share if share is None else share
            self.cap = self.cap if cap is None else cap
            self.send(OPPORTUNISTIC, contract.SetLimits(gpu_milli=share, mem_mib=cap))
            why = plan.why.get(OPPORTUNISTIC, "")
            self.log.append((now, OPPORTUNISTIC, f"share {self.share} milli, cap {self.cap} MiB ({why})"))
        return plan


# ==============================================================================================================
# Running the phases
# ==============================================================================================================
@dataclass(slots=True)
class Settings:
    smoke: bool
    gpu: int
    work: Path
    python: str
    g_model: str
    g_batch: int
    o_model: str
    o_batch: int
    precision: str
    solo_s: float
    pair_s: float
    baseline_s: float
    coordinated_s: float
    warmup_s: float
    warmup_steps: int
    settle_s: float
    control_interval_s: float
    start_milli: int
    simulated_gpu_mib: int
    nvml_period_s: float
    g_mem_mib: int | None = None
    o_mem_mib: int | None = None

    def worker_cmd(self, role: str, out: Path, *, seconds: float = 0.0, stop_file: Path | None = None) -> list[str]:
        model, batch = (self.g_model, self.g_batch) if role == GUARANTEED else (self.o_model, self.o_batch)
        cmd = [self.python, str(Path(__file__).resolve()), "--worker", "--role", role, "--model", model]
        cmd += ["--batch", str(batch), "--precision", self.precision, "--out", str(out)]
        cmd += ["--device", "cpu" if self.smoke else "cuda"]
        if seconds:
            cmd += ["--seconds", str(seconds)]
        if stop_file is not None:
            cmd += ["--stop-file", str(stop_file)]
        if self.smoke:
            cmd += ["--simulated-gpu-mib", str(self.simulated_gpu_mib)]
        return cmd

    def plain_env(self) -> dict[str, str]:
        """The environment of a job started outside corral: no contract variables (standalone), one GPU."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
        if not self.smoke:
            env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # NVML's order
            env["CUDA_VISIBLE_DEVICES"] = str(self.gpu)
        env["PYTHONUNBUFFERED"] = "1"
        return env


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _wait(procs: Sequence[tuple[subprocess.Popen[bytes], Path]], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    for proc, log in procs:
        try:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for p, _ in procs:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
            raise SystemExit(f"a worker ran past its time limit; its log ends:\n{_tail(log)}") from None
        if proc.returncode != 0:
            raise SystemExit(f"a worker failed (exit {proc.returncode}); its log ends:\n{_tail(log)}")


def _spawn(cmd: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as f:
        return subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True)


def run_standalone(cfg: Settings, name: str, roles: Sequence[str], seconds: float) -> dict[str, Series]:
    """Phases a, b and c: the workers started directly (standalone ``corral.job``, full share, no cap)."""
    procs = []
    outs = {}
    for role in roles:
        out = cfg.work / f"{name}-{role}.json"
        log = cfg.work / f"{name}-{role}.log"
        procs.append((_spawn(cfg.worker_cmd(role, out, seconds=seconds), cfg.plain_env(), log), log))
        outs[role] = out
    _wait(procs, seconds + (90 if cfg.smoke else 240))
    return {role: Series.load(out) for role, out in outs.items()}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def have_stack() -> bool:
    """Whether ``corral serve`` can run here (its HTTP server's packages are installed)."""
    return all(importlib.util.find_spec(m) is not None for m in ("fastapi", "uvicorn", "httpx"))


def policy_spec(cfg: Settings) -> str:
    # max_sm_used=1: a guaranteed ResNet-50 keeps NVML's "a kernel ran" figure near 100%, which would keep the
    # opportunistic job from ever being placed; the coordinator, not the placement threshold, is measured here.
    return f"antman:max_sm_used=1.0,control_interval_s={cfg.control_interval_s:g},start_milli={cfg.start_milli}"


def run_stack(cfg: Settings) -> dict[str, Any]:
    """Phase d through ``corral serve`` (antman) and its HTTP API."""
    from corral.live.client import Client, ClientError

    state = cfg.work / "state"
    port = _free_port()
    conf = cfg.work / "corral.toml"
    server_lines = [
        "[server]",
        f'policy = "{policy_spec(cfg)}"',
        f"port = {port}",
        f'state_dir = "{state}"',
        "grace_s = 10",
    ]
    if cfg.smoke:
        server_lines.append("gpus = 1  # a stand-in GPU: the jobs run on the CPU")
    conf.write_text(
        "\n".join(server_lines)
        + '\n\n[[tenants]]\nname = "alice"\nquota_gpus = 1\n\n[[tenants]]\nname = "bob"\nquota_gpus = 0\n',
        encoding="utf-8",
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
    env["PYTHONUNBUFFERED"] = "1"
    if not cfg.smoke:
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    server_log = cfg.work / "serve.log"
    server = _spawn([cfg.python, "-m", "corral.cli.main", "serve", "--config", str(conf)], env, server_log)
    stop_file = cfg.work / "d-stop"
    g_out, o_out = cfg.work / "d-guaranteed.json", cfg.work / "d-opportunistic.json"
    timeline: list[dict[str, Any]] = []
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while not (state / "admin.token").exists() or not _healthy(url):
            if server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"corral serve did not come up; its log ends:\n{_tail(server_log)}")
            time.sleep(0.2)
        client = Client(url, (state / "admin.token").read_text().strip())
        # A job gets only the harmless part of the server's environment (corral.core.contract): corral found on
        # PYTHONPATH (a machine without network access, docs/measurements.md) must be passed on explicitly.
        job_env = {"PYTHONPATH": os.environ["PYTHONPATH"]} if "PYTHONPATH" in os.environ else {}
        g = client.submit(
            cfg.worker_cmd(GUARANTEED, g_out, stop_file=stop_file),
            tenant="alice",
            name="guaranteed",
            cwd=str(ROOT),
            env=job_env,
            gpu_mem_mib=cfg.g_mem_mib,
        )["job_id"]
        limit = time.monotonic() + cfg.baseline_s + cfg.coordinated_s + (120 if cfg.smoke else 300)
        first_tel: float | None = None
        while first_tel is None or time.monotonic() - first_tel < cfg.baseline_s:
            job = client.job(g)
            if job["phase"] not in ("pending", "running"):
                raise SystemExit(
                    f"the guaranteed job ended early ({job['phase']}: {job['reason']}):\n{_log(client, g)}"
                )
            if first_tel is None and job["telemetry"] is not None:
                first_tel = time.monotonic()
            if time.monotonic() > limit:
                raise SystemExit(f"the guaranteed job never reported; its log ends:\n{_log(client, g)}")
            time.sleep(0.25)
        o = client.submit(
            cfg.worker_cmd(OPPORTUNISTIC, o_out, seconds=cfg.coordinated_s),
            tenant="bob",
            name="opportunistic",
            opportunistic=True,
            cwd=str(ROOT),
            env=job_env,
            gpu_mem_mib=cfg.o_mem_mib,
        )["job_id"]
        done = False
        while not done:
            if time.monotonic() > limit:
                oj = client.job(o)
                raise SystemExit(
                    f"phase d ran past its time limit; the opportunistic job is {oj['phase']} ({oj['reason']}), "
                    f"placement {oj['placement']}; its log:\n{_log(client, o)}"
                )
            snap = {"t": time.time()}
            for role, jid in ((GUARANTEED, g), (OPPORTUNISTIC, o)):
                job = client.job(jid)
                p = job["placement"]
                tel = job["telemetry"]
                snap[role] = {
                    "phase": job["phase"],
                    "gpus": p["gpus"] if p else None,
                    "gpu_milli": p["gpu_milli"] if p else None,
                    "mem_mib": p["mem_mib"] if p else None,
                    "step_time_s": tel["step_time_s"] if tel else None,
                    "sm_util": tel["sm_util"] if tel else None,
                }
                if role == OPPORTUNISTIC and job["phase"] in ("finished", "failed", "cancelled", "rejected"):
                    done = True
                    if job["phase"] != "finished":
                        raise SystemExit(
                            f"the opportunistic job ended {job['phase']}: {job['reason']}\n{_log(client, o)}"
                        )
            timeline.append(snap)
            time.sleep(0.5)
        stop_file.touch()
        while client.job(g)["phase"] in ("pending", "running"):
            if time.monotonic() > limit:
                raise SystemExit("the guaranteed job did not stop")
            time.sleep(0.25)
        events = {role: client.events(jid) for role, jid in ((GUARANTEED, g), (OPPORTUNISTIC, o))}
        client.close()
    except ClientError as e:
        raise SystemExit(f"the corral API refused: {e}; the server's log ends:\n{_tail(server_log)}") from None
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
    together = [s for s in timeline if s[GUARANTEED]["gpus"] and s[OPPORTUNISTIC]["gpus"]]
    if together and any(s[GUARANTEED]["gpus"] != s[OPPORTUNISTIC]["gpus"] for s in together):
        print("WARNING: the two jobs were placed on different GPUs (run on a one-GPU machine): phase d is void")
    return {
        "mode": "stack",
        "how": f"corral serve, policy {policy_spec(cfg)}, tenants alice (quota 1) and bob (quota 0), "
        "submitted through corral.live.client",
        "series": {GUARANTEED: Series.load(g_out), OPPORTUNISTIC: Series.load(o_out)},
        "events": events,
        "timeline": timeline,
    }


def _healthy(url: str) -> bool:
    import httpx

    try:
        return httpx.get(f"{url}/v1/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def _log(client: Any, job_id: str) -> str:
    try:
        text: str = client.logs(job_id)["text"]
    except Exception as e:
        return f"(no log: {e})"
    return "\n".join(text.splitlines()[-30:])


def run_loop(cfg: Settings) -> dict[str, Any]:
    """Phase d with corral's agent and the LocalCoordinator in a loop here (no HTTP server, no global
    scheduler)."""
    from corral.live.agent import Agent, JobReported, LaunchRequest, ProcessExited
    from corral.live.agent.gpus import discover_gpus, stand_in_gpus

    gpus = stand_in_gpus(1) if cfg.smoke else discover_gpus()
    if cfg.gpu >= len(gpus):
        raise SystemExit(f"--gpu {cfg.gpu}: this machine has {len(gpus)} GPU(s)")
    gpu_mem = gpus[cfg.gpu].mem_mib
    reports: queue.Queue[AgentReport] = queue.Queue()
    agent = Agent(cfg.work / "agent", gpus, reports.put)
    agent_ref: list[Agent] = [agent]
    runs = {GUARANTEED: 1, OPPORTUNISTIC: 1}
    loop = CoordinatorLoop(
        gpu_mem_mib=gpu_mem,
        guaranteed_mem_mib=cfg.g_mem_mib or gpu_mem,
        guest_need_mib=cfg.o_mem_mib or gpu_mem,
        send=lambda job_id, msg: agent_ref[0].send(job_id, runs[job_id], msg),
        evict=lambda job_id: agent_ref[0].pause(job_id, runs[job_id], evict=True),
        control_interval_s=cfg.control_interval_s,
        start_milli=cfg.start_milli,
    )
    stop_file = cfg.work / "d-stop"
    g_out, o_out = cfg.work / "d-guaranteed.json", cfg.work / "d-opportunistic.json"
    env = {"PYTHONUNBUFFERED": "1"}
    t0 = time.monotonic()

    def now() -> float:
        return time.monotonic() - t0

    exited: dict[str, ProcessExited] = {}
    first_report: float | None = None

    def pump(until: Callable[[], bool], limit_s: float) -> None:
        nonlocal first_report
        deadline = time.monotonic() + limit_s
        while not until():
            if time.monotonic() > deadline:
                raise SystemExit(f"phase d (loop) ran past its time limit; logs in {cfg.work / 'agent' / 'logs'}")
            try:
                r = reports.get(timeout=0.1)
            except queue.Empty:
                r = None
            if r is not None:
                if isinstance(r, ProcessExited):
                    exited[r.job_id] = r
                    if r.exit_code != 0:
                        log = agent_ref[0].log_path(r.job_id)
                        raise SystemExit(f"job {r.job_id} ended: {r.detail or r.exit_code}\n{_tail(log)}")
                    if r.job_id == OPPORTUNISTIC:
                        loop.guest_gone()
                else:
                    if first_report is None and isinstance(r, JobReported) and r.job_id == GUARANTEED:
                        first_report = time.monotonic()
                    loop.report(r, now())
            loop.control(now())

    agent.start()
    try:
        cwd = str(ROOT)
        agent.launch(
            LaunchRequest(
                GUARANTEED,
                1,
                tuple(cfg.worker_cmd(GUARANTEED, g_out, stop_file=stop_file)),
                cwd,
                env,
                (cfg.gpu,),
                1000,
                loop.reserved_mib,
                tenant="bench",
            )
        )
        limit = cfg.baseline_s + cfg.coordinated_s + (120 if cfg.smoke else 300)
        pump(lambda: first_report is not None and time.monotonic() - first_report >= cfg.baseline_s, limit)
        share, cap = loop.place_guest(now())
        agent.launch(
            LaunchRequest(
                OPPORTUNISTIC,
                1,
                tuple(cfg.worker_cmd(OPPORTUNISTIC, o_out, seconds=cfg.coordinated_s)),
                cwd,
                env,
                (cfg.gpu,),
                share,
                cap,
                tenant="bench",
            )
        )
        pump(lambda: OPPORTUNISTIC in exited, limit)
        stop_file.touch()
        pump(lambda: GUARANTEED in exited, 120)
    finally:
        agent.close()
    wall0 = time.time() - now()
    return {
        "mode": "loop",
        "how": f"corral.live.agent.Agent + corral.policies.antman.coordinator.LocalCoordinator (control interval "
        f"{cfg.control_interval_s:g} s, start {cfg.start_milli} milli) in a loop; no HTTP server, no global scheduler",
        "series": {GUARANTEED: Series.load(g_out), OPPORTUNISTIC: Series.load(o_out)},
        "events": {"coordinator": [[round(wall0 + t, 3), job, what] for t, job, what in loop.log]},
        "timeline": [],
    }


# ==============================================================================================================
# The report
# ==============================================================================================================
PHASES = {
    "a": "guaranteed alone",
    "b": "opportunistic alone",
    "c": "both, full share, no coordinator",
    "d": "both, corral's coordinator",
}


def _ratio(x: float | None, y: float | None) -> float | None:
    return None if x is None or y is None or not y else round(x / y, 4)


def analyse(cfg: Settings, runs: dict[str, dict[str, Any]], sampler: NvmlSampler) -> dict[str, Any]:
    """The figures of every phase run, and the summary against the solo phases."""
    phases: dict[str, Any] = {}
    skip = cfg.warmup_steps
    for name, run in runs.items():
        series: dict[str, Series] = run["series"]
        g, o = series.get(GUARANTEED), series.get(OPPORTUNISTIC)
        entry: dict[str, Any] = {"title": PHASES[name], "mode": run.get("mode")}
        if run.get("how"):
            entry["how"] = run["how"]
        if name in ("a", "b"):
            s = g if g is not None else o
            assert s is not None
            t0, t1 = s.first + cfg.warmup_s, s.last
            entry[s.role] = window_stats(s, t0, t1, skip)
            entry["peak_reserved_mib"] = s.peak_reserved_mib
        elif name == "c":
            assert g is not None and o is not None
            t0, t1 = max(g.first, o.first) + cfg.warmup_s, min(g.last, o.last)
            entry[GUARANTEED] = window_stats(g, t0, t1, skip)
            entry[OPPORTUNISTIC] = window_stats(o, t0, t1, skip)
        else:
            assert g is not None and o is not None
            # Before the opportunistic job: the guaranteed job's own baseline in this run.
            entry["guaranteed_before"] = window_stats(g, g.first + cfg.warmup_s, o.first - o.step_s[0], skip)
            t1 = min(g.last, float(o.info.get("ended") or o.last))
            t0 = o.first + cfg.settle_s
            entry["window_all"] = [o.first + cfg.warmup_s, t1]
            entry["guaranteed_all"] = window_stats(g, o.first + cfg.warmup_s, t1)
            entry["opportunistic_all"] = window_stats(o, o.first + cfg.warmup_s, t1)
            entry[GUARANTEED] = window_stats(g, t0, t1)
            entry[OPPORTUNISTIC] = window_stats(o, t0, t1)
            entry["shares"] = share_changes(o, o.first)
            entry["guaranteed_rungs"] = sorted({r for r in g.rungs if r})
            entry["events"] = run.get("events")
            entry["timeline"] = run.get("timeline")
        entry["window"] = [round(t0, 3), round(t1, 3)]
        entry["nvml"] = sampler.summary(t0, t1)
        phases[name] = entry

    def med(phase: str, role: str, key: str = "median_step_ms") -> float | None:
        st = phases.get(phase, {}).get(role)
        return None if st is None else st.get(key)

    solo_g = med("a", GUARANTEED)
    if solo_g is None and "d" in phases and phases["d"].get("guaranteed_before"):
        solo_g = phases["d"]["guaranteed_before"]["median_step_ms"]
    solo_o = med("b", OPPORTUNISTIC, "samples_per_s")
    summary: dict[str, Any] = {"target_slowdown": TARGET_SLOWDOWN}
    for name in ("c", "d"):
        if name in phases:
            summary[f"slowdown_{name}"] = _ratio(med(name, GUARANTEED), solo_g)
            summary[f"opportunistic_fraction_{name}"] = _ratio(med(name, OPPORTUNISTIC, "samples_per_s"), solo_o)
    if "d" in phases:
        summary["slowdown_d_all"] = _ratio((phases["d"].get("guaranteed_all") or {}).get("median_step_ms"), solo_g)
        sd = summary.get("slowdown_d")
        summary["target_met"] = None if sd is None else sd <= TARGET_SLOWDOWN
        summary["coordinator_mode"] = phases["d"]["mode"]
    base = (phases.get("a") or {}).get("nvml") or {}
    for name, entry in phases.items():
        nv = entry.get("nvml") or {}
        for key in ("gpu_util", "sm_util"):
            if nv.get(key) is not None and base.get(key):
                summary[f"{key}_{name}_vs_a"] = _ratio(nv[key], base[key])
    return {"phases": phases, "summary": summary}


def _plain(value: Any) -> Any:
    return str(value) if isinstance(value, Path) else value


def _f(x: Any, fmt: str = "{:.1f}", none: str = "-") -> str:
    return none if x is None else fmt.format(x)


def phase_line(name: str, result: dict[str, Any]) -> str:
    """One line with a phase's main figures, printed as soon as it ends."""
    entry, summary = result["phases"][name], result["summary"]
    g, o, nv = entry.get(GUARANTEED) or {}, entry.get(OPPORTUNISTIC) or {}, entry.get("nvml") or {}
    words = [f"phase {name} done:"]
    if g:
        words.append(f"guaranteed {_f(g.get('median_step_ms'), '{:.2f}')} ms/step")
    if name in ("c", "d"):
        words.append(f"(slowdown {_f(summary.get(f'slowdown_{name}'), '{:.3f}x')})")
    if o:
        words.append(f"opportunistic {_f(o.get('samples_per_s'))} samples/s")
    if name in ("c", "d"):
        words.append(f"({_f(summary.get(f'opportunistic_fraction_{name}'), '{:.2f}')} of solo)")
    if nv:
        words.append(f"NVML GPU util {_f(nv.get('gpu_util'))}%, SM util (GPM) {_f(nv.get('sm_util'))}%")
    return " ".join(words)


def print_report(result: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=160)
    for line in machine_lines(result["machine"]):
        console.print(line, highlight=False)
    phases, summary = result["phases"], result["summary"]
    cfg = result["config"]
    table = Table(title="Guaranteed and opportunistic job on one GPU (medians over each phase's window)")
    for col in ("phase", "G step ms", "G slowdown", "O samples/s", "O / solo", "O share", "GPU util %",
                "mem util %", "mem used GiB", "SM util % (GPM)", "steps G/O"):  # fmt: skip
        table.add_column(col, justify="right" if col != "phase" else "left")
    solo_g = (phases.get("a", {}).get(GUARANTEED) or {}).get("median_step_ms")
    solo_o = (phases.get("b", {}).get(OPPORTUNISTIC) or {}).get("samples_per_s")
    for name, entry in phases.items():
        g, o, nv = entry.get(GUARANTEED) or {}, entry.get(OPPORTUNISTIC) or {}, entry.get("nvml") or {}
        title = f"{name}: {entry['title']}" + (f" [{entry['mode']}]" if entry.get("mode") else "")
        used = nv.get("mem_used_mib")
        table.add_row(
            title,
            _f(g.get("median_step_ms"), "{:.2f}"),
            _f(_ratio(g.get("median_step_ms"), solo_g), "{:.3f}x"),
            _f(o.get("samples_per_s")),
            _f(_ratio(o.get("samples_per_s"), solo_o), "{:.2f}"),
            _f(o.get("median_share_milli"), "{:.0f}") if o else "-",
            _f(nv.get("gpu_util")),
            _f(nv.get("mem_util")),
            _f(None if used is None else used / 1024, "{:.1f}"),
            _f(nv.get("sm_util")),
            f"{g.get('steps', '-')}/{o.get('steps', '-')}",
        )
    console.print(table)
    if "d" in phases:
        d = phases["d"]
        console.print(f"phase d coordinator: {d.get('how')}", highlight=False)
        console.print(
            f"phase d window: from {cfg['settle_s']:g} s after the opportunistic job's first step (the whole "
            f"co-located time: slowdown {_f(summary.get('slowdown_d_all'), '{:.3f}x')}); opportunistic share "
            f"and cap over time (s, milli, MiB): {d.get('shares')[:20]}",
            highlight=False,
        )
        if d.get("guaranteed_rungs") and d["guaranteed_rungs"] != ["full"]:
            console.print(f"NOTE: the guaranteed job ran on ladder rungs {d['guaranteed_rungs']} (a memory cap bit it)")
    for name in ("c", "d"):
        sd = summary.get(f"slowdown_{name}")
        if sd is not None:
            what = "without" if name == "c" else "with"
            target = f" (target <= {TARGET_SLOWDOWN:.2f}: {'met' if sd <= TARGET_SLOWDOWN else 'NOT met'})"
            console.print(
                f"guaranteed slowdown {what} the coordinator: {sd:.3f}x{target if name == 'd' else ''}; "
                f"opportunistic throughput {_f(summary.get(f'opportunistic_fraction_{name}'), '{:.2f}')} of solo",
                highlight=False,
            )
    if result["machine"].get("smoke"):
        console.print(f"*** {SMOKE_NOTE} ***")


# ==============================================================================================================
# main
# ==============================================================================================================
def expected_seconds(cfg: Settings, phases: str) -> float:
    start = 5.0 if cfg.smoke else 20.0  # interpreter, torch, model, cuDNN autotuning, per phase
    total = 0.0
    if "a" in phases:
        total += cfg.solo_s + start
    if "b" in phases:
        total += cfg.solo_s + start
    if "c" in phases:
        total += cfg.pair_s + 2 * start
    if "d" in phases:
        total += cfg.baseline_s + cfg.coordinated_s + 3 * start
    return total


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--smoke", action="store_true", help="CPU smoke run with tiny models (automatic without CUDA)")
    p.add_argument("--phases", default="a,b,c,d", help="which phases to run (default a,b,c,d)")
    p.add_argument("--coordinator", choices=("auto", "stack", "loop"), default="auto",
                   help="phase d through corral serve (stack) or agent + LocalCoordinator (loop); auto: stack when "
                   "FastAPI and uvicorn are installed")  # fmt: skip
    p.add_argument("--gpu", type=int, default=0, help="the GPU (NVML index) for phases a-c and loop mode")
    p.add_argument("--guaranteed-model", choices=MODELS, help="default resnet50 (transformer without torchvision)")
    p.add_argument("--guaranteed-batch", type=int, help="default 64 (16 sequences of 512 for the transformer)")
    p.add_argument("--opportunistic-model", choices=MODELS, help="default: the guaranteed job's model")
    p.add_argument("--opportunistic-batch", type=int, help="default: the guaranteed job's batch")
    p.add_argument("--precision", choices=("bf16", "fp32"), default="bf16", help="autocast for the forward pass")
    p.add_argument("--solo-seconds", type=float, help="phases a and b (default 30; smoke 4)")
    p.add_argument("--pair-seconds", type=float, help="phase c (default 45; smoke 5)")
    p.add_argument("--baseline-seconds", type=float, help="phase d, guaranteed alone first (default 20; smoke 3)")
    p.add_argument("--coordinated-seconds", type=float, help="phase d, opportunistic job's run (default 120; smoke 8)")
    p.add_argument("--warmup-seconds", type=float, help="left out at the start of each window (default 8; smoke 1)")
    p.add_argument("--warmup-steps", type=int, default=10, help="each job's first steps left out (default 10)")
    p.add_argument("--settle-seconds", type=float, help="phase d: figures from this long after the opportunistic "
                   "job's first step (default 40; smoke 3)")  # fmt: skip
    p.add_argument("--control-interval", type=float, help="the coordinator's control interval (default 2 s; smoke 1)")
    p.add_argument("--start-milli", type=int, default=100, help="the opportunistic job's first share (default 100)")
    p.add_argument("--guaranteed-mem-mib", type=int, help="the guaranteed job's memory request (default: phase a's "
                   "peak reserved + 1024, else none: the coordinator measures it)")  # fmt: skip
    p.add_argument("--opportunistic-mem-mib", type=int, help="the opportunistic job's memory need (default: phase "
                   "b's peak reserved + 1024)")  # fmt: skip
    p.add_argument("--nvml-period", type=float, default=0.2, help="NVML sampling period, seconds (default 0.2)")
    p.add_argument("--json", metavar="PATH", help="write every figure (and the per-phase windows) to PATH")
    p.add_argument("--keep", action="store_true", help="keep the work directory (logs, per-step records)")
    return p


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = list(sys.argv[1:] if argv is None else argv)
    if "--worker" in args:
        worker_main(worker_parser().parse_args(args))
        return {}
    ns = parser().parse_args(args)
    smoke = ns.smoke or not cuda_available()
    if ns.guaranteed_model is None:
        has_tv = importlib.util.find_spec("torchvision") is not None
        ns.guaranteed_model = "tiny-cnn" if smoke else ("resnet50" if has_tv else "transformer")
    g_batch = ns.guaranteed_batch or (16 if smoke else (16 if ns.guaranteed_model == "transformer" else 64))
    o_model = ns.opportunistic_model or ns.guaranteed_model
    o_batch = ns.opportunistic_batch or (g_batch if o_model == ns.guaranteed_model else 64)

    def pick(value: float | None, gpu: float, cpu: float) -> float:
        return value if value is not None else (cpu if smoke else gpu)

    phases = [p.strip() for p in ns.phases.split(",") if p.strip()]
    if not phases or any(p not in PHASES for p in phases):
        raise SystemExit(f"--phases: a comma-separated subset of {','.join(PHASES)}")
    mode = ns.coordinator
    if mode == "auto":
        mode = "stack" if have_stack() else "loop"
    work = Path(tempfile.mkdtemp(prefix="corral-coloc-", dir="/tmp"))
    cfg = Settings(
        smoke=smoke,
        gpu=ns.gpu,
        work=work,
        python=sys.executable,
        g_model=ns.guaranteed_model,
        g_batch=g_batch,
        o_model=o_model,
        o_batch=o_batch,
        precision=ns.precision,
        solo_s=pick(ns.solo_seconds, 30, 4),
        pair_s=pick(ns.pair_seconds, 45, 5),
        baseline_s=pick(ns.baseline_seconds, 20, 3),
        coordinated_s=pick(ns.coordinated_seconds, 120, 8),
        warmup_s=pick(ns.warmup_seconds, 8, 1),
        warmup_steps=ns.warmup_steps,
        settle_s=pick(ns.settle_seconds, 40, 3),
        control_interval_s=pick(ns.control_interval, 2, 1),
        start_milli=ns.start_milli,
        simulated_gpu_mib=4096,
        nvml_period_s=ns.nvml_period,
        g_mem_mib=ns.guaranteed_mem_mib,
        o_mem_mib=ns.opportunistic_mem_mib,
    )
    machine = machine_info(smoke=smoke, gpu=ns.gpu)
    for line in machine_lines(machine):
        print(line)
    est = expected_seconds(cfg, "".join(phases))
    print(
        f"phases {','.join(phases)} (coordinator: {mode}); guaranteed {cfg.g_model} batch {cfg.g_batch}, "
        f"opportunistic {cfg.o_model} batch {cfg.o_batch}, {cfg.precision}; expected duration about "
        f"{est / 60:.1f} min; work directory {work}",
        flush=True,
    )
    sampler = NvmlSampler(ns.gpu, ns.nvml_period).start()
    if not sampler.available:
        print(f"NVML: not sampled ({sampler.reason})")
    runs: dict[str, dict[str, Any]] = {}
    t_start = time.monotonic()

    def results() -> dict[str, Any]:
        return {
            "script": "benchmarks/gpu_colocation.py",
            "argv": args,
            "note": SMOKE_NOTE if smoke else None,
            "machine": machine,
            "config": {f.name: _plain(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)},
            "nvml": {"available": sampler.available, "gpm": sampler.gpm, "period_s": sampler.period_s},
            "elapsed_s": round(time.monotonic() - t_start, 1),
            **analyse(cfg, runs, sampler),
        }

    try:
        for name in phases:
            print(f"phase {name}: {PHASES[name]} ...", flush=True)
            if name == "a":
                runs[name] = {"series": run_standalone(cfg, "a", [GUARANTEED], cfg.solo_s)}
                if cfg.g_mem_mib is None and not smoke:
                    cfg.g_mem_mib = runs[name]["series"][GUARANTEED].peak_reserved_mib + 1024
            elif name == "b":
                runs[name] = {"series": run_standalone(cfg, "b", [OPPORTUNISTIC], cfg.solo_s)}
                if cfg.o_mem_mib is None and not smoke:
                    cfg.o_mem_mib = runs[name]["series"][OPPORTUNISTIC].peak_reserved_mib + 1024
            elif name == "c":
                runs[name] = {"series": run_standalone(cfg, "c", [GUARANTEED, OPPORTUNISTIC], cfg.pair_s)}
            else:
                if smoke:
                    cfg.g_mem_mib = cfg.g_mem_mib or 1024
                    cfg.o_mem_mib = cfg.o_mem_mib or 1024
                runs[name] = run_stack(cfg) if mode == "stack" else run_loop(cfg)
            # A line per phase as it ends, and the JSON so far: a run cut short keeps what it measured.
            partial = results()
            print(phase_line(name, partial), flush=True)
            write_json(ns.json, partial, quiet=True)
    finally:
        sampler.stop()
        if not ns.keep:
            shutil.rmtree(work, ignore_errors=True)
    result = results()
    print_report(result)
    print(f"elapsed {result['elapsed_s']:.0f} s")
    write_json(ns.json, result)
    return result


if __name__ == "__main__":
    main()
