"""Job-side library overhead: what ``corral.job`` adds to each training step when nothing changes.

Target (DESIGN.md): under 1% of a step; for a 50 ms step that is 0.5 ms, and the aim is about 10 µs.

Measured: N iterations of an empty loop body, bare (``for _ in range(N)``) and through the library, in the forms a
script uses: ``job.loop(range(N))`` standalone, standalone with a checkpoint directory (SIGTERM handler,
generator states recorded at the epoch's start), under an agent (a live Unix socket peer on a thread that reads
and counts the reports, at the default report interval of 1 s and at 10 ms), and ``with job.step():``. The
overhead per step is (library - bare) / N, taken as the best of a few repeats. Then a handful of real 50 ms
steps (``time.sleep``), bare and under the agent, for the ratio as a script would see it.

    python benchmarks/bench_job_overhead.py
    python benchmarks/bench_job_overhead.py --steps 500000 --sleep-steps 40
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

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
    ns = parser.parse_args()
    n = ns.steps

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

        def connected(interval_s: float) -> Callable[[], Job]:
            def make() -> Job:
                job = Job(env=agent_env(interval_s), handle_sigterm=False)
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
            ("step(), agent, reports every 1 s", lambda: through_step(connected(1.0), n)),
        ]
        base = best_of(ns.repeats, lambda: bare(n))
        print(f"empty steps: {n:,} per run, best of {ns.repeats}; bare loop {base / n * 1e9:.0f} ns/step")
        print(f"{'form':<36}{'us/step':>9}{'% of 50 ms':>12}")
        for name, run in cases:
            per_step = (best_of(ns.repeats, run) - base) / n
            print(f"{name:<36}{per_step * 1e6:>9.2f}{per_step / STEP_S * 100:>11.4f}%")
        print(f"reports received by the peer: {peer.lines:,}")

        job = connected(0.2)()
        plain = sleeping(ns.sleep_steps, lambda it: it)
        with job:
            wrapped = sleeping(ns.sleep_steps, job.loop)
        print(
            f"\n{ns.sleep_steps} steps of time.sleep({STEP_S}): bare {plain * 1e3:.3f} ms/step, "
            f"under the agent {wrapped * 1e3:.3f} ms/step, ratio {wrapped / plain:.4f} "
            f"(sleep jitter dominates; the empty-step figures above are the library's cost)"
        )
        peer.close()


if __name__ == "__main__":
    main()
