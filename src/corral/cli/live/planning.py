"""Deciding on a policy: ``corral export-trace``, ``corral whatif`` and ``corral whatif accuracy``.

``export-trace`` writes the jobs that ran here as a trace (and the cluster as a cluster file) for replays;
``whatif --policy`` forecasts the current queue under other policies, and with ``--out`` replays this cluster's
history under them (``corral compare``); ``whatif accuracy`` says how good the server's start-time estimates
have been.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.table import Table

from corral.cli import live
from corral.cli.live.common import _errors, _print_json, _when, make_client, safe, visible
from corral.cli.options import client_options, json_option
from corral.core.errors import ConfigError
from corral.core.wording import duration

if TYPE_CHECKING:
    from corral.live.client import WhatifJson


@click.command("export-trace")
@click.option("--since", help="Jobs submitted since then: a time ago (7d, 12h, 30m) or a date (2026-11-20[T08:00]).")
@click.option(
    "--out", "out_path", required=True, type=click.Path(dir_okay=False), help="The trace to write (CSV; '-': stdout)."
)
@click.option(
    "--cluster-out",
    type=click.Path(dir_okay=False),
    help="Also write the cluster (GPUs, nodes, tenants, quotas) as a cluster file for --cluster.",
)
@click.option("--overwrite", is_flag=True, help="Replace files that exist.")
@client_options
def export_trace(since: str | None, out_path: str, cluster_out: str | None, overwrite: bool, **client: Any) -> None:
    """Write the jobs that ran here as a trace (and the cluster as a cluster file), for what-if replays:

    \b
    corral export-trace --since 7d --out week.csv --cluster-out here.toml
    corral compare --format csv --trace week.csv --cluster here.toml --policy fifo --policy tiresias --policy antman

    A row's duration is the time the job held GPUs here; jobs still pending or running are left out (docs/live.md,
    "This cluster's history as a trace"). With a tenant's token, that tenant's jobs only."""
    from corral.live.export import cluster_toml, parse_since, trace_csv, trace_rows

    with _errors():
        since_s = None
        if since is not None:
            try:
                since_s = parse_since(since, time.time())
            except ValueError as e:
                raise ConfigError(str(e)) from None
        targets = [t for t in (out_path, cluster_out) if t is not None and t != "-"]
        for target in targets:
            if Path(target).exists() and not overwrite:
                raise ConfigError(f"{target} exists; pass --overwrite to replace it")
        with make_client(**client) as api:
            export = trace_rows(api.iter_jobs(), since_s=since_s)
            cluster_text = cluster_toml(api.cluster(), api.tenants()) if cluster_out else None
        text = trace_csv(export)
        if out_path == "-":
            click.echo(text, nl=False)
        else:
            Path(out_path).write_text(text)
        if cluster_out is not None and cluster_text is not None:
            Path(cluster_out).write_text(cluster_text)
        left = ", ".join(f"{n} {why}" for why, n in sorted(export.left_out.items())) or "none"
        origin = "" if export.origin_s is None else f"; submit_s counts from {_when(export.origin_s)} (local time)"
        where = "stdout" if out_path == "-" else out_path
        click.echo(f"{len(export.rows)} jobs written to {visible(where)}{origin}; left out: {visible(left)}", err=True)


@click.group(invoke_without_command=True)
@click.option("--policy", "policies", multiple=True, help="A policy to try (repeat): NAME[:key=value,...].")
@click.option(
    "--current",
    help="The server's own policy as NAME[:key=value,...] (default: its name, with default options).",
)
@click.option("--since", default="7d", show_default=True, help="The history to replay, as for export-trace.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), help="Where to write it all.")
@click.option("--overwrite", is_flag=True, help="Let --out name a folder that is not empty (corral's files go).")
@click.option("--progress/--no-progress", default=True, help="Show the replays' progress.")
@client_options
@click.pass_context
def whatif(
    ctx: click.Context,
    /,
    policies: tuple[str, ...],
    current: str | None,
    since: str,
    out_dir: str | None,
    overwrite: bool,
    progress: bool,
    **client: Any,
) -> None:
    """What other policies would do with this cluster's queue, and would have done with its history.

    For each --policy: the current queue forecast under it and under the server's policy, from one snapshot: per
    tenant, the median wait and how many jobs would start earlier or later if the server switched now. With
    --out, also export-trace, then compare the server's policy with each --policy on that history; writes
    trace.csv and cluster.toml (the inputs), the comparison and report.html to --out.

    `corral whatif accuracy`: how good the server's start-time estimates have been."""
    from corral.live.export import cluster_toml, parse_since, trace_csv, trace_rows
    from corral.sim.report import prepare_out

    if ctx.invoked_subcommand is not None:
        return  # `corral whatif accuracy`
    with _errors():
        if not policies:
            raise ConfigError("corral whatif needs --policy NAME (one or more), or a subcommand (accuracy)")
        with make_client(**client) as api:
            for policy in policies:
                live.console.print(_queue_table(api.whatif_queue(policy)))
        if out_dir is None:
            return
        try:
            since_s = parse_since(since, time.time())
        except ValueError as e:
            raise ConfigError(str(e)) from None
        out = prepare_out(out_dir, overwrite=overwrite, per_policy=True)
        with make_client(**client) as api:
            export = trace_rows(api.iter_jobs(), since_s=since_s)
            cluster = api.cluster()
            found = cluster_toml(cluster, api.tenants())
        if not export.rows:
            raise ConfigError(f"no job ran and ended here since {_when(since_s)}: nothing to replay")
        (out / "trace.csv").write_text(trace_csv(export))
        (out / "cluster.toml").write_text(found)
        mine = current or str(cluster["policy"]).split("(", 1)[0]
        click.echo(
            f"{len(export.rows)} jobs since {_when(since_s)}; replaying them under {mine} (this server's)", err=True
        )
        root = ctx.find_root()
        compare = root.command.get_command(root, "compare") if isinstance(root.command, click.Group) else None
        assert compare is not None, "corral's command group has a compare command"
        ctx.invoke(
            compare,
            policies=(mine, *(p for p in policies if p != mine)),
            out_dir=str(out),
            overwrite=True,  # only this command's own inputs are there (prepare_out cleared the rest)
            fmt="csv",
            trace_path=str(out / "trace.csv"),
            cluster_spec=str(out / "cluster.toml"),
            progress=progress,
        )


def _queue_table(found: WhatifJson) -> Table:
    """``corral whatif --policy``'s table: the current queue's waits under the server's policy and another."""

    def wait(x: float | None) -> str:
        return "-" if x is None else duration(max(0.0, x))

    now, other = safe(found["policy"].split("(", 1)[0]), safe(found["other"].split("(", 1)[0])
    table = Table(title=f"the current queue under {now} (this server's) and under {other}")
    for col in ("tenant", "pending", f"median wait, {now}", f"median wait, {other}", "earlier", "later"):
        table.add_column(col, justify="left" if col == "tenant" else "right")
    for row in found["tenants"]:
        table.add_row(
            "all" if row["tenant"] is None else safe(row["tenant"]),
            str(row["pending"]),
            wait(row["wait_now_s"]),
            wait(row["wait_other_s"]),
            str(row["earlier"]),
            str(row["later"]),
        )
    table.caption = (
        f"starts forecast at {_when(found['made_s'])} ({found['took_s'] * 1000:.0f} ms), assuming no new "
        "submissions; earlier/later: jobs whose start would move by more than 1 s"
    )
    return table


@whatif.command("accuracy")
@json_option
@client_options
def whatif_accuracy(as_json: bool, **client: Any) -> None:
    """How far the server's estimated start times were from the real starts (admin token): each job's first
    estimate and its latest before it started (docs/live.md, "Estimated start times")."""
    with _errors():
        with make_client(**client) as api:
            found = api.estimate_accuracy()
            latest = api.estimates()
        if as_json:
            _print_json({"accuracy": found, "latest": latest})
            return
        if not found["jobs"]:
            live.console.print("no estimated job has started yet: nothing to judge")
            return

        def secs(x: float | None) -> str:
            return "-" if x is None else duration(abs(x)) if x >= 0 else f"-{duration(-x)}"

        table = Table(title=f"start-time estimates against real starts: {found['jobs']:,} jobs")
        for col in ("estimate", "median |error|", "p90 |error|"):
            table.add_column(col, justify="left" if col == "estimate" else "right")
        table.add_row("first (each job's first)", secs(found["first_median_s"]), secs(found["first_p90_s"]))
        table.add_row("latest (before it started)", secs(found["last_median_s"]), secs(found["last_p90_s"]))
        within = "-" if found["within"] is None else f"{found['within']:.0%}"
        bias = found["last_bias_s"]
        side = "late" if bias is not None and bias >= 0 else "early"
        late = "" if bias is None or abs(bias) < 0.5 else f"; latest estimates {side} by {secs(abs(bias))} on average"
        table.caption = f"real start within the latest estimate's range: {within}{late}"
        live.console.print(table)
        if latest["made_s"] is not None:
            every = f"every {duration(latest['interval_s'])}" if latest["interval_s"] else "on request only"
            live.console.print(
                f"[dim]last forecast {duration(time.time() - latest['made_s'])} ago, took "
                f"{(latest['took_s'] or 0) * 1000:.1f} ms ({every})[/]"
            )
