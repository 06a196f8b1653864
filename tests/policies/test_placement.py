"""Placement strategies, table-driven on small hand-built clusters.

Each case names a cluster, the GPUs already taken (whole, or ``{gpu: milli}`` for shares), a job and a
strategy, and the exact GPUs the job must get (``None``: it does not fit now). GPUs are numbered node by node:
with 4 GPUs per node, node 0 has GPUs 0-3, node 1 has 4-7, node 2 has 8-11, node 3 has 12-15.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from builders import cluster, job, occupy, state
from corral.core.cluster import Cluster
from corral.core.job import JobSpec
from corral.policies.framework.contract import allowed_types
from corral.policies.framework.placement import PlacementStrategy, place
from corral.policies.framework.planner import Planner

CONS, SPREAD, FIRST = PlacementStrategy.CONSOLIDATED, PlacementStrategy.SPREAD, PlacementStrategy.FIRST_FIT

N3x4 = cluster(nodes=3, gpus=4)
N4x4 = cluster(nodes=4, gpus=4)
N2x4 = cluster(nodes=2, gpus=4)
N1x4 = cluster(nodes=1, gpus=4)
SW2 = cluster(nodes=1, gpus=4, gpus_per_switch=2)  # switches {0,1} {2,3}
SW4 = cluster(nodes=1, gpus=8, gpus_per_switch=4)  # switches {0-3} {4-7}
AB = cluster(gpus=[4, 4], types=["A", "B"])  # A: 0-3, B: 4-7
A4B2 = cluster(gpus=[4, 2], types=["A", "B"])  # A: 0-3, B: 4-5
A2B4 = cluster(gpus=[2, 4], types=["A", "B"])  # A: 0-1, B: 2-5


@dataclass
class Case:
    name: str
    cluster: Cluster
    busy: Collection[int] | Mapping[int, int]
    spec: JobSpec
    strategy: PlacementStrategy
    expected: tuple[int, ...] | None
    busy_mem: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


CASES = [
    # -- consolidated, whole GPUs ----------------------------------------------------------------------------
    # free per node: 3 (1-3), 2 (6-7), 4 (8-11)
    Case("best fit: 2 goes to the node with exactly 2 free", N3x4, {0, 4, 5}, job("j", 2), CONS, (6, 7)),
    Case("best fit: 3 goes to the node with 3 free", N3x4, {0, 4, 5}, job("j", 3), CONS, (1, 2, 3)),
    Case("best fit: 4 needs the empty node", N3x4, {0, 4, 5}, job("j", 4), CONS, (8, 9, 10, 11)),
    Case("best fit: 1 takes the smallest hole (2 free)", N3x4, {0, 4, 5}, job("j", 1), CONS, (6,)),
    Case("one PCIe switch rather than two", SW2, {0}, job("j", 2), CONS, (2, 3)),
    Case("the tightest switch that fits", SW4, {0, 1}, job("j", 2), CONS, (2, 3)),
    Case("a larger switch when the small one is too small", SW4, {0, 1}, job("j", 3), CONS, (4, 5, 6)),
    Case("two switches when no one switch fits", SW2, {0, 2}, job("j", 2), CONS, (1, 3)),
    # free per node: 1, 2, 4, 4 -> 6 GPUs: a whole node (4) + the best fit for 2 (node 1): 2 nodes
    Case("multi-node: fewest nodes", N4x4, {0, 1, 2, 4, 5}, job("j", 6), CONS, (6, 7, 8, 9, 10, 11)),
    # 9 of 16: 4 + 4 + 1, three nodes (the minimum)
    Case("multi-node: whole nodes then the rest", N4x4, set(), job("j", 9), CONS, (*range(8), 8)),
    Case("multi-node: fullest node first", cluster(gpus=[2, 8]), set(), job("j", 9), CONS, (0, *range(2, 10))),
    Case("not first-fit: skips the 1-GPU hole", N3x4, {0, 1, 2}, job("j", 3), CONS, (4, 5, 6)),
    # -- spread ---------------------------------------------------------------------------------------------
    Case("spread: one GPU per node", N3x4, set(), job("j", 3), SPREAD, (0, 4, 8)),
    # free per node: 1, 4, 2, 3 -> the two nodes with the most free GPUs
    Case("spread: emptiest nodes first", N4x4, {0, 1, 2, 8, 9, 12}, job("j", 2), SPREAD, (4, 13)),
    Case("spread: round-robin past one per node", N2x4, set(), job("j", 4), SPREAD, (0, 1, 4, 5)),
    Case("spread: round-robin over uneven nodes", N2x4, {0, 1, 2}, job("j", 3), SPREAD, (3, 4, 5)),
    # -- first-fit ------------------------------------------------------------------------------------------
    Case("first-fit: nodes in index order", N3x4, {0, 1, 2}, job("j", 3), FIRST, (3, 4, 5)),
    Case("first-fit: the first free GPU", N3x4, {0, 1, 2}, job("j", 1), FIRST, (3,)),
    Case("first-fit: fills up to the whole cluster", N2x4, {5}, job("j", 7), FIRST, (0, 1, 2, 3, 4, 6, 7)),
    # -- a share of one GPU (free: GPU 0 700, GPU 1 300, GPU 2 500, GPU 3 untouched) ------------------------
    Case("fraction best fit: the fullest that fits", N1x4, {0: 300, 1: 700, 2: 500}, job("j", milli=250), CONS, (1,)),
    Case("fraction best fit: 400 skips 300", N1x4, {0: 300, 1: 700, 2: 500}, job("j", milli=400), CONS, (2,)),
    Case("fraction best fit: 600 needs 700", N1x4, {0: 300, 1: 700, 2: 500}, job("j", milli=600), CONS, (0,)),
    Case("fraction best fit: untouched last", N1x4, {0: 300, 1: 700, 2: 500}, job("j", milli=800), CONS, (3,)),
    Case("fraction worst fit: untouched first", N1x4, {0: 300, 1: 700, 2: 500}, job("j", milli=250), SPREAD, (3,)),
    Case(
        "fraction worst fit: then the emptiest",
        N1x4,
        {0: 300, 1: 700, 2: 500, 3: 1000},
        job("j", milli=250),
        SPREAD,
        (0,),
    ),
    # node 0 has 1 free GPU, node 1 has 2: best fit keeps node 1's pair; worst fit uses it
    Case("fraction best fit: the tightest node", N2x4, {0, 1, 2, 4, 5}, job("j", milli=100), CONS, (3,)),
    Case("fraction worst fit: the emptiest node", N2x4, {0, 1, 2, 4, 5}, job("j", milli=100), SPREAD, (6,)),
    Case("fraction first-fit: lowest GPU that fits", N1x4, {0: 900, 1: 500}, job("j", milli=250), FIRST, (1,)),
    Case("fraction first-fit: a small one fits GPU 0", N1x4, {0: 900, 1: 500}, job("j", milli=50), FIRST, (0,)),
    Case("fraction first-fit: untouched below partial", N1x4, {2: 500}, job("j", milli=250), FIRST, (0,)),
    # GPU 0: 500 milli free but only 6384 MiB; GPU 1: 300 milli free, 6384 MiB (fillers hold 10000 MiB each)
    Case(
        "fraction: memory rules a GPU out",
        cluster(nodes=1, gpus=3),
        {0: 500, 1: 700},
        job("j", milli=250, mem=8000),
        CONS,
        (2,),
        busy_mem=10000,
    ),
    Case(
        "fraction: memory fits",
        cluster(nodes=1, gpus=3),
        {0: 500, 1: 700},
        job("j", milli=250, mem=6000),
        CONS,
        (1,),
        busy_mem=10000,
    ),
    # -- GPU types --------------------------------------------------------------------------------------------
    Case("types: only B", AB, set(), job("j", 2, types=["B"]), CONS, (4, 5)),
    Case("types: only B, spread", AB, set(), job("j", 2, types=["B"]), SPREAD, (4, 5)),
    Case("types: only B, first-fit", AB, set(), job("j", 2, types=["B"]), FIRST, (4, 5)),
    Case("types: best fit across types", A4B2, set(), job("j", 2), CONS, (4, 5)),
    Case("types: first type that can hold it", A2B4, set(), job("j", 3), FIRST, (2, 3, 4)),
    Case("types: never mixed", A2B4, set(), job("j", 3), SPREAD, (2, 3, 4)),
    Case("types: fraction on B only", AB, {0: 500}, job("j", milli=250, types=["B"]), CONS, (4,)),
    # -- does not fit now -------------------------------------------------------------------------------------
    *[
        Case(f"none: {what} ({s.value})", c, busy, spec, s, None)
        for s in PlacementStrategy
        for what, c, busy, spec in [
            ("more GPUs than free", N1x4, {0}, job("j", 4)),
            ("more GPUs than the cluster", N1x4, set(), job("j", 5)),
            ("enough in total, not of the type", AB, {4, 5, 6}, job("j", 2, types=["B"])),
            ("no share that large", N1x4, {0: 600, 1: 600, 2: 600, 3: 600}, job("j", milli=500)),
            ("no GPU type with that memory", N1x4, set(), job("j", milli=500, mem=99999)),
            ("type not in the cluster", N1x4, set(), job("j", types=["nope"])),
        ]
    ],
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_place(case: Case) -> None:
    s = state(case.cluster)
    occupy(s, case.busy, mem=case.busy_mem)
    planner = Planner(s)
    before = [planner.gpu_free_milli(g) for g in range(s.topology.num_gpus)]
    placement = place(planner, case.spec, case.strategy, allowed_types(s, case.spec))
    after = [planner.gpu_free_milli(g) for g in range(s.topology.num_gpus)]
    if case.expected is None:
        assert placement is None
        assert after == before  # a failed attempt takes nothing
        return
    assert placement is not None
    assert placement.gpus == case.expected
    assert placement.gpu_milli == case.spec.gpu_milli
    # The planner now holds the GPUs (and only those); the launch is valid on the real state.
    assert after == [b - (case.spec.gpu_milli if g in case.expected else 0) for g, b in enumerate(before)]
    s.add(case.spec, 1.0)
    s.launch(case.spec.job_id, placement, 1.0)
    s.check_invariants()


@pytest.mark.parametrize("strategy", list(PlacementStrategy))
def test_successive_placements_never_overlap(strategy: PlacementStrategy) -> None:
    s = state(cluster(nodes=3, gpus=4, gpus_per_switch=2))
    planner = Planner(s)
    seen: set[int] = set()
    for i, n in enumerate([3, 1, 4, 2, 2]):  # 12 GPUs in all
        p = place(planner, job(f"j{i}", n), strategy, (0,))
        assert p is not None and seen.isdisjoint(p.gpus)
        seen.update(p.gpus)
    assert planner.total_free() == 0
    assert place(planner, job("more", 1), strategy, (0,)) is None
    assert s.free_gpus(0) == 12  # all of it was planning: the state is untouched


def test_fractions_fill_one_gpu_before_the_next() -> None:
    # Best fit packs: four 250-milli jobs share GPU 0 before any other GPU is touched.
    s = state(cluster(nodes=1, gpus=2))
    planner = Planner(s)
    got = [place(planner, job(f"f{i}", milli=250), CONS, (0,)) for i in range(5)]
    assert [p.gpus if p else None for p in got] == [(0,), (0,), (0,), (0,), (1,)]
    # Worst fit spreads: the second job goes to the untouched GPU, the third to the emptiest (GPU 0: 750 free).
    planner = Planner(s)
    got = [place(planner, job(f"g{i}", milli=m), SPREAD, (0,)) for i, m in enumerate([250, 500, 100])]
    assert [p.gpus if p else None for p in got] == [(0,), (1,), (0,)]
