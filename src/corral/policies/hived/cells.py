"""HiveD's cells (Zhao et al., "HiveD: Sharing a GPU Cluster for Deep Learning with Guarantees", OSDI'20): the
cell tree of a cluster, the buddy cell allocator (§3.2, Algorithm 1) and cell quotas (§3.1).

**Cells** (§3.1). A cell is a subtree of the topology: a GPU, the GPUs under one PCIe switch, a node, a rack.
corral's tree (:class:`corral.core.cluster.Topology`) has no CPU-socket level, so neither do the cells: the
levels are ``GPU < PCIe switch < node < rack``. Cells of one level are interchangeable only if they have the
same shape, so the cluster is cut into *chains* (HiveD's cell types per SKU): the nodes of one GPU type, one GPU
count and one switch layout form a chain, and every cell of a chain's level has the same number of GPUs. A
level is kept only if its cells are larger than the level below (a node with one PCIe switch has no separate
switch level; a one-GPU node is its GPU), and the switch level only if the node's switches are of one size.
Racks: the number of a chain's nodes that share a rack varies (Philly's last rack is partly filled), so a rack
cell holds the most common number of the chain's nodes per rack (ties: the larger); a rack with at least that
many gives one rack cell per that many consecutive nodes, and the nodes left over are top-level node cells. So
within a chain every cell size divides the next one, which the safety argument below needs.

**Buddy cell allocation** (§3.2, Algorithm 1). A free list per chain and level holds the free cells whose parent
is not free. A cell of level k is taken from the free list of level k, or a free cell of a higher level is split
into its children (buddies), one of which goes on down; a released cell goes back on its free list and is merged
with its buddies into its parent whenever all of them are free. A cell is *bound* to a virtual cluster (VC) while
it is taken: corral binds a VC's virtual cell lazily, when the VC first uses it (§3.2, dynamic binding), and
releases the binding when the VC no longer uses any of it.

**Safety** (§3.2, Theorem 1, and §3.3). Let ``C_k`` be the GPUs in free cells of level ``k`` or higher and
``D_k`` the GPUs in the VCs' unbound virtual cells of level ``k`` or higher (one chain). Sizes in a chain divide
each other, so every VC's unbound cells can be bound at once exactly when ``C_k >= D_k`` at every level (place
the largest first: what is left above level k is a whole number of level-k cells). Taking a cell of the level
asked for keeps the inequality; splitting a higher cell lowers ``C`` at the split levels only, and the
allocator does it only where the inequality still holds there. When no free cell of the level exists, splitting
the lowest free higher cell always keeps it (``C`` and ``D`` are multiples of the cell size at each level, and
one level lower the VC's own unbound cell makes ``C > D``), so a VC always gets a cell for each of its unbound
virtual cells: that is the guarantee :mod:`corral.policies.hived.policy` builds sharing safety on. The allocator
prefers, among the cells it may take, the one with the fewest GPUs lent to low-priority jobs (§3.4), splitting
a higher cell for it when that is safe.

**Bad hardware** (HiveD OSDI'20 §3.2's dynamic binding, which is what lets HiveD route around failed hardware, and
its scheduler's treatment of bad nodes: a cell is *bad* if any GPU under it is on a node that is down). The
allocator keeps bad free cells apart from the healthy ones (its scheduler's ``badFreeCells``) and binds a bad cell
only when no healthy one is free or can be split safely: then the VC's virtual cell is "doomed to be bad" for as
long as that lasts, and the policy places nothing on its down GPUs. Safety counts bad cells as free, as HiveD's
does: a node that comes back makes the doomed cell healthy again, so the guarantee holds once the hardware does.

**Cell quotas** (§3.1): a VC is a number of cells per chain and level: :mod:`corral.policies.hived.vc`.

:class:`Buckets` files cells by a count (free GPUs, say) per chain and level, the index the policy searches for
a best fit without scanning every cell.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from corral.core.cluster import Topology, TopologyLevel
from corral.core.errors import InvariantViolation

LEVEL_NAMES = {
    TopologyLevel.GPU: "gpu",
    TopologyLevel.SWITCH: "switch",
    TopologyLevel.NODE: "node",
    TopologyLevel.RACK: "rack",
}

_BAD = -2  # how a bad free cell is filed (healthy free cells are filed by their cost)

# A cell's state in the buddy allocator.
FREE = 0  # on its level's free list: free, and its parent is not
SPLIT = 1  # not bound, but some of its descendants are bound (its free children are on the free lists)
BOUND = 2  # bound to a VC as a whole
INNER = 3  # inside a free or bound cell


@dataclass(frozen=True, slots=True)
class Chain:
    """The cells of one shape of node (GPU type, GPUs per node, switch layout) and of the racks they fill."""

    index: int
    gpu_type: int
    type_name: str
    node_gpus: int
    levels: tuple[TopologyLevel, ...]  # from GPU up; sizes grow strictly
    sizes: tuple[int, ...]  # GPUs per cell at each level
    node_level: int  # index of the node level in ``levels`` (0 for one-GPU nodes)
    num_gpus: int
    num_nodes: int

    @property
    def name(self) -> str:
        return f"{self.type_name}/{self.node_gpus}"

    def level_index(self, level: TopologyLevel) -> int | None:
        """The index of ``level`` in this chain, or None if the chain has no such level."""
        if level is TopologyLevel.NODE:
            return self.node_level
        if level is TopologyLevel.GPU:
            return 0
        return self.levels.index(level) if level in self.levels else None

    def level_name(self, level: int) -> str:
        return "node" if level == self.node_level else LEVEL_NAMES[self.levels[level]]

    def affinity(self, num_gpus: int) -> int:
        """The lowest level whose cells hold ``num_gpus`` GPUs (the chain's top level if none does)."""
        for level, size in enumerate(self.sizes):
            if size >= num_gpus:
                return level
        return len(self.sizes) - 1


class CellTree:
    """The cells of a topology, numbered 0..num_cells-1 chain by chain, depth first (a parent before its
    children, children in GPU order). Read-only after construction."""

    __slots__ = (
        "ancestors",
        "chain",
        "chains",
        "children",
        "gpu_leaf",
        "key",
        "leaf_gpu",
        "leaves",
        "leaves_from",
        "leaves_to",
        "level",
        "node_of",
        "num_cells",
        "parent",
        "size",
        "topology",
        "tops",
    )

    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        topo = topology
        shapes: dict[tuple[int, int, int | None], list[int]] = {}
        for n in range(topo.num_nodes):
            k = topo.node_num_gpus[n]
            if k == 0:
                continue
            per_switch = Counter(topo.gpu_switch[g] for g in topo.node_gpus(n))
            sizes = set(per_switch.values())
            switch = sizes.pop() if len(per_switch) > 1 and len(sizes) == 1 else None
            shapes.setdefault((topo.node_type[n], k, switch), []).append(n)
        self.chains: list[Chain] = []
        self.chain: list[int] = []
        self.level: list[int] = []
        self.parent: list[int] = []
        self.children: list[tuple[int, ...]] = []
        self.size: list[int] = []
        self.leaf_gpu: list[int] = []  # cell -> GPU for leaves, -1 otherwise
        self.gpu_leaf: list[int] = [-1] * topo.num_gpus
        self.leaves: list[int] = []  # leaf cells in depth-first order: a cell's leaves are a slice of it
        self.leaves_from: list[int] = []
        self.leaves_to: list[int] = []
        self.node_of: list[int] = []  # the node-level cell a cell is in (itself for nodes), -1 above nodes
        self.tops: list[list[int]] = []
        for (t, k, switch), nodes in shapes.items():
            self._build_chain(t, k, switch, nodes)
        self.num_cells = len(self.chain)
        self.key: list[int] = [c * 8 + lv for c, lv in zip(self.chain, self.level, strict=True)]
        self.ancestors: list[tuple[int, ...]] = [() for _ in range(self.num_cells)]
        for leaf in self.leaves:
            path = [leaf]
            while self.parent[path[-1]] != -1:
                path.append(self.parent[path[-1]])
            self.ancestors[leaf] = tuple(path)

    def _build_chain(self, t: int, k: int, switch: int | None, nodes: list[int]) -> None:
        topo = self.topology
        index = len(self.chains)
        levels = [TopologyLevel.GPU]
        sizes = [1]
        if switch is not None and 1 < switch < k:
            levels.append(TopologyLevel.SWITCH)
            sizes.append(switch)
        if k > sizes[-1]:
            levels.append(TopologyLevel.NODE)
            sizes.append(k)
        node_level = len(sizes) - 1
        by_rack: dict[int, list[int]] = {}
        for n in nodes:
            by_rack.setdefault(topo.node_rack[n], []).append(n)
        counts = Counter(len(v) for v in by_rack.values())
        per_rack = max(counts, key=lambda c: (counts[c], c))
        groups: list[list[int]] = []  # top cells: lists of nodes (one node = a top-level node cell)
        if per_rack >= 2:
            levels.append(TopologyLevel.RACK)
            sizes.append(per_rack * k)
            for members in by_rack.values():
                whole = len(members) - len(members) % per_rack
                groups += [members[i : i + per_rack] for i in range(0, whole, per_rack)]
                groups += [[n] for n in members[whole:]]
        else:
            groups = [[n] for n in nodes]
        groups.sort(key=lambda g: g[0])
        chain = Chain(
            index=index,
            gpu_type=t,
            type_name=topo.type_names[t],
            node_gpus=k,
            levels=tuple(levels),
            sizes=tuple(sizes),
            node_level=node_level,
            num_gpus=k * len(nodes),
            num_nodes=len(nodes),
        )
        self.chains.append(chain)
        tops: list[int] = []
        for group in groups:
            if len(group) > 1:
                rack = self._new(index, node_level + 1, -1, per_rack * k)
                kids = tuple(self._node(chain, n, rack) for n in group)
                self._close(rack, kids)
                tops.append(rack)
            else:
                tops.append(self._node(chain, group[0], -1))
        self.tops.append(tops)

    def _new(self, chain: int, level: int, parent: int, size: int) -> int:
        cell = len(self.chain)
        self.chain.append(chain)
        self.level.append(level)
        self.parent.append(parent)
        self.children.append(())
        self.size.append(size)
        self.leaf_gpu.append(-1)
        self.leaves_from.append(len(self.leaves))
        self.leaves_to.append(len(self.leaves))
        self.node_of.append(-1)
        return cell

    def _close(self, cell: int, kids: tuple[int, ...]) -> None:
        self.children[cell] = kids
        self.leaves_to[cell] = len(self.leaves)

    def _node(self, chain: Chain, n: int, parent: int) -> int:
        gpus = list(self.topology.node_gpus(n))
        if chain.node_level == 0:  # a one-GPU node is its GPU
            return self._leaf(chain.index, gpus[0], parent, node=True)
        node = self._new(chain.index, chain.node_level, parent, len(gpus))
        self.node_of[node] = node
        if chain.node_level == 2:  # GPU < switch < node
            per = chain.sizes[1]
            kids = []
            for i in range(0, len(gpus), per):
                sw = self._new(chain.index, 1, node, per)
                self.node_of[sw] = node
                self._close(sw, tuple(self._leaf(chain.index, g, sw, owner=node) for g in gpus[i : i + per]))
                kids.append(sw)
            self._close(node, tuple(kids))
        else:
            self._close(node, tuple(self._leaf(chain.index, g, node, owner=node) for g in gpus))
        return node

    def _leaf(self, chain: int, gpu: int, parent: int, *, node: bool = False, owner: int = -1) -> int:
        leaf = self._new(chain, 0, parent, 1)
        self.leaf_gpu[leaf] = gpu
        self.gpu_leaf[gpu] = leaf
        self.leaves.append(leaf)
        self.leaves_to[leaf] = len(self.leaves)
        self.node_of[leaf] = leaf if node else owner
        return leaf

    def gpus(self, cell: int) -> list[int]:
        """The GPUs of ``cell``, in order."""
        gpu = self.leaf_gpu
        return [gpu[leaf] for leaf in self.leaves[self.leaves_from[cell] : self.leaves_to[cell]]]

    def subtree(self, cell: int) -> Iterator[int]:
        """``cell`` and every cell below it, depth first (children in order)."""
        stack = [cell]
        while stack:
            c = stack.pop()
            yield c
            stack.extend(reversed(self.children[c]))

    def describe(self, cell: int) -> str:
        chain = self.chains[self.chain[cell]]
        return f"{chain.level_name(self.level[cell])} cell {cell} ({chain.name}, GPUs {self.gpus(cell)})"


class Buckets:
    """Cells filed by a count per chain and level: ``first`` finds the cell of the smallest count >= n (best fit).

    Buckets are insertion-ordered dicts used as ordered sets (as in ``engine.state``): O(1) to move a cell,
    deterministic to iterate (the order is the history of moves)."""

    __slots__ = ("_at", "_lists", "tree")

    def __init__(self, tree: CellTree) -> None:
        self.tree = tree
        self._at: list[int] = [-1] * tree.num_cells  # the count a cell is filed at; -1: not in this index
        self._lists: dict[int, list[dict[int, None]]] = {}

    def __contains__(self, cell: int) -> bool:
        return self._at[cell] >= 0

    def add(self, cell: int, count: int) -> None:
        tree = self.tree
        key = tree.key[cell]
        lists = self._lists.get(key)
        if lists is None:
            chain = tree.chains[tree.chain[cell]]
            lists = self._lists[key] = [{} for _ in range(chain.sizes[tree.level[cell]] + 1)]
        lists[count][cell] = None
        self._at[cell] = count

    def remove(self, cell: int) -> None:
        old = self._at[cell]
        if old >= 0:
            del self._lists[self.tree.key[cell]][old][cell]
            self._at[cell] = -1

    def move(self, cell: int, count: int) -> None:
        old = self._at[cell]
        if old < 0 or old == count:
            return
        lists = self._lists[self.tree.key[cell]]
        del lists[old][cell]
        lists[count][cell] = None
        self._at[cell] = count

    def count(self, cell: int) -> int:
        return self._at[cell]

    def bucket(self, chain: int, level: int, count: int) -> Mapping[int, None]:
        lists = self._lists.get(chain * 8 + level)
        return lists[count] if lists is not None and count < len(lists) else {}

    def first(self, chain: int, level: int, at_least: int, skip_nodes: Mapping[int, object] | None = None) -> int:
        """The first cell of the lowest count >= ``at_least`` at this chain and level, or -1. With
        ``skip_nodes``, cells inside those node cells are passed over."""
        lists = self._lists.get(chain * 8 + level)
        if lists is None:
            return -1
        node_of = self.tree.node_of
        for count in range(at_least, len(lists)):
            bucket = lists[count]
            if not bucket:
                continue
            if not skip_nodes:
                return next(iter(bucket))
            for cell in bucket:
                if node_of[cell] not in skip_nodes:
                    return cell
        return -1


class BuddyAllocator:
    """Buddy cell allocation over a :class:`CellTree` (§3.2, Algorithm 1), with the safety accounting of the
    module docstring. ``cost`` (shared, read-only here) is a per-cell count the allocator minimises when it
    chooses among free cells (the policy passes the GPUs lent to low-priority jobs, §3.4); call
    :meth:`cost_changed` when it changes under a free cell."""

    __slots__ = (
        "_bad_free",
        "_filed",
        "_free",
        "bad",
        "cost",
        "nfree_children",
        "num_free",
        "state",
        "tree",
        "unbound",
    )

    def __init__(self, tree: CellTree, cost: list[int] | None = None) -> None:
        self.tree = tree
        self.cost: list[int] = cost if cost is not None else [0] * tree.num_cells
        self.state: list[int] = [INNER] * tree.num_cells
        self.nfree_children: list[int] = [0] * tree.num_cells
        self.bad: list[int] = [0] * tree.num_cells  # GPUs under each cell on nodes that are down (set_bad)
        self._filed: list[int] = [-1] * tree.num_cells  # the cost a healthy free cell is filed at; _BAD: bad
        # [chain][level][cost] -> healthy free cells, [chain][level] -> bad free cells, and per chain and level the
        # number of free cells (healthy or bad: safety counts both, as HiveD does)
        self._free: list[list[list[dict[int, None]]]] = [
            [[{} for _ in range(size + 1)] for size in chain.sizes] for chain in tree.chains
        ]
        self._bad_free: list[list[dict[int, None]]] = [[{} for _ in chain.sizes] for chain in tree.chains]
        self.num_free: list[list[int]] = [[0] * len(chain.sizes) for chain in tree.chains]
        self.unbound: list[list[int]] = [[0] * len(chain.sizes) for chain in tree.chains]  # VCs' unbound cells
        for tops in tree.tops:
            for top in tops:
                self._add_free(top)

    # -- accounting -----------------------------------------------------------------------------------------
    def reserve(self, chain: int, level: int, count: int) -> None:
        """Register ``count`` more unbound virtual cells of a VC (negative: fewer)."""
        self.unbound[chain][level] += count

    def slack(self, chain: int) -> list[int]:
        """``C_k - D_k`` per level of ``chain`` (GPUs): safety holds while every entry is >= 0."""
        sizes = self.tree.chains[chain].sizes
        free, unbound = self.num_free[chain], self.unbound[chain]
        out = [0] * len(sizes)
        c = d = 0
        for level in range(len(sizes) - 1, -1, -1):
            c += free[level] * sizes[level]
            d += unbound[level] * sizes[level]
            out[level] = c - d
        return out

    def safe(self) -> bool:
        return all(min(self.slack(c)) >= 0 for c in range(len(self.tree.chains)))

    def _split_ok(self, chain: int, level: int, top_level: int) -> bool:
        """Does splitting a free cell of ``top_level`` down to one cell of ``level`` keep ``C_j >= D_j``? It costs
        ``C_j`` one level-j cell at each split level ``level < j <= top_level`` (below, both sides lose the cell)."""
        sizes = self.tree.chains[chain].sizes
        free, unbound = self.num_free[chain], self.unbound[chain]
        c = d = 0
        for j in range(len(sizes) - 1, level, -1):
            c += free[j] * sizes[j]
            d += unbound[j] * sizes[j]
            if j <= top_level and c - sizes[j] < d:
                return False
        return True

    # -- free lists -----------------------------------------------------------------------------------------
    def _add_free(self, cell: int) -> None:
        tree = self.tree
        self.state[cell] = FREE
        if self.bad[cell]:
            self._bad_free[tree.chain[cell]][tree.level[cell]][cell] = None
            self._filed[cell] = _BAD
        else:
            cost = self.cost[cell]
            self._free[tree.chain[cell]][tree.level[cell]][cost][cell] = None
            self._filed[cell] = cost
        self.num_free[tree.chain[cell]][tree.level[cell]] += 1
        parent = tree.parent[cell]
        if parent >= 0:
            self.nfree_children[parent] += 1

    def _remove_free(self, cell: int, state: int) -> None:
        tree = self.tree
        filed = self._filed[cell]
        if filed == _BAD:
            del self._bad_free[tree.chain[cell]][tree.level[cell]][cell]
        else:
            del self._free[tree.chain[cell]][tree.level[cell]][filed][cell]
        self._filed[cell] = -1
        self.num_free[tree.chain[cell]][tree.level[cell]] -= 1
        parent = tree.parent[cell]
        if parent >= 0:
            self.nfree_children[parent] -= 1
        self.state[cell] = state

    def cost_changed(self, leaf: int) -> None:
        """``cost`` changed along ``leaf``'s ancestors: re-file the free cell among them, if any."""
        state = self.state
        for cell in self.tree.ancestors[leaf]:
            s = state[cell]
            if s == FREE:
                cost = self.cost[cell]
                old = self._filed[cell]
                if old != cost and old != _BAD:  # bad free cells are not filed by cost
                    tree = self.tree
                    buckets = self._free[tree.chain[cell]][tree.level[cell]]
                    del buckets[old][cell]
                    buckets[cost][cell] = None
                    self._filed[cell] = cost
                return
            if s != INNER:
                return

    def set_bad(self, leaf: int, delta: int) -> None:
        """GPU ``leaf`` went down (``delta`` +1) or came back (-1): count it in its ancestors' ``bad`` and re-file
        the free cell among them, if any, between the healthy and the bad free cells."""
        bad, state = self.bad, self.state
        free = -1
        for cell in self.tree.ancestors[leaf]:
            bad[cell] += delta
            if state[cell] == FREE:
                free = cell
        if free >= 0 and (self._filed[free] == _BAD) != (bad[free] > 0):
            self._remove_free(free, FREE)
            self._add_free(free)

    def free_cells(self, chain: int, level: int) -> Iterator[int]:
        """Free cells of a level, cheapest first (healthy ones, then bad ones)."""
        for bucket in self._free[chain][level]:
            yield from bucket
        yield from self._bad_free[chain][level]

    def _cheapest(self, chain: int, level: int) -> int:
        for bucket in self._free[chain][level]:
            if bucket:
                return next(iter(bucket))
        return next(iter(self._bad_free[chain][level]), -1)

    def _descend(self, cell: int, level: int) -> int:
        """The cell of ``level`` under ``cell`` reached by taking the cheapest child at each step (a healthy one
        before a bad one)."""
        tree, cost, bad = self.tree, self.cost, self.bad
        while tree.level[cell] > level:
            kids = tree.children[cell]
            best = kids[0]
            for kid in kids:
                if (bad[kid] > 0, cost[kid]) < (bad[best] > 0, cost[best]):
                    best = kid
            cell = best
        return cell

    # -- bind and release -----------------------------------------------------------------------------------
    def bind(self, chain: int, level: int) -> int:
        """Bind a cell of ``level`` for one of the VCs' unbound virtual cells there; returns it.

        Candidates: the cheapest free cell of the level, and for each higher level whose split is safe, the
        cheapest free cell there and its cheapest descendant of the level. A healthy cell wins over a bad one (see
        the module docstring), then the least cost, then the lowest level (a split only when it spares
        low-priority jobs or bad hardware)."""
        if self.unbound[chain][level] <= 0:
            raise InvariantViolation(f"buddy allocator: no unbound virtual cell of level {level} in chain {chain}")
        best: tuple[bool, int, int, int, int] | None = None  # (bad, cost, level, top, target)
        for j in range(level, len(self.tree.chains[chain].sizes)):
            if not self.num_free[chain][j]:
                continue
            if j > level and not self._split_ok(chain, level, j):
                continue
            top = self._cheapest(chain, j)
            target = top if j == level else self._descend(top, level)
            key = (self.bad[target] > 0, self.cost[target], j, top, target)
            if best is None or key[:3] < best[:3]:
                best = key
            if not key[0] and key[1] == 0:
                break
        if best is None:
            raise InvariantViolation(
                f"buddy allocator: no free cell for level {level} of chain {self.tree.chains[chain].name} "
                f"(slack {self.slack(chain)}): the cell quotas were not safe"
            )
        _, _, _, top, target = best
        self._take(top, target)
        return target

    def bind_at(self, target: int) -> bool:
        """Bind exactly ``target`` for an unbound virtual cell of its level, if it is free or inside a free cell
        whose split is safe (taking back a placement made elsewhere, e.g. after a restart); False otherwise."""
        tree = self.tree
        chain, level = tree.chain[target], tree.level[target]
        if self.unbound[chain][level] <= 0:
            return False
        top = target
        while self.state[top] == INNER:
            top = tree.parent[top]
            if top < 0:
                return False
        if self.state[top] != FREE:
            return False
        if top != target and not self._split_ok(chain, level, tree.level[top]):
            return False
        self._take(top, target)
        return True

    def _take(self, top: int, target: int) -> None:
        tree = self.tree
        path = [target]
        while path[-1] != top:
            path.append(tree.parent[path[-1]])
        # Split from the top down: each cell on the path is split, its other children go on the free lists.
        self._remove_free(top, BOUND if top == target else SPLIT)
        for i in range(len(path) - 1, 0, -1):
            cell, keep = path[i], path[i - 1]
            for kid in tree.children[cell]:
                if kid != keep:
                    self._add_free(kid)
            self.state[keep] = BOUND if keep == target else SPLIT
        self.unbound[tree.chain[target]][tree.level[target]] -= 1

    def release(self, cell: int) -> None:
        """Unbind ``cell``: back on its free list, merged with its buddies while all of them are free."""
        if self.state[cell] != BOUND:
            raise InvariantViolation(f"buddy allocator: cell {cell} is not bound")
        tree = self.tree
        self.unbound[tree.chain[cell]][tree.level[cell]] += 1
        self._add_free(cell)
        parent = tree.parent[cell]
        while parent >= 0 and self.nfree_children[parent] == len(tree.children[parent]):
            for kid in tree.children[parent]:
                self._remove_free(kid, INNER)
            self._add_free(parent)
            parent = tree.parent[parent]

    # -- checks (tests) ---------------------------------------------------------------------------------------
    def check(self) -> None:
        """Recompute the allocator's invariants from scratch (O(cells)); raise InvariantViolation if one fails:
        every GPU lies in exactly one free or bound cell, cells below those are INNER and above them SPLIT, no
        SPLIT cell has only free children (buddies merge), the free lists and counts match, and safety holds."""
        tree, state = self.tree, self.state
        for leaf in tree.leaves:
            holders = [c for c in tree.ancestors[leaf] if state[c] in (FREE, BOUND)]
            if len(holders) != 1:
                raise InvariantViolation(f"GPU {tree.leaf_gpu[leaf]} is in {len(holders)} free or bound cells")
            h = tree.ancestors[leaf].index(holders[0])
            for i, c in enumerate(tree.ancestors[leaf]):
                want = INNER if i < h else SPLIT if i > h else state[c]
                if state[c] != want:
                    raise InvariantViolation(f"cell {c} is in state {state[c]}, expected {want}")
        num_free = [[0] * len(chain.sizes) for chain in tree.chains]
        for c in range(tree.num_cells):
            kids = tree.children[c]
            nfree = sum(1 for k in kids if state[k] == FREE)
            if nfree != self.nfree_children[c]:
                raise InvariantViolation(f"cell {c}: {nfree} free children, counted {self.nfree_children[c]}")
            if state[c] == SPLIT and kids and nfree == len(kids):
                raise InvariantViolation(f"cell {c}: every child is free but they were not merged")
            at = self._filed[c]
            if at == _BAD:
                filed = c in self._bad_free[tree.chain[c]][tree.level[c]]
                if not filed or not self.bad[c]:
                    raise InvariantViolation(f"cell {c}: filed as bad, but it is not (or it is missing)")
            else:
                filed = c in self._free[tree.chain[c]][tree.level[c]][at] if at >= 0 else False
                if filed and (at != self.cost[c] or self.bad[c]):
                    raise InvariantViolation(f"cell {c}: filed as healthy at cost {at}, but is bad or costs otherwise")
            if filed != (state[c] == FREE):
                raise InvariantViolation(f"cell {c}: free-list filing is off")
            if kids and self.bad[c] != sum(self.bad[k] for k in kids):
                raise InvariantViolation(f"cell {c}: bad GPU count is off")
            if state[c] == FREE:
                num_free[tree.chain[c]][tree.level[c]] += 1
        if num_free != self.num_free:
            raise InvariantViolation("free cell counts are off")
        for chain in range(len(tree.chains)):
            if min(self.slack(chain)) < 0:
                raise InvariantViolation(f"safety: chain {tree.chains[chain].name} slack {self.slack(chain)}")
