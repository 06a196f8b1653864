"""Events: things that happened, named in the past tense. The engine's loop consumes them in order.

Ordering at equal times is by :data:`PRIORITY` (lower first), then by insertion order: a finished job frees its
GPUs before a job submitted at the same instant is considered, so replays do not depend on trace row order.

Node events (:class:`NodeLost`, :class:`NodeJoined`) are the same in both modes: the simulator reads them from
a failure file or draws them (:mod:`corral.sim.failures`), the live controller turns an agent that died or a
node its engine reports gone into them. They come before job events at the same instant, so that a job is
never launched on a node that was lost at that very time.

The compiled core (``setup.py``) compiles these records: the loop makes three events per job of a replay (its
arrival, its demand change, its end), which as interpreted dataclasses took 3.5% of a FIFO replay to make. So each
writes out its ``__init__`` (a frozen dataclass's generated one runs interpreted; tests/core/test_dataclass_inits.py
checks them against the fields), and the priorities are a table, not a class variable on each (compiled, a class
variable of a dataclass becomes one of its fields). Only corral's own code makes events, from checked input.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from corral.core.job import JobSpec


@dataclass(frozen=True, slots=True)
class JobFinished:
    """A running job completed its work. ``run_epoch`` ties it to one launch: stale ones are ignored.

    ``after_stop`` (live mode): the run's process completed after the scheduler had asked it to stop, before it
    reached a step boundary; the job is then PENDING (preempted) with this run epoch, and finishes from there."""

    job_id: str
    run_epoch: int
    after_stop: bool = False

    def __init__(self, job_id: str, run_epoch: int, after_stop: bool = False) -> None:
        object.__setattr__(self, "job_id", job_id)
        object.__setattr__(self, "run_epoch", run_epoch)
        object.__setattr__(self, "after_stop", after_stop)


@dataclass(frozen=True, slots=True)
class DemandChanged:
    """A running job's resource demand (GPU memory, SM use) changed in the middle of its run: the simulator's
    model of a job whose footprint varies over its life. ``run_epoch`` ties it to one launch, like
    :class:`JobFinished`; the executor says whether it is still current."""

    job_id: str
    run_epoch: int

    def __init__(self, job_id: str, run_epoch: int) -> None:
        object.__setattr__(self, "job_id", job_id)
        object.__setattr__(self, "run_epoch", run_epoch)


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

    def __init__(self, job_id: str, run_epoch: int, reason: str, after_stop: bool = False) -> None:
        object.__setattr__(self, "job_id", job_id)
        object.__setattr__(self, "run_epoch", run_epoch)
        object.__setattr__(self, "reason", reason)
        object.__setattr__(self, "after_stop", after_stop)


@dataclass(frozen=True, slots=True)
class JobInterrupted:
    """A running job's run ended without finishing and without failing: its process vanished (the node lost it,
    or it was gone when the controller restarted), or it saved a checkpoint and exited unasked. It goes back to
    the queue with its progress, like a preemption, and restarts from its last checkpoint."""

    job_id: str
    run_epoch: int
    reason: str

    def __init__(self, job_id: str, run_epoch: int, reason: str) -> None:
        object.__setattr__(self, "job_id", job_id)
        object.__setattr__(self, "run_epoch", run_epoch)
        object.__setattr__(self, "reason", reason)


@dataclass(frozen=True, slots=True)
class TelemetryReported:
    """A running job reported what it measured (live mode: its step report, already recorded with
    :meth:`corral.engine.loop.Engine.reported`). Like :class:`DemandChanged` in the simulator, it is news only to a
    policy that reads telemetry, and calls for a round for such a policy alone. ``run_epoch`` ties it to one run."""

    job_id: str
    run_epoch: int

    def __init__(self, job_id: str, run_epoch: int) -> None:
        object.__setattr__(self, "job_id", job_id)
        object.__setattr__(self, "run_epoch", run_epoch)


@dataclass(frozen=True, slots=True)
class JobCancelled:
    """A user cancelled a job (pending or running)."""

    job_id: str
    reason: str = "cancelled"

    def __init__(self, job_id: str, reason: str = "cancelled") -> None:
        object.__setattr__(self, "job_id", job_id)
        object.__setattr__(self, "reason", reason)


@dataclass(frozen=True, slots=True)
class JobSubmitted:
    job: JobSpec

    def __init__(self, job: JobSpec) -> None:
        object.__setattr__(self, "job", job)


@dataclass(frozen=True, slots=True)
class TimerFired:
    """A wake-up a policy asked for (time slices, lease ends, demotion checks)."""

    tag: str

    def __init__(self, tag: str) -> None:
        object.__setattr__(self, "tag", tag)


@dataclass(frozen=True, slots=True)
class NodeLost:
    """Node ``node`` (its name, as in the cluster's description) stopped: its GPUs leave the cluster, and every
    job with a GPU there is stopped on all its nodes and requeued from its last checkpoint (see
    :meth:`corral.engine.loop.Engine` and :mod:`corral.engine.state`). ``reason`` says why, in words. A loss of a
    node that is already lost changes nothing (a flapping report)."""

    node: str
    reason: str

    def __init__(self, node: str, reason: str) -> None:
        object.__setattr__(self, "node", node)
        object.__setattr__(self, "reason", reason)


@dataclass(frozen=True, slots=True)
class NodeJoined:
    """Node ``node`` (lost before) is back: its GPUs join the cluster again. A node that is up changes nothing."""

    node: str

    def __init__(self, node: str) -> None:
        object.__setattr__(self, "node", node)


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

# Ordering at equal times (lower first; see the module docstring): node events before job events, so that no job is
# launched on a node lost at that instant; a job's end before an arrival; a policy's timer last.
PRIORITY: Final[dict[type, int]] = {
    NodeLost: -1,
    NodeJoined: -1,
    JobFinished: 0,
    DemandChanged: 0,
    TelemetryReported: 0,
    JobFailed: 0,
    JobInterrupted: 0,
    JobCancelled: 0,
    JobSubmitted: 1,
    TimerFired: 2,
}
