"""Reader of any job CSV, given which of its columns hold which of corral's fields.

The mapping goes from corral's field to the file's header name, as the CLI's
``--columns id=jobid,submit=ts,duration=dur,gpus=n,tenant=vc`` writes it (:func:`parse_columns` turns that
string into the mapping). Without a mapping the file is read by corral's own names (:data:`DEFAULT_COLUMNS`,
those of :class:`~corral.core.job.JobSpec`'s fields: ``job_id,submit_s,duration_s,num_gpus`` and, where the
header has them, ``tenant``, ``model``, ``gpu_milli``, ``job_class``, ``batch_size``), as in
``examples/hpsearch.csv``: a file written for corral needs no ``--columns``. A header without one of the four
required names is an error that names the missing ones, shows the header found and points to ``--columns``.
Fields:

- required: ``id`` (unique job id), ``submit``, ``duration`` (seconds, a number >= 0), ``gpus`` (an integer
  >= 1, at most 1,000,000, the most GPUs a cluster may have; "4.0" is accepted too, as pandas writes integer
  columns that had a gap). Numbers are written with the digits 0-9 (no ``1_000``, no other scripts' digits);
- optional: ``tenant`` (empty: "default"), ``model`` (empty: None), ``gpu_milli`` (share of one GPU, 1..1000;
  empty: 1000), ``job_class`` ("guaranteed" or "opportunistic", any case; empty: guaranteed), ``batch_size``
  (the mini-batch size the job starts with, an integer >= 1, at most 1,000,000,000; empty: its model's
  reference batch size, the one its duration counts at: see ``docs/simulator.md``, "Batch size").

``submit`` is either seconds or a wall-clock time, decided by the first row whose value parses: a number means
seconds, used as they are (they must be >= 0); anything else is a timestamp (ISO 8601, e.g. ``2017-10-09
07:01:55`` or ``2017-10-09T07:01:55Z``, or the ``time_format`` given, in :func:`datetime.strptime` form), and
timestamps become seconds since the earliest one. Times without a timezone are taken as UTC. A file that mixes
the two kinds is an error on the first row of the other kind: a replay must not guess which clock a row means.
"""

from __future__ import annotations

from collections.abc import Mapping

from corral.core.errors import ConfigError, JobSpecError
from corral.core.job import FULL_GPU_MILLI, JobClass, JobSpec
from corral.core.wording import plural
from corral.sim.traces._rows import (
    MAX_BATCH_SIZE,
    MAX_JOB_GPUS,
    ONE_OR_MORE_GPUS,
    BadRow,
    CsvRows,
    IdRegistry,
    PathArg,
    sort_by_submit,
)
from corral.sim.traces.trace import Trace

REQUIRED_FIELDS = ("id", "submit", "duration", "gpus")
OPTIONAL_FIELDS = ("tenant", "model", "gpu_milli", "job_class", "batch_size")
FIELDS = REQUIRED_FIELDS + OPTIONAL_FIELDS

# corral's own column names (JobSpec's field names), read when no mapping is given.
DEFAULT_COLUMNS = {
    "id": "job_id",
    "submit": "submit_s",
    "duration": "duration_s",
    "gpus": "num_gpus",
    **{f: f for f in OPTIONAL_FIELDS},
}

_CLASSES = {c.value: c for c in JobClass}
_FORM = "id=COL,submit=COL,duration=COL,gpus=COL" + "".join(f"[,{f}=COL]" for f in OPTIONAL_FIELDS)
_DEFAULT_HINT = (
    "without --columns, corral's own column names are read: "
    + ",".join(DEFAULT_COLUMNS[f] for f in REQUIRED_FIELDS)
    + "; name the file's own with --columns "
    + _FORM
)


def parse_columns(spec: str) -> dict[str, str]:
    """Parse ``"id=a,submit=b,duration=c,gpus=d[,tenant=e...]"`` into ``{"id": "a", ...}``.

    Raises :class:`~corral.core.errors.ConfigError` on a malformed item, an unknown or repeated field, or a
    missing required one, saying what is expected.
    """
    columns: dict[str, str] = {}
    for item in spec.split(","):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key or not value:
            raise ConfigError(f"--columns: {item.strip()!r} is not FIELD=COLUMN; expected {_FORM}")
        if key in columns:
            raise ConfigError(f"--columns: field {key!r} is given twice; expected {_FORM}")
        columns[key] = value
    check_columns(columns)
    return columns


def check_columns(columns: Mapping[str, str]) -> None:
    """Raise a ConfigError unless ``columns`` maps all required fields, no other."""
    unknown = [key for key in columns if key not in FIELDS]
    if unknown:
        raise ConfigError(
            f"--columns: unknown field{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))};"
            f" known fields: required {', '.join(REQUIRED_FIELDS)}, optional {', '.join(OPTIONAL_FIELDS)}"
        )
    missing = [key for key in REQUIRED_FIELDS if not columns.get(key)]
    if missing:
        raise ConfigError(
            f"--columns: missing required field{'s' if len(missing) > 1 else ''} {', '.join(missing)}; expected {_FORM}"
        )


def read_csv(
    path: PathArg,
    columns: Mapping[str, str] | None = None,
    *,
    skip_invalid: bool = False,
    time_format: str | None = None,
) -> Trace:
    """Read a job CSV whose header names are given by ``columns`` (corral field -> header name); without
    ``columns``, by corral's own names (:data:`DEFAULT_COLUMNS`), the optional ones where the header has them."""
    hint = None
    if columns is None:
        col = dict(DEFAULT_COLUMNS)
        needed = [col[f] for f in REQUIRED_FIELDS]
        optional = [col[f] for f in OPTIONAL_FIELDS]
        hint = _DEFAULT_HINT
    else:
        check_columns(columns)
        col = dict(columns)
        # Every column the user named must be there: a mapping to a column the file lacks is a mistake.
        needed = [col[f] for f in FIELDS if f in col]
        optional = []
    # Pass 1 keeps tuples: timestamps are rebased on the earliest one, known only at the end.
    parsed: list[tuple[int, str, float, float, int, str, str | None, int, JobClass, int | None]] = []
    ids = IdRegistry()
    mode: str | None = None  # "seconds" or "timestamp", set by the first row whose submit value parses
    mode_line = 0
    with CsvRows(
        path, fmt="csv", required=needed, optional=optional, skip_invalid=skip_invalid, missing_hint=hint
    ) as rows:
        c_id, c_submit, c_dur, c_gpus = (col[f] for f in REQUIRED_FIELDS)
        i_id, i_submit, i_dur, i_gpus = (rows.index(c) for c in (c_id, c_submit, c_dur, c_gpus))
        c_tenant, c_model, c_milli, c_class, c_batch = (col.get(f, "") for f in OPTIONAL_FIELDS)
        i_tenant, i_model, i_milli, i_class, i_batch = (
            rows.find(c) if c else None for c in (c_tenant, c_model, c_milli, c_class, c_batch)
        )
        if time_format is not None:
            mode = "timestamp"
        for _, row in rows:
            try:
                job_id = rows.text(row, i_id, c_id, field="id", what="a job id")
                # --- submit: seconds or a timestamp, whichever the file uses
                value = row[i_submit].strip()
                number: float | None = None
                if mode != "timestamp":
                    try:
                        number = float(value)
                    except ValueError:
                        number = None
                if number is not None:
                    submit = rows.seconds(row, i_submit, c_submit, field="submit")
                    if mode is None:
                        mode, mode_line = "seconds", rows.line
                elif mode == "seconds":
                    raise rows.bad(
                        f"{c_submit} is not a number, but line {mode_line} gave seconds",
                        reason="bad submit",
                        column=c_submit,
                        expected=f"a number of seconds >= 0, like line {mode_line}",
                        got=row[i_submit],
                    )
                else:
                    submit = rows.timestamp(
                        row,
                        i_submit,
                        c_submit,
                        field="submit",
                        time_format=time_format,
                        what="a number of seconds, or a timestamp YYYY-MM-DD HH:MM:SS / ISO 8601"
                        if mode is None
                        else f"a timestamp YYYY-MM-DD HH:MM:SS or ISO 8601, like line {mode_line}",
                    )
                    if mode is None:
                        mode, mode_line = "timestamp", rows.line
                duration = rows.seconds(row, i_dur, c_dur, field="duration")
                gpus = rows.integer(
                    row,
                    i_gpus,
                    c_gpus,
                    field="gpus",
                    minimum=1,
                    maximum=MAX_JOB_GPUS,
                    integral_floats=True,
                    what=ONE_OR_MORE_GPUS,
                )
                # --- optional fields
                tenant = rows.optional_text(row, i_tenant, c_tenant, field="tenant") or "default"
                model = rows.optional_text(row, i_model, c_model, field="model") or None
                milli = FULL_GPU_MILLI
                if i_milli is not None and row[i_milli].strip():
                    milli = rows.integer(
                        row,
                        i_milli,
                        c_milli,
                        field="gpu_milli",
                        minimum=1,
                        maximum=FULL_GPU_MILLI,
                        integral_floats=True,
                    )
                    if gpus > 1 and milli != FULL_GPU_MILLI:
                        raise rows.bad(
                            "a multi-GPU job asks for a fraction of each GPU",
                            reason="bad gpu_milli",
                            column=c_milli,
                            expected=f"1000 when {c_gpus} > 1 (shares below one GPU are for one-GPU jobs)",
                            got=row[i_milli],
                        )
                job_class = JobClass.GUARANTEED
                if i_class is not None and row[i_class].strip():
                    name = row[i_class].strip().lower()
                    if name not in _CLASSES:
                        raise rows.bad(
                            f"unknown {c_class}",
                            reason="bad job_class",
                            column=c_class,
                            expected="one of " + ", ".join(_CLASSES) + " (any case), or empty",
                            got=row[i_class],
                        )
                    job_class = _CLASSES[name]
                batch = None
                if i_batch is not None and row[i_batch].strip():
                    batch = rows.integer(
                        row,
                        i_batch,
                        c_batch,
                        field="batch_size",
                        minimum=1,
                        maximum=MAX_BATCH_SIZE,
                        integral_floats=True,
                        what=f"an integer >= 1 (at most {MAX_BATCH_SIZE:,})",
                    )
                ids.claim(rows, job_id, c_id)  # last, so a row rejected for another reason keeps no id
            except BadRow as err:
                rows.skip(err)
                continue
            parsed.append((rows.line, job_id, submit, duration, gpus, tenant, model, milli, job_class, batch))

    origin = min(p[2] for p in parsed) if parsed and mode == "timestamp" else 0.0
    jobs: list[JobSpec] = []
    for line, job_id, submit, duration, gpus, tenant, model, milli, job_class, batch in parsed:
        try:
            jobs.append(
                JobSpec(
                    job_id=job_id,
                    submit_s=submit - origin,
                    num_gpus=gpus,
                    duration_s=duration,
                    tenant=tenant,
                    gpu_milli=milli,
                    model=model,
                    job_class=job_class,
                    batch_size=batch,
                )
            )
        except JobSpecError as err:  # the checks above make this unreachable; kept so it would be located
            rows.skip(rows.bad_spec(err, line))
    del parsed
    sort_by_submit(jobs)

    mapping = ", ".join(f"{f}={col[f]}" for f in FIELDS if f in col and rows.find(col[f]) is not None)
    if mode == "timestamp":
        clock = "submit times are timestamps, turned into seconds from the earliest (taken as UTC)"
    else:
        clock = "submit times are seconds, used as written"
    how = "corral's own columns" if columns is None else "columns"
    notes = [f"csv: {plural(len(jobs), 'job')} read with {how} {mapping}; {clock}"]
    skip_note = rows.skip_note()
    if skip_note:
        notes.append(skip_note)
    return Trace(jobs=jobs, source=rows.file, skipped=rows.skipped, notes=notes)
