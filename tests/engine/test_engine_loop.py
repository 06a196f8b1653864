"""The engine loop: event handling, stale completions, rejection, streaming input, hooks and the decision log.

Most tests drive the engine with a scripted policy (the actions to take at given times) and the simulator's
executor, so every time below can be worked out by hand: one node of GPUs of speed 1.0, so a job makes
``duration`` seconds of progress in ``duration`` seconds, and a restarted job first pays ``restore_s``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import pytest

import corral
from builders import cluster, job
from corral.core.cluster import Cluster, Topology
from corral.core.decisions import Action, Decision, Launch, Preempt, Reject
from corral.core.errors import InvariantViolation, JobSpecError
from corral.core.job import JobPhase, JobSpec, JobView
from corral.core.placement import Placement
from corral.engine.clock import VirtualClock
from corral.engine.loop import Engine, LoggedAction
from corral.engine.state import ClusterState
from corral.policies.baseline import FifoPolicy
from corral.policies.framework.contract import BasePolicy
from corral.policies.framework.view import ClusterView
from corral.sim.executor import SimExecutor
from corral.sim.perf import PerfModel
from corral.workloads.colocation import load_colocation


class Scripted(BasePolicy):
    """Does exactly what the script says at each time, and records every hook call."""

    name = "scripted"

    def __init__(self, script: Mapping[float, Sequence[Action]], refuse: Mapping[str, str] | None = None) -> None:
        super().__init__()
        self.script = {t: list(actions) for t, actions in script.items()}
        self.refuse = dict(refuse or {})
        self.changes: list[tuple[float, str, JobPhase]] = []
        self.rounds: list[float] = []
        self.timers: list[float] = []

    def admit(self, view: ClusterView, spec: JobSpec) -> str | None:
        return self.refuse.get(spec.job_id)

    def schedule(self, view: ClusterView, now_s: float) -> Decision:
        self.rounds.append(now_s)
        actions = self.script.pop(now_s, [])
        later = [t for t in self.script if t > now_s]
        return Decision(tuple(actions), wake_at_s=min(later) if later else None)

    def on_job_changed(self, job: JobView, before: Placement | None, now_s: float) -> None:
        self.changes.append((now_s, job.spec.job_id, job.phase))

    def on_timer(self, view: ClusterView, now_s: float) -> tuple[str, ...]:
        self.timers.append(now_s)
        return ()


def engine(c: Cluster, policy: BasePolicy, restore_s: float = 0.0, perf: PerfModel | None = None) -> Engine:
    topo = Topology(c)
    s = ClusterState(topo, c.tenants, queue_key=policy.queue_key)
    executor = SimExecutor(topo, perf or PerfModel(restore_s=restore_s))
    return Engine(s, policy, executor, VirtualClock(), record_decisions=True)


def replay(e: Engine, jobs: Iterable[JobSpec]) -> list[str]:
    e.feed(jobs)
    e.run()
    e.state.check_invariants()
    assert e.decision_log is not None
    return [entry.render() for entry in e.decision_log]


def on(*gpus: int, milli: int = 1000) -> Placement:
    return Placement(gpus, milli)


# -- stale completions ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("b_duration", "a_restart", "a_end"),
    [
        # b runs 10-60; a restarts at 60 (epoch 2) and is RUNNING when its stale epoch-1 completion (t=100)
        # comes: restore 5 + 90 s of work left -> 60 + 5 + 90 = 155.
        (50.0, 60.0, 155.0),
        # b runs 10-160; a is still PENDING when the stale completion comes at 100; 160 + 5 + 90 = 255.
        (150.0, 160.0, 255.0),
    ],
)
def test_stale_completion_after_preemption_is_ignored(b_duration: float, a_restart: float, a_end: float) -> None:
    script = {
        0.0: [Launch("a", on(0))],  # a would finish at 100
        10.0: [Preempt("a"), Launch("b", on(0))],  # a has done 10 s of its 100
        a_restart: [Launch("a", on(0))],
    }
    policy = Scripted(script)
    e = engine(cluster(nodes=1, gpus=1), policy, restore_s=5.0)
    lines = replay(e, [job("a", duration=100, submit=0), job("b", duration=b_duration, submit=10)])
    assert lines == [
        "0.000 launch a gpus=0 milli=1000",
        "10.000 preempt a",
        "10.000 launch b gpus=0 milli=1000",
        f"{a_restart:.3f} launch a gpus=0 milli=1000",
    ]
    a, b = e.state.job("a"), e.state.job("b")
    assert (a.phase, a.end_s, a.run_epoch, a.preemptions, a.work_done_s) == (JobPhase.FINISHED, a_end, 2, 1, 100.0)
    assert a.executed_s == 10.0 + (a_end - a_restart)  # the restore time holds the GPU, so it counts
    assert b.end_s == 10.0 + b_duration
    # The stale event at t=100 changed nothing: no round, no hook call.
    assert 100.0 not in policy.rounds
    assert all(t != 100.0 for t, _, _ in policy.changes)


# -- jobs that can never run ----------------------------------------------------------------------------------
def test_job_that_never_fits_is_rejected_and_the_run_ends() -> None:
    # FIFO without backfill on 4 GPUs: "big" (5 GPUs) is rejected on arrival, so it blocks nobody:
    # a runs 0-10 on 2 GPUs; b (4 GPUs) waits for a and runs 10-20.
    e = engine(cluster(nodes=1, gpus=4), FifoPolicy())
    lines = replay(
        e,
        [job("big", gpus=5, duration=10, submit=0), job("a", gpus=2, duration=10), job("b", gpus=4, duration=10)],
    )
    big = e.state.job("big")
    assert big.phase is JobPhase.REJECTED
    assert big.reason == "needs 5 GPUs; the cluster has at most 4 of one type"
    assert lines == [
        "0.000 reject big needs 5 GPUs; the cluster has at most 4 of one type",
        "0.000 launch a gpus=0 1 milli=1000",
        "10.000 launch b gpus=0 1 2 3 milli=1000",
    ]
    assert e.state.job("b").end_s == 20.0
    assert not e.queue
    assert e.state.num_pending == 0 and e.state.num_running == 0


# -- streaming input ------------------------------------------------------------------------------------------
def test_feed_rejects_out_of_order_jobs() -> None:
    e = engine(cluster(nodes=1, gpus=1), FifoPolicy())
    e.feed([job("a", submit=10), job("b", submit=5)])
    # A user error (CorralError, so the CLI prints it cleanly), naming both jobs and their times.
    with pytest.raises(
        JobSpecError, match=r"submission order: 'b' \(submitted at 5.*\) comes after 'a' \(submitted at 10"
    ):
        e.run()
    assert "b" not in e.state  # never admitted


def test_feed_keeps_one_arrival_queued_and_takes_equal_times() -> None:
    e = engine(cluster(nodes=1, gpus=1), FifoPolicy())
    e.feed([job("a", duration=1, submit=0), job("b", duration=1, submit=0), job("c", duration=1, submit=3)])
    assert len(e.queue) == 1  # only the next arrival, however long the stream
    with pytest.raises(RuntimeError, match="already being fed"):
        e.feed([])
    e.run()
    # a 0-1, b 1-2, c 3-4
    assert [(j.job_id, j.end_s) for j in e.state.jobs()] == [("a", 1.0), ("b", 2.0), ("c", 4.0)]
    assert e.submitted == 3


def test_submit_in_the_past_arrives_now_and_run_until_stops() -> None:
    e = engine(cluster(nodes=1, gpus=1), FifoPolicy())
    e.submit(job("a", duration=100, submit=0))
    e.run(until_s=50.0)
    assert e.state.job("a").phase is JobPhase.RUNNING  # its completion at 100 is still queued
    assert e.clock.now() == 0.0
    e.clock.advance_to(50.0)
    e.submit(job("late", duration=10, submit=20))  # "submitted at 20", but the engine is at 50
    e.run()
    late = e.state.job("late")
    assert late.queued_since_s == 50.0
    assert (late.first_start_s, late.end_s) == (100.0, 110.0)


# -- hooks ----------------------------------------------------------------------------------------------------
def test_on_job_changed_sees_every_phase_change() -> None:
    script = {
        0.0: [Launch("a", on(0))],
        5.0: [Preempt("a"), Reject("y", "not today"), Launch("b", on(0))],
        15.0: [Launch("a", on(0))],
    }
    policy = Scripted(script, refuse={"x": "nope"})
    e = engine(cluster(nodes=1, gpus=1), policy)
    jobs = [job("a", duration=30, submit=0)] + [job(j, duration=10, submit=5) for j in ("b", "x", "y")]
    lines = replay(e, jobs)
    P, R, F, X = JobPhase.PENDING, JobPhase.RUNNING, JobPhase.FINISHED, JobPhase.REJECTED
    # a: 0-5 (5 s done), b: 5-15, a again 15-40 (25 s left, no restore cost); a's stale completion at 30.
    assert policy.changes == [
        (0.0, "a", P),
        (0.0, "a", R),
        (5.0, "b", P),
        (5.0, "x", P),
        (5.0, "x", X),  # refused on admission
        (5.0, "y", P),
        (5.0, "a", P),  # preempted
        (5.0, "y", X),  # rejected by the policy's decision
        (5.0, "b", R),
        (15.0, "b", F),
        (15.0, "a", R),
        (40.0, "a", F),
    ]
    assert lines == [
        "0.000 launch a gpus=0 milli=1000",
        "5.000 reject x nope",
        "5.000 preempt a",
        "5.000 reject y not today",
        "5.000 launch b gpus=0 milli=1000",
        "15.000 launch a gpus=0 milli=1000",
    ]
    assert e.state.job("x").reason == "nope" and e.state.job("y").reason == "not today"
    # Rounds: at 0 (a arrives), 5 (arrivals + timer), 15 (b finished + timer), 40 (a finished).
    assert policy.rounds == [0.0, 5.0, 15.0, 40.0]
    assert policy.timers == [5.0, 15.0]


def test_wake_ups_are_not_duplicated() -> None:
    # The round at 0 and the round at 3 both ask to be woken at 10: one timer fires, once.
    policy = Scripted({10.0: []})
    e = engine(cluster(nodes=1, gpus=1), policy)
    e.feed([job("a", submit=0), job("b", submit=3)])
    e.run()
    assert policy.timers == [10.0]
    assert policy.rounds == [0.0, 3.0, 10.0]


# -- a policy's bug surfaces --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("actions", "message"),
    [
        ([Preempt("a")], "cannot preempt job 'a': it is pending"),
        ([Launch("a", on(0)), Launch("b", on(0))], "0 milli free"),
        ([Launch("a", on(0, 1))], "gang"),
        ([Launch("ghost", on(0))], "unknown job"),
    ],
)
def test_bad_decisions_raise(actions: list[Action], message: str) -> None:
    e = engine(cluster(nodes=1, gpus=2), Scripted({0.0: actions}))
    e.feed([job("a"), job("b")])
    with pytest.raises(InvariantViolation, match=message):
        e.run()


def test_unknown_event_raises() -> None:
    class Odd:
        priority = 0

    # The compiled core checks the type of an event as the engine is given it, with mypyc's TypeError (events are
    # compiled records: setup.py); the pure code says the same as an invariant violation.
    bug = (TypeError, "Odd") if corral.compiled() else (InvariantViolation, "unknown event")
    e = engine(cluster(nodes=1, gpus=1), FifoPolicy())
    with pytest.raises(bug[0], match=bug[1]):  # as it is scheduled
        e.schedule(1.0, Odd())  # type: ignore[arg-type]
    # One that reaches the loop all the same (pushed onto the heap directly) is refused there.
    e.queue._heap.append((1.0, 0, 1, Odd()))  # type: ignore[arg-type]
    with pytest.raises(bug[0], match=bug[1]):
        e.run()


# -- the decision log -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("entry", "text"),
    [
        (LoggedAction(0.0, Launch("a", on(0))), "0.000 launch a gpus=0 milli=1000"),
        (LoggedAction(12.5, Launch("b", on(3, 4, 7))), "12.500 launch b gpus=3 4 7 milli=1000"),
        (LoggedAction(1 / 3, Launch("c", on(2, milli=250))), "0.333 launch c gpus=2 milli=250"),
        (LoggedAction(7.0, Preempt("d", "because")), "7.000 preempt d"),
        (LoggedAction(7.5, Preempt("d", "time slice", suspend=True)), "7.500 suspend d"),
        (LoggedAction(8.0, Reject("e", "too big")), "8.000 reject e too big"),
    ],
)
def test_log_rendering(entry: LoggedAction, text: str) -> None:
    assert entry.render() == text


def test_no_log_unless_asked() -> None:
    topo = Topology(cluster(nodes=1, gpus=1))
    e = Engine(ClusterState(topo), FifoPolicy(), SimExecutor(topo), VirtualClock())
    e.feed([job("a")])
    e.run()
    assert e.decision_log is None
    assert e.state.job("a").phase is JobPhase.FINISHED


# -- migration, suspend/resume, packing -----------------------------------------------------------------------
def test_migration_is_a_preemption_and_a_launch_in_one_round() -> None:
    # a moves from node 0 to node 1 at 10 with 10 s done: restore 5 s, then 90 s: ends at 105. Its first
    # prediction (t=100, epoch 1) is stale and ignored.
    policy = Scripted({0.0: [Launch("a", on(0))], 10.0: [Preempt("a", "move"), Launch("a", on(1))]})
    e = engine(cluster(nodes=2, gpus=1), policy, restore_s=5.0)
    lines = replay(e, [job("a", duration=100)])
    assert lines == ["0.000 launch a gpus=0 milli=1000", "10.000 preempt a", "10.000 launch a gpus=1 milli=1000"]
    a = e.state.job("a")
    assert (a.end_s, a.preemptions, a.run_epoch, a.queued_s, a.executed_s) == (105.0, 1, 2, 0.0, 105.0)
    assert policy.changes[-3:] == [
        (10.0, "a", JobPhase.PENDING),
        (10.0, "a", JobPhase.RUNNING),
        (105.0, "a", JobPhase.FINISHED),
    ]
    assert 100.0 not in policy.rounds


@pytest.mark.parametrize(
    ("suspend", "gpu", "a_end"),
    [
        (True, 0, 20 + 3 + 90),  # resumed where it was suspended: suspend/resume cost
        (True, 1, 20 + 3 + 90),  # another GPU of the same node: its host memory still holds the state
        (True, 2, 20 + 30 + 90),  # another node: a restore
        (False, 0, 20 + 30 + 90),  # an ordinary preemption: a restore, wherever it restarts
    ],
)
def test_a_suspended_job_resumes_cheaply_only_on_its_node(suspend: bool, gpu: int, a_end: float) -> None:
    # Two nodes of two GPUs (0, 1 | 2, 3). a runs 0-10, is stopped, and comes back at 20 with 90 s to go.
    script = {0.0: [Launch("a", on(0))], 10.0: [Preempt("a", suspend=suspend)], 20.0: [Launch("a", on(gpu))]}
    e = engine(cluster(nodes=2, gpus=2), Scripted(script), perf=PerfModel(restore_s=30.0, suspend_resume_s=3.0))
    e.feed([job("a", duration=100)])
    e.run(until_s=15.0)
    a = e.state.job("a")
    assert a.suspended_from == (on(0) if suspend else None)
    e.run()
    assert e.decision_log is not None
    assert e.decision_log[1].render() == f"10.000 {'suspend' if suspend else 'preempt'} a"
    assert a.end_s == a_end


def test_packed_jobs_run_at_measured_rates_and_superseded_completions_are_ignored() -> None:
    # a (resnet50) starts packed at half of GPU 0 with nobody beside it: full speed, predicted to end at 100.
    # At 10 b (googlenet = ResNet-18) packs beside it: a slows to Gavel's rate r50 and is re-predicted to end
    # at 10 + 90 / r50. The first prediction (t=100, same run epoch) is superseded: the engine ignores it (no
    # round at 100). When a ends, b is alone and speeds up to 1.0.
    r50, r18 = load_colocation().rates("ResNet-50 (batch size 64)", "ResNet-18 (batch size 64)", "v100") or (0, 0)
    a_end = 10.0 + 90.0 / r50
    b_end = a_end + (200.0 - (a_end - 10.0) * r18)
    script = {0.0: [Launch("a", on(0, milli=500))], 10.0: [Launch("b", on(0, milli=500))]}
    policy = Scripted(script)
    e = engine(cluster(nodes=1, gpus=1), policy)
    e.feed([job("a", duration=100, model="resnet50"), job("b", duration=200, model="googlenet", submit=10)])
    e.run(until_s=5.0)
    assert e.state.job("a").observed_rate == 1.0
    e.run(until_s=50.0)
    assert (e.state.job("a").observed_rate, e.state.job("b").observed_rate) == (pytest.approx(r50), pytest.approx(r18))
    e.run()
    e.state.check_invariants()
    a, b = e.state.job("a"), e.state.job("b")
    assert a.end_s == pytest.approx(a_end)
    assert b.end_s == pytest.approx(b_end)
    assert (a.run_epoch, b.run_epoch) == (1, 1)
    assert 100.0 not in policy.rounds
    assert (a.observed_rate, b.observed_rate) == (None, None)  # not running any more
