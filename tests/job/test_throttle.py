"""The compute share's duty cycle (:mod:`corral.job.throttle`): the arithmetic on a fake clock, then the real
thing on CPU steps, through the job's own step loop."""

from __future__ import annotations

import time

import pytest

from corral.core import contract
from corral.job import Job
from corral.job.throttle import DutyCycle


class FakeTime:
    """A clock whose sleeps overshoot by a fixed amount, as a loaded machine's do."""

    def __init__(self, overshoot_s: float = 0.0) -> None:
        self.now = 0.0
        self.overshoot_s = overshoot_s

    def clock(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s + self.overshoot_s


@pytest.mark.parametrize("milli", [100, 250, 500, 900])
def test_idle_makes_busy_over_total_equal_the_share(milli: int) -> None:
    t = FakeTime()
    duty = DutyCycle(milli, sleep=t.sleep, clock=t.clock)
    for busy in [0.01, 0.03, 0.02] * 10:
        duty.after_step(busy)
    assert duty.achieved() == pytest.approx(milli / 1000)


def test_oversleeping_is_taken_off_the_next_idle() -> None:
    t = FakeTime(overshoot_s=0.004)  # every sleep 4 ms late
    duty = DutyCycle(500, sleep=t.sleep, clock=t.clock)
    for _ in range(200):
        duty.after_step(0.010)
    achieved = duty.achieved()
    assert achieved is not None and abs(achieved - 0.5) < 0.01


def test_full_or_no_share_costs_nothing_and_changes_reset_the_balance() -> None:
    t = FakeTime()
    for milli in (None, 1000, 1500, 0):
        duty = DutyCycle(milli, sleep=t.sleep, clock=t.clock)
        assert not duty.active and duty.after_step(1.0) == 0.0
    duty = DutyCycle(500, sleep=t.sleep, clock=t.clock)
    assert duty.active and duty.after_step(0.02) == pytest.approx(0.02)
    duty.set_share(250)
    assert duty.after_step(0.02) == pytest.approx(0.06)
    duty.set_share(1000)
    assert not duty.active


def busy_wait(s: float) -> None:
    end = time.perf_counter() + s
    while time.perf_counter() < end:
        pass


@pytest.mark.parametrize("milli", [250, 500, 750])
def test_a_job_with_a_share_keeps_its_duty_cycle_on_real_cpu_steps(milli: int) -> None:
    """The issue's check: the duty cycle achieves its share within 5% on CPU steps. Measured from outside the
    library: the steps' own time over the loop's whole wall time."""
    job = Job(env={contract.ENV_GPU_MILLI: str(milli)}, verbose=False, handle_sigterm=False)
    assert job.duty_cycle.active
    busy = 0.0
    t0 = time.perf_counter()
    for _ in job.loop(range(60)):
        s0 = time.perf_counter()
        busy_wait(0.004)
        busy += time.perf_counter() - s0
    total = time.perf_counter() - t0
    share = milli / 1000
    assert abs(busy / total - share) / share < 0.05, (busy, total)
    job.close()


def test_set_limits_changes_the_share_at_the_boundary() -> None:
    job = Job(env={}, verbose=False, handle_sigterm=False)
    assert not job.duty_cycle.active
    job._apply(contract.SetLimits(gpu_milli=400))
    assert job.duty_cycle.active and job.duty_cycle.share == 0.4
    job._apply(contract.SetLimits(gpu_milli=1000))
    assert not job.duty_cycle.active
    job.close()
