"""Golden figures: every decision-log digest and metric table that tests pin, in one file.

A change meant to alter what a policy decides (or what a replay measures) updates the figures here, and only here;
the tests that check them (named with each table) keep their assertions. Each figure was computed by the code of
its time and is compared exactly as before it moved here (digests equal, metrics within ``abs=1e-3``).
Importable from every test folder as ``golden`` (see ``tests/conftest.py``).
"""

from __future__ import annotations

# -- decision-log digests (tests/sim/test_batch_size.py) ------------------------------------------------------------
# SHA-256 (first 16 hex digits) of each replay's rendered decision log followed by every job's end time and work
# done, computed with the code as it was before batch sizes existed (commit 2e4562e). Regenerate only for a change
# meant to alter these policies' decisions. "sixty/...": the Tiresias 60-job trace on 2x4; "openb/...": 400 jobs of
# openb_pod_list_default at 8 times its load, two tenants with equal quotas, on 4x8:V100-16GB; "+noise": the
# performance model's interference noise 0.3, seed 7.
DECISION_DIGESTS = {
    "sixty/fifo": "95ad5ab03e71094f",
    "sixty/sjf": "56e975d17d176cc1",
    "sixty/srtf": "d74a732c6b800b86",
    "sixty/yarn-cs": "95ad5ab03e71094f",
    "sixty/tiresias": "af5cea670799e584",
    "sixty/tiresias:priority=gittins": "af5cea670799e584",
    "sixty/gandiva": "825cb3360acd4ac8",
    "sixty/themis": "cb7968cc79bb315b",
    "sixty/antman": "19c2dcd827d1a4fa",
    "sixty/gandiva+noise": "1e9f8029eff766a9",
    # Issue 15: the same decisions, at the same times; two jobs (openb-pod-0001 and -0013) end one ulp later, at
    # the correctly rounded end of their rate history: their memory-only resizes, which keep their speed, no
    # longer split their progress in two sums (was "1116bb90c53c3202").
    # Issue 16: AntMan's guests run in their holders' idle slots and slow them only by antman_residual (was the
    # symmetric pair model), and the coordinator's ceilings lapse: guests run faster, finish sooner and free their
    # GPUs at other times, so these decisions move (were "81131900c2072cce" and "9a88e4d08606326d").
    "openb/antman": "fcd393ab02915816",
    "openb/antman:coordinator=false": "509afad4f4f8b337",
    "openb/gandiva": "ac60464836d248b8",
}

# -- summary metrics on the Tiresias 60-job trace, by (policy, cluster) ---------------------------------------------
# Default options and performance model. On n32g4 (128 GPUs) the 60 jobs never contend, so every job runs at
# submission for exactly its trace duration, and every policy gives the same figures (every rho is 1); on 2x4
# (8 GPUs) they queue and the policies differ.
SIXTY_METRICS: dict[tuple[str, str], dict[str, float]] = {
    # tests/sim/test_replay.py
    ("fifo", "n32g4"): dict(avg_jct_s=178.417, p50_jct_s=125.0, p95_jct_s=308.15, p99_jct_s=1054.24,
                            avg_queueing_s=0.0, makespan_s=3271.0, gpu_alloc_util=0.063589),
    ("sjf", "n32g4"): dict(avg_jct_s=178.417, p50_jct_s=125.0, p95_jct_s=308.15, p99_jct_s=1054.24,
                           avg_queueing_s=0.0, makespan_s=3271.0, gpu_alloc_util=0.063589),
    ("fifo", "2x4"): dict(avg_jct_s=1556.483, p50_jct_s=1415.5, p95_jct_s=3897.65, p99_jct_s=3979.89,
                          avg_queueing_s=1378.067, makespan_s=5747.0, gpu_alloc_util=0.579085),
    # SJF spreads some 2-GPU jobs over both nodes; their models' own spread rates apply (VGG at 0.5: with one
    # rate of 0.8 for every model, avg_jct_s was 705.521).
    ("sjf", "2x4"): dict(avg_jct_s=735.736, p50_jct_s=182.5, p95_jct_s=3838.4, p99_jct_s=4223.17,
                         avg_queueing_s=548.205, makespan_s=4835.0, gpu_alloc_util=0.734655),
    # tests/policies/test_themis.py. With the default 10-minute leases one lease is ever taken back on 2x4.
    ("themis", "n32g4"): dict(avg_jct_s=178.417, p50_jct_s=125.0, p95_jct_s=308.15, p99_jct_s=1054.24,
                              avg_queueing_s=0.0, makespan_s=3271.0, gpu_alloc_util=0.063589, preemptions=0,
                              max_rho=1.0, p50_rho=1.0, p90_rho=1.0, p99_rho=1.0, jain_rho_tenants=1.0),
    ("themis", "2x4"): dict(avg_jct_s=718.413, p50_jct_s=183.5, p95_jct_s=3365.55, p99_jct_s=3611.05,
                            avg_queueing_s=531.562, makespan_s=4836.0, gpu_alloc_util=0.731619, preemptions=1,
                            max_rho=2.0525, p50_rho=0.7596, p90_rho=1.7491, p99_rho=2.0001, jain_rho_tenants=1.0),
    # tests/policies/test_gandiva.py. The trace names each job's model; on n32g4 gandiva is FIFO with backfilling.
    ("gandiva", "n32g4"): dict(avg_jct_s=178.417, p50_jct_s=125.0, p95_jct_s=308.15, p99_jct_s=1054.24,
                               avg_queueing_s=0.0, makespan_s=3271.0, gpu_alloc_util=0.063589, preemptions=0),
    # 31 time-slice suspends, 5 packs (googlenet beside ResNet-50 stand-ins: the only pairs of this trace's
    # models that gain on the V100 column), 2 re-seats, 5 migrations (defragmentation for 4-GPU jobs).
    ("gandiva", "2x4"): dict(avg_jct_s=752.276, p50_jct_s=161.0, p95_jct_s=3495.673, p99_jct_s=3713.976,
                             avg_queueing_s=561.068, makespan_s=4626.936, gpu_alloc_util=0.687017, preemptions=40),
    # tests/policies/test_iadeep.py. On n32g4 every single-GPU job finds an idle GPU, as under FIFO. On 2x4: 4
    # co-locations (three of a VGG beside googlenet, the ResNet-18 stand-in; one of two AlexNets, small enough to
    # share a GPU's memory), each re-seating its resident.
    ("iadeep", "n32g4"): dict(avg_jct_s=178.417, p50_jct_s=125.0, p95_jct_s=308.15, p99_jct_s=1054.24,
                              avg_queueing_s=0.0, makespan_s=3271.0, gpu_alloc_util=0.063589, preemptions=0),
    ("iadeep", "2x4"): dict(avg_jct_s=742.188, p50_jct_s=193.435, p95_jct_s=3388.05, p99_jct_s=3419.28,
                            avg_queueing_s=550.526, makespan_s=4806.0, gpu_alloc_util=0.719244, preemptions=8),
}  # fmt: skip

# The same replays' own counts of what the policy did (``policy.counts``, those that are not 0), by cluster.
GANDIVA_COUNTS: dict[str, dict[str, int]] = {
    "n32g4": {},
    "2x4": {"suspend": 31, "pack": 5, "unpack": 0, "reseat": 2, "migrate": 5},
}
IADEEP_COLOCATIONS: dict[str, int] = {"n32g4": 0, "2x4": 4}


def clusters_of(policy: str) -> list[str]:
    """The clusters :data:`SIXTY_METRICS` pins ``policy`` on, sorted."""
    return sorted(cluster for name, cluster in SIXTY_METRICS if name == policy)
