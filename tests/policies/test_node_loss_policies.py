"""Every registered policy under node failures, and the policies that keep structures about nodes.

The conformance part replays a small contended trace (two tenants with quotas, opportunistic jobs, gangs up to
8 GPUs on 12) while nodes are lost and come back, overlapping: no policy raises, the engine's invariants hold
after every round (and HiveD's picture of its cells), and every job finishes, or is rejected for a reason that
holds with every node up (the same reason a run without failures gives). Then HiveD's bad cells (the buddy
allocator binds a cell with down GPUs only when it is doomed to), AntMan's GPUs open to opportunistic jobs, and
IADeep's memo of job kinds that could not be placed, each where a policy that did not hear ``on_nodes_changed``
would go wrong.
"""

from __future__ import annotations

from typing import Any

import pytest

from builders import checked, cluster, job, log, spans
from corral.core.cluster import Cluster, Topology
from corral.core.decisions import Decision
from corral.core.events import NodeJoined, NodeLost
from corral.core.job import JobClass, JobPhase, JobSpec
from corral.policies import make_policy
from corral.policies.antman.policy import AntManPolicy
from corral.policies.framework.contract import BasePolicy
from corral.policies.framework.view import ClusterView
from corral.policies.hived.cells import BOUND, BuddyAllocator, CellTree
from corral.policies.hived.policy import HivedPolicy
from corral.policies.registry import policy_names
from corral.sim.failures import FailureRate, random_node_failures
from corral.sim.runner import SimulationResult, simulate
from corral.sim.traces import Trace, read_tiresias
from corral.sim.traces.filters import scale_load
from corral.workloads.data import data_file

SPECS = {name: name for name in policy_names()}
SPECS["tiresias"] = "tiresias:thresholds_gpu_s=300/1200,starvation_knob=2"

# Overlapping losses, each node back in the end, all while the trace runs (it ends after 2,900 s or more without
# failures): n1 down 300-1200, n2 down 600-900 (two of three down at once), n0 down 1500-1650, n1 again 2000-2100.
FAILURES: list[tuple[float, NodeLost | NodeJoined]] = [
    (300.0, NodeLost("n1", "t")),
    (600.0, NodeLost("n2", "t")),
    (900.0, NodeJoined("n2")),
    (1200.0, NodeJoined("n1")),
    (1500.0, NodeLost("n0", "t")),
    (1650.0, NodeJoined("n0")),
    (2000.0, NodeLost("n1", "t")),
    (2100.0, NodeJoined("n1")),
]


def _jobs() -> list[JobSpec]:
    """The 60-job Tiresias trace at three times its load, two tenants; every third job is opportunistic, and so is
    every 8-GPU one (no tenant's quota holds it)."""
    trace = scale_load(read_tiresias(data_file("tiresias", "60_job.csv")), 3.0)
    out = []
    for i, spec in enumerate(trace.jobs):
        opportunistic = i % 3 == 2 or spec.num_gpus > 4
        out.append(
            JobSpec(
                job_id=spec.job_id,
                submit_s=spec.submit_s,
                num_gpus=spec.num_gpus,
                duration_s=spec.duration_s,
                model=spec.model,
                tenant="a" if i % 2 else "b",
                job_class=JobClass.OPPORTUNISTIC if opportunistic else JobClass.GUARANTEED,
            )
        )
    return out


def _cluster() -> Cluster:
    return cluster(nodes=3, gpus=4, tenants={"a": 4, "b": 4})


def _replay(policy: BasePolicy, jobs: list[JobSpec], c: Cluster, events: Any) -> SimulationResult:
    """Replay under ``policy`` (a new one), with its own picture checked before every round it plays and at the
    end, where it has a ``check()``."""
    policy = checked(policy)
    check = getattr(policy, "check", None)
    result = simulate(Trace(jobs, "test"), c, policy, record_decisions=True, check_invariants=True, node_events=events)
    if callable(check):
        check()
    return result


def _events_drawn() -> Any:
    return random_node_failures(["n0", "n1", "n2"], FailureRate(mtbf_h=0.4, repair_h=0.15), seed=11)


@pytest.mark.parametrize("failures", ["file", "drawn"])
@pytest.mark.parametrize("policy", sorted(SPECS))
def test_every_policy_replays_a_contended_trace_with_node_failures(policy: str, failures: str) -> None:
    jobs, c = _jobs(), _cluster()
    events = FAILURES if failures == "file" else _events_drawn()
    result = _replay(make_policy(SPECS[policy]), jobs, c, events)
    s = result.summary
    assert s["node_failures"] >= (4 if failures == "file" else 1)
    lost = [line for line in log(result) if " node-lost " in line]
    assert len(lost) == s["node_failures"]
    assert s["jobs_unfinished"] == 0
    # Rejected exactly as without failures, for the same reasons: admission judges the cluster with every node up.
    plain = _replay(make_policy(SPECS[policy]), jobs, c, None)
    rejected = {j.job_id: j.reason for j in result.jobs if j.phase is JobPhase.REJECTED}
    assert rejected == {j.job_id: j.reason for j in plain.jobs if j.phase is JobPhase.REJECTED}
    assert all(j.phase is JobPhase.FINISHED for j in result.jobs if j.job_id not in rejected)
    if failures == "file":
        # Every run on a lost node was requeued, and each requeue shows in the log.
        requeued = sum(len(line.split(" requeued ")[1].split()) for line in lost if not line.endswith(" -"))
        assert requeued == s["jobs_requeued_by_failures"] > 0


# -- HiveD: bad cells ----------------------------------------------------------------------------------------------


def test_buddy_allocator_binds_a_bad_cell_only_when_it_is_doomed_to() -> None:
    # Three nodes of 2 GPUs, one per rack (no rack level): three top-level free node cells.
    tree = CellTree(Topology(cluster(nodes=3, gpus=2, racks=["r0", "r1", "r2"])))
    buddy = BuddyAllocator(tree)
    buddy.reserve(0, 1, 2)  # VCs hold two node cells
    node0, node1, node2 = tree.tops[0]
    for g in (0, 1):  # node 0 goes down
        buddy.set_bad(tree.gpu_leaf[g], +1)
    buddy.check()
    assert list(buddy.free_cells(0, 1)) == [node1, node2, node0]  # healthy first
    assert buddy.bind(0, 1) == node1  # a healthy cell, though node 0 comes first in cell order
    buddy.check()
    buddy.reserve(0, 1, 1)
    assert buddy.bind(0, 1) == node2
    # Only the bad cell is left: the VC's cell is doomed to it (safety counts it, as HiveD does).
    assert buddy.bind(0, 1) == node0
    assert buddy.state[node0] == BOUND
    buddy.check()
    buddy.release(node0)
    for g in (0, 1):
        buddy.set_bad(tree.gpu_leaf[g], -1)
    buddy.check()
    assert list(buddy.free_cells(0, 1)) == [node0]


def test_buddy_allocator_splits_a_healthy_cell_rather_than_take_a_bad_one() -> None:
    # Two nodes of 4 GPUs, each under two PCIe switches of 2, in one rack: the only free cell is the rack, bad
    # once GPU 0 is down; the allocator descends into its healthy half.
    tree = CellTree(Topology(cluster(nodes=2, gpus=4, gpus_per_switch=2)))
    buddy = BuddyAllocator(tree)
    buddy.reserve(0, 0, 1)  # one GPU cell
    buddy.set_bad(tree.gpu_leaf[0], +1)  # GPU 0 (node 0) down: node 0 is a bad cell
    buddy.check()
    gpu_cell = buddy.bind(0, 0)
    assert tree.leaf_gpu[gpu_cell] == 4  # from node 1, split down to a GPU
    buddy.check()


def _hived_trace() -> tuple[Cluster, list[JobSpec]]:
    # Two nodes of 4 GPUs; VCs a and b own one node cell each (quotas of 4 GPUs).
    c = cluster(nodes=2, gpus=4, tenants={"a": 4, "b": 4})
    jobs = [job("a1", gpus=4, duration=5000, tenant="a"), job("b1", gpus=4, duration=5000, tenant="b", submit=1)]
    return c, jobs


def test_hived_vc_whose_node_is_lost_waits_in_a_doomed_cell_and_runs_when_the_node_is_back() -> None:
    c, jobs = _hived_trace()
    events = [(1000.0, NodeLost("n0", "t")), (2000.0, NodeJoined("n0"))]
    policy = HivedPolicy()
    result = _replay(policy, jobs, c, events)
    assert log(result) == [
        "0.000 launch a1 gpus=0 1 2 3 milli=1000",
        "1.000 launch b1 gpus=4 5 6 7 milli=1000",
        "1000.000 node-lost n0 requeued a1",
        "2000.000 node-joined n0",
        "2000.000 launch a1 gpus=0 1 2 3 milli=1000",
    ]
    # a1 kept its checkpoint at 0 (it ran 1000 s of 5000, the interval is 1800): it runs 5000 s more after 30 s.
    assert spans(result)["a1"] == (0.0, 2000.0 + 30.0 + 5000.0)
    assert result.summary["jobs_unfinished"] == 0


def test_hived_vc_whose_node_is_lost_rebinds_to_a_healthy_node() -> None:
    c = cluster(nodes=3, gpus=4, tenants={"a": 4, "b": 4})
    jobs = [job("a1", gpus=4, duration=5000, tenant="a"), job("b1", gpus=2, duration=5000, tenant="b", submit=1)]
    # Low-priority jobs (no quota) may borrow, but never a GPU of a down node.
    jobs += [job(f"lo{i}", gpus=1, duration=300, tenant="c", submit=1100 + i) for i in range(6)]
    result = _replay(HivedPolicy(), jobs, c, [(1000.0, NodeLost("n0", "t"))])
    lines = log(result)
    assert "1000.000 node-lost n0 requeued a1" in lines
    assert "1000.000 launch a1 gpus=8 9 10 11 milli=1000" in lines  # n2: the healthy free node cell
    launches = [line for line in lines if " launch " in line and float(line.split()[0]) >= 1000.0]
    used = {int(g) for line in launches for g in line.split("gpus=")[1].split(" milli")[0].split()}
    assert not used & {0, 1, 2, 3}
    assert (result.summary["jobs_unfinished"], result.summary["jobs_rejected"]) == (0, 0)


# -- AntMan: GPUs open to opportunistic jobs -----------------------------------------------------------------------


def test_antman_never_opens_a_down_gpu_to_opportunistic_jobs_and_opens_it_again() -> None:
    c = cluster(nodes=2, gpus=2, tenants={"a": 2})
    # Opportunistic jobs of a tenant without a quota (never upgraded): two at a time run on n1 (one per GPU) while
    # n0 is down; the last two come after it is back, and go to the least used open GPUs: n0's.
    submits = [10.0, 11.0, 12.0, 13.0, 2600.0, 2601.0]
    jobs = [job(f"o{i}", duration=1000, tenant="x", opportunistic=True, submit=t) for i, t in enumerate(submits)]
    policy = AntManPolicy()
    events = [(0.0, NodeLost("n0", "t")), (2500.0, NodeJoined("n0"))]
    views: list[ClusterView] = []  # the state, kept to read the index at the end as a round would
    result = simulate(
        Trace(jobs, "test"),
        c,
        policy,
        record_decisions=True,
        check_invariants=True,
        node_events=events,
        after_round=lambda state, now_s: views.append(state) if not views else None,
    )
    lines = log(result)
    before = [line for line in lines if " launch " in line and float(line.split()[0]) < 2500.0]
    assert before and all("gpus=0 " not in line and "gpus=1 " not in line for line in before)
    after = [line for line in lines if " launch " in line and float(line.split()[0]) >= 2500.0]
    assert any("gpus=0 " in line or "gpus=1 " in line for line in after)  # its GPUs are used again
    assert result.summary["jobs_unfinished"] == 0
    topo = policy._topo
    assert topo is not None
    policy._open_index(views[0])  # the index as the next round would read it (re-filed lazily)
    assert all(g in policy._open_key for g in (0, 1))  # open again at the end


# -- IADeep: what could not be placed is tried again when a node is back --------------------------------------------


def test_iadeep_places_a_job_that_failed_while_a_node_was_down_once_it_is_back() -> None:
    # Two one-GPU nodes; a 2-GPU gang arrives while n1 is down: it cannot be placed (IADeep remembers the kind as
    # failed until something changes). Nothing but n1's return changes, so only on_nodes_changed can retry it.
    c = cluster(nodes=2, gpus=1)
    result = _replay(make_policy("iadeep"), [job("gang", gpus=2, duration=100, submit=10)], c, _back_at(500.0))
    assert spans(result)["gang"] == (500.0, 600.0)


def _back_at(t: float) -> list[tuple[float, NodeLost | NodeJoined]]:
    return [(0.0, NodeLost("n1", "t")), (t, NodeJoined("n1"))]


@pytest.mark.parametrize("policy", sorted(SPECS))
def test_every_policy_starts_a_job_as_soon_as_the_node_it_needs_is_back(policy: str) -> None:
    c = cluster(nodes=2, gpus=2, tenants={"default": 4})
    jobs = [job("big", gpus=4, duration=100, submit=10, model="resnet50")]
    result = _replay(make_policy(SPECS[policy]), jobs, c, _back_at(500.0))
    assert spans(result)["big"] == (500.0, 600.0)


def test_the_hook_is_told_which_nodes_changed() -> None:
    heard: list[tuple[tuple[int, ...], tuple[bool, ...], float]] = []

    class Listening(BasePolicy):
        name = "listening"

        def schedule(self, view: ClusterView, now_s: float) -> Decision:
            return Decision.NOTHING

        def on_nodes_changed(self, view: ClusterView, nodes: Any, now_s: float) -> None:
            heard.append((tuple(nodes), tuple(view.node_up(n) for n in nodes), now_s))

    c = cluster(nodes=2, gpus=1)
    _replay(Listening(), [job("a", submit=1000)], c, _back_at(20.0))
    assert heard == [((1,), (False,), 0.0), ((1,), (True,), 20.0)]
