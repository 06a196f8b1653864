"""``corral jobs`` and ``corral job``: the jobs, a page at a time, and one job in full.

``corral jobs`` reads one page (50 jobs unless ``--limit``), says how many match in all, and prints the
``--cursor`` of the next page. Its default view (the active jobs) also shows the jobs that failed or were
rejected in the last 10 minutes, in a table of their own: a job that fails at once is otherwise never seen there.
Also here: how a job's GPUs, class, phase, placement and times are written, which ``corral submit`` shares.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import click
from rich.table import Table

from corral.cli import live
from corral.cli.live.common import ACTIVE_PHASES, FAILED_PHASES, _errors, _print_json, _when, make_client, safe
from corral.cli.options import client_options, json_option
from corral.core.wording import duration, start_words

if TYPE_CHECKING:
    from corral.live.client import Client, ClusterJson, JobJson

RECENT_FAILURES_S = 600  # failures `corral jobs` shows: those that ended this recently
RECENT_FAILURES_SCAN = 200  # the failed jobs it reads for them, newest submitted first (the API has no end filter)
DEFAULT_PAGE = 50  # jobs `corral jobs` shows unless --limit says otherwise
_PHASE_STYLE = {
    "pending": "yellow",
    "running": "green",
    "finished": "blue",
    "failed": "red",
    "cancelled": "magenta",
    "rejected": "red",
}


def _gpus(job: JobJson) -> str:
    if job["gpu_milli"] == 1000:
        return str(job["num_gpus"])
    return f"{job['gpu_milli'] / 1000:g}"


def _job_class(job: JobJson) -> str:
    return "opportunistic" if job["job_class"] == "opportunistic" else "guaranteed"


def _runtime_s(job: JobJson, now: float) -> float:
    held = job["executed_s"]
    if job["phase"] == "running" and job["last_start_s"] is not None:
        held += max(0.0, now - job["last_start_s"])
    return held


def _queued_s(job: JobJson, now: float) -> float:
    """Seconds the job has waited, across preemptions: while it is pending, the wait it is in counts up to ``now``
    (a server without ``queued_since_s`` gives the ended waits only)."""
    waited = job["queued_s"]
    since = job.get("queued_since_s")
    if job["phase"] == "pending" and since is not None:
        waited += max(0.0, now - since)
    return waited


def _placement(job: JobJson) -> str:
    p = job["placement"]
    if p is None:
        why = job.get("wait_reason")
        return safe(why) if job["phase"] == "pending" and why else "-"
    gpus = ",".join(map(str, p["gpus"]))
    share = "" if p["gpu_milli"] == 1000 else f" @{p['gpu_milli']}m"
    return f"GPU {gpus}{share}{' (opp)' if p['opportunistic'] else ''}"


def _ranks(job: JobJson, snap: ClusterJson | None) -> str:
    """Where each rank of a job runs, with several nodes: ``rank 0: node0 GPUs 0,1; rank 1: node1 GPUs 2,3``
    (ranks by node order, as the gang environment numbers them)."""
    p = job["placement"]
    if p is None or snap is None or len(snap["nodes"]) < 2:
        return ""
    nodes = [n["name"] for n in snap["nodes"]]
    by_node: dict[str, list[int]] = {}
    for g in p["gpus"]:
        by_node.setdefault(snap["gpus"][g]["node"], []).append(g)
    ranked = sorted(by_node.items(), key=lambda kv: nodes.index(kv[0]) if kv[0] in nodes else len(nodes))
    return "; ".join(f"rank {r}: {safe(node)} GPUs {','.join(map(str, gpus))}" for r, (node, gpus) in enumerate(ranked))


def _job_phase(job: JobJson) -> str:
    """The job's phase, styled; a pending job whose state waits in host memory shows as suspended."""
    if job["phase"] == "pending" and job.get("suspended_on"):
        return "[yellow]suspended[/]"
    return _phase(job["phase"])


def _phase(phase: str) -> str:
    style = _PHASE_STYLE.get(phase)
    return f"[{style}]{phase}[/]" if style else safe(phase)


def _estimate(job: JobJson, now: float) -> str | None:
    """A pending job's estimated start in words, if the server made one."""
    e = job.get("estimated_start")
    if job["phase"] != "pending" or not e:
        return None
    return start_words(e["start_s"], e["earliest_s"], e["latest_s"], now)


@click.command()
@click.option("--tenant", help="Only this tenant's jobs.")
@click.option(
    "--phase", "phases", multiple=True, help="Only jobs in this phase (repeat): pending, running, finished, ..."
)
@click.option(
    "--all",
    "show_all",
    is_flag=True,
    help="Every job, ended ones too (default: pending and running, then those that failed or were rejected in the "
    f"last {RECENT_FAILURES_S // 60} minutes).",
)
@click.option(
    "--limit",
    type=click.IntRange(min=1, max=1000),
    default=DEFAULT_PAGE,
    show_default=True,
    help="Jobs in the page shown.",
)
@click.option("--cursor", help="Start where the page before ended (the cursor it printed).")
@click.option("--newest", is_flag=True, help="Newest first (default: in submission order, oldest first).")
@json_option
@client_options
def jobs(
    tenant: str | None,
    phases: tuple[str, ...],
    show_all: bool,
    limit: int,
    cursor: str | None,
    newest: bool,
    as_json: bool,
    **client: Any,
) -> None:
    """List jobs (by default the pending and running ones, then those that failed or were rejected in the last
    10 minutes), a page at a time."""
    with _errors():
        wanted: Sequence[str] | None = phases or (None if show_all else ACTIVE_PHASES)
        # The default view also shows what failed lately: a job that fails at once is never pending or running
        # long enough to be seen there.
        recent = not phases and not show_all and cursor is None and not as_json
        with make_client(**client) as api:
            page = api.jobs_page(tenant=tenant, phases=wanted, limit=limit, cursor=cursor, newest_first=newest)
            now = time.time()
            failures = _recent_failures(api, tenant, now) if recent else []
        if as_json:
            _print_json(page)
            return
        found = page["jobs"]
        what = "all jobs" if wanted is None else f"{', '.join(safe(w) for w in wanted)} jobs"
        shown = f"{page['total']:,}" if len(found) == page["total"] else f"{len(found):,} of {page['total']:,}"
        table = Table(title=f"{what}: {shown}{' (newest first)' if newest else ''}")
        starts = [_estimate(job, now) for job in found]
        estimated = any(starts)  # a column only when the server has estimated some (docs/live.md)
        for col, justify in (("id", "left"), ("name", "left"), ("tenant", "left"), ("class", "left"),
                             ("GPUs", "right"), ("phase", "left"), ("placement", "left"), ("queued", "right"),
                             ("runtime", "right"), ("preempted", "right")):  # fmt: skip
            table.add_column(col, justify=justify)  # type: ignore[arg-type]
        if estimated:
            table.add_column("est. start")
        for job, start in zip(found, starts, strict=True):
            table.add_row(
                safe(job["job_id"]),
                safe(job["name"] or ""),
                safe(job["tenant"]),
                "opp" if _job_class(job) == "opportunistic" else "guar",
                _gpus(job),
                _job_phase(job),
                _placement(job),
                duration(_queued_s(job, now)),
                duration(_runtime_s(job, now)),
                str(job["preemptions"]),
                *([start or "-"] if estimated else []),
            )
        if page["next_cursor"] is not None:
            table.caption = f"next page: the same command with --cursor {safe(page['next_cursor'])}"
        live.console.print(table)
        if failures:
            live.console.print(_failure_table(failures, now))


def _recent_failures(api: Client, tenant: str | None, now: float) -> list[JobJson]:
    """The jobs that failed or were rejected in the last :data:`RECENT_FAILURES_S` seconds, the latest first.

    The API filters by phase, not by end time, and pages in submission order: this reads the
    :data:`RECENT_FAILURES_SCAN` failed jobs submitted last and keeps those that ended lately (an older job that
    failed lately behind as many newer failures is not shown: ``corral jobs --phase failed`` lists them all)."""
    page = api.jobs_page(tenant=tenant, phases=FAILED_PHASES, limit=RECENT_FAILURES_SCAN, newest_first=True)
    since = now - RECENT_FAILURES_S
    found = [j for j in page["jobs"] if j["end_s"] is not None and j["end_s"] >= since]
    return sorted(found, key=lambda j: j["end_s"] or 0.0, reverse=True)


def _failure_table(failures: Sequence[JobJson], now: float, most: int = 10) -> Table:
    minutes = RECENT_FAILURES_S // 60
    why = "why: corral job ID, corral logs ID"
    table = Table(title=f"[bold red]failed or rejected in the last {minutes} minutes: {len(failures)}[/]", caption=why)
    for col in ("id", "name", "tenant", "phase", "ended", "reason"):
        table.add_column(col)
    for job in failures[:most]:
        table.add_row(
            safe(job["job_id"]),
            safe(job["name"] or ""),
            safe(job["tenant"]),
            _phase(job["phase"]),
            f"{duration(now - (job['end_s'] or now))} ago",
            safe(job["reason"] or ""),
        )
    if len(failures) > most:
        table.caption = f"{len(failures) - most} more: corral jobs --phase failed,rejected --newest; {why}"
    return table


@click.command()
@click.argument("job_id")
@json_option
@client_options
def job(job_id: str, as_json: bool, **client: Any) -> None:
    """Show one job: what it is, where it runs, its history and its latest telemetry."""
    with _errors():
        with make_client(**client) as api:
            record = api.job(job_id)
            events = api.events(job_id)
            snap = api.cluster() if record["placement"] is not None else None
        if as_json:
            _print_json({"job": record, "events": events})
            return
        import shlex

        now = time.time()
        table = Table(title=f"job {safe(record['job_id'])}" + (f" ({safe(record['name'])})" if record["name"] else ""))
        table.add_column("", style="bold")
        table.add_column("")
        proc = record["process"]
        rows = [
            ("phase", _job_phase(record) + (f": {safe(record['reason'])}" if record["reason"] else "")),
            *(
                [("state", "in host memory of " + ", ".join(safe(n) for n in record["suspended_on"] or []))]
                if record.get("suspended_on")
                else []
            ),
            *([("waiting", safe(record["wait_reason"]))] if record.get("wait_reason") else []),
            *([("estimated start", start)] if (start := _estimate(record, now)) else []),
            *(
                [("expected duration", duration(float(record["expected_duration_s"] or 0)))]
                if record.get("expected_duration_s")
                else []
            ),
            ("tenant", safe(record["tenant"])),
            ("class", _job_class(record)),
            ("GPUs", _gpus(record) + (f", {record['gpu_mem_mib']} MiB each" if record["gpu_mem_mib"] else "")),
            ("placement", _placement(record)),
            ("command", safe(shlex.join(record["command"]))),
            ("cwd", safe(record["cwd"])),
            ("submitted", _when(record["submit_s"])),
            ("first start", _when(record["first_start_s"])),
            ("ended", _when(record["end_s"])),
            ("queued", duration(_queued_s(record, now))),
            ("runtime", duration(_runtime_s(record, now))),
            ("preemptions", str(record["preemptions"])),
            ("process", f"run {proc['run']}, {safe(proc['phase'])}" + (f", pid {proc['pid']}" if proc["pid"] else "")
             + (f", exit code {proc['exit_code']}" if proc["exit_code"] is not None else "")
             + (f", signal {proc['exit_signal']}" if proc["exit_signal"] is not None else "")),
        ]  # fmt: skip
        ranks = _ranks(record, snap)
        if ranks:
            rows.insert(5, ("ranks", ranks))
        if record["env"]:
            rows.append(("env", safe(" ".join(f"{k}={v}" for k, v in sorted(record["env"].items())))))
        tel = record["telemetry"]
        if tel is not None:
            rows.append(
                (
                    "telemetry",
                    f"step {tel['step_time_s'] * 1000:.1f} ms, busy {tel['sm_util']:.0%}, "
                    f"GPU memory peak {tel['mem_peak_mib']} MiB (at {_when(tel['time_s'])})",
                )
            )
            if tel["slowdown"] is not None and tel["baseline_step_time_s"] is not None:
                rows.append(
                    (
                        "slowdown",
                        f"{tel['slowdown']:.2f}x its step time alone ({tel['baseline_step_time_s'] * 1000:.1f} ms, "
                        f"median of {tel['baseline_reports']} reports)",
                    )
                )
        for key, value in rows:
            table.add_row(key, value)
        live.console.print(table)
        history = Table(title="events")
        history.add_column("time")
        history.add_column("event")
        history.add_column("detail")
        for e in events:
            history.add_row(_when(e["time_s"]), safe(e["kind"]), safe(e["detail"]))
        live.console.print(history)
