"""The node agent with real processes (CPU only, stand-in GPUs): launching, exits and their records, preemption
by signal and over the channel, pause/resume, launch ordering on a GPU, adopting runs after a restart, and a
channel that survives bad input. The jobs are small Python scripts; the one that speaks the contract uses the
socket and :mod:`corral.core.contract` directly, not the job-side library."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from corral.core import contract
from corral.core.errors import ConfigError
from corral.live.agent import (
    Agent,
    AgentReport,
    JobMeasured,
    JobReported,
    JobSaid,
    LaunchRequest,
    ProcessExited,
    ProcessStarted,
    processes,
    safe_name,
)
from corral.live.agent import agent as agent_module
from corral.live.agent.gpus import GpuInfo, ProcessSample, discover_gpus

PY = sys.executable
T = TypeVar("T")

# -- job scripts ----------------------------------------------------------------------------------------------
PRINT_ENV = r"""
import json, os
names = [n for n in os.environ if n.startswith("CORRAL_") or n.startswith("CUDA_") or n == "USER_VAR"]
print("ENV " + json.dumps({n: os.environ[n] for n in names}), flush=True)
print("ALLENV " + json.dumps(dict(os.environ)), flush=True)
"""

# Traps SIGTERM like a checkpointing script that does not use corral.job; argv: a folder, seconds to "save".
TRAP_TERM = r"""
import pathlib, signal, sys, time
d, save_s = pathlib.Path(sys.argv[1]), float(sys.argv[2])
def on_term(signum, frame):
    time.sleep(save_s)
    (d / "got-term").write_text("saved")
    sys.exit(75)
signal.signal(signal.SIGTERM, on_term)
(d / "ready").write_text("")
while True:
    time.sleep(0.05)
"""

IGNORE_TERM = r"""
import pathlib, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
pathlib.Path(sys.argv[1], "ready").write_text("")
while True:
    time.sleep(0.05)
"""

# Exits with code argv[2] once the file argv[1] exists.
WAIT_FOR_FILE = r"""
import os, sys, time
while not os.path.exists(sys.argv[1]):
    time.sleep(0.02)
sys.exit(int(sys.argv[2]))
"""

# Speaks the contract over the agent's socket. argv[1]: "good" or "garbage" (sends a non-JSON line after hello).
# The hello carries the run's secret from the environment, as corral.job's channel does.
CHANNEL_JOB = r"""
import os, socket, sys
from corral.core import contract
job, run = os.environ["CORRAL_JOB_ID"], int(os.environ["CORRAL_RUN"])
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(os.environ["CORRAL_AGENT_SOCKET"])
send = lambda m: s.sendall(contract.encode(m))
send(contract.Hello(job, run, os.getpid(), os.environ["CORRAL_RUN_SECRET"]))
if sys.argv[1] == "garbage":
    s.sendall(b"{this is not json\n")
send(contract.StepReport(job, run, step=1, steps=1, step_time_s=0.25, busy_s=0.2, mem_peak_mib=0))
step = 1
for line in s.makefile("rb"):
    msg = contract.decode(line)
    if isinstance(msg, contract.Pause):
        send(contract.Paused(job, run, step))
    elif isinstance(msg, contract.Resume):
        send(contract.Resumed(job, run, step))
    elif isinstance(msg, contract.SetBatchSize):
        step += 1
        send(contract.StepReport(job, run, step, 1, 0.25, 0.2, 0, batch_size=msg.batch_size))
    elif isinstance(msg, contract.Checkpoint):
        path = os.path.join(os.environ["CORRAL_CHECKPOINT_DIR"], "ckpt")
        open(path, "w").write(str(step))
        send(contract.Checkpointed(job, run, step, path))
        sys.exit(contract.EXIT_PREEMPTED)
sys.exit(1)
"""

SLEEP_LOOP = "import time\nwhile True: time.sleep(0.05)"


# -- helpers --------------------------------------------------------------------------------------------------
class Recorder:
    """Collects the agent's reports; waits for one that matches."""

    def __init__(self) -> None:
        self.reports: list[AgentReport] = []
        self._cond = threading.Condition()

    def __call__(self, report: AgentReport) -> None:
        with self._cond:
            self.reports.append(report)
            self._cond.notify_all()

    def wait(self, kind: type[T], job_id: str, run: int = 1, pred: Callable[[T], bool] = lambda r: True) -> T:
        deadline = time.monotonic() + 15.0
        with self._cond:
            while True:
                for r in self.reports:
                    if isinstance(r, kind) and r.job_id == job_id and r.run == run and pred(r):  # type: ignore[attr-defined]
                        return r
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no {kind.__name__} for {job_id!r} run {run}; got {self.reports}")
                self._cond.wait(left)

    def index(self, report: AgentReport) -> int:
        with self._cond:
            return self.reports.index(report)

    def of(self, job_id: str) -> list[AgentReport]:
        with self._cond:
            return [r for r in self.reports if r.job_id == job_id]


def wait_until(pred: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def proc_state(pid: int) -> str:
    with open(f"/proc/{pid}/stat", "rb") as f:
        return f.read().rsplit(b")", 1)[1].split()[0].decode()


def live_members(pgid: int) -> list[int]:
    """Pids of the processes (zombies aside) in process group ``pgid``."""
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, IndexError):
                with open(f"/proc/{entry}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()
                if int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
                    members.append(int(entry))
    return members


def req(job_id: str, *command: str, run: int = 1, gpus: tuple[int, ...] = (0,), **kw: Any) -> LaunchRequest:
    return LaunchRequest(
        job_id=job_id,
        run=run,
        command=command,
        cwd=kw.pop("cwd", "/"),
        env=kw.pop("env", {}),
        gpus=gpus,
        tenant=kw.pop("tenant", "lab"),
        grace_s=kw.pop("grace_s", 10.0),
        **kw,
    )


def kill_everything_under(state_dir: Path) -> None:
    """Kill the process group of every run the agents left behind, and reap those that are our children."""
    for pid_file in [*state_dir.glob("runs/*/*/pid"), *state_dir.glob("runs/*/*/spawned")]:
        with contextlib.suppress(OSError, ValueError):
            pid, ticks = (int(x) for x in pid_file.read_text().split())
            st = processes.proc_stat(pid)
            if st is not None and st[1] == ticks:  # running or a zombie, and still the same process
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, 0)


class Node:
    """An agent on a state directory, with its recorder; more agents can be made on the same directory."""

    def __init__(self, state_dir: Path, gpus: list[GpuInfo]) -> None:
        self.state_dir = state_dir
        self.gpus = gpus
        self.agents: list[Agent] = []

    def agent(self, *, start: bool = True) -> tuple[Agent, Recorder]:
        rec = Recorder()
        a = Agent(self.state_dir, self.gpus, rec, report_interval_s=0.5)
        self.agents.append(a)
        if start:
            a.start()
        return a, rec


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    n = Node(tmp_path / "state", discover_gpus(stand_in=2))
    try:
        yield n
    finally:
        for a in n.agents:
            a.close()
        kill_everything_under(n.state_dir)


@pytest.fixture
def started(node: Node) -> tuple[Agent, Recorder]:
    return node.agent()


def env_printed(log: Path) -> dict[str, str]:
    for line in log.read_text().splitlines():
        if line.startswith("ENV "):
            env: dict[str, str] = json.loads(line[4:])
            return env
    raise AssertionError(f"no ENV line in {log.read_text()!r}")


# -- launching and exits --------------------------------------------------------------------------------------
def test_launch_sets_the_contract_environment_and_logs_runs(started: tuple[Agent, Recorder], tmp_path: Path) -> None:
    agent, rec = started
    agent.launch(req("7", PY, "-c", PRINT_ENV, gpus=(0, 1), env={"USER_VAR": "x"}, mem_mib=2048, cwd=str(tmp_path)))
    st = rec.wait(ProcessStarted, "7")
    ex = rec.wait(ProcessExited, "7")
    assert rec.index(st) < rec.index(ex)
    assert (ex.exit_code, ex.signal, ex.requested) == (0, None, None)
    env = env_printed(agent.log_path("7"))
    secret = env.pop("CORRAL_RUN_SECRET")
    assert len(secret) == 64 and int(secret, 16) >= 0  # 32 random bytes as hex
    assert (agent.run_dir("7", 1) / "secret").read_text().strip() == secret
    assert env == {
        "CORRAL_JOB_ID": "7",
        "CORRAL_RUN": "1",
        "CORRAL_AGENT_SOCKET": str(agent.socket_path),
        "CORRAL_CHECKPOINT_DIR": str(agent.checkpoint_dir("7")),
        "CORRAL_GPU_MILLI": "1000",
        "CORRAL_GPU_MEM_MIB": "2048",
        "CORRAL_STAND_IN": "1",
        "CORRAL_GPUS": "0,1",
        "CORRAL_GRACE_S": "10.0",
        "CORRAL_REPORT_INTERVAL_S": "0.5",
        "CUDA_VISIBLE_DEVICES": "",
        "USER_VAR": "x",
    }
    assert agent.checkpoint_dir("7").is_dir()
    assert agent.processes() == []
    # a second run appends to the same log, with its own markers
    agent.launch(req("7", PY, "-c", PRINT_ENV, run=2))
    assert rec.wait(ProcessExited, "7", run=2).exit_code == 0
    markers = [line for line in agent.log_path("7").read_text().splitlines() if line.startswith("=== corral:")]
    assert [m.split()[2:5] for m in markers] == [
        ["run", "1", "started"],
        ["run", "1", "ended"],
        ["run", "2", "started"],
        ["run", "2", "ended"],
    ]
    assert "CORRAL_GPU_MEM_MIB" not in env_printed_last(agent.log_path("7"))
    assert env_printed_last(agent.log_path("7"))["CORRAL_RUN_SECRET"] != secret  # each run its own


def test_a_job_gets_none_of_the_servers_environment_but_the_allow_list(
    started: tuple[Agent, Recorder], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tokens and settings in the server's environment (token_env variables, the admin token, anything else)
    never reach a job; the documented allow-list, the user's identity, the request's env and the contract do."""
    agent, rec = started
    monkeypatch.setenv("CORRAL_TOKEN_VISION", "tenant-token-0123456789")
    monkeypatch.setenv("CORRAL_ADMIN_TOKEN", "admin-token-0123456789")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "cloud-secret")
    monkeypatch.setenv("PYTHONPATH", "/server/only")
    monkeypatch.setenv("LC_MESSAGES", "C")
    monkeypatch.setenv("TZ", "UTC")
    agent.launch(req("envjob", PY, "-c", PRINT_ENV, env={"USER_VAR": "x", "TZ": "Europe/Paris"}))
    assert rec.wait(ProcessExited, "envjob").exit_code == 0
    line = next(x for x in agent.log_path("envjob").read_text().splitlines() if x.startswith("ALLENV "))
    env = json.loads(line[len("ALLENV ") :])
    for name in ("CORRAL_TOKEN_VISION", "CORRAL_ADMIN_TOKEN", "AWS_SECRET_ACCESS_KEY", "PYTHONPATH"):
        assert name not in env
    planted = ("tenant-token-0123456789", "admin-token-0123456789", "cloud-secret", "/server/only")
    assert not any(p in value for value in env.values() for p in planted)
    assert env["PATH"] == os.environ["PATH"] and env["LC_MESSAGES"] == "C"
    assert env["TZ"] == "Europe/Paris"  # the request's env wins over the server's
    assert env["USER_VAR"] == "x"
    import pwd

    me = pwd.getpwuid(os.geteuid())
    assert (env["USER"], env["LOGNAME"], env["HOME"]) == (me.pw_name, me.pw_name, me.pw_dir)
    allowed = {*contract.PASSED_ENV, *contract.USER_ENV, *contract.ALL_ENV, "USER_VAR", "CUDA_VISIBLE_DEVICES"}
    # (Python itself may add LC_CTYPE when it coerces a C locale, PEP 538: an LC_ variable, allowed.)
    assert {n for n in env if not n.startswith(contract.PASSED_ENV_PREFIXES)} <= allowed, env


def env_printed_last(log: Path) -> dict[str, str]:
    lines = [line for line in log.read_text().splitlines() if line.startswith("ENV ")]
    env: dict[str, str] = json.loads(lines[-1][4:])
    return env


def test_real_gpus_get_nvml_indices(tmp_path: Path) -> None:
    gpus = [GpuInfo(i, "NVIDIA H100 80GB HBM3", 81559, f"GPU-{i}", False) for i in range(3)]
    node = Node(tmp_path / "state", gpus)
    agent, rec = node.agent()
    try:
        agent.launch(req("r", PY, "-c", PRINT_ENV, gpus=(2, 0)))
        assert rec.wait(ProcessExited, "r").exit_code == 0
        env = env_printed(agent.log_path("r"))
        assert env["CUDA_VISIBLE_DEVICES"] == "2,0" and env["CORRAL_GPUS"] == "2,0"
        assert env["CORRAL_STAND_IN"] == "0" and env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    finally:
        agent.close()
        kill_everything_under(node.state_dir)


def test_failing_and_unrunnable_commands(started: tuple[Agent, Recorder], tmp_path: Path) -> None:
    agent, rec = started
    not_exec = tmp_path / "not-executable"
    not_exec.write_text("#!/bin/sh\n")
    agent.launch(req("fail", PY, "-c", "import sys; sys.exit(3)"))
    agent.launch(req("missing", "no-such-program-corral", "--flag", gpus=(1,)))
    agent.launch(req("noexec", str(not_exec)))
    assert rec.wait(ProcessExited, "fail").exit_code == 3
    missing = rec.wait(ProcessExited, "missing")
    assert missing.exit_code == 127 and "command not found" in missing.detail
    assert "cannot run 'no-such-program-corral'" in agent.log_path("missing").read_text()
    assert rec.wait(ProcessExited, "noexec").exit_code == 126


def test_spawn_problems_are_reported_not_raised(started: tuple[Agent, Recorder], tmp_path: Path) -> None:
    agent, rec = started
    agent.launch(req("nocwd", PY, "-c", "pass", cwd=str(tmp_path / "gone")))
    agent.launch(req("badgpu", PY, "-c", "pass", gpus=(5,)))
    agent.launch(req("", PY, "-c", "pass"))
    agent.launch(req("nocmd"))
    for job in ("nocwd", "badgpu", "", "nocmd"):
        ex = rec.wait(ProcessExited, job)
        assert (ex.exit_code, ex.signal) == (None, None) and ex.detail.startswith("cannot start the job")
        assert not any(isinstance(r, ProcessStarted) for r in rec.of(job))
    assert "does not exist" in rec.wait(ProcessExited, "nocwd").detail


def test_killed_from_outside(started: tuple[Agent, Recorder]) -> None:
    agent, rec = started
    agent.launch(req("main", PY, "-c", SLEEP_LOOP))
    agent.launch(req("group", PY, "-c", SLEEP_LOOP, gpus=(1,)))
    rec.wait(ProcessStarted, "main")
    child = agent.run_dir("main", 1) / "child"
    wait_until(child.exists, "the shim's child record")
    os.kill(int(child.read_text()), signal.SIGKILL)  # the job's main process only: the shim records it
    ex = rec.wait(ProcessExited, "main")
    assert (ex.exit_code, ex.signal, ex.requested) == (None, signal.SIGKILL, None)
    group = rec.wait(ProcessStarted, "group")
    os.killpg(group.pid, signal.SIGKILL)  # the whole group: no record
    ex = rec.wait(ProcessExited, "group")
    assert (ex.exit_code, ex.signal, ex.requested) == (None, None, None)
    assert "killed by SIGKILL; no exit record" in ex.detail


# -- stopping -------------------------------------------------------------------------------------------------
def test_preempt_without_the_library_sends_sigterm(started: tuple[Agent, Recorder], tmp_path: Path) -> None:
    agent, rec = started
    agent.launch(req("t", PY, "-c", TRAP_TERM, str(tmp_path), "0", grace_s=10.0))
    wait_until((tmp_path / "ready").exists, "the job to trap SIGTERM")
    agent.preempt("t", 1)
    ex = rec.wait(ProcessExited, "t")
    assert (ex.exit_code, ex.signal, ex.requested) == (75, None, "preempt")
    assert (tmp_path / "got-term").read_text() == "saved"


def test_preempt_kills_a_job_that_ignores_sigterm(started: tuple[Agent, Recorder], tmp_path: Path) -> None:
    agent, rec = started
    agent.launch(req("stubborn", PY, "-c", IGNORE_TERM, str(tmp_path), grace_s=0.3))
    wait_until((tmp_path / "ready").exists, "the job to ignore SIGTERM")
    pid = rec.wait(ProcessStarted, "stubborn").pid
    t0 = time.monotonic()
    agent.preempt("stubborn", 1)
    ex = rec.wait(ProcessExited, "stubborn")
    assert time.monotonic() - t0 >= 0.3
    assert (ex.exit_code, ex.signal, ex.requested) == (None, None, "preempt")
    assert "SIGKILL to its process group) 0.3 s after the preempt request" in ex.detail
    wait_until(lambda: not live_members(pid), "nothing left of the group", timeout=5.0)


def test_cancel_drops_a_pending_launch_and_stops_a_running_one(started: tuple[Agent, Recorder]) -> None:
    agent, rec = started
    agent.launch(req("c", PY, "-c", SLEEP_LOOP))
    agent.launch(req("c", PY, "-c", SLEEP_LOOP, run=2))  # waits for run 1
    rec.wait(ProcessStarted, "c")
    assert sorted(agent.processes()) == [("c", 1), ("c", 2)]
    agent.cancel("c", 2)
    dropped = rec.wait(ProcessExited, "c", run=2)
    assert (dropped.exit_code, dropped.requested) == (None, "cancel") and "before it started" in dropped.detail
    agent.cancel("c", 1)
    ex = rec.wait(ProcessExited, "c")
    assert (ex.signal, ex.requested) == (signal.SIGTERM, "cancel"), ex
    agent.cancel("c", 1)  # again, after the exit: nothing more is reported
    agent.cancel("unknown", 1)  # never here: an exit says there is nothing to wait for
    assert rec.wait(ProcessExited, "unknown").detail == "no such process on this node"
    time.sleep(0.1)
    assert len([r for r in rec.of("c") if isinstance(r, ProcessExited)]) == 2


def test_sigterm_right_after_start_is_held_until_the_shim_forwards_it(started: tuple[Agent, Recorder]) -> None:
    agent, rec = started
    agent.launch(req("early", PY, "-c", SLEEP_LOOP, grace_s=10.0))
    rec.wait(ProcessStarted, "early")
    agent.preempt("early", 1)  # the shim is still starting: a SIGTERM now would kill it without a record
    ex = rec.wait(ProcessExited, "early")
    assert (ex.exit_code, ex.signal, ex.requested) == (None, signal.SIGTERM, "preempt")
    assert (agent.run_dir("early", 1) / "exit.json").exists()


def test_pause_and_resume_by_signal(started: tuple[Agent, Recorder]) -> None:
    agent, rec = started
    agent.launch(req("p", PY, "-c", SLEEP_LOOP))
    shim = rec.wait(ProcessStarted, "p").pid
    child_file = agent.run_dir("p", 1) / "child"
    wait_until(child_file.exists, "the child record")
    child = int(child_file.read_text())
    agent.pause("p", 1)
    wait_until(lambda: proc_state(shim) == "T" and proc_state(child) == "T", "the group to stop")
    agent.resume("p", 1)
    wait_until(lambda: proc_state(shim) != "T" and proc_state(child) != "T", "the group to continue")
    agent.pause("p", 1)
    wait_until(lambda: proc_state(child) == "T", "the group to stop again")
    agent.cancel("p", 1)  # a stopped job gets SIGCONT after the SIGTERM, so it dies at once
    ex = rec.wait(ProcessExited, "p")
    assert (ex.signal, ex.requested) == (signal.SIGTERM, "cancel"), ex


# -- the channel ----------------------------------------------------------------------------------------------
def test_job_on_the_channel(started: tuple[Agent, Recorder]) -> None:
    agent, rec = started
    agent.launch(req("ch", PY, "-c", CHANNEL_JOB, "good", grace_s=10.0))
    started_report = rec.wait(ProcessStarted, "ch")
    hello = rec.wait(JobSaid, "ch", pred=lambda r: isinstance(r.message, contract.Hello))
    assert rec.index(started_report) < rec.index(hello)
    report = rec.wait(JobReported, "ch").report
    assert (report.step, report.step_time_s) == (1, 0.25)
    shim = started_report.pid

    agent.pause("ch", 1)
    rec.wait(JobSaid, "ch", pred=lambda r: isinstance(r.message, contract.Paused))
    assert proc_state(shim) != "T"  # paused over the channel, not by a signal
    agent.resume("ch", 1)
    rec.wait(JobSaid, "ch", pred=lambda r: isinstance(r.message, contract.Resumed))
    assert agent.send("ch", 1, contract.SetBatchSize(64))
    assert rec.wait(JobReported, "ch", pred=lambda r: r.report.batch_size == 64).report.step == 2

    agent.preempt("ch", 1)
    said = rec.wait(JobSaid, "ch", pred=lambda r: isinstance(r.message, contract.Checkpointed))
    assert isinstance(said.message, contract.Checkpointed)
    assert Path(said.message.path).read_text() == "2"
    ex = rec.wait(ProcessExited, "ch")
    assert (ex.exit_code, ex.requested) == (contract.EXIT_PREEMPTED, "preempt")
    assert rec.index(said) < rec.index(ex)
    assert not agent.send("ch", 1, contract.SetLimits(gpu_milli=500))


def _assert_closed_by_agent(sock: socket.socket) -> None:
    sock.settimeout(10.0)
    try:
        while sock.recv(4096):
            pass
    except ConnectionResetError:
        pass


def test_bad_channel_input_is_dropped(started: tuple[Agent, Recorder], caplog: pytest.LogCaptureFixture) -> None:
    agent, rec = started
    caplog.set_level(logging.INFO, logger="corral.live.agent")
    bad_lines = [
        b"{not json\n",
        b'{"type": "step", "job_id": "x"}\n',
        b'{"type": "pause"}\n',  # not a hello first
        json.dumps({"type": "hello", "job_id": "nobody", "run": 1, "pid": 1}).encode() + b"\n",
        b"x" * (contract.MAX_MESSAGE_BYTES + 10),  # no newline, too long
        b"[1, 2]\n",
    ]
    for data in bad_lines:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(str(agent.socket_path))
            s.sendall(data)
            _assert_closed_by_agent(s)
    # a connected job that then sends garbage: the bad line is dropped and counted against its run, with a warning
    # that names it; the job stays connected and its next (good) report goes through
    agent.launch(req("g", PY, "-c", CHANNEL_JOB, "garbage"))
    rec.wait(JobSaid, "g", pred=lambda r: isinstance(r.message, contract.Hello))
    assert rec.wait(JobReported, "g").report.step == 1
    assert agent.bad_messages("g", 1) == 1
    assert any("job 'g' run 1" in r.getMessage() and "not JSON" in r.getMessage() for r in caplog.records)
    assert agent.send("g", 1, contract.SetBatchSize(8))  # still connected
    assert rec.wait(JobReported, "g", pred=lambda r: r.report.batch_size == 8).report.step == 2
    agent.cancel("g", 1)
    rec.wait(ProcessExited, "g")
    # and the agent still works
    agent.launch(req("after", PY, "-c", "pass"))
    assert rec.wait(ProcessExited, "after").exit_code == 0


# Sends a hello, then argv[1] copies of each bad line below (wrong types, out of range, not JSON), then one good
# report; then waits to be stopped.
BAD_FLOOD = r"""
import json, os, socket, sys, time
from corral.core import contract
job, run = os.environ["CORRAL_JOB_ID"], int(os.environ["CORRAL_RUN"])
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(os.environ["CORRAL_AGENT_SOCKET"])
s.sendall(contract.encode(contract.Hello(job, run, os.getpid(), os.environ["CORRAL_RUN_SECRET"])))
good = dict(type="step", job_id=job, run=run, step=1, steps=1, step_time_s=0.5, busy_s=0.25, mem_peak_mib=10)
bad = [
    dict(good, step_time_s="slow"),
    dict(good, mem_peak_mib=True),
    dict(good, busy_s=-1.0),
    dict(good, step=2**80),
    dict(good, mem_mode="x" * 5000),
    dict(good, job_id="someone-else"),
]
lines = [json.dumps(b).encode() + b"\n" for b in bad] + [b"NaN\n", b'{"type": "step", "steps": []}\n']
try:
    for _ in range(int(sys.argv[1])):
        for line in lines:
            s.sendall(line)
    s.sendall(json.dumps(good).encode() + b"\n")
except OSError:  # disconnected by the agent
    pass
while True:
    time.sleep(0.05)
"""


def test_bad_messages_are_dropped_and_counted(
    started: tuple[Agent, Recorder], caplog: pytest.LogCaptureFixture
) -> None:
    """Wrongly typed or out-of-range fields never reach the controller; each bad message is counted against its
    run, logged at most once per 10 s, and the run stays connected below the limit."""
    agent, rec = started
    caplog.set_level(logging.WARNING, logger="corral.live.agent")
    agent.launch(req("few", PY, "-c", BAD_FLOOD, "1", grace_s=1.0))
    report = rec.wait(JobReported, "few").report
    assert (report.step, report.step_time_s, report.mem_peak_mib) == (1, 0.5, 10)
    assert agent.bad_messages("few", 1) == 8
    assert len([r for r in rec.of("few") if isinstance(r, JobReported)]) == 1
    complaints = [r.getMessage() for r in caplog.records if "job 'few' run 1 sent a bad message" in r.getMessage()]
    assert len(complaints) == 1 and "step_time_s" in complaints[0]  # the first, named; the rest held back
    assert agent.send("few", 1, contract.SetLimits(gpu_milli=500))  # still connected
    agent.cancel("few", 1)
    rec.wait(ProcessExited, "few")


def test_a_run_that_keeps_sending_bad_messages_is_disconnected(started: tuple[Agent, Recorder]) -> None:
    agent, rec = started
    agent.launch(req("flood", PY, "-c", BAD_FLOOD, "50", grace_s=0.5))  # 400 bad messages
    rec.wait(JobSaid, "flood", pred=lambda r: isinstance(r.message, contract.Hello))
    wait_until(lambda: agent.bad_messages("flood", 1) > contract.MAX_BAD_MESSAGES, "the run to be cut off")
    time.sleep(0.2)
    assert agent.bad_messages("flood", 1) == contract.MAX_BAD_MESSAGES + 1  # nothing read after the cut
    assert not any(isinstance(r, JobReported) for r in rec.of("flood"))
    assert not agent.send("flood", 1, contract.SetLimits(gpu_milli=500))
    assert "disconnected from the agent for good" in agent.log_path("flood").read_text()
    # it cannot come back: a new hello with the right secret is refused too
    secret = (agent.run_dir("flood", 1) / "secret").read_text().strip()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(str(agent.socket_path))
        s.sendall(contract.encode(contract.Hello("flood", 1, os.getpid(), secret)))
        _assert_closed_by_agent(s)
    # the job still runs, and is stopped by signal
    assert agent.processes() == [("flood", 1)]
    agent.cancel("flood", 1)
    ex = rec.wait(ProcessExited, "flood")
    assert ex.requested == "cancel"


def test_a_hello_must_carry_the_runs_secret(started: tuple[Agent, Recorder], caplog: pytest.LogCaptureFixture) -> None:
    """Another process naming a running job's run, without its secret, is dropped and logged; it receives none
    of the run's directives and cannot speak for it, and the real job stays connected."""
    agent, rec = started
    caplog.set_level(logging.WARNING, logger="corral.live.agent")
    agent.launch(req("victim", PY, "-c", CHANNEL_JOB, "good"))
    rec.wait(JobReported, "victim")
    for secret in ("", "0" * 64, "not even hex"):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(str(agent.socket_path))
            forged = contract.StepReport("victim", 1, 99, 1, 9.0, 9.0, 12345)
            s.sendall(contract.encode(contract.Hello("victim", 1, os.getpid(), secret)) + contract.encode(forged))
            _assert_closed_by_agent(s)
    assert agent.bad_messages("victim", 1) == 0  # impostors do not count against the run they name
    assert any("refused a hello as job 'victim' run 1" in r.getMessage() for r in caplog.records)
    assert not any(isinstance(r, JobReported) and r.report.step == 99 for r in rec.of("victim"))
    hellos = [r for r in rec.of("victim") if isinstance(r, JobSaid) and isinstance(r.message, contract.Hello)]
    assert len(hellos) == 1
    assert agent.send("victim", 1, contract.SetBatchSize(16))  # the real job still holds the channel
    assert rec.wait(JobReported, "victim", pred=lambda r: r.report.batch_size == 16).report.step == 2
    agent.cancel("victim", 1)
    rec.wait(ProcessExited, "victim")


def test_state_files_are_private_also_in_an_existing_state_dir(node: Node) -> None:
    sd = node.state_dir
    (sd / "logs").mkdir(parents=True)  # as an earlier corral left it, with the default umask's modes
    os.chmod(sd, 0o755)
    (sd / "corral.db").write_text("")
    os.chmod(sd / "corral.db", 0o644)
    (sd / "logs" / "old.log").write_text("x")
    agent, rec = node.agent()
    agent.launch(req("m", PY, "-c", "print('hi')"))
    assert rec.wait(ProcessExited, "m").exit_code == 0
    modes = {p: stat_mode(p) for p in [sd, *sd.rglob("*")]}
    for path, mode in modes.items():
        if path.is_dir():
            assert mode == 0o700, (path, oct(mode))
        elif path.parent != sd / "logs":  # (inside an earlier corral's logs dir, now 0700: unreachable)
            assert mode == 0o600, (path, oct(mode))  # files, records, the socket
    assert agent.log_path("m") == sd / "tenants" / "lab" / "logs" / "m.log"
    assert agent.checkpoint_dir("m") == sd / "tenants" / "lab" / "checkpoints" / "m"


def stat_mode(path: Path) -> int:
    return os.lstat(path).st_mode & 0o777


# -- ordering -------------------------------------------------------------------------------------------------
def test_launch_waits_for_the_gpu_and_the_previous_run(started: tuple[Agent, Recorder], tmp_path: Path) -> None:
    agent, rec = started
    agent.launch(req("a", PY, "-c", TRAP_TERM, str(tmp_path), "0.8", gpus=(0,), grace_s=10.0))
    wait_until((tmp_path / "ready").exists, "job a to trap SIGTERM")
    agent.preempt("a", 1)
    agent.launch(req("b", PY, "-c", "pass", gpus=(0,)))  # GPU 0 is still held by a, which is saving
    agent.launch(req("a", PY, "-c", "pass", run=2, gpus=(1,)))  # a's next run waits for its previous one
    agent.launch(req("c", PY, "-c", "pass", gpus=(1,)))  # nothing being stopped on GPU 1: starts at once
    a_exit = rec.wait(ProcessExited, "a")
    assert a_exit.exit_code == 75
    assert rec.index(rec.wait(ProcessStarted, "b")) > rec.index(a_exit)
    assert rec.index(rec.wait(ProcessStarted, "a", run=2)) > rec.index(a_exit)
    assert rec.index(rec.wait(ProcessStarted, "c")) < rec.index(a_exit)
    for job, run in (("b", 1), ("a", 2), ("c", 1)):
        assert rec.wait(ProcessExited, job, run=run).exit_code == 0


def test_a_pause_before_the_launch_started_holds_it_until_resumed(
    started: tuple[Agent, Recorder], tmp_path: Path
) -> None:
    """Gandiva suspends a job whose new run still waits for its GPU: the run must not start while the
    controller counts it paused (its GPUs are given to another job), and must start once resumed."""
    agent, rec = started
    agent.launch(req("h1", PY, "-c", TRAP_TERM, str(tmp_path), "0.5", gpus=(0,), grace_s=10.0))
    wait_until((tmp_path / "ready").exists, "job h1 to trap SIGTERM")
    agent.preempt("h1", 1)
    agent.launch(req("h2", PY, "-c", "pass", gpus=(0,)))  # waits: GPU 0 is held by h1, which is saving
    agent.pause("h2", 1, evict=True)
    h1_exit = rec.wait(ProcessExited, "h1")
    time.sleep(0.5)  # long enough for a waiting launch to start once h1 has exited
    assert not any(isinstance(r, ProcessStarted) and r.job_id == "h2" for r in rec.reports)
    assert agent.processes() == [("h2", 1)]
    agent.resume("h2", 1)
    assert rec.index(rec.wait(ProcessStarted, "h2")) > rec.index(h1_exit)
    assert rec.wait(ProcessExited, "h2").exit_code == 0


# -- adopting after a restart ---------------------------------------------------------------------------------
def test_adopt_a_running_job(node: Node, tmp_path: Path) -> None:
    first, rec1 = node.agent()
    go = tmp_path / "go"
    first.launch(req("j", PY, "-c", WAIT_FOR_FILE, str(go), "7", gpus=(1,)))
    shim = rec1.wait(ProcessStarted, "j").pid
    first.close()
    first.close()
    assert proc_state(shim) != "Z"  # still running without an agent
    second, rec2 = node.agent()
    assert second.adopt("j", 1)
    assert second.processes() == [("j", 1)]
    go.touch()
    ex = rec2.wait(ProcessExited, "j")
    assert (ex.exit_code, ex.requested) == (7, None)
    assert not any(isinstance(r, ProcessExited) for r in rec1.reports)
    assert "run 1 ended" in second.log_path("j").read_text()


# A corral.job job that steps until the file argv[1] exists; it reconnects to a restarted agent within 1 s.
LIBRARY_STEPS = r"""
import os, sys, time
import corral.job
with corral.job.Job(verbose=False, reconnect_s=1.0) as job:
    while not os.path.exists(sys.argv[1]):
        with job.step():
            time.sleep(0.02)
"""


def test_a_run_paused_by_an_earlier_agent_resumes_when_the_next_one_is_told_to(node: Node, tmp_path: Path) -> None:
    """Found by the chaos test under Gandiva: a job paused over the channel, then the controller restarted and
    resumed it before the job reconnected. The new agent knew no pause (a SIGCONT does not end a pause at a step
    boundary), the job reconnected saying Paused, and waited for good while the controller counted it running."""
    first, rec1 = node.agent()
    done = tmp_path / "done"
    first.launch(req("p", PY, "-c", LIBRARY_STEPS, str(done), grace_s=5.0))
    rec1.wait(JobSaid, "p", pred=lambda r: isinstance(r.message, contract.Hello))
    first.pause("p", 1, seq=4)
    rec1.wait(JobSaid, "p", pred=lambda r: isinstance(r.message, contract.Paused))
    first.close()
    second, rec2 = node.agent()
    assert second.adopt("p", 1)
    second.resume("p", 1, seq=5)  # before the job is back on the channel (it retries every second)
    rec2.wait(JobSaid, "p", pred=lambda r: isinstance(r.message, contract.Paused))  # its reconnection says so
    rec2.wait(JobSaid, "p", pred=lambda r: isinstance(r.message, contract.Resumed))
    done.touch()
    ex = rec2.wait(ProcessExited, "p")
    assert (ex.exit_code, ex.requested) == (0, None)


def test_adopt_then_preempt_uses_the_recorded_grace(node: Node, tmp_path: Path) -> None:
    first, _ = node.agent()
    first.launch(req("s", PY, "-c", IGNORE_TERM, str(tmp_path), grace_s=0.3))
    wait_until((tmp_path / "ready").exists, "the job to ignore SIGTERM")
    first.close()
    second, rec = node.agent()
    assert second.adopt("s", 1)
    second.preempt("s", 1)
    ex = rec.wait(ProcessExited, "s")
    assert (ex.exit_code, ex.signal, ex.requested) == (None, None, "preempt")
    assert "SIGKILL" in ex.detail


def test_adopt_without_pidfd_polls(node: Node, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(agent_module, "open_pidfd", lambda pid: None)
    first, rec1 = node.agent()
    go = tmp_path / "go"
    first.launch(req("poll", PY, "-c", WAIT_FOR_FILE, str(go), "5"))
    rec1.wait(ProcessStarted, "poll")
    first.close()
    second, rec2 = node.agent()
    assert second.adopt("poll", 1)
    go.touch()
    assert rec2.wait(ProcessExited, "poll").exit_code == 5


def test_adopt_a_job_that_ended_while_no_agent_ran(node: Node, tmp_path: Path) -> None:
    first, rec1 = node.agent()
    go = tmp_path / "go"
    first.launch(req("e", PY, "-c", WAIT_FOR_FILE, str(go), "4"))
    rec1.wait(ProcessStarted, "e")
    first.close()
    go.touch()
    wait_until((first.run_dir("e", 1) / "exit.json").exists, "the shim's exit record")
    second, rec2 = node.agent()
    assert second.adopt("e", 1)
    ex = rec2.wait(ProcessExited, "e")
    assert (ex.exit_code, ex.signal, ex.requested) == (4, None, None)
    assert "while no agent watched" in ex.detail


def test_adopt_without_a_live_process_or_record(node: Node) -> None:
    agent, _ = node.agent()
    assert not agent.adopt("nothing", 1)
    gone = agent.run_dir("dead", 1)
    gone.mkdir(parents=True)
    proc = os.posix_spawn("/bin/true", ["true"], os.environ)
    os.waitpid(proc, 0)
    (gone / "pid").write_text(f"{proc} 12345\n")  # a dead pid (or a reused one with another start time)
    assert not agent.adopt("dead", 1)
    (gone / "pid").write_text(f"{os.getpid()} 1\n")  # a live pid whose start time does not match
    assert not agent.adopt("dead", 1)
    assert agent.processes() == []


# -- misc -----------------------------------------------------------------------------------------------------
def test_job_ids_cannot_escape_the_state_dir(started: tuple[Agent, Recorder]) -> None:
    agent, rec = started
    assert safe_name("17") == "17"
    assert safe_name("..") == "%2E."
    assert safe_name("a/../b") == "a%2F..%2Fb"
    assert safe_name("50%") != safe_name("50%25") and "/" not in safe_name("é/x")
    assert len(safe_name("x" * 1000)) <= 200 and safe_name("x" * 1000) != safe_name("x" * 999)
    agent.launch(req("../../evil", PY, "-c", "print('hi')"))
    assert rec.wait(ProcessExited, "../../evil").exit_code == 0
    log = agent.log_path("../../evil")
    assert log.parent == agent.state_dir / "tenants" / "lab" / "logs" and "hi" in log.read_text()
    assert agent.run_dir("../../evil", 1).parent.parent == agent.state_dir / "runs"


def test_one_agent_per_state_dir(node: Node) -> None:
    node.agent()
    with pytest.raises(ConfigError, match="another corral agent"):
        node.agent()


def test_long_state_dir_gets_a_short_socket(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    agent = Agent(deep, discover_gpus(stand_in=1), lambda r: None)
    assert agent.socket_path.parent != deep and len(str(agent.socket_path)) <= 100
    agent.start()
    try:
        assert agent.socket_path.exists()
    finally:
        agent.close()
    assert not agent.socket_path.exists()


def test_a_stale_socket_is_replaced(node: Node) -> None:
    node.state_dir.mkdir(parents=True)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind(str(node.state_dir / "agent.sock"))  # bound, never listening: what a killed agent leaves
    agent, rec = node.agent()
    agent.launch(req("ok", PY, "-c", CHANNEL_JOB, "good"))
    rec.wait(JobReported, "ok")
    agent.cancel("ok", 1)
    rec.wait(ProcessExited, "ok")


# -- NVML figures -------------------------------------------------------------------------------------------------
def test_nvml_process_samples_are_attributed_to_runs_by_process_group(started: tuple[Agent, Recorder]) -> None:
    """The agent's sampler thread is NVML-only; here the samples are handed to the same attribution code it feeds.
    A sample of the job's child process (its own process group's member) counts for the job; another pid not."""
    agent, rec = started
    agent.launch(req("m", PY, "-c", SLEEP_LOOP, gpus=(0,)))
    shim = rec.wait(ProcessStarted, "m").pid
    child_file = agent.run_dir("m", 1) / "child"
    wait_until(child_file.exists, "the child record")
    child = int(child_file.read_text())
    agent.measured(
        [
            ProcessSample(0, child, 1200, 0.4),
            ProcessSample(0, shim, 300, None),  # the shim itself is in the group too (it holds no GPU in reality)
            ProcessSample(0, os.getpid(), 999, 0.9),  # not the job's
            ProcessSample(0, 2**22 + 7, 50, 0.1),  # gone: no such process
        ]
    )
    m = rec.wait(JobMeasured, "m")
    assert (m.run, m.mem_used_mib, m.sm_util) == (1, 1500, pytest.approx(0.4))
    agent.cancel("m", 1)
    rec.wait(ProcessExited, "m")
