"""Every trace reader on the real files in the shared data folder, checked against facts about those files.

The facts come from the data README (82,247 Philly jobs, 15 virtual clusters, 7,654 jobs under a minute) and
from counting the files independently (openb: 1,088 CPU-only pods, 861 Pending GPU pods).
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime
from pathlib import Path

import pytest

from corral.core.errors import ConfigError, TraceError
from corral.core.job import FULL_GPU_MILLI, JobClass
from corral.sim.traces import Trace, read_csv, read_openb, read_philly, read_tiresias, read_trace
from corral.workloads.data import data_dir


def _data(*parts: str) -> Path:
    try:
        path = data_dir().joinpath(*parts)
    except ConfigError as err:  # pragma: no cover - only where the shared data is not checked out
        pytest.skip(str(err))
    if not path.is_file():  # pragma: no cover
        pytest.skip(f"missing data file {path}")
    return path


def _assert_sorted(trace: Trace) -> None:
    submits = [job.submit_s for job in trace.jobs]
    assert submits == sorted(submits)


# --- Philly --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def philly() -> Trace:
    return read_philly(_data("philly", "philly.csv"))


def test_philly_counts(philly: Trace) -> None:
    assert len(philly) == 82_247
    assert philly.skipped_total == 0
    assert len({job.tenant for job in philly.jobs}) == 15
    assert max(job.num_gpus for job in philly.jobs) == 128
    assert sum(1 for job in philly.jobs if job.duration_s is not None and job.duration_s < 60) == 7_654
    assert Counter(job.num_gpus for job in philly.jobs)[1] == 76_627
    assert all(job.model is None and job.gpu_milli == FULL_GPU_MILLI for job in philly.jobs)


def test_philly_order_and_origin(philly: Trace) -> None:
    _assert_sorted(philly)
    assert philly.jobs[0].submit_s == 0.0
    # 2017-09-04 10:30:41 .. 2017-12-22 08:02:11
    span = (datetime(2017, 12, 22, 8, 2, 11) - datetime(2017, 9, 4, 10, 30, 41)).total_seconds()
    assert philly.jobs[-1].submit_s == span
    assert len({job.job_id for job in philly.jobs}) == len(philly)


def test_philly_first_row_of_the_file(philly: Trace) -> None:
    # Line 2 of the file: 2017-10-09 07:01:55,66.0,1,66.0,11cb48
    job = next(job for job in philly.jobs if job.job_id == "philly-0")
    assert job.submit_s == (datetime(2017, 10, 9, 7, 1, 55) - datetime(2017, 9, 4, 10, 30, 41)).total_seconds()
    assert job.duration_s == 66.0
    assert job.num_gpus == 1
    assert job.tenant == "11cb48"
    assert "82,247 jobs in 15 virtual clusters" in philly.notes[0]


def test_philly_through_read_trace() -> None:
    trace = read_trace(_data("philly", "philly.csv"), "philly")
    assert len(trace) == 82_247


# --- Tiresias ------------------------------------------------------------------------------------------------


def test_tiresias_60_jobs() -> None:
    trace = read_tiresias(_data("tiresias", "60_job.csv"))
    assert len(trace) == 60
    assert trace.skipped_total == 0
    _assert_sorted(trace)
    first = trace.jobs[0]
    # 0,1,0,606,vgg19,164,30
    assert (first.job_id, first.num_gpus, first.submit_s, first.model, first.duration_s, first.tenant) == (
        "0",
        1,
        0.0,
        "vgg19",
        164.0,
        "default",
    )
    second = trace.jobs[1]  # 1,8,30,133,vgg11,147,23
    assert (second.job_id, second.num_gpus, second.submit_s, second.model) == ("1", 8, 30.0, "vgg11")


def test_generic_csv_reads_the_tiresias_file_the_same() -> None:
    path = _data("tiresias", "60_job.csv")
    columns = "id=job_id,submit=submit_time,duration=duration,gpus=num_gpu,model=model_name"
    assert read_trace(path, "csv", columns=columns).jobs == read_tiresias(path).jobs
    mapping = {"id": "job_id", "submit": "submit_time", "duration": "duration", "gpus": "num_gpu"}
    generic = read_csv(path, mapping)
    assert [job.job_id for job in generic.jobs] == [job.job_id for job in read_tiresias(path).jobs]
    assert all(job.model is None for job in generic.jobs)


# --- Alibaba openb -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def openb() -> Trace:
    return read_openb(_data("alibaba-openb", "openb_pod_list_default.csv"))


def test_openb_default_treatments(openb: Trace) -> None:
    assert openb.skipped == Counter({"cpu-only pod": 1_088, "pending pod, never started": 861})
    assert len(openb) == 8_152 - 1_088 - 861 == 6_203
    notes = " ".join(openb.notes)
    assert "dropped 1,088 CPU-only pods" in notes
    assert "dropped 861 Pending GPU pods" in notes
    # 34 pods end at the trace's end (t=12,902,960 s); 2 of them are CPU-only, so 32 GPU pods are truncated.
    assert "32 Running pods were cut off at the trace's end (t=12,902,960 s)" in notes
    _assert_sorted(openb)


def test_openb_class_split_and_priorities(openb: Trace) -> None:
    classes = Counter(job.job_class for job in openb.jobs)
    assert classes == Counter({JobClass.GUARANTEED: 3_693, JobClass.OPPORTUNISTIC: 2_510})
    assert Counter(job.priority for job in openb.jobs) == Counter({2: 3_596, 1: 97, 0: 2_510})


def test_openb_shares(openb: Trace) -> None:
    assert all(job.gpu_milli == FULL_GPU_MILLI for job in openb.jobs if job.num_gpus > 1)
    assert any(job.gpu_milli < FULL_GPU_MILLI for job in openb.jobs)
    assert max(job.num_gpus for job in openb.jobs) == 8
    assert all(job.gpu_types == () and job.tenant == "default" and job.model is None for job in openb.jobs)


def test_openb_first_pod(openb: Trace) -> None:
    # openb-pod-0000,12000,16384,1,1000,,LS,Running,0,12537496,0
    pod = next(job for job in openb.jobs if job.job_id == "openb-pod-0000")
    assert (pod.submit_s, pod.duration_s, pod.num_gpus, pod.gpu_milli) == (0.0, 12_537_496.0, 1, 1000)
    assert (pod.job_class, pod.priority) == (JobClass.GUARANTEED, 2)


def test_openb_pending_wait() -> None:
    trace = read_trace(_data("alibaba-openb", "openb_pod_list_default.csv"), "openb", pending="wait")
    assert len(trace) == 8_152 - 1_088
    assert trace.skipped == Counter({"cpu-only pod": 1_088})
    assert any("kept 861 Pending GPU pods" in note for note in trace.notes)
    # openb-pod-7285 is Pending, created and deleted at 12,774,042 s.
    pod = next(job for job in trace.jobs if job.job_id == "openb-pod-7285")
    assert (pod.duration_s, pod.gpu_milli, pod.job_class) == (0.0, 230, JobClass.OPPORTUNISTIC)


def test_openb_gpu_types() -> None:
    trace = read_openb(_data("alibaba-openb", "openb_pod_list_gpuspec20.csv"))
    typed = [job for job in trace.jobs if job.gpu_types]
    assert typed
    assert all(len(set(job.gpu_types)) == len(job.gpu_types) for job in typed)  # "V100M32|V100M32" once
    assert Counter(job.gpu_types for job in typed)[("T4",)] > 0


@pytest.mark.parametrize("name", ["cpu050", "gpushare20", "gpushare40", "gpushare60", "gpuspec10", "gpuspec20"])
def test_openb_variants_read_cleanly(name: str) -> None:
    trace = read_openb(_data("alibaba-openb", f"openb_pod_list_{name}.csv"))
    assert len(trace) > 6_000
    assert set(trace.skipped) <= {"cpu-only pod", "pending pod, never started"}


def test_openb_multigpu_variant_has_no_times() -> None:
    path = _data("alibaba-openb", "openb_pod_list_multigpu20.csv")
    with pytest.raises(TraceError) as info:
        read_openb(path)
    err = info.value
    assert (err.file, err.line, err.column) == (str(path), 1, "qos")
    assert "creation_time" in err.message and err.expected is not None and "scheduled_time" in err.expected


def test_synthesize_like_philly(philly: Trace) -> None:
    from corral.sim.traces import synthesize

    trace = synthesize(5_000, seed=0, like=philly, arrival="trace")
    assert {job.tenant for job in trace.jobs} <= {job.tenant for job in philly.jobs}
    assert {job.num_gpus for job in trace.jobs} <= {job.num_gpus for job in philly.jobs}
    assert "runs of 755 consecutive gaps" in trace.notes[0]  # 82,247 jobs over 108.9 days: ~755 a day
