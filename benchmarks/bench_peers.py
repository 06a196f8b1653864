"""corral against peer simulators' own results (``../shared/data/peers/``), with the peer's assumptions matched.

Prints, per workload and schedule, the peer's average JCT, corral's, and their ratio; exits 1 when a ratio is
more than ``--tolerance`` (default 2%) off. The peer figures are read from the peers README's tables (they are
measured facts about the peer's code, kept with the data, not here).

- The Tiresias authors' simulator (``--scheme count``) on ``tiresias/60_job.csv``, clusters 2x4 and 4x4:
  FIFO, SRTF, 2D-LAS and 2D-Gittins.
- The Pollux artifact's Tiresias on its eight workloads, 16x4.

python benchmarks/bench_peers.py [--only tiresias|pollux] [--tolerance 0.02]
"""

from __future__ import annotations

import argparse
import re
import sys

from corral.core.options import build_config
from corral.policies.registry import make_policy
from corral.sim.clusters import load_cluster
from corral.sim.perf import PerfModel
from corral.sim.runner import simulate
from corral.sim.workload import WorkloadSpec, build_trace
from corral.workloads.data import data_dir, data_file

# The peer's assumptions, as corral options (the peers README, "corral's closest options").
TIRESIAS_PERF = "restore_s=0,spread_rate=1,cross_rack_rate=1,model_spread=false,suspend_resume_s=0"
TIRESIAS_SCHEDULES = {
    "fifo (yarn)": "fifo",
    "shortest (SRTF)": "srtf",
    "dlas-gpu (2D-LAS)": "tiresias:thresholds_gpu_s=3250/7200,sensitive=none",
    "dlas-gpu-gittins": "tiresias:priority=gittins,gittins_rerank=true,thresholds_gpu_s=3250/7200,sensitive=none",
}
POLLUX_PERF = "restore_s=30,spread_rate=1,cross_rack_rate=1,model_spread=false"
POLLUX_POLICY = "tiresias:thresholds_gpu_s=57600,sensitive=none,within_queue=entry,round_s=60"


def _peer_tables(readme: str) -> tuple[dict[str, float], dict[tuple[str, str], float]]:
    """The Pollux table (workload -> avg JCT) and the Tiresias table ((cluster, schedule) -> avg JCT)."""
    pollux: dict[str, float] = {}
    for m in re.finditer(r"^\| (pollux-workload-\d+) \| ([\d,.]+) \|", readme, re.M):
        pollux[m.group(1)] = float(m.group(2).replace(",", ""))
    tiresias: dict[tuple[str, str], float] = {}
    header: list[str] | None = None
    for line in readme.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells and cells[0] == "cluster":
            header = cells
            continue
        if header is None or not line.startswith("|") or set(line) <= set("|- "):
            if header is not None and not line.startswith("|"):
                header = None
            continue
        name = re.sub(r" \(.*\)", "", cells[0])
        for col, value in zip(header[1:], cells[1:], strict=False):
            tiresias[(name, col)] = float(value.replace(",", ""))
    return pollux, tiresias


def _avg_jct(trace_spec: WorkloadSpec, cluster: str, policy: str, perf: str) -> float:
    trace = build_trace(trace_spec)
    model = build_config(PerfModel, dict(kv.split("=", 1) for kv in perf.split(",")), "the perf model")
    result = simulate(trace, load_cluster(cluster), make_policy(policy), perf=model)
    return float(result.summary["avg_jct_s"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", choices=["tiresias", "pollux"])
    ap.add_argument("--tolerance", type=float, default=0.02)
    args = ap.parse_args()
    peers = data_dir() / "peers"
    pollux, tiresias = _peer_tables((peers / "README.md").read_text())
    rows: list[tuple[str, str, float, float]] = []
    if args.only in (None, "tiresias"):
        sixty = WorkloadSpec(fmt="tiresias", path=str(data_file("tiresias", "60_job.csv")))
        for cluster in ("2x4", "4x4"):
            for column, policy in TIRESIAS_SCHEDULES.items():
                got = _avg_jct(sixty, cluster, policy, TIRESIAS_PERF)
                rows.append((f"60_job {cluster}", policy, tiresias[(cluster, column)], got))
    if args.only in (None, "pollux"):
        columns = "id=id,submit=submit,duration=duration,gpus=gpus"
        for name, peer in sorted(pollux.items(), key=lambda kv: int(kv[0].rsplit("-", 1)[1])):
            spec = WorkloadSpec(fmt="csv", path=str(peers / f"{name}-corral.csv"), columns=columns)
            rows.append((name, POLLUX_POLICY, peer, _avg_jct(spec, "16x4", POLLUX_POLICY, POLLUX_PERF)))
    worst = 0.0
    print(f"{'workload':<20} {'policy':<44} {'peer':>10} {'corral':>10} {'ratio':>7}")
    for name, policy, peer, got in rows:
        ratio = got / peer
        worst = max(worst, abs(ratio - 1))
        flag = "" if abs(ratio - 1) <= args.tolerance else "  off"
        print(f"{name:<20} {policy:<44} {peer:>10,.1f} {got:>10,.1f} {ratio:>7.3f}{flag}")
    print(f"worst: {worst:.1%} off (tolerance {args.tolerance:.0%})")
    return 0 if worst <= args.tolerance else 1


if __name__ == "__main__":
    sys.exit(main())
