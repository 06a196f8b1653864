"""The per-decision Round (policies/framework/round.py), the planner's checkpoints under it, and the policies' keyed
pending queues (framework/queues.py): a rollback gives back exactly the planner a checkpoint saw, its query order
included; a Round's actions, reasons and decision follow what the policy did."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from builders import cluster, job, occupy, state
from corral.core.decisions import Decision, Launch, Preempt, Resize, SetBatchSize
from corral.core.placement import Placement
from corral.engine.state import ClusterState
from corral.policies.framework.contract import allowed_types
from corral.policies.framework.placement import PlacementStrategy, place
from corral.policies.framework.planner import Planner
from corral.policies.framework.queues import KeyedQueue
from corral.policies.framework.round import Round
from policies.test_planner import CLUSTER, STRATEGIES, random_spec


def reads(planner: Planner, s: ClusterState) -> Any:
    """Every read of ``planner``, in the order it gives them (a rollback must restore the order too)."""
    topo = s.topology
    n_types = len(topo.type_names)
    return (
        [planner.gpu_free_milli(g) for g in range(topo.num_gpus)],
        [planner.gpu_free_mem_mib(g) for g in range(topo.num_gpus)],
        [planner.node_free(n) for n in range(topo.num_nodes)],
        [planner.type_free(t) for t in range(n_types)],
        [[list(planner.nodes_with_free(t, k)) for k in range(s.max_node_gpus(t) + 1)] for t in range(n_types)],
        [[planner.first_with_free(t, k) for k in range(s.max_node_gpus(t) + 1)] for t in range(n_types)],
        [list(planner.nodes_with_any_free(t)) for t in range(n_types)],
        [list(planner.partial_gpus(t)) for t in range(n_types)],
        planner.total_free(),
        {name: planner.tenant_guaranteed_milli(name) for name in ("small", "free", "default")},
    )


def plan_some(data: st.DataObject, s: ClusterState, planner: Planner, tag: str, released: set[str]) -> None:
    """A few random placements and releases in ``planner``."""
    for step in range(data.draw(st.integers(0, 8), label=f"{tag} steps")):
        running = sorted(j.spec.job_id for j in s.running() if j.spec.job_id not in released)
        if running and data.draw(st.booleans(), label="release?"):
            victim = data.draw(st.sampled_from(running))
            planner.release(s.job(victim))
            released.add(victim)
        else:
            spec = random_spec(data, f"{tag}{step}")
            place(planner, spec, data.draw(st.sampled_from(STRATEGIES)), allowed_types(s, spec))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_rollback_restores_the_planner_exactly(data: st.DataObject) -> None:
    s = state(CLUSTER)
    for i in range(data.draw(st.integers(0, 10), label="initial jobs")):
        spec = random_spec(data, f"init{i}")
        s.add(spec, 0.0)
        seed = Planner(s)
        p = place(seed, spec, data.draw(st.sampled_from(STRATEGIES)), allowed_types(s, spec))
        if p is not None and seed.quota_allows(spec):
            s.launch(spec.job_id, p, 0.0)
    planner = Planner(s)
    released: set[str] = set()
    plan_some(data, s, planner, "a", released)
    at_checkpoint = reads(planner, s)
    cp = planner.checkpoint()
    for attempt in range(2):  # a checkpoint may be rolled back to more than once
        plan_some(data, s, planner, f"b{attempt}", set(released))
        planner.rollback(cp)
        assert reads(planner, s) == at_checkpoint


def test_rollback_to_the_start_gives_a_fresh_planner() -> None:
    s = state(cluster(nodes=3, gpus=4))
    occupy(s, [0, 5])
    planner = Planner(s)
    fresh = reads(Planner(s), s)
    cp = planner.checkpoint()
    place(planner, job("g", gpus=4), PlacementStrategy.CONSOLIDATED, (0,))
    place(planner, job("h", gpus=2), PlacementStrategy.CONSOLIDATED, (0,))
    assert reads(planner, s) != fresh
    planner.rollback(cp)
    # The nodes the plan changed and changed back are the view's again, in the view's order.
    assert reads(planner, s) == fresh


def test_a_round_records_actions_reasons_and_its_decision() -> None:
    s = state(cluster(nodes=1, gpus=4, tenants={"t": 2}))
    s.add(job("run", tenant="t"), 0.0)
    s.launch("run", Placement((0,)), 0.0)
    for name, gpus in (("a", 1), ("b", 2), ("c", 1)):
        s.add(job(name, gpus=gpus, tenant="t", submit=1.0), 1.0)
    rnd = Round(s, 1.0)
    a, b = s.job("a").spec, s.job("b").spec
    assert rnd.fits(a) is None
    assert rnd.fits(b) == "tenant t at quota 1/2 GPUs"  # 1 held + 2 > 2
    placement = rnd.place(a, PlacementStrategy.CONSOLIDATED)
    assert placement is not None
    rnd.wait("a", "examined before it was placed")  # a later launch clears the reason
    rnd.launch("a", placement)
    rnd.wait("b", "tenant t at quota 2/2 GPUs")
    assert rnd.planner.tenant_guaranteed_milli("t") == 2000
    rnd.preempt(s.job("run"), "make room")
    assert rnd.planner.tenant_guaranteed_milli("t") == 1000 and rnd.planner.gpu_free_milli(0) == 1000
    rnd.resize("a", mem_mib=512, reason="fits")
    rnd.act(SetBatchSize("c", 16))
    decision = rnd.decision(wake_at_s=5.0)
    assert decision.actions == (
        Launch("a", placement),
        Preempt("run", "make room"),
        Resize("a", None, 512, "fits"),
        SetBatchSize("c", 16),
    )
    assert decision.wake_at_s == 5.0
    # Reasons only for jobs the round left alone (c got a batch size: acted on).
    assert dict(decision.waiting) == {"b": "tenant t at quota 2/2 GPUs"}
    assert s.job("run").placement == Placement((0,))  # the view is untouched


def test_fits_names_the_free_count_for_a_gang() -> None:
    s = state(cluster(nodes=2, gpus=4))
    occupy(s, [0, 1, 4])
    rnd = Round(s, 0.0)
    assert rnd.fits(job("six", gpus=6)) == "waiting for 6 GPUs: 5 free"
    assert rnd.fits(job("five", gpus=5)) is None  # enough free on two nodes: place() decides where
    assert rnd.fits(job("half", milli=500)) is None


def test_rollback_undoes_a_tentative_preemption() -> None:
    s = state(cluster(nodes=1, gpus=2))
    (victim,) = occupy(s, [0])
    s.add(job("big", gpus=2), 0.0)
    rnd = Round(s, 0.0)
    rnd.wait("other", "was waiting before")
    before = reads(rnd.planner, s)
    cp = rnd.checkpoint()
    rnd.preempt(s.job(victim), "try")
    placement = rnd.place(s.job("big").spec, PlacementStrategy.CONSOLIDATED)
    assert placement is not None
    rnd.launch("big", placement)
    rnd.wait("other", "changed its mind")
    rnd.rollback(cp)  # say the plan was not worth it after all
    assert reads(rnd.planner, s) == before
    assert rnd.actions == [] and rnd.busy == set()
    assert rnd.decision().waiting == {"other": "was waiting before"}


def test_an_empty_round_decides_nothing() -> None:
    s = state(cluster(nodes=1, gpus=1))
    assert Round(s, 0.0).decision() is Decision.NOTHING


def test_keyed_queue_files_orders_and_merges() -> None:
    q: KeyedQueue[str] = KeyedQueue()
    q.add("vision", (3.0, 1, "v1"))
    q.add("nlp", (1.0, 2, "n1"))
    q.add("vision", (0.5, 3, "v0"))
    q.add("nlp", (2.0, 4, "n2"))
    assert len(q) == 4 and "v1" in q and "zz" not in q
    assert [e[-1] for e in q.get("vision")] == ["v0", "v1"]
    assert [e[-1] for e in q.merged()] == ["v0", "n1", "n2", "v1"]
    assert [e[-1] for e in q.merged(["nlp", "absent"])] == ["n1", "n2"]
    assert q.key_of("n2") == "nlp"
    with pytest.raises(ValueError, match="queued already"):
        q.add("nlp", (9.0, 5, "v1"))
    assert q.remove("n1") == "nlp" and q.remove("n2") == "nlp"
    assert "nlp" not in q.groups  # an empty key is dropped
    assert q.remove("n1") is None
    assert q.get("nlp") == ()
    assert [k for k, _ in q.items()] == ["vision"]
