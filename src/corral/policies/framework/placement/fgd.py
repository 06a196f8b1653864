"""Fragmentation Gradient Descent (FGD): place GPU-sharing requests where they fragment the cluster least.

The ``fgd`` placement strategy (:func:`place_fgd`, for requests of one GPU, fractional or whole; gangs of several
GPUs are placed as ``consolidated``) and the scorer it weighs candidates with (:class:`FragmentationScorer`).

After Weng et al., "Beware of Fragmentation: Scheduling GPU-Sharing Workloads with Fragmentation Gradient
Descent", USENIX ATC'23. The paper's trace (Alibaba's openb, ``corral.sim.traces.read_openb``) asks for parts
of GPUs, and its authors found that the main waste is free GPU share that no waiting request can use.

Definitions (paper §4; corral schedules GPUs, so the paper's CPU and host-memory checks are left out):

- A *task shape* m is what decides where a request can go and what it takes: ``(num_gpus, gpu_milli,
  gpu_types)`` (:class:`TaskShape`). Its *popularity* p_m is the fraction of submitted requests of that shape,
  learnt online by :class:`WorkloadShapes` (the paper assumes the target workload is known; learning it from
  the arrivals so far needs no oracle, and converges to the same distribution on a stationary trace).
- The fragment of a node n for shape m, F_n(m), in milli-GPU: if m cannot be placed on n at all (the node's
  GPU type is not one m accepts, no GPU has ``gpu_milli`` free for a fractional m, fewer than ``num_gpus``
  entirely free GPUs for a whole-GPU m), every free share on n is fragment for m. Otherwise the free share on
  the GPUs that cannot hold m is: for a fractional m of share s, the GPUs with less than s free; for a
  whole-GPU m, the partly used GPUs (their free share; an entirely free GPU is not a fragment).
- The node's fragmentation is F_n = sum over shapes of p_m x F_n(m): the free share the expected next
  request could not use there (:func:`node_fragmentation`).
- FGD places a request on the GPU whose node's F_n grows least (usually: shrinks most), the steepest descent
  of the cluster's total fragmentation. Ties go to best fit (least free share on the GPU, then the node with
  fewest entirely free GPUs), then to the lowest GPU index among partly used GPUs (for an untouched GPU: the
  node the best-fit index offers first, as ``consolidated`` placement does), so the choice is deterministic.

Why this is cheap (no scan of every GPU or node per placement). Placing share d on a GPU with f free changes
F_n by an amount that depends on far less than the node's whole vector of free shares:

- for a fractional shape s accepted by the node's type, by ``g_s(f - d) - g_s(f)`` with ``g_s(x) = x if x < s
  else 0``: whether or not the node could hold s before or after, the other GPUs' contribution cancels (if the
  chosen GPU was the only one with s free, every other GPU was already fragment);
- for a whole-GPU shape of k GPUs, only through c, the node's count of entirely free GPUs: taking from a
  partly used GPU changes F_n(m) by -d; taking d from an entirely free GPU by 1000 - d when c > k (one more
  partly used GPU), by 1000k - d when c = k (the node can no longer hold m: all of it becomes fragment), and
  by -d when c < k (it could not hold m anyway);
- for a shape the node's type does not accept, by -d.

So the change is a function of (GPU type, f) for partly used GPUs and of (GPU type, c) for entirely free ones.
Untouched GPUs are visited once per (type, c) through the planner's best-fit buckets (at most a node's GPU
count per type). For partly used GPUs, the change as a function of f is piecewise linear with breakpoints at
s and s + d for each shape, and non-decreasing between breakpoints; so only the first fitting GPU of each
piece needs scoring, and the ascending walk over ``planner.partial_gpus`` stops as soon as no later piece
can beat the best choice so far. Weights are integer counts (popularity without dividing by the total,
which scales every node alike), so the arithmetic is exact and ties are real ties.

Only the ``top_k`` most popular shapes are weighed (:data:`DEFAULT_TOP_K` = 16; on openb's default trace the
24 distinct shapes' top 16 cover 99.3% of the pods). The rest are rare, and each weighed shape adds two
breakpoints: the cost per placement grows with k, the benefit of the long tail does not.

Simplifications, stated: GPU memory is checked for every candidate GPU (a GPU without the request's memory
free is never chosen) but is not part of the measure (openb gives no memory per request); a shape that can
never fit anywhere (more GPUs than any node has, a type absent from the cluster) is counted, which changes
every candidate's score by the same amount and so never changes a choice.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from itertools import accumulate
from typing import NamedTuple

from corral.core.cluster import Topology
from corral.core.job import FULL_GPU_MILLI, JobSpec
from corral.core.placement import Placement
from corral.policies.framework.placement.packing import pick_on_node
from corral.policies.framework.planner import Planner

DEFAULT_TOP_K = 16


class TaskShape(NamedTuple):
    """What decides where a request fits and what it takes. ``gpu_milli`` is 1000 for whole-GPU requests;
    ``gpu_types`` empty means any type. GPU memory is left out (see the module docstring)."""

    num_gpus: int
    gpu_milli: int
    gpu_types: tuple[str, ...]

    @classmethod
    def of(cls, spec: JobSpec) -> TaskShape:
        return cls(spec.num_gpus, spec.gpu_milli, spec.gpu_types)

    def accepts(self, type_name: str) -> bool:
        return not self.gpu_types or type_name in self.gpu_types


class WorkloadShapes:
    """How often each task shape has been asked for: popularity = count / total, learnt online.

    ``version`` changes with every observation, so that a user of :meth:`top` can tell its cached tables are
    stale."""

    __slots__ = ("_counts", "total", "version")

    def __init__(self, specs: Iterable[JobSpec] = ()) -> None:
        self._counts: dict[TaskShape, int] = {}
        self.total = 0
        self.version = 0
        for spec in specs:
            self.observe(spec)

    def observe(self, spec: JobSpec) -> None:
        shape = TaskShape.of(spec)
        self._counts[shape] = self._counts.get(shape, 0) + 1
        self.total += 1
        self.version += 1

    def count(self, shape: TaskShape) -> int:
        return self._counts.get(shape, 0)

    def popularity(self, shape: TaskShape) -> float:
        return self._counts.get(shape, 0) / self.total if self.total else 0.0

    def top(self, k: int) -> list[tuple[TaskShape, int]]:
        """The ``k`` most frequent shapes with their counts, most frequent first (ties: by shape, so the cut
        is deterministic)."""
        return heapq.nsmallest(k, ((s, c) for s, c in self._counts.items()), key=lambda e: (-e[1], e[0]))

    def __len__(self) -> int:
        return len(self._counts)


# -- the measure, on a node's vector of free shares (tests, reports) --------------------------------------------
def task_fragment(free_milli: Sequence[int], shape: TaskShape, type_ok: bool = True) -> int:
    """F_n(m): the free milli-GPU on a node (free share per GPU ``free_milli``) that a task of ``shape`` cannot
    use. ``type_ok`` says whether the node's GPU type is one the shape accepts."""
    total = sum(free_milli)
    if not type_ok:
        return total
    if shape.gpu_milli < FULL_GPU_MILLI:
        s = shape.gpu_milli
        if max(free_milli, default=0) < s:
            return total
        return sum(f for f in free_milli if f < s)
    if sum(1 for f in free_milli if f == FULL_GPU_MILLI) < shape.num_gpus:
        return total
    return sum(f for f in free_milli if f < FULL_GPU_MILLI)


def node_fragmentation(free_milli: Sequence[int], gpu_type: str, weights: Iterable[tuple[TaskShape, float]]) -> float:
    """F_n = sum of weight x F_n(m) over ``weights`` (shape, popularity or count), for a node of ``gpu_type``."""
    return sum(w * task_fragment(free_milli, shape, shape.accepts(gpu_type)) for shape, w in weights)


# -- the placement --------------------------------------------------------------------------------------------
class _Table(NamedTuple):
    """The weighed shapes, for the GPU types that accept the same ones: fractional ``(share, count)`` and whole
    ``(gpus, count)`` accepted by those types; ``other``, the total count of the shapes they do not accept (each
    adds -d to every candidate there); ``flat``, the count of every shape that adds -d when a partly used GPU is
    chosen (whole or other)."""

    fractional: list[tuple[int, int]]
    whole: list[tuple[int, int]]
    other: int
    flat: int


class _Pieces(NamedTuple):
    """For one (type, share d): ``bounds[i]`` starts the i-th piece of f (free share) over which the change
    in fragmentation is linear and non-decreasing; ``floor[i]`` is the least change over pieces i and later."""

    bounds: list[int]
    floor: list[int]


# A candidate's sort key: (change in fragmentation, free share of the GPU, entirely free GPUs on its node
# (0 for a partly used GPU), GPU). Smallest wins.
_Key = tuple[int, int, int, int]


class FragmentationScorer:
    """FGD for single-GPU requests (fractional, or one whole GPU), over a :class:`Planner`.

    Feed it every submitted request with :meth:`observe`; ``place`` in :mod:`corral.policies.framework.placement` calls
    :meth:`choose_gpu` (fractional) and :meth:`choose_node` (one whole GPU). Gangs of several GPUs are not its
    business: they keep consolidated placement."""

    __slots__ = ("_full", "_pieces", "_table_of", "_tables", "_topo", "_version", "shapes", "top_k")

    def __init__(self, shapes: WorkloadShapes | None = None, *, top_k: int = DEFAULT_TOP_K) -> None:
        if top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {top_k}")
        self.shapes = shapes if shapes is not None else WorkloadShapes()
        self.top_k = top_k
        self._topo: Topology | None = None
        self._version = -1
        # Distinct tables, and each GPU type's index into them: types that accept the same shapes (all of them,
        # when no shape names a type) share one table and so share the caches below, keyed by table index.
        self._tables: list[_Table] = []
        self._table_of: list[int] = []
        self._pieces: dict[tuple[int, int], _Pieces] = {}
        self._full: dict[tuple[int, int, int], int] = {}

    def observe(self, spec: JobSpec) -> None:
        self.shapes.observe(spec)

    # -- choices ------------------------------------------------------------------------------------------
    def choose_gpu(self, planner: Planner, spec: JobSpec, types: tuple[int, ...]) -> int | None:
        """The GPU (of a type in ``types``, with ``spec.gpu_milli`` share and its memory free) whose node's
        fragmentation grows least when ``spec`` takes its share there; ``None`` if none fits."""
        self._refresh(planner.topo)
        d = spec.gpu_milli
        mem = spec.gpu_mem_mib or 0
        best = self._best_untouched(planner, types, d, mem)
        for t in types:
            best = self._best_partial(planner, t, d, mem, best)
        return None if best is None else best[3]

    def choose_node(self, planner: Planner, spec: JobSpec, types: tuple[int, ...]) -> int | None:
        """For one whole GPU: the node (with an entirely free GPU of a type in ``types``) whose fragmentation
        grows least when one of its free GPUs is taken. Which free GPU does not change the score; the caller
        picks it (``placement`` keeps PCIe switches whole)."""
        self._refresh(planner.topo)
        best = self._best_untouched(planner, types, FULL_GPU_MILLI, spec.gpu_mem_mib or 0)
        return None if best is None else planner.topo.gpu_node[best[3]]

    def _best_untouched(self, planner: Planner, types: tuple[int, ...], d: int, mem: int) -> _Key | None:
        """The best entirely free GPU: one candidate per (type, free count on the node), as best fit offers."""
        best: _Key | None = None
        for t in types:
            if not planner.type_free(t):
                continue
            for c in range(1, planner.view.max_node_gpus(t) + 1):
                node = next(iter(planner.nodes_with_free(t, c)), None)
                if node is None:
                    continue
                g = planner.node_free_gpus(node)[0]
                if planner.gpu_free_mem_mib(g) < mem:
                    break  # an entirely free GPU has its type's whole memory: no GPU of this type has enough
                key = (self._full_delta(t, d, c), FULL_GPU_MILLI, c, g)
                if best is None or key < best:
                    best = key
        return best

    def _best_partial(self, planner: Planner, t: int, d: int, mem: int, best: _Key | None) -> _Key | None:
        """Walk the partly used GPUs of type ``t`` with ``d`` free, ascending, scoring the first fitting GPU of
        each piece (see the module docstring) and stopping when no later piece can beat ``best``."""
        if d >= FULL_GPU_MILLI:
            return best
        pieces = self._pieces_for(t, d)
        bounds, floor = pieces.bounds, pieces.floor
        last = len(bounds) - 1
        i = 0
        scored = -1  # the piece whose best GPU has been scored
        for f, g in planner.partial_gpus(t, d):
            while i < last and f >= bounds[i + 1]:
                i += 1
            # Every GPU from here on has at least f free and scores at least floor[i]: done when neither a
            # lower score nor a tie with less free share is left.
            if best is not None and (floor[i] > best[0] or (floor[i] == best[0] and f > best[1])):
                break
            if scored == i or planner.gpu_free_mem_mib(g) < mem:
                continue
            scored = i
            key = (self._partial_delta(t, d, f), f, 0, g)
            if best is None or key < best:
                best = key
        return best

    # -- the change in fragmentation (integer counts as weights; see the module docstring) ----------------------
    def _partial_delta(self, t: int, d: int, f: int) -> int:
        """Change of the node's fragmentation when share ``d`` is taken from a partly used GPU with ``f`` free."""
        table = self._tables[self._table_of[t]]
        after = f - d
        delta = 0
        for s, w in table.fractional:
            delta += w * ((after if after < s else 0) - (f if f < s else 0))
        return delta - d * table.flat

    def _full_delta(self, t: int, d: int, c: int) -> int:
        """Change of the node's fragmentation when share ``d`` is taken from an entirely free GPU of a node of type
        ``t`` with ``c`` entirely free GPUs."""
        u = self._table_of[t]
        key = (u, d, c)
        got = self._full.get(key)
        if got is not None:
            return got
        table = self._tables[u]
        after = FULL_GPU_MILLI - d
        delta = sum(w * after for s, w in table.fractional if after < s)
        for k, w in table.whole:
            if c > k:
                delta += w * after
            elif c == k:
                delta += w * (FULL_GPU_MILLI * k - d)
            else:
                delta -= w * d
        delta -= d * table.other
        self._full[key] = delta
        return delta

    def _pieces_for(self, t: int, d: int) -> _Pieces:
        key = (self._table_of[t], d)
        got = self._pieces.get(key)
        if got is not None:
            return got
        cuts = {d}
        for s, _ in self._tables[key[0]].fractional:
            cuts.update(b for b in (s, s + d) if d < b < FULL_GPU_MILLI)
        bounds = sorted(cuts)
        # Each piece's least change is at its first f (non-decreasing within a piece); floor = suffix minimum.
        lows = [self._partial_delta(t, d, b) for b in bounds]
        floor = list(accumulate(reversed(lows), min))[::-1]
        pieces = self._pieces[key] = _Pieces(bounds, floor)
        return pieces

    def _refresh(self, topo: Topology) -> None:
        """Rebuild the per-type tables when the popularity (or the cluster) changed since they were built."""
        if self._version == self.shapes.version and self._topo is topo:
            return
        self._topo = topo
        self._version = self.shapes.version
        self._pieces.clear()
        self._full.clear()
        top = self.shapes.top(self.top_k)
        self._tables = []
        self._table_of = []
        index: dict[tuple[bool, ...], int] = {}
        typed = [shape.gpu_types for shape, _ in top]
        anywhere = not any(typed)
        for name in topo.type_names:
            accepted = (True,) * len(top) if anywhere else tuple(not types or name in types for types in typed)
            u = index.get(accepted)
            if u is None:
                u = index[accepted] = len(self._tables)
                self._tables.append(_table(top, accepted))
            self._table_of.append(u)


def _table(top: list[tuple[TaskShape, int]], accepted: tuple[bool, ...]) -> _Table:
    fractional: list[tuple[int, int]] = []
    whole: list[tuple[int, int]] = []
    other = 0
    for (shape, w), ok in zip(top, accepted, strict=True):
        if not ok:
            other += w
        elif shape.gpu_milli < FULL_GPU_MILLI:
            fractional.append((shape.gpu_milli, w))
        else:
            whole.append((shape.num_gpus, w))
    return _Table(fractional, whole, other, other + sum(w for _, w in whole))


def place_fgd(planner: Planner, spec: JobSpec, types: tuple[int, ...], scorer: FragmentationScorer) -> Placement | None:
    """Place a one-GPU request (fractional or whole) where ``scorer`` says fragmentation grows least, and take it
    in ``planner``; ``None`` if it fits nowhere now."""
    if spec.gpu_milli < FULL_GPU_MILLI:
        gpu = scorer.choose_gpu(planner, spec, types)
        return None if gpu is None else planner.take(spec, [gpu])
    node = scorer.choose_node(planner, spec, types)
    # Any free GPU of the node scores the same; take it as consolidated would (the tightest PCIe switch).
    return None if node is None else planner.take(spec, pick_on_node(planner, node, 1))
