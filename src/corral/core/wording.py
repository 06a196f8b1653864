"""Words in messages: a count and its noun, singular for exactly one ("1 job", "2 jobs", "1,024 jobs").

Messages are read by people first ("1 jobs read" makes a careful tool look careless), and every layer writes
them (trace readers, cluster descriptions, the CLI), so the rule lives once here in the vocabulary layer.
"""

from __future__ import annotations


def plural(count: int, noun: str, many: str | None = None) -> str:
    """``count`` and ``noun``, the noun in its plural unless ``count`` is 1: ``plural(1, "job")`` is "1 job",
    ``plural(2_000, "job")`` "2,000 jobs". ``many`` is the plural where adding "s" is wrong
    (``plural(n, "loss", "losses")``). Counts get thousands separators, as the replay's other figures do."""
    word = noun if count == 1 else (many if many is not None else noun + "s")
    return f"{count:,} {word}"


def duration(seconds: float, sep: str = "") -> str:
    """``42s``, ``3m05s``, ``2h07m``: a wait, a run time or an ETA, to the second at most, in its two largest
    units. ``sep`` goes between them (``"3m 05s"`` with ``" "``: a progress line; tables keep them together)."""
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{sep}{s % 60:02d}s"
    return f"{s // 3600}h{sep}{s % 3600 // 60:02d}m"
