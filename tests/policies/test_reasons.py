"""Every waiting job a round examined has a reason (issue 15 §3): what each policy says, and where it shows."""

from __future__ import annotations

import csv
from pathlib import Path

from builders import cluster, job, run
from corral.policies.registry import make_policy
from corral.sim.perf import PerfModel
from corral.sim.report import write_results
from corral.sim.runner import SimulationResult

FREE = PerfModel(restore_s=0.0)


def reasons(result: SimulationResult) -> dict[str, str | None]:
    return {j.job_id: j.wait_reason for j in result.jobs}


def test_fifo_says_how_many_gpus_are_free() -> None:
    # 4 GPUs; a holds 2 from 0 to 100; b needs 4 and waits: 2 free.
    jobs = [job("a", gpus=2, duration=100), job("b", gpus=4, duration=10, submit=1)]
    result = run(jobs, cluster(nodes=1, gpus=4), make_policy("fifo"), perf=FREE)
    assert reasons(result) == {"a": None, "b": "waiting for 4 GPUs: 2 free"}


def test_a_tenant_at_its_quota() -> None:
    jobs = [job("a", gpus=2, duration=100, tenant="t"), job("b", duration=10, submit=1, tenant="t")]
    result = run(jobs, cluster(nodes=1, gpus=4, tenants={"t": 2}), make_policy("fifo:backfill=true"), perf=FREE)
    assert reasons(result)["b"] == "tenant t at quota 2/2 GPUs"


def test_strict_consolidation_says_the_largest_free_node() -> None:
    # 3x4: a and x take 3 GPUs of a node each, y 2 of the third. 4 GPUs are free in all, 2 at most on one node:
    # yarn-cs wants b's 4 on one node.
    jobs = [
        job("a", gpus=3, duration=100),
        job("x", gpus=3, duration=100),
        job("y", gpus=2, duration=100),
        job("b", gpus=4, duration=10, submit=1),
    ]
    result = run(jobs, cluster(nodes=3, gpus=4), make_policy("yarn-cs"), perf=FREE)
    assert reasons(result)["b"] == "waiting for 4 GPUs on one node (largest free: 2)"
    # Consolidated (not strict) placement takes them on two nodes at once.
    assert reasons(run(jobs, cluster(nodes=3, gpus=4), make_policy("fifo"), perf=FREE))["b"] is None


def test_tiresias_gandiva_sjf_and_srtf_give_reasons_too() -> None:
    # b waits behind a, which none of them preempts for it (srtf: b has more time left than a).
    jobs = [job("a", gpus=3, duration=100), job("b", gpus=2, duration=1000, submit=1)]
    for spec in ("tiresias", "gandiva", "srtf", "sjf"):
        result = run(jobs, cluster(nodes=1, gpus=4), make_policy(spec), perf=FREE)
        assert reasons(result)["b"] == "waiting for 2 GPUs: 1 free", spec


def test_jobs_csv_has_the_last_wait_reason(tmp_path: Path) -> None:
    jobs = [job("a", gpus=2, duration=100), job("b", gpus=4, duration=10, submit=1)]
    write_results(run(jobs, cluster(nodes=1, gpus=4), make_policy("fifo"), perf=FREE), tmp_path)
    with (tmp_path / "jobs.csv").open() as f:
        rows = {row["job_id"]: row["last_wait_reason"] for row in csv.DictReader(f)}
    assert rows == {"a": "", "b": "waiting for 4 GPUs: 2 free"}


def test_antman_gives_reasons_for_guaranteed_and_opportunistic_jobs() -> None:
    # Tenant t (quota 2) holds its quota with a; its b waits for quota. o runs opportunistically beside a (one
    # guest per GPU by default), so p finds no GPU with room left.
    jobs = [
        job("a", gpus=2, duration=100, tenant="t"),
        job("b", duration=10, submit=1, tenant="t"),
        job("o", gpus=2, duration=50, submit=2, tenant="u", opportunistic=True),
        job("p", gpus=2, duration=10, submit=3, tenant="u", opportunistic=True),
    ]
    c = cluster(nodes=1, gpus=2, tenants={"t": 2, "u": 0})
    got = reasons(run(jobs, c, make_policy("antman"), perf=FREE))
    assert got["b"] == "tenant t at quota 2/2 GPUs"
    assert got["p"] == "opportunistic: no 2 GPU(s) with spare memory and compute"


def test_hived_says_when_a_tenants_share_is_full() -> None:
    jobs = [job("a", gpus=2, duration=100, tenant="t"), job("b", duration=10, submit=1, tenant="t")]
    c = cluster(nodes=1, gpus=4, tenants={"t": 2, "u": 2})
    assert reasons(run(jobs, c, make_policy("hived:cells=false"), perf=FREE))["b"] == "quota of t full"


def test_themis_gives_reasons_for_the_jobs_it_examined() -> None:
    # t's quota is 1: c waits for it while GPUs are free.
    jobs = [job("a", duration=100, tenant="t"), job("c", duration=10, submit=1, tenant="t")]
    c = cluster(nodes=1, gpus=4, tenants={"t": 1, "u": 3})
    assert reasons(run(jobs, c, make_policy("themis"), perf=FREE))["c"] == "tenant t at quota 1/1 GPUs"


def test_iadeep_gives_reasons() -> None:
    jobs = [job("a", gpus=3, duration=100, tenant="t"), job("b", gpus=2, duration=10, submit=1, tenant="t")]
    c = cluster(nodes=1, gpus=4, tenants={"t": 3, "u": 1})
    assert reasons(run(jobs, c, make_policy("iadeep"), perf=FREE))["b"] == "tenant t at quota 3/3 GPUs"
