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

With ``--torch`` each job is a training script's start instead (issue 19's cold start): it imports torch and
``corral.job``, builds a small model and prints the time at its first step in ``job.loop``; ``running`` is then
submit to first step, and the script's own phases (interpreter start to ``import torch`` done, ``corral.job``
imported, first step) are printed too. With ``--warm`` as well, the server has ``warm_starts`` on and the jobs are
submitted with ``warm``: forked from a process that has imported torch (``corral.live.agent.zygote``).

    python benchmarks/bench_submit.py            # 30 jobs
    python benchmarks/bench_submit.py --jobs 100
    python benchmarks/bench_submit.py --torch --jobs 10
    python benchmarks/bench_submit.py --torch --warm --jobs 10
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import free_port, wait_healthy

from corral.live.client import Client

TARGET_MS = 200.0

# A training script's start, each phase stamped: interpreter up, torch imported, corral.job imported, model built,
# first step begun (a CPU job: stand-in GPUs).
TORCH_JOB = """import time; t = [time.time()]
import torch; t.append(time.time())
from corral.job import Job; t.append(time.time())
model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.1); t.append(time.time())
job = Job(model=model, optimizer=opt)
for _ in job.loop(range(1)):
    t.append(time.time())
print(*map(repr, t))
"""
PHASES = ("interpreter up", "torch imported", "corral.job imported", "model built", "first step")


def _warm_config(tmp: Path) -> Path:
    conf = tmp / "corral.toml"
    conf.write_text("[server]\nwarm_starts = true\n")
    return conf


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=30)
    parser.add_argument("--torch", action="store_true", help="jobs that import torch and corral.job (cold start)")
    parser.add_argument("--warm", action="store_true", help="with --torch: serve with warm_starts, submit --warm")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "state"
        port = free_port()
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
                *(["--config", str(_warm_config(Path(tmp)))] if args.warm else []),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            wait_healthy(url, server, 60)
            if args.warm:  # the zygote imports torch after the server is up; until then runs start cold
                zlog = state / "zygote.log"
                deadline = time.monotonic() + 120
                while not (zlog.exists() and "imported" in zlog.read_text()):
                    if time.monotonic() > deadline:
                        raise SystemExit("the warm-start zygote did not come up")
                    time.sleep(0.05)
            client = Client(url, (state / "admin.token").read_text().strip())
            if args.torch:  # a script file, as a warm start needs (not python -c)
                job_file = Path(tmp) / "job.py"
                job_file.write_text(TORCH_JOB)
                command = [sys.executable, str(job_file)]
            else:
                command = [sys.executable, "-c", "import time; print(repr(time.time()))"]
            scheduled, spawned, running = [], [], []
            phases: list[list[float]] = [[] for _ in PHASES]
            for i in range(args.jobs + 1):
                sent = time.time()
                job = client.submit(command, cwd=os.getcwd(), warm=args.warm)
                while client.job(job["job_id"])["phase"] not in ("finished", "failed"):
                    time.sleep(0.01)
                events = {e["kind"]: e["time_s"] for e in client.events(job["job_id"])}
                text = client.logs(job["job_id"])["text"]
                try:
                    # the line of times (the log's first line names the command, which may span lines)
                    line = next(x for x in text.splitlines() if x and not x.strip(" .0123456789"))
                    stamps = [float(x) for x in line.split()]
                except (StopIteration, ValueError):
                    raise SystemExit(f"job {job['job_id']} did not print its times; its log:\n{text}") from None
                if i == 0:
                    continue  # warm-up: the first request pays the server's lazy imports
                scheduled.append((events["launched"] - sent) * 1000)
                spawned.append((events["started"] - sent) * 1000)
                running.append((stamps[-1] - sent) * 1000)
                for k, stamp in enumerate(stamps if args.torch else ()):
                    phases[k].append((stamp - sent) * 1000)
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=30)

    def row(name: str, xs: list[float]) -> None:
        xs = sorted(xs)
        p95 = xs[min(len(xs) - 1, int(0.95 * len(xs)))]
        print(f"{name:<38} median {statistics.median(xs):7.1f} ms   p95 {p95:7.1f} ms   max {xs[-1]:7.1f} ms")

    how = " (warm starts)" if args.warm else ""
    print(f"submit-to-start{how} on an idle machine, {args.jobs} jobs one at a time", end="")
    print(f" (target: < {TARGET_MS:.0f} ms + start)")
    row("submit -> launch decided", scheduled)
    row("submit -> job process spawned", spawned)
    if not args.torch:
        row("submit -> job's first line of Python", running)
        return
    for name, xs in zip(PHASES, phases, strict=True):
        row(f"submit -> {name}", xs)


if __name__ == "__main__":
    main()
