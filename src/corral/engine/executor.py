"""The executor seam: how decisions reach the world.

The engine first commits a decision to :class:`~corral.engine.state.ClusterState` (which checks it), then tells
the executor. The simulator's executor predicts when the job will finish and schedules a ``JobFinished`` event;
the live executor will start and signal real processes and report their exits as the same events.
"""

from __future__ import annotations

from typing import Protocol

from corral.core.events import Event
from corral.core.job import JobStatus


class EventSink(Protocol):
    def schedule(self, time_s: float, event: Event) -> None: ...


class Executor(Protocol):
    def bind(self, sink: EventSink) -> None:
        """Called once by the engine: where to send the events this executor produces."""
        ...

    def launch(self, job: JobStatus, now_s: float) -> None:
        """``job`` was just placed (``job.placement`` is set, phase RUNNING): start it."""
        ...

    def preempt(self, job: JobStatus, now_s: float) -> float:
        """Stop ``job`` (still RUNNING, placement still set) and return its ``work_done_s`` after checkpointing."""
        ...

    def finished(self, job: JobStatus, now_s: float) -> None:
        """``job`` completed and released its GPUs; forget anything held for it."""
        ...
