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


def table(folder: Path) -> str:
    sums = {}
    for slug in POLICIES:
        path = folder / slug / "summary.json"
        sums[slug] = json.loads(path.read_text()) if path.exists() else {}
    lines = ["| metric | " + " | ".join(POLICIES.values()) + " |", "|---|" + "---:|" * len(POLICIES)]
    for key, label, fmt in METRICS:
        cells = [fmt.format(sums[s][key]) if key in sums[s] else "-" for s in POLICIES]
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
