"""``corral``: replay traces through scheduling policies and compare them.

Commands:

- ``corral simulate``: one policy, one trace, one cluster; progress (jobs done of all, with an ETA: a bar on a
  terminal, a plain line every 5 s elsewhere, so that a log shows a long replay is alive), summary table, then
  the trace's notes
  and the jobs rejected as never runnable (count, the first few with their reasons); ``--out`` files
  (``--record-decisions`` adds ``decisions.log`` there, and is refused without ``--out``); nodes lost and back
  with ``--node-failures FILE`` or ``--node-failure-rate SPEC`` (:mod:`corral.sim.failures`); ``--out`` also
  gets ``report.html`` and its plots (:mod:`corral.sim.report_html`), unless ``--no-report``.
- ``corral compare``: several policies on the same trace and cluster, side by side; split into several tables
  when they do not fit side by side at the terminal's width, so that no metric name or value is cut. ``--out``
  gets a folder per policy, ``comparison.csv`` and ``comparison.json`` across them, and one ``report.html``.
- ``corral report DIR...``: ``report.html`` and its plots re-made from output folders (one, or several side by
  side, ``--out`` then naming where to write).
- ``corral policies``: one line per policy and the performance model's options; ``corral policies NAME``: that
  policy's options (from its config dataclass), one row each, the help wrapped rather than cut at 80 columns.
- ``corral cluster``: what a cluster spec (preset, ``NxG`` or file) expands to; without one, the live cluster.
- ``corral serve``, ``submit``, ``jobs``, ``job``, ``logs``, ``wait``, ``cancel``, ``tenants``: live mode
  (:mod:`corral.cli.live`).

Built on click (arguments, help) and rich (tables, progress). Errors that the user can fix are printed as one
``error:`` line and exit with status 2; anything else, an engine invariant broken (:class:`InvariantViolation`)
included, is a bug and keeps its traceback.
"""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar, get_args, get_origin

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from corral import __version__, compiled
from corral.cli.errors import user_errors
from corral.cli.options import client_options, json_option
from corral.core.cluster import Cluster
from corral.core.errors import ConfigError
from corral.core.job import JobPhase
from corral.core.options import build_config, config_fields, type_label
from corral.core.wording import duration, plural
from corral.policies.registry import make_policy, parse_policy_spec, policy_class, policy_names
from corral.sim.clusters import describe_cluster, describe_quotas, load_cluster, with_quotas
from corral.sim.metrics import SUMMARY_KEYS
from corral.sim.perf import PerfModel
from corral.sim.runner import SimulationResult, simulate
from corral.sim.traces import Trace
from corral.sim.workload import ALL_FORMATS, WorkloadSpec, build_trace

# Imported where used, not here (issue 20: a replay should not pay for what it does not use): live mode
# (corral.cli.live, loaded by _Cli when a live command is asked for), node failures (corral.sim.failures), the
# output files and the HTML report (corral.sim.report, corral.sim.report_html), the progress bar (rich.progress).
if TYPE_CHECKING:
    from corral.sim.failures import NodeEvent
    from corral.sim.report_html import Rendered

console = Console()
err_console = Console(stderr=True)

F = TypeVar("F", bound=Callable[..., Any])


def _parse_window(text: str | None) -> tuple[float | None, float | None]:
    if not text:
        return None, None
    start, sep, end = text.partition(":")
    if not sep:
        raise click.BadParameter("expected START:END in seconds (either side may be empty)", param_hint="--window")
    try:
        return (float(start) if start.strip() else None, float(end) if end.strip() else None)
    except ValueError:
        raise click.BadParameter(f"expected START:END in seconds, got {text!r}", param_hint="--window") from None


def _kv(text: str | None) -> dict[str, str]:
    if not text:
        return {}
    return parse_policy_spec("x:" + text)[1]


def workload_options(fn: F) -> F:
    """The options that say what to replay, shared by ``simulate`` and ``compare``."""
    options = [
        click.option("--trace", "trace_path", type=click.Path(dir_okay=False), help="Trace file to replay."),
        click.option("--format", "fmt", type=click.Choice(ALL_FORMATS), required=True, help="Trace format."),
        click.option(
            "--columns",
            help="csv format: map columns, e.g. id=jobid,submit=ts,duration=dur,gpus=n[,tenant=vc,model=m].",
        ),
        click.option(
            "--cluster",
            "cluster_spec",
            required=True,
            help="Preset (philly, openb, n32g4, ...), NxG[:TYPE], or a TOML file.",
        ),
        click.option("--seed", type=int, default=0, show_default=True, help="Seed for every random choice."),
        click.option(
            "--skip-invalid", is_flag=True, help="Skip malformed trace rows (and report how many) instead of stopping."
        ),
        click.option("--window", help="Keep jobs submitted in [START, END) seconds from the trace start (START:END)."),
        click.option("--tenants", help="Keep only these tenants (comma-separated)."),
        click.option("--min-duration", type=float, help="Drop jobs shorter than this many seconds."),
        click.option("--sample", type=float, help="Keep this fraction of jobs, drawn with --seed."),
        click.option("--scale-load", type=float, help="Compress inter-arrival times by this factor (>1 = busier)."),
        click.option("--limit", type=int, help="Replay only the first N jobs (after the other filters)."),
        click.option(
            "--assign-tenants",
            type=int,
            metavar="N",
            help="Give jobs of tenant 'default' (openb, tiresias) one of N tenants t0..t{N-1}, "
            "Zipf-weighted, drawn with --seed (after the filters above).",
        ),
        click.option(
            "--opportunistic",
            type=float,
            metavar="FRACTION",
            help="Make each guaranteed job opportunistic with this probability, drawn with --seed.",
        ),
        click.option(
            "--quotas",
            metavar="SPEC",
            help="Tenant GPU quotas on the cluster: philly-vc (scaled to fit), equal[:F] (GPUs x F split among "
            "the trace's tenants), NAME=GPUS,..., or none (the cluster's own).",
        ),
        click.option("--jobs", type=int, help="synthetic: number of jobs."),
        click.option(
            "--arrival",
            type=click.Choice(["poisson", "trace"]),
            default="poisson",
            show_default=True,
            help="synthetic: arrival process.",
        ),
        click.option(
            "--jobs-per-hour", type=float, help="synthetic: arrival rate (default: the fitted trace's, or 100)."
        ),
        click.option("--fit-to", help="synthetic: fit durations, GPU counts and tenants to FORMAT:PATH."),
        click.option(
            "--openb-pending",
            type=click.Choice(["drop", "wait"]),
            default="drop",
            show_default=True,
            help="openb: Pending pods never started in the trace; drop them, or keep them with their lifetime.",
        ),
        click.option(
            "--model-mix",
            help="Draw a model for each job without one: 'default' (Gavel's job types, uniform), "
            "'resnet50=2,vgg16=1', or 'none'. Default: 'default' when a chosen policy uses models, else none.",
        ),
        click.option(
            "--perf", help="Performance model options, e.g. spread_rate=0.7,restore_s=10 (see `corral policies`)."
        ),
        click.option(
            "--node-failures",
            "node_failures",
            type=click.Path(dir_okay=False),
            help="Nodes lost and back during the replay: a CSV file with columns time_s,node,event (lost or joined) "
            "and optionally reason; see docs/simulator.md. Jobs on a lost node restart elsewhere from their last "
            "checkpoint (--perf checkpoint_interval_s).",
        ),
        click.option(
            "--node-failure-rate",
            "node_failure_rate",
            metavar="SPEC",
            help="Nodes fail at random: mtbf_h=HOURS,repair_h=HOURS[,seed=N]: each node is lost after an "
            "exponential time of mean mtbf_h and back after one of mean repair_h (seed: --seed).",
        ),
        click.option(
            "--progress/--no-progress",
            default=True,
            show_default=True,
            help="Show the replay's progress: a bar on a terminal, else a line every 5 s.",
        ),
    ]
    for opt in reversed(options):
        fn = opt(fn)
    return fn


def _model_mix(text: str | None, policy_specs: Sequence[str]) -> str | None:
    """The mix to draw missing models from: the user's, else the default one when a policy reads models."""
    if text is not None:
        return None if text.strip().lower() == "none" else text
    needs = any(policy_class(parse_policy_spec(spec)[0]).needs_models for spec in policy_specs)
    return "default" if needs else None


def _workload(kw: dict[str, Any], policy_specs: Sequence[str] = ()) -> WorkloadSpec:
    start, end = _parse_window(kw["window"])
    tenants = tuple(t.strip() for t in kw["tenants"].split(",") if t.strip()) if kw["tenants"] else ()
    return WorkloadSpec(
        fmt=kw["fmt"],
        path=kw["trace_path"],
        columns=kw["columns"],
        skip_invalid=kw["skip_invalid"],
        seed=kw["seed"],
        openb_pending="wait" if kw["openb_pending"] == "wait" else "drop",
        jobs=kw["jobs"],
        arrival=kw["arrival"],
        jobs_per_hour=kw["jobs_per_hour"],
        fit_to=kw["fit_to"],
        tenants=tenants,
        start_s=start,
        end_s=end,
        min_duration_s=kw["min_duration"],
        sample=kw["sample"],
        scale_load=kw["scale_load"],
        limit=kw["limit"],
        assign_tenants=kw["assign_tenants"],
        opportunistic=kw["opportunistic"],
        model_mix=_model_mix(kw["model_mix"], policy_specs),
    )


def _errors() -> AbstractContextManager[None]:
    # The message is text, not markup: a "[...]" in it (a file's column list, an option's syntax) stays as is.
    return user_errors(err_console, lambda exc: escape(str(exc)))


NodeEventSource = Callable[[], Iterable[tuple[float, "NodeEvent"]]] | None


def _node_events(kw: dict[str, Any], trace: Trace, cluster: Cluster) -> NodeEventSource:
    """What ``--node-failures`` or ``--node-failure-rate`` asks for: a fresh stream of node events per replay."""
    path, rate_text = kw["node_failures"], kw["node_failure_rate"]
    if path is not None and rate_text is not None:
        raise ConfigError("give --node-failures FILE or --node-failure-rate SPEC, not both")
    if path is None and rate_text is None:
        return None
    from corral.core.events import NodeLost
    from corral.sim.failures import parse_failure_rate, random_node_failures, read_node_failures

    if path is not None:
        events = read_node_failures(path, cluster)
        lost = sum(1 for _, e in events if isinstance(e, NodeLost))
        trace.notes.append(
            f"node failures from {path}: {plural(lost, 'loss', 'losses')}, {plural(len(events) - lost, 'return')}"
        )
        return lambda: events
    if rate_text is not None:
        rate = parse_failure_rate(rate_text)
        names = [n.name for n in cluster.nodes]
        start = trace.jobs[0].submit_s if trace.jobs else 0.0
        seed = kw["seed"]
        trace.notes.append(
            f"node failures drawn for {plural(len(names), 'node')}: mean {rate.mtbf_h:g} h up, {rate.repair_h:g} h"
            f" down, seed {rate.seed if rate.seed is not None else seed}"
        )
        return lambda: random_node_failures(names, rate, start_s=start, seed=seed)
    return None


def _load(kw: dict[str, Any], policy_specs: Sequence[str]) -> tuple[Trace, Cluster, PerfModel, NodeEventSource]:
    trace = build_trace(_workload(kw, policy_specs))
    cluster = load_cluster(kw["cluster_spec"])
    if kw["quotas"] is not None:
        tenants = sorted({job.tenant for job in trace.jobs})
        cluster = with_quotas(cluster, kw["quotas"], tenants)
        # A note, like the trace's own treatments: printed after the table and kept in summary.json.
        trace.notes.append(describe_quotas(cluster, kw["quotas"], tenants))
    perf = build_config(PerfModel, _kv(kw["perf"]), "the perf model")
    failures = _node_events(kw, trace, cluster)
    if trace.skipped_total:
        reasons = ", ".join(f"{n} {why}" for why, n in sorted(trace.skipped.items()))
        err_console.print(f"skipped {plural(trace.skipped_total, 'row')}: {reasons}", highlight=False, markup=False)
    return trace, cluster, perf, failures


def _run(
    trace: Trace,
    cluster: Cluster,
    perf: PerfModel,
    policy_spec: str,
    seed: int,
    show: bool,
    record: bool,
    failures: NodeEventSource = None,
    *,
    outputs: bool = False,
) -> SimulationResult:
    """One replay; ``outputs`` keeps what an output folder's files and report need: the allocation and measured-use
    timelines (utilization.csv) and the queue's length over time."""
    policy = make_policy(policy_spec, seed=seed)
    events = failures() if failures is not None else None
    if not show:
        return simulate(
            trace,
            cluster,
            policy,
            perf=perf,
            record_decisions=record,
            node_events=events,
            record_queue=outputs,
            record_timelines=outputs,
        )
    if not err_console.is_terminal:
        # A bar off a terminal prints nothing until the end: a log would show nothing for minutes.
        return simulate(
            trace,
            cluster,
            policy,
            perf=perf,
            record_decisions=record,
            on_progress=_PlainProgress(policy.name, len(trace.jobs)),
            progress_every_s=_PLAIN_PROGRESS_EVERY_S,
            node_events=events,
            record_queue=outputs,
            record_timelines=outputs,
        )
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    with Progress(
        TextColumn(f"[bold]{escape(policy.name)}[/]"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("jobs done"),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=err_console,
        transient=True,
    ) as progress:
        task = progress.add_task("replay", total=len(trace.jobs))
        result = simulate(
            trace,
            cluster,
            policy,
            perf=perf,
            record_decisions=record,
            on_progress=lambda n: progress.update(task, completed=n),
            node_events=events,
            record_queue=outputs,
            record_timelines=outputs,
        )
    return result


# Off a terminal, a progress line this often: enough to see that a replay is alive, few enough for a log.
_PLAIN_PROGRESS_EVERY_S = 5.0


def _duration(seconds: float) -> str:
    """``42s``, ``3m 05s``, ``2h 07m``: an ETA or an elapsed time in a progress line."""
    return duration(seconds, sep=" ")


class _PlainProgress:
    """The replay's progress as plain lines on stderr (``fifo: 1,024 of 8,000 jobs done, 350/s, ETA 19s``), for
    a log or a pipe. Called by the replay's progress timer, then once at the end with every job done: a closing
    line is printed only after progress lines, so that a short replay prints none."""

    def __init__(self, name: str, total: int) -> None:
        self._name = name
        self._total = total
        self._started = time.monotonic()
        self._printed = False

    def __call__(self, done: int) -> None:
        elapsed = time.monotonic() - self._started
        if done >= self._total:
            if self._printed:
                self._line(f"all {self._total:,} jobs done in {_duration(elapsed)}")
            return
        rate = done / elapsed if elapsed > 0 else 0.0
        eta = _duration((self._total - done) / rate) if rate > 0 else "unknown"
        self._line(f"{done:,} of {self._total:,} jobs done, {rate:,.0f}/s, ETA {eta}")
        self._printed = True

    def _line(self, text: str) -> None:
        err_console.print(f"{self._name}: {text}", highlight=False, markup=False, soft_wrap=True)


# How many rejected jobs are shown on screen, each with its reason, before the rest are only counted.
_REJECTED_SHOWN = 5


def _rejected_lines(result: SimulationResult, to_file: bool) -> list[str]:
    """What to print about the jobs the replay rejected (jobs that can never run on this cluster), so that they
    are seen without opening ``jobs.csv``: their count, the first few with their reasons, how many more."""
    rejected = [j for j in result.jobs if j.phase is JobPhase.REJECTED]
    if not rejected:
        return []
    where = "every reason is in jobs.csv" if to_file else "--out writes every reason to jobs.csv"
    lines = [f"rejected {plural(len(rejected), 'job')} that can never run here ({where}):"]
    lines += [f"  {j.job_id}: {j.reason or 'no reason given'}" for j in rejected[:_REJECTED_SHOWN]]
    if len(rejected) > _REJECTED_SHOWN:
        lines.append(f"  and {len(rejected) - _REJECTED_SHOWN:,} more")
    return lines


def _print_rejected(results: Sequence[SimulationResult], labels: Sequence[str], to_file: bool) -> None:
    """The rejected jobs of each replay; once for all when every policy rejected the same jobs for the same
    reasons (admission usually depends on the cluster alone)."""
    if not any(r.summary.get("jobs_rejected") for r in results):
        return  # the summary counted them: no pass over every job of every replay to find none (issue 20)
    seen = [[(j.job_id, j.reason) for j in r.jobs if j.phase is JobPhase.REJECTED] for r in results]
    shown = [(results[0], "")] if all(s == seen[0] for s in seen) else list(zip(results, labels, strict=True))
    for result, label in shown:
        for i, line in enumerate(_rejected_lines(result, to_file)):
            # Job ids and reasons are text, not markup: a "[...]" in them is shown as is.
            text = f"{label}: {line}" if label and not i else line
            err_console.print(text, highlight=False, markup=False, soft_wrap=True)


def _fmt(key: str, value: Any) -> str:
    if isinstance(value, float):
        if key.endswith("_s"):
            return f"{value:,.1f}"
        return f"{value:.4f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


# Where a policy's name is longer than its values and the policies do not fit side by side, its column is this
# wide and the name folds in its header.
_FOLDED_HEADER = 12


def _compare_tables(title: str, specs: Sequence[str], results: Sequence[SimulationResult], width: int) -> list[Table]:
    """The metrics of each policy, side by side: one table when they fit in ``width``, else as many tables as it
    takes, each with as many policy columns as fit. The metric names and the values are never cut (a rich table
    too wide for the terminal shrinks every column and cuts them with an ellipsis); long policy names fold."""
    metrics = [*SUMMARY_KEYS, "wall time (s)"]
    columns = [[_fmt(key, r.summary[key]) for key in SUMMARY_KEYS] + [f"{r.wall_s:.2f}"] for r in results]
    metric_w = max(map(len, metrics))
    values_w = [max(map(len, column)) for column in columns]

    def fits(widths: Sequence[int]) -> bool:
        # Each column takes its text plus 3 (a space each side, its left border); then the right border.
        return metric_w + 3 + sum(w + 3 for w in widths) + 1 <= width

    widths = [max(v, len(spec)) for v, spec in zip(values_w, specs, strict=True)]
    if not fits(widths):
        widths = [max(v, min(len(spec), _FOLDED_HEADER)) for v, spec in zip(values_w, specs, strict=True)]
    groups: list[list[int]] = []
    for i, w in enumerate(widths):
        if groups and fits([widths[j] for j in groups[-1]] + [w]):
            groups[-1].append(i)
        else:
            groups.append([i])
    tables = []
    for group in groups:
        part = "" if len(groups) == 1 else f", policies {group[0] + 1}-{group[-1] + 1} of {len(specs)}"
        table = Table(title=title + part)
        table.add_column("metric", no_wrap=True, min_width=metric_w)
        for i in group:
            table.add_column(escape(specs[i]), justify="right", overflow="fold", width=widths[i])
        for row, key in enumerate(metrics):
            table.add_row(key, *(columns[i][row] for i in group))
        tables.append(table)
    return tables


def _out_options(fn: F) -> F:
    """``--overwrite`` and ``--report/--no-report``, which ``simulate`` and ``compare`` take with ``--out``."""
    fn = click.option(
        "--report/--no-report",
        default=True,
        show_default=True,
        help="With --out, also write report.html and its plots there (plots need matplotlib: corral[report]).",
    )(fn)
    return click.option(
        "--overwrite", is_flag=True, help="Let --out name a folder that is not empty: corral's files there go first."
    )(fn)


# The live commands of corral.cli.live, by name: loaded only when one of them is asked for (or for --help), so that
# a replay imports no live-mode module (issue 20). tests/sim/test_replay_imports.py holds this list to LIVE_COMMANDS.
LIVE_COMMAND_NAMES = (
    "serve",
    "submit",
    "jobs",
    "job",
    "logs",
    "events",
    "wait",
    "cancel",
    "tenants",
    "export-trace",
    "whatif",
)


class _Cli(click.Group):
    """corral's command group: the replay commands defined here, the live ones loaded from corral.cli.live on demand."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *LIVE_COMMAND_NAMES})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in LIVE_COMMAND_NAMES and cmd_name not in self.commands:
            from corral.cli.live import LIVE_COMMANDS

            for command in LIVE_COMMANDS:
                self.add_command(command)
        return super().get_command(ctx, cmd_name)


@click.group(cls=_Cli, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(
    __version__, prog_name="corral", message="%(prog)s %(version)s" + (" (compiled core)" if compiled() else "")
)
def cli() -> None:
    """corral: a GPU cluster scheduler. Replay real traces through scheduling policies."""


@cli.command()
@workload_options
@click.option(
    "--policy",
    "policy_spec",
    default="fifo",
    show_default=True,
    help="Policy, optionally with options: NAME[:key=value,...].",
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False),
    help="Write summary.json, jobs.csv, tenants.csv, utilization.csv here.",
)
@click.option(
    "--record-decisions", is_flag=True, help="Also write every decision to OUT/decisions.log (needs --out OUT)."
)
@_out_options
def simulate_cmd(
    policy_spec: str, out_dir: str | None, record_decisions: bool, overwrite: bool, report: bool, **kw: Any
) -> None:
    """Replay a trace on a cluster under one policy.

    Nodes can fail during the replay (--node-failures FILE, or --node-failure-rate mtbf_h=H,repair_h=H): the jobs
    on a lost node restart elsewhere from their last checkpoint, and the summary counts node_failures,
    jobs_requeued_by_failures, lost_work_gpu_h and down_gpu_h."""
    if record_decisions and out_dir is None:
        # The log goes only to OUT/decisions.log: without --out it would be recorded (slowly) and then dropped.
        raise click.UsageError("--record-decisions needs --out OUT: the decisions are written to OUT/decisions.log")
    with _errors():
        if out_dir is not None:
            from corral.sim.report import prepare_out

            prepare_out(out_dir, overwrite=overwrite)
        trace, cluster, perf, failures = _load(kw, [policy_spec])
        result = _run(
            trace,
            cluster,
            perf,
            policy_spec,
            kw["seed"],
            kw["progress"],
            record_decisions,
            failures,
            outputs=out_dir is not None,
        )
        table = Table(
            title=f"{plural(len(trace), 'job')} on {cluster.name} ({plural(result.num_gpus, 'GPU')})",
            caption=result.policy,
        )
        table.add_column("metric")
        table.add_column("value", justify="right")
        for key in SUMMARY_KEYS:
            table.add_row(key, _fmt(key, result.summary[key]))
        table.add_row("wall time (s)", f"{result.wall_s:.2f}")
        console.print(table)
        for note in trace.notes:
            err_console.print(f"note: {note}", highlight=False, markup=False)  # a cell quoted in it may hold "[/x]"
        _print_rejected([result], [policy_spec], to_file=out_dir is not None)
        if out_dir:
            from corral.sim.report import write_results

            paths = [*write_results(result, out_dir), _manifest(out_dir, result.policy, cluster.name, kw)]
            if report:
                paths += _report([out_dir], out_dir).paths
            err_console.print(f"wrote {', '.join(p.name for p in paths)} to {out_dir}", highlight=False)
    _replay_done()


simulate_cmd.name = "simulate"


def _manifest(out: str | Path, policy: str, cluster: str, kw: dict[str, Any]) -> Path:
    """``manifest.json`` for a run: its inputs are the files the options named (a preset is named, not hashed)."""
    fit_to = kw.get("fit_to")
    inputs = {
        "trace": kw.get("trace_path"),
        "cluster": kw.get("cluster_spec"),
        "node_failures": kw.get("node_failures"),
        "fit_to": fit_to.partition(":")[2] if fit_to else None,
    }
    from corral.sim.report import write_manifest

    return write_manifest(out, policy=policy, cluster=cluster, seed=kw["seed"], inputs=inputs)


def _report(dirs: Sequence[str], out_dir: str) -> Rendered:
    """``report.html`` and its plots for the runs in ``dirs``, in ``out_dir``; a note when there are no plots."""
    from corral.sim.report_html import report_folders

    rendered = report_folders(dirs, out_dir)
    if rendered.missing is not None:
        err_console.print(f"note: report.html has no plots: {rendered.missing}", highlight=False, markup=False)
    return rendered


def _slug(spec: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.=-]+", "_", spec).strip("_")


@cli.command()
@workload_options
@click.option(
    "--policy", "policies", multiple=True, required=True, help="A policy to compare (repeat): NAME[:key=value,...]."
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False),
    help="Write each policy's results to OUT/<policy>/, and comparison.csv, comparison.json and report.html to OUT.",
)
@_out_options
def compare(policies: Sequence[str], out_dir: str | None, overwrite: bool, report: bool, **kw: Any) -> None:
    """Replay one trace under several policies and print them side by side."""
    with _errors():
        if out_dir is not None:
            from corral.sim.report import prepare_out

            prepare_out(out_dir, overwrite=overwrite, per_policy=True)
        trace, cluster, perf, failures = _load(kw, policies)
        outputs = out_dir is not None
        results = [
            _run(trace, cluster, perf, spec, kw["seed"], kw["progress"], False, failures, outputs=outputs)
            for spec in policies
        ]
        title = f"{plural(len(trace), 'job')} on {cluster.name} ({plural(results[0].num_gpus, 'GPU')})"
        for table in _compare_tables(title, policies, results, console.width):
            console.print(table)
        for note in trace.notes:
            err_console.print(f"note: {note}", highlight=False, markup=False)  # a cell quoted in it may hold "[/x]"
        _print_rejected(results, policies, to_file=out_dir is not None)
        if out_dir:
            from corral.sim.report import summary_record, write_comparison, write_results

            runs = []
            for spec, result in zip(policies, results, strict=True):
                folder = Path(out_dir) / _slug(spec)
                write_results(result, folder)
                _manifest(folder, result.policy, cluster.name, kw)
                runs.append((spec, folder.name, summary_record(result)))
            paths = write_comparison(out_dir, runs)
            if report:
                paths += _report([out_dir], out_dir).paths
            err_console.print(
                f"wrote results to {out_dir}/<policy>/, and {', '.join(p.name for p in paths)} to {out_dir}",
                highlight=False,
            )
    _replay_done()


@cli.command()
@click.argument("dirs", nargs=-1, required=True, type=click.Path())
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False),
    help="Where to write report.html and the plots (default: DIR, when one is given; needed for several).",
)
def report(dirs: Sequence[str], out_dir: str | None) -> None:
    """Re-make report.html and its plots (PNG) from output folders of `corral simulate --out` or `corral compare
    --out`: one folder, or several side by side (before and after a change), each run labelled by its folder."""
    if out_dir is None:
        if len(dirs) > 1:
            raise click.UsageError("--out OUT is needed with several folders: the report of them all goes to OUT")
        out_dir = dirs[0]
    with _errors():
        rendered = _report(dirs, out_dir)
        err_console.print(f"wrote {', '.join(p.name for p in rendered.paths)} to {out_dir}", highlight=False)


@cli.command()
@click.argument("name", required=False)
def policies(name: str | None) -> None:
    """List the policies (one line each) and the performance model's options; with NAME, that policy's options."""
    with _errors():
        if name is not None:
            _print_policy(name)
            return
        table = Table(title="policies (use as --policy NAME[:option=value,...])")
        table.add_column("policy", style="bold", no_wrap=True)
        table.add_column("what it does")
        for policy_name in policy_names():
            table.add_row(policy_name, escape(policy_class(policy_name).summary))
        console.print(table)
        console.print("`corral policies NAME` lists a policy's options.", highlight=False, markup=False)
        console.print(_options_table("performance model (use as --perf option=value,...)", PerfModel))


def _print_policy(name: str) -> None:
    cls = policy_class(name)  # an unknown name is a ConfigError that lists the known ones
    console.print(f"[bold]{escape(name)}[/]: {escape(cls.summary)}", highlight=False)
    if not config_fields(cls.Config):
        console.print("no options", highlight=False)
        return
    console.print(_options_table(f"options (use as --policy {name}:option=value,...)", cls.Config))


def _options_table(title: str, config_cls: type[Any]) -> Table:
    """One row per option of a config dataclass: its name, what it takes (type or allowed values, and default),
    what it does. Three columns, not five, so that at 80 columns none is squeezed until words break: the name is
    never cut, the values wrap between values, the help wraps and takes the width that is left."""
    table = Table(title=escape(title), show_lines=True)
    table.add_column("option", style="bold", no_wrap=True)
    table.add_column("takes (default)", overflow="fold", ratio=1, min_width=14)
    table.add_column("what it does", overflow="fold", ratio=2)
    for fname, tp, default, help_ in config_fields(config_cls):
        takes = f"{_option_takes(tp)}\ndefault: {_option_value(default)}"
        table.add_row(fname, escape(takes), escape(help_))
    return table


def _option_takes(tp: Any) -> str:
    """What an option's value may be, as ``policies NAME`` shows it: a type, or the values allowed."""
    if isinstance(tp, type) and issubclass(tp, Enum):
        return "one of: " + ", ".join(str(m.value) for m in tp)
    if get_origin(tp) is Literal:
        return "one of: " + ", ".join(map(str, get_args(tp)))
    if tp is bool:
        return "true or false"
    if get_origin(tp) is tuple:
        return f"{type_label(get_args(tp)[0])}s, /-separated"
    if type(None) in get_args(tp):
        return f"{type_label(tp)} or none"
    return type_label(tp)


def _option_value(value: Any) -> str:
    """A default as it would be typed in an option: ``true``, ``none``, ``1/2/4``, an enum's value."""
    if isinstance(value, Enum):
        return str(value.value)
    if isinstance(value, bool):
        return str(value).lower()
    if value is None:
        return "none"
    if isinstance(value, tuple):
        return "/".join(_option_value(v) for v in value)
    return str(value)


@cli.command()
@click.argument("spec", required=False)
@json_option
@client_options
def cluster(spec: str | None, as_json: bool, **client: Any) -> None:
    """Show what a cluster spec (preset, NxG[:TYPE] or TOML file) contains; without SPEC, the running server's
    cluster (GPUs, who is on each, tenants' quotas and use)."""
    if spec is None:
        from corral.cli.live import show_live_cluster

        show_live_cluster(as_json=as_json, **client)
        return
    with _errors():
        c = load_cluster(spec)
        table = Table(title=f"cluster {c.name}")
        table.add_column("")
        table.add_column("")
        for key, value in describe_cluster(c):
            table.add_row(key, value)
        console.print(table)


# A replay command ends holding a whole trace's jobs, states and runs. Freeing them one by one as the interpreter
# ends took 0.2 s after full Philly and seconds after a million jobs (issue 20), for nothing: the process is over.
# simulate and compare set this once their output is written; main() then ends the process without that teardown
# (as mypy does), after flushing the output. Commands that start servers, threads or Ray never set it: they keep
# the interpreter's normal exit, atexit functions included.
_exit_without_teardown = False


def _replay_done() -> None:
    global _exit_without_teardown
    _exit_without_teardown = True


def main() -> None:
    try:
        cli(prog_name="corral")
    except SystemExit as e:
        if not _exit_without_teardown or e.code not in (0, None):
            raise
    if _exit_without_teardown:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


if __name__ == "__main__":
    main()
