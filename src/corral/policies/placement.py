"""Placement strategies: which GPUs a job gets, given what is free.

- ``consolidated``: as few nodes as possible. A job that fits in one node goes to the node whose free GPU count
  is the smallest that still fits (best fit, which keeps large holes for large jobs); inside the node, to one
  PCIe switch when it can. A job bigger than any free node takes whole nodes, fullest first, then best-fits the
  rest. Tiresias (NSDI'19 §3.3) and Gandiva call this consolidation; it is what locality-sensitive jobs need.
- ``strict``: consolidated, or not at all: the job waits until it can have the fewest nodes its size allows
  (ceil(GPUs / node size)). YARN's capacity scheduler places gangs this way, and Tiresias (NSDI'19 §3.3) does
  it for the placement-sensitive jobs only. A fractional request is placed as under ``consolidated``.
- ``spread``: one GPU per node, over the nodes with the most free GPUs, round-robin if it needs more GPUs than
  there are such nodes. The opposite extreme, useful as a bound on the cost of ignoring locality.
- ``first-fit``: nodes in index order, taking what is free on each until the job has enough.
- ``fgd``: fragmentation gradient descent (Weng et al., ATC'23; :mod:`corral.policies.fragmentation`) for
  requests of one GPU, fractional or whole: the GPU whose node's fragmentation, weighed by how popular each
  request shape has been, grows least. Gangs of several GPUs are placed as under ``consolidated``.

Fractional requests (one GPU, share below 1000) use best fit over partly taken GPUs for ``consolidated``
(fill holes first), worst fit for ``spread`` (an empty GPU first, else the emptiest), the lowest-numbered GPU
that fits for ``first-fit``, and the least growth of fragmentation for ``fgd``.

A gang runs on one GPU type; among the types a job accepts, the first (in cluster order) that can hold it is
used. Every function returns ``None`` when the job does not fit now: that is an answer, not an error.
"""

from __future__ import annotations

from enum import StrEnum

from corral.core.job import FULL_GPU_MILLI, JobSpec
from corral.core.placement import Placement
from corral.policies.fragmentation import FragmentationScorer
from corral.policies.planner import Planner


class PlacementStrategy(StrEnum):
    CONSOLIDATED = "consolidated"
    STRICT = "strict"
    SPREAD = "spread"
    FIRST_FIT = "first-fit"
    FRAGMENTATION = "fgd"


def place(
    planner: Planner,
    spec: JobSpec,
    strategy: PlacementStrategy,
    types: tuple[int, ...],
    scorer: FragmentationScorer | None = None,
) -> Placement | None:
    """Find GPUs for ``spec`` among GPU types ``types`` and take them in ``planner``; ``None`` if none fit.

    ``scorer`` is what ``fgd`` weighs fragmentation with: the policy keeps one per run and feeds it every
    submitted job. Without one, ``fgd`` knows no request shapes, every candidate scores 0, and the choice falls
    to its tie-breaks (best fit); callers that sample every strategy (tests, planning helpers such as
    ``preemption.place_by_preempting``) rely on that rather than on an error."""
    if strategy is PlacementStrategy.FRAGMENTATION and spec.num_gpus == 1:
        return _place_fgd(planner, spec, types, scorer if scorer is not None else FragmentationScorer())
    if spec.gpu_milli < FULL_GPU_MILLI:
        return _place_fraction(planner, spec, strategy, types)
    n = spec.num_gpus
    fits = [t for t in types if planner.type_free(t) >= n]
    if not fits:
        return None
    if strategy is PlacementStrategy.CONSOLIDATED or strategy is PlacementStrategy.FRAGMENTATION:
        gpus = _consolidated(planner, n, fits)
    elif strategy is PlacementStrategy.STRICT:
        node = _one_node(planner, n, fits)
        if node is not None:
            gpus = _pick_on_node(planner, node, n)
        elif n <= planner.view.max_node_gpus(fits[0]):
            return None  # it fits one node of the type it would span, so several nodes are too many
        else:
            gpus = _several_nodes(planner, n, fits[0])
            topo = planner.topo
            fewest = -(-n // planner.view.max_node_gpus(fits[0]))
            if len({topo.gpu_node[g] for g in gpus}) > fewest:
                return None
    elif strategy is PlacementStrategy.SPREAD:
        gpus = _spread(planner, n, fits[0])
    else:
        gpus = _first_fit(planner, n, fits[0])
    return planner.take(spec, gpus)


# -- whole GPUs -----------------------------------------------------------------------------------------------
def _consolidated(planner: Planner, n: int, fits: list[int]) -> list[int]:
    node = _one_node(planner, n, fits)
    if node is not None:
        return _pick_on_node(planner, node, n)
    return _several_nodes(planner, n, fits[0])


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
            gpus += _pick_on_node(planner, fit, need)
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


def _pick_on_node(planner: Planner, node: int, n: int) -> list[int]:
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


def _spread(planner: Planner, n: int, t: int) -> list[int]:
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


def _first_fit(planner: Planner, n: int, t: int) -> list[int]:
    out: list[int] = []
    for node in planner.nodes_with_any_free(t):
        out += planner.node_free_gpus(node)[: n - len(out)]
        if len(out) == n:
            break
    return out


# -- a share of one GPU ---------------------------------------------------------------------------------------
def _place_fraction(
    planner: Planner, spec: JobSpec, strategy: PlacementStrategy, types: tuple[int, ...]
) -> Placement | None:
    milli = spec.gpu_milli
    mem = spec.gpu_mem_mib or 0
    best: tuple[int, int] | None = None  # (free_milli, gpu) of the chosen partly taken GPU
    if strategy is PlacementStrategy.STRICT:
        strategy = PlacementStrategy.CONSOLIDATED
    if strategy is PlacementStrategy.SPREAD:
        # Worst fit: an untouched GPU on the emptiest node, else the emptiest partly taken GPU.
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
    elif strategy is PlacementStrategy.CONSOLIDATED:
        # Best fit: the fullest partly taken GPU that still has room; an untouched GPU only if none has.
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
    else:
        # First fit by GPU number, over partly taken GPUs (a scan) and the first node with a free GPU.
        candidates: list[int] = []
        for t in types:
            candidates += [g for free, g in planner.partial_gpus(t, milli) if planner.gpu_free_mem_mib(g) >= mem]
            for node in planner.nodes_with_any_free(t):
                candidates.append(planner.node_free_gpus(node)[0])
                break
        if candidates:
            return planner.take(spec, [min(candidates)])
    if best is None:
        return None
    return planner.take(spec, [best[1]])


def _place_fgd(
    planner: Planner, spec: JobSpec, types: tuple[int, ...], scorer: FragmentationScorer
) -> Placement | None:
    if spec.gpu_milli < FULL_GPU_MILLI:
        gpu = scorer.choose_gpu(planner, spec, types)
        return None if gpu is None else planner.take(spec, [gpu])
    node = scorer.choose_node(planner, spec, types)
    # Any free GPU of the node scores the same; take it as consolidated would (the tightest PCIe switch).
    return None if node is None else planner.take(spec, _pick_on_node(planner, node, 1))
