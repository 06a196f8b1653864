"""HiveD (OSDI'20) at full size, its cost per job, and the per-VC figures of docs/reproduction.md.

Four modes; the timed ones run each measurement in a fresh process (``_common.run_child``):

- default: the full Philly trace (82,247 jobs) on the 2,490-GPU ``philly`` cluster with the Philly VCs' quotas
  (``philly-vc``, scaled to the cluster) as cells, under ``hived`` and ``hived:cells=false`` (quota-only); the
  ``philly-opp`` workload makes 30% of the jobs opportunistic (seed 0), so borrowers run and are preempted.
  Prints time to read the trace, to simulate, the whole process's work, peak memory, queueing, preemptions.
  Issue target (2-core machine): HiveD on the full trace at most 60 s.
- ``--scaling``: synthetic traces shaped like Philly (``--fit-to philly``, its VCs and their frequencies, Poisson
  arrivals at a fixed rate so every size sees the same load) of 50k, 100k and 200k jobs, philly-vc quotas: the
  time per job should stay about flat (no per-event scan of every GPU or job).
- ``--table DIR``: the per-VC queueing tables of a ``corral compare ... --out DIR`` run with quota-only and HiveD
  (``hived:cells=false[,OPTIONS]`` beside ``hived[:OPTIONS]``), from its ``jobs.csv`` files: per VC its cells'
  GPUs, jobs, mean queueing under each policy (all jobs, and multi-GPU jobs: each must fit one node, so
  fragmentation makes them wait), and, pairing each job with itself in the other run, how many waited longer
  under each policy and the longest extra wait. corral's ``tenants.csv`` has the mean per tenant; the breakdowns
  and the pairing are computed here.
- ``--private DIR``: sharing safety on a whole replay. For each VC of the HiveD run in ``DIR`` (a compare of the
  Philly trace on an ``NxG`` cluster whose VCs hold whole nodes), replay the VC's jobs alone on its private
  cluster (``q/G`` nodes, the same policy) and count the jobs whose start or end differs from the shared run:
  HiveD's guarantee is 0.

    python benchmarks/bench_hived.py
    python benchmarks/bench_hived.py --workload philly --policy hived
    python benchmarks/bench_hived.py --scaling
    python benchmarks/bench_hived.py --table out/hived_352x8
    python benchmarks/bench_hived.py --private out/hived_352x8
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import emit, peak_rss_mib, run_child

TARGET_S = 60.0
WORKLOADS = ("philly", "philly-opp")
POLICIES = ("hived", "hived:cells=false")
SCALING_SIZES = (50_000, 100_000, 200_000)
SCALING_RATE = 35.0  # jobs per hour: a little above Philly's own rate (82,247 jobs in 109 days, 31 per hour)


def child(workload: str, policy_spec: str) -> None:
    t0 = time.perf_counter()
    from corral.policies import make_policy
    from corral.sim.clusters import load_cluster, with_quotas
    from corral.sim.runner import simulate
    from corral.sim.workload import WorkloadSpec, build_trace
    from corral.workloads.data import data_file

    path = str(data_file("philly", "philly.csv"))
    if workload.startswith("synthetic-"):
        spec = WorkloadSpec(
            fmt="synthetic", jobs=int(workload.split("-")[1]), jobs_per_hour=SCALING_RATE, fit_to=f"philly:{path}"
        )
    else:
        spec = WorkloadSpec(fmt="philly", path=path, opportunistic=0.3 if workload == "philly-opp" else None)
    trace = build_trace(spec)
    cluster = with_quotas(load_cluster("philly"), "philly-vc", sorted({job.tenant for job in trace.jobs}))
    policy = make_policy(policy_spec)
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
            "us_per_job": round((t_sim - t_read) / len(trace) * 1e6, 1),
            "peak_rss_mib": round(peak_rss_mib(), 1),
            "avg_queueing_s": s["avg_queueing_s"],
            "preemptions": s["preemptions"],
            "rounds": result.rounds,
        }
    )


def measure(workloads: list[str], policies: list[str]) -> None:
    print(
        f"{'workload':<18}{'policy':<22}{'jobs':>8}{'read s':>8}{'sim s':>8}{'total s':>9}{'us/job':>8}"
        f"{'peak MiB':>10}{'avg queue s':>12}{'preempt':>9}  target"
    )
    for workload in workloads:
        for spec in policies:
            r = run_child(__file__, workload, spec)
            verdict = ""
            if spec == "hived" and not workload.startswith("synthetic"):
                verdict = f"<= {TARGET_S:g} s: {'met' if r['total_s'] <= TARGET_S else 'MISSED'}"
            print(
                f"{workload:<18}{spec:<22}{r['jobs']:>8,}{r['read_s']:>8.2f}{r['simulate_s']:>8.2f}"
                f"{r['total_s']:>9.2f}{r['us_per_job']:>8.1f}{r['peak_rss_mib']:>10.0f}{r['avg_queueing_s']:>12,.1f}"
                f"{r['preemptions']:>9,}  {verdict}"
            )


# -- the per-VC table -------------------------------------------------------------------------------------------
def _jobs(folder: Path) -> list[dict[str, str]]:
    with (folder / "jobs.csv").open(newline="") as f:
        return [row for row in csv.DictReader(f) if row["status"] == "finished"]


def _quotas(folder: Path) -> dict[str, str]:
    """Tenant -> quota GPUs (the cells' GPUs on a one-chain cluster), from the run's tenants.csv."""
    with (folder / "tenants.csv").open(newline="") as f:
        return {row["tenant"]: row.get("quota_gpus", "") for row in csv.DictReader(f)}


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _fmt(x: float | None, spec: str = ",.0f") -> str:
    return "-" if x is None else format(x, spec)


def pairs(folder: Path) -> list[tuple[Path, Path]]:
    """(quota-only, HiveD) result folders of a compare run: ``hived_cells=false[_OPTIONS]`` and the same options
    without ``cells=false`` (corral compare names each policy's folder after its spec)."""
    out = []
    for base in sorted(folder.glob("hived*cells=false*")):
        partner = folder / base.name.replace("cells=false_", "").replace("_cells=false", "")
        if partner.is_dir():
            out.append((base, partner))
    return out


def table(base: Path, cells: Path) -> str:
    """Markdown, per VC: mean queueing (s) under quota-only / HiveD, for all jobs and for multi-GPU jobs; and,
    pairing each job with itself in the other run, how many waited longer under each policy and the longest
    extra wait (minutes)."""
    quotas = _quotas(cells)
    quota_runs, hived_runs = _jobs(base), _jobs(cells)
    quota_wait = {r["job_id"]: float(r["queueing_s"]) for r in quota_runs}
    summary = {
        name: json.loads((path / "summary.json").read_text()) for name, path in (("quota", base), ("hived", cells))
    }
    rows = [
        "| VC | cells (GPUs) | jobs | mean queueing (s), quota-only / HiveD | multi-GPU jobs | their mean queueing (s) "
        "| jobs waiting longer under quota-only / HiveD | longest extra wait (min), quota-only / HiveD |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    every = sorted({r["tenant"] for r in hived_runs})
    tenants = [t for t in every if quotas.get(t)]
    others = [t for t in every if not quotas.get(t)]
    for tenant in tenants:
        mine = [r for r in hived_runs if r["tenant"] == tenant and r["job_id"] in quota_wait]
        multi = [r for r in mine if int(r["num_gpus"]) >= 2]
        extra = [quota_wait[r["job_id"]] - float(r["queueing_s"]) for r in mine]  # > 0: longer under quota-only

        def both(rs: list[dict[str, str]]) -> str:
            q = _mean([quota_wait[r["job_id"]] for r in rs])
            h = _mean([float(r["queueing_s"]) for r in rs])
            return f"{_fmt(q)} / {_fmt(h)}"

        longer = f"{sum(1 for x in extra if x > 0):,} / {sum(1 for x in extra if x < 0):,}"
        worst = f"{max([0.0, *extra]) / 60:,.0f} / {max([0.0, *(-x for x in extra)]) / 60:,.0f}"
        quota = quotas.get(tenant) or "none"
        cols = [tenant, quota, f"{len(mine):,}", both(mine), f"{len(multi):,}", both(multi), longer, worst]
        rows.append("| " + " | ".join(cols) + " |")
    rows.append(
        f"| all | | {summary['hived']['jobs_finished']:,} | {summary['quota']['avg_queueing_s']:,.0f} / "
        f"{summary['hived']['avg_queueing_s']:,.0f} | | | | |"
    )
    if others:
        count = sum(1 for r in hived_runs if r["tenant"] in others)
        rows.append(f"\n(Tenants without cells, low priority in both, not shown: {', '.join(others)}; {count:,} jobs.)")
    return "\n".join(rows)


def private(folder: Path) -> None:
    from corral.core.tenant import Tenant
    from corral.policies import make_policy
    from corral.sim.clusters import load_cluster
    from corral.sim.runner import simulate
    from corral.sim.traces import read_philly, select_tenants
    from corral.workloads.data import data_file

    cells = folder / "hived"
    summary = json.loads((cells / "summary.json").read_text())
    nodes, _, per_node = summary["cluster"].partition("x")
    if not (nodes.isdigit() and per_node.isdigit()):
        raise SystemExit(f"--private needs a compare run on an NxG cluster, not {summary['cluster']!r}")
    g = int(per_node)
    shared = {r["job_id"]: (r["start_s"], r["end_s"]) for r in _jobs(cells)}
    trace = read_philly(data_file("philly", "philly.csv"))  # the mode is for Philly runs (summary.json names no path)
    print(f"{'VC':<8}{'private cluster':>16}{'jobs':>8}{'differ':>8}")
    for tenant, quota in sorted(_quotas(cells).items()):
        if not quota or int(quota) % g:
            continue
        mine = select_tenants(trace, [tenant])
        result = simulate(
            mine,
            load_cluster(f"{int(quota) // g}x{g}").with_tenants([Tenant(tenant, int(quota))]),
            make_policy("hived"),
        )
        differ = sum(
            1
            for j in result.jobs
            if shared.get(j.spec.job_id) != (f"{j.first_start_s:.3f}", f"{j.end_s:.3f}") and j.end_s is not None
        )
        print(f"{tenant:<8}{f'{int(quota) // g}x{g}':>16}{len(result.jobs):>8,}{differ:>8,}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", action="append", choices=WORKLOADS, help="default: both")
    parser.add_argument("--policy", action="append", help="policy spec (repeatable); default hived and quota-only")
    parser.add_argument("--scaling", action="store_true", help="time per job on synthetic traces of growing size")
    parser.add_argument("--table", nargs="+", metavar="DIR", help="print the per-VC tables of compare folders")
    parser.add_argument("--private", metavar="DIR", help="check each VC of a compare run against its private cluster")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("args", nargs="*", help=argparse.SUPPRESS)
    ns = parser.parse_args()
    if ns.child:
        child(ns.args[0], ns.args[1])
    elif ns.private:
        private(Path(ns.private))
    elif ns.table:
        for folder in map(Path, ns.table):
            for base, cells in pairs(folder):
                print(f"\n#### {folder.name}: {base.name} / {cells.name}\n\n{table(base, cells)}")
    elif ns.scaling:
        measure([f"synthetic-{n}" for n in SCALING_SIZES], ns.policy or ["hived"])
    else:
        measure(ns.workload or list(WORKLOADS), ns.policy or list(POLICIES))


if __name__ == "__main__":
    main()
