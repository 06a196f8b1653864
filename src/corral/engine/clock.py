"""The clock seam. The simulator jumps from event to event; the live controller will wait on the wall clock.

The engine never reads time any other way, which is what lets the same loop drive both modes.
"""

from __future__ import annotations

from typing import Protocol


class Clock(Protocol):
    def now(self) -> float: ...

    def advance_to(self, time_s: float) -> None:
        """Move to ``time_s`` (a virtual clock jumps; a wall clock sleeps until then)."""
        ...


class VirtualClock:
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
