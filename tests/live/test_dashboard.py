"""The dashboard over HTTP (``corral.live.dashboard``), with a real app and controller: stand-in GPUs, two tenants
with tokens, real job processes for both.

Login, logout, session expiry and a bad token; pages redirect and JSON answers 401 without a session; every page
for the admin; a tenant's pages and JSON never name another tenant's jobs, another's job is 404 and another's
tenant page and the scheduler 403; the JSON's numbers are the API's; nothing served names another host, and
every asset comes with its content type; the history is sampled, bounded, and stops with the app.
"""

from __future__ import annotations

import dataclasses
import re
import sys
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from test_controller import shutdown, wait_until

with warnings.catch_warnings():  # newer Starlette nags about httpx; the client works
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from corral.core import contract
from corral.core.errors import InputError
from corral.core.job import JobPhase
from corral.live.agent import JobReported
from corral.live.api import create_app
from corral.live.config import ServeConfig, TenantConfig, load_config
from corral.live.controller import Controller
from corral.live.dashboard import Dashboard
from corral.live.dashboard.history import NO_JOB, History, LatestCluster
from corral.live.dashboard.sessions import COOKIE, Sessions
from corral.live.records import ClusterSnapshot, JobRequest

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

ALICE = "alice-token-0123456789"
BOB = "bob-token-0123456789ab"
ADMIN = "admin-token-0123456789"
SLEEP = (sys.executable, "-c", "import time; print('hello from the job', flush=True); time.sleep(60)")
FORM = {"content-type": "application/x-www-form-urlencoded"}
PAGES = ("/", "/tenants", "/queue", "/scheduler")


@dataclass
class Served:
    controller: Controller
    api: TestClient
    dash: Dashboard
    jobs: dict[str, str]  # role -> job id


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    config = ServeConfig(
        state_dir=tmp_path_factory.mktemp("dash"),
        gpus=2,
        stand_in_mem_mib=8192,
        tenants=(TenantConfig("alice", 1, token=ALICE), TenantConfig("bob", 1, token=BOB)),
        admin_token=ADMIN,
        policy="antman",  # it gives each job a memory cap: the charts' "memory given"
        grace_s=1.0,
        dashboard_sample_s=0.2,
        dashboard_history_s=60.0,
    )
    c = Controller.from_config(config)
    c.start()
    try:
        jobs = {}
        for role, tenant in (("alice-run", "alice"), ("bob-run", "bob"), ("alice-wait", "alice"), ("bob-wait", "bob")):
            jobs[role] = c.submit(
                JobRequest(command=SLEEP, tenant=tenant, name=f"{role}-name", cwd=str(Path.cwd()))
            ).job_id
        assert wait_until(lambda: c.job(jobs["alice-run"]).phase is JobPhase.RUNNING, 20)
        assert wait_until(lambda: c.job(jobs["bob-run"]).phase is JobPhase.RUNNING, 20)
        assert wait_until(lambda: c.job(jobs["alice-wait"]).wait_reason is not None, 20)
        app = create_app(c)
        with TestClient(app) as api:  # runs the lifespan: the history's sampler
            dash: Dashboard = app.state.dashboard
            assert wait_until(lambda: len(dash.history.cluster) >= 3, 20)
            yield Served(c, api, dash, jobs)
        assert not dash.history.running  # the lifespan stopped the sampler
    finally:
        shutdown(c)


def login(api: TestClient, token: str) -> str:
    api.cookies.clear()
    r = api.post("/login", content=f"token={token}", headers=FORM, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/", r.text
    session: str = r.cookies[COOKIE]
    return session


def get(api: TestClient, path: str, session: str | None) -> Any:
    api.cookies.clear()
    cookies = {COOKIE: session} if session is not None else {}
    return api.get(path, cookies=cookies, follow_redirects=False)


def test_login_logout_and_no_session(served: Served) -> None:
    api = served.api
    for path in (*PAGES, "/tenants/alice", f"/jobs/{served.jobs['alice-run']}"):
        r = get(api, path, None)
        assert r.status_code == 303 and r.headers["location"] == "/login", path
        assert get(api, path, "made-up-session-id").status_code == 303, path
    r = get(api, "/ui/data/cluster", None)
    assert r.status_code == 401 and "log in" in r.json()["detail"]
    form = get(api, "/login", None)
    assert form.status_code == 200 and 'name="token"' in form.text and 'method="post"' in form.text

    session = login(api, ADMIN)
    api.cookies.clear()
    r = api.post("/login", content=f"token={ADMIN}", headers=FORM, follow_redirects=False)
    cookie = r.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/" in cookie, cookie
    assert ADMIN not in cookie and ADMIN not in r.headers["location"]
    page = get(api, "/", session)
    assert page.status_code == 200 and ADMIN not in page.text
    assert get(api, "/login", session).status_code == 303  # already in: on to the cluster

    r = api.post("/logout", cookies={COOKIE: session}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/login"
    assert COOKIE in r.headers["set-cookie"] and "Max-Age=0" in r.headers["set-cookie"]
    assert get(api, "/", session).status_code == 303  # that session is over
    assert get(api, "/ui/data/queue", session).status_code == 401


@pytest.mark.parametrize("token", ["", "wrong-token-0123456789", ALICE + "x", ALICE[:-1], "ünïcode-tökén-123456"])
def test_a_bad_token_shows_the_form_again(served: Served, token: str) -> None:
    api = served.api
    api.cookies.clear()
    r = api.post("/login", content=f"token={token}", headers=FORM, follow_redirects=False)
    assert r.status_code == 401 and "set-cookie" not in r.headers
    assert "That token is not valid here" in r.text and 'name="token"' in r.text
    assert not token or token not in r.text  # never echoed


def test_a_session_expires(served: Served) -> None:
    now = [1000.0]
    sessions = Sessions(ttl_s=60, clock=lambda: now[0])
    who_before = served.dash.sessions
    served.dash.sessions = sessions
    try:
        session = login(served.api, BOB)
        assert get(served.api, "/", session).status_code == 200
        now[0] += 59
        assert get(served.api, "/ui/data/cluster", session).status_code == 200
        now[0] += 2
        assert get(served.api, "/", session).status_code == 303
        assert get(served.api, "/ui/data/cluster", session).status_code == 401
        assert len(sessions) == 0
    finally:
        served.dash.sessions = who_before


def test_sessions_are_bounded_and_random() -> None:
    sessions = Sessions(ttl_s=60, limit=3)
    from corral.live.api.app import Principal

    ids = [sessions.create(Principal("t")) for _ in range(5)]
    assert len(set(ids)) == 5 and all(len(i) >= 40 for i in ids)
    assert len(sessions) == 3 and sessions.get(ids[0]) is None and sessions.get(ids[-1]) == Principal("t")


def test_every_page_for_the_admin(served: Served) -> None:
    api, jobs = served.api, served.jobs
    session = login(api, ADMIN)
    text = {path: get(api, path, session) for path in (*PAGES, "/tenants/alice", "/tenants/bob")}
    for role in jobs:
        text[f"job {role}"] = get(api, f"/jobs/{jobs[role]}", session)
    for what, r in text.items():
        assert r.status_code == 200, (what, r.text[:300])
        assert r.headers["content-type"].startswith("text/html")
        assert "Content-Security-Policy" in r.headers
    cluster = text["/"].text
    assert jobs["alice-run"] in cluster and jobs["bob-run"] in cluster and "stand-in" in cluster
    queue = text["/queue"].text
    assert jobs["alice-wait"] in queue and jobs["bob-wait"] in queue and jobs["alice-run"] not in queue
    reason = served.controller.job(jobs["alice-wait"]).wait_reason
    assert reason is not None and reason in queue.replace("&#39;", "'")
    assert queue.index(jobs["alice-wait"]) < queue.index(jobs["bob-wait"])  # the policy's order: submission
    job = text["job alice-run"].text
    for kind in ("submitted", "launched", "started"):
        assert kind in job
    assert "alice-run-name" in job
    assert "rounds" in text["/scheduler"].text
    for path in ("/cluster", "/tenants", "/tenants/bob", "/queue", "/scheduler", f"/jobs/{jobs['bob-run']}"):
        r = get(api, "/ui/data" + path, session)
        assert r.status_code == 200 and r.headers["content-type"] == "application/json", path
    assert get(api, "/jobs/nosuchjob", session).status_code == 404
    assert get(api, "/tenants/nobody", session).status_code == 404
    assert get(api, "/ui/data/jobs/nosuchjob", session).status_code == 404


def test_a_job_log_is_followed_from_its_tail(served: Served) -> None:
    session = login(served.api, ALICE)
    job = served.jobs["alice-run"]
    assert wait_until(lambda: "hello" in get(served.api, f"/ui/data/jobs/{job}/log", session).json()["text"], 20)
    first = get(served.api, f"/ui/data/jobs/{job}/log", session).json()
    assert first["offset"] == 0 and not first["complete"]
    again = get(served.api, f"/ui/data/jobs/{job}/log?offset={first['next_offset']}", session).json()
    assert again["offset"] == first["next_offset"] and again["text"] == ""


def _everything(api: TestClient, session: str, jobs: list[str], tenant: str) -> dict[str, str]:
    paths = [*PAGES, f"/tenants/{tenant}"]
    for job_id in jobs:
        paths += [f"/jobs/{job_id}", f"/ui/data/jobs/{job_id}", f"/ui/data/jobs/{job_id}/log"]
    paths += ["/ui/data/cluster?since=0", "/ui/data/tenants", f"/ui/data/tenants/{tenant}", "/ui/data/queue"]
    return {path: get(api, path, session).text for path in paths}


def test_a_tenant_sees_only_its_own(served: Served) -> None:
    api, jobs = served.api, served.jobs
    session = login(api, ALICE)
    seen = _everything(api, session, [jobs["alice-run"], jobs["alice-wait"]], "alice")
    for path, body in seen.items():
        for role in ("bob-run", "bob-wait"):
            assert jobs[role] not in body, (path, role)
            assert f"{role}-name" not in body, (path, role)
    assert jobs["alice-run"] in seen["/"] and jobs["alice-wait"] in seen["/queue"]
    assert "in use (not yours)" in seen["/"]  # bob's GPU: busy, nothing more
    assert "Scheduler" not in seen["/"]  # not in the navigation
    # bob's job: exactly as a job that does not exist; bob's page and the scheduler: not hers.
    for path in (
        f"/jobs/{jobs['bob-run']}",
        f"/ui/data/jobs/{jobs['bob-run']}",
        f"/ui/data/jobs/{jobs['bob-run']}/log",
    ):
        r = get(api, path, session)
        assert r.status_code == 404, path
    unknown = get(api, "/ui/data/jobs/zzzzzzzz", session).json()["detail"].replace("zzzzzzzz", "ID")
    assert (
        get(api, f"/ui/data/jobs/{jobs['bob-run']}", session).json()["detail"].replace(jobs["bob-run"], "ID") == unknown
    )
    for path in ("/tenants/bob", "/ui/data/tenants/bob", "/scheduler", "/ui/data/scheduler", "/tenants/nobody"):
        r = get(api, path, session)
        assert r.status_code == 403, path
        assert jobs["bob-run"] not in r.text
    # The charts of bob's GPU: its allocated share (as the API shows it), and nothing measured or given there.
    bobs = [
        g["index"]
        for g in served.api.get("/v1/cluster", headers={"Authorization": f"Bearer {BOB}"}).json()["gpus"]
        if g["jobs"]
    ]
    charts = get(api, "/ui/data/cluster?since=0", session).json()["charts"]
    for chart in charts.values():
        if any(chart["title"].startswith(f"GPU {index} ") for index in bobs):
            assert chart["x"] and all(v in (None, 0) for series in chart["y"][1:] for v in series), chart
    # Counts are hers alone.
    data = get(api, "/ui/data/queue", session).json()
    assert data["summary"]["pending"] == "1"
    assert [t["name"] for t in get(api, "/ui/data/tenants", session).json()["tenants"]] == ["alice"]


def _same(dash_json: Any, api_json: Any, tries: int = 20) -> None:
    for _ in range(tries):
        left, right = dash_json(), api_json()
        if left == right:
            return
        time.sleep(0.3)  # a change between the two reads (the dashboard's snapshot is up to 1 s old): again
    assert left == right


@pytest.mark.parametrize(("token", "tenant"), [(ADMIN, None), (ALICE, "alice"), (BOB, "bob")])
def test_the_numbers_are_the_apis(served: Served, token: str, tenant: str | None) -> None:
    api = served.api
    session = login(api, token)
    bearer = {"Authorization": f"Bearer {token}"}
    _same(
        lambda: get(api, "/ui/data/cluster", session).json()["cluster"],
        lambda: api.get("/v1/cluster", headers=bearer).json(),
    )
    _same(
        lambda: get(api, "/ui/data/tenants", session).json()["tenants"],
        lambda: api.get("/v1/tenants", headers=bearer).json()["tenants"],
    )
    cluster = get(api, "/ui/data/cluster", session).json()
    assert cluster["summary"]["GPUs"] == "2" and len(cluster["charts"]) == 2
    assert cluster["tables"]["gpus"]["rows"][0][0] == "local"


_ASSET = re.compile(r"""(?:src|href)\s*=\s*["']([^"']+)["']""", re.IGNORECASE)
_EXTERNAL = re.compile(r"""(?:https?:)?//[a-z0-9.-]+""", re.IGNORECASE)
_TYPES = {".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml"}


def test_nothing_comes_from_another_host(served: Served) -> None:
    api, jobs = served.api, served.jobs
    session = login(api, ADMIN)
    pages = [*PAGES, "/tenants/alice", f"/jobs/{jobs['alice-run']}", "/login"]
    assets: set[str] = set()
    for path in pages:
        html = get(api, path, session).text
        for url in _ASSET.findall(html):
            assert url.startswith("/") and not url.startswith("//"), (path, url)
            assets.add(url)
        assert not re.search(r"https?://", html), path
    static = {a for a in assets if a.startswith("/ui/static/")}
    assert {
        "/ui/static/dashboard.js",
        "/ui/static/dashboard.css",
        "/ui/static/vendor/uplot/uPlot.iife.min.js",
    } <= static
    for url in sorted(static):
        r = api.get(url)
        assert r.status_code == 200, url
        suffix = Path(url).suffix
        assert r.headers["content-type"].startswith(_TYPES[suffix]), (url, r.headers["content-type"])
        if suffix in (".js", ".css"):
            # uPlot's banner comment names its home page; nothing else may name a host, nor load from one.
            code = re.sub(r"/\*!.*?\*/", "", r.text, flags=re.DOTALL)
            assert not re.search(r"https?://", code), url
            assert "@import" not in code and not re.search(r"url\(\s*['\"]?(?:https?:)?//", code), url
    js = api.get("/ui/static/dashboard.js").text
    assert not _EXTERNAL.search(re.sub(r"//[^\n]*", "", js).replace("'//'", "")), "dashboard.js names a host"


def test_the_history_is_sampled_and_bounded(served: Served) -> None:
    h = served.dash.history
    with h.lock:
        assert len(h.cluster) <= h.cluster.maxlen if h.cluster.maxlen else False
        assert h.cluster.maxlen == 301  # 60 s every 0.2 s, and one
        last = h.cluster[-1]
        assert len(last.alloc_milli) == 2 and sorted(last.alloc_milli) == [1000, 1000]
        assert served.jobs["alice-run"] in h.jobs and served.jobs["alice-wait"] not in h.jobs  # ran / did not
        assert {"alice", "bob"} <= set(h.tenants[-1][1])
    session = login(served.api, ADMIN)
    data = get(served.api, f"/ui/data/jobs/{served.jobs['alice-run']}", session).json()
    assert set(data["charts"]) >= {"step", "memory", "share"} and data["charts"]["share"]["y"][0][-1] == 100
    later = get(served.api, f"/ui/data/jobs/{served.jobs['alice-run']}?since={data['now']}", session).json()
    assert all(x > data["now"] for x in later["charts"]["share"]["x"])  # a poll sends only what is new


def test_a_short_window_drops_old_samples(served: Served) -> None:
    now = [0.0]
    h = History(served.controller, served.dash.history.latest, every_s=1.0, window_s=3.0, clock=lambda: now[0])
    for t in range(10):
        now[0] = float(t)
        h.sample()
    assert [s.time_s for s in h.cluster] == [6.0, 7.0, 8.0, 9.0]
    assert all(series.time_s[0] >= 6.0 for series in h.jobs.values())
    now[0] = 100.0
    h._trim(now[0])
    assert not h.jobs  # no sample in the window: forgotten


class _Stale(LatestCluster):
    """The cluster as it was before any job started: what a cached snapshot may still say."""

    def get(self) -> ClusterSnapshot:
        snap = super().get()
        return dataclasses.replace(snap, gpus=tuple(dataclasses.replace(g, jobs=()) for g in snap.gpus))


def test_a_sample_counts_only_what_its_snapshot_shows(served: Served) -> None:
    # The running jobs are read a moment apart from the snapshot: a cap must not be counted on a GPU the snapshot
    # shows free (its owner unknown, a tenant's chart would show it another tenant's cap).
    capped = [r for r in served.controller.jobs(phases=[JobPhase.RUNNING]) if r.status.placement.mem_mib]
    assert len(capped) == 2  # else this test shows nothing
    h = History(served.controller, _Stale(served.controller))
    h.sample()
    sample = h.cluster[-1]
    assert list(sample.owner) == [NO_JOB, NO_JOB] and list(sample.mem_given_mib) == [0.0, 0.0]


@pytest.mark.parametrize(
    ("lines", "ok"),
    [
        ("dashboard_sample_s = 1\ndashboard_history_s = 600", True),
        ("dashboard_sample_s = 0", False),
        ("dashboard_sample_s = 10\ndashboard_history_s = 5", False),
        ('dashboard_history_s = "1h"', False),
    ],
)
def test_the_history_is_configured_in_server(tmp_path: Path, lines: str, ok: bool) -> None:
    path = tmp_path / "corral.toml"
    path.write_text(f"[server]\n{lines}\n")
    if ok:
        config = load_config(path)
        assert (config.dashboard_sample_s, config.dashboard_history_s) == (1.0, 600.0)
    else:
        with pytest.raises(InputError, match="dashboard_"):
            load_config(path)


def test_a_jobs_step_reports_reach_its_charts(served: Served) -> None:
    # Through the controller's own door (deliver), as the agent hands a job's report on.
    c, job = served.controller, served.jobs["alice-run"]
    step = contract.StepReport(job, 1, 10, 10, 0.125, 0.1, 1500, mem_cap_mib=2048, mem_mode="micro4")
    c.deliver(JobReported(job, 1, step))
    session = login(served.api, ALICE)

    def charts() -> dict[str, Any]:
        found: dict[str, Any] = get(served.api, f"/ui/data/jobs/{job}", session).json()["charts"]
        return found

    assert wait_until(lambda: "rung" in charts() and 125.0 in charts()["step"]["y"][0], 20)
    drawn = charts()
    assert "micro4" in drawn["rung"]["title"] and drawn["rung"]["y"][0][-1] == 0.0
    assert drawn["memory"]["y"][1][-1] == 1500  # used (its peak)


def test_the_queue_shows_each_waiting_jobs_estimated_start(served: Served) -> None:
    api, jobs = served.api, served.jobs
    session = login(api, ADMIN)
    before = get(api, "/ui/data/queue", session).json()["tables"]["queue"]
    assert before["columns"][-1] == "estimated start"
    served.controller.estimator.refresh()  # in the worker process, as the timer would
    est = served.api.get(f"/v1/jobs/{jobs['alice-wait']}", headers={"Authorization": f"Bearer {ADMIN}"}).json()
    assert est["estimated_start"] is not None and est["estimated_start"]["start_s"] is not None
    rows = get(api, "/ui/data/queue", session).json()["tables"]["queue"]["rows"]
    row = next(r for r in rows if r[1]["t"] == jobs["alice-wait"])
    assert isinstance(row[-1], str) and row[-1].startswith(("in ", "now", "any moment")), row
    page = get(api, f"/jobs/{jobs['alice-wait']}", session).text
    assert "estimated start" in page
