"""The hardware: GPU types, nodes, and the topology tree that placements are judged against.

A :class:`Cluster` is a declarative description (what a cluster file or preset says). A :class:`Topology` is
the same cluster flattened into integer-indexed arrays for the engine's hot path: GPUs are numbered 0..G-1,
node by node, so "the GPUs of node n" is a contiguous range.

The tree has the levels HiveD (OSDI'20 §3) and topology-aware placement work use::

    GPU < PCIe switch (or CPU socket) < node < rack < cluster

A node is homogeneous in GPU type; a cluster may mix types (Philly's 12 GB and 24 GB machines, openb's seven
models). ``GpuType.speed`` is relative throughput (1.0 = the reference GPU a trace's durations refer to).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import IntEnum

from corral.core.errors import ClusterSpecError
from corral.core.tenant import Tenant


class TopologyLevel(IntEnum):
    """The smallest subtree that holds a set of GPUs: a placement's locality, best (GPU) to worst (CLUSTER)."""

    GPU = 0
    SWITCH = 1
    NODE = 2
    RACK = 3
    CLUSTER = 4


@dataclass(frozen=True, slots=True)
class GpuType:
    name: str
    mem_mib: int
    speed: float = 1.0

    def __post_init__(self) -> None:
        if not self.name:
            raise ClusterSpecError("a GPU type needs a name")
        if self.mem_mib <= 0:
            raise ClusterSpecError(f"GPU type {self.name!r}", column="mem_mib", expected="> 0", got=str(self.mem_mib))
        if not self.speed > 0:
            raise ClusterSpecError(f"GPU type {self.name!r}", column="speed", expected="> 0", got=str(self.speed))


@dataclass(frozen=True, slots=True)
class NodeSpec:
    name: str
    gpu_type: str
    num_gpus: int
    rack: str = "rack-0"
    gpus_per_switch: int | None = None  # GPUs under one PCIe switch; None = all GPUs of the node share one
    cpu_milli: int | None = None
    host_mem_mib: int | None = None

    def __post_init__(self) -> None:
        if not self.name:
            raise ClusterSpecError("a node needs a name")
        if self.num_gpus < 0:
            raise ClusterSpecError(f"node {self.name!r}", column="num_gpus", expected=">= 0", got=str(self.num_gpus))
        if self.gpus_per_switch is not None and self.gpus_per_switch < 1:
            raise ClusterSpecError(
                f"node {self.name!r}", column="gpus_per_switch", expected=">= 1", got=str(self.gpus_per_switch)
            )


@dataclass(frozen=True, slots=True)
class Cluster:
    """A whole cluster: its GPU types, nodes (in order) and tenants."""

    name: str
    gpu_types: tuple[GpuType, ...]
    nodes: tuple[NodeSpec, ...]
    tenants: tuple[Tenant, ...] = field(default=())

    def __post_init__(self) -> None:
        type_names = [t.name for t in self.gpu_types]
        if len(set(type_names)) != len(type_names):
            raise ClusterSpecError(f"cluster {self.name!r}: a GPU type is defined twice: {type_names}")
        known = set(type_names)
        seen: set[str] = set()
        for node in self.nodes:
            if node.name in seen:
                raise ClusterSpecError(f"cluster {self.name!r}: node {node.name!r} is defined twice")
            seen.add(node.name)
            if node.gpu_type not in known:
                raise ClusterSpecError(
                    f"cluster {self.name!r}: node {node.name!r} has an unknown GPU type",
                    column="gpu_type",
                    expected=f"one of {sorted(known)}",
                    got=node.gpu_type,
                )
        tenant_names = [t.name for t in self.tenants]
        if len(set(tenant_names)) != len(tenant_names):
            raise ClusterSpecError(f"cluster {self.name!r}: a tenant is defined twice: {tenant_names}")
        if not any(n.num_gpus for n in self.nodes):
            raise ClusterSpecError(f"cluster {self.name!r} has no GPUs")

    @property
    def num_gpus(self) -> int:
        return sum(n.num_gpus for n in self.nodes)

    def gpu_type(self, name: str) -> GpuType:
        for t in self.gpu_types:
            if t.name == name:
                return t
        raise KeyError(name)

    def with_tenants(self, tenants: Iterable[Tenant]) -> Cluster:
        return Cluster(self.name, self.gpu_types, self.nodes, tuple(tenants))


class Topology:
    """A cluster flattened into arrays indexed by GPU and node number. Read-only after construction."""

    __slots__ = (
        "all_types",
        "cluster",
        "gpu_mem_mib",
        "gpu_node",
        "gpu_speed",
        "gpu_switch",
        "gpu_type",
        "node_first_gpu",
        "node_names",
        "node_num_gpus",
        "node_rack",
        "node_type",
        "num_gpus",
        "num_nodes",
        "rack_names",
        "type_mem_mib",
        "type_names",
        "type_num_gpus",
        "type_speed",
    )

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.type_names: tuple[str, ...] = tuple(t.name for t in cluster.gpu_types)
        self.type_mem_mib: tuple[int, ...] = tuple(t.mem_mib for t in cluster.gpu_types)
        self.type_speed: tuple[float, ...] = tuple(t.speed for t in cluster.gpu_types)
        type_index = {name: i for i, name in enumerate(self.type_names)}
        racks: dict[str, int] = {}
        gpu_node: list[int] = []
        gpu_switch: list[int] = []
        gpu_type: list[int] = []
        gpu_speed: list[float] = []
        gpu_mem: list[int] = []
        node_first: list[int] = []
        node_num: list[int] = []
        node_rack: list[int] = []
        node_type: list[int] = []
        type_count = [0] * len(self.type_names)
        switch = 0
        for n, node in enumerate(cluster.nodes):
            t = type_index[node.gpu_type]
            gt = cluster.gpu_types[t]
            node_first.append(len(gpu_node))
            node_num.append(node.num_gpus)
            node_rack.append(racks.setdefault(node.rack, len(racks)))
            node_type.append(t)
            type_count[t] += node.num_gpus
            per_switch = node.gpus_per_switch or max(node.num_gpus, 1)
            for i in range(node.num_gpus):
                gpu_node.append(n)
                gpu_switch.append(switch + i // per_switch)
                gpu_type.append(t)
                gpu_speed.append(gt.speed)
                gpu_mem.append(gt.mem_mib)
            switch += -(-node.num_gpus // per_switch) if node.num_gpus else 0
        self.gpu_node: tuple[int, ...] = tuple(gpu_node)
        self.gpu_switch: tuple[int, ...] = tuple(gpu_switch)
        self.gpu_type: tuple[int, ...] = tuple(gpu_type)
        self.gpu_speed: tuple[float, ...] = tuple(gpu_speed)
        self.gpu_mem_mib: tuple[int, ...] = tuple(gpu_mem)
        self.node_first_gpu: tuple[int, ...] = tuple(node_first)
        self.node_num_gpus: tuple[int, ...] = tuple(node_num)
        self.node_rack: tuple[int, ...] = tuple(node_rack)
        self.node_type: tuple[int, ...] = tuple(node_type)
        self.node_names: tuple[str, ...] = tuple(n.name for n in cluster.nodes)
        self.rack_names: tuple[str, ...] = tuple(racks)
        self.type_num_gpus: tuple[int, ...] = tuple(type_count)
        self.all_types: tuple[int, ...] = tuple(range(len(self.type_names)))  # every type index, in order
        self.num_gpus = len(gpu_node)
        self.num_nodes = len(cluster.nodes)

    def node_gpus(self, node: int) -> range:
        first = self.node_first_gpu[node]
        return range(first, first + self.node_num_gpus[node])

    def type_indices(self, names: Sequence[str]) -> tuple[int, ...]:
        """GPU type indices for a job's allowed types (all types when ``names`` is empty); unknown names drop."""
        if not names:
            return self.all_types
        wanted = set(names)
        return tuple(i for i, name in enumerate(self.type_names) if name in wanted)

    def nodes_spanned(self, gpus: Iterable[int]) -> int:
        node = self.gpu_node
        return len({node[g] for g in gpus})

    def level(self, gpus: Sequence[int]) -> TopologyLevel:
        """The lowest level of the tree that contains all of ``gpus``."""
        if len(gpus) <= 1:
            return TopologyLevel.GPU
        if len({self.gpu_switch[g] for g in gpus}) == 1:
            return TopologyLevel.SWITCH
        nodes = {self.gpu_node[g] for g in gpus}
        if len(nodes) == 1:
            return TopologyLevel.NODE
        if len({self.node_rack[n] for n in nodes}) == 1:
            return TopologyLevel.RACK
        return TopologyLevel.CLUSTER
