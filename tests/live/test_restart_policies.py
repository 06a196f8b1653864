"""Every registered policy survives a controller restart (issue 22, item 1).

A trace is replayed by the live controller on a virtual clock with stand-in agents; the controller is dropped
between two turns, as a ``kill -9`` would leave it (the store holds what each turn committed), and a new
controller, with a new policy object, takes over from the same store and the same agent (whose runs, like real
processes, outlived the controller). It must take back every job (running ones reattached, pending, suspended
and preempting ones as they were) without raising, and drain the trace: every job finished exactly once, none
lost or started twice.

The kill points are spread over the replay so that, for each policy, some restart finds running and pending
jobs, and the policies that suspend or preempt also meet a suspended job and a job whose preemption was in
flight.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path

import pytest

from corral.core.cluster import Cluster, Topology
from corral.core.job import JobClass, JobPhase, JobSpec
from corral.core.tenant import Tenant
from corral.engine.clock import VirtualClock
from corral.live.agent import LaunchRequest
from corral.live.agent.gpus import GpuInfo
from corral.live.controller import Controller
from corral.live.records import ProcessPhase
from corral.live.store import Store
from corral.live.virtual import VirtualAgent
from corral.policies import make_policy
from corral.policies.registry import policy_names
from corral.sim.clusters import load_cluster
from corral.sim.traces import Trace, read_tiresias
from corral.sim.traces.filters import scale_load
from corral.workloads.data import data_file

# Each policy with its defaults, except Tiresias: its first threshold is lowered to the trace's short jobs (a
# few minutes each), so that jobs are demoted and preempted, with a starvation knob so that promotions happen.
SPECS = {name: name for name in policy_names()}
SPECS["tiresias"] = "tiresias:thresholds_gpu_s=300/1200,starvation_knob=2"


def _jobs() -> list[JobSpec]:
    """The 60-job Tiresias trace at three times its load, two tenants; every third job is opportunistic, and so
    is every 8-GPU one (no tenant's quota holds it)."""
    trace: Trace = scale_load(read_tiresias(data_file("tiresias", "60_job.csv")), 3.0)
    out = []
    for i, job in enumerate(trace.jobs):
        opportunistic = i % 3 == 2 or job.num_gpus > 4
        out.append(
            JobSpec(
                job_id=job.job_id,
                submit_s=job.submit_s,
                num_gpus=job.num_gpus,
                duration_s=job.duration_s,
                model=job.model,
                tenant="a" if i % 2 else "b",
                job_class=JobClass.OPPORTUNISTIC if opportunistic else JobClass.GUARANTEED,
            )
        )
    return out


def _cluster() -> Cluster:
    return dataclasses.replace(load_cluster("2x4"), tenants=(Tenant("a", 4), Tenant("b", 4)))


def _controller(cluster: Cluster, policy: str, store: Store, agent: VirtualAgent, clock: VirtualClock) -> Controller:
    return Controller(cluster=cluster, policy=make_policy(policy), store=store, agent=agent, clock=clock)


class _Replay:
    """One replay's parts: the trace, the cluster, a virtual clock and the stand-in agent (counting launches)."""

    def __init__(self) -> None:
        self.jobs = _jobs()
        self.cluster = _cluster()
        topo = Topology(self.cluster)
        self.clock = VirtualClock()
        gpus = [GpuInfo(g, "stand-in", topo.gpu_mem_mib[g], None, True) for g in range(topo.num_gpus)]
        self.agent = VirtualAgent(gpus, {j.job_id: j.duration_s or 0.0 for j in self.jobs}, self.clock)
        self.launches: Counter[str] = Counter()
        launch = self.agent.launch

        def counting_launch(req: LaunchRequest) -> None:
            self.launches[req.job_id] += 1
            launch(req)

        self.agent.launch = counting_launch  # type: ignore[method-assign]

    def controller(self, policy: str, store: Store) -> Controller:
        return Controller(
            cluster=self.cluster, policy=make_policy(SPECS[policy]), store=store, agent=self.agent, clock=self.clock
        )


def _kinds(store: Store) -> set[str]:
    """What a restart would find in the store: running, pending, suspended, preempting (or finished) jobs."""
    out = set()
    for rec in store.jobs():
        if rec.status.phase is JobPhase.PENDING and rec.status.suspended_from is not None:
            out.add("suspended")
        elif rec.process.phase is ProcessPhase.STOPPING:
            out.add("preempting")
        else:
            out.add(rec.status.phase.value)
    return out


def _kill_points(policy: str) -> dict[str, int]:
    """For each kind of job a restart can find, the first turn after which an uninterrupted replay has one
    (replays are deterministic, so a replay killed after that turn has it too)."""
    replay = _Replay()
    store = Store(":memory:")
    c = replay.controller(policy, store)
    first: dict[str, int] = {}
    turn = c._turn
    count = [0]

    def watched(now: float, items: object) -> None:
        turn(now, items)  # type: ignore[arg-type]
        count[0] += 1
        for kind in _kinds(store):
            first.setdefault(kind, count[0])

    c._turn = watched  # type: ignore[method-assign]
    c.feed(replay.jobs)
    c.run_virtual()
    return first


def _restart_at(policy: str, turns: int, tmp_path: Path) -> set[str]:
    """Replay with a ``kill -9`` after ``turns`` turns and a restart; check the outcome; return what the restart
    found."""
    replay = _Replay()
    db = tmp_path / f"{turns}.db"
    first = replay.controller(policy, Store(db))
    first.feed(replay.jobs)
    first.run_virtual(turns=turns)
    del first  # nothing more of it runs; what it committed is in the store

    store = Store(db)
    found = _kinds(store)
    known = {rec.job_id for rec in store.jobs()}
    second = replay.controller(policy, store)
    second.feed(j for j in replay.jobs if j.job_id not in known)  # what clients submit after the restart
    second.run_virtual()

    ended = {r.job_id: r for r in store.jobs()}
    assert set(ended) == {j.job_id for j in replay.jobs}, "a job was lost"
    phases = Counter(r.status.phase for r in ended.values())
    assert phases == Counter({JobPhase.FINISHED: len(replay.jobs)}), phases
    assert all(r.process.phase is ProcessPhase.NONE for r in ended.values())
    # Nothing ran twice: every launch is a run the store counts (a reattached run was not launched again).
    for job_id, n in replay.launches.items():
        assert n == ended[job_id].process.run, (job_id, n, ended[job_id].process.run)
    return found


@pytest.mark.parametrize("policy", policy_names())
def test_every_policy_restarts_with_running_pending_suspended_and_preempting_jobs(policy: str, tmp_path: Path) -> None:
    points = _kill_points(policy)
    assert {"running", "pending"} <= set(points), points
    # The policies that suspend or preempt on this trace meet such jobs at some restart.
    if policy in ("gandiva", "antman"):
        assert "suspended" in points, points
    if policy in ("tiresias", "themis"):
        assert "preempting" in points, points
    seen: set[str] = set()
    for kind, turn in sorted(points.items(), key=lambda kv: kv[1]):
        if kind != "finished":
            found = _restart_at(policy, turn, tmp_path)
            assert kind in found, (kind, turn, found)
            seen |= found
    for turns in (40, 150):  # and two points in the thick of it
        seen |= _restart_at(policy, turns, tmp_path)
    assert {"running", "pending"} <= seen
