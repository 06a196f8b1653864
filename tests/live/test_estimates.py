"""Start-time estimates (issue 21): the forecast of the queue (corral.sim.forecast), the controller's estimator
(corral.live.controller.estimates) and what the API and the CLI show of it.

With every duration known exactly, a forecast made from a replay's (or the live controller's) state half-way gives
each waiting job the very start it then gets: the forecast restores the state as a restart does and runs the same
engine and policy. Gandiva and IADeep are not held to that (a fresh policy's time-slice phase and co-location
history differ from the running one's); with learned durations the error is measured, not asserted.
"""

from __future__ import annotations

import contextlib
import copy
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from test_controller import shutdown

from builders import cluster, job
from corral.cli.live import load_job_file
from corral.core.cluster import Cluster, Topology
from corral.core.errors import InputError
from corral.core.job import JobPhase, JobSpec
from corral.core.status import JobStatus
from corral.core.wording import start_words
from corral.engine.clock import VirtualClock
from corral.engine.loop import Engine
from corral.engine.state import ClusterState
from corral.live.api import create_app
from corral.live.config import ServeConfig, TenantConfig
from corral.live.controller import Controller
from corral.live.records import JobRequest
from corral.policies.registry import make_policy
from corral.sim.executor import SimExecutor
from corral.sim.forecast import MIN_HISTORY, PRIOR_S, Durations, Snapshot, forecast
from corral.sim.perf import PerfModel
from corral.sim.traces import Trace
from virtual_live import virtual_controller

EXACT = ("fifo", "fifo:backfill=true", "tiresias", "themis", "hived", "yarn-cs", "antman", "sjf", "srtf")


def burst(n: int = 30, seed: int = 1, *, spread_s: float = 0.0) -> list[JobSpec]:
    rng = random.Random(seed)
    sizes = [1, 1, 2, 4, 8]
    return [
        job(f"j{i:02}", gpus=rng.choice(sizes), duration=rng.uniform(50, 500), submit=rng.uniform(0, spread_s))
        for i in range(n)
    ]


def sorted_trace(jobs: list[JobSpec]) -> Trace:
    return Trace(sorted(jobs, key=lambda j: j.submit_s), source="burst")


# -- the forecast itself ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("policy", EXACT)
def test_a_forecast_from_a_replay_half_way_gives_each_waiting_job_its_next_start(policy: str) -> None:
    c = cluster(nodes=2, gpus=4)
    p = make_policy(policy)
    topo = Topology(c)
    state = ClusterState(topo, c.tenants, queue_key=p.queue_key)
    engine = Engine(state, p, SimExecutor(topo, PerfModel.neutral(), telemetry=p.needs_telemetry), VirtualClock())
    engine.feed(sorted(burst(), key=lambda j: j.submit_s))
    engine.run(until_s=300)
    live = tuple(copy.copy(j) for j in state.jobs() if not j.phase.is_terminal)
    snap = Snapshot(c, type(p), p.config, 0, 300.0, live, {j.spec.job_id: j.spec.duration_s or 0 for j in live})
    found = forecast(snap)
    waiting = {j.spec.job_id for j in live if j.phase is JobPhase.PENDING}
    assert waiting and set(found.estimates) == waiting
    assert found.runs == 1 and found.basis == {"known": len(live)}  # all known: one replay, no range

    starts: dict[str, float] = {}

    def seen(j: JobStatus, now: float) -> None:
        if j.phase is JobPhase.RUNNING and j.spec.job_id in waiting:
            starts.setdefault(j.spec.job_id, now)

    engine.on_change = seen
    engine.run()
    for job_id, e in found.estimates.items():
        assert e.start_s == pytest.approx(starts[job_id], abs=1e-6), job_id
        assert e.earliest_s == e.latest_s == e.start_s
        assert e.gpus and e.made_s == 300.0


def test_durations_known_learned_and_assumed() -> None:
    d = Durations([float(x) for x in range(1, 101)])  # 1 s .. 100 s
    r = d.remaining(30, expected_s=100)
    assert (r.low_s, r.mid_s, r.high_s, r.basis) == (70, 70, 70, "known")
    r = d.remaining(50)  # conditioned on d > 50: 51..100, less 50 (quartiles as statistics.quantiles' inclusive)
    assert (r.basis, r.low_s, r.mid_s, r.high_s) == ("learned", 13.25, 25.5, 37.75)
    assert d.remaining(120, expected_s=100).basis == "assumed"  # ran past its expected duration and past all
    longest = 100 - MIN_HISTORY + 1  # fewer than MIN_HISTORY finished jobs ran longer: as long again
    assert d.remaining(longest).basis == "assumed"
    assert (d.remaining(longest).low_s, d.remaining(longest).high_s) == (longest / 2, 2 * longest)
    r = Durations([]).remaining(0)
    assert (r.low_s, r.mid_s, r.high_s, r.basis) == (*PRIOR_S, "assumed")


def _one_running_one_waiting(c: Cluster, *, down: tuple[str, ...] = ()) -> Snapshot:
    running = JobStatus(job("run", gpus=1, duration=None), phase=JobPhase.RUNNING, last_start_s=0.0)
    running.placement = placement_on(c, [0])
    running.first_start_s = 0.0
    waiting = JobStatus(job("wait", gpus=1, duration=None, submit=5.0), queued_since_s=5.0)
    p = make_policy("fifo")
    return Snapshot(c, type(p), p.config, 0, 10.0, (running, waiting), {"run": 100.0, "wait": 50.0}, (), down)


def placement_on(c: Cluster, gpus: list[int]) -> Any:
    from corral.core.placement import Placement

    return Placement(tuple(gpus), 1000)


def test_a_node_that_is_down_takes_no_job_in_the_forecast() -> None:
    c = cluster(nodes=2, gpus=1)
    assert forecast(_one_running_one_waiting(c)).estimates["wait"].start_s == 10.0  # the other node's GPU: now
    late = forecast(_one_running_one_waiting(c, down=("n1",))).estimates["wait"]
    assert late.start_s == 100.0 and late.gpus == (0,)  # after the running job, on its GPU


def test_a_restored_tiresias_job_is_demoted_when_its_service_crosses_the_threshold_not_a_run_later() -> None:
    """Found by benchmarks/bench_estimate.py: Tiresias took a restored running job's service as of its last stop,
    so its demotion came a whole threshold after the restart (here at 6,250 s, after the job's end at 5,000 s),
    in forecasts and after a live restart alike."""
    c = cluster(nodes=1, gpus=1)
    running = JobStatus(job("run", gpus=1, duration=None), phase=JobPhase.RUNNING, last_start_s=0.0)
    running.placement = placement_on(c, [0])
    running.first_start_s = 0.0
    waiting = JobStatus(job("wait", gpus=1, duration=None, submit=5.0), queued_since_s=5.0)
    p = make_policy("tiresias")  # thresholds 3,250 and 7,200 GPU-s
    snap = Snapshot(c, type(p), p.config, 0, 3000.0, (running, waiting), {"run": 5000.0, "wait": 50.0})
    assert forecast(snap).estimates["wait"].start_s == pytest.approx(3250.0)  # the waiting job preempts it then


def test_beyond_the_horizon_or_the_wall_time_limit_there_is_no_estimate() -> None:
    c = cluster(nodes=1, gpus=1)
    assert forecast(_one_running_one_waiting(c), horizon_s=60).estimates["wait"].start_s is None
    cut = forecast(_one_running_one_waiting(c), wall_limit_s=0)
    assert cut.cut_short and cut.estimates["wait"].start_s is None


# -- the live controller on a virtual clock ----------------------------------------------------------------------
def run_with_estimates(policy: str, jobs: list[JobSpec], *, declared: bool, at: tuple[float, ...]) -> Controller:
    """Replay ``jobs`` through the live controller, with a forecast at each of the times ``at``."""
    c = virtual_controller(Trace([], source="none"), cluster(nodes=2, gpus=4), policy)
    trace = sorted_trace(jobs)
    agent: Any = c.agent
    agent._durations = {j.job_id: j.duration_s for j in trace.jobs}
    c.feed(trace.jobs, declared=declared)
    todo = list(at)

    def after(t: float) -> None:
        while todo and t >= todo[0]:
            todo.pop(0)
            c.estimator.refresh()

    c.run_virtual(after_turn=after)
    return c


@pytest.mark.parametrize("policy", ("fifo", "tiresias", "hived", "antman"))
def test_live_estimates_equal_the_real_starts_when_durations_are_known(policy: str) -> None:
    c = run_with_estimates(policy, burst(), declared=True, at=(100.0, 400.0))
    a = c.estimator.accuracy()
    assert a.jobs >= 10
    assert (a.first_median_s, a.first_p90_s, a.last_median_s, a.last_p90_s) == (0, 0, 0, 0)
    assert a.within == 1.0


def test_learned_durations_give_ranges_and_a_measured_error() -> None:
    jobs = burst(120, seed=5, spread_s=4000)
    c = run_with_estimates("fifo", jobs, declared=False, at=tuple(float(t) for t in range(500, 5000, 500)))
    latest = c.estimator.latest
    assert latest is not None and latest.runs in (1, 3)
    a = c.estimator.accuracy()
    assert a.jobs > 20
    assert a.first_median_s is not None and a.last_median_s is not None and a.last_median_s >= 0
    assert a.within is not None and 0 <= a.within <= 1
    # The store kept each job's first and latest estimate; a latest one is never made before the first.
    rows = c.store.estimate_outcomes()
    assert len(rows) == a.jobs


# -- the API ---------------------------------------------------------------------------------------------------
ADMIN = "estimates-admin-token-0123456789"
ALICE = "estimates-alice-token-012345678"
BOB = "estimates-bob-token-0123456789ab"
ROOT = {"Authorization": f"Bearer {ADMIN}"}
AS_ALICE = {"Authorization": f"Bearer {ALICE}"}


@contextlib.contextmanager
def serving(state_dir: Path) -> Iterator[Controller]:
    config = ServeConfig(
        state_dir=state_dir,
        gpus=2,
        tenants=(TenantConfig("alice", 2, token=ALICE), TenantConfig("bob", 2, token=BOB)),
        admin_token=ADMIN,
        policy="fifo",
        grace_s=1.0,
        estimate_interval_s=0,  # on request only: the tests say when
    )
    c = Controller.from_config(config)
    c.start()
    try:
        yield c
    finally:
        shutdown(c)  # no process left behind


@pytest.fixture(scope="module")
def controller(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Controller]:
    with serving(tmp_path_factory.mktemp("e")) as c:
        yield c


@pytest.fixture(scope="module")
def api(controller: Controller) -> TestClient:
    return TestClient(create_app(controller))


SLEEP = ["python3", "-c", "import time; time.sleep(60)"]


def test_the_api_estimates_the_queue_and_tests_a_job_without_submitting_it(api: TestClient) -> None:
    body = {"command": SLEEP, "cwd": "/", "num_gpus": 2, "expected_duration_s": 60}
    first = api.post("/v1/jobs", json={**body, "tenant": "alice"}, headers=ROOT).json()
    second = api.post("/v1/jobs", json={**body, "tenant": "bob", "expected_duration_s": 30}, headers=ROOT).json()
    assert second["expected_duration_s"] == 30
    deadline = time.monotonic() + 20
    while api.get(f"/v1/jobs/{first['job_id']}", headers=ROOT).json()["phase"] != "running":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert api.get("/v1/estimates", headers=ROOT).json()["made_s"] is None  # none made yet
    assert api.post("/v1/estimates", headers=AS_ALICE).status_code == 403
    made = api.post("/v1/estimates", headers=ROOT).json()
    assert made["pending"] == 1 and made["known"] == 2 and made["runs"] == 1
    mine = api.get("/v1/estimates", headers=AS_ALICE).json()  # a tenant sees no other tenant's counts
    assert mine["made_s"] == made["made_s"] and mine["pending"] is None and mine["known"] is None
    waiting = api.get(f"/v1/jobs/{second['job_id']}", headers=ROOT).json()
    e = waiting["estimated_start"]
    start = first["submit_s"] + 60  # the first job's expected end, give or take its start
    assert e is not None and e["start_s"] == pytest.approx(start, abs=2.0) and e["earliest_s"] == e["latest_s"]
    assert api.get(f"/v1/jobs/{first['job_id']}", headers=ROOT).json()["estimated_start"] is None  # running

    before = api.get("/v1/jobs", headers=ROOT).json()["total"]
    test = api.post("/v1/jobs/test", json={"command": SLEEP, "num_gpus": 1}, headers=AS_ALICE)
    assert test.status_code == 200, test.text
    t = test.json()
    assert t["start_s"] == pytest.approx(e["start_s"] + 30, abs=2.0)  # FIFO: behind the 30 s job
    assert t["gpus"] in ([0], [1]) and t["nodes"] == ["local"]
    assert api.get("/v1/jobs", headers=ROOT).json()["total"] == before  # nothing was submitted
    refused = api.post("/v1/jobs/test", json={"command": SLEEP, "num_gpus": 3}, headers=AS_ALICE)
    assert refused.status_code == 422 and "3 GPUs" in refused.json()["detail"]
    other = api.post("/v1/jobs/test", json={"command": SLEEP, "tenant": "bob"}, headers=AS_ALICE)
    assert other.status_code == 403
    assert api.get("/v1/estimates/accuracy", headers=AS_ALICE).status_code == 403
    assert api.get("/v1/estimates/accuracy", headers=ROOT).json()["jobs"] == 0  # nobody estimated has started
    bad = api.post("/v1/jobs", json={**body, "tenant": "alice", "expected_duration_s": -1}, headers=ROOT)
    assert bad.status_code == 422 and "expected_duration_s" in bad.text


STEPPER = """
import time
import corral.job
with corral.job.Job(total_steps=150, verbose=False) as job:
    for _ in job.loop(range(150)):
        time.sleep(0.04)
"""


def test_a_job_that_says_how_many_steps_it_has_left_gives_the_jobs_behind_it_their_start(tmp_path: Path) -> None:
    with serving(tmp_path / "s") as c:
        import sys

        stepper = c.submit(JobRequest(command=(sys.executable, "-c", STEPPER), tenant="alice", num_gpus=2, cwd="/"))
        behind = c.submit(JobRequest(command=tuple(SLEEP), tenant="bob", cwd="/"))  # no duration of its own
        deadline = time.monotonic() + 30
        while c.call(lambda: c.seconds_left(stepper.job_id, c.clock.now())) is None:  # its first step report
            assert time.monotonic() < deadline, "no step report"
            time.sleep(0.1)
        found = c.estimator.refresh()
        assert found.basis["known"] >= 1
        e = c.job(behind.job_id).estimate
        assert e is not None and e.start_s is not None
        left = c.call(lambda: c.seconds_left(stepper.job_id, found.made_s))
        assert left is not None and 0 < left < 6.1  # 150 steps of 40 ms, less what it has done
        assert e.start_s == pytest.approx(found.made_s + left, abs=0.5)
        while c.job(behind.job_id).phase is JobPhase.PENDING:
            assert time.monotonic() < deadline + 30
            time.sleep(0.05)
        started = c.job(behind.job_id).status.first_start_s
        assert started is not None and started == pytest.approx(e.start_s, abs=2.0)  # a 2-core machine's timing


def test_another_policy_on_the_current_queue_per_tenant(api: TestClient) -> None:
    assert api.post("/v1/estimates/whatif", json={"policy": "tiresias"}, headers=AS_ALICE).status_code == 403
    bad = api.post("/v1/estimates/whatif", json={"policy": "nosuch"}, headers=ROOT)
    assert bad.status_code == 422 and "nosuch" in bad.json()["detail"]
    r = api.post("/v1/estimates/whatif", json={"policy": "tiresias"}, headers=ROOT)
    assert r.status_code == 200, r.text
    found = r.json()
    assert found["policy"].startswith("fifo") and found["other"].startswith("tiresias")
    pending = api.get("/v1/jobs", params={"phase": "pending"}, headers=ROOT).json()["total"]
    assert sum(t["pending"] for t in found["tenants"] if t["tenant"] is not None) == pending


def test_moves_count_jobs_that_start_earlier_or_later_per_tenant() -> None:
    from corral.live.controller.estimates import moves
    from corral.sim.forecast import Estimate, Forecast

    def fc(starts: dict[str, float | None]) -> Forecast:
        return Forecast(100.0, 0.0, {j: Estimate(j, s, s, s, 100.0) for j, s in starts.items()}, {}, 1)

    now = fc({"a1": 200.0, "a2": 400.0, "b1": 150.0})
    other = fc({"a1": 120.0, "a2": 400.5, "b1": None})
    rows = {m.tenant: m for m in moves(now, other, {"a1": "a", "a2": "a", "b1": "b"})}
    assert (rows["a"].pending, rows["a"].earlier, rows["a"].later) == (2, 1, 0)  # 0.5 s is no move
    assert (rows["a"].wait_now_s, rows["a"].wait_other_s) == (200.0, pytest.approx(160.25))
    assert (rows["b"].wait_now_s, rows["b"].wait_other_s) == (50.0, None)
    assert rows[None].pending == 3


# -- the CLI's words ---------------------------------------------------------------------------------------------
def test_start_words() -> None:
    assert start_words(None, None, None, 0) == "not within the forecast's horizon (30 days)"
    assert start_words(100, 100, 100, 100) == "now"
    assert start_words(1500, 1200, 2400, 0) == "in 25m00s (20m00s to 40m00s)"
    assert start_words(180, 120, None, 0) == "in 3m00s (2m00s or later)"
    assert start_words(60, 60, 60, 0) == "in 1m00s"


def test_a_job_file_may_say_how_long_the_job_runs(tmp_path: Path) -> None:
    f = tmp_path / "job.toml"
    f.write_text('command = "python train.py"\nexpected_duration = "2h"\n')
    assert load_job_file(f)["expected_duration"] == 7200
    f.write_text('command = "python train.py"\nexpected_duration = 90\n')
    assert load_job_file(f)["expected_duration"] == 90
    f.write_text('command = "python train.py"\nexpected_duration = "soon"\n')
    with pytest.raises(InputError) as e:
        load_job_file(f)
    assert "job.toml" in str(e.value) and "expected_duration" in str(e.value) and "soon" in str(e.value)


def test_the_forecast_worker_leaves_with_a_killed_server(tmp_path: Path) -> None:
    """After a ``kill -9`` of ``corral serve`` nothing tells the forecast's worker process (it holds its own end of
    the task queue's pipe): it watches its parent and leaves within a second or two."""
    import os
    import signal

    from live_server import start_server

    (tmp_path / "serve.toml").write_text("[server]\nestimate_interval_s = 0.5\n")
    server = start_server(tmp_path / "state", "--gpus", "1", "--config", str(tmp_path / "serve.toml"))

    def workers() -> list[int]:
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                with contextlib.suppress(OSError):
                    fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                    if int(fields[1]) == server.process.pid and b"spawn_main" in (entry / "cmdline").read_bytes():
                        found.append(int(entry.name))
        return found

    try:
        deadline = time.monotonic() + 30
        while not (found := workers()):
            assert time.monotonic() < deadline, "no forecast worker started"
            time.sleep(0.1)
    finally:
        server.process.send_signal(signal.SIGKILL)
        server.process.wait()
    deadline = time.monotonic() + 10
    while any(Path(f"/proc/{pid}").exists() and "Z" not in Path(f"/proc/{pid}/stat").read_text() for pid in found):
        assert time.monotonic() < deadline, f"forecast worker {found} outlived the server"
        time.sleep(0.1)
    for pid in found:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)
