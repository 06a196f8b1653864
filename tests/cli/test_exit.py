"""How ``corral`` ends: the replay commands end the process without freeing their objects one by one (issue 20),
after their output is flushed; the other commands, and a replay that fails, end as Python normally does.

The marker is an ``atexit`` function: a normal exit runs it, the replay's quick exit does not. The output of the
quick exit is checked whole, through a pipe (block-buffered, so an unflushed table would be lost).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from corral.workloads.data import data_file

SIXTY = str(data_file("tiresias", "60_job.csv"))
CHILD = """
import atexit, sys
atexit.register(lambda: print("atexit ran", file=sys.stderr))
sys.argv[0] = "corral"
from corral.cli.main import main
main()
"""
REPLAY = ["--format", "tiresias", "--trace", SIXTY, "--cluster", "n32g4", "--no-progress"]


def _corral(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", CHILD, *args], capture_output=True, text=True, check=False)


def test_simulate_ends_without_teardown_after_its_output(tmp_path: Path) -> None:
    proc = _corral("simulate", *REPLAY, "--out", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    assert "atexit ran" not in proc.stderr
    assert "jobs_finished" in proc.stdout and "wall time (s)" in proc.stdout  # the whole table came through
    assert "wrote summary.json" in proc.stderr
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["jobs_total"] == 60


def test_compare_ends_without_teardown() -> None:
    proc = _corral("compare", *REPLAY, "--policy", "fifo", "--policy", "srtf")
    assert proc.returncode == 0, proc.stderr
    assert "atexit ran" not in proc.stderr
    assert "srtf" in proc.stdout


def test_other_commands_and_failures_end_normally() -> None:
    listed = _corral("policies")
    assert listed.returncode == 0 and "atexit ran" in listed.stderr
    failed = _corral("simulate", *REPLAY[:-1], "--policy", "no-such-policy")
    assert failed.returncode != 0
    assert "no-such-policy" in failed.stderr and "atexit ran" in failed.stderr
