"""What each dashboard page shows, as plain data: the templates render it into HTML (tables that work without
JavaScript) and the JSON endpoints hand the very same dict to the page's script, which redraws the tables and
charts from it every 2 s. One builder per page, so the HTML and the live updates cannot disagree.

A page's data is ``{"summary": {...}, "tables": {id: {"columns": [...], "rows": [[cell, ...], ...]}},
"charts": {id: {"title", "unit", "labels", "x", "y"}}, "now": t}``. A cell is a string, or ``{"t": text,
"href": link, "c": css class}``, or a list of those. Charts carry the history after ``since`` (the script's last
point), so that a poll sends only the new samples.

Isolation is the API's (docs/live.md, "What a tenant sees"): the cluster's numbers come from
:func:`~corral.live.api.models.cluster_out` with the viewer's tenant, so a tenant sees every GPU and how much of it
is given out, its own jobs, and the measured use only of GPUs its jobs have to themselves; its queue, its tenant
page and its jobs only. Another tenant's job is "not found", exactly as a job that does not exist.
"""

from __future__ import annotations

import itertools
import math
import re
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from corral.core.job import FULL_GPU_MILLI, JobPhase
from corral.core.telemetry import Telemetry
from corral.core.wording import duration, start_words
from corral.live.api.app import Principal
from corral.live.api.models import baseline_of, cluster_out, echo, tenant_out, utf8_cut
from corral.live.controller.stats import ROUND_BUCKETS_S
from corral.live.dashboard.cells import Cell, Data, badge, chart, gib, gpus, job_cell, kind, link, pct, share, table
from corral.live.dashboard.history import MIXED, NO_JOB, History, JobSeries, LatestCluster
from corral.live.records import JobRecord, NoSuchJob, ProcessPhase

if TYPE_CHECKING:
    from corral.live.controller import Controller

MAX_QUEUE_ROWS = 200  # the queue page lists the head of the queue; the count says how many more wait
QUEUE_SCAN = 20_000  # a tenant's view walks at most this far down the merged queue looking for its own jobs
LOG_TAIL_BYTES = 64 * 1024
# Job events that are the scheduler's decisions carried out (what "decisions per round" counts).
DECISIONS = ("launched", "preempted", "suspended", "resumed", "resized")


class NotFound(Exception):
    """No such page for this viewer (an unknown job, or another tenant's: they look the same)."""


class Forbidden(Exception):
    """A page this viewer may not see (another tenant's page, the scheduler page for a tenant)."""


@dataclass(frozen=True, slots=True)
class Context:
    controller: Controller
    latest: LatestCluster
    history: History
    gpu_order: Sequence[int]
    node_of: Callable[[int], str]


# -- cluster -------------------------------------------------------------------------------------------------------
def cluster_page(ctx: Context, who: Principal, since: float) -> Data:
    snap = ctx.latest.get()
    view = cluster_out(snap, who.tenant)  # the API's own view: same numbers, same isolation
    caps: dict[str, int | None] = {}
    for record in ctx.controller.jobs(tenant=who.tenant, phases=[JobPhase.RUNNING]):
        placement = record.status.placement
        caps[record.job_id] = placement.mem_mib if placement is not None else None
    rows: list[list[Cell]] = []
    for g in view.gpus:
        on: list[dict[str, str]] = []
        for j in g.jobs:
            cap = caps.get(j.job_id)
            on += [job_cell(j.job_id), kind(j.opportunistic)]
            on.append({"t": f"{share(j.gpu_milli)}{', cap ' + gib(cap) if cap is not None else ''}", "c": "br"})
        if g.busy and not g.jobs:
            on.append({"t": "in use (not yours)", "c": "muted"})
        rows.append(
            [
                g.node,
                str(g.index),
                g.type_name + (" (stand-in)" if g.stand_in and g.type_name != "stand-in" else ""),
                pct(g.allocated_milli / FULL_GPU_MILLI),
                pct(g.sm_util),
                f"{gib(g.mem_used_mib)} / {gib(g.mem_mib)}",
                on or "idle",
            ]
        )
    nodes: list[list[Cell]] = [
        [n.name, badge(n.state, "ok" if n.state == "alive" else "bad"), str(n.num_gpus)] for n in view.nodes
    ]
    return {
        "summary": {
            "policy": view.policy,
            "GPUs": str(view.num_gpus),
            "allocated": f"{view.allocated_gpus:g} GPUs",
            "running": str(view.running),
            "pending": str(view.pending),
        },
        "tables": {
            "gpus": table(["node", "GPU", "type", "allocated", "SM used", "memory used", "jobs"], rows),
            "nodes": table(["node", "state", "GPUs"], nodes),
        },
        "charts": _gpu_charts(ctx, who, since),
        "cluster": view.model_dump(),
    }


def _gpu_charts(ctx: Context, who: Principal, since: float) -> dict[str, Data]:
    h = ctx.history
    with h.lock:
        samples = [s for s in h.cluster if s.time_s > since]
        mine = h.tenant_names.index(who.tenant) if who.tenant in h.tenant_names else None
    snap = ctx.latest.get()
    labels = ["allocated %", "opportunistic %", "SM used %", "memory given %", "memory used %"]
    out: dict[str, Data] = {}
    for g, gpu in enumerate(snap.gpus):
        x: list[float] = []
        ys: list[list[float]] = [[], [], [], [], []]
        mem = gpu.mem_mib or 1
        for s in samples:
            if g >= len(s.alloc_milli):
                continue
            x.append(s.time_s)
            # A tenant sees what the API shows it: the allocated share of every GPU; the rest only where its
            # jobs are alone (or no job is).
            shown = who.admin or s.owner[g] == NO_JOB or (s.owner[g] != MIXED and s.owner[g] == mine)
            ys[0].append(s.alloc_milli[g] / 10)
            ys[1].append(s.opp_milli[g] / 10 if shown else math.nan)
            ys[2].append(s.sm_used[g] * 100 if shown else math.nan)
            ys[3].append(s.mem_given_mib[g] / mem * 100 if shown else math.nan)
            ys[4].append(s.mem_used_mib[g] / mem * 100 if shown else math.nan)
        out[f"gpu-{g}"] = chart(f"GPU {gpu.index} · {gpu.node}", "%", labels, x, ys)
    return out


# -- tenants -------------------------------------------------------------------------------------------------------
def _tenant_rows(ctx: Context, who: Principal) -> list[list[Cell]]:
    rows: list[list[Cell]] = []
    for t in ctx.controller.tenants():
        if not who.sees(t.name):
            continue
        o = tenant_out(t)
        short = 0.0
        if o.quota_gpus is not None and o.pending > 0:
            short = max(0.0, o.quota_gpus - o.guaranteed_gpus)
        rows.append(
            [
                link(o.name, f"/tenants/{o.name}"),
                gpus(o.quota_gpus) if o.quota_gpus is not None else "none",
                gpus(o.guaranteed_gpus),
                gpus(o.opportunistic_gpus),
                gpus(short),
                str(o.running),
                str(o.pending),
            ]
        )
    return rows


TENANT_COLUMNS = ["tenant", "quota", "guaranteed", "opportunistic", "shortfall", "running", "pending"]


def tenants_page(ctx: Context, who: Principal, since: float) -> Data:
    names = [t.name for t in ctx.controller.tenants() if who.sees(t.name)]
    return {
        "summary": {"tenants": str(len(names))},
        "tables": {"tenants": table(TENANT_COLUMNS, _tenant_rows(ctx, who))},
        "charts": {f"tenant-{name}": _tenant_chart(ctx, name, since) for name in names},
        "tenants": [tenant_out(t).model_dump() for t in ctx.controller.tenants() if who.sees(t.name)],
    }


def _tenant_chart(ctx: Context, name: str, since: float) -> Data:
    with ctx.history.lock:
        points = [(t, p[name]) for t, p in ctx.history.tenants if t > since and name in p]
    labels = ["quota", "guaranteed", "opportunistic", "shortfall"]
    ys = [
        [p.quota_gpus for _, p in points],
        [p.guaranteed_gpus for _, p in points],
        [p.opportunistic_gpus for _, p in points],
        [p.shortfall_gpus for _, p in points],
    ]
    return chart(f"{name}: GPUs", "GPUs", labels, [t for t, _ in points], ys)


def tenant_page(ctx: Context, who: Principal, name: str, since: float) -> Data:
    if not who.sees(name):
        raise Forbidden(f"this login is tenant {who.tenant!r}'s; it cannot see {echo(name)}'s page")
    found = [t for t in ctx.controller.tenants() if t.name == name]
    if not found:
        raise NotFound(f"no tenant {echo(name)}")
    jobs = ctx.controller.jobs(tenant=name, limit=200, newest_first=True)
    now = ctx.controller.clock.now()
    rows: list[list[Cell]] = [_job_row(r, now) for r in jobs]
    return {
        "summary": {"tenant": name, "quota": gpus(found[0].quota_gpus) if found[0].quota_gpus is not None else "none"},
        "tables": {
            "tenant": table(TENANT_COLUMNS, [r for r in _tenant_rows(ctx, who) if _text(r[0]) == name]),
            "jobs": table(["job", "name", "phase", "GPUs", "class", "waited", "ran"], rows, "no jobs yet"),
        },
        "charts": {f"tenant-{name}": _tenant_chart(ctx, name, since)},
    }


def _text(cell: Cell) -> str:
    return cell if isinstance(cell, str) else cell.get("t", "") if isinstance(cell, dict) else ""


def _waited_s(record: JobRecord, now: float) -> float:
    st = record.status
    waited = st.queued_s
    if st.phase is JobPhase.PENDING:
        waited += max(0.0, now - st.queued_since_s)
    return waited


def _ran_s(record: JobRecord, now: float) -> float:
    st = record.status
    held = st.executed_s
    if st.phase is JobPhase.RUNNING and st.last_start_s is not None:
        held += max(0.0, now - st.last_start_s)
    return held


def _phase(phase: JobPhase) -> dict[str, str]:
    return badge(phase.value, f"ph-{phase.value}")


def _job_row(r: JobRecord, now: float) -> list[Cell]:
    req = r.request
    asked = f"{req.num_gpus}" if req.gpu_milli == FULL_GPU_MILLI else share(req.gpu_milli)
    return [
        job_cell(r.job_id),
        req.name or "",
        _phase(r.phase),
        asked,
        kind(req.opportunistic),
        duration(_waited_s(r, now)),
        duration(_ran_s(r, now)),
    ]


# -- queue ---------------------------------------------------------------------------------------------------------
def queue_order(controller: Controller, tenant: str | None) -> list[str]:
    """The head of the queue in the policy's order (the engine's merged queue), ``tenant``'s jobs only if given.
    Read on the loop thread, where the engine's state may be read: a lazy merge, so the cost is the rows shown
    (and, for a tenant, at most :data:`QUEUE_SCAN` entries walked)."""

    def read() -> list[str]:
        out: list[str] = []
        for n, job in enumerate(controller.state.pending()):
            if n >= QUEUE_SCAN or len(out) >= MAX_QUEUE_ROWS:
                break
            if tenant is None or job.spec.tenant == tenant:
                out.append(job.spec.job_id)
        return out

    return controller.call(read)


def queue_page(ctx: Context, who: Principal) -> Data:
    c = ctx.controller
    ids = queue_order(c, who.tenant)
    total = c.store.count(tenant=who.tenant, phases=[JobPhase.PENDING])
    now = c.clock.now()
    rows: list[list[Cell]] = []
    for place, job_id in enumerate(ids, 1):
        try:
            r = c.job(job_id)
        except NoSuchJob:
            continue
        if r.phase is not JobPhase.PENDING or not who.sees(r.request.tenant):
            continue  # started (or ended) since the order was read
        req = r.request
        asked = f"{req.num_gpus} GPU{'s' if req.num_gpus > 1 else ''}"
        if req.gpu_milli != FULL_GPU_MILLI:
            asked = share(req.gpu_milli)
        rows.append(
            [
                str(place),
                job_cell(job_id),
                req.tenant,
                asked,
                kind(req.opportunistic),
                str(req.priority),
                duration(_waited_s(r, now)),
                r.wait_reason or {"t": "not examined yet", "c": "muted"},
                _starts(r, now),
            ]
        )
    more = max(0, total - len(rows))
    return {
        "summary": {"pending": str(total), "shown": str(len(rows)) + (f" (and {more} more)" if more else "")},
        "tables": {
            "queue": table(
                ["#", "job", "tenant", "asks", "class", "priority", "waited", "why it waits", "estimated start"],
                rows,
                "no job waits",
            )
        },
        "charts": {},
    }


def _starts(r: JobRecord, now: float) -> Cell:
    """A pending job's estimated start in words (docs/live.md, "Estimated start times")."""
    e = r.estimate
    if e is None:
        return {"t": "no forecast yet", "c": "muted"}
    return start_words(e.start_s, e.earliest_s, e.latest_s, now)


# -- job -----------------------------------------------------------------------------------------------------------
_RUN = re.compile(r"\brun (\d+)")


def visible_job(ctx: Context, who: Principal, job_id: str) -> JobRecord:
    try:
        record = ctx.controller.job(job_id)
    except NoSuchJob:
        raise NotFound(f"no job {echo(job_id)}") from None
    if not who.sees(record.request.tenant):
        raise NotFound(f"no job {echo(job_id)}")  # another tenant's job looks exactly like none
    return record


def job_page(ctx: Context, who: Principal, job_id: str, since: float) -> Data:
    r = visible_job(ctx, who, job_id)
    c = ctx.controller
    now = c.clock.now()
    events = c.events(job_id)
    start = events[0].time_s if events else r.status.spec.submit_s
    timeline: list[list[Cell]] = [
        ["+" + duration(e.time_s - start), badge(e.kind, f"ev-{e.kind.replace(' ', '-')}"), e.detail] for e in events
    ]
    runs: dict[int, list[str]] = {}
    for e in events:
        m = _RUN.search(e.detail)
        if m and e.kind in ("launched", "started", "exited", "paused", "resumed", "preempted", "suspended"):
            runs.setdefault(int(m[1]), []).append(f"{e.kind} +{duration(e.time_s - start)}")
    run_rows: list[list[Cell]] = [[str(n), "; ".join(what)] for n, what in sorted(runs.items())]
    st, req, proc = r.status, r.request, r.process
    p = st.placement
    where = "-"
    if p is not None:
        where = ", ".join(f"GPU {ctx.gpu_order[g]} ({ctx.node_of(g)})" for g in p.gpus)
    tel = r.telemetry
    summary = {
        "tenant": req.tenant,
        "name": req.name or "-",
        "phase": st.phase.value,
        "class": st.job_class.value,
        "asks": f"{req.num_gpus} x {share(req.gpu_milli)}",
        "placement": where,
        "share": share(p.gpu_milli) if p is not None else "-",
        "memory cap": gib(p.mem_mib) if p is not None and p.mem_mib is not None else "-",
        "waited": duration(_waited_s(r, now)),
        "ran": duration(_ran_s(r, now)),
        "preemptions": str(st.preemptions),
        "process": f"run {proc.run}, {proc.phase.value}" if proc.phase is not ProcessPhase.NONE else f"run {proc.run}",
        "step time": f"{tel.step_time_s * 1000:.0f} ms" if tel is not None else "-",
        "step time alone": f"{base * 1000:.0f} ms" if (base := _baseline(tel)) is not None else "-",
        "slowdown": f"{slow:.2f}x" if tel is not None and (slow := tel.slowdown) is not None else "-",
        "why it waits": r.wait_reason or "-" if st.phase is JobPhase.PENDING else "-",
        "estimated start": (
            start_words(est.start_s, est.earliest_s, est.latest_s, now)
            if st.phase is JobPhase.PENDING and (est := r.estimate) is not None
            else "-"
        ),
        "ended because": st.reason or "-",
        "command": shlex.join(req.command),
    }
    with ctx.history.lock:
        series = ctx.history.jobs.get(job_id)
        charts = _job_charts(series, since) if series is not None else {}
    return {
        "summary": summary,
        "tables": {
            "events": table(["when", "event", "detail"], timeline, "no events yet"),
            "runs": table(["run", "what happened"], run_rows, "not started yet"),
        },
        "charts": charts,
        "phase": st.phase.value,
    }


def _baseline(tel: Telemetry | None) -> float | None:
    return baseline_of(tel) if tel is not None else None


def _job_charts(s: JobSeries, since: float) -> dict[str, Data]:
    keep = [i for i, t in enumerate(s.time_s) if t > since]
    x = [s.time_s[i] for i in keep]

    def col(values: Sequence[float], scale: float = 1.0) -> list[float]:
        return [values[i] * scale for i in keep]

    # Step time alone: the controller's baseline as it stood at each sample (the solo time the job reports, else
    # the median of its latest step reports made with its GPUs to itself: corral.live.controller.baseline, after
    # AntMan's coordinator, OSDI'20 §3.3), the very figure /metrics divides by. NaN (a gap) while there is none.
    slowdown = [s.step_s[i] / s.baseline_s[i] if s.baseline_s[i] > 0 else math.nan for i in keep]
    labels = ["step time", "step time alone (reported, else median of its steps alone)"]
    out = {
        "step": chart("step time (ms)", "ms", labels, x, [col(s.step_s, 1000), col(s.baseline_s, 1000)]),
        "slowdown": chart("slowdown (step / step alone)", "x", ["slowdown"], x, [slowdown]),
        "memory": chart(
            "GPU memory (MiB)", "MiB", ["cap", "used (peak)"], x, [col(s.mem_cap_mib), col(s.mem_used_mib)]
        ),
        "share": chart(
            "compute share and SM use (%)", "%", ["share", "SM used"], x, [col(s.share, 100), col(s.sm_used, 100)]
        ),
    }
    if s.rungs:  # only jobs that run their steps through corral.job's train_step name a rung
        names = ", ".join(f"{n}: {name}" for n, name in enumerate(s.rungs))
        rungs = [float(s.rung[i]) if s.rung[i] >= 0 else math.nan for i in keep]
        out["rung"] = chart(f"memory ladder rung ({names})", "rung", ["rung"], x, [rungs])
    return out


def log_tail(ctx: Context, who: Principal, job_id: str, offset: int | None) -> Data:
    """The job's output from ``offset`` (``None``: the last :data:`LOG_TAIL_BYTES`, the tail), as the API's log
    endpoint reads it: whole UTF-8 characters, ``complete`` once the job ended and all of it was read."""
    r = visible_job(ctx, who, job_id)
    c = ctx.controller
    _, size = c.read_log(job_id, 0, 0)
    if offset is None or offset > size:
        offset = max(0, size - LOG_TAIL_BYTES)
    data, size = c.read_log(job_id, offset, LOG_TAIL_BYTES + 3)
    ended = r.phase.is_terminal and r.process.phase is ProcessPhase.NONE
    cut = len(data) if ended and offset + len(data) >= size else utf8_cut(data[:LOG_TAIL_BYTES])
    data = data[:cut]
    return {
        "offset": offset,
        "next_offset": offset + len(data),
        "text": data.decode("utf-8", errors="replace"),
        "complete": ended and offset + len(data) >= size,
    }


# -- scheduler -----------------------------------------------------------------------------------------------------
def scheduler_page(ctx: Context, who: Principal, since: float) -> Data:
    if not who.admin:
        raise Forbidden("the scheduler page needs the admin's login")
    c = ctx.controller
    stats = c.stats.snapshot()
    phases = c.store.count_by_phase()
    with ctx.history.lock:
        points = list(ctx.history.scheduler)
    x: list[float] = []
    latency, rounds, decisions, preempt, resize, pending, running = [], [], [], [], [], [], []
    for (t0, a), (t1, b) in itertools.pairwise(points):
        if t1 <= since:
            continue
        n = b.rounds - a.rounds
        x.append(t1)
        latency.append((b.round_seconds - a.round_seconds) / n * 1000 if n else math.nan)
        rounds.append(n / (t1 - t0) if t1 > t0 else math.nan)
        made = sum(b.events.get(k, 0) - a.events.get(k, 0) for k in DECISIONS)
        decisions.append(made / n if n else math.nan)
        preempt.append(float(sum(b.events.get(k, 0) - a.events.get(k, 0) for k in ("preempted", "suspended"))))
        resize.append(float(b.events.get("resized", 0) - a.events.get("resized", 0)))
        pending.append(float(b.phases.get("pending", 0)))
        running.append(float(b.phases.get("running", 0)))
    buckets: list[list[Cell]] = []
    bounds = [f"≤ {b * 1000:g} ms" for b in ROUND_BUCKETS_S] + ["more"]
    for bound, n in zip(bounds, stats.round_bucket_counts, strict=True):
        buckets.append([bound, str(n)])
    mean = stats.round_seconds_sum / stats.rounds * 1000 if stats.rounds else 0.0
    return {
        "summary": {
            "policy": ctx.latest.get().policy,
            "rounds": str(stats.rounds),
            "mean round": f"{mean:.2f} ms",
            **{f"jobs {k}": str(v) for k, v in sorted(phases.items())},
        },
        "tables": {
            "buckets": table(["round latency", "rounds"], buckets),
            "events": table(["event", "count"], [[k, str(v)] for k, v in sorted(stats.events.items())], "no events"),
        },
        "charts": {
            "latency": chart("mean round latency (ms)", "ms", ["mean round"], x, [latency]),
            "rounds": chart("rounds per second", "/s", ["rounds"], x, [rounds]),
            "decisions": chart("decisions per round", "", ["decisions"], x, [decisions]),
            "changes": chart(
                "preemptions and resizes per sample", "", ["preemptions", "resizes"], x, [preempt, resize]
            ),
            "phases": chart("jobs per phase", "jobs", ["pending", "running"], x, [pending, running]),
        },
    }
