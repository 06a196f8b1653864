"""Node failures for a replay: read from a file, or drawn at a rate. Either way a stream of ``(time_s, event)``
with events :class:`~corral.core.events.NodeLost` and :class:`~corral.core.events.NodeJoined`, in time order,
that :func:`corral.sim.runner.simulate` hands to the engine one at a time (the live controller produces the same
events from agents that die and nodes that come back).

**A failure file** (``corral simulate --node-failures FILE``) is a CSV file with a header naming the columns
``time_s``, ``node`` and ``event``, in any order, and optionally ``reason``::

    time_s,node,event,reason
    3600,n3,lost,power supply
    7200,n3,joined,

- ``time_s``: seconds on the trace's clock (the clock of its ``submit_s``), a number >= 0 written with ASCII digits;
- ``node``: a node name of the cluster (``corral cluster SPEC`` lists them);
- ``event``: ``lost`` or ``joined``;
- ``reason`` (optional): words for the decision log's reader; default ``failure file``.

Rows are taken in time order (rows of one time in file order). Every node starts up; a node's rows must
alternate, ``lost`` first. Anything else stops the run with the file, line, column, what was expected and what was
found (``failures.csv:4: node 'n3' is lost already (at line 2); column 'event'; expected joined; got 'lost'``),
for every bad row of the file at once (the first 20 listed, the rest counted), as for a trace.
Blank lines are skipped.

**Failures at a rate** (``--node-failure-rate mtbf_h=H,repair_h=H[,seed=N]``): each node fails after a time drawn
from an exponential distribution of mean ``mtbf_h`` hours (its mean time between failures), and comes back after
one of mean ``repair_h`` hours, again and again, from the trace's first submission on. Each node has its own
random stream, seeded by ``seed`` (default: the run's ``--seed``) and the node's name, so the failures of a node do
not depend on the other nodes or on the policy, and the same seed gives the same failures. The stream is endless:
the replay stops drawing once every job is done (see :func:`corral.sim.runner.simulate`).
"""

from __future__ import annotations

import csv
import heapq
import math
import random
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from corral.core.cluster import Cluster
from corral.core.errors import ConfigError, InputError
from corral.core.events import NodeJoined, NodeLost
from corral.core.wording import plural
from corral.sim.traces._rows import ROWS_SHOWN

NodeEvent = NodeLost | NodeJoined
NodeEvents = Iterator[tuple[float, NodeEvent]]

COLUMNS = ("time_s", "node", "event")
OPTIONAL = ("reason",)
EVENTS = ("lost", "joined")
_NUMBER = re.compile(r"[0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?|\.[0-9]+(?:[eE][+-]?[0-9]+)?")


def read_node_failures(path: str | Path, cluster: Cluster) -> list[tuple[float, NodeEvent]]:
    """The events of a failure file (the module docstring's form), checked against ``cluster``, in time order."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise InputError("no such failure file", file=source) from None
    except UnicodeDecodeError as err:
        raise InputError(f"not UTF-8 text ({err.reason} at byte {err.start})", file=source) from None
    except OSError as err:
        raise InputError(f"cannot read the failure file: {err.strerror}", file=source) from None
    rows = list(csv.reader(text.splitlines()))
    header_line = next((i for i, row in enumerate(rows) if any(cell.strip() for cell in row)), None)
    if header_line is None:
        raise InputError(
            "the failure file is empty", file=source, line=1, expected=f"a header: {','.join(COLUMNS)}[,reason]"
        )
    header = [cell.strip() for cell in rows[header_line]]
    where: dict[str, int] = {}
    for i, name in enumerate(header):
        if name not in COLUMNS and name not in OPTIONAL:
            raise InputError(
                "unknown column in the header",
                file=source,
                line=header_line + 1,
                column=name,
                expected=f"the columns {', '.join(COLUMNS)} and optionally {', '.join(OPTIONAL)}",
                got=",".join(header),
            )
        if name in where:
            raise InputError(
                "a column is named twice in the header", file=source, line=header_line + 1, column=name, got=name
            )
        where[name] = i
    missing = [c for c in COLUMNS if c not in where]
    if missing:
        raise InputError(
            f"the header lacks column {missing[0]!r}",
            file=source,
            line=header_line + 1,
            column=missing[0],
            expected=f"a header naming {', '.join(COLUMNS)} (and optionally {', '.join(OPTIONAL)})",
            got=",".join(header),
        )
    names = {n.name for n in cluster.nodes}
    bad: list[InputError] = []  # every bad row, reported together at the end (as a trace's are)
    parsed: list[tuple[float, int, str, bool, str]] = []  # (time, line, node, lost?, reason)
    for index in range(header_line + 1, len(rows)):
        row = rows[index]
        if not any(cell.strip() for cell in row):
            continue
        try:
            parsed.append(_row(row, header, where, names, cluster, source, index + 1))
        except InputError as err:
            bad.append(err)
    parsed.sort(key=lambda r: (r[0], r[1]))
    lost_at: dict[str, int] = {}  # node -> line of the row that took it down
    out: list[tuple[float, NodeEvent]] = []
    for time_s, line, node, lost, reason in parsed:
        if lost:
            if node in lost_at:
                bad.append(
                    InputError(
                        f"node {node!r} is lost already (at line {lost_at[node]})",
                        file=source,
                        line=line,
                        column="event",
                        expected="joined",
                        got="lost",
                    )
                )
                continue
            lost_at[node] = line
            out.append((time_s, NodeLost(node, reason)))
        else:
            if node not in lost_at:
                bad.append(
                    InputError(
                        f"node {node!r} is up at {time_s:g} s (every node starts up)",
                        file=source,
                        line=line,
                        column="event",
                        expected="lost",
                        got="joined",
                    )
                )
                continue
            del lost_at[node]
            out.append((time_s, NodeJoined(node)))
    if len(bad) == 1:
        raise bad[0]
    if bad:
        raise BadFailureRows(sorted(bad, key=lambda e: e.line or 0))
    return out


def _row(
    row: list[str],
    header: list[str],
    where: dict[str, int],
    names: set[str],
    cluster: Cluster,
    source: str,
    line: int,
) -> tuple[float, int, str, bool, str]:
    """One data row as (time, line, node, lost?, reason), or the InputError saying what is wrong with it."""
    if len(row) != len(header):
        raise InputError(
            f"the row has {plural(len(row), 'field')} but the header has {plural(len(header), 'column')}",
            file=source,
            line=line,
            expected=f"{len(header)} comma-separated fields, as in the header: {','.join(header)}",
            got=",".join(row),
        )
    cell = row[where["time_s"]].strip()
    if not _NUMBER.fullmatch(cell) or not math.isfinite(float(cell)):
        raise InputError(
            "bad time", file=source, line=line, column="time_s", expected="seconds >= 0 (ASCII digits)", got=cell
        )
    time_s = float(cell)
    node = row[where["node"]].strip()
    if node not in names:
        known = ", ".join(n.name for n in cluster.nodes[:5]) + (", ..." if len(cluster.nodes) > 5 else "")
        raise InputError(
            f"no such node in cluster {cluster.name!r}",
            file=source,
            line=line,
            column="node",
            expected=f"a node name of the cluster ({known})",
            got=node,
        )
    event = row[where["event"]].strip().lower()
    if event not in EVENTS:
        got = row[where["event"]]
        raise InputError("bad event", file=source, line=line, column="event", expected=" or ".join(EVENTS), got=got)
    reason = row[where["reason"]].strip() if "reason" in where else ""
    return time_s, line, node, event == "lost", reason or "failure file"


class BadFailureRows(InputError):
    """Every bad row of a failure file, in one error: the first :data:`ROWS_SHOWN` in line order, one per line,
    then how many more. The located fields are the first bad row's (as one :class:`InputError` would have)."""

    def __init__(self, rows: Sequence[InputError]) -> None:
        self.rows = tuple(rows)
        first = self.rows[0]
        super().__init__(
            first.message, file=first.file, line=first.line, column=first.column, expected=first.expected, got=first.got
        )

    def _render(self) -> str:
        lines = [str(row) for row in self.rows[:ROWS_SHOWN]]
        left = len(self.rows) - ROWS_SHOWN
        more = f"... and {plural(left, 'more bad row')} " if left > 0 else ""
        lines.append(f"{more}({plural(len(self.rows), 'bad row')} in all)")
        return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class FailureRate:
    """Failures drawn at a rate (see the module docstring). ``seed`` None: the run's seed."""

    mtbf_h: float
    repair_h: float
    seed: int | None = None

    def __post_init__(self) -> None:
        for name in ("mtbf_h", "repair_h"):
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):
                raise ConfigError(f"--node-failure-rate: {name} must be a positive number of hours, got {value}")


RATE_FORM = "mtbf_h=HOURS,repair_h=HOURS[,seed=N]"


def parse_failure_rate(text: str) -> FailureRate:
    """``mtbf_h=500,repair_h=2[,seed=1]`` -> :class:`FailureRate` (ConfigError saying the form otherwise)."""
    values: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, eq, value = (x.strip() for x in part.partition("="))
        if not eq or key not in ("mtbf_h", "repair_h", "seed"):
            raise ConfigError(f"--node-failure-rate: expected {RATE_FORM}, got {text!r} ({part!r})")
        if key in values:
            raise ConfigError(f"--node-failure-rate: {key} is given twice in {text!r}")
        values[key] = value
    for key in ("mtbf_h", "repair_h"):
        if key not in values:
            raise ConfigError(f"--node-failure-rate: {key} is missing; expected {RATE_FORM}, got {text!r}")
    try:
        mtbf, repair = float(values["mtbf_h"]), float(values["repair_h"])
    except ValueError:
        raise ConfigError(f"--node-failure-rate: hours must be numbers; expected {RATE_FORM}, got {text!r}") from None
    seed = None
    if "seed" in values:
        try:
            seed = int(values["seed"])
        except ValueError:
            raise ConfigError(f"--node-failure-rate: seed must be an integer, got {values['seed']!r}") from None
    return FailureRate(mtbf, repair, seed)


def random_node_failures(nodes: Sequence[str], rate: FailureRate, *, start_s: float = 0.0, seed: int = 0) -> NodeEvents:
    """An endless stream of failures of ``nodes`` at ``rate`` from ``start_s`` on, in time order (ties: by node
    order). ``rate.seed``, when set, overrides ``seed``."""
    base = rate.seed if rate.seed is not None else seed
    up_s, down_s = rate.mtbf_h * 3600.0, rate.repair_h * 3600.0
    rngs = [random.Random(f"corral-node-failures:{base}:{name}") for name in nodes]
    # (time, node index, lost?) for each node's next event.
    heap = [(start_s + rng.expovariate(1.0 / up_s), i, True) for i, rng in enumerate(rngs)]
    heapq.heapify(heap)
    reason = f"drawn failure (mtbf {rate.mtbf_h:g} h)"
    while heap:
        time_s, i, lost = heap[0]
        name = nodes[i]
        mean = down_s if lost else up_s
        heapq.heapreplace(heap, (time_s + rngs[i].expovariate(1.0 / mean), i, not lost))
        yield time_s, (NodeLost(name, reason) if lost else NodeJoined(name))
