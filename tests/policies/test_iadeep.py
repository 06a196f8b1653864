"""IADeep (SC'23): the interference predictor, the memory curves and the GP-LCB tuner as units, then the policy
through the simulator on hand-built cases whose outcome is worked out from Gavel's measured pairs.

Unless a case says otherwise: GPUs of the anonymous type ``gpu`` (16 GiB, speed 1.0, Gavel's V100 column); jobs
use exactly their model's catalogue profile (``usage_spread=0``) with no change of demand mid-run, so memory
needs are the catalogue's and pair rates are Gavel's (V100): ResNet-18 beside A3C runs at 1.00 and A3C at 0.75;
ResNet-50 beside A3C at 0.67 and A3C at 0.23.
"""

from __future__ import annotations

import math
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from builders import cluster, job, log, run, spans
from corral.core.decisions import Decision
from corral.core.errors import ConfigError
from corral.policies.framework.view import ClusterView
from corral.policies.iadeep.gp import GaussianProcess, cho_solve, cholesky, lcb_beta
from corral.policies.iadeep.interference import InterferencePredictor, gavel_features
from corral.policies.iadeep.policy import IADeepConfig, IADeepPolicy
from corral.policies.iadeep.tuner import GroupTuner, MemoryCurve, TunerConfig, config_grid
from corral.policies.registry import make_policy, policy_names
from corral.sim.clusters import load_cluster
from corral.sim.perf import PerfModel
from corral.sim.runner import SimulationResult, simulate
from corral.sim.traces import read_tiresias
from corral.workloads.batching import batch_curve
from corral.workloads.colocation import load_colocation
from corral.workloads.data import data_file
from corral.workloads.models import batch_mem_factor, traits
from golden import IADEEP_COLOCATIONS, SIXTY_METRICS, clusters_of

EXACT = PerfModel(usage_spread=0.0, demand_variation=0.0)
V100 = "v100"


def iadeep(**options: Any) -> IADeepPolicy:
    return IADeepPolicy(IADeepConfig(**options))


def rates(a: str, b: str) -> tuple[float, float]:
    got = load_colocation().rates(a, b, V100)
    assert got is not None
    return got


R18, R50, A3C = "ResNet-18 (batch size 64)", "ResNet-50 (batch size 64)", "A3C"


# -- the interference predictor ----------------------------------------------------------------------------------
def _predictor() -> tuple[InterferencePredictor, dict[str, Any]]:
    table = load_colocation()
    feats = gavel_features(table)
    return InterferencePredictor(table, feats), {f.job_type: f for column, f in feats if column == V100}


def test_warm_start_reproduces_gavels_pairs_and_their_stalls() -> None:
    table = load_colocation()
    predictor, f = _predictor()
    errors = []
    for (a, b), _ in table.packed[V100].items():
        measured = rates(a, b)[0]
        predicted = predictor.rate(f[a], [f[b]], "gpu", V100)
        if measured == 0.0:
            assert predicted == 0.0  # did not fit in memory together: a stall, never co-located
        else:
            errors.append((predicted - measured) ** 2)
    assert math.sqrt(sum(errors) / len(errors)) < 0.12
    assert predictor.rate(f[R18], [], "gpu", V100) == 1.0


@pytest.mark.parametrize("truth_column", ["k80", "p100"])
def test_the_predictor_improves_as_observations_arrive(truth_column: str) -> None:
    # Warm-started from Gavel's V100 column, on a cluster whose GPUs interfere as Gavel measured on another GPU:
    # the error on co-locations it never observed falls as it observes others.
    table = load_colocation()
    predictor, f = _predictor()
    pairs = [
        (a, b)
        for (a, b) in sorted(table.packed[truth_column])
        if a in f and b in f and (table.rates(a, b, truth_column) or (0, 0))[0] > 0.05 and rates(a, b)[0] > 0.05
    ]
    random.Random(0).shuffle(pairs)
    train, held_out = pairs[:300], pairs[300:]

    def truth(a: str, b: str) -> float:
        got = table.rates(a, b, truth_column)
        assert got is not None
        return got[0]

    def rmse() -> float:
        errs = [(predictor.rate(f[a], [f[b]], "cluster", V100) - truth(a, b)) ** 2 for a, b in held_out]
        return math.sqrt(sum(errs) / len(errs))

    checkpoints = [rmse()]
    for i, (a, b) in enumerate(train):
        assert predictor.observe(f[a], [f[b]], "cluster", V100, truth(a, b))
        if i % 100 == 99:
            checkpoints.append(rmse())
    assert checkpoints == sorted(checkpoints, reverse=True)  # falls at every checkpoint
    assert checkpoints[-1] < 0.6 * checkpoints[0]
    early, late = predictor.errors[:50], predictor.errors[-50:]
    assert sum(late) < sum(early)  # and so does its error on each new observation, before it learns from it


def test_a_co_location_is_learnt_once_and_a_stall_is_remembered() -> None:
    predictor, f = _predictor()
    before = predictor.rate(f[R18], [f[A3C]], "gpu", V100)
    assert predictor.observe(f[R18], [f[A3C]], "gpu", V100, 0.3, seen=("j1", ("j2", 64)))
    assert not predictor.observe(f[R18], [f[A3C]], "gpu", V100, 0.3, seen=("j1", ("j2", 64)))
    assert len(predictor.errors) == 1
    assert predictor.rate(f[R18], [f[A3C]], "gpu", V100) < before
    predictor.forget("j1")
    assert predictor.observe(f[R18], [f[A3C]], "gpu", V100, 0.3, seen=("j1", ("j2", 64)))
    assert predictor.observe(f[R50], [f[A3C]], "gpu", V100, 0.0)  # it stalled: never again
    assert predictor.rate(f[R50], [f[A3C]], "gpu", V100) == 0.0
    # Each GPU key learns on its own copy of the warm start.
    assert predictor.rate(f[R50], [f[A3C]], "other", V100) > 0.0


# -- memory curves, the GP and the tuner --------------------------------------------------------------------------
def test_memory_curve_prior_then_fitted_polynomial() -> None:
    model = traits("resnet18")
    curve = MemoryCurve(2000.0, model)
    assert curve.predict(128) == pytest.approx(2000.0 * batch_mem_factor(model, 128))
    curve.observe(64, 1500.0)  # one report: the prior's shape through it
    assert curve.predict(128) == pytest.approx(1500.0 * batch_mem_factor(model, 128))

    def quad(b: int) -> float:
        return 900.0 + 9.0 * b + 0.02 * b * b

    curve = MemoryCurve(quad(64), model, tolerance=10.0)
    for b in (16, 64, 256):
        curve.observe(b, quad(b))
    for b in (32, 128, 200):
        assert curve.predict(b) == pytest.approx(quad(b), rel=1e-6)


def test_memory_curve_drops_old_reports_when_the_footprint_changes_and_never_falls_below_a_report() -> None:
    model = traits("resnet18")
    curve = MemoryCurve(2000.0, model)
    curve.observe(64, 1000.0)
    curve.observe(128, 1000.0 * batch_mem_factor(model, 128))
    assert not curve.observe(64, 1000.0)  # the same report again: nothing changes
    assert curve.observe(64, 1040.0)  # within 10%: the same phase, the report replaced
    assert set(curve.points) == {64, 128}
    assert curve.observe(64, 1500.0)  # 50% more at the same batch size: a new phase
    assert curve.points == {64: 1500.0}
    flat = MemoryCurve(1000.0, model, tolerance=10.0)
    flat.observe(32, 1200.0)
    flat.observe(64, 900.0)  # noise: less at a larger batch
    assert flat.predict(64) >= 1200.0 and flat.predict(128) >= 1200.0


def test_cholesky_and_gp_regression() -> None:
    a = [[4.0, 2.0], [2.0, 3.0]]
    low = cholesky(a)
    x = cho_solve(low, [1.0, 2.0])
    assert [4 * x[0] + 2 * x[1], 2 * x[0] + 3 * x[1]] == pytest.approx([1.0, 2.0])
    gp = GaussianProcess(length=1.0, signal=1.0, noise=1e-6)
    assert gp.predict((0.0,)) == (0.0, 1.0)  # the prior
    gp.fit([(0.0,), (2.0,)], [1.0, -1.0])
    mean, var = gp.predict((0.0,))
    assert mean == pytest.approx(1.0, abs=1e-3) and var < 1e-3
    far_mean, far_var = gp.predict((10.0,))
    assert abs(far_mean) < 1e-6 and far_var == pytest.approx(1.0, abs=1e-6)
    assert lcb_beta(25, 1, 0.1) == pytest.approx(2 * math.log(25 * math.pi**2 / 0.6))


def test_config_grid_starts_with_the_current_configuration_and_is_cut_around_it() -> None:
    grid = config_grid([(16, 32, 64, 128, 256), (5, 10, 20, 40, 80)], (64, 20), 9)
    assert grid[0] == (64, 20) and len(grid) <= 9 and len(set(grid)) == len(grid)
    assert {b for b, _ in grid} == {32, 64, 128}
    assert config_grid([(), (8,)], (0, 8), 10) == [(0, 8)]


def test_gp_lcb_explores_then_settles_on_the_best_configuration_measured() -> None:
    # Two jobs; the true score is lowest at (32, 128), the prior believes (64, 64).
    choices = [(16, 32, 64, 128), (16, 32, 64, 128)]
    tuner = GroupTuner(("a", "b"), choices, (64, 64), (64, 64), TunerConfig(steps=12))

    def prior(c: tuple[int, ...]) -> float:
        return 2.0 + 0.1 * abs(math.log2(c[0] / 64)) + 0.1 * abs(math.log2(c[1] / 64))

    def truth(c: tuple[int, ...]) -> float:
        return 2.0 + 0.3 * abs(math.log2(c[0] / 32)) + 0.3 * abs(math.log2(c[1] / 128))

    config = (64, 64)
    tried = []
    while not tuner.done:
        tuner.record(config, truth(config), prior(config))
        tried.append(config)
        nxt = tuner.propose(prior, lambda c: True)
        assert nxt is not None
        config = nxt
    best = tuner.best(prior, lambda c: True)
    assert best == min(tried, key=truth)
    assert truth(best) < truth((64, 64))
    assert len(tried) <= 12


_FAMILIES = ["resnet18", "resnet50", "transformer", "lm", "recommendation"]


@settings(max_examples=60, deadline=None)
@given(
    models=st.lists(st.sampled_from(_FAMILIES), min_size=2, max_size=3),
    usages=st.lists(st.floats(0.3, 1.0), min_size=3, max_size=3),
    reports=st.lists(st.tuples(st.integers(0, 2), st.integers(0, 4)), max_size=6),
    gpu_gib=st.sampled_from([8, 12, 16, 24, 32, 40]),
    margin=st.integers(0, 1024),
    measured=st.lists(st.floats(0.5, 20.0), min_size=8, max_size=8),
)
def test_the_tuner_never_proposes_a_configuration_beyond_gpu_memory(
    models: list[str],
    usages: list[float],
    reports: list[tuple[int, int]],
    gpu_gib: int,
    margin: int,
    measured: list[float],
) -> None:
    """Whatever the jobs reported, every configuration the tuner proposes or settles on fits the GPU by the memory
    curves (each need plus the margin), and so by the truth the reports came from."""
    table = load_colocation()
    capacity = gpu_gib * 1024
    jobs = [traits(m) for m in models]
    curves_of = []
    for m in jobs:
        c = batch_curve(table, m, V100)
        assert c is not None
        curves_of.append(c)

    def truth(i: int, b: int) -> float:  # the simulator's memory shape: the catalogue's, times a usage factor
        return jobs[i].mem_mib * usages[i] * batch_mem_factor(jobs[i], b)

    mems = [MemoryCurve(float(m.mem_mib), m) for m in jobs]
    for i, k in reports:
        if i < len(jobs):
            sizes = curves_of[i].batch_sizes
            b = sizes[k % len(sizes)]
            mems[i].observe(b, truth(i, b))
    refs = [m.ref_batch or 1 for m in jobs]
    current = tuple(refs)
    tuner = GroupTuner(tuple(models), [c.batch_sizes for c in curves_of], current, refs, TunerConfig(steps=6))

    def fits(c: tuple[int, ...]) -> bool:
        return sum(math.ceil(mems[i].predict(b)) + margin for i, b in enumerate(c)) <= capacity

    def prior(c: tuple[int, ...]) -> float:
        return float(sum(math.log2(b) for b in c))

    config: tuple[int, ...] | None = current
    for step in range(8):
        if config is None or tuner.done:
            break
        tuner.record(config, measured[step], prior(config))
        config = tuner.propose(prior, fits)
        if config is not None:
            assert fits(config)
            assert sum(truth(i, b) for i, b in enumerate(config)) + margin * len(config) <= capacity
            for i, b in enumerate(config):  # what the job then reports is learnt, as the policy does
                mems[i].observe(b, truth(i, b))
    settled = tuner.best(prior, fits)
    if settled is not None:
        assert fits(settled)
        assert sum(truth(i, b) for i, b in enumerate(settled)) <= capacity


# -- the policy, through the simulator ---------------------------------------------------------------------------
def test_registered_with_its_options_checked() -> None:
    assert "iadeep" in policy_names()
    assert isinstance(make_policy("iadeep:max_colocate=3,tune=false"), IADeepPolicy)
    for bad, word in (("max_colocate=1", "max_colocate"), ("tune_steps=0", "steps"), ("scan_gpus=0", "scan_gpus")):
        with pytest.raises(ConfigError, match=word):
            make_policy(f"iadeep:{bad}")


def _two_residents_and_a_newcomer(policy: IADeepPolicy) -> SimulationResult:
    # ResNet-50 on GPU 0, ResNet-18 on GPU 1 (both long); an A3C job arrives when no GPU is idle.
    jobs = [
        job("r50", duration=2000, model="resnet50"),
        job("r18", duration=2000, submit=1, model="resnet18"),
        job("a3c", duration=500, submit=10, model="a3c"),
    ]
    return run(jobs, cluster(nodes=1, gpus=2), policy, perf=EXACT)


def test_interference_aware_placement_beats_naive_packing() -> None:
    aware = _two_residents_and_a_newcomer(iadeep(tune=False))
    naive = _two_residents_and_a_newcomer(iadeep(aware=False, tune=False))
    # Aware: beside ResNet-18 (A3C at 0.75, ResNet-18 unharmed at 1.00); the resident is re-seated at half a GPU
    # (a suspend/resume in place: 1 s).
    assert log(aware)[2:5] == [
        "10.000 suspend r18",
        "10.000 launch r18 gpus=1 milli=500",
        "10.000 launch a3c gpus=1 milli=500",
    ]
    a3c_rate, _ = rates(A3C, R18)
    assert spans(aware)["a3c"] == (10.0, pytest.approx(10.0 + 500.0 / a3c_rate))
    # Naive (MPS-style): the first GPU with room, beside ResNet-50, where A3C crawls at 0.23.
    assert "10.000 launch a3c gpus=0 milli=500" in log(naive)
    slow, _ = rates(A3C, R50)
    assert spans(naive)["a3c"][1] == pytest.approx(10.0 + 500.0 / slow, rel=0.01)

    def total_jct(result: SimulationResult) -> float:
        return sum(j.jct_s or 0.0 for j in result.jobs)

    assert total_jct(aware) < 0.8 * total_jct(naive)
    assert aware.summary["makespan_s"] < naive.summary["makespan_s"]


def test_a_job_waits_rather_than_join_a_gpu_where_the_pair_would_do_worse_than_taking_turns() -> None:
    # Two ResNet-50s hold both GPUs; a Recommendation job beside one would run at 0.21 and slow it to 0.59 (0.80
    # together): it waits for a GPU of its own. MPS-style, it joins at once.
    jobs = [
        job("a", duration=1000, model="resnet50"),
        job("b", duration=3000, model="resnet50"),
        job("rec", duration=500, submit=5, model="recommendation"),
    ]
    aware = run(jobs, cluster(nodes=1, gpus=2), iadeep(), perf=EXACT)
    assert spans(aware)["rec"] == (1000.0, 1500.0)
    policy = iadeep()
    run(jobs, cluster(nodes=1, gpus=2), policy, perf=EXACT)
    assert policy.counts["wait"] >= 1 and policy.counts["colocate"] == 0
    naive = run(jobs, cluster(nodes=1, gpus=2), iadeep(aware=False, tune=False), perf=EXACT)
    assert spans(naive)["rec"][0] == 5.0


def test_a_job_left_alone_gets_its_whole_gpu_back() -> None:
    jobs = [job("r18", duration=1000, model="resnet18"), job("a3c", duration=100, submit=10, model="a3c")]
    result = run(jobs, cluster(nodes=1, gpus=1), iadeep(tune=False), perf=EXACT)
    lines = log(result)
    assert lines[:4] == [
        "0.000 launch r18 gpus=0 milli=1000",
        "10.000 suspend r18",
        "10.000 launch r18 gpus=0 milli=500",
        "10.000 launch a3c gpus=0 milli=500",
    ]
    end = spans(result)["a3c"][1]
    assert end is not None
    assert f"{end:.3f} suspend r18" in lines and f"{end:.3f} launch r18 gpus=0 milli=1000" in lines
    assert result.summary["preemptions"] == 2  # the two re-seats, each a suspend/resume in place


def test_a_job_sent_back_to_the_queue_takes_a_gpu_left_idle_in_the_same_round() -> None:
    # Two GPUs. r18 takes GPU 0 and x (30 s) GPU 1; A3C arrives at 10 with no GPU idle and joins r18 (A3C at 0.75,
    # ResNet-18 unharmed). x ends at 30, leaving GPU 1 idle. At 70 the pair has been measured once (tune=false),
    # and with evict_below=2 any pair measures worse: A3C, the newest, is sent back to the queue. The round that
    # sends it back gives it the idle GPU at once (resumed from its suspension on the same node: 1 s), and r18,
    # alone, gets its whole GPU back at the next round (71). Before, A3C waited for r18 to end at 2001 beside the
    # idle GPU (no round came until then).
    jobs = [
        job("r18", duration=2000, model="resnet18"),
        job("x", duration=30, model="resnet50"),
        job("a3c", duration=500, submit=10, model="a3c"),
    ]
    policy = iadeep(tune=False, evict_below=2.0)
    result = run(jobs, cluster(nodes=1, gpus=2), policy, perf=EXACT)
    assert log(result)[2:] == [
        "10.000 suspend r18",
        "10.000 launch r18 gpus=0 milli=500",
        "10.000 launch a3c gpus=0 milli=500",
        "70.000 suspend a3c",
        "70.000 launch a3c gpus=1 milli=1000",
        "71.000 suspend r18",
        "71.000 launch r18 gpus=0 milli=1000",
    ]
    a3c_rate, _ = rates(A3C, R18)
    assert spans(result)["a3c"] == (10.0, pytest.approx(71.0 + 500.0 - 60.0 * a3c_rate))
    assert (policy.counts["evict"], policy.counts["alone"]) == (1, 3)


def test_the_tuner_searches_batch_sizes_within_memory_and_settles_on_the_best_measured() -> None:
    # ResNet-18 and LM share the only GPU for long enough to tune; memory never over-given (checked every round).
    jobs = [job("r18", duration=20000, model="resnet18"), job("lm", duration=20000, submit=10, model="lm")]
    policy = iadeep(tune_steps=5, tune_interval_s=60)
    result = run(jobs, cluster(nodes=1, gpus=1), policy, perf=EXACT)
    batches = [line for line in log(result) if " batch " in line]
    # The placement applies the prior's best configuration at once (10 s); each tuning step measures the one in
    # place and moves on; then the search settles and nothing changes until a job leaves (and the other goes
    # back to its own batch size).
    assert any(line.startswith("10.000 batch") for line in batches)
    assert 2 <= policy.counts["tune_steps"] <= 5
    ((settled_at, members, config, score),) = policy.settled
    assert set(members) == {"r18", "lm"} and settled_at <= 10.0 + 5 * 60.0 and math.isfinite(score)
    first_end = round(min(j.end_s for j in result.jobs if j.end_s is not None), 3)
    assert [line for line in batches if settled_at < float(line.split()[0]) < first_end] == []
    assert config in (policy.settled[0][2],)
    last = batches[-1].split()
    assert float(last[0]) == first_end and last[1:] in (["batch", "lm", "size=20"], ["batch", "r18", "size=64"])


def test_tuning_pays_off_against_fixed_batch_sizes() -> None:
    jobs = [
        job(f"j{i}", duration=4000 + 500 * i, submit=20 * i, model=m)
        for i, m in enumerate(["resnet18", "lm", "resnet18", "transformer", "lm", "recommendation", "resnet18", "lm"])
    ]
    c = cluster(nodes=1, gpus=4)
    tuned = run(jobs, c, iadeep(), perf=EXACT)
    fixed = run(jobs, c, iadeep(tune=False), perf=EXACT)
    assert tuned.summary["avg_jct_s"] < fixed.summary["avg_jct_s"]


class MemoryChecked(IADeepPolicy):
    """IADeepPolicy that checks, before every round, that what the jobs on each GPU truly need fits in it (a
    subclass: a compiled policy's ``schedule`` cannot be replaced on the instance)."""

    def __init__(self, config: IADeepConfig) -> None:
        super().__init__(config)
        self.rounds = 0

    def schedule(self, view: ClusterView, now_s: float) -> Decision:
        for g in range(view.topology.num_gpus):
            need = sum(t.mem_need_mib for j in view.gpu_jobs(g) if (t := view.job(j).telemetry) is not None)
            assert need <= view.topology.gpu_mem_mib[g]
        self.rounds += 1
        return super().schedule(view, now_s)


def test_co_located_jobs_never_need_more_memory_than_their_gpu_has() -> None:
    # Production-like jobs (usage below their model's benchmark) that the policy right-sizes from telemetry and
    # tunes: after every round, what the jobs on each GPU truly need fits in it.
    perf = PerfModel(usage_spread=0.5, demand_variation=0.0)
    models = ["resnet18", "lm", "resnet50", "transformer", "recommendation", "a3c", "cyclegan"]
    jobs = [job(f"j{i}", duration=3000 + 97 * i, submit=15 * i, model=models[i % 7]) for i in range(40)]
    c = cluster(nodes=2, gpus=2)
    policy = MemoryChecked(IADeepConfig(max_colocate=3))
    result = run(jobs, c, policy, perf=perf)
    assert result.summary["jobs_finished"] == 40
    assert policy.counts["colocate"] > 5 and policy.counts["batch_changes"] > 0 and policy.rounds > 40


def test_the_predictor_learns_from_the_co_locations_of_a_replay() -> None:
    jobs = [job(f"j{i}", duration=2000, submit=30 * i, model=["resnet18", "lm", "a3c"][i % 3]) for i in range(12)]
    policy = iadeep()
    run(jobs, cluster(nodes=1, gpus=2), policy, perf=PerfModel(interference_noise=0.3, seed=3))
    assert policy.predictor is not None
    assert policy.counts["observations"] == len(policy.predictor.errors) > 0


def test_determinism_same_inputs_same_decisions() -> None:
    models = ["resnet18", "lm", "resnet50", "transformer", "a3c"]
    jobs = [job(f"j{i}", duration=1500 + 50 * i, submit=10 * i, model=models[i % 5]) for i in range(25)]
    jobs += [job("gang", gpus=2, duration=300, submit=40, model="resnet50"), job("frac", milli=300, submit=50)]
    jobs.sort(key=lambda j: j.submit_s)
    c = cluster(nodes=1, gpus=3)
    perf = PerfModel(interference_noise=0.2, seed=1)
    first = run(jobs, c, iadeep(), perf=perf)
    second = run(jobs, c, iadeep(), perf=perf)
    assert log(first) == log(second)
    assert [j.end_s for j in first.jobs] == [j.end_s for j in second.jobs]
    assert first.summary["jobs_finished"] == len(jobs)


def test_gangs_and_fractional_jobs_are_never_co_located() -> None:
    jobs = [
        job("gang", gpus=2, duration=100, model="resnet50"),
        job("frac", milli=400, duration=100, submit=1, model="resnet18"),
        job("one", duration=100, submit=2, model="a3c"),
    ]
    result = run(jobs, cluster(nodes=1, gpus=3), iadeep(), perf=EXACT)
    assert log(result) == [
        "0.000 launch gang gpus=0 1 milli=1000",
        "1.000 launch frac gpus=2 milli=400",
        # No idle GPU and the only partly free one holds a fractional job: it waits.
        "100.000 launch one gpus=0 milli=1000",
    ]


# Golden figures on the Tiresias 60-job trace (default options and performance model): golden.SIXTY_METRICS and
# golden.IADEEP_COLOCATIONS.
@pytest.mark.parametrize("cluster_name", clusters_of("iadeep"))
def test_golden_metrics_on_the_tiresias_trace(cluster_name: str) -> None:
    trace = read_tiresias(data_file("tiresias", "60_job.csv"))
    policy = make_policy("iadeep")
    result = simulate(trace, load_cluster(cluster_name), policy, check_invariants=True)
    assert result.summary["jobs_finished"] == 60
    for key, value in SIXTY_METRICS[("iadeep", cluster_name)].items():
        assert result.summary[key] == pytest.approx(value, abs=1e-3), key
    assert isinstance(policy, IADeepPolicy)
    assert policy.counts["colocate"] == IADEEP_COLOCATIONS[cluster_name]
