"""The cyclic garbage collector, relaxed while a replay builds and runs (issue 20).

A trace of a million jobs is a million tracked containers, and a replay allocates a few hundred objects per job;
none of them form reference cycles (after full Philly under FIFO, and 2,000 jobs at 3x load under each of
Tiresias, Gandiva, Themis, HiveD, IADeep and AntMan, the collector found nothing to free), so reference counting
frees all their garbage. With the default thresholds the collector still walked the young objects every 700
allocations and, now and then, everything alive: perf found ``gc_collect_main`` the hottest function of a
compiled replay of full Philly (8% of the time on its own, 12% with its helpers).

:func:`relaxed_collector` freezes the objects alive when it starts (the collector no longer walks them) and
collects the youngest generation every 1,000,000 allocations: cyclic garbage, if some code ever makes it, is still
found, later. When it ends, what the block left alive goes to the oldest generation untouched (frozen, then thawed
with the rest), so that the first young collection after it does not walk it: a replay's job records live to its
end, and with the old thresholds restored that walk came just after the block (full Philly under FIFO: four young
collections of 9 to 24 ms, one in the replay, one after it). Nested uses are one: only the outermost changes and
restores the collector.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

THRESHOLDS = (1_000_000, 50, 100)  # allocations between young collections; young collections per older one
_depth = 0


@contextmanager
def relaxed_collector() -> Iterator[None]:
    """Relax the collector for the ``with`` block (or the decorated function), then restore it."""
    global _depth
    _depth += 1
    if _depth > 1:
        try:
            yield
        finally:
            _depth -= 1
        return
    thresholds = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)
    try:
        yield
    finally:
        gc.freeze()  # with the objects frozen at the start: all go to the oldest generation
        gc.set_threshold(*thresholds)
        gc.unfreeze()
        _depth -= 1
