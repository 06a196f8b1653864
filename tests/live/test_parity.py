"""Same decisions as the simulator: a trace replayed by the simulator and by the live controller (its store,
executor and report handling) with stand-in agents on a virtual clock gives the same decision log, event for
event (DESIGN, "What must stay true").

The simulator's performance model is made neutral (no locality penalty, no restore or resume cost, no demand
change), which is what the virtual agent models: every job runs at rate 1.0 for its trace duration.
"""

from __future__ import annotations

import pytest

from corral.core.cluster import Cluster, Topology
from corral.core.job import JobPhase
from corral.engine.clock import VirtualClock
from corral.live.controller import Controller
from corral.live.gpus import GpuInfo
from corral.live.store import Store
from corral.live.virtual import VirtualAgent
from corral.policies import make_policy
from corral.sim.clusters import load_cluster
from corral.sim.data import data_file
from corral.sim.perf import PerfModel
from corral.sim.runner import simulate
from corral.sim.trace import Trace
from corral.sim.traces import read_tiresias
from corral.sim.traces.filters import scale_load

NEUTRAL = PerfModel(
    spread_rate=1.0,
    cross_rack_rate=1.0,
    model_spread=False,
    gpu_speed=False,
    restore_s=0.0,
    suspend_resume_s=0.0,
    demand_variation=0.0,
)


def _trace() -> Trace:
    return read_tiresias(data_file("tiresias", "60_job.csv"))


def _live(trace: Trace, cluster: Cluster, policy: str, store: Store) -> Controller:
    clock = VirtualClock()
    topo = Topology(cluster)
    gpus = [GpuInfo(g, "stand-in", topo.gpu_mem_mib[g], None, True) for g in range(topo.num_gpus)]
    durations = {j.job_id: j.duration_s or 0.0 for j in trace.jobs}
    agent = VirtualAgent(gpus, durations, clock)
    controller = Controller(
        cluster=cluster, policy=make_policy(policy), store=store, agent=agent, clock=clock, record_decisions=True
    )
    controller.feed(trace.jobs)
    controller.run_virtual()
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
