"""HiveD end to end, through the real engine and simulator (``builders.run`` re-checks every engine invariant after
every round; :class:`Checked` also re-checks the policy's own picture of the cells and that it matches what the
engine runs): the sharing anomaly and its removal, sharing safety against the VC's private cluster (hand-built and
random request sequences), preemption of borrowers only, where borrowers and bindings go, admission, options.

Unless a case says otherwise: nodes of 8 GPUs on two PCIe switches of 4, one rack, speed 1.0, so a job runs
``duration`` seconds from its start, and a preempted one pays ``restore_s`` (30 s) when it starts again.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from builders import cluster, job, log, run, spans, state
from corral.core.cluster import Cluster
from corral.core.decisions import Decision
from corral.core.errors import ConfigError, InvariantViolation
from corral.core.job import JobPhase, JobSpec
from corral.core.placement import Placement
from corral.policies.framework.contract import PolicyConfig
from corral.policies.framework.view import ClusterView
from corral.policies.hived.policy import HivedConfig, HivedPolicy
from corral.policies.registry import make_policy, policy_names
from corral.sim.runner import SimulationResult


class Checked(HivedPolicy):
    """HivedPolicy that, at every round, checks that the GPUs it has each running job hold are the engine's
    placements, and after deciding, that its cells are consistent (``HivedPolicy.check``, from scratch)."""

    def __init__(self, config: PolicyConfig | None = None, *, seed: int = 0) -> None:
        super().__init__(config, seed=seed)
        self.rounds = 0

    def schedule(self, view: ClusterView, now_s: float) -> Decision:
        if self.tree is not None:
            engine = {j.spec.job_id: tuple(sorted(j.placement.gpus)) for j in view.running() if j.placement}
            held: dict[str, tuple[int, ...]] = {}
            for g, job_id in enumerate(self._gpu_job):
                if job_id is not None:
                    held[job_id] = (*held.get(job_id, ()), g)
            assert engine == held and held.keys() == self._runs.keys()
        decision = super().schedule(view, now_s)
        self.check()
        self.rounds += 1
        return decision


def hived(**options: object) -> Checked:
    return Checked(HivedConfig(**options))  # type: ignore[arg-type]


def eight(nodes: int, **kw: object) -> Cluster:
    return cluster(nodes=nodes, gpus=8, gpus_per_switch=4, **kw)  # type: ignore[arg-type]


def replay(jobs: Sequence[JobSpec], c: Cluster, policy: Checked) -> SimulationResult:
    result = run(jobs, c, policy)
    policy.check()
    assert all(j.phase in (JobPhase.FINISHED, JobPhase.REJECTED) for j in result.jobs)
    return result


# -- the sharing anomaly ----------------------------------------------------------------------------------------
def anomaly_jobs() -> list[JobSpec]:
    return [
        job("a1", gpus=7, duration=100, submit=0, tenant="A"),
        job("b1", gpus=1, duration=1000, submit=0, tenant="B"),
        job("b2", gpus=1, duration=1000, submit=1, tenant="B"),
        job("a2", gpus=8, duration=50, submit=101, tenant="A"),
    ]


def test_quota_only_makes_a_tenant_wait_for_a_whole_node_its_private_cluster_would_have() -> None:
    # Two nodes; A and B have 8 GPUs of quota each. a1 (7 GPUs) takes node 0, b1 its last GPU (best fit), b2
    # goes to node 1. When a1 ends, A's quota is free and 14 GPUs are idle, but no node is whole: a2 (8 GPUs in
    # one node) waits for B's jobs (1000-1050). HiveD keeps B's jobs in B's node cell: a2 starts at once.
    c = eight(2, tenants={"A": 8, "B": 8})
    quota_only = replay(anomaly_jobs(), c, hived(cells=False))
    assert spans(quota_only)["a2"] == (1000, 1050)
    assert log(quota_only)[:3] == [
        "0.000 launch a1 gpus=0 1 2 3 4 5 6 milli=1000",
        "0.000 launch b1 gpus=7 milli=1000",
        "1.000 launch b2 gpus=8 milli=1000",
    ]
    cells = replay(anomaly_jobs(), c, hived())
    assert spans(cells) == {"a1": (0, 100), "b1": (0, 1000), "b2": (1, 1001), "a2": (101, 151)}
    assert log(cells) == [
        "0.000 launch a1 gpus=0 1 2 3 4 5 6 milli=1000",
        "0.000 launch b1 gpus=8 milli=1000",
        "1.000 launch b2 gpus=9 milli=1000",
        "101.000 launch a2 gpus=0 1 2 3 4 5 6 7 milli=1000",
    ]


# -- sharing safety: a VC behaves exactly as its private cluster ------------------------------------------------
SHARED_CELLS = "A=2xnode+1xswitch;B=1xnode+1xswitch;C=1xnode"  # 20 + 12 + 8 of the 40 GPUs of eight(5)


def background(rng: random.Random, count: int) -> list[JobSpec]:
    """Other tenants' jobs and borrowers (opportunistic jobs, and jobs of a tenant without cells)."""
    out = []
    for i in range(count):
        kind = rng.choice(["B", "C", "opp", "nocells"])
        tenant = {"opp": "A", "nocells": "D"}.get(kind, kind)
        size = rng.choice([1, 1, 2, 3, 4, 8] if kind in ("B", "C") else [1, 2, 4, 8, 12, 16])
        out.append(
            job(
                f"{kind}{i}",
                gpus=size,
                duration=rng.randint(5, 400),
                submit=rng.randint(0, 600),
                tenant=tenant,
                opportunistic=kind == "opp",
            )
        )
    return out


def a_spans(jobs: list[JobSpec], others: list[JobSpec]) -> tuple[dict[str, object], dict[str, object]]:
    """A's job spans in the shared cluster (with ``others``) and in A's private cluster (A's cells alone)."""
    shared = replay(sorted(jobs + others, key=lambda j: j.submit_s), eight(5), hived(vc_cells=SHARED_CELLS))
    private = replay(jobs, eight(3), hived(vc_cells="A=2xnode+1xswitch"))
    mine = {j.job_id for j in jobs}
    return {k: v for k, v in spans(shared).items() if k in mine}, spans(private)


def test_a_hand_built_sequence_runs_in_the_shared_cluster_exactly_as_in_the_private_one() -> None:
    # A owns two node cells and a switch cell. Its requests: a 4-GPU job (a switch), an 8 (a node), a 12 (a node
    # and a switch), 1-GPU jobs that pack, a 16 that must wait for two whole nodes; meanwhile B, C and borrowers
    # load the rest of the cluster, and borrowers sit on idle GPUs that A then claims.
    mine = [
        job("a-4", gpus=4, duration=300, submit=0, tenant="A"),
        job("a-8", gpus=8, duration=200, submit=10, tenant="A"),
        job("a-1x", gpus=1, duration=500, submit=20, tenant="A"),
        job("a-1y", gpus=1, duration=50, submit=21, tenant="A"),
        job("a-12", gpus=12, duration=100, submit=30, tenant="A"),
        job("a-3", gpus=3, duration=100, submit=40, tenant="A"),
        job("a-16", gpus=16, duration=100, submit=50, tenant="A"),
        job("a-2", gpus=2, duration=20, submit=700, tenant="A"),
    ]
    others = [
        job("d-16", gpus=16, duration=2000, submit=0, tenant="D"),  # a borrower on two idle nodes
        job("opp-8", gpus=8, duration=2000, submit=0, tenant="B", opportunistic=True),
        job("b-1", gpus=1, duration=900, submit=1, tenant="B"),
        job("b-4", gpus=4, duration=900, submit=2, tenant="B"),
        job("c-8", gpus=8, duration=100, submit=3, tenant="C"),
        job("d-4", gpus=4, duration=2000, submit=200, tenant="D"),
    ]
    shared, private = a_spans(mine, others)
    assert shared == private
    # Worked by hand: a-4 binds the switch cell (0-300), a-8 a node (10-210), a-1x the other node (20-520) and
    # a-1y packs beside it (21-71); a-12 needs a whole node and finds none until a-8 leaves (210-310, its rest in
    # that node's free switch); a-3 fits a free switch at once (40-140); a-16 needs both nodes whole: 520.
    assert private == {
        "a-4": (0, 300),
        "a-8": (10, 210),
        "a-1x": (20, 520),
        "a-1y": (21, 71),
        "a-12": (210, 310),
        "a-3": (40, 140),
        "a-16": (520, 620),
        "a-2": (700, 720),
    }


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), mine=st.integers(1, 14), others=st.integers(0, 25))
def test_any_sequence_that_fits_the_private_cluster_fits_the_vc_at_the_same_moment(
    seed: int, mine: int, others: int
) -> None:
    """Sharing safety (HiveD §3.3), end to end: random request sequences of VC A next to random work of other
    VCs and of borrowers; every job of A starts (and ends) at the same instant as in A's private cluster."""
    rng = random.Random(seed)
    jobs = [
        job(
            f"a{i}",
            gpus=rng.choice([1, 1, 2, 3, 4, 5, 8, 12, 16, 20]),
            duration=rng.randint(5, 300),
            submit=rng.randint(0, 500),
            tenant="A",
        )
        for i in range(mine)
    ]
    jobs.sort(key=lambda j: j.submit_s)
    shared, private = a_spans(jobs, background(rng, others))
    assert shared == private


# -- low-priority jobs ------------------------------------------------------------------------------------------
def test_only_borrowers_are_preempted_when_a_vc_claims_its_cells() -> None:
    # Two nodes, A owns one node cell. A borrower (tenant D, no cells) takes 12 GPUs at 0: node 0 and a switch of
    # node 1. A's 8-GPU job at 10 binds a node: both hold some of the borrower, so the one with fewer borrowed
    # GPUs (node 1, 4 of them) is split off the rack; the borrower is preempted, a starts at once. The borrower
    # needs 12 GPUs and 8 are idle: it restarts when a ends (60), with 90 s of work left and a 30 s restore.
    c = eight(2, tenants={"A": 8})
    jobs = [job("d", gpus=12, duration=100, submit=0, tenant="D"), job("a", gpus=8, duration=50, submit=10, tenant="A")]
    result = replay(jobs, c, hived())
    assert log(result) == [
        "0.000 launch d gpus=0 1 2 3 4 5 6 7 8 9 10 11 milli=1000",
        "10.000 preempt d",
        "10.000 launch a gpus=8 9 10 11 12 13 14 15 milli=1000",
        "60.000 launch d gpus=0 1 2 3 4 5 6 7 8 9 10 11 milli=1000",
    ]
    assert spans(result) == {"d": (0, 180), "a": (10, 60)}


def test_binding_prefers_a_cell_without_borrowers() -> None:
    # A borrower of 4 GPUs takes switch 0 of node 0 (GPUs bound to no VC, best fit); A's node cell is then bound
    # to node 1, the free node with no borrower: no preemption.
    c = eight(2, tenants={"A": 8})
    jobs = [job("d", gpus=4, duration=100, submit=0, tenant="D"), job("a", gpus=8, duration=50, submit=10, tenant="A")]
    result = replay(jobs, c, hived())
    assert log(result) == [
        "0.000 launch d gpus=0 1 2 3 milli=1000",
        "10.000 launch a gpus=8 9 10 11 12 13 14 15 milli=1000",
    ]


def test_borrowers_avoid_idle_gpus_of_bound_cells_while_unbound_ones_fit() -> None:
    # A's 1-GPU job binds a node cell (node 0); its 7 idle GPUs stay A's. A 4-GPU borrower goes to node 1 (bound
    # to no VC), not next to A's job where A's next job would land. With borrow_bound=false a borrower that fits
    # only in bound cells waits.
    c = eight(2, tenants={"A": 16})
    jobs = [
        job("a1", gpus=1, duration=100, submit=0, tenant="A"),
        job("d1", gpus=4, duration=100, submit=1, tenant="D"),
        job("d2", gpus=8, duration=100, submit=2, tenant="D"),
    ]
    result = replay(jobs, c, hived(vc_cells="A=1xnode"))
    assert log(result)[:3] == [
        "0.000 launch a1 gpus=0 milli=1000",
        "1.000 launch d1 gpus=8 9 10 11 milli=1000",
        "100.000 launch d2 gpus=0 1 2 3 4 5 6 7 milli=1000",
    ]
    jobs = [
        job("a1", gpus=1, duration=100, submit=0, tenant="A"),
        job("d1", gpus=4, duration=50, submit=1, tenant="D"),
        job("d2", gpus=4, duration=50, submit=2, tenant="D"),
        job("d3", gpus=2, duration=50, submit=3, tenant="D"),
    ]
    lent = spans(replay(jobs, eight(2), hived(vc_cells="A=1xnode")))
    kept = spans(replay(jobs, eight(2), hived(vc_cells="A=1xnode", borrow_bound=False)))
    assert lent["d3"] == (3, 53) and kept["d3"] == (51, 101)


@st.composite
def workloads(draw: st.DrawFn) -> list[JobSpec]:
    jobs = []
    for i in range(draw(st.integers(1, 30))):
        tenant = draw(st.sampled_from(["A", "B", "D"]))
        jobs.append(
            job(
                f"j{i}",
                gpus=draw(st.sampled_from([1, 2, 3, 4, 8, 12, 16])),
                duration=draw(st.integers(1, 300)),
                submit=draw(st.integers(0, 400)),
                tenant=tenant,
                opportunistic=draw(st.booleans()) if tenant != "D" else False,
            )
        )
    return sorted(jobs, key=lambda j: j.submit_s)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(jobs=workloads(), cells=st.booleans(), borrow=st.booleans(), backfill=st.booleans())
def test_random_replays_keep_every_invariant_and_preempt_only_borrowers(
    jobs: list[JobSpec], cells: bool, borrow: bool, backfill: bool
) -> None:
    """Random mixes of VC jobs, opportunistic jobs and jobs of a tenant without cells, under HiveD and quota-only:
    every engine invariant holds after every round, the policy's cells stay consistent, every job finishes or is
    rejected with a reason, and every preempted job is a borrower (never a guaranteed job of a VC)."""
    c = cluster(
        gpus=[8, 8, 8, 2, 2],
        types=["V", "V", "V", "K", "K"],
        gpus_per_switch=[4, 4, 4, None, None],
        tenants={"A": 14, "B": 12},
    )
    result = replay(jobs, c, hived(cells=cells, borrow_bound=borrow, backfill=backfill))
    high = {j.job_id for j in jobs if j.tenant in ("A", "B") and j.job_class.value == "guaranteed"}
    preempted = {line.split()[2] for line in log(result) if line.split()[1] == "preempt"}
    assert not preempted & high
    for j in result.jobs:
        assert j.phase is JobPhase.FINISHED or (j.phase is JobPhase.REJECTED and j.reason)


# -- quota-only ---------------------------------------------------------------------------------------------------
def test_quota_only_counts_gpus_per_chain_as_the_cells_would() -> None:
    # Two chains (an 8-GPU V node, four 2-GPU K nodes), A's quota 8 of the 16 GPUs: its derived cells are half of
    # each chain (a V switch, two K nodes). Quota-only lets A hold that many GPUs per chain, anywhere in it: the
    # fifth 1-GPU V job waits although A holds only 4 of its 8.
    c = cluster(
        gpus=[8, 2, 2, 2, 2],
        types=["V", "K", "K", "K", "K"],
        gpus_per_switch=[4, None, None, None, None],
        tenants={"A": 8},
    )
    policy = hived(cells=False)
    jobs = [job(f"a{i}", gpus=1, duration=100, submit=0, tenant="A", types=("V",)) for i in range(5)]
    result = replay(jobs, c, policy)
    assert policy.vc_cells() == {"A": "1 switch of V/8, 2 node of K/2"}
    assert sorted(s[0] for s in spans(result).values()) == [0, 0, 0, 0, 100]


def test_without_backfill_each_vcs_queue_stops_at_its_first_job_that_does_not_fit() -> None:
    # A owns one node: a1 (4 GPUs, 0-100) runs; a2 needs 8 and waits for a1; a3 (1 GPU) fits beside a1, but with
    # backfill=false A's queue stops at a2 (YARN-CS queues). B's queue is its own: b1 starts at once either way.
    c = eight(2, tenants={"A": 8, "B": 8})
    jobs = [
        job("a1", gpus=4, duration=100, submit=0, tenant="A"),
        job("a2", gpus=8, duration=10, submit=1, tenant="A"),
        job("a3", gpus=1, duration=10, submit=2, tenant="A"),
        job("b1", gpus=2, duration=10, submit=3, tenant="B"),
    ]
    for cells in (True, False):
        assert spans(replay(jobs, c, hived(cells=cells))) == {
            "a1": (0, 100),
            "a2": (100, 110),
            "a3": (2, 12),
            "b1": (3, 13),
        }
        assert spans(replay(jobs, c, hived(cells=cells, backfill=False))) == {
            "a1": (0, 100),
            "a2": (100, 110),
            "a3": (110, 120),
            "b1": (3, 13),
        }


# -- admission, options, live mode ----------------------------------------------------------------------------------
def test_jobs_that_can_never_fit_are_rejected_with_a_reason() -> None:
    # A's cells are three switches (12 GPUs): no cell holds 8 GPUs in one node, although 12 is within its quota.
    c = eight(3, tenants={"A": 12})
    jobs = [
        job("a-8", gpus=8, duration=10, tenant="A"),
        job("a-12", gpus=12, duration=10, tenant="A", opportunistic=True),  # low priority: any idle GPUs
        job("d-32", gpus=32, duration=10, tenant="D"),
    ]
    result = replay(jobs, c, hived(vc_cells="A=3xswitch"))
    reasons = {j.job_id: j.reason for j in result.jobs}
    assert reasons == {
        "a-8": "needs 8 GPUs on 1 node(s); the cells of 'A' are 3 switch of gpu/8",
        "a-12": None,
        "d-32": "needs 32 GPUs; the cluster has at most 24 of one type",
    }
    # Quota-only counts GPUs only: 8 of A's 12 are fine there.
    assert replay(jobs[:1], c, hived(cells=False, vc_cells="A=3xswitch")).jobs[0].phase is JobPhase.FINISHED


def test_options_and_errors() -> None:
    assert "hived" in policy_names()
    policy = make_policy("hived:cells=false,borrow_bound=false")
    assert isinstance(policy, HivedPolicy) and not policy.cfg.cells and not policy.cfg.borrow_bound
    with pytest.raises(ConfigError, match="no option 'cell'"):
        make_policy("hived:cell=false")
    c = eight(2)
    with pytest.raises(ConfigError, match="rack level and above hold 32 GPUs"):
        run([job("x", tenant="A")], c, make_policy("hived:vc_cells=A=rack;B=rack"))
    with pytest.raises(ConfigError, match="expected COUNTxLEVEL@TYPE/GPUS"):
        run([job("x", tenant="A")], c, make_policy("hived:vc_cells=A=2xcabinet"))


def test_decisions_are_deterministic() -> None:
    rng = random.Random(7)
    jobs = sorted(background(rng, 40), key=lambda j: j.submit_s)
    c = eight(5)
    assert log(replay(jobs, c, hived(vc_cells=SHARED_CELLS))) == log(replay(jobs, c, hived(vc_cells=SHARED_CELLS)))


def test_running_jobs_reported_before_the_first_round_are_taken_into_account() -> None:
    # Live mode restores running jobs into a fresh controller: the policy hears of them before it has seen the
    # cluster. A's job is bound into A's node cell; D's counts as a borrower and is preempted when A needs it.
    c = eight(2, tenants={"A": 8})
    s = state(c)
    policy = hived()
    for spec, gpus in ((job("a", gpus=2, tenant="A"), (8, 9)), (job("d", gpus=4, tenant="D"), (0, 1, 2, 3))):
        s.add(spec, 0.0)
        s.launch(spec.job_id, Placement(gpus), 0.0)
        policy.on_job_changed(s.job(spec.job_id), None, 0.0)
    s.add(job("a8", gpus=6, tenant="A"), 1.0)
    policy.admit(s, s.job("a8").spec)
    policy.on_job_changed(s.job("a8"), None, 1.0)
    decision = policy.schedule(s, 1.0)
    # a8 goes to A's node (node 1, where a runs): 6 of its free GPUs, nobody preempted.
    assert [type(a).__name__ for a in decision.actions] == ["Launch"]
    assert decision.actions[0].placement.gpus == (10, 11, 12, 13, 14, 15)  # type: ignore[union-attr]


def test_a_gpu_given_twice_is_an_invariant_violation() -> None:
    policy = hived()
    s = state(eight(1))
    policy.admit(s, job("x"))
    policy._start("x", [0], high=False, vc=-1)
    with pytest.raises(InvariantViolation, match="GPU 0 is given to 'y' but 'x' holds it"):
        policy._start("y", [0], high=False, vc=-1)


def test_a_replay_of_real_philly_jobs_keeps_every_invariant() -> None:
    """Two busy Philly VCs on a small cluster with their quotas in cells, a tenant without cells and a third of
    the jobs opportunistic (borrowers): the replay through corral.sim keeps every engine invariant after every
    round and the policy's cells consistent; HiveD's VC jobs are never preempted."""
    from corral.core.errors import ConfigError as DataMissing
    from corral.sim.workload import WorkloadSpec, build_trace
    from corral.workloads.data import data_file

    try:
        path = data_file("philly", "philly.csv")
    except DataMissing as err:  # pragma: no cover - only where the shared data is not checked out
        pytest.skip(str(err))
    spec = WorkloadSpec(
        fmt="philly", path=str(path), tenants=("6c71a0", "b436b2", "ed69ec"), limit=400, opportunistic=0.3
    )
    trace = build_trace(spec)
    c = eight(6, tenants={"6c71a0": 24, "b436b2": 16})
    for options in ({}, {"cells": False}):
        policy = hived(**options)
        result = replay(trace.jobs, c, policy)
        assert policy.rounds > 100
        assert result.summary["jobs_finished"] + result.summary["jobs_rejected"] == len(trace.jobs)
        high = {j.job_id for j in trace.jobs if j.tenant != "ed69ec" and j.job_class.value == "guaranteed"}
        preempted = {line.split()[2] for line in log(result) if line.split()[1] == "preempt"}
        assert preempted and not preempted & high
