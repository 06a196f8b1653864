"""Chaos, bounded: under every live policy, a real ``corral serve`` (two stand-in GPUs) runs 14 short jobs while it
is killed with ``SIGKILL`` three times at random (seeded) moments and restarted on the same state directory; then
the queue is drained and the server stopped. Every job must be known, have done its work exactly once (a job's
log shows each run's own ``start``/``end`` lines, the ``end`` once and from the run the server counts last, and
no two runs of a job alive at once) or have failed for the reason the docs give (its exit code), none may be left
unfinished, and no process of any run's process group may outlive the final stop.

The jobs mix plain processes (some needing both GPUs, some exiting with code 3), ``corral.job`` jobs that
checkpoint a step counter through the library's hooks, and, under FIFO, a real PyTorch job
(``examples/train_mlp.py``) whose final weights must equal an uninterrupted run's. While the controller is down,
the driver makes some running jobs vanish (``SIGKILL`` to their group) and asks some ``corral.job`` jobs to
checkpoint and exit, so restarts meet runs to reattach, runs that ended unwatched, and jobs to requeue from a
checkpoint; some kills cut a submission in flight or a restart still recovering. Each policy runs with its time
constants cut to seconds, so that its own preemptions, time slices and leases happen around the kills.

The driver and the verdict are those of ``benchmarks/chaos.py`` (its module docstring says exactly what counts as
lost, run twice, stuck, an orphan or wrong), which runs the long version. The policies run side by side, so the
whole module takes about a minute on two cores (most of it the servers' restarts).

The bugs this test found, all fixed: two runs of a job alive at once after a restart (an earlier run still
stopping was not taken back), exits of a finished job ignored, and Gandiva's time slices moving jobs that cannot
checkpoint to other GPUs every quantum (each move started them again; they never finished).
"""

from __future__ import annotations

import importlib.util
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest


def _load_chaos() -> ModuleType:
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "chaos.py"
    spec = importlib.util.spec_from_file_location("corral_benchmark_chaos", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


chaos = _load_chaos()

LIVE_POLICIES: list[str] = chaos.live_policies()
OPTIONS = chaos.Options(
    jobs=14,
    kills=3,
    seed=22,
    max_s=1.5,
    fail_fraction=0.15,  # 2 jobs exit with code 3
    wide_fraction=0.15,
    steps_fraction=0.3,  # 4 corral.job jobs
    train_fraction=0.0,
    steps=25,
    step_s=0.05,
    victim_p=0.5,
    inflight_p=0.3,
    recovery_p=0.5,
    poll_s=0.5,
    drain_s=30.0,
)
FAILING = round(OPTIONS.jobs * OPTIONS.fail_fraction)
# A PyTorch job costs seconds of CPU (torch's import, at each run): one, under FIFO, where only the chaos stops it
# (as it stops the step counters under every policy; the benchmark runs them under each).
TRAIN_POLICIES = {"fifo": 1 / OPTIONS.jobs}


def _selected(request: pytest.FixtureRequest) -> list[str]:
    """The policies whose tests this session runs (all of them when only the summary test was picked)."""
    chosen = set()
    for item in request.session.items:
        callspec = getattr(item, "callspec", None)
        if getattr(item, "module", None) is request.module and callspec is not None and "policy" in callspec.params:
            chosen.add(callspec.params["policy"])
    return [p for p in LIVE_POLICIES if p in chosen] or LIVE_POLICIES


@pytest.fixture(scope="module")
def reports(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One chaos run per selected policy, all at once (each is mostly waiting on its jobs and its restarts)."""
    root = tmp_path_factory.mktemp("chaos")
    policies = _selected(request)
    with ThreadPoolExecutor(len(policies) + 1) as pool:
        reference: Future[str] | None = None
        if any(p in TRAIN_POLICIES for p in policies):
            # Runs beside the chaos runs; their training jobs are judged against it at the end.
            reference = pool.submit(chaos.reference_digest, root / "reference")
        runs = {}
        for policy in policies:
            options, digest = OPTIONS, None
            if policy in TRAIN_POLICIES and reference is not None:
                options, digest = replace(options, train_fraction=TRAIN_POLICIES[policy]), reference.result
            runs[policy] = pool.submit(chaos.run_chaos, chaos.chaos_spec(policy), options, root / policy, digest)
        done = {policy: run.result() for policy, run in runs.items()}
    print(chaos.HEADER)  # shown with the first failure's report (or with -s)
    for report in done.values():
        print(chaos.row(report))
    return done


@pytest.mark.parametrize("policy", LIVE_POLICIES)
def test_kill_9_at_random_loses_nothing_and_runs_nothing_twice(reports: dict[str, Any], policy: str) -> None:
    r = reports[policy]
    assert not r.problems, "\n".join(r.problems)
    # Every job ended as it should: all finished but the ones that exit with 3, which failed saying so.
    assert (r.jobs, r.finished, r.failed) == (OPTIONS.jobs, OPTIONS.jobs - FAILING, FAILING)
    # The chaos happened: three kills, restarts that came back healthy, and runs the controller had to take back.
    assert r.kills == OPTIONS.kills
    assert r.restart_s, "no restart came back healthy after a kill"
    if policy in TRAIN_POLICIES:
        assert r.trained == 1  # the PyTorch job finished, with an uninterrupted run's weights


def test_chaos_exercised_restarts_reattaching_requeueing_and_resuming(reports: dict[str, Any]) -> None:
    """Over all the policies' runs, the moments recovery must get right all came up (each is left to chance in a
    single run): runs reattached, runs requeued and resumed from a checkpoint, kills during a recovery, and the
    policies' own preemptions and suspensions around the restarts."""
    if set(reports) != set(LIVE_POLICIES):
        pytest.skip("judged over every policy's run")
    total = {key: sum(getattr(r, key) for r in reports.values()) for key in ("reattached", "requeued", "resumed")}
    assert all(total.values()), total
    assert sum(r.kills_in_recovery for r in reports.values()) > 0
    assert sum(r.stopped for r in reports.values()) > 0  # corral.job runs asked to checkpoint while no controller ran
    # A kill that finds a running job makes one vanish (a single run's kills may all land between jobs).
    assert sum(r.vanished for r in reports.values()) > 0
    assert reports["tiresias"].preempted > 0
    assert reports["gandiva"].suspended > 0
