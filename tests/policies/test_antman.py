"""AntMan end to end, through the real engine and ClusterState, with a fake executor whose telemetry the test
controls (``FakeExecutor`` below): every round re-checks every invariant of the state (memory never over-given,
opportunistic caps within 1000 milli per GPU, quotas), and every action AntMan's promises (a guaranteed job is
never preempted, nor its reservation lowered below what it measured it needs).

Unless a case says otherwise: GPUs of 16 GiB (16384 MiB); jobs give their memory need (``mem``), which the fake
reports back as measured; a guaranteed job steps 0.3 x (opportunistic share on its GPU) slower (``sensitivity``
0.3), so it tolerates up to 166 milli of opportunistic share within the 5% threshold; the default config
(coordinator on, shrink on reclaim, start at 100 milli, +100 per 10 s, x0.5 on slowdown, margin 512 MiB).
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from builders import cluster, job
from corral.core.cluster import Cluster, Topology
from corral.core.decisions import Action, Launch, Preempt, Resize
from corral.core.errors import ConfigError
from corral.core.events import DemandChanged, JobFinished
from corral.core.job import JobClass, JobPhase, JobSpec
from corral.core.placement import Placement
from corral.core.status import JobStatus
from corral.core.telemetry import Telemetry
from corral.engine.clock import VirtualClock
from corral.engine.executor import EventSink
from corral.engine.loop import Engine
from corral.engine.state import ClusterState
from corral.policies.antman.policy import AntManConfig, AntManPolicy, Reclaim
from corral.policies.framework.contract import BasePolicy
from corral.policies.registry import make_policy, policy_names


# -- the harness: the real engine and state, a fake executor ----------------------------------------------------
# The fake runs every job at its own pace (``duration`` seconds of work take ``duration`` seconds, whatever shares
# it holds: progress is not what these tests are about) and, whenever the jobs on some GPUs change, reports
# telemetry for every job there from a model the test sets:
#
# - a *holder* (a job on an ordinary placement) steps in 1.0 s alone (its solo time, reported unless
#   ``solo=False``) and ``1 + sensitivity x (opportunistic shares on its busiest GPU) / 1000`` beside guests; its
#   memory peak is its need;
# - a *guest* (opportunistic placement) steps in ``1000 / share`` s (paused: a huge number), and uses at most its
#   memory cap;
# - a job's need is ``need[job]``, else its spec's ``gpu_mem_mib``, else ``default_need``; its SM use is
#   ``sm[job]`` (default 0.5), times its share for a guest;
# - ``demand[job] = [(after_s, new_need), ...]`` changes a job's need that long after its launch (a
#   ``DemandChanged`` event, as the simulator's).
class FakeExecutor:
    def __init__(
        self,
        state: ClusterState,
        *,
        sensitivity: float = 0.3,
        need: Mapping[str, int] | None = None,
        sm: Mapping[str, float] | None = None,
        demand: Mapping[str, Sequence[tuple[float, int]]] | None = None,
        default_need: int = 4000,
        solo: bool = True,
    ) -> None:
        self.state = state
        self.sensitivity = sensitivity
        self.need = dict(need or {})
        self.sm = dict(sm or {})
        self.demand = {k: list(v) for k, v in (demand or {}).items()}
        self.default_need = default_need
        self.solo = solo
        self.sink: EventSink | None = None
        self.current: dict[str, set[object]] = {}  # job -> its current (not superseded) events
        self.started: dict[str, tuple[float, float]] = {}  # job -> (launch time, work done then)
        self.gpus_of: dict[str, tuple[int, ...]] = {}  # running job -> its GPUs (to re-report them when it ends)

    # -- Executor ---------------------------------------------------------------------------------------------
    def bind(self, sink: EventSink) -> None:
        self.sink = sink

    def launch(self, job: JobStatus, now_s: float) -> None:
        assert self.sink is not None and job.spec.duration_s is not None and job.placement is not None
        job_id = job.spec.job_id
        self.started[job_id] = (now_s, job.work_done_s)
        self.gpus_of[job_id] = job.placement.gpus
        done = JobFinished(job_id, job.run_epoch)
        self.current[job_id] = {done}
        self.sink.schedule(now_s + max(0.0, job.spec.duration_s - job.work_done_s), done)
        for after, _need in self.demand.get(job_id, ()):
            event = DemandChanged(job_id, job.run_epoch)
            self.current[job_id].add(event)
            self.sink.schedule(now_s + after, event)
        self._report_around(job.placement.gpus, now_s)

    def preempt(self, job: JobStatus, now_s: float, *, suspend: bool = False) -> float:
        job_id = job.spec.job_id
        start, done = self.started.pop(job_id)
        self.current.pop(job_id, None)
        self.gpus_of.pop(job_id, None)
        assert job.placement is not None
        self._report_around(job.placement.gpus, now_s, leaving=job_id)
        return min(done + now_s - start, job.spec.duration_s or 0.0)

    def resized(self, job: JobStatus, now_s: float, before: Placement) -> None:
        assert job.placement is not None
        self.gpus_of[job.spec.job_id] = job.placement.gpus
        self._report_around((*before.gpus, *job.placement.gpus), now_s)

    def finished(self, job: JobStatus, now_s: float) -> None:
        self.started.pop(job.spec.job_id, None)
        self.current.pop(job.spec.job_id, None)
        self._report_around(self.gpus_of.pop(job.spec.job_id, ()), now_s)  # its neighbours speed up

    def demand_changed(self, job: JobStatus, now_s: float) -> None:
        job_id = job.spec.job_id
        changes = self.demand[job_id]
        _after, need = changes.pop(0)
        self.need[job_id] = need
        self._report(job_id, now_s)

    def is_current(self, event: JobFinished | DemandChanged) -> bool:
        return event in self.current.get(event.job_id, ())

    # -- the telemetry model ----------------------------------------------------------------------------------
    def need_of(self, job_id: str) -> int:
        got = self.need.get(job_id)
        if got is not None:
            return got
        mem = self.state.job(job_id).spec.gpu_mem_mib
        return mem if mem is not None else self.default_need

    def _report_around(self, gpus: Iterable[int], now_s: float, leaving: str | None = None) -> None:
        state = self.state
        seen: dict[str, None] = {}
        for g in gpus:
            seen.update(dict.fromkeys(state.gpu_jobs(g)))
            seen.update(dict.fromkeys(state.gpu_opportunistic_jobs(g)))
        for job_id in seen:
            self._report(job_id, now_s, leaving)

    def _report(self, job_id: str, now_s: float, leaving: str | None = None) -> None:
        assert self.sink is not None
        state = self.state
        job = state.job(job_id)
        p = job.placement
        if p is None:
            return
        need = self.need_of(job_id)
        sm = self.sm.get(job_id, 0.5)
        if p.opportunistic:
            share = p.gpu_milli
            step = 1000.0 / share if share else 1e6
            cap = p.mem_mib if p.mem_mib is not None else need
            peak = min(need, cap)
            sm *= share / 1000
        else:
            busiest = max(sum(self._share(x) for x in state.gpu_opportunistic_jobs(g) if x != leaving) for g in p.gpus)
            step = 1.0 + self.sensitivity * busiest / 1000
            peak = need
        self.sink.report(
            job_id, Telemetry(now_s, step, 1.0 if self.solo else None, peak, peak // 2, need, min(1.0, sm))
        )

    def _share(self, job_id: str) -> int:
        p = self.state.job(job_id).placement
        return 0 if p is None else p.gpu_milli


def check_downgrades(state: ClusterState, actions: list[Any]) -> None:
    """A round's downgrades are for its own tenant's guaranteed jobs: every tenant whose upgraded job it suspends
    back launches a job submitted as guaranteed in the same round."""
    launched = {
        state.job(a.job_id).spec.tenant
        for a in actions
        if isinstance(a, Launch) and state.job(a.job_id).spec.job_class is JobClass.GUARANTEED
    }
    for a in actions:
        if isinstance(a, Preempt) and a.downgrade:
            assert state.job(a.job_id).spec.tenant in launched, f"{a.job_id} downgraded for no job of its tenant"


class _CheckedEngine(Engine):
    """The engine, with every round and action checked against the state's and AntMan's invariants."""

    timer_rounds = 0

    def _round(self, now: float) -> None:
        log = self.decision_log
        assert log is not None
        first = len(log)
        super()._round(now)
        self.state.check_invariants()
        check_downgrades(self.state, [entry.action for entry in log[first:]])

    def _apply(self, action: Action, now: float) -> None:
        check_action(self.state, action)
        super()._apply(action, now)

    def _handle(self, event: Any, now: float) -> bool:
        if type(event).__name__ == "TimerFired":
            self.timer_rounds += 1
        return super()._handle(event, now)


class Harness:
    """An engine with the fake executor; every round re-checks every invariant of the state and of AntMan."""

    def __init__(self, c: Cluster, policy: BasePolicy, **fake: Any) -> None:
        topo = Topology(c)
        self.state = ClusterState(topo, c.tenants, queue_key=policy.queue_key)
        self.executor = FakeExecutor(self.state, **fake)
        self.engine = _CheckedEngine(self.state, policy, self.executor, VirtualClock(), record_decisions=True)
        self.wakes: list[float | None] = []

    @property
    def timer_rounds(self) -> int:
        return self.engine.timer_rounds

    def run(self, jobs: Iterable[JobSpec], until_s: float | None = None) -> list[str]:
        self.engine.feed(sorted(jobs, key=lambda s: s.submit_s))
        self.engine.run(until_s)
        return self.log()

    def log(self) -> list[str]:
        assert self.engine.decision_log is not None
        return [entry.render() for entry in self.engine.decision_log]


def check_action(state: ClusterState, action: Action) -> None:
    """AntMan's promises, checked on every action before it is applied: a job submitted as guaranteed is never
    preempted or suspended, its compute share never cut, and its reservation never lowered below what it measured it
    needs; an upgraded job is stopped only as a downgrade (see :func:`check_downgrades`)."""
    if isinstance(action, Preempt):
        job = state.job(action.job_id)
        if action.downgrade:
            assert job.upgraded and job.spec.job_class is JobClass.OPPORTUNISTIC, f"{action.job_id} downgraded"
        else:
            assert job.job_class is JobClass.OPPORTUNISTIC, f"guaranteed job {action.job_id} preempted"
    if isinstance(action, Resize) and action.gpu_milli is not None:
        placement = state.job(action.job_id).placement
        assert placement is not None
        if not placement.opportunistic:
            assert action.gpu_milli >= placement.gpu_milli, f"guaranteed job's share cut: {action}"
    if isinstance(action, Resize) and action.mem_mib is not None:
        job = state.job(action.job_id)
        p, tel = job.placement, job.telemetry
        assert p is not None
        if not p.opportunistic and tel is not None:
            old = p.mem_mib if p.mem_mib is not None else job.spec.gpu_mem_mib or 0
            if action.mem_mib < old:
                assert action.mem_mib >= max(tel.mem_peak_mib, tel.mem_need_mib), f"{action} below measured need"


def antman(**options: Any) -> AntManPolicy:
    return AntManPolicy(AntManConfig(**options))


def launches(lines: list[str]) -> list[str]:
    return [line for line in lines if " launch " in line]


# -- registry and options ---------------------------------------------------------------------------------------
def test_registered_with_options() -> None:
    assert "antman" in policy_names()
    p = make_policy("antman:reclaim=preempt,coordinator=false,max_sm_used=0.5,start_milli=50")
    assert isinstance(p, AntManPolicy)
    assert p.cfg.reclaim is Reclaim.PREEMPT and not p.cfg.coordinator and p.cfg.max_sm_used == 0.5
    assert p.needs_telemetry and p.needs_models


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_sm_used": 1.5}, "max_sm_used"),
        ({"start_milli": 0}, "start_milli"),
        ({"max_opportunistic_per_gpu": 0}, "max_opportunistic_per_gpu"),
        ({"decrease_factor": 1.0}, "decrease_factor"),
        ({"control_interval_s": 0.0}, "control_interval_s"),
        ({"scan_gpus": 0}, "scan_gpus"),
    ],
)
def test_bad_options(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        AntManConfig(**options)


# -- reclaim: a guaranteed job lands where an opportunistic job runs --------------------------------------------
TWO_GPUS = cluster(nodes=1, gpus=2, tenants={"a": 2})


def test_landing_shrinks_the_opportunistic_job_first_then_the_coordinator_settles_it() -> None:
    # o (no quota tenant b) takes idle GPU 0 at its full share. g (2 GPUs, 8000 MiB each) lands on GPUs 0-1 at 5:
    # in the same decision, before the launch, o's share drops to 100 (its memory fits: 16384 - 8000 >= 6000).
    # Then AIMD at 10 s ticks: 200 hurts g (+6%) -> 100 (ceiling 175) -> 175 hurts (+5.25%) -> 87 (ceiling
    # 150) -> 150, which does not: settled. When g ends, o is alone again and takes its whole request at once.
    h = Harness(TWO_GPUS, antman())
    lines = h.run(
        [
            job("o", duration=1000, tenant="b", mem=6000, opportunistic=True),
            job("g", gpus=2, duration=100, submit=5, tenant="a", mem=8000),
        ]
    )
    assert lines == [
        "0.000 launch o gpus=0 milli=1000",
        "5.000 resize o milli=100",
        "5.000 launch g gpus=0 1 milli=1000",
        "5.000 resize o mem=6512",  # room beside g: its cap grows to its need + the margin
        "20.000 resize o milli=200",
        "20.000 resize g mem=8512",  # g's reservation: its measured peak + the margin
        "30.000 resize o milli=100",
        "40.000 resize o milli=175",
        "50.000 resize o milli=87",
        "60.000 resize o milli=150",
        "105.000 resize o milli=1000",
    ]
    # Ticks while settling (20..70) and one check after o regrows (120); none in the long steady tail to 1000.
    assert h.timer_rounds == 7


def test_landing_suspends_an_opportunistic_job_left_too_little_memory() -> None:
    # g reserves 12000 of GPU 0's 16384: 4384 left < half of o's 12000. o is suspended in the same decision,
    # before the launch, and waits (GPU 1 has no room for it either) until g ends.
    h = Harness(TWO_GPUS, antman())
    lines = h.run(
        [
            job("o", duration=1000, tenant="b", mem=12000, opportunistic=True),
            job("g", gpus=2, duration=100, submit=5, tenant="a", mem=12000),
        ]
    )
    assert lines == [
        "0.000 launch o gpus=0 milli=1000",
        "5.000 suspend o",
        "5.000 launch g gpus=0 1 milli=1000",
        "105.000 launch o gpus=0 milli=1000",
    ]
    assert h.state.job("g").end_s == 105.0  # the guaranteed job never waited


def test_reclaim_preempt_always_suspends() -> None:
    h = Harness(TWO_GPUS, antman(reclaim=Reclaim.PREEMPT))
    lines = h.run(
        [
            job("o", duration=1000, tenant="b", mem=2000, opportunistic=True),
            job("g", gpus=2, duration=100, submit=5, tenant="a", mem=8000),
        ]
    )
    assert lines[1:3] == ["5.000 suspend o", "5.000 launch g gpus=0 1 milli=1000"]


def test_a_guaranteed_jobs_peak_growing_shrinks_the_opportunistic_job_first() -> None:
    # 50 s after its launch g's need grows to 12000: its reservation goes to 12512 at once, and o, beside it, is
    # first cut to what is left (16384 - 12512 = 3872, above half of its 6000: it keeps running, spilling).
    h = Harness(TWO_GPUS, antman(), demand={"g": [(50.0, 12000)]})
    lines = h.run(
        [
            job("o", duration=1000, tenant="b", mem=6000, opportunistic=True),
            job("g", gpus=2, duration=100, submit=5, tenant="a", mem=8000),
        ]
    )
    at_55 = [line for line in lines if line.startswith("55.000")]
    assert at_55 == ["55.000 resize o mem=3872", "55.000 resize g mem=12512"]
    assert "105.000 resize o milli=1000 mem=6512" in lines  # g gone: o gets its share and memory back


def test_without_the_coordinator_shares_and_memory_stay_as_placed_and_nothing_ticks() -> None:
    h = Harness(TWO_GPUS, antman(coordinator=False))
    lines = h.run(
        [
            job("o", duration=1000, tenant="b", mem=6000, opportunistic=True),
            job("g", gpus=2, duration=100, submit=5, tenant="a", mem=8000),
        ]
    )
    assert lines == ["0.000 launch o gpus=0 milli=1000", "5.000 launch g gpus=0 1 milli=1000"]
    assert h.timer_rounds == 0


# -- placing opportunistic jobs by measured use -----------------------------------------------------------------
def test_an_opportunistic_job_goes_to_the_least_used_gpu_under_max_sm_used() -> None:
    # Three holders measure 0.7, 0.2 and 0.9 of their GPUs' SMs; 0.9 is above max_sm_used (0.8). o takes GPU 1,
    # beside a holder: at start_milli.
    c = cluster(nodes=1, gpus=3)
    h = Harness(c, antman(), sm={"h0": 0.7, "h1": 0.2, "h2": 0.9})
    lines = h.run(
        [job(f"h{i}", duration=100, mem=4000) for i in range(3)]
        + [job("o", duration=50, submit=1, mem=4000, opportunistic=True)]
    )
    assert "1.000 launch o gpus=1 milli=100" in lines


def test_nothing_is_placed_on_gpus_above_max_sm_used() -> None:
    c = cluster(nodes=1, gpus=1)
    h = Harness(c, antman(), sm={"h": 0.9})
    lines = h.run([job("h", duration=100, mem=4000), job("o", duration=50, submit=1, mem=4000, opportunistic=True)])
    assert launches(lines) == ["0.000 launch h gpus=0 milli=1000", "100.000 launch o gpus=0 milli=1000"]


def test_an_opportunistic_gang_prefers_one_node() -> None:
    # GPU 0 (node 0) is busy (SM 0.1); GPUs 1, 2, 3 idle. Least used first would take GPU 1 (node 0) and GPU 2
    # (node 1); the first node with two candidates, node 1, wins.
    c = cluster(nodes=2, gpus=2)
    h = Harness(c, antman(), sm={"h": 0.1})
    lines = h.run([job("h", duration=100, mem=4000), job("o", gpus=2, duration=50, submit=1, opportunistic=True)])
    assert "1.000 launch o gpus=2 3 milli=1000" in lines


def test_fractional_jobs_share_gpus_within_1000_milli() -> None:
    # openb-like: guaranteed 300 + 500 milli fit on GPU 0; 400 more would exceed it, so f3 takes GPU 1. A
    # best-effort 200 milli job then goes to the less used of the two (GPU 1: SM 0.5 against 0.3 + 0.5), beside
    # f3: at start_milli, below its request.
    c = cluster(nodes=1, gpus=2)
    h = Harness(c, antman(), sm={"f1": 0.3, "f2": 0.5})
    lines = h.run(
        [
            job("f1", duration=100, milli=300),
            job("f2", duration=100, milli=500),
            job("f3", duration=100, milli=400, submit=1, gpus=1, types=()),
            job("be", duration=100, milli=200, submit=2, opportunistic=True),
        ]
    )
    assert launches(lines)[:2] == ["0.000 launch f1 gpus=0 milli=300", "0.000 launch f2 gpus=0 milli=500"]
    assert "1.000 launch f3 gpus=1 milli=400" in lines  # GPU 0 has 200 milli left: f3 goes to GPU 1
    assert "2.000 launch be gpus=1 milli=100" in lines


# -- guaranteed jobs: quota, FIFO within a tenant, fair order across tenants ------------------------------------
def test_fair_order_across_tenants_then_tenants_without_quota() -> None:
    # Four GPUs, all seven jobs at 0. a and b (quota 4 each) alternate, ties by name, the least-served first;
    # c has no quota and comes after them. At 100 the second wave goes in the same order.
    c = cluster(nodes=1, gpus=4, tenants={"a": 4, "b": 4, "c": None})
    jobs = [job(f"{t}{i}", duration=100, tenant=t, mem=4000) for t in "abc" for i in (1, 2, 3) if f"{t}{i}" != "c3"]
    h = Harness(c, antman())
    lines = launches(h.run(jobs))
    order = [line.split()[2] for line in lines]
    assert order[:4] == ["a1", "b1", "a2", "b2"]
    assert order[4:7] == ["a3", "b3", "c1"]


def test_first_come_first_served_within_a_tenant_others_go_on() -> None:
    # b holds 2 of 4 GPUs. a's head needs 3: a stops there (a2, which would fit, waits behind it); b goes on.
    c = cluster(nodes=1, gpus=4, tenants={"a": 4, "b": 4})
    h = Harness(c, antman())
    lines = launches(
        h.run(
            [
                job("b1", gpus=2, duration=1000, tenant="b", mem=4000),
                job("a1", gpus=3, duration=100, submit=1, tenant="a", mem=4000),
                job("a2", duration=100, submit=1, tenant="a", mem=4000),
                job("b2", duration=100, submit=1, tenant="b", mem=4000),
            ]
        )
    )
    assert [line.split()[:3] for line in lines] == [
        ["0.000", "launch", "b1"],
        ["1.000", "launch", "b2"],
        ["1000.000", "launch", "a1"],
        ["1000.000", "launch", "a2"],
    ]


def test_quota_caps_guaranteed_jobs_and_opportunistic_jobs_use_the_rest() -> None:
    # a's quota is 1 GPU: its second guaranteed job waits although a GPU is free, and a's opportunistic job runs
    # on that GPU meanwhile. Nothing of a's guaranteed work is ever preempted for it.
    c = cluster(nodes=1, gpus=2, tenants={"a": 1})
    h = Harness(c, antman())
    lines = h.run(
        [
            job("g1", duration=100, tenant="a", mem=4000),
            job("g2", duration=100, submit=1, tenant="a", mem=4000),
            job("o", duration=50, submit=2, tenant="a", mem=4000, opportunistic=True),
        ]
    )
    assert launches(lines) == [
        "0.000 launch g1 gpus=0 milli=1000",
        "2.000 launch o gpus=1 milli=1000",
        "100.000 launch g2 gpus=0 milli=1000",
    ]


@pytest.mark.parametrize(
    ("spec", "reason"),
    [
        (job("big", gpus=8, tenant="a"), "needs 8 GPUs; the cluster has at most 4 of one type"),
        (job("opp", gpus=8, opportunistic=True), "needs 8 GPUs; the cluster has at most 4 of one type"),
        (job("over", gpus=3, tenant="a"), "needs 3 guaranteed GPUs; tenant 'a' has a quota of 2"),
    ],
)
def test_impossible_jobs_are_rejected(spec: JobSpec, reason: str) -> None:
    h = Harness(cluster(nodes=1, gpus=4, tenants={"a": 2}), antman())
    h.run([spec])
    assert h.state.job(spec.job_id).phase is JobPhase.REJECTED
    assert h.state.job(spec.job_id).reason == reason


def test_jobs_of_duration_zero_finish() -> None:
    h = Harness(cluster(nodes=1, gpus=2, tenants={"a": 1}), antman())
    h.run([job("g", duration=0, tenant="a"), job("o", duration=0, opportunistic=True), job("u", duration=0)])
    assert {j.phase for j in h.state.jobs()} == {JobPhase.FINISHED}


# -- upgrades -----------------------------------------------------------------------------------------------------
def test_an_opportunistic_job_is_upgraded_in_place_when_quota_frees() -> None:
    c = cluster(nodes=1, gpus=2, tenants={"a": 1})
    h = Harness(c, antman())
    lines = h.run(
        [
            job("g1", duration=100, tenant="a", mem=4000),
            job("o", duration=1000, submit=1, tenant="a", mem=4000, opportunistic=True),
        ]
    )
    assert launches(lines) == ["0.000 launch g1 gpus=0 milli=1000", "1.000 launch o gpus=1 milli=1000"]
    assert "100.000 upgrade o gpus=1 milli=1000" in lines
    o = h.state.job("o")
    assert o.upgraded and o.job_class is JobClass.GUARANTEED and o.preemptions == 0
    assert h.state.tenant_guaranteed_milli("a") == 0  # o finished; while it ran it counted against a's quota


def test_an_opportunistic_job_is_upgraded_by_migration_when_its_gpu_is_held() -> None:
    # o runs beside h (tenant b) on GPU 1, the less used one. When g1 ends, a's quota has room but o's GPU is
    # held by h: o moves to the free GPU 0 as a guaranteed job.
    c = cluster(nodes=1, gpus=2, tenants={"a": 1, "b": None})
    h = Harness(c, antman(), sm={"g1": 0.7, "h": 0.3})
    lines = h.run(
        [
            job("g1", duration=100, tenant="a", mem=4000),
            job("h", duration=1000, tenant="b", mem=4000),
            job("o", duration=1000, submit=1, tenant="a", mem=4000, opportunistic=True),
        ]
    )
    assert "1.000 launch o gpus=1 milli=100" in lines
    assert "100.000 upgrade o gpus=0 milli=1000" in lines
    assert h.state.job("o").upgraded


def test_a_waiting_opportunistic_job_with_quota_room_is_launched_and_upgraded_at_once() -> None:
    h = Harness(TWO_GPUS, antman())
    lines = h.run([job("o", duration=100, tenant="a", mem=4000, opportunistic=True)])
    assert lines[:2] == ["0.000 launch o gpus=0 milli=0", "0.000 upgrade o gpus=0 milli=1000"]
    assert h.state.job("o").upgraded


def test_no_upgrade_for_a_tenant_whose_guaranteed_queue_is_stuck() -> None:
    # a has room for 1 more GPU, but its waiting guaranteed job (2 GPUs) comes first: o is not upgraded.
    c = cluster(nodes=1, gpus=3, tenants={"a": 3, "b": None})
    h = Harness(c, antman())
    lines = h.run(
        [
            job("a1", duration=300, tenant="a", mem=4000),
            job("b1", duration=300, tenant="b", mem=4000),
            job("o", duration=1000, submit=1, tenant="b", mem=4000, opportunistic=True),  # no quota: never upgraded
            job("a2", gpus=2, duration=100, submit=2, tenant="a", mem=4000),
        ]
    )
    assert not any(" upgrade " in line for line in lines)


def test_a_later_guaranteed_job_takes_back_the_quota_an_upgrade_borrowed() -> None:
    # a's quota (1 GPU) is free when o arrives: o is launched and upgraded at once. At 10 s a's guaranteed job g
    # arrives: o, the latest (only) upgraded job of a, is suspended back to the opportunistic queue and g starts at
    # once, on o's GPU; o runs on as a guest (GPU 1 is idle: it resumes there, opportunistic).
    c = cluster(nodes=1, gpus=2, tenants={"a": 1})
    jobs = [
        job("o", duration=1000, tenant="a", mem=4000, opportunistic=True),
        job("g", duration=100, submit=10, tenant="a", mem=4000),
    ]
    h = Harness(c, antman())
    lines = h.run(jobs)
    assert lines[:2] == ["0.000 launch o gpus=0 milli=0", "0.000 upgrade o gpus=0 milli=1000"]
    assert "10.000 suspend o downgrade" in lines and "10.000 launch g gpus=0 milli=1000" in lines
    assert lines.index("10.000 suspend o downgrade") < lines.index("10.000 launch g gpus=0 milli=1000")
    o, g = h.state.job("o"), h.state.job("g")
    assert g.first_start_s == 10.0 and o.preemptions == 1 and o.end_s is not None
    # Without downgrades g waits for o to end (at 1000 s).
    h = Harness(c, antman(downgrade=False))
    lines = h.run(jobs)
    assert not any("downgrade" in line for line in lines)
    assert h.state.job("g").first_start_s == pytest.approx(1000.0)


def test_downgrades_take_the_latest_upgraded_and_only_as_many_as_needed() -> None:
    c = cluster(nodes=1, gpus=4, tenants={"a": 2})
    h = Harness(c, antman())
    lines = h.run(
        [
            job("o1", duration=1000, tenant="a", mem=4000, opportunistic=True),
            job("o2", duration=1000, submit=1, tenant="a", mem=4000, opportunistic=True),
            job("g", duration=100, submit=10, tenant="a", mem=4000),
        ]
    )
    assert "10.000 suspend o2 downgrade" in lines
    assert not any(line.startswith("10.000 suspend o1") for line in lines)
    assert h.state.job("g").first_start_s == 10.0


# -- exclusive allocation (opportunistic=false) ---------------------------------------------------------------------
def test_exclusive_allocation_places_opportunistic_jobs_on_their_own_gpus_outside_quota() -> None:
    c = cluster(nodes=1, gpus=2, tenants={"a": 1})
    h = Harness(c, antman(opportunistic=False))
    lines = h.run(
        [job("g", duration=100, tenant="a", mem=4000), job("o", duration=100, tenant="a", mem=4000, opportunistic=True)]
    )
    assert lines == ["0.000 launch g gpus=0 milli=1000", "0.000 launch o gpus=1 milli=1000"]
    assert h.timer_rounds == 0


# -- steady state and determinism ---------------------------------------------------------------------------------
def test_a_steady_cluster_is_not_ticked() -> None:
    c = cluster(nodes=1, gpus=1)
    policy = antman()
    h = Harness(c, policy)
    h.run(
        [job("g", duration=100_000, mem=4000), job("o", duration=100_000, submit=1, opportunistic=True, mem=4000)],
        until_s=50_000,
    )
    assert policy.coordinator.next_due_s() is None  # settled long ago: no wake-up pending
    assert h.timer_rounds < 10 and h.engine.rounds < 15
    assert h.state.job("o").placement is not None and 0 < h.state.job("o").placement.gpu_milli <= 166  # type: ignore[union-attr]


def random_workload(rng: random.Random, n: int) -> list[JobSpec]:
    jobs = []
    for i in range(n):
        frac = rng.random() < 0.3
        jobs.append(
            job(
                f"j{i}",
                gpus=1 if frac else rng.choice([1, 1, 2, 3]),
                duration=rng.choice([0, 30, 100, 250]),
                submit=rng.randrange(0, 300),
                milli=rng.choice([250, 500, 700]) if frac else 1000,
                tenant=rng.choice("abc"),
                mem=rng.choice([None, 2000, 6000, 12000]),
                model=rng.choice([None, "resnet50", "resnet18", "vgg16"]),
                opportunistic=rng.random() < 0.5,
            )
        )
    return jobs


SMALL = cluster(nodes=2, gpus=2, tenants={"a": 2, "b": 1, "c": None})


def test_determinism() -> None:
    jobs = random_workload(random.Random(7), 30)
    logs = []
    for _ in range(2):
        h = Harness(SMALL, antman())
        logs.append(h.run(jobs))
    assert logs[0] == logs[1] and len(logs[0]) > 30


# -- the property: whatever arrives and whatever is measured, the promises hold -----------------------------------
OPTIONS: list[dict[str, Any]] = [
    {},
    {"reclaim": Reclaim.PREEMPT},
    {"coordinator": False},
    {"opportunistic": False},
    {"max_opportunistic_per_gpu": 2, "max_sm_used": 1.0},
    {"start_milli": 1000, "min_mem_fraction": 0.0},
]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(1, 24),
    options=st.sampled_from(OPTIONS),
    sensitivity=st.sampled_from([0.0, 0.3, 3.0]),
    solo=st.booleans(),
)
def test_property_invariants_hold_under_random_arrivals_and_telemetry(
    seed: int, n: int, options: dict[str, Any], sensitivity: float, solo: bool
) -> None:
    rng = random.Random(seed)
    jobs = random_workload(rng, n)
    need = {s.job_id: rng.randrange(500, 16000) for s in jobs if rng.random() < 0.4}
    demand = {s.job_id: [(rng.choice([1.0, 20.0]), rng.randrange(500, 16000))] for s in jobs if rng.random() < 0.3}
    sm = {s.job_id: rng.choice([0.1, 0.5, 0.9]) for s in jobs}
    h = Harness(SMALL, antman(**options), sensitivity=sensitivity, need=need, demand=demand, sm=sm, solo=solo)
    h.run(jobs)  # every round checks the state's invariants, every action AntMan's promises
    # Nothing hangs: every job finished or was rejected, and no wake-up is left pending.
    assert all(j.phase.is_terminal for j in h.state.jobs())
    assert not h.engine.queue


def test_a_guaranteed_job_goes_to_a_gpu_without_an_opportunistic_job_when_one_is_free() -> None:
    # o runs alone on GPU 0 (the first the consolidated best fit would pick); g arrives later and takes GPU 1,
    # leaving o undisturbed. With both GPUs taken by guests, g lands on one of them and reclaims from it.
    c = cluster(nodes=1, gpus=2)
    h = Harness(c, antman())
    lines = h.run([job("o", duration=100, mem=4000, opportunistic=True), job("g", duration=50, submit=1, mem=4000)])
    assert "0.000 launch o gpus=0 milli=1000" in lines and "1.000 launch g gpus=1 milli=1000" in lines
    # no share cut and no suspension for o (its memory cap may still settle at its need plus the margin)
    assert not any(" resize o milli=" in line or " suspend o" in line for line in lines)

    h = Harness(c, antman())
    lines = h.run(
        [
            job("o1", duration=100, mem=4000, opportunistic=True),
            job("o2", duration=100, mem=4000, opportunistic=True),
            job("g", duration=50, submit=1, mem=4000),
        ]
    )
    assert any(line.startswith("1.000 launch g gpus=") for line in lines)
    assert any(line.startswith("1.000 resize o") for line in lines)  # reclaimed from the guest it landed beside
