"""A replay imports no live-mode code and no numpy (issue 20: ``corral simulate`` on a small trace was mostly imports).

``corral simulate`` runs in a fresh interpreter, with and without writing its files (``--out``, without the
report's plots), and the modules it imported are checked: none of FastAPI, uvicorn, httpx or corral's live mode
(``corral.live``, ``corral.cli.live``), and no numpy (the metrics compute numpy's figures without it,
:mod:`corral.sim.stats`; filters that draw at random, synthetic traces and the report's plots load it when used).
The live commands are still all there, loaded when asked for; the two things the CLI repeats so as not to import
live mode stay equal to their originals.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from corral.workloads.data import data_file

SIXTY = str(data_file("tiresias", "60_job.csv"))
CHILD = """
import json, sys
from corral.cli.main import cli
try:
    cli(sys.argv[1:], standalone_mode=False)
finally:
    print(json.dumps(sorted(sys.modules)))
"""


@pytest.mark.parametrize("writes", [False, True], ids=["no-out", "out-no-report"])
def test_simulate_imports_no_live_mode_and_no_numpy(writes: bool, tmp_path: Path) -> None:
    args = ["simulate", "--format", "tiresias", "--trace", SIXTY, "--cluster", "n32g4", "--no-progress"]
    if writes:  # its files, without report.html (whose plots do use numpy)
        args += ["--out", str(tmp_path / "out"), "--no-report"]
    proc = subprocess.run([sys.executable, "-c", CHILD, *args], capture_output=True, text=True, check=True)
    modules = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "corral.sim.runner" in modules  # it did replay
    if writes:
        assert "corral.sim.report" in modules and (tmp_path / "out" / "jobs.csv").is_file()
    live = [m for m in modules if m.split(".")[0] in {"fastapi", "uvicorn", "httpx", "starlette"}]
    live += [m for m in modules if m == "corral.live" or m.startswith(("corral.live.", "corral.cli.live"))]
    assert live == []
    assert [m for m in modules if m.split(".")[0] == "numpy"] == []


def test_live_commands_load_on_demand() -> None:
    from corral.cli import main
    from corral.cli.live import LIVE_COMMANDS
    from corral.cli.options import DEFAULT_STATE_DIR
    from corral.live.config import DEFAULT_STATE_DIR as LIVE_STATE_DIR

    assert sorted(main.LIVE_COMMAND_NAMES) == sorted(c.name for c in LIVE_COMMANDS if c.name)
    assert DEFAULT_STATE_DIR == LIVE_STATE_DIR
    ctx = main.cli.make_context("corral", ["--help"], resilient_parsing=True)
    for name in main.LIVE_COMMAND_NAMES:
        assert main.cli.get_command(ctx, name) is not None
