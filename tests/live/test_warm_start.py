"""Warm starts (corral.live.agent.zygote, issue 19): a run forked from the agent's zygote behaves as a cold one
(environment, arguments, working directory, exit codes, logs, signals, the contract's channel), is a fresh process
each time, and a command that cannot start warm starts cold and says so. Real processes, stand-in GPUs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="warm starts are for scripts that use torch (pip install corral[torch])")

from test_agent import CHANNEL_JOB, TRAP_TERM, Recorder, kill_everything_under, req, wait_until

from corral.live.agent import Agent, JobReported, ProcessExited, ProcessStarted
from corral.live.agent.gpus import discover_gpus
from corral.live.agent.zygote import WarmCommand, Zygote, warm_form

PY = sys.executable

# What a script sees of its start: written as one JSON line, then it exits with argv[1].
SEES = r"""
import json, os, sys
seen = {
    "argv": sys.argv, "cwd": os.getcwd(), "name": __name__, "path0": sys.path[0],
    "env": {k: v for k, v in os.environ.items() if k.startswith(("CORRAL_", "CUDA_")) or k in ("USER_VAR", "PATH")},
    "stdin": sys.stdin.read(), "torch_already": "torch" in sys.modules,
}
print("SEEN " + json.dumps(seen), flush=True)
print("to stderr", file=sys.stderr)
sys.exit(int(sys.argv[1]))
"""


@pytest.fixture(scope="module")
def warm_agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Agent, Recorder, Path]]:
    base = tmp_path_factory.mktemp("warm")
    state = base / "state"
    rec = Recorder()
    agent = Agent(state, discover_gpus(stand_in=2), rec, report_interval_s=0.5, warm=True)
    agent.start()
    assert agent._zygote is not None and agent._zygote.wait_ready(60.0), (state / "zygote.log").read_text()
    try:
        yield agent, rec, base
    finally:
        agent.close()
        kill_everything_under(state)


def seen(agent: Agent, job_id: str) -> dict[str, object]:
    for line in agent.log_path(job_id).read_text().splitlines():
        if line.startswith("SEEN "):
            found: dict[str, object] = json.loads(line[5:])
            return found
    raise AssertionError(agent.log_path(job_id).read_text())


def test_a_warm_run_sees_what_a_cold_run_sees(warm_agent: tuple[Agent, Recorder, Path]) -> None:
    agent, rec, base = warm_agent
    script = base / "sees.py"
    script.write_text(SEES)
    work = base / "work"
    work.mkdir()
    env = {"USER_VAR": "x", "PATH": os.path.dirname(PY) + os.pathsep + os.environ.get("PATH", "")}
    for job, warm in (("cold", False), ("warm", True)):
        agent.launch(req(job, PY, str(script), "3", cwd=str(work), env=env, warm=warm))
        rec.wait(ProcessStarted, job)
        exited = rec.wait(ProcessExited, job)
        assert (exited.exit_code, exited.signal) == (3, None), exited
    cold, warm = seen(agent, "cold"), seen(agent, "warm")
    assert warm.pop("torch_already") is True and cold.pop("torch_already") is False  # forked from the zygote
    for found, job in ((cold, "cold"), (warm, "warm")):
        env_seen = found.pop("env")
        assert isinstance(env_seen, dict)
        assert env_seen.pop("CORRAL_JOB_ID") == job and len(env_seen.pop("CORRAL_RUN_SECRET")) == 64
        assert str(env_seen.pop("CORRAL_CHECKPOINT_DIR")).endswith(job)
        found["env"] = env_seen
    assert warm == cold
    assert warm["argv"] == [str(script), "3"] and warm["cwd"] == str(work) and warm["name"] == "__main__"
    log = agent.log_path("warm").read_text()
    assert "to stderr" in log and "started cold" not in log
    assert (agent.run_dir("warm", 1) / "exit.json").exists() and (agent.run_dir("warm", 1) / "child").exists()


def test_each_warm_run_is_a_fresh_process_in_its_own_group(warm_agent: tuple[Agent, Recorder, Path]) -> None:
    agent, rec, base = warm_agent
    flag = base / "go"
    script = base / "wait.py"
    script.write_text(f"import os, time, pathlib\nwhile not pathlib.Path({str(flag)!r}).exists(): time.sleep(0.02)\n")
    for job in ("f1", "f2"):
        agent.launch(req(job, PY, str(script), warm=True))
    pids = [rec.wait(ProcessStarted, job).pid for job in ("f1", "f2")]
    assert len(set(pids)) == 2 and agent._zygote is not None
    for pid in pids:
        assert os.getpgid(pid) == pid and os.getsid(pid) == pid  # a shim of its own, as a cold run's
    flag.write_text("")
    for job in ("f1", "f2"):
        assert rec.wait(ProcessExited, job).exit_code == 0


def test_a_warm_run_is_stopped_by_signals_as_a_cold_one(warm_agent: tuple[Agent, Recorder, Path]) -> None:
    agent, rec, base = warm_agent
    for job, warm in (("term-cold", False), ("term-warm", True)):
        folder = base / job
        folder.mkdir()
        script = folder / "trap.py"
        script.write_text(TRAP_TERM)
        agent.launch(req(job, PY, str(script), str(folder), "0.1", warm=warm))
        rec.wait(ProcessStarted, job)
        wait_until(lambda f=folder: (f / "ready").exists(), f"{job} ready")  # type: ignore[misc]
        agent.preempt(job, 1)
        exited = rec.wait(ProcessExited, job)
        assert (exited.exit_code, exited.signal, exited.requested) == (75, None, "preempt"), exited
        assert (folder / "got-term").read_text() == "saved"


def test_a_warm_run_speaks_the_contract(warm_agent: tuple[Agent, Recorder, Path]) -> None:
    agent, rec, base = warm_agent
    script = base / "channel.py"
    script.write_text(CHANNEL_JOB)
    agent.launch(req("chan", PY, str(script), "good", warm=True, env={"PYTHONPATH": os.pathsep.join(sys.path)}))
    report = rec.wait(JobReported, "chan")
    assert report.report.step_time_s == 0.25
    agent.cancel("chan", 1)
    rec.wait(ProcessExited, "chan")


def test_an_uncaught_exception_and_sys_exit_with_a_message_exit_as_python_does(
    warm_agent: tuple[Agent, Recorder, Path],
) -> None:
    agent, rec, base = warm_agent
    cases = {
        "boom": ("raise RuntimeError('boom')", 1, "RuntimeError: boom"),
        "msg": ("import sys; sys.exit('bye')", 1, "bye"),
    }
    for job, (code, status, text) in cases.items():
        script = base / f"{job}.py"
        script.write_text(code + "\n")
        agent.launch(req(job, PY, str(script), warm=True))
        assert rec.wait(ProcessExited, job).exit_code == status
        assert text in agent.log_path(job).read_text()


def test_a_command_that_cannot_start_warm_starts_cold_and_says_so(warm_agent: tuple[Agent, Recorder, Path]) -> None:
    agent, rec, _ = warm_agent
    agent.launch(req("shell", "/bin/sh", "-c", "exit 4", warm=True))
    assert rec.wait(ProcessExited, "shell").exit_code == 4
    log = agent.log_path("shell").read_text()
    assert "=== corral: started cold, not warm: '/bin/sh' is not the warm workers' interpreter" in log


# Saves a checkpoint (run 1), or resumes from it (later runs) and says whether the checkpoint prefetch was under way
# before the script's first line ran (a warm run: its worker started it) and whether the restore used it.
PREFETCH_JOB = r"""
import sys
lib = sys.modules.get("corral.job.prefetch")
before = lib is not None and lib.pending_prefetch() is not None
import json, torch, corral.job
model = torch.nn.Linear(256, 256)
opt = torch.optim.Adam(model.parameters())
job = corral.job.Job(model=model, optimizer=opt)
if sys.argv[1] == "save":
    for _ in job.loop(range(10)):
        job.request_checkpoint()
print("PREFETCH " + json.dumps({"before": before, "prefetched": job.prefetched, "step": job.start_step}), flush=True)
job.close()
"""


def test_a_warm_worker_starts_the_checkpoint_prefetch_before_the_script_runs(
    warm_agent: tuple[Agent, Recorder, Path],
) -> None:
    agent, rec, base = warm_agent
    script = base / "prefetch.py"
    script.write_text(PREFETCH_JOB)
    found = {}
    for job, warm, env in (
        ("pf-warm", True, {"CORRAL_CHECKPOINT_PREFETCH": "1"}),  # 1: even though the page cache holds it
        ("pf-cold", False, {"CORRAL_CHECKPOINT_PREFETCH": "1"}),
        ("pf-off", True, {"CORRAL_CHECKPOINT_PREFETCH": "0"}),
    ):
        env = {**env, "PYTHONPATH": os.pathsep.join(sys.path), "CORRAL_CHECKPOINT_PREFETCH_MIN_MIB": "0"}
        agent.launch(req(job, PY, str(script), "save", warm=warm, env=env))
        assert rec.wait(ProcessExited, job).exit_code == 75
        agent.launch(req(job, PY, str(script), "resume", run=2, warm=warm, env=env))
        assert rec.wait(ProcessExited, job, run=2).exit_code == 0, agent.log_path(job).read_text()
        log = agent.log_path(job).read_text()
        found[job] = json.loads(next(line[9:] for line in log.splitlines() if line.startswith("PREFETCH ")))
        assert ("state prefetched" in log) is found[job]["prefetched"] and "prefetch not used" not in log
    assert found["pf-warm"] == {"before": True, "prefetched": True, "step": 1}  # started by the warm worker
    assert found["pf-cold"] == {"before": False, "prefetched": True, "step": 1}  # started by `import corral.job`
    assert found["pf-off"] == {"before": False, "prefetched": False, "step": 1}  # CORRAL_CHECKPOINT_PREFETCH=0


@pytest.mark.parametrize(
    "command, expected",
    [
        ([PY, "train.py", "--lr", "1"], WarmCommand(None, "train.py", ("--lr", "1"), False)),
        ([PY, "-u", "-m", "pkg.train", "x"], WarmCommand("pkg.train", None, ("x",), True)),
        ([PY, "-c", "print(1)"], "only -u, then a script or -m MODULE, may follow the interpreter in a warm command"),
        ([PY], "the command is not PYTHON SCRIPT or PYTHON -m MODULE"),
        (["/bin/true", "x"], f"'/bin/true' is not the warm workers' interpreter {PY}"),
    ],
)
def test_warm_form(command: list[str], expected: object) -> None:
    assert warm_form(command, {"PATH": os.environ.get("PATH", "")}, PY) == expected


def test_the_zygote_goes_when_its_agent_does(tmp_path: Path) -> None:
    """Closed with its agent; and gone by itself within seconds when the agent dies without closing it."""
    code = (
        "import sys, pathlib; from corral.live.agent.zygote import Zygote\n"
        f"z = Zygote({PY!r}, pathlib.Path({str(tmp_path / 'z.sock')!r}), pathlib.Path({str(tmp_path / 'z.log')!r}))\n"
        "z.start(); assert z.wait_ready(60); print(z._proc.pid, flush=True)\n"
    )
    parent = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    zygote = int(parent.stdout.split()[0])  # its parent exited without closing it (as after kill -9)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(zygote, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        os.kill(zygote, signal.SIGKILL)
        raise AssertionError("the zygote outlived its agent")
    z = Zygote(PY, tmp_path / "y.sock", tmp_path / "y.log")
    z.start()
    assert z.wait_ready(60.0)
    proc = z._proc
    z.close()
    assert proc is not None and proc.poll() is not None and not (tmp_path / "y.sock").exists()


# -- through corral serve -------------------------------------------------------------------------------------
def test_serve_with_warm_starts_forks_a_warm_job_and_refuses_a_warm_shell_command(tmp_path: Path) -> None:
    from corral.live.client import Client, ClientError
    from live_server import start_server, stop_server

    conf = tmp_path / "corral.toml"
    conf.write_text("[server]\nwarm_starts = true\n")
    server = start_server(tmp_path / "state", "--gpus", "1", "--config", str(conf))
    try:
        client = Client(server.url, (tmp_path / "state" / "admin.token").read_text().strip())
        script = tmp_path / "sees.py"
        script.write_text(SEES)
        env = {"PATH": os.path.dirname(PY) + os.pathsep + os.environ.get("PATH", "")}
        deadline = time.monotonic() + 60  # the zygote imports torch first; until then a run would start cold
        while (
            not (tmp_path / "state" / "zygote.log").exists()
            or "imported" not in (tmp_path / "state" / "zygote.log").read_text()
        ):
            assert time.monotonic() < deadline, "the zygote did not come up"
            time.sleep(0.1)
        job = client.submit([PY, str(script), "0"], env=env, warm=True)
        assert job["warm"] is True
        while client.job(job["job_id"])["phase"] not in ("finished", "failed"):
            time.sleep(0.05)
        log = client.logs(job["job_id"])["text"]
        assert client.job(job["job_id"])["phase"] == "finished", log
        assert '"torch_already": true' in log and "started cold" not in log
        with pytest.raises(ClientError, match="warm: only -u, then a script or -m MODULE"):
            client.submit(["/bin/sh", "-c", "true"], warm=True)
    finally:
        stop_server(server)


def test_warm_starts_in_the_serve_configuration(tmp_path: Path) -> None:
    from corral.live.config import ConfigFileError, load_config

    conf = tmp_path / "corral.toml"
    conf.write_text("[server]\nwarm_starts = true\n")
    assert load_config(conf).warm_starts is True
    assert load_config(None).warm_starts is False
    conf.write_text('[server]\nwarm_starts = "yes"\n')
    with pytest.raises(ConfigFileError, match=r"server.warm_starts: bad value; expected true or false; got .yes."):
        load_config(conf)


def test_a_warm_run_outlives_its_agent_and_zygote_and_is_adopted(tmp_path: Path) -> None:
    """The agent stops (or its server is killed): the zygote goes, the warm run lives on in its own session and a
    new agent adopts it, as it does a cold run; nothing is left behind."""
    state = tmp_path / "state"
    gpus = discover_gpus(stand_in=1)
    go = tmp_path / "go"
    script = tmp_path / "wait.py"
    script.write_text(f"import pathlib, sys, time\nwhile not pathlib.Path({str(go)!r}).exists(): time.sleep(0.02)\n")
    script.write_text(script.read_text() + "sys.exit(7)\n")
    first_rec, second_rec = Recorder(), Recorder()
    first = Agent(state, gpus, first_rec, report_interval_s=0.5, warm=True)
    second = Agent(state, gpus, second_rec, report_interval_s=0.5, warm=True)
    try:
        first.start()
        assert first._zygote is not None and first._zygote.wait_ready(60.0)
        zygote = first._zygote._proc
        first.launch(req("w", PY, str(script), warm=True))
        shim = first_rec.wait(ProcessStarted, "w").pid
        first.close()
        assert zygote is not None and zygote.poll() is not None  # the zygote went with its agent
        os.kill(shim, 0)  # the run did not
        second.start()
        assert second.adopt("w", 1)
        go.touch()
        exited = second_rec.wait(ProcessExited, "w")
        assert (exited.exit_code, exited.requested) == (7, None)
        assert "run 1 ended" in second.log_path("w").read_text()
    finally:
        first.close()
        second.close()
        kill_everything_under(state)


def test_a_job_file_may_ask_for_a_warm_start(tmp_path: Path) -> None:
    from corral.cli.live import load_job_file
    from corral.live.config import ConfigFileError

    job = tmp_path / "job.toml"
    job.write_text('command = "python train.py"\nwarm = true\n')
    assert load_job_file(job)["warm"] is True
    job.write_text('command = "python train.py"\nwarm = "yes"\n')
    with pytest.raises(ConfigFileError, match="warm: bad value; expected true or false"):
        load_job_file(job)


def test_a_run_whose_zygote_is_gone_starts_cold_and_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state = tmp_path / "state"
    rec = Recorder()
    agent = Agent(state, discover_gpus(stand_in=1), rec, report_interval_s=0.5, warm=True)
    try:
        agent.start()
        zygote = agent._zygote
        assert zygote is not None and zygote.wait_ready(60.0)
        zygote.close()  # gone between the check that it is ready and the request
        monkeypatch.setattr(zygote, "ready", lambda: True)
        script = tmp_path / "ok.py"
        script.write_text("print('ran')\n")
        agent.launch(req("z", PY, str(script), warm=True))
        assert rec.wait(ProcessExited, "z").exit_code == 0
        log = agent.log_path("z").read_text()
        assert "=== corral: started cold, not warm: the warm workers failed" in log and "ran" in log
    finally:
        agent.close()
        kill_everything_under(state)
