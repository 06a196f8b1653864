"""The event queue's order, (time, priority, seq), and the virtual clock."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from builders import job
from corral.core.events import PRIORITY, Event, JobFinished, JobSubmitted, TimerFired
from corral.engine.clock import VirtualClock
from corral.engine.event_queue import EventQueue


def drain(q: EventQueue) -> list[tuple[float, Event]]:
    out = []
    while q:
        out.append(q.pop())
    return out


def test_priorities() -> None:
    assert (PRIORITY[JobFinished], PRIORITY[JobSubmitted], PRIORITY[TimerFired]) == (0, 1, 2)


def test_finished_before_submitted_before_timer_at_the_same_time() -> None:
    q = EventQueue()
    timer = TimerFired("t")
    sub = JobSubmitted(job("b"))
    fin = JobFinished("a", 1)
    for e in (timer, sub, fin):
        q.push(5.0, e)
    assert [e for _, e in drain(q)] == [fin, sub, timer]


def test_time_comes_first() -> None:
    q = EventQueue()
    late_finish = JobFinished("a", 1)
    early_submit = JobSubmitted(job("b"))
    q.push(10.0, late_finish)
    q.push(2.0, early_submit)
    q.push(2.0, TimerFired("x"))
    assert q.peek_time() == 2.0
    assert [(t, type(e)) for t, e in drain(q)] == [(2.0, JobSubmitted), (2.0, TimerFired), (10.0, JobFinished)]


def test_fifo_among_equals() -> None:
    q = EventQueue()
    subs = [JobSubmitted(job(f"j{i}")) for i in range(20)]
    for s in subs:
        q.push(1.0, s)
    assert [e for _, e in drain(q)] == subs


def test_equal_events_are_never_compared() -> None:
    # Two identical events at the same time and priority: the sequence number decides, never the events.
    q = EventQueue()
    a, b = JobFinished("x", 1), JobFinished("x", 1)
    q.push(0.0, a)
    q.push(0.0, b)
    assert next(e for _, e in drain(q)) is a


def test_len_and_bool() -> None:
    q = EventQueue()
    assert not q and len(q) == 0
    q.push(1.0, TimerFired("a"))
    q.push(1.0, TimerFired("b"))
    assert q and len(q) == 2
    q.pop()
    assert len(q) == 1


KINDS = [lambda i: JobFinished(f"j{i}", 1), lambda i: JobSubmitted(job(f"j{i}")), lambda i: TimerFired(f"t{i}")]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5).map(float), st.integers(0, 2)), max_size=40))
def test_pop_order_is_time_priority_then_push_order(items: list[tuple[float, int]]) -> None:
    q = EventQueue()
    pushed = []
    for i, (time_s, kind) in enumerate(items):
        event = KINDS[kind](i)
        q.push(time_s, event)
        pushed.append((time_s, kind, i, event))
    expected = [(t, e) for t, _, _, e in sorted(pushed, key=lambda p: (p[0], p[1], p[2]))]
    got = drain(q)
    assert [t for t, _ in got] == [t for t, _ in expected]
    assert all(a is b for (_, a), (_, b) in zip(got, expected, strict=True))


def test_virtual_clock() -> None:
    c = VirtualClock()
    assert c.now() == 0.0
    c.advance_to(5.0)
    c.advance_to(5.0)  # standing still is fine
    assert c.now() == 5.0
    with pytest.raises(ValueError, match="cannot go back"):
        c.advance_to(4.0)
    assert c.now() == 5.0
    assert VirtualClock(100.0).now() == 100.0
