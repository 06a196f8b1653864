"""Pipelined restore (issue 19; PipeSwitch §4.2): the time from "resume" to the end of the first step after it,
with the evicted state put back plainly and in layer groups (``corral.job.pipeline``), against a normal step.

For each model (``--models``): train a few steps with Adam (so gradients and the optimizer's state are moved
too), take the median of ``--steps`` normal steps, then ``--repeats`` times: evict (``Residency.evict``, all on
the host, synchronized), and time ``restore()`` + one training step + ``synchronize``, alternately plain and
pipelined. Reported: the median of each, the restore's overhead over a normal step (what a switch costs: PipeSwitch
reports 3.6-6.6 ms of start-up overhead for inference), the plain copy alone, the bytes moved and the groups. That a
pipelined restore gives bit-identical training is checked on the CPU (tests/job/test_pipeline.py).

Without CUDA (or ``--smoke``) it runs a tiny model on the CPU with a ``SimulatedDevice``, whose pipeline copies at
once: a CPU smoke run of the code paths, not a GPU figure.

    python benchmarks/gpu_restore.py --json restore.json                    # on a GPU machine: about 1 minute
    python benchmarks/gpu_restore.py --models resnet50,bert-base --repeats 7
    python benchmarks/gpu_restore.py --smoke
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

# a sibling script: the machine information and the workloads are shared
from gpu_colocation import SMOKE_NOTE, build_workload, cuda_available, machine_info, machine_lines, write_json

from corral.job.memory import Residency
from corral.job.pipeline import first_group_bytes, leaf_modules, plan_groups

PIPESWITCH_MS = (3.6, 6.6)  # PipeSwitch's start-up overhead (OSDI'20, §6.2), inference


def measure(name: str, batch: int, ns: argparse.Namespace, smoke: bool) -> dict[str, Any]:
    import torch

    from corral.job.device import SimulatedDevice, TorchDevice

    device = torch.device("cpu" if smoke else "cuda")
    if not smoke:
        torch.backends.cudnn.benchmark = True
    work = build_workload(name, batch, device, precision="bf16")
    model, batches = work.model, work.batches
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    dev: Any = SimulatedDevice(capacity_mib=1 << 16) if smoke else TorchDevice()
    if ns.keep_cache:  # an experiment: does the allocator's emptied cache (cudaMalloc on restore) cost the time?
        dev.release_cached = lambda: None
    residency = Residency(model, optimizer, dev)
    dev.attach(residency)
    state = {"i": 0}

    def sync() -> None:
        if not smoke:
            torch.cuda.synchronize()

    def step(index: int | None = None) -> None:
        """One training step, on the next batch (or batch ``index``)."""
        if index is None:
            index = state["i"]
            state["i"] += 1
        b = batches[index % len(batches)]
        optimizer.zero_grad(set_to_none=True)
        work.loss_fn(b).backward()
        optimizer.step()

    for _ in range(ns.warmup):
        step()
    sync()
    normal = []
    for _ in range(ns.steps):
        t0 = time.perf_counter()
        step()
        sync()
        normal.append(time.perf_counter() - t0)
    step_ms = statistics.median(normal) * 1e3
    # Gradients exist at a boundary (set to None only at the next step's start): keep them, as a job's would be.
    nbytes = sum(t.nelement() * t.element_size() for t in residency.tensors())

    kinds = ("plain", "pipelined", "side")  # side: the pipelined copies, but waited for before the step
    runs: dict[str, list[float]] = {k: [] for k in (*kinds, "copy")}
    calls: dict[str, list[float]] = {k: [] for k in kinds}  # the restore call alone (CPU: queuing the copies)
    for r in range(ns.repeats):
        for how in kinds[r % 3 :] + kinds[: r % 3]:
            residency.evict()
            sync()
            t0 = time.perf_counter()
            residency.restore(pipelined=how != "plain")
            calls[how].append(time.perf_counter() - t0)
            if how == "side":
                residency.settle()
            step()
            sync()
            runs[how].append(time.perf_counter() - t0)
            residency.settle()
        residency.evict()
        sync()
        t0 = time.perf_counter()
        residency.restore()
        sync()
        runs["copy"].append(time.perf_counter() - t0)
    exact = same_after_restores(residency, step, sync, torch) if ns.check else None
    sizes = [
        sum(t.nelement() * t.element_size() for t in [*m._parameters.values(), *m._buffers.values()] if t is not None)
        for m in leaf_modules(model)
    ]
    groups = plan_groups(sizes, first_group_bytes(residency.copy_gbps))
    med = {k: statistics.median(v) * 1e3 for k, v in runs.items()}
    return {
        "model": name,
        "batch": batch,
        "state_mib": round(nbytes / (1 << 20), 1),
        "copy_gbps": round(residency.copy_gbps, 2),
        "groups": len(groups),
        "step_ms": round(step_ms, 3),
        "copy_ms": round(med["copy"], 3),
        "plain_ms": round(med["plain"], 3),
        "pipelined_ms": round(med["pipelined"], 3),
        "plain_overhead_ms": round(med["plain"] - step_ms, 3),
        "pipelined_overhead_ms": round(med["pipelined"] - step_ms, 3),
        "side_ms": round(med["side"], 3),
        "restore_call_ms": {k: round(statistics.median(v) * 1e3, 3) for k, v in calls.items()},
        "repeats": ns.repeats,
        "bit_exact": exact,
    }


def same_after_restores(residency: Residency, step: Any, sync: Any, torch: Any) -> dict[str, bool]:
    """``--check``: from one saved state, a plain restore and a step, then a pipelined restore and the same step
    (deterministic kernels): the parameters and the optimizer's state must be equal bit for bit (a copy that
    landed after the kernel reading it would show here)."""
    import copy

    model, optimizer = residency.model, residency.optimizer
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    saved = copy.deepcopy((model.state_dict(), optimizer.state_dict()))
    results = []
    for pipelined in (False, False, True):  # plain twice: the control (is the step itself deterministic here?)
        model.load_state_dict(saved[0])
        optimizer.load_state_dict(saved[1])
        sync()
        residency.evict()
        residency.restore(pipelined=pipelined)
        step(0)
        sync()
        residency.settle()
        results.append([t.detach().clone() for t in residency.tensors()])

    def same(x: list[Any], y: list[Any]) -> bool:
        return all(torch.equal(a, b) for a, b in zip(x, y, strict=True))

    return {"plain_vs_plain": same(results[0], results[1]), "pipelined_vs_plain": same(results[0], results[2])}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--models", default="resnet50,bert-base", help="comma-separated (gpu_colocation's workloads)")
    p.add_argument("--batch", type=int, help="default 64 for a ResNet, 32 sequences of 128 tokens for bert-base")
    p.add_argument("--warmup", type=int, default=10, help="steps before measuring")
    p.add_argument("--steps", type=int, default=20, help="normal steps for the median")
    p.add_argument("--repeats", type=int, default=7, help="evict/restore cycles per kind")
    p.add_argument("--keep-cache", action="store_true", help="evict without emptying the allocator's cache")
    p.add_argument("--check", action="store_true", help="also check a pipelined restore is bit-exact (slow kernels)")
    p.add_argument("--smoke", action="store_true", help="CPU smoke run (a tiny model, simulated device)")
    p.add_argument("--json", metavar="PATH", help="also write the figures to PATH as JSON")
    ns = p.parse_args(argv)
    smoke = ns.smoke or not cuda_available()
    models = ["tiny-mlp"] if smoke else [m for m in ns.models.split(",") if m]
    info = machine_info(smoke=smoke, torch_cuda=not smoke)
    for line in machine_lines(info):
        print(line)
    rows = []
    for name in models:
        batch = ns.batch or (32 if name == "bert-base" else (256 if smoke else 64))
        rows.append(measure(name, batch, ns, smoke))
        r = rows[-1]
        print(
            f"{r['model']:<10} batch {r['batch']:>3}: state {r['state_mib']:>7.1f} MiB in {r['groups']} groups "
            f"({r['copy_gbps']} GB/s); step {r['step_ms']:.2f} ms; copy alone {r['copy_ms']:.2f} ms; "
            f"restore + first step: plain {r['plain_ms']:.2f} ms (+{r['plain_overhead_ms']:.2f}), "
            f"pipelined {r['pipelined_ms']:.2f} ms (+{r['pipelined_overhead_ms']:.2f})"
            + f"; side stream, waited before the step: {r['side_ms']:.2f} ms; restore call (CPU) {r['restore_call_ms']}"
            + ("" if r["bit_exact"] is None else f"; bit-exact: {r['bit_exact']}")
        )
    print(f"PipeSwitch's start-up overhead (inference): {PIPESWITCH_MS[0]}-{PIPESWITCH_MS[1]} ms")
    if smoke:
        print(f"*** {SMOKE_NOTE} ***")
    out = {"machine": info, "note": SMOKE_NOTE if smoke else None, "models": rows}
    if ns.json:
        write_json(ns.json, out)
    return out


if __name__ == "__main__":
    main()
