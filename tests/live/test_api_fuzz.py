"""The HTTP API under generated input, bounded in examples and time: hypothesis over submission bodies (well
formed, mistyped, not JSON, not UTF-8), list and log queries, job ids in paths and Authorization headers; and a
schemathesis run over the whole OpenAPI schema (positive and negative cases, every built-in check).

What must hold for every request: no 5xx; no traceback in the body; an error is ``{"detail": "..."}`` that names
what was wrong (the field, the query parameter, or the thing the value is about); a refused request changes
nothing in the store.

The controller is real (store, engine, FIFO, loop thread); its agent is a stand-in that starts nothing (a
launched job is reported started and stays so), so that generated commands are never run.
"""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, given, settings

with warnings.catch_warnings():  # newer Starlette nags about httpx; the client works
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from corral.core import contract
from corral.core.job import JobPhase, JobSpec
from corral.core.status import JobStatus
from corral.core.tenant import Tenant
from corral.live.agent import LaunchRequest, ProcessExited, ProcessStarted
from corral.live.agent.gpus import GpuInfo, stand_in_gpus
from corral.live.api import create_app
from corral.live.config import ServeConfig, TenantConfig
from corral.live.controller import Controller, cluster_for
from corral.live.records import JobRequest, ProcessState
from corral.live.store import Store
from corral.policies.registry import make_policy

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

ALICE = "alice-fuzz-token-0123456789"
BOB = "bob-fuzz-token-0123456789ab"
ADMIN = "admin-fuzz-token-0123456789"
A, B, ROOT = ({"Authorization": f"Bearer {t}"} for t in (ALICE, BOB, ADMIN))
FIELDS = ("command", "tenant", "num_gpus", "gpu_milli", "opportunistic", "name", "cwd", "env", "gpu_mem_mib",
          "priority", "warm")  # fmt: skip
# What a refusal may name instead of a wire field: the controller's checks say what the value is about.
CONCEPTS = ("the body", "GPUs", "working directory", "environment variable", "quota", "tenant")

# Bounded: a few seconds per test on a 2-core machine.
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)


class StandInAgent:
    """An agent that starts nothing: a launch is reported started at once, a stop as an exit by SIGTERM."""

    def __init__(self, gpus: list[GpuInfo], log_dir: Path) -> None:
        self._gpus = tuple(gpus)
        self._log_dir = log_dir
        self.controller: Controller | None = None

    @property
    def gpus(self) -> tuple[GpuInfo, ...]:
        return self._gpus

    def start(self) -> None:
        pass

    def close(self) -> None:
        pass

    def _report(self, report: ProcessStarted | ProcessExited) -> None:
        assert self.controller is not None
        self.controller.deliver(report)

    def launch(self, req: LaunchRequest) -> None:
        self._report(ProcessStarted(job_id=req.job_id, run=req.run, pid=1, started_at=time.time()))

    def preempt(self, job_id: str, run: int) -> None:
        self._report(
            ProcessExited(job_id=job_id, run=run, exit_code=None, signal=15, requested="preempt", detail="stopped")
        )

    def cancel(self, job_id: str, run: int) -> None:
        self._report(
            ProcessExited(job_id=job_id, run=run, exit_code=None, signal=15, requested="cancel", detail="stopped")
        )

    def pause(self, job_id: str, run: int, *, evict: bool = False) -> None:
        pass

    def resume(self, job_id: str, run: int) -> None:
        pass

    def send(self, job_id: str, run: int, message: contract.SetBatchSize | contract.SetLimits) -> bool:
        return True

    def adopt(self, job_id: str, run: int) -> bool:
        return False

    def log_path(self, job_id: str) -> Path:
        return self._log_dir / f"{job_id}.log"


@pytest.fixture(scope="module")
def controller(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Controller]:
    state = tmp_path_factory.mktemp("fuzz")
    config = ServeConfig(
        state_dir=state,
        gpus=2,
        tenants=(TenantConfig("alice", 1, token=ALICE), TenantConfig("bob", 1, token=BOB)),
        admin_token=ADMIN,
        policy="fifo",
    )
    gpus = stand_in_gpus(2)
    cluster, order = cluster_for(gpus, [Tenant("alice", 1), Tenant("bob", 1)])
    agent = StandInAgent(gpus, state)
    c = Controller(
        cluster=cluster,
        policy=make_policy("fifo"),
        store=Store(state / "corral.db"),
        agent=agent,
        gpu_order=order,
        config=config,
    )
    agent.controller = c
    c.start()
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def api(controller: Controller) -> TestClient:
    return TestClient(create_app(controller), raise_server_exceptions=False)


def stored(controller: Controller) -> tuple[Any, ...]:
    """Everything the store holds, once the controller has nothing left to do."""
    assert controller.wait_idle(10)
    db = controller.store._db
    with controller.store._lock:
        jobs = db.execute("SELECT job_id, phase, status, process FROM jobs ORDER BY seq").fetchall()
        events = db.execute("SELECT COUNT(*) FROM events").fetchone()
    return tuple(jobs), events


def check(r: Any, *names: str) -> None:
    """What every answer must be: no 5xx, no traceback, and an error that says in one sentence what is wrong,
    naming one of ``names`` (or, for a refused submission, the thing the value is about)."""
    assert r.status_code < 500, (r.status_code, r.text[:500])
    assert "Traceback" not in r.text and 'File "' not in r.text, r.text[:500]
    if r.status_code >= 400:
        body = r.json()
        assert set(body) == {"detail"} and isinstance(body["detail"], str) and body["detail"], body
        assert len(r.content) < 3000, r.text[:500]
        if r.status_code == 422 and names:
            assert any(n in body["detail"] for n in names), body["detail"]


# -- submissions ------------------------------------------------------------------------------------------------
json_scalars = (
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20)
)
json_values = st.recursive(
    json_scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
)
texts = st.text(max_size=30) | st.sampled_from(["", "/", "/tmp", "true", "alice", "bob", "CORRAL_RUN", "\x1b[2J"])
field_values: dict[str, st.SearchStrategy[Any]] = {
    "command": st.lists(texts, max_size=4) | json_values,
    "tenant": texts | json_values,
    "num_gpus": st.integers(-3, 4) | json_values,
    "gpu_milli": st.integers(-1, 1200) | json_values,
    "opportunistic": st.booleans() | json_values,
    "name": texts | json_values,
    "cwd": texts | st.just("/no/such/dir") | json_values,
    "env": st.dictionaries(texts, texts, max_size=3) | json_values,
    "gpu_mem_mib": st.integers(-1, 20_000) | st.none() | json_values,
    "priority": st.integers(-2_000_000, 2_000_000) | json_values,
    "warm": st.booleans() | json_values,
}
bodies = st.fixed_dictionaries({}, optional={**field_values, "junk": json_values}) | json_values


@FUZZ
@given(body=bodies, headers=st.sampled_from([A, B, ROOT]))
def test_generated_submissions(api: TestClient, controller: Controller, body: Any, headers: dict[str, str]) -> None:
    before = stored(controller)
    r = api.post("/v1/jobs", json=body, headers=headers)
    check(r, *FIELDS, *CONCEPTS, "junk")  # a refusal of the unknown field names it (and may name it alone)
    if r.status_code == 201:
        job = r.json()
        assert job["command"] == body["command"] and job["phase"] in ("pending", "running")
        controller.cancel(job["job_id"])  # keep the GPUs free for the next examples
    else:
        assert stored(controller) == before, r.text


@FUZZ
@given(
    raw=st.binary(max_size=200)
    | st.builds(lambda v: json.dumps(v).encode("utf-8", "surrogatepass"), json_values)
    | st.builds(lambda b, cut: b[:cut], st.just(b'{"command": ["true"], "name": "\xc3\xa9"}'), st.integers(0, 40)),
    content_type=st.sampled_from(["application/json", "application/json; charset=utf-8", "text/plain", None]),
)
def test_generated_raw_bodies(api: TestClient, controller: Controller, raw: bytes, content_type: str | None) -> None:
    before = stored(controller)
    headers = {**A, **({"Content-Type": content_type} if content_type else {})}
    r = api.post("/v1/jobs", content=raw, headers=headers)
    check(r, *FIELDS, *CONCEPTS)
    if r.status_code == 201:
        controller.cancel(r.json()["job_id"])
    else:
        assert r.status_code in (403, 404, 422), r.text
        assert stored(controller) == before


# -- queries and paths ------------------------------------------------------------------------------------------
query_values = (
    st.text(max_size=30)
    | st.integers(-5, 2000).map(str)
    | st.sampled_from(
        ["pending", "running,finished", "pending,", "oldest", "newest", "alice", "bob", "0", "1000", "1001"]
    )
)


@FUZZ
@given(
    params=st.lists(
        st.tuples(st.sampled_from(["tenant", "phase", "limit", "cursor", "order", "offset", "junk"]), query_values),
        max_size=5,
    ),
    headers=st.sampled_from([A, B, ROOT]),
)
def test_generated_list_queries(
    api: TestClient, controller: Controller, params: list[tuple[str, str]], headers: dict[str, str]
) -> None:
    r = api.get("/v1/jobs", params=params, headers=headers)
    check(r, "query parameter", "tenant")
    if r.status_code == 200:
        page = r.json()
        assert page["total"] >= len(page["jobs"])
        if headers is not ROOT:  # a tenant's token lists its own jobs only
            assert {j["tenant"] for j in page["jobs"]} <= {"alice" if headers is A else "bob"}
    else:
        assert r.status_code in (403, 404, 422), r.text


job_ids = st.text(min_size=1, max_size=40).filter(lambda s: s not in (".", "..")) | st.sampled_from(
    ["1", "0", "-1", "abcdefgh", "%00", "null", "\x1b[2J"]
)


@FUZZ
@given(
    job_id=job_ids,
    route=st.sampled_from(["GET {}", "GET {}/events", "GET {}/logs", "POST {}/cancel"]),
    params=st.dictionaries(st.sampled_from(["offset", "limit"]), query_values, max_size=2),
    headers=st.sampled_from([A, B, ROOT]),
)
def test_generated_job_paths(
    api: TestClient, controller: Controller, job_id: str, route: str, params: dict[str, str], headers: dict[str, str]
) -> None:
    from urllib.parse import quote

    before = stored(controller)
    method, template = route.split(" ")
    r = api.request(method, "/v1/jobs/" + template.format(quote(job_id, safe="")), params=params, headers=headers)
    check(r, "query parameter")
    if r.status_code == 404:  # no such job; or no such route, when the id holds a slash
        assert r.json()["detail"].startswith("no job ") or "/" in job_id, r.text
    assert stored(controller) == before


@FUZZ
@given(
    value=st.text(max_size=60)
    | st.builds(lambda a, b, c: f"{a}Bearer{b}{ALICE}{c}", *[st.sampled_from(["", " ", "  ", "\t"])] * 3),
    twice=st.booleans(),
)
def test_generated_authorization(api: TestClient, value: str, twice: bool) -> None:
    sent = value.replace("\r", "").replace("\n", "").encode("latin-1", "ignore")  # the bytes a header can hold
    value = sent.decode("latin-1")
    headers = [(b"Authorization", sent)] * (2 if twice else 1)
    r = api.get("/v1/tenants", headers=headers)
    check(r)
    exact = value == f"Bearer {ALICE}"
    assert r.status_code == (200 if exact and not twice else 401), (value, r.text)
    if r.status_code == 401:
        assert r.headers["www-authenticate"] == "Bearer"


# -- pages ---------------------------------------------------------------------------------------------------------
@FUZZ
@given(
    jobs=st.lists(st.tuples(st.sampled_from(["alice", "bob"]), st.sampled_from(list(JobPhase))), max_size=30),
    tenant=st.none() | st.sampled_from(["alice", "bob"]),
    phases=st.none() | st.sets(st.sampled_from(list(JobPhase)), max_size=3),
    limit=st.integers(1, 7),
    newest_first=st.booleans(),
)
def test_pages_tile_the_filtered_list(
    jobs: list[tuple[str, JobPhase]],
    tenant: str | None,
    phases: set[JobPhase] | None,
    limit: int,
    newest_first: bool,
) -> None:
    """Page after page (each starting after the last job of the one before) gives every job that matches, once,
    in order: the per-phase reads of Store.jobs merge as one ordered list would."""
    store = Store(":memory:")
    with store.transaction():
        for seq, (owner, phase) in enumerate(jobs, start=1):
            spec = JobSpec(job_id=f"j{seq}", submit_s=float(seq), num_gpus=1, tenant=owner)
            request = JobRequest(command=("true",), tenant=owner)
            store.insert(seq, request, JobStatus(spec=spec, phase=phase), ProcessState())
    expected = [
        f"j{seq}"
        for seq, (owner, phase) in enumerate(jobs, start=1)
        if (tenant is None or owner == tenant) and (phases is None or phase in phases)
    ]
    if newest_first:
        expected.reverse()
    got: list[str] = []
    after: str | None = None
    for _ in range(len(jobs) + 1):
        page = store.jobs(tenant=tenant, phases=phases, limit=limit, after=after, newest_first=newest_first)
        assert len(page) <= limit
        got += [r.job_id for r in page]
        if len(page) < limit:
            break
        after = page[-1].job_id
    assert got == expected
    assert store.count(tenant=tenant, phases=phases) == len(expected)
    assert store.jobs(after="no-such-job") == []


# -- schemathesis -------------------------------------------------------------------------------------------------
def test_schemathesis_finds_nothing(api: TestClient, controller: Controller) -> None:
    """Every operation of the OpenAPI schema, positive and negative cases, every built-in check (server errors,
    undeclared status codes, answers that do not fit the schema, schema-invalid input accepted, auth ignored,
    405 without Allow, ...), in process (ASGI: no network). A schema-valid submission may still be refused with
    422 (a working directory that does not exist here, more GPUs than the quota), and a schema-valid cursor that
    this server did not give is refused too: the schema cannot say what the cluster holds."""
    import schemathesis
    from hypothesis.errors import Unsatisfiable
    from schemathesis import GenerationMode

    config = schemathesis.Config.from_dict(
        {
            "headers": {"Authorization": f"Bearer {ADMIN}"},
            # 413 is a refusal too: a generated body above max_body_bytes.
            "checks": {
                "negative_data_rejection": {
                    "expected-statuses": ["400", "401", "403", "404", "405", "409", "413", "415", "422"]
                }
            },
            "operations": [
                {
                    "include-name": "POST /v1/jobs",
                    "checks": {"positive_data_acceptance": {"expected-statuses": ["201", "403", "404", "422"]}},
                },
                {  # a submission's body and checks, nothing submitted
                    "include-name": "POST /v1/jobs/test",
                    "checks": {"positive_data_acceptance": {"expected-statuses": ["200", "403", "404", "422"]}},
                },
                {  # a schema-valid policy spec names no registered policy, or a bad option, more often than not
                    "include-name": "POST /v1/estimates/whatif",
                    "checks": {"positive_data_acceptance": {"expected-statuses": ["200", "403", "422"]}},
                },
                {
                    "include-name": "GET /v1/jobs",
                    "checks": {"positive_data_acceptance": {"expected-statuses": ["200", "403", "404", "422"]}},
                },
            ],
        }
    )
    schema = schemathesis.openapi.from_asgi("/openapi.json", api.app, config=config)
    raw = api.get("/openapi.json").json()["paths"]
    failures: list[str] = []
    for result in schema.get_all_operations():
        op = result.ok()
        spec = raw[op.path][op.method.lower()]
        # Negative cases need something to break: a body, or a query parameter with a type.
        negatable = "requestBody" in spec or any(p["in"] == "query" for p in spec.get("parameters", ()))
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE) if negatable else (GenerationMode.POSITIVE,):

            @given(case=op.as_strategy(generation_mode=mode))
            @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), database=None)
            def run(case: Any) -> None:
                case.call_and_validate()

            try:
                run()
            except Unsatisfiable:
                failures.append(f"{op.label} ({mode.value}): no case could be generated")
            except Exception as e:  # gathered (and cut: a case can be 64 KB), so one run reports every operation
                failures.append(f"{op.label} ({mode.value}): {str(e)[:1500]}")
    assert not failures, "\n\n".join(failures[:5])
