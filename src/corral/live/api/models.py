"""The API's wire models (pydantic: what a request may hold and what an answer shows, with their limits) and the
conversions of the controller's records into them."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from corral.core.job import FULL_GPU_MILLI, JobPhase
from corral.core.placement import Placement
from corral.core.telemetry import Telemetry
from corral.live.controller.baseline import ObservedTelemetry
from corral.live.records import (
    MAX_COMMAND_ARGS,
    MAX_NAME_CHARS,
    ClusterSnapshot,
    JobRecord,
    TenantSnapshot,
)

if TYPE_CHECKING:
    from corral.sim.forecast import Estimate


DEFAULT_LOG_CHUNK = 64 * 1024
MAX_LOG_CHUNK = 1024 * 1024
DEFAULT_PAGE = 100  # jobs in a page of GET /v1/jobs when no limit is given
MAX_PAGE = 1000  # the most a page may hold: a page is answered in milliseconds whatever the store holds
MAX_ECHO_CHARS = 200  # the most of a caller's input an error message quotes back
MAX_CWD_CHARS = 4096  # PATH_MAX on Linux
MAX_EXPECTED_S = 366 * 86400.0  # the longest expected duration a submission may give: a year

# The values the wire models show, as literals so that the schema lists them (a test keeps them equal to the
# enums in corral.core.job and corral.live.records).
PhaseName = Literal["pending", "running", "finished", "rejected", "failed", "cancelled"]
ProcessPhaseName = Literal["none", "starting", "running", "paused", "stopping"]
JobClassName = Literal["guaranteed", "opportunistic"]


# ==============================================================================================================
# Wire models
# ==============================================================================================================
class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class JobSubmission(_Model):
    """A job to run: a command on ``num_gpus`` GPUs (or a share of one), for a tenant."""

    model_config = ConfigDict(extra="forbid", strict=True)

    command: list[Annotated[str, Field(min_length=1)]] = Field(
        min_length=1,
        max_length=MAX_COMMAND_ARGS,
        description='The program and its arguments, run without a shell, e.g. `["python", "train.py"]`.',
    )
    tenant: str | None = Field(
        None,
        min_length=1,
        max_length=64,
        description="The tenant the job runs for. With a tenant's token: that tenant (the default; another is 403). "
        "With the admin token: required unless the server has a single tenant.",
    )
    num_gpus: int = Field(1, ge=1, description="GPUs the job needs, all at once (a gang).")
    gpu_milli: int = Field(
        FULL_GPU_MILLI,
        ge=1,
        le=FULL_GPU_MILLI,
        description="Share of each GPU in milli-GPU (1000 = a whole GPU); below 1000 needs `num_gpus` = 1.",
    )
    opportunistic: bool = Field(
        False,
        description="Run on spare GPU memory and cycles outside the tenant's quota (AntMan): may be shrunk, paused "
        "or preempted whenever a guaranteed job needs the GPU.",
    )
    name: str | None = Field(None, max_length=MAX_NAME_CHARS, description="A name to show in listings.")
    cwd: str | None = Field(
        None,
        min_length=1,
        max_length=MAX_CWD_CHARS,
        description="Absolute working directory on the server's machine (default: the server's own).",
    )
    env: dict[str, str] = Field(
        default_factory=dict, description="Environment variables added to the job's (CORRAL_* ones are reserved)."
    )
    gpu_mem_mib: int | None = Field(None, ge=0, description="GPU memory the job needs on each GPU, in MiB, if known.")
    priority: int = Field(0, ge=-1_000_000, le=1_000_000, description="Higher runs first under priority policies.")
    expected_duration_s: float | None = Field(
        None,
        gt=0,
        le=MAX_EXPECTED_S,
        description="How long the job is expected to run, in seconds, if known: the start-time estimates of the jobs "
        "behind it use it (docs/live.md, 'Estimated start times'); nothing stops the job when it runs longer.",
    )
    warm: bool = Field(
        False,
        description="Start it from the node's warm workers (torch already imported; docs/live.md, 'Warm starts'). "
        "The command must be PYTHON [-u] SCRIPT ... or PYTHON [-u] -m MODULE ...; a node without warm workers, or "
        "with another Python, starts it cold and says so in its log.",
    )

    @field_validator("cwd")
    @classmethod
    def _absolute(cls, cwd: str | None) -> str | None:
        # A field validator, not the model's: the error then names the field.
        if cwd is not None and not os.path.isabs(cwd):
            raise ValueError(f"cwd must be an absolute path on the server, got {echo(cwd)}")
        return cwd

    @model_validator(mode="after")
    def _warm_needs_a_python_command(self) -> JobSubmission:
        if self.warm:
            from corral.live.agent.zygote import warm_argv

            form = warm_argv(self.command)
            if isinstance(form, str):
                raise ValueError(f"warm: {form}")
        return self

    @model_validator(mode="after")
    def _share_needs_one_gpu(self) -> JobSubmission:
        if self.num_gpus > 1 and self.gpu_milli != FULL_GPU_MILLI:
            raise ValueError("a fractional GPU share (gpu_milli < 1000) needs num_gpus == 1")
        return self


class PlacementOut(_Model):
    """Where a job runs."""

    gpus: list[int] = Field(description="The GPUs (as CUDA/NVML numbers them on the server's machine).")
    gpu_milli: int = Field(description="Share of each GPU, milli-GPU; for an opportunistic job, its compute cap.")
    mem_mib: int | None = Field(description="GPU memory given on each GPU (MiB), if set.")
    opportunistic: bool = Field(description="On spare resources (preemptible at any time).")


class ProcessOut(_Model):
    """The process of the job's latest run."""

    run: int = Field(description="Run number (CORRAL_RUN): 1 for the first start, one more for each restart.")
    phase: ProcessPhaseName = Field(description="none, starting, running, paused or stopping.")
    pid: int | None = Field(description="Its process id on the server's machine.")
    exit_code: int | None = Field(description="Exit status of the last run that ended, if it exited.")
    exit_signal: int | None = Field(description="Signal that killed the last run that ended, if any.")
    stopping_for: str | None = Field(description="'preempt' or 'cancel' while stopping.")


class TelemetryOut(_Model):
    """The job's latest step report."""

    time_s: float = Field(description="When it was received (Unix seconds).")
    step_time_s: float = Field(description="Recent mini-batch time, seconds.")
    solo_step_time_s: float | None = Field(description="Mini-batch time alone on the same GPUs, if the job reports it.")
    mem_peak_mib: int = Field(description="Peak GPU memory in a mini-batch, MiB.")
    mem_mean_mib: int = Field(description="Mean GPU memory over a mini-batch, MiB.")
    mem_need_mib: int = Field(description="Peak the job would reach with no memory cap, MiB.")
    sm_util: float = Field(description="Fraction of time the job kept the GPU busy, 0..1.")
    baseline_step_time_s: float | None = Field(
        description="Its mini-batch time alone on these GPUs: the solo time it reports, else the one the controller "
        "measured (the median of its latest step reports made while no other job ran on its GPUs, for this run, "
        "placement, share and batch size). Null until known."
    )
    baseline_reports: int = Field(
        description="How many step reports made alone the measured baseline is the median of (0: reported, or none)."
    )
    slowdown: float | None = Field(
        description="step_time_s / baseline_step_time_s (1.0: as fast as alone); null while there is no baseline."
    )


class EstimateOut(_Model):
    """When a pending job is expected to start, from the latest forecast of the queue (docs/live.md, "Estimated
    start times"): a replay of the cluster's state under the server's policy, assuming no new submissions."""

    start_s: float | None = Field(description="The estimate (Unix seconds); null: not within the forecast's horizon.")
    earliest_s: float | None = Field(description="The earliest of the forecast's duration scenarios.")
    latest_s: float | None = Field(description="The latest of them; null: some scenario did not see it start.")
    made_s: float = Field(description="When the forecast was made (Unix seconds).")


class TestStartOut(_Model):
    """Where and when a job would start if it were submitted now (nothing is submitted)."""

    start_s: float | None = Field(description="The estimate (Unix seconds); null: not within the forecast's horizon.")
    earliest_s: float | None = Field(description="The earliest of the forecast's duration scenarios.")
    latest_s: float | None = Field(description="The latest of them; null: some scenario did not see it start.")
    made_s: float = Field(description="When the forecast was made (Unix seconds).")
    gpus: list[int] = Field(description="The GPUs it would start on (empty: not within the horizon).")
    nodes: list[str] = Field(description="Their nodes.")


class EstimatesOut(_Model):
    """The latest forecast of the queue's start times (null fields: none made yet)."""

    made_s: float | None = Field(description="When it was made (Unix seconds).")
    took_s: float | None = Field(description="Its wall time, seconds (off the scheduling loop).")
    runs: int | None = Field(description="Replays it took: 1 when every duration was known, else 3.")
    interval_s: float = Field(description="How often the server makes one (0: only on request).")
    pending: int | None = Field(description="Pending jobs it estimated (the admin's view only).")
    known: int | None = Field(description="Jobs whose remaining time was known (the admin's view only).")
    learned: int | None = Field(description="... learned from the jobs that finished here (the admin's only).")
    assumed: int | None = Field(description="... assumed, with too few finished jobs (the admin's only).")
    cut_short: bool | None = Field(description="A replay hit its wall-time limit; late estimates are missing.")


class WhatifIn(_Model):
    """Another policy to try on the current queue."""

    policy: str = Field(min_length=1, max_length=1024, description="NAME[:key=value,...], as `corral serve --policy`.")


class TenantMoveOut(_Model):
    """A tenant's pending jobs under the server's policy and under the other one."""

    tenant: str | None = Field(description="The tenant (null: every tenant together).")
    pending: int = Field(description="Its pending jobs.")
    wait_now_s: float | None = Field(description="Their median wait from now under the server's policy, seconds.")
    wait_other_s: float | None = Field(description="The same under the other policy.")
    earlier: int = Field(description="Jobs that would start earlier under the other policy.")
    later: int = Field(description="Jobs that would start later.")


class WhatifOut(_Model):
    """How the queue's start times would move if the server switched policies now (no new submissions assumed)."""

    policy: str = Field(description="The server's policy.")
    other: str = Field(description="The policy tried.")
    made_s: float = Field(description="When the forecasts were made (Unix seconds).")
    took_s: float = Field(description="Both forecasts' wall time, seconds.")
    tenants: list[TenantMoveOut] = Field(description="Per tenant, then every tenant together (several tenants).")


class AccuracyOut(_Model):
    """Estimates of first starts against the real starts, in seconds (null: no job to judge yet)."""

    jobs: int = Field(description="Jobs that were estimated while pending and have started since.")
    first_median_s: float | None = Field(description="Median |estimate - start| of each job's first estimate.")
    first_p90_s: float | None = Field(description="Its 90th percentile.")
    last_median_s: float | None = Field(description="Median |estimate - start| of each job's latest estimate.")
    last_p90_s: float | None = Field(description="Its 90th percentile.")
    last_bias_s: float | None = Field(description="Mean of estimate - start (latest estimates): > 0, too late.")
    within: float | None = Field(description="Share of latest estimates whose range held the real start.")


class JobOut(_Model):
    """A job: what was submitted and where it stands."""

    job_id: str = Field(description="The job's id: opaque, it says nothing about other jobs.")
    name: str | None = Field(description="The name given at submission.")
    tenant: str = Field(description="The tenant it runs for.")
    command: list[str] = Field(description="The program and its arguments.")
    cwd: str = Field(description="Working directory.")
    env: dict[str, str] = Field(description="Environment variables given at submission.")
    num_gpus: int = Field(description="GPUs asked for.")
    gpu_milli: int = Field(description="Share of each GPU asked for, milli-GPU.")
    opportunistic: bool = Field(description="Submitted as opportunistic.")
    job_class: JobClassName = Field(
        description="guaranteed or opportunistic (an opportunistic job may have been upgraded)."
    )
    gpu_mem_mib: int | None = Field(description="GPU memory needed per GPU, MiB, if given.")
    priority: int = Field(description="Priority given at submission.")
    warm: bool = Field(description="Asked to start from the warm workers.")
    phase: PhaseName = Field(description="pending, running, finished, failed, cancelled or rejected.")
    reason: str | None = Field(description="Why it ended (failed, rejected, cancelled), when known.")
    wait_reason: str | None = Field(
        default=None,
        description="Why it still waits (pending jobs), from the last scheduling round that examined it, e.g. "
        "'tenant vision at quota 16/16 GPUs' or 'waiting for 8 GPUs on one node (largest free: 6)'.",
    )
    estimated_start: EstimateOut | None = Field(
        default=None, description="When it is expected to start (pending jobs, once a forecast has been made)."
    )
    expected_duration_s: float | None = Field(default=None, description="The duration given at submission.")
    placement: PlacementOut | None = Field(description="Where it runs now (running jobs only).")
    submit_s: float = Field(description="When it was submitted (Unix seconds).")
    first_start_s: float | None = Field(description="When it first started (Unix seconds).")
    last_start_s: float | None = Field(description="When its current (or last) run started (Unix seconds).")
    end_s: float | None = Field(description="When it ended (Unix seconds).")
    queued_s: float = Field(
        description="Seconds spent waiting, across preemptions. While it is pending: the waits before the current "
        "one (add now - queued_since_s)."
    )
    queued_since_s: float | None = Field(
        default=None,
        description="When its current wait began (Unix seconds): its submission, or its last preemption or requeue. "
        "Pending jobs only (null otherwise).",
    )
    suspended_on: list[str] | None = Field(
        default=None,
        description="A pending job suspended to host memory (its state kept there, not checkpointed away): the "
        "nodes that hold its state, where it resumes cheaply. Null otherwise.",
    )
    executed_s: float = Field(
        description="Seconds it held GPUs in its runs before the current one (add now - last_start_s while it runs)."
    )
    preemptions: int = Field(description="Times it was preempted (or suspended).")
    run_epoch: int = Field(description="Times the scheduler launched it.")
    process: ProcessOut = Field(description="The process of its latest run.")
    telemetry: TelemetryOut | None = Field(description="Its latest step report while it runs.")


class JobList(_Model):
    """One page of the jobs that match, in submission order (or newest first)."""

    jobs: list[JobOut] = Field(description="This page's jobs.")
    total: int = Field(description="How many jobs match, on every page together.")
    next_cursor: str | None = Field(
        description="Pass it as `cursor` (with the same `order`) for the next page; null on the last page."
    )


class EventOut(_Model):
    """One line of a job's history."""

    time_s: float = Field(description="When (Unix seconds).")
    kind: str = Field(description="What happened: submitted, started, preempted, exited, finished, ...")
    detail: str = Field(description="More words about it.")


class EventList(_Model):
    """A job's history, oldest first."""

    job_id: str = Field(description="The job.")
    events: list[EventOut] = Field(description="Its events in order.")


class FeedEventOut(_Model):
    """One job event in the feed of every job's events."""

    position: int = Field(description="Its place in the feed (with a tenant's token, in that tenant's feed).")
    time_s: float = Field(description="When (Unix seconds).")
    job_id: str = Field(description="The job.")
    kind: str = Field(description="What happened: submitted, launched, preempted, resized, finished, ...")
    detail: str = Field(description="More words about it.")


class EventFeed(_Model):
    """Events of every job (a tenant's token: its own jobs'), oldest first, after a position."""

    events: list[FeedEventOut] = Field(description="The events, in the order they happened.")
    next_after: int = Field(description="Pass as `after` to get the events that come next (or none yet).")


class LogChunk(_Model):
    """Part of a job's output (stdout and stderr together), from byte ``offset``."""

    job_id: str = Field(description="The job.")
    offset: int = Field(description="Byte offset this chunk starts at.")
    next_offset: int = Field(description="Offset to ask for next (a chunk never splits a UTF-8 character).")
    text: str = Field(description="The output (UTF-8; undecodable bytes replaced).")
    size: int = Field(description="The log file's size now, bytes (0 before the job started).")
    complete: bool = Field(description="True once the job has ended and this chunk reaches the end of its log.")


class GpuJobOut(_Model):
    """A job on a GPU. With a tenant's token, only that tenant's jobs are listed."""

    job_id: str = Field(description="The job.")
    tenant: str = Field(description="Its tenant.")
    gpu_milli: int = Field(description="Its share of the GPU (milli-GPU); for an opportunistic job, its cap.")
    opportunistic: bool = Field(description="On spare resources.")


class GpuOut(_Model):
    """One GPU."""

    index: int = Field(description="CUDA/NVML index on its node.")
    node: str = Field(description="The node it is on.")
    type_name: str = Field(description="GPU type (e.g. H100-80GB), or 'stand-in'.")
    mem_mib: int = Field(description="Its memory, MiB.")
    stand_in: bool = Field(description="A stand-in declared with `corral serve --gpus N`: jobs run on the CPU.")
    allocated_milli: int = Field(
        description="Share given to ordinary (guaranteed or whole-GPU) placements, whoever's they are."
    )
    busy: bool = Field(description="Some job runs on it, listed or not (another tenant's is not listed).")
    jobs: list[GpuJobOut] = Field(description="Jobs on it (with a tenant's token: that tenant's only).")
    sm_util: float | None = Field(
        description="Measured busy fraction 0..1, if measured (with a tenant's token: only on a GPU that runs "
        "that tenant's jobs alone)."
    )
    mem_used_mib: int | None = Field(
        description="Memory in use, MiB, if known (with a tenant's token: as for sm_util)."
    )


class NodeOut(_Model):
    """One node."""

    name: str = Field(description="The node (with Ray: its corral.node label, else node-<Ray node id>).")
    state: Literal["alive", "lost"] = Field(description="lost: its agent or machine is gone, its GPUs unused.")
    num_gpus: int = Field(description="Its GPUs.")


class ClusterOut(_Model):
    """The cluster as the scheduler sees it."""

    policy: str = Field(description="The scheduling policy and its options.")
    num_gpus: int = Field(description="GPUs in the cluster.")
    allocated_gpus: float = Field(description="GPUs given out to ordinary placements (fractional shares add up).")
    pending: int = Field(description="Jobs waiting (with a tenant's token: that tenant's).")
    running: int = Field(description="Jobs running (with a tenant's token: that tenant's).")
    gpus: list[GpuOut] = Field(description="Every GPU.")
    nodes: list[NodeOut] = Field(description="Every node, alive or lost.")


class TenantOut(_Model):
    """A tenant's quota and what it holds now."""

    name: str = Field(description="The tenant.")
    quota_gpus: int | None = Field(description="Guaranteed GPUs (null: no promise and no cap).")
    guaranteed_gpus: float = Field(description="GPUs its guaranteed jobs hold (counted against the quota).")
    opportunistic_gpus: float = Field(description="GPU shares its opportunistic jobs are capped at.")
    running: int = Field(description="Its running jobs.")
    pending: int = Field(description="Its waiting jobs.")


class TenantList(_Model):
    """Tenants (with a tenant's token, only its own)."""

    tenants: list[TenantOut] = Field(description="The tenants.")


class Health(_Model):
    """The server is up."""

    status: Literal["ok"] = Field(description="Always 'ok'.")
    version: str = Field(description="corral's version.")


class ErrorOut(_Model):
    """An error: the request changed nothing."""

    detail: str = Field(description="What was wrong, in words.")


# ==============================================================================================================
# Conversions
# ==============================================================================================================
def _placement_out(p: Placement | None, order: Sequence[int] | None) -> PlacementOut | None:
    if p is None:
        return None
    gpus = [order[g] if order is not None and 0 <= g < len(order) else g for g in p.gpus]
    return PlacementOut(gpus=gpus, gpu_milli=p.gpu_milli, mem_mib=p.mem_mib, opportunistic=p.opportunistic)


def estimate_out(e: Estimate) -> EstimateOut:
    return EstimateOut(start_s=e.start_s, earliest_s=e.earliest_s, latest_s=e.latest_s, made_s=e.made_s)


def baseline_of(tel: Telemetry) -> float | None:
    """A job's step time alone: the solo time it reports, else the controller's measured baseline (what its
    ``slowdown`` divides by; see :mod:`corral.live.controller.baseline`)."""
    if isinstance(tel, ObservedTelemetry):
        return tel.baseline_step_time_s
    return tel.solo_step_time_s


def job_out(
    record: JobRecord, order: Sequence[int] | None = None, node_of: Callable[[int], str] | None = None
) -> JobOut:
    """The API's view of ``record``. ``order`` maps the engine's GPU numbers to the agents' (NVML indices);
    ``node_of`` names the node of an engine GPU (for a suspended job's state)."""
    req, st, proc, tel = record.request, record.status, record.process, record.telemetry
    held = st.suspended_from if st.phase is JobPhase.PENDING else None
    suspended_on = None
    if held is not None and node_of is not None:
        suspended_on = sorted({node_of(g) for g in held.gpus})
    return JobOut(
        job_id=record.job_id,
        name=req.name,
        tenant=req.tenant,
        command=list(req.command),
        cwd=req.cwd,
        env=dict(req.env),
        num_gpus=req.num_gpus,
        gpu_milli=req.gpu_milli,
        opportunistic=req.opportunistic,
        job_class=st.job_class.value,
        gpu_mem_mib=req.gpu_mem_mib,
        priority=req.priority,
        warm=req.warm,
        phase=st.phase.value,
        reason=st.reason,
        wait_reason=record.wait_reason,
        estimated_start=None if record.estimate is None else estimate_out(record.estimate),
        expected_duration_s=req.expected_duration_s,
        placement=_placement_out(st.placement, order),
        submit_s=st.spec.submit_s,
        first_start_s=st.first_start_s,
        last_start_s=st.last_start_s,
        end_s=st.end_s,
        queued_s=st.queued_s,
        queued_since_s=st.queued_since_s if st.phase is JobPhase.PENDING else None,
        suspended_on=suspended_on,
        executed_s=st.executed_s,
        preemptions=st.preemptions,
        run_epoch=st.run_epoch,
        process=ProcessOut(
            run=proc.run,
            phase=proc.phase.value,
            pid=proc.pid,
            exit_code=proc.exit_code,
            exit_signal=proc.exit_signal,
            stopping_for=proc.stopping_for,
        ),
        telemetry=None
        if tel is None
        else TelemetryOut(
            time_s=tel.time_s,
            step_time_s=tel.step_time_s,
            solo_step_time_s=tel.solo_step_time_s,
            mem_peak_mib=tel.mem_peak_mib,
            mem_mean_mib=tel.mem_mean_mib,
            mem_need_mib=tel.mem_need_mib,
            sm_util=tel.sm_util,
            baseline_step_time_s=baseline_of(tel),
            baseline_reports=tel.baseline_reports if isinstance(tel, ObservedTelemetry) else 0,
            slowdown=tel.slowdown,
        ),
    )


def cluster_out(snap: ClusterSnapshot, viewer: str | None) -> ClusterOut:
    """``viewer``: the tenant whose token asks (``None``: the admin, who sees every job).

    A tenant sees every GPU, whether it is busy and how much of it is given out (what it needs to understand why
    its jobs wait), and its own jobs; not another tenant's jobs, ids, names, shares or counts, nor the measured
    use of a GPU it shares with one (that would be the other job's telemetry). See docs/live.md."""
    gpus = []
    for g in snap.gpus:
        mine = [j for j in g.jobs if viewer is None or j.tenant == viewer]
        alone = len(mine) == len(g.jobs)  # nothing of another tenant's on it
        gpus.append(
            GpuOut(
                index=g.index,
                node=g.node,
                type_name=g.type_name,
                mem_mib=g.mem_mib,
                stand_in=g.stand_in,
                allocated_milli=g.allocated_milli,
                busy=bool(g.jobs),
                jobs=[
                    GpuJobOut(job_id=j.job_id, tenant=j.tenant, gpu_milli=j.gpu_milli, opportunistic=j.opportunistic)
                    for j in mine
                ],
                sm_util=g.sm_util if alone else None,
                mem_used_mib=g.mem_used_mib if alone else None,
            )
        )
    if viewer is None:
        pending, running = snap.pending, snap.running
    else:
        pending, running = snap.pending_by_tenant.get(viewer, 0), snap.running_by_tenant.get(viewer, 0)
    return ClusterOut(
        policy=snap.policy,
        num_gpus=snap.num_gpus,
        allocated_gpus=snap.allocated_gpus,
        pending=pending,
        running=running,
        gpus=gpus,
        nodes=[NodeOut(name=n.name, state=n.state, num_gpus=n.num_gpus) for n in snap.nodes],  # type: ignore[arg-type]
    )


def tenant_out(t: TenantSnapshot) -> TenantOut:
    return TenantOut(
        name=t.name,
        quota_gpus=t.quota_gpus,
        guaranteed_gpus=t.guaranteed_gpus,
        opportunistic_gpus=t.opportunistic_gpus,
        running=t.running,
        pending=t.pending,
    )


def utf8_cut(data: bytes) -> int:
    """How many leading bytes of ``data`` end on a UTF-8 character boundary (so a chunk never splits one)."""
    n = len(data)
    for i in range(n - 1, max(n - 4, 0) - 1, -1):
        b = data[i]
        if b & 0xC0 != 0x80:  # ASCII or a lead byte: is its sequence complete?
            need = 1 if b < 0x80 else 2 if b >> 5 == 0b110 else 3 if b >> 4 == 0b1110 else 4 if b >> 3 == 0b11110 else 1
            return n if n - i >= need else i
    return n  # no lead byte in the last four: not UTF-8 anyway; cut nothing


def echo(value: object) -> str:
    """``value`` as an error message quotes it: ``repr``, cut to :data:`MAX_ECHO_CHARS` (a message that sent 10 KB
    back would let a caller make the server's answers, and its clients' screens, as large as the body limit)."""
    shown = repr(value)
    return shown if len(shown) <= MAX_ECHO_CHARS else shown[: MAX_ECHO_CHARS - 4] + "..." + shown[-1]
