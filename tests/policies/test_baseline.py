"""FIFO, SJF and SRTF end to end, through the simulator, with every time worked out by hand.

Unless a case says otherwise: one rack, one GPU type of speed 1.0 and consolidated placement, so a job runs at
rate 1.0 and ends ``duration`` seconds after it starts; a restarted job first pays ``restore_s``.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from builders import cluster, job, log, occupy, run, spans, state
from corral.core.cluster import Topology
from corral.core.job import JobPhase, JobSpec
from corral.engine.clock import VirtualClock
from corral.engine.loop import Engine
from corral.engine.state import ClusterState
from corral.policies.baseline import FifoConfig, FifoPolicy, SjfPolicy, SrtfConfig, SrtfPolicy, fill
from corral.policies.framework.contract import BasePolicy
from corral.policies.framework.placement import PlacementStrategy
from corral.policies.framework.round import Round
from corral.policies.registry import make_policy
from corral.sim.executor import SimExecutor
from corral.sim.perf import PerfModel


# -- FIFO -----------------------------------------------------------------------------------------------------
def hol_jobs() -> list[JobSpec]:
    return [
        job("a", gpus=2, duration=100, submit=0),
        job("b", gpus=4, duration=50, submit=1),
        job("c", duration=10, submit=2),
    ]


def test_fifo_head_of_line_blocking() -> None:
    # 4 GPUs. a takes 2 (0-100). b needs all 4: waits for a (100-150). c needs 1 and 2 are free from t=2,
    # but it is behind b: 150-160.
    result = run(hol_jobs(), cluster(nodes=1, gpus=4), make_policy("fifo"))
    assert spans(result) == {"a": (0, 100), "b": (100, 150), "c": (150, 160)}
    assert log(result) == [
        "0.000 launch a gpus=0 1 milli=1000",
        "100.000 launch b gpus=0 1 2 3 milli=1000",
        "150.000 launch c gpus=0 milli=1000",
    ]


def test_fifo_backfill_lets_the_small_job_past() -> None:
    # Same trace with backfill: c starts on arrival on a free GPU (2-12); b still waits for a (100-150).
    result = run(hol_jobs(), cluster(nodes=1, gpus=4), make_policy("fifo:backfill=true"))
    assert spans(result) == {"a": (0, 100), "b": (100, 150), "c": (2, 12)}
    assert log(result) == [
        "0.000 launch a gpus=0 1 milli=1000",
        "2.000 launch c gpus=2 milli=1000",
        "100.000 launch b gpus=0 1 2 3 milli=1000",
    ]


@pytest.mark.parametrize(("backfill", "f2_span"), [(False, (110, 120)), (True, (2, 12))])
def test_fifo_shares_behind_a_blocked_whole_gpu_job(backfill: bool, f2_span: tuple[float, float]) -> None:
    # One GPU. f1 takes half of it (0-100); "whole" needs all of it and waits (100-110). f2 wants a quarter:
    # behind "whole" it waits (110-120); with backfill it shares the GPU with f1 at once (2-12).
    jobs = [
        job("f1", milli=500, duration=100, submit=0),
        job("whole", duration=10, submit=1),
        job("f2", milli=250, duration=10, submit=2),
    ]
    result = run(jobs, cluster(nodes=1, gpus=1), FifoPolicy(FifoConfig(backfill=backfill)))
    assert spans(result) == {"f1": (0, 100), "whole": (100, 110), "f2": f2_span}


# -- SJF ------------------------------------------------------------------------------------------------------
def test_sjf_runs_shortest_first_without_preempting() -> None:
    # One GPU. a starts alone at 0 and is never preempted (0-100). Then by duration, ties by arrival:
    # c (10) 100-110, e (10) 110-120, d (30) 120-150, b (50) 150-200.
    jobs = [
        job("a", duration=100, submit=0),
        job("b", duration=50, submit=1),
        job("c", duration=10, submit=2),
        job("d", duration=30, submit=3),
        job("e", duration=10, submit=4),
    ]
    result = run(jobs, cluster(nodes=1, gpus=1), make_policy("sjf"))
    assert spans(result) == {"a": (0, 100), "b": (150, 200), "c": (100, 110), "d": (120, 150), "e": (110, 120)}
    assert result.summary["preemptions"] == 0


# -- SRTF -----------------------------------------------------------------------------------------------------
def test_srtf_preempts_the_longest_it_needs_and_only_that() -> None:
    # 2 nodes x 2 GPUs, restore 5 s. Queue order is by remaining time: w (20), y (200), x (300).
    #  t=0   w -> GPU 0 (best fit: node 0), y -> GPUs 2,3 (node 1), x -> GPU 1 (the 1-GPU hole).
    #  t=10  c (2 GPUs, 50 s) arrives; nothing is free. Victims, most remaining first: x (290 left) frees only
    #        GPU 1, not enough; y (190 left) frees node 1 -> c runs on 2,3 (10-60). x's GPU was not needed:
    #        x keeps running. y has done 10 s: 190 left.
    #  t=20  w ends: GPU 0 free, y needs 2. x has 280 left > y's 190: preempt x, y restarts on 0,1:
    #        20 + 5 (restore) + 190 = 215. x has done 20 s: 280 left.
    #  t=60  c ends; x restarts on GPU 2: 60 + 5 + 280 = 345. (The stale completions of y at 200 and x at
    #        300 are ignored.)
    jobs = [
        job("w", duration=20, submit=0),
        job("x", duration=300, submit=0),
        job("y", gpus=2, duration=200, submit=0),
        job("c", gpus=2, duration=50, submit=10),
    ]
    result = run(jobs, cluster(nodes=2, gpus=2), make_policy("srtf"), perf=PerfModel(restore_s=5.0))
    assert log(result) == [
        "0.000 launch w gpus=0 milli=1000",
        "0.000 launch y gpus=2 3 milli=1000",
        "0.000 launch x gpus=1 milli=1000",
        "10.000 preempt y",
        "10.000 launch c gpus=2 3 milli=1000",
        "20.000 preempt x",
        "20.000 launch y gpus=0 1 milli=1000",
        "60.000 launch x gpus=2 milli=1000",
    ]
    assert spans(result) == {"w": (0, 20), "x": (0, 345), "y": (0, 215), "c": (10, 60)}
    preemptions = {j.job_id: j.preemptions for j in result.jobs}
    assert preemptions == {"w": 0, "x": 1, "y": 1, "c": 0}
    assert result.summary["preemptions"] == 2
    assert all(j.work_done_s == j.spec.duration_s for j in result.jobs)


def test_srtf_preempts_the_tenants_own_longer_job_for_quota() -> None:
    # One node of 4 GPUs; tenant t's quota is 2. a (t, 2 GPUs, 300 s) runs; b (u, 1 GPU, 300 s) runs; c (t, 2 GPUs,
    # 20 s) arrives at 10. One GPU is free and c needs two, and t is at its quota: preempting a frees both the
    # GPUs and the quota, so c runs at once; b (another tenant, and its GPU not needed) keeps running.
    jobs = [
        job("a", gpus=2, duration=300, tenant="t"),
        job("b", duration=300, tenant="u"),
        job("c", gpus=2, duration=20, submit=10, tenant="t"),
    ]
    c = cluster(nodes=1, gpus=4, tenants={"t": 2, "u": 2})
    lines = log(run(jobs, c, make_policy("srtf"), perf=PerfModel(restore_s=0.0)))
    assert lines[2:4] == ["10.000 preempt a", "10.000 launch c gpus=0 1 milli=1000"]
    assert not any(line.startswith("10.000 preempt b") for line in lines)


def test_srtf_picks_the_victim_with_the_most_remaining_time() -> None:
    # 3 GPUs, no restore cost. By remaining time d (50) -> GPU 0, a (100) -> GPU 1, b (200) -> GPU 2.
    # At t=5 c (10 s) arrives: remaining a 95, b 195, d 45, all > 10; b has the most: preempt b only.
    # c runs 5-15 on GPU 2; then b (195 left) restarts there: 15 + 195 = 210.
    jobs = [
        job("a", duration=100),
        job("b", duration=200),
        job("d", duration=50),
        job("c", duration=10, submit=5),
    ]
    result = run(jobs, cluster(nodes=1, gpus=3), make_policy("srtf"), perf=PerfModel(restore_s=0.0))
    assert log(result)[3:] == [
        "5.000 preempt b",
        "5.000 launch c gpus=2 milli=1000",
        "15.000 launch b gpus=2 milli=1000",
    ]
    assert spans(result) == {"a": (0, 100), "b": (0, 210), "d": (0, 50), "c": (5, 15)}


def test_srtf_preempts_as_many_as_the_gang_needs() -> None:
    # 2 GPUs: a (100) on GPU 0, b (200) on GPU 1. c needs both at t=5: b alone frees one, so a goes too.
    # c runs 5-15; then a (95 left) 15-110 and b (195 left) 15-210.
    jobs = [job("a", duration=100), job("b", duration=200), job("c", gpus=2, duration=10, submit=5)]
    result = run(jobs, cluster(nodes=1, gpus=2), make_policy("srtf"), perf=PerfModel(restore_s=0.0))
    assert log(result) == [
        "0.000 launch a gpus=0 milli=1000",
        "0.000 launch b gpus=1 milli=1000",
        "5.000 preempt b",
        "5.000 preempt a",
        "5.000 launch c gpus=0 1 milli=1000",
        "15.000 launch a gpus=0 milli=1000",
        "15.000 launch b gpus=1 milli=1000",
    ]
    assert spans(result) == {"a": (0, 110), "b": (0, 210), "c": (5, 15)}


@pytest.mark.parametrize(
    ("c_duration", "expected_log", "expected_spans"),
    [
        # At t=10 a has 30 - 10 = 20 s left and c needs 20: not strictly more, so c waits: 30-50.
        (
            20.0,
            ["0.000 launch a gpus=0 milli=1000", "30.000 launch c gpus=0 milli=1000"],
            {"a": (0, 30), "c": (30, 50)},
        ),
        # c needs 19.5 < 20: a is preempted; c runs 10-29.5; a restarts at 29.5 + 5 + 20 = 54.5.
        (
            19.5,
            [
                "0.000 launch a gpus=0 milli=1000",
                "10.000 preempt a",
                "10.000 launch c gpus=0 milli=1000",
                "29.500 launch a gpus=0 milli=1000",
            ],
            {"a": (0, 54.5), "c": (10, 29.5)},
        ),
    ],
)
def test_srtf_preempts_only_for_strictly_less_remaining(
    c_duration: float, expected_log: list[str], expected_spans: dict[str, tuple[float, float]]
) -> None:
    jobs = [job("a", duration=30, submit=0), job("c", duration=c_duration, submit=10)]
    result = run(jobs, cluster(nodes=1, gpus=1), make_policy("srtf"), perf=PerfModel(restore_s=5.0))
    assert log(result) == expected_log
    assert spans(result) == expected_spans


def test_srtf_without_preemption_is_sjf_like() -> None:
    jobs = [job("a", duration=30, submit=0), job("c", duration=1, submit=10)]
    result = run(jobs, cluster(nodes=1, gpus=1), SrtfPolicy(SrtfConfig(preempt=False)))
    assert spans(result) == {"a": (0, 30), "c": (30, 31)}


# -- strict gang ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("policy", "b_start"),
    [
        ("fifo", 100.0),
        ("fifo:backfill=true", 100.0),
        ("sjf", 100.0),
        ("srtf:preempt=false", 100.0),
        ("srtf", 1.0),  # a (99 s left) is preempted for b (10 s): b still gets all 4 GPUs at once
    ],
)
def test_strict_gang(policy: str, b_start: float) -> None:
    # 4 GPUs; a holds 1 from 0 to 100. b needs 4: three are free from t=1, but b never starts on three.
    jobs = [job("a", duration=100, submit=0), job("b", gpus=4, duration=10, submit=1)]
    result = run(jobs, cluster(nodes=1, gpus=4), make_policy(policy), perf=PerfModel(restore_s=0.0))
    b = next(j for j in result.jobs if j.job_id == "b")
    assert (b.first_start_s, b.end_s) == (b_start, b_start + 10)
    launches_b = [line for line in log(result) if " launch b " in line]
    assert launches_b == [f"{b_start:.3f} launch b gpus=0 1 2 3 milli=1000"]


# -- admission ------------------------------------------------------------------------------------------------
A4B2 = cluster(gpus=[4, 2], types=["A", "B"], mem={"A": 16384, "B": 32768}, tenants={"t": 2, "z": 0, "open": None})
ADMISSION = [
    (
        "more than the cluster",
        cluster(nodes=1, gpus=4),
        job("j", gpus=5),
        "needs 5 GPUs; the cluster has at most 4 of one type",
    ),
    ("more than one type", A4B2, job("j", gpus=5), "needs 5 GPUs; the cluster has at most 4 of one type"),
    (
        "more than its type",
        A4B2,
        job("j", gpus=3, types=["B"]),
        "needs 3 GPUs of type B; the cluster has at most 2 of one type",
    ),
    ("unknown type", A4B2, job("j", types=["H100"]), "needs GPU types H100; the cluster has A, B"),
    ("too much memory", A4B2, job("j", mem=40000), "needs GPUs with 40000 MiB; the cluster has A, B"),
    (
        "memory of its type",
        A4B2,
        job("j", types=["A"], mem=20000),
        "needs GPU types A with 20000 MiB; the cluster has A, B",
    ),
    ("over quota", A4B2, job("j", gpus=3, tenant="t"), "needs 3 guaranteed GPUs; tenant 't' has a quota of 2"),
    ("zero quota", A4B2, job("j", milli=500, tenant="z"), "needs 0.5 guaranteed GPU; tenant 'z' has a quota of 0"),
    ("fits", A4B2, job("j", gpus=4), None),
    ("fits its type", A4B2, job("j", gpus=2, types=["B"], mem=20000), None),
    ("memory picks the type", A4B2, job("j", gpus=2, mem=20000), None),
    ("exactly the quota", A4B2, job("j", gpus=2, tenant="t"), None),
    ("opportunistic over quota", A4B2, job("j", gpus=3, tenant="t", opportunistic=True), None),
    ("tenant without quota", A4B2, job("j", gpus=4, tenant="open"), None),
    ("tenant not in the cluster", A4B2, job("j", gpus=4, tenant="stranger"), None),
]


@pytest.mark.parametrize("policy", ["fifo", "sjf", "srtf"])
@pytest.mark.parametrize(("what", "c", "spec", "reason"), ADMISSION, ids=[a[0] for a in ADMISSION])
def test_admission(policy: str, what: str, c: object, spec: JobSpec, reason: str | None) -> None:
    p = make_policy(policy)
    assert p.admit(state(c), spec) == reason  # type: ignore[arg-type]


@pytest.mark.parametrize("policy", ["sjf", "srtf"])
def test_oracle_policies_reject_jobs_without_duration(policy: str) -> None:
    p = make_policy(policy)
    reason = p.admit(state(cluster(nodes=1, gpus=4)), job("j", duration=None))
    assert reason == f"{policy} needs job durations (an oracle), and this job has none"
    assert make_policy("fifo").admit(state(cluster(nodes=1, gpus=4)), job("j", duration=None)) is None


def test_sjf_rejects_a_job_without_duration_while_others_wait() -> None:
    # Live mode has no durations. The job enters the pending queue before admission rejects it, so its queue
    # key must compare with the keys of jobs already waiting (b here): it is rejected, nothing crashes.
    c = cluster(nodes=1, gpus=1)
    topo = Topology(c)
    policy = SjfPolicy()
    e = Engine(
        ClusterState(topo, queue_key=policy.queue_key), policy, SimExecutor(topo), VirtualClock(), record_decisions=True
    )
    e.feed([job("a", duration=100), job("b", duration=50, submit=1), job("nod", duration=None, submit=2)])
    e.run()
    e.state.check_invariants()
    assert e.state.job("nod").phase is JobPhase.REJECTED
    assert e.decision_log is not None
    assert [x.render() for x in e.decision_log] == [
        "0.000 launch a gpus=0 milli=1000",
        "2.000 reject nod sjf needs job durations (an oracle), and this job has none",
        "100.000 launch b gpus=0 milli=1000",
    ]


def test_rejection_end_to_end() -> None:
    # The over-quota job is rejected on arrival with its reason; the others run; the run ends.
    jobs = [job("big", gpus=3, tenant="t", duration=5), job("ok", gpus=2, tenant="t", duration=5, submit=1)]
    result = run(jobs, A4B2, make_policy("fifo"))
    big = next(j for j in result.jobs if j.job_id == "big")
    assert big.phase is JobPhase.REJECTED
    assert big.reason == "needs 3 guaranteed GPUs; tenant 't' has a quota of 2"
    assert log(result)[0] == "0.000 reject big needs 3 guaranteed GPUs; tenant 't' has a quota of 2"
    assert spans(result)["ok"] == (1, 6)
    assert result.summary["jobs_rejected"] == 1


def test_quota_makes_a_tenant_wait_not_fail() -> None:
    # Tenant t may hold 2 guaranteed GPUs. t1 (2 GPUs) runs 0-10; t2 (1 GPU) fits the cluster but not the
    # quota until t1 ends: 10-20. The opportunistic job of t runs at once beside t1 (0-10). FIFO with backfill.
    jobs = [
        job("t1", gpus=2, tenant="t", duration=10),
        job("t2", tenant="t", duration=10, submit=1),
        job("o", tenant="t", duration=10, submit=2, opportunistic=True),
    ]
    result = run(jobs, A4B2, make_policy("fifo:backfill=true"))
    assert spans(result) == {"t1": (0, 10), "t2": (10, 20), "o": (2, 12)}


# -- any trace ends, with every job finished or rejected -------------------------------------------------------
POLICIES = [
    "fifo",
    "fifo:backfill=true,placement=spread",
    "fifo:placement=first-fit",
    "fifo:backfill=true,placement=strict",
    "yarn-cs",
    "sjf",
    "sjf:backfill=false,placement=first-fit",
    "srtf",
    "srtf:placement=spread",
]
MIXED = cluster(
    gpus=[4, 2, 8, 1],
    types=["A", "A", "B", "B"],
    gpus_per_switch=[2, None, 4, None],
    racks=["r0", "r0", "r1", "r1"],
    speed={"A": 1.0, "B": 2.0},
    mem={"A": 16384, "B": 32768},
    tenants={"t": 3, "u": None},
)
trace_jobs = st.lists(
    st.tuples(
        st.integers(1, 10),  # GPUs (some never fit: B has 9, A has 6)
        st.sampled_from([1000, 1000, 250, 500]),
        st.sampled_from([(), ("A",), ("B",)]),
        st.sampled_from(["t", "u", "default"]),
        st.booleans(),
        st.integers(1, 100),  # duration
        st.integers(0, 30),  # inter-arrival
    ),
    min_size=1,
    max_size=25,
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=trace_jobs, policy=st.sampled_from(POLICIES))
def test_every_trace_ends(rows: list[tuple[int, int, tuple[str, ...], str, bool, int, int]], policy: str) -> None:
    t = 0.0
    jobs = []
    for i, (gpus, milli, types, tenant, opp, duration, gap) in enumerate(rows):
        t += gap
        jobs.append(
            job(
                f"j{i}",
                gpus=gpus if milli == 1000 else 1,
                milli=milli,
                types=types,
                tenant=tenant,
                opportunistic=opp,
                duration=duration,
                submit=t,
            )
        )
    p: BasePolicy = make_policy(policy)
    result = run(jobs, MIXED, p, perf=PerfModel(restore_s=3.0))
    admit = make_policy(policy)
    view = state(MIXED)
    for j in result.jobs:
        assert j.phase in (JobPhase.FINISHED, JobPhase.REJECTED)
        assert j.reason == admit.admit(view, j.spec)  # rejected iff it could never run, and why
        if j.phase is JobPhase.FINISHED:
            assert j.work_done_s == j.spec.duration_s
            assert j.first_start_s is not None and j.end_s is not None
            # Never faster than alone on the fastest GPU (speed 2).
            assert j.end_s - j.first_start_s >= j.spec.duration_s / 2 - 1e-9
            assert j.first_start_s >= j.spec.submit_s
    launches = sum(" launch " in line for line in log(result))
    finished = sum(j.phase is JobPhase.FINISHED for j in result.jobs)
    assert launches == finished + result.summary["preemptions"]
    if not policy.startswith("srtf"):
        assert result.summary["preemptions"] == 0


def test_same_trace_same_decisions() -> None:
    jobs = [job(f"j{i}", gpus=1 + i % 3, duration=10 + 7 * i % 23, submit=i) for i in range(30)]
    first = log(run(jobs, MIXED, make_policy("srtf:placement=spread")))
    again = log(run(jobs, MIXED, make_policy("srtf:placement=spread")))
    assert first == again


def test_placement_option_reaches_the_placement() -> None:
    # One 3-GPU job on 3 nodes of 4: consolidated keeps it on node 0, spread puts one GPU on each node.
    jobs = [job("a", gpus=3, duration=10)]
    assert log(run(jobs, cluster(nodes=3, gpus=4), make_policy("fifo")))[0] == "0.000 launch a gpus=0 1 2 milli=1000"
    spread = make_policy("fifo:placement=spread")
    assert spread.config.placement is PlacementStrategy.SPREAD  # type: ignore[attr-defined]
    assert log(run(jobs, cluster(nodes=3, gpus=4), spread))[0] == "0.000 launch a gpus=0 4 8 milli=1000"


def test_sjf_and_srtf_queue_keys() -> None:
    s = state(cluster(nodes=1, gpus=1))
    short = s.add(job("short", duration=5, submit=9), 9.0)
    long = s.add(job("long", duration=50, submit=0), 0.0)
    assert SjfPolicy().queue_key(short) < SjfPolicy().queue_key(long)
    long.work_done_s = 48.0  # 2 s left
    assert SrtfPolicy().queue_key(long) < SrtfPolicy().queue_key(short)
    assert FifoPolicy().queue_key(long) < FifoPolicy().queue_key(short)


# -- work conservation after preemption, strict backfilling (issue 15 §4) --------------------------------------
def test_srtf_fills_what_a_preemption_left_free() -> None:
    # 4 GPUs held by l (1,000 s). At 10, s (3 GPUs, 100 s) preempts l; w (1 GPU, 5,000 s: more than l has left,
    # so it preempts nobody) takes the GPU that s left free, in the same round. (It waited to 1,100 before.)
    jobs = [
        job("l", gpus=4, duration=1000, submit=0),
        job("s", gpus=3, duration=100, submit=10),
        job("w", gpus=1, duration=5000, submit=10),
    ]
    result = run(jobs, cluster(nodes=1, gpus=4), make_policy("srtf"), perf=PerfModel(restore_s=0.0))
    assert log(result)[1:4] == [
        "10.000 preempt l",
        "10.000 launch s gpus=0 1 2 milli=1000",
        "10.000 launch w gpus=3 milli=1000",
    ]


def test_strict_backfilling_lets_a_larger_job_that_needs_more_nodes_start() -> None:
    # 2x8 with 7 GPUs free on each node. Strict consolidation: an 8-GPU job must have a whole node and waits;
    # a 9-GPU job behind it needs two nodes anyway, has them, and starts (it was blocked as "larger" before).
    c = cluster(nodes=2, gpus=8)
    s = state(c)
    occupy(s, [0, 8])
    for spec in (job("eight", gpus=8, submit=0), job("nine", gpus=9, submit=1), job("ten", gpus=15, submit=2)):
        s.add(spec, 5.0)
    rnd = Round(s, 5.0)
    fill(rnd, PlacementStrategy.STRICT, backfill=True)
    assert [a.job_id for a in rnd.actions] == ["nine"]
