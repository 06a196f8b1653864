"""Short names for runs on a report's plots.

A run read from a ``corral simulate`` folder is named by its policy as ``summary.json`` describes it, every option
spelled out: ``antman(placement=consolidated, opportunistic=True, ...)`` is some 300 characters, too long for a
legend or a bar's tick (it ran off the figure). On the plots a description keeps only what tells the runs apart:
the options whose values differ between runs of the same policy; a policy that ran once is its name alone. The
tables of ``report.html`` keep the full names.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

# "<anything before>name(options)": a policy's description at the end of a label (a folder's name may come first)
_DESCRIBED = re.compile(r"^(?P<head>.*?)(?P<name>[A-Za-z][\w-]*)\((?P<options>.*)\)$", re.DOTALL)


def _split_options(text: str) -> list[tuple[str, str]] | None:
    """``k=v, k2=v2`` as pairs, splitting at commas outside brackets; None when it is not such a list."""
    parts: list[str] = []
    depth = 0
    start = 0
    for i, ch in enumerate(text):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    pairs = []
    for part in parts:
        key, eq, value = part.strip().partition("=")
        if not eq or not key.isidentifier():
            return None
        pairs.append((key, value))
    return pairs


def short_labels(labels: Sequence[str]) -> list[str]:
    """``labels`` with each policy description cut to the options that differ between runs of that policy (see
    the module docstring). A label that is not a description, or that would become another's twin, stays as it
    is."""
    parsed: list[tuple[str, str, list[tuple[str, str]]] | None] = []
    for label in labels:
        m = _DESCRIBED.match(label)
        pairs = _split_options(m["options"]) if m and m["options"] else None
        parsed.append((m["head"], m["name"], pairs) if m and pairs is not None else None)
    values: dict[tuple[str, str], set[str]] = {}  # (policy, option) -> its values among the runs
    for entry in parsed:
        if entry is not None:
            for key, value in entry[2]:
                values.setdefault((entry[1], key), set()).add(value)
    out = []
    for label, entry in zip(labels, parsed, strict=True):
        if entry is None:
            out.append(label)
            continue
        head, name, pairs = entry
        kept = [f"{k}={v}" for k, v in pairs if len(values[(name, k)]) > 1]
        out.append(f"{head}{name}({', '.join(kept)})" if kept else f"{head}{name}")
    # Runs whose descriptions differ only in an option some other run lacks could come out alike: keep those whole.
    return [
        short if out.count(short) == 1 or labels.count(label) > 1 else label
        for label, short in zip(labels, out, strict=True)
    ]
