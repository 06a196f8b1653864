"""Decisions: what a policy asks the engine to do. A policy returns them; it never carries them out.

Actions are in the imperative (``Launch``, ``Preempt``, ``Reject``). The engine applies them in order, checking
every invariant, and hands them to the executor (simulated or live).

Composite moves are sequences of these:

- **suspend / resume**: ``Preempt(job, suspend=True)`` keeps the job's state in its node's host memory (Gandiva,
  OSDI'18 §3.1); the job goes back to pending like any preemption, and a later ``Launch`` on the same node(s) is
  its resume (cheap), anywhere else a restore from checkpoint.
- **migration**: ``Preempt(job)`` then ``Launch(job, elsewhere)`` in the same decision (Gandiva §3.2): the job
  pays a checkpoint restore at its new place.
- **packing**: a whole-GPU job launched with ``Placement.gpu_milli`` below 1000 shares its GPUs with another
  packed job (Gandiva §3.1); the engine's state accepts any share in ``1..1000`` for a whole-GPU job.
- **scaling in place**: ``Resize`` changes a running job's compute share or GPU memory without stopping it (AntMan
  §3: the job applies it at its next mini-batch boundary); ``Upgrade`` turns a running opportunistic job into a
  guaranteed one when its tenant's quota has room (AntMan §4).
- **batch size**: ``SetBatchSize`` changes the mini-batch size a job trains with (IADeep, SC'23, tunes co-located
  jobs' batch sizes to lower their interference): a running job applies it at its next mini-batch boundary, a
  pending one starts with it. It changes no allocation: a policy that needs more (or less) GPU memory for the new
  size also issues a ``Resize`` of the job's memory, before the ``SetBatchSize`` when growing and after it when
  shrinking, so the state never over-gives a GPU.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar

from corral.core.placement import Placement


@dataclass(frozen=True, slots=True)
class Launch:
    """Start (or restart, after a preemption) a pending job on exactly these GPUs."""

    job_id: str
    placement: Placement


@dataclass(frozen=True, slots=True)
class Preempt:
    """Stop a running job, checkpointing it; it goes back to pending and keeps its progress.

    With ``suspend``, the job is suspended at a mini-batch boundary and its state stays in the host memory of its
    node(s) (Gandiva's suspend, OSDI'18 §3.1): resuming it there costs far less than a restore elsewhere.

    With ``downgrade``, an opportunistic job that was upgraded to guaranteed goes back to the queue as the
    opportunistic job it was submitted as (AntMan: its tenant's own guaranteed job claims the quota it borrowed)."""

    job_id: str
    reason: str = ""
    suspend: bool = False
    downgrade: bool = False


@dataclass(frozen=True, slots=True)
class Reject:
    """Give up on a job that can never run here; ``reason`` tells the user why."""

    job_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class Resize:
    """Change a running job's share or GPU memory on the GPUs it holds, without restarting it.

    For an opportunistic placement ``gpu_milli`` is its compute-share cap (0 pauses it, memory kept) and
    ``mem_mib`` its memory cap; for an ordinary placement only ``mem_mib`` (its reservation) may change. ``None``
    leaves a field as it is."""

    job_id: str
    gpu_milli: int | None = None
    mem_mib: int | None = None
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Upgrade:
    """Make a running opportunistic job a guaranteed one, holding ``placement`` (an ordinary placement) within its
    tenant's quota from now on. On the same GPUs it keeps running; elsewhere it migrates (a checkpoint restore)."""

    job_id: str
    placement: Placement


@dataclass(frozen=True, slots=True)
class SetBatchSize:
    """Train ``job_id`` (running or pending) with mini-batches of ``batch_size`` samples from its next step on.

    Progress is counted in reference-batch seconds (see :mod:`corral.core.job`), so the new size changes how fast
    the job's work gets done; the simulator re-rates it at once, the live controller tells the job."""

    job_id: str
    batch_size: int
    reason: str = ""


Action = Launch | Preempt | Reject | Resize | Upgrade | SetBatchSize


@dataclass(frozen=True, slots=True)
class Decision:
    """An ordered batch of actions from one scheduling round. Preemptions come before the launches they enable.

    ``waiting`` says, for jobs the round examined and left waiting, why (from the check that refused each: "tenant
    vision at quota 16/16 GPUs", "waiting for 8 GPUs on one node (largest free: 6)"), as Slurm's reason column
    does. Only for the jobs it examined: a round never scans the whole queue to explain it."""

    actions: tuple[Action, ...] = ()
    wake_at_s: float | None = None  # ask the engine to call the policy again at this time (time slices, leases)
    waiting: Mapping[str, str] = field(default_factory=dict)

    NOTHING: ClassVar[Decision]

    def __bool__(self) -> bool:
        return bool(self.actions)

    def __len__(self) -> int:
        return len(self.actions)


Decision.NOTHING = Decision(())
