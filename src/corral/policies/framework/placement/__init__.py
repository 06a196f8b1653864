"""Placement strategies: which GPUs a job gets, given what is free, as one table.

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
- ``fgd``: fragmentation gradient descent (Weng et al., ATC'23; :mod:`corral.policies.framework.placement.fgd`)
  for requests of one GPU, fractional or whole: the GPU whose node's fragmentation, weighed by how popular each
  request shape has been, grows least. Gangs of several GPUs are placed as under ``consolidated``.

Fractional requests (one GPU, share below 1000) use best fit over partly taken GPUs for ``consolidated``
(fill holes first), worst fit for ``spread`` (an empty GPU first, else the emptiest), the lowest-numbered GPU
that fits for ``first-fit``, and the least growth of fragmentation for ``fgd``.

A gang runs on one GPU type; among the types a job accepts, the first (in cluster order) that can hold it is
used. Every function returns ``None`` when the job does not fit now: that is an answer, not an error.

The strategies themselves are :mod:`corral.policies.framework.placement.packing` (all but ``fgd``) and
:mod:`corral.policies.framework.placement.fgd`; :func:`place` picks one through :data:`STRATEGIES`.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum

from corral.core.job import FULL_GPU_MILLI, JobSpec
from corral.core.placement import Placement
from corral.policies.framework.placement import packing
from corral.policies.framework.placement.fgd import FragmentationScorer, place_fgd
from corral.policies.framework.planner import Planner


class PlacementStrategy(StrEnum):
    CONSOLIDATED = "consolidated"
    STRICT = "strict"
    SPREAD = "spread"
    FIRST_FIT = "first-fit"
    FRAGMENTATION = "fgd"


WholeGpus = Callable[[Planner, int, list[int]], list[int] | None]
"""``(planner, n, fits) -> GPUs``: a gang of ``n`` whole GPUs on the first of the types ``fits`` that hold it."""
ShareOfOne = Callable[[Planner, JobSpec, tuple[int, ...]], Placement | None]
"""``(planner, spec, types) -> Placement``: a share of one GPU, taken in the planner."""

STRATEGIES: dict[PlacementStrategy, tuple[WholeGpus, ShareOfOne]] = {
    PlacementStrategy.CONSOLIDATED: (packing.consolidated, packing.fraction_best_fit),
    PlacementStrategy.STRICT: (packing.strict, packing.fraction_best_fit),
    PlacementStrategy.SPREAD: (packing.spread, packing.fraction_worst_fit),
    PlacementStrategy.FIRST_FIT: (packing.first_fit, packing.fraction_first_fit),
    # fgd places every one-GPU request itself (place_fgd, in place() below); these serve gangs.
    PlacementStrategy.FRAGMENTATION: (packing.consolidated, packing.fraction_first_fit),
}
"""What each strategy does with a gang of whole GPUs and with a share of one GPU."""


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
        return place_fgd(planner, spec, types, scorer if scorer is not None else FragmentationScorer())
    if spec.gpu_milli < FULL_GPU_MILLI:
        return STRATEGIES[strategy][1](planner, spec, types)
    gpus = find_whole(planner, spec.num_gpus, strategy, types)
    return None if gpus is None else planner.take(spec, gpus)


def find_whole(planner: Planner, n: int, strategy: PlacementStrategy, types: tuple[int, ...]) -> list[int] | None:
    """The ``n`` whole GPUs :func:`place` would take for a whole-GPU request with ``strategy`` (not fragmentation)
    among ``types``, without taking them; ``None`` if none fit. For a policy that takes them its own way."""
    fits = [t for t in types if planner.type_free(t) >= n]
    if not fits:
        return None
    return STRATEGIES[strategy][0](planner, n, fits)


__all__ = ["STRATEGIES", "PlacementStrategy", "ShareOfOne", "WholeGpus", "find_whole", "place"]
