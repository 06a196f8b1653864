"""The scheduler's model of the machines the controller runs jobs on: one machine's GPUs (:func:`cluster_for`) or
several machines' (:func:`cluster_for_nodes`), as the engine's cluster, with the agents' GPU numbering."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from corral.core.cluster import Cluster, GpuType, NodeSpec
from corral.core.tenant import Tenant
from corral.live.agent.gpus import GpuInfo

if TYPE_CHECKING:
    pass


def cluster_for(gpus: Sequence[GpuInfo], tenants: Iterable[Tenant], name: str = "local") -> tuple[Cluster, list[int]]:
    """The scheduler's model of one machine: a node per GPU type (a node is homogeneous), in the order the
    agent numbers them. Returns the cluster and, for each engine GPU index, the agent's GPU index."""
    by_type: dict[str, list[GpuInfo]] = {}
    for g in gpus:
        by_type.setdefault(g.type_name, []).append(g)
    types: list[GpuType] = []
    nodes: list[NodeSpec] = []
    order: list[int] = []
    for type_name, group in by_type.items():
        types.append(GpuType(type_name, min(g.mem_mib for g in group)))
        node = name if len(by_type) == 1 else f"{name}-{type_name}"
        nodes.append(NodeSpec(node, type_name, len(group)))
        order.extend(g.index for g in group)
    return Cluster(name, tuple(types), tuple(nodes), tuple(tenants)), order


def cluster_for_nodes(
    nodes: Sequence[tuple[str, Sequence[GpuInfo]]], tenants: Iterable[Tenant], name: str = "ray"
) -> tuple[Cluster, list[int], dict[str, tuple[str, ...]]]:
    """The scheduler's model of several machines (:meth:`corral.live.nodes.Nodes.node_gpus`): each machine is a
    node (one per GPU type it has, named ``MACHINE-TYPE``, when it has several types). Returns the cluster, for
    each engine GPU index the agent's (global) GPU index, and for each machine the names of its engine nodes."""
    types: dict[str, int] = {}
    specs: list[NodeSpec] = []
    order: list[int] = []
    engine_nodes: dict[str, tuple[str, ...]] = {}
    for machine, gpus in nodes:
        by_type: dict[str, list[GpuInfo]] = {}
        for g in gpus:
            by_type.setdefault(g.type_name, []).append(g)
        names = []
        for type_name, group in by_type.items():
            mem = min(g.mem_mib for g in group)
            types[type_name] = min(mem, types.get(type_name, mem))
            node = machine if len(by_type) == 1 else f"{machine}-{type_name}"
            specs.append(NodeSpec(node, type_name, len(group)))
            order.extend(g.index for g in group)
            names.append(node)
        engine_nodes[machine] = tuple(names)
    gpu_types = tuple(GpuType(t, mem) for t, mem in types.items())
    return Cluster(name, gpu_types, tuple(specs), tuple(tenants)), order, engine_nodes
