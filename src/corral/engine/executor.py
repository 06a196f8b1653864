"""The executor seam: how decisions reach the world.

The engine first commits a decision to :class:`~corral.engine.state.ClusterState` (which checks it), then tells
the executor. The simulator's executor predicts when the job will finish and schedules a ``JobFinished`` event;
the live executor will start and signal real processes and report their exits as the same events.

Two reports flow back besides events:

- a completion may be superseded: the simulator re-predicts a job's end whenever its speed changes (a job packed
  beside it starts or stops), so an earlier ``JobFinished`` of the same run becomes stale. The engine asks
  :meth:`Executor.is_current` before acting on one (the live executor answers ``True``: a real exit is real);
- :meth:`EventSink.observe_rate` carries the executor's measure of a running job's progress relative to running
  alone (Gandiva's introspection, OSDI'18 §4.2); the engine records it on the job, where policies read it;
- :meth:`EventSink.report` carries a running job's :class:`~corral.core.telemetry.Telemetry` (mini-batch time,
  memory, SM use): modelled by the simulator, measured by the job and the agent in live mode. AntMan's
  coordinator reads it.

A ``SetBatchSize`` for a running job reaches the executor through :meth:`BatchSizeExecutor.batch_size_changed`.
That method is a separate, optional seam: an executor without it cannot carry out batch-size decisions, and the
engine refuses such a decision (before changing anything) rather than letting the state and the job disagree.
The simulator's executor has it; the live executor sends the job ``contract.SetBatchSize``.

A lost node (``NodeLost``) reaches the executor through :class:`NodeLossExecutor`, another optional seam. For each
job that held a GPU of the node, :meth:`NodeLossExecutor.run_lost`: its processes there are gone, those on its
other nodes must be stopped without waiting for a checkpoint (a gang cannot write one without a rank), and it
returns the progress of the job's last checkpoint, from which it restarts. For each pending job suspended to that
node's host memory, :meth:`NodeLossExecutor.suspended_lost`: that state is gone; it returns the progress the job
restarts from. An executor without the seam is asked :meth:`Executor.preempt` for a lost run (as for a run whose
process vanished, ``JobInterrupted``: what the run achieved), and a suspended job keeps its progress. The simulator's
executor has the seam: a job checkpoints every ``checkpoint_interval_s`` of work (``corral.sim.perf``), and what it
did since its last checkpoint is lost.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from corral.core.events import DemandChanged, Event, JobFinished
from corral.core.placement import Placement
from corral.core.status import JobStatus
from corral.core.telemetry import Telemetry


class EventSink(Protocol):
    def schedule(self, time_s: float, event: Event) -> None: ...

    def observe_rate(self, job_id: str, rate: float) -> None:
        """The running job ``job_id`` now progresses at ``rate`` of its speed alone on the same GPUs."""
        ...

    def report(self, job_id: str, telemetry: Telemetry) -> None:
        """The running job ``job_id`` measured ``telemetry``."""
        ...


class Executor(Protocol):
    def bind(self, sink: EventSink) -> None:
        """Called once by the engine: where to send the events this executor produces."""
        ...

    def launch(self, job: JobStatus, now_s: float) -> None:
        """``job`` was just placed (``job.placement`` is set, phase RUNNING): start it (or resume it, when
        ``job.suspended_from`` says where its state waits in host memory)."""
        ...

    def preempt(self, job: JobStatus, now_s: float, *, suspend: bool = False) -> float:
        """Stop ``job`` (still RUNNING, placement still set) and return its ``work_done_s`` after checkpointing;
        with ``suspend``, keep its state in its node's host memory instead."""
        ...

    def resized(self, job: JobStatus, now_s: float, before: Placement) -> None:
        """``job`` (RUNNING) now holds ``job.placement`` instead of ``before``: a share or memory change in place
        (``Resize``), or an upgrade to guaranteed (``Upgrade``; on other GPUs it is a migration)."""
        ...

    def finished(self, job: JobStatus, now_s: float) -> None:
        """``job`` completed (or failed) and released its GPUs; forget anything held for it."""
        ...

    def cancel(self, job: JobStatus, now_s: float) -> None:
        """A user cancelled the running ``job``: stop it for good (no checkpoint is needed) and forget it."""
        ...

    def demand_changed(self, job: JobStatus, now_s: float) -> None:
        """A ``DemandChanged`` this executor scheduled for the running ``job`` came due (and is current): apply
        it. Only an executor that models demand (the simulator's) schedules these."""
        ...

    def is_current(self, event: JobFinished | DemandChanged) -> bool:
        """Is this completion (of the job's current run) still the executor's word, or was it superseded by a
        later prediction? Only asked for a RUNNING job whose run epoch matches the event."""
        ...


@runtime_checkable
class BatchSizeExecutor(Protocol):
    """An executor that can change a running job's batch size in place (see the module docstring)."""

    def batch_size_changed(self, job: JobStatus, now_s: float, before: int | None) -> None:
        """``job`` (RUNNING) trains with ``job.batch_size`` from now on instead of ``before`` (``None``: its model's
        reference batch size): apply it at the job's next mini-batch boundary."""
        ...


@runtime_checkable
class NodeLossExecutor(Protocol):
    """An executor that knows what a lost node costs the jobs that ran there (see the module docstring)."""

    def run_lost(self, job: JobStatus, now_s: float, node: str) -> float:
        """``job`` (still RUNNING, placement still set) held a GPU of ``node``, which was lost with its processes.
        Stop what runs on its other nodes (no checkpoint), forget the run, and return the ``work_done_s`` of its
        last checkpoint: the job restarts from there."""
        ...

    def suspended_lost(self, job: JobStatus, now_s: float, node: str) -> float:
        """``job`` (PENDING) was suspended with its state in the host memory of ``node``, which was lost. Forget
        what is kept for it there and return the ``work_done_s`` it restarts from (its last checkpoint)."""
        ...
