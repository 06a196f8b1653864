"""Checkpoint prefetch (issue 19): a resuming run's start to its first step, with the checkpoint read in the
background while the script starts (``CORRAL_CHECKPOINT_PREFETCH=1``, or ``--on auto``: the library's default,
which prefetches only a checkpoint the page cache does not hold) and without (``=0``).

A node's agent (:class:`corral.live.agent.Agent`, one stand-in GPU, warm workers on) runs a training script that
imports torch and :mod:`corral.job`, builds a large model (``--layers`` x ``Linear(--width, --width)``, with Adam:
about 200 MB of parameters and 400 MB of Adam's moments by default) and resumes from a checkpoint of it. The job's
first run writes that checkpoint (one step, then checkpoint and exit, as a preemption does); every later run of
the same job resumes from it, takes its first step and exits without saving, so each reads the same checkpoint.
Timed: from the agent's ``launch`` to the first resumed step (the step begun), with prefetch off and on, cold (a
fresh interpreter) and warm (forked from the agent's zygote), interleaved, medians of ``--runs``; and, from the
script's own clock, where the time went: the imports (to ``import corral.job`` done), building the model,
``Job()`` (the restore: with prefetch on, waiting for the background read, then ``load_state_dict``).

By default the checkpoint is in the page cache (as when it was written on this node); ``--uncached`` evicts its
files from the page cache before each run (``posix_fadvise(DONTNEED)``), as when the run lands on a node that has
not read it yet.

    python benchmarks/bench_prefetch.py                  # 7 runs of each mode, about 2 minutes (idle machine)
    python benchmarks/bench_prefetch.py --uncached       # as after a migration (--on auto: the same runs)
    python benchmarks/bench_prefetch.py --layers 2 --width 512 --runs 10 --min-mib 0   # a small one: its cost
    python benchmarks/bench_prefetch.py --gpu            # on a GPU machine: the model on cuda:0, pinned prefetch
    python benchmarks/bench_prefetch.py --gpu --unpinned # the same, the prefetch into ordinary memory
    python benchmarks/bench_prefetch.py --smoke          # a tiny model, one run each: the code paths only

A state file smaller than ``--min-mib`` (the library's ``CORRAL_CHECKPOINT_PREFETCH_MIN_MIB``, 64 MiB) is not
prefetched at all: both modes then run the same code.

``--gpu`` runs the agent on the machine's real GPUs (NVML), the model on the job's GPU: the prefetch then reads
the state into pinned host memory, and the restore's ``load_state_dict`` copies it to the GPU; the first step is
timed to its start as on the CPU (the copies are done: ``copy_`` from host memory is synchronous).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from bench_switch import Exits, job_env, log_line

from corral.core.errors import ConfigError
from corral.job.checkpoint import STATE_NAME, CheckpointStore
from corral.job.env import DEFAULT_CHECKPOINT_PREFETCH_MIN_MIB, ENV_CHECKPOINT_PREFETCH, ENV_CHECKPOINT_PREFETCH_MIN_MIB
from corral.live.agent import Agent, LaunchRequest
from corral.live.agent.gpus import discover_gpus

# argv: MODE (init | resume), LAYERS, WIDTH. Prints one RESUMED line with its clock's marks (time.time()).
SCRIPT = """import time
t_start = time.time()
import json, os, sys
import torch
import corral.job
from corral.job.prefetch import pending_prefetch
if os.environ.get("BENCH_PREFETCH_UNPINNED") == "1":  # --unpinned: as the import would, but pin=False
    corral.job.prefetch_checkpoint(os.environ["CORRAL_CHECKPOINT_DIR"], min_bytes=0, pin=False)
t_imported = time.time()
mode, layers, width = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)]).to(device)
opt = torch.optim.Adam(model.parameters(), lr=1e-4)
x = torch.randn(8, width, device=device)
t_built = time.time()
prefetch = pending_prefetch()
with corral.job.Job(model=model, optimizer=opt, verbose=False) as job:
    t_restored = time.time()
    for _ in job.loop(range(10**9)):
        if mode == "init":
            job.request_checkpoint()  # this step, then checkpoint and exit with 75
        else:
            t_first = time.time()
            print("RESUMED " + json.dumps({
                "run": job.run, "start_step": job.start_step, "prefetched": job.prefetched,
                "pinned": prefetch.pinned if prefetch is not None else 0,
                "read_s": prefetch.read_s if prefetch is not None else None,
                "start": t_start, "imported": t_imported, "built": t_built, "restored": t_restored,
                "first": t_first,
            }), flush=True)
            break
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
"""

MODES = ("cold, prefetch off", "cold, prefetch on", "warm, prefetch off", "warm, prefetch on")


def resumed(agent: Agent, exits: Exits, job_id: str, run: int, timeout_s: float = 300.0) -> dict[str, Any]:
    """Run ``run``'s RESUMED line, from the job's log."""

    def find(line: str) -> dict[str, Any] | None:
        if line.startswith("RESUMED "):
            found: dict[str, Any] = json.loads(line[8:])
            if found["run"] == run:
                return found
        return None

    return log_line(agent, exits, job_id, run, find, timeout_s)


def evict_from_page_cache(directory: Path) -> None:
    for path in directory.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=7, help="resumed runs of each mode (default 7)")
    parser.add_argument("--layers", type=int, default=3, help="Linear layers of the model (default 3)")
    parser.add_argument("--width", type=int, default=4096, help="their width (default 4096: 50M parameters)")
    parser.add_argument("--uncached", action="store_true", help="evict the checkpoint from the page cache first")
    parser.add_argument("--gpu", action="store_true", help="on the machine's GPU (NVML), not a stand-in")
    parser.add_argument(
        "--min-mib",
        type=int,
        default=DEFAULT_CHECKPOINT_PREFETCH_MIN_MIB,
        help=f"CORRAL_CHECKPOINT_PREFETCH_MIN_MIB: the smallest state file prefetched (default "
        f"{DEFAULT_CHECKPOINT_PREFETCH_MIN_MIB}; 0 to measure the prefetch of a small checkpoint)",
    )
    parser.add_argument(
        "--on",
        choices=("1", "auto"),
        default="1",
        help="CORRAL_CHECKPOINT_PREFETCH of the 'on' runs: 1 (default: always) or auto (the library's default: "
        "only when the checkpoint is not in the page cache, so with --uncached)",
    )
    parser.add_argument(
        "--unpinned",
        action="store_true",
        help="prefetch on: into ordinary memory even with CUDA (Prefetch(pin=False)), to weigh the pinning on a GPU",
    )
    parser.add_argument("--smoke", action="store_true", help="a tiny model, one run of each mode (--min-mib 0)")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    if args.smoke:
        args.runs, args.layers, args.width, args.min_mib = 1, 2, 256, 0
    try:
        gpus = discover_gpus() if args.gpu else discover_gpus(stand_in=1)
    except ConfigError as e:
        raise SystemExit(f"--gpu: {e}") from None
    with tempfile.TemporaryDirectory(prefix="corral-prefetch-") as tmp:
        base = Path(tmp)
        script, work = base / "train.py", base / "work"
        script.write_text(SCRIPT)
        work.mkdir()
        exits = Exits()
        agent = Agent(base / "state", gpus[:1], exits, warm=True)
        agent.start()
        try:
            zygote = agent._zygote
            if zygote is None or not zygote.wait_ready(120.0):
                raise SystemExit("the agent's warm workers did not start")
            job_id, shape = "prefetch", (str(args.layers), str(args.width))

            def launch(run: int, mode: str, *, warm: bool, prefetch: bool) -> LaunchRequest:
                env = {
                    **job_env(),
                    ENV_CHECKPOINT_PREFETCH: args.on if prefetch and not args.unpinned else "0",
                    ENV_CHECKPOINT_PREFETCH_MIN_MIB: str(args.min_mib),
                }
                if prefetch and args.unpinned and prefetched:
                    env["BENCH_PREFETCH_UNPINNED"] = "1"
                command = (sys.executable, str(script), mode, *shape)
                return LaunchRequest(job_id, run, command, str(work), env, (0,), tenant="t", warm=warm)

            agent.launch(launch(1, "init", warm=True, prefetch=False))
            if exits.wait(job_id, 1, timeout_s=600)[1].exit_code != 75:
                raise SystemExit(f"the first run did not checkpoint:\n{agent.log_path(job_id).read_text()}")
            latest = CheckpointStore(agent.checkpoint_dir(job_id, "t")).latest()
            assert latest is not None
            size = sum(p.stat().st_size for p in latest.iterdir())
            prefetched = (latest / STATE_NAME).stat().st_size >= args.min_mib * 1024 * 1024
            rows: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
            run = 1
            for i in range(args.runs):
                order = MODES if i % 2 == 0 else MODES[1::-1] + MODES[:1:-1]  # off/on, then on/off: no order bias
                for mode in order:
                    run += 1
                    if args.uncached:
                        evict_from_page_cache(latest)
                    began = time.time()
                    agent.launch(launch(run, "resume", warm=mode.startswith("warm"), prefetch=mode.endswith("on")))
                    found = resumed(agent, exits, job_id, run)
                    exits.wait(job_id, run, timeout_s=120)
                    # auto decides by what the page cache holds at the run's start: whatever it did is measured
                    expected = found["prefetched"] if args.on == "auto" else prefetched and mode.endswith("on")
                    if found["prefetched"] != expected or found["start_step"] != 1:
                        raise SystemExit(f"run {run} ({mode}) did not resume as asked: {found}")
                    found["launched"] = began
                    rows[mode].append(found)
        finally:
            agent.close()

    device = "GPU " + gpus[0].name if args.gpu else "CPU, stand-in GPU"
    cache = "evicted from the page cache before each run" if args.uncached else "in the page cache"
    print(
        f"checkpoint prefetch, {args.runs} resumed runs of each mode ({device}; {args.layers} x Linear({args.width}, "
        f"{args.width}) with Adam: a {size / 1e6:,.0f} MB checkpoint, {cache}"
        + ("" if prefetched else "; not prefetched: smaller than --min-mib")
        + (f"; prefetch on: CORRAL_CHECKPOINT_PREFETCH={args.on}" if prefetched else "")
        + ("; prefetch into ordinary memory (--unpinned)" if args.unpinned else "")
        + "):"
    )
    figures: dict[str, Any] = {
        "runs": args.runs,
        "layers": args.layers,
        "width": args.width,
        "bytes": size,
        "device": device,
        "uncached": args.uncached,
        "unpinned": args.unpinned,
        "on": args.on,
    }
    for mode, found_rows in rows.items():

        def med(a: str, b: str, rows: list[dict[str, Any]] = found_rows) -> float:
            return statistics.median(r[b] - r[a] for r in rows) * 1000

        total = med("launched", "first")
        worst = max(r["first"] - r["launched"] for r in found_rows) * 1000
        reads = [r["read_s"] for r in found_rows if r["read_s"] is not None]
        read = f", background read {statistics.median(reads) * 1000:,.0f} ms" if reads else ""
        pinned = f", {found_rows[0]['pinned']} storages pinned" if found_rows[0]["pinned"] else ""
        if args.on == "auto" and mode.endswith("on"):
            pinned += f"; auto prefetched in {sum(1 for r in found_rows if r['prefetched'])} of {len(found_rows)} runs"
        figures[mode] = {
            "start_to_first_step_ms": total,
            "max_ms": worst,
            "to_script_ms": med("launched", "start"),
            "imports_ms": med("start", "imported"),
            "build_ms": med("imported", "built"),
            "restore_ms": med("built", "restored"),
            "first_ms": med("restored", "first"),
            "prefetched_runs": sum(1 for r in found_rows if r["prefetched"]),
        }
        print(
            f"  {mode}: start to first resumed step {total:7,.1f} ms median (max {worst:,.1f}): to the script "
            f"{med('launched', 'start'):,.0f}, imports {med('start', 'imported'):,.0f}, model built "
            f"{med('imported', 'built'):,.0f}, Job() restore {med('built', 'restored'):,.0f}, to the step "
            f"{med('restored', 'first'):,.0f} ms{read}{pinned}"
        )
    for start in ("cold", "warm"):
        off = figures[f"{start}, prefetch off"]["start_to_first_step_ms"]
        on = figures[f"{start}, prefetch on"]["start_to_first_step_ms"]
        print(f"  {start}: prefetch saves {off - on:,.1f} ms ({(off - on) / off * 100:.1f}%)")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1) + "\n")


if __name__ == "__main__":
    main()
