"""Fractional GPU placement on Alibaba's openb trace: best fit, worst fit and FGD (Weng et al., ATC'23).

Replays ``openb_pod_list_default.csv`` (6,203 GPU pods, 2,573 of them asking for part of one GPU) on the
``openb`` cluster (6,212 GPUs on 1,213 nodes) under ``fifo:placement=consolidated`` (best fit),
``fifo:placement=spread`` (worst fit) and ``fifo:placement=fgd``, one fresh process per run, at each setting:

- ``load``: :func:`corral.sim.traces.scale_load` divides inter-arrival times by it. The trace spans 149 days and
  all its pods together ask for 5,485 GPUs, 88% of the cluster: at x1, x50, even x1000, pods barely overlap,
  and at x100000 (arrivals within 129 s, so nearly everything runs at once) best fit still fits everything.
- ``inflate``: for queueing to appear the workload must outgrow the cluster, so, as the paper's evaluation does
  (ATC'23 §6.1, Monte-Carlo inflation of the trace's pods), ``round((inflate - 1) x n)`` more pods drawn
  uniformly from the trace (seed 0) are added, each a copy arriving with its original.

Per run: wall time of ``simulate`` (with its decision log on, which the figures below need), average and p99
queueing over finished pods, average JCT, ``gpu_alloc_util`` (over the makespan, which one 145-day pod
stretches: a small number for every run), pods finished, and two figures of fragmentation:

- ``frag %``: FGD's own measure, sum over nodes of F_n(M) / free GPU share (see
  :mod:`corral.policies.framework.placement.fgd`), with M the popularity of the replayed trace's shapes (top 16),
  averaged over the placement window (first submission to last launch), weighted by free share: of the
  capacity that was free while pods were being placed, the part the typical pod could not have used;
- ``idle %``: the free share of the cluster, as a fraction of its capacity, averaged over the time at least
  one pod waited (``-`` when none did): capacity that fragmentation (or head-of-line blocking) kept idle.

Both come from the decision log and the finish times, replayed GPU by GPU after the run; they do not count in
the wall time. ``--fill`` adds the paper's own experiment: pods drawn from the trace arrive and never leave
until one does not fit; it prints the allocated share of the cluster at the first failure and after arrivals
worth 130% of the cluster, and the frag share of what is then left free.

    python benchmarks/bench_fragmentation.py                      # the default grid
    python benchmarks/bench_fragmentation.py --setting 1.2:1e5 --policy fifo:placement=fgd,backfill=true
    python benchmarks/bench_fragmentation.py --fill
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from _common import emit, run_child

TRACE = ("alibaba-openb", "openb_pod_list_default.csv")
POLICIES = ["fifo:placement=consolidated", "fifo:placement=spread", "fifo:placement=fgd"]
# (inflate, load): the trace as recorded, compressed 50x, compressed until nearly everything overlaps, and
# inflated by 10% and 20% with everything overlapping (where queueing, and so fragmentation, starts to cost).
SETTINGS = ["1:1", "1:50", "1:1e5", "1.1:1e5", "1.2:1e5"]
TOP_K = 16


def inflate(trace: Any, factor: float, seed: int = 0) -> Any:
    """The trace plus ``round((factor - 1) x n)`` pods drawn uniformly with replacement, each arriving with its
    original (ATC'23 §6.1 inflates the workload the same way)."""
    import numpy as np

    from corral.sim.traces import Trace

    jobs = list(trace.jobs)
    extra = round((factor - 1.0) * len(jobs))
    if extra <= 0:
        return trace
    picks = np.random.default_rng(seed).integers(0, len(jobs), extra)
    copies = [dataclasses.replace(jobs[i], job_id=f"{jobs[i].job_id}+{k}") for k, i in enumerate(picks.tolist())]
    merged = sorted(jobs + copies, key=lambda j: j.submit_s)  # stable: an original keeps its place
    note = f"inflate x{factor:g}: {extra:,} pods drawn from the trace (seed {seed}) added beside their originals"
    return Trace(merged, trace.source, trace.skipped, [*trace.notes, note])


def fragmentation_figures(result: Any, topo: Any, trace: Any) -> tuple[float | None, float | None]:
    """(frag share over the placement window, idle share while a pod waits), replaying the run GPU by GPU."""
    from corral.core.decisions import Launch, Preempt, Reject
    from corral.core.job import FULL_GPU_MILLI
    from corral.policies.framework.placement.fgd import WorkloadShapes, node_fragmentation

    shapes = WorkloadShapes(trace.jobs)
    weights = [(shape, count / shapes.total) for shape, count in shapes.top(TOP_K)]  # popularity p_m
    free = [FULL_GPU_MILLI] * topo.num_gpus
    node_frag = [0.0] * topo.num_nodes
    capacity = topo.num_gpus * FULL_GPU_MILLI
    total_free = float(capacity)
    total_frag = 0.0
    pending = 0
    held: dict[str, Any] = {}
    log = result.decision_log
    # The placement window: from the first submission to the last launch, while placements are being made.
    first_submit = trace.jobs[0].submit_s
    last_launch = max((e.time_s for e in log if isinstance(e.action, Launch)), default=first_submit)
    frag_area = free_area = idle_area = wait_s = 0.0
    last_t = first_submit

    def advance(t: float) -> None:
        nonlocal frag_area, free_area, idle_area, wait_s, last_t
        lo, hi = max(last_t, first_submit), min(t, last_launch)
        if hi > lo:
            frag_area += total_frag * (hi - lo)
            free_area += total_free * (hi - lo)
        if pending and t > last_t:
            idle_area += total_free / capacity * (t - last_t)
            wait_s += t - last_t
        last_t = max(last_t, t)

    def change(gpus: tuple[int, ...], milli: int) -> None:
        nonlocal total_free, total_frag
        for node in {topo.gpu_node[g] for g in gpus}:
            total_frag -= node_frag[node]
        for g in gpus:
            free[g] += milli
            total_free += milli
        for node in {topo.gpu_node[g] for g in gpus}:
            vec = [free[g] for g in topo.node_gpus(node)]
            node_frag[node] = node_fragmentation(vec, topo.type_names[topo.node_type[node]], weights)
            total_frag += node_frag[node]

    # Three time-ordered streams: submissions, finishes, and the decision log. At one instant the engine takes
    # submissions and finishes first, then the round's decisions.
    submits = [j.submit_s for j in trace.jobs]
    finishes = sorted((j.end_s, j.spec.job_id) for j in result.jobs if j.end_s is not None)
    si = fi = li = 0
    inf = float("inf")
    while si < len(submits) or fi < len(finishes) or li < len(log):
        ts = submits[si] if si < len(submits) else inf
        tf = finishes[fi][0] if fi < len(finishes) else inf
        tl = log[li].time_s if li < len(log) else inf
        t = min(ts, tf, tl)
        advance(t)
        if ts == t:
            pending += 1
            si += 1
        elif tf == t:
            placement = held.pop(finishes[fi][1], None)
            if placement is not None:
                change(placement.gpus, placement.gpu_milli)
            fi += 1
        else:
            action = log[li].action
            if isinstance(action, Launch):
                held[action.job_id] = action.placement
                change(action.placement.gpus, -action.placement.gpu_milli)
                pending -= 1
            elif isinstance(action, Preempt):
                placement = held.pop(action.job_id)
                change(placement.gpus, placement.gpu_milli)
                pending += 1
            elif isinstance(action, Reject):
                pending -= 1
            li += 1
    frag = frag_area / free_area if free_area > 0 else None
    idle = idle_area / wait_s if wait_s > 0 else None
    return frag, idle


def child(policy_spec: str, setting: str) -> None:
    import numpy as np

    from corral.core.cluster import Topology
    from corral.policies.registry import make_policy
    from corral.sim.clusters import load_cluster
    from corral.sim.runner import simulate
    from corral.sim.traces import read_openb, scale_load
    from corral.workloads.data import data_file

    factor, load = (float(x) for x in setting.split(":"))
    trace = scale_load(inflate(read_openb(data_file(*TRACE)), factor), load)
    cluster = load_cluster("openb")
    policy = make_policy(policy_spec)
    t0 = time.perf_counter()
    result = simulate(trace, cluster, policy, record_decisions=True)
    wall = time.perf_counter() - t0
    frag, idle = fragmentation_figures(result, Topology(cluster), trace)
    queued = np.array([j.queued_s for j in result.jobs if j.end_s is not None])
    s = result.summary
    emit(
        {
            "setting": setting,
            "policy": policy_spec,
            "jobs": len(trace),
            "wall_s": round(wall, 2),
            "avg_queue_s": s["avg_queueing_s"],
            "p99_queue_s": round(float(np.percentile(queued, 99)), 1) if len(queued) else 0.0,
            "waited": int((queued > 0).sum()),
            "avg_jct_s": s["avg_jct_s"],
            "gpu_alloc_util": s["gpu_alloc_util"],
            "finished": s["jobs_finished"],
            "frag": frag,
            "idle": idle,
        }
    )


def fill(seeds: int, strategies: list[str]) -> list[dict[str, Any]]:
    """ATC'23 §6's experiment: pods drawn from the trace arrive, none leaves; placement alone decides how much of
    the cluster gets used. Returns, per strategy and seed, the allocated share at the first pod that did not
    fit and after arrivals of 130% of the cluster's capacity, with the frag share of what is left free then."""
    import numpy as np

    from corral.core.cluster import Topology
    from corral.engine.state import ClusterState
    from corral.policies.framework.contract import allowed_types
    from corral.policies.framework.placement import PlacementStrategy, place
    from corral.policies.framework.placement.fgd import FragmentationScorer, WorkloadShapes, node_fragmentation
    from corral.policies.framework.planner import Planner
    from corral.sim.clusters import load_cluster
    from corral.sim.traces import read_openb
    from corral.workloads.data import data_file

    trace = read_openb(data_file(*TRACE))
    cluster = load_cluster("openb")
    topo = Topology(cluster)
    capacity = topo.num_gpus * 1000
    known = WorkloadShapes(trace.jobs)
    weights = [(shape, count / known.total) for shape, count in known.top(TOP_K)]
    rows = []
    for name in strategies:
        strategy = PlacementStrategy(name)
        for seed in range(seeds):
            state = ClusterState(topo, cluster.tenants)
            # The scorer knows the trace's shape popularity up front, as the paper assumes.
            scorer = FragmentationScorer(known)
            rng = np.random.default_rng(seed)
            arrived = 0
            first_fail = None
            t0 = time.perf_counter()
            n = 0
            while arrived < 1.3 * capacity:
                spec = dataclasses.replace(trace.jobs[int(rng.integers(0, len(trace.jobs)))], job_id=f"p{n}")
                n += 1
                arrived += spec.num_gpus * spec.gpu_milli
                state.add(spec, 0.0)
                placement = place(Planner(state), spec, strategy, allowed_types(state, spec), scorer)
                if placement is None:
                    if first_fail is None:
                        first_fail = state.allocated_milli / capacity
                    continue
                state.launch(spec.job_id, placement, 0.0)
            wall = time.perf_counter() - t0
            free = [state.gpu_free_milli(g) for g in range(topo.num_gpus)]
            frag = sum(
                node_fragmentation([free[g] for g in topo.node_gpus(n)], topo.type_names[topo.node_type[n]], weights)
                for n in range(topo.num_nodes)
            )
            rows.append(
                {
                    "strategy": name,
                    "seed": seed,
                    "first_fail": first_fail,
                    "final": state.allocated_milli / capacity,
                    "frag": frag / sum(free) if sum(free) else None,
                    "wall_s": wall,
                }
            )
    return rows


def main() -> None:
    from rich.console import Console
    from rich.table import Table

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policy", action="append", help="policy spec (repeatable); default the three placements")
    parser.add_argument("--setting", action="append", help="INFLATE:LOAD (repeatable); default " + " ".join(SETTINGS))
    parser.add_argument("--fill", action="store_true", help="also run the paper's fill-until-full experiment")
    parser.add_argument("--fill-only", action="store_true", help="only the fill experiment")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("args", nargs="*", help=argparse.SUPPRESS)
    ns = parser.parse_args()
    if ns.child:
        child(ns.args[0], ns.args[1])
        return
    console = Console(width=None if sys.stdout.isatty() else 200)  # a file or pipe gets whole columns
    if not ns.fill_only:
        table = Table(title="openb default trace on the openb cluster (6,212 GPUs): FIFO, three placements")
        for col in ("inflate:load", "policy", "jobs", "wall s", "avg queue s", "p99 queue s", "waited", "avg JCT s"):
            table.add_column(col, justify="left" if col in ("inflate:load", "policy") else "right")
        for col in ("alloc util", "finished", "frag %", "idle %"):
            table.add_column(col, justify="right")
        for setting in ns.setting or SETTINGS:
            for spec in ns.policy or POLICIES:
                r = run_child(__file__, spec, setting)
                table.add_row(
                    setting,
                    spec,
                    f"{r['jobs']:,}",
                    f"{r['wall_s']:.2f}",
                    f"{r['avg_queue_s']:,.2f}",
                    f"{r['p99_queue_s']:,.1f}",
                    f"{r['waited']:,}",
                    f"{r['avg_jct_s']:,.0f}",
                    f"{r['gpu_alloc_util']:.4f}",
                    f"{r['finished']:,}",
                    "-" if r["frag"] is None else f"{100 * r['frag']:.2f}",
                    "-" if r["idle"] is None else f"{100 * r['idle']:.2f}",
                )
            table.add_section()
        console.print(table)
    if ns.fill or ns.fill_only:
        table = Table(title="fill until full, no departures (ATC'23 §6): allocated share of the cluster")
        for col in ("placement", "seed", "at first failure %", "after 130% arrived %", "frag % then", "wall s"):
            table.add_column(col, justify="left" if col == "placement" else "right")
        for row in fill(3, ["consolidated", "spread", "fgd"]):
            table.add_row(
                row["strategy"],
                str(row["seed"]),
                "-" if row["first_fail"] is None else f"{100 * row['first_fail']:.2f}",
                f"{100 * row['final']:.2f}",
                "-" if row["frag"] is None else f"{100 * row['frag']:.1f}",
                f"{row['wall_s']:.2f}",
            )
        console.print(table)


if __name__ == "__main__":
    main()
