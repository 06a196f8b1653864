"""Live mode on a Ray cluster (issue 14): how long the multi-node paths take, on a local Ray cluster of fake nodes
with stand-in GPUs (``ray.cluster_utils.Cluster`` on 127.0.0.1), the controller in this process.

- ``gang start``: submit to all ranks started, a 4-GPU job spanning 2 nodes on 3 nodes x 2 GPUs (the "started"
  event is written when every rank's process has started).
- ``node lost``: a node removed from the Ray cluster while a 2-GPU job runs there; to the job requeued (target at
  most 5 s) and to its next run started on another node.
- ``restart``: the controller stopped with 50 jobs running on 3 nodes (fractional shares, 10 per GPU), a new one
  started on the same state: to every run reattached.
- ``fan-out``: one round's actions sent to 1,000 agents and answered. A local machine cannot hold 1,000 Ray
  actor processes, so 16 agent actors stand in for them, each taking 1,000/16 of the calls (what is measured is
  the controller's side: 1,000 actor calls out and their answers gathered with ``ray.wait``).

    python benchmarks/bench_multinode.py           # 5 repetitions of each
    python benchmarks/bench_multinode.py --reps 2
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # keep Ray on 127.0.0.1; read at import

PY = sys.executable
TARGET_REQUEUE_S = 5.0


def _until(cond: Callable[[], bool], timeout_s: float = 120.0) -> float:
    t0 = time.perf_counter()
    while not cond():
        if time.perf_counter() - t0 > timeout_s:
            raise SystemExit("timed out")
        time.sleep(0.005)
    return time.perf_counter() - t0


class Bench:
    def __init__(self) -> None:
        import ray
        from ray.cluster_utils import Cluster

        from corral.live.transport.ray import NODE_LABEL

        self.ray = ray
        self.label = NODE_LABEL
        self.cluster = Cluster(
            initialize_head=True, head_node_args={"num_cpus": 2, "num_gpus": 0, "node_ip_address": "127.0.0.1"}
        )
        self.nodes: dict[str, Any] = {}
        for i in range(3):
            self.add(f"node{i}")
        ray.init(address=self.cluster.address, namespace="corral", logging_level="ERROR", log_to_driver=False)
        self.tmp = Path(tempfile.mkdtemp(prefix="corral-bench-"))

    def add(self, name: str) -> None:
        self.nodes[name] = self.cluster.add_node(
            num_cpus=1, num_gpus=2, node_ip_address="127.0.0.1", labels={self.label: name}
        )

    def controller(self, state: Path, policy: str = "fifo") -> Any:
        from corral.live.config import ServeConfig
        from corral.live.controller import Controller

        c = Controller.from_config(ServeConfig(state_dir=state, ray=self.cluster.address, grace_s=5.0, policy=policy))
        c.start()
        return c

    def clear_agents(self) -> None:
        for name in list(self.nodes):
            with contextlib.suppress(ValueError):
                self.ray.kill(self.ray.get_actor(f"corral-agent-{name}", namespace="corral"))


def _request(code: str, num_gpus: int = 1, gpu_milli: int = 1000) -> Any:
    from corral.live.records import JobRequest

    return JobRequest(
        command=(PY, "-c", code), tenant="default", cwd=os.getcwd(), num_gpus=num_gpus, gpu_milli=gpu_milli
    )


def gang_start(b: Bench, reps: int) -> list[float]:
    c = b.controller(b.tmp / "gang")
    out = []
    try:
        for _ in range(reps):
            job = c.submit(_request("import time; time.sleep(0.2)", num_gpus=4))
            _until(lambda j=job.job_id: any(e.kind == "started" for e in c.events(j)))
            events = {e.kind: e.time_s for e in c.events(job.job_id)}
            out.append(events["started"] - events["submitted"])
            _until(lambda j=job.job_id: c.job(j).phase.value == "finished")
    finally:
        c.stop()
        b.clear_agents()
    return out


def _lose_one(b: Bench, state: Path) -> tuple[float, float]:
    """One 2-GPU job running; its node removed: to the job requeued, and to its next run started elsewhere."""
    c = b.controller(state)
    node = ""
    try:
        job = c.submit(_request("import time; time.sleep(600)", num_gpus=2)).job_id
        _until(lambda: c.job(job).process.phase.value == "running")
        placement = c.job(job).status.placement
        node = c.cluster().gpus[placement.gpus[0]].node
        t0 = time.perf_counter()
        b.cluster.remove_node(b.nodes.pop(node))
        _until(lambda: c.job(job).status.preemptions >= 1)
        requeued = time.perf_counter() - t0
        _until(lambda: c.job(job).process.run == 2 and c.job(job).process.phase.value == "running")
        restarted = time.perf_counter() - t0
        c.cancel(job)
    finally:
        c.stop()
        b.clear_agents()
        if node and node not in b.nodes:
            b.add(node)
    return requeued, restarted


def node_lost(b: Bench, reps: int) -> tuple[list[float], list[float]]:
    runs = [_lose_one(b, b.tmp / f"lost{rep}") for rep in range(reps)]
    return [r[0] for r in runs], [r[1] for r in runs]


def restart(b: Bench, reps: int) -> list[float]:
    out = []
    state = b.tmp / "restart"
    c = b.controller(state)
    jobs = [c.submit(_request("import time; time.sleep(3600)", gpu_milli=100)) for _ in range(50)]
    try:
        _until(lambda: all(c.job(j.job_id).process.phase.value == "running" for j in jobs))
        for _ in range(reps):
            c.stop()
            t0 = time.perf_counter()
            c = b.controller(state)
            _until(lambda c=c: all(c.job(j.job_id).process.phase.value == "running" for j in jobs))
            out.append(time.perf_counter() - t0)
            assert all(c.job(j.job_id).process.run == 1 for j in jobs), "a run was started again"
    finally:
        for j in jobs:
            c.cancel(j.job_id)
        c.stop()
        b.clear_agents()
    return out


class _Standin:
    """An agent actor's answer to a request, and nothing else (the fan-out's stand-in for a node agent)."""

    def preempt(self, job_id: str, run: int, seq: int | None) -> None:
        return None


def fan_out(b: Bench, reps: int, agents: int = 1000, actors: int = 16) -> list[float]:
    ray = b.ray
    cls = ray.remote(_Standin)
    pool = [cls.options(num_cpus=0, max_concurrency=8).remote() for _ in range(actors)]
    ray.get([a.preempt.remote("warm", 0, None) for a in pool])
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        refs = [pool[i % actors].preempt.remote(f"job{i}", 1, None) for i in range(agents)]
        pending = refs
        while pending:
            _ready, pending = ray.wait(pending, num_returns=len(pending), timeout=1.0)
        out.append(time.perf_counter() - t0)
    for a in pool:
        ray.kill(a)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=5)
    ns = parser.parse_args()
    try:
        import ray  # noqa: F401
    except ImportError:
        raise SystemExit("needs Ray: pip install -e '.[ray]'") from None
    from rich.console import Console
    from rich.table import Table

    t0 = time.perf_counter()
    b = Bench()
    up_s = time.perf_counter() - t0
    rows = []
    rows.append(("gang start: submit to all ranks started (2 of 3 nodes)", gang_start(b, ns.reps), None))
    requeued, restarted = node_lost(b, ns.reps)
    rows.append(("node lost -> job requeued", requeued, TARGET_REQUEUE_S))
    rows.append(("node lost -> job restarted on another node", restarted, None))
    rows.append(("controller restart -> 50 runs on 3 nodes reattached", restart(b, ns.reps), None))
    rows.append(("fan-out: 1,000 agent calls answered (16 actors stand in)", fan_out(b, ns.reps), None))
    table = Table(title=f"live mode on Ray: local cluster of 3 nodes x 2 stand-in GPUs (up in {up_s:.1f} s)")
    for col in ("what", "runs", "median s", "min s", "max s", "target"):
        table.add_column(col, justify="left" if col == "what" else "right")
    for what, samples, target in rows:
        verdict = "-" if target is None else ("met" if max(samples) <= target else "MISSED") + f" (<= {target:g} s)"
        table.add_row(
            what,
            str(len(samples)),
            f"{statistics.median(samples):.3f}",
            f"{min(samples):.3f}",
            f"{max(samples):.3f}",
            verdict,
        )
    Console().print(table)
    b.ray.shutdown()
    b.cluster.shutdown()


if __name__ == "__main__":
    main()
