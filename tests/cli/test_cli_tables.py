"""Issue 18, "a first hour without surprises", on an 80-column terminal: ``corral policies`` is an index and
``corral policies NAME`` one policy's options with nothing cut; ``corral compare`` of 8 policies keeps every
metric name and value whole; the replay's progress counts jobs done, and off a terminal is a plain line."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from rich.console import Console

import corral.cli.main as main_module
from corral.cli.main import cli
from corral.core.job import JobSpec
from corral.core.options import config_fields
from corral.policies.registry import make_policy, policy_class, policy_names
from corral.sim.clusters import load_cluster
from corral.sim.metrics import SUMMARY_KEYS
from corral.sim.runner import SimulationResult, simulate
from corral.sim.traces.trace import Trace
from corral.workloads.data import data_file

SIXTY = str(data_file("tiresias", "60_job.csv"))
WIDTH = 80


@pytest.fixture(autouse=True)
def narrow_console(monkeypatch: pytest.MonkeyPatch) -> None:
    # The module's console was sized when it was imported; an 80-column terminal is set here, whatever runs the tests.
    monkeypatch.setattr(main_module, "console", Console(width=WIDTH))


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.output


def assert_fits(out: str) -> list[str]:
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= WIDTH, out
    assert "…" not in out, out  # rich's mark of a cell cut short
    return lines


def test_policies_without_a_name_is_an_index() -> None:
    code, out = invoke("policies")
    assert code == 0, out
    lines = assert_fits(out)
    for name in policy_names():
        assert any(line.startswith(f"│ {name} ") for line in lines), name
    assert "`corral policies NAME` lists a policy's options." in out
    assert "restore_s" in out  # the performance model's options stay here
    assert "pack_threshold" not in out and "fgd" not in out  # no policy's options


@pytest.mark.parametrize("name", policy_names())
def test_policies_name_shows_every_option_whole_at_80_columns(name: str) -> None:
    code, out = invoke("policies", name)
    assert code == 0, out
    lines = assert_fits(out)
    cells = [cell.strip() for line in lines for cell in line.split("│")]
    for fname, _tp, _default, _help in config_fields(policy_class(name).Config):
        assert fname in cells, (fname, out)
    assert policy_class(name).summary.split()[0] in out


def test_a_choice_shows_its_values_and_default() -> None:
    code, out = invoke("policies", "fifo")
    assert code == 0, out
    takes = [line.split("│")[2].strip() for line in out.splitlines() if line.count("│") == 4]
    # The fgd placement (the value the five-column listing hid at 80 columns) and the default, whole: the
    # values wrap between values, never inside one.
    assert "one of: consolidated, strict, spread, first-fit, fgd" in " ".join(takes)
    assert {"consolidated,", "strict,", "spread,", "first-fit,", "fgd"} <= set(" ".join(takes).split())
    assert "default: consolidated" in takes
    assert "default: false" in takes  # backfill, written as it is typed


def test_an_unknown_policy_name_lists_the_known_ones() -> None:
    code, out = invoke("policies", "nope")
    assert code == 2, out
    assert "error: unknown policy 'nope'; known policies: " + ", ".join(policy_names()) in " ".join(out.split())


EIGHT = ["fifo", "sjf", "srtf", "tiresias", "themis", "gandiva", "srtf:placement=spread", "fifo:backfill=true"]


def test_compare_of_eight_policies_at_80_columns_cuts_nothing(tmp_path: Path) -> None:
    args = ["compare", "--trace", SIXTY, "--format", "tiresias", "--cluster", "2x4", "--no-progress"]
    code, out = invoke(*args, *(x for spec in EIGHT for x in ("--policy", spec)), "--out", str(tmp_path))
    assert code == 0, out
    lines = assert_fits(out)
    tables = [line for line in lines if re.search(r"policies \d+-\d+ of 8", line)]
    assert len(tables) >= 2  # 8 policies do not fit side by side in 80 columns
    metrics = [*SUMMARY_KEYS, "wall time (s)"]
    rows = {key: [line for line in lines if line.startswith(f"│ {key} ")] for key in metrics}
    for key, found in rows.items():
        assert len(found) == len(tables), key  # the metric name whole, once in each table
    # Each policy's values whole, in order: the row's cells across the tables are the policies' values.
    values = {key: [cell.strip() for line in rows[key] for cell in line.split("│")[2:-1]] for key in metrics}
    for i, spec in enumerate(EIGHT):
        summary = json.loads((tmp_path / main_module._slug(spec) / "summary.json").read_text())
        for key in SUMMARY_KEYS:
            assert values[key][i] == main_module._fmt(key, summary[key]), (spec, key)


def test_compare_that_fits_is_one_table() -> None:
    code, out = invoke(
        "compare", "--trace", SIXTY, "--format", "tiresias", "--cluster", "2x4", "--policy", "fifo",
        "--policy", "sjf", "--no-progress",
    )  # fmt: skip
    assert code == 0, out
    assert_fits(out)
    assert "60 jobs on 2x4 (8 GPUs)" in out and "policies 1-" not in out


def test_progress_off_a_terminal_is_a_plain_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """CliRunner's stderr is not a terminal: lines with jobs done of all, the rate and an ETA, and a closing line
    (the replay is stood in for, so that the counts are exact and no test waits 5 s)."""
    real = simulate
    calls: dict[str, Any] = {}

    def fake(*args: Any, **kwargs: Any) -> SimulationResult:
        on_progress = kwargs.pop("on_progress", None)
        calls["every_s"] = kwargs.pop("progress_every_s", None)
        for done in (0, 20, 45, 60) if on_progress is not None else ():
            on_progress(done)
        result: SimulationResult = real(*args, **kwargs)
        return result

    monkeypatch.setattr(main_module, "simulate", fake)
    code, out = invoke("simulate", "--trace", SIXTY, "--format", "tiresias", "--cluster", "2x4")
    assert code == 0, out
    assert calls["every_s"] == main_module._PLAIN_PROGRESS_EVERY_S == 5.0
    assert "fifo: 0 of 60 jobs done, 0/s, ETA unknown" in out
    assert re.search(r"^fifo: 20 of 60 jobs done, [\d,]+/s, ETA \d+s$", out, re.M), out
    assert re.search(r"^fifo: 45 of 60 jobs done, [\d,]+/s, ETA \d+s$", out, re.M), out
    assert re.search(r"^fifo: all 60 jobs done in \d+s$", out, re.M), out
    # --no-progress: none of it.
    code, out = invoke("simulate", "--trace", SIXTY, "--format", "tiresias", "--cluster", "2x4", "--no-progress")
    assert code == 0 and "jobs done" not in out and calls["every_s"] is None


def test_a_short_replay_off_a_terminal_prints_no_progress_line() -> None:
    code, out = invoke("simulate", "--trace", SIXTY, "--format", "tiresias", "--cluster", "2x4")
    assert code == 0, out
    assert "jobs done" not in out  # over before the first line is due


@pytest.mark.parametrize(
    ("seconds", "text"), [(0.4, "0s"), (42, "42s"), (185, "3m 05s"), (7620, "2h 07m"), (90061, "25h 01m")]
)
def test_durations(seconds: float, text: str) -> None:
    assert main_module._duration(seconds) == text


def test_the_runner_reports_jobs_done_not_submitted() -> None:
    """Every job is submitted at the first instant; then they drain one at a time on one GPU. The timer thread
    sees jobs done climb while every job has long been submitted, and the last call is every job."""
    jobs = [JobSpec(job_id=f"j{i}", submit_s=0.0, num_gpus=1, duration_s=10.0) for i in range(40)]
    seen: list[int] = []

    def slow_round(_state: object, _now: float) -> None:
        time.sleep(0.002)  # room for the timer's ticks between rounds

    simulate(
        Trace(jobs=jobs, source="test"),
        load_cluster("1x1"),
        make_policy("fifo"),
        on_progress=seen.append,
        progress_every_s=0.001,
        after_round=slow_round,
    )
    assert seen[-1] == 40
    assert all(0 <= n <= 40 for n in seen)
    assert any(0 < n < 40 for n in seen[:-1]), seen  # counted while draining, after every submission
