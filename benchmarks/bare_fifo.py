"""A bare-bones FIFO replay of the Philly trace: the reference that corral's replay speed is measured against.

Independent of corral (it imports nothing of it, except in ``--check``): it reads ``philly.csv`` and the
machine list itself, and computes the schedule of a strict FIFO gang scheduler with one heap of events and no
performance model (every job runs for its trace duration). It is what corral's ``fifo`` computes on the
neutral performance model (no locality penalty, no restore cost, no demand change), job for job:

- a job is submitted at its timestamp less the earliest one (seconds, timestamps taken as UTC); ties keep file
  order;
- at each instant, every finish and every arrival due then is taken first, then the queue's head starts while
  some GPU type has enough free GPUs for its whole gang (the first such type in the machine list's order: a
  gang runs on one type), and the first head that does not fit blocks the queue (head-of-line blocking);
- a job ends at its start plus its duration.

Which GPUs of a type a job gets does not matter to when anything starts, so only free counts per type are kept.

    python benchmarks/bare_fifo.py               # the schedule's average JCT and the time it took
    python benchmarks/bare_fifo.py --check       # ... and compare every job's start and end with corral's
                                                 #     fifo on the neutral performance model (about 10 s more)
"""

from __future__ import annotations

import argparse
import bisect
import csv
import heapq
import sys
import time
from collections import deque
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "philly"

Job = tuple[str, float, float, int]  # (job id, submit s, duration s, GPUs)


def read_jobs(path: Path) -> list[Job]:
    """The trace's jobs sorted by submit time (stable: ties keep file order); ids ``philly-<data row>``."""
    rows: list[tuple[str, float, float, int]] = []
    with open(path, newline="") as f:
        reader = csv.reader(f)
        header = [h.strip() for h in next(reader)]
        i_ts, i_dur, i_gpus = header.index("timestamp"), header.index("duration"), header.index("num_gpus")
        for i, row in enumerate(reader):
            if not row:
                continue  # the file ends with an empty line
            ts = datetime.fromisoformat(row[i_ts].strip()).replace(tzinfo=UTC).timestamp()
            rows.append((f"philly-{i}", ts, float(row[i_dur]), int(row[i_gpus])))
    origin = min(r[1] for r in rows)
    jobs = [(job_id, ts - origin, dur, gpus) for job_id, ts, dur, gpus in rows]
    jobs.sort(key=lambda j: j[1])
    return jobs


Node = tuple[int, int]  # (GPU type index, GPUs)


def read_nodes(path: Path) -> list[Node]:
    """The machines with GPUs, in file order, as (type, GPUs); a type is a GPU memory size, numbered in order of
    first appearance."""
    types: dict[str, int] = {}
    nodes: list[Node] = []
    with open(path, newline="") as f:
        reader = csv.reader(f)
        next(reader)
        for row in reader:
            if not row or int(row[1]) == 0:
                continue  # the file's end, or a machine without GPUs
            nodes.append((types.setdefault(row[2].strip(), len(types)), int(row[1])))
    return nodes


def fifo(jobs: list[Job], nodes: list[Node]) -> dict[str, tuple[float, float]]:
    """Strict FIFO, gang, one heap of events: ``job id -> (start s, end s)``. ``jobs`` sorted by submit time.

    Placement is corral's ``consolidated`` rule, on free GPU counts per node (which GPUs of a node a job gets
    changes nothing about when jobs start): a gang runs on one type, among the types with enough free GPUs;
    the node with the fewest free GPUs that still holds it (over those types, for each count the types in
    order), else whole nodes of the first such type, fullest first, and the best fit for the rest. Nodes of a
    free count are taken in the order they came to that count (oldest first); nodes whose count a round has
    already changed come after the others, by index. That order is corral's, and under load it decides which
    type a one-GPU job takes, hence when later gangs fit."""
    n_types = 1 + max(t for t, _ in nodes)
    size = [max(g for t, g in nodes if t == ty) for ty in range(n_types)]
    free = [g for _, g in nodes]
    type_free = [sum(g for t, g in nodes if t == ty) for ty in range(n_types)]
    # buckets[type][count]: nodes with that many free GPUs, in the order they got there (dicts keep it)
    buckets: list[list[dict[int, None]]] = [[{} for _ in range(m + 1)] for m in size]
    for i, (t, g) in enumerate(nodes):
        buckets[t][g][i] = None
    most = max(type_free)
    queue: deque[Job] = deque()
    # One heap of events (time, kind, seq, payload): kind 0 = a job ends (payload: its nodes and GPUs there),
    # 1 = the next arrival (payload: its index). Arrivals are streamed: only the next one is in the heap.
    events: list[tuple[float, int, int, Any]] = []
    out: dict[str, tuple[float, float]] = {}
    seq = 0
    if jobs:
        events.append((jobs[0][1], 1, 0, 0))

    def move(node: int, delta: int) -> None:
        t = nodes[node][0]
        del buckets[t][free[node]][node]
        free[node] += delta
        buckets[t][free[node]][node] = None
        type_free[t] += delta

    plan_free: dict[int, int] = {}  # a round's plan: node -> free GPUs, for the nodes it changed
    by_count: dict[tuple[int, int], list[int]] = {}  # (type, count) -> nodes the plan changed to it, ascending

    def first(t: int, k: int, skip: set[int]) -> int | None:
        """The first node of type ``t`` with ``k`` free GPUs in the round's plan, not in ``skip``."""
        for node in buckets[t][k] if k < len(buckets[t]) else ():
            if node not in plan_free and node not in skip:
                return node
        return next((node for node in by_count.get((t, k), ()) if node not in skip), None)

    while events:
        now = events[0][0]
        while events and events[0][0] == now:
            _, kind, _, payload = heapq.heappop(events)
            if kind == 0:
                for node, g in payload:
                    move(node, g)
            else:
                job = jobs[payload]
                if job[3] <= most:  # a gang larger than every type can never run (corral rejects it)
                    queue.append(job)
                if payload + 1 < len(jobs):
                    heapq.heappush(events, (jobs[payload + 1][1], 1, 0, payload + 1))
        if not queue:
            continue
        # A round: plan on a copy of the counts; nodes changed in the round come after the others, by index.
        plan_free.clear()
        by_count.clear()
        plan_type = list(type_free)
        launched: list[tuple[Job, list[tuple[int, int]]]] = []
        while queue:
            job = queue[0]
            n = job[3]
            fits = [t for t in range(n_types) if plan_type[t] >= n]
            if not fits:
                break  # the head does not fit: it blocks the queue
            taken: list[tuple[int, int]] = []
            one = None
            for k in range(n, max(size[t] for t in fits) + 1):
                one = next((nd for t in fits if k <= size[t] and (nd := first(t, k, set())) is not None), None)
                if one is not None:
                    taken.append((one, n))
                    break
            if one is None:
                t, need, used = fits[0], n, set()
                while need > 0:
                    fit = next((nd for k in range(need, size[t] + 1) if (nd := first(t, k, used)) is not None), None)
                    if fit is not None:
                        taken.append((fit, need))
                        break
                    full = next(nd for k in range(size[t], 0, -1) if (nd := first(t, k, used)) is not None)
                    got = plan_free.get(full, free[full])
                    taken.append((full, got))
                    need -= got
                    used.add(full)
            for node, g in taken:
                t = nodes[node][0]
                had = plan_free.get(node)
                if had is None:
                    had = free[node]
                else:
                    by_count[(t, had)].remove(node)
                plan_free[node] = had - g
                bisect.insort(by_count.setdefault((t, had - g), []), node)
                plan_type[t] -= g
            queue.popleft()
            launched.append((job, sorted(taken)))
        for job, taken in launched:  # applied in launch order, each gang's nodes by index
            for node, g in taken:
                move(node, -g)
            end = now + job[2]
            out[job[0]] = (now, end)
            seq += 1
            heapq.heappush(events, (end, 0, seq, taken))
    return out


def corral_fifo(jobs_csv: Path, jobs: list[Job] | None = None) -> dict[str, tuple[float, float]]:
    """corral's ``fifo`` on the ``philly`` cluster with the neutral performance model: job id -> (start, end).
    ``jobs``: replay these (id, submit, duration, GPUs) instead of the file's, for a test on a subset."""
    from dataclasses import replace

    from corral.policies import make_policy
    from corral.sim.clusters import load_cluster
    from corral.sim.perf import PerfModel
    from corral.sim.runner import simulate
    from corral.sim.traces import Trace, read_philly

    neutral = PerfModel.neutral()
    trace = read_philly(jobs_csv)
    if jobs is not None:
        by_id = {spec.job_id: spec for spec in trace.jobs}
        specs = [replace(by_id[j], submit_s=s, duration_s=d, num_gpus=g) for j, s, d, g in jobs]
        trace = Trace(jobs=specs, source=trace.source)
    result = simulate(trace, load_cluster("philly"), make_policy("fifo"), perf=neutral)
    return {
        j.job_id: (j.first_start_s, j.end_s) for j in result.jobs if j.first_start_s is not None and j.end_s is not None
    }


def compare(ours: dict[str, tuple[float, float]], theirs: dict[str, tuple[float, float]]) -> list[str]:
    """Every job whose (start, end) differs, as a line each; empty when the schedules are the same."""
    return [
        f"{j}: reference {ours.get(j)} corral {theirs.get(j)}"
        for j in sorted(set(ours) | set(theirs))
        if ours.get(j) != theirs.get(j)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trace", type=Path, default=DATA / "philly.csv")
    parser.add_argument("--machines", type=Path, default=DATA / "cluster_machine_list.csv")
    parser.add_argument("--check", action="store_true", help="compare every job's start and end with corral's")
    ns = parser.parse_args()
    t0 = time.perf_counter()
    jobs = read_jobs(ns.trace)
    nodes = read_nodes(ns.machines)
    t1 = time.perf_counter()
    schedule = fifo(jobs, nodes)
    t2 = time.perf_counter()
    jcts = [schedule[j][1] - s for j, s, _, _ in jobs if j in schedule]
    print(
        f"{len(jobs)} jobs on {sum(g for _, g in nodes)} GPUs: avg JCT {sum(jcts) / len(jcts):.3f} s; "
        f"read {t1 - t0:.3f} s, simulate {t2 - t1:.3f} s"
    )
    if ns.check:
        diffs = compare(schedule, corral_fifo(ns.trace))
        if diffs:
            print(f"MISMATCH: {len(diffs)} jobs differ from corral's fifo (neutral model); first ones:")
            print("\n".join(diffs[:10]))
            sys.exit(1)
        print(f"check: all {len(schedule)} jobs start and end as in corral's fifo (neutral performance model)")


if __name__ == "__main__":
    main()
