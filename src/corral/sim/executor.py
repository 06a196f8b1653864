"""The simulated executor: carries decisions out in virtual time, through the performance model.

On launch it predicts the job's completion (restore cost if it is a restart, then remaining work at the
placement's rate) and schedules a ``JobFinished`` event tagged with the launch's epoch. On preemption it works
out how much the job progressed and returns it; the stale completion event is ignored by the engine.
"""

from __future__ import annotations

from corral.core.cluster import Topology
from corral.core.errors import InvariantViolation
from corral.core.events import JobFinished
from corral.core.job import JobStatus
from corral.engine.executor import EventSink
from corral.sim.perf import PerfModel


class SimExecutor:
    __slots__ = ("_runs", "_sink", "perf")

    def __init__(self, topology: Topology, perf: PerfModel | None = None) -> None:
        self.perf = (perf or PerfModel()).bind(topology)
        self._sink: EventSink | None = None
        self._runs: dict[str, tuple[float, float]] = {}  # job -> (time progress starts, rate)

    def bind(self, sink: EventSink) -> None:
        self._sink = sink

    def launch(self, job: JobStatus, now_s: float) -> None:
        spec = job.spec
        placement = job.placement
        if spec.duration_s is None or placement is None or self._sink is None:
            raise InvariantViolation(f"cannot simulate job {spec.job_id!r} without a duration and a placement")
        rate = self.perf.rate(spec, placement)
        start = now_s + (self.perf.model.restore_s if job.preemptions else 0.0)
        self._runs[spec.job_id] = (start, rate)
        remaining = max(0.0, spec.duration_s - job.work_done_s)
        self._sink.schedule(start + remaining / rate, JobFinished(spec.job_id, job.run_epoch))

    def preempt(self, job: JobStatus, now_s: float) -> float:
        start, rate = self._runs.pop(job.spec.job_id)
        done = job.work_done_s + max(0.0, now_s - start) * rate
        duration = job.spec.duration_s
        return done if duration is None else min(done, duration)

    def finished(self, job: JobStatus, now_s: float) -> None:
        self._runs.pop(job.spec.job_id, None)
