"""Job-side library overhead: what ``corral.job`` adds to each training step when nothing changes.

Target (DESIGN.md): under 1% of a step; for a 50 ms step that is 0.5 ms, and the aim is about 10 µs.

Measured: N iterations of an empty loop body, bare (``for _ in range(N)``) and through the library, in the forms a
script uses: ``job.loop(range(N))`` standalone, standalone with a checkpoint directory (SIGTERM handler,
generator states recorded at the epoch's start), under an agent (a live Unix socket peer on a thread that reads
and counts the reports, at the default report interval of 1 s and at 10 ms), as rank 0 of a gang across nodes
(hosting the gang store, its watcher thread waiting on it; ``corral.job.gang``), and ``with job.step():``. The
overhead per step is (library - bare) / N, taken as the best of a few repeats. Then a handful of real 50 ms
steps (``time.sleep``), bare and under the agent, for the ratio as a script would see it.

With ``--device cuda`` (or ``cpu``) it goes on to a job that has initialised CUDA, so that every boundary also
records and reads the step's CUDA events (``TorchDevice``): empty steps (the library's own cost per step, events
included), then a small real training step (an MLP, fwd + bwd + SGD, about a millisecond on an H100) bare, in
``job.loop``, with ``job.train_step`` (the memory ladder's bookkeeping: the allocator's peak counters read and
reset every step) and under the agent; each run synchronized at its end, best of ``--repeats``. Without CUDA it
runs on the CPU and says so (a CPU smoke run, not a GPU figure).

    python benchmarks/bench_job_overhead.py
    python benchmarks/bench_job_overhead.py --steps 500000 --sleep-steps 40
    python benchmarks/bench_job_overhead.py --device cuda --json overhead.json      # on a GPU machine: ~1 min
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from corral.core import contract
from corral.job import Job

STEP_S = 0.050


class Peer:
    """The agent's end of the channel: accepts one job at a time and counts the lines it sends."""

    def __init__(self, path: str) -> None:
        self.lines = 0
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(path)
        self._listener.listen(4)
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            with conn:
                while data := conn.recv(65536):
                    self.lines += data.count(b"\n")

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()


def best_of(repeats: int, run: Callable[[], float]) -> float:
    return min(run() for _ in range(repeats))


def bare(n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        pass
    return time.perf_counter() - t0


def through_loop(make_job: Callable[[], Job], n: int) -> float:
    job = make_job()
    try:
        t0 = time.perf_counter()
        for _ in job.loop(range(n)):
            pass
        return time.perf_counter() - t0
    finally:
        job.close()


def through_step(make_job: Callable[[], Job], n: int) -> float:
    job = make_job()
    try:
        t0 = time.perf_counter()
        for _ in range(n):
            with job.step():
                pass
        return time.perf_counter() - t0
    finally:
        job.close()


def sleeping(steps: int, wrap: Callable[[Iterator[int]], Iterator[int]]) -> float:
    t0 = time.perf_counter()
    for _ in wrap(iter(range(steps))):
        time.sleep(STEP_S)
    return (time.perf_counter() - t0) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=200_000, help="empty steps per measurement")
    parser.add_argument("--repeats", type=int, default=5, help="best of this many runs")
    parser.add_argument("--sleep-steps", type=int, default=20, help="50 ms steps for the ratio")
    parser.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        help="then measure a job that uses torch on this device (cuda: CUDA events at every boundary)",
    )
    parser.add_argument("--device-steps", type=int, default=300, help="real training steps per run (--device)")
    parser.add_argument("--json", metavar="PATH", help="also write the figures to PATH as JSON")
    parser.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="N",
        help="with --device: cProfile the loop and train_step runs, print the N functions with the most own time",
    )
    ns = parser.parse_args()
    n = ns.steps
    figures: dict[str, Any] = {"script": "benchmarks/bench_job_overhead.py", "argv": sys.argv[1:], "empty": {}}

    with tempfile.TemporaryDirectory(prefix="corral-bench-", dir="/tmp") as tmp:
        sock = os.path.join(tmp, "agent.sock")
        peer = Peer(sock)

        def agent_env(interval_s: float) -> dict[str, str]:
            return {
                contract.ENV_JOB_ID: "bench",
                contract.ENV_RUN: "1",
                contract.ENV_AGENT_SOCKET: sock,
                contract.ENV_REPORT_INTERVAL_S: str(interval_s),
            }

        def gang_env() -> dict[str, str]:
            """Rank 0 of a gang of one node: the gang store hosted here, its watcher thread waiting on it."""
            ports = []
            for _ in range(2):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", 0))
                    ports.append(s.getsockname()[1])
            return contract.gang_env(["127.0.0.1"], 0, 1, ports[0], ports[1])

        def connected(interval_s: float, gang: bool = False) -> Callable[[], Job]:
            def make() -> Job:
                env = agent_env(interval_s) | (gang_env() if gang else {})
                job = Job(env=env, handle_sigterm=False)
                deadline = time.monotonic() + 5
                while not job.connected and time.monotonic() < deadline:
                    time.sleep(0.001)
                return job

            return make

        ckpt = Path(tmp) / "ckpt"
        cases: list[tuple[str, Callable[[], float]]] = [
            ("loop, standalone", lambda: through_loop(lambda: Job(env={}), n)),
            ("loop, standalone + checkpoint dir", lambda: through_loop(lambda: Job(env={}, checkpoint_dir=ckpt), n)),
            ("loop, agent, reports every 1 s", lambda: through_loop(connected(1.0), n)),
            ("loop, agent, reports every 10 ms", lambda: through_loop(connected(0.01), n)),
            ("loop, gang rank 0, agent, 1 s", lambda: through_loop(connected(1.0, gang=True), n)),
            ("step(), agent, reports every 1 s", lambda: through_step(connected(1.0), n)),
        ]
        base = best_of(ns.repeats, lambda: bare(n))
        print(f"empty steps: {n:,} per run, best of {ns.repeats}; bare loop {base / n * 1e9:.0f} ns/step")
        print(f"{'form':<36}{'us/step':>9}{'% of 50 ms':>12}")
        for name, run in cases:
            per_step = (best_of(ns.repeats, run) - base) / n
            print(f"{name:<36}{per_step * 1e6:>9.2f}{per_step / STEP_S * 100:>11.4f}%")
            figures["empty"][name] = {"us_per_step": per_step * 1e6}
        print(f"reports received by the peer: {peer.lines:,}")
        figures["bare_ns_per_step"] = base / n * 1e9

        job = connected(0.2)()
        plain = sleeping(ns.sleep_steps, lambda it: it)
        with job:
            wrapped = sleeping(ns.sleep_steps, job.loop)
        print(
            f"\n{ns.sleep_steps} steps of time.sleep({STEP_S}): bare {plain * 1e3:.3f} ms/step, "
            f"under the agent {wrapped * 1e3:.3f} ms/step, ratio {wrapped / plain:.4f} "
            f"(sleep jitter dominates; the empty-step figures above are the library's cost)"
        )
        figures["sleep_steps"] = {"bare_ms": plain * 1e3, "agent_ms": wrapped * 1e3, "ratio": wrapped / plain}
        if ns.device is not None:
            figures["device"] = device_section(ns.device, ns, agent_env)
        peer.close()
    if ns.json:
        Path(ns.json).write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
        print(f"results written to {ns.json}")


def device_section(wanted: str, ns: argparse.Namespace, agent_env: Callable[[float], dict[str, str]]) -> dict[str, Any]:
    """``--device``: the library's cost on a job that uses torch on ``wanted`` (CUDA events at each boundary)."""
    import torch
    import torch.nn.functional as F

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gpu_colocation import SMOKE_NOTE, machine_info, machine_lines

    cuda = wanted == "cuda" and torch.cuda.is_available()
    dev = torch.device("cuda" if cuda else "cpu")
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(1024, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 1024), torch.nn.ReLU(),
        torch.nn.Linear(1024, 10),
    ).to(dev)  # fmt: skip
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    rows = 512 if cuda else 32  # a CPU smoke run only checks the code paths
    batch = (torch.randn(rows, 1024, generator=g).to(dev), torch.randint(0, 10, (rows,), generator=g).to(dev))

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    def loss_fn(b: Any) -> Any:
        return F.cross_entropy(model(b[0]), b[1])

    def manual_step() -> None:
        optimizer.zero_grad(set_to_none=True)
        loss_fn(batch).backward()
        optimizer.step()

    steps = ns.device_steps
    empty = min(ns.steps, 50_000)

    def bare_real() -> float:
        sync()
        t0 = time.perf_counter()
        for _ in range(steps):
            manual_step()
        sync()
        return time.perf_counter() - t0

    def in_loop(make: Callable[[], Job], use_train_step: bool) -> Callable[[], float]:
        def run() -> float:
            job = make()
            try:
                sync()
                t0 = time.perf_counter()
                for _ in job.loop(range(steps)):
                    if use_train_step:
                        job.train_step(batch, loss_fn)
                    else:
                        manual_step()
                sync()
                return time.perf_counter() - t0
            finally:
                job.close()

        return run

    def standalone() -> Job:
        return Job(model=model, optimizer=optimizer, env={})

    def agent() -> Job:
        job = Job(model=model, optimizer=optimizer, env=agent_env(1.0), handle_sigterm=False)
        deadline = time.monotonic() + 5
        while not job.connected and time.monotonic() < deadline:
            time.sleep(0.001)
        return job

    for _ in range(20):
        manual_step()  # warm-up: kernels chosen, allocator filled
    sync()
    machine = machine_info(smoke=not cuda, torch_cuda=cuda)
    print()
    for line in machine_lines(machine):
        print(line)
    where = "CUDA" if cuda else "CPU"
    out: dict[str, Any] = {"device": str(dev), "note": None if cuda else SMOKE_NOTE, "machine": machine}
    base = best_of(ns.repeats, lambda: bare(empty))
    per_empty = (best_of(ns.repeats, lambda: through_loop(standalone, empty)) - base) / empty
    print(f"{where} job, empty steps ({empty:,} per run, best of {ns.repeats}; the boundary records and reads the")
    print(f"step's {'CUDA events' if cuda else 'wall time'}): {per_empty * 1e6:.2f} us/step")
    out["empty_us_per_step"] = per_empty * 1e6
    ref = best_of(ns.repeats, bare_real) / steps
    cases: list[tuple[str, Callable[[], float]]] = [
        ("loop, standalone, own step", in_loop(standalone, False)),
        ("loop, standalone, train_step", in_loop(standalone, True)),
        ("loop, agent (1 s reports), train_step", in_loop(agent, True)),
    ]
    print(f"real steps ({steps} per run, MLP 1024-2048-1024-10, batch {rows}, SGD): bare {ref * 1e3:.3f} ms/step")
    print(f"{'form':<40}{'ms/step':>9}{'us/step over bare':>19}{'% of step':>11}")
    out["real_step_ms"] = ref * 1e3
    out["real"] = {}
    for name, run in cases:
        per = best_of(ns.repeats, run) / steps
        print(f"{name:<40}{per * 1e3:>9.3f}{(per - ref) * 1e6:>19.1f}{(per - ref) / ref * 100:>10.2f}%")
        out["real"][name] = {"ms_per_step": per * 1e3, "us_over_bare": (per - ref) * 1e6}
    if ns.profile:
        profile_cases(cases[:2], ns.profile)
    if not cuda:
        print(f"*** {SMOKE_NOTE} ***")
    return out


def profile_cases(cases: list[tuple[str, Callable[[], float]]], top: int) -> None:
    """``--profile N``: where a real step's time goes in ``job.loop`` and ``job.train_step`` (cProfile, the N
    functions with the most own time). cProfile's own cost inflates every call, so read it for the shares, not
    the totals."""
    import cProfile
    import pstats

    for name, run in cases:
        prof = cProfile.Profile()
        prof.runcall(run)
        print(f"\nprofile: {name} (top {top} by own time)")
        pstats.Stats(prof, stream=sys.stdout).sort_stats("tottime").print_stats(top)


if __name__ == "__main__":
    main()
