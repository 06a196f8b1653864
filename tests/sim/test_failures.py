"""Node failures in the simulator: replays with a failure file (jobs on a lost node requeue from their last
checkpoint and finish elsewhere; a node that is back is used again), the checkpoint model by hand, failures drawn
at a rate, the failure file's located errors, the metrics, and ``corral simulate --node-failures``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from builders import cluster, job, log, spans
from corral.cli.main import cli
from corral.core.cluster import Cluster
from corral.core.decisions import Action, Decision, Launch, Preempt
from corral.core.errors import ConfigError, InputError
from corral.core.events import NodeJoined, NodeLost
from corral.core.job import JobPhase, JobSpec
from corral.core.placement import Placement
from corral.policies import make_policy
from corral.policies.framework.contract import BasePolicy
from corral.policies.framework.view import ClusterView
from corral.sim.failures import (
    BadFailureRows,
    FailureRate,
    parse_failure_rate,
    random_node_failures,
    read_node_failures,
)
from corral.sim.perf import PerfModel
from corral.sim.runner import SimulationResult, simulate
from corral.sim.traces import Trace
from corral.workloads.data import data_file

FAILURE_KEYS = ("node_failures", "jobs_requeued_by_failures", "lost_work_gpu_h", "down_gpu_h")


def replay(
    jobs: list[JobSpec],
    c: Cluster,
    policy: BasePolicy | str,
    events: Any,
    perf: PerfModel | None = None,
) -> SimulationResult:
    p = make_policy(policy) if isinstance(policy, str) else policy
    return simulate(
        Trace(jobs, "test"), c, p, perf=perf, record_decisions=True, check_invariants=True, node_events=events
    )


def write(tmp_path: Path, text: str, name: str = "failures.csv") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


# -- replays with a failure file ---------------------------------------------------------------------------------


def test_jobs_on_a_lost_node_restart_elsewhere_from_their_checkpoint_and_the_node_is_used_again(
    tmp_path: Path,
) -> None:
    # Two nodes of two GPUs (n0: GPUs 0-1, n1: GPUs 2-3). a (2 GPUs, 3600 s) runs on n0 from 0; n0 is lost at 2000:
    # a kept its checkpoint at 1800 s of work (the default interval), restarts on n1 at once, pays restore_s = 30 s
    # and needs 1800 s more: it ends at 3830. n0 is back at 2500; b (2 GPUs, 100 s, at 2600) runs there.
    c = cluster(nodes=2, gpus=2)
    path = write(tmp_path, "time_s,node,event,reason\n2000,n0,lost,psu\n2500,n0,joined,\n")
    events = read_node_failures(path, c)
    assert events == [(2000.0, NodeLost("n0", "psu")), (2500.0, NodeJoined("n0"))]
    jobs = [job("a", gpus=2, duration=3600), job("b", gpus=2, duration=100, submit=2600)]
    result = replay(jobs, c, "fifo", events)
    assert log(result) == [
        "0.000 launch a gpus=0 1 milli=1000",
        "2000.000 node-lost n0 requeued a",
        "2000.000 launch a gpus=2 3 milli=1000",
        "2500.000 node-joined n0",
        "2600.000 launch b gpus=0 1 milli=1000",
    ]
    assert spans(result) == {"a": (0.0, 3830.0), "b": (2600.0, 2700.0)}
    a = next(j for j in result.jobs if j.job_id == "a")
    assert (a.phase, a.preemptions, a.work_done_s) == (JobPhase.FINISHED, 1, 3600.0)
    s = result.summary
    assert (s["jobs_finished"], s["jobs_unfinished"], s["preemptions"]) == (2, 0, 1)
    assert s["node_failures"] == 1 and s["jobs_requeued_by_failures"] == 1
    assert s["lost_work_gpu_h"] == pytest.approx(200 * 2 / 3600, abs=1e-3)  # 2000 - 1800 s on 2 GPUs
    assert s["down_gpu_h"] == pytest.approx(2 * 500 / 3600, abs=1e-3)  # 2 GPUs from 2000 to 2500


@pytest.mark.parametrize(
    ("interval", "kept"),
    [(1800.0, 1800.0), (0.0, 2000.0), (700.0, 1400.0), (5000.0, 0.0)],
    ids=["default", "every-step", "700s", "never-reached"],
)
def test_the_work_since_the_last_checkpoint_is_lost(interval: float, kept: float) -> None:
    c = cluster(nodes=2, gpus=2)
    perf = PerfModel(checkpoint_interval_s=interval)
    result = replay([job("a", gpus=2, duration=3600)], c, "fifo", [(2000.0, NodeLost("n0", "t"))], perf)
    assert spans(result)["a"] == (0.0, 2000.0 + 30.0 + 3600.0 - kept)
    assert result.summary["lost_work_gpu_h"] == pytest.approx((2000.0 - kept) * 2 / 3600, abs=1e-3)


class Script(BasePolicy):
    """Plays a fixed list of actions per round time (and launches nothing else)."""

    name = "script"

    def __init__(self, script: dict[float, list[Action]]) -> None:
        super().__init__()
        self.script = script

    def schedule(self, view: ClusterView, now_s: float) -> Decision:
        return Decision(tuple(self.script.pop(now_s, [])))


@pytest.mark.parametrize(
    ("again", "end"),
    [
        # Resumed in place from host memory: not a checkpoint, so the run it was suspended from is what counts
        # (progress 0 at its launch): everything is lost at 2000.
        (Placement((0,)), 2000.0 + 30.0 + 3000.0),
        # Resumed on the other node: a checkpoint restore (restore_s), so its 100 s of work then were a checkpoint.
        (Placement((2,)), 2000.0 + 30.0 + 2900.0),
    ],
    ids=["resumed-in-place", "resumed-elsewhere"],
)
def test_a_resumed_job_restarts_from_its_last_real_checkpoint(again: Placement, end: float) -> None:
    c = cluster(nodes=2, gpus=2)
    lost = "n0" if again.gpus == (0,) else "n1"
    script: dict[float, list[Action]] = {
        0.0: [Launch("a", Placement((0,)))],
        100.0: [Preempt("a", "test", suspend=True), Launch("t1", Placement((1,)))],
        150.0: [Launch("a", again), Launch("t2", Placement((1,)))],
        2000.0: [Launch("a", Placement((3,) if lost == "n0" else (1,)))],
    }
    # t1 and t2 (1 s each) only make the rounds at 100 and 150 happen.
    jobs = [job("a", duration=3000), job("t1", duration=1, submit=100), job("t2", duration=1, submit=150)]
    perf = PerfModel(checkpoint_interval_s=5000.0)
    result = replay(jobs, c, Script(script), [(2000.0, NodeLost(lost, "t"))], perf)
    assert spans(result)["a"] == (0.0, end)
    assert f"2000.000 node-lost {lost} requeued a" in log(result)


def test_a_job_suspended_on_a_lost_node_loses_its_host_memory_state() -> None:
    # a runs on GPU 0 for 100 s, is suspended there (b takes GPU 0); n0 is lost at 200: b's run and a's suspended
    # state go; both restart on n1 from progress 0 (their last checkpoint), each paying restore_s.
    c = cluster(nodes=2, gpus=2)
    script: dict[float, list[Action]] = {
        0.0: [Launch("a", Placement((0,)))],
        100.0: [Preempt("a", "test", suspend=True), Launch("b", Placement((0,)))],
        200.0: [Launch("a", Placement((2,))), Launch("b", Placement((3,)))],
    }
    jobs = [job("a", duration=1000), job("b", duration=1000, submit=100)]
    result = replay(jobs, c, Script(script), [(200.0, NodeLost("n0", "t"))])
    assert spans(result) == {"a": (0.0, 200.0 + 30.0 + 1000.0), "b": (100.0, 200.0 + 30.0 + 1000.0)}
    assert "200.000 node-lost n0 requeued b" in log(result)
    s = result.summary
    assert (s["jobs_requeued_by_failures"], s["lost_work_gpu_h"]) == (1, pytest.approx(200 / 3600, abs=1e-3))


def test_a_job_that_needs_a_lost_node_waits_for_it_and_is_not_rejected() -> None:
    c = cluster(nodes=2, gpus=2)
    events = [(0.0, NodeLost("n1", "t")), (500.0, NodeJoined("n1"))]
    result = replay([job("big", gpus=4, duration=100, submit=10)], c, "fifo", events)
    assert spans(result)["big"] == (500.0, 600.0)
    assert result.summary["jobs_rejected"] == 0
    # A node that never comes back leaves it unfinished, and the replay still ends.
    result = replay([job("big", gpus=4, duration=100, submit=10)], c, "fifo", [(0.0, NodeLost("n1", "t"))])
    assert (result.summary["jobs_unfinished"], result.summary["jobs_rejected"]) == (1, 0)


def test_an_endless_stream_of_failures_stops_with_the_replay() -> None:
    c = cluster(nodes=4, gpus=2)
    jobs = [job(f"j{i}", gpus=1 + i % 2, duration=600, submit=60.0 * i) for i in range(20)]
    stream = random_node_failures([n.name for n in c.nodes], FailureRate(mtbf_h=0.5, repair_h=0.1), seed=3)
    result = replay(jobs, c, "fifo:backfill=true", stream)
    s = result.summary
    assert (s["jobs_finished"], s["jobs_unfinished"]) == (20, 0)
    assert s["node_failures"] > 0 and s["jobs_requeued_by_failures"] > 0
    lost = sum(1 for line in log(result) if " node-lost " in line)
    assert lost == s["node_failures"]
    ends = [j.end_s for j in result.jobs if j.end_s is not None]
    assert all(float(line.split()[0]) <= max(ends) for line in log(result))  # nothing after the last job


def test_without_failures_a_replay_is_unchanged() -> None:
    c = cluster(nodes=2, gpus=4)
    jobs = [job(f"j{i}", gpus=1 + i % 4, duration=100 + 37 * i, submit=13.0 * i) for i in range(30)]
    plain = replay(jobs, c, "tiresias", None)
    empty = replay(jobs, c, "tiresias", [])
    assert log(plain) == log(empty)
    assert plain.summary == empty.summary
    assert all(plain.summary[k] == 0 for k in FAILURE_KEYS)


def test_the_same_seed_gives_the_same_replay() -> None:
    c = cluster(nodes=3, gpus=2)
    jobs = [job(f"j{i}", gpus=1 + i % 2, duration=900, submit=30.0 * i) for i in range(15)]
    rate = FailureRate(mtbf_h=0.3, repair_h=0.1)
    names = [n.name for n in c.nodes]
    one = replay(jobs, c, "srtf", random_node_failures(names, rate, seed=1))
    two = replay(jobs, c, "srtf", random_node_failures(names, rate, seed=1))
    other = replay(jobs, c, "srtf", random_node_failures(names, rate, seed=2))
    assert log(one) == log(two) and one.summary == two.summary
    assert log(one) != log(other)


# -- failures drawn at a rate ------------------------------------------------------------------------------------


def test_drawn_failures_alternate_per_node_and_depend_on_the_seed_and_the_node_only() -> None:
    rate = FailureRate(mtbf_h=10.0, repair_h=1.0)
    three = list(_take(random_node_failures(["a", "b", "c"], rate, start_s=100.0, seed=5), 300))
    times = [t for t, _ in three]
    assert times == sorted(times) and times[0] >= 100.0
    for name in "abc":
        mine = [e for _, e in three if e.node == name]
        assert all(isinstance(e, NodeLost) for e in mine[0::2]) and all(isinstance(e, NodeJoined) for e in mine[1::2])
    # A node's failures do not depend on the other nodes: node b alone gives b's events of the three.
    alone = list(_take(random_node_failures(["b"], rate, start_s=100.0, seed=5), 50))
    assert alone == [x for x in three if x[1].node == "b"][:50]
    # The rate's own seed overrides the run's.
    pinned = FailureRate(mtbf_h=10.0, repair_h=1.0, seed=5)
    assert list(_take(random_node_failures(["b"], pinned, start_s=100.0, seed=9), 50)) == alone
    assert list(_take(random_node_failures(["b"], rate, start_s=100.0, seed=9), 50)) != alone


def test_drawn_failures_have_the_means_asked_for() -> None:
    rate = FailureRate(mtbf_h=10.0, repair_h=2.0)
    events = list(_take(random_node_failures([f"n{i}" for i in range(20)], rate, seed=0), 40_000))
    up: list[float] = []
    down: list[float] = []
    last: dict[str, float] = {}
    for t, e in events:
        if e.node in last:
            (down if isinstance(e, NodeJoined) else up).append(t - last[e.node])
        last[e.node] = t
    assert sum(up) / len(up) / 3600 == pytest.approx(10.0, rel=0.05)
    assert sum(down) / len(down) / 3600 == pytest.approx(2.0, rel=0.05)


def _take(it: Any, n: int) -> Any:
    for i, x in enumerate(it):
        if i >= n:
            return
        yield x


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("mtbf_h=10,repair_h=1,seed=4", None),
        (" mtbf_h = 0.5 , repair_h=2 ", None),
        ("mtbf_h=10", "repair_h is missing"),
        ("mtbf_h=10,repair_h=1,mttr=3", "expected mtbf_h=HOURS,repair_h=HOURS[,seed=N]"),
        ("mtbf_h=10,repair_h=x", "hours must be numbers"),
        ("mtbf_h=0,repair_h=1", "mtbf_h must be a positive number of hours, got 0.0"),
        ("mtbf_h=10,repair_h=inf", "repair_h must be a positive number"),
        ("mtbf_h=1,repair_h=1,seed=1.5", "seed must be an integer"),
        ("mtbf_h=1,mtbf_h=2,repair_h=1", "mtbf_h is given twice"),
    ],
)
def test_parse_failure_rate(text: str, message: str | None) -> None:
    if message is None:
        rate = parse_failure_rate(text)
        assert rate.mtbf_h > 0 and rate.repair_h > 0
        return
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_failure_rate(text)


# -- the failure file's errors -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("", "failures.csv:1: the failure file is empty; expected a header: time_s,node,event[,reason]"),
        (
            "time,node,event\n",
            "failures.csv:1: unknown column in the header; column 'time'; expected the columns time_s, node, event "
            "and optionally reason; got 'time,node,event'",
        ),
        ("time_s,node\n", "failures.csv:1: the header lacks column 'event'; column 'event'"),
        ("time_s,node,event,node\n", "failures.csv:1: a column is named twice in the header; column 'node'"),
        (
            "time_s,node,event\n10,n0\n",
            "failures.csv:2: the row has 2 fields but the header has 3 columns; expected 3 comma-separated fields, as "
            "in the header: time_s,node,event; got '10,n0'",
        ),
        (
            "time_s,node,event\n\n-5,n0,lost\n",
            "failures.csv:3: bad time; column 'time_s'; expected seconds >= 0 (ASCII digits); got '-5'",
        ),
        ("time_s,node,event\n１２,n0,lost\n", "failures.csv:2: bad time; column 'time_s'"),
        ("time_s,node,event\n1e999,n0,lost\n", "failures.csv:2: bad time; column 'time_s'"),
        ("time_s,node,event\nnan,n0,lost\n", "failures.csv:2: bad time; column 'time_s'"),
        (
            "time_s,node,event\n5,n7,lost\n",
            "failures.csv:2: no such node in cluster 'test'; column 'node'; expected a node name of the cluster (n0, "
            "n1); got 'n7'",
        ),
        (
            "time_s,node,event\n5,n0,down\n",
            "failures.csv:2: bad event; column 'event'; expected lost or joined; got 'down'",
        ),
        (
            "time_s,node,event\n5,n0,lost\n9,n0,lost\n",
            "failures.csv:3: node 'n0' is lost already (at line 2); column 'event'; expected joined; got 'lost'",
        ),
        (
            # Taken in time order: the return at 9 (line 2) comes before the loss at 10 (line 3).
            "time_s,node,event\n9,n1,joined\n10,n1,lost\n",
            "failures.csv:2: node 'n1' is up at 9 s (every node starts up); column 'event'; expected lost; got "
            "'joined'",
        ),
    ],
    ids=lambda x: x if len(x) < 30 else x[:30],
)
def test_a_bad_failure_file_is_named_where_it_is_wrong(tmp_path: Path, text: str, error: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(InputError) as got:
        read_node_failures(path, cluster(nodes=2, gpus=1))
    assert str(got.value).startswith(str(tmp_path / error.split(":", 1)[0]) + ":" + error.split(":", 1)[1])


def test_failure_file_rows_are_taken_in_time_order_with_optional_reason_and_blank_lines(tmp_path: Path) -> None:
    path = write(tmp_path, "event, node ,time_s\n\njoined,n1,20.5\nLOST,n1,3\nlost,n0,20.5\n")
    assert read_node_failures(path, cluster(nodes=2, gpus=1)) == [
        (3.0, NodeLost("n1", "failure file")),
        (20.5, NodeJoined("n1")),
        (20.5, NodeLost("n0", "failure file")),
    ]
    bom = write(tmp_path, "\ufefftime_s,node,event\n1,n0,lost\n", "bom.csv")  # as spreadsheets save CSV
    assert read_node_failures(bom, cluster(nodes=2, gpus=1)) == [(1.0, NodeLost("n0", "failure file"))]
    with pytest.raises(InputError, match="no such failure file"):
        read_node_failures(tmp_path / "missing.csv", cluster(nodes=1, gpus=1))


# -- the command line --------------------------------------------------------------------------------------------


def _simulate(*args: str) -> Any:
    trace = str(data_file("tiresias", "60_job.csv"))
    return CliRunner().invoke(
        cli, ["simulate", "--format", "tiresias", "--trace", trace, "--cluster", "2x4", "--no-progress", *args]
    )


def test_cli_simulate_with_a_failure_file(tmp_path: Path) -> None:
    path = write(tmp_path, "time_s,node,event\n600,node-1,lost\n3000,node-1,joined\n")
    out = tmp_path / "out"
    got = _simulate("--node-failures", str(path), "--out", str(out))
    assert got.exit_code == 0, got.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["node_failures"] == 1 and summary["jobs_finished"] == 60
    assert summary["jobs_requeued_by_failures"] >= 1
    assert f"node failures from {path}: 1 loss, 1 return" in summary["trace_notes"]


def test_cli_simulate_with_failures_drawn_at_a_rate() -> None:
    got = _simulate("--node-failure-rate", "mtbf_h=0.5,repair_h=0.2", "--policy", "tiresias")
    assert got.exit_code == 0, got.output
    assert "node_failures" in got.output and "node failures drawn for 2 nodes" in got.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--node-failure-rate", "mtbf_h=1"], "repair_h is missing"),
        (["--node-failures", "X", "--node-failure-rate", "mtbf_h=1,repair_h=1"], "not both"),
    ],
)
def test_cli_refuses_bad_failure_options(args: list[str], message: str) -> None:
    got = _simulate(*args)
    assert got.exit_code == 2
    assert message in got.output


def test_cli_names_the_bad_line_of_a_failure_file(tmp_path: Path) -> None:
    path = write(tmp_path, "time_s,node,event\n600,node-9,lost\n")
    got = _simulate("--node-failures", str(path))
    assert got.exit_code == 2
    assert "failures.csv:2: no such node in cluster '2x4'" in " ".join(got.output.split())


def test_drawn_failure_counts_are_plausible() -> None:
    # 4 nodes failing every 0.5 h on average over a replay of a few hours: dozens of failures, not thousands.
    c = cluster(nodes=4, gpus=2)
    jobs = [job(f"j{i}", duration=1800, submit=600.0 * i) for i in range(10)]
    stream = random_node_failures([n.name for n in c.nodes], FailureRate(0.5, 0.05), seed=0)
    result = replay(jobs, c, "fifo", stream)
    makespan_h = result.summary["makespan_s"] / 3600
    assert 0 < result.summary["node_failures"] <= math.ceil(4 * makespan_h / 0.5 * 3)


def test_every_bad_row_of_a_failure_file_is_reported_at_once(tmp_path: Path) -> None:
    text = "time_s,node,event\n5,n0,lost\n-1,n0,lost\n6,n7,lost\n7,n0,down\n8,n0,lost\n9,n1,joined\n10,n0,joined\n"
    path = write(tmp_path, text)
    with pytest.raises(BadFailureRows) as got:
        read_node_failures(path, cluster(nodes=2, gpus=1))
    err = got.value
    assert [e.line for e in err.rows] == [3, 4, 5, 6, 7]  # in line order, the order checks' among the rows'
    assert err.line == 3 and err.column == "time_s"  # located as the first bad row
    lines = str(err).splitlines()
    assert lines[0].endswith(
        "failures.csv:3: bad time; column 'time_s'; expected seconds >= 0 (ASCII digits); got '-1'"
    )
    assert "failures.csv:6: node 'n0' is lost already (at line 2)" in lines[3]
    assert "failures.csv:7: node 'n1' is up at 9 s" in lines[4]
    assert lines[-1] == "(5 bad rows in all)"
    many = write(tmp_path, "time_s,node,event\n" + "x,n0,lost\n" * 25, "many.csv")
    with pytest.raises(BadFailureRows) as got:
        read_node_failures(many, cluster(nodes=2, gpus=1))
    assert str(got.value).splitlines()[-1] == "... and 5 more bad rows (25 bad rows in all)"
