"""AntMan (Xiao et al., OSDI'20): guaranteed jobs within tenants' quotas, opportunistic jobs on what they leave.

This module is AntMan's global scheduler (§4); :mod:`corral.policies.antman.coordinator` is its local coordinator
(§3.3), which this policy runs on the GPUs where something changed. ``docs/policies/antman.md`` says what differs
from the paper. The rules:

- **Guaranteed jobs** (§4; ``JobView.job_class`` GUARANTEED, upgraded jobs included) are admitted within their
  tenant's quota (a tenant without a quota has no cap), from one queue per tenant, first come first served
  within a tenant: a tenant's queue stops at its first job that does not fit (its quota or the free GPUs), and
  the other tenants go on. Across tenants the order is fair: the tenant holding the least of its quota
  (held / quota) goes first, ties by name; tenants without a quota come after, the oldest head-of-line job
  first. They get ordinary placements (whole GPUs, or their share of one for fractional jobs) by ``placement``;
  the memory reserved for them is their expected need (:func:`~corral.policies.antman.coordinator.expected_mem_mib`)
  until they have measured it.
- **Reclaim** (§4: opportunistic jobs give way to guaranteed ones; §3's dynamic scaling and §3.3's coordinator let
  them shrink in place rather than be killed): when an ordinary placement lands on GPUs where opportunistic jobs
  run, the same decision first shrinks them, before the ``Launch``: their memory caps to what is left (oldest keep
  theirs first) and, with the coordinator, their compute shares to ``start_milli`` (the coordinator grows them back
  if the guaranteed job does not suffer). One that would keep less than ``min_mem_fraction`` of its need is
  suspended instead (``reclaim=preempt``: every opportunistic job there is). A guaranteed job is never shrunk or
  preempted for an opportunistic one.
- **Opportunistic jobs** (§4) wait in one queue, first come first served, and run on spare capacity found by
  *measured* use, not allocation: GPUs whose measured SM use (``ClusterView.gpu_sm_used``; an idle GPU uses 0)
  is at most ``max_sm_used``, that hold fewer than ``max_opportunistic_per_gpu`` opportunistic jobs and whose
  unreserved memory holds ``min_mem_fraction`` of the job's need, least used first. A gang prefers one node: the
  candidates are examined least used first, and the first node with enough of them wins; after ``scan_gpus`` +
  2 x the gang's size candidates without one, the least used candidates anywhere are taken. The initial memory
  cap is the need, or what is free less ``mem_margin_mib`` beside guaranteed jobs; the initial share is the full
  request on a GPU no one holds, else ``start_milli``.
- **Upgrades** (§4: an opportunistic job becomes a resource-guarantee one once its tenant's quota has room): each
  round, in the same fair order across tenants (with a quota), oldest first, running opportunistic jobs whose
  tenant's quota has room for them become guaranteed (``Upgrade``): in place when their GPUs have the allocation
  free, else on free GPUs found by ``placement`` (a migration). Then pending opportunistic jobs of such tenants:
  launched on an ordinary placement and upgraded in the same decision. A tenant whose guaranteed queue stopped this
  round gets no upgrade (its own guaranteed jobs come first). At most ``max_upgrades`` per round.
- **Downgrades** (corral's reading of §4's guarantee: an upgrade borrows quota that its tenant's own guaranteed
  jobs may claim): a guaranteed job held back by its tenant's quota, while upgraded jobs of that tenant hold some of
  it, takes it back: the latest upgraded first, as few as give it its quota and a placement, are suspended (state
  to host memory) back to the opportunistic queue as the opportunistic jobs they were submitted as
  (``Preempt(downgrade=True)``), and it starts in the same decision. Without this, a tenant whose quota filled with
  upgraded jobs made its later guaranteed jobs wait for them to end (on the full Philly trace, 24,664 upgrades
  raised the quota shortfall from 517 to 1,283 GPU-hours). ``downgrade=false`` keeps the old rule.
- **Coordinator** (§3.3): see :mod:`corral.policies.antman.coordinator`. ``coordinator=false`` is the "packing without
  the coordinator" comparison point: opportunistic jobs keep the share and memory cap they were placed with
  (only a reclaim shrinks them), and reservations are never re-sized.
- ``opportunistic=false`` is the "exclusive allocation" comparison point: opportunistic jobs are placed like
  guaranteed ones on ordinary placements, outside any quota, after every tenant's guaranteed jobs, first come
  first served (a job that does not fit skips every job of its kind that cannot fit either); nobody preempts them.

Nodes lost and back (``on_nodes_changed``): the GPUs of a node that changed are re-filed in the index of GPUs open
to opportunistic jobs (a GPU of a down node is never open; the engine requeued the jobs that ran there, and the
coordinator forgot them as for any job that stops). Guaranteed jobs see only the capacity that is up, through the
view; a tenant's quota is unchanged, so a lost node can leave a tenant below its quota until it is back (AntMan
§4 promises quota within the cluster's capacity, and the capacity shrank).

A round (:meth:`AntManPolicy.schedule`) plans on an :class:`~corral.policies.antman.round.AntManRound`, the
framework's round on the allocation layer's planner with the opportunistic layer on top, in four steps: the
coordinator on what changed, the guaranteed queues, upgrades, then the opportunistic queue. Its decision puts the
actions in an order the engine accepts step by step: suspensions and shrinking resizes first, then the ordinary
launches and upgrades as planned, opportunistic launches, and growing resizes.

Cost: the policy keeps its own indexes, updated in :meth:`AntManPolicy.on_job_changed` from the change itself (the
placement the job held before it, and the one it holds now): guaranteed pending jobs per tenant, opportunistic
pending jobs by shape (size, share, GPU types, memory; one failure skips every job of the shape that cannot fit
either) and per tenant with a quota, running opportunistic jobs per tenant (the framework's
:class:`~corral.policies.framework.queues.KeyedQueue` each), and, per GPU type, the GPUs open to an opportunistic
job sorted by measured SM use. Only GPUs marked changed (a job came or went, telemetry arrived) or jobs due a
coordinator check are examined in a round, never all GPUs or all jobs.
"""

from __future__ import annotations

import heapq
import itertools
import math
from bisect import insort
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from enum import StrEnum

from corral.core.cluster import Topology
from corral.core.decisions import Decision, Upgrade
from corral.core.errors import ConfigError
from corral.core.job import FULL_GPU_MILLI, JobClass, JobPhase, JobSpec, JobView, mem_given
from corral.core.options import option
from corral.core.placement import Placement
from corral.core.sorted_groups import remove_sorted
from corral.policies.antman.coordinator import (
    CoordinatorConfig,
    GpuSnapshot,
    Guest,
    Holder,
    LocalCoordinator,
    Plan,
    Snapshot,
    expected_mem_mib,
)
from corral.policies.antman.round import AntManRound
from corral.policies.framework.contract import BasePolicy, PolicyConfig
from corral.policies.framework.placement import PlacementStrategy
from corral.policies.framework.planner import Planner
from corral.policies.framework.queues import KeyedQueue
from corral.policies.framework.reasons import fit_reason
from corral.policies.framework.view import ClusterView

# (whole, GPU types, memory) -> the kind of a pending opportunistic job; with its size, its shape. A job of a kind
# cannot fit where a smaller one of the same kind did not (see corral.policies.framework.queues).
_Kind = tuple[bool, tuple[str, ...], int | None]
_Shape = tuple[bool, tuple[str, ...], int | None, int]
_Entry = tuple[float, int, str]  # (submission time, arrival number, job): FIFO order


class Reclaim(StrEnum):
    SHRINK = "shrink"  # shrink the opportunistic jobs' memory and share; suspend those left too little memory
    PREEMPT = "preempt"  # suspend every opportunistic job on the GPUs


@dataclass(frozen=True, slots=True)
class AntManConfig(PolicyConfig):
    placement: PlacementStrategy = option(
        PlacementStrategy.CONSOLIDATED,
        "where ordinary placements go: consolidated (fewest nodes, best fit), strict (fewest possible nodes or "
        "wait), spread (one per node), first-fit",
    )
    opportunistic: bool = option(
        True, "run opportunistic jobs on spare capacity (false: exclusive allocation outside quotas, to compare)"
    )
    coordinator: bool = option(
        True, "run the local coordinator (false: packing with shares and memory fixed at placement, to compare)"
    )
    reclaim: Reclaim = option(
        Reclaim.SHRINK,
        "when a guaranteed job lands on an opportunistic job: shrink (memory and share; suspend if too little "
        "memory is left) or preempt (suspend it)",
    )
    max_sm_used: float = option(0.8, "an opportunistic job goes only to GPUs whose measured SM use is at most this")
    max_opportunistic_per_gpu: int = option(1, "most opportunistic jobs on one GPU")
    min_mem_fraction: float = option(
        0.5, "an opportunistic job needs at least this fraction of its GPU memory need, or it is suspended"
    )
    start_milli: int = option(100, "compute share (milli-GPU) an opportunistic job starts at beside guaranteed jobs")
    slowdown_threshold: float = option(0.05, "a guaranteed job slowed by more than this shrinks its neighbours")
    decrease_factor: float = option(0.5, "multiplicative decrease of an interfering opportunistic job's share")
    increase_milli: int = option(100, "additive increase of an opportunistic job's share per control interval")
    control_interval_s: float = option(10.0, "seconds between the coordinator's increases")
    mem_margin_mib: int = option(512, "GPU memory (MiB) kept above a guaranteed job's measured peak")
    max_upgrades: int = option(16, "most opportunistic jobs upgraded to guaranteed per round")
    downgrade: bool = option(
        True,
        "a guaranteed job held back by its tenant's quota takes it back from the tenant's upgraded jobs, latest "
        "upgraded first: they are suspended to the opportunistic queue (false: it waits for them to end)",
    )
    scan_gpus: int = option(64, "candidate GPUs examined per opportunistic placement, besides 2 x its size")

    def __post_init__(self) -> None:
        if not 0 <= self.max_sm_used <= 1:
            raise ConfigError(f"antman: max_sm_used must be in [0, 1], got {self.max_sm_used}")
        if self.max_opportunistic_per_gpu < 1:
            raise ConfigError(f"antman: max_opportunistic_per_gpu must be >= 1, got {self.max_opportunistic_per_gpu}")
        if not 1 <= self.start_milli <= FULL_GPU_MILLI:
            raise ConfigError(f"antman: start_milli must be in 1..1000, got {self.start_milli}")
        if self.max_upgrades < 0:
            raise ConfigError(f"antman: max_upgrades must be >= 0, got {self.max_upgrades}")
        if self.scan_gpus < 1:
            raise ConfigError(f"antman: scan_gpus must be >= 1, got {self.scan_gpus}")
        try:
            self.coordinator_config()
        except ConfigError as err:
            raise ConfigError(f"antman: {str(err).removeprefix('coordinator: ')}") from None

    def coordinator_config(self) -> CoordinatorConfig:
        return CoordinatorConfig(
            slowdown_threshold=self.slowdown_threshold,
            decrease_factor=self.decrease_factor,
            increase_milli=self.increase_milli,
            control_interval_s=self.control_interval_s,
            mem_margin_mib=self.mem_margin_mib,
            min_mem_fraction=self.min_mem_fraction,
        )


_AVOID_GUEST_TRIES = 3  # placements looked for away from opportunistic jobs before reclaiming from them
_GPU_BITS = 32  # a GPU index fits below this bit of an open-GPU key (_open_key)
_GPU_MASK = (1 << _GPU_BITS) - 1


def _open_key(sm_milli: int, gpu: int) -> int:
    """GPU ``gpu`` with measured SM use ``sm_milli`` as one integer that sorts as the pair (sm_milli, gpu) does."""
    assert sm_milli >= 0 and 0 <= gpu <= _GPU_MASK, (sm_milli, gpu)
    return (sm_milli << _GPU_BITS) | gpu


def _fair_key(view: ClusterView, planner: Planner, tenant: str, head_submit_s: float) -> tuple[int, float, str]:
    """Tenants with a quota first, the least served (held / quota) first; then the others, oldest head first."""
    t = view.tenants.get(tenant)
    quota = None if t is None else t.quota_gpus
    if quota is None:
        return (1, head_submit_s, tenant)
    held = planner.tenant_guaranteed_milli(tenant)
    return (0, held / (quota * FULL_GPU_MILLI) if quota else math.inf, tenant)


class AntManPolicy(BasePolicy):
    name = "antman"
    summary = "guaranteed jobs in quota, opportunistic jobs on spare GPU cycles and memory (AntMan, OSDI'20)"
    Config = AntManConfig
    needs_models = True
    needs_telemetry = True

    def __init__(self, config: PolicyConfig | None = None, *, seed: int = 0) -> None:
        super().__init__(config, seed=seed)
        cfg = self.config
        assert isinstance(cfg, AntManConfig)
        self.cfg = cfg
        self.coordinator = LocalCoordinator(cfg.coordinator_config())
        self._coordinating = cfg.coordinator and cfg.opportunistic
        self._max_sm_milli = round(cfg.max_sm_used * FULL_GPU_MILLI)  # what _refresh compares a GPU's use with
        self._topo: Topology | None = None
        self._seq = 0
        self._arrival: dict[str, int] = {}  # job -> arrival number (FIFO ties), while not terminal
        # Pending guaranteed jobs, per tenant, FIFO.
        self._gq: KeyedQueue[str] = KeyedQueue()
        # Pending opportunistic jobs: by shape (the walk), and per tenant with a quota (upgrades at launch), FIFO.
        self._oq: KeyedQueue[_Shape] = KeyedQueue()
        self._oq_tenant: KeyedQueue[str] = KeyedQueue()
        self._quota: dict[str, int | None] = {}  # tenant -> quota in milli-GPUs (None: no quota)
        # Running opportunistic jobs per tenant, oldest first (upgrade candidates).
        self._guests: KeyedQueue[str] = KeyedQueue()
        # What changed since the last round: GPUs, holders or guests arriving/leaving, telemetry.
        self._dirty: dict[int, None] = {}
        self._holders_moved: dict[int, None] = {}
        self._guests_moved: dict[int, None] = {}
        self._noted: dict[str, None] = {}
        # Per GPU type: GPUs open to an opportunistic job, least measured SM use first (then by GPU), each as one
        # integer _open_key(sm, gpu) in a list kept sorted: re-filing a GPU whose use changed is two bisections and
        # two moves of machine words (a sorted container of tuples cost 7% of a replay in its Python, issue 20).
        self._open: list[list[int]] = []
        self._open_key: dict[int, int] = {}
        # GPUs changed since the index was last read, re-filed when it is next read (_open_index): one round in ten
        # reads it (one that places a guest), and a GPU changed several times between two reads (its measured use
        # moves at every telemetry report) is re-filed once. Full Philly: 278,411 re-files, not 475,754 (issue 20:
        # they were 8.5% of the replay). The index read is the same: what a GPU is filed under is read from the
        # view, which changes only between rounds, and only for GPUs marked changed.
        self._stale: dict[int, None] = {}
        # Running upgraded jobs per tenant, in the order they were upgraded (the quota they borrowed, see downgrade).
        self._lent: dict[str, dict[str, None]] = {}
        self.counts: dict[str, int] = {
            "reclaim_shrink": 0,
            "reclaim_suspend": 0,
            "upgrade": 0,
            "evict": 0,
            "downgrade": 0,
        }

    # -- hooks ------------------------------------------------------------------------------------------------
    def admit(self, view: ClusterView, spec: JobSpec) -> str | None:
        self._bind(view)
        return super().admit(view, spec)

    def on_telemetry(self, job: JobView, now_s: float) -> None:
        # Only take note (this may run while a decision is being applied): the next round reads it.
        self._noted[job.spec.job_id] = None
        p = job.placement
        if p is not None:
            dirty = self._dirty
            for g in p.gpus:
                dirty[g] = None

    def on_nodes_changed(self, view: ClusterView, nodes: Sequence[int], now_s: float) -> None:
        # Re-file the nodes' GPUs at the next round (before that, _bind reads every GPU anyway).
        topo = view.topology
        for n in nodes:
            self._dirty.update(dict.fromkeys(topo.node_gpus(n)))

    def on_job_changed(self, job: JobView, before: Placement | None, now_s: float) -> None:
        spec = job.spec
        job_id = spec.job_id
        # Where it ran just before (None: it did not run) and where it runs now: what it left and what it came to.
        new = job.placement if job.phase is JobPhase.RUNNING else None
        moved = before is None or new is None or before.gpus != new.gpus or before.opportunistic != new.opportunistic
        for p in (before, new):
            if p is not None:
                for g in p.gpus:
                    self._dirty[g] = None
                    if moved:
                        (self._guests_moved if p.opportunistic else self._holders_moved)[g] = None
        was_guest = before is not None and before.opportunistic
        is_guest = new is not None and new.opportunistic
        if new is None or (was_guest and not is_guest):
            self.coordinator.forget(job_id)
        if was_guest and not is_guest:
            self._guests.remove(job_id)
        if is_guest and not was_guest:
            self._guests.add(spec.tenant, self._entry(job_id, spec))
        lent = self._lent.get(spec.tenant)
        if job.phase is JobPhase.RUNNING and job.job_class is not spec.job_class:  # upgraded
            self._lent.setdefault(spec.tenant, {})[job_id] = None  # first time: the order of upgrades
        elif lent is not None and job_id in lent:
            del lent[job_id]
            if not lent:
                del self._lent[spec.tenant]
        if job.phase is JobPhase.PENDING:
            if job_id not in self._gq and job_id not in self._oq:
                self._enqueue(job)
        else:
            self._dequeue(job_id)
            if job.phase.is_terminal:
                self._arrival.pop(job_id, None)
                self._noted.pop(job_id, None)

    def schedule(self, view: ClusterView, now_s: float) -> Decision:
        self._bind(view)
        rnd = AntManRound(view, now_s)
        self._absorb(view)
        if self._coordinating:
            self._coordinate(rnd)
        if self._gq:
            self._admit_guaranteed(rnd)
        if self.cfg.opportunistic and self.cfg.max_upgrades and (self._guests or self._oq_tenant):
            self._upgrade(rnd)
        if self._oq:
            self._place_waiting_opportunistic(rnd)
        self._dirty.clear()
        wake = self.coordinator.next_due_s() if self._coordinating else None
        return rnd.decision(wake if wake is not None and wake > now_s else None)

    # -- indexes ----------------------------------------------------------------------------------------------
    def _bind(self, view: ClusterView) -> None:
        if self._topo is not None:
            return
        topo = self._topo = view.topology
        self._quota = {
            name: None if t.quota_gpus is None else t.quota_gpus * FULL_GPU_MILLI for name, t in view.tenants.items()
        }
        self._open = [[] for _ in topo.type_names]
        for g in range(topo.num_gpus):
            self._refresh(view, g)

    def _entry(self, job_id: str, spec: JobSpec) -> _Entry:
        seq = self._arrival.get(job_id)
        if seq is None:
            self._seq += 1
            seq = self._arrival[job_id] = self._seq
        return (spec.submit_s, seq, job_id)

    def _enqueue(self, job: JobView) -> None:
        spec = job.spec
        entry = self._entry(spec.job_id, spec)
        if job.job_class is JobClass.GUARANTEED:
            self._gq.add(spec.tenant, entry)
            return
        whole = spec.gpu_milli == FULL_GPU_MILLI
        self._oq.add((whole, spec.gpu_types, spec.gpu_mem_mib, spec.num_gpus if whole else spec.gpu_milli), entry)
        if self._quota.get(spec.tenant) is not None:
            self._oq_tenant.add(spec.tenant, entry)

    def _dequeue(self, job_id: str) -> None:
        if self._gq.remove(job_id) is None and self._oq.remove(job_id) is not None:
            self._oq_tenant.remove(job_id)

    def _refresh(self, view: ClusterView, g: int) -> None:
        """Re-file GPU ``g`` in the index of GPUs open to an opportunistic job (what changed on it is in the view)."""
        topo = self._topo
        assert topo is not None
        cfg = self.cfg
        sm = view.gpu_sm_used(g)
        held = view.gpu_free_milli(g) < FULL_GPU_MILLI
        is_open = (
            view.node_up(topo.gpu_node[g])
            and len(view.gpu_opportunistic_jobs(g)) < cfg.max_opportunistic_per_gpu
            and sm <= self._max_sm_milli
            and view.gpu_free_mem_mib(g) > (cfg.mem_margin_mib if held else 0)
        )
        key = _open_key(sm, g) if is_open else None
        old = self._open_key.get(g)
        if old == key:
            return
        index = self._open[topo.gpu_type[g]]
        if old is not None:
            remove_sorted(index, old)  # filed under the key kept for it
            del self._open_key[g]
        if key is not None:
            insort(index, key)
            self._open_key[g] = key

    def _open_index(self, view: ClusterView) -> list[list[int]]:
        """The index of GPUs open to an opportunistic job, per GPU type, up to date with ``view``."""
        if self._stale:
            for g in self._stale:
                self._refresh(view, g)
            self._stale.clear()
        return self._open

    def _absorb(self, view: ClusterView) -> None:
        """Bring what changed since the last round into the coordinator and the indexes."""
        coord = self.coordinator
        if self._coordinating:
            for g in self._holders_moved:
                # Another holder came or went: the holders' learned baselines and the guests' ceilings are stale.
                for h in view.gpu_jobs(g):
                    coord.forget_baseline(h)
                for x in view.gpu_opportunistic_jobs(g):
                    coord.reset(x)
            for g in self._guests_moved:
                for x in view.gpu_opportunistic_jobs(g):
                    coord.reset(x)
            for job_id in self._noted:
                job = view.job(job_id)
                p, tel = job.placement, job.telemetry
                if job.phase is not JobPhase.RUNNING or p is None or tel is None or p.opportunistic:
                    continue
                active = any(self._share_of(view, x) > 0 for g in p.gpus for x in view.gpu_opportunistic_jobs(g))
                if coord.observe(job_id, tel, guest_active=active):
                    for g in p.gpus:
                        for x in view.gpu_opportunistic_jobs(g):
                            coord.reset(x)
        self._holders_moved.clear()
        self._guests_moved.clear()
        self._noted.clear()
        self._stale.update(self._dirty)

    @staticmethod
    def _share_of(view: ClusterView, x: str) -> int:
        p = view.job(x).placement
        return 0 if p is None else p.gpu_milli

    def _need(self, view: ClusterView, spec: JobSpec, gpu: int) -> int:
        """An opportunistic job's memory need on ``gpu``: measured when it has telemetry, else expected."""
        job = view.job(spec.job_id)
        tel = job.telemetry if job.phase is JobPhase.RUNNING else None
        if tel is not None:
            return tel.mem_need_mib
        topo = self._topo
        assert topo is not None
        return expected_mem_mib(spec, topo.gpu_mem_mib[gpu])

    # -- the coordinator --------------------------------------------------------------------------------------
    def _coordinate(self, rnd: AntManRound) -> None:
        """Run the coordinator on the jobs of changed GPUs and the jobs due a check (with, for each opportunistic
        one, the holders beside it, whose measurements decide its share)."""
        view = rnd.view
        coord = self.coordinator
        focus: dict[str, Placement] = {}
        # No nested functions here: compiled, their shared environment and they refer to each other, and each round
        # would leave that cycle, with the snapshot it holds, to the garbage collector (issue 20: 9% of a replay).
        for g in self._dirty:  # holders, then guests (two loops: a tuple of both cost a list and a tuple per GPU)
            for job_id in view.gpu_jobs(g):
                self._add_focus(view, focus, job_id)
            for job_id in view.gpu_opportunistic_jobs(g):
                self._add_focus(view, focus, job_id)
        for job_id in coord.pop_due(rnd.now_s):
            if view.job(job_id).phase is JobPhase.RUNNING:
                self._add_focus(view, focus, job_id)
        for p in [p for p in focus.values() if p.opportunistic]:
            for g in p.gpus:
                for h in view.gpu_jobs(g):
                    self._add_focus(view, focus, h)
        if not focus:
            return
        topo = self._topo
        assert topo is not None
        gpus: dict[int, GpuSnapshot] = {}
        holders: dict[str, Holder] = {}
        guest_ids: dict[str, None] = {}
        for p in focus.values():
            for g in p.gpus:
                if g in gpus:
                    continue
                on = tuple(view.gpu_jobs(g))
                visitors = self._oldest_first(view, view.gpu_opportunistic_jobs(g))
                gpus[g] = GpuSnapshot(topo.gpu_mem_mib[g], on, visitors)
                for h in on:
                    if h not in holders:
                        job = view.job(h)
                        hp = job.placement
                        assert hp is not None
                        holders[h] = Holder(h, hp.gpus, mem_given(job.spec, hp), job.telemetry)
                guest_ids.update(dict.fromkeys(visitors))
        guests: dict[str, Guest] = {}
        for x in self._oldest_first(view, guest_ids):  # as the coordinator expects
            job = view.job(x)
            xp = job.placement
            assert xp is not None
            need = self._need(view, job.spec, xp.gpus[0])
            guests[x] = Guest(
                x, xp.gpus, xp.gpu_milli, job.spec.gpu_milli, mem_given(job.spec, xp), need, job.telemetry is not None
            )
        plan = coord.step(rnd.now_s, Snapshot(gpus, holders, guests, focus.keys()))
        if plan:
            self._apply_plan(rnd, plan)

    def _add_focus(self, view: ClusterView, focus: dict[str, Placement], job_id: str) -> None:
        """Put running ``job_id`` in the coordinator's focus: a guest always; a holder only if its reservation is to
        change (most changed GPUs hold no guest and no reservation to re-size: they cost no snapshot)."""
        if job_id in focus:
            return
        job = view.job(job_id)
        p = job.placement
        assert p is not None  # the view lists running jobs only; due ones are checked by the caller
        if p.opportunistic or self.coordinator.reservation_target(mem_given(job.spec, p), job.telemetry) is not None:
            focus[job_id] = p

    def _oldest_first(self, view: ClusterView, job_ids: Iterable[str]) -> tuple[str, ...]:
        """``job_ids`` by their last start, then arrival (a stable sort: ties keep their order)."""
        keyed = [(view.job(x).last_start_s or 0.0, self._arrival.get(x, 0), i, x) for i, x in enumerate(job_ids)]
        keyed.sort()
        return tuple(k[3] for k in keyed)

    def _apply_plan(self, rnd: AntManRound, plan: Plan) -> None:
        for x in plan.evict:
            rnd.drop_guest(x, f"antman coordinator: {plan.why.get(x, 'memory')}")
            self.counts["evict"] += 1
        for h, mem in plan.reservations.items():
            rnd.set_reservation(h, mem)
            rnd.why[h] = f"antman coordinator: {plan.why.get(h, 'reservation')}"
        for x, share in plan.shares.items():
            rnd.set_guest(x, share=share)
            rnd.why[x] = f"antman coordinator: {plan.why.get(x, 'share')}"
        for x, cap in plan.mem_caps.items():
            rnd.set_guest(x, cap=cap)
            rnd.why.setdefault(x, f"antman coordinator: {plan.why.get(x, 'memory')}")

    # -- ordinary placements ----------------------------------------------------------------------------------
    def _take_ordinary(self, rnd: AntManRound, spec: JobSpec, types: tuple[int, ...]) -> Placement | None:
        """Allocation for ``spec`` by ``placement`` on GPUs of ``types``, reserving its expected memory (at most what
        is not reserved on each GPU: opportunistic jobs' memory is reclaimed, see :meth:`_reclaim`)."""
        planner = rnd.alloc
        strategy = self.cfg.placement
        found = rnd.place(spec, strategy, types)
        # Prefer GPUs where no opportunistic job runs: reclaiming one slows it for nothing when another GPU is
        # free. Hide the GPUs with guests and look again, a bounded number of times; else keep the first choice.
        hidden: dict[int, int] = {}
        for _ in range(_AVOID_GUEST_TRIES):
            if found is None:
                break
            shared = [g for g in found.gpus if rnd.guests_on(g)]
            if not shared:
                break
            planner.untake(spec, found)
            for g in shared:
                hidden[g] = planner.hide(g)
            alternative = rnd.place(spec, strategy, types)
            if alternative is None:
                for g, milli in hidden.items():
                    planner.unhide(g, milli)
                hidden.clear()
                found = planner.take(spec, list(found.gpus))
                break
            found = alternative
        for g, milli in hidden.items():
            planner.unhide(g, milli)
        if found is None:
            return None
        topo = self._topo
        assert topo is not None
        base = spec.gpu_mem_mib or 0  # what take() reserved
        want = expected_mem_mib(spec, topo.gpu_mem_mib[found.gpus[0]])
        extra = max(0, min(want - base, min(planner.gpu_free_mem_mib(g) for g in found.gpus)))
        for g in found.gpus:
            planner.add_memory(g, -extra)
        rnd.touched.update(found.gpus)
        return Placement(found.gpus, found.gpu_milli, base + extra)

    def _reclaim(self, rnd: AntManRound, gpus: tuple[int, ...], for_job: str) -> None:
        """An ordinary placement just landed on ``gpus``: make the opportunistic jobs there fit in what is left
        (AntMan §4; the rule is in the module docstring)."""
        view = rnd.view
        cfg = self.cfg
        for g in gpus:
            visitors = rnd.guests_on(g)
            if not visitors:
                continue
            reason = f"antman: reclaim GPU {g} for {for_job}"
            if cfg.reclaim == Reclaim.PREEMPT:
                for x in visitors:
                    rnd.drop_guest(x, reason)
                    self.counts["reclaim_suspend"] += 1
                continue
            left = rnd.alloc.gpu_free_mem_mib(g)
            for x in visitors:
                cap = rnd.cap(x)
                need = self._need(view, view.job(x).spec, g)
                keep = min(cap, max(0, left))
                if keep < cfg.min_mem_fraction * need or (keep == 0 and need > 0):
                    rnd.drop_guest(x, reason)
                    self.counts["reclaim_suspend"] += 1
                    continue
                left -= keep
                share = rnd.share(x)
                lower = min(share, cfg.start_milli) if self._coordinating else share
                if keep != cap or lower != share:
                    rnd.set_guest(x, share=lower, cap=keep)
                    rnd.why[x] = reason
                    self.counts["reclaim_shrink"] += 1
                if self._coordinating:
                    self.coordinator.touched(x, rnd.now_s)

    def _check_holder(self, rnd: AntManRound, job_id: str) -> None:
        """A holder just placed: when opportunistic jobs wait for room, right-size its reservation at the next
        control tick rather than at the next event."""
        if self._coordinating and self._oq:
            self.coordinator.check_after(job_id, rnd.now_s)

    # -- guaranteed jobs --------------------------------------------------------------------------------------
    def _admit_guaranteed(self, rnd: AntManRound) -> None:
        view, planner = rnd.view, rnd.alloc
        strategy = self.cfg.placement
        cursors: dict[str, Iterator[_Entry]] = {}
        heads: dict[str, _Entry] = {}
        heap: list[tuple[tuple[int, float, str], str]] = []
        for tenant, queue in self._gq.items():
            it = iter(queue)
            head: _Entry = next(it)
            cursors[tenant], heads[tenant] = it, head
            heap.append((_fair_key(view, planner, tenant, head[0]), tenant))
        heapq.heapify(heap)
        while heap:
            _, tenant = heapq.heappop(heap)
            job_id = heads[tenant][2]
            spec = view.job(job_id).spec
            types = rnd.types(spec)
            why = rnd.fits(spec, strategy, types)
            placement = self._take_ordinary(rnd, spec, types) if why is None else None
            if placement is None and self.cfg.downgrade and tenant in self._lent and not planner.quota_allows(spec):
                placement = self._downgrade_for(rnd, spec, types)
            if placement is None:
                rnd.stopped.add(tenant)  # first come, first served within a tenant: it waits for its head
                rnd.wait(job_id, why if why is not None else fit_reason(planner, spec, types, strategy))
                continue
            self._reclaim(rnd, placement.gpus, job_id)
            rnd.launch(job_id, placement)
            self._check_holder(rnd, job_id)
            nxt = next(cursors[tenant], None)
            if nxt is not None:
                heads[tenant] = nxt
                heapq.heappush(heap, (_fair_key(view, planner, tenant, nxt[0]), tenant))

    def _downgrade_for(self, rnd: AntManRound, spec: JobSpec, types: tuple[int, ...]) -> Placement | None:
        """The quota ``spec``'s tenant lent to its upgraded jobs, taken back for its guaranteed job ``spec`` (see
        the module docstring): the latest upgraded first, as few as give ``spec`` its quota and a placement. They
        are suspended to the opportunistic queue. ``None`` (nothing changed) if even all of them would not do."""
        view, planner = rnd.view, rnd.alloc
        cp = rnd.checkpoint()
        released: list[str] = []
        planned: dict[str, int] = {}  # reservations the coordinator re-sized this round, put back while released
        placement = None
        for job_id in reversed(self._lent[spec.tenant]):
            job = view.job(job_id)
            if job_id in rnd.downgrade or job.phase is not JobPhase.RUNNING or job.placement is None:
                continue
            if job_id in rnd.reserve:  # the planner counts the re-sized reservation: back to what it holds first
                planned[job_id] = rnd.reserve[job_id]
                rnd.set_reservation(job_id, mem_given(job.spec, job.placement))
                del rnd.reserve[job_id]
            planner.release(job)
            released.append(job_id)
            if planner.quota_allows(spec):
                placement = self._take_ordinary(rnd, spec, types)
                if placement is not None:
                    break
        if placement is None:
            rnd.rollback(cp)  # the planner as it was: shares, memory and quota use
            rnd.reserve.update(planned)  # and the re-sized reservations it counted
            return None
        for x in released:
            rnd.downgrade[x] = f"antman: quota of {spec.tenant} taken back by its guaranteed job {spec.job_id}"
            self.counts["downgrade"] += 1
        return placement

    # -- upgrades ---------------------------------------------------------------------------------------------
    def _upgrade(self, rnd: AntManRound) -> None:
        view, planner = rnd.view, rnd.alloc
        budget = self.cfg.max_upgrades
        looks = 4 * budget  # candidates examined at most (quota misses included)
        heap: list[tuple[tuple[int, float, str], str]] = []
        cursors: dict[str, Iterator[_Entry]] = {}
        for tenant in dict.fromkeys([*self._guests.groups, *self._oq_tenant.groups]):
            quota = self._quota.get(tenant)
            if tenant in rnd.stopped or quota is None or planner.tenant_guaranteed_milli(tenant) >= quota:
                continue  # no quota to upgrade into, or none left
            cursors[tenant] = itertools.chain(self._guests.get(tenant), self._oq_tenant.get(tenant))
            heap.append((_fair_key(view, planner, tenant, 0.0), tenant))
        heapq.heapify(heap)
        while heap and budget > 0 and looks > 0:
            _, tenant = heapq.heappop(heap)
            quota = self._quota.get(tenant)
            assert quota is not None
            for _submit, _seq, job_id in cursors[tenant]:
                if rnd.left(job_id):
                    continue
                looks -= 1
                spec = view.job(job_id).spec
                if planner.tenant_guaranteed_milli(tenant) + spec.gpu_demand_milli > quota:
                    if looks <= 0:
                        break
                    continue  # a smaller one may fit in the room left
                if self._plan_upgrade(rnd, job_id):
                    budget -= 1
                    heapq.heappush(heap, (_fair_key(view, planner, tenant, 0.0), tenant))
                break  # upgraded (the tenant goes back in fair order), or no GPUs for it: the tenant is done
            # the cursor is exhausted, or the tenant is done for this round

    def _plan_upgrade(self, rnd: AntManRound, job_id: str) -> bool:
        view, planner = rnd.view, rnd.alloc
        job = view.job(job_id)
        spec = job.spec
        topo = self._topo
        assert topo is not None
        p = job.placement
        if p is not None:  # running opportunistically: in place if its GPUs' allocation is free
            mem = expected_mem_mib(spec, topo.gpu_mem_mib[p.gpus[0]])
            if all(planner.gpu_free_milli(g) >= spec.gpu_milli and planner.gpu_free_mem_mib(g) >= mem for g in p.gpus):
                rnd.drop_guest(job_id, None)
                placement = planner.take(spec, list(p.gpus), mem_mib=mem)
                rnd.touched.update(p.gpus)
            else:
                found = self._take_ordinary(rnd, spec, rnd.types(spec))
                if found is None:
                    return False
                rnd.drop_guest(job_id, None)
                placement = found
            planner.charge(spec.tenant, spec.gpu_demand_milli)
            self._reclaim(rnd, placement.gpus, job_id)
            rnd.act(Upgrade(job_id, placement))
        else:  # waiting: launched (paused, no memory) and upgraded at once
            found = self._take_ordinary(rnd, spec, rnd.types(spec))
            if found is None:
                return False
            planner.charge(spec.tenant, spec.gpu_demand_milli)
            self._reclaim(rnd, found.gpus, job_id)
            rnd.launch(job_id, Placement(found.gpus, 0, 0, opportunistic=True))
            rnd.act(Upgrade(job_id, found))
        self.counts["upgrade"] += 1
        self._check_holder(rnd, job_id)
        return True

    # -- opportunistic jobs -----------------------------------------------------------------------------------
    def _place_waiting_opportunistic(self, rnd: AntManRound) -> None:
        """Walk the opportunistic queue in FIFO order over its shape groups, dropping at once every group of a
        kind whose smaller jobs did not fit (as ``corral.policies.framework.queues.PendingWalk`` does)."""
        view, planner = rnd.view, rnd.alloc
        strategy = self.cfg.placement
        exclusive = not self.cfg.opportunistic
        if not exclusive and not any(self._open_index(view)):
            # No GPU has room: the walk would stop at the head of each shape group; say why to those it would reach.
            for group in self._oq.groups.values():
                job_id = group[0][2]
                if job_id not in rnd.busy:  # not launched and upgraded this round
                    rnd.wait(job_id, self._no_room(view.job(job_id).spec))
            return
        blocked: dict[_Kind, int] = {}
        heap: list[tuple[_Entry, _Shape, Iterator[_Entry]]] = []
        for shape, group in self._oq.items():
            it = iter(group)
            heap.append((next(it), shape, it))
        heapq.heapify(heap)
        while heap:
            entry, shape, it = heap[0]
            kind: _Kind = shape[:3]
            limit = blocked.get(kind)
            if limit is not None and shape[3] >= limit:
                heapq.heappop(heap)
                continue
            job_id = entry[2]
            if job_id not in rnd.busy:  # not launched and upgraded this round
                spec = view.job(job_id).spec
                if exclusive:
                    if planner.total_free() == 0 and not planner.has_partial():
                        return
                    types = rnd.types(spec)
                    why = rnd.fits(spec, strategy, types)
                    found = self._take_ordinary(rnd, spec, types) if why is None else None
                    if found is not None:
                        rnd.launch(job_id, found)
                    else:
                        rnd.wait(job_id, why if why is not None else fit_reason(planner, spec, types, strategy))
                else:
                    found = self._place_guest(rnd, spec)
                    if found is None:
                        rnd.wait(job_id, self._no_room(spec))
                if found is None:
                    blocked[kind] = shape[3] if limit is None else min(limit, shape[3])
            nxt = next(it, None)
            if nxt is None:
                heapq.heappop(heap)
            else:
                heapq.heapreplace(heap, (nxt, shape, it))

    @staticmethod
    def _no_room(spec: JobSpec) -> str:
        return f"opportunistic: no {spec.num_gpus} GPU(s) with spare memory and compute"

    def _place_guest(self, rnd: AntManRound, spec: JobSpec) -> Placement | None:
        """Spare capacity for an opportunistic job, by measured use (module docstring); planned in ``rnd``."""
        cfg = self.cfg
        topo = self._topo
        assert topo is not None
        n = spec.num_gpus
        margin = cfg.mem_margin_mib
        for t in rnd.types(spec):
            need = expected_mem_mib(spec, topo.type_mem_mib[t])
            least = max(
                1 if need else 0, math.ceil(cfg.min_mem_fraction * need)
            )  # a job needing no memory fits anywhere
            by_node: dict[int, list[int]] = {}
            pool: list[int] = []
            fits: dict[int, tuple[int, int, bool]] = {}  # GPU -> (memory cap, share room, held)
            chosen: list[int] | None = None
            for examined, key in enumerate(self._open_index(rnd.view)[t]):
                g = key & _GPU_MASK
                if examined >= cfg.scan_gpus + 2 * n:
                    break
                if g in rnd.touched or len(rnd.guests_on(g)) >= cfg.max_opportunistic_per_gpu:
                    continue
                held = rnd.held(g)
                free = rnd.guest_free(g)
                cap = min(need, free - margin if held else free)
                room = FULL_GPU_MILLI - rnd.guest_milli(g)
                if cap < least or room <= 0:
                    continue
                fits[g] = (cap, room, held)
                pool.append(g)
                on_node = by_node.setdefault(topo.gpu_node[g], [])
                on_node.append(g)
                if len(on_node) >= n:
                    chosen = on_node
                    break
            if chosen is None:
                if len(pool) < n:
                    continue
                chosen = pool[:n]
            gpus = tuple(sorted(chosen))
            held_any = any(fits[g][2] for g in gpus)
            share = min(spec.gpu_milli, cfg.start_milli) if held_any and self._coordinating else spec.gpu_milli
            share = min(share, *(fits[g][1] for g in gpus))
            placement = Placement(gpus, share, min(fits[g][0] for g in gpus), opportunistic=True)
            rnd.add_guest(spec.job_id, placement)
            if held_any and self._coordinating:
                self.coordinator.touched(spec.job_id, rnd.now_s)
            return placement
        return None
