"""The clock seam. The simulator jumps from event to event; the live controller runs on the wall clock.

The engine never reads time any other way, which is what lets the same loop drive both modes.

:class:`Clock` is an interface the two clocks name as their base (a mypyc ``trait``), not a ``Protocol``: the
compiled engine then calls them directly, not through Python's method lookup, at every instant of a replay (issue
20; :mod:`corral.policies.framework.view` says more). A clock of one's own must subclass it in plain Python only: a
compiled trait takes no interpreted subclass.
"""

from __future__ import annotations

import time
from abc import abstractmethod

from mypy_extensions import trait


@trait
class Clock:
    __slots__ = ()

    @abstractmethod
    def now(self) -> float: ...

    @abstractmethod
    def advance_to(self, time_s: float) -> None:
        """Move to ``time_s`` (a virtual clock jumps; a wall clock sleeps until then)."""
        ...


class VirtualClock(Clock):
    """Simulated time: jumps straight to the next event. Time never goes backwards."""

    __slots__ = ("_now",)

    def __init__(self, start_s: float = 0.0) -> None:
        self._now = start_s

    def now(self) -> float:
        return self._now

    def advance_to(self, time_s: float) -> None:
        if time_s < self._now:
            raise ValueError(f"virtual clock cannot go back from {self._now} to {time_s}")
        self._now = time_s


class WallClock(Clock):
    """Real time for the live controller: seconds since the Unix epoch, never going backwards.

    The live loop only runs events that are already due, so :meth:`advance_to` a past time does nothing; a future
    time sleeps until then (a loop that waits on its inbox instead never asks for one)."""

    __slots__ = ("_last",)

    def __init__(self) -> None:
        self._last = 0.0

    def now(self) -> float:
        t = time.time()
        if t < self._last:  # the system clock was set back: hold still rather than reorder events
            return self._last
        self._last = t
        return t

    def advance_to(self, time_s: float) -> None:
        delay = time_s - self.now()
        if delay > 0:
            time.sleep(delay)
