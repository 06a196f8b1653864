"""The event queue: a binary heap keyed ``(time_s, priority, seq)``, the priority of the event's kind from
:data:`corral.core.events.PRIORITY`.

``seq`` is a counter assigned at push time, so events at the same time and priority come out in the order they
went in. That, and never comparing the events themselves, is what makes replays deterministic.
"""

from __future__ import annotations

import heapq

from corral.core.errors import InvariantViolation
from corral.core.events import PRIORITY, Event


class EventQueue:
    """The heap itself (``_heap``: entries ``(time_s, priority, seq, event)``) is read directly by
    :meth:`corral.engine.loop.Engine.run`, whose inner loop runs once per event."""

    __slots__ = ("_heap", "_seq")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, int, Event]] = []
        self._seq = 0

    def push(self, time_s: float, event: Event) -> None:
        priority = PRIORITY.get(type(event))
        if priority is None:  # not one of corral's events: a bug in whoever scheduled it
            raise InvariantViolation(f"unknown event {event!r}: not one of corral.core.events' kinds")
        self._seq += 1
        heapq.heappush(self._heap, (time_s, priority, self._seq, event))

    def pop(self) -> tuple[float, Event]:
        time_s, _, _, event = heapq.heappop(self._heap)
        return time_s, event

    def peek_time(self) -> float:
        return self._heap[0][0]

    def __len__(self) -> int:
        return len(self._heap)

    def __bool__(self) -> bool:
        return bool(self._heap)
