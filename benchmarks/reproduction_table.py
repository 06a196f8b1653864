"""Print the Markdown tables of docs/reproduction.md from the output folder of ``benchmarks/reproduce.sh``.

python benchmarks/reproduction_table.py OUT [SETTING ...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

POLICIES = {
    "yarn-cs": "YARN-CS",
    "fifo_backfill=true": "FIFO+backfill",
    "tiresias": "Tiresias LAS",
    "tiresias_priority=gittins": "Tiresias Gittins",
    "srtf": "SRTF (oracle)",
    "gandiva": "Gandiva",
    "themis": "Themis",
}
METRICS = [
    ("avg_jct_s", "avg JCT (s)", "{:,.0f}"),
    ("p50_jct_s", "p50 JCT (s)", "{:,.0f}"),
    ("p99_jct_s", "p99 JCT (s)", "{:,.0f}"),
    ("gpu_alloc_util", "GPU alloc util", "{:.3f}"),
    ("makespan_s", "makespan (s)", "{:,.0f}"),
    ("preemptions", "preemptions", "{:,}"),
    ("max_rho", "max rho", "{:,.1f}"),
    ("p90_rho", "p90 rho", "{:.2f}"),
    ("jain_rho_tenants", "Jain (tenants)", "{:.3f}"),
]
# The AntMan settings compare sharing modes on quota workloads (docs/reproduction.md, AntMan section).
ANTMAN_POLICIES = {
    "antman_opportunistic=false": "exclusive",
    "antman_coordinator=false": "packing, no coordinator",
    "antman": "AntMan",
    "gandiva": "Gandiva packing",
}
ANTMAN_METRICS = [
    ("gpu_alloc_util", "GPU alloc util", "{:.3f}"),
    ("gpu_sm_util", "SM util (used)", "{:.3f}"),
    ("gpu_mem_util", "memory util (used)", "{:.3f}"),
    ("g_slowdown_p50", "guaranteed slowdown p50", "{:.3f}"),
    ("g_slowdown_p99", "guaranteed slowdown p99", "{:.3f}"),
    ("g_slowdown_max", "guaranteed slowdown max", "{:.3f}"),
    ("avg_queueing_s", "avg queueing (s)", "{:,.0f}"),
    ("opp_avg_jct_s", "opportunistic avg JCT (s)", "{:,.0f}"),
    ("opp_p99_jct_s", "opportunistic p99 JCT (s)", "{:,.0f}"),
    ("opp_throughput", "opportunistic throughput", "{:.3f}"),
    ("upgrades", "upgrades", "{:,}"),
    ("quota_shortfall_gpu_h", "quota shortfall (GPU-h)", "{:,.0f}"),
    ("jain_rho_tenants", "Jain (tenants)", "{:.3f}"),
    ("avg_jct_s", "avg JCT, all (s)", "{:,.0f}"),
]


def table(folder: Path) -> str:
    antman = (folder / "antman").is_dir()
    policies, metrics = (ANTMAN_POLICIES, ANTMAN_METRICS) if antman else (POLICIES, METRICS)
    sums = {}
    for slug in policies:
        path = folder / slug / "summary.json"
        sums[slug] = json.loads(path.read_text()) if path.exists() else {}
    lines = ["| metric | " + " | ".join(policies.values()) + " |", "|---|" + "---:|" * len(policies)]
    for key, label, fmt in metrics:
        cells = [fmt.format(sums[s][key]) if key in sums[s] else "-" for s in policies]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    root = Path(sys.argv[1])
    settings = sys.argv[2:] or sorted(p.name for p in root.iterdir() if p.is_dir())
    for name in settings:
        if (root / name).is_dir():
            print(f"\n#### {name}\n\n{table(root / name)}")


if __name__ == "__main__":
    main()
