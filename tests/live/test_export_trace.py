"""The live cluster's history as a trace and a cluster file (corral.live.export): what is exported, and that the
replays read both as they are."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from corral.core.job import JobClass
from corral.live.export import cluster_toml, parse_since, trace_csv, trace_rows
from corral.sim.clusters import parse_cluster_toml
from corral.sim.traces.generic import read_csv

T0 = 1_795_000_000.0


def job(job_id: str, submit: float, phase: str, executed: float, **more: Any) -> dict[str, Any]:
    base = {"job_id": job_id, "submit_s": T0 + submit, "phase": phase, "executed_s": executed, "num_gpus": 1}
    return {**base, "gpu_milli": 1000, "tenant": "vision", "opportunistic": False, **more}


JOBS = [
    job("b", 30.0, "finished", 120.5, num_gpus=4, tenant="nlp"),
    job("a", 10.0, "failed", 2.25),
    job("c", 40.0, "cancelled", 60.0, opportunistic=True, gpu_milli=500),
    job("d", 50.0, "running", 5.0),
    job("e", 60.0, "pending", 0.0),
    job("f", 70.0, "rejected", 0.0),
    job("g", 80.0, "cancelled", 0.0),  # cancelled while it waited: it never ran
    job("old", -5.0, "finished", 9.0),
]


def test_jobs_that_ran_and_ended_are_rows_from_the_first_submission_on() -> None:
    export = trace_rows(JOBS, since_s=T0)
    assert export.origin_s == T0 + 10.0
    assert [r["job_id"] for r in export.rows] == ["a", "b", "c"]
    assert export.rows[0] == {
        "job_id": "a", "submit_s": 0.0, "duration_s": 2.25, "num_gpus": 1, "gpu_milli": 1000, "tenant": "vision",
        "job_class": "guaranteed",
    }  # fmt: skip
    assert export.rows[1]["submit_s"] == 20.0 and export.rows[1]["num_gpus"] == 4
    assert export.rows[2]["job_class"] == "opportunistic" and export.rows[2]["gpu_milli"] == 500
    assert export.left_out == {"running (no duration yet)": 1, "pending (no duration yet)": 1, "rejected": 1,
                               "never ran": 1}  # fmt: skip
    assert next(r["job_id"] for r in trace_rows(JOBS).rows) == "old"  # without --since: everything


def test_the_csv_reads_back_as_a_trace_without_column_names(tmp_path: Path) -> None:
    path = tmp_path / "week.csv"
    path.write_text(trace_csv(trace_rows(JOBS, since_s=T0)))
    trace = read_csv(path)
    specs = {j.job_id: j for j in trace.jobs}
    assert set(specs) == {"a", "b", "c"}
    assert specs["b"].submit_s == 20.0 and specs["b"].duration_s == 120.5 and specs["b"].num_gpus == 4
    assert specs["b"].tenant == "nlp"
    assert specs["c"].job_class is JobClass.OPPORTUNISTIC and specs["c"].gpu_milli == 500


CLUSTER = {
    "nodes": [{"name": "gpu-0", "state": "alive", "num_gpus": 2}, {"name": "gpu-1", "state": "lost", "num_gpus": 1}],
    "gpus": [
        {"index": 0, "node": "gpu-0", "type_name": "H100-80GB", "mem_mib": 81559},
        {"index": 1, "node": "gpu-0", "type_name": "H100-80GB", "mem_mib": 81559},
        {"index": 0, "node": "gpu-1", "type_name": 'odd "name"', "mem_mib": 1024},
    ],
}


def test_the_cluster_file_reads_back_with_its_nodes_types_and_quotas() -> None:
    text = cluster_toml(CLUSTER, [{"name": "vision", "quota_gpus": 2}, {"name": "nlp", "quota_gpus": None}])
    cluster = parse_cluster_toml(text, source="here.toml")
    assert [(n.name, n.num_gpus) for n in cluster.nodes] == [("gpu-0", 2), ("gpu-1", 1)]
    assert cluster.nodes[1].gpu_type == 'odd "name"'
    assert {t.name: (t.mem_mib, t.speed) for t in cluster.gpu_types} == {
        "H100-80GB": (81559, 1.0),
        'odd "name"': (1024, 1.0),
    }
    assert {t.name: t.quota_gpus for t in cluster.tenants} == {"vision": 2, "nlp": None}


def test_a_node_with_two_gpu_types_is_refused() -> None:
    mixed = {**CLUSTER, "gpus": [*CLUSTER["gpus"], {"index": 2, "node": "gpu-0", "type_name": "A100", "mem_mib": 1}]}
    with pytest.raises(ValueError, match="node 'gpu-0' has GPUs of several types"):
        cluster_toml(mixed, [])


@pytest.mark.parametrize(
    "text, expected",
    [("90s", T0 - 90), ("30m", T0 - 1800), ("12h", T0 - 43200), ("7d", T0 - 7 * 86400), ("1.5w", T0 - 1.5 * 604800),
     ("2026-11-20", 1_795_132_800.0), ("2026-11-20T08:00", 1_795_161_600.0),
     ("2026-11-20T09:00+01:00", 1_795_161_600.0)],
)  # fmt: skip
def test_since_is_a_time_ago_or_a_date(text: str, expected: float) -> None:
    assert parse_since(text, T0) == expected


@pytest.mark.parametrize("text", ["", "7", "7 days", "-3d", "yesterday", "2026-13-01"])
def test_a_bad_since_says_the_forms(text: str) -> None:
    with pytest.raises(ValueError, match=r"--since: expected a time ago \(90s"):
        parse_since(text, T0)


# -- through corral serve and the CLI --------------------------------------------------------------------------
def test_export_trace_writes_what_a_replay_reads(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys
    import time

    from corral.live.client import Client
    from live_server import start_server, stop_server

    server = start_server(tmp_path / "state", "--gpus", "2")
    try:
        token = (tmp_path / "state" / "admin.token").read_text().strip()
        client = Client(server.url, token)
        ids = [client.submit([sys.executable, "-c", "import time; time.sleep(0.3)"])["job_id"] for _ in range(3)]
        client.submit(["/no/such/program"])  # fails at once: it held its GPU a moment
        while any(client.job(i)["phase"] not in ("finished", "failed") for i in ids):
            time.sleep(0.05)
        env = {**os.environ, "CORRAL_URL": server.url, "CORRAL_TOKEN": token}
        corral = [sys.executable, "-m", "corral.cli.main"]
        out = subprocess.run(
            [*corral, "export-trace", "--since", "1h", "--out", str(tmp_path / "t.csv"), "--cluster-out",
             str(tmp_path / "c.toml")],
            env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        assert "jobs written to" in out.stderr and "submit_s counts from" in out.stderr
        rows = (tmp_path / "t.csv").read_text().splitlines()
        assert rows[0] == "job_id,submit_s,duration_s,num_gpus,gpu_milli,tenant,job_class"
        assert {r.split(",")[0] for r in rows[1:]} >= set(ids)
        again = subprocess.run(
            [*corral, "export-trace", "--out", str(tmp_path / "t.csv")], env=env, capture_output=True, text=True
        )
        assert again.returncode != 0 and "exists; pass --overwrite" in again.stderr
        replay = subprocess.run(
            [*corral, "simulate", "--format", "csv", "--trace", str(tmp_path / "t.csv"),
             "--cluster", str(tmp_path / "c.toml"), "--policy", "fifo"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert replay.returncode == 0, replay.stderr + replay.stdout
        whatif = subprocess.run(
            [*corral, "whatif", "--policy", "sjf", "--since", "1h", "--out", str(tmp_path / "wi"), "--no-progress"],
            env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert whatif.returncode == 0, whatif.stderr + whatif.stdout
        assert "replaying them under fifo (this server's)" in whatif.stderr
        made = {f.name for f in (tmp_path / "wi").iterdir()}
        assert {"trace.csv", "cluster.toml", "comparison.csv", "fifo", "sjf"} <= made, made
        refused = subprocess.run(
            [*corral, "whatif", "--policy", "sjf", "--out", str(tmp_path / "wi")], env=env, capture_output=True,
            text=True,
        )  # fmt: skip
        assert refused.returncode != 0 and "the folder is not empty" in refused.stderr
        bad = subprocess.run(
            [*corral, "export-trace", "--since", "yesterday", "--out", "-"], env=env, capture_output=True, text=True
        )
        assert bad.returncode != 0 and "--since: expected a time ago" in bad.stderr
    finally:
        stop_server(server)


@pytest.mark.parametrize("policy", ["fifo", "tiresias"])
def test_a_live_runs_exported_trace_replays_to_the_same_schedule(policy: str, tmp_path: Path) -> None:
    """Parity (issue 21): the live controller on a virtual clock runs a trace; its history, exported, is replayed
    by the simulator under the same policy on the same cluster and gives every job the same start and end
    (shifted by the first submission, where the export's clock starts)."""
    import random

    from builders import cluster, job
    from corral.live.api.models import job_out
    from corral.policies.registry import make_policy
    from corral.sim.perf import PerfModel
    from corral.sim.runner import simulate
    from corral.sim.traces import Trace
    from virtual_live import virtual_controller

    rng = random.Random(7)
    specs = sorted(
        (
            job(f"j{i:02}", gpus=rng.choice([1, 2, 4]), duration=rng.uniform(30, 300), submit=5 + rng.uniform(0, 600))
            for i in range(40)
        ),
        key=lambda j: j.submit_s,
    )
    c4 = cluster(nodes=2, gpus=4)
    live = virtual_controller(Trace(specs, source="t"), c4, policy)
    live.run_virtual()
    exported = [job_out(r).model_dump() for r in live.store.jobs()]
    path = tmp_path / "history.csv"
    export = trace_rows(exported)
    path.write_text(trace_csv(export))
    assert export.origin_s is not None and len(export.rows) == len(specs)
    replay = simulate(read_csv(path), c4, make_policy(policy), perf=PerfModel.neutral())
    ran = {j.spec.job_id: j for j in replay.jobs}
    # The export rounds times to the millisecond; a start waits on earlier jobs' (rounded) ends, so the roundings
    # add up along a chain of jobs: 40 of them at most here.
    tol = len(specs) * 1e-3
    for r in live.store.jobs():
        st, again = r.status, ran[r.job_id]
        assert st.first_start_s is not None and st.end_s is not None and again.first_start_s is not None
        assert again.first_start_s == pytest.approx(st.first_start_s - export.origin_s, abs=tol), r.job_id
        assert again.end_s == pytest.approx(st.end_s - export.origin_s, abs=tol), r.job_id
        assert again.preemptions == st.preemptions, r.job_id
