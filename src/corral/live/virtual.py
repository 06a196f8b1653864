"""A stand-in agent on a virtual clock: jobs "run" for their trace duration without processes.

It lets the live :class:`~corral.live.controller.Controller` (its store, executor, report handling and
recovery) replay a trace in virtual time, so that the parity test can compare its decision log with the
simulator's, event for event (DESIGN, "What must stay true"). Each job progresses at rate 1.0 while it runs: the
simulator agrees when its performance model is neutral (no locality penalty, no restore or resume cost, no
sharing), which is how the parity test configures it.

Every job is movable in the simulator (it keeps its progress wherever it resumes). A live job is movable once its
run says it checkpoints (``Hello(checkpoints=True)``, sent by :mod:`corral.job` with a checkpoint directory); with
``checkpoints=True`` each run the virtual agent starts says so at once, so that policies that move or resume jobs
elsewhere (Gandiva's migrations and time slices) see the jobs as the simulator does.

Reports come out in virtual time: :meth:`VirtualAgent.next_report_s` says when the next one is due and
:meth:`VirtualAgent.reports_due` hands over those due by then; the controller's :meth:`run_virtual` merges them
with the engine's own events.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from corral.core import contract
from corral.core.errors import CorralError
from corral.engine.clock import Clock
from corral.live.agent import AgentReport, JobSaid, LaunchRequest, ProcessExited, ProcessStarted, StopRequest
from corral.live.agent.gpus import GpuInfo
from corral.live.agent.processes import read_chunk


@dataclass(slots=True)
class _Run:
    started_s: float | None  # None while paused
    generation: int


class VirtualAgent:
    """Runs each job for ``durations[job_id]`` seconds of work on ``clock``; with ``checkpoints``, each run says
    hello as a job that checkpoints (see the module docstring)."""

    def __init__(
        self,
        gpus: Sequence[GpuInfo],
        durations: Mapping[str, float],
        clock: Clock,
        log_dir: Path | None = None,
        *,
        checkpoints: bool = False,
    ) -> None:
        self._gpus = tuple(gpus)
        self._checkpoints = checkpoints
        self._durations = durations
        self._clock = clock
        self._log_dir = log_dir or Path("/nonexistent")
        self._done: dict[str, float] = {}
        self._runs: dict[tuple[str, int], _Run] = {}
        self._heap: list[tuple[float, int, int, AgentReport]] = []  # (due, seq, generation, report)
        self._seq = 0

    @property
    def gpus(self) -> tuple[GpuInfo, ...]:
        return self._gpus

    def start(self) -> None:
        pass

    def close(self) -> None:
        pass

    def log_path(self, job_id: str) -> Path:
        return self._log_dir / f"{job_id}.log"

    def read_log(self, job_id: str, offset: int, size: int) -> tuple[bytes, int]:
        return read_chunk(self.log_path(job_id), offset, size)

    # -- reports in virtual time -------------------------------------------------------------------------------
    def next_report_s(self) -> float | None:
        heap = self._heap
        while heap and not self._valid(heap[0]):
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def reports_due(self, now_s: float) -> list[AgentReport]:
        out = []
        heap = self._heap
        while heap and heap[0][0] <= now_s:
            entry = heapq.heappop(heap)
            if self._valid(entry):
                out.append(entry[3])
                if isinstance(entry[3], ProcessExited):
                    self._runs.pop((entry[3].job_id, entry[3].run), None)
        return out

    def _valid(self, entry: tuple[float, int, int, AgentReport]) -> bool:
        report = entry[3]
        if not isinstance(report, ProcessExited) or report.requested is not None:
            return True
        run = self._runs.get((report.job_id, report.run))
        return run is not None and run.generation == entry[2]

    def _report(self, at_s: float, report: AgentReport, generation: int = 0) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (at_s, self._seq, generation, report))

    # -- actions ---------------------------------------------------------------------------------------------
    def launch(self, req: LaunchRequest) -> None:
        now = self._clock.now()
        if req.job_id not in self._durations:
            raise CorralError(f"virtual agent: no duration for job {req.job_id!r}")
        run = self._runs[(req.job_id, req.run)] = _Run(now, 0)
        self._report(now, ProcessStarted(req.job_id, req.run, pid=0, started_at=now))
        if self._checkpoints:
            hello = contract.Hello(req.job_id, req.run, pid=0, checkpoints=True)
            self._report(now, JobSaid(req.job_id, req.run, hello))
        self._schedule_exit(req.job_id, req.run, run, now)

    def _schedule_exit(self, job_id: str, run_no: int, run: _Run, now: float) -> None:
        left = max(0.0, self._durations[job_id] - self._done.get(job_id, 0.0))
        run.generation += 1
        exited = ProcessExited(job_id, run_no, contract.EXIT_FINISHED, None, None, "")
        self._report(now + left, exited, run.generation)

    def _settle(self, job_id: str, run: _Run, now: float) -> None:
        if run.started_s is not None:
            self._done[job_id] = self._done.get(job_id, 0.0) + (now - run.started_s)
            run.started_s = None
        run.generation += 1  # its scheduled exit no longer holds

    def _stop(self, job_id: str, run_no: int, why: StopRequest) -> None:
        run = self._runs.pop((job_id, run_no), None)
        if run is None:
            return
        now = self._clock.now()
        self._settle(job_id, run, now)
        self._report(now, ProcessExited(job_id, run_no, contract.EXIT_PREEMPTED, None, why, ""))

    def preempt(self, job_id: str, run: int) -> None:
        self._stop(job_id, run, "preempt")

    def cancel(self, job_id: str, run: int) -> None:
        self._stop(job_id, run, "cancel")

    def pause(self, job_id: str, run: int, *, evict: bool = False) -> None:
        r = self._runs.get((job_id, run))
        if r is not None:
            self._settle(job_id, r, self._clock.now())

    def resume(self, job_id: str, run: int) -> None:
        r = self._runs.get((job_id, run))
        if r is not None and r.started_s is None:
            now = self._clock.now()
            r.started_s = now
            self._schedule_exit(job_id, run, r, now)

    def send(self, job_id: str, run: int, message: contract.SetBatchSize | contract.SetLimits) -> bool:
        return (job_id, run) in self._runs

    def adopt(self, job_id: str, run: int) -> bool:
        # A run outlives its controller as a real process does: a controller started anew on the same agent
        # (a restart) takes back the runs the agent still has.
        return (job_id, run) in self._runs
