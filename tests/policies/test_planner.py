"""The planner's overlay: after any mix of take()s and release()s its reads must agree with a brute-force
recomputation from per-GPU free shares, and the view underneath must not change."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from builders import cluster, job, occupy, state
from corral.core.job import FULL_GPU_MILLI, JobClass, JobSpec
from corral.core.placement import Placement
from corral.engine.state import ClusterState
from corral.policies.framework.contract import allowed_types
from corral.policies.framework.placement import PlacementStrategy, place
from corral.policies.framework.planner import Planner

CLUSTER = cluster(
    gpus=[4, 2, 0, 4, 1, 8, 2],
    types=["A", "A", "A", "B", "B", "A", "B"],
    gpus_per_switch=[2, None, None, None, None, 4, None],
    mem={"A": 16384, "B": 32768},
    tenants={"small": 3, "free": None},
)
STRATEGIES = list(PlacementStrategy)
SHARES = [1, 100, 250, 500, 750, 999, 1000]


def check(planner: Planner, s: ClusterState, free: list[int], mem: list[int], tenants: dict[str, int]) -> None:
    """Compare every read of ``planner`` with what ``free``/``mem`` (per GPU) and ``tenants`` imply."""
    topo = s.topology
    n_types = len(topo.type_names)
    assert [planner.gpu_free_milli(g) for g in range(topo.num_gpus)] == free
    assert [planner.gpu_free_mem_mib(g) for g in range(topo.num_gpus)] == mem
    whole = [f == FULL_GPU_MILLI for f in free]
    node_free = [sum(whole[g] for g in topo.node_gpus(n)) for n in range(topo.num_nodes)]
    for n in range(topo.num_nodes):
        assert planner.node_free(n) == node_free[n]
        assert planner.node_free_gpus(n) == [g for g in topo.node_gpus(n) if whole[g]]
    for t in range(n_types):
        nodes_t = [n for n in range(topo.num_nodes) if topo.node_type[n] == t]
        assert planner.type_free(t) == sum(node_free[n] for n in nodes_t)
        for k in range(s.max_node_gpus(t) + 1):
            got = list(planner.nodes_with_free(t, k))
            assert len(got) == len(set(got))  # each node once
            assert sorted(got) == [n for n in nodes_t if node_free[n] == k]
        assert list(planner.nodes_with_any_free(t)) == [n for n in nodes_t if node_free[n] > 0]  # by index
        partial = [(f, g) for g, f in enumerate(free) if topo.gpu_type[g] == t and 0 < f < FULL_GPU_MILLI]
        for at_least in (1, 250, 500, 999):
            expected = sorted(e for e in partial if e[0] >= at_least)
            assert list(planner.partial_gpus(t, at_least)) == expected
            assert list(planner.partial_gpus(t, at_least, descending=True)) == expected[::-1]
    assert planner.total_free() == sum(whole)
    if any(0 < f < FULL_GPU_MILLI for f in free):
        assert planner.has_partial()  # (it may say True when the view had partial GPUs the plan filled: safe)
    else:
        assert planner.has_partial() == any(s.partial_gpus(t) for t in range(n_types))
    for name, used in tenants.items():
        assert planner.tenant_guaranteed_milli(name) == used


def view_snapshot(s: ClusterState) -> Any:
    topo = s.topology
    return (
        [(s.gpu_free_milli(g), s.gpu_free_mem_mib(g)) for g in range(topo.num_gpus)],
        [sorted(s.node_free_gpus(n)) for n in range(topo.num_nodes)],
        [[sorted(s.nodes_with_free(t, k)) for k in range(s.max_node_gpus(t) + 1)] for t in range(2)],
        [list(s.partial_gpus(t)) for t in range(2)],
        [s.free_gpus(t) for t in range(2)],
        s.allocated_milli,
    )


def random_spec(data: st.DataObject, jid: str) -> JobSpec:
    milli = data.draw(st.sampled_from(SHARES))
    return job(
        jid,
        gpus=data.draw(st.integers(1, 7)) if milli == FULL_GPU_MILLI else 1,
        milli=milli,
        types=data.draw(st.sampled_from([(), ("A",), ("B",)])),
        tenant=data.draw(st.sampled_from(["small", "free"])),
        opportunistic=data.draw(st.booleans()),
        mem=data.draw(st.sampled_from([None, 1000, 7000])),
    )


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_overlay_matches_brute_force(data: st.DataObject) -> None:
    s = state(CLUSTER)
    topo = s.topology
    # A random starting state, placed by the real placement code so it is valid.
    for i in range(data.draw(st.integers(0, 12), label="initial jobs")):
        spec = random_spec(data, f"init{i}")
        s.add(spec, 0.0)
        seed = Planner(s)
        p = place(seed, spec, data.draw(st.sampled_from(STRATEGIES)), allowed_types(s, spec))
        if p is not None and seed.quota_allows(spec):
            s.launch(spec.job_id, p, 0.0)
    s.check_invariants()
    before = view_snapshot(s)

    planner = Planner(s)
    free = [s.gpu_free_milli(g) for g in range(topo.num_gpus)]
    mem = [s.gpu_free_mem_mib(g) for g in range(topo.num_gpus)]
    tenants = {name: s.tenant_guaranteed_milli(name) for name in ("small", "free", "default")}
    releasable = sorted((j.spec.job_id for j in s.running()), reverse=True)
    check(planner, s, free, mem, tenants)

    def taken(spec: JobSpec, gpus: tuple[int, ...], sign: int) -> None:
        for g in gpus:
            free[g] -= sign * spec.gpu_milli
            mem[g] -= sign * (spec.gpu_mem_mib or 0)
        if spec.job_class is JobClass.GUARANTEED:
            tenants[spec.tenant] += sign * spec.gpu_demand_milli

    for step in range(data.draw(st.integers(1, 25), label="steps")):
        op = data.draw(st.sampled_from(["place", "take", "release"]), label="op")
        if op == "release" and releasable:
            victim = s.job(releasable.pop(data.draw(st.integers(0, len(releasable) - 1))))
            assert victim.placement is not None
            planner.release(victim)
            taken(victim.spec, victim.placement.gpus, -1)
        elif op == "place":
            spec = random_spec(data, f"p{step}")
            strategy = data.draw(st.sampled_from(STRATEGIES))
            p = place(planner, spec, strategy, allowed_types(s, spec))
            if p is not None:
                assert p.num_gpus == spec.num_gpus and p.gpu_milli == spec.gpu_milli
                assert all(free[g] >= spec.gpu_milli for g in p.gpus)  # only GPUs the plan has room on
                assert all(mem[g] >= (spec.gpu_mem_mib or 0) for g in p.gpus)
                assert len({topo.gpu_type[g] for g in p.gpus}) == 1
                taken(spec, p.gpus, +1)
        else:
            milli = data.draw(st.sampled_from(SHARES))
            room = [g for g in range(topo.num_gpus) if free[g] >= milli and mem[g] >= 1000]
            if not room:
                continue
            n = 1 if milli < FULL_GPU_MILLI else data.draw(st.integers(1, min(4, len(room))))
            gpus = data.draw(st.lists(st.sampled_from(room), min_size=n, max_size=n, unique=True))
            spec = job(f"t{step}", gpus=n, milli=milli, mem=1000, tenant="small")
            p = planner.take(spec, gpus)
            assert p.gpus == tuple(sorted(gpus)) and p.gpu_milli == milli
            taken(spec, p.gpus, +1)
        check(planner, s, free, mem, tenants)
    # Planning never touches the view.
    assert view_snapshot(s) == before
    s.check_invariants()


def test_quota_allows_follows_the_plan() -> None:
    s = state(cluster(nodes=1, gpus=4, tenants={"t": 2}))
    s.add(job("r", tenant="t"), 0.0)
    s.launch("r", Placement((0,)), 0.0)
    planner = Planner(s)
    two = job("two", gpus=2, tenant="t")
    one = job("one", tenant="t")
    assert not planner.quota_allows(two)  # 1 held + 2 > 2
    assert planner.quota_allows(one)
    assert planner.quota_allows(job("opp", gpus=2, tenant="t", opportunistic=True))
    assert planner.quota_allows(job("other", gpus=4, tenant="nobody"))  # no tenant entry: no cap
    planner.release(s.job("r"))
    assert planner.quota_allows(two)
    planner.take(one, [1])
    assert not planner.quota_allows(two)
    assert s.tenant_guaranteed_milli("t") == 1000  # the view is untouched


def test_release_of_a_pending_job_is_a_no_op() -> None:
    s = state(cluster(nodes=1, gpus=2))
    s.add(job("p"), 0.0)
    occupy(s, [0])
    planner = Planner(s)
    planner.release(s.job("p"))
    assert planner.total_free() == 1
    assert planner.node_free_gpus(0) == [1]
