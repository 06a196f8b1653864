"""HiveD's cells (corral.policies.hived.cells): the cell tree a topology becomes, the buddy cell allocator (split,
merge, safety) as property tests over random clusters and random bind/release sequences, and cell quotas
(corral.policies.hived.vc: parsed and derived)."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from builders import cluster
from corral.core.cluster import Cluster, Topology, TopologyLevel
from corral.core.errors import ConfigError, InvariantViolation
from corral.core.tenant import Tenant
from corral.policies.hived.cells import BOUND, FREE, Buckets, BuddyAllocator, CellTree
from corral.policies.hived.vc import CellQuota, check_vc_cells, derive_vc_cells, describe_vc, parse_vc_cells

G, S, N, R = TopologyLevel.GPU, TopologyLevel.SWITCH, TopologyLevel.NODE, TopologyLevel.RACK


def tree_of(c: Cluster) -> CellTree:
    return CellTree(Topology(c))


# -- the tree ---------------------------------------------------------------------------------------------------
def test_eight_gpu_nodes_in_one_rack_make_one_chain_of_four_levels() -> None:
    tree = tree_of(cluster(nodes=2, gpus=8, gpus_per_switch=4))
    (chain,) = tree.chains
    assert chain.levels == (G, S, N, R)
    assert chain.sizes == (1, 4, 8, 16)
    assert chain.node_level == 2
    (top,) = tree.tops[0]
    assert tree.size[top] == 16 and tree.gpus(top) == list(range(16))
    nodes = tree.children[top]
    assert [tree.gpus(n) for n in nodes] == [list(range(8)), list(range(8, 16))]
    assert [tree.gpus(s) for s in tree.children[nodes[1]]] == [[8, 9, 10, 11], [12, 13, 14, 15]]
    # Every GPU's ancestors run leaf -> switch -> node -> rack.
    assert [tree.level[c] for c in tree.ancestors[tree.gpu_leaf[13]]] == [0, 1, 2, 3]


def test_levels_that_add_nothing_are_dropped() -> None:
    # One PCIe switch per node: no separate switch level; one-GPU nodes: the node is its GPU.
    one_switch = tree_of(cluster(nodes=2, gpus=4)).chains[0]
    assert one_switch.levels == (G, N, R) and one_switch.sizes == (1, 4, 8) and one_switch.node_level == 1
    single = tree_of(cluster(nodes=3, gpus=1)).chains[0]
    assert single.levels == (G, R) and single.node_level == 0 and single.sizes == (1, 3)
    # Switches of unequal size (6 GPUs, 4 per switch: 4 + 2): no switch level.
    uneven = tree_of(cluster(nodes=2, gpus=6, gpus_per_switch=4)).chains[0]
    assert uneven.levels == (G, N, R)


def test_racks_hold_the_most_common_number_of_a_chains_nodes() -> None:
    # Racks of 3, 3 and 1 nodes (like Philly's partly filled last rack): rack cells of 3 nodes, and a loose node.
    racks = ["r0"] * 3 + ["r1"] * 3 + ["r2"]
    tree = tree_of(cluster(nodes=7, gpus=8, gpus_per_switch=4, racks=racks))
    (chain,) = tree.chains
    assert chain.sizes == (1, 4, 8, 24)
    assert [(tree.level[t], tree.gpus(t)[0]) for t in tree.tops[0]] == [(3, 0), (3, 24), (2, 48)]
    # A rack with more than that many nodes gives a rack cell per that many and loose nodes for the rest.
    racks = ["r0"] * 2 + ["r1"] * 2 + ["r2"] * 5
    tree = tree_of(cluster(nodes=9, gpus=2, racks=racks))
    assert [tree.level[t] for t in tree.tops[0]] == [2, 2, 2, 2, 1]


def test_each_gpu_type_and_node_shape_is_its_own_chain() -> None:
    c = cluster(gpus=[8, 8, 2, 2, 8], types=["A", "A", "B", "B", "A"], gpus_per_switch=[4, 4, None, None, 2])
    tree = tree_of(c)
    assert [(ch.type_name, ch.node_gpus, ch.sizes) for ch in tree.chains] == [
        ("A", 8, (1, 4, 8, 16)),  # nodes 0 and 1 (switches of 4), one rack of both
        ("B", 2, (1, 2, 4)),
        ("A", 8, (1, 2, 8)),  # node 4: switches of 2, a different shape
    ]
    assert sum(ch.num_gpus for ch in tree.chains) == Topology(c).num_gpus


# -- the buddy allocator ----------------------------------------------------------------------------------------
def test_bind_splits_the_lowest_free_cell_and_release_merges_buddies_back() -> None:
    tree = tree_of(cluster(nodes=2, gpus=8, gpus_per_switch=4))
    buddy = BuddyAllocator(tree)
    (rack,) = tree.tops[0]
    buddy.reserve(0, 1, 2)  # two switch cells
    buddy.reserve(0, 2, 1)  # one node cell
    first = buddy.bind(0, 1)  # splits the rack, then node 0: switch 0 bound, switch 1 and node 1 free
    assert tree.gpus(first) == [0, 1, 2, 3]
    assert sorted(tree.gpus(c)[0] for c in buddy.free_cells(0, 1)) == [4]
    assert [tree.gpus(c)[0] for c in buddy.free_cells(0, 2)] == [8]
    second = buddy.bind(0, 1)  # the free switch, no split
    assert tree.gpus(second) == [4, 5, 6, 7]
    node = buddy.bind(0, 2)
    assert tree.gpus(node) == list(range(8, 16))
    buddy.check()
    for cell in (first, node, second):
        buddy.release(cell)
        buddy.check()
    assert buddy.state[rack] == FREE and list(buddy.free_cells(0, 3)) == [rack]


def test_bind_prefers_free_cells_with_fewer_borrowed_gpus_and_splits_a_clean_cell_when_safe() -> None:
    tree = tree_of(cluster(nodes=4, gpus=8, gpus_per_switch=4, racks=["r0", "r0", "r1", "r1"]))
    cost = [0] * tree.num_cells
    buddy = BuddyAllocator(tree, cost)
    r0, r1 = tree.tops[0]
    buddy.reserve(0, 2, 1)
    first = buddy.bind(0, 2)  # splits rack 0 (the first); its other node is free at node level
    other = next(buddy.free_cells(0, 2))
    # A low-priority job on the free node: a node bind would rather split the clean rack 1, and may (safe).
    for a in tree.ancestors[tree.gpu_leaf[tree.gpus(other)[0]]]:
        cost[a] += 1
    buddy.cost_changed(tree.gpu_leaf[tree.gpus(other)[0]])
    buddy.reserve(0, 2, 1)
    second = buddy.bind(0, 2)
    assert tree.parent[second] == r1 and tree.parent[first] == r0
    # With a VC's rack cell unbound, splitting rack 1 is not safe: the node with the borrower is taken instead.
    buddy.release(second)  # its virtual cell is unbound again
    buddy.reserve(0, 3, 1)
    assert buddy.bind(0, 2) == other
    buddy.check()


def test_bind_without_an_unbound_virtual_cell_or_a_free_cell_is_an_invariant_violation() -> None:
    buddy = BuddyAllocator(tree_of(cluster(nodes=1, gpus=4)))
    with pytest.raises(InvariantViolation, match="no unbound virtual cell"):
        buddy.bind(0, 1)
    buddy.reserve(0, 1, 2)  # two node cells on a one-node cluster: unsafe quotas
    buddy.bind(0, 1)
    with pytest.raises(InvariantViolation, match="not safe"):
        buddy.bind(0, 1)


@st.composite
def shapes(draw: st.DrawFn) -> Cluster:
    """A random cluster: 1-3 GPU types, each with nodes of one shape spread over racks of random sizes."""
    specs: list[tuple[str, int, int | None, str]] = []
    for t in range(draw(st.integers(1, 3))):
        gpus, per_switch = draw(st.sampled_from([(1, None), (2, None), (4, 2), (8, 4), (8, None), (6, 4)]))
        for r, size in enumerate(draw(st.lists(st.integers(1, 4), min_size=1, max_size=3))):
            specs += [(f"T{t}", gpus, per_switch, f"T{t}-r{r}")] * size
    return cluster(
        gpus=[s[1] for s in specs],
        types=[s[0] for s in specs],
        gpus_per_switch=[s[2] for s in specs],
        racks=[s[3] for s in specs],
    )


def carve(tree: CellTree, rng: random.Random, vcs: int) -> dict[str, tuple[CellQuota, ...]]:
    """Random safe cell quotas: cut random top cells into random pieces (a partition of part of the cluster)
    and deal the pieces to the VCs."""
    pieces: list[int] = []
    for tops in tree.tops:
        stack = [t for t in tops if rng.random() < 0.8]
        while stack:
            cell = stack.pop()
            if tree.children[cell] and rng.random() < 0.5:
                stack += tree.children[cell]
            elif rng.random() < 0.8:
                pieces.append(cell)
    counts: dict[str, Counter[tuple[int, int]]] = {f"vc{i}": Counter() for i in range(vcs)}
    for cell in pieces:
        counts[f"vc{rng.randrange(vcs)}"][(tree.chain[cell], tree.level[cell])] += 1
    return {vc: tuple(CellQuota(c, lv, n) for (c, lv), n in sorted(cq.items())) for vc, cq in counts.items()}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=shapes(), seed=st.integers(0, 2**32 - 1), vcs=st.integers(1, 4), steps=st.integers(1, 80))
def test_buddy_allocation_properties(shape: Cluster, seed: int, vcs: int, steps: int) -> None:
    """Random safe quotas and a random sequence of binds (of a VC's unbound cells) and releases, with random
    borrower costs: every bind succeeds (safety), bound and free cells never overlap and cover every GPU once
    (total GPUs conserved), safety ``C_k >= D_k`` holds throughout, and releasing everything merges the free
    lists back to the initial top cells."""
    tree = tree_of(shape)
    rng = random.Random(seed)
    quotas = carve(tree, rng, vcs)
    check_vc_cells(tree, quotas)  # a partition is always safe
    cost = [0] * tree.num_cells
    buddy = BuddyAllocator(tree, cost)
    initial = {
        (ch.index, lv): sorted(buddy.free_cells(ch.index, lv)) for ch in tree.chains for lv in range(len(ch.sizes))
    }
    unbound: dict[str, Counter[tuple[int, int]]] = {vc: Counter() for vc in quotas}
    for vc, cells in quotas.items():
        for q in cells:
            buddy.reserve(q.chain, q.level, q.count)
            unbound[vc][(q.chain, q.level)] += q.count
    bound: list[tuple[str, int]] = []
    total = Topology(shape).num_gpus
    for _ in range(steps):
        if rng.random() < 0.3:  # borrowers come and go anywhere
            leaf = rng.choice(tree.leaves)
            delta = -1 if cost[leaf] else 1  # a GPU holds one job at most
            for a in tree.ancestors[leaf]:
                cost[a] += delta
            buddy.cost_changed(leaf)
        wanted = [(vc, key) for vc, left in unbound.items() for key, n in left.items() if n > 0]
        if wanted and (not bound or rng.random() < 0.6):
            vc, (chain, level) = rng.choice(wanted)
            cell = buddy.bind(chain, level)  # never fails: that is sharing safety's foundation
            assert (tree.chain[cell], tree.level[cell]) == (chain, level) and buddy.state[cell] == BOUND
            unbound[vc][(chain, level)] -= 1
            bound.append((vc, cell))
        elif bound:
            vc, cell = bound.pop(rng.randrange(len(bound)))
            buddy.release(cell)
            unbound[vc][(tree.chain[cell], tree.level[cell])] += 1
        buddy.check()
        assert buddy.safe()
        free = [c for c in range(tree.num_cells) if buddy.state[c] == FREE]
        held = [set(tree.gpus(c)) for c in free + [c for _, c in bound]]
        assert sum(len(h) for h in held) == total == len(set().union(*held))
    for _, cell in bound:
        buddy.release(cell)
    buddy.check()
    assert {
        (ch.index, lv): sorted(buddy.free_cells(ch.index, lv)) for ch in tree.chains for lv in range(len(ch.sizes))
    } == initial


# -- cell quotas ------------------------------------------------------------------------------------------------
def philly_like() -> Cluster:
    """Two chains: 2-GPU 12GB nodes (racks of 3 and 1) and 8-GPU 24GB nodes (racks of 2 and 1)."""
    return cluster(
        gpus=[2, 2, 2, 2, 8, 8, 8],
        types=["12GB"] * 4 + ["24GB"] * 3,
        gpus_per_switch=[None] * 4 + [4] * 3,
        racks=["a", "a", "a", "b", "c", "c", "d"],
    )


def test_parse_vc_cells() -> None:
    tree = tree_of(philly_like())
    cells = parse_vc_cells("vision = 2xnode@24GB + switch@24GB ; speech=1xrack@12GB+3xgpu@24GB/8", tree)
    assert cells == {
        "vision": (CellQuota(1, 1, 1), CellQuota(1, 2, 2)),
        "speech": (CellQuota(0, 2, 1), CellQuota(1, 0, 3)),
    }
    assert describe_vc(tree, cells["vision"]) == "2 node + 1 switch of 24GB/8"
    check_vc_cells(tree, cells)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("vision", "is not TENANT=CELLS"),
        ("vision=2xcabinet", "expected COUNTxLEVEL@TYPE/GPUS"),
        ("vision=node", "several chains match \\(12GB/2, 24GB/8\\)"),
        ("vision=switch@12GB", "no chain of the cluster is of GPU type .12GB. with that level"),
        ("vision=node@V100", "no chain of the cluster is of GPU type 'V100' with that level"),
        ("vision=node@24GB/4", "no chain of the cluster is of GPU type '24GB' with 4 GPUs per node with that"),
        ("a=gpu@12GB;a=gpu@12GB", "given twice"),
    ],
)
def test_parse_vc_cells_errors_name_the_tenant_and_the_form(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_vc_cells(text, tree_of(philly_like()))


def test_unsafe_cell_quotas_are_a_config_error() -> None:
    tree = tree_of(philly_like())
    # The 24GB chain has one rack cell (2 nodes) and a loose node: two rack cells cannot be honoured.
    with pytest.raises(ConfigError, match=r"rack level and above hold 32 GPUs, but .* hold 16"):
        check_vc_cells(tree, parse_vc_cells("a=rack@24GB;b=rack@24GB", tree))
    # Three nodes' worth of 24GB node cells plus a switch: 28 GPUs at switch level and above, 24 exist.
    with pytest.raises(ConfigError, match="switch level and above hold 28"):
        check_vc_cells(tree, parse_vc_cells("a=2xnode@24GB;b=node@24GB+switch@24GB", tree))


def test_derived_cells_give_a_vc_of_n_nodes_n_node_cells() -> None:
    tree = tree_of(cluster(nodes=8, gpus=8, gpus_per_switch=4))
    tenants = {"a": Tenant("a", 32), "b": Tenant("b", 13), "c": Tenant("c"), "d": Tenant("d", 0)}
    cells = derive_vc_cells(tree, tenants)
    assert cells == {"a": (CellQuota(0, 2, 4),), "b": (CellQuota(0, 0, 1), CellQuota(0, 1, 1), CellQuota(0, 2, 1))}
    check_vc_cells(tree, cells)


@settings(max_examples=100, deadline=None)
@given(quotas=st.lists(st.integers(0, 40), min_size=1, max_size=6))
def test_derived_cells_are_safe_and_never_exceed_the_quota(quotas: list[int]) -> None:
    """Any GPU quotas, overcommitted or not, on a two-chain cluster: the derived cells are safe, a VC's cells
    hold at most its quota (scaled when the quotas overcommit the cluster), and nothing is lost when they fit."""
    tree = tree_of(philly_like())
    tenants = {f"t{i}": Tenant(f"t{i}", q) for i, q in enumerate(quotas)}
    cells = derive_vc_cells(tree, tenants)
    check_vc_cells(tree, cells)
    total, want = Topology(philly_like()).num_gpus, sum(quotas)
    for name, cq in cells.items():
        gpus = sum(q.count * tree.chains[q.chain].sizes[q.level] for q in cq)
        quota = tenants[name].quota_gpus or 0
        assert gpus <= quota
        if want <= total:
            assert gpus == quota
    assert set(cells) == {t for t, v in tenants.items() if v.quota_gpus}


def test_buckets_find_the_best_fit_and_skip_chosen_nodes() -> None:
    tree = tree_of(cluster(nodes=3, gpus=8, gpus_per_switch=4))
    index = Buckets(tree)
    nodes = [c for c in range(tree.num_cells) if tree.level[c] == 2]
    for node, free in zip(nodes, (8, 3, 5), strict=True):
        index.add(node, free)
    assert index.first(0, 2, 4) == nodes[2]  # 5 is the smallest count >= 4
    assert index.first(0, 2, 4, {nodes[2]: None}) == nodes[0]
    index.move(nodes[1], 6)
    assert index.first(0, 2, 4) == nodes[2] and index.first(0, 2, 6) == nodes[1]
    index.remove(nodes[1])
    assert nodes[1] not in index and index.first(0, 2, 6) == nodes[0] and index.first(0, 2, 9) == -1
