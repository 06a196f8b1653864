"""Issue 18, "a first hour without surprises", on the library side: rho on GPUs faster than the trace's, every bad
row of a trace in one error, corral's own column names read without ``--columns``, and counts that agree with
their nouns. The command-line side (``--record-decisions`` without ``--out``, rejected jobs on screen) is in
``tests/cli/test_cli.py``."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from builders import EventSink, cluster, job, run
from corral.core.cluster import Topology
from corral.core.errors import TraceError
from corral.core.job import JobPhase
from corral.core.placement import Placement
from corral.core.status import JobStatus
from corral.core.wording import plural
from corral.policies.registry import make_policy
from corral.sim.clusters import describe_cluster, load_cluster
from corral.sim.executor import SimExecutor
from corral.sim.metrics import job_rhos
from corral.sim.perf import PerfModel
from corral.sim.report import write_results
from corral.sim.traces import read_csv, read_philly, read_tiresias, read_trace
from corral.sim.traces._rows import ROWS_SHOWN, BadRowsError

HPSEARCH = Path(__file__).resolve().parents[2] / "examples" / "hpsearch.csv"
TIRESIAS_HEADER = "job_id,num_gpu,submit_time,iterations,model_name,duration,interval"
PHILLY_HEADER = "timestamp,duration,num_gpus,gpu_time,cluster"
PHILLY_GOOD = "2017-10-09 07:01:55,66.0,1,66.0,11cb48"


def _write(tmp_path: Path, *lines: str, name: str = "trace.csv") -> Path:
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


# -- plural ---------------------------------------------------------------------------------------------------
def test_plural_agrees_with_its_count() -> None:
    assert plural(1, "job") == "1 job"
    assert plural(0, "job") == "0 jobs"
    assert plural(2, "GPU") == "2 GPUs"
    assert plural(82_247, "job") == "82,247 jobs"
    assert plural(1, "loss", "losses") == "1 loss"
    assert plural(3, "loss", "losses") == "3 losses"


# -- rho at the speed of the GPUs a job ran on ----------------------------------------------------------------
def test_rho_is_one_for_jobs_alone_on_gpus_twice_as_fast() -> None:
    # 4 nodes of 8 A100s (speed 2.0), three jobs that never queue: each runs in half its trace duration, which
    # is exactly its time alone on those GPUs, so rho is 1 (it was 0.5: T_id was taken at speed 1.0).
    jobs = [job("a", gpus=1, duration=100), job("b", gpus=8, duration=300, submit=10), job("c", 4, 60, 20)]
    result = run(jobs, load_cluster("4x8:A100-80GB"), make_policy("fifo"))
    assert all(j.phase is JobPhase.FINISHED and j.queued_s == 0 for j in result.jobs)
    assert [j.end_s - j.spec.submit_s for j in result.jobs if j.end_s is not None] == [50.0, 150.0, 30.0]
    assert result.usage is not None
    assert job_rhos(result.jobs, result.num_gpus, result.usage.job_speeds).tolist() == pytest.approx([1.0] * 3)
    s = result.summary
    assert (s["max_rho"], s["p50_rho"], s["p99_rho"], s["jain_rho_tenants"]) == (1.0, 1.0, 1.0, 1.0)
    assert [(r["mean_rho"], r["max_rho"]) for r in result.tenants] == [(1.0, 1.0)]


def test_jobs_csv_rho_uses_the_same_speed(tmp_path: Path) -> None:
    result = run([job("a", duration=100)], load_cluster("1x8:A100-80GB"), make_policy("fifo"))
    write_results(result, tmp_path)
    header, row = (tmp_path / "jobs.csv").read_text().splitlines()
    assert dict(zip(header.split(","), row.split(","), strict=True))["rho"] == "1.0000"


def test_rho_without_gpu_speeds_is_still_one() -> None:
    # --perf gpu_speed=false: the runs go at 1.0 on every type, and so does the time alone.
    result = run(
        [job("a", duration=100)], load_cluster("1x8:A100-80GB"), make_policy("fifo"), perf=PerfModel(gpu_speed=False)
    )
    assert result.jobs[0].end_s == 100.0
    assert result.summary["max_rho"] == 1.0


def test_rho_on_a_mixed_cluster_uses_each_jobs_own_type() -> None:
    # One slow node (speed 0.5), one fast (speed 2.0); each job pinned to one type, both alone: rho 1 for both.
    c = cluster(gpus=[4, 4], types=["slow", "fast"], speed={"slow": 0.5, "fast": 2.0})
    result = run(
        [job("s", duration=100, types=["slow"]), job("f", duration=100, types=["fast"])], c, make_policy("fifo")
    )
    assert [j.end_s for j in result.jobs] == [200.0, 50.0]
    assert result.usage is not None and result.usage.job_speeds == {"s": 0.5, "f": 2.0}
    assert result.summary["max_rho"] == 1.0 and result.summary["p50_rho"] == 1.0


def test_a_job_that_ran_on_two_speeds_gets_their_work_weighted_harmonic_mean() -> None:
    # Half its work (50 s) on a speed-1.0 GPU, the other half on a speed-2.0 one (25 s, after a 30 s restore):
    # alone on those GPUs the work takes 50 + 25 = 75 s, so v = 100 / 75 = 4/3.
    topo = Topology(cluster(gpus=[1, 1], types=["slow", "fast"], speed={"slow": 1.0, "fast": 2.0}))
    executor = SimExecutor(topo, PerfModel(usage_spread=0.0, demand_variation=0.0))
    executor.bind(EventSink())
    status = JobStatus(spec=job("a", duration=100), phase=JobPhase.RUNNING, placement=Placement((0,), 1000))
    executor.launch(status, 0.0)
    status.work_done_s = executor.preempt(status, 50.0)
    assert status.work_done_s == 50.0
    status = dataclasses.replace(status, placement=Placement((1,), 1000), preemptions=1, run_epoch=1)
    executor.launch(status, 60.0)
    executor.finished(status, 115.0)  # starts at 90 (restore), 50 s of work at speed 2.0
    assert executor.job_speeds() == {"a": pytest.approx(4 / 3)}
    done = dataclasses.replace(status, phase=JobPhase.FINISHED, placement=None, end_s=75.0)
    assert job_rhos([done], 1000, executor.job_speeds()).tolist() == pytest.approx([1.0])


# -- every bad row in one error -------------------------------------------------------------------------------
def test_every_bad_row_is_reported_at_once(tmp_path: Path) -> None:
    bad = [f"j{i},1,{i},10,resnet50,{'x' if i % 2 else '-5'}," for i in range(25)]
    path = _write(tmp_path, TIRESIAS_HEADER, "ok,1,0,10,resnet50,100,", *bad, "ok2,1,0,10,resnet50,100,")
    with pytest.raises(BadRowsError) as info:
        read_tiresias(path)
    err = info.value
    assert isinstance(err, TraceError)
    assert (err.total, len(err.rows)) == (25, ROWS_SHOWN)
    assert (err.file, err.line, err.column, err.got) == (str(path), 3, "duration", "-5")  # the first bad row's
    text = str(err)
    lines = text.splitlines()
    assert [line.split(": ", 1)[0] for line in lines[:ROWS_SHOWN]] == [f"{path}:{n}" for n in range(3, 23)]
    assert "and 5 more bad rows (25 bad rows in all: bad duration: 25)" in text
    assert "--skip-invalid" in lines[-1]
    assert len(read_tiresias(path, skip_invalid=True)) == 2


def test_a_few_bad_rows_are_all_listed_with_their_count(tmp_path: Path) -> None:
    path = _write(tmp_path, PHILLY_HEADER, PHILLY_GOOD, "2017-10-09 07:01:55,x,1,66.0,v", PHILLY_GOOD,
                  "2017-10-09 07:01:55,66.0,0,66.0,v", "2017-10-09,66.0,1,66.0,v")  # fmt: skip
    with pytest.raises(BadRowsError) as info:
        read_philly(path)
    text = str(info.value)
    assert [line.split(": ", 1)[0] for line in text.splitlines()[:3]] == [f"{path}:{n}" for n in (3, 5, 6)]
    assert "3 bad rows in all (bad duration: 1, bad num_gpus: 1, bad submit: 1)" in text
    assert "more bad row" not in text
    assert text.splitlines()[-1].startswith("fix them, or pass --skip-invalid")


def test_one_bad_row_suggests_skip_invalid(tmp_path: Path) -> None:
    path = _write(tmp_path, "jobid,ts,dur,n", "a,0,10,1", "b,5,-3,1")
    with pytest.raises(TraceError) as info:
        read_csv(path, {"id": "jobid", "submit": "ts", "duration": "dur", "gpus": "n"})
    first, hint = str(info.value).splitlines()
    assert first.startswith(f"{path}:3: invalid dur; column 'dur'")
    assert hint.startswith("fix it, or pass --skip-invalid")


def test_a_row_that_stops_the_reading_comes_with_the_bad_rows_before_it(tmp_path: Path) -> None:
    # A field over the csv module's limit cannot be split from what follows: reading stops there, and the bad
    # row before it is not lost.
    huge = '"' + "x" * 200_000 + '"'
    path = _write(tmp_path, "jobid,ts,dur,n", "a,0,-1,1", f"b,0,{huge},1", "c,0,10,1")
    with pytest.raises(BadRowsError) as info:
        read_csv(path, {"id": "jobid", "submit": "ts", "duration": "dur", "gpus": "n"})
    lines = str(info.value).splitlines()
    assert lines[0].startswith(f"{path}:2: ")
    assert lines[1].startswith(f"{path}:3: cannot read the row") and lines[1].endswith("(the reading stopped there)")


# -- corral's own column names --------------------------------------------------------------------------------
def test_a_csv_with_corrals_own_names_needs_no_columns() -> None:
    trace = read_trace(HPSEARCH, "csv")
    assert len(trace) == 48
    first = trace.jobs[0]
    assert (first.job_id, first.duration_s, first.num_gpus, first.model, first.tenant) == (
        "hp00", 7200.0, 1, "resnet50", "search"
    )  # fmt: skip
    assert trace.notes[0].startswith(
        "csv: 48 jobs read with corral's own columns id=job_id, submit=submit_s, duration=duration_s, gpus=num_gpus,"
        " tenant=tenant, model=model;"
    )


def test_own_names_with_optional_columns_absent(tmp_path: Path) -> None:
    path = _write(tmp_path, "num_gpus,duration_s,job_id,submit_s,batch_size", "2,10,a,5,", "1,20,b,0,64")
    trace = read_csv(path)
    assert [(j.job_id, j.num_gpus, j.batch_size, j.tenant) for j in trace.jobs] == [
        ("b", 1, 64, "default"),
        ("a", 2, None, "default"),
    ]


def test_own_names_missing_a_required_column_names_it_and_the_header(tmp_path: Path) -> None:
    path = _write(tmp_path, "job_id,submit,duration_s,gpus", "a,0,10,1")
    with pytest.raises(TraceError) as info:
        read_trace(path, "csv")
    err = info.value
    assert (err.line, err.column, err.got) == (1, "submit_s", "job_id,submit,duration_s,gpus")
    assert "lacks columns submit_s, num_gpus" in str(err)
    assert "--columns id=COL,submit=COL,duration=COL,gpus=COL" in str(err)


# -- counts and nouns -----------------------------------------------------------------------------------------
def test_trace_notes_say_one_job(tmp_path: Path) -> None:
    tiresias = _write(tmp_path, TIRESIAS_HEADER, "a,1,0,10,resnet50,100,", name="t.csv")
    assert read_tiresias(tiresias).notes[0].startswith("tiresias: 1 job, one tenant")
    philly = _write(tmp_path, PHILLY_HEADER, PHILLY_GOOD, name="p.csv")
    assert read_philly(philly).notes[0].startswith("philly: 1 job in 1 virtual cluster (tenant = cluster)")
    csv_one = _write(tmp_path, "job_id,submit_s,duration_s,num_gpus", "a,0,10,1", name="one.csv")
    assert read_csv(csv_one).notes[0].startswith("csv: 1 job read with corral's own columns")


def test_cluster_description_says_one_node() -> None:
    rows = dict(describe_cluster(load_cluster("1x1")))
    gpu_type = next(v for k, v in rows.items() if k.startswith("GPU type"))
    assert gpu_type.startswith("1 GPU on 1 node;")
