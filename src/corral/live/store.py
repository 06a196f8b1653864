"""The controller's durable store: every job, its phase, placement and process, and an event log, in SQLite.

The rule (DESIGN, "What must stay true"): every submitted job, phase change and placement is committed before it
is acted on. The controller writes a whole turn of its loop (the submissions it took, the engine's changes to
jobs, the process states it is about to ask for) in one transaction and commits it before it sends anything to
an agent; the API commits a submission before it answers. So after a ``kill -9`` the store knows every job the
API accepted and every process the controller may have started.

SQLite runs in WAL mode with ``synchronous=FULL``: a commit survives the process's death and the machine's. One
connection, guarded by a lock, serves every thread (the API's and the loop's); reads are short.

Tables: ``jobs`` (one row per job: the request, the engine's status and the process state as JSON, plus indexed
columns), ``events`` (what happened to each job, for ``corral job ID``) and ``meta`` (schema version). A job has
two keys: ``job_id``, the opaque id users see, and ``seq``, its place in submission order, which stays inside
(shown, it would count every tenant's submissions). Listings are read a page at a time, by position in that
order (:meth:`Store.jobs`): a page reads only its own rows, at 50 jobs or 50,000.
"""

from __future__ import annotations

import heapq
import itertools
import json
import sqlite3
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from corral.core.errors import ConfigError
from corral.core.job import JobPhase
from corral.core.status import JobStatus
from corral.live.records import (
    JobRecord,
    JobRequest,
    ProcessState,
    status_from_json,
    status_to_json,
)

SCHEMA_VERSION = 1
ESTIMATE_ROWS = 500  # estimates written per transaction (see Store.record_estimates)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS jobs (
    seq INTEGER PRIMARY KEY,
    job_id TEXT UNIQUE NOT NULL,
    tenant TEXT NOT NULL,
    phase TEXT NOT NULL,
    request TEXT NOT NULL,
    status TEXT NOT NULL,
    process TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS jobs_tenant ON jobs (tenant, seq);
CREATE INDEX IF NOT EXISTS jobs_phase ON jobs (phase, seq);
CREATE INDEX IF NOT EXISTS jobs_tenant_phase ON jobs (tenant, phase, seq);
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY,
    time_s REAL NOT NULL,
    job_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    detail TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_job ON events (job_id, seq);
CREATE TABLE IF NOT EXISTS estimates (
    job_id TEXT PRIMARY KEY,
    first_made_s REAL NOT NULL,
    first_start_s REAL NOT NULL,
    last_made_s REAL NOT NULL,
    last_start_s REAL NOT NULL,
    last_low_s REAL NOT NULL,
    last_high_s REAL
);
"""


@dataclass(frozen=True, slots=True)
class EstimateOutcome:
    """A job's first and latest estimated first start (and the latest one's range), and when it really started."""

    job_id: str
    first_start_s: float
    last_start_s: float
    last_low_s: float
    last_high_s: float | None
    actual_s: float


@dataclass(frozen=True, slots=True)
class JobEvent:
    """One line of a job's history."""

    time_s: float
    job_id: str
    kind: str
    detail: str


class Store:
    """The SQLite store. ``path`` may be ``":memory:"`` (tests, virtual-clock runs)."""

    def __init__(self, path: Path | str) -> None:
        self.path = str(path)
        try:
            self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        except sqlite3.Error as e:
            raise ConfigError(f"cannot open the state database {self.path}: {e}") from None
        self._lock = threading.RLock()
        self._in_tx = False
        db = self._db
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        db.execute("PRAGMA foreign_keys=ON")
        db.executescript(_SCHEMA)
        row = db.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
        if row is None:
            db.execute("INSERT INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
        elif int(row[0]) != SCHEMA_VERSION:
            raise ConfigError(
                f"{self.path}: state database schema {row[0]} is not the {SCHEMA_VERSION} this corral reads"
            )

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # -- writes ---------------------------------------------------------------------------------------------
    @contextmanager
    def transaction(self) -> Iterator[None]:
        """Group writes; committed (durably) when the block ends, rolled back if it raises. Nests."""
        with self._lock:
            if self._in_tx:
                yield
                return
            self._db.execute("BEGIN IMMEDIATE")
            self._in_tx = True
            try:
                yield
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            else:
                self._db.execute("COMMIT")
            finally:
                self._in_tx = False

    def next_seq(self) -> int:
        with self._lock:
            row = self._db.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM jobs").fetchone()
            return int(row[0])

    def insert(self, seq: int, request: JobRequest, status: JobStatus, process: ProcessState) -> None:
        with self.transaction():
            self._db.execute(
                "INSERT INTO jobs (seq, job_id, tenant, phase, request, status, process) VALUES (?,?,?,?,?,?,?)",
                (
                    seq,
                    status.spec.job_id,
                    status.spec.tenant,
                    status.phase.value,
                    json.dumps(request.to_json()),
                    json.dumps(status_to_json(status)),
                    json.dumps(process.to_json()),
                ),
            )

    def update(self, status: JobStatus, process: ProcessState | None = None) -> None:
        """Write a job's engine status (and process state, if given)."""
        with self.transaction():
            if process is None:
                self._db.execute(
                    "UPDATE jobs SET phase=?, status=? WHERE job_id=?",
                    (status.phase.value, json.dumps(status_to_json(status)), status.spec.job_id),
                )
            else:
                self._db.execute(
                    "UPDATE jobs SET phase=?, status=?, process=? WHERE job_id=?",
                    (
                        status.phase.value,
                        json.dumps(status_to_json(status)),
                        json.dumps(process.to_json()),
                        status.spec.job_id,
                    ),
                )

    def update_process(self, job_id: str, process: ProcessState) -> None:
        with self.transaction():
            self._db.execute("UPDATE jobs SET process=? WHERE job_id=?", (json.dumps(process.to_json()), job_id))

    def log(self, time_s: float, job_id: str, kind: str, detail: str = "") -> None:
        with self.transaction():
            self._db.execute(
                "INSERT INTO events (time_s, job_id, kind, detail) VALUES (?,?,?,?)", (time_s, job_id, kind, detail)
            )

    # -- reads ----------------------------------------------------------------------------------------------
    def get(self, job_id: str) -> JobRecord | None:
        with self._lock:
            row = self._db.execute(
                "SELECT seq, request, status, process FROM jobs WHERE job_id=?", (job_id,)
            ).fetchone()
        return None if row is None else _record(row)

    def jobs(
        self,
        *,
        tenant: str | None = None,
        phases: Iterable[JobPhase] | None = None,
        limit: int | None = None,
        after: str | None = None,
        newest_first: bool = False,
    ) -> list[JobRecord]:
        """Jobs filtered by tenant and phase, in submission order (newest first with ``newest_first``): at most
        ``limit`` of them, starting after the job ``after`` (a job id: its place in that order, whatever its
        phase is now; a job that does not exist gives no jobs). One page of the API's listing.

        Each phase is read on its own, along the ``(phase, seq)`` index from the page's start, and the pieces are
        merged: a single ``phase IN (...)`` query would sort every matching job to find the page (SQLite cannot
        merge index ranges in order), which costs as much as the whole list."""
        start: int | None = None
        if after is not None:
            with self._lock:
                row = self._db.execute("SELECT seq FROM jobs WHERE job_id=?", (after,)).fetchone()
            if row is None:
                return []
            start = int(row[0])
        names: list[str | None] = [None] if phases is None else [*sorted({JobPhase(p).value for p in phases})]
        pieces = []
        with self._lock:
            for phase in names:
                where, args = _filters(tenant, None)
                if phase is not None:
                    where.append("phase=?")
                    args.append(phase)
                if start is not None:
                    where.append(f"seq {'<' if newest_first else '>'} ?")
                    args.append(start)
                sql = "SELECT seq, request, status, process FROM jobs"
                if where:
                    sql += " WHERE " + " AND ".join(where)
                sql += " ORDER BY seq DESC" if newest_first else " ORDER BY seq"
                if limit is not None:
                    sql += " LIMIT ?"
                    args.append(int(limit))
                pieces.append(self._db.execute(sql, args).fetchall())
        rows: Iterable[tuple[Any, ...]] = (
            pieces[0] if len(pieces) == 1 else heapq.merge(*pieces, key=lambda r: int(r[0]), reverse=newest_first)
        )
        if limit is not None:
            rows = itertools.islice(rows, int(limit))
        return [_record(r) for r in rows]

    def count(self, *, tenant: str | None = None, phases: Iterable[JobPhase] | None = None) -> int:
        """How many jobs :meth:`jobs` would list with these filters and no limit (from the indexes alone)."""
        where, args = _filters(tenant, phases)
        sql = "SELECT COUNT(*) FROM jobs" + (" WHERE " + " AND ".join(where) if where else "")
        with self._lock:
            row = self._db.execute(sql, args).fetchone()
        return int(row[0])

    def has(self, job_id: str) -> bool:
        with self._lock:
            return self._db.execute("SELECT 1 FROM jobs WHERE job_id=?", (job_id,)).fetchone() is not None

    def unfinished(self) -> list[JobRecord]:
        """Every job a restarted controller must take back: not in a terminal phase, or with a process that may
        still be alive (a job cancelled or failed while its process was stopping)."""
        with self._lock:
            rows = self._db.execute("SELECT seq, request, status, process FROM jobs ORDER BY seq").fetchall()
        out = []
        for r in rows:
            rec = _record(r)
            if not rec.phase.is_terminal or rec.process.phase.value != "none":
                out.append(rec)
        return out

    def events(self, job_id: str) -> list[JobEvent]:
        with self._lock:
            rows = self._db.execute(
                "SELECT time_s, job_id, kind, detail FROM events WHERE job_id=? ORDER BY seq", (job_id,)
            ).fetchall()
        return [JobEvent(*r) for r in rows]

    def events_after(self, after: int, limit: int, *, tenant: str | None = None) -> list[tuple[int, JobEvent]]:
        """Every job's events in the order they were logged, after position ``after``, at most ``limit``, each with
        its position. Without ``tenant``: positions are the events' own numbers. With ``tenant``: that tenant's
        jobs' events only, and positions count its events alone (1, 2, 3, ...), so that they say nothing of
        other tenants' (an offset into its own history: events are only ever appended)."""
        with self._lock:
            if tenant is None:
                rows = self._db.execute(
                    "SELECT seq, time_s, job_id, kind, detail FROM events WHERE seq > ? ORDER BY seq LIMIT ?",
                    (after, limit),
                ).fetchall()
                return [(r[0], JobEvent(*r[1:])) for r in rows]
            rows = self._db.execute(
                "SELECT e.time_s, e.job_id, e.kind, e.detail FROM events e JOIN jobs j ON j.job_id = e.job_id "
                "WHERE j.tenant = ? ORDER BY e.seq LIMIT ? OFFSET ?",
                (tenant, limit, after),
            ).fetchall()
        return [(after + i + 1, JobEvent(*r)) for i, r in enumerate(rows)]

    # -- start-time estimates (corral.live.controller.estimates) ---------------------------------------------
    def record_estimates(self, made_s: float, estimates: Iterable[tuple[str, float, float, float | None]]) -> None:
        """Keep each job's first estimate of its first start and its latest: ``(job_id, start_s, earliest_s,
        latest_s)`` made at ``made_s`` (``latest_s`` None: no bound)."""
        rows = [(job_id, made_s, start, made_s, start, low, high) for job_id, start, low, high in estimates]
        # In transactions of ESTIMATE_ROWS rows: the controller's loop commits its turns through the same lock, and
        # waits at most one of them (a queue of 50,000 jobs is 100 of them).
        for at in range(0, len(rows), ESTIMATE_ROWS):
            with self.transaction():
                self._db.executemany(
                    "INSERT INTO estimates VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT(job_id) DO UPDATE SET "
                    "last_made_s=excluded.last_made_s, last_start_s=excluded.last_start_s, "
                    "last_low_s=excluded.last_low_s, last_high_s=excluded.last_high_s",
                    rows[at : at + ESTIMATE_ROWS],
                )

    def estimate_outcomes(self) -> list[EstimateOutcome]:
        """The estimated jobs that have started since, with when."""
        with self._lock:
            rows = self._db.execute(
                "SELECT e.job_id, e.first_start_s, e.last_start_s, e.last_low_s, e.last_high_s, "
                "json_extract(j.status, '$.first_start_s') FROM estimates e JOIN jobs j ON j.job_id = e.job_id "
                "WHERE json_extract(j.status, '$.first_start_s') IS NOT NULL ORDER BY j.seq"
            ).fetchall()
        return [
            EstimateOutcome(
                str(job), float(first), float(last), float(low), None if high is None else float(high), float(at)
            )
            for job, first, last, low, high, at in rows
        ]

    def finished_durations(self, limit: int) -> list[float]:
        """The seconds the ``limit`` most recently submitted finished jobs held GPUs (their durations here)."""
        with self._lock:
            rows = self._db.execute(
                "SELECT json_extract(status, '$.executed_s') FROM jobs WHERE phase='finished' "
                "ORDER BY seq DESC LIMIT ?",
                (int(limit),),
            ).fetchall()
        return [float(r[0]) for r in rows if r[0] is not None]

    def count_by_phase(self) -> dict[str, int]:
        with self._lock:
            rows = self._db.execute("SELECT phase, COUNT(*) FROM jobs GROUP BY phase").fetchall()
        return {str(p): int(n) for p, n in rows}


def _filters(tenant: str | None, phases: Iterable[JobPhase] | None) -> tuple[list[str], list[Any]]:
    where: list[str] = []
    args: list[Any] = []
    if tenant is not None:
        where.append("tenant=?")
        args.append(tenant)
    if phases is not None:
        names = sorted({JobPhase(p).value for p in phases})
        where.append(f"phase IN ({','.join('?' * len(names))})")
        args.extend(names)
    return where, args


def _record(row: tuple[Any, ...]) -> JobRecord:
    seq, request, status, process = row
    return JobRecord(
        seq=int(seq),
        request=JobRequest.from_json(json.loads(request)),
        status=status_from_json(json.loads(status)),
        process=ProcessState.from_json(json.loads(process)),
    )
