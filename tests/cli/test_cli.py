"""The ``corral`` command line: the interface scripts rely on (``--out`` files and their columns), compare,
the policy listing, determinism of output bytes, and clean errors for bad input."""

from __future__ import annotations

import csv
import hashlib
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from corral.cli.main import cli
from corral.workloads.data import data_file

SIXTY = str(data_file("tiresias", "60_job.csv"))
SUMMARY_REQUIRED = (
    "jobs_total", "jobs_finished", "jobs_rejected", "avg_jct_s", "p50_jct_s", "p95_jct_s", "p99_jct_s",
    "avg_queueing_s", "makespan_s", "gpu_alloc_util",
)  # fmt: skip
JOB_COLUMNS = ["job_id", "tenant", "num_gpus", "submit_s", "start_s", "end_s", "jct_s", "queueing_s", "preemptions"]


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.output


def test_simulate_writes_the_documented_files(tmp_path: Path) -> None:
    code, out = invoke(
        "simulate", "--trace", SIXTY, "--format", "tiresias", "--cluster", "n32g4", "--policy", "fifo",
        "--out", str(tmp_path), "--no-progress",
    )  # fmt: skip
    assert code == 0, out
    assert "avg_jct_s" in out and "178.4" in out
    summary = json.loads((tmp_path / "summary.json").read_text())
    for key in SUMMARY_REQUIRED:
        assert key in summary
    assert summary["jobs_total"] == 60
    with (tmp_path / "jobs.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 60
    assert list(rows[0])[: len(JOB_COLUMNS)] == JOB_COLUMNS
    assert rows[0]["job_id"] == "0" and rows[0]["end_s"] == "164.000"
    header = "time_s,gpu_alloc_frac,gpu_sm_frac,gpu_mem_frac,queue_mean\n"
    assert (tmp_path / "utilization.csv").read_text().startswith(header)
    assert (tmp_path / "tenants.csv").exists()


def test_jobs_that_never_ran_have_empty_start_and_end(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("id,t,d,g\na,0,10,1\nbig,1,10,64\n")
    code, out = invoke(
        "simulate", "--trace", str(trace), "--format", "csv", "--columns", "id=id,submit=t,duration=d,gpus=g",
        "--cluster", "2x4", "--out", str(tmp_path / "out"), "--no-progress",
    )  # fmt: skip
    assert code == 0, out
    rows = {r["job_id"]: r for r in csv.DictReader((tmp_path / "out" / "jobs.csv").open())}
    assert rows["big"]["start_s"] == "" and rows["big"]["end_s"] == ""
    assert rows["big"]["status"] == "rejected" and "64 GPUs" in rows["big"]["reason"]
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["jobs_rejected"] == 1


def test_same_seed_same_bytes(tmp_path: Path) -> None:
    args = ["--format", "synthetic", "--jobs", "3000", "--jobs-per-hour", "400", "--cluster", "4x8", "--no-progress"]
    for name in ("a", "b"):
        code, out = invoke("simulate", *args, "--seed", "7", "--policy", "srtf", "--out", str(tmp_path / name),
                           "--record-decisions")  # fmt: skip
        assert code == 0, out
    code, out = invoke("simulate", *args, "--seed", "8", "--policy", "srtf", "--out", str(tmp_path / "c"))
    assert code == 0, out
    for f in ("summary.json", "jobs.csv", "tenants.csv", "utilization.csv", "decisions.log"):
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes(), f
    assert (tmp_path / "a" / "jobs.csv").read_bytes() != (tmp_path / "c" / "jobs.csv").read_bytes()


def test_compare_prints_policies_side_by_side(tmp_path: Path) -> None:
    code, out = invoke(
        "compare", "--trace", SIXTY, "--format", "tiresias", "--cluster", "2x4",
        "--policy", "fifo", "--policy", "sjf", "--policy", "srtf:placement=spread", "--out", str(tmp_path),
        "--no-progress",
    )  # fmt: skip
    assert code == 0, out
    assert "fifo" in out and "sjf" in out and "srtf:placement=spread" in out
    assert "1,556.5" in out  # FIFO's average JCT on 2x4 (see tests/sim/test_replay.py)
    assert (tmp_path / "fifo" / "summary.json").exists()
    assert (tmp_path / "srtf_placement=spread" / "jobs.csv").exists()


def test_policies_lists_every_policy_and_each_ones_options() -> None:
    code, out = invoke("policies")
    assert code == 0, out
    for name in ("fifo", "sjf", "srtf", "restore_s", "corral policies NAME"):
        assert name in out
    code, out = invoke("policies", "fifo")
    assert code == 0, out
    for name in ("placement", "backfill"):
        assert name in out


def test_cluster_describes_a_preset() -> None:
    code, out = invoke("cluster", "philly")
    assert code == 0, out
    assert "2,490" in out or "2490" in out


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        ("b,5,-3,1", ["t.csv:3", "'d'", "-3"]),
        ("b,5,abc,1", ["t.csv:3", "'d'", "abc"]),
        ("b,5,10,0", ["t.csv:3", "'g'", "0"]),
        ("b,5,10,1.5", ["t.csv:3", "'g'", "1.5"]),
        ("b,yesterday,10,1", ["t.csv:3", "'t'", "yesterday"]),
    ],
)
def test_bad_rows_stop_the_run_with_file_line_and_column(tmp_path: Path, row: str, expected: list[str]) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text(f"id,t,d,g\na,0,10,1\n{row}\n")
    args = ["simulate", "--trace", str(trace), "--format", "csv", "--columns", "id=id,submit=t,duration=d,gpus=g",
            "--cluster", "2x4", "--no-progress"]  # fmt: skip
    code, out = invoke(*args)
    assert code == 2
    assert "error:" in out
    flat = " ".join(out.split())
    for piece in expected:
        assert piece in flat, (piece, out)
    code, out = invoke(*args, "--skip-invalid")
    assert code == 0, out
    assert "skipped 1 row: 1 " in " ".join(out.split())  # issue 18: one row, not "1 rows"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--policy", "nope"], "unknown policy 'nope'"),
        (["--policy", "fifo:colour=red"], "has no option 'colour'"),
        (["--policy", "fifo:backfill=maybe"], "expected bool"),
        (["--cluster", "banana"], "banana"),
        (["--perf", "spread_rate=2"], "spread_rate"),
        (["--policy", "[x]"], "unknown policy '[x]'"),  # square brackets are shown, not read as markup
    ],
)
def test_bad_options_are_clean_errors(args: list[str], message: str) -> None:
    base = {"--policy": "fifo", "--cluster": "n32g4"}
    for key, value in zip(args[::2], args[1::2], strict=True):
        base[key] = value
    flat_args = [x for kv in base.items() for x in kv]
    code, out = invoke("simulate", "--trace", SIXTY, "--format", "tiresias", *flat_args, "--no-progress")
    assert code == 2, out
    assert message in " ".join(out.split())


def test_a_broken_invariant_is_shown_as_a_bug_with_its_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    """Not a user error (status 2, one line): the engine refusing a decision is corral's own bug."""
    import corral.cli.main as main_module
    from corral.core.errors import InvariantViolation

    def broken(*args: object, **kwargs: object) -> None:
        raise InvariantViolation("job 'x' would be placed on a GPU that is already full")

    monkeypatch.setattr(main_module, "simulate", broken)
    result = CliRunner().invoke(
        cli, ["simulate", "--trace", SIXTY, "--format", "tiresias", "--cluster", "n32g4", "--no-progress"]
    )
    assert result.exit_code == 1
    assert isinstance(result.exception, InvariantViolation)  # raised on: Python prints its traceback
    assert "bug:" in result.output and "error:" not in result.output


def test_bad_cluster_file_is_a_clean_error(tmp_path: Path) -> None:
    bad = tmp_path / "c.toml"
    bad.write_text('name = "x"\n[[nodes]]\ngpu_type = "nope"\ngpus = 4\n')
    code, out = invoke("simulate", "--trace", SIXTY, "--format", "tiresias", "--cluster", str(bad), "--no-progress")
    assert code == 2
    assert "c.toml" in out and "nope" in out


OPENB_HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time"
)


def _tiny_openb(path: Path, pods: int = 40) -> Path:
    """``pods`` single-GPU pods in the openb format, a tenth of a minute apart: every fourth best-effort
    (opportunistic), every third at half a GPU, all Succeeded (so every row is replayed as written)."""
    rows = [OPENB_HEADER]
    for i in range(pods):
        qos = "BE" if i % 4 == 0 else "LS"
        milli = 500 if i % 3 == 0 else 1000
        rows.append(f"pod-{i},4000,8192,1,{milli},,{qos},Succeeded,{6 * i},{6 * i + 300 + 7 * i},{6 * i}")
    path.write_text("\n".join(rows) + "\n")
    return path


def test_openb_with_assigned_tenants_and_equal_quotas(tmp_path: Path) -> None:
    trace = _tiny_openb(tmp_path / "pods.csv")
    code, out = invoke(
        "simulate", "--trace", str(trace), "--format", "openb", "--cluster", "2x4", "--assign-tenants", "4",
        "--quotas", "equal:0.8", "--out", str(tmp_path / "out"), "--no-progress",
    )  # fmt: skip
    assert code == 0, out
    with (tmp_path / "out" / "tenants.csv").open() as f:
        tenants = {row["tenant"]: row for row in csv.DictReader(f)}
    assert sorted(tenants) == ["t0", "t1", "t2", "t3"]
    assert sum(int(row["jobs"]) for row in tenants.values()) == 40
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["jobs_finished"] == 40 and summary["jobs_rejected"] == 0
    # 8 GPUs x 0.8 = 6.4, split among 4 tenants and floored: 1 each. The note is printed and kept.
    quota_note = "quotas equal:0.8: 4 of 8 GPUs promised to 4 tenants: t0 1, t1 1, t2 1, t3 1"
    assert quota_note in summary["trace_notes"]
    assert any(n.startswith("tenants: 40 of 40 jobs had tenant 'default'") for n in summary["trace_notes"])
    assert f"note: {quota_note}" in " ".join(out.split())


def test_compare_with_opportunistic_fraction_and_explicit_quotas(tmp_path: Path) -> None:
    trace = _tiny_openb(tmp_path / "pods.csv")
    code, out = invoke(
        "compare", "--trace", str(trace), "--format", "openb", "--cluster", "2x4", "--assign-tenants", "2",
        "--opportunistic", "0.5", "--quotas", "t0=3,t1=2", "--policy", "fifo", "--policy", "sjf",
        "--out", str(tmp_path / "out"), "--no-progress",
    )  # fmt: skip
    assert code == 0, out
    flat = " ".join(out.split())
    assert "note: opportunistic 0.5 (seed 0):" in flat and "of 30 guaranteed jobs made opportunistic" in flat
    assert "note: quotas t0=3,t1=2: 5 of 8 GPUs promised to 2 tenants: t0 3, t1 2" in flat
    for policy in ("fifo", "sjf"):
        notes = json.loads((tmp_path / "out" / policy / "summary.json").read_text())["trace_notes"]
        assert any(n.startswith("quotas t0=3,t1=2") for n in notes)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--quotas", "equal:2"], "F must be in (0, 1]"),
        (["--quotas", "lots"], "expected philly-vc"),
        (["--assign-tenants", "0"], "count must be an integer >= 1"),
        (["--opportunistic", "1.5"], "fraction must be in [0, 1]"),
    ],
)
def test_bad_tenant_options_are_clean_errors(tmp_path: Path, args: list[str], message: str) -> None:
    trace = _tiny_openb(tmp_path / "pods.csv", pods=4)
    code, out = invoke("simulate", "--trace", str(trace), "--format", "openb", "--cluster", "2x4", *args,
                       "--no-progress")  # fmt: skip
    assert code == 2, out
    assert "error:" in out and message in " ".join(out.split())


DEEP_TOML = "name = 'x'\nnodes = " + "[" * 500 + "]" * 500 + "\n"  # tomllib alone raises RecursionError on it


@pytest.mark.parametrize(
    "args",
    [
        ("cluster", "{path}"),
        ("simulate", "--trace", SIXTY, "--format", "tiresias", "--cluster", "{path}", "--no-progress"),
        ("serve", "--config", "{path}", "--gpus", "1", "--state-dir", "{state}"),
        ("submit", "--file", "{path}"),
    ],
    ids=["cluster", "simulate", "serve", "submit"],
)
def test_toml_nested_500_deep_is_a_located_error(tmp_path: Path, args: tuple[str, ...]) -> None:
    path = tmp_path / "deep.toml"
    path.write_text(DEEP_TOML)
    code, out = invoke(*(a.format(path=path, state=tmp_path / "state") for a in args))
    text = " ".join(out.split())
    assert code == 2, out
    assert f"error: {path}:2: arrays and inline tables nested more than 64 deep" in text
    assert "Traceback" not in out and "RecursionError" not in out


def test_cluster_with_a_huge_count_is_a_located_error(tmp_path: Path) -> None:
    path = tmp_path / "big.toml"
    path.write_text('[[nodes]]\ngpu_type = "T4"\ngpus = 8\ncount = 100000000\n')
    code, out = invoke("cluster", str(path))
    assert code == 2, out
    text = " ".join(out.split())
    assert f"{path}:4: out of range; column 'nodes[0].count'" in text
    assert "at most 200,000 (corral's limit on nodes in a cluster)" in text


def test_trace_with_an_offset_timestamp_off_the_calendar(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("id,ts,dur,n\na,2024-01-01T00:00:00Z,5,1\nb,0001-01-01T00:00:00+01:00,5,1\n")
    code, out = invoke(
        "simulate", "--trace", str(trace), "--format", "csv", "--columns", "id=id,submit=ts,duration=dur,gpus=n",
        "--cluster", "2x8", "--no-progress",
    )  # fmt: skip
    assert code == 2, out
    assert f"{trace}:3: ts is out of range" in " ".join(out.split())


# -- issue 18, "a first hour without surprises" (the library side: tests/sim/test_first_hour_replay.py) ---------
HPSEARCH = str(Path(__file__).resolve().parents[2] / "examples" / "hpsearch.csv")


def test_record_decisions_without_out_is_a_usage_error() -> None:
    # The decisions go only to OUT/decisions.log: without --out they were recorded and silently dropped.
    code, out = invoke(
        "simulate", "--trace", SIXTY, "--format", "tiresias", "--cluster", "n32g4", "--record-decisions",
        "--no-progress",
    )  # fmt: skip
    assert code == 2, out
    assert "--record-decisions needs --out" in out and "Usage:" in out
    assert "avg_jct_s" not in out  # refused before the replay, not after


def test_rejected_jobs_are_shown_with_their_reasons(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    big = "".join(f"big{i},1,10,{64 + i}\n" for i in range(7))
    trace.write_text("job_id,submit_s,duration_s,num_gpus\na,0,10,1\n" + big)
    code, out = invoke("simulate", "--trace", str(trace), "--format", "csv", "--cluster", "2x4", "--no-progress")
    assert code == 0, out
    lines = out.splitlines()
    start = lines.index("rejected 7 jobs that can never run here (--out writes every reason to jobs.csv):")
    assert lines[start + 1 : start + 7] == [
        *(f"  big{i}: needs {64 + i} GPUs; the cluster has at most 8 of one type" for i in range(5)),
        "  and 2 more",
    ]
    # compare: once for all the policies when they rejected the same jobs, and with --out it says where.
    code, out = invoke(
        "compare", "--trace", str(trace), "--format", "csv", "--cluster", "2x4", "--policy", "fifo",
        "--policy", "sjf", "--out", str(tmp_path / "out"), "--no-progress",
    )  # fmt: skip
    assert code == 0, out
    assert out.count("rejected 7 jobs that can never run here (every reason is in jobs.csv):") == 1
    code, out = invoke("simulate", "--trace", SIXTY, "--format", "tiresias", "--cluster", "n32g4", "--no-progress")
    assert code == 0 and "can never run here" not in out  # no notice when nothing was rejected


def test_a_trace_with_corrals_own_column_names_needs_no_columns() -> None:
    code, out = invoke("simulate", "--trace", HPSEARCH, "--format", "csv", "--cluster", "2x8", "--no-progress")
    assert code == 0, out
    assert "48 jobs on 2x8" in out


def test_a_trace_without_corrals_names_or_columns_is_a_clean_error(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("id,t,d,g\na,0,10,1\n")
    code, out = invoke("simulate", "--trace", str(trace), "--format", "csv", "--cluster", "2x4", "--no-progress")
    assert code == 2, out
    flat = " ".join(out.split())
    assert f"{trace}:1: the header lacks columns job_id, submit_s, duration_s, num_gpus" in flat
    assert "--columns id=COL" in flat and "got 'id,t,d,g'" in flat


def test_every_bad_row_is_shown_in_one_run(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("id,t,d,g\na,0,10,1\nb,5,-3,1\nc,5,10,0\nd,6,10,1\ne,x,10,1\n")
    code, out = invoke(
        "simulate", "--trace", str(trace), "--format", "csv", "--columns", "id=id,submit=t,duration=d,gpus=g",
        "--cluster", "2x4", "--no-progress",
    )  # fmt: skip
    assert code == 2, out
    for line in (3, 4, 6):
        assert f"{trace}:{line}: " in out
    assert "3 bad rows in all" in out and "--skip-invalid" in out


def test_one_job_on_one_gpu_is_said_so(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("job_id,submit_s,duration_s,num_gpus\na,0,10,1\n")
    code, out = invoke("simulate", "--trace", str(trace), "--format", "csv", "--cluster", "1x1", "--no-progress")
    assert code == 0, out
    assert "1 job on 1x1 (1 GPU)" in out
    assert "csv: 1 job read" in out


def test_out_holds_one_run_with_its_manifest(tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = ["simulate", "--trace", SIXTY, "--format", "tiresias", "--cluster", "2x4", "--no-progress"]
    code, text = invoke(*args, "--policy", "srtf", "--out", str(out), "--record-decisions")
    assert code == 0, text
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["corral_version"] and manifest["seed"] == 0 and manifest["cluster"] == "2x4"
    assert manifest["policy"].startswith("srtf")
    digest = hashlib.sha256(Path(SIXTY).read_bytes()).hexdigest()
    assert manifest["inputs"]["trace"] == {"path": SIXTY, "bytes": Path(SIXTY).stat().st_size, "sha256": digest}
    assert manifest["inputs"]["cluster"] == {"path": "2x4"}  # a spec, not a file
    # A second run into the same folder would mix with the first (its decisions.log would stay): refused.
    (out / "notes.txt").write_text("mine")
    code, text = invoke(*args, "--policy", "fifo", "--out", str(out))
    assert code != 0 and "not empty" in text and "--overwrite" in text, text
    assert json.loads((out / "summary.json").read_text())["policy"].startswith("srtf")  # nothing touched
    code, text = invoke(*args, "--policy", "fifo", "--out", str(out), "--overwrite")
    assert code == 0, text
    assert json.loads((out / "summary.json").read_text())["policy"].startswith("fifo")
    assert not (out / "decisions.log").exists()  # the earlier run's, deleted first
    assert (out / "notes.txt").read_text() == "mine"  # not corral's: kept
    # compare: each policy's folder gets its manifest; --overwrite clears the policies' folders.
    both = ["compare", *args[1:], "--policy", "fifo", "--policy", "sjf", "--out", str(tmp_path / "cmp")]
    assert invoke(*both)[0] == 0
    assert json.loads((tmp_path / "cmp" / "sjf" / "manifest.json").read_text())["policy"].startswith("sjf")
    assert invoke(*both)[0] != 0
    assert invoke(*both, "--overwrite")[0] == 0
