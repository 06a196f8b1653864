"""The compute-share throttle of the job-side library: a duty cycle at the step boundary.

AntMan (OSDI'20 §3.2, "dynamic computation scaling") limits an opportunistic job's GPU use by making it idle
between mini-batches. corral does the same: after each step of busy time ``b`` (the GPU's own time, measured with
CUDA events by :class:`~corral.job.device.TorchDevice`), a job with share ``s`` (``gpu_milli / 1000``) idles
``b * (1 - s) / s`` seconds, so that busy / (busy + idle) = ``s``. A share of 1 (or none set) costs nothing;
a share of 0 is a pause (the step loop waits for a new share, GPU memory kept), handled by :mod:`corral.job.loop`.

Sleeps overshoot (the OS wakes the thread late) and steps vary, so the throttle keeps a running balance: what it
slept beyond what it owed is taken off the next idle, and a shortfall is added to it. Over a window of steps the
achieved share therefore tracks the target even where single sleeps are imprecise. The balance is dropped when
the share changes, so one share's error never leaks into the next.
"""

from __future__ import annotations

import time
from collections.abc import Callable

FULL_SHARE_MILLI = 1000
_MAX_CREDIT_S = 1.0  # never carry more than this much overslept time forward (a long stall is not a credit)


class DutyCycle:
    """Idle after each step so that busy / (busy + idle) equals the share. ``sleep`` and ``clock`` are seams
    for tests."""

    __slots__ = ("_balance_s", "_clock", "_share", "_sleep", "busy_s", "idle_s")

    def __init__(
        self,
        gpu_milli: int | None = None,
        *,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._sleep = sleep
        self._clock = clock
        self._share = 1.0
        self._balance_s = 0.0  # idle owed (> 0) or slept ahead (< 0)
        self.busy_s = 0.0
        """Busy time of the throttled steps so far."""
        self.idle_s = 0.0
        """Idle time the throttle added so far."""
        self.set_share(gpu_milli)

    @property
    def active(self) -> bool:
        """Whether the throttle idles at all (a share strictly between 0 and 1)."""
        return 0.0 < self._share < 1.0

    @property
    def share(self) -> float:
        return self._share

    def set_share(self, gpu_milli: int | None) -> None:
        """A new share in milli-GPU (``None`` or >= 1000: no throttling; 0: paused, which the loop handles)."""
        share = 1.0 if gpu_milli is None else max(0, min(gpu_milli, FULL_SHARE_MILLI)) / FULL_SHARE_MILLI
        if share != self._share:
            self._share = share
            self._balance_s = 0.0

    def after_step(self, busy_s: float) -> float:
        """The step just done kept the device busy ``busy_s`` seconds: idle as the share says; return the idle
        time actually spent."""
        if not self.active or busy_s <= 0.0:
            return 0.0
        s = self._share
        self.busy_s += busy_s
        owed = self._balance_s + busy_s * (1.0 - s) / s
        if owed <= 0.0:
            self._balance_s = owed
            return 0.0
        t0 = self._clock()
        self._sleep(owed)
        slept = self._clock() - t0
        self.idle_s += slept
        self._balance_s = max(owed - slept, -_MAX_CREDIT_S)
        return slept

    def achieved(self) -> float | None:
        """busy / (busy + idle) over the throttled steps so far, or ``None`` before any."""
        total = self.busy_s + self.idle_s
        return None if total <= 0.0 else self.busy_s / total
