#!/usr/bin/env bash
# Every GPU measurement of docs/measurements.md in one run of under 10 minutes, for a machine lent for a short
# time: the co-location phases (shortened windows), memory caps / eviction / duty cycle, and corral.job's
# overhead per step. Each script gets its own time limit, so one that fails or hangs does not cost the others.
#
#   bash benchmarks/gpu_measure.sh OUTDIR
#
# Runs from the repository root with the machine's own python3 (a CUDA build of PyTorch and torchvision) and
# corral from ./src (PYTHONPATH), as docs/measurements.md describes for a machine without network access.
# Writes OUTDIR/{colocation,memory,overhead}.json and one log per script; the tables are the logs' last lines.
set -u
out=${1:?usage: gpu_measure.sh OUTDIR}
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

# 1. Co-location (phase d through `corral serve`): shorter windows than the defaults so that all fits the lease.
step colocation 290 "$py" benchmarks/gpu_colocation.py --json "$out/colocation.json" \
    --solo-seconds 20 --pair-seconds 30 --baseline-seconds 15 --coordinated-seconds 75 \
    --settle-seconds 25 --warmup-seconds 6
# 2. Memory caps, evict/restore, duty cycle.
step memory 160 "$py" benchmarks/gpu_memory.py --json "$out/memory.json"
# 3. corral.job's cost per step with CUDA events.
step overhead 110 "$py" benchmarks/bench_job_overhead.py --device cuda --json "$out/overhead.json"

for name in colocation memory overhead; do
    echo; echo "######## $name (last lines)"; tail -n 45 "$out/$name.log"
done
cat "$out/summary.txt"
