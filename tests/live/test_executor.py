"""The live executor's commands when a round and a later round of the same turn act on one job.

The executor queues its agent commands until the turn's writes are committed (``controller._flush``); a launch
request is made then, from the placement the job holds then. A later round of the same turn may have stopped the
run again: it must not be launched, and its end is reported as the agent reports a run stopped before it started.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from builders import job
from corral.core.job import JobPhase
from corral.core.placement import Placement
from corral.core.status import JobStatus
from corral.live.agent import LaunchRequest, ProcessExited
from corral.live.controller.executor import ExecutorLinks, LiveExecutor
from corral.live.records import ProcessPhase, ProcessState


class _Agent:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def launch(self, req: LaunchRequest) -> None:
        self.calls.append(("launch", req.run))

    def preempt(self, job_id: str, run: int) -> None:
        self.calls.append(("preempt", run))

    def cancel(self, job_id: str, run: int) -> None:
        self.calls.append(("cancel", run))


def _executor() -> tuple[LiveExecutor, _Agent, ProcessState, list[Callable[[], object]], list[ProcessExited]]:
    agent, proc = _Agent(), ProcessState()
    commands: list[Callable[[], object]] = []
    reports: list[ProcessExited] = []

    def request(status: JobStatus, run: int) -> LaunchRequest:
        assert status.placement is not None
        return LaunchRequest(
            job_id=status.spec.job_id, run=run, command=("true",), cwd="/", env={}, gpus=(0,), tenant="t"
        )

    links = ExecutorLinks(
        agent=lambda: agent,  # type: ignore[arg-type,return-value]
        process=lambda _job_id: proc,
        command=commands.append,
        note=lambda *_: None,
        launch_request=request,
        set_movable=lambda *_: None,
        report=reports.append,
    )
    return LiveExecutor(links), agent, proc, commands, reports


def test_a_run_stopped_in_the_turn_that_launched_it_is_never_launched() -> None:
    executor, agent, proc, commands, reports = _executor()
    status = JobStatus(spec=job("j"), phase=JobPhase.RUNNING, placement=Placement((0,), 1000), last_start_s=0.0)
    executor.launch(status, 0.0)
    executor.preempt(status, 0.0)  # a later round of the same turn
    status.phase, status.placement = JobPhase.PENDING, None
    for command in commands:  # the turn's flush
        command()
    assert ("launch", 1) not in agent.calls
    assert proc.phase is ProcessPhase.STOPPING
    assert [(r.run, r.requested, r.exit_code, r.signal) for r in reports] == [(1, "preempt", None, None)]


def test_a_run_still_held_at_the_flush_is_launched() -> None:
    executor, agent, _proc, commands, reports = _executor()
    status = JobStatus(spec=job("j"), phase=JobPhase.RUNNING, placement=Placement((0,), 1000), last_start_s=0.0)
    executor.launch(status, 0.0)
    for command in commands:
        command()
    assert agent.calls == [("launch", 1)] and reports == []
