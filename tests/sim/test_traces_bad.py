"""Broken trace files: every error names the file, the line (header = line 1), the column and the expected form;
with ``skip_invalid`` the bad rows are left out and counted by reason instead.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from corral.core.errors import ConfigError, TraceError
from corral.core.job import JobClass, JobPhase
from corral.policies import make_policy
from corral.sim.clusters import load_cluster
from corral.sim.runner import simulate
from corral.sim.traces import Trace, parse_columns, read_csv, read_openb, read_philly, read_tiresias, read_trace
from corral.sim.traces._rows import BadRowsError

PHILLY_HEADER = "timestamp,duration,num_gpus,gpu_time,cluster"
PHILLY_GOOD = "2017-10-09 07:01:55,66.0,1,66.0,11cb48"
TIRESIAS_HEADER = "job_id,num_gpu,submit_time,iterations,model_name,duration,interval"
OPENB_HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time"
)
OPENB_GOOD = "pod-a,6000,12288,1,460,,LS,Running,10,100,20"


def _write(tmp_path: Path, *lines: str, name: str = "trace.csv") -> Path:
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


def _error(read: Callable[[Path], Trace], path: Path) -> TraceError:
    with pytest.raises(TraceError) as info:
        read(path)
    err = info.value
    # The rendered message carries the location too, since that is what the CLI prints.
    assert str(path) in str(err)
    if err.line is not None:
        assert f":{err.line}:" in str(err)
    return err


# --- Philly: one case per kind of damage, the bad row on line 3 ----------------------------------------------

PHILLY_CASES = [
    # (bad row, column, words in `expected`, got)
    ("2017-10-09 07:01:55,66.0,1,66.0", "cluster", "5 comma-separated fields", "2017-10-09 07:01:55,66.0,1,66.0"),
    ("2017-10-09 07:01:55,66.0,1,66.0,", "cluster", "non-empty", ""),
    ("2017-10-09 07:01:55,,1,66.0,11cb48", "duration", "seconds >= 0", ""),
    ("2017-10-09 07:01:55,-5,1,66.0,11cb48", "duration", "seconds >= 0", "-5"),
    ("2017-10-09 07:01:55,abc,1,66.0,11cb48", "duration", "seconds >= 0", "abc"),
    ("2017-10-09 07:01:55,nan,1,66.0,11cb48", "duration", "seconds >= 0", "nan"),
    ("2017-10-09 07:01:55,66.0,0,66.0,11cb48", "num_gpus", "integer >= 1", "0"),
    ("2017-10-09 07:01:55,66.0,1.5,66.0,11cb48", "num_gpus", "integer >= 1", "1.5"),
    ("2017-10-09 07:01:55,66.0,two,66.0,11cb48", "num_gpus", "integer >= 1", "two"),
    ("2017-13-09 07:01:55,66.0,1,66.0,11cb48", "timestamp", "YYYY-MM-DD HH:MM:SS", "2017-13-09 07:01:55"),
    ("09/10/2017 07:01,66.0,1,66.0,11cb48", "timestamp", "YYYY-MM-DD HH:MM:SS", "09/10/2017 07:01"),
    ("2017-10-09,66.0,1,66.0,11cb48", "timestamp", "YYYY-MM-DD HH:MM:SS", "2017-10-09"),
]


@pytest.mark.parametrize(("row", "column", "expected", "got"), PHILLY_CASES)
def test_philly_bad_row(tmp_path: Path, row: str, column: str, expected: str, got: str) -> None:
    path = _write(tmp_path, PHILLY_HEADER, PHILLY_GOOD, row, PHILLY_GOOD)
    err = _error(read_philly, path)
    assert err.file == str(path)
    assert err.line == 3
    assert err.column == column
    assert err.expected is not None and expected in err.expected
    assert err.got == got


def test_philly_missing_header_column(tmp_path: Path) -> None:
    path = _write(tmp_path, "timestamp,duration,gpu_time,cluster", "2017-10-09 07:01:55,66.0,66.0,11cb48")
    err = _error(read_philly, path)
    assert (err.file, err.line, err.column) == (str(path), 1, "num_gpus")
    assert err.expected is not None and "timestamp,duration,num_gpus,cluster" in err.expected
    assert err.got == "timestamp,duration,gpu_time,cluster"


def test_missing_header_column_raises_even_with_skip_invalid(tmp_path: Path) -> None:
    path = _write(tmp_path, "timestamp,duration,cluster", "2017-10-09 07:01:55,66.0,11cb48")
    with pytest.raises(TraceError, match="num_gpus"):
        read_philly(path, skip_invalid=True)


def test_empty_and_missing_files(tmp_path: Path) -> None:
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    err = _error(read_philly, empty)
    assert err.line == 1 and err.expected is not None and "header" in err.expected
    with pytest.raises(TraceError, match="cannot open"):
        read_philly(tmp_path / "nope.csv")


def test_blank_lines_are_ignored_but_counted_in_line_numbers(tmp_path: Path) -> None:
    path = _write(tmp_path, PHILLY_HEADER, PHILLY_GOOD, "", PHILLY_GOOD, "2017-10-09 07:01:55,x,1,66.0,11cb48", "")
    err = _error(read_philly, path)
    assert err.line == 5


def test_byte_order_mark_and_spaces_in_header(tmp_path: Path) -> None:
    path = tmp_path / "bom.csv"
    path.write_text("\ufefftimestamp, duration,num_gpus,gpu_time,cluster\n" + PHILLY_GOOD + "\n", encoding="utf-8")
    assert len(read_philly(path)) == 1


# --- skip_invalid ----------------------------------------------------------------------------------------------


def test_philly_skip_invalid_counts_reasons(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        PHILLY_HEADER,
        "2017-10-09 07:01:55,-1,1,66.0,vcA",  # philly-0: bad duration
        "2017-10-09 07:00:00,60,1,60,vcA",  # philly-1: good
        "2017-10-09 07:01:55,abc,1,66.0,vcA",  # philly-2: bad duration
        "2017-10-09 07:01:55,66.0,0,66.0,vcA",  # philly-3: bad num_gpus
        "2017-10-09 07:01:55,66.0,1",  # philly-4: wrong number of fields
        "yesterday,66.0,1,66.0,vcA",  # philly-5: bad submit
        "2017-10-09 07:05:00,10,2,20,vcB",  # philly-6: good
    )
    trace = read_philly(path, skip_invalid=True)
    assert trace.skipped == Counter(
        {"bad duration": 2, "bad num_gpus": 1, "wrong number of fields": 1, "bad submit": 1}
    )
    # Ids keep the file's numbering; the earliest *accepted* row is the origin of time.
    assert [(job.job_id, job.submit_s) for job in trace.jobs] == [("philly-1", 0.0), ("philly-6", 300.0)]
    note = trace.notes[-1]
    assert note.startswith("skipped 5 invalid rows")
    assert "bad duration: 2" in note and f"{path}:2" in note


def test_skip_invalid_off_stops_at_the_first_bad_row(tmp_path: Path) -> None:
    path = _write(tmp_path, PHILLY_HEADER, PHILLY_GOOD, "2017-10-09 07:01:55,-1,1,66.0,vcA", "x,y,z,w,v")
    assert _error(read_philly, path).line == 3


# --- Tiresias ------------------------------------------------------------------------------------------------


def test_tiresias_duplicate_id(tmp_path: Path) -> None:
    path = _write(tmp_path, TIRESIAS_HEADER, "0,1,0,606,vgg19,164,30", "1,2,30,1,vgg11,10,1", "0,1,40,1,x,5,1")
    err = _error(read_tiresias, path)
    assert (err.line, err.column, err.got) == (4, "job_id", "0")
    assert err.expected is not None and "line 2" in err.expected


@pytest.mark.parametrize(
    ("row", "column", "expected"),
    [
        ("0,0,0,606,vgg19,164,30", "num_gpu", "integer >= 1"),
        ("0,1,-3,606,vgg19,164,30", "submit_time", "seconds >= 0"),
        ("0,1,0,606,vgg19,1e400,30", "duration", "seconds >= 0"),
        (",1,0,606,vgg19,164,30", "job_id", "non-empty"),
    ],
)
def test_tiresias_bad_row(tmp_path: Path, row: str, column: str, expected: str) -> None:
    path = _write(tmp_path, TIRESIAS_HEADER, row)
    err = _error(read_tiresias, path)
    assert (err.file, err.line, err.column) == (str(path), 2, column)
    assert err.expected is not None and expected in err.expected


# --- openb -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("row", "column", "expected"),
    [
        ("pod-b,6000,12288,1,460,,Gold,Running,10,100,20", "qos", "one of LS, Guaranteed, Burstable, BE"),
        ("pod-b,6000,12288,1,460,,LS,Lost,10,100,20", "pod_phase", "one of Running"),
        ("pod-b,6000,12288,2,500,,LS,Running,10,100,20", "gpu_milli", "1000 when num_gpu > 1"),
        ("pod-b,6000,12288,1,1500,,LS,Running,10,100,20", "gpu_milli", "integer in 0..1000"),
        ("pod-b,6000,12288,1,0,,LS,Running,10,100,20", "gpu_milli", "1..1000"),
        ("pod-b,6000,12288,-1,1000,,LS,Running,10,100,20", "num_gpu", "integer >= 0"),
        ("pod-b,6000,12288,1,460,,LS,Running,10,5,20", "deletion_time", ">= creation_time (10)"),
        ("pod-b,6000,12288,1,460,,LS,Running,10,100,", "scheduled_time", "for a Running pod"),
        ("pod-b,6000,12288,1,460,,LS,Running,10,100,200", "scheduled_time", "from creation_time (10)"),
        ("pod-b,6000,12288,1,460,,LS,Pending,10,100,20", "scheduled_time", "empty for a Pending pod"),
        ("pod-a,6000,12288,1,460,,LS,Running,10,100,20", "name", "not used on an earlier line"),
    ],
)
def test_openb_bad_row(tmp_path: Path, row: str, column: str, expected: str) -> None:
    path = _write(tmp_path, OPENB_HEADER, OPENB_GOOD, row)
    err = _error(read_openb, path)
    assert (err.file, err.line, err.column) == (str(path), 3, column)
    assert err.expected is not None and expected in err.expected


def test_openb_skip_invalid_keeps_format_treatments_apart(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        OPENB_HEADER,
        OPENB_GOOD,
        "pod-b,6000,12288,1,460,,Gold,Running,10,100,20",  # bad qos
        "pod-c,6000,12288,0,0,,BE,Running,10,300,20",  # CPU-only; its deletion sets the trace's end
        "pod-d,6000,12288,1,1000,,BE,Pending,50,60,",  # Pending
        "pod-e,6000,12288,4,1000,V100M32|V100M32|T4,BE,Running,30,300,40",  # truncated at the end
    )
    trace = read_openb(path, skip_invalid=True)
    assert trace.skipped == Counter({"bad qos": 1, "cpu-only pod": 1, "pending pod, never started": 1})
    assert [job.job_id for job in trace.jobs] == ["pod-a", "pod-e"]
    pod_e = trace.jobs[1]
    assert (pod_e.duration_s, pod_e.gpu_types, pod_e.job_class, pod_e.priority) == (
        260.0,
        ("V100M32", "T4"),
        JobClass.OPPORTUNISTIC,
        0,
    )
    assert any("1 Running pod was cut off" in note for note in trace.notes)
    assert trace.notes[-1].startswith("skipped 1 invalid row ")
    with pytest.raises(ConfigError):
        read_openb(path, pending="keep")  # type: ignore[arg-type]


# --- generic CSV ----------------------------------------------------------------------------------------------

COLUMNS = {"id": "jobid", "submit": "ts", "duration": "dur", "gpus": "n", "tenant": "vc"}


def test_generic_timestamps_and_optional_fields(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "jobid,ts,dur,n,vc,share,cls",
        "a,2024-01-01T00:00:10Z,5,1,,250,Opportunistic",
        "b,2024-01-01 00:00:00,7,4.0,x,,",
        "c,2024-01-01T01:00:00+01:00,9,2,x,1000,guaranteed",
    )
    trace = read_csv(path, {**COLUMNS, "gpu_milli": "share", "job_class": "cls"})
    assert [(j.job_id, j.submit_s, j.num_gpus, j.tenant) for j in trace.jobs] == [
        ("b", 0.0, 4, "x"),
        ("c", 0.0, 2, "x"),  # 01:00 at +01:00 is midnight UTC: a tie, kept in file order
        ("a", 10.0, 1, "default"),
    ]
    a = trace.jobs[2]
    assert (a.gpu_milli, a.job_class) == (250, JobClass.OPPORTUNISTIC)


def test_generic_time_format(tmp_path: Path) -> None:
    path = _write(tmp_path, "jobid,ts,dur,n,vc", "a,09/10/2017 07:01,5,1,v", "b,09/10/2017 07:00,5,1,v")
    trace = read_csv(path, COLUMNS, time_format="%d/%m/%Y %H:%M")
    assert [(j.job_id, j.submit_s) for j in trace.jobs] == [("b", 0.0), ("a", 60.0)]
    bad = _write(tmp_path, "jobid,ts,dur,n,vc", "a,2017-10-09 07:01,5,1,v", name="bad.csv")
    err = _error(lambda p: read_csv(p, COLUMNS, time_format="%d/%m/%Y %H:%M"), bad)
    assert err.column == "ts" and err.expected is not None and "%d/%m/%Y %H:%M" in err.expected


def test_generic_mixed_submit_kinds(tmp_path: Path) -> None:
    path = _write(tmp_path, "jobid,ts,dur,n,vc", "a,10,5,1,v", "b,2024-01-01 00:00:00,5,1,v")
    err = _error(lambda p: read_csv(p, COLUMNS), path)
    assert (err.line, err.column) == (3, "ts")
    assert err.expected is not None and "like line 2" in err.expected


@pytest.mark.parametrize(
    ("row", "column", "expected"),
    [
        ("a,10,-5,1,v", "dur", "seconds >= 0"),
        ("a,10,5,0,v", "n", "integer >= 1"),
        ("a,10,5,2.5,v", "n", "integer >= 1"),
        ("a,later,5,1,v", "ts", "timestamp"),
    ],
)
def test_generic_bad_row(tmp_path: Path, row: str, column: str, expected: str) -> None:
    path = _write(tmp_path, "jobid,ts,dur,n,vc", row)
    err = _error(lambda p: read_csv(p, COLUMNS), path)
    assert (err.file, err.line, err.column) == (str(path), 2, column)
    assert err.expected is not None and expected in err.expected


def test_generic_skip_invalid_tallies_by_corral_field(tmp_path: Path) -> None:
    path = _write(tmp_path, "jobid,ts,dur,n,vc", "a,10,-5,1,v", "b,10,5,x,v", "c,20,5,1,v", "a,30,1,1,v")
    trace = read_csv(path, COLUMNS, skip_invalid=True)
    assert trace.skipped == Counter({"bad duration": 1, "bad gpus": 1})
    assert [job.job_id for job in trace.jobs] == ["c", "a"]  # "a" on line 2 was bad, so line 5 may use it


def test_generic_header_lacks_a_mapped_column(tmp_path: Path) -> None:
    path = _write(tmp_path, "jobid,ts,dur,n", "a,10,5,1")
    err = _error(lambda p: read_csv(p, COLUMNS), path)
    assert (err.line, err.column) == (1, "vc")


def test_parse_columns() -> None:
    assert parse_columns("id=jobid, submit=ts,duration=dur,gpus=n,tenant=vc") == COLUMNS
    with pytest.raises(ConfigError, match=r"unknown field 'user'.*required id, submit, duration, gpus"):
        parse_columns("id=a,submit=b,duration=c,gpus=d,user=e")
    with pytest.raises(ConfigError, match="missing required field gpus"):
        parse_columns("id=a,submit=b,duration=c")
    with pytest.raises(ConfigError, match="not FIELD=COLUMN"):
        parse_columns("id=a,submit,duration=c,gpus=d")
    with pytest.raises(ConfigError, match="given twice"):
        parse_columns("id=a,id=b,submit=b,duration=c,gpus=d")


def test_read_trace_arguments(tmp_path: Path) -> None:
    path = _write(tmp_path, "jobid,ts,dur,n,vc", "a,10,5,1,v")
    assert len(read_trace(path, "csv", columns="id=jobid,submit=ts,duration=dur,gpus=n")) == 1
    with pytest.raises(ConfigError, match="unknown trace format"):
        read_trace(path, "parquet")
    # Without columns a csv file is read by corral's own names (tests/sim/test_first_hour_replay.py); this one
    # has others, so the error names the missing ones and points to --columns.
    with pytest.raises(TraceError, match=r"job_id, submit_s, duration_s, num_gpus.*--columns"):
        read_trace(path, "csv")
    with pytest.raises(ConfigError, match="only for the csv format"):
        read_trace(path, "philly", columns=COLUMNS)
    with pytest.raises(ConfigError, match="only for the openb format"):
        read_trace(path, "philly", pending="wait")


def test_bytes_that_are_not_utf8_are_located(tmp_path: Path) -> None:
    path = tmp_path / "latin1.csv"
    path.write_bytes(f"{PHILLY_HEADER}\n{PHILLY_GOOD}\n2017-10-09 07:01:55,66.0,1,66.0,caf\xe9\n".encode("latin-1"))
    err = _error(read_philly, path)
    assert type(err) is BadRowsError  # the one error for bad rows (a TraceError), not a decoding error
    assert (err.line, err.column, err.expected) == (3, "cluster", "UTF-8 text")
    assert read_philly(path, skip_invalid=True).skipped == Counter({"bad cluster": 1})


# --- number forms Python reads but a trace should not, and numbers too large to replay -------------------------

ODD_NUMBERS = ["1_000", "1_0.5", "\uff11\uff12", "\u0663", "\u0661\u0662.5", "\u09e8", "\u2003" + "4"]


@pytest.mark.parametrize("cell", ODD_NUMBERS)
@pytest.mark.parametrize(
    ("header", "row", "column", "read"),
    [
        (PHILLY_HEADER, "2017-10-09 07:01:55,{},1,66.0,11cb48", "duration", read_philly),
        (PHILLY_HEADER, "2017-10-09 07:01:55,66.0,{},66.0,11cb48", "num_gpus", read_philly),
        (TIRESIAS_HEADER, "0,{},0,606,vgg19,164,30", "num_gpu", read_tiresias),
        (TIRESIAS_HEADER, "0,1,{},606,vgg19,164,30", "submit_time", read_tiresias),
        (OPENB_HEADER, "pod-b,6000,12288,1,{},,LS,Running,10,100,20", "gpu_milli", read_openb),
        (OPENB_HEADER, "pod-b,6000,12288,1,460,,LS,Running,10,{},20", "deletion_time", read_openb),
        ("jobid,ts,dur,n,vc", "a,{},5,1,v", "ts", lambda p: read_csv(p, COLUMNS)),
        ("jobid,ts,dur,n,vc", "a,10,5,{},v", "n", lambda p: read_csv(p, COLUMNS)),
        ("jobid,ts,dur,n,vc,bs", "a,10,5,1,v,{}", "bs", lambda p: read_csv(p, {**COLUMNS, "batch_size": "bs"})),
    ],
    ids=["philly-duration", "philly-gpus", "tiresias-gpus", "tiresias-submit", "openb-milli", "openb-deletion",
         "csv-submit", "csv-gpus", "csv-batch"],
)  # fmt: skip
def test_number_forms_python_reads_are_refused(
    tmp_path: Path, header: str, row: str, column: str, read: Callable[[Path], Trace], cell: str
) -> None:
    path = tmp_path / "trace.csv"
    path.write_text(f"{header}\n{row.format(cell)}\n", encoding="utf-8")
    err = _error(read, path)
    assert (err.line, err.column, err.got) == (2, column, cell)
    assert err.expected is not None and "digits 0-9" in err.expected


def test_plain_number_forms_still_read(tmp_path: Path) -> None:
    # What a trace has always been allowed to write keeps reading as before.
    path = _write(tmp_path, "jobid,ts,dur,n,vc", "a, 10 ,5e1,4.0,v", "b,+20,1.5E2, 2 ,v", "c,30.,.5,+1,v")
    trace = read_csv(path, COLUMNS)
    assert [(j.job_id, j.submit_s, j.duration_s, j.num_gpus) for j in trace.jobs] == [
        ("a", 10.0, 50.0, 4),
        ("b", 20.0, 150.0, 2),
        ("c", 30.0, 0.5, 1),
    ]


def test_skip_invalid_tallies_odd_number_forms(tmp_path: Path) -> None:
    path = _write(tmp_path, "jobid,ts,dur,n,vc", "a,1_0,5,1,v", "b,10,\uff15,1,v", "c,10,5,\u0662,v", "d,10,5,1,v")
    trace = read_csv(path, COLUMNS, skip_invalid=True)
    assert trace.skipped == Counter({"bad submit": 1, "bad duration": 1, "bad gpus": 1})
    assert [job.job_id for job in trace.jobs] == ["d"]


@pytest.mark.parametrize(
    ("row", "column", "words"),
    [
        ("a,10,5,1e308,v", "n", "at most 1,000,000"),
        ("a,10,5,1000001,v", "n", "at most 1,000,000"),
        ("a,10,5," + "9" * 5000 + ",v", "n", "at most 1,000,000"),  # int() refuses 5,000 digits
    ],
)
def test_generic_gpu_counts_beyond_any_cluster(tmp_path: Path, row: str, column: str, words: str) -> None:
    path = _write(tmp_path, "jobid,ts,dur,n,vc", row)
    err = _error(lambda p: read_csv(p, COLUMNS), path)
    assert (err.line, err.column) == (2, column)
    assert err.expected is not None and words in err.expected and "integer >= 1" in err.expected


def test_gpu_counts_at_the_limit_read(tmp_path: Path) -> None:
    path = _write(tmp_path, "jobid,ts,dur,n,vc", "a,10,5,1000000,v", "b,10,5,1e6,v")
    assert [job.num_gpus for job in read_csv(path, COLUMNS).jobs] == [1_000_000, 1_000_000]


@pytest.mark.parametrize(
    ("header", "row", "column", "read"),
    [
        (PHILLY_HEADER, "2017-10-09 07:01:55,66.0,1000001,66.0,11cb48", "num_gpus", read_philly),
        (TIRESIAS_HEADER, "0,99999999999999999999,0,606,vgg19,164,30", "num_gpu", read_tiresias),
        (OPENB_HEADER, "pod-b,6000,12288,1000001,1000,,LS,Running,10,100,20", "num_gpu", read_openb),
    ],
)
def test_gpu_counts_beyond_any_cluster(
    tmp_path: Path, header: str, row: str, column: str, read: Callable[[Path], Trace]
) -> None:
    path = _write(tmp_path, header, row)
    err = _error(read, path)
    assert (err.line, err.column) == (2, column)
    assert err.expected is not None and "at most 1,000,000" in err.expected


def test_batch_size_beyond_any_training_run(tmp_path: Path) -> None:
    columns = {**COLUMNS, "batch_size": "bs"}
    path = _write(tmp_path, "jobid,ts,dur,n,vc,bs", "a,10,5,1,v,1e300")
    err = _error(lambda p: read_csv(p, columns), path)
    assert (err.line, err.column, err.got) == (2, "bs", "1e300")
    assert err.expected is not None and "at most 1,000,000,000" in err.expected
    ok = _write(tmp_path, "jobid,ts,dur,n,vc,bs", "a,10,5,1,v,1000000000", name="ok.csv")
    assert read_csv(ok, columns).jobs[0].batch_size == 1_000_000_000


def test_metrics_of_the_largest_job_do_not_overflow(tmp_path: Path) -> None:
    # gpus = 1e308 used to pass the reader and raise OverflowError in the metrics; the largest count that
    # reads now is one a replay can account for (it is rejected: no cluster here is that large).
    path = _write(tmp_path, "jobid,ts,dur,n,vc", "a,0,100,1e6,v", "b,5,100,1,v")
    result = simulate(read_csv(path, COLUMNS), load_cluster("2x8"), make_policy("fifo"))
    assert [job.phase for job in result.jobs] == [JobPhase.REJECTED, JobPhase.FINISHED]
    assert result.summary["jobs_total"] == 2


@pytest.mark.parametrize(
    "stamp",
    ["0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00", "0001-01-01 00:00:00+23:59"],
)
def test_timestamps_whose_utc_time_leaves_the_calendar(tmp_path: Path, stamp: str) -> None:
    path = _write(tmp_path, "jobid,ts,dur,n,vc", "a,2024-01-01T00:00:00Z,5,1,v", f"b,{stamp},5,1,v")
    err = _error(lambda p: read_csv(p, COLUMNS), path)
    assert (err.line, err.column, err.got) == (3, "ts", stamp)
    assert err.expected is not None and "0001-01-01 to 9999-12-31 in UTC" in err.expected
    assert read_csv(path, COLUMNS, skip_invalid=True).skipped == Counter({"bad submit": 1})


def test_timestamps_at_the_calendar_edges_read(tmp_path: Path) -> None:
    path = _write(tmp_path, "jobid,ts,dur,n,vc", "a,0001-01-01T01:00:00+01:00,5,1,v", "b,9999-12-31T23:59:59Z,5,1,v")
    trace = read_csv(path, COLUMNS)
    assert [job.submit_s for job in trace.jobs] == [0.0, 315537897599.0]


def test_timestamps_with_other_scripts_digits(tmp_path: Path) -> None:
    arabic = "\u0662\u0660\u0661\u0667-10-09 07:01"  # strptime's %Y reads these
    path = _write(tmp_path, "jobid,ts,dur,n,vc", f"a,{arabic},5,1,v")
    err = _error(lambda p: read_csv(p, COLUMNS, time_format="%Y-%m-%d %H:%M"), path)
    assert (err.line, err.column, err.got) == (2, "ts", arabic)
    philly = _write(tmp_path, PHILLY_HEADER, "\uff12017-10-09 07:01:55,66.0,1,66.0,11cb48", name="p.csv")
    assert _error(read_philly, philly).column == "timestamp"


# --- the wrong number of fields names the columns ------------------------------------------------------------


def test_too_few_fields_name_the_columns_filled_and_lacking(tmp_path: Path) -> None:
    path = _write(tmp_path, PHILLY_HEADER, "2017-10-09 07:01:55,66.0,1")
    err = _error(read_philly, path)
    assert err.column == "gpu_time"
    assert err.message == (
        "the row has 3 fields but the header has 5 columns: it fills columns timestamp,duration,num_gpus and"
        " lacks gpu_time,cluster (a missing field?)"
    )
    assert err.expected == "5 comma-separated fields, as in the header: " + PHILLY_HEADER


def test_too_many_fields_name_the_last_column(tmp_path: Path) -> None:
    path = _write(tmp_path, TIRESIAS_HEADER, "0,1,0,606,vgg19,164,30,x,y")
    err = _error(read_tiresias, path)
    assert err.column is None
    assert err.message == (
        "the row has 9 fields but the header has 7 columns: 2 fields beyond the last column, interval"
        " (an unquoted comma?)"
    )
    assert err.expected == "7 comma-separated fields, as in the header: " + TIRESIAS_HEADER


def test_a_wide_header_is_listed_in_part(tmp_path: Path) -> None:
    header = ",".join(["jobid", "ts", "dur", "n"] + [f"c{i}" for i in range(100)])
    path = _write(tmp_path, header, "a,10,5")
    err = _error(lambda p: read_csv(p, {"id": "jobid", "submit": "ts", "duration": "dur", "gpus": "n"}), path)
    assert err.expected is not None and err.expected.endswith(",c7,... (92 more)")
    assert "lacks n,c0,c1," in err.message and ",c10,... (89 more)" in err.message
