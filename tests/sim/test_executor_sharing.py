"""The simulated executor with AntMan's two layers (OSDI'20 §4): opportunistic jobs beside guaranteed ones,
compute-share caps (0 = paused), memory caps that spill, resizes, upgrades, modelled telemetry and measured use.

Most tests drive the executor directly with a recording sink; those about decisions (``Resize``, ``Upgrade``) go
through the engine with a scripted policy, so the state, the loop and the executor are exercised together. One
node of 16 GiB GPUs of speed 1.0 (the Gavel V100 column), and no random draws (no usage spread, no mid-run demand
change), so every figure below follows from :mod:`corral.sim.sharing`, the model table and Gavel's measurements.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from builders import cluster, job
from corral.core.cluster import Topology
from corral.core.decisions import Action, Decision, Launch, Resize, Upgrade
from corral.core.events import Event, JobFinished
from corral.core.job import JobClass, JobPhase, JobSpec, JobView
from corral.core.placement import Placement
from corral.core.status import JobStatus
from corral.core.telemetry import Telemetry
from corral.engine.clock import VirtualClock
from corral.engine.loop import Engine
from corral.engine.state import ClusterState
from corral.policies.framework.contract import BasePolicy
from corral.policies.framework.view import ClusterView
from corral.sim.executor import SimExecutor
from corral.sim.perf import PerfModel
from corral.sim.sharing import (
    DEFAULT_STEP_S,
    Profile,
    activity,
    guest_rate,
    measured_pair_rates,
    modelled_pair_rates,
    pair_slowdown,
    spill_rate,
    usage_factor,
)
from corral.workloads.colocation import FALLBACK_RATES, load_colocation
from corral.workloads.models import traits

R18 = "ResNet-18 (batch size 64)"
R50 = "ResNet-50 (batch size 64)"
TOPO = Topology(cluster(nodes=1, gpus=2))
R18_NEED_MIB = 1536  # ResNet-18's peak: 1.5 GiB (corral.workloads.models)
R50_NEED_MIB = 9 * 1024


def quiet(**options: Any) -> PerfModel:
    """A performance model without random draws: no usage spread and (where the model has it) no demand change."""
    names = {f.name for f in dataclasses.fields(PerfModel)}
    base: dict[str, Any] = {"usage_spread": 0.0}
    if "demand_variation" in names:
        base["demand_variation"] = 0.0
    return PerfModel(**{**base, **options})


@dataclass
class Sink:
    events: list[tuple[float, Event]] = field(default_factory=list)
    rates: dict[str, float] = field(default_factory=dict)
    reports: list[tuple[str, Telemetry]] = field(default_factory=list)

    def schedule(self, time_s: float, event: Event) -> None:
        self.events.append((time_s, event))

    def observe_rate(self, job_id: str, rate: float) -> None:
        self.rates[job_id] = rate

    def report(self, job_id: str, telemetry: Telemetry) -> None:
        self.reports.append((job_id, telemetry))

    def last_report(self, job_id: str) -> Telemetry:
        return [t for j, t in self.reports if j == job_id][-1]

    def ends(self, executor: SimExecutor, job_id: str) -> list[float]:
        """The times of the job's completions the executor still stands by (one, or none while it is paused)."""
        return [
            t for t, e in self.events if isinstance(e, JobFinished) and e.job_id == job_id and executor.is_current(e)
        ]

    def end(self, executor: SimExecutor, job_id: str) -> float:
        current = self.ends(executor, job_id)
        assert len(current) == 1
        return current[0]


def executor(perf: PerfModel | None = None, *, telemetry: bool = False) -> tuple[SimExecutor, Sink]:
    ex = SimExecutor(TOPO, perf or quiet(), telemetry=telemetry)
    sink = Sink()
    ex.bind(sink)
    return ex, sink


def running(spec: JobSpec, placement: Placement, epoch: int = 1) -> JobStatus:
    return JobStatus(spec=spec, phase=JobPhase.RUNNING, placement=placement, run_epoch=epoch)


def opp(gpus: tuple[int, ...], milli: int, mem: int | None = None) -> Placement:
    return Placement(gpus, milli, mem, opportunistic=True)


def resize(ex: SimExecutor, status: JobStatus, placement: Placement, now: float) -> None:
    """What the engine does for a Resize/Upgrade: the state changes the placement, then the executor is told."""
    before = status.placement
    assert before is not None
    status.placement = placement
    ex.resized(status, now, before)


def gavel(a: str, b: str) -> tuple[float, float]:
    rates = load_colocation().rates(a, b, "v100")
    assert rates is not None
    return rates


# -- an opportunistic job (guest) beside a guaranteed one (holder) ------------------------------------------------


def test_a_guest_runs_in_its_holders_idle_slots_and_slows_it_only_by_the_residual() -> None:
    # g: ResNet-50 at SM 0.9 leaves 0.1 idle; o: ResNet-18 at SM 0.55 fits 0.1 / 0.55 of its work into it. Its
    # cap of 300 would allow 0.3 / 0.55 (its activity): the idle slots bind. g loses 0.02 x 0.3 / 0.55.
    act = 300 / 1000 / traits("resnet18").sm_util
    ex, sink = executor()
    ex.launch(running(job("g", model="resnet50"), Placement((0,))), 0.0)
    assert sink.end(ex, "g") == 100.0
    ex.launch(running(job("o", model="resnet18", opportunistic=True), opp((0,), 300)), 10.0)
    f_g = 1 - 0.02 * act
    f_o = 0.1 / 0.55
    assert f_o < act
    assert sink.rates == {"g": pytest.approx(f_g), "o": pytest.approx(f_o)}
    assert sink.end(ex, "g") == pytest.approx(10.0 + 90.0 / f_g)
    assert sink.end(ex, "o") == pytest.approx(10.0 + 100.0 / f_o)
    # The same through the module's functions.
    p_g, p_o = ex.perf.profile(job("g", model="resnet50"), 0), ex.perf.profile(job("o", model="resnet18"), 0)
    assert (p_g.sm_util, p_o.sm_util) == (0.9, 0.55)
    assert activity(p_o, 300) == pytest.approx(act)
    assert f_o == pytest.approx(guest_rate(p_o, p_g.sm_util, activity(p_o, 300)))
    assert f_g == pytest.approx(1 - ex.perf.model.antman_residual * activity(p_o, 300))


def test_a_guest_beside_a_holder_at_60_percent_sm_runs_in_the_other_40() -> None:
    # g: an unknown model, SM 0.6, leaves 0.4 idle. o: ResNet-18 (SM 0.55) capped at 500: activity 0.5 / 0.55,
    # but it fits only 0.4 / 0.55 of its work into g's idle slots. g runs at 1 - 0.02 x 0.5 / 0.55.
    ex, sink = executor()
    g, o = job("g", model="mystery"), running(job("o", model="resnet18", opportunistic=True), opp((0,), 500))
    assert ex.perf.profile(g, 0).sm_util == 0.6
    ex.launch(running(g, Placement((0,))), 0.0)
    ex.launch(o, 0.0)
    act = 0.5 / 0.55
    f_o = 0.4 / 0.55
    assert f_o < act
    assert sink.rates == {"g": pytest.approx(1 - 0.02 * act), "o": pytest.approx(f_o)}
    assert sink.end(ex, "g") == pytest.approx(100.0 / (1 - 0.02 * act))
    assert sink.end(ex, "o") == pytest.approx(100.0 / f_o)
    # Capped at 200 instead, its share binds before the idle slots do: activity 0.2 / 0.55 < 0.4 / 0.55.
    resize(ex, o, opp((0,), 200), 10.0)
    assert sink.rates == {"g": pytest.approx(1 - 0.02 * 0.2 / 0.55), "o": pytest.approx(0.2 / 0.55)}


def test_the_holders_residual_slowdown_is_the_perf_models_antman_residual() -> None:
    # g: ResNet-50 (SM 0.9); o: ResNet-18 capped at 300, activity 0.3 / 0.55, running at 0.1 / 0.55 in g's idle
    # slots whatever the residual.
    act = 0.3 / 0.55
    for residual, f_g in [(0.0, 1.0), (0.1, 1 - 0.1 * act), (0.02, 1 - 0.02 * act)]:
        ex, sink = executor(quiet(antman_residual=residual))
        ex.launch(running(job("g", model="resnet50"), Placement((0,))), 0.0)
        ex.launch(running(job("o", model="resnet18", opportunistic=True), opp((0,), 300)), 0.0)
        assert sink.rates["o"] == pytest.approx(0.1 / 0.55)
        if residual == 0.0:
            assert sink.rates["g"] == 1.0  # exactly: no residual, no slowdown
        else:
            assert sink.rates["g"] == pytest.approx(f_g)
    # Several guests multiply: a second ResNet-18 at 100 (activity 0.1 / 0.55) beside g at residual 0.1.
    ex, sink = executor(quiet(antman_residual=0.1))
    ex.launch(running(job("g", model="resnet50"), Placement((0,))), 0.0)
    ex.launch(running(job("o", model="resnet18", opportunistic=True), opp((0,), 300)), 0.0)
    ex.launch(running(job("o2", model="resnet18", opportunistic=True), opp((0,), 100)), 0.0)
    assert sink.rates["g"] == pytest.approx((1 - 0.1 * act) * (1 - 0.1 * 0.1 / 0.55))


def test_guests_beside_a_holder_share_its_idle_slots_in_proportion() -> None:
    # g: ResNet-18 holder at SM 0.55 leaves 0.45 idle. Two uncapped ResNet-18 guests would each use 0.55 of it:
    # demand 1.1 > 0.45, so each runs at 0.45 / 1.1 of its speed, and together they fill the idle slots exactly.
    ex, sink = executor()
    ex.launch(running(job("g", model="resnet18"), Placement((0,))), 0.0)
    ex.launch(running(job("o", model="resnet18", opportunistic=True), opp((0,), 1000)), 0.0)
    ex.launch(running(job("o2", model="resnet18", opportunistic=True), opp((0,), 1000)), 0.0)
    assert sink.rates == {"g": pytest.approx(0.98**2), "o": pytest.approx(0.45 / 1.1), "o2": pytest.approx(0.45 / 1.1)}
    # One of them capped at 100 (activity 0.1 / 0.55, demand 0.1): the other gets 0.45 x 0.55 / 0.65 of its speed.
    resize(ex, running(job("o2", model="resnet18", opportunistic=True), opp((0,), 1000)), opp((0,), 100), 10.0)
    assert sink.rates["o"] == pytest.approx(0.45 / 0.65)
    assert sink.rates["o2"] == pytest.approx(0.1 / 0.55 * 0.45 / 0.65)
    for job_id in ("g", "o", "o2"):
        ex.finished(running(job(job_id), Placement((0,))), 20.0)
    sm, _ = ex.usage_areas(20.0)
    assert sm == pytest.approx(10 * (0.55 * 0.98**2 + 0.45) + 10 * (0.55 * 0.98 * (1 - 0.02 * 0.1 / 0.55) + 0.45))


def test_two_guests_of_an_unmeasured_pair_use_the_modelled_rates() -> None:
    # Two guests, no holder: no priority between them, so the symmetric pair model. Unknown models: SM 0.6 and
    # bandwidth 0.5 each. Together 1.2 > 1: each gets 1/1.2 of the GPU, times 1 - 0.3 x 0.5 for the partner's
    # bandwidth: 0.85 / 1.2. b is capped at 300 of its 600 (activity 0.5), so a loses half of its pair loss;
    # a (uncapped: activity 1) costs b its whole pair loss, on top of b's own cap.
    full = 0.85 / 1.2
    ex, sink = executor()
    a, b = job("a", model="mystery", opportunistic=True), job("b", opportunistic=True)
    ex.launch(running(a, opp((0,), 1000)), 0.0)
    ex.launch(running(b, opp((0,), 300)), 0.0)
    assert sink.rates == {"a": pytest.approx(1 - (1 - full) * 0.5), "b": pytest.approx(full * 0.5)}
    modelled = modelled_pair_rates(ex.perf.profile(a, 0), ex.perf.profile(b, 0), 0.3)
    assert modelled == pytest.approx((full, full))
    assert ex.perf.sharing_rates(a, ex.perf.profile(a, 0), b, ex.perf.profile(b, 0), 0) == modelled
    assert sink.rates["a"] == pytest.approx(pair_slowdown(full, 0.5))


def test_share_zero_pauses_the_opportunistic_job_and_leaves_its_neighbour_at_full_speed() -> None:
    ex, sink = executor()
    g = running(job("g", model="resnet50"), Placement((0,)))
    o = running(job("o", model="resnet18", opportunistic=True), opp((0,), 0))
    ex.launch(g, 0.0)
    ex.launch(o, 0.0)
    assert sink.rates == {"g": 1.0, "o": 0.0}  # activity 0: g loses 0.02 x 0
    assert sink.ends(ex, "o") == []  # no completion while paused
    assert sink.end(ex, "g") == 100.0
    # Un-paused at full activity (min(1, 1.0 / 0.55)): o runs in the 0.1 that g (SM 0.9) leaves idle, 0.1 / 0.55
    # of its speed; g loses the residual 0.02 x 1.
    resize(ex, o, opp((0,), 1000), 20.0)
    f_g, f_o = 0.98, 0.1 / 0.55
    assert sink.rates == {"g": pytest.approx(f_g), "o": pytest.approx(f_o)}
    assert sink.end(ex, "g") == pytest.approx(20.0 + 80.0 / f_g)
    assert sink.end(ex, "o") == pytest.approx(20.0 + 100.0 / f_o)
    assert ex.job_times == {}  # nobody left yet


def test_an_opportunistic_gang_goes_at_its_slowest_gpu() -> None:
    # GPU 0: g, ResNet-50 at SM 0.9, leaves o 0.1 / 0.55. GPU 1: h, ResNet-18 at SM 0.55, leaves it 0.45 / 0.55.
    # The gang goes at GPU 0's pace; each holder loses the residual 0.02 x 1.
    ex, sink = executor()
    ex.launch(running(job("g", model="resnet50"), Placement((0,))), 0.0)
    ex.launch(running(job("h", model="resnet18"), Placement((1,))), 0.0)
    ex.launch(running(job("o", gpus=2, model="resnet18", opportunistic=True), opp((0, 1), 1000)), 0.0)
    assert sink.rates == {"g": pytest.approx(0.98), "h": pytest.approx(0.98), "o": pytest.approx(0.1 / 0.55)}
    # Without g, GPU 1 is the slower: 0.45 / 0.55.
    ex.finished(running(job("g", model="resnet50"), Placement((0,))), 10.0)
    assert sink.rates["o"] == pytest.approx(0.45 / 0.55)


def test_a_memory_cap_below_the_need_spills_and_slows_by_the_spill_rate() -> None:
    cases = [(768, 2.0, 0.5), (0, 2.0, 1 / 3), (1152, 2.0, 1 / 1.5), (768, 1.0, 1 / 1.5), (1536, 2.0, 1.0)]
    for cap, penalty, rate in cases:
        ex, sink = executor(quiet(spill_penalty=penalty))
        ex.launch(running(job("o", model="resnet18", opportunistic=True), opp((1,), 1000, cap)), 0.0)
        assert sink.rates["o"] == pytest.approx(rate)
        assert rate == pytest.approx(spill_rate(R18_NEED_MIB, cap, penalty))
        assert sink.end(ex, "o") == pytest.approx(100.0 / rate)
    # A guaranteed job's reservation is not a cap: it never spills.
    ex, sink = executor()
    ex.launch(running(job("g", model="resnet18"), Placement((1,), 1000, 100)), 0.0)
    assert sink.rates["g"] == 1.0


def test_two_fractional_jobs_at_their_own_share_do_not_slow_each_other() -> None:
    ex, sink = executor()
    ex.launch(running(job("a", milli=500, model="resnet50"), Placement((0,), 500)), 0.0)
    ex.launch(running(job("b", milli=500, model="resnet18"), Placement((0,), 500)), 5.0)
    assert sink.rates == {"a": 1.0, "b": 1.0}
    assert (sink.end(ex, "a"), sink.end(ex, "b")) == (100.0, 105.0)


# -- resizes and upgrades, through the engine ------------------------------------------------------------------


class Scripted(BasePolicy):
    """Takes exactly the scripted actions at the scripted times; records the telemetry it is told about."""

    name = "scripted"

    def __init__(self, script: Mapping[float, Sequence[Action]]) -> None:
        super().__init__()
        self.script = {t: list(actions) for t, actions in script.items()}
        self.told: list[tuple[float, str]] = []

    def schedule(self, view: ClusterView, now_s: float) -> Decision:
        actions = self.script.pop(now_s, [])
        later = [t for t in self.script if t > now_s]
        return Decision(tuple(actions), wake_at_s=min(later) if later else None)

    def on_telemetry(self, job: JobView, now_s: float) -> None:
        self.told.append((now_s, job.spec.job_id))


def engine(
    script: Mapping[float, Sequence[Action]], *, perf: PerfModel | None = None, telemetry: bool = False
) -> Engine:
    c = cluster(nodes=1, gpus=2, tenants={"q": 2})
    topo = Topology(c)
    policy = Scripted(script)
    s = ClusterState(topo, c.tenants, queue_key=policy.queue_key)
    ex = SimExecutor(topo, perf or quiet(), telemetry=telemetry)
    return Engine(s, policy, ex, VirtualClock(), record_decisions=True)


def replay(e: Engine, jobs: Sequence[JobSpec], until_s: float | None = None) -> list[str]:
    e.feed(jobs)
    e.run(until_s)
    e.state.check_invariants()
    assert e.decision_log is not None
    return [entry.render() for entry in e.decision_log]


JOB_G = job("g", model="resnet50", tenant="q")
JOB_O = job("o", model="resnet18", tenant="q", opportunistic=True)


def test_a_resize_re_rates_both_jobs_at_once_and_re_predicts_their_completions() -> None:
    # g: ResNet-18 at SM 0.55 leaves 0.45 idle, room for 0.45 / 0.55 of o (ResNet-18, SM 0.55). At cap 300 o's
    # share binds (activity 0.3 / 0.55); at 600 (past its natural use: activity 1) the idle slots do. g loses
    # 0.02 x o's activity: 0.02 x 0.3 / 0.55, then 0.02.
    act = 0.3 / 0.55
    f_g1, f_o1 = 1 - 0.02 * act, act  # cap 300
    f_g2, f_o2 = 0.98, 0.45 / 0.55  # cap 600
    g_spec = job("g", model="resnet18", tenant="q")
    e = engine({0.0: [Launch("g", Placement((0,))), Launch("o", opp((0,), 300))], 20.0: [Resize("o", gpu_milli=600)]})
    log = replay(e, [g_spec, JOB_O], until_s=20.0)
    assert log[-1] == "20.000 resize o milli=600"
    assert e.state.job("g").observed_rate == pytest.approx(f_g2)
    assert e.state.job("o").observed_rate == pytest.approx(f_o2)
    g_end = 20.0 + (100.0 - 20.0 * f_g1) / f_g2
    o_left = 100.0 - 20.0 * f_o1 - (g_end - 20.0) * f_o2  # alone after g finishes: full speed
    assert o_left > 0
    replay(e, [])
    assert e.state.job("g").end_s == pytest.approx(g_end)
    assert e.state.job("o").end_s == pytest.approx(g_end + o_left)
    ex = e.executor
    assert isinstance(ex, SimExecutor)
    assert ex.job_times["g"] == pytest.approx([g_end, 100.0])


def test_a_resize_supersedes_the_earlier_completion() -> None:
    # g: ResNet-50 at SM 0.9 leaves o (ResNet-18, SM 0.55) room for 0.1 / 0.55: below its activity at 300 (0.3 /
    # 0.55) and at 600 (1), so the resize leaves o's speed, and its queued completion, as they were. g's speed
    # goes from 1 - 0.02 x 0.3 / 0.55 to 1 - 0.02: its earlier completion is superseded.
    ex, sink = executor()
    g = running(job("g", model="resnet50"), Placement((0,)))
    o = running(job("o", model="resnet18", opportunistic=True), opp((0,), 300))
    ex.launch(g, 0.0)
    ex.launch(o, 0.0)
    assert sink.rates == {"g": pytest.approx(1 - 0.02 * 0.3 / 0.55), "o": pytest.approx(0.1 / 0.55)}
    first = {
        j: [e for _, e in sink.events if isinstance(e, JobFinished) and e.job_id == j and ex.is_current(e)]
        for j in ("g", "o")
    }
    resize(ex, o, opp((0,), 600, 1536), 20.0)
    assert not ex.is_current(first["g"][0])
    assert ex.is_current(first["o"][0])
    assert len(sink.ends(ex, "g")) == 1 and len(sink.ends(ex, "o")) == 1
    assert sink.rates == {"g": pytest.approx(0.98), "o": pytest.approx(0.1 / 0.55)}
    assert sink.end(ex, "g") == pytest.approx(20.0 + (100.0 - 20.0 * (1 - 0.02 * 0.3 / 0.55)) / 0.98)
    assert sink.end(ex, "o") == pytest.approx(100.0 / (0.1 / 0.55))


def test_upgrade_in_place_costs_nothing_and_runs_at_full_speed_alone() -> None:
    act = 0.3 / 0.55
    e = engine({0.0: [Launch("o", opp((0,), 300))], 10.0: [Upgrade("o", Placement((0,)))]}, perf=quiet(restore_s=30.0))
    replay(e, [JOB_O], until_s=10.0)
    assert e.state.tenant_guaranteed_milli("q") == 1000 and e.state.gpu_free_milli(0) == 0
    assert e.state.job("o").observed_rate == 1.0
    log = replay(e, [])
    assert log == ["0.000 launch o gpus=0 milli=300", "10.000 upgrade o gpus=0 milli=1000"]
    o = e.state.job("o")
    assert o.upgraded and o.job_class is JobClass.GUARANTEED and o.preemptions == 0
    assert o.end_s == pytest.approx(10.0 + (100.0 - 10.0 * act))
    ex = e.executor
    assert isinstance(ex, SimExecutor)
    assert ex.job_times["o"] == pytest.approx([o.end_s, 100.0])


def test_upgrade_onto_another_gpu_pays_the_restore_and_frees_its_neighbour() -> None:
    # Over [0, 10]: g (ResNet-50, SM 0.9) loses 0.02 x o's activity 0.3 / 0.55; o (ResNet-18, SM 0.55) runs in
    # the 0.1 g leaves idle: 0.1 / 0.55. From 10, g is alone; o restores for 30 s on GPU 1, then runs alone.
    act = 0.3 / 0.55
    f_g, f_o = 1 - 0.02 * act, 0.1 / 0.55
    e = engine(
        {0.0: [Launch("g", Placement((0,))), Launch("o", opp((0,), 300))], 10.0: [Upgrade("o", Placement((1,)))]},
        perf=quiet(restore_s=30.0),
    )
    log = replay(e, [JOB_G, JOB_O])
    assert log[-1] == "10.000 upgrade o gpus=1 milli=1000"
    g, o = e.state.job("g"), e.state.job("o")
    assert g.end_s == pytest.approx(10.0 + (100.0 - 10.0 * f_g))  # full speed from 10 on
    o_done = 10.0 * f_o
    assert o.end_s == pytest.approx(10.0 + 30.0 + (100.0 - o_done))
    assert e.state.tenant_guaranteed_milli("q") == 0  # both finished
    ex = e.executor
    assert isinstance(ex, SimExecutor)
    assert ex.job_times["o"] == pytest.approx([10.0 + 100.0 - o_done, 100.0])  # the restore is not run time
    assert ex.job_times["g"] == pytest.approx([g.end_s, 100.0])


def test_upgrade_onto_another_gpu_with_telemetry_keeps_the_measured_use_consistent() -> None:
    e = engine(
        {0.0: [Launch("g", Placement((0,))), Launch("o", opp((0,), 300))], 10.0: [Upgrade("o", Placement((1,)))]},
        telemetry=True,
    )
    replay(e, [JOB_G, JOB_O], until_s=10.0)  # replay() checks every invariant


def test_an_upgrade_to_a_packed_share_uses_the_packing_rates() -> None:
    # Two unknown models (SM 0.6). Before the upgrade b is a guest and a (packed, but not opportunistic) its
    # holder: b runs in the 0.4 a leaves idle, 0.4 / 0.6, and a loses the residual 0.02 x 1. After the upgrade
    # both are packed and run at the fallback 0.5 each (a fresh executor agrees): no priority between them.
    ex, sink = executor()
    a = running(job("a"), Placement((0,), 500))
    b = running(job("b", opportunistic=True), opp((0,), 1000))
    ex.launch(a, 0.0)
    ex.launch(b, 0.0)
    assert sink.rates == {"a": pytest.approx(0.98), "b": pytest.approx(0.4 / 0.6)}
    b.upgraded = True
    resize(ex, b, Placement((0,), 500), 10.0)
    assert (sink.rates["a"], sink.rates["b"]) == FALLBACK_RATES


# -- telemetry ---------------------------------------------------------------------------------------------------


def test_telemetry_is_modelled_for_every_rate_change() -> None:
    table = load_colocation()
    solo_50, solo_18 = 1 / table.isolated["v100"][R50], 1 / table.isolated["v100"][R18]
    ex, sink = executor(telemetry=True)
    ex.launch(running(job("g", model="resnet50"), Placement((0,))), 0.0)
    # (time, step, solo step, peak memory, mean memory, memory need, SM)
    g_alone = (0.0, solo_50, solo_50, R50_NEED_MIB, round(R50_NEED_MIB * 0.6), R50_NEED_MIB, 0.9)
    assert dataclasses.astuple(sink.last_report("g")) == pytest.approx(g_alone)
    ex.launch(running(job("o", model="resnet18", opportunistic=True), opp((0,), 1000, 1000)), 5.0)
    # o: ResNet-18 (SM 0.55) in the 0.1 that g (ResNet-50, SM 0.9) leaves idle, 0.1 / 0.55, times its spill rate
    # (1000 of its 1536 MiB in GPU memory). g: 1 - 0.02 x o's activity 1.
    f_o = 0.1 / 0.55 * spill_rate(R18_NEED_MIB, 1000, 2.0)
    f_g = 0.98
    # Its peak within its cap; the mean is the model's 0.6 of that peak; the need is what it would use uncapped.
    o_shared = (5.0, solo_18 / f_o, solo_18, 1000, 600, R18_NEED_MIB, 0.55 * f_o)
    assert dataclasses.astuple(sink.last_report("o")) == pytest.approx(o_shared)
    g_shared = (5.0, solo_50 / f_g, solo_50, R50_NEED_MIB, round(R50_NEED_MIB * 0.6), R50_NEED_MIB, 0.9 * f_g)
    assert dataclasses.astuple(sink.last_report("g")) == pytest.approx(g_shared)  # re-reported when o arrived
    assert sink.last_report("g").slowdown == pytest.approx(1 / f_g)
    assert [j for j, _ in sink.reports] == ["g", "g", "o"]  # g re-rated first, then o entered


def test_a_paused_job_reports_a_very_long_step_and_no_sm_use() -> None:
    ex, sink = executor(telemetry=True)
    ex.launch(running(job("o", model="resnet18", opportunistic=True), opp((0,), 0)), 0.0)
    t = sink.last_report("o")
    assert t.solo_step_time_s is not None
    assert t.sm_util == 0.0 and t.step_time_s == pytest.approx(t.solo_step_time_s * 1e6)


def test_no_telemetry_unless_asked() -> None:
    ex, sink = executor(telemetry=False)
    ex.launch(running(job("g", model="resnet50"), Placement((0,))), 0.0)
    ex.launch(running(job("o", model="resnet18", opportunistic=True), opp((0,), 300)), 0.0)
    assert sink.reports == [] and set(sink.rates) == {"g", "o"}


def test_the_engine_records_telemetry_and_tells_the_policy() -> None:
    e = engine({0.0: [Launch("g", Placement((0,))), Launch("o", opp((0,), 1000))]}, telemetry=True)
    replay(e, [JOB_G, JOB_O], until_s=0.0)
    g, o = e.state.job("g"), e.state.job("o")
    assert g.telemetry is not None and o.telemetry is not None
    assert e.state.gpu_sm_used(0) == round(g.telemetry.sm_util * 1000) + round(o.telemetry.sm_util * 1000)
    assert e.state.gpu_mem_used_mib(0) == R50_NEED_MIB + R18_NEED_MIB
    assert isinstance(e.policy, Scripted)
    assert sorted(set(e.policy.told)) == [(0.0, "g"), (0.0, "o")]


# -- measured use ------------------------------------------------------------------------------------------------


def test_usage_areas_integrate_sm_and_memory_in_use_by_hand() -> None:
    # a: ResNet-50 alone on GPU 0 over [0, 100]: SM 0.9, memory 9216 x 0.6 = 5529.6 MiB.
    # b: ResNet-18 alone on GPU 1 over [50, 70]: SM 0.55, memory 1536 x 0.6 = 921.6 MiB.
    ex, _ = executor()
    a = running(job("a", model="resnet50"), Placement((0,)))
    b = running(job("b", duration=20, model="resnet18"), Placement((1,)))
    ex.launch(a, 0.0)
    assert ex.usage_areas(0.0) == (0.0, 0.0)
    ex.launch(b, 50.0)
    assert ex.usage_areas(60.0) == pytest.approx((0.9 * 60 + 0.55 * 10, 5529.6 * 60 + 921.6 * 10))
    ex.finished(b, 70.0)
    ex.finished(a, 100.0)
    sm, mem = ex.usage_areas(100.0)
    assert (sm, mem) == pytest.approx((101.0, 571392.0))
    assert ex.usage_areas(500.0) == pytest.approx((sm, mem))  # nothing runs after 100
    assert list(ex.timeline_s) == [0.0, 50.0, 70.0, 100.0]
    assert list(ex.timeline_sm) == pytest.approx([0.9, 1.45, 0.9, 0.0])
    assert ex.job_times == {"a": [100.0, 100.0], "b": [20.0, 20.0]}


def test_usage_of_shared_gpus_is_capped_at_one_and_job_times_measure_the_slowdown() -> None:
    ex, _ = executor()
    # GPU 0: two opportunistic ResNet-18s (no holder: the symmetric pair), which Gavel measured at full speed
    # together: SM 0.55 + 0.55, capped at 1.
    # GPU 1: g2, a guaranteed ResNet-50 (SM 0.9), beside two guests: o2, a ResNet-50 capped at half its memory,
    # runs in the 0.1 g2 leaves idle, 0.1 / 0.9, times its spill rate 0.5; p, a paused ResNet-18, holds its
    # memory, uses no SM and slows no one. g2 loses 0.02 x o2's activity 1, times 1 - 0.02 x p's 0: 0.98. Their
    # SM, 0.9 x 0.98 + 0.9 x 0.1 / 0.9 x 0.5, stays below 1: a guest uses only its holder's idle time.
    assert gavel(R18, R18) == (1.0, 1.0)
    f_g2, f_o2 = 0.98, 0.1 / 0.9 * 0.5
    ex.launch(running(job("a", model="resnet18", opportunistic=True), opp((0,), 1000)), 0.0)
    ex.launch(running(job("g2", model="resnet50"), Placement((1,))), 0.0)
    ex.launch(running(job("b", model="resnet18", opportunistic=True), opp((0,), 1000)), 10.0)
    ex.launch(running(job("o2", model="resnet50", opportunistic=True), opp((1,), 1000, 4608)), 10.0)
    ex.launch(running(job("p", model="resnet18", opportunistic=True), opp((1,), 0)), 10.0)
    for job_id in ("a", "g2", "b", "o2", "p"):
        ex.finished(running(job(job_id), Placement((0,))), 20.0)
    sm, mem = ex.usage_areas(20.0)
    assert sm == pytest.approx((0.55 + 0.9) * 10 + (1.0 + 0.9 * f_g2 + 0.9 * f_o2) * 10)
    alone = 1536 * 0.6 + 9216 * 0.6
    shared = 1536 * 0.6 * 2 + 9216 * 0.6 + 4608 * 0.6 + 1536 * 0.6
    assert mem == pytest.approx(alone * 10 + shared * 10)
    assert ex.job_times == {
        "a": pytest.approx([20.0, 20.0]),
        "b": pytest.approx([10.0, 10.0]),
        "g2": pytest.approx([20.0, 10.0 + 10.0 * f_g2]),
        "o2": pytest.approx([10.0, 10.0 * f_o2]),
        "p": [10.0, 0.0],  # held the GPU, made no progress
    }


# -- profiles --------------------------------------------------------------------------------------------------


def test_profiles_draw_one_usage_factor_per_job_and_seed() -> None:
    factors = [usage_factor(f"j{i}", 3, 0.5) for i in range(200)]
    assert all(0.5 <= f <= 1.0 for f in factors)
    assert min(factors) < 0.6 and max(factors) > 0.9  # it does spread
    assert factors == [usage_factor(f"j{i}", 3, 0.5) for i in range(200)]  # same id and seed: same draw
    assert factors != [usage_factor(f"j{i}", 4, 0.5) for i in range(200)]
    assert usage_factor("j0", 3, 0.0) == 1.0
    spec = job("j7", model="resnet50")
    one = quiet(usage_spread=0.5, seed=3).bind(TOPO).profile(spec, 0)
    again = quiet(usage_spread=0.5, seed=3).bind(TOPO).profile(spec, 1)
    other = quiet(usage_spread=0.5, seed=4).bind(TOPO).profile(spec, 0)
    assert one == again and one != other
    u = usage_factor("j7", 3, 0.5)
    assert one.sm_util == pytest.approx(0.9 * u)
    assert one.mem_bw == pytest.approx(0.6 * u)
    assert one.mem_need_mib == round(R50_NEED_MIB * u)
    assert one.solo_step_s == pytest.approx(1 / load_colocation().isolated["v100"][R50])


def test_profile_of_a_fractional_job_and_of_a_declared_memory_need() -> None:
    bound = quiet().bind(TOPO)
    half = bound.profile(job("h", milli=500, model="resnet50"), 0)
    assert (half.sm_util, half.mem_bw, half.mem_need_mib) == (0.45, 0.3, R50_NEED_MIB // 2)
    declared = bound.profile(job("d", model="resnet50", mem=3000), 0)
    assert declared.mem_need_mib == 3000
    huge = bound.profile(job("x", model="resnet50", mem=99999), 0)
    assert huge.mem_need_mib == 16384  # within the GPU
    unknown = bound.profile(job("u"), 0)
    assert (unknown.sm_util, unknown.solo_step_s, unknown.mem_need_mib) == (0.6, DEFAULT_STEP_S, 6 * 1024)


def test_measured_pair_losses_scale_with_the_partners_usage() -> None:
    full = Profile(0.5, 4000, 0.7, 0.5, 0.2, traits("resnet50"), usage=1.0)
    half = dataclasses.replace(full, usage=0.5)
    assert measured_pair_rates((0.6, 0.8), full, full) == (0.6, 0.8)
    # a loses 0.4 beside a full-usage partner, 0.2 beside one that uses half of its model's benchmark GPU time
    assert measured_pair_rates((0.6, 0.8), full, half) == (pytest.approx(0.8), pytest.approx(0.8))
    assert measured_pair_rates((0.6, 0.8), half, full) == (pytest.approx(0.6), pytest.approx(0.9))
