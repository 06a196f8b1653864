"""Reader of Alibaba's GPU-sharing cluster trace v2023, "openb" (Weng et al., ATC'23).

Columns: ``name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,
scheduled_time``; times are seconds from the trace's start. ``cpu_milli`` and ``memory_mib`` (host resources)
are not used by corral and not required. The authors' ``multigpu`` variants carry only the first five columns,
no times, so they cannot be replayed; reading one fails on its header, naming the missing columns.

Mapping to :class:`~corral.core.job.JobSpec`:

- ``job_id`` = ``name``; ``submit_s`` = ``creation_time``; ``num_gpus`` = ``num_gpu``; ``gpu_milli`` =
  ``gpu_milli`` (the share of one GPU; below 1000 only for single-GPU pods); ``gpu_types`` = the
  ``|``-separated ``gpu_spec`` (empty: any type; a type listed twice, as some rows do, is kept once);
  ``model`` None; ``tenant`` "default" (the trace names no users);
- ``job_class``: qos ``BE`` (best effort) is opportunistic, everything else (``LS`` latency-sensitive,
  ``Guaranteed``, ``Burstable``) guaranteed, after AntMan's split (OSDI'20 §4); ``priority``: LS 2,
  Guaranteed 2, Burstable 1, BE 0, Kubernetes' own ordering of QoS classes;
- ``duration_s`` = ``deletion_time - scheduled_time``: how long the pod ran, not how long it existed, because
  the time between creation and scheduling was queueing that the replay will model by itself.

Treatments, each reported in ``Trace.notes`` with its count (and in ``Trace.skipped`` when rows are dropped):

- CPU-only pods (``num_gpu`` 0) are dropped ("cpu-only pod"): corral schedules GPUs.
- Pending pods never started within the trace, so their run time is unknown. By default (``pending="drop"``)
  they are dropped ("pending pod, never started"). ``pending="wait"`` keeps them with ``duration_s`` =
  ``deletion_time - creation_time``, how long they existed, as an upper bound of the run time they asked for
  (the trace does not say what that was; a pod may also have been deleted because it waited too long).
- Running pods whose ``deletion_time`` is the trace's end (the largest ``deletion_time`` in the file) were
  cut off by the end of the recording: they are kept with ``duration_s`` = end - ``scheduled_time``, a lower
  bound.
- Failed and Succeeded pods (and Running pods that ended before the trace did) are kept with the run time
  observed.
"""

from __future__ import annotations

from collections import Counter
from typing import Literal

from corral.core.errors import ConfigError, JobSpecError
from corral.core.job import FULL_GPU_MILLI, JobClass, JobSpec
from corral.core.wording import plural
from corral.sim.traces._rows import (
    MAX_JOB_GPUS,
    ZERO_OR_MORE_GPUS,
    BadRow,
    CsvRows,
    IdRegistry,
    PathArg,
    sort_by_submit,
)
from corral.sim.traces.trace import Trace

PendingMode = Literal["drop", "wait"]

COLUMNS = (
    "name",
    "num_gpu",
    "gpu_milli",
    "qos",
    "pod_phase",
    "creation_time",
    "deletion_time",
    "scheduled_time",
)
OPTIONAL = ("cpu_milli", "memory_mib", "gpu_spec")
QOS_CLASS = {
    "LS": JobClass.GUARANTEED,
    "Guaranteed": JobClass.GUARANTEED,
    "Burstable": JobClass.GUARANTEED,
    "BE": JobClass.OPPORTUNISTIC,
}
QOS_PRIORITY = {"LS": 2, "Guaranteed": 2, "Burstable": 1, "BE": 0}
PHASES = ("Running", "Pending", "Succeeded", "Failed")

CPU_ONLY = "cpu-only pod"
PENDING = "pending pod, never started"

# One parsed GPU pod, kept until the trace's end is known: (line, name, num_gpu, gpu_milli, gpu_types, qos,
# phase, creation, deletion, scheduled or None).
_Pod = tuple[int, str, int, int, tuple[str, ...], str, str, float, float, float | None]


def read_openb(path: PathArg, *, skip_invalid: bool = False, pending: PendingMode = "drop") -> Trace:
    """Read an openb pod list. Bad rows raise :class:`~corral.core.errors.TraceError` unless ``skip_invalid``.

    ``pending`` says what to do with Pending pods: "drop" them (default) or "wait", keeping them with the
    time they existed as their duration (see the module's docstring).
    """
    if pending not in ("drop", "wait"):
        raise ConfigError(f"openb: pending must be 'drop' or 'wait', got {pending!r}")
    pods: list[_Pod] = []
    ids = IdRegistry()
    end = 0.0  # the trace's end: the largest deletion_time of any valid row, CPU-only pods included
    cpu_only = 0
    with CsvRows(path, fmt="openb", required=COLUMNS, optional=OPTIONAL, skip_invalid=skip_invalid) as rows:
        i_name, i_gpus, i_milli, i_qos, i_phase, i_create, i_delete, i_sched = (rows.index(c) for c in COLUMNS)
        i_spec = rows.find("gpu_spec")
        for _, row in rows:
            try:
                pod = _parse(rows, row, i_name, i_gpus, i_milli, i_spec, i_qos, i_phase, i_create, i_delete, i_sched)
                ids.claim(rows, pod[1], "name")
            except BadRow as err:
                rows.skip(err)
                continue
            end = max(end, pod[8])
            if pod[2] == 0:
                cpu_only += 1
                continue
            pods.append(pod)

    # rows.skipped holds only the invalid rows (skip_invalid); the format's own treatments are added to a copy
    # so the note about invalid rows stays about them alone.
    skipped = Counter(rows.skipped)
    notes = []
    if cpu_only:
        skipped[CPU_ONLY] += cpu_only
        notes.append(f"openb: dropped {plural(cpu_only, 'CPU-only pod')} (num_gpu 0): corral schedules GPUs")

    jobs: list[JobSpec] = []
    n_pending = n_truncated = 0
    kept_phase: dict[str, int] = dict.fromkeys(PHASES, 0)
    for line, name, gpus, milli, types, qos, phase, created, deleted, scheduled in pods:
        if scheduled is None:  # Pending
            n_pending += 1
            if pending == "drop":
                continue
            duration = deleted - created
        else:
            if phase == "Running" and deleted == end:
                n_truncated += 1
            duration = deleted - scheduled
        try:
            jobs.append(
                JobSpec(
                    job_id=name,
                    submit_s=created,
                    num_gpus=gpus,
                    duration_s=duration,
                    gpu_milli=milli,
                    job_class=QOS_CLASS[qos],
                    priority=QOS_PRIORITY[qos],
                    gpu_types=types,
                )
            )
        except JobSpecError as err:  # the row checks make this unreachable; kept so it would be located
            rows.skip(rows.bad_spec(err, line))
            continue
        kept_phase[phase] += 1
    del pods
    sort_by_submit(jobs)

    if n_pending and pending == "drop":
        skipped[PENDING] += n_pending
        notes.append(
            f"openb: dropped {plural(n_pending, 'Pending GPU pod')}: they never started within the trace, so their"
            " run time is unknown (pending='wait' keeps them with the time they existed as duration)"
        )
    elif n_pending:
        notes.append(
            f"openb: kept {plural(n_pending, 'Pending GPU pod')} with duration = deletion_time - creation_time"
            " (how long they existed; they never ran within the trace, so this only stands in for their"
            " run time)"
        )
    if n_truncated:
        notes.append(
            f"openb: {plural(n_truncated, 'Running pod')} {'was' if n_truncated == 1 else 'were'} cut off at the"
            f" trace's end (t={end:,.0f} s): kept with"
            " duration = end - scheduled_time, a lower bound of their run time"
        )
    n_class = sum(1 for job in jobs if job.job_class is JobClass.OPPORTUNISTIC)
    notes.append(
        f"openb: {plural(len(jobs), 'GPU pod')} kept ({', '.join(f'{p} {n:,}' for p, n in kept_phase.items() if n)});"
        f" duration = deletion_time - scheduled_time; {len(jobs) - n_class:,} guaranteed (qos LS, Guaranteed,"
        f" Burstable), {n_class:,} opportunistic (qos BE); one tenant ('default')"
    )
    skip_note = rows.skip_note()
    if skip_note:
        notes.append(skip_note)
    return Trace(jobs=jobs, source=rows.file, skipped=skipped, notes=notes)


def _parse(
    rows: CsvRows,
    row: list[str],
    i_name: int,
    i_gpus: int,
    i_milli: int,
    i_spec: int | None,
    i_qos: int,
    i_phase: int,
    i_create: int,
    i_delete: int,
    i_sched: int,
) -> _Pod:
    """Check every cell of one pod row, including the ones that only make sense together."""
    name = rows.text(row, i_name, "name", field="id", what="a pod name")
    gpus = rows.integer(row, i_gpus, "num_gpu", field="gpus", minimum=0, maximum=MAX_JOB_GPUS, what=ZERO_OR_MORE_GPUS)
    milli = rows.integer(row, i_milli, "gpu_milli", minimum=0, maximum=FULL_GPU_MILLI)
    if gpus >= 1 and milli == 0:
        raise rows.bad(
            "a GPU pod asks for no GPU share",
            reason="bad gpu_milli",
            column="gpu_milli",
            expected="an integer in 1..1000 when num_gpu >= 1",
            got=row[i_milli],
        )
    if gpus > 1 and milli != FULL_GPU_MILLI:
        raise rows.bad(
            "a multi-GPU pod asks for a fraction of each GPU",
            reason="bad gpu_milli",
            column="gpu_milli",
            expected="1000 when num_gpu > 1 (shares below a whole GPU are for single-GPU pods)",
            got=row[i_milli],
        )
    spec = rows.optional_text(row, i_spec, "gpu_spec")
    # dict.fromkeys drops a repeated type but keeps the file's order (a few rows list V100M32 twice).
    types = tuple(dict.fromkeys(t.strip() for t in spec.split("|") if t.strip())) if spec else ()
    qos = rows.choice(row, i_qos, "qos", tuple(QOS_CLASS))
    phase = rows.choice(row, i_phase, "pod_phase", PHASES)
    created = rows.seconds(row, i_create, "creation_time", field="submit")
    deleted = rows.seconds(row, i_delete, "deletion_time")
    if deleted < created:
        raise rows.bad(
            "the pod is deleted before it is created",
            reason="bad deletion_time",
            column="deletion_time",
            expected=f"seconds >= creation_time ({row[i_create]})",
            got=row[i_delete],
        )
    scheduled: float | None
    if phase == "Pending":
        # A Pending pod never got a node; a scheduled time on one would make the row contradict itself.
        if row[i_sched].strip():
            raise rows.bad(
                "a Pending pod has a scheduled_time",
                reason="bad scheduled_time",
                column="scheduled_time",
                expected="empty for a Pending pod (it was never scheduled)",
                got=row[i_sched],
            )
        scheduled = None
    else:
        scheduled = rows.seconds(
            row, i_sched, "scheduled_time", what=f"seconds since the trace's start for a {phase} pod"
        )
        if not created <= scheduled <= deleted:
            raise rows.bad(
                "the pod is scheduled outside its lifetime",
                reason="bad scheduled_time",
                column="scheduled_time",
                expected=f"seconds from creation_time ({row[i_create]}) to deletion_time ({row[i_delete]})",
                got=row[i_sched],
            )
    return (rows.line, name, gpus, milli, types, qos, phase, created, deleted, scheduled)
