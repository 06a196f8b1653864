"""The output files' fairness columns: appended after the existing ones, with values matching the metrics."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from builders import cluster, job, run
from corral.policies.registry import make_policy
from corral.sim.metrics import SUMMARY_KEYS
from corral.sim.report import JOB_COLUMNS, write_results


def test_fairness_columns_are_appended(tmp_path: Path) -> None:
    # One GPU, FIFO: a (tenant x) runs 0-100, b (tenant y) 100-200; rho 0.5 and 1.3333 (see test_metrics).
    jobs = [job("a", duration=100, tenant="x"), job("b", duration=100, tenant="y"), job("big", gpus=2, submit=1)]
    write_results(run(jobs, cluster(nodes=1, gpus=1), make_policy("fifo")), tmp_path)

    with (tmp_path / "jobs.csv").open() as f:
        reader = csv.DictReader(f)
        assert reader.fieldnames == list(JOB_COLUMNS)
        rows = {r["job_id"]: r for r in reader}
    assert JOB_COLUMNS[12] == "rho" and JOB_COLUMNS[:12] == (
        "job_id", "tenant", "num_gpus", "submit_s", "start_s", "end_s", "jct_s", "queueing_s", "preemptions",
        "gpu_milli", "status", "reason",
    )  # fmt: skip
    assert (rows["a"]["rho"], rows["b"]["rho"], rows["big"]["rho"]) == ("0.5000", "1.3333", "")

    with (tmp_path / "tenants.csv").open() as f:
        reader = csv.DictReader(f)
        assert reader.fieldnames is not None and reader.fieldnames[-2:] == ["mean_rho", "max_rho"]
        tenants = {r["tenant"]: r for r in reader}
    assert (tenants["x"]["mean_rho"], tenants["y"]["max_rho"]) == ("0.5", "1.3333")
    assert tenants["default"]["mean_rho"] == "0.0"  # its only job was rejected

    summary = json.loads((tmp_path / "summary.json").read_text())
    for key in SUMMARY_KEYS:
        assert key in summary
    # Jain over the tenants' mean rho (1/2, 4/3): (11/6)^2 / (2 x (1/4 + 16/9)) = 121/146 = 0.828767
    assert summary["jain_rho_tenants"] == 0.828767


def test_a_replay_without_timelines_has_the_same_summary_and_cannot_write_utilization(tmp_path: Path) -> None:
    from corral.sim.runner import simulate
    from corral.sim.traces import Trace

    # One opportunistic job beside guaranteed ones, so that the measured-use figures are not all zero.
    jobs = [job("a", duration=100), job("o", submit=5, opportunistic=True), job("b", duration=50, submit=10)]
    trace = Trace(jobs=jobs, source="test")
    kept = simulate(trace, cluster(nodes=1, gpus=2), make_policy("antman"))
    lean = simulate(trace, cluster(nodes=1, gpus=2), make_policy("antman"), record_timelines=False)
    assert lean.summary == kept.summary and lean.tenants == kept.tenants
    assert len(kept.timeline_s) and len(kept.timeline_use_s)
    assert lean.timeline_s is None and lean.timeline_milli is None and lean.timeline_use_s is None
    with pytest.raises(ValueError, match="record_timelines=True"):
        write_results(lean, tmp_path)
    assert not (tmp_path / "summary.json").exists()  # refused before writing anything
