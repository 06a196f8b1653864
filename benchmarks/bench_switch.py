"""A preempted job's checkpoint-and-resume cycle, cold against warm (issue 19's second figure).

A node's agent (:class:`corral.live.agent.Agent`, one stand-in GPU, warm workers on) runs a training script that
imports torch and :mod:`corral.job`, builds a small model with an optimizer, and steps with checkpoints on. Once
its first run is stepping, the agent asks it to checkpoint and exit (``preempt``, as a scheduler's preemption
does: :class:`~corral.core.contract.Checkpoint`, then exit code 75), and as soon as that run has exited it starts
the job's next run, which resumes from the checkpoint. The cycle is timed from the preemption to the first step
of the new run, in two parts: ``stop`` (the checkpoint written and the run gone) and ``resume`` (the new run
started, torch imported, the model built, the checkpoint loaded, the first step begun). ``cold``: the new run is
a fresh interpreter; ``warm``: it is forked from the agent's zygote, with torch already imported
(``corral.live.agent.zygote``). The scheduler's own part (a round, a store commit: milliseconds, see
``bench_submit.py``) is not in it. By default on the CPU with a stand-in GPU; ``--gpu`` runs the agent on the
machine's real GPUs (NVML) and the model on the job's GPU, which adds CUDA's start (the context is made in every
run, warm or cold: it does not survive a fork) and the copy of the state to the GPU.

    python benchmarks/bench_switch.py              # 10 cycles each way
    python benchmarks/bench_switch.py --cycles 20
    python benchmarks/bench_switch.py --gpu --cycles 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

sys.path.insert(0, str(Path(__file__).parent))
from corral.core.errors import ConfigError
from corral.live.agent import Agent, AgentReport, LaunchRequest, ProcessExited
from corral.live.agent.gpus import discover_gpus

T = TypeVar("T")

# Steps until preempted; prints the time of each run's first step (after the checkpoint, when resumed).
SCRIPT = """import time, sys
import torch
from corral.job import Job
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)).to(device)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
x, y = torch.randn(64, 512, device=device), torch.randint(0, 10, (64,), device=device)
with Job(model=model, optimizer=opt, verbose=False) as job:
    first = True
    for _ in job.loop(range(10**9)):
        if first:
            print("FIRST", job.run, job.start_step, repr(time.time()), flush=True)
            first = False
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        time.sleep(0.01)
"""


class Exits:
    """The agent's reports, waited on for a run's exit."""

    def __init__(self) -> None:
        self._exits: dict[tuple[str, int], tuple[float, ProcessExited]] = {}
        self._cond = threading.Condition()

    def __call__(self, report: AgentReport) -> None:
        if isinstance(report, ProcessExited):
            with self._cond:
                self._exits[(report.job_id, report.run)] = (time.time(), report)
                self._cond.notify_all()

    def exited(self, job_id: str, run: int) -> bool:
        with self._cond:
            return (job_id, run) in self._exits

    def wait(self, job_id: str, run: int, timeout_s: float = 60.0) -> tuple[float, ProcessExited]:
        with self._cond:
            if not self._cond.wait_for(lambda: (job_id, run) in self._exits, timeout_s):
                raise SystemExit(f"run {run} of {job_id} did not exit within {timeout_s:g} s")
            return self._exits[(job_id, run)]


def job_env() -> dict[str, str]:
    """What a benchmark's jobs need of its environment. A job gets only the harmless part of the agent's
    (:mod:`corral.core.contract`, "Environment"): corral found on ``PYTHONPATH`` (a machine without network
    access, docs/measurements.md) must be passed on explicitly, or a cold run cannot import ``corral.job``."""
    return {"PYTHONPATH": os.environ["PYTHONPATH"]} if "PYTHONPATH" in os.environ else {}


def log_line(
    agent: Agent, exits: Exits, job_id: str, run: int, find: Callable[[str], T | None], timeout_s: float = 60.0
) -> T:
    """The first line of the job's log that ``find`` makes something of, polled for; the run's exit before it, or
    the timeout, ends the benchmark with the log."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        gone = exits.exited(job_id, run)  # before reading: a line written just before the exit is still seen
        path = agent.log_path(job_id)
        if path.exists():
            for line in path.read_text().splitlines():
                found = find(line)
                if found is not None:
                    return found
        if gone:
            raise SystemExit(f"run {run} of {job_id} exited first; its log:\n{path.read_text()}")
        time.sleep(0.005)
    raise SystemExit(
        f"run {run} of {job_id}: nothing within {timeout_s:g} s; its log:\n{agent.log_path(job_id).read_text()}"
    )


def first_step(agent: Agent, exits: Exits, job_id: str, run: int) -> tuple[float, int]:
    """When run ``run`` of the job took its first step (from its log), and the step it resumed at."""

    def find(line: str) -> tuple[float, int] | None:
        parts = line.split()
        if len(parts) == 4 and parts[0] == "FIRST" and int(parts[1]) == run:
            return float(parts[3]), int(parts[2])
        return None

    return log_line(agent, exits, job_id, run, find)


def cycle(agent: Agent, exits: Exits, script: Path, work: Path, job_id: str, warm: bool) -> tuple[float, float]:
    def launch(run: int) -> None:
        agent.launch(
            LaunchRequest(job_id, run, (sys.executable, str(script)), str(work), job_env(), (0,), tenant="t", warm=warm)
        )

    launch(1)
    first_step(agent, exits, job_id, 1)
    time.sleep(0.3)  # a few steps: a checkpoint with something in it
    began = time.time()
    agent.preempt(job_id, 1)
    gone, exited = exits.wait(job_id, 1)
    if exited.exit_code != 75:
        raise SystemExit(f"run 1 of {job_id} exited with {exited.exit_code}, not 75 (checkpointed)")
    launch(2)
    resumed, step = first_step(agent, exits, job_id, 2)
    if step == 0:
        raise SystemExit(f"run 2 of {job_id} did not resume from its checkpoint")
    agent.cancel(job_id, 2)
    exits.wait(job_id, 2)
    return gone - began, resumed - gone


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cycles", type=int, default=10, help="cycles each way (default 10)")
    parser.add_argument("--gpu", action="store_true", help="on the machine's GPU (NVML), not a stand-in")
    args = parser.parse_args()
    try:
        gpus = discover_gpus() if args.gpu else discover_gpus(stand_in=1)
    except ConfigError as e:
        raise SystemExit(f"--gpu: {e}") from None
    with tempfile.TemporaryDirectory(prefix="corral-switch-") as tmp:
        base = Path(tmp)
        script, work = base / "train.py", base / "work"
        script.write_text(SCRIPT)
        work.mkdir()
        exits = Exits()
        agent = Agent(base / "state", gpus[:1], exits, warm=True)
        agent.start()
        try:
            zygote = agent._zygote
            if zygote is None or not zygote.wait_ready(60.0):
                raise SystemExit("the agent's warm workers did not start")
            results: dict[str, list[tuple[float, float]]] = {"cold": [], "warm": []}
            for i in range(args.cycles):
                for mode in ("cold", "warm"):  # interleaved: a drift of the machine hits both alike
                    results[mode].append(cycle(agent, exits, script, work, f"{mode}{i}", mode == "warm"))
        finally:
            agent.close()
    where = "GPU " + gpus[0].name if args.gpu else "CPU, stand-in GPU"
    print(f"checkpoint-and-resume cycle, {args.cycles} each way ({where}; a 512-wide MLP with Adam, torch imported):")
    medians = {}
    for mode, rows in results.items():
        stop = statistics.median(r[0] for r in rows)
        resume = statistics.median(r[1] for r in rows)
        total = statistics.median(r[0] + r[1] for r in rows)
        worst = max(r[0] + r[1] for r in rows)
        medians[mode] = total
        print(
            f"  {mode}: preempt to first step resumed {total * 1000:7.1f} ms median (max {worst * 1000:.1f}): "
            f"checkpoint and exit {stop * 1000:.1f} ms, start to first step {resume * 1000:.1f} ms"
        )
    print(f"  warm is {medians['cold'] / medians['warm']:.1f}x faster")


if __name__ == "__main__":
    main()
