"""The collector is relaxed while a replay runs and restored after it, also when the replay fails, and nested
uses change it once (:mod:`corral.sim.collector`)."""

from __future__ import annotations

import gc

import pytest

from builders import cluster, job
from corral.policies.registry import make_policy
from corral.sim.collector import THRESHOLDS, relaxed_collector
from corral.sim.runner import simulate
from corral.sim.traces import Trace


def test_relaxed_inside_and_restored_after() -> None:
    before = gc.get_threshold()
    with relaxed_collector():
        assert gc.get_threshold() == THRESHOLDS
        assert gc.get_freeze_count() > 0  # what was alive at the start is out of the collector's walks
        with relaxed_collector():
            assert gc.get_threshold() == THRESHOLDS
        assert gc.get_threshold() == THRESHOLDS  # the inner exit leaves the outer's settings alone
        assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def test_restored_when_the_block_raises() -> None:
    before = gc.get_threshold()
    with pytest.raises(RuntimeError, match="boom"), relaxed_collector():
        raise RuntimeError("boom")
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0
    with relaxed_collector():  # and the next use works as the first did
        assert gc.get_threshold() == THRESHOLDS


def test_a_replay_leaves_the_collector_as_it_found_it() -> None:
    before = gc.get_threshold()
    seen: list[tuple[int, int, int]] = []
    trace = Trace(jobs=[job("a", submit=0, duration=10), job("b", submit=5, duration=10)], source="test")
    result = simulate(
        trace, cluster(1, 1), make_policy("fifo"), after_round=lambda state, now: seen.append(gc.get_threshold())
    )
    assert result.summary["jobs_finished"] == 2
    assert seen and set(seen) == {THRESHOLDS}
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def test_what_the_block_leaves_alive_goes_to_the_oldest_generation() -> None:
    # The first young collection after the block must not walk a replay's records again (they live to its end).
    with relaxed_collector():
        kept = [[i] for i in range(1_000)]
        assert any(o is kept for o in gc.get_objects(0))
    assert not any(o is kept for o in gc.get_objects(0))
    assert any(o is kept for o in gc.get_objects(2))
    assert gc.get_count()[0] < 100  # nothing of the block is counted towards the next young collection
