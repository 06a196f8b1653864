"""The packing strategies: which GPUs a job gets, given what is free (all but ``fgd``, which is :mod:`.fgd`).

What each strategy means is written in :mod:`corral.policies.framework.placement`, whose table maps a
:class:`~corral.policies.framework.placement.PlacementStrategy` to the functions here:

- for a gang of whole GPUs, ``(planner, n, fits) -> GPUs or None``, where ``fits`` are the GPU types the job
  accepts that have ``n`` GPUs free, in cluster order (the gang runs on one type: the first that can hold it):
  :func:`consolidated`, :func:`strict`, :func:`spread`, :func:`first_fit`;
- for a share of one GPU, ``(planner, spec, types) -> Placement or None``, taken in the planner:
  :func:`fraction_best_fit` (``consolidated``, ``strict``: fill holes first), :func:`fraction_worst_fit`
  (``spread``: an empty GPU first, else the emptiest), :func:`fraction_first_fit` (``first-fit``: the
  lowest-numbered GPU that fits).

``None`` means the job does not fit now: an answer, not an error.
"""

from __future__ import annotations

from corral.core.job import JobSpec
from corral.core.placement import Placement
from corral.policies.framework.planner import Planner


# -- whole GPUs -----------------------------------------------------------------------------------------------
def consolidated(planner: Planner, n: int, fits: list[int]) -> list[int] | None:
    """As few nodes as possible: best fit on one node, else whole nodes, fullest first, then best fit."""
    node = _one_node(planner, n, fits)
    if node is not None:
        return pick_on_node(planner, node, n)
    return _several_nodes(planner, n, fits[0])


def strict(planner: Planner, n: int, fits: list[int]) -> list[int] | None:
    """Consolidated, or not at all: ``None`` unless the gang gets the fewest nodes its size allows."""
    node = _one_node(planner, n, fits)
    if node is not None:
        return pick_on_node(planner, node, n)
    if n <= planner.view.max_node_gpus(fits[0]):
        return None  # it fits one node of the type it would span, so several nodes are too many
    gpus = _several_nodes(planner, n, fits[0])
    topo = planner.topo
    fewest = -(-n // planner.view.max_node_gpus(fits[0]))
    if len({topo.gpu_node[g] for g in gpus}) > fewest:
        return None
    return gpus


def _one_node(planner: Planner, n: int, fits: list[int]) -> int | None:
    """Best fit on one node: the first with the smallest free count >= n, over all acceptable types."""
    max_node_gpus = planner.view.max_node_gpus
    if len(fits) == 1:  # most jobs, in a cluster of one type or with the other types full
        t = fits[0]
        for k in range(n, max_node_gpus(t) + 1):
            node = planner.first_with_free(t, k)
            if node is not None:
                return node
        return None
    sizes = [max_node_gpus(t) for t in fits]
    for k in range(n, max(sizes) + 1):
        for t, size in zip(fits, sizes, strict=True):
            if k <= size:
                node = planner.first_with_free(t, k)
                if node is not None:
                    return node
    return None


def _several_nodes(planner: Planner, n: int, t: int) -> list[int]:
    """Several nodes of type ``t``: whole nodes, fullest first, then best fit for the remainder."""
    top = planner.view.max_node_gpus(t)
    gpus: list[int] = []
    used: set[int] = set()
    need = n
    while need > 0:
        fit = _best_fit_node(planner, t, need, top, used)
        if fit is not None:
            gpus += pick_on_node(planner, fit, need)
            break
        fullest = _fullest_node(planner, t, top, used)
        assert fullest is not None  # type_free(t) >= n guarantees free GPUs remain
        free = planner.node_free_gpus(fullest)
        gpus += free
        need -= len(free)
        used.add(fullest)
    return gpus


def _best_fit_node(planner: Planner, t: int, need: int, top: int, used: set[int]) -> int | None:
    for k in range(need, top + 1):
        node = planner.first_with_free(t, k, used)
        if node is not None:
            return node
    return None


def _fullest_node(planner: Planner, t: int, top: int, used: set[int]) -> int | None:
    for k in range(top, 0, -1):
        node = planner.first_with_free(t, k, used)
        if node is not None:
            return node
    return None


def pick_on_node(planner: Planner, node: int, n: int) -> list[int]:
    """``n`` free GPUs of ``node``, under one PCIe switch when possible (the tightest switch that fits)."""
    free = planner.node_free_gpus(node)
    if n == len(free):
        return free
    switch = planner.topo.gpu_switch
    groups: dict[int, list[int]] = {}
    for g in free:
        groups.setdefault(switch[g], []).append(g)
    if len(groups) == 1:
        return free[:n]
    fitting = [grp for grp in groups.values() if len(grp) >= n]
    if fitting:
        return min(fitting, key=len)[:n]
    out: list[int] = []
    for grp in sorted(groups.values(), key=len, reverse=True):
        out += grp[: n - len(out)]
        if len(out) == n:
            break
    return out


def spread(planner: Planner, n: int, fits: list[int]) -> list[int] | None:
    """One GPU per node, over the nodes with the most free GPUs (round-robin if there are fewer such nodes)."""
    t = fits[0]
    top = planner.view.max_node_gpus(t)
    nodes: list[int] = []
    capacity = 0
    for k in range(top, 0, -1):
        for node in planner.nodes_with_free(t, k):
            nodes.append(node)
            capacity += k
        if len(nodes) >= n:
            break
    assert capacity >= n
    free = {node: planner.node_free_gpus(node) for node in nodes[:n]} if len(nodes) >= n else None
    if free is not None:
        return [free[node][0] for node in nodes[:n]]
    # Fewer nodes than GPUs wanted: deal GPUs round-robin over all nodes with free GPUs.
    pools = [planner.node_free_gpus(node) for node in nodes]
    out: list[int] = []
    depth = 0
    while len(out) < n:
        for pool in pools:
            if depth < len(pool):
                out.append(pool[depth])
                if len(out) == n:
                    break
        depth += 1
    return out


def first_fit(planner: Planner, n: int, fits: list[int]) -> list[int] | None:
    """Nodes in index order, taking what is free on each until the gang has enough."""
    out: list[int] = []
    for node in planner.nodes_with_any_free(fits[0]):
        out += planner.node_free_gpus(node)[: n - len(out)]
        if len(out) == n:
            break
    return out


# -- a share of one GPU ---------------------------------------------------------------------------------------
def fraction_worst_fit(planner: Planner, spec: JobSpec, types: tuple[int, ...]) -> Placement | None:
    """Worst fit (``spread``): an untouched GPU on the emptiest node, else the emptiest partly taken GPU."""
    milli = spec.gpu_milli
    mem = spec.gpu_mem_mib or 0
    best: tuple[int, int] | None = None  # (free_milli, gpu) of the chosen partly taken GPU
    for t in types:
        node = _fullest_node(planner, t, planner.view.max_node_gpus(t), set())
        if node is not None:
            return planner.take(spec, [planner.node_free_gpus(node)[0]])
    for t in types:
        for free, g in planner.partial_gpus(t, milli, descending=True):
            if planner.gpu_free_mem_mib(g) >= mem:
                if best is None or free > best[0]:
                    best = (free, g)
                break
    if best is None:
        return None
    return planner.take(spec, [best[1]])


def fraction_best_fit(planner: Planner, spec: JobSpec, types: tuple[int, ...]) -> Placement | None:
    """Best fit (``consolidated``, ``strict``): the fullest partly taken GPU that still has room; an untouched GPU
    only if none has."""
    milli = spec.gpu_milli
    mem = spec.gpu_mem_mib or 0
    best: tuple[int, int] | None = None  # (free_milli, gpu) of the chosen partly taken GPU
    for t in types:
        for free, g in planner.partial_gpus(t, milli):
            if planner.gpu_free_mem_mib(g) >= mem:
                if best is None or free < best[0]:
                    best = (free, g)
                break
    if best is None:
        for t in types:
            node = _best_fit_node(planner, t, 1, planner.view.max_node_gpus(t), set())
            if node is not None:
                return planner.take(spec, [planner.node_free_gpus(node)[0]])
        return None
    return planner.take(spec, [best[1]])


def fraction_first_fit(planner: Planner, spec: JobSpec, types: tuple[int, ...]) -> Placement | None:
    """First fit by GPU number (``first-fit``), over partly taken GPUs (a scan) and the first node with a free
    GPU."""
    milli = spec.gpu_milli
    mem = spec.gpu_mem_mib or 0
    candidates: list[int] = []
    for t in types:
        candidates += [g for free, g in planner.partial_gpus(t, milli) if planner.gpu_free_mem_mib(g) >= mem]
        for node in planner.nodes_with_any_free(t):
            candidates.append(planner.node_free_gpus(node)[0])
            break
    if candidates:
        return planner.take(spec, [min(candidates)])
    return None
