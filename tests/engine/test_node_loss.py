"""Nodes lost and joined: the state's checked mutations and indexes, the engine's handling of the two events, and
a hypothesis state machine that interleaves losses and returns with launches, preemptions and finishes.

What must hold (``corral.engine.state``): no job holds a GPU of a down node; every free count, bucket and index a
policy reads excludes down nodes' GPUs, and capacities are sums over up nodes; a lost node's jobs are stopped on
every node and requeued from their last checkpoint, its suspended jobs lose their host-memory state; a node that
joins brings back exactly what it took away.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from builders import cluster, job, state
from corral.core.cluster import Topology
from corral.core.decisions import Decision, Launch, Preempt
from corral.core.errors import InvariantViolation
from corral.core.events import JobFinished, JobSubmitted, NodeJoined, NodeLost
from corral.core.job import FULL_GPU_MILLI, JobPhase, JobView
from corral.core.placement import Placement
from corral.core.status import JobStatus
from corral.engine.clock import VirtualClock
from corral.engine.executor import EventSink
from corral.engine.loop import Engine
from corral.engine.state import ClusterState
from corral.policies.framework.contract import BasePolicy, allowed_types
from corral.policies.framework.placement import PlacementStrategy, place
from corral.policies.framework.planner import Planner
from corral.policies.framework.view import ClusterView


def P(gpus: tuple[int, ...], milli: int = 1000, **kw: Any) -> Placement:
    return Placement(gpus, milli, **kw)


# ------------------------------------------------------------------------------------------------------------
# Brute force: what the view must show, recomputed from the running jobs and the nodes that are up
# ------------------------------------------------------------------------------------------------------------


def check_view(s: ClusterState) -> None:
    """Every index a policy reads, against a recomputation over up nodes; and no job on a down node."""
    s.check_invariants()
    topo = s.topology
    up = [s.node_up(n) for n in range(topo.num_nodes)]
    assert sorted(s.down_nodes()) == [n for n in range(topo.num_nodes) if not up[n]]
    used = [0] * topo.num_gpus
    for j in s.running():
        assert j.placement is not None
        for g in j.placement.gpus:
            assert up[topo.gpu_node[g]], f"job {j.job_id} holds GPU {g} of a down node"
            if not j.placement.opportunistic:
                used[g] += j.placement.gpu_milli
    for g in range(topo.num_gpus):
        if not up[topo.gpu_node[g]]:
            assert (s.gpu_free_milli(g), s.gpu_free_mem_mib(g), list(s.gpu_jobs(g))) == (0, 0, [])
            assert list(s.gpu_opportunistic_jobs(g)) == []
        else:
            assert s.gpu_free_milli(g) == FULL_GPU_MILLI - used[g]
    for t in range(len(topo.type_names)):
        nodes_t = [n for n in range(topo.num_nodes) if topo.node_type[n] == t]
        assert s.up_gpus(t) == sum(topo.node_num_gpus[n] for n in nodes_t if up[n])
        free = [g for n in nodes_t if up[n] for g in topo.node_gpus(n) if used[g] == 0]
        assert s.free_gpus(t) == len(free)
        for k in range(s.max_node_gpus(t) + 1):
            assert sorted(s.nodes_with_free(t, k)) == [n for n in nodes_t if up[n] and s.node_free(n) == k]
        assert list(s.nodes_with_any_free(t)) == [n for n in nodes_t if up[n] and s.node_free(n) > 0]
        assert all(up[topo.gpu_node[g]] for _, g in s.partial_gpus(t))
        assert sorted(g for _, g in s.gpus_by_sm_used(t)) == [g for n in nodes_t if up[n] for g in topo.node_gpus(n)]
    for n in range(topo.num_nodes):
        if not up[n]:
            assert (s.node_free(n), list(s.node_free_gpus(n)), s.suspended_on_node(n)) == (0, [], [])
    # The per-node index of suspended jobs, by brute force.
    for n in range(topo.num_nodes):
        want = {
            j.job_id
            for j in s.pending()
            if j.suspended_from is not None and any(topo.gpu_node[g] == n for g in j.suspended_from.gpus)
        }
        assert {j.job_id for j in s.suspended_on_node(n)} == want


def lose(s: ClusterState, node: int, now: float, work: float = 0.0) -> list[str]:
    """What the engine does for a NodeLost: requeue the node's jobs, drop its suspended state, take it down."""
    requeued = [j.job_id for j in s.jobs_on_node(node)]
    for job_id in requeued:
        s.requeue_lost(job_id, now, work)
    for j in s.suspended_on_node(node):
        s.forget_suspended(j.job_id, min(work, j.work_done_s))
    s.lose_node(node, now)
    return requeued


# ------------------------------------------------------------------------------------------------------------
# The state, case by case
# ------------------------------------------------------------------------------------------------------------


def test_losing_a_node_requeues_its_running_fractional_and_gang_jobs_and_hides_its_gpus() -> None:
    # Three nodes of 4 GPUs: GPUs 0-3, 4-7, 8-11.
    s = state(cluster(nodes=3, gpus=4))
    s.add(job("gang", gpus=4), 0.0)
    s.launch("gang", P((2, 3, 4, 5)), 0.0)  # across nodes 0 and 1
    s.add(job("frac", milli=300), 0.0)
    s.launch("frac", P((6,), 300), 0.0)
    s.add(job("solo"), 0.0)
    s.launch("solo", P((8,)), 0.0)
    s.add(job("opp", opportunistic=True, milli=500), 0.0)
    s.launch("opp", P((7,), 200, mem_mib=0, opportunistic=True), 0.0)
    s.add(job("waiting", gpus=2), 0.0)
    check_view(s)

    assert [j.job_id for j in s.jobs_on_node(1)] == ["gang", "frac", "opp"]
    assert lose(s, 1, 10.0, work=3.0) == ["gang", "frac", "opp"]
    check_view(s)
    for job_id in ("gang", "frac", "opp"):
        j = s.job(job_id)
        assert (j.phase, j.placement, j.work_done_s, j.preemptions) == (JobPhase.PENDING, None, 3.0, 1)
    # The gang's GPUs on node 0 came back too; node 1 is gone from every index.
    assert s.node_free(0) == 4 and s.gpu_free_milli(2) == FULL_GPU_MILLI
    assert (s.node_up(1), list(s.down_nodes()), s.up_gpus(0), s.free_gpus(0)) == (False, [1], 8, 7)
    assert [list(s.nodes_with_free(0, k)) for k in range(5)] == [[], [], [], [2], [0]]
    assert s.job("solo").phase is JobPhase.RUNNING and s.job("waiting").phase is JobPhase.PENDING
    assert (s.node_failures, s.failure_requeues) == (1, 3)
    assert {j.job_id for j in s.pending()} == {"gang", "frac", "opp", "waiting"}

    s.join_node(1, 20.0)
    check_view(s)
    assert (s.node_up(1), list(s.down_nodes()), s.up_gpus(0), s.free_gpus(0)) == (True, [], 12, 11)
    s.launch("gang", P((0, 1, 4, 5)), 20.0)  # its GPUs are used again
    check_view(s)
    assert s.down_timeline == [(10.0, 4), (20.0, 0)]
    assert s.down_gpu_area(0.0, 100.0) == 40.0 and s.down_gpu_area(15.0, 18.0) == 12.0


def test_a_node_goes_down_only_empty_and_only_once() -> None:
    s = state(cluster(nodes=2, gpus=2))
    s.add(job("a"), 0.0)
    s.launch("a", P((1,)), 0.0)
    with pytest.raises(InvariantViolation, match="job 'a' holds GPU 1"):
        s.lose_node(0, 1.0)
    check_view(s)
    assert s.node_up(0)
    with pytest.raises(InvariantViolation, match="is up already"):
        s.join_node(1, 1.0)
    s.requeue_lost("a", 1.0, 0.0)
    s.lose_node(0, 1.0)
    with pytest.raises(InvariantViolation, match="is down already"):
        s.lose_node(0, 2.0)
    with pytest.raises(InvariantViolation, match="no node 'nope'"):
        s.node_index("nope")
    assert s.node_index("n1") == 1
    check_view(s)


@pytest.mark.parametrize(
    "placement",
    [P((0,)), P((1,), 500), P((0,), 0, mem_mib=0, opportunistic=True), P((0, 2))],
    ids=["whole", "share", "paused-opportunistic", "gang-across"],
)
def test_nothing_is_placed_on_a_down_node(placement: Placement) -> None:
    s = state(cluster(nodes=2, gpus=2))
    s.lose_node(0, 0.0)
    gpus = placement.num_gpus
    s.add(job("a", gpus=gpus, milli=placement.gpu_milli if gpus == 1 and placement.gpu_milli else 1000,
              opportunistic=placement.opportunistic), 0.0)  # fmt: skip
    with pytest.raises(InvariantViolation, match="node 'n0', which is down"):
        s.launch("a", placement, 0.0)
    assert s.job("a").phase is JobPhase.PENDING
    check_view(s)


def test_a_job_suspended_on_a_lost_node_loses_its_host_memory_state() -> None:
    s = state(cluster(nodes=2, gpus=2))
    s.add(job("a", gpus=2), 0.0)
    s.launch("a", P((0, 1)), 0.0)
    s.preempt("a", 5.0, 40.0, suspend=True)
    assert [j.job_id for j in s.suspended_on_node(0)] == ["a"]
    check_view(s)
    with pytest.raises(InvariantViolation, match="still holds suspended job 'a'"):
        s.lose_node(0, 6.0)
    with pytest.raises(InvariantViolation, match="between 0 and 40"):
        s.forget_suspended("a", 41.0)
    s.forget_suspended("a", 30.0)
    a = s.job("a")
    assert (a.phase, a.suspended_from, a.work_done_s) == (JobPhase.PENDING, None, 30.0)
    with pytest.raises(InvariantViolation, match="has none"):
        s.forget_suspended("a", 0.0)
    s.lose_node(0, 6.0)
    check_view(s)
    # A resumed suspended job leaves the index; one that is preempted without suspend never enters it.
    s.add(job("b"), 6.0)
    s.launch("b", P((2,)), 6.0)
    s.preempt("b", 7.0, 1.0, suspend=True)
    assert [j.job_id for j in s.suspended_on_node(1)] == ["b"]
    s.launch("b", P((2,)), 8.0)
    assert s.suspended_on_node(1) == []
    s.preempt("b", 9.0, 2.0)
    assert s.suspended_on_node(1) == []
    check_view(s)


def test_invariant_check_catches_a_job_on_a_down_node() -> None:
    s = state(cluster(nodes=2, gpus=1))
    s.lose_node(1, 0.0)
    s.add(job("a"), 0.0)
    s.launch("a", P((0,)), 0.0)
    s._up[0] = False  # tamper: node 0 "down" with a job on it
    s._down[0] = None
    with pytest.raises(InvariantViolation):
        s.check_invariants()


# ------------------------------------------------------------------------------------------------------------
# The engine
# ------------------------------------------------------------------------------------------------------------


class RecordingExecutor:
    """An executor that records its calls; with ``lost=True`` it has the node-loss seam (and keeps 1/2 of the work
    of a lost run, 1/4 of a lost suspended state)."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.sink: EventSink | None = None

    def bind(self, sink: EventSink) -> None:
        self.sink = sink

    def launch(self, job: JobStatus, now_s: float) -> None:
        self.calls.append(("launch", job.job_id, now_s))
        assert self.sink is not None and job.spec.duration_s is not None
        self.sink.schedule(now_s + job.spec.duration_s - job.work_done_s, JobFinished(job.job_id, job.run_epoch))

    def preempt(self, job: JobStatus, now_s: float, *, suspend: bool = False) -> float:
        self.calls.append(("preempt", job.job_id, now_s, suspend))
        assert job.last_start_s is not None
        return job.work_done_s + now_s - job.last_start_s

    def resized(self, job: JobStatus, now_s: float, before: Placement) -> None:
        raise AssertionError

    def finished(self, job: JobStatus, now_s: float) -> None:
        self.calls.append(("finished", job.job_id, now_s))

    def cancel(self, job: JobStatus, now_s: float) -> None:
        raise AssertionError

    def demand_changed(self, job: JobStatus, now_s: float) -> None:
        raise AssertionError

    def is_current(self, event: Any) -> bool:
        return True


class LossAwareExecutor(RecordingExecutor):
    def run_lost(self, job: JobStatus, now_s: float, node: str) -> float:
        assert job.phase is JobPhase.RUNNING and job.placement is not None  # told before the state changes
        self.calls.append(("run_lost", job.job_id, now_s, node))
        assert job.last_start_s is not None
        return (job.work_done_s + now_s - job.last_start_s) / 2

    def suspended_lost(self, job: JobStatus, now_s: float, node: str) -> float:
        assert job.phase is JobPhase.PENDING and job.suspended_from is not None
        self.calls.append(("suspended_lost", job.job_id, now_s, node))
        return job.work_done_s / 4


class ScriptedPolicy(BasePolicy):
    """Launches what it is told to at given times; records every hook call."""

    name = "scripted-nodes"

    def __init__(self, script: dict[float, list[Launch | Preempt]]) -> None:
        super().__init__()
        self.script = script
        self.heard: list[tuple[Any, ...]] = []

    def schedule(self, view: ClusterView, now_s: float) -> Decision:
        self.heard.append(("round", now_s, tuple(sorted(view.down_nodes()))))
        return Decision(tuple(self.script.pop(now_s, [])))

    def on_job_changed(self, job: JobView, before: Placement | None, now_s: float) -> None:
        self.heard.append(("changed", job.job_id, job.phase.value, now_s))

    def on_nodes_changed(self, view: ClusterView, nodes: Sequence[int], now_s: float) -> None:
        self.heard.append(("nodes", tuple(nodes), tuple(view.node_up(n) for n in nodes), now_s))


def _engine(policy: BasePolicy, executor: RecordingExecutor, nodes: int = 2) -> Engine:
    s = ClusterState(Topology(cluster(nodes=nodes, gpus=2)), queue_key=policy.queue_key)
    return Engine(s, policy, executor, VirtualClock(), record_decisions=True)


@pytest.mark.parametrize("aware", [True, False], ids=["node-loss-seam", "preempt-fallback"])
def test_engine_requeues_a_gang_across_nodes_and_tells_the_policy(aware: bool) -> None:
    executor = LossAwareExecutor() if aware else RecordingExecutor()
    policy = ScriptedPolicy(
        {
            0.0: [Launch("gang", P((1, 2))), Launch("other", P((0,)))],
            10.0: [Launch("gang", P((0, 1)))],  # after the loss of node 1 (GPUs 2-3), on node 0
        }
    )
    e = _engine(policy, executor)
    e.submit(job("gang", gpus=2, duration=100))
    e.submit(job("other", duration=5))
    e.schedule(10.0, NodeLost("n1", "test"))
    e.schedule(30.0, NodeJoined("n1"))
    e.schedule(30.0, NodeJoined("n1"))  # a repeated report changes nothing
    e.schedule(31.0, NodeLost("n0", "test"))
    e.schedule(31.0, NodeLost("n0", "test"))
    e.run(until_s=31.0)
    s = e.state
    gang = s.job("gang")
    lost_call = ("run_lost", "gang", 10.0, "n1") if aware else ("preempt", "gang", 10.0, False)
    assert lost_call in executor.calls
    # It kept half its 10 s of work with the seam, all of it through preempt; it ran again, then lost node 0.
    assert gang.preemptions == 2 and gang.phase is JobPhase.PENDING
    assert (s.node_failures, s.failure_requeues) == (2, 2)
    assert [entry.render() for entry in e.decision_log or []] == [
        "0.000 launch gang gpus=1 2 milli=1000",
        "0.000 launch other gpus=0 milli=1000",
        "10.000 node-lost n1 requeued gang",
        "10.000 launch gang gpus=0 1 milli=1000",
        "30.000 node-joined n1",
        "31.000 node-lost n0 requeued gang",
    ]
    heard = policy.heard[policy.heard.index(("changed", "gang", "pending", 10.0)) :]
    assert heard[:4] == [
        ("changed", "gang", "pending", 10.0),
        ("nodes", (1,), (False,), 10.0),
        ("round", 10.0, (1,)),
        ("changed", "gang", "running", 10.0),
    ]
    assert ("nodes", (1,), (True,), 30.0) in heard and ("nodes", (0,), (False,), 31.0) in heard
    assert sum(1 for h in heard if h[0] == "nodes") == 3
    check_view(s)
    # With the seam, work is what the executor said (half of 10 s, then half of 5 + 21); else all of it.
    assert gang.work_done_s == ((5.0 + 21.0) / 2 if aware else 10.0 + 21.0)


def test_a_node_lost_at_the_instant_a_job_is_submitted_is_lost_first() -> None:
    policy = ScriptedPolicy({})
    e = _engine(policy, LossAwareExecutor())
    e.schedule(5.0, JobSubmitted(job("a", submit=5.0)))
    e.schedule(5.0, NodeLost("n0", "test"))
    e.run()
    assert policy.heard[0] == ("nodes", (0,), (False,), 5.0)
    assert policy.heard[-1] == ("round", 5.0, (0,))


def test_a_suspended_job_on_a_lost_node_restarts_from_what_the_executor_says() -> None:
    executor = LossAwareExecutor()
    policy = ScriptedPolicy({0.0: [Launch("a", P((0, 1)))], 8.0: [Preempt("a", "test", suspend=True)]})
    e = _engine(policy, executor)
    e.submit(job("a", gpus=2, duration=100))
    e.schedule(8.0, NodeJoined("n1"))  # (an event at 8 to call a round there: n1 is up, nothing changes)
    e.schedule(8.0, JobSubmitted(job("b", submit=8.0)))
    e.schedule(20.0, NodeLost("n0", "test"))
    e.run()
    a = e.state.job("a")
    assert ("suspended_lost", "a", 20.0, "n0") in executor.calls
    assert (a.phase, a.suspended_from, a.work_done_s) == (JobPhase.PENDING, None, 2.0)  # 8 s of work / 4
    assert "20.000 node-lost n0 requeued -" in [x.render() for x in e.decision_log or []]
    check_view(e.state)


# ------------------------------------------------------------------------------------------------------------
# The state machine: losses and returns interleaved with everything else
# ------------------------------------------------------------------------------------------------------------

MACHINE_CLUSTER = cluster(
    gpus=[4, 2, 0, 4, 1, 8],
    types=["A", "A", "A", "B", "B", "A"],
    gpus_per_switch=[2, None, None, None, None, 4],
    racks=["r0", "r0", "r0", "r1", "r1", "r1"],
    mem={"A": 16384, "B": 32768},
    tenants={"small": 2, "free": None},
)

job_fields = st.fixed_dictionaries(
    {
        "gpus": st.integers(1, 6),
        "milli": st.sampled_from([1000, 1000, 250, 500]),
        "types": st.sampled_from([(), ("A",), ("B",)]),
        "tenant": st.sampled_from(["default", "small", "free"]),
        "opportunistic": st.booleans(),
        "mem": st.sampled_from([None, 0, 4000]),
    }
)


class NodeFailureMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.s = state(MACHINE_CLUSTER)
        self.now = 0.0
        self.count = 0

    @initialize()
    def start(self) -> None:
        check_view(self.s)

    def _ids(self, phase: JobPhase) -> list[str]:
        return sorted(j.job_id for j in self.s.jobs() if j.phase is phase)

    @rule(fields=job_fields)
    def submit(self, fields: dict[str, Any]) -> None:
        self.count += 1
        if fields["milli"] != 1000:
            fields = {**fields, "gpus": 1}
        self.s.add(job(f"j{self.count}", **fields), self.now)

    @rule(dt=st.sampled_from([0.5, 3.0]))
    def advance(self, dt: float) -> None:
        self.now += dt

    @precondition(lambda self: self.s.num_pending > 0)
    @rule(pick=st.integers(0, 10**6), strategy=st.sampled_from(list(PlacementStrategy)))
    def launch(self, pick: int, strategy: PlacementStrategy) -> None:
        ids = self._ids(JobPhase.PENDING)
        spec = self.s.job(ids[pick % len(ids)]).spec
        planner = Planner(self.s)
        placement = place(planner, spec, strategy, allowed_types(self.s, spec)) if planner.quota_allows(spec) else None
        if placement is None:
            return
        topo = self.s.topology
        assert all(self.s.node_up(topo.gpu_node[g]) for g in placement.gpus)  # placement never picks a down GPU
        self.s.launch(spec.job_id, placement, self.now)

    @precondition(lambda self: self.s.num_running > 0)
    @rule(pick=st.integers(0, 10**6), suspend=st.booleans())
    def preempt(self, pick: int, suspend: bool) -> None:
        ids = self._ids(JobPhase.RUNNING)
        self.s.preempt(ids[pick % len(ids)], self.now, 1.0, suspend=suspend)

    @precondition(lambda self: self.s.num_running > 0)
    @rule(pick=st.integers(0, 10**6))
    def finish(self, pick: int) -> None:
        ids = self._ids(JobPhase.RUNNING)
        self.s.finish(ids[pick % len(ids)], self.now)

    @rule(node=st.integers(0, len(MACHINE_CLUSTER.nodes) - 1))
    def lose(self, node: int) -> None:
        s = self.s
        topo = s.topology
        if not s.node_up(node):
            with pytest.raises(InvariantViolation):
                s.lose_node(node, self.now)
            return
        on_node = {
            j.job_id
            for j in s.running()
            if j.placement is not None and any(topo.gpu_node[g] == node for g in j.placement.gpus)
        }
        others = {j.job_id for j in s.running()} - on_node
        requeued = lose(s, node, self.now, work=0.5)
        assert set(requeued) == on_node and len(requeued) == len(on_node)
        assert {j.job_id for j in s.running()} == others
        assert all(s.job(j).phase is JobPhase.PENDING for j in requeued)

    @rule(node=st.integers(0, len(MACHINE_CLUSTER.nodes) - 1))
    def join(self, node: int) -> None:
        if self.s.node_up(node):
            with pytest.raises(InvariantViolation):
                self.s.join_node(node, self.now)
            return
        self.s.join_node(node, self.now)

    @invariant()
    def consistent(self) -> None:
        check_view(self.s)


TestNodeFailureMachine = NodeFailureMachine.TestCase
TestNodeFailureMachine.settings = settings(
    max_examples=120, stateful_step_count=50, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
