"""Decisions: what a policy asks the engine to do. A policy returns them; it never carries them out.

Actions are in the imperative (``Launch``, ``Preempt``, ``Reject``). The engine applies them in order, checking
every invariant, and hands them to the executor (simulated or live). Later issues add ``Suspend``, ``Resume``,
``Migrate``, ``ResizeShare`` and ``SetBatchSize`` here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from corral.core.placement import Placement


@dataclass(frozen=True, slots=True)
class Launch:
    """Start (or restart, after a preemption) a pending job on exactly these GPUs."""

    job_id: str
    placement: Placement


@dataclass(frozen=True, slots=True)
class Preempt:
    """Stop a running job, checkpointing it; it goes back to pending and keeps its progress."""

    job_id: str
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Reject:
    """Give up on a job that can never run here; ``reason`` tells the user why."""

    job_id: str
    reason: str


Action = Launch | Preempt | Reject


@dataclass(frozen=True, slots=True)
class Decision:
    """An ordered batch of actions from one scheduling round. Preemptions come before the launches they enable."""

    actions: tuple[Action, ...] = ()
    wake_at_s: float | None = None  # ask the engine to call the policy again at this time (time slices, leases)

    NOTHING: ClassVar[Decision]

    def __bool__(self) -> bool:
        return bool(self.actions)

    def __len__(self) -> int:
        return len(self.actions)


Decision.NOTHING = Decision(())
