"""``GET /metrics`` against a real controller with stand-in GPUs and real job processes: parsed with the Prometheus
client's own parser and checked against the API's numbers (GPUs, tenants, the queue by reason, the running jobs),
counters that count, no secrets in it, and the admin token when the configuration asks for one."""

from __future__ import annotations

import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from test_controller import shutdown, wait_until

with warnings.catch_warnings():  # newer Starlette nags about httpx; the client works
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from corral.core import contract
from corral.core.job import JobPhase
from corral.live.agent.messages import JobReported
from corral.live.api import create_app
from corral.live.config import ServeConfig, TenantConfig
from corral.live.controller import Controller
from corral.live.records import ProcessPhase

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

ALICE = "alice-token-0123456789"
BOB = "bob-token-0123456789ab"
ADMIN = "admin-token-0123456789"
ROOT = {"Authorization": f"Bearer {ADMIN}"}
SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]


def start(tmp: Path, **options: object) -> Controller:
    config = ServeConfig(
        state_dir=tmp,
        gpus=2,
        stand_in_mem_mib=8192,
        tenants=(TenantConfig("alice", 1, token=ALICE), TenantConfig("bob", 1, token=BOB)),
        admin_token=ADMIN,
        policy="fifo",
        grace_s=1.0,
        **options,  # type: ignore[arg-type]
    )
    c = Controller.from_config(config)
    c.start()
    return c


@pytest.fixture
def controller(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Controller]:
    c = start(tmp_path_factory.mktemp("m"))
    try:
        yield c
    finally:
        shutdown(c)


def scrape(
    api: TestClient, headers: dict[str, str] | None = None
) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """name -> {sorted labels -> value}, through the Prometheus client's parser."""
    r = api.get("/metrics", headers=headers or {})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(r.text):
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def until(cond: object, timeout_s: float = 20.0) -> None:
    assert wait_until(cond, timeout_s), "timed out"


def test_metrics_match_the_api(controller: Controller) -> None:
    c = controller
    api = TestClient(create_app(c))
    body = {"command": SLEEP, "cwd": "/", "num_gpus": 1, "gpu_mem_mib": 2048}
    a = api.post("/v1/jobs", json={**body, "tenant": "alice"}, headers=ROOT).json()["job_id"]
    b = api.post("/v1/jobs", json={**body, "tenant": "bob"}, headers=ROOT).json()["job_id"]
    waiting = api.post("/v1/jobs", json={**body, "tenant": "alice"}, headers=ROOT).json()["job_id"]
    until(lambda: c.job(a).process.phase is ProcessPhase.RUNNING and c.job(b).process.phase is ProcessPhase.RUNNING)
    until(lambda: c.job(waiting).wait_reason is not None)
    step = contract.StepReport(a, 1, 10, 10, 0.125, 0.1, 1500)
    c.deliver(JobReported(a, 1, step))
    until(lambda: c.job(a).telemetry is not None)

    m = scrape(api)
    cluster = api.get("/v1/cluster", headers=ROOT).json()
    for gpu in cluster["gpus"]:
        key = (("gpu", str(gpu["index"])), ("node", gpu["node"]), ("type", gpu["type_name"]))
        assert m["corral_gpu_allocated_ratio"][key] == pytest.approx(gpu["allocated_milli"] / 1000)
        assert m["corral_gpu_memory_bytes"][key] == gpu["mem_mib"] * 1024 * 1024
        assert m["corral_gpu_jobs"][tuple(sorted((*key, ("class", "guaranteed"))))] == len(gpu["jobs"])
    for tenant in api.get("/v1/tenants", headers=ROOT).json()["tenants"]:
        name = (("tenant", tenant["name"]),)
        assert m["corral_tenant_quota_gpus"][name] == tenant["quota_gpus"]
        assert m["corral_tenant_guaranteed_gpus"][name] == pytest.approx(tenant["guaranteed_gpus"])
        assert m["corral_tenant_jobs"][(("phase", "pending"), *name)] == tenant["pending"]
        assert m["corral_tenant_jobs"][(("phase", "running"), *name)] == tenant["running"]
    reason = api.get(f"/v1/jobs/{waiting}", headers=ROOT).json()["wait_reason"]
    assert m["corral_queue_jobs"] == {(("reason", reason),): 1.0}
    job_key = (("class", "guaranteed"), ("job", a), ("tenant", "alice"))
    assert m["corral_job_step_seconds"][job_key] == pytest.approx(0.125)
    assert m["corral_job_gpu_share_ratio"][job_key] == 1.0
    assert job_key not in m.get("corral_job_memory_cap_bytes", {})  # FIFO reserves no memory: no cap to show
    assert set(m["corral_job_gpu_share_ratio"]) == {job_key, (("class", "guaranteed"), ("job", b), ("tenant", "bob"))}
    assert m["corral_job_events_total"][(("kind", "launched"),)] == 2
    assert m["corral_round_duration_seconds_count"][()] >= 1
    assert m["corral_round_duration_seconds_bucket"][(("le", "+Inf"),)] == m["corral_round_duration_seconds_count"][()]

    text = api.get("/metrics").text
    for secret in (ALICE, BOB, ADMIN, "time.sleep"):
        assert secret not in text  # no token, no command line

    api.post(f"/v1/jobs/{a}/cancel", headers=ROOT)
    until(lambda: c.job(waiting).phase is JobPhase.RUNNING)
    m = scrape(api)
    assert m.get("corral_queue_jobs", {}) == {}  # a family without samples is not written
    assert m["corral_job_events_total"][(("kind", "launched"),)] == 3


def test_metrics_need_the_admin_token_when_configured(tmp_path_factory: pytest.TempPathFactory) -> None:
    c = start(tmp_path_factory.mktemp("m"), metrics_token=True)
    try:
        api = TestClient(create_app(c))
        assert api.get("/metrics").status_code == 401
        assert api.get("/metrics", headers={"Authorization": f"Bearer {ALICE}"}).status_code == 403
        assert "corral_gpu_allocated_ratio" in scrape(api, ROOT)
    finally:
        shutdown(c)


def test_the_grafana_dashboard_queries_only_series_that_metrics_exports(controller: Controller) -> None:
    import json
    import re

    api = TestClient(create_app(controller))
    r = api.post("/v1/jobs", json={"command": SLEEP, "cwd": "/", "tenant": "alice"}, headers=ROOT)
    job_id = r.json()["job_id"]
    until(lambda: controller.job(job_id).process.phase is ProcessPhase.RUNNING)
    families = list(text_string_to_metric_families(api.get("/metrics").text))
    exported = {f.name for f in families} | {sample.name for f in families for sample in f.samples}
    dashboard = json.loads((Path(__file__).parents[2] / "docs" / "grafana" / "corral.json").read_text())
    queried = {
        name
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in re.findall(r"\bcorral_[a-z_]+", target["expr"])
    }
    assert queried and queried <= exported, queried - exported
