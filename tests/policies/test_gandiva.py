"""Gandiva end to end, through the simulator: each rule pinned by a hand-built scenario whose times are worked
out by hand, then golden metrics on the Tiresias 60-job trace.

Unless a case says otherwise: one GPU type (the anonymous ``gpu``, which reads Gavel's V100 column), speed 1.0,
one rack; restore (checkpoint + restore elsewhere) 30 s, suspend/resume on the same node 2 s. Jobs without a
model are never packed (their co-location rates fall back to 0.5 + 0.5: no gain).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from builders import cluster, job, log, run, spans
from corral.core.cluster import Topology
from corral.core.errors import ConfigError
from corral.core.job import JobSpec
from corral.core.status import JobStatus
from corral.policies import gandiva as gandiva_module
from corral.policies.gandiva import GandivaConfig, GandivaPolicy
from corral.policies.registry import make_policy, policy_class, policy_names
from corral.sim.clusters import load_cluster
from corral.sim.executor import SimExecutor
from corral.sim.perf import PerfModel
from corral.sim.runner import simulate
from corral.sim.traces import read_tiresias
from corral.workloads.colocation import load_colocation
from corral.workloads.data import data_file
from golden import GANDIVA_COUNTS, SIXTY_METRICS, clusters_of

PERF = PerfModel(restore_s=30.0, suspend_resume_s=2.0)
R18 = "ResNet-18 (batch size 64)"  # googlenet's stand-in
R50 = "ResNet-50 (batch size 64)"  # resnet50 itself, and vgg16's stand-in


def gandiva(**options: Any) -> GandivaPolicy:
    return GandivaPolicy(GandivaConfig(**options))


def _no_job_movable(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every run is marked not movable once launched, as the live controller marks a run until it says it
    checkpoints (the simulator's jobs are all movable)."""
    launch = SimExecutor.launch

    def unmovable(self: SimExecutor, job: JobStatus, now_s: float) -> None:
        launch(self, job, now_s)
        job.movable = False

    monkeypatch.setattr(SimExecutor, "launch", unmovable)


# -- time-slicing ---------------------------------------------------------------------------------------------
def test_time_slices_rotate_jobs_of_one_size_and_each_resume_costs_suspend_resume() -> None:
    # One GPU, two 100-s jobs. a runs 0-60; its quantum is over and b waits: a is suspended, b runs 60-120;
    # then a resumes where it was suspended (2 s), has 40 s left: 120 + 2 + 40 = 162; b resumes at 162 and
    # has 40 s left: 162 + 2 + 40 = 204.
    result = run([job("a"), job("b")], cluster(nodes=1, gpus=1), gandiva(), perf=PERF)
    assert log(result) == [
        "0.000 launch a gpus=0 milli=1000",
        "60.000 suspend a",
        "60.000 launch b gpus=0 milli=1000",
        "120.000 suspend b",
        "120.000 launch a gpus=0 milli=1000",
        "162.000 launch b gpus=0 milli=1000",
    ]
    assert spans(result) == {"a": (0.0, 162.0), "b": (60.0, 204.0)}
    assert {j.job_id: j.preemptions for j in result.jobs} == {"a": 1, "b": 1}


def test_a_job_resumed_on_another_node_pays_a_restore() -> None:
    # Two nodes of one GPU. a -> node 0, b -> node 1, c waits. At 60 a's quantum is over (a and b both started
    # at 0; a comes first): c takes node 0. At 100 b ends and a, waiting, gets node 1: its state is in node 0's
    # host memory, so it pays the full restore: 100 + 30 + 40 = 170. c keeps node 0 (nobody waits): 60-160.
    jobs = [job("a"), job("b"), job("c")]
    result = run(jobs, cluster(nodes=2, gpus=1), gandiva(), perf=PERF)
    assert log(result) == [
        "0.000 launch a gpus=0 milli=1000",
        "0.000 launch b gpus=1 milli=1000",
        "60.000 suspend a",
        "60.000 launch c gpus=0 milli=1000",
        "100.000 launch a gpus=1 milli=1000",
    ]
    assert spans(result) == {"a": (0.0, 170.0), "b": (0.0, 100.0), "c": (60.0, 160.0)}


def test_a_job_that_cannot_move_resumes_only_where_it_was_suspended(monkeypatch: pytest.MonkeyPatch) -> None:
    # As above, but no job is movable (live: processes that do not checkpoint; a move would restart them from the
    # beginning). At 100 b ends and node 1 is free, but a's state is in node 0's GPU process: a waits for node 0,
    # which c holds until its quantum is over at 120. c then waits for node 0 in turn (120 + 2 + 40 = 162 for
    # a; c has 40 s left: 162 + 2 + 40 = 204). Nothing is ever launched on node 1 again.
    _no_job_movable(monkeypatch)
    result = run([job("a"), job("b"), job("c")], cluster(nodes=2, gpus=1), gandiva(), perf=PERF)
    assert log(result) == [
        "0.000 launch a gpus=0 milli=1000",
        "0.000 launch b gpus=1 milli=1000",
        "60.000 suspend a",
        "60.000 launch c gpus=0 milli=1000",
        "120.000 suspend c",
        "120.000 launch a gpus=0 milli=1000",
        "162.000 launch c gpus=0 milli=1000",
    ]
    assert spans(result) == {"a": (0.0, 162.0), "b": (0.0, 100.0), "c": (60.0, 204.0)}


def test_a_job_suspended_for_one_needing_its_gpu_type_moves_to_idle_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    # Node 0: one GPU of type A; node 1: one of type B. x (A only) holds node 0 until 30, so a (any type) starts on
    # node 1. b (B only) arrives at 40 and waits. At 60 a's quantum is over: b takes a's GPU, and a, which may run
    # on A, is suspended and resumed at once on the GPU x left idle (a migration: another node, so a restore:
    # 60 + 30 + 40 = 130). Before, it waited beside that GPU until the next round, at 120 (b's quantum over), and
    # paid the same restore there: 190.
    c = cluster(gpus=[1, 1], types=["A", "B"])
    jobs = [job("x", duration=30, types=("A",)), job("a"), job("b", submit=40, types=("B",))]
    policy = gandiva()
    result = run(jobs, c, policy, perf=PERF)
    assert log(result) == [
        "0.000 launch x gpus=0 milli=1000",
        "0.000 launch a gpus=1 milli=1000",
        "60.000 suspend a",
        "60.000 launch b gpus=1 milli=1000",
        "60.000 launch a gpus=0 milli=1000",
    ]
    assert spans(result) == {"x": (0.0, 30.0), "a": (0.0, 130.0), "b": (60.0, 160.0)}
    assert (policy.counts["suspend"], policy.counts["migrate"]) == (1, 1)
    # A job that cannot move (its state stays on node 1) stays suspended: it waits for node 1, takes it back when
    # b's quantum ends at 120 (120 + 2 + 40 = 162), and b resumes there after it (162 + 2 + 40 = 204).
    _no_job_movable(monkeypatch)
    result = run(jobs, c, gandiva(), perf=PERF)
    assert log(result)[2:] == [
        "60.000 suspend a",
        "60.000 launch b gpus=1 milli=1000",
        "120.000 suspend b",
        "120.000 launch a gpus=1 milli=1000",
        "162.000 launch b gpus=1 milli=1000",
    ]
    assert spans(result) == {"x": (0.0, 30.0), "a": (0.0, 162.0), "b": (60.0, 204.0)}


def test_running_jobs_that_cannot_move_are_not_migrated(monkeypatch: pytest.MonkeyPatch) -> None:
    # The defragmentation case below with no job movable: moving e and f would restart them from the beginning,
    # so the gang runs spread, as without migration.
    _no_job_movable(monkeypatch)
    result = run(defrag_jobs(), cluster(nodes=2, gpus=4), gandiva(), perf=PERF)
    assert log(result)[6:] == ["20.000 launch g gpus=1 2 6 7 milli=1000"]
    assert spans(result)["g"] == (20.0, 145.0)


def test_only_jobs_of_the_same_size_share_by_time_slices() -> None:
    # Two GPUs: a (2 GPUs) holds both; b (1 GPU) waits for it to end, however long: no quantum applies.
    result = run([job("a", gpus=2, duration=500), job("b", submit=1)], cluster(nodes=1, gpus=2), gandiva(), perf=PERF)
    assert spans(result) == {"a": (0.0, 500.0), "b": (500.0, 600.0)}
    assert result.summary["preemptions"] == 0


def test_without_time_slicing_jobs_run_to_completion() -> None:
    result = run([job("a"), job("b")], cluster(nodes=1, gpus=1), gandiva(time_slicing=False), perf=PERF)
    assert spans(result) == {"a": (0.0, 100.0), "b": (100.0, 200.0)}


# -- packing --------------------------------------------------------------------------------------------------
def test_a_pair_predicted_to_gain_is_packed_and_reseated_when_its_partner_ends() -> None:
    # One GPU. a (resnet50) runs alone 0-10 (10 s done). b (googlenet, i.e. ResNet-18) arrives: Gavel measured
    # the pair on a V100 at r50 + r18 = 0.81 + 0.52 > 1.1, so they are packed at half a GPU each. a is re-seated
    # at half share (suspend + resume in place: 2 s), b starts at once. a needs 90 s of work at r50; then b,
    # alone again, is re-seated at a whole share (2 s) and finishes what is left.
    r50, r18 = load_colocation().rates(R50, R18, "v100") or (0.0, 0.0)
    a_end = 12.0 + 90.0 / r50
    b_done = (a_end - 10.0) * r18
    b_end = a_end + 2.0 + (100.0 - b_done)
    jobs = [job("a", model="resnet50"), job("b", model="googlenet", submit=10)]
    policy = gandiva()
    result = run(jobs, cluster(nodes=1, gpus=1), policy, perf=PERF)
    assert log(result) == [
        "0.000 launch a gpus=0 milli=1000",
        "10.000 suspend a",
        "10.000 launch a gpus=0 milli=500",
        "10.000 launch b gpus=0 milli=500",
        f"{a_end:.3f} suspend b",
        f"{a_end:.3f} launch b gpus=0 milli=1000",
    ]
    assert spans(result)["a"] == (0.0, pytest.approx(a_end))
    assert spans(result)["b"] == (10.0, pytest.approx(b_end))
    assert policy.counts["pack"] == 1 and policy.counts["unpack"] == 0 and policy.counts["reseat"] == 1
    # Packed, the pair beat taking turns: b ended earlier than a time-sliced run of the same two jobs.
    sliced = run(jobs, cluster(nodes=1, gpus=1), gandiva(packing=False), perf=PERF)
    sliced_b_end = spans(sliced)["b"][1]
    assert sliced_b_end is not None and b_end < sliced_b_end


@pytest.mark.parametrize("model", ["resnet50", "vgg16", None])
def test_packing_is_refused_when_the_pair_would_interfere(model: str | None) -> None:
    # Two ResNet-50s (vgg16 stands in as ResNet-50) on a V100 run at 0.5 + 0.5 packed: no better than taking
    # turns, so b waits and the two time-slice (as do jobs without a model). No launch at half a GPU.
    jobs = [job("a", model="resnet50"), job("b", model=model, submit=10)]
    result = run(jobs, cluster(nodes=1, gpus=1), gandiva(), perf=PERF)
    assert log(result)[:3] == [
        "0.000 launch a gpus=0 milli=1000",
        "60.000 suspend a",
        "60.000 launch b gpus=0 milli=1000",
    ]
    assert not any("milli=500" in line for line in log(result))


def test_observed_interference_unpacks_the_pair_for_good() -> None:
    # The simulator's truth differs from the table by a per-pair factor: with noise 0.5 and seed 4 this pair's
    # factor is 0.63, so the pair the table predicts at 1.33 really runs at 0.84 < 1 (worse than taking turns).
    perf = PerfModel(restore_s=30.0, suspend_resume_s=2.0, interference_noise=0.5, seed=4)
    factor = perf.bind(Topology(cluster(nodes=1, gpus=1))).noise_factor("a", "b")
    r50, r18 = load_colocation().rates(R50, R18, "v100") or (0.0, 0.0)
    assert (r50 + r18) * factor < 1.0 < r50 + r18
    jobs = [job("a", model="resnet50"), job("b", model="googlenet", submit=10)]
    policy = gandiva()
    result = run(jobs, cluster(nodes=1, gpus=1), policy, perf=perf)
    # Packed at 10; judged introspect_s (60 s) later from the observed rates: b, which joined last, is
    # suspended back to the queue and a re-seated at a whole share. Then the two take turns (a's slice ends at
    # 130, when b reclaims the GPU it left) and are never packed again.
    lines = log(result)
    assert lines[:7] == [
        "0.000 launch a gpus=0 milli=1000",
        "10.000 suspend a",
        "10.000 launch a gpus=0 milli=500",
        "10.000 launch b gpus=0 milli=500",
        "70.000 suspend b",
        "70.000 suspend a",
        "70.000 launch a gpus=0 milli=1000",
    ]
    assert lines[7:9] == ["130.000 suspend a", "130.000 launch b gpus=0 milli=1000"]
    assert sum("milli=500" in line for line in lines) == 2
    assert policy.counts["unpack"] == 1
    # With the table as the truth (no noise) the same pair stays packed.
    kept = gandiva()
    run(jobs, cluster(nodes=1, gpus=1), kept, perf=PERF)
    assert kept.counts["unpack"] == 0


def test_a_lone_packed_job_takes_a_new_partner_from_the_queue() -> None:
    # a (resnet50, 50 s) and b (googlenet, 1000 s) pack at 1; a is re-seated (2 s) with 49 s of work left.
    # c (googlenet) waits. When a ends, the open half of the GPU goes to c, without touching b: two ResNet-18s
    # on a V100 are measured at full speed each (1.0 + 1.0). When b ends, c is alone and re-seated (2 s).
    table = load_colocation()
    r50, r18 = table.rates(R50, R18, "v100") or (0.0, 0.0)
    assert table.rates(R18, R18, "v100") == (1.0, 1.0)
    a_end = 3.0 + 49.0 / r50
    b_end = a_end + (1000.0 - (a_end - 1.0) * r18)
    c_end = b_end + 2.0 + (1000.0 - (b_end - a_end))
    jobs = [
        job("a", model="resnet50", duration=50),
        job("b", model="googlenet", duration=1000, submit=1),
        job("c", model="googlenet", duration=1000, submit=2),
    ]
    policy = gandiva()
    result = run(jobs, cluster(nodes=1, gpus=1), policy, perf=PERF)
    assert log(result) == [
        "0.000 launch a gpus=0 milli=1000",
        "1.000 suspend a",
        "1.000 launch a gpus=0 milli=500",
        "1.000 launch b gpus=0 milli=500",
        f"{a_end:.3f} launch c gpus=0 milli=500",
        f"{b_end:.3f} suspend c",
        f"{b_end:.3f} launch c gpus=0 milli=1000",
    ]
    assert spans(result) == {
        "a": (0.0, pytest.approx(a_end)),
        "b": (1.0, pytest.approx(b_end)),
        "c": (pytest.approx(a_end), pytest.approx(c_end)),
    }
    assert policy.counts == {"suspend": 0, "pack": 2, "unpack": 0, "reseat": 1, "migrate": 0}


# -- migration ------------------------------------------------------------------------------------------------
def defrag_jobs() -> list[JobSpec]:
    # Two nodes of 4. a-d fill node 0 (best fit), e and f go to node 1; b and c end at 10, leaving two GPUs
    # free on each node. g (4 GPUs) arrives at 20.
    return [job(j, duration=1000 if j in "adef" else 10) for j in "abcdef"] + [job("g", gpus=4, submit=20)]


def test_migration_frees_a_consolidated_node_for_a_waiting_gang() -> None:
    # e and f move to node 0's free GPUs (a restore each: 20 + 30 + 980 = 1030) so that g gets node 1 whole
    # and runs at full speed: 20-120.
    result = run(defrag_jobs(), cluster(nodes=2, gpus=4), gandiva(), perf=PERF)
    assert log(result)[6:] == [
        "20.000 preempt e",
        "20.000 launch e gpus=1 milli=1000",
        "20.000 preempt f",
        "20.000 launch f gpus=2 milli=1000",
        "20.000 launch g gpus=4 5 6 7 milli=1000",
    ]
    assert spans(result) == {
        "a": (0.0, 1000.0),
        "b": (0.0, 10.0),
        "c": (0.0, 10.0),
        "d": (0.0, 1000.0),
        "e": (0.0, 1030.0),
        "f": (0.0, 1030.0),
        "g": (20.0, 120.0),
    }


def test_without_migration_the_gang_runs_spread_and_slower() -> None:
    # g takes two GPUs on each node: spread, at 0.8 (no model): 20 + 100 / 0.8 = 145.
    result = run(defrag_jobs(), cluster(nodes=2, gpus=4), gandiva(migration=False), perf=PERF)
    assert log(result)[6:] == ["20.000 launch g gpus=1 2 6 7 milli=1000"]
    assert spans(result)["g"] == (20.0, 145.0)


@pytest.mark.parametrize(("migration", "z_end"), [(True, 1058.0), (False, 1260.0)])
def test_migration_consolidates_a_spread_job_when_room_frees(migration: bool, z_end: float) -> None:
    # x (3 GPUs) on node 0, y (3 GPUs) on node 1; z (2 GPUs) at 10 can only be spread (GPUs 3 and 7: nothing
    # single-GPU to move away). At 100 x ends: z moves to node 0 (restore 30 s). Spread it did 90 s x 0.8 = 72:
    # 100 + 30 + 928 = 1058. Without migration it stays spread: 10 + 1000 / 0.8 = 1260.
    jobs = [job("x", gpus=3), job("y", gpus=3, duration=1000), job("z", gpus=2, duration=1000, submit=10)]
    result = run(jobs, cluster(nodes=2, gpus=4), gandiva(migration=migration), perf=PERF)
    expected = [
        "0.000 launch x gpus=0 1 2 milli=1000",
        "0.000 launch y gpus=4 5 6 milli=1000",
        "10.000 launch z gpus=3 7 milli=1000",
    ]
    if migration:
        expected += ["100.000 preempt z", "100.000 launch z gpus=0 1 milli=1000"]
    assert log(result) == expected
    assert spans(result)["z"] == (10.0, z_end)


# -- the policy's contract ------------------------------------------------------------------------------------
def test_registered_with_models_and_options() -> None:
    assert "gandiva" in policy_names()
    cls = policy_class("gandiva")
    assert cls is GandivaPolicy and cls.needs_models
    policy = make_policy("gandiva:quantum_s=30,packing=false,reserve_after_s=600")
    assert isinstance(policy.config, GandivaConfig)
    assert (policy.config.quantum_s, policy.config.packing, policy.config.reserve_after_s) == (30.0, False, 600.0)


@pytest.mark.parametrize(
    "options", ["quantum_s=0", "introspect_s=-1", "pack_threshold=1.5", "max_migrations=-1", "reserve_after_s=-5"]
)
def test_bad_options_are_config_errors(options: str) -> None:
    with pytest.raises(ConfigError, match="gandiva"):
        make_policy(f"gandiva:{options}")


def test_the_policy_never_reads_durations() -> None:
    # Gandiva does not know how long jobs run (OSDI'18 §4): nothing in the module touches spec.duration_s.
    # (Its source file, not inspect.getsource: a compiled module, setup.py, has none to inspect.)
    assert "duration_s" not in Path(gandiva_module.__file__).with_name("gandiva.py").read_text()


def test_the_reservation_stops_backfilling_past_a_job_that_waited_too_long() -> None:
    # Two GPUs. a holds one until 1000. big (2 GPUs) waits from 1. A small job arrives every 150 s, each as
    # the one before ends. With backfilling each takes the free GPU: s6 runs 902-1052, so big starts at 1052.
    # With reserve_after_s=100, s0 (at 2) is let past, but from 152 on big has waited long enough: the free GPU
    # is kept for it, and big starts when a ends, at 1000.
    jobs = [job("a", duration=1000), job("big", gpus=2, submit=1)]
    jobs += [job(f"s{i}", duration=150, submit=2 + 150 * i) for i in range(8)]
    free = run(jobs, cluster(nodes=1, gpus=2), gandiva(time_slicing=False), perf=PERF)
    held = run(jobs, cluster(nodes=1, gpus=2), gandiva(time_slicing=False, reserve_after_s=100.0), perf=PERF)
    assert spans(free)["big"][0] == 1052.0
    assert spans(held)["big"][0] == 1000.0
    assert spans(held)["s0"] == (2.0, 152.0) and spans(held)["s1"][0] == 1100.0  # after big (100 s)


# -- golden metrics on the Tiresias 60-job trace (golden.SIXTY_METRICS, golden.GANDIVA_COUNTS) ---------------------
@pytest.mark.parametrize("cluster_name", clusters_of("gandiva"))
def test_golden_metrics_on_the_tiresias_trace(cluster_name: str) -> None:
    trace = read_tiresias(data_file("tiresias", "60_job.csv"))
    policy = make_policy("gandiva")
    result = simulate(trace, load_cluster(cluster_name), policy, check_invariants=True)
    assert result.summary["jobs_finished"] == 60
    assert result.summary["jobs_rejected"] == 0
    for key, value in SIXTY_METRICS[("gandiva", cluster_name)].items():
        assert result.summary[key] == pytest.approx(value, abs=1e-3), key
    assert isinstance(policy, GandivaPolicy)
    expected = GANDIVA_COUNTS[cluster_name]
    assert {k: v for k, v in policy.counts.items() if v} == {k: v for k, v in expected.items() if v}


def test_time_slices_keep_turning_where_float_rounding_bites() -> None:
    # Near 2^23 s, (start + 60) - 60 < start: the wake-up at start + 60 found the slice not due and set no later
    # one, so b waited for a's end (1,000 s) instead of its 60 s turn.
    start = 8388588.9140031235
    jobs = [
        job("a", duration=1000, submit=start, model="resnet50"),
        job("b", duration=1000, submit=start, model="resnet50"),
    ]
    result = run(jobs, cluster(nodes=1, gpus=1), make_policy("gandiva:packing=false"), perf=PerfModel(restore_s=0.0))
    b = next(j for j in result.jobs if j.job_id == "b")
    assert b.first_start_s is not None and b.first_start_s - start < 61
