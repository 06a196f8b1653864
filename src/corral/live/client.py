"""A small typed client of the ``corral serve`` HTTP API (httpx), used by the ``corral`` commands.

Every method mirrors one route of :mod:`corral.live.api` and returns its JSON body as a typed dict (the shapes
below are the API's response models, field for field; a test keeps the two in step); ``iter_jobs``, ``jobs`` and
``wait`` are built on them. Errors raise
:class:`ClientError` carrying the server's status and message; a server that is not there is a
:class:`ClientError` with status 0 saying so and how to start one.

This module imports neither FastAPI nor the controller, so the client commands start fast.

A request cut short by Ctrl-C (a ``KeyboardInterrupt``, or another exception that is not an ``Exception``, such
as a signal handler's ``SystemExit``) marks the client broken. httpx's connection pool guards its state with a lock
taken in Python code (httpcore's ``ThreadLock.__enter__``), so an interrupt that lands just after the lock is taken
leaves it held, and closing the pool, or another request, would then wait for it forever. A broken client's
``close`` leaves the connections to the process's exit, and its requests fail at once. (``corral events -f`` once
ignored Ctrl-C this way; in a stress test that interrupted requests at random moments, about one interrupt in a
thousand landed there.)
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, NotRequired, TypedDict, cast
from urllib.parse import quote

import httpx

from corral.core.errors import ConfigError, CorralError
from corral.live.config import ADMIN_TOKEN_FILE, SERVER_FILE

MAX_PAGE = 1000  # the most jobs the server puts in a page (corral.live.api.models.MAX_PAGE)
ENDED_PHASES = frozenset(("finished", "failed", "cancelled", "rejected"))
# How often `wait` asks: soon at first, so that a quick job is seen ending at once, then less and less often, so
# that a long job costs the server one request every 2 s.
FIRST_POLL_S = 0.2
LAST_POLL_S = 2.0
POLL_BACKOFF = 1.5


class ClientError(CorralError):
    """A request the server refused (``status`` is its HTTP status), or could not make (``status`` 0)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


# -- response shapes (see corral.live.api for what each field means) -------------------------------------------
class PlacementJson(TypedDict):
    gpus: list[int]
    gpu_milli: int
    mem_mib: int | None
    opportunistic: bool


class ProcessJson(TypedDict):
    run: int
    phase: str
    pid: int | None
    exit_code: int | None
    exit_signal: int | None
    stopping_for: str | None


class TelemetryJson(TypedDict):
    time_s: float
    step_time_s: float
    solo_step_time_s: float | None
    mem_peak_mib: int
    mem_mean_mib: int
    mem_need_mib: int
    sm_util: float
    baseline_step_time_s: float | None
    baseline_reports: int
    slowdown: float | None


class EstimateJson(TypedDict):
    start_s: float | None
    earliest_s: float | None
    latest_s: float | None
    made_s: float


class TestStartJson(TypedDict):
    start_s: float | None
    earliest_s: float | None
    latest_s: float | None
    made_s: float
    gpus: list[int]
    nodes: list[str]


class EstimatesJson(TypedDict):
    made_s: float | None
    took_s: float | None
    runs: int | None
    interval_s: float
    pending: int | None
    known: int | None
    learned: int | None
    assumed: int | None
    cut_short: bool | None


class AccuracyJson(TypedDict):
    jobs: int
    first_median_s: float | None
    first_p90_s: float | None
    last_median_s: float | None
    last_p90_s: float | None
    last_bias_s: float | None
    within: float | None


class TenantMoveJson(TypedDict):
    tenant: str | None
    pending: int
    wait_now_s: float | None
    wait_other_s: float | None
    earlier: int
    later: int


class WhatifJson(TypedDict):
    policy: str
    other: str
    made_s: float
    took_s: float
    tenants: list[TenantMoveJson]


class JobJson(TypedDict):
    job_id: str
    name: str | None
    tenant: str
    command: list[str]
    cwd: str
    env: dict[str, str]
    num_gpus: int
    gpu_milli: int
    opportunistic: bool
    job_class: str
    gpu_mem_mib: int | None
    priority: int
    warm: bool
    phase: str
    reason: str | None
    wait_reason: NotRequired[str | None]
    estimated_start: NotRequired[EstimateJson | None]
    expected_duration_s: NotRequired[float | None]
    placement: PlacementJson | None
    submit_s: float
    first_start_s: float | None
    last_start_s: float | None
    end_s: float | None
    queued_s: float
    queued_since_s: NotRequired[float | None]
    suspended_on: NotRequired[list[str] | None]
    executed_s: float
    preemptions: int
    run_epoch: int
    process: ProcessJson
    telemetry: TelemetryJson | None


class JobListJson(TypedDict):
    jobs: list[JobJson]
    total: int
    next_cursor: str | None


class EventJson(TypedDict):
    time_s: float
    kind: str
    detail: str


class FeedEventJson(TypedDict):
    position: int
    time_s: float
    job_id: str
    kind: str
    detail: str


class EventFeedJson(TypedDict):
    events: list[FeedEventJson]
    next_after: int


class LogChunkJson(TypedDict):
    job_id: str
    offset: int
    next_offset: int
    text: str
    size: int
    complete: bool


class GpuJobJson(TypedDict):
    job_id: str
    tenant: str
    gpu_milli: int
    opportunistic: bool


class GpuJson(TypedDict):
    index: int
    node: str
    type_name: str
    mem_mib: int
    stand_in: bool
    allocated_milli: int
    busy: bool
    jobs: list[GpuJobJson]
    sm_util: float | None
    mem_used_mib: int | None


class NodeJson(TypedDict):
    name: str
    state: str
    num_gpus: int


class ClusterJson(TypedDict):
    policy: str
    num_gpus: int
    allocated_gpus: float
    pending: int
    running: int
    gpus: list[GpuJson]
    nodes: list[NodeJson]


class TenantJson(TypedDict):
    name: str
    quota_gpus: int | None
    guaranteed_gpus: float
    opportunistic_gpus: float
    running: int
    pending: int


class HealthJson(TypedDict):
    status: str
    version: str


# -- finding the server -----------------------------------------------------------------------------------------
def find_server(state_dir: Path | str) -> tuple[str, str]:
    """The URL and admin token of the server whose state is in ``state_dir``, from the ``server.json`` and
    ``admin.token`` that ``corral serve`` keeps there. Raises :class:`ConfigError` saying what is missing."""
    return read_server_url(state_dir), read_admin_token(state_dir)


def read_server_url(state_dir: Path | str) -> str:
    """The URL in ``state_dir/server.json``."""
    server_file = Path(state_dir) / SERVER_FILE
    try:
        info = json.loads(server_file.read_text(encoding="utf-8"))
        url = info["url"]
        if not isinstance(url, str):
            raise ValueError("url is not a string")
    except FileNotFoundError:
        raise ConfigError(
            f"no corral server found: {server_file} does not exist (start one with `corral serve`, or give "
            "--url/CORRAL_URL, or --state-dir/CORRAL_STATE_DIR where the server keeps its state)"
        ) from None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"cannot read {server_file}: {e}") from None
    return url


def read_admin_token(state_dir: Path | str) -> str:
    """The admin token in ``state_dir/admin.token``."""
    token_file = Path(state_dir) / ADMIN_TOKEN_FILE
    try:
        token = token_file.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        raise ConfigError(
            f"no token: {token_file} does not exist (give --token or CORRAL_TOKEN, or --state-dir/CORRAL_STATE_DIR "
            "where the server keeps its state)"
        ) from None
    except OSError as e:
        raise ConfigError(f"cannot read {token_file}: {e.strerror or e} (give --token or CORRAL_TOKEN)") from None
    if not token:
        raise ConfigError(f"{token_file} is empty (give --token or CORRAL_TOKEN)")
    return token


# -- the client -------------------------------------------------------------------------------------------------
class Client:
    """The API at ``url`` with ``token`` (the admin's or a tenant's)."""

    def __init__(self, url: str, token: str, timeout_s: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self._http = httpx.Client(
            base_url=self.url,
            headers={"Authorization": f"Bearer {token}", "User-Agent": "corral-cli"},
            timeout=timeout_s,
        )
        self.timeout_s = timeout_s
        self._broken = False  # a request was interrupted: the pool may hold its lock (module docstring)

    def close(self) -> None:
        if not self._broken:
            self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    # -- routes ----------------------------------------------------------------------------------------------
    def health(self) -> HealthJson:
        return cast(HealthJson, self._request("GET", "/v1/health"))

    def submit(
        self,
        command: Iterable[str],
        *,
        tenant: str | None = None,
        num_gpus: int = 1,
        gpu_milli: int = 1000,
        opportunistic: bool = False,
        name: str | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        gpu_mem_mib: int | None = None,
        priority: int = 0,
        warm: bool = False,
        expected_duration_s: float | None = None,
        test_only: bool = False,
    ) -> JobJson:
        """Submit a job. With ``test_only`` nothing is submitted: see :meth:`test_start`."""
        body: dict[str, Any] = {
            "command": list(command),
            "num_gpus": num_gpus,
            "gpu_milli": gpu_milli,
            "opportunistic": opportunistic,
            "priority": priority,
            "env": dict(env or {}),
        }
        if warm:  # only when asked: a server from before warm starts refuses unknown fields
            body["warm"] = True
        optional = (
            ("tenant", tenant),
            ("name", name),
            ("cwd", cwd),
            ("gpu_mem_mib", gpu_mem_mib),
            ("expected_duration_s", expected_duration_s),
        )
        for key, value in optional:
            if value is not None:
                body[key] = value
        if test_only:
            return cast(JobJson, self._request("POST", "/v1/jobs/test", json=body))
        return cast(JobJson, self._request("POST", "/v1/jobs", json=body))

    def test_start(self, command: Iterable[str], **fields: Any) -> TestStartJson:
        """Where and when a job would start if submitted now (the arguments of :meth:`submit`); nothing is
        submitted."""
        return cast(TestStartJson, self.submit(command, test_only=True, **fields))

    def estimates(self, *, refresh: bool = False) -> EstimatesJson:
        """The latest start-time forecast (``refresh``: make one now; admin token)."""
        return cast(EstimatesJson, self._request("POST" if refresh else "GET", "/v1/estimates"))

    def whatif_queue(self, policy: str) -> WhatifJson:
        """The current queue under another policy, per tenant (admin token)."""
        return cast(WhatifJson, self._request("POST", "/v1/estimates/whatif", json={"policy": policy}))

    def estimate_accuracy(self) -> AccuracyJson:
        """How far estimated first starts were from the real ones (admin token)."""
        return cast(AccuracyJson, self._request("GET", "/v1/estimates/accuracy"))

    def jobs_page(
        self,
        *,
        tenant: str | None = None,
        phases: Iterable[str] | None = None,
        limit: int | None = None,
        cursor: str | None = None,
        newest_first: bool = False,
    ) -> JobListJson:
        """One page of the job list (the server's default size unless ``limit``), from ``cursor`` on."""
        params: list[tuple[str, str]] = []
        if tenant is not None:
            params.append(("tenant", tenant))
        for phase in phases or ():
            params.append(("phase", phase))
        if limit is not None:
            params.append(("limit", str(limit)))
        if cursor is not None:
            params.append(("cursor", cursor))
        if newest_first:
            params.append(("order", "newest"))
        return cast(JobListJson, self._request("GET", "/v1/jobs", params=params))

    def iter_jobs(
        self,
        *,
        tenant: str | None = None,
        phases: Iterable[str] | None = None,
        newest_first: bool = False,
        page_size: int = MAX_PAGE,
    ) -> Iterator[JobJson]:
        """Every job that matches, page after page."""
        wanted = list(phases or ())
        cursor: str | None = None
        while True:
            page = self.jobs_page(
                tenant=tenant, phases=wanted, limit=page_size, cursor=cursor, newest_first=newest_first
            )
            yield from page["jobs"]
            cursor = page["next_cursor"]
            if cursor is None:
                return

    def jobs(
        self, *, tenant: str | None = None, phases: Iterable[str] | None = None, limit: int | None = None
    ) -> list[JobJson]:
        """The jobs that match, in submission order: all of them, or the first ``limit``."""
        out: list[JobJson] = []
        size = MAX_PAGE if limit is None else max(1, min(limit, MAX_PAGE))
        for job in self.iter_jobs(tenant=tenant, phases=phases, page_size=size):
            out.append(job)
            if limit is not None and len(out) >= limit:
                break
        return out

    def job(self, job_id: str) -> JobJson:
        return cast(JobJson, self._request("GET", f"/v1/jobs/{_id(job_id)}"))

    def events(self, job_id: str) -> list[EventJson]:
        return cast(list[EventJson], self._request("GET", f"/v1/jobs/{_id(job_id)}/events")["events"])

    def event_feed(self, *, after: int = 0, limit: int | None = None) -> EventFeedJson:
        params: list[tuple[str, str]] = [("after", str(after))]
        if limit is not None:
            params.append(("limit", str(limit)))
        return cast(EventFeedJson, self._request("GET", "/v1/events", params=params))

    def logs(self, job_id: str, *, offset: int = 0, limit: int | None = None) -> LogChunkJson:
        params: list[tuple[str, str]] = [("offset", str(offset))]
        if limit is not None:
            params.append(("limit", str(limit)))
        return cast(LogChunkJson, self._request("GET", f"/v1/jobs/{_id(job_id)}/logs", params=params))

    def cancel(self, job_id: str) -> JobJson:
        return cast(JobJson, self._request("POST", f"/v1/jobs/{_id(job_id)}/cancel"))

    def wait(self, job_id: str, *, timeout_s: float | None = None) -> JobJson:
        """The job once it has ended (finished, failed, cancelled or rejected), or as it stands when ``timeout_s``
        has passed: its ``phase`` says which. Polls ``GET /v1/jobs/{id}`` every :data:`FIRST_POLL_S` at first,
        backing off to every :data:`LAST_POLL_S`; it asks once more at the deadline, and at least once."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        interval = FIRST_POLL_S
        while True:
            job = self.job(job_id)
            if job["phase"] in ENDED_PHASES:
                return job
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return job
            time.sleep(interval if left is None else min(interval, left))
            interval = min(interval * POLL_BACKOFF, LAST_POLL_S)

    def cluster(self) -> ClusterJson:
        return cast(ClusterJson, self._request("GET", "/v1/cluster"))

    def tenants(self) -> list[TenantJson]:
        return cast(list[TenantJson], self._request("GET", "/v1/tenants")["tenants"])

    # -- plumbing --------------------------------------------------------------------------------------------
    def _request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: list[tuple[str, str]] | None = None,
    ) -> Any:
        if self._broken:
            raise ClientError(0, f"an earlier request to {self.url} was interrupted; make a new client")
        try:
            response = self._http.request(method, path, json=json, params=tuple(params or ()))
        except httpx.ConnectError:
            raise ClientError(0, f"no corral server at {self.url} (start one with `corral serve`)") from None
        except httpx.TimeoutException:
            raise ClientError(0, f"the corral server at {self.url} did not answer in {self.timeout_s:g} s") from None
        except httpx.HTTPError as e:
            raise ClientError(0, f"cannot talk to the corral server at {self.url}: {e}") from None
        except BaseException as e:
            if not isinstance(e, Exception):  # KeyboardInterrupt, a signal handler's SystemExit: from anywhere
                self._broken = True
            raise
        if response.is_success:
            try:
                return response.json()
            except ValueError:
                raise ClientError(response.status_code, f"{self.url}{path}: the answer is not JSON") from None
        raise ClientError(response.status_code, _message(response))


def _id(job_id: str) -> str:
    return quote(str(job_id), safe="")


def _message(response: httpx.Response) -> str:
    try:
        detail = response.json().get("detail")
    except (ValueError, AttributeError):
        detail = None
    if isinstance(detail, str) and detail:
        return detail
    if detail:  # not corral's shape (another server?): show it compactly
        return f"HTTP {response.status_code}: {json.dumps(detail)[:300]}"
    reason = response.reason_phrase or "error"
    return f"HTTP {response.status_code} {reason}"
