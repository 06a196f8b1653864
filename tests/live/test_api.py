"""The HTTP API against a real controller with two stand-in GPUs and real job processes: a job's whole life,
tenant isolation (what a tenant sees: its own jobs, counts and ids only), paging the job list, every bad request
refused with a clear message and nothing changed (strict Authorization, non-UTF-8 bodies, capped echoes), the
OpenAPI schema (enums, declared responses, 405 with Allow), and cancelling a running job. Fuzzing (hypothesis and
schemathesis) is in test_api_fuzz.py."""

from __future__ import annotations

import contextlib
import re
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, get_args

import pytest

with warnings.catch_warnings():  # newer Starlette nags about httpx; the client works
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from corral.core.job import JobClass, JobPhase
from corral.live.api import MAX_ECHO_CHARS, create_app, encode_cursor, utf8_cut
from corral.live.config import ServeConfig, TenantConfig
from corral.live.controller import Controller
from corral.live.records import BadRequest, ProcessPhase

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

ALICE = "alice-token-0123456789"
BOB = "bob-token-0123456789ab"
ADMIN = "admin-token-0123456789"
PY = sys.executable


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


A, B, ROOT = auth(ALICE), auth(BOB), auth(ADMIN)


@pytest.fixture
def controller(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Controller]:
    # A short state dir: the agent's Unix socket lives there (paths are limited to ~100 bytes).
    config = ServeConfig(
        state_dir=tmp_path_factory.mktemp("c"),
        gpus=2,
        tenants=(TenantConfig("alice", 1, token=ALICE), TenantConfig("bob", 1, token=BOB)),
        admin_token=ADMIN,
        policy="fifo",
        grace_s=2.0,
    )
    c = Controller.from_config(config)
    c.start()
    try:
        yield c
    finally:  # leave no process behind: stop() alone keeps jobs running for the next start
        for record in c.jobs(phases=[JobPhase.PENDING, JobPhase.RUNNING]):
            with contextlib.suppress(BadRequest):
                c.cancel(record.job_id)
        deadline = time.monotonic() + 20
        while any(r.process.phase is not ProcessPhase.NONE for r in c.jobs()) and time.monotonic() < deadline:
            time.sleep(0.05)
        c.stop()


@pytest.fixture
def api(controller: Controller) -> TestClient:
    return TestClient(create_app(controller))


def submit(api: TestClient, headers: dict[str, str], **body: Any) -> dict[str, Any]:
    r = api.post("/v1/jobs", json=body, headers=headers)
    assert r.status_code == 201, r.text
    job: dict[str, Any] = r.json()
    return job


def wait_for(api: TestClient, job_id: str, phases: set[str], headers: dict[str, str] = ROOT) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while True:
        job: dict[str, Any] = api.get(f"/v1/jobs/{job_id}", headers=headers).json()
        if job["phase"] in phases and (job["phase"] != "running" or job["process"]["phase"] == "running"):
            return job
        assert time.monotonic() < deadline, f"job {job_id} stuck in {job['phase']}: {job}"
        time.sleep(0.05)


def wait_ended(api: TestClient, job_id: str) -> dict[str, Any]:
    """Until the job ended and its process is gone (its log is complete)."""
    deadline = time.monotonic() + 30
    while True:
        job: dict[str, Any] = api.get(f"/v1/jobs/{job_id}", headers=ROOT).json()
        if job["phase"] in ("finished", "failed", "cancelled", "rejected") and job["process"]["phase"] == "none":
            return job
        assert time.monotonic() < deadline, f"job {job_id} did not end: {job}"
        time.sleep(0.05)


def read_log(api: TestClient, job_id: str, headers: dict[str, str] = ROOT, limit: int | None = None) -> str:
    text, offset = "", 0
    for _ in range(10_000):
        params: dict[str, int] = {"offset": offset}
        if limit is not None:
            params["limit"] = limit
        chunk = api.get(f"/v1/jobs/{job_id}/logs", params=params, headers=headers).json()
        text += chunk["text"]
        offset = chunk["next_offset"]
        if chunk["complete"]:
            return text
    raise AssertionError("the log never completed")


# -- a job's life ---------------------------------------------------------------------------------------------
def test_submit_run_finish_with_logs_and_events(api: TestClient) -> None:
    job = submit(api, A, command=[PY, "-c", "print('hello from corral')"], name="hi")
    assert job["phase"] == "pending" and job["tenant"] == "alice" and job["name"] == "hi"
    assert job["cwd"] and Path(job["cwd"]).is_absolute()
    done = wait_ended(api, job["job_id"])
    assert done["phase"] == "finished", done
    assert done["process"]["exit_code"] == 0 and done["first_start_s"] is not None and done["end_s"] is not None
    assert "hello from corral" in read_log(api, job["job_id"], A)
    kinds = [e["kind"] for e in api.get(f"/v1/jobs/{job['job_id']}/events", headers=A).json()["events"]]
    assert kinds[0] == "submitted" and "finished" in kinds
    listed = api.get("/v1/jobs", params={"phase": "finished"}, headers=A).json()["jobs"]
    assert [j["job_id"] for j in listed] == [job["job_id"]]


def test_a_failing_job_is_failed(api: TestClient) -> None:
    job = submit(api, B, command=[PY, "-c", "import sys; print('oops', file=sys.stderr); sys.exit(3)"])
    done = wait_ended(api, job["job_id"])
    assert done["phase"] == "failed" and done["process"]["exit_code"] == 3
    assert "oops" in read_log(api, job["job_id"])


def test_logs_in_small_chunks_never_split_a_character(api: TestClient) -> None:
    job = submit(api, A, command=[PY, "-c", "print('é€😀' * 50)"], env={"PYTHONIOENCODING": "utf-8"})
    wait_ended(api, job["job_id"])
    whole = read_log(api, job["job_id"])
    assert "é€😀" * 50 in whole
    for limit in (1, 2, 3, 5, 7):
        assert read_log(api, job["job_id"], limit=limit) == whole


def test_utf8_cut() -> None:
    text = "aé€😀".encode()
    assert utf8_cut(text) == len(text)
    assert utf8_cut(text[:-1]) == len(text) - 4  # half an emoji is kept for the next chunk
    assert utf8_cut(text[:2]) == 1
    assert utf8_cut(b"") == 0


def test_logs_before_the_job_started_are_empty(api: TestClient, controller: Controller) -> None:
    blocker = submit(api, A, command=[PY, "-c", "import time; time.sleep(30)"])
    waiting = submit(api, A, command=[PY, "-c", "print(1)"])  # alice's quota is 1 GPU: it waits
    wait_for(api, blocker["job_id"], {"running"})
    chunk = api.get(f"/v1/jobs/{waiting['job_id']}/logs", headers=A).json()
    assert chunk == {
        "job_id": waiting["job_id"],
        "offset": 0,
        "next_offset": 0,
        "text": "",
        "size": 0,
        "complete": False,
    }
    for j in (waiting, blocker):
        assert api.post(f"/v1/jobs/{j['job_id']}/cancel", headers=A).status_code == 200


def test_cancel_a_running_job(api: TestClient) -> None:
    job = submit(api, A, command=[PY, "-c", "import time; print('up', flush=True); time.sleep(60)"])
    running = wait_for(api, job["job_id"], {"running"}, A)
    assert running["placement"]["gpus"] in ([0], [1])
    snapshot = api.get("/v1/cluster", headers=A).json()
    assert sum(len(g["jobs"]) for g in snapshot["gpus"]) == 1 and snapshot["running"] == 1
    r = api.post(f"/v1/jobs/{job['job_id']}/cancel", headers=A)
    assert r.status_code == 200, r.text
    assert r.json()["phase"] == "cancelled"
    done = wait_ended(api, job["job_id"])
    assert done["phase"] == "cancelled" and done["process"]["exit_code"] != 0
    again = api.post(f"/v1/jobs/{job['job_id']}/cancel", headers=A)
    assert again.status_code == 409 and "already ended" in again.json()["detail"]
    assert api.get("/v1/cluster", headers=A).json()["running"] == 0


def test_cancel_a_pending_job(api: TestClient) -> None:
    blocker = submit(api, B, command=[PY, "-c", "import time; time.sleep(30)"])
    waiting = submit(api, B, command=[PY, "-c", "print(1)"])
    wait_for(api, blocker["job_id"], {"running"})
    r = api.post(f"/v1/jobs/{waiting['job_id']}/cancel", headers=B)
    assert r.status_code == 200 and r.json()["phase"] == "cancelled"
    api.post(f"/v1/jobs/{blocker['job_id']}/cancel", headers=ROOT)
    wait_ended(api, blocker["job_id"])


def test_a_pending_job_says_why_it_waits(api: TestClient) -> None:
    # bob's quota is 1 GPU: his second job waits for it, and the API says so (Slurm's reason column).
    blocker = submit(api, B, command=[PY, "-c", "import time; time.sleep(30)"])
    wait_for(api, blocker["job_id"], {"running"})
    waiting = submit(api, B, command=[PY, "-c", "print(1)"])
    deadline = time.monotonic() + 30
    while (job := api.get(f"/v1/jobs/{waiting['job_id']}", headers=B).json())["wait_reason"] is None:
        assert time.monotonic() < deadline, job
        time.sleep(0.05)
    assert job["phase"] == "pending"
    assert job["wait_reason"] == "tenant bob at quota 1/1 GPUs"
    listed = api.get("/v1/jobs", params={"phase": "pending"}, headers=B).json()["jobs"]
    assert [j["wait_reason"] for j in listed] == ["tenant bob at quota 1/1 GPUs"]
    # Running, it has no reason to wait.
    assert api.get(f"/v1/jobs/{blocker['job_id']}", headers=B).json()["wait_reason"] is None
    for job_id in (waiting["job_id"], blocker["job_id"]):
        api.post(f"/v1/jobs/{job_id}/cancel", headers=ROOT)
    wait_ended(api, blocker["job_id"])


# -- tenants ----------------------------------------------------------------------------------------------------
def test_tenant_isolation(api: TestClient) -> None:
    mine = submit(api, A, command=[PY, "-c", "import time; time.sleep(30)"])
    theirs = submit(api, B, command=[PY, "-c", "print('bob')"])
    wait_for(api, mine["job_id"], {"running"})
    wait_ended(api, theirs["job_id"])
    bid = theirs["job_id"]

    # Another tenant's job is exactly as absent as a job that does not exist.
    nosuch = api.get("/v1/jobs/999", headers=A)
    assert nosuch.status_code == 404
    for method, path in (
        ("GET", f"/v1/jobs/{bid}"),
        ("GET", f"/v1/jobs/{bid}/events"),
        ("GET", f"/v1/jobs/{bid}/logs"),
        ("POST", f"/v1/jobs/{bid}/cancel"),
    ):
        r = api.request(method, path, headers=A)
        assert r.status_code == 404, (path, r.text)
        assert r.json()["detail"] == f"no job {bid!r}"
    assert api.get("/v1/jobs/999", headers=A).json()["detail"] == "no job '999'"

    assert [
        j["tenant"] for j in api.get("/v1/jobs", params={"phase": "running,finished"}, headers=A).json()["jobs"]
    ] == ["alice"]
    everything = api.get("/v1/jobs", params=[("phase", "running"), ("phase", "finished")], headers=ROOT).json()
    assert {j["job_id"] for j in everything["jobs"]} == {mine["job_id"], bid}
    bobs = api.get("/v1/jobs", params={"tenant": "bob"}, headers=ROOT).json()["jobs"]
    assert [j["job_id"] for j in bobs] == [bid]
    assert api.get("/v1/jobs", params={"tenant": "bob", "phase": "running"}, headers=ROOT).json()["jobs"] == []
    r = api.get("/v1/jobs", params={"tenant": "alice"}, headers=B)
    assert r.status_code == 403 and "cannot list" in r.json()["detail"]
    r = api.post("/v1/jobs", json={"command": ["true"], "tenant": "alice"}, headers=B)
    assert r.status_code == 403 and "cannot submit for 'alice'" in r.json()["detail"]

    # The admin sees and acts on every job.
    assert api.get(f"/v1/jobs/{bid}", headers=ROOT).json()["tenant"] == "bob"
    assert "bob" in read_log(api, bid, ROOT)

    # The cluster: bob sees that a GPU is busy and how much of it is given out; not alice's job, its share or
    # her counts (this asserted before that bob saw her job's share, which counted her running jobs).
    bobs_view = api.get("/v1/cluster", headers=B).json()
    assert [j for g in bobs_view["gpus"] for j in g["jobs"]] == []
    busy = [g for g in bobs_view["gpus"] if g["busy"]]
    assert len(busy) == 1 and busy[0]["allocated_milli"] == 1000
    assert busy[0]["sm_util"] is None and busy[0]["mem_used_mib"] is None  # another tenant's telemetry
    assert (bobs_view["running"], bobs_view["pending"]) == (0, 0)  # bob's own counts
    alices_view = api.get("/v1/cluster", headers=A).json()
    on = [j for g in alices_view["gpus"] for j in g["jobs"]]
    assert on == [{"job_id": mine["job_id"], "tenant": "alice", "gpu_milli": 1000, "opportunistic": False}]
    assert alices_view["running"] == 1
    assert api.get("/v1/cluster", headers=ROOT).json()["running"] == 1
    assert [t["name"] for t in api.get("/v1/tenants", headers=B).json()["tenants"]] == ["bob"]
    tenants = {t["name"]: t for t in api.get("/v1/tenants", headers=ROOT).json()["tenants"]}
    assert set(tenants) == {"alice", "bob"}
    assert tenants["alice"]["quota_gpus"] == 1 and tenants["alice"]["guaranteed_gpus"] == 1.0
    assert tenants["alice"]["running"] == 1 and tenants["bob"]["running"] == 0

    api.post(f"/v1/jobs/{mine['job_id']}/cancel", headers=ROOT)
    wait_ended(api, mine["job_id"])


def test_the_admin_names_the_tenant(api: TestClient) -> None:
    r = api.post("/v1/jobs", json={"command": ["true"]}, headers=ROOT)
    assert r.status_code == 422 and "tenant is required" in r.json()["detail"]
    job = submit(api, ROOT, command=[PY, "-c", "pass"], tenant="bob")
    assert job["tenant"] == "bob"
    wait_ended(api, job["job_id"])


# -- bad requests ---------------------------------------------------------------------------------------------------
GOOD = {"command": [PY, "-c", "pass"]}

BAD: list[tuple[str, dict[str, str], Any, int, str]] = [
    # (case, headers, body, status, words in the detail)
    ("zero GPUs", A, {**GOOD, "num_gpus": 0}, 422, "field 'num_gpus': Input should be greater than or equal to 1"),
    ("negative GPUs", A, {**GOOD, "num_gpus": -2}, 422, "num_gpus"),
    ("more GPUs than the cluster", A, {**GOOD, "num_gpus": 3, "opportunistic": True}, 422, "this cluster has 2"),
    ("above the quota", A, {**GOOD, "num_gpus": 2}, 422, "quota of 1 GPU;"),
    ("share of zero", A, {**GOOD, "gpu_milli": 0}, 422, "gpu_milli"),
    ("share above one", A, {**GOOD, "gpu_milli": 1001}, 422, "gpu_milli"),
    (
        "fraction of two",
        B,
        {**GOOD, "num_gpus": 2, "gpu_milli": 500, "opportunistic": True},
        422,
        "needs num_gpus == 1",
    ),
    ("no command", A, {"num_gpus": 1}, 422, "field 'command' is required"),
    ("empty command", A, {"command": []}, 422, "field 'command'"),
    ("empty argument", A, {"command": [""]}, 422, "field 'command.0'"),
    ("command as a string", A, {"command": "python x.py"}, 422, "field 'command': Input should be a valid list"),
    ("GPUs as a string", A, {**GOOD, "num_gpus": "1"}, 422, "field 'num_gpus': Input should be a valid integer"),
    ("GPUs as a float", A, {**GOOD, "num_gpus": 1.5}, 422, "field 'num_gpus'"),
    ("an unknown field", A, {**GOOD, "gpus": 1}, 422, "field 'gpus' is not a known field"),
    ("not an object", A, [1, 2], 422, "the body"),
    ("a relative cwd", A, {**GOOD, "cwd": "here"}, 422, "cwd must be an absolute path"),
    ("a missing cwd", A, {**GOOD, "cwd": "/no/such/dir"}, 422, "does not exist"),
    ("a reserved variable", A, {**GOOD, "env": {"CORRAL_JOB_ID": "x"}}, 422, "CORRAL_JOB_ID"),
    ("an unknown tenant", ROOT, {**GOOD, "tenant": "carol"}, 404, "unknown tenant 'carol'"),
    ("another tenant", A, {**GOOD, "tenant": "bob"}, 403, "cannot submit for 'bob'"),
    ("an unknown token", auth("x" * 20), GOOD, 401, "unknown token"),
    ("no token", {}, GOOD, 401, "missing token"),
    ("another scheme", {"Authorization": f"Basic {ALICE}"}, GOOD, 401, "missing token"),
    ("two spaces after Bearer", {"Authorization": f"Bearer  {ALICE}"}, GOOD, 401, "malformed Authorization"),
    ("a space after the token", {"Authorization": f"Bearer {ALICE} "}, GOOD, 401, "malformed Authorization"),
    ("Bearer and no token", {"Authorization": "Bearer"}, GOOD, 401, "malformed Authorization"),
    ("Bearer and a space", {"Authorization": "Bearer "}, GOOD, 401, "malformed Authorization"),
    ("a tab for the space", {"Authorization": f"Bearer\t{ALICE}"}, GOOD, 401, "missing token"),
    ("a 10 KB cwd", A, {**GOOD, "cwd": "/" + "x" * 10_000}, 422, "field 'cwd': String should have at most 4096"),
    ("a long relative cwd", A, {**GOOD, "cwd": "x" * 4000}, 422, "field 'cwd': cwd must be an absolute path"),
]


@pytest.mark.parametrize(("case", "headers", "body", "status", "words"), BAD, ids=[c[0] for c in BAD])
def test_bad_submissions_change_nothing(
    api: TestClient, controller: Controller, case: str, headers: dict[str, str], body: Any, status: int, words: str
) -> None:
    before = len(controller.jobs())
    r = api.post("/v1/jobs", json=body, headers=headers)
    assert r.status_code == status, r.text
    assert words in r.json()["detail"], r.json()
    assert isinstance(r.json()["detail"], str)
    assert len(controller.jobs()) == before
    if status == 401:
        assert r.headers["www-authenticate"] == "Bearer"


def test_malformed_json(api: TestClient, controller: Controller) -> None:
    r = api.post("/v1/jobs", content=b'{"command": [', headers={**A, "Content-Type": "application/json"})
    assert r.status_code == 422 and r.json()["detail"].startswith("the body is not valid JSON"), r.text
    assert controller.jobs() == []


@pytest.mark.parametrize(
    ("body", "content_type", "words"),
    [
        (b'{"command": ["\xff"]}', "application/json", "the body is not valid JSON (it is not UTF-8 text: byte 14)"),
        (b'{"command": ["true"], "name": "\xc3"}', "application/json", "not UTF-8 text: byte 31"),
        (b'{"command": ["true"]}', "text/plain", "the body must be a JSON object sent with `Content-Type: application"),
        (b'{"command": ["true"]}', None, "the body must be a JSON object sent with `Content-Type: application"),
        (b"command=true", "application/x-www-form-urlencoded", "the body must be a JSON object"),
    ],
)
def test_bodies_that_are_not_json_are_422(
    api: TestClient, controller: Controller, body: bytes, content_type: str | None, words: str
) -> None:
    # Before, bytes that were not UTF-8 got FastAPI's generic 400 ("There was an error parsing the body").
    headers = dict(A) if content_type is None else {**A, "Content-Type": content_type}
    r = api.post("/v1/jobs", content=body, headers=headers)
    assert r.status_code == 422, r.text
    assert words in r.json()["detail"]
    assert controller.jobs() == []


def test_authorization_must_be_one_header_of_the_exact_form(api: TestClient) -> None:
    r = api.get("/v1/jobs", headers=[("Authorization", f"Bearer {ALICE}"), ("Authorization", f"Bearer {BOB}")])
    assert r.status_code == 401 and "more than one Authorization header" in r.json()["detail"]
    assert r.headers["www-authenticate"] == "Bearer"
    r = api.get("/v1/jobs", headers=[("Authorization", f"Bearer {ALICE}"), ("Authorization", f"Bearer {ALICE}")])
    assert r.status_code == 401  # even the same token twice
    # The scheme's case is free (RFC 7235 §2.1): that is still the exact form.
    assert api.get("/v1/jobs", headers={"Authorization": f"bearer {ALICE}"}).status_code == 200
    assert api.get("/v1/jobs", headers={"Authorization": f"BEARER {ALICE}"}).status_code == 200


def test_error_messages_quote_at_most_a_little_of_the_input(api: TestClient) -> None:
    long = "q" * 10_000
    cases = [
        api.get(f"/v1/jobs/{long}", headers=A),
        api.get(f"/v1/jobs/{long}/events", headers=ROOT),
        api.post(f"/v1/jobs/{long}/cancel", headers=ROOT),
        api.get("/v1/jobs", params={"tenant": long}, headers=ROOT),
        api.get("/v1/jobs", params={"phase": long}, headers=ROOT),
        api.get("/v1/jobs", params={"cursor": long}, headers=ROOT),
        api.post("/v1/jobs", json={**GOOD, "env": {long + "=": "1"}}, headers=A),  # the controller's words
        api.post("/v1/jobs", json={**GOOD, "cwd": "/" + "q" * 4000}, headers=A),
        api.post("/v1/jobs", json={**GOOD, "name": long}, headers=A),
        api.post("/v1/jobs", json={**GOOD, long: 1}, headers=A),
        api.post("/v1/jobs", json={**GOOD, "tenant": long}, headers=A),
    ]
    for r in cases:
        assert 400 <= r.status_code < 500, r.text[:300]
        detail = r.json()["detail"]
        assert "qqq" in detail or "field" in detail, detail[:300]  # it still says what was wrong
        assert max((len(run) for run in re.findall("q+", detail)), default=0) <= MAX_ECHO_CHARS, detail[:300]
        assert len(r.content) < 1000, r.text[:300]


def test_oversize_bodies_are_refused_before_parsing(api: TestClient, controller: Controller) -> None:
    big = {"command": ["echo", "x" * 70_000]}
    r = api.post("/v1/jobs", json=big, headers=A)
    assert r.status_code == 413 and "limit is 65536 bytes" in r.json()["detail"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: chunked transfer
        yield b'{"command": ["echo", "'
        for _ in range(100):
            yield b"x" * 1000
        yield b'"]}'

    r = api.post("/v1/jobs", content=chunks(), headers={**A, "Content-Type": "application/json"})
    assert r.status_code == 413, r.text
    assert controller.jobs() == []

    def small() -> Iterator[bytes]:  # a chunked body under the limit goes through
        yield b'{"command": ["' + PY.encode() + b'", '
        yield b'"-c", "pass"]}'

    r = api.post("/v1/jobs", content=small(), headers={**A, "Content-Type": "application/json"})
    assert r.status_code == 201, r.text
    wait_ended(api, r.json()["job_id"])


@pytest.mark.parametrize(
    ("path", "params", "status", "words"),
    [
        ("/v1/jobs", {"limit": 0}, 422, "query parameter 'limit'"),
        ("/v1/jobs", {"limit": "many"}, 422, "query parameter 'limit'"),
        ("/v1/jobs", {"phase": "sleeping"}, 422, "unknown phase 'sleeping'"),
        ("/v1/jobs", {"tenant": "carol"}, 404, "unknown tenant 'carol'"),
        ("/v1/jobs/1", {}, 404, "no job '1'"),
        ("/v1/jobs/abc/events", {}, 404, "no job 'abc'"),
        ("/v1/jobs/1/logs", {}, 404, "no job '1'"),
    ],
)
def test_bad_queries(api: TestClient, path: str, params: dict[str, Any], status: int, words: str) -> None:
    r = api.get(path, params=params, headers=ROOT)
    assert r.status_code == status, r.text
    assert words in r.json()["detail"]


def test_bad_log_offsets(api: TestClient) -> None:
    job = submit(api, A, **GOOD)
    r = api.get(f"/v1/jobs/{job['job_id']}/logs", params={"offset": -1}, headers=A)
    assert r.status_code == 422 and "query parameter 'offset'" in r.json()["detail"]
    r = api.get(f"/v1/jobs/{job['job_id']}/logs", params={"limit": 10**9}, headers=A)
    assert r.status_code == 422
    wait_ended(api, job["job_id"])
    far = api.get(f"/v1/jobs/{job['job_id']}/logs", params={"offset": 10**9}, headers=A).json()
    assert far["text"] == "" and far["next_offset"] == 10**9


def test_cancel_unknown(api: TestClient) -> None:
    r = api.post("/v1/jobs/77/cancel", headers=ROOT)
    assert r.status_code == 404 and r.json()["detail"] == "no job '77'"


def test_unexpected_errors_are_500_without_a_traceback(
    controller: Controller, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def boom() -> None:
        raise RuntimeError("secret internals")

    monkeypatch.setattr(controller, "cluster", boom)
    api = TestClient(create_app(controller), raise_server_exceptions=False)
    r = api.get("/v1/cluster", headers=ROOT)
    assert r.status_code == 500
    assert r.json() == {"detail": "internal server error (the server's log says more)"}
    assert "secret" not in r.text and "Traceback" not in r.text
    assert "secret internals" in caplog.text  # logged on the server's side


# -- ids and pages ------------------------------------------------------------------------------------------------
JOB_ID = re.compile(r"[abcdefghjkmnpqrstuvwxyz23456789]{8}")


def test_job_ids_are_opaque(api: TestClient, controller: Controller) -> None:
    # Before, ids were the global sequence 1, 2, 3...: alice's two ids told her how many jobs bob submitted between.
    ids = [submit(api, A if i % 2 else B, command=[PY, "-c", "pass"])["job_id"] for i in range(6)]
    assert all(JOB_ID.fullmatch(i) for i in ids), ids
    assert len(set(ids)) == 6
    assert not any(i.isdigit() for i in ids)
    assert [r.job_id for r in controller.jobs()] == ids  # listed in submission order all the same
    for i in ids:
        wait_ended(api, i)


def test_the_job_list_is_paged(api: TestClient, controller: Controller) -> None:
    for i in range(7):
        submit(api, A if i < 5 else B, command=[PY, "-c", "pass"], name=f"j{i}", opportunistic=True)
    every = [r.job_id for r in controller.jobs()]
    assert len(every) == 7

    def pages(headers: dict[str, str], **params: Any) -> list[list[str]]:
        out, cursor = [], None
        while True:
            query = {**params, **({"cursor": cursor} if cursor else {})}
            r = api.get("/v1/jobs", params=query, headers=headers)
            assert r.status_code == 200, r.text
            page = r.json()
            out.append([j["job_id"] for j in page["jobs"]])
            cursor = page["next_cursor"]
            if cursor is None:
                return out

    first = api.get("/v1/jobs", params={"limit": 3}, headers=ROOT).json()
    assert first["total"] == 7 and len(first["jobs"]) == 3 and first["next_cursor"]
    assert pages(ROOT, limit=3) == [every[0:3], every[3:6], every[6:7]]
    assert pages(ROOT, limit=7) == [every]
    assert pages(ROOT, limit=3, order="newest") == [every[6:3:-1], every[3:0:-1], every[0:1]]
    # A tenant's pages and total hold its own jobs only.
    alice = api.get("/v1/jobs", params={"limit": 2}, headers=A).json()
    assert alice["total"] == 5
    assert pages(A, limit=2) == [every[0:2], every[2:4], every[4:5]]
    assert api.get("/v1/jobs", params={"limit": 2}, headers=B).json()["total"] == 2
    assert api.get("/v1/jobs", params={"phase": "cancelled"}, headers=ROOT).json() == {
        "jobs": [],
        "total": 0,
        "next_cursor": None,
    }
    # The default page size; the most a page holds.
    assert len(api.get("/v1/jobs", headers=ROOT).json()["jobs"]) == 7
    assert api.get("/v1/jobs", params={"limit": 1001}, headers=ROOT).status_code == 422

    # A cursor is the server's: garbage, and a cursor at another tenant's job, are refused alike (nothing says
    # whether that job exists); a cursor of the other order is refused too.
    garbage = api.get("/v1/jobs", params={"cursor": "bm90LWEtam9i"}, headers=A)
    theirs = api.get("/v1/jobs", params={"cursor": encode_cursor(every[6], False)}, headers=A)
    assert garbage.status_code == theirs.status_code == 422
    assert garbage.json() == theirs.json() == {"detail": "query parameter 'cursor': not a cursor this server gave"}
    r = api.get("/v1/jobs", params={"cursor": first["next_cursor"], "order": "newest"}, headers=ROOT)
    assert r.status_code == 422 and "another order" in r.json()["detail"]


# -- the rest -----------------------------------------------------------------------------------------------------
def test_health_needs_no_token(api: TestClient) -> None:
    r = api.get("/v1/health")
    assert r.status_code == 200 and r.json()["status"] == "ok"


def test_cluster_view(api: TestClient) -> None:
    snap = api.get("/v1/cluster", headers=ROOT).json()
    assert snap["num_gpus"] == 2 and snap["policy"].startswith("fifo")
    assert [g["index"] for g in snap["gpus"]] == [0, 1]
    assert all(g["stand_in"] and g["type_name"] == "stand-in" and g["mem_mib"] == 16384 for g in snap["gpus"])


def test_openapi_schema_describes_every_route_and_model(api: TestClient) -> None:
    schema = api.get("/openapi.json").json()
    assert schema["info"]["title"] == "corral"
    paths = schema["paths"]
    expected = {
        ("post", "/v1/jobs"),
        ("get", "/v1/jobs"),
        ("get", "/v1/jobs/{job_id}"),
        ("get", "/v1/jobs/{job_id}/events"),
        ("get", "/v1/events"),
        ("get", "/v1/jobs/{job_id}/logs"),
        ("post", "/v1/jobs/{job_id}/cancel"),
        ("post", "/v1/jobs/test"),
        ("get", "/v1/estimates"),
        ("post", "/v1/estimates"),
        ("get", "/v1/estimates/accuracy"),
        ("post", "/v1/estimates/whatif"),
        ("get", "/v1/cluster"),
        ("get", "/v1/tenants"),
        ("get", "/v1/health"),
    }
    assert {(m, p) for p, ops in paths.items() for m in ops} == expected
    for p, ops in paths.items():
        for m, op in ops.items():
            assert op.get("summary") and op.get("description"), (m, p)
    for name, model in schema["components"]["schemas"].items():
        if name in ("HTTPValidationError", "ValidationError"):
            continue
        assert model.get("description"), name
        for field, prop in model.get("properties", {}).items():
            assert prop.get("description"), (name, field)
    sub = schema["components"]["schemas"]["JobSubmission"]["properties"]
    assert sub["num_gpus"]["minimum"] == 1
    assert (sub["gpu_milli"]["minimum"], sub["gpu_milli"]["maximum"]) == (1, 1000)
    assert "HTTPBearer" in schema["components"]["securitySchemes"]
    assert api.get("/docs").status_code == 200

    # Phases are enums, in the answers and in the query.
    models = schema["components"]["schemas"]
    assert models["JobOut"]["properties"]["phase"]["enum"] == [p.value for p in JobPhase]
    assert models["JobOut"]["properties"]["job_class"]["enum"] == [c.value for c in JobClass]
    assert models["ProcessOut"]["properties"]["phase"]["enum"] == [p.value for p in ProcessPhase]
    query = {q["name"]: q["schema"] for q in paths["/v1/jobs"]["get"]["parameters"]}
    assert query["phase"]["anyOf"][0]["items"]["enum"] == [p.value for p in JobPhase]
    assert query["order"]["enum"] == ["oldest", "newest"]
    assert set(models["JobList"]["properties"]) == {"jobs", "total", "next_cursor"}

    # Every error a route can give is declared, with corral's error body.
    def declared(method: str, path: str) -> set[str]:
        responses = paths[path][method]["responses"]
        for code, response in responses.items():
            if code.startswith("4") or code.startswith("5"):
                assert response["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/ErrorOut"}
        return set(responses)

    common = {"400", "401", "413", "503"}
    assert declared("post", "/v1/jobs") == {"201", "403", "404", "422", *common}
    assert declared("get", "/v1/jobs") == {"200", "403", "404", "422", *common}
    for path in ("/v1/jobs/{job_id}", "/v1/jobs/{job_id}/events", "/v1/jobs/{job_id}/logs"):
        assert declared("get", path) == {"200", "404", "422", *common}
    assert declared("post", "/v1/jobs/{job_id}/cancel") == {"200", "404", "409", "422", *common}
    assert declared("get", "/v1/cluster") == declared("get", "/v1/tenants") == {"200", *common}
    assert declared("get", "/v1/health") == {"200", "400", "413"}


def test_the_wire_literals_are_the_enums() -> None:
    from corral.live.api import models as wire

    assert list(get_args(wire.PhaseName)) == [p.value for p in JobPhase]
    assert list(get_args(wire.ProcessPhaseName)) == [p.value for p in ProcessPhase]
    assert list(get_args(wire.JobClassName)) == [c.value for c in JobClass]


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("DELETE", "/v1/jobs", "GET, POST"),  # two routes share the path: both methods
        ("PUT", "/v1/jobs", "GET, POST"),
        ("DELETE", "/v1/jobs/abc", "GET"),
        ("GET", "/v1/jobs/abc/cancel", "POST"),
        ("POST", "/v1/health", "GET"),
        ("PATCH", "/v1/cluster", "GET"),
    ],
)
def test_405_says_what_is_allowed(api: TestClient, method: str, path: str, allow: str) -> None:
    r = api.request(method, path, headers=ROOT)
    assert r.status_code == 405 and r.headers["allow"] == allow
    assert r.json() == {"detail": "Method Not Allowed"}


def test_the_client_shapes_match_the_api_models() -> None:
    from corral.live import client
    from corral.live.api import models as wire

    pairs = [
        (client.JobJson, wire.JobOut),
        (client.JobListJson, wire.JobList),
        (client.PlacementJson, wire.PlacementOut),
        (client.ProcessJson, wire.ProcessOut),
        (client.TelemetryJson, wire.TelemetryOut),
        (client.EventJson, wire.EventOut),
        (client.FeedEventJson, wire.FeedEventOut),
        (client.EventFeedJson, wire.EventFeed),
        (client.LogChunkJson, wire.LogChunk),
        (client.GpuJobJson, wire.GpuJobOut),
        (client.GpuJson, wire.GpuOut),
        (client.ClusterJson, wire.ClusterOut),
        (client.TenantJson, wire.TenantOut),
        (client.HealthJson, wire.Health),
        (client.EstimateJson, wire.EstimateOut),
        (client.TestStartJson, wire.TestStartOut),
        (client.EstimatesJson, wire.EstimatesOut),
        (client.AccuracyJson, wire.AccuracyOut),
        (client.TenantMoveJson, wire.TenantMoveOut),
        (client.WhatifJson, wire.WhatifOut),
    ]
    for shape, model in pairs:
        assert list(shape.__annotations__) == list(model.model_fields), model.__name__


def test_the_event_feed_shows_a_tenant_its_own_jobs_events_numbered_on_their_own(api: TestClient) -> None:
    quick = [PY, "-c", "pass"]
    a = submit(api, A, command=quick, cwd="/", tenant="alice")["job_id"]
    b = submit(api, B, command=quick, cwd="/", tenant="bob")["job_id"]
    deadline = time.monotonic() + 30
    while {api.get(f"/v1/jobs/{j}", headers=ROOT).json()["phase"] for j in (a, b)} != {"finished"}:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    everything = api.get("/v1/events", headers=ROOT).json()
    assert {e["job_id"] for e in everything["events"]} == {a, b}
    mine = api.get("/v1/events", headers=A).json()
    assert {e["job_id"] for e in mine["events"]} == {a}
    # Positions count alice's events alone: they say nothing of how many bob's jobs had.
    assert [e["position"] for e in mine["events"]] == list(range(1, len(mine["events"]) + 1))
    assert mine["next_after"] == len(mine["events"])
    assert mine["events"][0]["kind"] == "submitted" and mine["events"][-1]["kind"] == "finished"
    page = api.get("/v1/events", params={"after": 1, "limit": 2}, headers=A).json()
    assert page["events"] == mine["events"][1:3] and page["next_after"] == 3
    assert api.get("/v1/events", params={"after": page["next_after"] + 100}, headers=A).json() == {
        "events": [],
        "next_after": page["next_after"] + 100,
    }
    assert api.get("/v1/events", params={"after": -1}, headers=A).status_code == 422


def test_a_suspended_job_says_which_nodes_hold_its_state() -> None:
    from corral.cli.live import _job_phase
    from corral.core.job import JobSpec
    from corral.core.placement import Placement
    from corral.core.status import JobStatus
    from corral.live.api.models import job_out
    from corral.live.records import JobRecord, JobRequest, ProcessState

    spec = JobSpec(job_id="s1", submit_s=0.0, num_gpus=2, tenant="bob")
    request = JobRequest(command=("true",), tenant="bob", cwd="/")
    suspended = JobStatus(spec=spec, phase=JobPhase.PENDING, suspended_from=Placement((0, 5)))
    nodes = ["n0", "n0", "n0", "n0", "n1", "n1"]
    out = job_out(JobRecord(1, request, suspended, ProcessState()), None, nodes.__getitem__).model_dump()
    assert out["suspended_on"] == ["n0", "n1"]
    assert "suspended" in _job_phase(out)  # type: ignore[arg-type]
    plain = JobStatus(spec=spec, phase=JobPhase.PENDING)
    out = job_out(JobRecord(1, request, plain, ProcessState()), None, nodes.__getitem__).model_dump()
    assert out["suspended_on"] is None and "pending" in _job_phase(out)  # type: ignore[arg-type]
