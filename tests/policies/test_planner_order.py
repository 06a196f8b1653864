"""The planner's indexes over its changed entries, and passing over victims that cannot help, change no decision.

Both are speed-ups for rounds that plan thousands of placements or preemptions (``benchmarks/bench_round.py``).
Decisions depend on the *order* in which the planner lists candidates (nodes of one free count: the view's in
its order, then the ones the plan changed, by index), so these tests compare whole sequences, order included,
with a reference: the planner and ``place_by_preempting`` as they were written before (scans of every changed
entry; every candidate released and put back).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from builders import cluster, job, state
from corral.core.job import FULL_GPU_MILLI, JobClass, JobSpec, JobView
from corral.core.placement import Placement
from corral.engine.state import ClusterState
from corral.policies.framework.contract import allowed_types
from corral.policies.framework.placement import PlacementStrategy, place
from corral.policies.framework.planner import Planner
from corral.policies.framework.preemption import place_by_preempting
from corral.policies.framework.view import ClusterView

CLUSTER = cluster(
    gpus=[4, 4, 2, 4, 4, 4, 8, 4],
    types=["A", "B", "A", "B", "A", "B", "A", "B"],
    gpus_per_switch=[2, None, None, 2, None, None, 4, None],
    mem={"A": 16384, "B": 32768},
    tenants={"small": 6, "free": None},
)
STRATEGIES = [s for s in PlacementStrategy if s is not PlacementStrategy.FRAGMENTATION]
SHARES = [250, 500, 1000, 1000, 1000]


class ReferencePlanner(Planner):
    """The planner's reads as first written: every query scans all the changed entries."""

    __slots__ = ()

    def has_partial(self) -> bool:
        if any(0 < m < FULL_GPU_MILLI for m in self._gpu_milli.values()):
            return True
        return any(self.view.partial_gpus(t) for t in range(len(self.topo.type_names)))

    def nodes_with_free(self, t: int, count: int) -> Iterator[int]:
        changed = self._node_free
        for node in self.view.nodes_with_free(t, count):
            if node not in changed:
                yield node
        if changed:
            node_type = self.topo.node_type
            yield from sorted(n for n, c in changed.items() if c == count and node_type[n] == t)

    def nodes_with_any_free(self, t: int) -> Iterator[int]:
        changed = self._node_free
        base = (n for n in self.view.nodes_with_any_free(t) if n not in changed)
        if not changed:
            return base
        node_type = self.topo.node_type
        extra = sorted(n for n, c in changed.items() if c > 0 and node_type[n] == t)
        return heapq.merge(base, extra)

    def partial_gpus(self, t: int, at_least: int = 1, descending: bool = False) -> Iterator[tuple[int, int]]:
        changed = self._gpu_milli
        base_seq = self.view.partial_gpus(t)
        base_iter = reversed(base_seq) if descending else iter(base_seq)
        base = (e for e in base_iter if e[1] not in changed and e[0] >= at_least)
        if not changed:
            return base
        gpu_type = self.topo.gpu_type
        extra = sorted(
            ((m, g) for g, m in changed.items() if 0 < m < FULL_GPU_MILLI and m >= at_least and gpu_type[g] == t),
            reverse=descending,
        )
        return heapq.merge(base, extra, reverse=descending)

    def _set(self, gpu: int, milli: int, mem: int) -> None:
        old = self.gpu_free_milli(gpu)
        self._gpu_milli[gpu] = milli
        self._gpu_mem[gpu] = mem
        if (old == FULL_GPU_MILLI) != (milli == FULL_GPU_MILLI):
            delta = 1 if milli == FULL_GPU_MILLI else -1
            node = self.topo.gpu_node[gpu]
            t = self.topo.gpu_type[gpu]
            self._node_free[node] = self.node_free(node) + delta
            self._type_free[t] = self.type_free(t) + delta


def reference_place_by_preempting(
    view: ClusterView,
    planner: Planner,
    spec: JobSpec,
    strategy: PlacementStrategy,
    candidates: Iterable[str],
    taken: set[str],
) -> tuple[Placement, list[JobView]] | None:
    """``place_by_preempting`` as first written: every candidate is released, and put back if unused; with the
    quota rule added since: the job fits only within its tenant's quota (freeing the tenant's own jobs frees
    quota), and an unused victim of the tenant stays preempted if putting every such victim back would exceed the
    quota (then the least expendable are put back while they fit)."""
    types = allowed_types(view, spec)
    whole = spec.gpu_milli == 1000
    victims: list[JobView] = []
    placement = None
    for victim_id in candidates:
        if victim_id in taken:
            continue
        victim = view.job(victim_id)
        planner.release(victim)
        victims.append(victim)
        if not planner.quota_allows(spec):
            continue
        if whole and not any(planner.type_free(t) >= spec.num_gpus for t in types):
            continue
        placement = place(planner, spec, strategy, types)
        if placement is not None:
            break
    if placement is None:
        for victim in victims:
            assert victim.placement is not None
            planner.take(victim.spec, list(victim.placement.gpus))
        return None
    used = set(placement.gpus)
    unused = [v for v in victims if v.placement is not None and used.isdisjoint(v.placement.gpus)]
    keep = {v.spec.job_id for v in unused}
    quota = view.tenants[spec.tenant].quota_gpus if spec.tenant in view.tenants else None
    if quota is not None and spec.job_class is JobClass.GUARANTEED:
        own = [v for v in unused if v.spec.tenant == spec.tenant and v.job_class is JobClass.GUARANTEED]
        room = quota * 1000 - planner.tenant_guaranteed_milli(spec.tenant)
        if sum(v.spec.gpu_demand_milli for v in own) > room:
            keep -= {v.spec.job_id for v in own}
            for v in reversed(own):
                if v.spec.gpu_demand_milli <= room:
                    room -= v.spec.gpu_demand_milli
                    keep.add(v.spec.job_id)
    needed: list[JobView] = []
    for victim in victims:
        assert victim.placement is not None
        if victim.spec.job_id in keep:
            planner.take(victim.spec, list(victim.placement.gpus))
            continue
        taken.add(victim.spec.job_id)
        needed.append(victim)
    return placement, needed


def reads(planner: Planner, s: ClusterState) -> Any:
    """Every order-sensitive read of the planner, as lists."""
    topo = s.topology
    out: list[Any] = [planner.has_partial(), planner.total_free()]
    for t in range(len(topo.type_names)):
        out.append([list(planner.nodes_with_free(t, k)) for k in range(s.max_node_gpus(t) + 1)])
        out.append(list(planner.nodes_with_any_free(t)))
        for at_least in (1, 250, 500, 999):
            out.append(list(planner.partial_gpus(t, at_least)))
            out.append(list(planner.partial_gpus(t, at_least, descending=True)))
    out.append([(planner.gpu_free_milli(g), planner.gpu_free_mem_mib(g)) for g in range(topo.num_gpus)])
    out.append([planner.node_free_gpus(n) for n in range(topo.num_nodes)])
    out.append([planner.tenant_guaranteed_milli(t) for t in ("small", "free", "default")])
    return out


def random_spec(data: st.DataObject, jid: str, *, typed: bool = True) -> JobSpec:
    milli = data.draw(st.sampled_from(SHARES))
    return job(
        jid,
        gpus=data.draw(st.integers(1, 6)) if milli == FULL_GPU_MILLI else 1,
        milli=milli,
        types=data.draw(st.sampled_from([(), ("A",), ("B",)])) if typed else (),
        tenant=data.draw(st.sampled_from(["small", "free"])),
        mem=data.draw(st.sampled_from([None, 1000])),
    )


def busy_state(data: st.DataObject) -> ClusterState:
    """A cluster with running jobs placed by the real placement code, a few of them holding a share or memory
    other than their spec's (packed, or with a reservation of their own: put back, they do not restore it)."""
    s = state(CLUSTER)
    for i in range(data.draw(st.integers(0, 20), label="running jobs")):
        spec = random_spec(data, f"r{i}")
        s.add(spec, 0.0)
        seed = Planner(s)
        p = place(seed, spec, data.draw(st.sampled_from(STRATEGIES)), allowed_types(s, spec))
        if p is None or not seed.quota_allows(spec):
            continue
        odd = data.draw(st.sampled_from(["as asked", "as asked", "packed", "own memory"]))
        if odd == "packed" and spec.gpu_milli == FULL_GPU_MILLI:
            p = Placement(p.gpus, 500)
        elif odd == "own memory":
            p = Placement(p.gpus, p.gpu_milli, 2000)
        s.launch(spec.job_id, p, 0.0)
    s.check_invariants()
    return s


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_reads_keep_their_order(data: st.DataObject) -> None:
    s = busy_state(data)
    new, old = Planner(s), ReferencePlanner(s)
    assert reads(new, s) == reads(old, s)
    running = sorted(j.spec.job_id for j in s.running())
    for step in range(data.draw(st.integers(1, 30), label="steps")):
        op = data.draw(st.sampled_from(["place", "release", "take back", "hide"]), label="op")
        if op == "place":
            spec = random_spec(data, f"p{step}")
            strategy = data.draw(st.sampled_from(STRATEGIES))
            types = allowed_types(s, spec)
            assert place(new, spec, strategy, types) == place(old, spec, strategy, types)
        elif op in ("release", "take back") and running:
            victim = s.job(running[data.draw(st.integers(0, len(running) - 1))])
            assert victim.placement is not None
            if op == "release":
                new.release(victim)
                old.release(victim)
            elif all(new.gpu_free_milli(g) >= victim.spec.gpu_milli for g in victim.placement.gpus):
                new.take(victim.spec, list(victim.placement.gpus))
                old.take(victim.spec, list(victim.placement.gpus))
        elif op == "hide":
            g = data.draw(st.integers(0, s.topology.num_gpus - 1))
            had = new.hide(g)
            assert old.hide(g) == had
            if data.draw(st.booleans()):
                new.unhide(g, had)
                old.unhide(g, had)
        assert reads(new, s) == reads(old, s)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_passing_over_victims_decides_as_releasing_them(data: st.DataObject) -> None:
    s = busy_state(data)
    new, old = Planner(s), ReferencePlanner(s)
    taken_new: set[str] = set()
    taken_old: set[str] = set()
    running = [j.spec.job_id for j in s.running()]
    for step in range(data.draw(st.integers(1, 6), label="jobs")):
        spec = random_spec(data, f"w{step}")
        strategy = data.draw(st.sampled_from(STRATEGIES))
        order = data.draw(st.permutations(running), label="candidates")
        got = place_by_preempting(s, new, spec, strategy, iter(order), taken_new)
        want = reference_place_by_preempting(s, old, spec, strategy, iter(order), taken_old)
        if want is None:
            assert got is None
        else:
            assert got is not None
            assert got[0] == want[0]
            assert [v.spec.job_id for v in got[1]] == [v.spec.job_id for v in want[1]]
        assert taken_new == taken_old
        assert reads(new, s) == reads(old, s)
        # What comes after in the round sees the same plan, order included.
        after = random_spec(data, f"a{step}")
        types = allowed_types(s, after)
        assert place(new, after, strategy, types) == place(old, after, strategy, types)
