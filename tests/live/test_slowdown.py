"""A live job's step time alone and its slowdown (:mod:`corral.live.controller.baseline`).

The baseline alone: reports made alone count, shared ones (and the one right after) do not, the median of the
latest ones, a new run, other GPUs, another batch size or share start it over, a reported solo time wins, memory
stays bounded and a job is forgotten. Then on a real server with stand-in GPUs: a ``corral.job`` job alone on its
GPU gets ``corral_job_slowdown_ratio`` near 1 and the API and the dashboard show that very figure; two jobs
sharing a GPU get none until one leaves; the policies still get the report without a baseline.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from test_controller import shutdown, wait_until

with warnings.catch_warnings():  # newer Starlette nags about httpx; the client works
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from corral.core import contract
from corral.core.job import JobPhase
from corral.core.telemetry import Telemetry
from corral.live.agent import JobReported
from corral.live.api import create_app
from corral.live.config import ServeConfig, TenantConfig
from corral.live.controller import Controller
from corral.live.controller.baseline import (
    MIN_REPORTS,
    SHARE_CHANGE,
    WINDOW,
    Baselines,
    ObservedTelemetry,
    Placing,
)
from corral.live.dashboard.sessions import COOKIE
from corral.live.records import JobRequest, ProcessPhase

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

ADMIN = "admin-token-0123456789"
ROOT = {"Authorization": f"Bearer {ADMIN}"}
FORM = {"content-type": "application/x-www-form-urlencoded"}
SLEEP = (sys.executable, "-c", "import time; time.sleep(60)")
# A corral.job job whose steps take 20 ms, alone: its reports come once a second (the agent's interval).
STEPS = (
    sys.executable,
    "-c",
    "import time, corral.job\n"
    "with corral.job.Job(verbose=False) as job:\n"
    "    while True:\n"
    "        with job.step():\n"
    "            time.sleep(0.02)\n",
)
ON_0 = Placing(run=1, gpus=(0,), gpu_milli=1000)


def tel(step_s: float, solo_s: float | None = None) -> Telemetry:
    return Telemetry(
        time_s=0.0,
        step_time_s=step_s,
        solo_step_time_s=solo_s,
        mem_peak_mib=100,
        mem_mean_mib=100,
        mem_need_mib=100,
        sm_util=0.5,
    )


def feed(b: Baselines, steps: list[float], placing: Placing = ON_0, *, alone: bool = True) -> ObservedTelemetry:
    out = None
    for s in steps:
        out = b.observe("j", tel(s), placing, alone=alone)
    assert out is not None
    return out


# -- the baseline alone -------------------------------------------------------------------------------------------
def test_the_median_of_reports_made_alone_once_there_are_enough() -> None:
    b = Baselines()
    seen = feed(b, [0.5, 0.1])  # a run's slow first steps, and too few reports to tell
    assert seen.baseline_step_time_s is None and seen.slowdown is None and seen.baseline_reports == 0
    seen = feed(b, [0.1, 0.1, 0.12])
    assert seen.baseline_step_time_s == pytest.approx(0.1) and seen.baseline_reports == MIN_REPORTS + 2
    # the median, not the least: an ordinary report is not a slowdown; this one is 1.2x
    assert seen.slowdown == pytest.approx(1.2)
    assert isinstance(seen, Telemetry) and seen.solo_step_time_s is None  # the report itself, as it came


def test_reports_made_beside_another_job_do_not_count_nor_the_next_one() -> None:
    b = Baselines()
    feed(b, [0.2] * 10, alone=False)
    assert b.baseline("j") is None
    feed(b, [0.2], alone=True)  # alone now, but its steps began beside the neighbour that just left
    feed(b, [0.1] * (MIN_REPORTS - 1), alone=True)
    assert b.baseline("j") is None
    seen = feed(b, [0.1], alone=True)
    assert seen.baseline_step_time_s == pytest.approx(0.1)
    shared = feed(b, [0.15], alone=False)  # a neighbour arrives: the slowdown it causes shows
    assert shared.baseline_step_time_s == pytest.approx(0.1) and shared.slowdown == pytest.approx(1.5)


def test_degraded_steps_do_not_make_a_baseline() -> None:
    b = Baselines()
    for _ in range(10):
        b.observe("j", tel(0.3), ON_0, alone=True, undegraded=False)  # a memory cap made it micro-batch
    assert b.baseline("j") is None


@pytest.mark.parametrize(
    ("now", "starts_over"),
    [
        (Placing(run=2, gpus=(0,), gpu_milli=1000), True),  # a new run
        (Placing(run=1, gpus=(1,), gpu_milli=1000), True),  # other GPUs
        (Placing(run=1, gpus=(0, 1), gpu_milli=1000), True),
        (Placing(run=1, gpus=(0,), gpu_milli=1000, batch_size=64), True),  # another batch size
        (Placing(run=1, gpus=(0,), gpu_milli=round(1000 * (1 - 2 * SHARE_CHANGE))), True),  # a share cut
        (Placing(run=1, gpus=(0,), gpu_milli=round(1000 * (1 - SHARE_CHANGE / 2))), False),  # a small change
        (ON_0, False),
    ],
)
def test_a_new_run_placement_batch_size_or_share_starts_over(now: Placing, starts_over: bool) -> None:
    b = Baselines()
    feed(b, [0.1] * MIN_REPORTS)
    seen = feed(b, [0.2], now)
    if starts_over:
        assert seen.baseline_step_time_s is None and b.baseline("j") is None
        seen = feed(b, [0.2] * (MIN_REPORTS - 1), now)
        assert seen.baseline_step_time_s == pytest.approx(0.2)
    else:
        assert seen.baseline_step_time_s == pytest.approx(0.1) and seen.slowdown == pytest.approx(2.0)


def test_a_reported_solo_time_wins() -> None:
    b = Baselines()
    feed(b, [0.1] * MIN_REPORTS)
    seen = b.observe("j", tel(0.3, solo_s=0.2), ON_0, alone=False)
    assert seen.baseline_step_time_s == 0.2 and seen.slowdown == pytest.approx(1.5) and seen.baseline_reports == 0
    first = Baselines().observe("k", tel(0.3, solo_s=0.25), ON_0, alone=True)  # at once, no report alone needed
    assert first.baseline_step_time_s == 0.25


def test_memory_is_bounded_and_a_job_forgotten() -> None:
    b = Baselines()
    feed(b, [1.0] * 500)
    seen = feed(b, [2.0] * WINDOW)  # the latest WINDOW reports only: the old ones are gone
    assert seen.baseline_step_time_s == 2.0 and seen.baseline_reports == WINDOW
    track = b._tracks["j"]
    assert len(track.samples) == WINDOW and track.samples.itemsize == 8  # a ring of WINDOW doubles, no more
    for n in range(100):
        b.observe(f"other-{n}", tel(0.1), ON_0, alone=True)
    assert len(b) == 101
    b.forget("j")
    assert "j" not in b and b.baseline("j") is None and len(b) == 100
    with pytest.raises(ValueError, match="min_reports"):
        Baselines(window=2, min_reports=3)


# -- on a real server ---------------------------------------------------------------------------------------------
def start(tmp: Path, gpus: int) -> Controller:
    config = ServeConfig(
        state_dir=tmp,
        gpus=gpus,
        stand_in_mem_mib=8192,
        tenants=(TenantConfig("alice", 1), TenantConfig("bob", 1)),
        admin_token=ADMIN,
        policy="fifo",
        grace_s=1.0,
        dashboard_sample_s=0.2,
        dashboard_history_s=60.0,
    )
    c = Controller.from_config(config)
    c.start()
    return c


@pytest.fixture
def controller(tmp_path: Path) -> Iterator[Controller]:
    c = start(tmp_path, gpus=2)
    try:
        yield c
    finally:
        shutdown(c)


def slowdowns(api: TestClient) -> dict[str, float]:
    """job id -> its ``corral_job_slowdown_ratio``, through the Prometheus client's parser."""
    r = api.get("/metrics")
    assert r.status_code == 200
    out = {}
    for family in text_string_to_metric_families(r.text):
        if family.name == "corral_job_slowdown_ratio":
            assert "alone" in family.documentation  # the help text says how it is measured
            out.update({s.labels["job"]: s.value for s in family.samples})
    return out


def telemetry(api: TestClient, job_id: str) -> Any:
    return api.get(f"/v1/jobs/{job_id}", headers=ROOT).json()["telemetry"]


def test_a_job_alone_is_as_fast_as_alone_in_metrics_the_api_and_the_dashboard(controller: Controller) -> None:
    c = controller
    job = c.submit(JobRequest(command=STEPS, tenant="alice", cwd=str(Path.cwd()))).job_id
    app = create_app(c)
    with TestClient(app) as api:  # the lifespan runs the dashboard's sampler
        assert wait_until(lambda: (telemetry(api, job) or {}).get("baseline_step_time_s") is not None, 30), c.events(
            job
        )
        shown = telemetry(api, job)
        assert shown["baseline_reports"] >= MIN_REPORTS and shown["solo_step_time_s"] is None  # measured
        assert 0.02 <= shown["baseline_step_time_s"] < 0.1  # its 20 ms steps
        assert shown["slowdown"] == pytest.approx(shown["step_time_s"] / shown["baseline_step_time_s"])
        assert 0.8 < shown["slowdown"] < 1.25  # alone: about as fast as alone
        for _ in range(20):  # the same figure in /metrics (read again if a report came in between)
            before, scraped, after = telemetry(api, job), slowdowns(api), telemetry(api, job)
            if before == after:
                break
        assert scraped[job] == pytest.approx(before["slowdown"])
        # The policies got the report as it was: no baseline, no solo time (observation only).
        engine_tel = c.call(lambda: c.state.job(job).telemetry)
        assert type(engine_tel) is Telemetry and engine_tel.solo_step_time_s is None

        api.cookies.clear()
        r = api.post("/login", content=f"token={ADMIN}", headers=FORM, follow_redirects=False)
        session = r.cookies[COOKIE]

        def page() -> Any:
            api.cookies.clear()
            return api.get(f"/ui/data/jobs/{job}", cookies={COOKIE: session}).json()

        assert wait_until(lambda: page()["charts"]["step"]["y"][1][-1] is not None, 20)  # a gap is null
        data = page()
        step = data["charts"]["step"]
        assert step["labels"][1].startswith("step time alone")
        assert data["summary"]["step time alone"].endswith(" ms") and data["summary"]["slowdown"].endswith("x")
        assert 0.8 < data["charts"]["slowdown"]["y"][0][-1] < 1.25
        baselines_s = {v / 1000 for v in step["y"][1] if v is not None}
        assert baselines_s  # each sample's baseline is one the controller had (the API's figure, in ms)
        assert all(0.02 <= v < 0.1 for v in baselines_s)


def test_jobs_sharing_a_gpu_get_no_baseline_until_one_is_alone(tmp_path: Path) -> None:
    c = start(tmp_path, gpus=1)
    try:
        api = TestClient(create_app(c))
        half = {"command": list(SLEEP), "cwd": "/", "gpu_milli": 500}
        a = api.post("/v1/jobs", json={**half, "tenant": "alice"}, headers=ROOT).json()["job_id"]
        b = api.post("/v1/jobs", json={**half, "tenant": "bob"}, headers=ROOT).json()["job_id"]
        assert wait_until(lambda: all(c.job(j).process.phase is ProcessPhase.RUNNING for j in (a, b)), 20), (
            "both run on the one GPU"
        )

        def report(step_s: float) -> None:
            before = c.job(a).telemetry
            c.deliver(JobReported(a, 1, contract.StepReport(a, 1, 10, 10, step_s, step_s, 1500)))
            assert wait_until(lambda: c.job(a).telemetry is not before, 10)

        for _ in range(MIN_REPORTS + 2):
            report(0.25)
        assert telemetry(api, a)["baseline_step_time_s"] is None and a not in slowdowns(api)  # never alone
        api.post(f"/v1/jobs/{b}/cancel", headers=ROOT)
        assert wait_until(lambda: c.job(b).phase is JobPhase.CANCELLED, 10)
        for _ in range(MIN_REPORTS):  # the first began beside b: it does not count
            report(0.1)
        assert telemetry(api, a)["baseline_step_time_s"] is None
        report(0.1)
        shown = telemetry(api, a)
        assert shown["baseline_step_time_s"] == pytest.approx(0.1) and shown["slowdown"] == pytest.approx(1.0)
        assert slowdowns(api)[a] == pytest.approx(1.0)
        report(0.2)
        assert slowdowns(api)[a] == pytest.approx(2.0) == telemetry(api, a)["slowdown"]
    finally:
        shutdown(c)
