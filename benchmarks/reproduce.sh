#!/bin/bash
# Re-runs every setting of docs/reproduction.md: one `corral compare` per setting, all policies side by side.
#   bash benchmarks/reproduce.sh OUT            # then: python benchmarks/reproduction_table.py OUT
# Needs the shared data folder at ../shared/data (or CORRAL_DATA_DIR). A few minutes on 2 cores.
set -euo pipefail
out=${1:?usage: reproduce.sh OUTDIR}
D=${CORRAL_DATA_DIR:-../shared/data}
P="--policy yarn-cs --policy fifo:backfill=true --policy tiresias --policy tiresias:priority=gittins --policy srtf"
P="$P --policy gandiva --policy themis"
mkdir -p "$out"
run() { name=$1; shift; corral compare "$@" $P --no-progress --overwrite --out "$out/$name" > "$out/$name.txt" 2>&1; }
run sixty_15x4 --format tiresias --trace "$D/tiresias/60_job.csv" --cluster 15x4
run sixty_2x4 --format tiresias --trace "$D/tiresias/60_job.csv" --cluster 2x4
run vc_6c71a0 --format philly --trace "$D/philly/philly.csv" --tenants 6c71a0 --cluster 6x8
run vc_b436b2 --format philly --trace "$D/philly/philly.csv" --tenants b436b2 --cluster 8x8
run vc_6214e9 --format philly --trace "$D/philly/philly.csv" --tenants 6214e9 --cluster 6x8
# Philly-like synthetic jobs (about 42,800 GPU-seconds each) at 50/70/90% nominal load on 128 GPUs.
run synth_u50 --format synthetic --jobs 4000 --fit-to "philly:$D/philly/philly.csv" --jobs-per-hour 5.36 --cluster 16x8
run synth_u70 --format synthetic --jobs 4000 --fit-to "philly:$D/philly/philly.csv" --jobs-per-hour 7.5 --cluster 16x8
run synth_u90 --format synthetic --jobs 4000 --fit-to "philly:$D/philly/philly.csv" --jobs-per-hour 9.65 --cluster 16x8
run hpsearch --format csv --trace examples/hpsearch.csv \
    --columns id=job_id,submit=submit_s,duration=duration_s,gpus=num_gpus,model=model,tenant=tenant --cluster 2x8
run philly_full --format philly --trace "$D/philly/philly.csv" --cluster philly
# AntMan: sharing modes on quota workloads (exclusive, packing without the coordinator, AntMan, Gandiva packing).
P="--policy antman:opportunistic=false --policy antman:coordinator=false --policy antman --policy gandiva"
run antman_openb_own --format openb --trace "$D/alibaba-openb/openb_pod_list_default.csv" --cluster openb \
    --assign-tenants 4 --quotas equal:0.9
run antman_openb_busy --format openb --trace "$D/alibaba-openb/openb_pod_list_default.csv" --cluster 16x8:V100-16GB \
    --assign-tenants 2 --quotas equal:1.0 --scale-load 8
run antman_philly_full --format philly --trace "$D/philly/philly.csv" --cluster philly --quotas philly-vc \
    --opportunistic 0.3
run antman_vc_6c71a0 --format philly --trace "$D/philly/philly.csv" --tenants 6c71a0 --cluster 6x8 \
    --quotas equal:1.0 --opportunistic 0.3
