"""Events: things that happened, named in the past tense. The engine's loop consumes them in order.

Ordering at equal times is by :attr:`priority` (lower first), then by insertion order: a finished job frees its
GPUs before a job submitted at the same instant is considered, so replays do not depend on trace row order.

Node events (:class:`NodeLost`, :class:`NodeJoined`) are the same in both modes: the simulator reads them from
a failure file or draws them (:mod:`corral.sim.failures`), the live controller turns an agent that died or a
node its engine reports gone into them. They come before job events at the same instant, so that a job is
never launched on a node that was lost at that very time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from corral.core.job import JobSpec


@dataclass(frozen=True, slots=True)
class JobFinished:
    """A running job completed its work. ``run_epoch`` ties it to one launch: stale ones are ignored.

    ``after_stop`` (live mode): the run's process completed after the scheduler had asked it to stop, before it
    reached a step boundary; the job is then PENDING (preempted) with this run epoch, and finishes from there."""

    job_id: str
    run_epoch: int
    after_stop: bool = False
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
class JobFailed:
    """A running job's run ended in error (live mode: its process exited non-zero or died of a signal nobody
    sent). ``run_epoch`` ties it to one launch, like :class:`JobFinished`.

    ``after_stop`` (live mode): the run's process failed on its own while the job was suspended (it ended before
    the pause reached it); the job is then PENDING with this run epoch, and fails from there."""

    job_id: str
    run_epoch: int
    reason: str
    after_stop: bool = False
    priority: ClassVar[int] = 0


@dataclass(frozen=True, slots=True)
class JobInterrupted:
    """A running job's run ended without finishing and without failing: its process vanished (the node lost it,
    or it was gone when the controller restarted), or it saved a checkpoint and exited unasked. It goes back to
    the queue with its progress, like a preemption, and restarts from its last checkpoint."""

    job_id: str
    run_epoch: int
    reason: str
    priority: ClassVar[int] = 0


@dataclass(frozen=True, slots=True)
class TelemetryReported:
    """A running job reported what it measured (live mode: its step report, already recorded with
    :meth:`corral.engine.loop.Engine.reported`). Like :class:`DemandChanged` in the simulator, it is news only to a
    policy that reads telemetry, and calls for a round for such a policy alone. ``run_epoch`` ties it to one run."""

    job_id: str
    run_epoch: int
    priority: ClassVar[int] = 0


@dataclass(frozen=True, slots=True)
class JobCancelled:
    """A user cancelled a job (pending or running)."""

    job_id: str
    reason: str = "cancelled"
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


@dataclass(frozen=True, slots=True)
class NodeLost:
    """Node ``node`` (its name, as in the cluster's description) stopped: its GPUs leave the cluster, and every
    job with a GPU there is stopped on all its nodes and requeued from its last checkpoint (see
    :meth:`corral.engine.loop.Engine` and :mod:`corral.engine.state`). ``reason`` says why, in words. A loss of a
    node that is already lost changes nothing (a flapping report)."""

    node: str
    reason: str
    priority: ClassVar[int] = -1


@dataclass(frozen=True, slots=True)
class NodeJoined:
    """Node ``node`` (lost before) is back: its GPUs join the cluster again. A node that is up changes nothing."""

    node: str
    priority: ClassVar[int] = -1


Event = (
    NodeLost
    | NodeJoined
    | JobFinished
    | DemandChanged
    | TelemetryReported
    | JobFailed
    | JobInterrupted
    | JobCancelled
    | JobSubmitted
    | TimerFired
)
