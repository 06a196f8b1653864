"""CPU smoke tests of the GPU measurement scripts (``benchmarks/gpu_colocation.py``, ``benchmarks/gpu_memory.py``
and ``bench_job_overhead.py --device``): their logic on tiny models, on the CPU, never their figures (no test here
asserts a time). The GPU runs themselves are described in ``docs/measurements.md``."""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from corral.core import contract  # noqa: E402
from corral.job.memory import build_rungs  # noqa: E402
from corral.live.agent import JobReported  # noqa: E402

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def load(name: str) -> ModuleType:
    """A benchmark script as a module (gpu_memory imports gpu_colocation as a sibling: the same module)."""
    if name in sys.modules:
        return sys.modules[name]
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def coloc() -> ModuleType:
    return load("gpu_colocation")


@pytest.fixture(autouse=True)
def keep_threads() -> Iterator[None]:
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


# -- gpu_colocation.py ----------------------------------------------------------------------------------------------
def test_the_worker_trains_through_corral_job_and_records_each_step(coloc: ModuleType, tmp_path: Path) -> None:
    out = tmp_path / "w.json"
    args = ["--worker", "--role", "guaranteed", "--model", "tiny-cnn", "--batch", "8", "--steps", "6"]
    args += ["--device", "cpu", "--simulated-gpu-mib", "256", "--out", str(out)]
    coloc.main(args)
    s = coloc.Series.load(out)
    assert s.role == "guaranteed" and s.batch == 8 and len(s.ends) == 6
    assert s.info["standalone"] and s.info["stopped_by"] == "steps"
    assert s.rungs == ["full"] * 6  # steps ran through job.train_step
    assert all(b > a for a, b in zip(s.ends, s.ends[1:], strict=False))


def make_series(coloc: ModuleType, role: str, start: float, step_s: float, n: int, batch: int = 10) -> Any:
    ends = [start + step_s * (i + 1) for i in range(n)]
    return coloc.Series(role, batch, ends, [step_s] * n, [None] * n, [None] * n, ["full"] * n)


def test_window_figures_count_whole_steps_and_charge_pauses(coloc: ModuleType) -> None:
    s = make_series(coloc, "opportunistic", 100.0, 0.5, 20)
    st = coloc.window_stats(s, 101.0, 106.0)
    assert st["steps"] == 10  # steps that began at or after 101 and ended by 106
    assert st["median_step_ms"] == 500.0
    assert st["samples_per_s"] == 10 * 10 / 5.0
    empty = coloc.window_stats(s, 200.0, 210.0)  # a paused job: no step, no throughput
    assert empty["steps"] == 0 and empty["samples_per_s"] == 0 and empty["median_step_ms"] is None
    assert coloc.window_stats(s, 5.0, 5.0) is None
    s.shares[5:] = [250] * 15
    assert coloc.share_changes(s, 100.0) == [[0.5, None, None], [3.0, 250, None]]


def test_analyse_reports_slowdowns_against_the_solo_phases(coloc: ModuleType, tmp_path: Path, capsys: Any) -> None:
    cfg = coloc.Settings(
        smoke=True, gpu=0, work=tmp_path, python=sys.executable, g_model="tiny-cnn", g_batch=10, o_model="tiny-cnn",
        o_batch=10, precision="bf16", solo_s=4, pair_s=4, baseline_s=2, coordinated_s=8, warmup_s=0.0,
        warmup_steps=0, settle_s=2.0, control_interval_s=1, start_milli=100, simulated_gpu_mib=256,
        nvml_period_s=0.2,
    )  # fmt: skip
    g, o = coloc.GUARANTEED, coloc.OPPORTUNISTIC
    d_g = make_series(coloc, g, 0.0, 0.1, 120)  # 12 s; the guest joins at 2 s
    d_g.step_s[30:] = [0.103] * 90
    d_g.ends = [sum(d_g.step_s[: i + 1]) for i in range(120)]
    d_o = make_series(coloc, o, 2.0, 0.4, 20)
    d_o.info["ended"] = d_o.ends[-1]
    runs = {
        "a": {"series": {g: make_series(coloc, g, 0.0, 0.1, 40)}},
        "b": {"series": {o: make_series(coloc, o, 0.0, 0.1, 40)}},
        "c": {"series": {g: make_series(coloc, g, 0.0, 0.2, 40), o: make_series(coloc, o, 0.0, 0.2, 40)}},
        "d": {"mode": "loop", "how": "test", "series": {g: d_g, o: d_o}, "events": {}, "timeline": []},
    }
    sampler = coloc.NvmlSampler.__new__(coloc.NvmlSampler)  # one without NVML, as on a CPU
    sampler._nv, sampler.samples, sampler.period_s, sampler.gpm = None, [], 0.2, False
    out = coloc.analyse(cfg, runs, sampler)
    summary = out["summary"]
    assert summary["slowdown_c"] == pytest.approx(2.0)
    assert summary["opportunistic_fraction_c"] == pytest.approx(0.5)
    assert summary["slowdown_d"] == pytest.approx(1.03)
    assert summary["opportunistic_fraction_d"] == pytest.approx(0.25, rel=0.1)
    assert summary["target_met"] is True and summary["coordinator_mode"] == "loop"
    assert out["phases"]["d"]["guaranteed_before"]["median_step_ms"] == pytest.approx(100.0)
    result = {"machine": coloc.machine_info(smoke=True), "config": {"settle_s": 2.0}, **out}
    coloc.print_report(result)
    text = capsys.readouterr().out
    assert "guaranteed slowdown with the coordinator: 1.030x" in text and coloc.SMOKE_NOTE in text
    path = tmp_path / "r.json"
    coloc.write_json(str(path), result)
    assert json.loads(path.read_text())["summary"]["slowdown_c"] == pytest.approx(2.0)


def report(job_id: str, step_time_s: float, mem: int = 1000) -> JobReported:
    return JobReported(job_id, 1, contract.StepReport(job_id, 1, 10, 10, step_time_s, step_time_s, mem_peak_mib=mem))


def test_the_coordinator_loop_runs_antmans_coordinator_on_the_jobs_reports(coloc: ModuleType) -> None:
    sent: list[tuple[str, contract.SetLimits]] = []
    evicted: list[str] = []
    loop = coloc.CoordinatorLoop(
        gpu_mem_mib=80_000,
        guaranteed_mem_mib=20_000,
        guest_need_mib=10_000,
        send=lambda job, msg: sent.append((job, msg)),
        evict=evicted.append,
        control_interval_s=2.0,
        start_milli=100,
    )
    g, o = coloc.GUARANTEED, coloc.OPPORTUNISTIC
    for t in (1.0, 2.0, 3.0, 4.0, 5.0):  # alone: the coordinator learns its step time (and that it is steady)
        loop.report(report(g, 0.100), t)
        loop.control(t)
    assert sent and sent[0] == (g, contract.SetLimits(gpu_milli=1000, mem_mib=1000 + 512))  # reservation = peak
    assert loop.place_guest(6.0) == (100, 10_000)
    sent.clear()
    loop.report(report(g, 0.100), 8.0)  # no slowdown, one interval on, but the guest has not stepped yet: hold
    loop.control(8.0)
    assert all(msg.gpu_milli is None for _, msg in sent)  # its memory cap may change, not its share
    loop.report(report(o, 0.500), 8.5)  # its first steps
    loop.report(report(g, 0.100), 9.0)  # still no slowdown: the guest grows
    loop.control(9.0)
    assert sent[-1][0] == o and sent[-1][1].gpu_milli == 200
    loop.report(report(g, 0.130), 10.0)  # 30% slower: the guest's share is halved at once
    loop.control(10.0)
    assert sent[-1][0] == o and sent[-1][1].gpu_milli == 100
    assert not evicted and loop.log[-1][1] == o


# -- gpu_memory.py --------------------------------------------------------------------------------------------------
def test_gpu_memory_smoke_walks_the_ladder_evicts_and_throttles(tmp_path: Path) -> None:
    mem = load("gpu_memory")
    path = tmp_path / "mem.json"
    args = ["--smoke", "--batch", "512", "--warm-steps", "2", "--caps", "0.5,0.1,2.0", "--steps-per-cap", "3"]
    args += ["--evict-repeats", "2", "--shares", "1000,500", "--duty-steps", "3", "--json", str(path)]
    result = mem.main(args)
    assert json.loads(path.read_text())["need_mib"] == result["need_mib"] > 0
    assert result["note"] == mem.SMOKE_NOTE
    order = [r.name for r in build_rungs()]
    shrink, tighter, grow = result["caps"]
    assert [r["direction"] for r in result["caps"]] == ["shrink", "shrink", "grow"]
    assert shrink["cap_mib"] < result["need_mib"] and grow["cap_mib"] > result["need_mib"]
    assert shrink["settled_rung"] != "full"  # a cap below the need degrades the step instead of failing it
    assert order.index(tighter["settled_rung"]) >= order.index(shrink["settled_rung"])
    assert order.index(grow["settled_rung"]) < order.index(tighter["settled_rung"])  # it climbs back
    e = result["evict"]
    assert e["bit_exact"] is True and e["tensors"] > 0
    assert e["directive_evict_ms"] is not None and e["directive_restore_ms"] is not None
    assert [d["share_milli"] for d in result["duty"]] == [1000, 500]
    assert result["duty"][1]["achieved_by_duty_cycle"] is not None


# -- bench_job_overhead.py --device ---------------------------------------------------------------------------------
def test_bench_job_overhead_device_section_runs_on_the_cpu(tmp_path: Path, capsys: Any) -> None:
    overhead = load("bench_job_overhead")
    peer = overhead.Peer(str(tmp_path / "a.sock"))
    try:

        def agent_env(interval_s: float) -> dict[str, str]:
            return {
                contract.ENV_JOB_ID: "bench",
                contract.ENV_RUN: "1",
                contract.ENV_AGENT_SOCKET: str(tmp_path / "a.sock"),
                contract.ENV_REPORT_INTERVAL_S: str(interval_s),
            }

        ns = argparse.Namespace(steps=200, repeats=1, device_steps=3, profile=3)  # the profile runs too
        out = overhead.device_section("cuda", ns, agent_env)  # no CUDA here: a CPU smoke run, and it says so
    finally:
        peer.close()
    assert out["device"] == "cpu" and out["note"] == load("gpu_colocation").SMOKE_NOTE
    assert set(out["real"]) == {"loop, standalone, own step", "loop, standalone, train_step",
                                "loop, agent (1 s reports), train_step"}  # fmt: skip
    assert "CPU smoke run: not a GPU figure" in capsys.readouterr().out


def test_gpu_restore_smoke_times_plain_and_pipelined_restores(tmp_path: Path) -> None:
    restore = load("gpu_restore")
    path = tmp_path / "restore.json"
    result = restore.main(
        ["--smoke", "--warmup", "1", "--steps", "2", "--repeats", "2", "--check", "--json", str(path)]
    )
    assert json.loads(path.read_text())["note"] == result["note"] == load("gpu_colocation").SMOKE_NOTE
    (row,) = result["models"]
    assert row["state_mib"] > 0 and row["groups"] >= 1
    assert row["plain_ms"] > 0 and row["pipelined_ms"] > 0 and row["copy_ms"] > 0
    assert row["bit_exact"] == {"plain_vs_plain": True, "pipelined_vs_plain": True}
