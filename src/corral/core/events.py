"""Events: things that happened, named in the past tense. The engine's loop consumes them in order.

Ordering at equal times is by :attr:`priority` (lower first), then by insertion order: a finished job frees its
GPUs before a job submitted at the same instant is considered, so replays do not depend on trace row order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from corral.core.job import JobSpec


@dataclass(frozen=True, slots=True)
class JobFinished:
    """A running job completed its work. ``run_epoch`` ties it to one launch: stale ones are ignored."""

    job_id: str
    run_epoch: int
    priority: ClassVar[int] = 0


@dataclass(frozen=True, slots=True)
class DemandChanged:
    """A running job's resource demand (GPU memory, SM use) changed in the middle of its run: the simulator's
    model of a job whose footprint varies over its life. ``run_epoch`` ties it to one launch, like
    :class:`JobFinished`; the executor says whether it is still current."""

    job_id: str
    run_epoch: int
    priority: ClassVar[int] = 0


@dataclass(frozen=True, slots=True)
class JobSubmitted:
    job: JobSpec
    priority: ClassVar[int] = 1


@dataclass(frozen=True, slots=True)
class TimerFired:
    """A wake-up a policy asked for (time slices, lease ends, demotion checks)."""

    tag: str
    priority: ClassVar[int] = 2


Event = JobFinished | DemandChanged | JobSubmitted | TimerFired
