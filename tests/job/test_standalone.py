"""The job-side library without an agent: the loop forms, step counting, checkpoint and resume with the
script's own hooks, the SIGTERM path, the environment, and importing without torch."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from corral.core import contract
from corral.core.errors import ConfigError
from corral.job import CheckpointStore, Job, JobEnvironment


def standalone(**kwargs: object) -> Job:
    return Job(env={}, **kwargs)  # type: ignore[arg-type]


def test_standalone_job_needs_no_socket_and_no_thread() -> None:
    with standalone() as job:
        assert job.standalone and not job.connected
        assert job.checkpoint_dir is None
        assert not any(t.name == "corral-job-channel" for t in threading.enumerate())
        seen = list(job.loop(range(10)))
        assert seen == list(range(10))
        assert (job.global_step, job.start_step, job.epoch, job.resumed) == (10, 0, 0, False)
        assert job.last_step_s >= 0.0


def test_standalone_installs_no_sigterm_handler_without_checkpoint_dir() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with standalone():
        assert signal.getsignal(signal.SIGTERM) is before


def test_epochs_and_loop() -> None:
    with standalone() as job:
        got = []
        for epoch in job.epochs(3):
            for item in job.loop("abcd"):
                got.append((epoch, job.step_in_epoch, job.global_step, item))
        assert got == [(e, i, 4 * e + i, "abcd"[i]) for e in range(3) for i in range(4)]
        assert job.global_step == 12


def test_flat_loop_over_epochs() -> None:
    with standalone() as job:
        assert list(job.loop([1, 2], epochs=3)) == [1, 2] * 3
        assert job.epoch == 3 and job.global_step == 6


def test_successive_loops_are_successive_epochs() -> None:
    with standalone() as job:
        assert list(job.loop([1, 2, 3])) == [1, 2, 3]
        assert list(job.loop([1, 2, 3])) == [1, 2, 3]
        assert job.epoch == 1 and job.global_step == 6


def test_break_counts_the_step_and_the_next_loop_continues_the_epoch() -> None:
    with standalone() as job:
        for item in job.loop(range(10)):
            if item == 3:
                break
        assert job.global_step == 4 and job.step_in_epoch == 4
        assert list(job.loop(range(10))) == [4, 5, 6, 7, 8, 9]
        assert job.epoch == 0 and job.global_step == 10


def test_step_context_manager() -> None:
    with standalone() as job:
        for i in range(5):
            with job.step():
                assert job.global_step == i
        assert job.global_step == 5


def test_one_loop_at_a_time() -> None:
    with standalone() as job:
        for _ in job.loop(range(2)):
            with pytest.raises(RuntimeError, match=r"inside job\.loop"), job.step():
                pass
            with pytest.raises(RuntimeError, match="already running"):
                next(iter(job.loop(range(2))))
            break


def test_environment_parsing() -> None:
    env = JobEnvironment.from_env(
        {
            contract.ENV_JOB_ID: "j7",
            contract.ENV_RUN: "3",
            contract.ENV_GPU_MILLI: "500",
            contract.ENV_GPUS: "0,2",
            contract.ENV_STAND_IN: "1",
            contract.ENV_REPORT_INTERVAL_S: "0.5",
            contract.ENV_AGENT_SOCKET: "",
        }
    )
    assert (env.job_id, env.run, env.gpu_milli, env.gpus, env.stand_in) == ("j7", 3, 500, ("0", "2"), True)
    assert env.report_interval_s == 0.5 and env.agent_socket is None and env.gpu_mem_mib is None
    assert JobEnvironment.from_env({}) == JobEnvironment()


@pytest.mark.parametrize(
    ("name", "value"),
    [
        (contract.ENV_RUN, "two"),
        (contract.ENV_RUN, "0"),
        (contract.ENV_GPU_MILLI, "-1"),
        (contract.ENV_REPORT_INTERVAL_S, "soon"),
        (contract.ENV_GRACE_S, "nan"),
    ],
)
def test_malformed_environment_names_the_variable(name: str, value: str) -> None:
    with pytest.raises(ConfigError, match=name):
        JobEnvironment.from_env({name: value})


# -- checkpoint and resume with the script's own hooks --------------------------------------------------------
class Counter:
    """A script's own state, saved by its hooks: a running sum and the random draws it made."""

    def __init__(self) -> None:
        self.total = 0
        self.saved_to: list[Path] = []
        self.loaded_from: list[Path] = []

    def save(self, path: Path) -> None:
        (path / "counter.txt").write_text(str(self.total))
        self.saved_to.append(path)

    def load(self, path: Path) -> None:
        self.total = int((path / "counter.txt").read_text())
        self.loaded_from.append(path)


def train(job: Job, counter: Counter, draws: list[float], stop_at: int | None = None) -> None:
    for item in job.loop(range(20)):
        counter.total += item
        draws.append(random.random())
        if job.global_step == stop_at:
            job.request_checkpoint()


def test_save_and_load_hooks_resume_where_the_job_stopped(tmp_path: Path) -> None:
    random.seed(1)
    whole: list[float] = []
    train(standalone(), Counter(), whole)

    random.seed(1)
    counter, first = Counter(), []
    job = standalone(checkpoint_dir=tmp_path, save=counter.save, load=counter.load)
    with pytest.raises(SystemExit) as exit_info:
        train(job, counter, first, stop_at=6)
    assert exit_info.value.code == contract.EXIT_PREEMPTED
    latest = CheckpointStore(tmp_path).latest()
    assert latest is not None and len(counter.saved_to) == 1  # called with the directory before it is renamed
    assert (latest / "counter.txt").read_text() == str(sum(range(7)))

    random.seed(99)  # the resumed run must not depend on the generator's state at start
    counter2, second = Counter(), []
    with standalone(checkpoint_dir=tmp_path, save=counter2.save, load=counter2.load) as job2:
        assert job2.resumed and job2.start_step == 7 and job2.step_in_epoch == 7
        assert counter2.loaded_from == [latest] and job2.checkpoint_path == latest
        train(job2, counter2, second)
    assert counter2.total == sum(range(20))
    assert first + second == whole


def test_checkpoint_without_exit_keeps_only_the_latest(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("the script's own file")
    with standalone(checkpoint_dir=tmp_path) as job:
        for _ in job.loop(range(10)):
            if job.global_step in (2, 5):
                job.request_checkpoint(exit=False)
        assert job.global_step == 10
    latest = CheckpointStore(tmp_path).latest()
    assert latest is not None and latest.name.startswith("ckpt-000000006-")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["latest", latest.name, "notes.txt"])


def test_sigterm_checkpoints_at_the_next_boundary_and_exits_75(tmp_path: Path) -> None:
    before = signal.getsignal(signal.SIGTERM)
    job = standalone(checkpoint_dir=tmp_path)
    assert signal.getsignal(signal.SIGTERM) is not before
    steps_after_signal = 0
    with pytest.raises(SystemExit) as exit_info:
        for _ in job.loop(range(100)):
            if job.global_step == 3:
                signal.raise_signal(signal.SIGTERM)
            elif job.global_step > 3:
                steps_after_signal += 1
    assert exit_info.value.code == contract.EXIT_PREEMPTED
    assert steps_after_signal == 0
    assert job.preempt_requested == "SIGTERM"
    assert signal.getsignal(signal.SIGTERM) is before  # restored by close()
    with standalone(checkpoint_dir=tmp_path) as resumed:
        assert resumed.start_step == 4
        assert next(iter(resumed.loop(range(100)))) == 4


def test_imports_and_runs_without_torch(tmp_path: Path) -> None:
    script = f"""
import sys
sys.modules["torch"] = None  # any "import torch" now fails
import corral.job
job = corral.job.Job(env={{}}, checkpoint_dir={str(tmp_path)!r})
for i in job.loop(range(5)):
    if i == 2:
        job.request_checkpoint(exit=False)
job.close()
with open({str(tmp_path / "ok")!r}, "w") as f:
    f.write(str(job.global_step))
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "ok").read_text() == "5"
    assert CheckpointStore(tmp_path).latest() is not None
