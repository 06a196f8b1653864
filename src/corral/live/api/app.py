"""The HTTP API of ``corral serve`` (FastAPI): submit, list, inspect, follow and cancel jobs; see the cluster and
the tenants. ``create_app(controller)`` builds the app; the OpenAPI schema is served at ``/openapi.json``, and
its interactive docs at ``/docs`` (Swagger UI) and ``/redoc`` from local files, so that they work offline
(:mod:`corral.live.api.docs`).

Routes (all under ``/v1``; every one but ``/v1/health`` needs ``Authorization: Bearer TOKEN``):

==========================  ===========================================================================
``POST /v1/jobs``           submit a job (201, the job)
``GET /v1/jobs``            one page of jobs (query ``tenant``, ``phase`` (repeatable or comma-separated),
                            ``limit``, ``cursor``, ``order``), with the total count and the next page's cursor
``GET /v1/jobs/{id}``       one job
``GET /v1/jobs/{id}/events`` the job's history
``GET /v1/events``          every job's events after a position (query ``after``, ``limit``), for following
``GET /v1/jobs/{id}/logs``  a chunk of the job's output from byte ``offset`` (for ``corral logs -f``)
``POST /v1/jobs/{id}/cancel`` cancel a pending or running job (409 if it already ended)
``GET /v1/cluster``         the GPUs, who is on each, and the queue
``GET /v1/tenants``         quotas and what each tenant holds
``GET /v1/health``          liveness (no token needed)
``GET /metrics``            Prometheus metrics (:mod:`corral.live.api.metrics`; no token unless the serve
                            configuration's ``metrics_token`` asks for the admin's); not in the OpenAPI schema
==========================  ===========================================================================

Auth: exactly one ``Authorization`` header, of exactly the form ``Bearer TOKEN`` (one space; the scheme's case is
free, as RFC 7235 says). The admin token sees and acts on everything. A tenant's token sees only its own tenant
(docs/live.md, "What a tenant sees"): another tenant's job answers 404 exactly as a job that does not exist,
listings and counts are filtered, submitting for (or listing) another tenant is 403, and the cluster view shows
which GPUs are busy and how much of each is given out, but not other tenants' jobs, names or counts. Job ids are
opaque (random), so they do not count other tenants' submissions either. A missing, malformed or unknown token
is 401. Tokens are compared in constant time.

Errors are JSON ``{"detail": "..."}`` with a readable message that names the field, and change nothing: 400
malformed (a bad ``Content-Length``), 401 no/unknown token, 403 not yours, 404 unknown job or tenant (an unknown
tenant in a submission is 404 too, as the controller answers), 405 (with ``Allow``) a method the path does not
take, 409 the job already ended, 413 a body above ``max_body_bytes`` (enforced before parsing, with or without
``Content-Length``), 422 a body or query that does not fit the schema (a body that is not UTF-8 JSON included),
or a job that can never run here (more GPUs than the cluster or the quota has). A message quotes at most
:data:`MAX_ECHO_CHARS` characters of what was sent. Anything unexpected is a 500 with no traceback; the server
logs it.

Routes are plain ``def``: FastAPI runs them in its thread pool, since the controller's calls may block briefly
on SQLite or on the loop thread.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import logging
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal

from fastapi import Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BeforeValidator
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from corral import __version__
from corral.core.errors import ConfigError, CorralError, InvariantViolation, JobSpecError
from corral.core.job import JobPhase
from corral.live.api.docs import add_offline_docs
from corral.live.api.errors import http_status
from corral.live.api.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from corral.live.api.metrics import metrics_registry, render
from corral.live.api.models import (
    DEFAULT_LOG_CHUNK,
    DEFAULT_PAGE,
    MAX_ECHO_CHARS,
    MAX_LOG_CHUNK,
    MAX_PAGE,
    ClusterOut,
    ErrorOut,
    EventFeed,
    EventList,
    EventOut,
    FeedEventOut,
    Health,
    JobList,
    JobOut,
    JobSubmission,
    LogChunk,
    PhaseName,
    TenantList,
    cluster_out,
    echo,
    job_out,
    tenant_out,
    utf8_cut,
)
from corral.live.config import ServeConfig, ensure_admin_token
from corral.live.records import (
    BadRequest,
    InvalidRequest,
    JobRecord,
    JobRequest,
    NoSuchJob,
    NotYours,
    ProcessPhase,
    UnknownTenant,
)

if TYPE_CHECKING:
    from corral.live.controller import Controller

log = logging.getLogger("corral.live.api")


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
        # Starlette decodes header bytes as Latin-1: encoding back gives the bytes sent, which a UTF-8 token's
        # own bytes then match.
        given = token.encode("latin-1", errors="replace")
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


_MISSING = "missing token: send `Authorization: Bearer TOKEN`"


def bearer_token(values: Sequence[str]) -> str:
    """The token of the request's ``Authorization`` header values, which must be exactly one, of exactly the form
    ``Bearer TOKEN``: one space, the token without surrounding whitespace (tokens never have any). Lenient
    parsing (extra spaces, a second header) would let a proxy and this server read different tokens from one
    request. Raises :class:`_Unauthorized`."""
    if not values:
        raise _Unauthorized(_MISSING)
    if len(values) > 1:
        raise _Unauthorized("more than one Authorization header: send exactly one, `Authorization: Bearer TOKEN`")
    value = values[0]
    scheme, space, token = value.partition(" ")
    if scheme.lower() != "bearer":  # the scheme's case is free (RFC 7235 §2.1); another scheme is no token
        raise _Unauthorized(_MISSING)
    if not space or not token or token != token.strip():
        raise _Unauthorized("malformed Authorization header: expected exactly `Bearer TOKEN`, with one space")
    return token


def _principal(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> Principal:
    # `credentials` (FastAPI's lenient parse) is there so that the schema names the security scheme; the
    # header itself is read here, strictly.
    token = bearer_token(request.headers.getlist("authorization"))
    tokens: _Tokens = request.app.state.tokens
    who = tokens.principal(token)
    if who is None:
        raise _Unauthorized("unknown token")
    return who


Who = Annotated[Principal, Depends(_principal)]


def _not_found(job_id: str) -> NoSuchJob:
    # The controller's own words for an unknown job: another tenant's job must look exactly the same.
    return NoSuchJob(f"no job {echo(job_id)}")


# A quoted value in a message made elsewhere (the controller's checks quote what they refuse with repr).
_QUOTED = re.compile(r"'(?:[^'\\]|\\.)*'" + r'|"(?:[^"\\]|\\.)*"')
MAX_DETAIL_CHARS = 2000


def _capped(detail: str) -> str:
    """An error message with every quoted value in it cut to :data:`MAX_ECHO_CHARS`, and the whole to
    :data:`MAX_DETAIL_CHARS`: the last guard, for messages made outside this module."""
    detail = _QUOTED.sub(
        lambda m: m[0] if len(m[0]) <= MAX_ECHO_CHARS else m[0][: MAX_ECHO_CHARS - 4] + "..." + m[0][0], detail
    )
    return detail if len(detail) <= MAX_DETAIL_CHARS else detail[: MAX_DETAIL_CHARS - 3] + "..."


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


def _readable(errors: Sequence[Any], json_body: bool = True) -> str:
    """FastAPI's validation errors as one sentence a person can act on, naming each field. ``json_body``: the
    request said its body is JSON (else a body error is, first, that it is not)."""
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
        if where == "body" and not field and not json_body:
            parts.append("the body must be a JSON object sent with `Content-Type: application/json`")
            continue
        if where == "body":
            name = f"field {echo(field)}" if field else "the body"
        elif where in ("query", "path", "header"):
            name = f"{where} parameter {echo(field)}"
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


def _is_json(content_type: str | None) -> bool:
    kind = (content_type or "").split(";", 1)[0].strip().lower()
    return kind == "application/json" or (kind.startswith("application/") and kind.endswith("+json"))


def _phases(values: Any) -> Any:
    """The ``phase`` query: each value one phase or several, comma-separated (``phase=pending,running``)."""
    if not isinstance(values, list):
        return values
    out: list[str] = []
    for value in values:
        if not isinstance(value, str):
            return values  # let the schema's own check say what is wrong
        for word in value.split(","):
            word = word.strip()
            if word not in _PHASE_NAMES:
                raise ValueError(f"unknown phase {echo(word)}; one of {', '.join(_PHASE_NAMES)}")
            out.append(word)
    return out


_PHASE_NAMES = tuple(p.value for p in JobPhase)
PhaseQuery = Annotated[list[PhaseName], BeforeValidator(_phases)]


# -- cursors --------------------------------------------------------------------------------------------------
# A cursor is the id of the last job of a page and the order it was read in, encoded: opaque to clients, so
# that its form can change. The next page starts after that job's place in submission order.
def encode_cursor(job_id: str, newest_first: bool) -> str:
    raw = f"{'n' if newest_first else 'o'}:{job_id}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[str, bool] | None:
    """``(job_id, newest_first)``, or ``None`` for a string this server did not make."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
    except (binascii.Error, ValueError):
        return None
    order, colon, job_id = raw.partition(":")
    if not colon or order not in ("n", "o") or not job_id:
        return None
    return job_id, order == "n"


# ==============================================================================================================
# The app
# ==============================================================================================================
_STATUS: dict[int, str] = {
    400: "A malformed request (a bad Content-Length header).",
    401: "No token, a malformed Authorization header, or an unknown token.",
    413: "A body above the server's max_body_bytes.",
    422: "A body or query that does not fit the schema.",
    503: "The controller did not answer in time.",
}


def _responses(**specific: str) -> dict[int | str, dict[str, Any]]:
    """The error responses of a route: those every route with a token can give, and ``specific`` ones
    (``_404="..."``), each with corral's error body."""
    out: dict[int | str, dict[str, Any]] = {
        code: {"model": ErrorOut, "description": words} for code, words in _STATUS.items() if code != 422
    }
    for key, words in specific.items():
        out[int(key.lstrip("_"))] = {"model": ErrorOut, "description": words}
    return dict(sorted(out.items(), key=lambda kv: int(kv[0])))


_NO_JOB = "No such job (or another tenant's: it looks the same)."
# Declared on every route with a parameter, as corral's error body: FastAPI would otherwise declare its own shape.
_BAD_PARAMETER = "A parameter that does not fit the schema."


def create_app(controller: Controller) -> FastAPI:
    """The FastAPI app serving ``controller``. Tokens come from ``controller.config``."""
    config: ServeConfig | None = controller.config
    if config is None:
        raise ConfigError("the API needs a controller built from a serve configuration (Controller.from_config)")
    config = ensure_admin_token(config)
    assert config.admin_token is not None
    tokens = _Tokens(config.admin_token, {t.token: t.name for t in config.tenants if t.token is not None})
    tenant_names = [t.name for t in config.tenants]
    store = controller.store

    app = FastAPI(
        title="corral",
        version=__version__,
        docs_url=None,  # FastAPI's pages load their scripts from a CDN: add_offline_docs serves /docs instead
        redoc_url=None,
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
    add_offline_docs(app)
    from corral.live.dashboard import add_dashboard  # here, not on top: the dashboard imports Principal from here

    add_dashboard(app, controller, tokens, every_s=config.dashboard_sample_s, window_s=config.dashboard_history_s)

    # -- errors ------------------------------------------------------------------------------------------------
    def error(status: int, detail: str, headers: dict[str, str] | None = None) -> JSONResponse:
        return JSONResponse({"detail": _capped(detail)}, status_code=status, headers=headers)

    @app.exception_handler(BadRequest)
    async def _bad_request(request: Request, exc: BadRequest) -> JSONResponse:
        return error(http_status(exc), exc.message)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return error(422, _readable(exc.errors(), _is_json(request.headers.get("content-type"))))

    @app.exception_handler(JobSpecError)
    async def _bad_spec(request: Request, exc: JobSpecError) -> JSONResponse:
        return error(422, str(exc))

    @app.exception_handler(_Unauthorized)
    async def _unauthorized(request: Request, exc: _Unauthorized) -> JSONResponse:
        return error(401, exc.message, {"WWW-Authenticate": "Bearer"})

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        cause = exc.__cause__
        if exc.status_code == 400 and isinstance(cause, UnicodeDecodeError):
            # FastAPI's body parsing fails so on bytes that are not UTF-8: a body that is not JSON, as the
            # docs promise (422), and where.
            return error(422, f"the body is not valid JSON (it is not UTF-8 text: byte {cause.start})")
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            # Starlette names only the methods of the first route that matched the path; say all of them.
            headers["Allow"] = ", ".join(_allowed(app, request.scope))
        detail = exc.detail if isinstance(exc.detail, str) else "error"
        return error(exc.status_code, detail, headers or None)

    @app.exception_handler(CorralError)
    async def _corral_error(request: Request, exc: CorralError) -> JSONResponse:
        if isinstance(exc, InvariantViolation):  # a bug in corral, not the caller's doing
            log.error("invariant violated serving %s %s: %s", request.method, request.url.path, exc)
            return error(500, "internal server error (the server's log says more)")
        return error(503, str(exc))

    def visible(who: Principal, job_id: str) -> JobRecord:
        try:
            record = controller.job(job_id)
        except NoSuchJob:
            raise _not_found(job_id) from None
        if not who.sees(record.request.tenant):
            raise _not_found(job_id)
        return record

    def unknown_tenant(tenant: str) -> UnknownTenant:
        return UnknownTenant(f"unknown tenant {echo(tenant)}; tenants here: {', '.join(sorted(tenant_names))}")

    gpu_order: Sequence[int] | None = getattr(controller, "gpu_order", None)
    topology = controller.topology

    def node_of(gpu: int) -> str:
        return topology.node_names[topology.gpu_node[gpu]]

    # -- jobs --------------------------------------------------------------------------------------------------
    @app.post(
        "/v1/jobs",
        status_code=201,
        tags=["jobs"],
        summary="Submit a job",
        responses=_responses(
            _403="Submitting for another tenant with a tenant's token.",
            _404="Unknown tenant.",
            _422="A body that does not fit the schema, or a job that can never run here.",
        ),
    )
    def submit(body: JobSubmission, who: Who) -> JobOut:
        """Queue a job. It is committed to the store before this answers; the scheduler places it when it can.
        A job that can never run here (more GPUs than the cluster, a guaranteed job above its tenant's quota) is
        refused with 422 and nothing is queued."""
        return job_out(controller.submit(request_from(body, who)), gpu_order, node_of)

    def request_from(body: JobSubmission, who: Principal) -> JobRequest:
        """The request a submission makes, for the tenant the token may submit for."""
        if who.tenant is not None:
            if body.tenant is not None and body.tenant != who.tenant:
                raise NotYours(f"this token is tenant {who.tenant!r}'s; it cannot submit for {echo(body.tenant)}")
            tenant = who.tenant
        elif body.tenant is not None:
            tenant = body.tenant
        elif len(tenant_names) == 1:
            tenant = tenant_names[0]
        else:
            raise InvalidRequest(
                f"tenant is required with the admin token; tenants here: {', '.join(sorted(tenant_names))}"
            )
        if tenant not in tenant_names:
            raise unknown_tenant(tenant)
        return JobRequest(
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
            warm=body.warm,
            expected_duration_s=body.expected_duration_s,
        )

    @app.get(
        "/v1/jobs",
        tags=["jobs"],
        summary="List jobs, a page at a time",
        responses=_responses(
            _403="Another tenant's jobs.",
            _404="Unknown tenant.",
            _422="A query that does not fit the schema, or a cursor this server did not give.",
        ),
    )
    def list_jobs(
        who: Who,
        tenant: Annotated[str | None, Query(max_length=64, description="Only this tenant's jobs.")] = None,
        phase: Annotated[
            PhaseQuery | None,
            Query(
                description="Only jobs in these phases (repeat, or comma-separate): pending, running, finished, "
                "failed, cancelled, rejected."
            ),
        ] = None,
        limit: Annotated[
            int, Query(ge=1, le=MAX_PAGE, description=f"The most jobs in the page (default {DEFAULT_PAGE}).")
        ] = DEFAULT_PAGE,
        cursor: Annotated[
            str | None,
            Query(
                min_length=1,
                max_length=200,
                description="Where the page starts: the `next_cursor` of the page before (opaque).",
            ),
        ] = None,
        order: Annotated[
            Literal["oldest", "newest"],
            Query(description="oldest: submission order (the default); newest: the newest job first."),
        ] = "oldest",
    ) -> JobList:
        """The jobs that match, one page at a time: ``total`` says how many match in all, and ``next_cursor``
        gives the next page. A tenant's token lists and counts only that tenant's jobs."""
        if who.tenant is not None:
            if tenant is not None and tenant != who.tenant:
                raise NotYours(f"this token is tenant {who.tenant!r}'s; it cannot list {echo(tenant)}'s jobs")
            tenant = who.tenant
        elif tenant is not None and tenant not in tenant_names:
            raise unknown_tenant(tenant)
        phases = None if phase is None else [JobPhase(p) for p in phase]
        newest_first = order == "newest"
        after: str | None = None
        if cursor is not None:
            decoded = decode_cursor(cursor)
            # A cursor naming a job the caller may not see is refused like garbage: no answer tells whether
            # another tenant's job exists.
            found = None if decoded is None else store.get(decoded[0])
            if decoded is None or found is None or not who.sees(found.request.tenant):
                raise InvalidRequest("query parameter 'cursor': not a cursor this server gave")
            if decoded[1] != newest_first:
                raise InvalidRequest(f"query parameter 'cursor': it was given for another order than {order!r}")
            after = decoded[0]
        records = controller.jobs(tenant=tenant, phases=phases, limit=limit + 1, after=after, newest_first=newest_first)
        more = len(records) > limit  # one more than asked: whether a next page exists, without counting
        records = records[:limit]
        return JobList(
            jobs=[job_out(r, gpu_order, node_of) for r in records],
            total=store.count(tenant=tenant, phases=phases),
            next_cursor=encode_cursor(records[-1].job_id, newest_first) if more else None,
        )

    @app.get(
        "/v1/jobs/{job_id}", tags=["jobs"], summary="One job", responses=_responses(_404=_NO_JOB, _422=_BAD_PARAMETER)
    )
    def get_job(job_id: str, who: Who) -> JobOut:
        """A job with its process and latest telemetry."""
        return job_out(visible(who, job_id), gpu_order, node_of)

    @app.get(
        "/v1/jobs/{job_id}/events",
        tags=["jobs"],
        summary="A job's history",
        responses=_responses(_404=_NO_JOB, _422=_BAD_PARAMETER),
    )
    def job_events(job_id: str, who: Who) -> EventList:
        """What happened to the job, oldest first: submitted, started, preempted, exited, finished, ..."""
        visible(who, job_id)
        events = controller.events(job_id)
        return EventList(
            job_id=job_id, events=[EventOut(time_s=e.time_s, kind=e.kind, detail=e.detail) for e in events]
        )

    @app.get(
        "/v1/events",
        tags=["jobs"],
        summary="Every job's events",
        responses=_responses(_422=_BAD_PARAMETER),
    )
    def events_feed(
        who: Who,
        after: Annotated[
            int, Query(ge=0, le=2**53, description="Position after which to start (0: from the first).")
        ] = 0,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE, description="Most events to return.")] = MAX_PAGE,
    ) -> EventFeed:
        """Events of every job, oldest first, after position ``after``: poll with ``after=next_after`` to follow
        (``corral events -f``). With a tenant's token, its own jobs' events only, and positions count its own
        events alone, so that they say nothing of other tenants'."""
        found = controller.events_after(after, limit, who.tenant)
        return EventFeed(
            events=[
                FeedEventOut(position=n, time_s=e.time_s, job_id=e.job_id, kind=e.kind, detail=e.detail)
                for n, e in found
            ],
            next_after=found[-1][0] if found else after,
        )

    @app.get(
        "/v1/jobs/{job_id}/logs",
        tags=["jobs"],
        summary="A chunk of a job's output",
        responses=_responses(_404=_NO_JOB, _422=_BAD_PARAMETER),
    )
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
        job starts the chunk is empty. The text is the job's own output, as it wrote it (terminal escape sequences
        included)."""
        record = visible(who, job_id)
        ended = record.phase.is_terminal and record.process.phase is ProcessPhase.NONE
        # 3 more bytes: to finish a character that straddles the limit. The node that holds the log reads it.
        data, size = controller.read_log(job_id, offset, limit + 3)
        if ended and offset + len(data) >= size and len(data) <= limit:
            cut = len(data)  # the job's last bytes: hand them on even if they end mid-character
        else:
            # Up to `limit` bytes ending on a character boundary; when even the first character does not fit in
            # `limit`, that one character.
            cut = utf8_cut(data[:limit]) or utf8_cut(data[:4])
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
        responses=_responses(_404=_NO_JOB, _409="The job already ended.", _422=_BAD_PARAMETER),
    )
    def cancel_job(job_id: str, who: Who) -> JobOut:
        """Cancel a pending or running job: a running one is stopped (its process gets SIGTERM, then SIGKILL
        after the grace period). Answers with the job as it stands right after the request."""
        visible(who, job_id)
        return job_out(controller.cancel(job_id), gpu_order, node_of)

    from corral.live.api.estimates import add_estimate_routes  # here: it imports Who and Principal from here

    add_estimate_routes(app, controller, request_from, node_of, gpu_order, _responses)

    # -- cluster -----------------------------------------------------------------------------------------------
    @app.get("/v1/cluster", tags=["cluster"], summary="The cluster", responses=_responses())
    def get_cluster(who: Who) -> ClusterOut:
        """Every GPU with its type, whether it is a stand-in, whether it is busy, its jobs and their shares, and
        the queue's size. With a tenant's token: that tenant's jobs and counts only (docs/live.md, "What a tenant
        sees")."""
        return cluster_out(controller.cluster(), who.tenant)

    @app.get("/v1/tenants", tags=["cluster"], summary="Tenants", responses=_responses())
    def get_tenants(who: Who) -> TenantList:
        """Each tenant's quota and what it holds. With a tenant's token, only that tenant."""
        return TenantList(tenants=[tenant_out(t) for t in controller.tenants() if who.sees(t.name)])

    @app.get(
        "/v1/health",
        tags=["health"],
        summary="Liveness",
        responses={
            400: {"model": ErrorOut, "description": _STATUS[400]},
            413: {"model": ErrorOut, "description": _STATUS[413]},
        },
    )
    def health() -> Health:
        """Answers while the server runs; needs no token."""
        return Health(status="ok", version=__version__)

    # -- metrics -----------------------------------------------------------------------------------------------
    registry = metrics_registry(controller)

    def metrics_page() -> Response:
        return Response(render(registry), media_type=METRICS_CONTENT_TYPE)

    if config.metrics_token:

        @app.get("/metrics", include_in_schema=False)
        def metrics_admin(who: Who) -> Response:
            if who.tenant is not None:
                raise NotYours("the metrics need the admin token")
            return metrics_page()

    else:

        @app.get("/metrics", include_in_schema=False)
        def metrics_open() -> Response:
            return metrics_page()

    return app


def _allowed(app: FastAPI, scope: Scope) -> list[str]:
    """The methods some route of ``app`` takes at ``scope``'s path."""
    methods: set[str] = set()
    for route in app.router.routes:
        match, _ = route.matches({**scope, "method": "GET"})  # the path alone decides: any method would do
        route_methods = getattr(route, "methods", None)
        if match is not Match.NONE and route_methods:
            methods |= set(route_methods)
    return sorted(methods)
