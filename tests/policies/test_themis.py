"""Themis (finish-time fairness, leases, the auction per lease round), rule by rule, with every time and every
rho worked out by hand; then golden metrics on the Tiresias 60-job trace and replays of random traces.

Unless a case says otherwise: one rack, one GPU type of speed 1.0, consolidated placement and no restore cost
(``restore_s=0``), so a job runs at rate 1.0. The policy's estimate for an active job at time t is
``rho = E / T_id`` with ``E = t - submit + remaining`` and ``T_id = work * max(1, GPUs * N / G)``, where N counts
the active (pending or running) jobs and G the cluster's GPUs.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from builders import cluster, job, log, run, spans, state
from corral.core.decisions import Launch, Preempt
from corral.core.errors import ConfigError
from corral.core.job import JobPhase
from corral.core.placement import Placement
from corral.policies.registry import make_policy
from corral.policies.themis import _COLUMNS, _SEQ, _TENANT, ThemisPolicy, _Estimates
from corral.sim.clusters import load_cluster
from corral.sim.perf import PerfModel
from corral.sim.runner import simulate
from corral.sim.traces import read_tiresias
from corral.workloads.data import data_file
from golden import SIXTY_METRICS, clusters_of

FREE = PerfModel(restore_s=0.0)


def themis(**options: object) -> ThemisPolicy:
    spec = "themis:" + ",".join(f"{k}={v}" for k, v in options.items())
    policy = make_policy(spec)
    assert isinstance(policy, ThemisPolicy)
    return policy


# -- a lease round: who bids, who wins ---------------------------------------------------------------------
def test_a_lease_goes_to_the_worst_rho_tenant() -> None:
    # Two GPUs, leases of 100 s, only the worst contender bids (f=1). c2 (tenant C) and a (tenant A) run from 0;
    # c1 (C) and b (B) wait from t=1. At the lease round t=100 all four contend; N=4 on G=2, so T_id = 2 x work:
    #   a, c2: running, E = 0 + 10000          -> rho 10000 / 20000 = 0.5
    #   c1: E = 99 + 120 = 219, T_id = 240       -> rho 0.9125  (the worst job)
    #   b:  E = 99 + 160 = 259, T_id = 320       -> rho 0.809375
    # Tenants by the mean rho of their active jobs: B 0.809 > C (0.9125 + 0.5) / 2 = 0.706 > A 0.5. So B's job
    # bids, not c1: the worst tenant, not the worst job, gets the lease. The offer is both GPUs (both leases
    # ended); b takes the GPU of the best-off contender, a (the last in rank: tenant A).
    jobs = [
        job("c2", duration=10000, tenant="C"),
        job("a", duration=10000, tenant="A"),
        job("c1", duration=120, submit=1, tenant="C"),
        job("b", duration=160, submit=1, tenant="B"),
    ]
    result = run(jobs, cluster(nodes=1, gpus=2), themis(lease_s=100, fairness_knob=1), perf=FREE)
    assert log(result)[:4] == [
        "0.000 launch c2 gpus=0 milli=1000",
        "0.000 launch a gpus=1 milli=1000",
        "100.000 preempt a",
        "100.000 launch b gpus=1 milli=1000",
    ]


@pytest.mark.parametrize(
    ("options", "winner"),
    [
        # Only the worst (1 - f) fraction bids; with f=1 that is the single worst job, y.
        ({"fairness_knob": 1}, "y"),
        # f=0: everyone bids and the auction picks the largest improvement per GPU, (E + lease) / E:
        # x (E = 101): 201/101 beats y (E = 300): 400/300 and a (E = 10000).
        ({"fairness_knob": 0}, "x"),
        # Everyone bids, but allocation=rho serves the bidders worst first: y again.
        ({"fairness_knob": 0, "allocation": "rho"}, "y"),
    ],
)
def test_the_fairness_knob_trades_fairness_for_efficiency(options: dict[str, object], winner: str) -> None:
    # One GPU, leases of 100 s. a runs from 0; y (200 s) waits from 0 and x (100 s) from 99. At t=100, N=3, G=1:
    #   a: E = 10000, T_id = 30000 -> rho 0.333;  y: E = 100 + 200 = 300, T_id = 600 -> rho 0.5 (the worst);
    #   x: E = 1 + 100 = 101, T_id = 300 -> rho 0.337.
    # The winner takes a's GPU (a's lease ended; it is the best-off contender).
    jobs = [job("a", duration=10000), job("y", duration=200), job("x", duration=100, submit=99)]
    result = run(jobs, cluster(nodes=1, gpus=1), themis(lease_s=100, **options), perf=FREE)
    assert log(result)[:3] == [
        "0.000 launch a gpus=0 milli=1000",
        "100.000 preempt a",
        f"100.000 launch {winner} gpus=0 milli=1000",
    ]


def test_lease_rounds_time_share_the_worst_first() -> None:
    # Continuing the f=1 case to the end. t=100: y wins (above). t=200: y's lease ends (granted at 100); N=3:
    #   y: running, E = 100 + 200 = 300 (it started at 100 after waiting 100) -> rho 300/600 = 0.5
    #   x: E = 101 + 100 = 201, T_id = 300 -> rho 0.67 (now the worst) -> x takes y's GPU, runs 200-300.
    # t=300, x ends; between lease rounds the free GPU goes to the worse waiting job: y (E = 300 + 100 = 400,
    # T_id = 400: rho 1.0) over a (E = 300 + 9900, T_id = 20000: 0.51); y ends at 400, then a runs to 10300.
    jobs = [job("a", duration=10000), job("y", duration=200), job("x", duration=100, submit=99)]
    result = run(jobs, cluster(nodes=1, gpus=1), themis(lease_s=100, fairness_knob=1), perf=FREE)
    assert log(result) == [
        "0.000 launch a gpus=0 milli=1000",
        "100.000 preempt a",
        "100.000 launch y gpus=0 milli=1000",
        "200.000 preempt y",
        "200.000 launch x gpus=0 milli=1000",
        "300.000 launch y gpus=0 milli=1000",
        "400.000 launch a gpus=0 milli=1000",
    ]
    assert spans(result) == {"a": (0, 10300), "y": (100, 400), "x": (200, 300)}
    assert result.summary["preemptions"] == 2


def test_the_worst_job_renews_its_lease_where_it_is() -> None:
    # One GPU, leases of 100 s, f=1. z runs 0-50; a (240 s, submitted 0) waits and runs from 50; its lease ends
    # at the first round at least 100 s later: t=200. b (1000 s) waits from 60. At t=200, N=2, G=1:
    #   a: running, E = 50 + 240 = 290, T_id = 480 -> rho 0.604 (the worst)
    #   b: E = 140 + 1000 = 1140, T_id = 2000 -> rho 0.57
    # a bids alone and renews: no preemption, no move. It ends at 290, and b starts then.
    jobs = [job("z", duration=50), job("a", duration=240), job("b", duration=1000, submit=60)]
    result = run(jobs, cluster(nodes=1, gpus=1), themis(lease_s=100, fairness_knob=1), perf=FREE)
    assert log(result) == [
        "0.000 launch z gpus=0 milli=1000",
        "50.000 launch a gpus=0 milli=1000",
        "290.000 launch b gpus=0 milli=1000",
    ]
    assert result.summary["preemptions"] == 0


def test_leases_end_on_the_round_clock() -> None:
    # Leases of 100 s: rounds at 100, 200, ... a starts at 30, so its lease ends at the first round at or after
    # 130, t=200 (not 100, not 130). b (10 s) waits from 40 and takes a's GPU at 200, not before.
    jobs = [job("a", duration=1000, submit=30), job("b", duration=10, submit=40)]
    result = run(jobs, cluster(nodes=1, gpus=1), themis(lease_s=100, fairness_knob=1), perf=FREE)
    assert log(result) == [
        "30.000 launch a gpus=0 milli=1000",
        "200.000 preempt a",
        "200.000 launch b gpus=0 milli=1000",
        "210.000 launch a gpus=0 milli=1000",
    ]


def test_a_job_that_cannot_fit_even_with_every_ended_lease_preempts_nobody() -> None:
    # One node of 2 GPUs, leases of 100 s, f=1. a runs from 0 (GPU 0), c from 150 (GPU 1); w (2 GPUs, 10 s)
    # waits from 160 and is the worst (E = 40 + 10 = 50, T_id = 10 x 2 x 3/2 = 30: rho 1.67). At t=200 only
    # a's lease has ended: one GPU is not enough, so a keeps it. At t=300 c's lease has ended too: w preempts
    # both, the best-off first (a and c tie at rho 0.667; c came later, so it ranks last and goes first).
    jobs = [job("a", duration=10000), job("c", duration=10000, submit=150), job("w", gpus=2, duration=10, submit=160)]
    result = run(jobs, cluster(nodes=1, gpus=2), themis(lease_s=100, fairness_knob=1), perf=FREE)
    assert log(result)[:6] == [
        "0.000 launch a gpus=0 milli=1000",
        "150.000 launch c gpus=1 milli=1000",
        "300.000 preempt c",
        "300.000 preempt a",
        "300.000 launch w gpus=0 1 milli=1000",
        "310.000 launch a gpus=0 milli=1000",
    ]


def test_a_running_job_whose_gpus_are_not_needed_is_not_preempted() -> None:
    # GPU 0 is type A (node 0); GPUs 1 and 2 are type B (node 1). b (type B) runs on GPU 1, a (type A) on GPU 0;
    # w wants 2 GPUs of type B and waits from 1. At t=100 (N=3, G=3) a and b have rho 1.0 (they tie; b came
    # first, so a ranks last) and w 149 / 100 = 1.49 bids alone. Releasing a, the last, frees no B GPU; releasing
    # b then makes room: w takes GPUs 1 and 2, and a, freed for nothing, keeps running.
    jobs = [
        job("b", duration=300, types=["B"]),
        job("a", duration=10000, types=["A"]),
        job("w", gpus=2, duration=50, submit=1, types=["B"]),
    ]
    c = cluster(gpus=[1, 2], types=["A", "B"])
    result = run(jobs, c, themis(lease_s=100, fairness_knob=1), perf=FREE)
    assert log(result)[:4] == [
        "0.000 launch b gpus=1 milli=1000",
        "0.000 launch a gpus=0 milli=1000",
        "100.000 preempt b",
        "100.000 launch w gpus=1 2 milli=1000",
    ]
    assert {j.job_id: j.preemptions for j in result.jobs} == {"a": 0, "b": 1, "w": 0}


# -- between lease rounds ----------------------------------------------------------------------------------
def test_a_freed_gpu_goes_to_the_worst_waiting_job() -> None:
    # One GPU, default leases (600 s). a runs 0-50; b (1000 s) waits from 1, c (10 s) from 2. At t=50, N=3:
    #   b: E = 49 + 1000, T_id = 3000 -> rho 0.35;  c: E = 48 + 10, T_id = 30 -> rho 1.93.
    # c goes first (FIFO would take b), then b. No lease round is needed: nobody waits once b runs.
    jobs = [job("a", duration=50), job("b", duration=1000, submit=1), job("c", duration=10, submit=2)]
    result = run(jobs, cluster(nodes=1, gpus=1), themis(), perf=FREE)
    assert log(result) == [
        "0.000 launch a gpus=0 milli=1000",
        "50.000 launch c gpus=0 milli=1000",
        "60.000 launch b gpus=0 milli=1000",
    ]


def test_an_uncontended_cluster_runs_every_job_at_once() -> None:
    trace = read_tiresias(data_file("tiresias", "60_job.csv"))
    result = simulate(trace, load_cluster("n32g4"), make_policy("themis"), check_invariants=True)
    for j in result.jobs:
        assert j.first_start_s == j.spec.submit_s
        assert j.jct_s == pytest.approx(j.spec.duration_s)
    assert result.summary["max_rho"] == 1.0


# -- live mode: no durations ---------------------------------------------------------------------------------
def test_without_durations_a_job_is_expected_to_run_as_long_again() -> None:
    # Live mode: no job has a duration. One GPU, leases of 100 s, f=1. a runs from 0; b waits from 50. At the
    # lease round t=100, N=2, G=1; remaining = max(time on GPUs, lease):
    #   a: ran 100 -> remaining 100, work 200, T_id 400; E = 100 + 100 = 200 -> rho 0.5
    #   b: ran 0 -> remaining 100, work 100, T_id 200; E = 50 + 100 = 150 -> rho 0.75 (the worst)
    # so b takes a's GPU.
    c = cluster(nodes=1, gpus=1)
    s = state(c)
    policy = themis(lease_s=100, fairness_knob=1)
    a, b = job("a", duration=None), job("b", duration=None, submit=50)
    assert policy.admit(s, a) is None  # no duration is no reason to refuse a job
    policy.on_job_changed(s.add(a, 0.0), None, 0.0)
    policy.on_job_changed(s.launch("a", Placement((0,), 1000), 0.0), None, 0.0)
    policy.on_job_changed(s.add(b, 50.0), None, 50.0)
    decision = policy.schedule(s, 50.0)
    assert decision.actions == () and decision.wake_at_s == 100.0
    decision = policy.schedule(s, 100.0)
    assert decision.actions == (
        Preempt("a", "themis: lease ended; b won it"),
        Launch("b", Placement((0,), 1000)),
    )


@settings(max_examples=60, deadline=None)
@given(
    rhos=st.lists(st.sampled_from([0.5, 1.0, 1.0, 2.0, 3.5, 7.0]), min_size=1, max_size=400),
    tenants=st.integers(1, 4),
    seed=st.integers(0, 1000),
)
def test_the_lazy_rank_order_is_the_full_sort(rhos: list[float], tenants: int, seed: int) -> None:
    # Between lease rounds the policy sorts only the head of the queue first (with the ties at its boundary);
    # walking on must give exactly the full order, by tenant, then rho (worst first), then arrival.
    rng = np.random.default_rng(seed)
    policy = themis()
    for t in range(tenants):
        policy._tenant_ids[f"t{t}"] = t
    n = len(rhos)
    rows = np.zeros((n, _COLUMNS))
    rows[:, _TENANT] = rng.integers(0, tenants, n)
    rows[:, _SEQ] = rng.permutation(n)
    est = _Estimates(np.array(rhos), np.ones(n), np.zeros(n, dtype=bool))
    which = rng.permutation(n)
    positions = policy._tenant_positions(est, rows)
    assert (
        list(policy._in_rank_order(est, rows, which, positions)) == policy._sort(est, rows, which, positions).tolist()
    )


# -- options -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("themis:lease_s=0", "lease_s must be a positive number"),
        ("themis:fairness_knob=1.5", "fairness_knob must be in [0, 1]"),
        ("themis:allocation=random", "expected welfare|rho"),
    ],
)
def test_bad_options_are_config_errors(spec: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("|", r"\|")):
        make_policy(spec)


@pytest.mark.parametrize(
    ("placement", "w_launch"),
    [("consolidated", "1.000 launch w gpus=1 3 milli=1000"), ("strict", "50.000 launch w gpus=2 3 milli=1000")],
)
def test_placement_preference(placement: str, w_launch: str) -> None:
    # Two nodes of 2 GPUs. x (GPU 0) runs to 100, y (GPU 1) to 1, z (GPU 2) to 50. When w (2 GPUs) arrives at 1,
    # the free GPUs 1 and 3 are on different nodes: consolidated (the fewest nodes among what is free) takes them
    # at once; strict waits for a whole node, node 1, at 50.
    jobs = [
        job("x", duration=100),
        job("y", duration=1),
        job("z", duration=50),
        job("w", gpus=2, duration=10, submit=1),
    ]
    result = run(jobs, cluster(nodes=2, gpus=2), themis(placement=placement), perf=FREE)
    assert [line for line in log(result) if " launch w " in line] == [w_launch]


# -- golden metrics on the Tiresias 60-job trace (golden.SIXTY_METRICS) -------------------------------------------
@pytest.mark.parametrize("cluster_name", clusters_of("themis"))
def test_golden_metrics(cluster_name: str) -> None:
    trace = read_tiresias(data_file("tiresias", "60_job.csv"))
    result = simulate(trace, load_cluster(cluster_name), make_policy("themis"), check_invariants=True)
    assert result.summary["jobs_finished"] == 60
    for key, value in SIXTY_METRICS[("themis", cluster_name)].items():
        assert result.summary[key] == pytest.approx(value, abs=1e-3), key


def test_themis_has_the_lowest_max_rho_on_a_small_cluster() -> None:
    # On 2x4: themis 2.05, srtf 2.18, sjf 2.90, fifo 17.55 (the trace has one tenant: Jain's index is 1 for all).
    trace = read_tiresias(data_file("tiresias", "60_job.csv"))
    worst = {
        p: simulate(trace, load_cluster("2x4"), make_policy(p)).summary["max_rho"] for p in ("fifo", "sjf", "srtf")
    }
    themis_max = simulate(trace, load_cluster("2x4"), make_policy("themis")).summary["max_rho"]
    assert all(themis_max < value for value in worst.values()), (themis_max, worst)


# -- any trace ends, with every job finished or rejected -------------------------------------------------------
POLICIES = [
    "themis",
    "themis:lease_s=7,fairness_knob=0",
    "themis:lease_s=5,fairness_knob=1,allocation=rho",
    "themis:lease_s=11,placement=spread",
    "themis:lease_s=13,placement=strict,fairness_knob=0.5",
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
        st.integers(0, 100),  # duration (0 included: a job with no work)
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
    result = run(jobs, MIXED, make_policy(policy), perf=PerfModel(restore_s=3.0))
    admit = make_policy(policy)
    view = state(MIXED)
    for j in result.jobs:
        assert j.phase in (JobPhase.FINISHED, JobPhase.REJECTED)
        assert j.reason == admit.admit(view, j.spec)  # rejected iff it could never run, and why
        if j.phase is JobPhase.FINISHED:
            assert j.work_done_s == j.spec.duration_s
            assert j.first_start_s is not None and j.end_s is not None
            assert j.first_start_s >= j.spec.submit_s
    launches = sum(" launch " in line for line in log(result))
    finished = sum(j.phase is JobPhase.FINISHED for j in result.jobs)
    assert launches == finished + result.summary["preemptions"]


def test_same_trace_same_decisions() -> None:
    jobs = [job(f"j{i}", gpus=1 + i % 3, duration=50 + 37 * i % 230, submit=i, tenant="tu"[i % 2]) for i in range(40)]
    first = log(run(jobs, MIXED, make_policy("themis:lease_s=5,fairness_knob=0.5")))
    again = log(run(jobs, MIXED, make_policy("themis:lease_s=5,fairness_knob=0.5")))
    assert first == again
    assert any(" preempt " in line for line in first)
