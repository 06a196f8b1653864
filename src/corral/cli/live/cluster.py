"""Looking at the cluster and its tenants: ``corral tenants``, and ``corral cluster`` without a SPEC.

``corral cluster`` itself is a replay command (:mod:`corral.cli.main`: what a cluster spec expands to); without a
SPEC it calls :func:`show_live_cluster`: the running server's nodes, GPUs (who is on each), quotas and use.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import click
from rich.table import Table

from corral.cli import live
from corral.cli.live.common import _errors, _print_json, make_client, safe
from corral.cli.options import client_options, json_option

if TYPE_CHECKING:
    from corral.live.client import ClusterJson, TenantJson


@click.command()
@json_option
@client_options
def tenants(as_json: bool, **client: Any) -> None:
    """Each tenant's quota and what it holds."""
    with _errors():
        with make_client(**client) as api:
            found = api.tenants()
        if as_json:
            _print_json(found)
            return
        live.console.print(_tenant_table(found))


def _tenant_table(found: Sequence[TenantJson]) -> Table:
    table = Table(title="tenants")
    table.add_column("tenant")
    table.add_column("quota", justify="right")
    table.add_column("held (guaranteed)", justify="right")
    table.add_column("opportunistic", justify="right")
    table.add_column("running", justify="right")
    table.add_column("pending", justify="right")
    for t in found:
        table.add_row(
            safe(t["name"]),
            "none" if t["quota_gpus"] is None else str(t["quota_gpus"]),
            f"{t['guaranteed_gpus']:g}",
            f"{t['opportunistic_gpus']:g}",
            str(t["running"]),
            str(t["pending"]),
        )
    return table


def show_live_cluster(url: str | None, token: str | None, client_state_dir: str | None, as_json: bool = False) -> None:
    """``corral cluster`` without a SPEC: the running server's GPUs, who is on each, quotas and utilization."""
    with _errors():
        with make_client(url, token, client_state_dir) as api:
            snap = api.cluster()
            found = api.tenants()
        if as_json:
            _print_json({"cluster": snap, "tenants": found})
            return
        if len(snap["nodes"]) > 1 or any(n["state"] != "alive" for n in snap["nodes"]):
            live.console.print(_node_table(snap))
        live.console.print(_cluster_table(snap))
        live.console.print(_tenant_table(found))


def _node_table(snap: ClusterJson) -> Table:
    """The nodes, alive or lost, with the jobs on each (several machines: ``corral serve --ray``)."""
    on_node: dict[str, set[str]] = {}
    for g in snap["gpus"]:
        names = on_node.setdefault(g["node"], set())
        names.update(safe(j["job_id"]) for j in g["jobs"])
        if g["busy"] and not g["jobs"]:
            names.add("another tenant's")
    table = Table(title=f"{len(snap['nodes'])} nodes")
    table.add_column("node")
    table.add_column("state")
    table.add_column("GPUs", justify="right")
    table.add_column("jobs")
    for n in snap["nodes"]:
        state = "[bold red]lost[/]" if n["state"] == "lost" else "alive"
        table.add_row(safe(n["name"]), state, str(n["num_gpus"]), ", ".join(sorted(on_node.get(n["name"], ()))) or "-")
    return table


def _cluster_table(snap: ClusterJson) -> Table:
    stand_in = bool(snap["gpus"]) and all(g["stand_in"] for g in snap["gpus"])
    title = (
        f"{snap['num_gpus']} GPUs, {snap['allocated_gpus']:g} allocated | {snap['running']} running, "
        f"{snap['pending']} pending | policy {safe(snap['policy'])}"
    )
    if stand_in:
        title += "\n[bold yellow]STAND-IN GPUs: no real GPU, jobs run on the CPU[/]"
    table = Table(title=title)
    table.add_column("GPU", justify="right")
    table.add_column("node")
    table.add_column("type")
    table.add_column("memory", justify="right")
    table.add_column("allocated", justify="right")
    table.add_column("jobs: id (tenant, share)")
    table.add_column("busy", justify="right")
    table.add_column("mem used", justify="right")
    for g in snap["gpus"]:
        jobs_text = ", ".join(
            f"{safe(j['job_id'])} ({safe(j['tenant'])}, "
            f"{'opp ' if j['opportunistic'] else ''}{j['gpu_milli'] / 1000:g})"
            for j in g["jobs"]
        )
        if g["busy"] and not g["jobs"]:
            jobs_text = "busy (another tenant's)"  # with a tenant's token, others' jobs are not listed
        kind = f"[bold yellow]{safe(g['type_name'])}[/]" if g["stand_in"] else safe(g["type_name"])
        table.add_row(
            str(g["index"]),
            safe(g["node"]),
            kind,
            f"{g['mem_mib']:,} MiB",
            f"{g['allocated_milli'] / 1000:g}",
            jobs_text or "-",
            "-" if g["sm_util"] is None else f"{g['sm_util']:.0%}",
            "-" if g["mem_used_mib"] is None else f"{g['mem_used_mib']:,} MiB",
        )
    return table
