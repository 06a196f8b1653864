"""AntMan replays at full size: openb's default trace on its 6,212-GPU cluster, and the full Philly trace.

Each measurement runs in a fresh process and prints: time to build the workload, time to simulate, total wall
time of the process's work, peak memory, and the headline sharing figures. Issue targets (2-core machine):
openb default trace with AntMan at most 30 s; Philly full trace with AntMan at most 60 s.

Workloads (the same as the reproduction's, docs/reproduction.md):

- ``openb``: ``openb_pod_list_default.csv``; qos BE pods opportunistic, the rest guaranteed; 4 tenants assigned
  by the seeded rule of ``assign_tenants`` (seed 0) with equal quotas of 90% of the cluster; models drawn from
  the default mix.
- ``philly``: ``philly.csv`` on the ``philly`` cluster; the VCs as tenants with ``philly-vc`` quotas (scaled to
  the cluster); 30% of the jobs opportunistic (seed 0); models drawn from the default mix.

    python benchmarks/bench_antman.py                    # both, antman
    python benchmarks/bench_antman.py --workload openb --policy antman --policy fifo
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import emit, peak_rss_mib, run_child

TARGET_S = {"openb": 30.0, "philly": 60.0}


def child(workload: str, policy_spec: str) -> None:
    t0 = time.perf_counter()
    from corral.policies import make_policy
    from corral.sim.clusters import load_cluster, with_quotas
    from corral.sim.runner import simulate
    from corral.sim.workload import WorkloadSpec, build_trace
    from corral.workloads.data import data_file

    policy = make_policy(policy_spec)
    mix = "default" if policy.needs_models else None
    if workload == "openb":
        path = data_file("alibaba-openb", "openb_pod_list_default.csv")
        spec = WorkloadSpec(fmt="openb", path=str(path), assign_tenants=4, model_mix=mix)
        quotas = "equal:0.9"
    else:
        path = data_file("philly", "philly.csv")
        spec = WorkloadSpec(fmt="philly", path=str(path), opportunistic=0.3, model_mix=mix)
        quotas = "philly-vc"
    trace = build_trace(spec)
    cluster = load_cluster(workload)
    cluster = with_quotas(cluster, quotas, sorted({job.tenant for job in trace.jobs}))
    t_read = time.perf_counter()
    result = simulate(trace, cluster, policy)
    t_sim = time.perf_counter()
    s = result.summary
    emit(
        {
            "workload": workload,
            "policy": policy_spec,
            "jobs": len(trace),
            "read_s": round(t_read - t0, 3),
            "simulate_s": round(t_sim - t_read, 3),
            "total_s": round(t_sim - t0, 3),
            "peak_rss_mib": round(peak_rss_mib(), 1),
            "gpu_sm_util": s["gpu_sm_util"],
            "gpu_mem_util": s["gpu_mem_util"],
            "g_slowdown_p99": s["g_slowdown_p99"],
            "opp_avg_jct_s": s["opp_avg_jct_s"],
        }
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", action="append", choices=sorted(TARGET_S), help="default: both")
    parser.add_argument("--policy", action="append", help="policy spec (repeatable); default antman")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("args", nargs="*", help=argparse.SUPPRESS)
    ns = parser.parse_args()
    if ns.child:
        child(ns.args[0], ns.args[1])
        return
    print(
        f"{'workload':<9}{'policy':<28}{'jobs':>8}{'read s':>8}{'sim s':>8}{'total s':>9}{'peak MiB':>10}"
        f"{'SM used':>9}{'mem used':>9}{'g p99 slow':>11}{'opp JCT s':>11}  target"
    )
    for workload in ns.workload or sorted(TARGET_S):
        for spec in ns.policy or ["antman"]:
            r = run_child(__file__, workload, spec)
            target = TARGET_S[workload]
            verdict = f"<= {target:g} s: {'met' if r['total_s'] <= target else 'MISSED'}" if spec == "antman" else ""
            print(
                f"{workload:<9}{spec:<28}{r['jobs']:>8,}{r['read_s']:>8.2f}{r['simulate_s']:>8.2f}"
                f"{r['total_s']:>9.2f}{r['peak_rss_mib']:>10.0f}{r['gpu_sm_util']:>9.3f}{r['gpu_mem_util']:>9.3f}"
                f"{r['g_slowdown_p99']:>11.3f}{r['opp_avg_jct_s']:>11,.0f}  {verdict}"
            )


if __name__ == "__main__":
    main()
