"""Words in messages: a count and its noun, singular for exactly one ("1 job", "2 jobs", "1,024 jobs"); a length
of time ("3m05s"); an estimated start ("in 25m00s (20m00s to 40m00s)", shown by the CLI and the dashboard alike).

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


def gpus(count: float, what: str = "GPU") -> str:
    """A number of GPUs, whole or not: "1 GPU", "0.5 GPU", "2 GPUs", "10,000 GPUs" (``what``: "guaranteed GPU")."""
    return f"{count:,g} {what}{'' if 0 < count <= 1 else 's'}"


def duration(seconds: float, sep: str = "") -> str:
    """``42s``, ``3m05s``, ``2h07m``: a wait, a run time or an ETA, to the second at most, in its two largest
    units. ``sep`` goes between them (``"3m 05s"`` with ``" "``: a progress line; tables keep them together)."""
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{sep}{s % 60:02d}s"
    return f"{s // 3600}h{sep}{s % 3600 // 60:02d}m"


def start_words(start_s: float | None, earliest_s: float | None, latest_s: float | None, now: float) -> str:
    """An estimated start in words: ``now``, ``in 25m00s (20m00s to 40m00s)``, ``in 3m00s (2m00s or later)``."""
    if start_s is None:
        return "not within the forecast's horizon (30 days)"
    if start_s <= now + 0.5:
        return "now" if earliest_s is None or latest_s is None or latest_s <= now + 0.5 else "any moment now"
    text = f"in {duration(start_s - now)}"
    low = duration(max(0.0, (earliest_s if earliest_s is not None else start_s) - now))
    if latest_s is None:
        return f"{text} ({low} or later)"
    high = duration(max(0.0, latest_s - now))
    return text if low == high else f"{text} ({low} to {high})"
