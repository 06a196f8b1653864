"""Scaling: a synthetic trace of 100,000 and of 1,000,000 jobs under FIFO, one fresh process each.

The cost of a replay should grow about linearly with jobs (no per-event scan of every job or GPU). Issue
targets: the 1M-job replay finishes within 4 GiB, and time per job grows by at most 1.5x from 100k to 1M.

The load is fixed by the arrival rate (default 500 jobs/hour on the 2,490-GPU `philly` cluster, busy but not
saturated with the default synthetic mix), so both sizes see the same queueing regime.

    python benchmarks/bench_scaling.py
    python benchmarks/bench_scaling.py --sizes 100000,300000 --jobs-per-hour 550
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import emit, peak_rss_mib, run_child


def child(n: int, rate: float, policy: str, cluster_spec: str) -> None:
    from corral.policies import make_policy
    from corral.sim.clusters import load_cluster
    from corral.sim.runner import simulate
    from corral.sim.traces import synthesize

    t0 = time.perf_counter()
    trace = synthesize(n, seed=1, jobs_per_hour=rate)
    t1 = time.perf_counter()
    result = simulate(trace, load_cluster(cluster_spec), make_policy(policy))
    t2 = time.perf_counter()
    emit(
        {
            "jobs": n,
            "generate_s": round(t1 - t0, 2),
            "simulate_s": round(t2 - t1, 2),
            "us_per_job": round((t2 - t1) / n * 1e6, 2),
            "peak_rss_mib": round(peak_rss_mib(), 1),
            "avg_queueing_s": result.summary["avg_queueing_s"],
            "finished": result.summary["jobs_finished"],
        }
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="100000,1000000")
    parser.add_argument("--jobs-per-hour", type=float, default=500.0)
    parser.add_argument("--policy", default="fifo")
    parser.add_argument("--cluster", default="philly")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("args", nargs="*", help=argparse.SUPPRESS)
    ns = parser.parse_args()
    if ns.child:
        child(int(ns.args[0]), ns.jobs_per_hour, ns.policy, ns.cluster)
        return
    sizes = [int(s) for s in ns.sizes.split(",")]
    print(f"{'jobs':>10}{'generate s':>12}{'simulate s':>12}{'us/job':>9}{'peak MiB':>10}{'avg queue s':>13}")
    rows = []
    for n in sizes:
        r = run_child(
            __file__, "--jobs-per-hour", str(ns.jobs_per_hour), "--policy", ns.policy, "--cluster", ns.cluster, str(n)
        )
        rows.append(r)
        print(
            f"{n:>10,}{r['generate_s']:>12.2f}{r['simulate_s']:>12.2f}{r['us_per_job']:>9.2f}"
            f"{r['peak_rss_mib']:>10.0f}{r['avg_queueing_s']:>13.1f}"
        )
    if len(rows) >= 2:
        growth = rows[-1]["us_per_job"] / rows[0]["us_per_job"]
        print(f"time per job grows {growth:.2f}x from {sizes[0]:,} to {sizes[-1]:,} jobs (target <= 1.5x)")
        print(f"peak memory at {sizes[-1]:,} jobs: {rows[-1]['peak_rss_mib'] / 1024:.2f} GiB (target <= 4 GiB)")


if __name__ == "__main__":
    main()
