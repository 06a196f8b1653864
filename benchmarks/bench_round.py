"""One live scheduling round at 10,000 GPUs with 50,000 queued jobs, under Tiresias and AntMan (default configs).

Design target (docs: DESIGN.md, "Performance, as the user feels it"): a round takes at most 1 s on a 2-core
machine. A round is what the engine's ``Engine._round`` does: the policy's ``schedule`` plus applying every
action of its decision to the cluster state (and telling the executor). Both are timed; the share spent in
``schedule`` is shown too.

The cluster: 1,250 nodes x 8 GPUs (two PCIe switches of 4 per node, 32 nodes per rack): 750 nodes of an 80 GB
type and 500 of a slower 32 GB type. AntMan's run has 16 tenants whose quotas (Zipf-skewed) add up to the 10,000
GPUs; Tiresias' run has the same tenants without quotas. Jobs: mostly 1 GPU (70%), then 2, 4 and 8 GPUs, a few of
16, 32 and 64; 3% ask for a share of one GPU; of the queued ones, 15% want only the 80 GB type and 5% only the
32 GB one; tenants Zipf-skewed like the quotas; models drawn from the default mix; no durations (live jobs have
none). For AntMan 30% of the jobs are opportunistic.

The state is built the way the live controller builds it: the real :class:`~corral.engine.loop.Engine` on a
virtual clock, with a stand-in executor that starts nothing and, for a policy that reads telemetry (AntMan),
reports a measurement (SM use, memory) for each job as it starts, as the node agents would. Scenarios, each with
its own fresh engine (nothing is timed while building it):

- ``fill``: an idle cluster; 50,000 jobs arrive at once; the round launches until nothing more fits.
- ``burst``: the cluster about 90% held by jobs that started over the previous 4 hours (one round per arrival,
  untimed; under AntMan the opportunistic ones among them are upgraded into the quota left, so it ends ~99%
  held); then 50,000 jobs arrive at once and the round is timed. Under Tiresias the newcomers, in the top queue,
  preempt the demoted jobs: thousands of preemptions and launches. Under AntMan every tenant's quota is full and
  its queue waits at its head, so the round is short.
- ``finish`` / ``arrive`` / ``timer``: after the burst (a full cluster, ~50,000 queued), a running job finishes,
  or one job arrives, once a minute; the rounds those trigger are timed, and so is every round a policy timer
  triggers in between (Tiresias' demotions, AntMan's coordinator checks).

    python benchmarks/bench_round.py            # both policies, all scenarios
    python benchmarks/bench_round.py --quick    # fewer repetitions
    python benchmarks/bench_round.py --policy antman --steps 20
    python benchmarks/bench_round.py --nodes 1000 --target 0.3   # issue 14: 1,000 nodes x 8 GPUs, at most 0.3 s
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import sys
import time
import zlib
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from _common import emit, peak_rss_mib, run_child

TARGET_S = 1.0
NODES_FAST, NODES_SLOW, GPUS_PER_NODE = 750, 500, 8
NUM_TENANTS = 16
QUEUED = 50_000
RUNNING_SHARE = 0.9  # of the GPUs held before the burst
WARMUP_S = 4 * 3600.0
SIZES = ((1, 0.70), (2, 0.10), (4, 0.09), (8, 0.08), (16, 0.02), (32, 0.007), (64, 0.003))


# -- the workload ---------------------------------------------------------------------------------------------
def make_cluster(quotas: bool) -> Any:
    from corral.core.cluster import Cluster, GpuType, NodeSpec
    from corral.core.tenant import Tenant

    types = (GpuType("a100-80g", 81_920, 1.0), GpuType("v100-32g", 32_768, 0.5))
    nodes = tuple(
        NodeSpec(
            f"n{i:04d}",
            types[0].name if i < NODES_FAST else types[1].name,
            GPUS_PER_NODE,
            rack=f"rack-{i // 32}",
            gpus_per_switch=4,
        )
        for i in range(NODES_FAST + NODES_SLOW)
    )
    total = len(nodes) * GPUS_PER_NODE
    weights = [1 / (k + 1) for k in range(NUM_TENANTS)]
    shares = [int(total * w / sum(weights)) for w in weights]
    shares[0] += total - sum(shares)  # quotas add up to the cluster
    tenants = tuple(Tenant(f"t{k:02d}", shares[k] if quotas else None) for k in range(NUM_TENANTS))
    return Cluster("bench-10k", types, nodes, tenants)


def make_jobs(
    prefix: str, count: int, submit_s: list[float], opportunistic: float, seed: int, *, typed: bool = True
) -> list[Any]:
    from corral.core.job import JobClass, JobSpec
    from corral.workloads.models import draw_models, parse_mix

    rng = random.Random(seed)
    models = draw_models(count, parse_mix("default"), seed)
    tenant_w = [1 / (k + 1) for k in range(NUM_TENANTS)]
    sizes, size_w = zip(*SIZES, strict=True)
    jobs = []
    for i in range(count):
        n = rng.choices(sizes, size_w)[0]
        milli = 1000
        if n == 1 and rng.random() < 0.03:
            milli = rng.choice((250, 500))
        r = rng.random()
        types = () if not typed else ("a100-80g",) if r < 0.15 else ("v100-32g",) if r < 0.20 else ()
        cls = JobClass.OPPORTUNISTIC if rng.random() < opportunistic else JobClass.GUARANTEED
        jobs.append(
            JobSpec(
                f"{prefix}{i}",
                submit_s[i],
                n,
                tenant=f"t{rng.choices(range(NUM_TENANTS), tenant_w)[0]:02d}",
                gpu_milli=milli,
                model=models[i],
                job_class=cls,
                gpu_types=types,
            )
        )
    return jobs


def running_workload(opportunistic: float, seed: int) -> list[Any]:
    """Jobs arriving over the warm-up whose guaranteed demand adds up to about ``RUNNING_SHARE`` of the cluster (and
    of each tenant's quota, as tenants are drawn with the quotas' weights). They name no GPU type, so that none
    waits at the head of its tenant's queue for a type that is full: the cluster does fill up."""
    from corral.core.job import JobClass

    target = RUNNING_SHARE * (NODES_FAST + NODES_SLOW) * GPUS_PER_NODE
    pool = make_jobs("r", 12_000, [0.0] * 12_000, opportunistic, seed, typed=False)
    picked, demand = [], 0.0
    for spec in pool:
        if demand >= target:
            break
        picked.append(spec)
        if spec.job_class is JobClass.GUARANTEED:
            demand += spec.gpu_demand_milli / 1000
    step = WARMUP_S / len(picked)
    return [replace(spec, submit_s=i * step) for i, spec in enumerate(picked)]


# -- the engine, as the live controller runs it -----------------------------------------------------------------
class StandInExecutor:
    """Starts nothing; reports one plausible measurement per started job when the policy reads telemetry."""

    def __init__(self, telemetry: bool) -> None:
        self.telemetry = telemetry
        self.sink: Any = None

    def bind(self, sink: Any) -> None:
        self.sink = sink

    def launch(self, job: Any, now_s: float) -> None:
        if self.telemetry:
            self.sink.report(job.spec.job_id, self._measure(job, now_s))

    def _measure(self, job: Any, now_s: float) -> Any:
        from corral.core.job import mem_given
        from corral.core.telemetry import Telemetry
        from corral.policies.antman.coordinator import expected_mem_mib

        p = job.placement
        h = zlib.crc32(job.spec.job_id.encode())
        sm = 0.2 + 0.75 * (h % 1000) / 1000  # 0.2 .. 0.95
        topo_mem = self.sink.state.topology.gpu_mem_mib[p.gpus[0]]
        need = expected_mem_mib(job.spec, topo_mem)
        given = mem_given(job.spec, p) or need
        peak = min(need, given) * 8 // 10
        step = 0.5 if p.gpu_milli else 0.5 * 1e6
        return Telemetry(now_s, step, 0.5, peak, peak // 2, need, sm if p.gpu_milli else 0.0)

    def preempt(self, job: Any, now_s: float, *, suspend: bool = False) -> float:
        return float(job.work_done_s)

    def resized(self, job: Any, now_s: float, before: Any) -> None:
        return None

    def finished(self, job: Any, now_s: float) -> None:
        return None

    def cancel(self, job: Any, now_s: float) -> None:
        return None

    def demand_changed(self, job: Any, now_s: float) -> None:
        return None

    def is_current(self, event: Any) -> bool:
        return True


class Bench:
    """A fresh engine and the figures of the rounds timed on it, by label."""

    def __init__(self, policy_name: str) -> None:
        from corral.core.cluster import Topology
        from corral.engine.clock import VirtualClock
        from corral.engine.loop import Engine
        from corral.engine.state import ClusterState
        from corral.policies import make_policy

        self.antman = policy_name == "antman"
        policy = make_policy(policy_name)
        self.cluster = make_cluster(quotas=self.antman)
        topo = Topology(self.cluster)
        self.state = ClusterState(topo, self.cluster.tenants, queue_key=policy.queue_key)
        self.engine = Engine(self.state, policy, StandInExecutor(policy.needs_telemetry), VirtualClock())
        self.label: str | None = None
        self.samples: dict[str, list[tuple[float, float, int]]] = {}
        self._schedule_s = 0.0
        self._actions = 0
        original_round = self.engine._round
        original_schedule = policy.schedule

        def timed_schedule(view: Any, now_s: float) -> Any:
            t0 = time.perf_counter()
            decision = original_schedule(view, now_s)
            self._schedule_s = time.perf_counter() - t0
            self._actions = len(decision.actions)
            return decision

        def timed_round(now_s: float) -> None:
            if self.label is None:
                original_round(now_s)
                return
            gc.collect()
            t0 = time.perf_counter()
            original_round(now_s)
            total = time.perf_counter() - t0
            self.samples.setdefault(self.label, []).append((total, self._schedule_s, self._actions))

        policy.schedule = timed_schedule  # type: ignore[method-assign]
        self.engine._round = timed_round  # type: ignore[method-assign]

    @property
    def opportunistic(self) -> float:
        return 0.3 if self.antman else 0.0

    def run(self, until_s: float, label: str | None = None) -> None:
        self.label = label
        self.engine.run(until_s)
        self.label = None

    def queue(self, at_s: float, seed: int) -> None:
        for spec in make_jobs("q", QUEUED, [at_s] * QUEUED, self.opportunistic, seed):
            self.engine.submit(spec)


def set_nodes(nodes: int) -> None:
    """A cluster of ``nodes`` nodes of 8 GPUs, three in five of the fast type (as the default 1,250: 750 + 500)."""
    global NODES_FAST, NODES_SLOW
    NODES_FAST = round(nodes * 0.6)
    NODES_SLOW = nodes - NODES_FAST


def child(policy: str, reps: int, steps: int) -> None:
    from corral.core.events import JobFinished

    out: dict[str, Any] = {"policy": policy, "rounds": {}}
    held = []
    for rep in range(reps):
        b = Bench(policy)
        b.queue(0.0, seed=100 + rep)
        b.run(0.0, "fill")
        out["rounds"].setdefault("fill", []).extend(b.samples["fill"])
        del b
        gc.collect()
    for rep in range(reps):
        b = Bench(policy)
        t_build = time.perf_counter()
        b.engine.feed(running_workload(b.opportunistic, seed=200 + rep))
        b.run(WARMUP_S)
        held.append(b.state.allocated_milli / 1000 / b.state.topology.num_gpus)
        b.queue(WARMUP_S, seed=300 + rep)
        out["build_s"] = round(time.perf_counter() - t_build, 1)
        b.run(WARMUP_S, "burst")
        if rep == reps - 1:  # the steady rounds, on the last one
            rng = random.Random(7)
            now = WARMUP_S
            arrivals = make_jobs("a", steps, [0.0] * steps, b.opportunistic, seed=400)
            for i in range(steps):
                now += 30.0
                b.run(now, "timer")
                running = list(b.state.running())
                job = running[rng.randrange(len(running))]
                b.engine.schedule(now, JobFinished(job.spec.job_id, job.run_epoch))
                b.run(now, "finish")
                now += 30.0
                b.run(now, "timer")
                b.engine.submit(replace(arrivals[i], submit_s=now))
                b.run(now, "arrive")
            out["queued_after"] = b.state.num_pending
            out["held_after"] = round(b.state.allocated_milli / 1000 / b.state.topology.num_gpus, 3)
        out["rounds"].setdefault("burst", []).extend(b.samples.pop("burst"))
        for label, samples in b.samples.items():
            out["rounds"].setdefault(label, []).extend(samples)
        del b
        gc.collect()
    out["held_before_burst"] = round(statistics.mean(held), 3)
    out["peak_rss_mib"] = round(peak_rss_mib(), 1)
    emit(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policy", action="append", choices=("tiresias", "antman"), help="default: both")
    parser.add_argument("--reps", type=int, default=3, help="fresh engines for the fill and burst rounds")
    parser.add_argument("--steps", type=int, default=10, help="job finishes (and as many arrivals) after the burst")
    parser.add_argument("--quick", action="store_true", help="one fill and one burst round, 3 steps")
    parser.add_argument("--nodes", type=int, default=NODES_FAST + NODES_SLOW, help="nodes of 8 GPUs (default 1,250)")
    parser.add_argument("--target", type=float, default=TARGET_S, help="seconds a round may take (default 1)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("args", nargs="*", help=argparse.SUPPRESS)
    ns = parser.parse_args()
    if ns.child:
        set_nodes(int(ns.args[3]))
        child(ns.args[0], int(ns.args[1]), int(ns.args[2]))
        return
    target = ns.target
    gpus = ns.nodes * GPUS_PER_NODE
    from rich.console import Console
    from rich.table import Table

    reps, steps = (1, 3) if ns.quick else (ns.reps, ns.steps)
    table = Table(
        title=f"one scheduling round: {gpus:,} GPUs, {QUEUED:,} queued jobs (target: <= {target:g} s)",
        caption="sched s: median time in the policy's schedule(); actions: the most in one round",
    )
    for col in ("policy", "scenario", "rounds", "median s", "max s", "sched s", "actions", f"<= {target:g} s"):
        table.add_column(col, justify="left" if col in ("policy", "scenario") or col.startswith("<=") else "right")
    notes = []
    for policy in ns.policy or ["tiresias", "antman"]:
        r = run_child(__file__, policy, str(reps), str(steps), str(ns.nodes))
        for label in ("fill", "burst", "finish", "arrive", "timer"):
            samples = r["rounds"].get(label)
            if not samples:
                continue
            totals = [s[0] for s in samples]
            worst = max(totals)
            table.add_row(
                policy,
                label,
                str(len(samples)),
                f"{statistics.median(totals):.3f}",
                f"{worst:.3f}",
                f"{statistics.median(s[1] for s in samples):.3f}",
                f"{max(s[2] for s in samples):,}",
                "met" if worst <= target else "MISSED",
            )
        notes.append(
            f"{policy}: {r['held_before_burst']:.0%} of GPUs held before the burst; after the steps "
            f"{r.get('held_after', 0):.0%} held, {r.get('queued_after', 0):,} queued; building the busy state "
            f"{r['build_s']} s; peak memory {r['peak_rss_mib']:.0f} MiB"
        )
    console = Console()
    console.print(table)
    for note in notes:
        console.print(note)


if __name__ == "__main__":
    main()
