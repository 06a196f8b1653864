"""Full Philly replay: 82,247 jobs on the 2,490-GPU `philly` cluster, one fresh process per policy.

Prints, per policy: time to read the trace, time to simulate, total wall time of the process's work, and peak
memory. Issue targets (2-core machine): FIFO at most 10 s and 1.5 GiB.

    python benchmarks/bench_philly.py                      # fifo
    python benchmarks/bench_philly.py --policy fifo --policy sjf --policy srtf
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import emit, peak_rss_mib, run_child

TARGETS = {"fifo": (10.0, 1536.0)}


def child(policy_spec: str) -> None:
    t0 = time.perf_counter()
    from corral.policies import make_policy
    from corral.sim.clusters import load_cluster
    from corral.sim.data import data_file
    from corral.sim.runner import simulate
    from corral.sim.traces import read_philly

    t_import = time.perf_counter()
    trace = read_philly(data_file("philly", "philly.csv"))
    cluster = load_cluster("philly")
    t_read = time.perf_counter()
    result = simulate(trace, cluster, make_policy(policy_spec))
    t_sim = time.perf_counter()
    emit(
        {
            "policy": policy_spec,
            "jobs": len(trace),
            "gpus": result.num_gpus,
            "import_s": round(t_import - t0, 3),
            "read_s": round(t_read - t_import, 3),
            "simulate_s": round(t_sim - t_read, 3),
            "total_s": round(t_sim - t0, 3),
            "peak_rss_mib": round(peak_rss_mib(), 1),
            "avg_jct_s": result.summary["avg_jct_s"],
            "us_per_job": round((t_sim - t_read) / len(trace) * 1e6, 1),
        }
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policy", action="append", help="policy spec (repeatable); default fifo")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("args", nargs="*", help=argparse.SUPPRESS)
    ns = parser.parse_args()
    if ns.child:
        child(ns.args[0])
        return
    print(f"{'policy':<28}{'read s':>8}{'sim s':>8}{'total s':>9}{'peak MiB':>10}{'us/job':>8}  target")
    for spec in ns.policy or ["fifo"]:
        r = run_child(__file__, spec)
        target = TARGETS.get(spec)
        verdict = ""
        if target:
            ok = r["total_s"] <= target[0] and r["peak_rss_mib"] <= target[1]
            verdict = f"<= {target[0]:g} s, <= {target[1]:g} MiB: {'met' if ok else 'MISSED'}"
        print(
            f"{spec:<28}{r['read_s']:>8.2f}{r['simulate_s']:>8.2f}{r['total_s']:>9.2f}"
            f"{r['peak_rss_mib']:>10.0f}{r['us_per_job']:>8.1f}  {verdict}"
        )


if __name__ == "__main__":
    main()
