"""The bare-bones FIFO reference of the speed benchmark (benchmarks/bare_fifo.py) computes corral's FIFO schedule.

benchmarks/bench_speed.py measures corral's replay against that script, which is only a fair reference if it does
the same work: here both replay a subset of Philly made to queue (submit times compressed), and every job must
start and end at the same times as under corral's ``fifo`` on the neutral performance model. The compression makes
the head of the queue block and gangs spill over from the first GPU type to the second, the cases where a
simpler reference would differ.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from corral.workloads.data import data_file


def _load_bare_fifo() -> ModuleType:
    """benchmarks/bare_fifo.py as a module, without putting benchmarks/ on everyone's import path."""
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "bare_fifo.py"
    spec = importlib.util.spec_from_file_location("corral_benchmark_bare_fifo", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses and typing look their module up by name
    spec.loader.exec_module(module)
    return module


bare_fifo = _load_bare_fifo()


def test_bare_fifo_gives_corrals_fifo_schedule_job_for_job() -> None:
    trace = data_file("philly", "philly.csv")
    jobs = [(j, s / 1000.0, d, g) for j, s, d, g in bare_fifo.read_jobs(trace)[:3000]]
    nodes = bare_fifo.read_nodes(data_file("philly", "cluster_machine_list.csv"))
    ours = bare_fifo.fifo(jobs, nodes)
    queued = sum(1 for j, s, _, _ in jobs if ours[j][0] > s)
    assert queued > len(jobs) // 4  # the subset does queue: the comparison covers blocking
    assert bare_fifo.compare(ours, bare_fifo.corral_fifo(trace, jobs)) == []
