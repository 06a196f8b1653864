"""GPU-sharing metrics (AntMan, OSDI'20 §6): measured SM and memory use, guaranteed jobs' slowdown, opportunistic
jobs' progress, upgrades and quota shortfall; worked by hand on built job lists, then end to end through a replay
and its report files."""

from __future__ import annotations

import csv
import dataclasses
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from builders import cluster, job, run
from corral.core.decisions import Action, Decision, Launch, Upgrade
from corral.core.job import JobPhase, JobSpec
from corral.core.placement import Placement
from corral.core.status import JobStatus
from corral.policies.framework.contract import BasePolicy
from corral.policies.framework.view import ClusterView
from corral.policies.registry import make_policy
from corral.sim.metrics import (
    SUMMARY_KEYS,
    Usage,
    Window,
    job_slowdown,
    sharing_stats,
    summarize,
    tenant_quota_columns,
)
from corral.sim.perf import PerfModel
from corral.sim.report import JOB_COLUMNS, write_results

SHARING_KEYS = SUMMARY_KEYS[SUMMARY_KEYS.index("gpu_sm_util") :]


def quiet(**options: Any) -> PerfModel:
    """A performance model without random draws: no usage spread and (where the model has it) no demand change."""
    names = {f.name for f in dataclasses.fields(PerfModel)}
    base: dict[str, Any] = {"usage_spread": 0.0}
    if "demand_variation" in names:
        base["demand_variation"] = 0.0
    return PerfModel(**{**base, **options})


def status(spec: JobSpec, phase: JobPhase = JobPhase.FINISHED, end: float | None = None) -> JobStatus:
    return JobStatus(spec=spec, phase=phase, first_start_s=spec.submit_s, end_s=end)


# -- sharing_stats by hand ----------------------------------------------------------------------------------------


def test_sharing_stats_by_hand() -> None:
    o1 = status(job("o1", submit=10, opportunistic=True), end=110.0)
    o1.upgraded = True  # submitted opportunistic: counted with them, and as an upgrade
    jobs = [
        status(job("g1"), end=100.0),
        status(job("g2"), end=150.0),
        status(job("g3", submit=5), JobPhase.RUNNING),
        status(job("g4"), JobPhase.PENDING),
        status(job("g5"), JobPhase.PENDING),
        o1,
        status(job("o2", submit=20, opportunistic=True), end=220.0),
        status(job("o3", opportunistic=True), JobPhase.PENDING),
    ]
    times = {
        "g1": [100.0, 100.0],  # never slowed
        "g2": [150.0, 100.0],  # 1.5
        "g3": [40.0, 20.0],  # 2.0, still running: it ran
        "g5": [5.0, 0.0],  # made no progress while it ran: no slowdown
        "o1": [100.0, 50.0],
        "o2": [200.0, 150.0],
    }
    # The window is [0, 220]: 2 GPUs x 220 s, 32 GiB x 220 s.
    usage = Usage(
        sm_area=110.0,
        mem_area_mib_s=0.4 * 32768 * 220,
        total_mem_mib=32768,
        job_times=times,
        tenant_areas={"q": (2, 1e6, 3.6e6), "r": (1, 0.0, 1.8e6)},
    )
    assert sharing_stats(jobs, usage, 2) == {
        "gpu_sm_util": 0.25,
        "gpu_mem_util": 0.4,
        "g_slowdown_p50": 1.5,
        "g_slowdown_p99": 1.99,  # linear: 1.5 + 0.98 x 0.5
        "g_slowdown_max": 2.0,
        "opp_jobs": 3,
        "opp_finished": 2,
        "opp_avg_jct_s": 150.0,  # JCTs 100 and 200
        "opp_p99_jct_s": 199.0,
        "opp_throughput": 0.6667,  # (50 + 150) solo s over (100 + 200) run s
        "upgrades": 1,
        "quota_shortfall_gpu_h": 1.5,  # (3.6e6 + 1.8e6) milli x s = 1.5 GPU-hours
    }


def test_sharing_stats_with_nothing_measured_are_zero() -> None:
    empty = Usage(0.0, 0.0, 1, {}, {})
    assert sharing_stats([], empty, 4) == dict.fromkeys(SHARING_KEYS, 0.0) | {"opp_jobs": 0, "opp_finished": 0}
    got = summarize([status(job("a"), end=10.0)], 10_000.0, 1)  # no usage at all
    assert [got[k] for k in SHARING_KEYS] == [0.0] * len(SHARING_KEYS)
    assert list(got) == list(SUMMARY_KEYS)


@pytest.mark.parametrize(
    ("times", "slowdown"), [(None, None), ([5.0, 0.0], None), ([30.0, 20.0], 1.5), ([20.0, 20.0], 1.0)]
)
def test_job_slowdown(times: list[float] | None, slowdown: float | None) -> None:
    assert job_slowdown(times) == slowdown


def test_tenant_quota_columns_by_hand() -> None:
    rows: list[dict[str, Any]] = [{"tenant": "a"}, {"tenant": "q"}]
    usage = Usage(0.0, 0.0, 1, {}, {"q": (2, 1.8e6, 3.6e6)})
    tenant_quota_columns(rows, usage, Window(0.0, 3600.0))
    assert rows == [
        {"tenant": "a", "quota_gpus": "", "quota_use": "", "shortfall_gpu_h": ""},
        {"tenant": "q", "quota_gpus": 2, "quota_use": 0.25, "shortfall_gpu_h": 1.0},  # 1.8e6 of 2 x 1000 x 3600
    ]
    rows = [{"tenant": "q"}]
    tenant_quota_columns(rows, usage, Window(5.0, 5.0))
    assert rows == [{"tenant": "q", "quota_gpus": 2, "quota_use": 0.0, "shortfall_gpu_h": 1.0}]


# -- end to end ------------------------------------------------------------------------------------------------


def test_a_replay_measures_sm_and_memory_use() -> None:
    # FIFO on two 16 GiB GPUs: a ResNet-50 alone for 100 s (SM 0.9, 9216 x 0.6 MiB), a ResNet-18 alone for 50 s
    # (SM 0.55, 1536 x 0.6 MiB). Nobody shares, so nobody is slowed.
    jobs = [job("a", model="resnet50"), job("b", duration=50, model="resnet18", opportunistic=True)]
    result = run(jobs, cluster(nodes=1, gpus=2), make_policy("fifo"), perf=quiet())
    s = result.summary
    assert list(s) == list(SUMMARY_KEYS)
    assert s["gpu_sm_util"] == pytest.approx((0.9 * 100 + 0.55 * 50) / 200, abs=1e-6)
    assert s["gpu_mem_util"] == pytest.approx((9216 * 0.6 * 100 + 1536 * 0.6 * 50) / (2 * 16384 * 100), abs=1e-6)
    assert (s["g_slowdown_p50"], s["g_slowdown_max"], s["opp_throughput"]) == (1.0, 1.0, 1.0)
    assert (s["opp_jobs"], s["opp_finished"], s["opp_avg_jct_s"], s["upgrades"]) == (1, 1, 50.0, 0)
    assert result.usage is not None and result.usage.job_times == {"a": [100.0, 100.0], "b": [50.0, 50.0]}


def test_a_replay_counts_quota_shortfall_per_tenant(tmp_path: Path) -> None:
    # One GPU. x (no quota) takes it at 0 for 100 s; q1 (tenant q, quota 1) waits meanwhile with its whole quota
    # free: 100 s x 1 GPU of shortfall, then holds its GPU for 100 s of the 200 s window.
    jobs = [job("x"), job("q1", tenant="q")]
    result = run(jobs, cluster(nodes=1, gpus=1, tenants={"q": 1}), make_policy("fifo"), perf=quiet())
    assert result.summary["quota_shortfall_gpu_h"] == round(100 / 3600, 3)
    assert result.usage is not None and result.usage.tenant_areas == {"q": (1, 100_000.0, 100_000.0)}
    rows = {row["tenant"]: row for row in result.tenants}
    assert (rows["q"]["quota_gpus"], rows["q"]["quota_use"], rows["q"]["shortfall_gpu_h"]) == (1, 0.5, 0.028)
    assert (rows["default"]["quota_gpus"], rows["default"]["quota_use"]) == ("", "")
    write_results(result, tmp_path)
    with (tmp_path / "tenants.csv").open() as f:
        tenants = {row["tenant"]: row for row in csv.DictReader(f)}
    assert (tenants["q"]["quota_use"], tenants["q"]["shortfall_gpu_h"]) == ("0.5", "0.028")
    assert tenants["default"]["quota_gpus"] == ""


class Scripted(BasePolicy):
    """Takes exactly the scripted actions at the scripted times."""

    name = "scripted"

    def __init__(self, script: Mapping[float, Sequence[Action]]) -> None:
        super().__init__()
        self.script = {t: list(actions) for t, actions in script.items()}

    def schedule(self, view: ClusterView, now_s: float) -> Decision:
        actions = self.script.pop(now_s, [])
        later = [t for t in self.script if t > now_s]
        return Decision(tuple(actions), wake_at_s=min(later) if later else None)


def test_a_replay_with_an_upgrade_reports_classes_and_slowdowns(tmp_path: Path) -> None:
    # GPU 0: g (ResNet-50, guaranteed, SM 0.9) with o (ResNet-18, opportunistic, uncapped: activity 1) beside it:
    # o runs in the 0.1 g leaves idle, 0.1 / 0.55 of its speed; g loses only AntMan's residual, 0.02 x 1.
    # GPU 1: p (opportunistic on an ordinary placement) alone for 5 s. At 10, o is upgraded onto GPU 1 (a restore
    # of 30 s): g runs alone from then on.
    f_g, f_o = 1 - 0.02 * 1.0, 0.1 / 0.55
    script: dict[float, list[Action]] = {
        0.0: [
            Launch("g", Placement((0,))),
            Launch("o", Placement((0,), 1000, opportunistic=True)),
            Launch("p", Placement((1,))),
        ],
        10.0: [Upgrade("o", Placement((1,)))],
    }
    jobs = [
        job("g", model="resnet50", tenant="q"),
        job("o", model="resnet18", tenant="q", opportunistic=True),
        job("p", duration=5, model="resnet18", opportunistic=True),
    ]
    result = run(jobs, cluster(nodes=1, gpus=2, tenants={"q": 2}), Scripted(script), perf=quiet(restore_s=30.0))
    g_end = 10.0 + (100.0 - 10.0 * f_g)  # 9.8 s of work by 10, the other 90.2 alone: 100.2
    o_end = 10.0 + 30.0 + (100.0 - 10.0 * f_o)  # 1/0.55 s of work by 10, restored at 40
    ends = {j.job_id: j.end_s for j in result.jobs}
    assert ends == {"g": pytest.approx(g_end), "o": pytest.approx(o_end), "p": 5.0}
    s = result.summary
    assert (s["upgrades"], s["opp_jobs"], s["opp_finished"]) == (1, 2, 2)
    assert s["g_slowdown_max"] == round(g_end / 100.0, 4)
    run_s = 5.0 + (10.0 + 100.0 - 10.0 * f_o)  # p, and o without its restore
    assert s["opp_throughput"] == round((5.0 + 100.0) / run_s, 4)
    assert s["quota_shortfall_gpu_h"] == 0.0  # q's guaranteed jobs never waited

    write_results(result, tmp_path)
    with (tmp_path / "jobs.csv").open() as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames or ()) == JOB_COLUMNS
        rows = {row["job_id"]: row for row in reader}
    assert {j: (row["job_class"], row["slowdown"]) for j, row in rows.items()} == {
        "g": ("guaranteed", f"{g_end / 100.0:.4f}"),
        "o": ("upgraded", f"{(10.0 + 100.0 - 10.0 * f_o) / 100.0:.4f}"),
        "p": ("opportunistic", "1.0000"),
    }
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert all(key in summary for key in SUMMARY_KEYS)
    with (tmp_path / "utilization.csv").open() as f:
        table = list(csv.reader(f))
    assert table[0] == ["time_s", "gpu_alloc_frac", "gpu_sm_frac", "gpu_mem_frac"]
    assert len(table) > 1 and all(len(row) == 4 for row in table)
    assert all(0.0 <= float(row[2]) <= 1.0 and 0.0 <= float(row[3]) <= 1.0 for row in table[1:])
    logged = (tmp_path / "decisions.log").read_text().splitlines()
    assert "10.000 upgrade o gpus=1 milli=1000" in logged
