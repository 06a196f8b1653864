"""The live controller with its real agent and real processes on stand-in GPUs: submit, run, finish, fail,
queue within quotas, cancel, and the durability rule (the store knows every job and process)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.core.job import JobPhase
from corral.live.agent import ProcessExited, StopRequest
from corral.live.api import http_status
from corral.live.config import ServeConfig, TenantConfig
from corral.live.controller import Controller
from corral.live.records import BadRequest, JobRecord, JobRequest, ProcessPhase
from corral.live.store import Store

PY = sys.executable


def _config(tmp_path: Path, **kw: object) -> ServeConfig:
    base: dict[str, object] = dict(
        state_dir=tmp_path / "state",
        gpus=2,
        tenants=(TenantConfig("alice", 1), TenantConfig("bob", 1)),
        grace_s=2.0,
        policy="fifo",
    )
    base.update(kw)
    return ServeConfig(**base)  # type: ignore[arg-type]


def shutdown(c: Controller) -> None:
    """Cancel whatever still runs (tests leave no processes behind), then stop."""
    for rec in c.jobs(phases=[JobPhase.RUNNING, JobPhase.PENDING]):
        with contextlib.suppress(BadRequest):
            c.cancel(rec.job_id)
    wait_until(lambda: all(r.process.phase is ProcessPhase.NONE for r in c.jobs()), 10)
    c.stop()


@pytest.fixture
def controller(tmp_path: Path) -> Iterator[Controller]:
    c = Controller.from_config(_config(tmp_path))
    c.start()
    yield c
    shutdown(c)


def wait_until(cond: object, timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():  # type: ignore[operator]
            return True
        time.sleep(0.02)
    return False


def wait_phase(c: Controller, job_id: str, *phases: JobPhase, timeout_s: float = 30.0) -> JobRecord:
    assert wait_until(lambda: c.job(job_id).phase in phases, timeout_s), (
        f"job {job_id} is {c.job(job_id).phase}, events: {c.events(job_id)}"
    )
    return c.job(job_id)


def request(tenant: str, *argv: str, **kw: object) -> JobRequest:
    return JobRequest(command=(PY, *argv), tenant=tenant, cwd=os.getcwd(), **kw)  # type: ignore[arg-type]


def test_submit_run_finish(controller: Controller) -> None:
    rec = controller.submit(request("alice", "-c", "import os; print('hello from', os.environ['CORRAL_JOB_ID'])"))
    assert rec.phase is JobPhase.PENDING
    done = wait_phase(controller, rec.job_id, JobPhase.FINISHED)
    assert done.process.exit_code == 0 and done.process.phase is ProcessPhase.NONE
    assert done.status.placement is None and done.status.first_start_s is not None
    text = controller.log_path(rec.job_id).read_text()
    assert f"hello from {rec.job_id}" in text
    kinds = [e.kind for e in controller.events(rec.job_id)]
    assert kinds[0] == "submitted" and "launched" in kinds and "started" in kinds and kinds[-1] == "finished"


def test_a_failing_job_fails_with_its_exit_code(controller: Controller) -> None:
    rec = controller.submit(request("bob", "-c", "import sys; sys.exit(3)"))
    done = wait_phase(controller, rec.job_id, JobPhase.FAILED)
    assert done.status.reason is not None and "code 3" in done.status.reason
    missing = controller.submit(JobRequest(command=("/nonexistent/cmd",), tenant="bob", cwd=os.getcwd()))
    done = wait_phase(controller, missing.job_id, JobPhase.FAILED)
    assert "127" in (done.status.reason or "")


def test_quota_holds_a_guaranteed_job_until_its_tenant_has_room(controller: Controller) -> None:
    first = controller.submit(request("alice", "-c", "import time; time.sleep(1.0)"))
    second = controller.submit(request("alice", "-c", "pass"))
    wait_phase(controller, first.job_id, JobPhase.RUNNING)
    time.sleep(0.3)
    assert controller.job(second.job_id).phase is JobPhase.PENDING  # one free GPU, but alice's quota is 1
    snapshot = {t.name: t for t in controller.tenants()}
    assert snapshot["alice"].guaranteed_gpus == 1 and snapshot["alice"].pending == 1
    wait_phase(controller, first.job_id, JobPhase.FINISHED)
    done = wait_phase(controller, second.job_id, JobPhase.FINISHED)
    assert done.status.first_start_s is not None
    assert done.status.first_start_s >= (controller.job(first.job_id).status.end_s or 0)


def test_cancel_stops_a_running_job_and_a_pending_one(controller: Controller) -> None:
    running = controller.submit(request("alice", "-c", "import time; time.sleep(60)"))
    waiting = controller.submit(request("alice", "-c", "pass"))
    wait_phase(controller, running.job_id, JobPhase.RUNNING)
    assert wait_until(lambda: controller.job(running.job_id).process.phase is ProcessPhase.RUNNING)
    pid = controller.job(running.job_id).process.pid
    assert pid is not None
    controller.cancel(waiting.job_id)
    assert controller.job(waiting.job_id).phase is JobPhase.CANCELLED
    controller.cancel(running.job_id)
    assert controller.job(running.job_id).phase is JobPhase.CANCELLED
    assert wait_until(lambda: controller.job(running.job_id).process.phase is ProcessPhase.NONE, 10)
    assert not Path(f"/proc/{pid}").exists() or _zombie(pid)
    with pytest.raises(BadRequest) as err:
        controller.cancel(running.job_id)
    assert http_status(err.value) == 409


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] == "Z"
    except OSError:
        return True


@pytest.mark.parametrize(
    ("change", "status", "words"),
    [
        (dict(tenant="carol"), 404, "unknown tenant"),
        (dict(num_gpus=0), 422, "num_gpus"),
        (dict(num_gpus=3), 422, "this cluster has 2"),
        (dict(num_gpus=2), 422, "quota of 1"),
        (dict(gpu_milli=1500), 422, "gpu_milli"),
        (dict(num_gpus=2, gpu_milli=500, opportunistic=True), 422, "fractional"),
        (dict(cwd="/no/such/dir"), 422, "working directory"),
        (dict(env={"CORRAL_RUN": "7"}), 422, "set by corral"),
        (dict(command=()), 422, "command"),
        (dict(gpu_mem_mib=10**9), 422, "gpu_mem_mib"),
    ],
)
def test_bad_requests_are_refused_and_change_nothing(
    controller: Controller, change: dict[str, object], status: int, words: str
) -> None:
    base: dict[str, object] = dict(command=(PY, "-c", "pass"), tenant="alice", cwd=os.getcwd())
    base.update(change)
    before = len(controller.jobs())
    with pytest.raises(BadRequest) as err:
        controller.submit(JobRequest(**base))  # type: ignore[arg-type]
    assert http_status(err.value) == status
    assert words in err.value.message
    assert len(controller.jobs()) == before


def test_every_change_is_in_the_store_before_the_process_starts(tmp_path: Path) -> None:
    c = Controller.from_config(_config(tmp_path))
    c.start()
    try:
        rec = c.submit(request("alice", "-c", "import time; time.sleep(0.5)"))
        wait_phase(c, rec.job_id, JobPhase.RUNNING)
        # A second reader of the database file sees the launch: it was committed, not just held in memory.
        other = Store(tmp_path / "state" / "corral.db")
        seen = other.get(rec.job_id)
        assert seen is not None and seen.phase is JobPhase.RUNNING and seen.status.placement is not None
        assert seen.process.run == 1
        other.close()
        wait_phase(c, rec.job_id, JobPhase.FINISHED)
    finally:
        shutdown(c)


EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_mlp.py"


def test_preempted_pytorch_job_resumes_from_its_checkpoint_with_the_same_final_weights(tmp_path: Path) -> None:
    """Tiresias on one stand-in GPU: a short job arriving after a long one has attained more than the first
    queue's threshold preempts it; the long one checkpoints (corral.job), exits, waits, and resumes from its
    checkpoint. Its final weights equal those of a run nobody interrupted."""
    torch = pytest.importorskip("torch")
    import subprocess

    args = ["--epochs", "2", "--steps-per-epoch", "40", "--batch-size", "16"]
    alone = tmp_path / "alone.pt"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    subprocess.run([PY, str(EXAMPLE), *args, "--save-weights", str(alone)], check=True, env=env, timeout=120)

    c = Controller.from_config(
        _config(tmp_path, gpus=1, policy="tiresias:thresholds_gpu_s=1", tenants=(TenantConfig("alice"),), grace_s=15.0)
    )
    c.start()
    try:
        shared = tmp_path / "shared.pt"
        long = c.submit(request("alice", str(EXAMPLE), *args, "--step-sleep", "0.05", "--save-weights", str(shared)))
        wait_phase(c, long.job_id, JobPhase.RUNNING)
        # Training (its first step report is in), and past the first queue's 1 GPU-second.
        assert wait_until(lambda: c.job(long.job_id).telemetry is not None, 60)
        short = c.submit(request("alice", "-c", "import time; time.sleep(0.3)"))
        done_short = wait_phase(c, short.job_id, JobPhase.FINISHED, timeout_s=60)
        done_long = wait_phase(c, long.job_id, JobPhase.FINISHED, timeout_s=120)
        assert done_long.status.preemptions >= 1 and done_long.process.run >= 2
        assert done_short.status.first_start_s is not None and done_long.status.end_s is not None
        assert done_short.status.first_start_s < done_long.status.end_s  # it really ran in between
        kinds = [e.kind for e in c.events(long.job_id)]
        assert "preempted" in kinds and "checkpointed" in kinds
        exits = [e.detail for e in c.events(long.job_id) if e.kind == "exited"]
        assert "code 75" in exits[0] and "code 0" in exits[-1]
        a, b = torch.load(alone), torch.load(shared)
        assert a.keys() == b.keys()
        assert all(torch.equal(a[k], b[k]) for k in a)
    finally:
        shutdown(c)


def test_telemetry_takes_nvml_figures_over_the_jobs_own_estimates() -> None:
    from corral.core import contract
    from corral.live.agent import JobMeasured
    from corral.live.controller.controller import _telemetry

    report = contract.StepReport(
        job_id="j", run=1, step=5, steps=5, step_time_s=0.1, busy_s=0.05, mem_peak_mib=800, mem_need_mib=2000
    )
    alone = _telemetry(report, 3.0)
    assert (alone.sm_util, alone.mem_peak_mib, alone.mem_need_mib) == (0.5, 800, 2000)
    nvml = _telemetry(report, 3.0, JobMeasured("j", 1, 1300, 0.7))
    assert (nvml.sm_util, nvml.mem_peak_mib, nvml.mem_need_mib) == (0.7, 1300, 2000)
    no_figures = _telemetry(report, 3.0, JobMeasured("j", 1, None, None))
    assert no_figures == alone


def test_the_live_executor_carries_batch_size_decisions(controller: Controller) -> None:
    """IADeep's tuner sets batch sizes of running jobs: the engine refuses that from an executor without
    batch_size_changed, so the live one has it (it sends the job SetBatchSize)."""
    from corral.engine.executor import BatchSizeExecutor

    assert isinstance(controller.executor, BatchSizeExecutor)


def test_an_earlier_run_that_ends_while_no_controller_runs_is_heard_after_the_restart(tmp_path: Path) -> None:
    """A job's run 1 was asked to stop and run 2 launched (a move: Gandiva resuming it elsewhere, a migration),
    then the controller went down before run 2 started, and run 1 completed the job's work meanwhile. After the
    restart, run 1's exit is heard (the store lists it in ``ProcessState.earlier``) and finishes the job: the
    work is not done a second time by a new run."""
    go = tmp_path / "go"
    done = tmp_path / "done"
    script = (
        "import os, sys, time\n"
        f"while not os.path.exists({str(go)!r}): time.sleep(0.02)\n"
        f"open({str(done)!r}, 'a').write('run ' + os.environ['CORRAL_RUN'] + '\\n')\n"
    )
    c = Controller.from_config(_config(tmp_path))
    c.start()
    rec = c.submit(request("alice", "-c", script))
    wait_phase(c, rec.job_id, JobPhase.RUNNING)
    c.stop()  # its process runs on, as after a kill -9
    # What the store holds when the controller went down between launching run 2 and the agent starting it.
    store = Store(tmp_path / "state" / "corral.db")
    held = store.get(rec.job_id)
    assert held is not None
    status = held.status
    status.phase, status.placement, status.preemptions = JobPhase.PENDING, None, 1
    status.queued_since_s = status.last_start_s or 0.0
    store.update(status, dataclasses.replace(held.process, run=2, phase=ProcessPhase.NONE, earlier=[1]))
    store.close()
    go.touch()  # run 1 completes the work with no controller
    assert wait_until(done.exists)
    c = Controller.from_config(_config(tmp_path))
    c.start()
    try:
        finished = wait_phase(c, rec.job_id, JobPhase.FINISHED, JobPhase.FAILED)
        assert finished.phase is JobPhase.FINISHED, c.events(rec.job_id)
        time.sleep(0.3)  # a new run, had one been launched, would have written its line by now
        assert done.read_text() == "run 1\n"
        assert finished.process.earlier == []
    finally:
        shutdown(c)


@pytest.mark.parametrize(
    ("policy", "phase", "asked"),
    [
        ("gandiva:quantum_s=1", ProcessPhase.PAUSED, None),
        ("tiresias:thresholds_gpu_s=1", ProcessPhase.STOPPING, None),
        ("tiresias:thresholds_gpu_s=1", ProcessPhase.STOPPING, "preempt"),  # exit 3 once asked: still failed
    ],
)
def test_a_stopped_run_that_failed_on_its_own_fails_the_job(
    tmp_path: Path, policy: str, phase: ProcessPhase, asked: StopRequest | None
) -> None:
    """A job is suspended (Gandiva) or preempted (Tiresias) in the turn where its run's exit with an error is
    heard (before the agent asked it to stop, or after: an exit code other than 0 and 75 is a failure either way,
    as the contract says) (the chaos runs met both, after restarts: the restart's round decided
    while the adopting agent's report of an exit that happened with no controller waited in the inbox). The job
    failed: it must end FAILED, not be run again."""
    c = Controller.from_config(_config(tmp_path, gpus=1, policy=policy, tenants=(TenantConfig("alice"),), grace_s=30))
    c.start()
    pid = None
    # Ignores SIGTERM: the preemption's own end of the run does not come during the test.
    stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
    try:
        a = c.submit(request("alice", "-c", stubborn))
        wait_phase(c, a.job_id, JobPhase.RUNNING)
        time.sleep(1.2)  # past Tiresias' first queue
        c.submit(request("alice", "-c", "import time; time.sleep(60)"))
        assert wait_until(lambda: c.job(a.job_id).process.phase is phase, 10)
        assert c.job(a.job_id).phase is JobPhase.PENDING
        pid = c.job(a.job_id).process.pid
        c.deliver(ProcessExited(a.job_id, 1, 3, None, asked, "exited with code 3"))  # as had it ended just then
        failed = wait_phase(c, a.job_id, JobPhase.FAILED, JobPhase.RUNNING, JobPhase.FINISHED)
        assert failed.phase is JobPhase.FAILED and "code 3" in (failed.status.reason or ""), c.events(a.job_id)
        assert failed.process.run == 1
    finally:
        shutdown(c)
        if pid is not None:  # a's real process: the controller counts it ended
            with contextlib.suppress(OSError):
                os.killpg(pid, 9)


def test_a_run_asked_to_stop_that_dies_by_sigterm_after_a_restart_did_not_fail() -> None:
    """Found by the chaos test under Tiresias: the controller asked a run to stop (preempted: its process
    stopping, in the store), the agent sent SIGTERM, the job died of it before its handler was in place, and the
    controller was killed before it heard. The new agent reported the death with no stop of its own asked
    (``requested`` None): it was counted a failure ("killed by SIGTERM"). A stop the store says was asked is that
    stop, whichever agent sent it; a signal nobody asked for is still a failure."""
    import signal as signals

    from corral.live.controller.controller import _failed

    died = ProcessExited("j", 1, None, signals.SIGTERM, None, "")
    assert _failed(died)  # nobody asked it to stop
    assert not _failed(died, asked=True)
    killed = ProcessExited("j", 1, None, signals.SIGKILL, None, "")
    assert not _failed(killed, asked=True)  # the grace period's SIGKILL
    segv = ProcessExited("j", 1, None, signals.SIGSEGV, None, "")
    assert _failed(segv, asked=True)  # not a stop: the job crashed
    assert _failed(ProcessExited("j", 1, 3, None, None, ""), asked=True)  # an error code fails, asked or not
