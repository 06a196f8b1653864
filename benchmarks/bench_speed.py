"""Replay speed against a bare-bones reference (issue 20): whole commands, timed from outside.

Every figure is a whole command (``python benchmarks/bare_fifo.py``, ``corral simulate ...``) run in a fresh
process, its wall time taken from outside (median of ``--runs``, default 3) and its peak memory from
``/usr/bin/time`` (the maximum resident set size, over the runs). Sections:

- ``philly``: the bare-bones FIFO reference (benchmarks/bare_fifo.py, checked by ``--check`` and by
  tests/sim/test_bare_fifo_reference.py to give corral's FIFO schedule job for job on the neutral performance
  model), then ``corral simulate`` of the full Philly trace under FIFO (default performance model), and the ratio.
  Target: at most 3x.
- ``policies``: every registered policy on full Philly (AntMan with the ``philly-vc`` quotas and 30% of the jobs
  opportunistic, as in bench_antman.py; the model-aware ones with models from the default mix, as ``corral
  simulate`` draws them). Target: at most 5 s each.
- ``scaling``: synthetic traces of 100,000 and 1,000,000 jobs under FIFO (500 jobs/hour on ``philly``, seed 1, as
  bench_scaling.py). Targets: 1M at most 40 s and 1 GiB; time per job grows at most 1.2x from 100k to 1M.
- ``small``: ``corral simulate`` of a 200-job trace (the first 200 rows of philly.csv). Target: at most 0.15 s.

    python benchmarks/bench_speed.py                          # everything, 3 runs each (about 15 minutes)
    python benchmarks/bench_speed.py --section philly --section small
    python benchmarks/bench_speed.py --section scaling --runs 1 --json out.json

Before and after a change, on a shared (noisy) machine: ``--baseline SRC`` runs every corral command a second
time with ``PYTHONPATH=SRC`` (another copy of corral's ``src/``, e.g. ``git worktree add /tmp/base HEAD~1`` then
``/tmp/base/src``), alternating the two run by run, so that both see the same load; it prints both medians and
the speed-up. The reference and the 200-job trace are measured the same way.

Python here runs with ``PYTHONDONTWRITEBYTECODE`` unset and a bytecode cache under a temporary
``PYTHONPYCACHEPREFIX`` (warmed by the first run of each command), as an installed package runs; without a cache
every command would also compile corral's sources, about 0.1 s more.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PHILLY = HERE.parent.parent / "shared" / "data" / "philly" / "philly.csv"
POLICIES = {
    "fifo": [],
    "sjf": [],
    "srtf": [],
    "yarn-cs": [],
    "tiresias": [],
    "tiresias:priority=gittins": [],
    "themis": [],
    "gandiva": [],
    "hived": [],
    "iadeep": [],
    "antman": ["--opportunistic", "0.3", "--quotas", "philly-vc"],
}
SECTIONS = ("philly", "policies", "scaling", "small")


def corral() -> list[str]:
    """The ``corral`` command of this interpreter's environment."""
    return [str(Path(sys.executable).with_name("corral"))]


ENV: dict[str, str] = {}  # the environment of every command (set in main)
BASELINE: dict[str, str] | None = None  # the same with PYTHONPATH=the baseline's src (--baseline)


def run_once(cmd: list[str], env: dict[str, str]) -> tuple[float, int]:
    """One run of ``cmd``: wall seconds (timed from outside) and peak RSS in KiB (``/usr/bin/time``)."""
    t0 = time.perf_counter()
    proc = subprocess.run(
        ["/usr/bin/time", "-f", "%M", *cmd], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env
    )
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{proc.stderr}")
    return wall, int(proc.stderr.strip().splitlines()[-1])


def summary(walls: list[float], peaks: list[int]) -> dict[str, Any]:
    return {
        "median_s": round(statistics.median(walls), 3),
        "min_s": round(min(walls), 3),
        "max_s": round(max(walls), 3),
        "peak_mib": round(max(peaks) / 1024, 1),
        "runs": len(walls),
    }


def measure(cmd: list[str], runs: int, *, corral_cmd: bool = True) -> dict[str, Any]:
    """Run ``cmd`` ``runs`` times: median, min and max wall seconds, and the peak RSS in MiB over the runs. With
    ``--baseline`` (and ``corral_cmd``), each run is followed by one of the baseline, and its figures are under
    ``"baseline"``."""
    walls: list[float] = []
    peaks: list[int] = []
    base_walls: list[float] = []
    base_peaks: list[int] = []
    for _ in range(runs):
        wall, peak = run_once(cmd, ENV)
        walls.append(wall)
        peaks.append(peak)
        if BASELINE is not None and corral_cmd:
            wall, peak = run_once(cmd, BASELINE)
            base_walls.append(wall)
            base_peaks.append(peak)
    out = summary(walls, peaks)
    if base_walls:
        out["baseline"] = summary(base_walls, base_peaks)
    return out


def philly_cmd(policy: str, extra: list[str]) -> list[str]:
    base = [*corral(), "simulate", "--format", "philly", "--trace", str(PHILLY), "--cluster", "philly"]
    return [*base, "--policy", policy, "--no-progress", *extra]


def line(label: str, r: dict[str, Any], note: str = "") -> None:
    print(
        f"{label:<34}{r['median_s']:>9.3f}{r['min_s']:>9.3f}{r['max_s']:>9.3f}{r['peak_mib']:>10.0f}  {note}",
        flush=True,
    )
    base = r.get("baseline")
    if base is not None:
        print(
            f"{'  baseline':<34}{base['median_s']:>9.3f}{base['min_s']:>9.3f}{base['max_s']:>9.3f}"
            f"{base['peak_mib']:>10.0f}  now {base['median_s'] / r['median_s']:.2f}x faster",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--section", action="append", choices=SECTIONS, help="default: all")
    parser.add_argument("--runs", type=int, default=3, help="runs per command (the median is reported)")
    parser.add_argument("--scaling-runs", type=int, help="runs of the 1M-job replay (default: --runs)")
    parser.add_argument("--policy", action="append", help="policies section: only these (default: all)")
    parser.add_argument("--json", type=Path, help="also write every figure here")
    parser.add_argument("--baseline", type=Path, help="another corral src/ to compare with, run by run")
    ns = parser.parse_args()
    global BASELINE
    cache = tempfile.mkdtemp(prefix="corral-bench-pyc-")
    ENV.update(os.environ)
    ENV.pop("PYTHONDONTWRITEBYTECODE", None)
    ENV["PYTHONPYCACHEPREFIX"] = cache
    if ns.baseline is not None:
        BASELINE = {**ENV, "PYTHONPATH": str(ns.baseline.resolve()), "PYTHONPYCACHEPREFIX": cache + "-baseline"}
    small = Path(cache) / "philly200.csv"  # the first 200 jobs of philly.csv: the "small" section's trace
    with open(PHILLY) as f:
        small.write_text("".join(f.readline() for _ in range(201)))
    small_cmd = [*corral(), "simulate", "--format", "philly", "--trace", str(small), "--cluster", "philly"]
    small_cmd += ["--policy", "fifo", "--no-progress"]
    measure(small_cmd, 1)  # warm the page cache and the bytecode caches of the replay's modules
    sections = ns.section or list(SECTIONS)
    out: dict[str, Any] = {}
    print(f"{'command':<34}{'median s':>9}{'min s':>9}{'max s':>9}{'peak MiB':>10}  target")
    if "philly" in sections:
        ref = measure([sys.executable, str(HERE / "bare_fifo.py")], ns.runs, corral_cmd=False)
        line("reference (bare_fifo.py)", ref)
        fifo = measure(philly_cmd("fifo", []), ns.runs)
        ratio = fifo["median_s"] / ref["median_s"]
        line("corral simulate, philly, fifo", fifo, f"{ratio:.2f}x the reference (target <= 3x)")
        out["philly"] = {"reference": ref, "fifo": fifo, "ratio": round(ratio, 2)}
        if "baseline" in fifo:
            out["philly"]["baseline_ratio"] = round(fifo["baseline"]["median_s"] / ref["median_s"], 2)
            print(f"{'  baseline':<34}{'':>37}  {out['philly']['baseline_ratio']:.2f}x the reference")
    if "policies" in sections:
        out["policies"] = {}
        for policy in ns.policy or list(POLICIES):
            r = measure(philly_cmd(policy, POLICIES.get(policy, [])), ns.runs)
            line(f"philly, {policy}", r, "met (<= 5 s)" if r["median_s"] <= 5.0 else "MISSED (<= 5 s)")
            out["policies"][policy] = r
    if "scaling" in sections:
        rows = {}
        for n in (100_000, 1_000_000):
            cmd = [*corral(), "simulate", "--format", "synthetic", "--jobs", str(n), "--jobs-per-hour", "500"]
            cmd += ["--seed", "1", "--cluster", "philly", "--policy", "fifo", "--no-progress"]
            runs = ns.scaling_runs or ns.runs if n == 1_000_000 else ns.runs
            r = measure(cmd, runs)
            r["us_per_job"] = round(r["median_s"] / n * 1e6, 2)
            rows[n] = r
            note = f"{r['us_per_job']:.1f} us/job"
            if n == 1_000_000:
                ok = r["median_s"] <= 40 and r["peak_mib"] <= 1024
                note += f" (target <= 40 s, <= 1024 MiB: {'met' if ok else 'MISSED'})"
            line(f"synthetic {n:,} jobs, fifo", r, note)
        growth = rows[1_000_000]["us_per_job"] / rows[100_000]["us_per_job"]
        print(f"time per job grows {growth:.2f}x from 100,000 to 1,000,000 jobs (target <= 1.2x)")
        out["scaling"] = {"100k": rows[100_000], "1M": rows[1_000_000], "growth": round(growth, 2)}
    if "small" in sections:
        r = measure(small_cmd, max(ns.runs, 5))
        line("corral simulate, 200 jobs, fifo", r, "met (<= 0.15 s)" if r["median_s"] <= 0.15 else "MISSED (<= 0.15 s)")
        out["small"] = r
    if ns.json is not None:
        ns.json.write_text(json.dumps(out, indent=1) + "\n")
    shutil.rmtree(cache, ignore_errors=True)
    if BASELINE is not None:
        shutil.rmtree(BASELINE["PYTHONPYCACHEPREFIX"], ignore_errors=True)


if __name__ == "__main__":
    main()
