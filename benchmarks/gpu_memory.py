"""GPU memory and compute limits inside a job (issue 6): how fast a memory cap takes effect, how long eviction and
restore take, and what share the duty cycle achieves.

One training job (``--model``, default a torchvision ResNet-50, batch 64, Adam, synthetic data, bf16 autocast)
runs through ``corral.job`` in this process, connected to a small stand-in agent on a Unix socket that speaks the
contract (:mod:`corral.core.contract`): directives reach the job exactly as the live agent's do, through its
channel, and are applied at its next step boundary. Every step is synchronized (``loss.item()``).

(a) **Memory cap shrink and grow.** After warm-up steps without a cap, the job's need is its ``full`` rung's
    peak (the ``mem_need_mib`` of its step reports). The agent then sends caps at ``--caps`` fractions of that
    need (default shrinking to 50%, 25%, 10% and 4%, then growing to 200%), each held ``--steps-per-cap`` steps.
    For each cap: the boundary's own time (from the end of the previous step to the start of the next: setting
    ``torch.cuda.set_per_process_memory_fraction`` and releasing cached memory), the first step under the cap
    (including any out-of-memory retry down the ladder), the rung it lands on, and how many steps and how long
    until the ladder settles (growing, it climbs back one rung per step); GPU memory reserved before and after.
(b) **Evict and restore.** :class:`~corral.job.memory.Residency` ``evict()`` and ``restore()`` through the job's
    :class:`~corral.job.device.TorchDevice` (parameters, gradients, buffers and Adam's state to pinned host memory
    and back), ``--evict-repeats`` times: the first (pinned host memory allocated) and the median of the rest,
    bytes moved, the memory given back, and a bit-for-bit check of every tensor after restore. Then the same
    through the contract, a ``Pause(evict=True)`` directive and ``Resume``: the times the job reports in
    ``Paused.took_s`` and ``Resumed.took_s`` (what ``corral job`` shows). Gandiva reports ~100 ms suspend/resume.
(c) **Duty cycle.** For each share in ``--shares`` the agent sends ``SetLimits(gpu_milli=...)``; over
    ``--duty-steps`` steps the achieved share is the steps' busy time (CUDA events around each step) over the wall
    time from the first step's start to the start of the step after the last (the idle included); also the duty
    cycle's own figure, the throughput relative to the full share, and NVML's utilization over the window.

Without CUDA (or with ``--smoke``) the same code runs on the CPU with a small MLP and a
:class:`~corral.job.device.SimulatedDevice` modelling the GPU's memory: a CPU smoke run, not a GPU figure.

    python benchmarks/gpu_memory.py                   # on a GPU machine: about 2 minutes
    python benchmarks/gpu_memory.py --json mem.json
    python benchmarks/gpu_memory.py --model transformer --batch 16
    python benchmarks/gpu_memory.py --smoke           # CPU smoke run (about 15 seconds)
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import socket
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

# a sibling script: the machine information, NVML sampler and workloads are shared
from gpu_colocation import (
    MIB,
    SMOKE_NOTE,
    NvmlSampler,
    Rotate,
    build_workload,
    cuda_available,
    machine_info,
    machine_lines,
    write_json,
)

from corral.core import contract

GANDIVA_SUSPEND_MS = 100.0


# ==============================================================================================================
# The agent's end of the channel
# ==============================================================================================================
class Peer:
    """A stand-in agent: accepts the job's connection on a Unix socket, records what it says, sends directives.
    With ``resume_after_s`` set, it answers a ``Paused`` with ``Resume`` that long after (from its own thread:
    the job's training thread is the one waiting), calling ``on_paused()`` first (to read memory while paused)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.messages: list[contract.Message] = []
        self.resume_after_s: float | None = None
        self.on_paused: Callable[[], object] | None = None
        self.paused_reading: object = None
        self._cond = threading.Condition()
        self._conn: socket.socket | None = None
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(path)
        self._listener.listen(2)
        threading.Thread(target=self._serve, name="bench-agent", daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            with self._cond:
                self._conn = conn
                self._cond.notify_all()
            buffer = b""
            with conn:
                while True:
                    try:
                        data = conn.recv(65536)
                    except OSError:
                        break
                    if not data:
                        break
                    buffer += data
                    while b"\n" in buffer:
                        line, buffer = buffer.split(b"\n", 1)
                        self._received(contract.decode(line))

    def _received(self, message: contract.Message) -> None:
        if isinstance(message, contract.Paused) and self.resume_after_s is not None:
            if self.on_paused is not None:
                self.paused_reading = self.on_paused()
            delay = self.resume_after_s
            threading.Timer(delay, lambda: self.send(contract.Resume())).start()
        with self._cond:
            self.messages.append(message)
            self._cond.notify_all()

    def send(self, message: contract.Message) -> None:
        with self._cond:
            conn = self._conn
        if conn is None:
            raise RuntimeError("the job is not connected")
        conn.sendall(contract.encode(message))

    def wait_for(self, kind: type[Any], start: int = 0, timeout_s: float = 60.0) -> Any:
        """The first message of type ``kind`` at index ``start`` or later."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                for m in self.messages[start:]:
                    if isinstance(m, kind):
                        return m
                left = deadline - time.monotonic()
                if left <= 0:
                    raise SystemExit(f"the job sent no {kind.__name__} within {timeout_s:g} s")
                self._cond.wait(left)

    def reports(self, start: int = 0) -> list[contract.StepReport]:
        with self._cond:
            return [m for m in self.messages[start:] if isinstance(m, contract.StepReport)]

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        with self._cond:
            if self._conn is not None:
                with contextlib.suppress(OSError):
                    self._conn.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


class RetryCounter(logging.Handler):
    """Counts the library's "out of memory at ..., running the step at ..." lines (steps rerun lower down)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.retries = 0
        self.partial = 0

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if "out of memory at" in text:
            self.retries += 1
        elif "inside optimizer.step()" in text:
            self.partial += 1


# ==============================================================================================================
# The job and its steps
# ==============================================================================================================
class Bench:
    """The job under test, stepped one step at a time (every ``next`` of ``job.loop`` is a boundary)."""

    def __init__(self, ns: argparse.Namespace, smoke: bool, sock: str) -> None:
        import torch

        from corral.job import Job
        from corral.job.device import SimulatedDevice, TorchDevice

        self.torch = torch
        self.smoke = smoke
        self.cuda = not smoke
        device = torch.device("cuda" if self.cuda else "cpu")
        if self.cuda:
            torch.backends.cudnn.benchmark = True
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
        else:
            torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
        self.work = build_workload(ns.model, ns.batch, device, precision=ns.precision)
        self.optimizer = torch.optim.Adam(self.work.model.parameters(), lr=1e-4)
        self.device: Any = SimulatedDevice(capacity_mib=ns.simulated_gpu_mib) if smoke else TorchDevice()
        env = {
            contract.ENV_JOB_ID: "gpu-memory",
            contract.ENV_RUN: "1",
            contract.ENV_AGENT_SOCKET: sock,
            contract.ENV_REPORT_INTERVAL_S: "0.05",
        }
        self.job = Job(
            model=self.work.model,
            optimizer=self.optimizer,
            batch_size=self.work.batch,
            device=self.device,
            env=env,
            handle_sigterm=False,
            verbose=False,
        )
        self._it: Iterator[Any] = iter(self.job.loop(Rotate(self.work.batches)))
        self.prev_end = time.perf_counter()
        self.retries = RetryCounter()
        log = logging.getLogger("corral.job")
        log.addHandler(self.retries)
        log.setLevel(logging.INFO)

    def close(self) -> None:
        logging.getLogger("corral.job").removeHandler(self.retries)
        with contextlib.suppress(StopIteration, GeneratorExit):
            close = getattr(self._it, "close", None)
            if close is not None:
                close()
        self.job.close()

    def settle(self, seconds: float) -> None:
        """Wait for a directive to reach the job's inbox; the wait is no part of the next boundary's time."""
        time.sleep(seconds)
        self.prev_end = time.perf_counter()

    def reserved_mib(self) -> float:
        """GPU memory the allocator holds (on the simulated device: what it counts as held)."""
        if self.cuda:
            return float(self.torch.cuda.memory_reserved()) / MIB
        return float(self.device.held_bytes()) / MIB

    def allocated_mib(self) -> float:
        if self.cuda:
            return float(self.torch.cuda.memory_allocated()) / MIB
        return float(self.device.held_bytes()) / MIB

    def step(self, body: Callable[[], object] | None = None) -> dict[str, Any]:
        """One step: the boundary (``next``), then ``train_step``, synchronized. Returns its timings (the
        boundary's time: from the previous step's end to this step's start), the cap and share in force, the rung
        it ran on and whether it failed with out-of-memory (the ladder exhausted)."""
        torch = self.torch
        before = self.reserved_mib()
        batch = next(self._it)
        start = time.perf_counter()
        after_boundary = self.reserved_mib()
        planned = self.job.mem_mode  # the rung the boundary chose (a new cap moves it down at once)
        if body is not None:
            body()
        retries = self.retries.retries
        failed = None
        try:
            loss = self.job.train_step(batch, self.work.loss_fn)
            loss.item()
        except torch.OutOfMemoryError as e:
            failed = str(e).splitlines()[0][:160]
        end = time.perf_counter()
        out = {
            "boundary_ms": (start - self.prev_end) * 1e3,
            "step_ms": (end - start) * 1e3,
            "start": start,
            "end": end,
            "cap_mib": self.job.mem_cap_mib,
            "share_milli": self.job.gpu_milli,
            # The rung the step ran on: the planned one, or where out-of-memory retries took it (a success may
            # then climb a rung for the next step: that is "next_rung").
            "rung": planned if self.retries.retries == retries else self.job.mem_mode,
            "next_rung": self.job.mem_mode,
            "retries": self.retries.retries - retries,
            "reserved_before_mib": round(before, 1),
            "reserved_after_boundary_mib": round(after_boundary, 1),
            "reserved_end_mib": round(self.reserved_mib(), 1),
            "failed": failed,
        }
        self.prev_end = end
        return out


def _median(xs: Sequence[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _r(x: float | None, nd: int = 2) -> float | None:
    return None if x is None else round(x, nd)


# ==============================================================================================================
# (a) memory caps
# ==============================================================================================================
def measure_need(b: Bench, peer: Peer, warm_steps: int) -> int:
    """Run uncapped steps until a step report carries the ``full`` rung's peak; return it (MiB)."""
    start = len(peer.messages)
    for _ in range(warm_steps):
        b.step()
    for _ in range(200):
        b.settle(0.06)  # past the report interval: the next boundary sends a report
        b.step()
        need = [r.mem_need_mib for r in peer.reports(start) if r.mem_need_mib]
        if need:
            return int(need[-1])
    raise SystemExit("the job never reported its memory need (mem_need_mib)")


def cap_walk(
    b: Bench, peer: Peer, need_mib: int, fractions: Sequence[float], steps_per_cap: int
) -> list[dict[str, Any]]:
    """(a): each cap in turn; the figures of the step that first ran under it and of the ladder settling."""
    from corral.job.memory import build_rungs

    rows = []
    previous_cap: int | None = None
    for f in fractions:
        cap = max(1, round(need_mib * f))
        peer.send(contract.SetLimits(mem_mib=cap))
        b.settle(0.05)  # the channel's thread puts it in the job's inbox; the next boundary applies it
        steps = []
        for _ in range(50):  # until the boundary has applied it (at once, normally)
            s = b.step()
            if s["cap_mib"] == cap:
                steps.append(s)
                break
        else:
            raise SystemExit(f"the cap {cap} MiB was never applied")
        # Growing, the ladder climbs one rung per step: leave it room to get back to the top.
        more = steps_per_cap - 1 + (len(build_rungs()) if previous_cap is not None and cap > previous_cap else 0)
        for _ in range(more):
            steps.append(b.step())
        rungs = [s["rung"] for s in steps]
        final = rungs[-1]
        settle = next(i for i in range(len(rungs)) if all(r == final for r in rungs[i:]))
        first = steps[0]
        settled_ms = first["boundary_ms"] + sum(s["step_ms"] + (s["boundary_ms"] if i else 0) for i, s in
                                                enumerate(steps[: settle + 1]))  # fmt: skip
        steady = [s["step_ms"] for s in steps[settle + 1 :] if not s["failed"]]
        rows.append(
            {
                "fraction": f,
                "cap_mib": cap,
                "direction": "grow" if previous_cap is not None and cap > previous_cap else "shrink",
                "boundary_ms": _r(first["boundary_ms"], 3),
                "first_step_ms": _r(first["step_ms"], 3),
                "to_first_step_end_ms": _r(first["boundary_ms"] + first["step_ms"], 3),
                "first_rung": first["rung"],
                "first_step_retries": first["retries"],
                "failed": first["failed"] or next((s["failed"] for s in steps if s["failed"]), None),
                "settled_rung": final,
                "steps_to_settle": settle + 1,
                "to_settled_ms": _r(settled_ms, 3),
                "steady_step_ms": _r(_median(steady), 3),
                "reserved_before_mib": first["reserved_before_mib"],
                "reserved_after_boundary_mib": first["reserved_after_boundary_mib"],
                "reserved_end_mib": steps[-1]["reserved_end_mib"],
                "rungs": rungs,
            }
        )
        previous_cap = cap
    return rows


# ==============================================================================================================
# (b) evict and restore
# ==============================================================================================================
def evict_restore(b: Bench, peer: Peer, repeats: int) -> dict[str, Any]:
    """(b): Residency.evict/restore directly, then a Pause(evict=True) and Resume through the contract."""
    from corral.job.memory import Residency

    torch = b.torch
    for _ in range(2):
        b.step()  # gradients and optimizer state exist, the device is probed
    residency = Residency(b.work.model, b.optimizer, b.device)
    state = list(dict.fromkeys(residency.tensors(), None))
    nbytes = sum(t.untyped_storage().nbytes() for t in {t.untyped_storage().data_ptr(): t for t in state}.values())
    count = len(state)
    devices = [t.device for t in state]
    reference = [t.detach().to("cpu", copy=True) for t in state]  # on the host: not counted as GPU memory
    del state  # no reference may keep an evicted tensor's GPU memory alive
    runs = []
    exact = True
    for i in range(repeats):
        b.device.synchronize()
        held = b.reserved_mib()
        t0 = time.perf_counter()
        residency.evict()
        t1 = time.perf_counter()
        evicted = b.reserved_mib()
        residency.restore()
        t2 = time.perf_counter()
        if i == 0:
            now = list(residency.tensors())
            exact = len(now) == len(reference) and all(
                x.device == d and torch.equal(x.cpu(), y) for x, y, d in zip(now, reference, devices, strict=True)
            )
            del now
        runs.append(
            {"evict_ms": (t1 - t0) * 1e3, "restore_ms": (t2 - t1) * 1e3, "held_mib": held, "evicted_mib": evicted}
        )
    after = b.step()  # training goes on after a restore
    rest = runs[1:] or runs
    result: dict[str, Any] = {
        "tensors": count,
        "state_mib": round(nbytes / MIB, 1),
        "first_evict_ms": _r(runs[0]["evict_ms"], 3),
        "first_restore_ms": _r(runs[0]["restore_ms"], 3),
        "evict_ms": _r(_median([r["evict_ms"] for r in rest]), 3),
        "restore_ms": _r(_median([r["restore_ms"] for r in rest]), 3),
        "evict_gb_s": _r(nbytes / 1e9 / (_median([r["evict_ms"] for r in rest]) or 1) * 1e3),
        "restore_gb_s": _r(nbytes / 1e9 / (_median([r["restore_ms"] for r in rest]) or 1) * 1e3),
        "held_mib": _r(runs[-1]["held_mib"], 1),
        "evicted_mib": _r(runs[-1]["evicted_mib"], 1),
        "bit_exact": exact,
        "repeats": repeats,
        "step_after_restore_ms": _r(after["step_ms"], 3),
        "note": "held/evicted: memory the allocator reserves (the synthetic batches stay on the GPU)",
    }
    # The same through the contract: Pause(evict=True), Resume after a short wait.
    peer.resume_after_s = 0.3
    peer.on_paused = b.reserved_mib
    start = len(peer.messages)
    peer.send(contract.Pause(reason="benchmark", evict=True))
    time.sleep(0.1)
    b.step()  # its boundary pauses (evicts), waits for Resume, restores, then the step runs
    paused = peer.wait_for(contract.Paused, start)
    resumed = peer.wait_for(contract.Resumed, start)
    peer.resume_after_s = None
    result["directive_evict_ms"] = _r(None if paused.took_s is None else paused.took_s * 1e3, 3)
    result["directive_restore_ms"] = _r(None if resumed.took_s is None else resumed.took_s * 1e3, 3)
    reading = peer.paused_reading
    result["directive_paused_reserved_mib"] = _r(reading if isinstance(reading, float) else None, 1)
    return result


# ==============================================================================================================
# (c) duty cycle
# ==============================================================================================================
def duty_cycle(b: Bench, peer: Peer, shares: Sequence[int], steps: int, sampler: NvmlSampler) -> list[dict[str, Any]]:
    """(c): for each share, the busy time of ``steps`` steps (CUDA events) over their wall time, idle included."""
    torch = b.torch
    rows = []
    full_rate: float | None = None
    for milli in shares:
        peer.send(contract.SetLimits(gpu_milli=milli))
        b.settle(0.05)
        for _ in range(50):
            if b.step()["share_milli"] == milli:
                break
        else:
            raise SystemExit(f"the share {milli} was never applied")
        b.step()  # one whole step under the share before measuring
        duty = b.job.duty_cycle
        busy0, idle0 = duty.busy_s, duty.idle_s
        events: list[tuple[Any, Any]] = []
        cpu_busy: list[float] = []
        starts: list[float] = []
        wall0 = time.time()
        for _ in range(steps + 1):
            if b.cuda:
                pair = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                s = b.step(body=pair[0].record)
                pair[1].record()
                events.append(pair)
            else:
                s = b.step()
                cpu_busy.append(s["step_ms"] / 1e3)
            starts.append(s["start"])
        wall1 = time.time()
        if b.cuda:
            torch.cuda.synchronize()
            busy = [a.elapsed_time(z) / 1e3 for a, z in events]
        else:
            busy = cpu_busy
        window = starts[-1] - starts[0]  # steps 0..steps-1 and the idle after each
        measured_busy = sum(busy[:-1])
        job_busy, job_idle = duty.busy_s - busy0, duty.idle_s - idle0
        rate = steps / window
        if milli >= 1000:
            full_rate = rate
        nv = sampler.summary(wall0, wall1)
        rows.append(
            {
                "share_milli": milli,
                "achieved": _r(measured_busy / window, 4),
                "achieved_by_duty_cycle": _r(job_busy / (job_busy + job_idle), 4) if job_busy + job_idle else None,
                "throughput_vs_full": _r(rate / full_rate, 4) if full_rate else None,
                "median_busy_ms": _r(_median([x * 1e3 for x in busy[:-1]]), 3),
                "steps": steps,
                "window_s": _r(window, 3),
                "nvml_gpu_util": None if nv is None else nv.get("gpu_util"),
                "nvml_sm_util": None if nv is None else nv.get("sm_util"),
            }
        )
    peer.send(contract.SetLimits(gpu_milli=1000))
    return rows


# ==============================================================================================================
# Report and main
# ==============================================================================================================
def print_report(result: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=160)
    for line in machine_lines(result["machine"]):
        console.print(line, highlight=False)
    cfg = result["config"]
    console.print(
        f"job: {cfg['model']} batch {cfg['batch']}, Adam, {cfg['precision']}; need (full rung's peak) "
        f"{result['need_mib']} MiB",
        highlight=False,
    )
    t = Table(title="(a) memory cap: from the boundary that applies it to the end of the first step under it")
    for col in ("cap MiB", "x need", "", "boundary ms", "1st step ms", "total ms", "1st step rung (OOM retries)",
                "settled rung", "steps", "to settled ms", "steady ms", "reserved MiB"):  # fmt: skip
        t.add_column(col, justify="left" if "rung" in col or not col else "right")
    for r in result["caps"]:
        t.add_row(
            str(r["cap_mib"]),
            f"{r['fraction']:g}",
            r["direction"],
            f"{r['boundary_ms']:.2f}",
            f"{r['first_step_ms']:.1f}",
            f"{r['to_first_step_end_ms']:.1f}",
            f"{r['first_rung']} ({r['first_step_retries']})" + (" OOM: ladder exhausted" if r["failed"] else ""),
            str(r["settled_rung"]),
            str(r["steps_to_settle"]),
            f"{r['to_settled_ms']:.1f}",
            "-" if r["steady_step_ms"] is None else f"{r['steady_step_ms']:.1f}",
            f"{r['reserved_before_mib']:.0f}>{r['reserved_after_boundary_mib']:.0f}>{r['reserved_end_mib']:.0f}",
        )
    console.print(t)
    e = result["evict"]
    t = Table(title=f"(b) evict and restore: {e['state_mib']} MiB of state in {e['tensors']} tensors (Gandiva: "
              f"~{GANDIVA_SUSPEND_MS:.0f} ms)")  # fmt: skip
    for col in ("path", "evict ms", "restore ms", "evict GB/s", "restore GB/s", "reserved MiB held -> evicted",
                "bit-exact"):  # fmt: skip
        t.add_column(col, justify="left" if col == "path" else "right")
    t.add_row(
        "Residency, first (pinned memory allocated)",
        f"{e['first_evict_ms']:.1f}",
        f"{e['first_restore_ms']:.1f}",
        "",
        "",
        "",
        str(e["bit_exact"]),
    )
    t.add_row(
        f"Residency, median of {max(1, e['repeats'] - 1)}",
        f"{e['evict_ms']:.1f}",
        f"{e['restore_ms']:.1f}",
        f"{e['evict_gb_s']:.1f}",
        f"{e['restore_gb_s']:.1f}",
        f"{e['held_mib']:.0f} -> {e['evicted_mib']:.0f}",
        "",
    )
    t.add_row(
        "Pause(evict=True) / Resume directives (took_s)",
        "-" if e["directive_evict_ms"] is None else f"{e['directive_evict_ms']:.1f}",
        "-" if e["directive_restore_ms"] is None else f"{e['directive_restore_ms']:.1f}",
        "",
        "",
        "-" if e["directive_paused_reserved_mib"] is None else f"paused: {e['directive_paused_reserved_mib']:.0f}",
        "",
    )
    console.print(t)
    t = Table(title="(c) duty cycle: busy (CUDA events) / wall, idle included")
    for col in ("share", "achieved", "by the duty cycle", "throughput vs full", "busy ms/step", "steps",
                "NVML GPU util %", "GPM SM util %"):  # fmt: skip
        t.add_column(col, justify="right")
    for r in result["duty"]:
        t.add_row(
            f"{r['share_milli'] / 1000:.2f}",
            f"{r['achieved']:.3f}",
            "-" if r["achieved_by_duty_cycle"] is None else f"{r['achieved_by_duty_cycle']:.3f}",
            "-" if r["throughput_vs_full"] is None else f"{r['throughput_vs_full']:.3f}",
            f"{r['median_busy_ms']:.2f}",
            str(r["steps"]),
            "-" if r["nvml_gpu_util"] is None else f"{r['nvml_gpu_util']:.0f}",
            "-" if r["nvml_sm_util"] is None else f"{r['nvml_sm_util']:.0f}",
        )
    console.print(t)
    if result["machine"].get("smoke"):
        console.print(f"*** {SMOKE_NOTE} ***")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="CPU smoke run with a small MLP (automatic without CUDA)")
    p.add_argument("--model", help="resnet50 (default; transformer without torchvision), transformer, resnet18")
    p.add_argument("--batch", type=int, help="default 64 (16 sequences for the transformer; smoke 2048)")
    p.add_argument("--precision", choices=("bf16", "fp32"), default="bf16")
    p.add_argument("--warm-steps", type=int, help="uncapped steps first (default 15; smoke 3)")
    p.add_argument("--caps", default="0.5,0.25,0.1,0.04,2.0", help="memory caps, as fractions of the need")
    p.add_argument(
        "--steps-per-cap", type=int, help="steps under each cap, more for a growing one (default 8; smoke 4)"
    )
    p.add_argument("--evict-repeats", type=int, help="evict/restore repeats (default 5; smoke 3)")
    p.add_argument("--shares", default="1000,750,500,250,100", help="duty-cycle shares, milli-GPU (first: 1000)")
    p.add_argument("--duty-steps", type=int, help="steps measured per share (default 30; smoke 8)")
    p.add_argument("--simulated-gpu-mib", type=int, default=1024, help="smoke: the simulated GPU's memory")
    p.add_argument("--nvml-period", type=float, default=0.1, help="NVML sampling period, seconds")
    p.add_argument("--json", metavar="PATH", help="write every figure to PATH")
    return p


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    ns = parser().parse_args(argv)
    smoke = ns.smoke or not cuda_available()
    if ns.model is None:
        import importlib.util

        ns.model = "tiny-mlp" if smoke else ("resnet50" if importlib.util.find_spec("torchvision") else "transformer")
    if ns.batch is None:
        ns.batch = 2048 if smoke else (16 if ns.model == "transformer" else 64)

    def pick(value: int | None, gpu: int, cpu: int) -> int:
        return value if value is not None else (cpu if smoke else gpu)

    warm = pick(ns.warm_steps, 15, 3)
    per_cap = pick(ns.steps_per_cap, 8, 4)
    repeats = pick(ns.evict_repeats, 5, 3)
    duty_steps = pick(ns.duty_steps, 30, 8)
    fractions = [float(x) for x in ns.caps.split(",") if x.strip()]
    shares = [int(x) for x in ns.shares.split(",") if x.strip()]
    if not fractions or not shares or shares[0] != 1000:
        raise SystemExit("--caps needs at least one fraction; --shares must start with 1000 (the reference)")
    machine = machine_info(smoke=smoke, torch_cuda=not smoke)
    for line in machine_lines(machine):
        print(line)
    print(
        f"{ns.model} batch {ns.batch}: {warm} warm-up steps, {len(fractions)} caps x {per_cap} steps, "
        f"{repeats} evict/restore, {len(shares)} shares x {duty_steps} steps; expected duration about "
        f"{'15 s' if smoke else '2 min (longer with a slow model: the low caps run with activations in host memory)'}",
        flush=True,
    )
    sampler = NvmlSampler(0, ns.nvml_period)
    if not smoke:
        sampler.start()
    tmp = tempfile.mkdtemp(prefix="cgm-", dir="/tmp")
    peer = Peer(os.path.join(tmp, "agent.sock"))
    bench: Bench | None = None
    t0 = time.monotonic()
    try:
        bench = Bench(ns, smoke, peer.path)
        deadline = time.monotonic() + 10
        while not bench.job.connected and time.monotonic() < deadline:
            time.sleep(0.01)
        if not bench.job.connected:
            raise SystemExit("the job did not connect to the stand-in agent")
        need = measure_need(bench, peer, warm)
        print(f"need (full rung's peak): {need} MiB; (a) memory caps ...", flush=True)
        caps = cap_walk(bench, peer, need, fractions, per_cap)
        print("(b) evict and restore ...", flush=True)
        evict = evict_restore(bench, peer, repeats)
        print("(c) duty cycle ...", flush=True)
        duty = duty_cycle(bench, peer, shares, duty_steps, sampler)
    finally:
        sampler.stop()
        if bench is not None:
            bench.close()
        peer.close()
        with contextlib.suppress(OSError):
            os.rmdir(tmp)
    result: dict[str, Any] = {
        "script": "benchmarks/gpu_memory.py",
        "argv": list(sys.argv[1:] if argv is None else argv),
        "note": SMOKE_NOTE if smoke else None,
        "machine": machine,
        "config": {
            "model": ns.model,
            "batch": ns.batch,
            "precision": ns.precision,
            "optimizer": "Adam",
            "warm_steps": warm,
            "steps_per_cap": per_cap,
            "evict_repeats": repeats,
            "duty_steps": duty_steps,
            "simulated_gpu_mib": ns.simulated_gpu_mib if smoke else None,
        },
        "need_mib": need,
        "caps": caps,
        "evict": evict,
        "duty": duty,
        "elapsed_s": round(time.monotonic() - t0, 1),
    }
    print_report(result)
    print(f"elapsed {result['elapsed_s']:.0f} s")
    write_json(ns.json, result)
    return result


if __name__ == "__main__":
    main()
