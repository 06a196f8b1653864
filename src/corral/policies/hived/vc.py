"""HiveD's virtual clusters as cell quotas (Zhao et al., "HiveD: Sharing a GPU Cluster for Deep Learning with
Guarantees", OSDI'20, §3.1): what cells each tenant's virtual cluster (VC) is made of.

A VC is a number of cells per chain and level of the cell tree (:mod:`corral.policies.hived.cells`), a
:class:`CellQuota` each: written out in the policy's ``vc_cells`` option (:func:`parse_vc_cells`, form
:data:`VC_CELLS_FORM`), or derived from the tenants' GPU quotas (:func:`derive_vc_cells`). :func:`check_vc_cells`
refuses quotas that the cluster's free cells could not all honour at once (the safety condition of the buddy
allocator, HiveD §3.2), and :func:`describe_vc` says a VC's cells in words.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from corral.core.errors import ConfigError
from corral.core.tenant import Tenant
from corral.policies.hived.cells import LEVEL_NAMES, CellTree

_LEVEL_BY_NAME = {name: level for level, name in LEVEL_NAMES.items()}


@dataclass(frozen=True, slots=True)
class CellQuota:
    """``count`` cells of level ``level`` of chain ``chain``: part of a VC."""

    chain: int
    level: int
    count: int


VcCells = dict[str, tuple[CellQuota, ...]]


VC_CELLS_FORM = (
    "TENANT=CELL+CELL...;TENANT=... with CELL = COUNTxLEVEL@TYPE/GPUS (COUNTx, @TYPE and /GPUS optional), LEVEL "
    "one of gpu, switch, node, rack, TYPE a GPU type and GPUS the GPUs per node of the chain meant (e.g. "
    "vision=4xnode+2xswitch@24GB)"
)
_CELL_RE = re.compile(r"^(?:(\d+)\s*x\s*)?([a-z]+)(?:@([^/]+?)(?:/(\d+))?)?$", re.IGNORECASE)


def parse_vc_cells(text: str, tree: CellTree) -> VcCells:
    """Explicit cell quotas (the ``vc_cells`` option, form :data:`VC_CELLS_FORM`), checked against ``tree``."""
    out: VcCells = {}
    for item in filter(None, (part.strip() for part in text.split(";"))):
        tenant, eq, cells = (part.strip() for part in item.partition("="))
        if not eq or not tenant or not cells:
            raise ConfigError(f"hived vc_cells: {item!r} is not TENANT=CELLS; expected {VC_CELLS_FORM}")
        if tenant in out:
            raise ConfigError(f"hived vc_cells: tenant {tenant!r} is given twice")
        counts: Counter[tuple[int, int]] = Counter()
        for cell in (c.strip() for c in cells.split("+")):
            chain, level, count = _parse_cell(cell, tenant, tree)
            counts[(chain, level)] += count
        out[tenant] = tuple(CellQuota(c, lv, n) for (c, lv), n in sorted(counts.items()) if n > 0)
    return out


def _parse_cell(text: str, tenant: str, tree: CellTree) -> tuple[int, int, int]:
    m = _CELL_RE.match(text)
    where = f"hived vc_cells: tenant {tenant!r}: cell {text!r}"
    if m is None or m.group(2).lower() not in _LEVEL_BY_NAME:
        raise ConfigError(
            f"{where}: expected COUNTxLEVEL@TYPE/GPUS (COUNTx, @TYPE and /GPUS optional) with LEVEL one of gpu, "
            "switch, node, rack"
        )
    count = int(m.group(1)) if m.group(1) else 1
    level = _LEVEL_BY_NAME[m.group(2).lower()]
    type_name, per_node = m.group(3), m.group(4)
    chains = [
        c
        for c in tree.chains
        if (type_name is None or c.type_name == type_name.strip())
        and (per_node is None or c.node_gpus == int(per_node))
        and c.level_index(level) is not None
    ]
    known = ", ".join(f"{c.name} ({'/'.join(c.level_name(i) for i in range(len(c.sizes)))})" for c in tree.chains)
    if not chains:
        what = "" if type_name is None else f" is of GPU type {type_name.strip()!r}"
        what += "" if per_node is None else f" with {per_node} GPUs per node"
        raise ConfigError(f"{where}: no chain of the cluster{what} with that level; the cluster's chains: {known}")
    if len(chains) > 1:
        names = ", ".join(c.name for c in chains)
        raise ConfigError(f"{where}: several chains match ({names}); name one as LEVEL@TYPE/GPUS_PER_NODE")
    chain = chains[0]
    index = chain.level_index(level)
    assert index is not None
    return chain.index, index, count


def derive_vc_cells(tree: CellTree, tenants: Mapping[str, Tenant]) -> VcCells:
    """Cell quotas from GPU quotas: every tenant with a quota of ``q`` GPUs becomes a VC.

    With ``G`` GPUs in the cluster and ``Q`` the quotas' sum, scale ``s = min(1, G / Q)``. Of each chain of
    ``G_c`` GPUs a VC gets ``floor(q s G_c / G)`` GPUs' worth of cells, as node cells first, then switch cells,
    then GPU cells (a VC of n nodes on a cluster of one 8-GPU chain gets n node cells: Philly's VCs of
    philly_vc.csv with ``--quotas philly-vc`` on ``352x8``). What the floors leave of ``floor(q s)`` becomes GPU
    cells wherever the chains have room left, in chain order. Rack cells are never derived (name them in
    ``vc_cells``). Every cell is at node level or below, so ``D_k <= G_c = C_k``: the result is safe."""
    total = tree.topology.num_gpus
    quotas = sorted((t.name, t.quota_gpus) for t in tenants.values() if t.quota_gpus)
    want = sum(q for _, q in quotas)
    if not quotas or total == 0:
        return {}
    left = [c.num_gpus for c in tree.chains]
    counts: dict[str, Counter[tuple[int, int]]] = {}
    extras: list[tuple[str, int]] = []
    for name, q in quotas:  # first every VC's share of each chain, then what the floors left, so they all fit
        share = q * min(total, want)  # GPUs x want: s * q = share / want, kept in integers
        cells = counts[name] = Counter()
        got = 0
        for chain in tree.chains:
            gpus = share * chain.num_gpus // (total * want)
            left[chain.index] -= gpus
            got += gpus
            for level in range(chain.node_level, -1, -1):
                n, gpus = divmod(gpus, chain.sizes[level])
                if n:
                    cells[(chain.index, level)] += n
        extras.append((name, share // want - got))
    for name, extra in extras:
        for chain in tree.chains:
            take = min(extra, left[chain.index])
            if take > 0:
                counts[name][(chain.index, 0)] += take
                left[chain.index] -= take
                extra -= take
    return {name: tuple(CellQuota(c, lv, n) for (c, lv), n in sorted(cells.items())) for name, cells in counts.items()}


def check_vc_cells(tree: CellTree, vcs: Mapping[str, Sequence[CellQuota]]) -> None:
    """ConfigError unless the cell quotas are safe on an empty cluster: ``D_k <= C_k`` per chain and level."""
    for chain in tree.chains:
        sizes = chain.sizes
        demand = [0] * len(sizes)
        for cells in vcs.values():
            for cq in cells:
                if cq.chain == chain.index:
                    demand[cq.level] += cq.count
        free = [0] * len(sizes)
        for top in tree.tops[chain.index]:
            free[tree.level[top]] += 1
        c = d = 0
        for level in range(len(sizes) - 1, -1, -1):
            c += free[level] * sizes[level]
            d += demand[level] * sizes[level]
            if d > c:
                raise ConfigError(
                    f"hived: the VCs' cells of chain {chain.name} at {chain.level_name(level)} level and above "
                    f"hold {d:,} GPUs, but the cluster's free cells there hold {c:,}: the cell quotas cannot all "
                    "be honoured at once (HiveD §3.2)"
                )


def describe_vc(tree: CellTree, cells: Sequence[CellQuota]) -> str:
    """``4 node + 1 switch of 24GB/8, 2 node of 12GB/2`` (empty: ``no cells``)."""
    by_chain: dict[int, list[str]] = {}
    for cq in sorted(cells, key=lambda c: (c.chain, -c.level)):
        chain = tree.chains[cq.chain]
        by_chain.setdefault(cq.chain, []).append(f"{cq.count} {chain.level_name(cq.level)}")
    parts = [f"{' + '.join(v)} of {tree.chains[c].name}" for c, v in by_chain.items()]
    return ", ".join(parts) if parts else "no cells"
