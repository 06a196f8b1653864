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
