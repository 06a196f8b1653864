"""The live cluster's history as a trace and a cluster file, for what-if replays (issue 21).

``corral export-trace`` reads the jobs that ran on a ``corral serve`` cluster through its API (a tenant's token
exports that tenant's jobs only, as every API read) and writes them in the generic CSV format the replays read
without ``--columns`` (:mod:`corral.sim.traces.generic`), and the cluster (GPUs, nodes, tenants and quotas) in the
TOML format of ``docs/clusters.md``, so that::

    corral export-trace --since 7d --out week.csv --cluster-out here.toml
    corral compare --format csv --trace week.csv --cluster here.toml --policy fifo --policy tiresias --policy antman

replays this cluster's own last week under other policies. What a row says:

- ``job_id``: the live job's id; ``submit_s``: seconds after the first exported submission (the header comment
  of the summary, and :attr:`Export.origin_s`, give that instant as Unix time);
- ``duration_s``: the seconds the job held GPUs here (``executed_s``), over all its runs: its own speed on these
  GPUs, with whatever sharing, throttling and restarts slowed it, since a live job's solo run time on a reference
  GPU is not known. A replay takes it as the job's duration on its GPU type (speed 1.0 in the cluster file);
- ``num_gpus``, ``gpu_milli``, ``tenant``; ``job_class``: the class it was submitted with (``opportunistic`` or
  ``guaranteed``; an upgraded job was submitted opportunistic).

Jobs that ran and ended (finished, failed, cancelled) are exported; pending and running jobs (no duration yet)
and jobs that never ran (rejected, cancelled while waiting) are not, and the summary counts them.
"""

from __future__ import annotations

import csv
import io
import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

COLUMNS = ("job_id", "submit_s", "duration_s", "num_gpus", "gpu_milli", "tenant", "job_class")
ENDED = ("finished", "failed", "cancelled")


@dataclass(frozen=True)
class Export:
    """The exported rows (in submission order), when the first was submitted, and what was left out and why."""

    rows: tuple[dict[str, Any], ...]
    origin_s: float | None
    left_out: Mapping[str, int] = field(default_factory=dict)


def trace_rows(jobs: Iterable[Mapping[str, Any]], *, since_s: float | None = None) -> Export:
    """The jobs (as ``GET /v1/jobs`` gives them) submitted at or after ``since_s`` (Unix seconds) that ran and
    ended, as trace rows (the module docstring says what each column holds)."""
    kept: list[Mapping[str, Any]] = []
    left_out: Counter[str] = Counter()
    for job in jobs:
        if since_s is not None and job["submit_s"] < since_s:
            continue
        executed = float(job.get("executed_s") or 0.0)
        if job["phase"] not in ENDED:
            left_out[f"{job['phase']} (no duration yet)" if job["phase"] != "rejected" else "rejected"] += 1
        elif not executed > 0 or not math.isfinite(executed):
            left_out["never ran"] += 1
        else:
            kept.append(job)
    kept.sort(key=lambda j: (j["submit_s"], j["job_id"]))
    origin = kept[0]["submit_s"] if kept else None
    rows = tuple(
        {
            "job_id": j["job_id"],
            "submit_s": _seconds(j["submit_s"] - origin) if origin is not None else 0,
            "duration_s": _seconds(float(j["executed_s"])),
            "num_gpus": int(j["num_gpus"]),
            "gpu_milli": int(j["gpu_milli"]),
            "tenant": j["tenant"],
            "job_class": "opportunistic" if j.get("opportunistic") else "guaranteed",
        }
        for j in kept
    )
    return Export(rows, origin, dict(left_out))


def _seconds(x: float) -> float:
    return round(max(0.0, x), 3)  # milliseconds: finer than any scheduling decision, and short to read


_AGO = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*(s|m|h|d|w)")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
SINCE_FORM = "a time ago (90s, 30m, 12h, 7d, 2w) or a date and time (2026-11-20 or 2026-11-20T08:00, UTC if no zone)"


SPAN_FORM = "a number of seconds, or a number and a unit (90s, 30m, 12h, 7d, 2w)"


def parse_span(text: str) -> float:
    """A length of time (``--expect 2h``): seconds, or a number and a unit, as Unix seconds > 0 (ValueError)."""
    text = text.strip()
    span = _AGO.fullmatch(text)
    try:
        seconds = float(span[1]) * _UNIT_S[span[2]] if span is not None else float(text)
    except ValueError:
        raise ValueError(f"expected {SPAN_FORM}; got {text!r}") from None
    if not 0 < seconds < math.inf:
        raise ValueError(f"expected {SPAN_FORM}, more than 0; got {text!r}")
    return seconds


def parse_since(text: str, now_s: float) -> float:
    """``--since``: a time ago (``7d``) or an ISO 8601 date and time, as Unix seconds (ValueError otherwise)."""
    text = text.strip()
    ago = _AGO.fullmatch(text)
    if ago is not None:
        return now_s - float(ago[1]) * _UNIT_S[ago[2]]
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"--since: expected {SINCE_FORM}; got {text!r}") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.timestamp()


def trace_csv(export: Export) -> str:
    """The rows as CSV text with corral's own column names (read by ``--trace FILE`` with no ``--columns``)."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(export.rows)
    return out.getvalue()


def cluster_toml(cluster: Mapping[str, Any], tenants: Sequence[Mapping[str, Any]], *, name: str = "live") -> str:
    """The cluster of ``GET /v1/cluster`` and the tenants of ``GET /v1/tenants`` as a cluster file: one
    ``[[gpu_type]]`` per GPU type seen (its memory; speed 1.0, the speed the exported durations were measured
    at), one ``[[nodes]]`` per node (lost ones too: they are part of the cluster), one ``[[tenant]]`` each."""
    types: dict[str, int] = {}
    per_node: dict[str, list[Mapping[str, Any]]] = {n["name"]: [] for n in cluster["nodes"]}
    for gpu in cluster["gpus"]:
        types.setdefault(gpu["type_name"], int(gpu["mem_mib"]))
        per_node.setdefault(gpu["node"], []).append(gpu)
    lines = [
        "# Written by corral export-trace from a live cluster's API (docs/clusters.md has the format).",
        "# GPU speeds are 1.0: the exported durations were measured on these GPUs.",
        "",
        f"name = {_quote(name)}",
    ]
    for type_name, mem in types.items():
        lines += ["", "[[gpu_type]]", f"name = {_quote(type_name)}", f"mem_mib = {mem}", "speed = 1.0"]
    for node, gpus in per_node.items():
        if not gpus:
            continue  # a node without GPUs cannot be written in the format (gpus >= 1) and holds no GPU job
        kinds = {g["type_name"] for g in gpus}
        if len(kinds) > 1:
            raise ValueError(f"node {node!r} has GPUs of several types ({', '.join(sorted(kinds))}): not expressible")
        lines += ["", "[[nodes]]", f"name = {_quote(node)}", f"gpu_type = {_quote(kinds.pop())}", f"gpus = {len(gpus)}"]
    for tenant in tenants:
        lines += ["", "[[tenant]]", f"name = {_quote(tenant['name'])}"]
        if tenant.get("quota_gpus") is not None:
            lines.append(f"quota_gpus = {int(tenant['quota_gpus'])}")
    return "\n".join(lines) + "\n"


def _quote(text: str) -> str:
    """A TOML basic string."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    escaped = "".join(c if c.isprintable() else f"\\u{ord(c):04x}" for c in escaped)
    return f'"{escaped}"'
