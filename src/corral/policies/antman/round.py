"""What one AntMan round plans: the allocation layer, the opportunistic layer on top, and the order of the actions.

Each GPU has two layers (``docs/policies/antman.md``): ordinary placements *allocate* a share of it and *reserve*
memory; opportunistic jobs allocate nothing and run under a compute-share cap and a memory cap on what the holders
leave. :mod:`corral.policies.antman.policy` decides what changes in a round; this module keeps the plan:

- :class:`AllocationPlanner`, the framework's planner for the allocation layer, in which opportunistic jobs' memory
  counts as free (an ordinary placement reclaims it);
- :class:`AntManRound`, the framework's :class:`~corral.policies.framework.round.Round` on that planner, with the
  opportunistic layer as planned: the guests' caps, the holders' reservations, the guests launched, suspended and
  upgraded. Its :meth:`~AntManRound.decision` puts the round's actions in an order the engine's state accepts
  step by step (what frees memory or share before what takes it).
"""

from __future__ import annotations

from corral.core.decisions import Decision
from corral.core.job import FULL_GPU_MILLI, mem_given
from corral.core.placement import Placement
from corral.policies.framework.planner import Planner
from corral.policies.framework.round import Round
from corral.policies.framework.view import ClusterView


class AllocationPlanner(Planner):
    """The allocation layer's planner. Opportunistic jobs' memory counts as free here: an ordinary placement
    takes it back (reclaim), so ``gpu_free_mem_mib`` is the GPU's memory less the ordinary reservations."""

    __slots__ = ()

    def gpu_free_mem_mib(self, gpu: int) -> int:
        got = self._gpu_mem.get(gpu)
        if got is not None:
            return got
        view = self.view
        guests = 0
        for job_id in view.gpu_opportunistic_jobs(gpu):
            job = view.job(job_id)
            assert job.placement is not None
            guests += mem_given(job.spec, job.placement)
        return view.gpu_free_mem_mib(gpu) + guests

    def charge(self, tenant: str, milli: int) -> None:
        """Count ``milli`` more against ``tenant``'s quota (an upgrade: ``take`` charges guaranteed specs only)."""
        self._tenant[tenant] = self.tenant_guaranteed_milli(tenant) + milli


class AntManRound(Round):
    """One round's plan: the framework's :class:`~corral.policies.framework.round.Round` on the allocation layer's
    planner, with the opportunistic layer on top as planned (the guests' share and memory caps, the holders'
    reservations, the guests launched and the jobs suspended).

    Ordinary launches and upgrades are recorded (:meth:`launch`, :meth:`act`) as they are planned, so ``busy`` holds
    the jobs given an ordinary placement so far; the opportunistic layer's changes are collected and put in order
    around them by :meth:`decision`."""

    __slots__ = (
        "alloc",
        "caps",
        "downgrade",
        "evict",
        "new_guests",
        "on_gpu",
        "reserve",
        "shares",
        "stopped",
        "touched",
        "upgraded",
        "why",
    )

    def __init__(self, view: ClusterView, now_s: float) -> None:
        alloc = AllocationPlanner(view)
        super().__init__(view, now_s, alloc)
        self.alloc = alloc  # the round's planner (``planner``), as its own class (see Round's module docstring)
        self.caps: dict[str, int] = {}  # running opportunistic job -> planned memory cap
        self.shares: dict[str, int] = {}  # running opportunistic job -> planned share cap
        self.reserve: dict[str, int] = {}  # running holder -> planned memory reservation
        self.evict: dict[str, str] = {}  # running opportunistic job to suspend -> why
        self.downgrade: dict[str, str] = {}  # running upgraded job to suspend back to the opportunistic queue -> why
        self.upgraded: set[str] = set()  # running opportunistic jobs upgraded this round
        self.new_guests: dict[str, Placement] = {}  # opportunistic launches, in plan order
        self.on_gpu: dict[int, list[str]] = {}  # GPU -> its opportunistic jobs as planned (copied on write)
        self.touched: set[int] = set()  # GPUs given an ordinary placement this round
        self.why: dict[str, str] = {}  # reasons of resizes
        self.stopped: set[str] = set()  # tenants whose guaranteed queue stopped this round

    # -- the opportunistic layer as planned -------------------------------------------------------------------
    def guests_on(self, g: int) -> list[str]:
        got = self.on_gpu.get(g)
        return list(self.view.gpu_opportunistic_jobs(g)) if got is None else got

    def left(self, x: str) -> bool:
        """Did running opportunistic job ``x`` leave that layer this round (suspended or upgraded)?"""
        return x in self.evict or x in self.upgraded

    def guest_placement(self, x: str) -> Placement:
        new = self.new_guests.get(x)
        if new is not None:
            return new
        p = self.view.job(x).placement
        assert p is not None
        return p

    def cap(self, x: str) -> int:
        got = self.caps.get(x)
        if got is not None:
            return got
        p = self.guest_placement(x)
        return mem_given(self.view.job(x).spec, p)

    def share(self, x: str) -> int:
        got = self.shares.get(x)
        return self.guest_placement(x).gpu_milli if got is None else got

    def guest_free(self, g: int) -> int:
        """Memory on ``g`` given to no one, as planned."""
        return self.alloc.gpu_free_mem_mib(g) - sum(self.cap(x) for x in self.guests_on(g))

    def guest_milli(self, g: int) -> int:
        return sum(self.share(x) for x in self.guests_on(g))

    def held(self, g: int) -> bool:
        """Does anyone hold an allocation on ``g`` (now or as planned)?"""
        return self.alloc.gpu_free_milli(g) < FULL_GPU_MILLI

    def set_guest(self, x: str, share: int | None = None, cap: int | None = None) -> None:
        new = self.new_guests.get(x)
        if new is not None:
            self.new_guests[x] = Placement(
                new.gpus,
                new.gpu_milli if share is None else share,
                new.mem_mib if cap is None else cap,
                opportunistic=True,
            )
            return
        if share is not None:
            self.shares[x] = share
        if cap is not None:
            self.caps[x] = cap

    def add_guest(self, x: str, placement: Placement) -> None:
        self.new_guests[x] = placement
        for g in placement.gpus:
            self.on_gpu[g] = [*self.guests_on(g), x]

    def drop_guest(self, x: str, reason: str | None) -> None:
        """``x`` leaves the opportunistic layer: suspended (with ``reason``), or upgraded (``None``).

        An upgraded job keeps the decreases planned for it before: an ordinary placement planned earlier in the
        round may count on the memory they free, and its launch comes before the upgrade (see :meth:`decision`)."""
        gpus = self.guest_placement(x).gpus
        if self.new_guests.pop(x, None) is None:
            if reason is None:
                self.upgraded.add(x)
            else:
                self.evict[x] = reason
                self.shares.pop(x, None)
                self.caps.pop(x, None)
        for g in gpus:
            self.on_gpu[g] = [o for o in self.guests_on(g) if o != x]

    def set_reservation(self, h: str, mem: int) -> None:
        job = self.view.job(h)
        assert job.placement is not None
        old = self.reserve.get(h, mem_given(job.spec, job.placement))
        for g in job.placement.gpus:
            self.alloc.add_memory(g, old - mem)
        self.reserve[h] = mem

    # -- the decision -----------------------------------------------------------------------------------------
    def decision(self, wake_at_s: float | None = None) -> Decision:
        """The round's actions in an order the engine's state accepts step by step: what frees memory or share
        (suspensions, then shrinking resizes) before what takes it (the ordinary launches and upgrades, in the order
        they were planned, then opportunistic launches, then growing resizes). The round planned a state that fits;
        taking the frees first and growing towards it afterwards never passes through one that does not. Called
        once, at the end of the round."""
        view = self.view
        ordinary, self.actions = self.actions, []
        for x, why in self.downgrade.items():  # released in the planner when planned
            self.preempt(view.job(x), why, suspend=True, downgrade=True, release=False)
        for x, why in self.evict.items():  # a guest holds no allocation: nothing to release
            self.preempt(view.job(x), why, suspend=True, release=False)
        grow: list[tuple[str, int | None, int | None, str]] = []
        # Most rounds change no guest's share or cap: then no list of both is built (issue 20).
        changed = dict.fromkeys([*self.shares, *self.caps]) if self.shares or self.caps else {}
        for x in changed:
            if x in self.evict:
                continue
            job = view.job(x)
            p = job.placement
            assert p is not None
            share, cap = self.share(x), self.cap(x)
            old_cap = mem_given(job.spec, p)
            why = self.why.get(x, "antman")
            down = (share if share < p.gpu_milli else None, cap if cap < old_cap else None)
            up = (share if share > p.gpu_milli else None, cap if cap > old_cap else None)
            if down != (None, None):
                self.resize(x, down[0], down[1], why)
            if up != (None, None) and x not in self.upgraded:
                grow.append((x, up[0], up[1], why))
        for h, mem in self.reserve.items():
            job = view.job(h)
            assert job.placement is not None
            old = mem_given(job.spec, job.placement)
            why = self.why.get(h, "antman")
            if mem < old:
                self.resize(h, mem_mib=mem, reason=why)
            elif mem > old:
                grow.append((h, None, mem, why))
        if ordinary:
            self.actions += ordinary
        for x, p in self.new_guests.items():
            self.launch(x, p)
        for job_id, milli, mib, why in grow:
            self.resize(job_id, milli, mib, why)
        return super().decision(wake_at_s)
