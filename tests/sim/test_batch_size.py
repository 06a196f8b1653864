"""Batch size in the simulator's job model: the curves (throughput measured by Gavel, memory and statistical
efficiency from the catalogue), the ``SetBatchSize`` decision through the state, the engine and the simulated
executor (a new batch size changes the finish time as documented), and nothing changed for anyone who does not
use batch sizes (decision logs of the existing policies pinned from before batch sizes existed).

Times worked out by hand use one GPU of the anonymous type ``gpu`` (speed 1.0, Gavel's V100 column) and
ResNet-18, whose reference batch size is 64: at batch size ``b`` a job does ``goodput(b)`` =
``samples/s(b) / samples/s(64) x (phi + 64) / (phi + b)`` reference-batch seconds of work per second, with
Gavel's measured steps/s and the catalogue's ``phi`` = 128.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from builders import cluster, job, log, run
from corral.core.cluster import Topology
from corral.core.decisions import Action, Decision, Launch, Preempt, SetBatchSize
from corral.core.errors import InvariantViolation, JobSpecError, TraceError
from corral.core.events import Event, JobFinished
from corral.core.job import JobPhase, JobSpec
from corral.core.placement import Placement
from corral.core.status import JobStatus
from corral.core.telemetry import Telemetry
from corral.engine.clock import VirtualClock
from corral.engine.loop import Engine
from corral.engine.state import ClusterState
from corral.policies import make_policy
from corral.policies.framework.contract import BasePolicy
from corral.policies.framework.view import ClusterView
from corral.sim.clusters import load_cluster, with_quotas
from corral.sim.executor import SimExecutor
from corral.sim.perf import PerfModel
from corral.sim.runner import simulate
from corral.sim.traces import parse_columns, read_csv
from corral.sim.workload import WorkloadSpec, build_trace
from corral.workloads.batching import batch_curve, goodput_ratio, type_at_batch
from corral.workloads.colocation import load_colocation
from corral.workloads.data import data_file
from corral.workloads.models import batch_mem_factor, statistical_efficiency, traits
from golden import DECISION_DIGESTS

R18 = traits("resnet18")
QUIET = PerfModel(usage_spread=0.0, demand_variation=0.0)


def steps(batch: int, family: str = "ResNet-18", gpu: str = "v100") -> float:
    """Gavel's measured steps/s of ``family`` at ``batch`` on ``gpu``."""
    return load_colocation().isolated[gpu][f"{family} (batch size {batch})"]


def goodput(batch: int) -> float:
    """ResNet-18's documented goodput at ``batch`` relative to 64, worked out from the raw numbers."""
    samples = batch * steps(batch) / (64 * steps(64))
    return samples * (128 + 64) / (128 + batch)


# -- the curves ------------------------------------------------------------------------------------------------
def test_catalogue_reference_batch_sizes_and_families() -> None:
    assert (R18.ref_batch, R18.family) == (64, "ResNet-18")
    assert (traits("lm").ref_batch, traits("recommendation").ref_batch) == (20, 2048)
    assert (traits("vgg16").family, traits("vgg16").ref_batch) == ("ResNet-50", 64)  # its stand-in's
    assert traits("a3c").ref_batch is None and traits("unknown-model").ref_batch is None


def test_statistical_efficiency_is_pollux_form_relative_to_the_reference() -> None:
    assert statistical_efficiency(R18, 64) == 1.0
    assert statistical_efficiency(R18, None) == 1.0
    assert statistical_efficiency(R18, 128) == pytest.approx((128 + 64) / (128 + 128))
    assert statistical_efficiency(R18, 16) == pytest.approx((128 + 64) / (128 + 16))  # > 1: more per sample
    assert statistical_efficiency(traits("a3c"), 999) == 1.0  # no batch model
    effs = [statistical_efficiency(R18, b) for b in (16, 32, 64, 128, 256)]
    assert effs == sorted(effs, reverse=True)


def test_memory_grows_linearly_from_the_fixed_share() -> None:
    fixed = R18.mem_fixed_frac
    assert batch_mem_factor(R18, 64) == 1.0
    assert batch_mem_factor(R18, 128) == pytest.approx(fixed + (1 - fixed) * 2)
    assert batch_mem_factor(R18, 32) == pytest.approx(fixed + (1 - fixed) / 2)
    assert batch_mem_factor(traits("cyclegan"), 8) == 1.0


def test_throughput_curve_is_gavels_measurements_and_interpolates_between_them() -> None:
    table = load_colocation()
    curve = batch_curve(table, R18, "v100")
    assert curve is not None
    assert curve.batch_sizes == (16, 32, 64, 128, 256)
    assert curve.throughput_ratio(128) == pytest.approx(128 * steps(128) / (64 * steps(64)))
    assert curve.throughput_ratio(64) == 1.0
    # Between 64 and 128 the step time is interpolated linearly.
    mid = (1 / steps(64) + 1 / steps(128)) / 2
    assert curve.step_s(96) == pytest.approx(mid)
    # Beyond the measured range: no extrapolated gain above, no saving below.
    assert curve.samples_per_s(512) == pytest.approx(curve.samples_per_s(256))
    assert curve.step_s(8) == pytest.approx(1 / steps(16))
    assert goodput_ratio(curve, R18, 128) == pytest.approx(goodput(128))
    assert goodput_ratio(curve, R18, None) == 1.0
    assert batch_curve(table, traits("a3c"), "v100") is None  # measured at one batch size only
    assert batch_curve(table, traits("unknown-model"), "v100") is None


def test_job_type_at_a_batch_size_is_the_nearest_measured_one() -> None:
    table = load_colocation()
    assert type_at_batch(table, R18, "v100", None) == "ResNet-18 (batch size 64)"
    assert type_at_batch(table, R18, "v100", 128) == "ResNet-18 (batch size 128)"
    assert type_at_batch(table, R18, "v100", 90) == "ResNet-18 (batch size 64)"  # log distance: 64 is nearer
    assert type_at_batch(table, R18, "v100", 100) == "ResNet-18 (batch size 128)"
    assert type_at_batch(table, traits("vgg16"), "v100", 32) == "ResNet-50 (batch size 32)"
    assert type_at_batch(table, traits("a3c"), "v100", 32) == "A3C"


def test_job_spec_checks_its_batch_size() -> None:
    assert job("a", batch_size=32).batch_size == 32
    for bad in (0, -4, 2.5, True):
        with pytest.raises(JobSpecError, match="batch_size"):
            job("a", batch_size=bad)


def test_a_csv_trace_may_give_each_job_its_batch_size(tmp_path: Path) -> None:
    path = tmp_path / "jobs.csv"
    path.write_text("id,t,d,n,m,bs\na,0,10,1,resnet18,128\nb,1,10,1,resnet18,\nc,2,10,1,lm,zero\n")
    columns = parse_columns("id=id,submit=t,duration=d,gpus=n,model=m,batch_size=bs")
    with pytest.raises(TraceError) as err:
        read_csv(path, columns)
    assert (err.value.line, err.value.column) == (4, "bs")
    trace = read_csv(path, columns, skip_invalid=True)
    assert [(j.job_id, j.batch_size) for j in trace.jobs] == [("a", 128), ("b", None)]
    assert trace.skipped == Counter({"bad batch_size": 1})


def test_profile_at_a_batch_size() -> None:
    bound = QUIET.bind(Topology(cluster(nodes=1, gpus=1)))
    spec = job("a", model="resnet18")
    ref = bound.profile(spec, 0)
    big = bound.profile(spec, 0, 128)
    ratio = 128 * steps(128) / (64 * steps(64))
    assert big.solo_step_s == pytest.approx(1 / steps(128))
    assert big.mem_need_mib == round(ref.mem_need_mib * batch_mem_factor(R18, 128))
    assert big.sm_util == pytest.approx(min(1.0, ref.sm_util * ratio))
    assert big.colocation_type == "ResNet-18 (batch size 128)"
    assert bound.profile(spec, 0, 64) == ref  # the reference itself changes nothing
    assert bound.batch_rate(spec, 0, 64) == 1.0 and bound.batch_rate(spec, 0, None) == 1.0
    assert bound.batch_rate(spec, 0, 128) == pytest.approx(goodput(128))
    assert bound.batch_rate(job("u"), 0, 128) == 1.0  # no model: no batch model


def test_packed_pairs_interfere_at_gavels_rates_for_their_batch_sizes() -> None:
    table = load_colocation()
    bound = PerfModel().bind(Topology(cluster(nodes=1, gpus=1)))
    a, b = job("a", model="resnet18"), job("b", model="resnet50")
    measured = table.rates("ResNet-18 (batch size 128)", "ResNet-50 (batch size 32)", "v100")
    assert measured is not None
    assert bound.pair_rates(a, b, 0, 128, 32) == pytest.approx(measured)
    assert bound.pair_rates(a, b, 0, None, None) == bound.pair_rates(a, b, 0)  # the reference types


# -- the decision, the state and the engine --------------------------------------------------------------------
class Scripted(BasePolicy):
    """Takes exactly the actions of its script at each time (with a wake-up at the next scripted time)."""

    name = "scripted-batch"

    def __init__(self, script: Mapping[float, Sequence[Action]]) -> None:
        super().__init__()
        self.script = {t: list(actions) for t, actions in script.items()}

    def schedule(self, view: ClusterView, now_s: float) -> Decision:
        actions = self.script.pop(now_s, [])
        later = [t for t in self.script if t > now_s]
        return Decision(tuple(actions), wake_at_s=min(later) if later else None)


def test_set_batch_size_changes_the_finish_time_as_documented() -> None:
    # 100 s of work at the reference batch size; at t=20 the batch size goes to 128: 80 s of work left, done at
    # goodput(128) per second.
    script = {0.0: [Launch("a", Placement((0,)))], 20.0: [SetBatchSize("a", 128, "test")]}
    result = run([job("a", model="resnet18")], cluster(nodes=1, gpus=1), Scripted(script), perf=QUIET)
    (a,) = result.jobs
    assert a.end_s == pytest.approx(20.0 + 80.0 / goodput(128))
    assert a.batch_size == 128
    assert log(result) == ["0.000 launch a gpus=0 milli=1000", "20.000 batch a size=128"]
    # A smaller batch size: fewer samples per second, each worth more.
    script = {0.0: [Launch("b", Placement((0,)))], 20.0: [SetBatchSize("b", 16)]}
    (b,) = run([job("b", model="resnet18")], cluster(nodes=1, gpus=1), Scripted(script), perf=QUIET).jobs
    assert b.end_s == pytest.approx(20.0 + 80.0 / goodput(16))


def test_a_job_submitted_with_a_batch_size_runs_at_its_goodput_and_the_reference_changes_nothing() -> None:
    c = cluster(nodes=1, gpus=1)
    script = {0.0: [Launch("a", Placement((0,)))]}
    (a,) = run([job("a", model="resnet18", batch_size=256)], c, Scripted(script), perf=QUIET).jobs
    assert a.end_s == pytest.approx(100.0 / goodput(256))
    for spec in (job("a", model="resnet18", batch_size=64), job("a", model="resnet18")):
        (same,) = run([spec], c, Scripted({0.0: [Launch("a", Placement((0,)))]}), perf=QUIET).jobs
        assert same.end_s == 100.0


def test_a_pending_job_keeps_the_batch_size_set_before_its_launch_and_across_a_preemption() -> None:
    script = {
        0.0: [SetBatchSize("a", 128), Launch("a", Placement((0,)))],
        10.0: [Preempt("a")],
        20.0: [Launch("a", Placement((0,)))],
    }
    perf = replace(QUIET, restore_s=5.0)
    (a,) = run([job("a", model="resnet18")], cluster(nodes=1, gpus=1), Scripted(script), perf=perf).jobs
    g = goodput(128)
    assert a.end_s == pytest.approx(20.0 + 5.0 + (100.0 - 10.0 * g) / g)


def test_the_state_checks_batch_size_changes() -> None:
    s = ClusterState(Topology(cluster(nodes=1, gpus=1)))
    s.add(job("a", model="resnet18"), 0.0)
    assert s.set_batch_size("a", 32) is None  # pending: allowed
    s.launch("a", Placement((0,)), 0.0)
    assert s.set_batch_size("a", 128) == 32
    assert s.job("a").batch_size == 128 and s.job("a").spec.batch_size is None
    with pytest.raises(InvariantViolation, match="integer >= 1"):
        s.set_batch_size("a", 0)
    with pytest.raises(InvariantViolation, match="unknown job"):
        s.set_batch_size("zz", 8)
    s.finish("a", 5.0)
    with pytest.raises(InvariantViolation, match="finished"):
        s.set_batch_size("a", 8)
    assert s.job("a").batch_size == 128


@dataclass
class _NoBatchExecutor:
    """An executor without ``batch_size_changed`` (as the live one is until it sends ``SetBatchSize``)."""

    events: list[tuple[float, Event]] = field(default_factory=list)

    def bind(self, sink: object) -> None:
        pass

    def launch(self, job: JobStatus, now_s: float) -> None:
        pass

    def preempt(self, job: JobStatus, now_s: float, *, suspend: bool = False) -> float:
        return 0.0

    def resized(self, job: JobStatus, now_s: float, before: Placement) -> None:
        pass

    def finished(self, job: JobStatus, now_s: float) -> None:
        pass

    def cancel(self, job: JobStatus, now_s: float) -> None:
        pass

    def demand_changed(self, job: JobStatus, now_s: float) -> None:
        pass

    def is_current(self, event: JobFinished | object) -> bool:
        return True


def test_an_executor_without_batch_sizes_makes_the_engine_refuse_before_anything_changes() -> None:
    topo = Topology(cluster(nodes=1, gpus=1))
    state = ClusterState(topo)
    script = {0.0: [Launch("a", Placement((0,))), SetBatchSize("a", 128)]}
    engine = Engine(state, Scripted(script), _NoBatchExecutor(), VirtualClock())
    engine.submit(job("a", model="resnet18"))
    with pytest.raises(InvariantViolation, match="no batch_size_changed"):
        engine.run()
    assert state.job("a").batch_size is None  # not half-applied
    # A pending job's batch size needs no executor.
    state2 = ClusterState(topo)
    engine2 = Engine(state2, Scripted({0.0: [SetBatchSize("b", 32)]}), _NoBatchExecutor(), VirtualClock())
    engine2.submit(job("b", model="resnet18"))
    engine2.run()
    assert state2.job("b").batch_size == 32 and state2.job("b").phase is JobPhase.PENDING


@dataclass
class _Sink:
    events: list[tuple[float, Event]] = field(default_factory=list)
    rates: dict[str, float] = field(default_factory=dict)
    telemetry: dict[str, Telemetry] = field(default_factory=dict)

    def schedule(self, time_s: float, event: Event) -> None:
        self.events.append((time_s, event))

    def observe_rate(self, job_id: str, rate: float) -> None:
        self.rates[job_id] = rate

    def report(self, job_id: str, telemetry: Telemetry) -> None:
        self.telemetry[job_id] = telemetry


def test_the_executor_re_rates_a_job_and_its_packed_partner_when_a_batch_size_changes() -> None:
    table = load_colocation()
    ex = SimExecutor(Topology(cluster(nodes=1, gpus=1)), QUIET, telemetry=True)
    sink = _Sink()
    ex.bind(sink)
    a = JobStatus(spec=job("a", model="resnet18"), phase=JobPhase.RUNNING, placement=Placement((0,), 500), run_epoch=1)
    b = JobStatus(spec=job("b", model="resnet50"), phase=JobPhase.RUNNING, placement=Placement((0,), 500), run_epoch=1)
    ex.launch(a, 0.0)
    ex.launch(b, 0.0)
    ref = table.rates("ResNet-18 (batch size 64)", "ResNet-50 (batch size 64)", "v100")
    assert ref is not None and (sink.rates["a"], sink.rates["b"]) == pytest.approx(ref)
    a.batch_size_set = 32
    ex.batch_size_changed(a, 10.0, None)
    now = table.rates("ResNet-18 (batch size 32)", "ResNet-50 (batch size 64)", "v100")
    assert now is not None and (sink.rates["a"], sink.rates["b"]) == pytest.approx(now)
    # a's telemetry is at its new batch size: Gavel's solo step time there, slowed by its partner.
    tel = sink.telemetry["a"]
    assert tel.solo_step_time_s == pytest.approx(1 / steps(32))
    assert tel.step_time_s == pytest.approx(tel.solo_step_time_s / now[0])
    # a's completion: 10 s at ref[0] (reference batch), then the rest at goodput(32) x now[0].
    ends = [t for t, e in sink.events if isinstance(e, JobFinished) and e.job_id == "a" and ex.is_current(e)]
    assert ends == [pytest.approx(10.0 + (100.0 - 10.0 * ref[0]) / (goodput(32) * now[0]))]


# -- nothing changes for those who do not use batch sizes -----------------------------------------------------------
# The digests (golden.DECISION_DIGESTS) were computed with the code as it was before batch sizes existed.


def _digest(policy: str, spec: WorkloadSpec, cluster_name: str, quotas: str | None, perf: PerfModel | None) -> str:
    p = make_policy(policy)
    if p.needs_models and spec.model_mix is None:
        spec = replace(spec, model_mix="default")
    trace = build_trace(spec)
    c = load_cluster(cluster_name)
    if quotas:
        c = with_quotas(c, quotas, sorted({j.tenant for j in trace.jobs}))
    result = simulate(trace, c, p, perf=perf, record_decisions=True)
    assert result.decision_log is not None
    h = hashlib.sha256()
    for entry in result.decision_log:
        h.update(entry.render().encode())
        h.update(b"\n")
    for j in result.jobs:
        h.update(f"{j.job_id} {j.end_s!r} {j.work_done_s!r}\n".encode())
    return h.hexdigest()[:16]


@pytest.mark.parametrize("case", sorted(DECISION_DIGESTS))
def test_existing_policies_decide_exactly_as_before_batch_sizes(case: str) -> None:
    trace_name, policy = case.split("/", 1)
    perf = None
    if policy.endswith("+noise"):
        policy = policy.removesuffix("+noise")
        perf = PerfModel(interference_noise=0.3, seed=7)
    if trace_name == "sixty":
        spec = WorkloadSpec(fmt="tiresias", path=str(data_file("tiresias", "60_job.csv")))
        digest = _digest(policy, spec, "2x4", None, perf)
    else:
        path = str(data_file("alibaba-openb", "openb_pod_list_default.csv"))
        spec = WorkloadSpec(fmt="openb", path=path, scale_load=8, limit=400, assign_tenants=2)
        digest = _digest(policy, spec, "4x8:V100-16GB", "equal:1.0", perf)
    assert digest == DECISION_DIGESTS[case]


def test_specs_without_batch_sizes_and_at_the_reference_give_identical_replays() -> None:
    jobs: list[JobSpec] = [job(f"j{i}", model="resnet18", submit=i, duration=50 + 10 * i) for i in range(6)]
    at_ref = [replace(j, batch_size=64) for j in jobs]
    c = cluster(nodes=1, gpus=2)
    plain = run(jobs, c, make_policy("gandiva"))
    same = run(at_ref, c, make_policy("gandiva"))
    assert log(plain) == log(same)
    assert [j.end_s for j in plain.jobs] == [j.end_s for j in same.jobs]
