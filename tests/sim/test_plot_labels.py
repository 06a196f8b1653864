"""Runs' names on a report's plots (corral.sim.plot_labels): a policy's full description ran off the figures."""

from __future__ import annotations

from corral.sim.plot_labels import short_labels

ANTMAN = "antman(placement=consolidated, opportunistic=True, reclaim={}, gpu_types=(a, b), scan_gpus=64)"


def test_a_policy_that_ran_once_is_named_alone() -> None:
    assert short_labels([ANTMAN.format("shrink")]) == ["antman"]
    assert short_labels(["before: " + ANTMAN.format("shrink"), "after: " + ANTMAN.format("shrink")]) == [
        "before: antman",
        "after: antman",
    ]


def test_only_the_options_that_differ_are_kept() -> None:
    got = short_labels([ANTMAN.format("shrink"), ANTMAN.format("preempt"), "fifo(backfill=False)"])
    assert got == ["antman(reclaim=shrink)", "antman(reclaim=preempt)", "fifo"]


def test_brackets_hold_their_commas() -> None:
    a = "hived(cells=(4, 8), seed=1)"
    b = "hived(cells=(4, 16), seed=1)"
    assert short_labels([a, b]) == ["hived(cells=(4, 8))", "hived(cells=(4, 16))"]


def test_labels_that_are_not_descriptions_or_would_become_alike_stay_whole() -> None:
    assert short_labels(["fifo", "tiresias:queues=3", "odd(text)", "x()"]) == [
        "fifo",
        "tiresias:queues=3",
        "odd(text)",
        "x()",
    ]
    # the same options but one more: cut, both would read "x"
    assert short_labels(["x(y=1)", "x(y=1, z=2)"]) == ["x(y=1)", "x(y=1, z=2)"]
    assert short_labels([ANTMAN.format("shrink")] * 2) == ["antman", "antman"]  # twins already
