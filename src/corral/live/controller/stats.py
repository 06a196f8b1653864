"""What the controller counts about itself, for ``GET /metrics`` (:mod:`corral.live.api.metrics`).

The loop thread records (each round's latency, each job event by kind); the API's threads read a consistent copy
(:meth:`LiveStats.snapshot`). Plain counters and fixed histogram buckets, so that the controller does not depend on
the metrics library: the API turns them into Prometheus' types.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Mapping
from dataclasses import dataclass

# Round latency buckets (seconds): a round of a small cluster takes well under a millisecond, one of a 1,000-node
# burst a few hundred milliseconds (docs/performance.md); the top buckets catch a loop that stalls.
ROUND_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


@dataclass(frozen=True, slots=True)
class StatsSnapshot:
    rounds: int
    round_seconds_sum: float
    round_bucket_counts: tuple[int, ...]  # per bucket of ROUND_BUCKETS_S, not cumulative; then the +Inf bucket
    events: Mapping[str, int]  # job events by kind ("launched", "preempted", "resized", "finished", ...)


class LiveStats:
    """Counters the controller keeps for its metrics. Thread-safe: written by the loop, read by scrapes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rounds = 0
        self._round_sum = 0.0
        self._buckets = [0] * (len(ROUND_BUCKETS_S) + 1)
        self._events: dict[str, int] = {}

    def observe_round(self, seconds: float) -> None:
        with self._lock:
            self._rounds += 1
            self._round_sum += seconds
            self._buckets[bisect.bisect_left(ROUND_BUCKETS_S, seconds)] += 1

    def count_event(self, kind: str) -> None:
        with self._lock:
            self._events[kind] = self._events.get(kind, 0) + 1

    def snapshot(self) -> StatsSnapshot:
        with self._lock:
            return StatsSnapshot(self._rounds, self._round_sum, tuple(self._buckets), dict(self._events))
