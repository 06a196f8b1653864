"""Chaos: ``kill -9`` the live controller again and again while it runs short jobs, then check what became of them.

For each policy, a real ``corral serve`` (stand-in GPUs) gets a stream of short jobs; at random moments (seeded)
the driver kills it with ``SIGKILL`` and starts a new one on the same state directory, at once, as a supervisor
would. Some kills land while the previous restart is still recovering, some while a submission is in flight.
While no controller runs, the driver also makes some running jobs disappear (``SIGKILL`` to their process
group) or asks ``corral.job`` jobs to stop (``SIGTERM``: they checkpoint and exit 75), so restarts meet runs that
vanished, runs that ended while nobody watched, and jobs to be requeued from a checkpoint. After the last kill
the queue is drained, the server stopped normally, and every job judged:

- **lost**: a job the API accepted that the server no longer knows, or one marked finished whose work never
  completed (its last line missing);
- **twice**: a job whose work completed more than once (its last line twice), a run number started twice, two
  runs of one job alive at the same time (each run takes an ``flock`` on a file of the job's; a second run that
  finds it taken says so), or one submission that became two jobs;
- **stuck**: not in a terminal phase when the drain ended: ``drain_s`` with no job ending (a backlog still being
  worked through keeps the drain going, up to ``DRAIN_CAP`` times ``drain_s`` in all);
- **orphans**: a process of any run's process group still alive after the final stop (the agent records the
  shim's pid, the group id, under ``STATE_DIR/runs/<job>/<run>/``), other than a stuck job's current run;
- **wrong**: any other unexpected outcome: a job that should finish that failed or was rejected, a failing job
  whose reason does not name its exit code as the docs say, a finish in another run than the last one, a
  checkpointed job whose resumed state or final weights differ from an uninterrupted run's;
- **errors**: ``ERROR`` lines and tracebacks in the servers' logs, a server that died on its own or did not answer.

Where the controller's own notes explain a job done twice, the report says so: each earlier completed run was
either never heard to exit (no "exited run N" event: ``unheard``) or heard to exit as it does when done without
the job ending (``ignored``); two runs alive at once, with an older run never heard to exit, are ``unheard`` too.

Restart-to-healthy is the time from a kill to the new server answering ``/v1/health`` with every job that was
running before the kill known again (``GET /v1/jobs/<id>`` answers); a restart cut short by the next kill is not
timed. A job's output (``start NAME run R``, ``end NAME run R``) says which run did what, so a job reattached
across restarts keeps its run number and a requeued one shows one ``start`` per run and one ``end``.

The jobs: plain Python processes that sleep 0.2-2 s (some exit with code 3: they must fail, once), some needing
both GPUs; ``corral.job`` jobs without torch (a step counter checkpointed through the library's hooks); and a few
``examples/train_mlp.py`` runs (real PyTorch through ``corral.job``, bit-exact resume: their final weights must
equal an uninterrupted run's). Each policy runs with its time constants cut to seconds (see
:data:`SHORT_SPECS`), so that its own preemptions, time slices and leases happen within these jobs' lifetimes.

    python benchmarks/chaos.py                                      # every live policy, 1000 jobs, 100 kills
    python benchmarks/chaos.py --policy tiresias --jobs 100 --kills 10 --seed 1
    python benchmarks/chaos.py --policy 'gandiva:quantum_s=5' --train-fraction 0

``tests/live/test_chaos.py`` runs a bounded version of the same driver in the test suite.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import math
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import free_port

from corral.live.agent import safe_name
from corral.live.client import Client, ClientError, JobJson
from corral.policies.registry import policy_names

PY = sys.executable
REPO = Path(__file__).resolve().parents[1]
TRAIN_SCRIPT = REPO / "examples" / "train_mlp.py"
ORACLES = ("sjf", "srtf")  # they refuse live jobs: no duration is known (docs/live.md, "Policies live")
TERMINAL = ("finished", "failed", "cancelled", "rejected")
Digest = str | Callable[[], str]

# Each policy's time constants cut to seconds: with their defaults (a 60 s quantum, a 10-minute lease, an hour of
# GPU service before demotion) nothing but FIFO-like behaviour would happen to jobs of a second or two.
DRAIN_CAP = 20  # the longest drain, in drain_s: a queue that drains slower than that counts as stuck

SHORT_SPECS: dict[str, str] = {
    "antman": "antman:control_interval_s=1",
    "gandiva": "gandiva:quantum_s=1,introspect_s=2",
    "iadeep": "iadeep:tune_interval_s=2",
    "themis": "themis:lease_s=2",
    "tiresias": "tiresias:thresholds_gpu_s=1",
}

# -- the jobs ------------------------------------------------------------------------------------------------------
# Every job takes an exclusive flock on a file of its own for as long as it lives (the lock goes with the process,
# however it dies): a run that finds it taken is a second run of the same job alive at once, and says so.
# A job blocks SIGTERM before its last line and leaves with os._exit: a preemption that comes after the work is
# done cannot kill it between the line and the exit (which would run the work again, and look like a duplicate).
_LOCK = """
import fcntl, os, signal, sys, time
lock = open(os.path.join(os.environ["CHAOS_LOCKS"], name), "a")
try:
    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
except OSError:
    print(f"CONCURRENT {name} run {run}", flush=True)
"""

PLAIN_JOB = (
    """
import os, sys
name, seconds, code = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
run = os.environ["CORRAL_RUN"]
"""
    + _LOCK
    + """
print(f"start {name} run {run}", flush=True)
time.sleep(seconds)
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
print(f"end {name} run {run}", flush=True)
os._exit(code)
"""
)

# corral.job without torch: a counter saved and restored through the library's checkpoint hooks. The count must
# end equal to the steps: a checkpoint whose saved state and step disagree shows up as a wrong total. The script's
# own handler ignores SIGTERM before the library takes it over and after the library gives it back: a stop asked
# before the job is up is then carried out by the grace period's SIGKILL (a job slow to stop, as big checkpoints
# make real ones), and one asked after the work is done lets it end with 0 instead of doing it again.
STEPS_JOB = (
    """
import json, os, sys
name, steps, step_s = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
run = os.environ["CORRAL_RUN"]
"""
    + _LOCK
    + """
signal.signal(signal.SIGTERM, lambda *_: None)
import corral.job
state = {"count": 0}
def save(path):
    (path / "chaos.json").write_text(json.dumps(state))
def load(path):
    state.update(json.loads((path / "chaos.json").read_text()))
with corral.job.Job(save=save, load=load, verbose=False) as job:
    print(f"start {name} run {run} at step {job.start_step}", flush=True)
    while job.global_step < steps:
        with job.step():
            state["count"] += 1
            time.sleep(step_s)
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
print(f"end {name} run {run} count {state['count']}", flush=True)
os._exit(0)
"""
)

# examples/train_mlp.py run in-process (so the flock and the SIGTERM guard above hold for it), then a digest of the
# weights it saved: equal to an uninterrupted run's when every resume was bit-exact.
TRAIN_JOB = """
import hashlib, os, runpy, signal, sys
name, script, weights = sys.argv[1], sys.argv[2], sys.argv[3]
run = os.environ.get("CORRAL_RUN", "0")
if "CHAOS_LOCKS" in os.environ:
    import fcntl
    lock = open(os.path.join(os.environ["CHAOS_LOCKS"], name), "a")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        print(f"CONCURRENT {name} run {run}", flush=True)
signal.signal(signal.SIGTERM, lambda *_: None)
print(f"start {name} run {run}", flush=True)
sys.argv = [script, *sys.argv[4:], "--save-weights", weights]
runpy.run_path(script, run_name="__main__")
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
import torch
state = torch.load(weights)
digest = hashlib.sha256()
for key in sorted(state):
    digest.update(key.encode())
    digest.update(state[key].numpy().tobytes())
print(f"end {name} run {run} weights {digest.hexdigest()}", flush=True)
sys.stdout.flush()
os._exit(0)
"""
TRAIN_ARGS = ("--epochs", "2", "--steps-per-epoch", "12", "--step-sleep", "0.03", "--seed", "7")


def live_policies() -> list[str]:
    """Every registered policy that takes live jobs (all but the oracles)."""
    return [p for p in policy_names() if p not in ORACLES]


def chaos_spec(policy: str) -> str:
    """The spec a policy runs with here: its name with its time constants cut to seconds."""
    return SHORT_SPECS.get(policy, policy)


@dataclass(frozen=True)
class Options:
    """What one chaos run does. Job durations are the plain jobs' sleeps; kills fall at random moments spread
    over the time the jobs would take on the GPUs."""

    jobs: int = 1000
    kills: int = 100
    seed: int = 0
    gpus: int = 2
    min_s: float = 0.2
    max_s: float = 2.0
    fail_fraction: float = 0.08  # jobs that exit with code 3 (they must end failed, once)
    wide_fraction: float = 0.1  # jobs that need every GPU
    steps_fraction: float = 0.2  # corral.job jobs without torch
    train_fraction: float = 0.02  # examples/train_mlp.py jobs (each costs seconds of CPU: torch's import)
    steps: int = 20  # a corral.job step job's steps ...
    step_s: float = 0.04  # ... and the time each takes
    victim_p: float = 0.3  # per kill, the chance that each running job is made to vanish or stop meanwhile
    first_victim: bool = True  # the first kill that finds a running job always makes one vanish or stop
    recovery_p: float = 0.2  # per restart, the chance that the next kill comes while it is still recovering
    inflight_p: float = 0.3  # per kill, the chance it hits while a submission is in flight
    grace_s: float = 2.0  # the server's grace period: a preempted job that ignores SIGTERM is killed after it
    poll_s: float = 0.3
    drain_s: float = 120.0  # after the last kill and submission: time with no job ending before the rest is "stuck"
    start_s: float = 60.0  # the most a restart may take before it counts as failed (and is tried again)


@dataclass
class Planned:
    """One job as the driver means it."""

    name: str
    kind: str  # plain | fail | steps | train
    command: list[str]
    num_gpus: int
    submit_at_s: float
    job_id: str | None = None
    in_doubt: bool = False  # submitted while the server was killed: accepted or not, the server will say
    victim_of: list[str] = field(default_factory=list)  # what the driver did to its runs


@dataclass
class Report:
    """What one chaos run found (each list holds one line per problem, naming the job and what was wrong)."""

    policy: str
    jobs: int = 0
    kills: int = 0
    kills_in_recovery: int = 0
    in_doubt: int = 0  # submissions cut by a kill (then found accepted, or submitted again)
    lost: list[str] = field(default_factory=list)
    twice: list[str] = field(default_factory=list)
    stuck: list[str] = field(default_factory=list)
    orphans: list[str] = field(default_factory=list)
    wrong: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    # Of ``twice``, the ones the controller's notes explain: a run that completed and whose exit was never noted
    # (``unheard``), or was noted but did not end the job (``ignored``).
    unheard: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)
    restart_s: list[float] = field(default_factory=list)
    finished: int = 0
    trained: int = 0  # of them, PyTorch jobs whose final weights equal an uninterrupted run's
    failed: int = 0
    vanished: int = 0  # runs the driver killed while no controller ran
    stopped: int = 0  # corral.job runs it asked to checkpoint and exit while no controller ran
    requeued: int = 0  # jobs that ran more than once
    resumed: int = 0  # runs that started from a checkpoint
    reattached: int = 0  # "reattached" events: a run taken back by a restarted controller
    preempted: int = 0  # "preempted" events (the policy's own)
    suspended: int = 0  # "suspended" events (the policy's own)
    wall_s: float = 0.0

    @property
    def problems(self) -> list[str]:
        return [*self.lost, *self.twice, *self.stuck, *self.orphans, *self.wrong, *self.errors]


# -- processes ----------------------------------------------------------------------------------------------------
def _exits(events: list[Any]) -> dict[int, str]:
    """What the controller noted of each run's exit (its "exited" events): ``run -> "exited with code 0"``..."""
    exits: dict[int, str] = {}
    for e in events:
        m = re.match(r"run (\d+): (.*)", e["detail"]) if e["kind"] == "exited" else None
        if m:
            exits[int(m.group(1))] = m.group(2)
    return exits


def _healthy(port: int) -> bool:
    """Whether the server on ``port`` answers ``/v1/health`` with 200. (The standard library's client: httpx makes
    an SSL context per client, some 50 ms of CPU, and this is asked every 50 ms while a server restarts.)"""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1.0)
    try:
        conn.request("GET", "/v1/health")
        return conn.getresponse().status == 200
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()


def _proc_table() -> dict[int, list[tuple[int, str, int]]]:
    """Every process by process group: ``pgrp -> [(pid, state letter, start ticks)]``."""
    table: dict[int, list[tuple[int, str, int]]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                rest = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        table.setdefault(int(rest[2]), []).append((int(entry.name), rest[0].decode(), int(rest[19])))
    return table


def _group_alive(table: dict[int, list[tuple[int, str, int]]], pgid: int, ticks: int) -> bool:
    """Whether the process group led by the shim ``pgid`` (started at ``ticks``) still has a live member. A
    group id cannot be reused while the group has members, so a leader with other start ticks means ours is gone."""
    members = table.get(pgid, [])
    if any(pid == pgid and t != ticks for pid, _, t in members):
        return False
    return any(state not in ("Z", "X", "x") for _, state, _ in members)


def _read_pid(path: Path) -> tuple[int, int] | None:
    try:
        pid, ticks = path.read_text().split()
        return int(pid), int(ticks)
    except (OSError, ValueError):
        return None


def _run_groups(state_dir: Path) -> dict[tuple[str, int], set[tuple[int, int]]]:
    """The process groups of every run the agent recorded: ``(job file name, run) -> {(shim pid, ticks)}``."""
    groups: dict[tuple[str, int], set[tuple[int, int]]] = {}
    for run_dir in (state_dir / "runs").glob("*/*"):
        if not run_dir.name.isdigit():
            continue
        for record in ("spawned", "pid"):
            found = _read_pid(run_dir / record)
            if found is not None:
                groups.setdefault((run_dir.parent.name, int(run_dir.name)), set()).add(found)
    return groups


def _write_scripts(bin_dir: Path) -> None:
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name, text in (("plain.py", PLAIN_JOB), ("steps.py", STEPS_JOB), ("train.py", TRAIN_JOB)):
        (bin_dir / name).write_text(text.lstrip())


def reference_digest(work_dir: Path) -> str:
    """The weights digest of an uninterrupted standalone run of the training job (no corral environment)."""
    _write_scripts(work_dir / "bin")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_") and k != "CHAOS_LOCKS"}
    env["OMP_NUM_THREADS"] = "1"
    weights = work_dir / "reference.pt"
    done = subprocess.run(
        [PY, str(work_dir / "bin" / "train.py"), "reference", str(TRAIN_SCRIPT), str(weights), *TRAIN_ARGS],
        env=env,
        cwd=work_dir,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    found = re.search(r"^end reference run \S+ weights (\w+)$", done.stdout, re.M)
    if done.returncode != 0 or found is None:
        raise RuntimeError(f"the reference training run failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return found.group(1)


# -- one run ------------------------------------------------------------------------------------------------------
class Chaos:
    """One chaos run of one policy (see the module docstring). ``run()`` returns its :class:`Report` and leaves
    no process behind."""

    def __init__(self, spec: str, options: Options, work_dir: Path, train_digest: Digest | None = None) -> None:
        self.spec = spec
        self.o = options
        self.work = work_dir
        self.state_dir = work_dir / "state"
        self.locks = work_dir / "locks"
        self.bin = work_dir / "bin"  # the jobs' scripts
        self._digest = train_digest
        self.rng = random.Random(f"{options.seed}:{spec}")
        self.report = Report(policy=spec)
        self.server: subprocess.Popen[bytes] | None = None
        self.client: Client | None = None
        self.starts = 0
        self.started_at = 0.0  # monotonic time of the last spawn
        self.killed_at: float | None = None  # the kill the server being started is timed from
        self.running_before: list[str] = []  # jobs running at the last poll before the kill
        self.healthy = False
        self.running: dict[str, JobJson] = {}
        self.open_jobs = 0  # pending or running at the last poll
        self.last_poll = 0.0
        self.t0 = 0.0
        self.token = ""
        self.url = ""
        self.port = 0
        self._by_id: dict[str, Planned] = {}
        self.stuck_ids: set[str] = set()
        self.pending: list[Planned] = []  # not submitted yet, by submission time
        self.last_submit = 0.0
        self.plan = self._plan()
        # Kills come after a random time up (or, now and then, while a restart is still recovering), spaced so
        # that they spread over about the time the work takes on the GPUs.
        self.kill_gap_s = self._work_s(self.plan) / (options.kills + 1)
        self.kills_left = options.kills
        self.next_kill: float | None = None  # monotonic time of the next kill

    # -- the plan ---------------------------------------------------------------------------------------------------
    def _plan(self) -> list[Planned]:
        o, rng = self.o, self.rng
        kinds = ["plain"] * o.jobs
        n_fail, n_steps = round(o.jobs * o.fail_fraction), round(o.jobs * o.steps_fraction)
        n_train = round(o.jobs * o.train_fraction) if self._digest is not None else 0
        slots = rng.sample(range(o.jobs), min(o.jobs, n_fail + n_steps + n_train))
        for i, slot in enumerate(slots):
            kinds[slot] = "fail" if i < n_fail else "steps" if i < n_fail + n_steps else "train"
        plan: list[Planned] = []
        for i, kind in enumerate(kinds):
            name = f"j{i:04d}"
            seconds = rng.uniform(o.min_s, o.max_s)
            if kind in ("plain", "fail"):
                code = "3" if kind == "fail" else "0"
                command = [PY, str(self.bin / "plain.py"), name, f"{seconds:.3f}", code]
            elif kind == "steps":
                command = [PY, str(self.bin / "steps.py"), name, str(o.steps), str(o.step_s)]
            else:
                weights = self.work / "weights" / f"{name}.pt"
                command = [PY, str(self.bin / "train.py"), name, str(TRAIN_SCRIPT), str(weights), *TRAIN_ARGS]
            wide = kind != "train" and rng.random() < o.wide_fraction
            plan.append(Planned(name, kind, command, o.gpus if wide else 1, 0.0))
        # Submissions spread over a bit less than the time the work takes on the GPUs, so a queue builds up.
        window = self._work_s(plan) * 0.7
        for job, at in zip(plan, sorted(rng.uniform(0, window) for _ in plan), strict=True):
            job.submit_at_s = at
        return plan

    def _work_s(self, plan: list[Planned]) -> float:
        """About how long the jobs take on the GPUs, one after another (seconds of wall time)."""
        o = self.o
        mean = {"plain": (o.min_s + o.max_s) / 2 + 0.1, "steps": o.steps * o.step_s + 0.4, "train": 8.0}
        total = sum(mean.get(p.kind, mean["plain"]) * p.num_gpus for p in plan)
        return max(1.0, total / o.gpus)

    # -- the server -------------------------------------------------------------------------------------------------
    def _spawn(self) -> None:
        self.starts += 1
        if self.starts > 2 * self.o.kills + 10:
            raise RuntimeError(f"corral serve keeps failing to start: see the logs in {self.work}")
        port = free_port()
        with open(self.work / f"server-{self.starts}.log", "wb") as out:  # the child keeps its own copy
            self.server = subprocess.Popen(
                [
                    PY,
                    "-m",
                    "corral.cli.main",
                    "serve",
                    "--state-dir",
                    str(self.state_dir),
                    "--port",
                    str(port),
                    "--gpus",
                    str(self.o.gpus),
                    "--policy",
                    self.spec,
                    "--grace",
                    str(self.o.grace_s),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.work,
            )
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.started_at = time.monotonic()
        self.healthy = False
        self.next_kill = None
        if self.killed_at is not None and self.kills_left and self.rng.random() < self.o.recovery_p:
            self.next_kill = self.started_at + self.rng.uniform(0.05, 1.5)
        if self.client is not None:
            self.client.close()
            self.client = None

    def _listening(self) -> bool:
        """Whether the server we started holds its socket: its state dir's server.json names its pid."""
        assert self.server is not None
        try:
            info = json.loads((self.state_dir / "server.json").read_text())
        except (OSError, ValueError):
            return False
        return isinstance(info, dict) and info.get("pid") == self.server.pid

    def _kill(self, *, during_submit: Planned | None = None) -> None:
        """SIGKILL the server (while ``during_submit`` is being submitted, if given), act on the jobs it leaves
        running, and start the next one at once."""
        server = self.server
        assert server is not None
        if not self.healthy:
            self.report.kills_in_recovery += 1
        self.report.kills += 1
        self.kills_left -= 1
        when: list[float] = []

        def kill() -> None:
            server.send_signal(signal.SIGKILL)
            when.append(time.monotonic())

        if during_submit is not None:
            killer = threading.Timer(self.rng.uniform(0.0, 0.02), kill)
            killer.start()
            self._submit(during_submit, killing=True)
            killer.join()
        else:
            kill()
        killed_at = when[0]
        server.wait()
        if self.client is not None:
            self.client.close()
            self.client = None
        self.running_before = list(self.running) if self.healthy else self.running_before
        self._victims()
        self.killed_at = killed_at
        self._spawn()

    def _victims(self) -> None:
        """While no controller runs: some running jobs vanish (SIGKILL to their process group), some corral.job
        ones are asked to checkpoint and exit (SIGTERM, which the library turns into exit 75)."""
        table = _proc_table()
        eligible: list[tuple[JobJson, Planned, int, tuple[int, int]]] = []
        for job_id, job in sorted(self.running.items()):
            run = job["process"]["run"]
            run_dir = self.state_dir / "runs" / safe_name(job_id) / str(run)
            shim = _read_pid(run_dir / "pid") or _read_pid(run_dir / "spawned")
            planned = self._by_id.get(job_id)
            if shim is None or planned is None or not _group_alive(table, *shim):
                continue  # ended since the last poll
            if any(state == "T" for _, state, _ in table.get(shim[0], [])):
                continue  # suspended by the policy: left for the restarted controller to resume
            eligible.append((job, planned, run, shim))
        # The first kill that can always picks one, so that every run has a job to requeue: a corral.job one that
        # can checkpoint if there is one, so that resuming from a checkpoint comes up too.
        forced = -1
        if eligible and self.o.first_victim and not (self.report.vanished or self.report.stopped):
            ready = [i for i, (job, planned, _, _) in enumerate(eligible) if self._ready(job, planned)]
            forced = self.rng.choice(ready or range(len(eligible)))
        for i, (job, planned, run, shim) in enumerate(eligible):
            if i != forced and self.rng.random() >= self.o.victim_p:
                continue
            if self._ready(job, planned) and (i == forced or self.rng.random() < 0.5):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(shim[0], signal.SIGTERM)  # the shim forwards it to the job's main process
                planned.victim_of.append(f"SIGTERM to run {run}")
                self.report.stopped += 1
            else:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(shim[0], signal.SIGKILL)
                planned.victim_of.append(f"SIGKILL to run {run}'s group")
                self.report.vanished += 1

    def _ready(self, job: JobJson, planned: Planned) -> bool:
        """Whether the job's current run is inside corral.job (its SIGTERM handler in place), from its log."""
        if planned.kind not in ("steps", "train"):
            return False
        log = self.state_dir / "tenants" / job["tenant"] / "logs" / f"{safe_name(job['job_id'])}.log"
        try:
            text = log.read_text(errors="replace")
        except OSError:
            return False
        run = job["process"]["run"]
        tail = text.rsplit(f"=== corral: run {run} started", 1)[-1]
        wanted = f"start {planned.name} run {run} at step" if planned.kind == "steps" else "training on"
        return wanted in tail and f"end {planned.name} run {run}" not in tail

    def _check_health(self) -> None:
        """While a restarted server comes up: is it healthy (answering, every job that ran before the kill known)?"""
        server = self.server
        assert server is not None
        if server.poll() is not None:
            log = self.work / f"server-{self.starts}.log"
            # The free port was taken between our look and its bind: not corral's doing, and the clock still runs.
            if "cannot listen on" not in log.read_text(errors="replace"):
                self.report.errors.append(f"corral serve exited with {server.returncode} while starting: see {log}")
                self.killed_at = None
            self._spawn()
            return
        if time.monotonic() - self.started_at > self.o.start_s:
            self.report.errors.append(f"corral serve not healthy after {self.o.start_s:g} s; started again")
            server.kill()
            server.wait()
            self.killed_at = None
            self._spawn()
            return
        # Answering on our port is not enough: another run's server may have taken the port between our pick and
        # our bind, and answer until ours fails to bind and exits (its token is not ours: "unknown token"). Ours
        # writes server.json with its pid once it holds its socket.
        if not self._listening() or not _healthy(self.port):
            return
        if not self.token:
            self.token = (self.state_dir / "admin.token").read_text().strip()
        self.client = Client(self.url, self.token, timeout_s=60.0)
        for job_id in self.running_before:
            try:
                self.client.job(job_id)
            except ClientError as e:
                self.report.lost.append(f"{self._name(job_id)}: running before a kill, unknown after it ({e})")
        now = time.monotonic()
        if self.killed_at is not None:
            self.report.restart_s.append(now - self.killed_at)
        self.killed_at = None
        self.healthy = True
        if self.next_kill is None or self.next_kill < now:
            self.next_kill = now + self.rng.uniform(0.2, 2 * self.kill_gap_s)
        self._reconcile()

    def _reconcile(self) -> None:
        """Submissions cut by a kill: the server says whether it took them (by name); the others are sent again."""
        doubtful = [p for p in self.plan if p.in_doubt]
        if not doubtful:
            return
        assert self.client is not None
        names: dict[str, list[str]] = {}
        for job in self.client.iter_jobs():
            names.setdefault(job["name"] or "", []).append(job["job_id"])
        for p in doubtful:
            ids = names.get(p.name, [])
            p.in_doubt = False
            if ids:
                p.job_id = ids[0]
                self._by_id[ids[0]] = p
            else:
                self.pending.insert(0, p)  # not taken: submit it again, now

    # -- submitting and watching ------------------------------------------------------------------------------------
    def _died(self) -> bool:
        """After a request got no answer: if the server died on its own (not by our kill), say so and start another."""
        server = self.server
        if server is None or server.poll() is None:
            return False
        self.report.errors.append(
            f"corral serve died on its own (exit {server.returncode}): see {self.work}/server-{self.starts}.log"
        )
        self.killed_at = None
        self._spawn()
        return True

    def _submit(self, p: Planned, *, killing: bool = False) -> None:
        assert self.client is not None
        try:
            job = self.client.submit(
                p.command,
                num_gpus=p.num_gpus,
                name=p.name,
                cwd=str(self.work),
                env={"CHAOS_LOCKS": str(self.locks), "OMP_NUM_THREADS": "1"},
            )
        except ClientError as e:
            if e.status != 0:
                raise
            p.in_doubt = True  # no answer: the kill came while it was in flight
            self.report.in_doubt += 1
            if not killing and not self._died():
                self.report.errors.append(f"{p.name}: no answer to its submission ({e})")
            return
        p.job_id = job["job_id"]
        self._by_id[job["job_id"]] = p
        self.last_submit = time.monotonic()

    def _poll(self) -> None:
        assert self.client is not None
        running: dict[str, JobJson] = {}
        open_jobs = 0
        try:
            for job in self.client.iter_jobs(phases=("pending", "running")):
                open_jobs += 1
                if job["phase"] == "running" and job["process"]["phase"] == "running":
                    running[job["job_id"]] = job
        except ClientError as e:
            if e.status != 0 or not self._died():
                self.report.errors.append(f"listing the jobs failed: {e}")
            self.last_poll = time.monotonic()
            return
        self.running, self.open_jobs = running, open_jobs
        self.last_poll = time.monotonic()

    def _name(self, job_id: str) -> str:
        p = self._by_id.get(job_id)
        return p.name if p is not None else job_id

    # -- the run ----------------------------------------------------------------------------------------------------
    def run(self) -> Report:
        began = time.monotonic()
        self.work.mkdir(parents=True, exist_ok=True)
        self.locks.mkdir(exist_ok=True)
        (self.work / "weights").mkdir(exist_ok=True)
        _write_scripts(self.bin)
        try:
            self._spawn()
            self._drive()
            self._judge()
        finally:
            self._cleanup()
        self.report.jobs = len(self.plan)
        self.report.wall_s = time.monotonic() - began
        return self.report

    def _first_start(self) -> None:
        """Wait for the first server (not a restart: not timed)."""
        while not self.healthy:
            self._check_health()
            time.sleep(0.05)

    def _drive(self) -> None:
        o = self.o
        self._first_start()
        self.t0 = time.monotonic()
        self.pending = sorted(self.plan, key=lambda p: p.submit_at_s)
        deadline: float | None = None
        cap = math.inf
        least = 0
        while True:
            mono = time.monotonic()
            kill_at = self.next_kill if self.kills_left > 0 and self.next_kill is not None else math.inf
            due = mono >= kill_at
            if not self.healthy:
                if due:
                    self._kill()  # the restart is still recovering
                    continue
                self._check_health()
                time.sleep(0.05)
                continue
            # A kill waits (a little) for a job to be running, so that most kills leave runs to take back.
            if due and (self.running or not self.open_jobs or mono > kill_at + 5):
                inflight = None
                if self.pending and self.rng.random() < o.inflight_p:
                    inflight = self.pending.pop(0)  # submitted early, to be cut by the kill
                self._kill(during_submit=inflight)
                continue
            now = mono - self.t0
            while self.pending and self.pending[0].submit_at_s <= now:
                self._submit(self.pending.pop(0))
            if mono - self.last_poll >= o.poll_s:
                self._poll()
            if not self.kills_left and not self.pending and all(p.job_id is not None for p in self.plan):
                if self.open_jobs == 0 and self.last_poll > self.last_submit:
                    return
                # The drain lasts while jobs keep ending: a backlog still being worked through is not stuck; drain_s
                # with none ending is (or DRAIN_CAP drains in all).
                if deadline is None:
                    deadline, cap, least = mono + o.drain_s, mono + DRAIN_CAP * o.drain_s, self.open_jobs
                elif self.open_jobs < least:
                    deadline, least = min(mono + o.drain_s, cap), self.open_jobs
                elif mono > deadline:
                    return
            time.sleep(0.02)

    # -- the verdict ------------------------------------------------------------------------------------------------
    def _logs(self, job_id: str) -> str:
        assert self.client is not None
        text, offset = [], 0
        while True:
            chunk = self.client.logs(job_id, offset=offset)
            text.append(chunk["text"])
            if chunk["next_offset"] >= chunk["size"] or chunk["next_offset"] == offset:
                return "".join(text)
            offset = chunk["next_offset"]

    def _judge(self) -> None:
        r, client = self.report, self.client
        assert client is not None
        known: dict[str, JobJson] = {}
        by_name: dict[str, list[str]] = {}
        for job in client.iter_jobs():
            known[job["job_id"]] = job
            by_name.setdefault(job["name"] or "", []).append(job["job_id"])
        for name, ids in by_name.items():
            if len(ids) > 1:
                r.twice.append(f"{name}: one submission became {len(ids)} jobs ({', '.join(ids)})")
        for p in self.plan:
            job = known.get(p.job_id) if p.job_id is not None else None
            if job is None:
                r.lost.append(f"{p.name}: accepted as {p.job_id}, unknown to the server at the end")
                continue
            self._judge_job(p, job, self._logs(job["job_id"]), client.events(job["job_id"]))
        self._stop()

    def _judge_job(self, p: Planned, job: JobJson, log: str, events: list[Any]) -> None:
        r = self.report
        phase, run, why = job["phase"], job["process"]["run"], job["reason"] or ""
        kinds = [e["kind"] for e in events]
        r.reattached += kinds.count("reattached")
        r.preempted += kinds.count("preempted")
        r.suspended += kinds.count("suspended")
        if run > 1:
            r.requeued += 1
        did = f" (driver: {'; '.join(p.victim_of)})" if p.victim_of else ""
        lines = log.splitlines()
        started = [int(m.group(1)) for m in map(re.compile(r"^=== corral: run (\d+) started").match, lines) if m]
        exits = _exits(events)
        for m in filter(None, map(re.compile(rf"^CONCURRENT {p.name} run (\d+)").match, lines)):
            n = int(m.group(1))
            twice = f"{p.name}: two runs alive at once (run {n} found the job's lock taken){did}"
            r.twice.append(twice)
            if any(k < n and k not in exits for k in started):  # an older run the controller never heard end
                r.unheard.append(twice)
        for n in sorted(set(started)):
            if started.count(n) > 1:
                r.twice.append(f"{p.name}: run {n} started {started.count(n)} times{did}")
        ends = [line for line in lines if line.startswith(f"end {p.name} run ")]
        r.resumed += sum(
            bool(re.match(rf"start {p.name} run \d+ at step [1-9]", line)) or "resumed at step" in line
            for line in lines
        )
        if phase not in TERMINAL:
            self.stuck_ids.add(job["job_id"])
            r.stuck.append(f"{p.name}: still {phase} (process {job['process']['phase']}, run {run}){did}")
            return
        # A run the driver SIGKILLed after its last line, before it could exit, did the work but never ended as
        # done: no scheduler can tell, and running it again is right. Its line is not a completion.
        killed = {int(n) for n in re.findall(r"SIGKILL to run (\d+)'s group", " ".join(p.victim_of))}
        done_ends = [
            end
            for end in ends
            if not (int(end.split()[3]) in killed and not exits.get(int(end.split()[3]), "").startswith("exited with"))
        ]
        if len(done_ends) > 1:
            self._judge_twice(p, done_ends, events, did)
        if started and max(started) != run:
            r.wrong.append(f"{p.name}: the server says run {run}, its log's last run is {max(started)}{did}")
        if p.kind == "fail":
            if phase != "failed" or "code 3" not in why:
                r.wrong.append(f"{p.name}: exits with 3, ended {phase} ({why!r}){did}")
            else:
                r.failed += 1
            if not ends:
                r.wrong.append(f"{p.name}: ended {phase} without running to its end{did}")
            return
        if phase != "finished":
            r.wrong.append(f"{p.name}: ended {phase} ({why!r}), should have finished{did}")
            return
        if not ends:
            r.lost.append(f"{p.name}: finished, but its work never completed (no end line){did}")
            return
        r.finished += 1
        last = ends[-1]
        m = re.match(rf"end {re.escape(p.name)} run (\d+)", last)
        ended_in = int(m.group(1)) if m else None
        # An earlier run may finish the work after the next one was launched (it ended on its own while asked to
        # pause or stop): the controller then counts the job finished by it and stops the later run.
        by_earlier = (
            ended_in is not None and ended_in < run and exits.get(ended_in, "").startswith("exited with code 0")
        )
        if ended_in != run and not by_earlier:
            r.wrong.append(f"{p.name}: finished in run {run}, its work ended in another ({last!r}){did}")
        if p.kind == "steps" and not last.endswith(f" count {self.o.steps}"):
            r.wrong.append(f"{p.name}: {self.o.steps} steps, state restored wrong ({last!r}){did}")
        if p.kind == "train":
            if last.endswith(f" weights {self._reference()}"):
                r.trained += 1
            else:
                r.wrong.append(f"{p.name}: final weights differ from an uninterrupted run's ({last!r}){did}")

    def _judge_twice(self, p: Planned, ends: list[str], events: list[Any], did: str) -> None:
        """A job whose work completed more than once; also say why, when the controller's own notes tell: each
        earlier run that completed was either never heard to exit (no "exited run N" note: its exit was dropped)
        or heard to exit as it does when done (code 0, or 3 for a failing job) without the job ending."""
        r = self.report
        twice = f"{p.name}: its work completed {len(ends)} times ({'; '.join(ends)}){did}"
        r.twice.append(twice)
        exits = _exits(events)
        done = "exited with code 3" if p.kind == "fail" else "exited with code 0"
        earlier = [int(end.split()[3]) for end in ends[:-1]]
        unheard = [n for n in earlier if n not in exits]
        ignored = [n for n in earlier if exits.get(n, "").startswith(done)]
        if len(unheard) + len(ignored) == len(earlier):  # each earlier completion explained, one way or the other
            if unheard:
                r.unheard.append(twice)
            if ignored:
                r.ignored.append(twice)

    def _reference(self) -> str:
        digest = self._digest
        if callable(digest):
            digest = self._digest = digest()
        assert digest is not None
        return digest

    def _stop(self) -> None:
        """Stop the server as a user would (SIGTERM), then look for what it left running."""
        server = self.server
        if server is None:
            return
        server.send_signal(signal.SIGTERM)
        try:
            code = server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
            code = None
        if code != 0:
            self.report.errors.append(f"the final corral serve did not stop cleanly on SIGTERM (exit {code})")
        self.server = None
        still = {safe_name(job_id) for job_id in self.stuck_ids}  # their processes may rightly live on
        time.sleep(0.2)  # the agent kills what is left of a group just after its shim exits
        table = _proc_table()
        for (job_file, run), shims in sorted(_run_groups(self.state_dir).items()):
            if job_file in still:
                continue
            for pgid, ticks in shims:
                if _group_alive(table, pgid, ticks):
                    pids = [pid for pid, state, _ in table.get(pgid, []) if state not in ("Z", "X", "x")]
                    self.report.orphans.append(f"{job_file} run {run}: process group {pgid} alive ({pids})")
        for log in sorted(self.work.glob("server-*.log")):
            for line in log.read_text(errors="replace").splitlines():
                if " ERROR " in line or " CRITICAL " in line or line.startswith("Traceback"):
                    self.report.errors.append(f"{log.name}: {line.strip()[:300]}")

    def _cleanup(self) -> None:
        """Leave nothing running, whatever happened: the server, then every recorded run's process group."""
        if self.client is not None:
            self.client.close()
            self.client = None
        if self.server is not None and self.server.poll() is None:
            self.server.kill()
            self.server.wait()
        table = _proc_table()
        for shims in _run_groups(self.state_dir).values():
            for pgid, ticks in shims:
                if _group_alive(table, pgid, ticks):
                    with contextlib.suppress(OSError):
                        os.killpg(pgid, signal.SIGKILL)


def run_chaos(spec: str, options: Options, work_dir: Path, train_digest: Digest | None = None) -> Report:
    """One chaos run of the policy ``spec`` (see the module docstring), its files under ``work_dir``. Training jobs
    are planned only with ``train_digest``: the weights digest of an uninterrupted run (:func:`reference_digest`),
    or a function that returns it when the jobs are judged (so the reference can run meanwhile)."""
    return Chaos(spec, options, work_dir, train_digest).run()


# -- the command --------------------------------------------------------------------------------------------------
def row(r: Report) -> str:
    p50 = statistics.median(r.restart_s) if r.restart_s else float("nan")
    top = max(r.restart_s) if r.restart_s else float("nan")
    return (
        f"{r.policy:<36} {r.jobs:>5} {r.kills:>5} {r.kills_in_recovery:>5} {len(r.lost):>5} {len(r.twice):>5} "
        f"{len(r.stuck):>5} {len(r.orphans):>7} {len(r.wrong):>5} {len(r.errors):>6} {p50:>8.2f} {top:>7.2f} "
        f"{r.requeued:>8} {r.resumed:>7} {r.reattached:>6} {r.preempted:>6} {r.suspended:>6} {r.wall_s:>6.0f}"
    )


HEADER = (
    f"{'policy':<36} {'jobs':>5} {'kills':>5} {'in-rec':>5} {'lost':>5} {'twice':>5} {'stuck':>5} {'orphans':>7} "
    f"{'wrong':>5} {'errors':>6} {'p50 s':>8} {'max s':>7} {'requeued':>8} {'resumed':>7} {'reatt':>6} "
    f"{'preem':>6} {'susp':>6} {'wall s':>6}"
)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--policy",
        action="append",
        metavar="SPEC",
        help="a policy or policy spec (repeat for several; default: every live policy, with its time constants cut "
        "to seconds as in SHORT_SPECS; a bare name gets the same cut)",
    )
    parser.add_argument("--jobs", type=int, default=1000, help="jobs per policy (default 1000)")
    parser.add_argument("--kills", type=int, default=100, help="kill -9s of the controller per policy (default 100)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--train-fraction", type=float, default=Options.train_fraction, help="train_mlp.py jobs")
    parser.add_argument("--steps-fraction", type=float, default=Options.steps_fraction, help="corral.job step jobs")
    parser.add_argument(
        "--parallel", type=int, default=1, help="policies run at once (restart times then include the others' load)"
    )
    parser.add_argument("--keep", metavar="DIR", help="keep every run's files (state, server logs) under DIR")
    args = parser.parse_args(argv)
    specs = [chaos_spec(p) if ":" not in p else p for p in (args.policy or live_policies())]
    options = Options(
        jobs=args.jobs,
        kills=args.kills,
        seed=args.seed,
        train_fraction=args.train_fraction,
        steps_fraction=args.steps_fraction,
    )
    with contextlib.ExitStack() as stack:
        root = Path(args.keep) if args.keep else Path(stack.enter_context(tempfile.TemporaryDirectory()))
        digest = reference_digest(root / "reference") if options.train_fraction > 0 else None
        print(f"chaos: {options.jobs} jobs, {options.kills} kills, seed {options.seed}, {options.gpus} stand-in GPUs")
        print(HEADER, flush=True)
        reports: list[Report] = []

        def one(spec: str) -> Report:
            report = run_chaos(spec, options, root / re.sub(r"[^\w.-]+", "_", spec), digest)
            print(row(report), flush=True)
            return report

        with ThreadPoolExecutor(max(1, args.parallel)) as pool:
            reports = list(pool.map(one, specs))
        bad = 0
        for report in reports:
            for line in report.problems:
                why = " [exit unheard]" if line in report.unheard else ""
                why += " [exit ignored]" if line in report.ignored else ""
                print(f"  {report.policy}: {line}{why}")
                bad += 1
        all_restarts = [s for r in reports for s in r.restart_s]
        if all_restarts:
            print(
                f"restart to healthy, all policies: p50 {statistics.median(all_restarts):.2f} s, "
                f"max {max(all_restarts):.2f} s over {len(all_restarts)} restarts"
            )
        return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
