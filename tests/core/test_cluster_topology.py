"""Cluster validation and the flattened Topology: GPU/node/switch/rack indexing and locality levels."""

from __future__ import annotations

import pytest

from corral.core.cluster import Cluster, GpuType, NodeSpec, Topology, TopologyLevel
from corral.core.errors import ClusterSpecError, InputError
from corral.core.tenant import Tenant

A = GpuType("A", 16384, 1.0)
B = GpuType("B", 32768, 2.0)


def topo() -> Topology:
    """Five nodes: GPUs are numbered node by node.

    node  type  gpus  per_switch  rack   GPU indices  switch ids
    n0    A     4     2           r0     0-3          0,0,1,1
    n1    A     2     None        r0     4-5          2,2
    n2    B     0     None        r1     (none)       (none: adds no switch)
    n3    B     3     2           r1     6-8          3,3,4   (ceil(3/2) = 2 switches)
    n4    A     1     None        r2     9            5
    """
    nodes = (
        NodeSpec("n0", "A", 4, rack="r0", gpus_per_switch=2),
        NodeSpec("n1", "A", 2, rack="r0"),
        NodeSpec("n2", "B", 0, rack="r1"),
        NodeSpec("n3", "B", 3, rack="r1", gpus_per_switch=2),
        NodeSpec("n4", "A", 1, rack="r2"),
    )
    return Topology(Cluster("t", (A, B), nodes))


def test_sizes_and_per_type_counts() -> None:
    t = topo()
    assert t.num_gpus == 10
    assert t.num_nodes == 5
    assert t.type_names == ("A", "B")
    assert t.type_num_gpus == (7, 3)
    assert t.type_mem_mib == (16384, 32768)
    assert t.type_speed == (1.0, 2.0)
    assert t.rack_names == ("r0", "r1", "r2")
    assert t.node_rack == (0, 0, 1, 1, 2)
    assert t.node_type == (0, 0, 1, 1, 0)
    assert t.node_names == ("n0", "n1", "n2", "n3", "n4")


@pytest.mark.parametrize(
    ("node", "gpus"),
    [(0, range(0, 4)), (1, range(4, 6)), (2, range(6, 6)), (3, range(6, 9)), (4, range(9, 10))],
)
def test_node_gpus_are_contiguous_ranges(node: int, gpus: range) -> None:
    t = topo()
    assert t.node_gpus(node) == gpus
    assert all(t.gpu_node[g] == node for g in gpus)


def test_per_gpu_arrays() -> None:
    t = topo()
    assert t.gpu_node == (0, 0, 0, 0, 1, 1, 3, 3, 3, 4)
    assert t.gpu_switch == (0, 0, 1, 1, 2, 2, 3, 3, 4, 5)
    assert t.gpu_type == (0, 0, 0, 0, 0, 0, 1, 1, 1, 0)
    assert t.gpu_mem_mib == (16384,) * 6 + (32768,) * 3 + (16384,)
    assert t.gpu_speed == (1.0,) * 6 + (2.0,) * 3 + (1.0,)
    assert t.node_first_gpu == (0, 4, 6, 6, 9)
    assert t.node_num_gpus == (4, 2, 0, 3, 1)


@pytest.mark.parametrize(
    ("gpus", "level"),
    [
        ((), TopologyLevel.GPU),
        ((5,), TopologyLevel.GPU),
        ((0, 1), TopologyLevel.SWITCH),  # same PCIe switch of n0
        ((2, 3), TopologyLevel.SWITCH),
        ((4, 5), TopologyLevel.SWITCH),  # n1 has one switch for all its GPUs
        ((1, 2), TopologyLevel.NODE),  # two switches of n0
        ((0, 1, 2, 3), TopologyLevel.NODE),
        ((6, 8), TopologyLevel.NODE),
        ((0, 4), TopologyLevel.RACK),  # n0 and n1, both in r0
        ((3, 4, 5), TopologyLevel.RACK),
        ((0, 6), TopologyLevel.CLUSTER),  # r0 and r1
        ((8, 9), TopologyLevel.CLUSTER),
    ],
)
def test_level(gpus: tuple[int, ...], level: TopologyLevel) -> None:
    assert topo().level(gpus) is level


def test_levels_are_ordered_best_to_worst() -> None:
    assert TopologyLevel.GPU < TopologyLevel.SWITCH < TopologyLevel.NODE < TopologyLevel.RACK < TopologyLevel.CLUSTER


@pytest.mark.parametrize(
    ("names", "indices"),
    [
        ((), (0, 1)),  # empty = any type
        (("A",), (0,)),
        (("B",), (1,)),
        (("B", "A"), (0, 1)),  # cluster order, not request order
        (("B", "nope"), (1,)),  # unknown names drop
        (("nope",), ()),
    ],
)
def test_type_indices(names: tuple[str, ...], indices: tuple[int, ...]) -> None:
    assert topo().type_indices(names) == indices


def test_nodes_spanned() -> None:
    t = topo()
    assert t.nodes_spanned([0, 1, 2]) == 1
    assert t.nodes_spanned([0, 4, 9]) == 3
    assert t.nodes_spanned([]) == 0


def test_switch_default_is_whole_node() -> None:
    c = Cluster("c", (A,), (NodeSpec("x", "A", 8), NodeSpec("y", "A", 8, gpus_per_switch=4)))
    t = Topology(c)
    assert t.gpu_switch == (0,) * 8 + (1,) * 4 + (2,) * 4
    assert t.level(tuple(range(8))) is TopologyLevel.SWITCH
    assert t.level(tuple(range(8, 16))) is TopologyLevel.NODE


# -- Cluster / GpuType / NodeSpec validation -------------------------------------------------------------------
def test_unknown_gpu_type() -> None:
    with pytest.raises(ClusterSpecError) as info:
        Cluster("c", (A,), (NodeSpec("n0", "A", 2), NodeSpec("n1", "Z", 2)))
    err = info.value
    assert (err.column, err.expected, err.got) == ("gpu_type", "one of ['A']", "Z")
    assert "'n1'" in str(err) and "unknown GPU type" in str(err)


def test_duplicate_node() -> None:
    with pytest.raises(ClusterSpecError, match="node 'n0' is defined twice"):
        Cluster("c", (A,), (NodeSpec("n0", "A", 2), NodeSpec("n0", "A", 2)))


@pytest.mark.parametrize("nodes", [(), (NodeSpec("n0", "A", 0),), (NodeSpec("n0", "A", 0), NodeSpec("n1", "A", 0))])
def test_cluster_without_gpus(nodes: tuple[NodeSpec, ...]) -> None:
    with pytest.raises(ClusterSpecError, match="has no GPUs"):
        Cluster("c", (A,), nodes)


def test_duplicate_gpu_type_and_tenant() -> None:
    with pytest.raises(ClusterSpecError, match="GPU type is defined twice"):
        Cluster("c", (A, GpuType("A", 1)), (NodeSpec("n0", "A", 1),))
    with pytest.raises(ClusterSpecError, match="tenant is defined twice"):
        Cluster("c", (A,), (NodeSpec("n0", "A", 1),), (Tenant("t"), Tenant("t", 2)))


@pytest.mark.parametrize(
    ("make", "column"),
    [
        (lambda: GpuType("X", 0), "mem_mib"),
        (lambda: GpuType("X", 100, 0.0), "speed"),
        (lambda: GpuType("X", 100, float("nan")), "speed"),
        (lambda: NodeSpec("n", "A", -1), "num_gpus"),
        (lambda: NodeSpec("n", "A", 2, gpus_per_switch=0), "gpus_per_switch"),
    ],
)
def test_part_validation(make: object, column: str) -> None:
    with pytest.raises(ClusterSpecError) as info:
        make()  # type: ignore[operator]
    assert info.value.column == column


def test_nameless_parts() -> None:
    with pytest.raises(ClusterSpecError):
        GpuType("", 1)
    with pytest.raises(ClusterSpecError):
        NodeSpec("", "A", 1)
    # ClusterSpecError is an InputError, so the CLI reports it like any bad input.
    assert issubclass(ClusterSpecError, InputError)


def test_cluster_helpers() -> None:
    c = Cluster("c", (A, B), (NodeSpec("n0", "A", 2), NodeSpec("n1", "B", 3)))
    assert c.num_gpus == 5
    assert c.gpu_type("B") is B
    with pytest.raises(KeyError):
        c.gpu_type("Z")
    d = c.with_tenants([Tenant("t", 1)])
    assert d.tenants == (Tenant("t", 1),)
    assert (d.nodes, d.gpu_types, c.tenants) == (c.nodes, c.gpu_types, ())
