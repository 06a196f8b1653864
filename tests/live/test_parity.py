"""Same decisions as the simulator: a trace replayed by the simulator and by the live controller (its store,
executor and report handling) with stand-in agents on a virtual clock gives the same decision log, event for
event (DESIGN, "What must stay true").

The simulator's performance model is made neutral (no locality penalty, no restore or resume cost, no demand
change), which is what the virtual agent models: every job runs at rate 1.0 for its trace duration.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from corral.core.cluster import Cluster
from corral.core.events import NodeJoined, NodeLost
from corral.core.job import JobPhase
from corral.live.controller import Controller
from corral.live.store import Store
from corral.policies import make_policy
from corral.sim.clusters import load_cluster
from corral.sim.runner import simulate
from corral.sim.traces import Trace, read_tiresias
from corral.sim.traces.filters import scale_load
from corral.workloads.data import data_file
from virtual_live import NEUTRAL, virtual_controller


def _trace() -> Trace:
    return read_tiresias(data_file("tiresias", "60_job.csv"))


def _live(trace: Trace, cluster: Cluster, policy: str, store: Store, node_events: Any = ()) -> Controller:
    controller = virtual_controller(trace, cluster, policy, store=store)
    controller.run_virtual(node_events=node_events)
    return controller


@pytest.mark.parametrize("policy", ["fifo", "fifo:backfill=true", "tiresias", "themis"])
@pytest.mark.parametrize("cluster_name", ["2x4", "4x2"])
def test_live_controller_on_a_virtual_clock_decides_as_the_simulator(policy: str, cluster_name: str) -> None:
    trace = _trace()
    cluster = load_cluster(cluster_name)
    sim = simulate(trace, cluster, make_policy(policy), perf=NEUTRAL, record_decisions=True)
    store = Store(":memory:")
    live = _live(trace, cluster, policy, store)
    assert sim.decision_log is not None and live.engine.decision_log is not None
    sim_log = [a.render() for a in sim.decision_log]
    live_log = [a.render() for a in live.engine.decision_log]
    assert len(sim_log) >= len(trace.jobs)
    assert any(j.first_start_s != j.spec.submit_s for j in sim.jobs)  # jobs queue on 8 GPUs: real decisions
    assert live_log == sim_log
    # The store saw it all: every job finished, at the simulator's times.
    records = {r.job_id: r for r in store.jobs()}
    assert len(records) == len(trace.jobs)
    for job in sim.jobs:
        rec = records[job.spec.job_id]
        assert rec.phase is JobPhase.FINISHED
        assert rec.status.end_s == pytest.approx(job.end_s)
        assert rec.status.preemptions == job.preemptions


@pytest.mark.parametrize(
    "policy", ["tiresias:thresholds_gpu_s=200", "tiresias:thresholds_gpu_s=500,priority=gittins", "srtf"]
)
@pytest.mark.parametrize("load", [1.0, 3.0])
def test_parity_holds_with_preemptions(policy: str, load: float) -> None:
    """Policies that preempt (Tiresias with a low first threshold, SRTF) on the trace and a busier version of it:
    the logs still match event for event, preemptions included."""
    trace = scale_load(_trace(), load)
    cluster = load_cluster("2x4")
    sim = simulate(trace, cluster, make_policy(policy), perf=NEUTRAL, record_decisions=True)
    live = _live(trace, cluster, policy, Store(":memory:"))
    assert sim.decision_log is not None and live.engine.decision_log is not None
    assert sum(j.preemptions for j in sim.jobs) > 0
    assert [a.render() for a in live.engine.decision_log] == [a.render() for a in sim.decision_log]


# No work is lost to a node failure in the neutral model (a checkpoint at every instant), which is what the live
# controller counts too: a run stopped by a lost node has done what it did (the virtual agent keeps it).
NEUTRAL_FAILURES = dataclasses.replace(NEUTRAL, checkpoint_interval_s=0.0)


# The policies with parity above (Gandiva and AntMan read what the simulator's sharing model measures, which the
# virtual agent does not model).
@pytest.mark.parametrize("policy", ["fifo", "tiresias:thresholds_gpu_s=200", "themis", "srtf"])
def test_parity_holds_with_nodes_lost_and_back(policy: str) -> None:
    """Nodes lost and back in the middle of a busy replay (issue 14): the controller, with stand-in agents on a
    virtual clock, requeues the lost nodes' jobs and uses their GPUs again exactly as the simulator does."""
    trace = scale_load(_trace(), 2.0)
    cluster = load_cluster("4x2")
    events = [
        (300.0, NodeLost("node-1", "test")),
        (900.0, NodeLost("node-3", "test")),
        (1500.0, NodeJoined("node-1")),
        (2400.0, NodeJoined("node-3")),
    ]
    sim = simulate(
        trace, cluster, make_policy(policy), perf=NEUTRAL_FAILURES, record_decisions=True, node_events=events
    )
    live = _live(trace, cluster, policy, Store(":memory:"), node_events=events)
    assert sim.decision_log is not None and live.engine.decision_log is not None
    sim_log = [a.render() for a in sim.decision_log]
    assert sum("node-lost" in line for line in sim_log) == 2 and any("requeued" in line for line in sim_log)
    assert [a.render() for a in live.engine.decision_log] == sim_log
