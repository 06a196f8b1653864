"""``corral``: replay traces through scheduling policies and compare them.

Commands:

- ``corral simulate``: one policy, one trace, one cluster; progress bar, summary table, then the trace's notes
  and the jobs rejected as never runnable (count, the first few with their reasons); ``--out`` files
  (``--record-decisions`` adds ``decisions.log`` there, and is refused without ``--out``); nodes lost and back
  with ``--node-failures FILE`` or ``--node-failure-rate SPEC`` (:mod:`corral.sim.failures`).
- ``corral compare``: several policies on the same trace and cluster, side by side.
- ``corral policies``: every policy and its options (from the policies' config dataclasses).
- ``corral cluster``: what a cluster spec (preset, ``NxG`` or file) expands to; without one, the live cluster.
- ``corral serve``, ``submit``, ``jobs``, ``job``, ``logs``, ``wait``, ``cancel``, ``tenants``: live mode
  (:mod:`corral.cli.live`).

Built on click (arguments, help) and rich (tables, progress). Errors that the user can fix are printed as one
``error:`` line and exit with status 2; anything else, an engine invariant broken (:class:`InvariantViolation`)
included, is a bug and keeps its traceback.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from corral import __version__
from corral.cli.errors import user_errors
from corral.cli.live import LIVE_COMMANDS, client_options, json_option, show_live_cluster
from corral.core.cluster import Cluster
from corral.core.errors import ConfigError
from corral.core.events import NodeLost
from corral.core.job import JobPhase
from corral.core.options import build_config, config_fields, type_label
from corral.core.wording import plural
from corral.policies.registry import make_policy, parse_policy_spec, policy_class, policy_names
from corral.sim.clusters import describe_cluster, describe_quotas, load_cluster, with_quotas
from corral.sim.failures import NodeEvent, parse_failure_rate, random_node_failures, read_node_failures
from corral.sim.metrics import SUMMARY_KEYS
from corral.sim.perf import PerfModel
from corral.sim.report import write_results
from corral.sim.runner import SimulationResult, simulate
from corral.sim.traces import Trace
from corral.sim.workload import ALL_FORMATS, WorkloadSpec, build_trace

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
            "--progress/--no-progress", default=None, help="Show a progress bar (default: when on a terminal)."
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


NodeEventSource = Callable[[], Iterable[tuple[float, NodeEvent]]] | None


def _node_events(kw: dict[str, Any], trace: Trace, cluster: Cluster) -> NodeEventSource:
    """What ``--node-failures`` or ``--node-failure-rate`` asks for: a fresh stream of node events per replay."""
    path, rate_text = kw["node_failures"], kw["node_failure_rate"]
    if path is not None and rate_text is not None:
        raise ConfigError("give --node-failures FILE or --node-failure-rate SPEC, not both")
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
) -> SimulationResult:
    policy = make_policy(policy_spec, seed=seed)
    events = failures() if failures is not None else None
    if not show:
        return simulate(trace, cluster, policy, perf=perf, record_decisions=record, node_events=events)
    with Progress(
        TextColumn(f"[bold]{policy.name}[/]"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("jobs submitted"),
        TimeElapsedColumn(),
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
        )
    return result


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


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(__version__, prog_name="corral")
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
def simulate_cmd(policy_spec: str, out_dir: str | None, record_decisions: bool, **kw: Any) -> None:
    """Replay a trace on a cluster under one policy.

    Nodes can fail during the replay (--node-failures FILE, or --node-failure-rate mtbf_h=H,repair_h=H): the jobs
    on a lost node restart elsewhere from their last checkpoint, and the summary counts node_failures,
    jobs_requeued_by_failures, lost_work_gpu_h and down_gpu_h."""
    if record_decisions and out_dir is None:
        # The log goes only to OUT/decisions.log: without --out it would be recorded (slowly) and then dropped.
        raise click.UsageError("--record-decisions needs --out OUT: the decisions are written to OUT/decisions.log")
    with _errors():
        trace, cluster, perf, failures = _load(kw, [policy_spec])
        show = kw["progress"] if kw["progress"] is not None else err_console.is_terminal
        result = _run(trace, cluster, perf, policy_spec, kw["seed"], show, record_decisions, failures)
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
            paths = write_results(result, out_dir)
            err_console.print(f"wrote {', '.join(p.name for p in paths)} to {out_dir}", highlight=False)


simulate_cmd.name = "simulate"


def _slug(spec: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.=-]+", "_", spec).strip("_")


@cli.command()
@workload_options
@click.option(
    "--policy", "policies", multiple=True, required=True, help="A policy to compare (repeat): NAME[:key=value,...]."
)
@click.option(
    "--out", "out_dir", type=click.Path(file_okay=False), help="Write each policy's results to OUT/<policy>/."
)
def compare(policies: Sequence[str], out_dir: str | None, **kw: Any) -> None:
    """Replay one trace under several policies and print them side by side."""
    with _errors():
        trace, cluster, perf, failures = _load(kw, policies)
        show = kw["progress"] if kw["progress"] is not None else err_console.is_terminal
        results = [_run(trace, cluster, perf, spec, kw["seed"], show, False, failures) for spec in policies]
        table = Table(title=f"{plural(len(trace), 'job')} on {cluster.name} ({plural(results[0].num_gpus, 'GPU')})")
        table.add_column("metric")
        for spec in policies:
            table.add_column(spec, justify="right", overflow="fold")
        for key in SUMMARY_KEYS:
            table.add_row(key, *(_fmt(key, r.summary[key]) for r in results))
        table.add_row("wall time (s)", *(f"{r.wall_s:.2f}" for r in results))
        console.print(table)
        for note in trace.notes:
            err_console.print(f"note: {note}", highlight=False, markup=False)  # a cell quoted in it may hold "[/x]"
        _print_rejected(results, policies, to_file=out_dir is not None)
        if out_dir:
            for spec, result in zip(policies, results, strict=True):
                write_results(result, Path(out_dir) / _slug(spec))
            err_console.print(f"wrote results to {out_dir}/<policy>/", highlight=False)


@cli.command()
def policies() -> None:
    """List the policies and their options (and the performance model's)."""
    with _errors():
        table = Table(title="policies (use as --policy NAME[:option=value,...])", show_lines=True)
        table.add_column("policy", style="bold")
        table.add_column("what it does")
        table.add_column("options")
        for name in policy_names():
            cls = policy_class(name)
            opts = "\n".join(
                f"{fname} ({type_label(tp)}, default {getattr(default, 'value', default)}): {help_}"
                for fname, tp, default, help_ in config_fields(cls.Config)
            )
            table.add_row(name, cls.summary, opts or "-")
        console.print(table)
        perf = Table(title="performance model (use as --perf option=value,...)")
        perf.add_column("option", style="bold")
        perf.add_column("default", justify="right")
        perf.add_column("meaning")
        for fname, _tp, default, help_ in config_fields(PerfModel):
            perf.add_row(fname, str(default), help_)
        console.print(perf)


@cli.command()
@click.argument("spec", required=False)
@json_option
@client_options
def cluster(spec: str | None, as_json: bool, **client: Any) -> None:
    """Show what a cluster spec (preset, NxG[:TYPE] or TOML file) contains; without SPEC, the running server's
    cluster (GPUs, who is on each, tenants' quotas and use)."""
    if spec is None:
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


for _command in LIVE_COMMANDS:
    cli.add_command(_command)


def main() -> None:
    cli(prog_name="corral")


if __name__ == "__main__":
    main()
