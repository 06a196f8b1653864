"""The simulated executor and the performance model with packed jobs: interference rates from the co-location
table, seeded noise, re-predicted completions, observed rates and start-up costs, driven directly (no engine)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from builders import cluster, job
from corral.core.cluster import Topology
from corral.core.errors import ConfigError
from corral.core.events import Event, JobFinished
from corral.core.job import JobPhase, JobSpec
from corral.core.placement import Placement
from corral.core.status import JobStatus
from corral.core.telemetry import Telemetry
from corral.sim.executor import SimExecutor
from corral.sim.perf import PerfModel
from corral.workloads.colocation import load_colocation

R18 = "ResNet-18 (batch size 64)"
R50 = "ResNet-50 (batch size 64)"
TOPO = Topology(cluster(nodes=2, gpus=2))


@dataclass
class Sink:
    events: list[tuple[float, Event]] = field(default_factory=list)
    rates: dict[str, float] = field(default_factory=dict)

    def schedule(self, time_s: float, event: Event) -> None:
        self.events.append((time_s, event))

    def observe_rate(self, job_id: str, rate: float) -> None:
        self.rates[job_id] = rate

    def report(self, job_id: str, telemetry: Telemetry) -> None:
        pass  # these tests run without telemetry

    def current_end(self, executor: SimExecutor, job_id: str) -> float:
        """The time of the job's one completion the executor still stands by."""
        current = [
            t for t, e in self.events if isinstance(e, JobFinished) and e.job_id == job_id and executor.is_current(e)
        ]
        assert len(current) == 1
        return current[0]


def started(spec: JobSpec, gpus: tuple[int, ...], milli: int = 1000, epoch: int = 1) -> JobStatus:
    return JobStatus(spec=spec, phase=JobPhase.RUNNING, placement=Placement(gpus, milli), run_epoch=epoch)


def executor(perf: PerfModel | None = None) -> tuple[SimExecutor, Sink]:
    ex = SimExecutor(TOPO, perf or PerfModel())
    sink = Sink()
    ex.bind(sink)
    return ex, sink


def rates() -> tuple[float, float]:
    r50, r18 = load_colocation().rates(R50, R18, "v100") or (0.0, 0.0)
    return r50, r18


def test_a_job_alone_reports_full_speed_and_one_completion() -> None:
    ex, sink = executor()
    ex.launch(started(job("a", duration=100), (0,)), 0.0)
    assert sink.rates == {"a": 1.0}
    assert sink.current_end(ex, "a") == 100.0


def test_packed_pairs_slow_each_other_and_are_re_predicted_when_one_leaves() -> None:
    r50, r18 = rates()
    ex, sink = executor()
    a = started(job("a", duration=100, model="resnet50"), (0,), 500)
    b = started(job("b", duration=100, model="googlenet"), (0,), 500)
    ex.launch(a, 0.0)
    assert sink.current_end(ex, "a") == 100.0  # nobody beside it yet
    ex.launch(b, 10.0)
    assert sink.rates == {"a": pytest.approx(r50), "b": pytest.approx(r18)}
    a_end = 10.0 + 90.0 / r50
    assert sink.current_end(ex, "a") == pytest.approx(a_end)  # the t=100 prediction is no longer current
    assert sink.current_end(ex, "b") == pytest.approx(10.0 + 100.0 / r18)
    # b is preempted at 20: it did 10 s at r18; a speeds back up.
    done = ex.preempt(b, 20.0, suspend=True)
    assert done == pytest.approx(10.0 * r18)
    assert sink.rates["a"] == 1.0
    a_done = 10.0 + 10.0 * r50
    assert sink.current_end(ex, "a") == pytest.approx(20.0 + 100.0 - a_done)


def test_unpacked_jobs_on_other_gpus_are_not_affected() -> None:
    ex, sink = executor()
    ex.launch(started(job("a", duration=100, model="resnet50"), (0,), 500), 0.0)
    ex.launch(started(job("c", duration=100, model="googlenet"), (1,)), 0.0)  # whole share, another GPU
    ex.launch(started(job("d", duration=100, model="googlenet"), (2,), 500), 0.0)  # packed, another GPU
    assert sink.rates == {"a": 1.0, "c": 1.0, "d": 1.0}


def test_a_gang_goes_at_its_slowest_gpu_and_three_jobs_multiply_their_pair_rates() -> None:
    table = load_colocation()
    r50_18, _ = table.rates(R50, R18, "v100") or (0.0, 0.0)
    r50_50, _ = table.rates(R50, R50, "v100") or (0.0, 0.0)
    ex, sink = executor()
    ex.launch(started(job("g", gpus=2, duration=100, model="resnet50"), (0, 1), 300), 0.0)
    ex.launch(started(job("x", duration=100, model="googlenet"), (0,), 300), 0.0)
    assert sink.rates["g"] == pytest.approx(r50_18)
    ex.launch(started(job("y", duration=100, model="resnet50"), (1,), 300), 0.0)
    assert sink.rates["g"] == pytest.approx(min(r50_18, r50_50))
    ex.launch(started(job("z", duration=100, model="resnet50"), (0,), 300), 0.0)
    assert sink.rates["g"] == pytest.approx(min(r50_18 * r50_50, r50_50))


def test_a_pair_that_does_not_fit_makes_no_progress_until_it_is_split() -> None:
    # ResNet-50 and CycleGAN on a K80 measured [0, 0] (out of memory): no completion is predicted for either.
    topo = Topology(cluster(nodes=1, gpus=1, types=["K80"], speed={"K80": 1.0}))
    ex = SimExecutor(topo)
    sink = Sink()
    ex.bind(sink)
    a = started(job("a", duration=10, model="resnet50"), (0,), 500)
    ex.launch(a, 0.0)
    ex.launch(started(job("b", duration=10, model="cyclegan"), (0,), 500), 0.0)
    assert sink.rates == {"a": 0.0, "b": 0.0}
    assert not any(ex.is_current(e) for _, e in sink.events if isinstance(e, JobFinished))
    ex.preempt(a, 5.0)
    assert sink.current_end(ex, "b") == 15.0


@pytest.mark.parametrize(
    ("suspended_from", "gpus", "cost"),
    [((0,), (0,), 2.0), ((0,), (1,), 2.0), ((0,), (2,), 30.0), (None, (0,), 30.0)],
)
def test_start_up_cost_of_a_restart(suspended_from: tuple[int, ...] | None, gpus: tuple[int, ...], cost: float) -> None:
    ex, sink = executor(PerfModel(restore_s=30.0, suspend_resume_s=2.0))
    status = started(job("a", duration=100), gpus, epoch=2)
    status.preemptions = 1
    status.work_done_s = 40.0
    status.suspended_from = Placement(suspended_from) if suspended_from else None
    ex.launch(status, 100.0)
    assert sink.current_end(ex, "a") == 100.0 + cost + 60.0


def test_noise_is_seeded_per_pair_and_bounded() -> None:
    perf = PerfModel(interference_noise=0.3, seed=7).bind(TOPO)
    again = PerfModel(interference_noise=0.3, seed=7).bind(TOPO)
    other = PerfModel(interference_noise=0.3, seed=8).bind(TOPO)
    factors = [perf.noise_factor(f"j{i}", f"k{i}") for i in range(200)]
    assert all(0.7 <= f <= 1.3 for f in factors)
    assert min(factors) < 0.8 and max(factors) > 1.2  # it does spread
    assert factors == [again.noise_factor(f"k{i}", f"j{i}") for i in range(200)]  # same seed, either order
    assert factors != [other.noise_factor(f"j{i}", f"k{i}") for i in range(200)]
    assert PerfModel().bind(TOPO).noise_factor("a", "b") == 1.0


def test_noisy_rates_are_the_table_times_the_factor_capped_at_one() -> None:
    r50, r18 = rates()
    a, b = job("a", model="resnet50"), job("b", model="googlenet")
    for seed in range(20):
        perf = PerfModel(interference_noise=0.5, seed=seed).bind(TOPO)
        f = perf.noise_factor("a", "b")
        assert perf.pair_rates(a, b, 0) == (pytest.approx(min(1.0, r50 * f)), pytest.approx(min(1.0, r18 * f)))
    assert PerfModel().bind(TOPO).pair_rates(a, b, 0) == (r50, r18)


@pytest.mark.parametrize(
    ("field_name", "value"),
    [
        ("suspend_resume_s", -1.0),
        ("suspend_resume_s", float("inf")),
        ("interference_noise", 1.0),
        ("interference_noise", -0.1),
    ],
)
def test_bad_perf_options(field_name: str, value: float) -> None:
    with pytest.raises(ConfigError, match=field_name):
        PerfModel(**{field_name: value})
