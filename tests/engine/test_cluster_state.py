"""ClusterState: the checked mutations and their indexes.

Two halves: a hypothesis state machine that drives random, valid launches (found by the real placement code
over a Planner), preemptions, finishes and rejections and checks every invariant against a brute-force
recomputation after every step; and a table of invalid mutations, each of which must raise
InvariantViolation and leave every observable part of the state exactly as it was.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from builders import cluster, job, state
from corral.core.errors import InvariantViolation, JobSpecError
from corral.core.job import FULL_GPU_MILLI, JobClass, JobPhase, JobSpec, JobView
from corral.core.placement import Placement
from corral.engine.state import ClusterState
from corral.policies.framework.contract import allowed_types
from corral.policies.framework.placement import PlacementStrategy, place
from corral.policies.framework.planner import Planner

# ------------------------------------------------------------------------------------------------------------
# Brute force: everything the state indexes, recomputed from the running jobs alone
# ------------------------------------------------------------------------------------------------------------


def held(j: JobView) -> int:
    """The share a running job holds on each of its GPUs (its placement's: a packed job holds less than asked)."""
    assert j.placement is not None
    return j.placement.gpu_milli


def check_against_brute_force(s: ClusterState) -> None:
    s.check_invariants()
    topo = s.topology
    used = [0] * topo.num_gpus
    mem_used = [0] * topo.num_gpus
    holders: list[set[str]] = [set() for _ in range(topo.num_gpus)]
    guaranteed: dict[str, int] = {}
    running = list(s.running())
    for j in running:
        assert j.phase is JobPhase.RUNNING
        p = j.placement
        assert p is not None
        assert p.num_gpus == j.spec.num_gpus  # gang
        # At its share; or, for a whole-GPU job, packed at a smaller one.
        packed = j.spec.gpu_milli == FULL_GPU_MILLI and p.gpu_milli < FULL_GPU_MILLI
        assert p.gpu_milli == j.spec.gpu_milli or packed
        for g in p.gpus:
            used[g] += p.gpu_milli
            mem_used[g] += j.spec.gpu_mem_mib or 0
            holders[g].add(j.spec.job_id)
        if j.spec.job_class is JobClass.GUARANTEED:
            guaranteed[j.spec.tenant] = guaranteed.get(j.spec.tenant, 0) + j.spec.num_gpus * p.gpu_milli
    # Per GPU: free + given = 1000, never over-given; memory likewise.
    for g in range(topo.num_gpus):
        assert used[g] <= FULL_GPU_MILLI
        assert s.gpu_free_milli(g) + used[g] == FULL_GPU_MILLI
        assert s.gpu_free_mem_mib(g) == topo.gpu_mem_mib[g] - mem_used[g] >= 0
        assert set(s.gpu_jobs(g)) == holders[g]
    # Overall: conserved, and the allocated total is the sum over running jobs.
    total_free = sum(s.gpu_free_milli(g) for g in range(topo.num_gpus))
    assert total_free + s.allocated_milli == topo.num_gpus * FULL_GPU_MILLI
    assert s.allocated_milli == sum(j.spec.num_gpus * held(j) for j in running)
    # Whole-GPU indexes.
    free = [g for g in range(topo.num_gpus) if used[g] == 0]
    for n in range(topo.num_nodes):
        node_free = [g for g in topo.node_gpus(n) if used[g] == 0]
        assert s.node_free(n) == len(node_free)
        assert sorted(s.node_free_gpus(n)) == node_free
    for t in range(len(topo.type_names)):
        assert s.free_gpus(t) == sum(1 for g in free if topo.gpu_type[g] == t)
        nodes_t = [n for n in range(topo.num_nodes) if topo.node_type[n] == t]
        for k in range(s.max_node_gpus(t) + 1):
            assert sorted(s.nodes_with_free(t, k)) == [n for n in nodes_t if s.node_free(n) == k]
        assert list(s.nodes_with_any_free(t)) == [n for n in nodes_t if s.node_free(n) > 0]
        partial = sorted(
            (FULL_GPU_MILLI - used[g], g) for g in range(topo.num_gpus) if topo.gpu_type[g] == t and 0 < used[g] < 1000
        )
        assert list(s.partial_gpus(t)) == partial
    # Tenants: the index matches, and quotas hold.
    for name in set(guaranteed) | set(s.tenants):
        assert s.tenant_guaranteed_milli(name) == guaranteed.get(name, 0)
        quota = s.tenants[name].quota_gpus if name in s.tenants else None
        if quota is not None:
            assert guaranteed.get(name, 0) <= quota * FULL_GPU_MILLI
    # Phases: each job in exactly one, and the pending/running listings agree.
    jobs = list(s.jobs())
    pending = [j.spec.job_id for j in s.pending()]
    assert sorted(pending) == sorted(j.spec.job_id for j in jobs if j.phase is JobPhase.PENDING)
    assert {j.spec.job_id for j in running} == {j.spec.job_id for j in jobs if j.phase is JobPhase.RUNNING}
    assert (s.num_pending, s.num_running) == (len(pending), len(running))
    for j in jobs:
        assert (j.placement is not None) == (j.phase is JobPhase.RUNNING)


# ------------------------------------------------------------------------------------------------------------
# The state machine
# ------------------------------------------------------------------------------------------------------------

# Two GPU types, PCIe switches, an empty node, and tenants with and without quotas.
MACHINE_CLUSTER = cluster(
    gpus=[4, 2, 0, 4, 1, 8],
    types=["A", "A", "A", "B", "B", "A"],
    gpus_per_switch=[2, None, None, None, None, 4],
    racks=["r0", "r0", "r0", "r1", "r1", "r1"],
    mem={"A": 16384, "B": 32768},
    tenants={"small": 2, "zero": 0, "free": None},
)

job_specs = st.builds(
    lambda whole, gpus, milli, types, tenant, opportunistic, mem, duration, submit: (
        {
            "gpus": gpus if whole else 1,
            "milli": 1000 if whole else milli,
            "types": types,
            "tenant": tenant,
            "opportunistic": opportunistic,
            "mem": mem,
            "duration": duration,
            "submit": submit,
        }
    ),
    whole=st.booleans(),
    gpus=st.integers(1, 6),
    milli=st.sampled_from([1, 100, 250, 400, 500, 600, 999]),
    types=st.sampled_from([(), ("A",), ("B",), ("A", "B")]),
    tenant=st.sampled_from(["default", "small", "zero", "free"]),
    opportunistic=st.booleans(),
    mem=st.sampled_from([None, None, 0, 4000, 9000, 20000]),
    duration=st.sampled_from([10.0, 100.0, 1000.0]),
    submit=st.sampled_from([0.0, 1.0, 2.0]),
)


def by_priority(job: JobView) -> tuple[Any, ...]:
    return (-job.spec.priority, job.spec.submit_s)


class ClusterStateMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.s = state(MACHINE_CLUSTER, queue_key=by_priority)
        self.now = 0.0
        self.count = 0
        self.area = 0.0  # milli-GPU x s, integrated here independently of the state
        self.keys: dict[str, tuple[Any, ...]] = {}  # queue key of each pending job when it entered the queue

    @initialize()
    def start(self) -> None:
        check_against_brute_force(self.s)

    def _ids(self, phase: JobPhase) -> list[str]:
        return sorted(j.spec.job_id for j in self.s.jobs() if j.phase is phase)

    @rule(fields=job_specs, priority=st.integers(0, 2))
    def submit(self, fields: dict[str, Any], priority: int) -> None:
        self.count += 1
        jid = f"j{self.count}"
        spec = job(jid, priority=priority, **fields)
        status = self.s.add(spec, self.now)
        assert status.phase is JobPhase.PENDING and status.queued_since_s == self.now
        self.keys[jid] = by_priority(status)

    @rule(dt=st.sampled_from([0.0, 0.5, 3.0]))
    def advance(self, dt: float) -> None:
        self.area += self.s.allocated_milli * dt
        self.now += dt

    @precondition(lambda self: self.s.num_pending > 0)
    @rule(pick=st.integers(0, 10**6), strategy=st.sampled_from(list(PlacementStrategy)))
    def launch(self, pick: int, strategy: PlacementStrategy) -> None:
        ids = self._ids(JobPhase.PENDING)
        jid = ids[pick % len(ids)]
        spec = self.s.job(jid).spec
        planner = Planner(self.s)
        types = allowed_types(self.s, spec)
        placement = place(planner, spec, strategy, types) if planner.quota_allows(spec) else None
        if placement is None:
            return
        topo = self.s.topology
        assert len({topo.gpu_type[g] for g in placement.gpus}) == 1  # a gang runs on one GPU type
        assert all(topo.gpu_type[g] in types for g in placement.gpus)
        epoch = self.s.job(jid).run_epoch
        before = self.s.allocated_milli
        status = self.s.launch(jid, placement, self.now)
        assert status.phase is JobPhase.RUNNING and status.placement == placement
        assert status.run_epoch == epoch + 1 and status.last_start_s == self.now
        assert self.s.allocated_milli == before + spec.gpu_demand_milli

    @precondition(lambda self: self.s.num_pending > 0)
    @rule(pick=st.integers(0, 10**6), share=st.sampled_from([300, 500, 700]))
    def launch_packed(self, pick: int, share: int) -> None:
        """A whole-GPU job packed at ``share`` on the first GPUs of one allowed type with room for it (Gandiva's
        packing); the quota counts what it holds."""
        ids = [j for j in self._ids(JobPhase.PENDING) if self.s.job(j).spec.gpu_milli == FULL_GPU_MILLI]
        if not ids:
            return
        jid = ids[pick % len(ids)]
        spec = self.s.job(jid).spec
        topo = self.s.topology
        mem = spec.gpu_mem_mib or 0
        for t in allowed_types(self.s, spec):
            room = [
                g
                for g in range(topo.num_gpus)
                if topo.gpu_type[g] == t and self.s.gpu_free_milli(g) >= share and self.s.gpu_free_mem_mib(g) >= mem
            ]
            if len(room) >= spec.num_gpus:
                break
        else:
            return
        tenant = self.s.tenants.get(spec.tenant)
        quota = tenant.quota_gpus if tenant is not None and spec.job_class is JobClass.GUARANTEED else None
        held_now = self.s.tenant_guaranteed_milli(spec.tenant)
        over = quota is not None and held_now + spec.num_gpus * share > quota * FULL_GPU_MILLI
        placement = Placement(tuple(room[: spec.num_gpus]), share)
        if over:
            with pytest.raises(InvariantViolation, match="quota"):
                self.s.launch(jid, placement, self.now)
            return
        before = self.s.allocated_milli
        status = self.s.launch(jid, placement, self.now)
        assert status.placement == placement
        assert self.s.allocated_milli == before + spec.num_gpus * share

    @precondition(lambda self: self.s.num_running > 0)
    @rule(pick=st.integers(0, 10**6), fraction=st.sampled_from([0.0, 0.5, 1.0]), suspend=st.booleans())
    def preempt(self, pick: int, fraction: float, suspend: bool) -> None:
        ids = self._ids(JobPhase.RUNNING)
        jid = ids[pick % len(ids)]
        status = self.s.job(jid)
        work = (status.spec.duration_s or 0.0) * fraction
        preemptions = status.preemptions
        placement = status.placement
        self.s.preempt(jid, self.now, work, suspend=suspend)
        assert status.phase is JobPhase.PENDING and status.placement is None
        assert status.work_done_s == work and status.preemptions == preemptions + 1
        assert status.suspended_from == (placement if suspend else None)
        self.keys[jid] = by_priority(status)

    @precondition(lambda self: self.s.num_running > 0)
    @rule(pick=st.integers(0, 10**6))
    def finish(self, pick: int) -> None:
        ids = self._ids(JobPhase.RUNNING)
        jid = ids[pick % len(ids)]
        status = self.s.finish(jid, self.now)
        assert status.phase is JobPhase.FINISHED and status.end_s == self.now
        assert status.work_done_s == status.spec.duration_s

    @precondition(lambda self: self.s.num_pending > 0)
    @rule(pick=st.integers(0, 10**6))
    def reject(self, pick: int) -> None:
        ids = self._ids(JobPhase.PENDING)
        jid = ids[pick % len(ids)]
        status = self.s.reject(jid, "test", self.now)
        assert status.phase is JobPhase.REJECTED and status.reason == "test"

    @invariant()
    def consistent(self) -> None:
        check_against_brute_force(self.s)

    @invariant()
    def pending_in_queue_order(self) -> None:
        keys = [self.keys[j.spec.job_id] for j in self.s.pending()]
        assert keys == sorted(keys)

    @invariant()
    def utilization_integral(self) -> None:
        assert self.s.allocated_area(self.now) == pytest.approx(self.area)


TestClusterStateMachine = ClusterStateMachine.TestCase
TestClusterStateMachine.settings = settings(
    max_examples=150, stateful_step_count=50, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


# ------------------------------------------------------------------------------------------------------------
# Invalid mutations: refused, and nothing changes
# ------------------------------------------------------------------------------------------------------------


def snapshot(s: ClusterState) -> Any:
    """Everything a reader of the state can observe."""
    topo = s.topology
    types = range(len(topo.type_names))
    return (
        [(s.gpu_free_milli(g), s.gpu_free_mem_mib(g), sorted(s.gpu_jobs(g))) for g in range(topo.num_gpus)],
        [(s.node_free(n), sorted(s.node_free_gpus(n))) for n in range(topo.num_nodes)],
        [s.free_gpus(t) for t in types],
        [[list(s.nodes_with_free(t, k)) for k in range(s.max_node_gpus(t) + 1)] for t in types],
        [list(s.nodes_with_any_free(t)) for t in types],
        [list(s.partial_gpus(t)) for t in types],
        [j.spec.job_id for j in s.pending()],
        [j.spec.job_id for j in s.running()],
        (s.num_pending, s.num_running),
        [
            (
                j.spec.job_id,
                j.phase,
                j.placement,
                j.first_start_s,
                j.last_start_s,
                j.end_s,
                j.executed_s,
                j.work_done_s,
                j.queued_s,
                j.queued_since_s,
                j.preemptions,
                j.run_epoch,
                j.reason,
            )
            for j in s.jobs()
        ],
        {name: s.tenant_guaranteed_milli(name) for name in ("default", "q")},
        (s.allocated_milli, s.allocated_area(1000.0), list(s.timeline_s), list(s.timeline_milli)),
    )


def setup() -> ClusterState:
    """Node 0: four A GPUs (0-3, 16 GiB); node 1: two B GPUs (4-5, 32 GiB). Tenant q has a quota of 2 GPUs.

    GPU 0: "half" holds 600 milli (400 free). GPU 1: "whole". GPU 4: "qrun" (tenant q, guaranteed, 20000 MiB).
    GPU 2 was used by "done", which finished. Free: GPUs 2, 3 (A) and 5 (B).
    """
    s = state(cluster(gpus=[4, 2], types=["A", "B"], mem={"A": 16384, "B": 32768}, tenants={"q": 2}))
    specs = [
        job("half", milli=600, opportunistic=True),
        job("whole"),
        job("qrun", tenant="q", mem=20000),
        job("done"),
        job("rej"),
        job("p500", milli=500),
        job("w1"),
        job("w2", gpus=2),
        job("onlyB", types=["B"]),
        job("mem20k", mem=20000),
        job("q2", gpus=2, tenant="q"),
    ]
    for spec in specs:
        s.add(spec, 0.0)
    s.launch("half", Placement((0,), 600), 1.0)
    s.launch("whole", Placement((1,)), 1.0)
    s.launch("qrun", Placement((4,)), 1.0)
    s.launch("done", Placement((2,)), 1.0)
    s.finish("done", 2.0)
    s.reject("rej", "no", 2.0)
    s.check_invariants()
    return s


P = Placement
INVALID: list[tuple[str, Callable[[ClusterState], object], str]] = [
    ("share over what is left", lambda s: s.launch("p500", P((0,), 500), 5.0), "400 milli free"),
    ("whole GPU on a shared one", lambda s: s.launch("w1", P((0,)), 5.0), "400 milli free"),
    ("whole GPU on a taken one", lambda s: s.launch("w1", P((1,)), 5.0), "0 milli free"),
    ("one GPU taken, one free", lambda s: s.launch("w2", P((2, 1)), 5.0), "0 milli free"),
    ("gang too small", lambda s: s.launch("w2", P((2,)), 5.0), "gang"),
    ("gang too large", lambda s: s.launch("w2", P((2, 3, 5)), 5.0), "gang"),
    ("whole job packed where there is no room", lambda s: s.launch("w1", P((0,), 500), 5.0), "400 milli free"),
    ("shared job given a whole GPU", lambda s: s.launch("p500", P((2,), 1000), 5.0), "asked for 500"),
    ("shared job given less than it asked", lambda s: s.launch("p500", P((2,), 250), 5.0), "asked for 500"),
    ("packed job over quota", lambda s: s.launch("q2", P((2, 3), 600), 5.0), "quota"),
    ("observed rate of a pending job", lambda s: s.observe_rate("w1", 0.5), "it is pending"),
    ("negative observed rate", lambda s: s.observe_rate("whole", -0.5), "observed rate"),
    ("disallowed GPU type", lambda s: s.launch("onlyB", P((2,)), 5.0), "may only use GPU types"),
    ("GPU that does not exist", lambda s: s.launch("w1", P((42,)), 5.0), "does not exist"),
    ("negative GPU index", lambda s: s.launch("w1", P((-1,)), 5.0), "does not exist"),
    ("not enough GPU memory", lambda s: s.launch("mem20k", P((2,)), 5.0), "MiB free"),
    ("over quota", lambda s: s.launch("q2", P((2, 3)), 5.0), "quota"),
    ("launch a running job", lambda s: s.launch("whole", P((2,)), 5.0), "it is running"),
    ("launch a finished job", lambda s: s.launch("done", P((2,)), 5.0), "it is finished"),
    ("launch a rejected job", lambda s: s.launch("rej", P((2,)), 5.0), "it is rejected"),
    ("launch an unknown job", lambda s: s.launch("ghost", P((2,)), 5.0), "unknown job"),
    ("finish a pending job", lambda s: s.finish("w1", 5.0), "cannot finish job 'w1': it is pending"),
    ("finish a finished job", lambda s: s.finish("done", 5.0), "it is finished"),
    ("preempt a finished job", lambda s: s.preempt("done", 5.0, 0.0), "cannot preempt job 'done'"),
    ("preempt a pending job", lambda s: s.preempt("w1", 5.0, 0.0), "it is pending"),
    ("preempt a rejected job", lambda s: s.preempt("rej", 5.0, 0.0), "it is rejected"),
    ("reject a running job", lambda s: s.reject("whole", "why", 5.0), "it is running"),
    ("reject a finished job", lambda s: s.reject("done", "why", 5.0), "it is finished"),
]


@pytest.mark.parametrize(("what", "mutate", "message"), INVALID, ids=[case[0] for case in INVALID])
def test_invalid_mutation_is_refused_and_changes_nothing(
    what: str, mutate: Callable[[ClusterState], object], message: str
) -> None:
    s = setup()
    before = snapshot(s)
    with pytest.raises(InvariantViolation, match=message):
        mutate(s)
    assert snapshot(s) == before
    s.check_invariants()


def test_the_setup_allows_the_valid_neighbours_of_the_invalid_cases() -> None:
    # The table above is only meaningful if the same jobs launch when the placement is right.
    s = setup()
    s.launch("w2", P((2, 3)), 5.0)
    s.launch("onlyB", P((5,)), 5.0)
    check_against_brute_force(s)
    s2 = setup()
    s2.launch("mem20k", P((5,)), 5.0)  # 32 GiB B GPU
    s2.launch("p500", P((2,), 500), 5.0)
    check_against_brute_force(s2)
    # Packed: a whole-GPU job at a share of its GPUs; the quota counts what is held (1000 + 2 x 500 = 2 GPUs).
    s3 = setup()
    s3.launch("w1", P((2,), 500), 5.0)
    s3.launch("q2", P((2, 3), 500), 5.0)
    assert s3.tenant_guaranteed_milli("q") == 2000
    assert (s3.gpu_free_milli(2), s3.gpu_free_milli(3)) == (0, 500)
    s3.observe_rate("q2", 0.75)
    assert s3.job("q2").observed_rate == 0.75
    check_against_brute_force(s3)
    s3.preempt("q2", 6.0, 0.0)
    assert s3.tenant_guaranteed_milli("q") == 1000
    assert s3.job("q2").observed_rate is None
    check_against_brute_force(s3)


def test_quota_is_exact() -> None:
    s = setup()
    s.add(job("q1", tenant="q"), 3.0)
    s.add(job("q2opp", gpus=2, tenant="q", opportunistic=True), 3.0)
    s.launch("q2opp", P((2, 3)), 5.0)  # opportunistic: outside the quota
    assert s.tenant_guaranteed_milli("q") == 1000
    s.launch("q1", P((5,)), 5.0)  # 1 + 1 = 2 GPUs: exactly at quota
    assert s.tenant_guaranteed_milli("q") == 2000
    check_against_brute_force(s)


def test_duplicate_job_id_is_refused_and_changes_nothing() -> None:
    s = setup()
    before = snapshot(s)
    with pytest.raises(JobSpecError, match="'w1' was submitted twice"):
        s.add(job("w1", gpus=3), 9.0)
    assert snapshot(s) == before


# ------------------------------------------------------------------------------------------------------------
# Bookkeeping of one job's life
# ------------------------------------------------------------------------------------------------------------


def test_lifecycle_accounting() -> None:
    s = state(cluster(nodes=1, gpus=4))
    s.add(job("a", gpus=2, duration=100, submit=0), 0.0)
    s.launch("a", P((0, 1)), 10.0)
    s.preempt("a", 30.0, 20.0)
    a = s.job("a")
    assert (a.phase, a.work_done_s, a.preemptions, a.queued_since_s, a.run_epoch) == (JobPhase.PENDING, 20, 1, 30, 1)
    s.launch("a", P((2, 3)), 50.0)
    s.finish("a", 100.0)
    assert a.phase is JobPhase.FINISHED
    assert a.queued_s == 10.0 + 20.0  # 0-10 before the first start, 30-50 after the preemption
    assert a.executed_s == 20.0 + 50.0  # 10-30 and 50-100
    assert (a.first_start_s, a.last_start_s, a.end_s, a.run_epoch) == (10.0, 50.0, 100.0, 2)
    assert a.work_done_s == 100.0
    # 2000 milli for 20 s + 50 s
    assert s.allocated_area(100.0) == 2000 * 70
    assert s.allocated_area(500.0) == 2000 * 70  # nothing allocated after the end
    assert list(s.timeline_s) == [10.0, 30.0, 50.0, 100.0]
    assert list(s.timeline_milli) == [2000, 0, 2000, 0]


def test_timeline_merges_changes_at_one_instant() -> None:
    s = state(cluster(nodes=1, gpus=2))
    s.add(job("a"), 0.0)
    s.add(job("b"), 0.0)
    s.launch("a", P((0,)), 5.0)
    s.launch("b", P((1,)), 5.0)
    s.finish("a", 7.0)
    assert list(s.timeline_s) == [5.0, 7.0]
    assert list(s.timeline_milli) == [2000, 1000]


def test_reject_records_reason_and_wait() -> None:
    s = state(cluster(nodes=1, gpus=1))
    s.add(job("a"), 2.0)
    r = s.reject("a", "too big", 5.0)
    assert (r.phase, r.reason, r.queued_s) == (JobPhase.REJECTED, "too big", 3.0)
    assert s.num_pending == 0


def test_pending_order_follows_queue_key_then_arrival() -> None:
    s = state(cluster(nodes=1, gpus=1), queue_key=by_priority)
    for jid, prio in [("a", 0), ("b", 2), ("c", 1), ("d", 2), ("e", 0)]:
        s.add(job(jid, priority=prio), 0.0)
    assert [j.spec.job_id for j in s.pending()] == ["b", "d", "c", "a", "e"]
    # A preempted job re-enters behind jobs of the same key that are already waiting.
    s.launch("b", P((0,)), 1.0)
    s.preempt("b", 2.0, 0.0)
    assert [j.spec.job_id for j in s.pending()] == ["d", "b", "c", "a", "e"]


def test_reading_the_view() -> None:
    c = cluster(gpus=[2, 2], types=["A", "B"], tenants={"t": 3})
    s = state(c)
    assert s.topology.num_gpus == 4
    assert dict(s.tenants)["t"].quota_gpus == 3
    s.add(job("a", types=["B"]), 0.0)
    assert "a" in s and "zzz" not in s
    assert s.job("a").spec.gpu_types == ("B",)
    assert [j.spec.job_id for j in s.jobs()] == ["a"]
    assert (s.max_node_gpus(0), s.max_node_gpus(1)) == (2, 2)
    assert list(s.nodes_with_free(0, 2)) == [0]
    assert list(s.nodes_with_free(0, 3)) == []  # above any node's size: empty, not an error


def test_fractional_jobs_share_one_gpu() -> None:
    s = state(cluster(nodes=1, gpus=2))
    for jid, milli in [("a", 300), ("b", 300), ("c", 400)]:
        s.add(job(jid, milli=milli), 0.0)
        s.launch(jid, P((0,), milli), 0.0)
        check_against_brute_force(s)
    assert s.gpu_free_milli(0) == 0
    assert list(s.partial_gpus(0)) == []  # full: no longer "partly taken"
    assert s.allocated_milli == 1000
    s.finish("b", 1.0)
    assert list(s.partial_gpus(0)) == [(300, 0)]
    assert s.node_free(0) == 1  # GPU 0 is still partly taken
    check_against_brute_force(s)


def test_spec_helper_is_a_jobspec() -> None:
    assert isinstance(job("x"), JobSpec)
