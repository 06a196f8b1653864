"""Reader of the Microsoft Philly trace (Jeon et al., ATC'19), in the job-level CSV of the Pollux artifact.

Columns: ``timestamp`` (submit time, wall clock ``2017-10-09 07:01:55``, no timezone), ``duration`` (s),
``num_gpus``, ``gpu_time`` (= duration x num_gpus; not needed, so not required) and ``cluster`` (the virtual
cluster's hash). The rows are not in time order.

Mapping to :class:`~corral.core.job.JobSpec`:

- ``job_id`` = ``philly-<i>``, ``i`` the 0-based data row in file order (bad rows skipped with
  ``skip_invalid`` still use up their number, so an id always points at the same line of the file);
- ``tenant`` = ``cluster``: the virtual cluster is the closest thing to a tenant the trace has;
- ``submit_s`` = seconds since the earliest timestamp among the accepted rows (timestamps are taken as UTC, so
  the result never depends on the local timezone; the trace has no DST gaps to worry about then either);
- ``duration_s`` = ``duration``; ``num_gpus`` = ``num_gpus``, an integer >= 1 (the file writes plain integers;
  "1.5" or "1.0" are rejected); ``model`` is unknown (None).
"""

from __future__ import annotations

from datetime import UTC, datetime

from corral.core.errors import JobSpecError
from corral.core.job import JobSpec
from corral.core.wording import plural
from corral.sim.traces._rows import MAX_JOB_GPUS, ONE_OR_MORE_GPUS, BadRow, CsvRows, PathArg, sort_by_submit
from corral.sim.traces.trace import Trace

COLUMNS = ("timestamp", "duration", "num_gpus", "cluster")
OPTIONAL = ("gpu_time",)
TIMESTAMP_FORM = "a timestamp YYYY-MM-DD HH:MM:SS"


def read_philly(path: PathArg, *, skip_invalid: bool = False) -> Trace:
    """Read a Philly CSV; bad rows raise :class:`~corral.core.errors.TraceError` unless ``skip_invalid``."""
    # Pass 1 parses every row into a tuple: submit times are relative to the earliest one, which is known only
    # at the end (the file is not sorted). Tuples cost far less than JobSpecs built twice.
    parsed: list[tuple[int, int, float, float, int, str]] = []
    with CsvRows(path, fmt="philly", required=COLUMNS, optional=OPTIONAL, skip_invalid=skip_invalid) as rows:
        i_ts, i_dur, i_gpus, i_vc = (rows.index(c) for c in COLUMNS)
        for i, row in rows:
            try:
                ts = rows.timestamp(row, i_ts, "timestamp", field="submit", exact_length=19, what=TIMESTAMP_FORM)
                duration = rows.seconds(row, i_dur, "duration")
                gpus = rows.integer(row, i_gpus, "num_gpus", minimum=1, maximum=MAX_JOB_GPUS, what=ONE_OR_MORE_GPUS)
                vc = rows.text(row, i_vc, "cluster", what="a virtual cluster name")
            except BadRow as err:
                rows.skip(err)
                continue
            parsed.append((i, rows.line, ts, duration, gpus, vc))

    origin = min(p[2] for p in parsed) if parsed else 0.0
    jobs: list[JobSpec] = []
    for i, line, ts, duration, gpus, vc in parsed:
        try:
            # job_id, submit_s, num_gpus, duration_s, tenant: by position (by keyword, each of the constructor's two
            # steps parses them: 0.5 us more per job, 2% of a full-Philly replay; issue 20)
            jobs.append(JobSpec(f"philly-{i}", ts - origin, gpus, duration, vc))
        except JobSpecError as err:  # cannot happen after the checks above; kept so it would be located
            rows.skip(rows.bad_spec(err, line))
    del parsed
    sort_by_submit(jobs)

    notes = []
    if jobs:
        start = datetime.fromtimestamp(origin, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")
        tenants = len({job.tenant for job in jobs})
        notes.append(
            f"philly: {plural(len(jobs), 'job')} in {plural(tenants, 'virtual cluster')} (tenant = cluster);"
            " submit times are"
            f" seconds from the earliest timestamp, {start} (timestamps taken as UTC)"
        )
    skip_note = rows.skip_note()
    if skip_note:
        notes.append(skip_note)
    return Trace(jobs=jobs, source=rows.file, skipped=rows.skipped, notes=notes)
