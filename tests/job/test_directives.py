"""The job-side library under an agent: a real Unix socket peer (:class:`AgentPeer`) receives the job's Hello
and step reports and sends it directives; the job's loop runs on a thread as a script's would."""

from __future__ import annotations

import itertools
import os
import threading
import time
from pathlib import Path

from job_agent_peer import AgentPeer, Runner, agent_env, wait_until

from corral.core import contract
from corral.job import CheckpointStore, Job


def endless(job: Job, stop: threading.Event, step_s: float = 0.002) -> Runner:
    """A training loop that steps until ``stop`` is set."""

    def body() -> None:
        for _ in job.loop(itertools.count()):
            if stop.is_set():
                break
            time.sleep(step_s)

    return Runner(body)


def steps_stay(job: Job, for_s: float = 0.15) -> bool:
    before = job.global_step
    time.sleep(for_s)
    return job.global_step == before


def test_hello_then_aggregated_reports(peer: AgentPeer) -> None:
    job = Job(env=agent_env(peer, job_id="j1", run=3), batch_size=16, handle_sigterm=False)

    def body() -> None:
        with job:
            for _ in job.loop(range(60)):
                time.sleep(0.002)

    assert Runner(body).join() == 0
    hello = peer.expect(contract.Hello)
    assert (hello.job_id, hello.run, hello.pid) == ("j1", 3, os.getpid())
    peer.expect(contract.StepReport, lambda r: r.step == 60)  # the final report, sent by close()
    reports = peer.received(contract.StepReport)
    assert len(reports) >= 2
    assert sum(r.steps for r in reports) == 60
    assert [r.step for r in reports] == sorted(r.step for r in reports)
    for r in reports:
        assert (r.job_id, r.run, r.batch_size, r.mem_peak_mib, r.mem_cap_mib) == ("j1", 3, 16, 0, None)
        assert r.step_time_s >= 0.002 and 0 < r.busy_s <= r.step_time_s


def test_a_job_that_knows_its_total_steps_says_how_many_are_left(peer: AgentPeer) -> None:
    job = Job(env=agent_env(peer, job_id="j1", run=1), handle_sigterm=False, total_steps=60)

    def body() -> None:
        with job:
            for _ in job.loop(range(60)):
                time.sleep(0.002)

    assert Runner(body).join() == 0
    peer.expect(contract.StepReport, lambda r: r.step == 60)
    reports = peer.received(contract.StepReport)
    assert [r.steps_left for r in reports] == [60 - r.step for r in reports] and reports[-1].steps_left == 0
    for bad, error in ((-1, ValueError), (2.5, TypeError)):
        try:
            Job(env=agent_env(peer, job_id="j2", run=1), handle_sigterm=False, total_steps=bad)  # type: ignore[arg-type]
        except error:
            continue
        raise AssertionError(f"total_steps={bad!r} was taken")


def test_pause_stops_at_a_boundary_until_resume(peer: AgentPeer) -> None:
    stop = threading.Event()
    job = Job(env=agent_env(peer), handle_sigterm=False)
    runner = endless(job, stop)
    peer.expect(contract.StepReport)
    peer.send(contract.Pause(reason="time slice"))
    paused = peer.expect(contract.Paused)
    assert paused.job_id == "job-1" and job.paused
    assert steps_stay(job)
    assert paused.step == job.global_step
    peer.send(contract.Resume())
    resumed = peer.expect(contract.Resumed)
    assert resumed.step == paused.step and not job.paused
    peer.expect(contract.StepReport, lambda r: r.step > paused.step)
    stop.set()
    assert runner.join() == 0
    job.close()


def test_set_batch_size_calls_the_hook_and_reports_it(peer: AgentPeer) -> None:
    asked: list[int] = []

    def on_batch_size(n: int) -> int | None:
        asked.append(n)
        return None  # applied as asked

    stop = threading.Event()
    job = Job(env=agent_env(peer), batch_size=32, on_batch_size=on_batch_size, handle_sigterm=False)
    runner = endless(job, stop)
    peer.expect(contract.StepReport, lambda r: r.batch_size == 32)
    peer.send(contract.SetBatchSize(batch_size=48))
    peer.expect(contract.StepReport, lambda r: r.batch_size == 48)
    assert asked == [48] and job.batch_size == 48
    stop.set()
    runner.join()
    job.close()


def test_set_limits_records_them_and_a_zero_share_pauses(peer: AgentPeer) -> None:
    stop = threading.Event()
    job = Job(env=agent_env(peer, **{contract.ENV_GPU_MILLI: "1000"}), handle_sigterm=False)
    assert job.gpu_milli == 1000 and job.mem_limit_mib is None
    runner = endless(job, stop)
    peer.expect(contract.StepReport)
    peer.send(contract.SetLimits(gpu_milli=0))
    peer.expect(contract.Paused)
    peer.send(contract.SetLimits(mem_mib=2048))
    peer.send(contract.Resume())  # does not end a pause of a zero share
    assert steps_stay(job)
    assert job.gpu_milli == 0 and job.mem_limit_mib == 2048
    peer.send(contract.SetLimits(gpu_milli=250))
    peer.expect(contract.Resumed)
    peer.expect(contract.StepReport)
    assert job.gpu_milli == 250 and job.mem_limit_mib == 2048
    stop.set()
    runner.join()
    job.close()


def test_checkpoint_directive_saves_and_exits_75(peer: AgentPeer, tmp_path: Path) -> None:
    stop = threading.Event()
    job = Job(env=agent_env(peer, **{contract.ENV_CHECKPOINT_DIR: str(tmp_path)}), handle_sigterm=False)
    runner = endless(job, stop)
    peer.expect(contract.StepReport)
    peer.send(contract.Checkpoint(reason="preempted"))
    done = peer.expect(contract.Checkpointed)
    assert runner.join() == contract.EXIT_PREEMPTED
    assert Path(done.path) == CheckpointStore(tmp_path).latest()
    assert done.step == job.global_step
    assert job.preempt_requested == "preempted"


def test_checkpoint_while_paused(peer: AgentPeer, tmp_path: Path) -> None:
    stop = threading.Event()
    job = Job(env=agent_env(peer, **{contract.ENV_CHECKPOINT_DIR: str(tmp_path)}), handle_sigterm=False)
    runner = endless(job, stop)
    peer.send(contract.Pause())
    paused = peer.expect(contract.Paused)
    peer.send(contract.Checkpoint())
    done = peer.expect(contract.Checkpointed)
    assert runner.join() == contract.EXIT_PREEMPTED
    assert done.step == paused.step == job.global_step
    assert peer.received(contract.Resumed) == []


def test_reconnects_after_the_agent_goes_away(peer: AgentPeer) -> None:
    stop = threading.Event()
    job = Job(env=agent_env(peer), reconnect_s=0.05, handle_sigterm=False)
    runner = endless(job, stop)
    peer.expect(contract.StepReport)
    peer.stop()
    wait_until(lambda: not job.connected)
    at_stop = job.global_step
    wait_until(lambda: job.global_step > at_stop + 10)  # training goes on without the agent
    peer.start()
    peer.wait_connections(2)
    # The second connection is accepted before its Hello is read: wait for the message, not just the socket.
    wait_until(lambda: len(peer.received(contract.Hello)) == 2)
    peer.expect(contract.Hello)
    peer.expect(contract.StepReport)
    peer.send(contract.Pause())  # directives work on the new connection
    peer.expect(contract.Paused)
    peer.send(contract.Resume())
    peer.expect(contract.Resumed)
    stop.set()
    runner.join()
    job.close()


def test_paused_job_says_so_again_after_reconnecting(peer: AgentPeer) -> None:
    stop = threading.Event()
    job = Job(env=agent_env(peer), reconnect_s=0.05, handle_sigterm=False)
    runner = endless(job, stop)
    peer.send(contract.Pause())
    peer.expect(contract.Paused)
    peer.stop()
    peer.start()
    peer.wait_connections(2)
    peer.expect(contract.Hello)
    peer.expect(contract.Paused)
    peer.send(contract.Resume())
    peer.expect(contract.Resumed)
    stop.set()
    runner.join()
    job.close()


def test_agent_started_after_the_job(short_tmp: Path) -> None:
    path = str(short_tmp / "late.sock")
    stop = threading.Event()
    job = Job(env=agent_env(path), reconnect_s=0.05, handle_sigterm=False)
    runner = endless(job, stop)
    wait_until(lambda: job.global_step > 10)
    assert not job.connected
    late = AgentPeer(path)
    try:
        late.expect(contract.Hello)
        late.expect(contract.StepReport)
    finally:
        stop.set()
        runner.join()
        job.close()
        late.stop()


def test_an_agent_that_does_not_read_never_stalls_the_job(short_tmp: Path) -> None:
    import socket

    path = str(short_tmp / "mute.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    env = {contract.ENV_JOB_ID: "j", contract.ENV_AGENT_SOCKET: path, contract.ENV_REPORT_INTERVAL_S: "0"}
    job = Job(env=env, handle_sigterm=False)
    conn, _ = listener.accept()  # accepted, never read: the socket buffers fill up
    try:
        runner = Runner(lambda: [None for _ in job.loop(range(30_000))] and None)
        assert runner.join(timeout=60) == 0
        assert job.global_step == 30_000
        assert job._channel is not None and job._channel.dropped > 0  # reports were dropped, not queued
    finally:
        job.close()
        conn.close()
        listener.close()


def test_malformed_and_unknown_messages_are_skipped(peer: AgentPeer) -> None:
    stop = threading.Event()
    job = Job(env=agent_env(peer), handle_sigterm=False)
    runner = endless(job, stop)
    peer.expect(contract.StepReport)
    peer.send(contract.Pause())
    peer.expect(contract.Paused)
    assert peer._conn is not None
    peer._conn.sendall(b'{"type":"warp"}\nnot json\n' + contract.encode(contract.Resume()))
    peer.expect(contract.Resumed)
    stop.set()
    runner.join()
    job.close()
