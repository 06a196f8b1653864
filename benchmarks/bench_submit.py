"""Submit-to-start latency of the live controller on an idle machine (target: under 200 ms plus process start).

Runs ``corral serve`` (stand-in GPUs, FIFO) in a child process, then submits small jobs one at a time over the
HTTP API with the CLI's client, each waiting for the previous to finish, so every submission meets an idle
machine. For each job it reports:

- ``scheduled``: from the moment the client sends the request to the scheduling round that launches the job
  (the store's "launched" event is stamped with the time of the controller's turn that decided it).
- ``spawned``: to the moment the agent has spawned the job's shim (the "started" event): includes the HTTP
  request, the store commits, the round, and the fork and exec. This is corral's whole part.
- ``running``: to the first line of the job's own Python code (the job prints ``time.time()``): adds the
  interpreter start of the job itself, which is the user's, not corral's.

    python benchmarks/bench_submit.py            # 30 jobs
    python benchmarks/bench_submit.py --jobs 100
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import wait_healthy

from corral.live.client import Client

TARGET_MS = 200.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=30)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "state"
        port = _free_port()
        server = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "corral.cli.main",
                "serve",
                "--state-dir",
                str(state),
                "--port",
                str(port),
                "--gpus",
                "1",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            wait_healthy(url, server, 60)
            client = Client(url, (state / "admin.token").read_text().strip())
            command = [sys.executable, "-c", "import time; print(repr(time.time()))"]
            scheduled, spawned, running = [], [], []
            for i in range(args.jobs + 1):
                sent = time.time()
                job = client.submit(command, cwd=os.getcwd())
                while client.job(job["job_id"])["phase"] not in ("finished", "failed"):
                    time.sleep(0.01)
                events = {e["kind"]: e["time_s"] for e in client.events(job["job_id"])}
                first_line = float(client.logs(job["job_id"])["text"].splitlines()[1])
                if i == 0:
                    continue  # warm-up: the first request pays the server's lazy imports
                scheduled.append((events["launched"] - sent) * 1000)
                spawned.append((events["started"] - sent) * 1000)
                running.append((first_line - sent) * 1000)
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=30)

    def row(name: str, xs: list[float]) -> None:
        xs = sorted(xs)
        p95 = xs[min(len(xs) - 1, int(0.95 * len(xs)))]
        print(f"{name:<38} median {statistics.median(xs):7.1f} ms   p95 {p95:7.1f} ms   max {xs[-1]:7.1f} ms")

    print(f"submit-to-start on an idle machine, {args.jobs} jobs one at a time (target: < {TARGET_MS:.0f} ms + start)")
    row("submit -> launch decided", scheduled)
    row("submit -> job process spawned", spawned)
    row("submit -> job's first line of Python", running)


if __name__ == "__main__":
    main()
