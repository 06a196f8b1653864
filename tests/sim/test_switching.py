"""The performance model's switching presets (issue 19): ``--perf switching=cold|warm`` charges corral's own
measured restart and resume costs instead of the assumed 30 s and 1 s."""

from __future__ import annotations

import dataclasses

import pytest
from click.testing import CliRunner

from corral.cli.main import cli
from corral.core.errors import ConfigError
from corral.policies.registry import make_policy
from corral.sim.clusters import load_cluster
from corral.sim.perf import SWITCHING, PerfModel
from corral.sim.runner import simulate
from corral.sim.traces import read_tiresias
from corral.workloads.data import data_file

SIXTY = ["--trace", str(data_file("tiresias", "60_job.csv")), "--format", "tiresias", "--cluster", "2x4"]


def test_a_preset_sets_both_figures_and_refuses_either_beside_it() -> None:
    for name, (restore, resume) in SWITCHING.items():
        p = PerfModel(switching=name)
        assert (p.restore_s, p.suspend_resume_s) == (restore, resume)
        assert dataclasses.replace(p, seed=2).restore_s == restore  # a copy keeps it
    assert SWITCHING["warm"][0] < SWITCHING["cold"][0] < PerfModel().restore_s
    # on the GPU a new run also makes its CUDA context: each costs more than on the CPU, warm still far less
    assert SWITCHING["warm"][0] < SWITCHING["warm-h100"][0] < SWITCHING["cold"][0] < SWITCHING["cold-h100"][0]
    with pytest.raises(ConfigError, match="not both"):
        PerfModel(switching="warm", restore_s=5.0)
    with pytest.raises(ConfigError, match="assumed, cold or warm"):
        PerfModel(switching="hot")


def test_a_replay_with_preemptions_finishes_sooner_with_warm_switching() -> None:
    trace = read_tiresias(data_file("tiresias", "60_job.csv"))
    avg = {}
    for switching in ("assumed", "cold-h100", "cold", "warm-h100", "warm"):
        result = simulate(trace, load_cluster("2x4"), make_policy("srtf"), perf=PerfModel(switching=switching))
        assert result.summary["preemptions"] > 0
        avg[switching] = result.summary["avg_jct_s"]
    assert avg["warm"] < avg["warm-h100"] < avg["cold"] < avg["cold-h100"] < avg["assumed"]


def test_the_cli_takes_the_preset() -> None:
    result = CliRunner().invoke(
        cli, ["simulate", *SIXTY, "--policy", "srtf", "--no-progress", "--perf", "switching=warm"]
    )
    assert result.exit_code == 0, result.output
    result = CliRunner().invoke(cli, ["simulate", *SIXTY, "--perf", "switching=warm,restore_s=3", "--no-progress"])
    assert result.exit_code == 2 and "not both" in result.output
