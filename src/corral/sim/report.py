"""Write a replay's results to a folder: ``summary.json``, ``jobs.csv``, ``tenants.csv``, ``utilization.csv``,
``manifest.json`` (what produced them) and, when decisions were recorded, ``decisions.log``; for a comparison,
``comparison.csv`` and ``comparison.json`` (:func:`write_comparison`) beside the policies' folders. The HTML
report and its plots are :mod:`corral.sim.report_html`'s.

An output folder holds one run: :func:`prepare_out` refuses a folder that is not empty (results of two runs mixed,
or a stale ``decisions.log`` from an earlier run beside new files, would mislead whoever reads them), unless told
to overwrite, which first deletes corral's own files there and nothing else.

``jobs.csv`` ends with each job's finish-time fairness ``rho`` (empty where undefined), its class at the end
(``guaranteed``, ``opportunistic``, or ``upgraded``), its ``slowdown`` from sharing and ``last_wait_reason``, the
reason the last round that examined it while it waited gave for leaving it waiting (empty if none did: it never
waited, or was never examined); ``tenants.csv`` with
``mean_rho`` and ``max_rho`` and, for tenants with a quota, ``quota_gpus``, ``quota_use`` and
``shortfall_gpu_h``; ``utilization.csv`` gives, per time bin, the allocated fraction of the GPUs, the fraction of
GPU time kept busy (SM) and the fraction of GPU memory in use (see :mod:`corral.sim.metrics`). New columns are
only ever appended, so scripts that read columns by position keep working.

Files hold no wall-clock times or paths that vary between runs, so the same inputs and seed give the same bytes.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from corral import __version__, compiled
from corral.core.errors import ConfigError
from corral.core.job import JobClass, JobPhase
from corral.sim.metrics import job_rhos, job_slowdown, utilization_bins
from corral.sim.report_html import REPORT_FILES
from corral.sim.runner import SimulationResult

JOB_COLUMNS = (
    "job_id",
    "tenant",
    "num_gpus",
    "submit_s",
    "start_s",
    "end_s",
    "jct_s",
    "queueing_s",
    "preemptions",
    "gpu_milli",
    "status",
    "reason",
    "rho",
    "job_class",
    "slowdown",
    "last_wait_reason",
)


# Enum values by dictionary: an enum member's ``.value`` is a Python-level descriptor call, two per row of jobs.csv.
_PHASES = {phase: phase.value for phase in JobPhase}
_CLASSES = {job_class: job_class.value for job_class in JobClass}


def _num(x: float | None) -> str:
    return "" if x is None else format(x, ".3f")  # format(), not an f-string: compiled, that parses "{:.3f}" each time


def _ratio(x: float | None) -> str:
    return "" if x is None else format(x, ".4f")


COMPARISON_FILES = ("comparison.csv", "comparison.json")
RESULT_FILES = (
    "summary.json",
    "jobs.csv",
    "tenants.csv",
    "utilization.csv",
    "decisions.log",
    "manifest.json",
    *COMPARISON_FILES,
    *REPORT_FILES,
)


def prepare_out(out_dir: str | Path, *, overwrite: bool, per_policy: bool = False) -> Path:
    """The output folder, made ready for one run: created if missing; if it holds anything, an error unless
    ``overwrite``, which deletes corral's result files there (and, for ``per_policy`` runs, in its sub-folders
    that hold a ``summary.json``), never anything else. Called before the replay, so a refusal costs nothing."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out}: not a folder")
    entries = sorted(out.iterdir()) if out.exists() else []
    if entries and not overwrite:
        shown = ", ".join(e.name for e in entries[:5]) + (f" and {len(entries) - 5} more" if len(entries) > 5 else "")
        raise ConfigError(
            f"--out {out}: the folder is not empty ({shown}); results of two runs would mix. Choose another "
            "folder, or pass --overwrite to delete corral's result files there first"
        )
    folders = [out, *(e for e in entries if per_policy and e.is_dir() and (e / "summary.json").is_file())]
    for folder in folders:
        for name in RESULT_FILES:
            (folder / name).unlink(missing_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    return out


def write_manifest(
    out_dir: str | Path,
    *,
    policy: str,
    cluster: str,
    seed: int,
    inputs: Mapping[str, str | None],
    argv: Sequence[str] | None = None,
) -> Path:
    """``manifest.json``: corral's version, the command line, the policy, cluster and seed, and each input file
    (``inputs``: role -> path, e.g. ``trace``) with its size and SHA-256, so that a result can be traced to what
    made it and re-made."""
    files: dict[str, Any] = {}
    for role, name in inputs.items():
        if name is None:
            continue
        path = Path(name)
        if not path.is_file():
            files[role] = {"path": name}  # a preset or a spec, not a file
            continue
        digest = hashlib.sha256()
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        files[role] = {"path": str(path), "bytes": path.stat().st_size, "sha256": digest.hexdigest()}
    manifest = {
        "corral_version": __version__,
        "compiled": compiled(),  # the compiled core (setup.py) or pure Python: same decisions, other timings
        "command": list(sys.argv if argv is None else argv),
        "policy": policy,
        "cluster": cluster,
        "seed": seed,
        "inputs": files,
    }
    path = Path(out_dir) / "manifest.json"
    path.write_text(json.dumps(manifest, indent=2) + "\n")
    return path


def summary_record(result: SimulationResult) -> dict[str, Any]:
    """What ``summary.json`` holds: every summary metric, then the policy, cluster, GPUs, trace and its notes."""
    return {
        **result.summary,
        "policy": result.policy,
        "cluster": result.cluster,
        "num_gpus": result.num_gpus,
        "trace": Path(result.trace).name,
        "trace_notes": result.notes,
    }


def write_comparison(out_dir: str | Path, runs: Sequence[tuple[str, str, Mapping[str, Any]]]) -> list[Path]:
    """``comparison.json`` and ``comparison.csv`` across the policies of a comparison, in the order given:
    ``runs`` holds, per policy, its spec as given to ``--policy``, its sub-folder's name and its summary (as
    :func:`summary_record` makes it). One JSON object per policy: ``policy_spec``, ``folder``, then every key of
    its ``summary.json`` with the same values; one CSV row per policy with the same columns but ``trace_notes``
    (a list, the same for every policy, and in each ``summary.json``)."""
    out = Path(out_dir)
    rows = [{"policy_spec": spec, "folder": folder, **summary} for spec, folder, summary in runs]
    path_json = out / "comparison.json"
    path_json.write_text(json.dumps(rows, indent=2) + "\n")
    columns = list(dict.fromkeys(k for row in rows for k in row if k != "trace_notes"))
    path_csv = out / "comparison.csv"
    with path_csv.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
    return [path_csv, path_json]


def write_results(result: SimulationResult, out_dir: str | Path) -> list[Path]:
    if result.timeline_s is None:
        raise ValueError("utilization.csv needs the replay's timelines: simulate(..., record_timelines=True)")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []

    summary = summary_record(result)
    path = out / "summary.json"
    path.write_text(json.dumps(summary, indent=2) + "\n")
    written.append(path)

    path = out / "jobs.csv"
    usage = result.usage
    rhos = result.rho
    if rhos is None:  # a result made by hand, not by simulate()
        rhos = job_rhos(result.jobs, result.num_gpus, usage.job_speeds if usage is not None else None)
    times = usage.job_times if usage is not None else {}
    with path.open("w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(JOB_COLUMNS)
        for j, rho in zip(result.jobs, rhos, strict=True):
            s = j.spec
            end = j.end_s
            w.writerow(
                (
                    s.job_id,
                    s.tenant,
                    s.num_gpus,
                    _num(s.submit_s),
                    _num(j.first_start_s),
                    _num(end),
                    _num(None if end is None else end - s.submit_s),
                    _num(j.queued_s),
                    j.preemptions,
                    s.gpu_milli,
                    _PHASES[j.phase],
                    j.reason or "",
                    "" if math.isnan(rho) else format(rho, ".4f"),
                    "upgraded" if j.upgraded else _CLASSES[s.job_class],
                    _ratio(job_slowdown(times.get(s.job_id))),
                    j.wait_reason or "",
                )
            )
    written.append(path)

    path = out / "tenants.csv"
    with path.open("w", newline="") as f:
        rows = result.tenants
        w2 = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["tenant"], lineterminator="\n")
        w2.writeheader()
        w2.writerows(rows)
    written.append(path)

    bin_s, bins = utilization_bins(result.timeline_s, result.timeline_milli, result.window, result.num_gpus)
    columns = [bins]
    if usage is not None and result.timeline_use_s is not None:
        # The same bins, on the measured use: SM-busy GPUs x 1000 and memory as a fraction of the cluster's x G x 1000
        # (utilization_bins divides by num_gpus x 1000).
        scale = result.num_gpus * 1000 / usage.total_mem_mib
        for series, factor in ((result.timeline_sm, 1000.0), (result.timeline_mem_mib, scale)):
            values = [v * factor for v in series]
            columns.append(utilization_bins(result.timeline_use_s, values, result.window, result.num_gpus, bin_s)[1])
    header = ["time_s", "gpu_alloc_frac", "gpu_sm_frac", "gpu_mem_frac"][: len(columns) + 1]
    if result.timeline_queue_s is not None:
        # The mean number of jobs pending in each bin, every wait counted (utilization_bins divides by 1000 x G).
        counts = [n * 1000.0 for n in result.timeline_queue]
        columns.append(utilization_bins(result.timeline_queue_s, counts, result.window, 1, bin_s)[1])
        header.append("queue_mean")
    path = out / "utilization.csv"
    with path.open("w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(header)
        for i, row in enumerate(bins):
            w.writerow((*row, *(col[i][1] for col in columns[1:])))
    written.append(path)

    if result.decision_log is not None:
        path = out / "decisions.log"
        path.write_text("".join(entry.render() + "\n" for entry in result.decision_log))
        written.append(path)
    return written
