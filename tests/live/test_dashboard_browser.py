"""The dashboard in a real browser: a real ``corral serve`` (stand-in GPUs, two tenants with tokens, real job
processes), Chromium driven by Playwright. Logs in through the form, loads every page, checks that each shows the
real jobs, GPUs and wait reasons, that nothing fails in the browser (no console error, no failed request, nothing
fetched from another host), that the charts are drawn, that a job's log follows, and that a tenant's login shows
none of the other tenant's jobs.

Screenshots go to ``$CORRAL_TEST_ARTIFACTS`` (default: a pytest temporary folder). With
``CORRAL_UPDATE_SCREENSHOTS=1`` the cluster and job pages are also written to ``docs/img/`` (the README's).

Needs Playwright and a Chromium executable (``.ci/run`` installs both); skipped, saying which, without them.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import httpx
import pytest

from browser import chromium
from live_server import Server, start_server, stop_server

ALICE = "alice-dashboard-token-0123"
BOB = "bob-dashboard-token-456789"
ADMIN = "admin-dashboard-token-0123"
CONFIG = f"""
[server]
policy = "antman"
admin_token = "{ADMIN}"
grace_s = 2
dashboard_sample_s = 0.5

[[tenants]]
name = "alice"
quota_gpus = 2
token = "{ALICE}"

[[tenants]]
name = "bob"
quota_gpus = 1
token = "{BOB}"
"""
# A job that reports its steps through corral.job (about 20 steps a second), so the job page has step times.
STEPPER = (
    "import time, corral.job\n"
    "with corral.job.Job() as job:\n"
    "    for _ in job.loop(range(10**9)):\n"
    "        print('step', job.global_step, flush=True) if job.global_step % 20 == 0 else None\n"
    "        time.sleep(0.05)\n"
)
SLEEP = "import time; print('sleeping', flush=True); time.sleep(600)"
DOCS_IMG = Path(__file__).parents[2] / "docs" / "img"


@dataclass
class Cluster:
    server: Server
    jobs: dict[str, str]  # role -> job id


def _api(server: Server, token: str = ADMIN) -> httpx.Client:
    return httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {token}"}, timeout=30)


def _until(what: str, check: Any, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    chromium()  # skip before starting anything
    base = tmp_path_factory.mktemp("dash")
    (base / "corral.toml").write_text(CONFIG)
    server = start_server(base / "st", "--gpus", "4", "--config", str(base / "corral.toml"), "--quiet")
    jobs: dict[str, str] = {}
    try:
        with _api(server) as api:

            def submit(role: str, tenant: str, code: str, **more: Any) -> None:
                body = {"command": [sys.executable, "-c", code], "tenant": tenant, "cwd": str(base), **more}
                r = api.post("/v1/jobs", json=body)
                assert r.status_code == 201, r.text
                jobs[role] = r.json()["job_id"]

            submit("alice-stepper", "alice", STEPPER, name="resnet-sweep")
            submit("alice-half", "alice", SLEEP, gpu_milli=500, name="alice-half-gpu")
            submit("bob-running", "bob", SLEEP, name="bert-finetune")
            submit("bob-opp", "bob", SLEEP, opportunistic=True, name="bert-spare")  # bob is at quota: on spare GPUs
            submit("bob-waiting", "bob", SLEEP, name="bert-second")  # bob's quota is 1 GPU: waits
            submit("alice-big", "alice", SLEEP, num_gpus=2, name="alice-two-gpus")  # 1.5 + 2 > alice's quota of 2

            def settled() -> bool:
                got = {role: api.get(f"/v1/jobs/{job_id}").json() for role, job_id in jobs.items()}
                running = all(
                    got[r]["phase"] == "running" for r in ("alice-stepper", "alice-half", "bob-running", "bob-opp")
                )
                waiting = all(got[r]["wait_reason"] for r in ("bob-waiting", "alice-big"))
                stepping = got["alice-stepper"]["telemetry"] is not None
                return running and waiting and stepping

            _until("the jobs to start, wait with reasons and report steps", settled)
            time.sleep(3)  # a few history samples (every 0.5 s here) for the charts
        yield Cluster(server, jobs)
    finally:
        with _api(server) as api:
            for job_id in jobs.values():
                api.post(f"/v1/jobs/{job_id}/cancel")
            _until(
                "the jobs to stop",
                lambda: all(api.get(f"/v1/jobs/{j}").json()["process"]["phase"] == "none" for j in jobs.values()),
            )
        stop_server(server)


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    given = os.environ.get("CORRAL_TEST_ARTIFACTS")
    folder = Path(given) if given else tmp_path_factory.mktemp("dashboard-screens")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


class Browser:
    """One Chromium page that records every console error, page error, failed request and request URL."""

    def __init__(self, page: Any, base: str) -> None:
        self.page = page
        self.base = base
        self.errors: list[str] = []
        self.urls: list[str] = []
        page.on("console", lambda m: self.errors.append(f"console: {m.text}") if m.type == "error" else None)
        page.on("pageerror", lambda e: self.errors.append(f"page error: {e}"))
        page.on("requestfailed", self._failed)
        page.on("request", lambda r: self.urls.append(r.url))

    def _failed(self, request: Any) -> None:
        # A poll still in flight when the test moves to the next page is aborted by the browser: not a failure.
        if "ERR_ABORTED" not in str(request.failure):
            self.errors.append(f"request failed: {request.url} {request.failure}")

    def login(self, token: str) -> None:
        self.page.goto(self.base + "/", wait_until="load")
        assert urlparse(self.page.url).path == "/login"  # no session: sent to the form
        self.page.fill("#token", token)
        self.page.click("button[type=submit]")
        self.page.wait_for_url(self.base + "/")

    def load(self, path: str) -> str:
        self.page.goto(self.base + path, wait_until="networkidle")
        # One poll of the page's JSON has come back and been drawn (the first fetch asks for the whole history).
        self.page.wait_for_function("() => document.getElementById('live').textContent === 'live'")
        text: str = self.page.inner_text("main")
        return text

    def check_clean(self) -> None:
        assert not self.errors, self.errors
        host = urlparse(self.base).netloc
        strangers = [u for u in self.urls if urlparse(u).scheme in ("http", "https") and urlparse(u).netloc != host]
        assert not strangers, f"requests to other hosts: {strangers}"


@pytest.fixture
def browser() -> Iterator[Any]:
    executable = chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=executable)
        try:
            yield launched
        finally:
            launched.close()


def _shot(page: Any, folder: Path, name: str, docs: bool = False) -> None:
    page.screenshot(path=str(folder / f"{name}.png"), full_page=True)
    if docs and os.environ.get("CORRAL_UPDATE_SCREENSHOTS") == "1":
        DOCS_IMG.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(DOCS_IMG / f"{name}.png"), full_page=False)


def test_the_admin_sees_every_page_with_the_real_jobs(cluster: Cluster, browser: Any, artifacts: Path) -> None:
    jobs = cluster.jobs
    context = browser.new_context(viewport={"width": 1440, "height": 1000})
    b = Browser(context.new_page(), cluster.server.url)
    b.login(ADMIN)

    text = b.load("/")
    for role in ("alice-stepper", "alice-half", "bob-running", "bob-opp"):
        assert jobs[role] in text, role
    assert "stand-in" in text and "opportunistic" in text and "guaranteed" in text
    b.page.wait_for_selector("figure.chart .uplot canvas")  # the history, drawn by uPlot
    assert b.page.locator("figure.chart .uplot").count() == 4  # one chart per GPU
    _shot(b.page, artifacts, "dashboard-cluster", docs=True)

    text = b.load("/queue")
    assert jobs["bob-waiting"] in text and jobs["alice-big"] in text
    assert "bob" in text and "quota" in text  # the policy's reason names the quota
    assert jobs["bob-running"] not in text  # running, not queued
    _shot(b.page, artifacts, "dashboard-queue")

    text = b.load("/tenants")
    assert "alice" in text and "bob" in text
    b.page.wait_for_selector("figure.chart .uplot canvas")
    _shot(b.page, artifacts, "dashboard-tenants")
    text = b.load("/tenants/bob")
    assert jobs["bob-running"] in text and jobs["bob-waiting"] in text and jobs["alice-stepper"] not in text

    text = b.load(f"/jobs/{jobs['alice-stepper']}")
    assert "resnet-sweep" in text and "launched" in text and "started" in text
    b.page.wait_for_selector("figure.chart .uplot canvas")
    b.page.wait_for_function("() => document.getElementById('log').textContent.includes('step ')")
    _shot(b.page, artifacts, "dashboard-job", docs=True)

    text = b.load("/scheduler")
    assert "rounds" in text and "launched" in text
    b.page.wait_for_selector("figure.chart .uplot canvas")
    _shot(b.page, artifacts, "dashboard-scheduler")

    b.check_clean()
    context.close()


def test_a_tenant_sees_only_its_own_jobs(cluster: Cluster, browser: Any, artifacts: Path) -> None:
    jobs = cluster.jobs
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    b = Browser(context.new_page(), cluster.server.url)
    b.login(ALICE)
    theirs = [jobs["bob-running"], jobs["bob-opp"], jobs["bob-waiting"]]
    mine = [jobs["alice-stepper"], jobs["alice-half"]]
    pages = ("/", "/queue", "/tenants", "/tenants/alice", f"/jobs/{jobs['alice-stepper']}")
    for path in pages:
        text = b.load(path)
        html = b.page.content()
        for job_id in theirs:
            assert job_id not in html, (path, job_id)
        assert "bert" not in html, path  # nor their names
    text = b.load("/")
    assert all(job_id in text for job_id in mine)
    assert "in use (not yours)" in text  # bob's GPU: busy, whose is not said
    assert "Scheduler" not in b.page.inner_text("header")
    _shot(b.page, artifacts, "dashboard-cluster-tenant")
    b.check_clean()
    # Another tenant's job and page, and the scheduler: refused, as the API refuses them.
    for path, status in ((f"/jobs/{jobs['bob-running']}", 404), ("/tenants/bob", 403), ("/scheduler", 403)):
        response = b.page.goto(cluster.server.url + path)
        assert response is not None and response.status == status, path
        assert jobs["bob-running"] not in b.page.content() or path.startswith("/jobs/")
    # Logging out ends the session: the pages send the browser back to the form.
    b.load("/")
    b.page.click(".who button")
    b.page.wait_for_url(cluster.server.url + "/login")
    b.page.goto(cluster.server.url + "/queue")
    assert urlparse(b.page.url).path == "/login"
    context.close()


def test_a_bad_token_shows_the_form_again(cluster: Cluster, browser: Any) -> None:
    context = browser.new_context()
    page = context.new_page()
    page.goto(cluster.server.url + "/login")
    page.fill("#token", "not-a-token-of-this-server")
    page.click("button[type=submit]")
    page.wait_for_selector(".error")
    assert "not valid" in page.inner_text(".error")
    assert urlparse(page.url).path == "/login"
    assert "not-a-token" not in page.content()  # the page never shows a token
    context.close()
