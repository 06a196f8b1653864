"""A job trace: the jobs to replay, in submission order, and an account of how they were read.

Every reader in :mod:`corral.sim.traces` returns a :class:`Trace` (which that package exports). ``jobs`` is
sorted by ``submit_s`` (ties keep file order), with times in seconds from the trace's own origin. ``skipped``
counts rows left out and why (only with ``skip_invalid``, or rows the format itself says cannot be replayed, such
as openb's CPU-only pods); ``notes`` tells the user, in words, every such treatment so a replay is never silently
different from the file.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from corral.core.job import JobSpec


@dataclass(slots=True)
class Trace:
    jobs: list[JobSpec]
    source: str
    skipped: Counter[str] = field(default_factory=Counter)  # reason -> rows
    notes: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.jobs)

    @property
    def skipped_total(self) -> int:
        return sum(self.skipped.values())
