"""Fuzzing the simulator's edges: any trace file (for each reader: philly, tiresias, openb, generic csv) and any
cluster spec (TOML file or inline form) gives either a parsed result within corral's limits or a located
InputError / ConfigError: never another exception, never a hang.

Cells are drawn mostly from pools of values each column meets in real files and the values that broke corral
before (``1_000``, other scripts' digits, ``1e308``, offsets past the calendar's ends, 5,000-digit numbers),
mixed with arbitrary text, so the examples reach both the deep checks of a row and the CSV and TOML layers.
Each test is bounded in examples and, per example, by hypothesis' deadline and by an alarm that turns a hang
into a failure.
"""

from __future__ import annotations

import math
import signal
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.core.errors import ClusterSpecError, ConfigError, InputError
from corral.core.job import FULL_GPU_MILLI
from corral.sim.clusters import MAX_GPUS, MAX_GPUS_PER_NODE, MAX_NODES, load_cluster, parse_cluster_toml
from corral.sim.traces import Trace, read_csv, read_openb, read_philly, read_tiresias
from corral.sim.traces._rows import MAX_BATCH_SIZE, MAX_JOB_GPUS

FUZZ = settings(max_examples=150, deadline=5000, suppress_health_check=[HealthCheck.too_slow])
HANG_S = 20  # far above any example's time (milliseconds); only a hang gets there


@contextmanager
def no_hang() -> Iterator[None]:
    """Fail, rather than wait forever, when one example runs for HANG_S seconds (hypothesis' deadline is only
    checked once an example returns)."""

    def alarm(signum: int, frame: Any) -> None:
        raise AssertionError(f"no answer within {HANG_S} s: a hang")

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(HANG_S)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


# -- cells ----------------------------------------------------------------------------------------------------

NUMBERS = [
    "0", "1", "2", "4", "8", "16", "460", "1000", "1000000", "1000001", "4.0", "1e3", "1e6", "1e308", "1e309",
    "1e-400", "-1", "-0", "nan", "inf", "-inf", "3.5", ".5", "5.", "+5", " 7 ", "0x10", "1_000", "1_0.5",
    "\uff11\uff12", "\u0663", "\u0661\u0662.5", "\u2003" + "4", "9" * 30, "9" * 5000, "",
]  # fmt: skip
TIMES = [
    "2017-10-09 07:01:55", "2017-10-09 07:05:00", "2017-13-09 07:01:55", "2017-10-09", "09/10/2017 07:01",
    "2024-01-01T00:00:00Z", "2024-01-01T01:00:00+01:00", "0001-01-01T00:00:00+01:00",
    "9999-12-31T23:59:59-01:00", "0001-01-01T01:00:00+01:00", "9999-12-31T23:59:59.9999999",
    "0001-01-01 00:00:00 +2359", "\u0662\u0660\u0661\u0667-10-09 07:01:55", "1970-01-01T00:00:00", "",
]  # fmt: skip
WORDS = [
    "a", "b", "vc1", "11cb48", "", " ", "LS", "BE", "Guaranteed", "Burstable", "Gold", "Running", "Pending",
    "Succeeded", "Failed", "guaranteed", "Opportunistic", "resnet50", "vgg19", "T4", "T4|V100M32|T4", "|",
    "\ufffd", "\x00", 'x"y', '"quoted, comma"', "a,b", "line\nbreak", "caf\u00e9", "a" * 300,
]  # fmt: skip

ANY_CELL = st.one_of(st.sampled_from(NUMBERS + TIMES + WORDS), st.text(max_size=12))


def cells(*pools: list[str]) -> st.SearchStrategy[str]:
    """Mostly values from ``pools``, sometimes anything at all."""
    pool = [v for p in pools for v in p]
    return st.one_of(st.sampled_from(pool), st.sampled_from(pool), ANY_CELL)


# Each reader's columns, in the order its own files write them, with the cells each column gets.
PHILLY = {
    "timestamp": cells(TIMES),
    "duration": cells(NUMBERS),
    "num_gpus": cells(NUMBERS),
    "gpu_time": cells(NUMBERS),
    "cluster": cells(WORDS),
}
TIRESIAS = {
    "job_id": cells(["0", "1", "2", "j"], WORDS),
    "num_gpu": cells(NUMBERS),
    "submit_time": cells(NUMBERS),
    "iterations": cells(NUMBERS),
    "model_name": cells(WORDS),
    "duration": cells(NUMBERS),
    "interval": cells(NUMBERS),
}
OPENB = {
    "name": cells(["pod-a", "pod-b", "pod-c"], WORDS),
    "cpu_milli": cells(NUMBERS),
    "memory_mib": cells(NUMBERS),
    "num_gpu": cells(NUMBERS),
    "gpu_milli": cells(NUMBERS),
    "gpu_spec": cells(WORDS),
    "qos": cells(WORDS),
    "pod_phase": cells(WORDS),
    "creation_time": cells(NUMBERS),
    "deletion_time": cells(NUMBERS),
    "scheduled_time": cells(NUMBERS),
}
GENERIC = {
    "id": cells(["a", "b", "c"], WORDS),
    "submit": cells(NUMBERS, TIMES),
    "dur": cells(NUMBERS),
    "gpus": cells(NUMBERS),
    "tenant": cells(WORDS),
    "model": cells(WORDS),
    "milli": cells(NUMBERS),
    "class": cells(WORDS),
    "bs": cells(NUMBERS),
}
GENERIC_COLUMNS = {
    "id": "id", "submit": "submit", "duration": "dur", "gpus": "gpus", "tenant": "tenant", "model": "model",
    "gpu_milli": "milli", "job_class": "class", "batch_size": "bs",
}  # fmt: skip
TIME_FORMATS = [None, None, "%d/%m/%Y %H:%M", "%Y-%m-%d %H:%M:%S %z"]


@st.composite
def csv_files(draw: st.DrawFn, columns: Mapping[str, st.SearchStrategy[str]]) -> bytes:
    """A CSV file: usually the reader's header (sometimes reordered, short of a column or with one more), rows
    of cells for its columns (sometimes a field short or long), joined as they are: a cell holding a comma, a
    quote or a newline changes the file's structure, as a broken file's would."""
    names = list(columns)
    shape = draw(st.sampled_from(["as is", "as is", "as is", "shuffled", "short", "extra"]))
    if shape == "shuffled":
        names = draw(st.permutations(names))
    elif shape == "short":
        names.pop(draw(st.integers(0, len(names) - 1)))
    elif shape == "extra":
        names.append(draw(st.sampled_from(["extra", names[0], ""])))
    lines = [",".join(names)]
    for _ in range(draw(st.integers(0, 6))):
        row = [draw(columns[name]) if name in columns else draw(ANY_CELL) for name in names]
        change = draw(st.sampled_from([0, 0, 0, 0, -1, 1]))
        if change < 0:
            row.pop()
        elif change > 0:
            row.append(draw(ANY_CELL))
        lines.append(",".join(row))
    text = "\n".join(lines) + draw(st.sampled_from(["\n", "", "\n\n"]))
    data = text.encode("utf-8", "surrogatepass")  # lone surrogates from st.text: bytes that are not UTF-8
    if draw(st.booleans()) and draw(st.booleans()):
        at = draw(st.integers(0, len(data)))
        data = data[:at] + draw(st.sampled_from([b"\xff", b"\xe9", b"\x00", b"\r", b'"', b"\xef\xbb\xbf"])) + data[at:]
    return data


def check_trace(read: Callable[[Path], Trace], path: Path, data: bytes) -> None:
    """A Trace whose every job is within corral's limits, or a TraceError naming the file and a line in it."""
    path.write_bytes(data)
    try:
        with no_hang():
            trace = read(path)
    except InputError as err:
        assert err.file == str(path), err
        assert err.line is not None and 1 <= err.line <= data.count(b"\n") + data.count(b"\r") + 1, err
        assert str(err).startswith(f"{path}:{err.line}: ")
        return
    submits = [job.submit_s for job in trace.jobs]
    assert submits == sorted(submits)
    for job in trace.jobs:
        assert 1 <= job.num_gpus <= MAX_JOB_GPUS
        assert 0 <= job.submit_s < math.inf and job.duration_s is not None and 0 <= job.duration_s < math.inf
        assert 1 <= job.gpu_milli <= FULL_GPU_MILLI
        assert job.batch_size is None or 1 <= job.batch_size <= MAX_BATCH_SIZE
    assert sum(trace.skipped.values()) >= 0 and all(isinstance(note, str) for note in trace.notes)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


@FUZZ
@given(data=csv_files(PHILLY), skip=st.booleans())
def test_philly_rows(folder: Path, data: bytes, skip: bool) -> None:
    check_trace(lambda p: read_philly(p, skip_invalid=skip), folder / "philly.csv", data)


@FUZZ
@given(data=csv_files(TIRESIAS), skip=st.booleans())
def test_tiresias_rows(folder: Path, data: bytes, skip: bool) -> None:
    check_trace(lambda p: read_tiresias(p, skip_invalid=skip), folder / "tiresias.csv", data)


@FUZZ
@given(data=csv_files(OPENB), skip=st.booleans(), pending=st.sampled_from(["drop", "wait"]))
def test_openb_rows(folder: Path, data: bytes, skip: bool, pending: Any) -> None:
    check_trace(lambda p: read_openb(p, skip_invalid=skip, pending=pending), folder / "openb.csv", data)


@FUZZ
@given(data=csv_files(GENERIC), skip=st.booleans(), time_format=st.sampled_from(TIME_FORMATS))
def test_generic_csv_rows(folder: Path, data: bytes, skip: bool, time_format: str | None) -> None:
    check_trace(
        lambda p: read_csv(p, GENERIC_COLUMNS, skip_invalid=skip, time_format=time_format), folder / "jobs.csv", data
    )


# -- cluster files ----------------------------------------------------------------------------------------------

VALUES = [
    "0", "1", "2", "4", "8", "-1", "1024", "1025", "200000", "200001", "1000000", "100000000",
    "9223372036854775807", "9223372036854775808", "-9223372036854775809", "0x7fffffffffffffff", "0xff" + "f" * 40,
    "1" * 5000, "1e308", "0.5", "nan", "inf", "true", '"T4"', '"V100"', '"A100-80GB"', '"gpu"', '""', '"x"',
    '"r0"', '"n-"', "[]", "[1, 2]", '{ name = "x" }', "[" * 300 + "]" * 300, "1979-05-27", "12:00:00",
]  # fmt: skip
GPU_TYPES = ['"T4"', '"V100"', '"A100-80GB"']
KEYS = [
    "name", "count", "prefix", "gpu_type", "gpus", "gpus_per_switch", "rack", "racks_of", "cpu_milli",
    "host_mem_mib", "mem_mib", "speed", "quota_gpus", "gpu", "a.b", '"quoted"',
]  # fmt: skip


@st.composite
def toml_tables(draw: st.DrawFn) -> str:
    """A cluster file of [[gpu_type]], [[nodes]] and [[tenant]] tables whose keys are mostly the format's own."""
    out = []
    if draw(st.booleans()):
        out.append(f"name = {draw(st.sampled_from(VALUES))}")
    for _ in range(draw(st.integers(0, 5))):
        table = draw(st.sampled_from(["nodes", "nodes", "nodes", "gpu_type", "tenant", "other"]))
        out.append(f"[[{table}]]")
        if table == "nodes" and draw(st.booleans()):  # often well formed, so the size checks are reached
            out += [f"gpu_type = {draw(st.sampled_from(GPU_TYPES))}", f"gpus = {draw(st.sampled_from(VALUES[:12]))}"]
        for _ in range(draw(st.integers(0, 4))):
            out.append(f"{draw(st.sampled_from(KEYS))} = {draw(st.sampled_from(VALUES))}")
    return "\n".join(out) + "\n"


TOML_PIECES = st.sampled_from(
    ["[[nodes]]\n", "[nodes]\n", "gpus = ", "count = ", 'gpu_type = "T4"\n', "1", "8\n", "[", "]", "{", "}",
     '"', "'", '"""', "=", ".", ",", "#", "\n", " ", "a", "1e308", "9223372036854775808", "\x00", "\udc80"]
)  # fmt: skip
TOML_TEXTS = st.one_of(toml_tables(), st.lists(TOML_PIECES, max_size=40).map("".join), st.text(max_size=120))


def check_cluster(build: Callable[[], Any], source: str | None) -> None:
    """A cluster within corral's limits, or a ClusterSpecError (``source`` named, when there is a file) or a
    ConfigError."""
    try:
        with no_hang():
            cluster = build()
    except ClusterSpecError as err:
        if source is not None:
            assert err.file == source, err
            assert err.line is not None or err.column is not None, err
        str(err)
        return
    except ConfigError as err:
        str(err)
        return
    assert 1 <= len(cluster.nodes) <= MAX_NODES
    assert cluster.num_gpus <= MAX_GPUS
    assert all(1 <= node.num_gpus <= MAX_GPUS_PER_NODE for node in cluster.nodes)


@FUZZ
@given(text=TOML_TEXTS)
def test_cluster_toml_text(text: str) -> None:
    check_cluster(lambda: parse_cluster_toml(text, source="fuzz.toml"), "fuzz.toml")


@FUZZ
@given(text=TOML_TEXTS, junk=st.sampled_from([b"", b"\xff", b"\xef\xbb\xbf", b"\x00"]))
def test_cluster_toml_file(folder: Path, text: str, junk: bytes) -> None:
    path = folder / "cluster.toml"
    path.write_bytes(junk + text.encode("utf-8", "surrogatepass"))
    check_cluster(lambda: load_cluster(str(path)), str(path))


INLINE = st.one_of(
    st.builds(
        lambda n, x, g, t: f"{n}{x}{g}{t}",
        st.sampled_from(["0", "1", "4", "200000", "200001", "9" * 5000, "\u0664", "\uff14", "1_0", ""]),
        st.sampled_from(["x", "X", "*"]),
        st.sampled_from(["0", "1", "8", "1024", "1025", "9" * 30, "\u0668", ""]),
        st.sampled_from(["", ":T4", ":t4", ":nope", ":", ": A100-80GB "]),
    ),
    st.text(alphabet="0123456789xX:gn \u0664\uff14_-abc", max_size=20),  # no "/" or ".": never a real path
)


@FUZZ
@given(spec=INLINE)
def test_inline_cluster_specs(spec: str) -> None:
    check_cluster(lambda: load_cluster(spec), None)
