"""The HTTP API of ``corral serve`` (FastAPI): submit, list, inspect, follow and cancel jobs; see the cluster and
the tenants. ``create_app(controller)`` builds the app; OpenAPI docs are served at ``/docs`` and
``/openapi.json``.

Routes (all under ``/v1``; every one but ``/v1/health`` needs ``Authorization: Bearer TOKEN``):

==========================  ===========================================================================
``POST /v1/jobs``           submit a job (201, the job)
``GET /v1/jobs``            list jobs (query ``tenant``, ``phase`` (repeatable or comma-separated), ``limit``)
``GET /v1/jobs/{id}``       one job
``GET /v1/jobs/{id}/events`` the job's history
``GET /v1/jobs/{id}/logs``  a chunk of the job's output from byte ``offset`` (for ``corral logs -f``)
``POST /v1/jobs/{id}/cancel`` cancel a pending or running job (409 if it already ended)
``GET /v1/cluster``         the GPUs, who is on each, and the queue
``GET /v1/tenants``         quotas and what each tenant holds
``GET /v1/health``          liveness (no token needed)
==========================  ===========================================================================

Auth: the admin token sees and acts on everything. A tenant's token sees only its own tenant: another tenant's
job answers 404 exactly as a job that does not exist, listings are filtered, submitting for (or listing) another
tenant is 403, and in the cluster view other tenants' jobs show their share but neither id nor tenant. A missing
or unknown token is 401. Tokens are compared in constant time.

Errors are JSON ``{"detail": "..."}`` with a readable message, and change nothing: 400 malformed (a bad
``Content-Length``), 401 no/unknown token, 403 not yours, 404 unknown job or tenant (an unknown tenant in a
submission is 404 too, as the controller answers), 409 the job already ended, 413 a body above
``max_body_bytes`` (enforced before parsing, with or without ``Content-Length``), 422 a body or query that does
not fit the schema or a job that can never run here (more GPUs than the cluster or the quota has). Anything
unexpected is a 500 with no traceback; the server logs it.

Routes are plain ``def``: FastAPI runs them in its thread pool, since the controller's calls may block briefly
on SQLite or on the loop thread.
"""

from __future__ import annotations

import hmac
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from fastapi import Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ConfigDict, Field, model_validator
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from corral import __version__
from corral.core.errors import ConfigError, CorralError, InvariantViolation, JobSpecError
from corral.core.job import FULL_GPU_MILLI, JobPhase
from corral.core.placement import Placement
from corral.live.config import ServeConfig, ensure_admin_token
from corral.live.records import (
    MAX_COMMAND_ARGS,
    MAX_NAME_CHARS,
    BadRequest,
    ClusterSnapshot,
    JobRecord,
    JobRequest,
    ProcessPhase,
    TenantSnapshot,
)

if TYPE_CHECKING:
    from corral.live.controller import Controller

log = logging.getLogger("corral.live.api")

DEFAULT_LOG_CHUNK = 64 * 1024
MAX_LOG_CHUNK = 1024 * 1024
MAX_LIST_LIMIT = 100_000


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
        description="Absolute working directory on the server's machine (default: the server's own).",
    )
    env: dict[str, str] = Field(
        default_factory=dict, description="Environment variables added to the job's (CORRAL_* ones are reserved)."
    )
    gpu_mem_mib: int | None = Field(None, ge=0, description="GPU memory the job needs on each GPU, in MiB, if known.")
    priority: int = Field(0, ge=-1_000_000, le=1_000_000, description="Higher runs first under priority policies.")

    @model_validator(mode="after")
    def _share_needs_one_gpu(self) -> JobSubmission:
        if self.num_gpus > 1 and self.gpu_milli != FULL_GPU_MILLI:
            raise ValueError("a fractional GPU share (gpu_milli < 1000) needs num_gpus == 1")
        if self.cwd is not None and not os.path.isabs(self.cwd):
            raise ValueError(f"cwd must be an absolute path on the server, got {self.cwd!r}")
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
    phase: str = Field(description="none, starting, running, paused or stopping.")
    pid: int | None = Field(description="Its process id on the server's machine.")
    exit_code: int | None = Field(description="Exit status of the last run that ended, if it exited.")
    exit_signal: int | None = Field(description="Signal that killed the last run that ended, if any.")
    stopping_for: str | None = Field(description="'preempt' or 'cancel' while stopping.")


class TelemetryOut(_Model):
    """The job's latest step report."""

    time_s: float = Field(description="When it was received (Unix seconds).")
    step_time_s: float = Field(description="Recent mini-batch time, seconds.")
    solo_step_time_s: float | None = Field(description="Mini-batch time alone on the same GPUs, if known.")
    mem_peak_mib: int = Field(description="Peak GPU memory in a mini-batch, MiB.")
    mem_mean_mib: int = Field(description="Mean GPU memory over a mini-batch, MiB.")
    mem_need_mib: int = Field(description="Peak the job would reach with no memory cap, MiB.")
    sm_util: float = Field(description="Fraction of time the job kept the GPU busy, 0..1.")


class JobOut(_Model):
    """A job: what was submitted and where it stands."""

    job_id: str = Field(description="The job's id.")
    name: str | None = Field(description="The name given at submission.")
    tenant: str = Field(description="The tenant it runs for.")
    command: list[str] = Field(description="The program and its arguments.")
    cwd: str = Field(description="Working directory.")
    env: dict[str, str] = Field(description="Environment variables given at submission.")
    num_gpus: int = Field(description="GPUs asked for.")
    gpu_milli: int = Field(description="Share of each GPU asked for, milli-GPU.")
    opportunistic: bool = Field(description="Submitted as opportunistic.")
    job_class: str = Field(description="guaranteed or opportunistic (an opportunistic job may have been upgraded).")
    gpu_mem_mib: int | None = Field(description="GPU memory needed per GPU, MiB, if given.")
    priority: int = Field(description="Priority given at submission.")
    phase: str = Field(description="pending, running, finished, failed, cancelled or rejected.")
    reason: str | None = Field(description="Why it ended (failed, rejected, cancelled) or waits, when known.")
    placement: PlacementOut | None = Field(description="Where it runs now (running jobs only).")
    submit_s: float = Field(description="When it was submitted (Unix seconds).")
    first_start_s: float | None = Field(description="When it first started (Unix seconds).")
    last_start_s: float | None = Field(description="When its current (or last) run started (Unix seconds).")
    end_s: float | None = Field(description="When it ended (Unix seconds).")
    queued_s: float = Field(description="Seconds spent waiting so far (all waits, across preemptions).")
    executed_s: float = Field(
        description="Seconds it held GPUs in its runs before the current one (add now - last_start_s while it runs)."
    )
    preemptions: int = Field(description="Times it was preempted (or suspended).")
    run_epoch: int = Field(description="Times the scheduler launched it.")
    process: ProcessOut = Field(description="The process of its latest run.")
    telemetry: TelemetryOut | None = Field(description="Its latest step report while it runs.")


class JobList(_Model):
    """Jobs, oldest first."""

    jobs: list[JobOut] = Field(description="The jobs that match, in submission order.")


class EventOut(_Model):
    """One line of a job's history."""

    time_s: float = Field(description="When (Unix seconds).")
    kind: str = Field(description="What happened: submitted, started, preempted, exited, finished, ...")
    detail: str = Field(description="More words about it.")


class EventList(_Model):
    """A job's history, oldest first."""

    job_id: str = Field(description="The job.")
    events: list[EventOut] = Field(description="Its events in order.")


class LogChunk(_Model):
    """Part of a job's output (stdout and stderr together), from byte ``offset``."""

    job_id: str = Field(description="The job.")
    offset: int = Field(description="Byte offset this chunk starts at.")
    next_offset: int = Field(description="Offset to ask for next (a chunk never splits a UTF-8 character).")
    text: str = Field(description="The output (UTF-8; undecodable bytes replaced).")
    size: int = Field(description="The log file's size now, bytes (0 before the job started).")
    complete: bool = Field(description="True once the job has ended and this chunk reaches the end of its log.")


class GpuJobOut(_Model):
    """A job on a GPU. With a tenant's token, another tenant's job shows its share only."""

    job_id: str | None = Field(description="The job (null: another tenant's).")
    tenant: str | None = Field(description="Its tenant (null: another tenant's).")
    gpu_milli: int = Field(description="Its share of the GPU (milli-GPU); for an opportunistic job, its cap.")
    opportunistic: bool = Field(description="On spare resources.")


class GpuOut(_Model):
    """One GPU."""

    index: int = Field(description="CUDA/NVML index on its node.")
    node: str = Field(description="The node it is on.")
    type_name: str = Field(description="GPU type (e.g. H100-80GB), or 'stand-in'.")
    mem_mib: int = Field(description="Its memory, MiB.")
    stand_in: bool = Field(description="A stand-in declared with `corral serve --gpus N`: jobs run on the CPU.")
    allocated_milli: int = Field(description="Share given to ordinary (guaranteed or whole-GPU) placements.")
    jobs: list[GpuJobOut] = Field(description="Jobs on it.")
    sm_util: float | None = Field(description="Measured busy fraction 0..1, if measured.")
    mem_used_mib: int | None = Field(description="Memory in use, MiB, if known.")


class ClusterOut(_Model):
    """The cluster as the scheduler sees it."""

    policy: str = Field(description="The scheduling policy and its options.")
    num_gpus: int = Field(description="GPUs in the cluster.")
    allocated_gpus: float = Field(description="GPUs given out to ordinary placements (fractional shares add up).")
    pending: int = Field(description="Jobs waiting.")
    running: int = Field(description="Jobs running.")
    gpus: list[GpuOut] = Field(description="Every GPU.")


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


def job_out(record: JobRecord, order: Sequence[int] | None = None) -> JobOut:
    req, st, proc, tel = record.request, record.status, record.process, record.telemetry
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
        phase=st.phase.value,
        reason=st.reason,
        placement=_placement_out(st.placement, order),
        submit_s=st.spec.submit_s,
        first_start_s=st.first_start_s,
        last_start_s=st.last_start_s,
        end_s=st.end_s,
        queued_s=st.queued_s,
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
        ),
    )


def cluster_out(snap: ClusterSnapshot, viewer: str | None) -> ClusterOut:
    """``viewer``: the tenant whose token asks (``None``: the admin, who sees every job)."""
    gpus = []
    for g in snap.gpus:
        jobs = [
            GpuJobOut(job_id=j.job_id, tenant=j.tenant, gpu_milli=j.gpu_milli, opportunistic=j.opportunistic)
            if viewer is None or j.tenant == viewer
            else GpuJobOut(job_id=None, tenant=None, gpu_milli=j.gpu_milli, opportunistic=j.opportunistic)
            for j in g.jobs
        ]
        gpus.append(
            GpuOut(
                index=g.index,
                node=g.node,
                type_name=g.type_name,
                mem_mib=g.mem_mib,
                stand_in=g.stand_in,
                allocated_milli=g.allocated_milli,
                jobs=jobs,
                sm_util=g.sm_util,
                mem_used_mib=g.mem_used_mib,
            )
        )
    return ClusterOut(
        policy=snap.policy,
        num_gpus=snap.num_gpus,
        allocated_gpus=snap.allocated_gpus,
        pending=snap.pending,
        running=snap.running,
        gpus=gpus,
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


def _utf8_cut(data: bytes) -> int:
    """How many leading bytes of ``data`` end on a UTF-8 character boundary (so a chunk never splits one)."""
    n = len(data)
    for i in range(n - 1, max(n - 4, 0) - 1, -1):
        b = data[i]
        if b & 0xC0 != 0x80:  # ASCII or a lead byte: is its sequence complete?
            need = 1 if b < 0x80 else 2 if b >> 5 == 0b110 else 3 if b >> 4 == 0b1110 else 4 if b >> 3 == 0b11110 else 1
            return n if n - i >= need else i
    return n  # no lead byte in the last four: not UTF-8 anyway; cut nothing


# ==============================================================================================================
# Auth
# ==============================================================================================================
@dataclass(frozen=True, slots=True)
class Principal:
    """Who is asking: the admin (``tenant is None``) or one tenant."""

    tenant: str | None

    @property
    def admin(self) -> bool:
        return self.tenant is None

    def sees(self, tenant: str) -> bool:
        return self.tenant is None or self.tenant == tenant


class _Tokens:
    def __init__(self, admin: str, tenants: dict[str, str]) -> None:
        # Every token is compared, each in constant time, so the time taken says nothing about which matched.
        self._entries: list[tuple[bytes, Principal]] = [(admin.encode(), Principal(None))]
        self._entries += [(token.encode(), Principal(name)) for token, name in tenants.items()]

    def principal(self, token: str) -> Principal | None:
        given = token.encode("utf-8", errors="replace")
        found: Principal | None = None
        for secret, who in self._entries:
            if hmac.compare_digest(given, secret) and found is None:
                found = who
        return found


_bearer = HTTPBearer(
    auto_error=False,
    description="The admin token (state_dir/admin.token) or a tenant's token from the serve configuration.",
)


class _Unauthorized(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def _principal(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> Principal:
    if credentials is None:
        raise _Unauthorized("missing token: send `Authorization: Bearer TOKEN`")
    tokens: _Tokens = request.app.state.tokens
    who = tokens.principal(credentials.credentials)
    if who is None:
        raise _Unauthorized("unknown token")
    return who


Who = Annotated[Principal, Depends(_principal)]


def _not_found(job_id: str) -> BadRequest:
    # The controller's own words for an unknown job: another tenant's job must look exactly the same.
    return BadRequest(404, f"no job {job_id!r}")


# ==============================================================================================================
# Middleware
# ==============================================================================================================
class BodyLimit:
    """Refuse (413) a request body above ``max_bytes`` before anything parses it: by ``Content-Length`` when
    there is one, else by counting the chunks as they arrive (chunked transfer). The body (at most
    ``max_bytes``) is then handed on whole."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        too_big = f"request body too large: the limit is {self.max_bytes} bytes"
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    length = int(value)
                    if length < 0:
                        raise ValueError
                except ValueError:
                    await _plain_error(scope, receive, send, 400, "bad Content-Length header")
                    return
                if length > self.max_bytes:
                    await _plain_error(scope, receive, send, 413, too_big)
                    return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body = message.get("body", b"")
            size += len(body)
            if size > self.max_bytes:
                await _plain_error(scope, receive, send, 413, too_big)
                return
            chunks.append(body)
            if not message.get("more_body", False):
                break
        whole = b"".join(chunks)
        given = False

        async def replay() -> Message:
            nonlocal given
            if not given:
                given = True
                return {"type": "http.request", "body": whole, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


class CatchAll:
    """An unexpected exception: logged here with its traceback, answered 500 without one."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def watch(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, watch)
        except Exception:
            log.exception("%s %s failed", scope.get("method"), scope.get("path"))
            if not started:
                await _plain_error(scope, receive, send, 500, "internal server error (the server's log says more)")


async def _plain_error(scope: Scope, receive: Receive, send: Send, status: int, detail: str) -> None:
    response = JSONResponse({"detail": detail}, status_code=status, headers={"Connection": "close"})
    await response(scope, receive, send)


def _readable(errors: Sequence[Any]) -> str:
    """FastAPI's validation errors as one sentence a person can act on."""
    parts = []
    for e in errors:
        loc = [str(x) for x in e.get("loc", ())]
        kind = e.get("type", "")
        if kind == "json_invalid":
            err = (e.get("ctx") or {}).get("error", "")
            parts.append(f"the body is not valid JSON{f' ({err})' if err else ''}")
            continue
        where = loc[0] if loc else "request"
        field = ".".join(loc[1:])
        if where == "body":
            name = f"field {field!r}" if field else "the body"
        elif where in ("query", "path", "header"):
            name = f"{where} parameter {field!r}"
        else:
            name = ".".join(loc) or "the request"
        msg = str(e.get("msg", "invalid")).removeprefix("Value error, ")
        if kind == "missing":
            parts.append(f"{name} is required")
        elif kind == "extra_forbidden":
            parts.append(f"{name} is not a known field")
        else:
            got = e.get("input")
            shown = repr(got) if isinstance(got, str | int | float | bool) and (field or where != "body") else ""
            if len(shown) > 60:
                shown = shown[:57] + "..."
            parts.append(f"{name}: {msg}" + (f" (got {shown})" if shown else ""))
    return "; ".join(parts) or "invalid request"


# ==============================================================================================================
# The app
# ==============================================================================================================
_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorOut, "description": "No token, or an unknown one."},
    422: {"model": ErrorOut, "description": "A body or query that does not fit the schema."},
}
_JOB_ERRORS: dict[int | str, dict[str, Any]] = {
    **_ERRORS,
    404: {"model": ErrorOut, "description": "No such job (or another tenant's)."},
}


def create_app(controller: Controller) -> FastAPI:
    """The FastAPI app serving ``controller``. Tokens come from ``controller.config``."""
    config: ServeConfig | None = controller.config
    if config is None:
        raise ConfigError("the API needs a controller built from a serve configuration (Controller.from_config)")
    config = ensure_admin_token(config)
    assert config.admin_token is not None
    tokens = _Tokens(config.admin_token, {t.token: t.name for t in config.tenants if t.token is not None})
    tenant_names = [t.name for t in config.tenants]

    app = FastAPI(
        title="corral",
        version=__version__,
        description="The live API of corral, a GPU cluster scheduler: submit jobs (commands) to run on this "
        "machine's GPUs under a scheduling policy, with per-tenant quotas. Authenticate with "
        '`Authorization: Bearer TOKEN` (the admin token, or a tenant\'s). Errors are `{"detail": "..."}`.',
        openapi_tags=[
            {"name": "jobs", "description": "Submit, inspect, follow and cancel jobs."},
            {"name": "cluster", "description": "GPUs, tenants and the queue."},
            {"name": "health", "description": "Liveness."},
        ],
    )
    app.state.tokens = tokens
    app.add_middleware(BodyLimit, max_bytes=config.max_body_bytes)
    app.add_middleware(CatchAll)

    # -- errors ------------------------------------------------------------------------------------------------
    @app.exception_handler(BadRequest)
    async def _bad_request(request: Request, exc: BadRequest) -> JSONResponse:
        return JSONResponse({"detail": exc.message}, status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"detail": _readable(exc.errors())}, status_code=422)

    @app.exception_handler(JobSpecError)
    async def _bad_spec(request: Request, exc: JobSpecError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=422)

    @app.exception_handler(_Unauthorized)
    async def _unauthorized(request: Request, exc: _Unauthorized) -> JSONResponse:
        return JSONResponse({"detail": exc.message}, status_code=401, headers={"WWW-Authenticate": "Bearer"})

    @app.exception_handler(CorralError)
    async def _corral_error(request: Request, exc: CorralError) -> JSONResponse:
        if isinstance(exc, InvariantViolation):  # a bug in corral, not the caller's doing
            log.error("invariant violated serving %s %s: %s", request.method, request.url.path, exc)
            return JSONResponse({"detail": "internal server error (the server's log says more)"}, status_code=500)
        return JSONResponse({"detail": str(exc)}, status_code=503)

    def visible(who: Principal, job_id: str) -> JobRecord:
        record = controller.job(job_id)
        if not who.sees(record.request.tenant):
            raise _not_found(job_id)
        return record

    order: Sequence[int] | None = getattr(controller, "gpu_order", None)

    # -- jobs --------------------------------------------------------------------------------------------------
    @app.post(
        "/v1/jobs",
        status_code=201,
        tags=["jobs"],
        summary="Submit a job",
        responses={
            **_ERRORS,
            403: {"model": ErrorOut, "description": "Submitting for another tenant with a tenant's token."},
            404: {"model": ErrorOut, "description": "Unknown tenant."},
            413: {"model": ErrorOut, "description": "Body too large."},
        },
    )
    def submit(body: JobSubmission, who: Who) -> JobOut:
        """Queue a job. It is committed to the store before this answers; the scheduler places it when it can.
        A job that can never run here (more GPUs than the cluster, a guaranteed job above its tenant's quota) is
        refused with 422 and nothing is queued."""
        if who.tenant is not None:
            if body.tenant is not None and body.tenant != who.tenant:
                raise BadRequest(403, f"this token is tenant {who.tenant!r}'s; it cannot submit for {body.tenant!r}")
            tenant = who.tenant
        elif body.tenant is not None:
            tenant = body.tenant
        elif len(tenant_names) == 1:
            tenant = tenant_names[0]
        else:
            raise BadRequest(
                422, f"tenant is required with the admin token; tenants here: {', '.join(sorted(tenant_names))}"
            )
        if tenant not in tenant_names:
            raise BadRequest(404, f"unknown tenant {tenant!r}; tenants here: {', '.join(sorted(tenant_names))}")
        request = JobRequest(
            command=tuple(body.command),
            tenant=tenant,
            num_gpus=body.num_gpus,
            gpu_milli=body.gpu_milli,
            opportunistic=body.opportunistic,
            name=body.name,
            cwd=body.cwd if body.cwd is not None else os.getcwd(),
            env=dict(body.env),
            gpu_mem_mib=body.gpu_mem_mib,
            priority=body.priority,
        )
        return job_out(controller.submit(request), order)

    @app.get(
        "/v1/jobs",
        tags=["jobs"],
        summary="List jobs",
        responses={**_ERRORS, 403: {"model": ErrorOut, "description": "Another tenant's jobs."}},
    )
    def list_jobs(
        who: Who,
        tenant: Annotated[str | None, Query(description="Only this tenant's jobs.")] = None,
        phase: Annotated[
            list[str] | None,
            Query(
                description="Only jobs in these phases (repeat, or comma-separate): pending, running, finished, "
                "failed, cancelled, rejected."
            ),
        ] = None,
        limit: Annotated[int | None, Query(ge=1, le=MAX_LIST_LIMIT, description="Only the newest N.")] = None,
    ) -> JobList:
        """Jobs in submission order. A tenant's token lists only that tenant's jobs."""
        if who.tenant is not None:
            if tenant is not None and tenant != who.tenant:
                raise BadRequest(403, f"this token is tenant {who.tenant!r}'s; it cannot list {tenant!r}'s jobs")
            tenant = who.tenant
        elif tenant is not None and tenant not in tenant_names:
            raise BadRequest(404, f"unknown tenant {tenant!r}; tenants here: {', '.join(sorted(tenant_names))}")
        phases: list[JobPhase] | None = None
        if phase:
            phases = []
            for word in (w.strip() for p in phase for w in p.split(",")):
                if not word:
                    continue
                try:
                    phases.append(JobPhase(word))
                except ValueError:
                    known = ", ".join(p.value for p in JobPhase)
                    raise BadRequest(422, f"query parameter 'phase': unknown phase {word!r}; one of {known}") from None
        records = controller.jobs(tenant=tenant, phases=phases, limit=limit)
        return JobList(jobs=[job_out(r, order) for r in records])

    @app.get("/v1/jobs/{job_id}", tags=["jobs"], summary="One job", responses=_JOB_ERRORS)
    def get_job(job_id: str, who: Who) -> JobOut:
        """A job with its process and latest telemetry."""
        return job_out(visible(who, job_id), order)

    @app.get("/v1/jobs/{job_id}/events", tags=["jobs"], summary="A job's history", responses=_JOB_ERRORS)
    def job_events(job_id: str, who: Who) -> EventList:
        """What happened to the job, oldest first: submitted, started, preempted, exited, finished, ..."""
        visible(who, job_id)
        events = controller.events(job_id)
        return EventList(
            job_id=job_id, events=[EventOut(time_s=e.time_s, kind=e.kind, detail=e.detail) for e in events]
        )

    @app.get("/v1/jobs/{job_id}/logs", tags=["jobs"], summary="A chunk of a job's output", responses=_JOB_ERRORS)
    def job_logs(
        job_id: str,
        who: Who,
        offset: Annotated[int, Query(ge=0, description="Byte offset to read from.")] = 0,
        limit: Annotated[
            int, Query(ge=1, le=MAX_LOG_CHUNK, description="Most bytes to return (but at least one whole character).")
        ] = DEFAULT_LOG_CHUNK,
    ) -> LogChunk:
        """The job's stdout and stderr (one file, across its runs) from byte ``offset``. Poll with
        ``offset=next_offset`` to follow; ``complete`` says the job has ended and nothing more will come. Before the
        job starts the chunk is empty."""
        record = visible(who, job_id)
        ended = record.phase.is_terminal and record.process.phase is ProcessPhase.NONE
        path: Path = controller.log_path(job_id)
        data = b""
        size = 0
        try:
            with path.open("rb") as f:
                size = os.fstat(f.fileno()).st_size
                if offset < size:
                    f.seek(offset)
                    data = f.read(limit + 3)  # 3 more: to finish a character that straddles the limit
        except FileNotFoundError:
            pass
        if ended and offset + len(data) >= size and len(data) <= limit:
            cut = len(data)  # the job's last bytes: hand them on even if they end mid-character
        else:
            # Up to `limit` bytes ending on a character boundary; when even the first character does not fit in
            # `limit`, that one character.
            cut = _utf8_cut(data[:limit]) or _utf8_cut(data[:4])
            if cut == 0 and ended and offset + len(data) >= size:
                cut = len(data)
        data = data[:cut]
        next_offset = offset + len(data)
        return LogChunk(
            job_id=job_id,
            offset=offset,
            next_offset=next_offset,
            text=data.decode("utf-8", errors="replace"),
            size=size,
            complete=ended and next_offset >= size,
        )

    @app.post(
        "/v1/jobs/{job_id}/cancel",
        tags=["jobs"],
        summary="Cancel a job",
        responses={**_JOB_ERRORS, 409: {"model": ErrorOut, "description": "The job already ended."}},
    )
    def cancel_job(job_id: str, who: Who) -> JobOut:
        """Cancel a pending or running job: a running one is stopped (its process gets SIGTERM, then SIGKILL
        after the grace period). Answers with the job as it stands right after the request."""
        visible(who, job_id)
        return job_out(controller.cancel(job_id), order)

    # -- cluster -----------------------------------------------------------------------------------------------
    @app.get("/v1/cluster", tags=["cluster"], summary="The cluster", responses=_ERRORS)
    def get_cluster(who: Who) -> ClusterOut:
        """Every GPU with its type, whether it is a stand-in, its jobs and their shares, and the queue's size.
        With a tenant's token, other tenants' jobs show their shares only."""
        return cluster_out(controller.cluster(), who.tenant)

    @app.get("/v1/tenants", tags=["cluster"], summary="Tenants", responses=_ERRORS)
    def get_tenants(who: Who) -> TenantList:
        """Each tenant's quota and what it holds. With a tenant's token, only that tenant."""
        return TenantList(tenants=[tenant_out(t) for t in controller.tenants() if who.sees(t.name)])

    @app.get("/v1/health", tags=["health"], summary="Liveness")
    def health() -> Health:
        """Answers while the server runs; needs no token."""
        return Health(status="ok", version=__version__)

    return app
