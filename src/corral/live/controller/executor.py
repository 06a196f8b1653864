"""The executor seam for live mode (:class:`LiveExecutor`): the engine's decisions as actions on a job's process
(start, checkpoint-and-exit, pause, resume, stop, new limits) for the node agents, queued until the controller
has committed the turn's writes (see :mod:`corral.live.controller.controller`). Every change of a process's phase
goes through :mod:`corral.live.controller.lifecycle`.

The executor does not hold the controller: it gets the few things it needs (:class:`ExecutorLinks`)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from corral.core import contract
from corral.core.job import FULL_GPU_MILLI
from corral.core.placement import Placement
from corral.core.status import JobStatus
from corral.live.agent import LaunchRequest, ProcessExited, StopRequest
from corral.live.agent.gpus import GpuInfo
from corral.live.controller import lifecycle
from corral.live.records import (
    ProcessPhase,
    ProcessState,
)

if TYPE_CHECKING:
    pass


log = logging.getLogger("corral.live.controller")


class AgentLike(Protocol):
    """What the controller needs of a node agent (:class:`corral.live.agent.Agent`, or the virtual one)."""

    @property
    def gpus(self) -> tuple[GpuInfo, ...]: ...
    def start(self) -> None: ...
    def close(self) -> None: ...
    def launch(self, req: LaunchRequest) -> None: ...
    def preempt(self, job_id: str, run: int) -> None: ...
    def cancel(self, job_id: str, run: int) -> None: ...
    def pause(self, job_id: str, run: int, *, evict: bool = False) -> None: ...
    def resume(self, job_id: str, run: int) -> None: ...
    def send(self, job_id: str, run: int, message: contract.SetBatchSize | contract.SetLimits) -> bool: ...
    def adopt(self, job_id: str, run: int) -> bool: ...
    def log_path(self, job_id: str) -> Path: ...
    def read_log(self, job_id: str, offset: int, size: int) -> tuple[bytes, int]: ...


@dataclass(frozen=True, slots=True)
class ExecutorLinks:
    """What the executor needs of the controller, and nothing more: the agent (looked up when a command is sent),
    the process table, the turn's command queue and notes, the launch request of a run, and the engine state's
    movability flag."""

    agent: Callable[[], AgentLike]
    process: Callable[[str], ProcessState]
    command: Callable[[Callable[[], object]], None]
    note: Callable[[str, str, str], None]
    launch_request: Callable[[JobStatus, int], LaunchRequest]
    set_movable: Callable[[str, bool], object]
    report: Callable[[ProcessExited], None]  # a report as if from the agent (handled in a later turn)


class LiveExecutor:
    """The executor seam for live mode: the engine's decisions as process actions, queued until the turn's
    writes are committed (see the module docstring)."""

    def __init__(self, links: ExecutorLinks) -> None:
        self._c = links

    def bind(self, sink: Any) -> None:  # reports reach the engine through the controller's inbox instead
        pass

    def launch(self, job: JobStatus, now_s: float) -> None:
        c = self._c
        job_id = job.spec.job_id
        proc = c.process(job_id)
        placement = job.placement
        assert placement is not None
        held = job.suspended_from
        if proc.phase is ProcessPhase.PAUSED and held is not None and held.gpus == placement.gpus:
            lifecycle.move(job_id, proc, ProcessPhase.RUNNING)  # Gandiva's resume in place: same process, same GPUs
            run = proc.run
            c.command(lambda: c.agent().resume(job_id, run))
            c.note(job_id, "resumed", f"run {run} on GPUs {_gpus(placement)}")
            return
        if proc.phase is ProcessPhase.PAUSED:  # resumed elsewhere: the paused process checkpoints and exits first
            old = proc.run
            c.command(lambda: c.agent().preempt(job_id, old))
        if proc.phase is ProcessPhase.PAUSED and not job.movable:
            log.warning(
                "job %s: resumed on other GPUs than it was suspended from, but it does not checkpoint: it starts "
                "again from the beginning (the policy should have waited for its GPUs)",
                job_id,
            )
        # A new run can be moved once it says it checkpoints (its hello), not before.
        c.set_movable(job_id, False)
        run_no = lifecycle.start_run(job_id, proc)  # one still stopping is watched until it exits, across restarts

        def send() -> None:
            # The request is made when the turn's writes are committed, from the placement the job holds then: a
            # later action of the same round (AntMan resizes or upgrades what it just launched) is already in it.
            # A later round of the same turn may have stopped the run again (preempted or cancelled it): it is
            # never launched, and its end is reported as the agent reports a run stopped before it started.
            now = c.process(job_id)
            if job.placement is None or now.run != run_no or now.phase is not ProcessPhase.STARTING:
                cancelled = now.run == run_no and now.stopping_for == "cancel"
                why: StopRequest = "cancel" if cancelled else "preempt"
                c.report(ProcessExited(job_id, run_no, None, None, why, "stopped before it was launched"))
                return
            c.agent().launch(c.launch_request(job, run_no))

        c.command(send)
        c.note(job_id, "launched", f"run {proc.run} on GPUs {_gpus(placement)} at {placement.gpu_milli} milli")

    def preempt(self, job: JobStatus, now_s: float, *, suspend: bool = False) -> float:
        c = self._c
        job_id = job.spec.job_id
        proc = c.process(job_id)
        run = proc.run
        if proc.phase in (ProcessPhase.STARTING, ProcessPhase.RUNNING):
            if suspend:
                # The engine gives the job's GPU memory to others as of now, so the job must give it back too:
                # its state goes to host memory (Gandiva's suspend, OSDI'18 §3.1) until it resumes here.
                lifecycle.move(job_id, proc, ProcessPhase.PAUSED)
                c.command(lambda: c.agent().pause(job_id, run, evict=True))
                c.note(job_id, "suspended", f"run {run} paused, state to host memory")
            else:
                lifecycle.stop(job_id, proc, "preempt")
                c.command(lambda: c.agent().preempt(job_id, run))
                c.note(job_id, "preempted", f"run {run} asked to checkpoint and exit")
        last = job.last_start_s
        # Live jobs have no known duration: progress is measured in time held, as Tiresias' attained service.
        return job.work_done_s + (0.0 if last is None else max(0.0, now_s - last))

    def run_lost(self, job: JobStatus, now_s: float, node: str) -> float:
        """A node of the job's run was lost (:class:`~corral.engine.executor.NodeLossExecutor`): its ranks there
        are gone; those elsewhere are stopped (a gang cannot go on without a rank, nor checkpoint). The job
        restarts from the last checkpoint it wrote itself; what it did is counted, as for a preemption, in time
        held (the controller cannot know which step that checkpoint holds)."""
        c = self._c
        job_id = job.spec.job_id
        proc = c.process(job_id)
        if proc.phase is not ProcessPhase.NONE:
            self.stop_run(job_id, proc)
        c.note(job_id, "node lost", f"node {node} lost; run {proc.run} stopped, requeued from its last checkpoint")
        last = job.last_start_s
        return job.work_done_s + (0.0 if last is None else max(0.0, now_s - last))

    def suspended_lost(self, job: JobStatus, now_s: float, node: str) -> float:
        """A suspended job's paused process was on the lost node: it restarts from its last checkpoint."""
        c = self._c
        job_id = job.spec.job_id
        proc = c.process(job_id)
        if proc.phase is ProcessPhase.PAUSED:
            self.stop_run(job_id, proc)
        c.note(job_id, "node lost", f"node {node} lost with the suspended run {proc.run}")
        return job.work_done_s

    def resized(self, job: JobStatus, now_s: float, before: Placement) -> None:
        c = self._c
        job_id = job.spec.job_id
        after = job.placement
        assert after is not None
        proc = c.process(job_id)
        if after.gpus != before.gpus:  # an upgrade onto other GPUs: a migration through a checkpoint
            old = proc.run
            c.command(lambda: c.agent().preempt(job_id, old))
            self.launch(job, now_s)
            return
        limits = contract.SetLimits(
            gpu_milli=after.gpu_milli if after.opportunistic else FULL_GPU_MILLI,
            mem_mib=after.mem_mib,
        )
        run = proc.run
        c.command(lambda: c.agent().send(job_id, run, limits))
        c.note(job_id, "resized", f"share {limits.gpu_milli} milli, memory {after.mem_mib} MiB")

    def batch_size_changed(self, job: JobStatus, now_s: float, before: int | None) -> None:
        """IADeep's tuner (or any policy) set a running job's batch size: the job's ``on_batch_size`` hook applies
        it at its next boundary (``SetBatchSize``); the size the job then uses comes back in its step reports."""
        c = self._c
        job_id = job.spec.job_id
        size = job.batch_size
        if size is None:
            return  # back to the model's reference size: a live job has none to go back to
        run = c.process(job_id).run
        message = contract.SetBatchSize(size)
        c.command(lambda: c.agent().send(job_id, run, message))
        c.note(job_id, "batch size", f"{before if before is not None else 'default'} -> {size}")

    def finished(self, job: JobStatus, now_s: float) -> None:
        pass  # its process already exited: that is how the engine learnt it finished (or failed)

    def cancel(self, job: JobStatus, now_s: float) -> None:
        job_id = job.spec.job_id
        proc = self._c.process(job_id)
        if proc.phase is not ProcessPhase.NONE:
            self.stop_run(job_id, proc)

    def stop_run(self, job_id: str, proc: ProcessState) -> None:
        """Stop the job's run without a checkpoint (a cancel, or what is left of a run a lost node broke)."""
        c = self._c
        lifecycle.stop(job_id, proc, "cancel")
        run = proc.run
        c.command(lambda: c.agent().cancel(job_id, run))

    def demand_changed(self, job: JobStatus, now_s: float) -> None:
        pass  # only the simulator models demand changes; a real job's demand shows in its telemetry

    def is_current(self, event: object) -> bool:
        return True  # a real exit is real


def _gpus(p: Placement) -> str:
    return ",".join(map(str, p.gpus))
