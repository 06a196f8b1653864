"""Reader of the Tiresias (NSDI'19) trace format, such as its 60-job trace ``60_job.csv``.

Columns: ``job_id,num_gpu,submit_time,iterations,model_name,duration,interval``. Times are seconds from the
trace's start. ``iterations`` and ``interval`` (the gap to the next submission) are not needed to replay the
trace, so they are not required.

Mapping: ``job_id`` as written (must be unique), ``submit_s`` = ``submit_time``, ``duration_s`` =
``duration``, ``num_gpus`` = ``num_gpu``, ``model`` = ``model_name`` (None when empty), ``tenant`` = "default"
(the format has no tenants).
"""

from __future__ import annotations

from corral.core.errors import JobSpecError
from corral.core.job import JobSpec
from corral.core.wording import plural
from corral.sim.traces._rows import MAX_JOB_GPUS, ONE_OR_MORE_GPUS, BadRow, CsvRows, IdRegistry, PathArg, sort_by_submit
from corral.sim.traces.trace import Trace

COLUMNS = ("job_id", "num_gpu", "submit_time", "model_name", "duration")
OPTIONAL = ("iterations", "interval")


def read_tiresias(path: PathArg, *, skip_invalid: bool = False) -> Trace:
    """Read a Tiresias CSV; bad rows raise :class:`~corral.core.errors.TraceError` unless ``skip_invalid``."""
    jobs: list[JobSpec] = []
    ids = IdRegistry()
    with CsvRows(path, fmt="tiresias", required=COLUMNS, optional=OPTIONAL, skip_invalid=skip_invalid) as rows:
        i_id, i_gpus, i_submit, i_model, i_dur = (rows.index(c) for c in COLUMNS)
        for _, row in rows:
            try:
                job_id = rows.text(row, i_id, "job_id", field="id", what="a job id")
                gpus = rows.integer(
                    row, i_gpus, "num_gpu", field="gpus", minimum=1, maximum=MAX_JOB_GPUS, what=ONE_OR_MORE_GPUS
                )
                submit = rows.seconds(row, i_submit, "submit_time", field="submit")
                duration = rows.seconds(row, i_dur, "duration")
                model = rows.optional_text(row, i_model, "model_name", field="model") or None
                ids.claim(rows, job_id, "job_id")  # last, so a row rejected for another reason keeps no id
                try:
                    jobs.append(
                        JobSpec(job_id=job_id, submit_s=submit, num_gpus=gpus, duration_s=duration, model=model)
                    )
                except JobSpecError as err:
                    raise rows.bad_spec(err, rows.line) from None
            except BadRow as err:
                rows.skip(err)
    sort_by_submit(jobs)
    notes = [f"tiresias: {plural(len(jobs), 'job')}, one tenant ('default'); times in seconds from the trace's start"]
    skip_note = rows.skip_note()
    if skip_note:
        notes.append(skip_note)
    return Trace(jobs=jobs, source=rows.file, skipped=rows.skipped, notes=notes)
