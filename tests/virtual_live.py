"""The live controller on a virtual clock with a virtual agent, for the tests that hold it to the simulator's
decisions (tests/live/test_parity.py, tests/policies/test_contract.py).

What the virtual agent models: every job runs at rate 1.0 for its trace duration, alone on its GPUs; it reports
starts and exits, and (``checkpoints=True``) that each run checkpoints, so every job is movable as in the
simulator. :data:`NEUTRAL` makes the simulator's model as neutral: no locality penalty, no restore or resume cost,
no demand change.
"""

from __future__ import annotations

from corral.core.cluster import Cluster, Topology
from corral.engine.clock import VirtualClock
from corral.live.agent.gpus import GpuInfo
from corral.live.controller import Controller
from corral.live.store import Store
from corral.live.virtual import VirtualAgent
from corral.policies import make_policy
from corral.sim.perf import PerfModel
from corral.sim.traces import Trace

NEUTRAL = PerfModel.neutral()


def virtual_controller(
    trace: Trace, cluster: Cluster, policy: str, *, store: Store | None = None, checkpoints: bool = False
) -> Controller:
    """A controller scheduling ``trace`` on stand-in GPUs of ``cluster`` under ``policy``, fed and ready for
    ``run_virtual``."""
    clock = VirtualClock()
    topo = Topology(cluster)
    gpus = [GpuInfo(g, "stand-in", topo.gpu_mem_mib[g], None, True) for g in range(topo.num_gpus)]
    durations = {j.job_id: j.duration_s or 0.0 for j in trace.jobs}
    agent = VirtualAgent(gpus, durations, clock, checkpoints=checkpoints)
    controller = Controller(
        cluster=cluster,
        policy=make_policy(policy),
        store=store if store is not None else Store(":memory:"),
        agent=agent,
        clock=clock,
        record_decisions=True,
    )
    controller.feed(trace.jobs)
    return controller
