"""The simulated executor: carries decisions out in virtual time, through the performance model.

On launch it predicts the job's completion (a start-up cost if it is a restart, then remaining work at the
placement's rate) and schedules a ``JobFinished`` event tagged with the launch's epoch. On preemption it works
out how much the job progressed and returns it; the stale completion event is ignored by the engine.

Start-up cost of a restart: ``suspend_resume_s`` when the job was suspended (``Preempt(suspend=True)``) and comes
back on the same set of nodes, whose host memory holds its state; ``restore_s`` otherwise (a checkpoint restore,
as after a migration).

Packed jobs (whole-GPU jobs launched at a share below 1000) slow each other down at the rates of the performance
model's co-location table. Whenever a packed job starts, stops or finishes, every job packed beside it is
re-rated: its progress so far is settled at the old rate and its completion re-predicted at the new one. The
superseded ``JobFinished`` stays in the event queue; :meth:`SimExecutor.is_current` tells the engine to ignore it.
Each new rate is reported to the engine (``EventSink.observe_rate``) as the job's speed relative to running
alone, which is what policies read as the observed rate. Only packed jobs are tracked per GPU, so a replay
without packing pays nothing for this.
"""

from __future__ import annotations

from corral.core.cluster import Topology
from corral.core.errors import InvariantViolation
from corral.core.events import JobFinished
from corral.core.job import JobSpec, JobStatus
from corral.core.placement import Placement
from corral.engine.executor import EventSink
from corral.sim.perf import PerfModel


class _Run:
    """One run of a job: progress is ``done_s`` at ``start_s`` and grows at ``base_rate * factor`` after it."""

    __slots__ = ("base_rate", "done_s", "epoch", "event", "factor", "placement", "spec", "start_s")

    def __init__(self, spec: JobSpec, placement: Placement, epoch: int, start_s: float, done_s: float, rate: float):
        self.spec = spec
        self.placement = placement
        self.epoch = epoch
        self.start_s = start_s
        self.done_s = done_s
        self.base_rate = rate
        self.factor = 1.0
        self.event: JobFinished | None = None

    def settle(self, now_s: float) -> None:
        """Count the progress made up to ``now_s`` (nothing while the start-up cost is still being paid)."""
        if now_s > self.start_s:
            self.done_s += (now_s - self.start_s) * self.base_rate * self.factor
            self.start_s = now_s


class SimExecutor:
    __slots__ = ("_packed", "_runs", "_sink", "perf")

    def __init__(self, topology: Topology, perf: PerfModel | None = None) -> None:
        self.perf = (perf or PerfModel()).bind(topology)
        self._sink: EventSink | None = None
        self._runs: dict[str, _Run] = {}
        self._packed: dict[int, dict[str, None]] = {}  # GPU -> packed jobs on it (only GPUs that have some)

    def bind(self, sink: EventSink) -> None:
        self._sink = sink

    def launch(self, job: JobStatus, now_s: float) -> None:
        spec = job.spec
        placement = job.placement
        sink = self._sink
        if spec.duration_s is None or placement is None or sink is None:
            raise InvariantViolation(f"cannot simulate job {spec.job_id!r} without a duration and a placement")
        start = now_s + self._startup_s(job, placement)
        run = _Run(spec, placement, job.run_epoch, start, job.work_done_s, self.perf.rate(spec, placement))
        self._runs[spec.job_id] = run
        if placement.gpu_milli < spec.gpu_milli:
            for g in placement.gpus:
                self._packed.setdefault(g, {})[spec.job_id] = None
            run.factor = self._factor(run)
            self._predict(run)
            self._rerate(self._partners(run), now_s)
        else:
            self._predict(run)
        sink.observe_rate(spec.job_id, run.factor)

    def _startup_s(self, job: JobStatus, placement: Placement) -> float:
        if not job.preemptions:
            return 0.0
        model = self.perf.model
        held = job.suspended_from
        if held is not None:
            node = self.perf.topo.gpu_node
            if {node[g] for g in held.gpus} == {node[g] for g in placement.gpus}:
                return model.suspend_resume_s
        return model.restore_s

    def preempt(self, job: JobStatus, now_s: float, *, suspend: bool = False) -> float:
        run = self._runs.pop(job.spec.job_id)
        run.settle(now_s)
        self._leave(run, now_s)
        duration = job.spec.duration_s
        return run.done_s if duration is None else min(run.done_s, duration)

    def finished(self, job: JobStatus, now_s: float) -> None:
        run = self._runs.pop(job.spec.job_id, None)
        if run is not None:
            self._leave(run, now_s)

    def is_current(self, event: JobFinished) -> bool:
        run = self._runs.get(event.job_id)
        return run is not None and run.event is event

    # -- internals --------------------------------------------------------------------------------------------
    def _predict(self, run: _Run) -> None:
        """Schedule ``run``'s completion at its current rate (none while the rate is 0: a re-rate will come)."""
        assert self._sink is not None and run.spec.duration_s is not None
        rate = run.base_rate * run.factor
        if rate <= 0:
            run.event = None
            return
        remaining = max(0.0, run.spec.duration_s - run.done_s)
        run.event = JobFinished(run.spec.job_id, run.epoch)
        self._sink.schedule(run.start_s + remaining / rate, run.event)

    def _factor(self, run: _Run) -> float:
        """Speed of a packed run relative to alone: per GPU the product of its pair rates with each partner
        there; the gang goes at its slowest GPU's pace."""
        job_id = run.spec.job_id
        worst = 1.0
        for g in run.placement.gpus:
            here = 1.0
            for other in self._packed.get(g, ()):
                if other != job_id:
                    here *= self.perf.pair_rates(run.spec, self._runs[other].spec, g)[0]
            worst = min(worst, here)
        return worst

    def _partners(self, run: _Run) -> list[str]:
        job_id = run.spec.job_id
        seen: dict[str, None] = {}
        for g in run.placement.gpus:
            for other in self._packed.get(g, ()):
                if other != job_id:
                    seen[other] = None
        return list(seen)

    def _rerate(self, job_ids: list[str], now_s: float) -> None:
        """The jobs packed beside a job that just started or stopped: settle, re-rate, re-predict, report."""
        sink = self._sink
        assert sink is not None
        for other_id in job_ids:
            other = self._runs[other_id]
            factor = self._factor(other)
            if factor != other.factor:
                other.settle(now_s)
                other.factor = factor
                self._predict(other)
                sink.observe_rate(other_id, factor)

    def _leave(self, run: _Run, now_s: float) -> None:
        """``run`` stops holding its GPUs: if it was packed, its partners speed up."""
        if run.placement.gpu_milli >= run.spec.gpu_milli:
            return
        job_id = run.spec.job_id
        partners = self._partners(run)
        for g in run.placement.gpus:
            on = self._packed[g]
            del on[job_id]
            if not on:
                del self._packed[g]
        self._rerate(partners, now_s)
