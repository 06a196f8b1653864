#!/usr/bin/env bash
# The GPU measurements of docs/measurements.md, in two sets of under 10 minutes each, for a machine lent for a
# short time. Each script gets its own time limit, so one that fails or hangs does not cost the others.
#
#   bash benchmarks/gpu_measure.sh OUTDIR             # "framework" (sections 1-3): the co-location phases
#                                                     # (shortened windows), memory caps / eviction / duty cycle,
#                                                     # corral.job's overhead per step
#   bash benchmarks/gpu_measure.sh OUTDIR switching   # sections 4-6 (issue 19): pipelined restore (cache emptied
#                                                     # and kept), checkpoint prefetch (600 MB, in and out of the
#                                                     # page cache), warm against cold start of a small job,
#                                                     # the checkpoint-and-resume cycle
#
# Runs from the repository root with the machine's own python3 (a CUDA build of PyTorch and torchvision) and
# corral from ./src (PYTHONPATH), as docs/measurements.md describes for a machine without network access.
# Writes OUTDIR/NAME.json and one log per script; the tables are the logs' last lines.
set -u
out=${1:?usage: gpu_measure.sh OUTDIR [framework|switching]}
set_name=${2:-framework}
case $set_name in framework | switching) ;; *) echo "unknown set: $set_name (framework or switching)" >&2; exit 2 ;; esac
mkdir -p "$out"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
py=${PYTHON:-python3}

nvidia-smi --query-gpu=name,memory.total,driver_version,utilization.gpu --format=csv | tee "$out/machine.txt"
"$py" -c 'import torch, torchvision; print("torch", torch.__version__, "torchvision", torchvision.__version__)' \
    | tee -a "$out/machine.txt"

step() {  # step NAME LIMIT_S COMMAND...: run one measurement under its own limit, log it, say how it ended
    local name=$1 limit=$2; shift 2
    local t0=$SECONDS
    timeout --signal=INT --kill-after=10 "$limit" "$@" >"$out/$name.log" 2>&1
    local rc=$?
    echo "== $name: exit $rc after $((SECONDS - t0)) s (limit $limit s)" | tee -a "$out/summary.txt"
}

if [ "$set_name" = framework ]; then
    names="colocation memory overhead"
    # 1. Co-location (phase d through `corral serve`): shorter windows than the defaults so that all fits the lease.
    step colocation 290 "$py" benchmarks/gpu_colocation.py --json "$out/colocation.json" \
        --solo-seconds 20 --pair-seconds 30 --baseline-seconds 15 --coordinated-seconds 75 \
        --settle-seconds 25 --warmup-seconds 6
    # 2. Memory caps, evict/restore, duty cycle.
    step memory 160 "$py" benchmarks/gpu_memory.py --json "$out/memory.json"
    # 3. corral.job's cost per step with CUDA events.
    step overhead 110 "$py" benchmarks/bench_job_overhead.py --device cuda --json "$out/overhead.json"
else
    names="restore restore-keep prefetch prefetch-uncached start-small switch"
    # 4. Pipelined restore, the allocator's cache emptied at eviction (the default) and kept.
    step restore 90 "$py" benchmarks/gpu_restore.py --repeats 5 --json "$out/restore.json"
    step restore-keep 90 "$py" benchmarks/gpu_restore.py --repeats 5 --keep-cache --json "$out/restore-keep.json"
    # 5. Checkpoint prefetch of a 600 MB checkpoint, cold and warm starts: in the page cache, then evicted from it
    #    before each run (the migration case; --on auto, the library's default).
    step prefetch 120 "$py" benchmarks/bench_prefetch.py --gpu --runs 4 --json "$out/prefetch.json"
    step prefetch-uncached 100 "$py" benchmarks/bench_prefetch.py --gpu --uncached --on auto --runs 3 \
        --json "$out/prefetch-uncached.json"
    # Warm against cold start of a small job (a 2 MB checkpoint): start to first step on the GPU.
    step start-small 70 "$py" benchmarks/bench_prefetch.py --gpu --runs 4 --layers 2 --width 512 --min-mib 0 \
        --json "$out/start-small.json"
    # A preempted job's checkpoint-and-resume cycle, cold against warm (bench_switch.py; it prints, no JSON).
    step switch 60 "$py" benchmarks/bench_switch.py --gpu --cycles 4
fi

for name in $names; do
    echo; echo "######## $name (last lines)"; tail -n 45 "$out/$name.log"
done
cat "$out/summary.txt"
