"""AntMan's coordinator in live mode hears every step report, also once every share has settled.

Found on an H100 (docs/measurements.md, co-location phase d): once the opportunistic job's share had reached its
request, the coordinator asked for no more wake-ups, and a step report alone ran no round; the guaranteed job then
ran 1.4x slower for the rest of the run and the coordinator never cut the share. Here the jobs are plain sleeping
processes and their step reports are handed to the controller as its agent would, so that the step times are
exactly the ones the test means (steady ones: no noise, so that each decision needs one report).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_controller import shutdown, wait_phase, wait_until

from corral.core import contract
from corral.core.job import JobPhase
from corral.live.agent.messages import JobReported
from corral.live.config import ServeConfig, TenantConfig
from corral.live.controller import Controller
from corral.live.records import JobRequest, ProcessPhase

INTERVAL_S = 0.2


@pytest.fixture
def controller(tmp_path: Path) -> Iterator[Controller]:
    config = ServeConfig(
        state_dir=tmp_path / "state",
        gpus=1,
        tenants=(TenantConfig("alice", 1), TenantConfig("bob", 0)),
        grace_s=1.0,
        policy=f"antman:max_sm_used=1.0,control_interval_s={INTERVAL_S},start_milli=100",
    )
    c = Controller.from_config(config)
    c.start()
    yield c
    shutdown(c)


def sleeper(c: Controller, tenant: str, *, opportunistic: bool) -> str:
    job_id = c.submit(
        JobRequest(
            command=(sys.executable, "-c", "import time; time.sleep(60)"),
            tenant=tenant,
            cwd=os.getcwd(),
            gpu_mem_mib=1024,
            opportunistic=opportunistic,
        )
    ).job_id
    wait_phase(c, job_id, JobPhase.RUNNING)
    assert wait_until(lambda: c.job(job_id).process.phase is ProcessPhase.RUNNING), c.events(job_id)
    return job_id


class Reporter:
    """Hands the controller a step report of each job in ``steps`` every 50 ms, as a job's library would every
    second (``step`` counts up, so each is a new report)."""

    def __init__(self, c: Controller) -> None:
        self.c = c
        self.steps: dict[str, float] = {}
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        n = 0
        while not self.done.wait(0.05):
            n += 1
            for job_id, step_s in list(self.steps.items()):
                report = contract.StepReport(job_id, 1, 10 * n, 10, step_s, step_s, 1024)
                self.c.deliver(JobReported(job_id, 1, report))

    def stop(self) -> None:
        self.done.set()
        self.thread.join()


def share(c: Controller, job_id: str) -> int:
    placement = c.job(job_id).status.placement
    assert placement is not None and placement.opportunistic
    return placement.gpu_milli


def test_a_slowdown_reported_after_the_shares_settled_cuts_the_guests_share(controller: Controller) -> None:
    c = controller
    reporter = Reporter(c)
    try:
        guaranteed = sleeper(c, "alice", opportunistic=False)
        reporter.steps[guaranteed] = 0.030  # its step time alone: the coordinator's baseline
        assert wait_until(lambda: c.job(guaranteed).telemetry is not None)
        time.sleep(0.5)  # a few reports alone
        guest = sleeper(c, "bob", opportunistic=True)
        assert share(c, guest) == 100
        # Not stepping yet: its share stays where it was launched.
        assert not wait_until(lambda: share(c, guest) != 100, 4 * INTERVAL_S)
        reporter.steps[guest] = 0.040  # its first steps: now it grows, one interval at a time, to its request
        assert wait_until(lambda: share(c, guest) == 1000, 60 * INTERVAL_S), c.events(guest)
        assert not wait_until(lambda: share(c, guest) != 1000, 3 * INTERVAL_S)  # settled: nothing more to change
        reporter.steps[guaranteed] = 0.042  # 1.4x its baseline: the guest's share is what slows it
        assert wait_until(lambda: share(c, guest) < 1000, 2.0), c.events(guest)
        assert share(c, guest) == 500  # halved (AIMD's multiplicative decrease)
    finally:
        reporter.stop()


def test_a_guest_parked_by_a_slowdown_is_probed_again_and_resumes_when_it_passes(controller: Controller) -> None:
    c = controller
    reporter = Reporter(c)
    try:
        guaranteed = sleeper(c, "alice", opportunistic=False)
        reporter.steps[guaranteed] = 0.030
        assert wait_until(lambda: c.job(guaranteed).telemetry is not None)
        time.sleep(0.5)  # a few reports alone: its baseline
        guest = sleeper(c, "bob", opportunistic=True)
        reporter.steps[guest] = 0.040
        reporter.steps[guaranteed] = 0.060  # a burst of its own that outlasts every cut: the guest is parked at 0
        assert wait_until(lambda: share(c, guest) == 0, 40 * INTERVAL_S), c.events(guest)
        parked = time.monotonic()
        reporter.steps[guaranteed] = 0.030  # the burst passes; the ceiling (0) holds until it lapses
        # It lapses 15 control intervals after the last cut: then the guest is probed, and grows again.
        assert wait_until(lambda: share(c, guest) > 0, 15 * INTERVAL_S + 5.0), c.events(guest)
        assert time.monotonic() - parked >= 15 * INTERVAL_S - 1.0  # not before its ceiling lapsed
        assert wait_until(lambda: share(c, guest) == 1000, 60 * INTERVAL_S), c.events(guest)
    finally:
        reporter.stop()
