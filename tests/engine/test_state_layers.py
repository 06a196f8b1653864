"""ClusterState's two layers per GPU (AntMan, OSDI'20 §4): ordinary placements allocate share and count against
quotas; opportunistic ones allocate nothing, only a compute-share cap and memory. Also ``resize``, ``upgrade``,
``report`` (measured use) and the per-tenant quota integrals.

Three parts: a table of refused changes, each of which must raise InvariantViolation and leave the state as it
was; hand-worked scenarios with exact figures; and a hypothesis state machine that throws random launches on
both layers, resizes, upgrades, reports, preemptions and finishes at a small cluster, checking every invariant
against an independent recomputation after every step.
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
from corral.core.job import FULL_GPU_MILLI, JobClass, JobPhase
from corral.core.placement import Placement
from corral.core.telemetry import Telemetry
from corral.engine.state import ClusterState

P = Placement


def opp(gpus: tuple[int, ...], milli: int, mem: int | None = None) -> Placement:
    return Placement(gpus, milli, mem, opportunistic=True)


def tel(sm: float = 0.5, peak: int = 1000, now: float = 0.0) -> Telemetry:
    return Telemetry(
        time_s=now,
        step_time_s=0.2,
        solo_step_time_s=0.1,
        mem_peak_mib=peak,
        mem_mean_mib=peak // 2,
        mem_need_mib=peak,
        sm_util=sm,
    )


def snapshot(s: ClusterState, now: float = 5.0) -> Any:
    """Everything a reader of the state can observe, both layers and measured use included (collections keyed
    by job are compared as sets: see ``test_a_refused_change_keeps_the_order_of_the_indexes`` for their order)."""
    topo = s.topology
    types = range(len(topo.type_names))
    return (
        [
            (
                s.gpu_free_milli(g),
                s.gpu_free_mem_mib(g),
                sorted(s.gpu_jobs(g)),
                sorted(s.gpu_opportunistic_jobs(g)),
                s.gpu_opportunistic_milli(g),
                s.gpu_sm_used(g),
                s.gpu_mem_used_mib(g),
            )
            for g in range(topo.num_gpus)
        ],
        [(s.node_free(n), sorted(s.node_free_gpus(n))) for n in range(topo.num_nodes)],
        [s.free_gpus(t) for t in types],
        [[sorted(s.nodes_with_free(t, k)) for k in range(s.max_node_gpus(t) + 1)] for t in types],
        [list(s.nodes_with_any_free(t)) for t in types],
        [list(s.partial_gpus(t)) for t in types],
        [list(s.gpus_by_sm_used(t)) for t in types],
        [j.spec.job_id for j in s.pending()],
        {shape: [e[2].spec.job_id for e in group] for shape, group in s.pending_groups()},
        [j.spec.job_id for j in s.running()],
        [
            (
                j.spec.job_id,
                j.phase,
                j.placement,
                j.job_class,
                j.upgraded,
                j.telemetry,
                j.observed_rate,
                j.last_start_s,
                j.executed_s,
                j.queued_s,
                j.preemptions,
                j.run_epoch,
            )
            for j in s.jobs()
        ],
        {name: s.tenant_guaranteed_milli(name) for name in ("default", "q")},
        s.tenant_areas("q", now),
        (s.allocated_milli, s.allocated_area(now), list(s.timeline_s), list(s.timeline_milli)),
    )


# ------------------------------------------------------------------------------------------------------------
# Refused changes
# ------------------------------------------------------------------------------------------------------------


def setup() -> ClusterState:
    """Two nodes of two 16 GiB GPUs (0, 1 | 2, 3); tenant q has a quota of 2 GPUs.

    GPU 0: "g" (q, guaranteed, 8000 MiB reserved) allocates it whole; "o1" (cap 600, 4000 MiB) and "o4" (cap 300,
    no memory) run there opportunistically: 900 milli of caps, 12000 MiB given, 4384 MiB left.
    GPU 1: "qo" (q, opportunistic, cap 500, 10000 MiB): 6384 MiB left, nothing allocated.
    GPUs 2, 3: "qbig" (q, a 2-GPU opportunistic gang, cap 500 each); on GPU 3 also "o5" (asks 500, cap 250).
    Pending: "gp" (guaranteed), "o2" (opportunistic, asks 1000), "o3" (opportunistic, asks 500), "gmem"
    (guaranteed, 8000 MiB).
    """
    s = state(cluster(nodes=2, gpus=2, tenants={"q": 2}))
    for spec in (
        job("g", tenant="q", mem=8000),
        job("o1", opportunistic=True),
        job("o4", opportunistic=True),
        job("qo", tenant="q", opportunistic=True),
        job("qbig", gpus=2, tenant="q", opportunistic=True),
        job("gp"),
        job("o2", opportunistic=True),
        job("o3", milli=500, opportunistic=True),
        job("gmem", mem=8000),
        job("o5", milli=500, opportunistic=True),
    ):
        s.add(spec, 0.0)
    s.launch("g", P((0,)), 1.0)
    s.launch("o1", opp((0,), 600, 4000), 1.0)
    s.launch("o4", opp((0,), 300), 1.0)
    s.launch("qo", opp((1,), 500, 10000), 1.0)
    s.launch("qbig", opp((2, 3), 500), 1.0)
    s.launch("o5", opp((3,), 250), 1.0)
    s.check_invariants()
    return s


INVALID: list[tuple[str, Callable[[ClusterState], object], str]] = [
    ("guaranteed job on an opportunistic placement", lambda s: s.launch("gp", opp((1,), 500), 5.0), "is guaranteed"),
    ("opportunistic cap above the request", lambda s: s.launch("o3", opp((1,), 600), 5.0), "share cap is 600"),
    ("opportunistic caps over 1000 at launch", lambda s: s.launch("o2", opp((0,), 200), 5.0), "100 milli of oppo"),
    ("opportunistic memory over the GPU's", lambda s: s.launch("o2", opp((0,), 100, 5000), 5.0), "4384 MiB free"),
    ("reservation over what caps leave", lambda s: s.launch("gmem", P((1,)), 5.0), "6384 MiB free"),
    ("opportunistic caps over 1000 at resize", lambda s: s.resize("o1", 5.0, gpu_milli=800), "opportunistic share"),
    ("opportunistic cap above its request at resize", lambda s: s.resize("o5", 5.0, gpu_milli=600), "share cap is 600"),
    ("share over 1000 at resize", lambda s: s.resize("qo", 5.0, gpu_milli=1001), "cannot resize"),
    ("negative share at resize", lambda s: s.resize("qo", 5.0, gpu_milli=-1), "cannot resize"),
    ("negative memory at resize", lambda s: s.resize("qo", 5.0, mem_mib=-1), "cannot resize"),
    ("opportunistic memory over at resize", lambda s: s.resize("o1", 5.0, mem_mib=8385), "8384 MiB free"),
    ("reservation over at resize", lambda s: s.resize("g", 5.0, mem_mib=12385), "12384 MiB free"),
    ("share of an ordinary placement", lambda s: s.resize("g", 5.0, gpu_milli=500), "ordinary placement"),
    ("resize a pending job", lambda s: s.resize("gp", 5.0, mem_mib=10), "it is pending"),
    ("upgrade a guaranteed job", lambda s: s.upgrade("g", P((1,)), 5.0), "not running opportunistically"),
    ("upgrade a pending job", lambda s: s.upgrade("o2", P((1,)), 5.0), "it is pending"),
    ("upgrade over quota", lambda s: s.upgrade("qbig", P((2, 3)), 5.0), "quota"),
    ("upgrade packed over quota", lambda s: s.upgrade("qbig", P((2, 3), 600), 5.0), "quota"),
    ("upgrade onto an opportunistic placement", lambda s: s.upgrade("qo", opp((1,), 500), 5.0), "to an opportunistic"),
    ("upgrade onto an allocated GPU", lambda s: s.upgrade("qo", P((0,)), 5.0), "0 milli free"),
    ("upgrade with memory over", lambda s: s.upgrade("qo", P((2,), 1000, 16385), 5.0), "MiB free"),
    ("upgrade gang too small", lambda s: s.upgrade("qbig", P((2,)), 5.0), "gang"),
    ("telemetry for a pending job", lambda s: s.report("gp", tel()), "it is pending"),
    ("telemetry for an unknown job", lambda s: s.report("ghost", tel()), "unknown job"),
]


@pytest.mark.parametrize(("what", "mutate", "message"), INVALID, ids=[case[0] for case in INVALID])
def test_refused_change_raises_and_changes_nothing(
    what: str, mutate: Callable[[ClusterState], object], message: str
) -> None:
    s = setup()
    s.report("o1", tel(0.25, 3000))  # measured use must survive a refused change too
    before = snapshot(s)
    with pytest.raises(InvariantViolation, match=message):
        mutate(s)
    assert snapshot(s) == before
    s.check_invariants()


def test_the_setup_allows_the_valid_neighbours_of_the_refused_changes() -> None:
    # The table is only meaningful if the same jobs go through when the figures are right.
    s = setup()
    s.launch("o3", opp((1,), 500), 5.0)  # at its request
    s.launch("o2", opp((0,), 100, 4384), 5.0)  # exactly the caps and memory left
    assert (s.gpu_opportunistic_milli(0), s.gpu_free_mem_mib(0)) == (1000, 0)
    s.resize("qo", 5.0, mem_mib=16384)  # every MiB of GPU 1 (o3 took none)
    s.check_invariants()
    s2 = setup()
    s2.resize("o1", 5.0, gpu_milli=700, mem_mib=8384)  # caps 1000, memory all given
    s2.resize("g", 5.0, mem_mib=8000)  # an ordinary reservation may be re-stated
    s2.resize("g", 5.0, gpu_milli=1000)  # ... and its share too, unchanged
    s2.upgrade("qo", P((1,), 1000, 6000), 5.0)  # q: 1000 + 1000 = its quota
    s2.check_invariants()
    s3 = setup()
    s3.resize("qo", 5.0, mem_mib=2384)
    s3.launch("gmem", P((1,)), 5.0)  # the reservation fits once the cap has shrunk
    s3.check_invariants()


def test_an_opportunistic_job_on_an_ordinary_placement_cannot_be_upgraded() -> None:
    s = state(cluster(nodes=1, gpus=2, tenants={"q": 2}))
    s.add(job("o", tenant="q", opportunistic=True), 0.0)
    s.launch("o", P((0,)), 0.0)  # opportunistic by class, but it allocates its GPU already
    before = snapshot(s, 1.0)
    with pytest.raises(InvariantViolation, match="not running opportunistically"):
        s.upgrade("o", P((1,)), 1.0)
    assert snapshot(s, 1.0) == before and not s.job("o").upgraded


# ------------------------------------------------------------------------------------------------------------
# The opportunistic layer allocates nothing
# ------------------------------------------------------------------------------------------------------------


def test_an_opportunistic_job_allocates_nothing_and_a_guaranteed_one_can_join_it() -> None:
    s = state(cluster(nodes=1, gpus=2, tenants={"q": 1}))
    s.add(job("o", tenant="q", opportunistic=True), 0.0)
    s.add(job("g", tenant="q", mem=10000), 0.0)
    s.add(job("big", mem=10385), 0.0)
    empty = snapshot(s, 0.0)
    s.launch("o", opp((0,), 1000, 6000), 1.0)
    # The allocation layer cannot tell: both GPUs whole and free, no quota used, nothing allocated.
    assert s.gpu_free_milli(0) == 1000 and s.free_gpus(0) == 2 and s.node_free(0) == 2
    assert list(s.nodes_with_free(0, 2)) == [0] and sorted(s.node_free_gpus(0)) == [0, 1]
    assert list(s.partial_gpus(0)) == [] and list(s.gpu_jobs(0)) == []
    assert s.allocated_milli == 0 and s.tenant_guaranteed_milli("q") == 0
    assert list(s.timeline_s) == [] and s.allocated_area(10.0) == 0.0
    assert snapshot(s, 1.0)[1:6] == empty[1:6]  # node and type indexes untouched
    # The opportunistic layer can: its cap and its memory.
    assert list(s.gpu_opportunistic_jobs(0)) == ["o"] and s.gpu_opportunistic_milli(0) == 1000
    assert s.gpu_free_mem_mib(0) == 16384 - 6000
    # A guaranteed job takes the whole GPU beside it, within its memory.
    with pytest.raises(InvariantViolation, match="10384 MiB free"):
        s.launch("big", P((0,)), 2.0)
    s.launch("g", P((0,)), 2.0)
    assert s.gpu_free_milli(0) == 0 and s.gpu_free_mem_mib(0) == 384
    assert s.tenant_guaranteed_milli("q") == 1000 and s.allocated_milli == 1000
    assert list(s.gpu_jobs(0)) == ["g"] and list(s.gpu_opportunistic_jobs(0)) == ["o"]
    assert list(s.nodes_with_free(0, 1)) == [0]
    s.check_invariants()
    # When the guaranteed job leaves, the opportunistic one is still there; when that leaves, all is back.
    s.finish("g", 3.0)
    assert s.gpu_free_mem_mib(0) == 10384
    s.finish("o", 4.0)
    assert (s.gpu_free_milli(0), s.gpu_free_mem_mib(0), s.gpu_opportunistic_milli(0)) == (1000, 16384, 0)
    s.check_invariants()


def test_an_opportunistic_job_may_also_run_on_an_ordinary_placement_outside_the_quota() -> None:
    s = state(cluster(nodes=1, gpus=2, tenants={"q": 0}))
    s.add(job("o", tenant="q", opportunistic=True), 0.0)
    s.launch("o", P((0,)), 0.0)  # allocates the GPU, but a quota of 0 does not stop it
    assert s.allocated_milli == 1000 and s.tenant_guaranteed_milli("q") == 0
    assert s.job("o").job_class is JobClass.OPPORTUNISTIC
    s.check_invariants()


def test_resize_to_share_zero_pauses_an_opportunistic_job_and_keeps_its_memory() -> None:
    s = state(cluster(nodes=1, gpus=1))
    s.add(job("o", opportunistic=True, mem=3000), 0.0)
    s.launch("o", opp((0,), 400), 0.0)
    assert s.gpu_free_mem_mib(0) == 16384 - 3000  # the spec's memory when the placement names none
    before = s.resize("o", 1.0, gpu_milli=0)
    assert before == opp((0,), 400)
    assert s.job("o").placement == opp((0,), 0)
    assert s.job("o").phase is JobPhase.RUNNING
    assert (s.gpu_opportunistic_milli(0), s.gpu_free_mem_mib(0)) == (0, 16384 - 3000)
    s.check_invariants()
    s.resize("o", 2.0, mem_mib=1000)  # None leaves the share as it is (paused)
    assert s.job("o").placement == opp((0,), 0, 1000)
    assert s.gpu_free_mem_mib(0) == 16384 - 1000
    s.resize("o", 3.0, gpu_milli=1000)
    assert s.job("o").placement == opp((0,), 1000, 1000) and s.gpu_opportunistic_milli(0) == 1000
    s.check_invariants()
    # An ordinary placement has no share 0.
    with pytest.raises(JobSpecError):
        Placement((0,), 0)


# ------------------------------------------------------------------------------------------------------------
# Upgrades
# ------------------------------------------------------------------------------------------------------------


def upgrade_setup() -> ClusterState:
    s = state(cluster(nodes=2, gpus=2, tenants={"q": 2}))
    s.add(job("o", tenant="q", opportunistic=True, mem=5000), 0.0)
    s.add(job("x", opportunistic=True), 0.0)
    s.launch("o", opp((0,), 700, 2000), 1.0)
    s.launch("x", opp((0,), 300), 1.0)
    return s


def test_upgrade_in_place_takes_the_allocation_and_counts_the_quota() -> None:
    s = upgrade_setup()
    before = s.upgrade("o", P((0,)), 3.0)
    assert before == opp((0,), 700, 2000)
    o = s.job("o")
    assert o.placement == P((0,)) and o.upgraded and o.job_class is JobClass.GUARANTEED
    assert o.spec.job_class is JobClass.OPPORTUNISTIC  # the spec stays what was submitted
    assert (o.phase, o.last_start_s, o.run_epoch, o.preemptions) == (JobPhase.RUNNING, 1.0, 1, 0)  # kept running
    assert s.tenant_guaranteed_milli("q") == 1000 and s.allocated_milli == 1000
    assert s.gpu_free_milli(0) == 0 and list(s.gpu_jobs(0)) == ["o"]
    assert list(s.gpu_opportunistic_jobs(0)) == ["x"] and s.gpu_opportunistic_milli(0) == 300
    assert s.gpu_free_mem_mib(0) == 16384 - 5000  # now the spec's reservation, not the old cap
    assert (list(s.timeline_s), list(s.timeline_milli)) == ([3.0], [1000])
    assert s.allocated_area(5.0) == 2000.0
    s.check_invariants()
    with pytest.raises(InvariantViolation, match="not running opportunistically"):
        s.upgrade("o", P((1,)), 4.0)  # only once


def test_upgrade_onto_other_gpus_moves_the_job_between_layers() -> None:
    s = upgrade_setup()
    s.upgrade("o", P((2,), 1000, 7000), 3.0)
    assert s.job("o").placement == P((2,), 1000, 7000)
    assert s.gpu_opportunistic_milli(0) == 300 and list(s.gpu_opportunistic_jobs(0)) == ["x"]
    assert s.gpu_free_mem_mib(0) == 16384
    assert (s.gpu_free_milli(2), s.gpu_free_mem_mib(2), s.node_free(1), s.node_free(0)) == (0, 16384 - 7000, 1, 2)
    assert s.tenant_guaranteed_milli("q") == 1000
    s.check_invariants()


def test_an_upgraded_job_that_is_preempted_waits_as_a_guaranteed_job() -> None:
    s = upgrade_setup()
    s.upgrade("o", P((0,), 600), 3.0)  # a packed upgrade counts what it holds
    assert s.tenant_guaranteed_milli("q") == 600 and s.gpu_free_milli(0) == 400
    s.preempt("o", 5.0, 2.0)
    o = s.job("o")
    assert o.phase is JobPhase.PENDING and o.upgraded and o.job_class is JobClass.GUARANTEED
    assert s.tenant_guaranteed_milli("q") == 0 and s.allocated_milli == 0
    shapes = [shape for shape, group in s.pending_groups() if any(e[2] is o for e in group)]
    assert len(shapes) == 1 and shapes[0].quota_tenant == "q"
    s.check_invariants()
    # It waits as guaranteed: its demand is quota shortfall, and it cannot go back to the opportunistic layer.
    held, short = s.tenant_areas("q", 7.0)
    assert (held, short) == (600 * 2.0, 1000 * 2.0)
    with pytest.raises(InvariantViolation, match="is guaranteed"):
        s.launch("o", opp((1,), 500), 7.0)
    s.launch("o", P((1,)), 7.0)
    assert s.tenant_guaranteed_milli("q") == 1000
    s.check_invariants()


# ------------------------------------------------------------------------------------------------------------
# Telemetry and measured use
# ------------------------------------------------------------------------------------------------------------


def test_reported_telemetry_is_summed_per_gpu_and_indexed_by_sm_use() -> None:
    s = state(cluster(gpus=[3, 1], types=["A", "B"]))
    s.add(job("a"), 0.0)
    s.add(job("b", gpus=2, opportunistic=True), 0.0)
    s.add(job("c"), 0.0)
    s.launch("a", P((0,)), 0.0)
    s.launch("b", opp((0, 1), 500), 0.0)
    s.launch("c", P((3,)), 0.0)
    assert list(s.gpus_by_sm_used(0)) == [(0, 0), (0, 1), (0, 2)]
    s.report("a", tel(0.5, 3000))
    s.report("b", tel(0.3, 2000))
    s.report("c", tel(1.0, 100))
    assert [s.gpu_sm_used(g) for g in range(4)] == [800, 300, 0, 1000]
    assert [s.gpu_mem_used_mib(g) for g in range(4)] == [5000, 2000, 0, 100]
    assert list(s.gpus_by_sm_used(0)) == [(0, 2), (300, 1), (800, 0)]
    assert list(s.gpus_by_sm_used(1)) == [(1000, 3)]
    assert s.job("a").telemetry == tel(0.5, 3000)
    s.check_invariants()
    s.report("a", tel(0.1, 500))  # the latest replaces the previous one
    assert (s.gpu_sm_used(0), s.gpu_mem_used_mib(0)) == (400, 2500)
    assert list(s.gpus_by_sm_used(0)) == [(0, 2), (300, 1), (400, 0)]
    s.check_invariants()
    s.finish("a", 1.0)  # what a job measured goes with it
    assert (s.gpu_sm_used(0), s.gpu_mem_used_mib(0)) == (300, 2000)
    s.preempt("b", 1.0, 0.0)
    assert s.job("b").telemetry is None
    assert [s.gpu_sm_used(g) for g in range(4)] == [0, 0, 0, 1000]
    assert [s.gpu_mem_used_mib(g) for g in range(4)] == [0, 0, 0, 100]
    assert list(s.gpus_by_sm_used(0)) == [(0, 0), (0, 1), (0, 2)]
    s.check_invariants()


def test_the_sm_use_index_built_late_equals_the_one_kept_all_along() -> None:
    # The index is built when first asked for (no built-in policy asks); from then on every report keeps it.
    def replay(ask_first: bool) -> list[list[tuple[int, int]]]:
        s = state(cluster(gpus=[3, 1], types=["A", "B"]))
        if ask_first:
            s.gpus_by_sm_used(0)
        s.add(job("a"), 0.0)
        s.add(job("b", gpus=2, opportunistic=True), 0.0)
        s.launch("a", P((0,)), 0.0)
        s.launch("b", opp((0, 1), 500), 0.0)
        s.report("a", tel(0.5, 3000))
        s.report("b", tel(0.3, 2000))
        s.report("a", tel(0.1, 500))
        s.finish("a", 1.0)
        s.check_invariants()
        return [list(s.gpus_by_sm_used(t)) for t in (0, 1)]

    assert replay(ask_first=True) == replay(ask_first=False) == [[(0, 2), (300, 0), (300, 1)], [(0, 3)]]


def test_measured_use_follows_an_upgrade_in_place() -> None:
    s = upgrade_setup()
    s.report("o", tel(0.4, 2000))
    s.upgrade("o", P((0,)), 3.0)
    assert (s.gpu_sm_used(0), s.gpu_mem_used_mib(0)) == (400, 2000)
    s.check_invariants()
    s.finish("o", 4.0)
    assert (s.gpu_sm_used(0), s.gpu_mem_used_mib(0)) == (0, 0)
    s.check_invariants()


def test_upgrade_onto_other_gpus_moves_the_measured_use_with_the_job() -> None:
    s = upgrade_setup()
    s.report("o", tel(0.4, 2000))
    s.upgrade("o", P((2,)), 3.0)
    # Either the telemetry moves with the job or it is dropped (it was measured elsewhere); never left behind.
    assert (s.gpu_sm_used(0), s.gpu_mem_used_mib(0)) == (0, 0)
    s.check_invariants()
    s.finish("o", 4.0)
    assert [s.gpu_sm_used(g) for g in range(4)] == [0, 0, 0, 0]
    s.check_invariants()


# ------------------------------------------------------------------------------------------------------------
# Per-tenant quota integrals
# ------------------------------------------------------------------------------------------------------------


def test_tenant_areas_by_hand() -> None:
    """Tenant q has a quota of 2 GPUs. held / pending guaranteed demand / shortfall = min(2000 - held, pending):

    [0, 10)   a (1 GPU) and b (2 GPUs) wait:      held 0,    pending 3000, short 2000
    [10, 40)  a runs:                             held 1000, pending 2000, short 1000
    [40, 50)  a finished, b waits:                held 0,    pending 2000, short 2000
    [50, 70)  b runs (an opportunistic c of q
              arrives at 60 and runs: no effect): held 2000, pending 0,    short 0
    [70, 80)  b preempted:                        held 0,    pending 2000, short 2000
    [80, 85)  b rejected:                         held 0,    pending 0,    short 0
    [85, 100) c upgraded onto a whole GPU:        held 1000, pending 0,    short 0
    """
    s = state(cluster(nodes=2, gpus=2, tenants={"q": 2, "other": None}))
    s.add(job("a", tenant="q"), 0.0)
    s.add(job("b", gpus=2, tenant="q"), 0.0)
    s.add(job("x", tenant="other"), 0.0)
    s.launch("x", P((3,)), 5.0)  # another tenant's jobs do not count
    s.launch("a", P((0,)), 10.0)
    assert s.tenant_areas("q", 25.0) == (15000.0, 2000 * 10 + 1000 * 15)  # a look mid-way changes nothing
    s.finish("a", 40.0)
    s.launch("b", P((0, 1)), 50.0)
    s.add(job("c", tenant="q", opportunistic=True), 60.0)
    s.launch("c", opp((2,), 1000), 60.0)
    s.preempt("b", 70.0, 20.0)
    s.reject("b", "gave up", 80.0)
    s.upgrade("c", P((2,)), 85.0)
    held = 1000 * 30 + 2000 * 20 + 1000 * 15
    short = 2000 * 10 + 1000 * 30 + 2000 * 10 + 2000 * 10
    assert s.tenant_areas("q", 100.0) == (held, short)
    assert s.tenant_areas("q", 100.0) == (held, short)  # asking twice adds nothing
    assert s.tenant_areas("other", 100.0) == (0.0, 0.0)  # no quota: nothing integrated
    assert s.tenant_areas("nobody", 100.0) == (0.0, 0.0)
    s.check_invariants()


# ------------------------------------------------------------------------------------------------------------
# Index order under refused changes
# ------------------------------------------------------------------------------------------------------------


def _ordered(s: ClusterState) -> Any:
    topo = s.topology
    return (
        [list(s.nodes_with_free(0, k)) for k in range(s.max_node_gpus(0) + 1)],
        [list(s.node_free_gpus(n)) for n in range(topo.num_nodes)],
        [list(s.gpu_jobs(g)) for g in range(topo.num_gpus)],
        [list(s.gpu_opportunistic_jobs(g)) for g in range(topo.num_gpus)],
    )


def _refused_ordinary_resize(s: ClusterState) -> None:
    s.resize("a", 5.0, mem_mib=20000)


def _refused_opportunistic_resize(s: ClusterState) -> None:
    s.resize("o1", 5.0, gpu_milli=900)


def _refused_upgrade(s: ClusterState) -> None:
    s.upgrade("o1", P((0,)), 5.0)


@pytest.mark.parametrize("mutate", [_refused_ordinary_resize, _refused_opportunistic_resize, _refused_upgrade])
def test_a_refused_change_keeps_the_order_of_the_indexes(mutate: Callable[[ClusterState], None]) -> None:
    # Nodes 0 and 1 both have one whole GPU free (bucket 1 = [0, 1]); GPU 2 runs o1 then o2 opportunistically.
    s = state(cluster(nodes=2, gpus=2))
    s.add(job("a"), 0.0)
    s.add(job("b"), 0.0)
    s.add(job("o1", opportunistic=True), 0.0)
    s.add(job("o2", opportunistic=True), 0.0)
    s.launch("a", P((0,)), 1.0)
    s.launch("b", P((2,)), 1.0)
    s.launch("o1", opp((2,), 500), 1.0)
    s.launch("o2", opp((2,), 500), 1.0)
    before = _ordered(s)
    assert before[0][1] == [0, 1] and before[3][2] == ["o1", "o2"]
    with pytest.raises(InvariantViolation):
        mutate(s)
    assert _ordered(s) == before


# ------------------------------------------------------------------------------------------------------------
# The state machine: both layers at random
# ------------------------------------------------------------------------------------------------------------

# Two nodes of two 16 GiB A GPUs and one 8 GiB B GPU; tenant q has a quota of 2 GPUs, z of none.
MACHINE_CLUSTER = cluster(gpus=[2, 2, 1], types=["A", "A", "B"], mem={"A": 16384, "B": 8192}, tenants={"q": 2, "z": 0})
QUOTA_TENANTS = ("q", "z")

job_fields = st.fixed_dictionaries(
    {
        "gpus": st.sampled_from([1, 1, 2]),
        "milli": st.sampled_from([1000, 1000, 250, 500]),
        "tenant": st.sampled_from(["default", "q", "z"]),
        "opportunistic": st.booleans(),
        "mem": st.sampled_from([None, 2000, 6000, 12000]),
    }
)
gpu_picks = st.lists(st.integers(0, 4), min_size=1, max_size=2, unique=True)
caps = st.sampled_from([0, 100, 250, 500, 700, 1000])
mems = st.sampled_from([None, 0, 3000, 7000, 15000])


class LayersMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.s = state(MACHINE_CLUSTER)
        self.now = 0.0
        self.count = 0
        self.refused = 0
        # Per quota tenant, integrated here from the brute-force figures: (held, shortfall) milli x s.
        self.areas = {t: [0.0, 0.0] for t in QUOTA_TENANTS}

    @initialize()
    def start(self) -> None:
        self.s.check_invariants()

    def _pick(self, phase: JobPhase, pick: int) -> str | None:
        ids = sorted(j.spec.job_id for j in self.s.jobs() if j.phase is phase)
        return ids[pick % len(ids)] if ids else None

    def _try(self, change: Callable[[], object]) -> bool:
        """Apply ``change``; a refused one must leave everything as it was."""
        before = snapshot(self.s, self.now)
        try:
            change()
        except InvariantViolation:
            self.refused += 1
            assert snapshot(self.s, self.now) == before
            return False
        return True

    @rule(fields=job_fields)
    def submit(self, fields: dict[str, Any]) -> None:
        self.count += 1
        if fields["milli"] != FULL_GPU_MILLI:
            fields = {**fields, "gpus": 1}
        self.s.add(job(f"j{self.count}", **fields), self.now)

    @rule(dt=st.sampled_from([0.5, 2.0]))
    def advance(self, dt: float) -> None:
        for tenant in QUOTA_TENANTS:
            held, short = brute_tenant(self.s, tenant)
            self.areas[tenant][0] += held * dt
            self.areas[tenant][1] += short * dt
        self.now += dt

    @precondition(lambda self: self.s.num_pending > 0)
    @rule(pick=st.integers(0, 10**6), gpus=gpu_picks, layer=st.booleans(), cap=caps, mem=mems)
    def launch(self, pick: int, gpus: list[int], layer: bool, cap: int, mem: int | None) -> None:
        jid = self._pick(JobPhase.PENDING, pick)
        assert jid is not None
        spec = self.s.job(jid).spec
        # Mostly the right width, so that many launches go through; the share as asked on the ordinary layer.
        gang = tuple(sorted({(g + i) % 5 for i, g in enumerate(gpus * spec.num_gpus)}))[: spec.num_gpus]
        opportunistic = (layer and spec.job_class is JobClass.OPPORTUNISTIC) or (layer and cap == 100)
        milli = cap if opportunistic else (spec.gpu_milli if cap != 500 else 500)
        placement = Placement(gang, milli, mem, opportunistic)
        if self._try(lambda: self.s.launch(jid, placement, self.now)):
            status = self.s.job(jid)
            assert status.phase is JobPhase.RUNNING and status.placement == placement

    @precondition(lambda self: self.s.num_running > 0)
    @rule(pick=st.integers(0, 10**6), cap=st.one_of(st.none(), caps), mem=mems)
    def resize(self, pick: int, cap: int | None, mem: int | None) -> None:
        jid = self._pick(JobPhase.RUNNING, pick)
        assert jid is not None
        old = self.s.job(jid).placement
        assert old is not None
        if self._try(lambda: self.s.resize(jid, self.now, cap, mem)):
            new = self.s.job(jid).placement
            assert new is not None and new.gpus == old.gpus and new.opportunistic == old.opportunistic
            assert new.gpu_milli == (old.gpu_milli if cap is None else cap)
            assert new.mem_mib == (old.mem_mib if mem is None else mem)

    @precondition(lambda self: self.s.num_running > 0)
    @rule(pick=st.integers(0, 10**6), gpus=gpu_picks, in_place=st.booleans(), packed=st.booleans())
    def upgrade(self, pick: int, gpus: list[int], in_place: bool, packed: bool) -> None:
        jid = self._pick(JobPhase.RUNNING, pick)
        assert jid is not None
        status = self.s.job(jid)
        old = status.placement
        assert old is not None
        spec = status.spec
        gang = old.gpus if in_place else tuple(sorted({(g + i) % 5 for i, g in enumerate(gpus * spec.num_gpus)}))
        gang = gang[: spec.num_gpus]
        milli = 500 if packed and spec.gpu_milli == FULL_GPU_MILLI else spec.gpu_milli
        was_opportunistic = old.opportunistic and status.job_class is JobClass.OPPORTUNISTIC
        if self._try(lambda: self.s.upgrade(jid, Placement(gang, milli), self.now)):
            assert was_opportunistic
            assert status.upgraded and status.job_class is JobClass.GUARANTEED
            assert status.placement == Placement(gang, milli)

    @precondition(lambda self: self.s.num_running > 0)
    @rule(pick=st.integers(0, 10**6), sm=st.sampled_from([0.0, 0.25, 0.5, 1.0]), peak=st.sampled_from([0, 900]))
    def report(self, pick: int, sm: float, peak: int) -> None:
        jid = self._pick(JobPhase.RUNNING, pick)
        assert jid is not None
        self.s.report(jid, tel(sm, peak, self.now))

    @precondition(lambda self: self.s.num_running > 0)
    @rule(pick=st.integers(0, 10**6), suspend=st.booleans())
    def preempt(self, pick: int, suspend: bool) -> None:
        jid = self._pick(JobPhase.RUNNING, pick)
        assert jid is not None
        self.s.preempt(jid, self.now, 0.0, suspend=suspend)
        status = self.s.job(jid)
        assert status.placement is None and status.telemetry is None

    @precondition(lambda self: self.s.num_running > 0)
    @rule(pick=st.integers(0, 10**6))
    def finish(self, pick: int) -> None:
        jid = self._pick(JobPhase.RUNNING, pick)
        assert jid is not None
        self.s.finish(jid, self.now)

    @invariant()
    def consistent(self) -> None:
        check_layers(self.s)

    @invariant()
    def tenant_integrals(self) -> None:
        for tenant in QUOTA_TENANTS:
            held, short = self.s.tenant_areas(tenant, self.now)
            assert held == pytest.approx(self.areas[tenant][0])
            assert short == pytest.approx(self.areas[tenant][1])


def brute_tenant(s: ClusterState, tenant: str) -> tuple[int, int]:
    """``(held, shortfall)`` of a quota tenant now, from the jobs alone."""
    quota = s.tenants[tenant].quota_gpus
    assert quota is not None
    held = 0
    for j in s.running():
        p = j.placement
        if j.spec.tenant == tenant and j.job_class is JobClass.GUARANTEED and p is not None and not p.opportunistic:
            held += j.spec.num_gpus * p.gpu_milli
    pending = sum(
        j.spec.gpu_demand_milli for j in s.pending() if j.spec.tenant == tenant and j.job_class is JobClass.GUARANTEED
    )
    return held, min(max(0, quota * FULL_GPU_MILLI - held), pending)


def check_layers(s: ClusterState) -> None:
    """check_invariants, and the same figures recomputed here from the running jobs alone."""
    s.check_invariants()
    topo = s.topology
    allocated = [0] * topo.num_gpus
    caps_sum = [0] * topo.num_gpus
    mem_given = [0] * topo.num_gpus
    sm = [0] * topo.num_gpus
    mem_used = [0] * topo.num_gpus
    opp_jobs: list[set[str]] = [set() for _ in range(topo.num_gpus)]
    guaranteed: dict[str, int] = {}
    for j in s.running():
        p = j.placement
        assert p is not None
        assert not p.opportunistic or j.job_class is JobClass.OPPORTUNISTIC
        mem = p.mem_mib if p.mem_mib is not None else (j.spec.gpu_mem_mib or 0)
        for g in p.gpus:
            mem_given[g] += mem
            if p.opportunistic:
                caps_sum[g] += p.gpu_milli
                opp_jobs[g].add(j.spec.job_id)
            else:
                allocated[g] += p.gpu_milli
            if j.telemetry is not None:
                sm[g] += round(j.telemetry.sm_util * FULL_GPU_MILLI)
                mem_used[g] += j.telemetry.mem_peak_mib
        if not p.opportunistic and j.job_class is JobClass.GUARANTEED:
            guaranteed[j.spec.tenant] = guaranteed.get(j.spec.tenant, 0) + j.spec.num_gpus * p.gpu_milli
    for g in range(topo.num_gpus):
        assert mem_given[g] <= topo.gpu_mem_mib[g]
        assert s.gpu_free_mem_mib(g) == topo.gpu_mem_mib[g] - mem_given[g]
        assert allocated[g] <= FULL_GPU_MILLI and s.gpu_free_milli(g) == FULL_GPU_MILLI - allocated[g]
        assert caps_sum[g] <= FULL_GPU_MILLI and s.gpu_opportunistic_milli(g) == caps_sum[g]
        assert set(s.gpu_opportunistic_jobs(g)) == opp_jobs[g]
        assert (s.gpu_sm_used(g), s.gpu_mem_used_mib(g)) == (sm[g], mem_used[g])
    for t in range(len(topo.type_names)):
        assert list(s.gpus_by_sm_used(t)) == sorted((sm[g], g) for g in range(topo.num_gpus) if topo.gpu_type[g] == t)
    for name, tenant in s.tenants.items():
        assert s.tenant_guaranteed_milli(name) == guaranteed.get(name, 0)
        if tenant.quota_gpus is not None:
            assert guaranteed.get(name, 0) <= tenant.quota_gpus * FULL_GPU_MILLI
    assert s.allocated_milli == sum(allocated)


TestLayersMachine = LayersMachine.TestCase
TestLayersMachine.settings = settings(
    max_examples=120, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def test_a_running_job_restored_with_telemetry_counts_in_its_gpus_measured_use() -> None:
    # Live recovery and forecasts restore running jobs with their last telemetry: it counts as it did before, and
    # its next report, or its end, takes it out again (it was taken out without having been put in: the GPU's
    # measured use went negative, found by AntMan's index of open GPUs in a forecast).
    before = state(cluster(gpus=[2]))
    before.add(job("a"), 0.0)
    before.launch("a", P((1,)), 0.0)
    before.report("a", tel(0.5, 3000))
    s = state(cluster(gpus=[2]))
    s.restore(before.job("a"), 5.0)
    assert (s.gpu_sm_used(1), s.gpu_mem_used_mib(1)) == (500, 3000)
    s.check_invariants()
    s.report("a", tel(0.25, 1000))
    assert (s.gpu_sm_used(1), s.gpu_mem_used_mib(1)) == (250, 1000)
    s.finish("a", 6.0)
    assert (s.gpu_sm_used(1), s.gpu_mem_used_mib(1)) == (0, 0)
    s.check_invariants()
