"""Where a job stands: :class:`JobStatus`, the engine's mutable record of one job (its spec is
:class:`corral.core.job.JobSpec`): the record every engine step reads and writes, compiled in the compiled core
(``setup.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from corral.core.job import JobClass, JobPhase, JobSpec, JobView
from corral.core.placement import Placement
from corral.core.telemetry import Telemetry


@dataclass(slots=True, eq=False)
class JobStatus(JobView):
    """Where a job stands. Only the engine's ``ClusterState`` writes these fields.

    - ``executed_s``: wall-clock seconds the job has held GPUs (Tiresias' attained time; multiply by
      ``num_gpus`` for 2D attained service).
    - ``work_done_s``: progress in units of ``spec.duration_s`` (reference-GPU, consolidated seconds).
    - ``queued_s``: total seconds spent pending, including after preemptions.
    - ``suspended_from``: where the job's last preemption left its state in host memory, if that preemption was
      a suspend (``Preempt(suspend=True)``, Gandiva's suspend at a mini-batch boundary, OSDI'18 §3.1); ``None``
      after an ordinary preemption. Kept until the next preemption: the executor reads it when the job is
      launched again (a resume on the same node(s) is cheap, anywhere else it is a checkpoint restore).
    - ``movable``: whether the job keeps its progress when it is launched elsewhere than it ran or was suspended
      (it resumes from a checkpoint). Always so in simulation, whose executor models checkpoints; live, only once
      the current run said it checkpoints (``corral.job`` with a checkpoint directory): a plain process cannot
      leave its GPUs without starting again. A policy resumes a suspended job that is not movable only on the
      GPUs it was suspended from, and does not migrate one that runs (Gandiva does both).
    - ``observed_rate``: the executor's measure of the current run's progress relative to the same job running
      alone on the same GPUs (1.0 = no interference; below 1.0 when a job packed beside it slows it down), as
      Gandiva's introspection compares mini-batch times (OSDI'18 §4.2). ``None`` while the job is not running.
    - ``batch_size_set``: the batch size the last ``SetBatchSize`` decision chose (``None``: none did; the job
      trains at ``spec.batch_size``). Read it as :attr:`batch_size`. It survives preemption: a job resumes from its
      checkpoint with the batch size it had.
    """

    spec: JobSpec
    phase: JobPhase = JobPhase.PENDING
    placement: Placement | None = None
    first_start_s: float | None = None
    last_start_s: float | None = None
    end_s: float | None = None
    executed_s: float = 0.0
    work_done_s: float = 0.0
    queued_s: float = 0.0
    queued_since_s: float = 0.0
    preemptions: int = 0
    run_epoch: int = 0  # bumped on every launch so stale completion events can be told apart
    reason: str | None = None
    wait_reason: str | None = None  # why the last round that examined it left it waiting
    suspended_from: Placement | None = None
    movable: bool = True
    observed_rate: float | None = None
    upgraded: bool = False
    telemetry: Telemetry | None = None
    batch_size_set: int | None = None

    # Written out (a test checks it against the fields): the compiled core runs a dataclass's generated __init__ as
    # interpreted code, several times slower, and every job makes one (issue 20; setup.py).
    def __init__(
        self,
        spec: JobSpec,
        phase: JobPhase = JobPhase.PENDING,
        placement: Placement | None = None,
        first_start_s: float | None = None,
        last_start_s: float | None = None,
        end_s: float | None = None,
        executed_s: float = 0.0,
        work_done_s: float = 0.0,
        queued_s: float = 0.0,
        queued_since_s: float = 0.0,
        preemptions: int = 0,
        run_epoch: int = 0,
        reason: str | None = None,
        wait_reason: str | None = None,
        suspended_from: Placement | None = None,
        movable: bool = True,
        observed_rate: float | None = None,
        upgraded: bool = False,
        telemetry: Telemetry | None = None,
        batch_size_set: int | None = None,
    ) -> None:
        self.spec = spec
        self.phase = phase
        self.placement = placement
        self.first_start_s = first_start_s
        self.last_start_s = last_start_s
        self.end_s = end_s
        self.executed_s = executed_s
        self.work_done_s = work_done_s
        self.queued_s = queued_s
        self.queued_since_s = queued_since_s
        self.preemptions = preemptions
        self.run_epoch = run_epoch
        self.reason = reason
        self.wait_reason = wait_reason
        self.suspended_from = suspended_from
        self.movable = movable
        self.observed_rate = observed_rate
        self.upgraded = upgraded
        self.telemetry = telemetry
        self.batch_size_set = batch_size_set

    def __reduce__(self) -> tuple[type[JobStatus], tuple[object, ...]]:
        # Copies and pickles (the live controller's forecasts) go through the constructor: a compiled class with a
        # written __init__ cannot be made empty and then filled in (setup.py).
        return type(self), tuple([getattr(self, f.name) for f in fields(self)])

    @property
    def job_id(self) -> str:
        return self.spec.job_id

    @property
    def batch_size(self) -> int | None:
        """The batch size in use: the last one a ``SetBatchSize`` chose, else the spec's (``None``: the model's
        reference batch size)."""
        got = self.batch_size_set
        return self.spec.batch_size if got is None else got

    @property
    def job_class(self) -> JobClass:
        return JobClass.GUARANTEED if self.upgraded else self.spec.job_class

    @property
    def remaining_work_s(self) -> float | None:
        d = self.spec.duration_s
        return None if d is None else max(0.0, d - self.work_done_s)

    @property
    def jct_s(self) -> float | None:
        return None if self.end_s is None else self.end_s - self.spec.submit_s
