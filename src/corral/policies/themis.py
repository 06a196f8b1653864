"""Themis (Mahajan et al., NSDI'20): finish-time fair GPU scheduling with leases and an auction per lease round.

The rules, each with the section of the paper it comes from (``docs/policies/themis.md`` says what differs):

- **Finish-time fairness** (§3.2): rho = T_sh / T_id, a job's finish time in the shared cluster over its finish
  time alone on a 1/N share of the cluster. The policy estimates it for every active job at each round::

      rho(t) = (t - submit + remaining) / T_id,    T_id = work * max(1, demand / (G / N))

  ``remaining`` is the work left if the job runs from now on at the trace's pace; ``work`` its total work;
  ``demand`` its GPUs (shares count: a half GPU is 0.5); ``G`` the cluster's GPUs (those on nodes that are up,
  while some are down); ``N`` the jobs contending now (pending or running: each job is one of Themis' apps). A
  running job's remaining work falls one second per second, so its rho stays put; a waiting job's rho grows at
  1 / T_id, fastest for short jobs.
- **Work estimates**: Themis' agents know their apps' total iterations (§4.3). Here the trace's ``duration_s``
  plays that part when a job has one: an oracle, as for SJF. Without one (live mode) a job is expected to run
  as long again as it has run so far, and at least one more lease: ``remaining = max(executed_s, lease_s)``.
  The policy does not see the performance model: like SRTF's, its estimate treats every job as running at
  the trace's pace (not the GPU type's speed or a spread placement's slowdown) and ignores restore costs.
- **Leases** (§3.3, multi-round auctions; §4.2): GPUs are granted for a lease. Lease rounds fall at multiples
  of ``lease_s``; a lease granted at time x ends at the first round at least ``lease_s`` later, so a job holds
  its GPUs for one to two lease lengths and then competes at every round until it finishes. Aligning leases on
  one clock batches their expiries (one round per ``lease_s``, not one per job); a round is woken only when a
  job waits.
- **Lease round: who bids** (§3.3, the fairness knob f): the contenders are the waiting jobs and the running
  jobs whose lease has ended. They are ranked worst first, by tenant and then by job: tenants by the mean rho
  of their active jobs (pending and running), worst first; within a tenant, its jobs by rho, worst first. The
  worst ``ceil((1 - f) * contenders)`` take part in the auction (at least one). f = 0: everyone bids and the
  auction is pure efficiency; f near 1: only the worst job bids, pure fairness.
- **Lease round: the auction** (§3.3): the offer is every free GPU plus the GPUs of every contender whose
  lease ended. Themis' partial-allocation auction picks the allocation that maximises the product of the
  participants' rho improvements (rho_old / rho_new: Nash social welfare). Each bid here is one whole gang for
  one lease, so the policy maximises it greedily: participants in decreasing log improvement per GPU, where
  the improvement of running for this lease rather than waiting it out is (E + lease_s) / E with
  E = t - submit + remaining (``allocation=rho`` instead serves participants worst rho first). A waiting
  participant takes free GPUs, else preempts contenders that come after it (non-participants first, the
  best-off first; then participants with smaller improvements); a running participant renews its lease where
  it is (no migration, no needless preemption).
- **Leftovers** (§3.3): what the auction leaves goes to the non-participants in rank order: waiting jobs take
  what is free; a running job nobody displaced keeps its GPUs. Nobody is preempted for a non-participant.
- **Between lease rounds**: GPUs freed by finishing jobs go to waiting jobs in rank order, without preemption
  (Themis offers resources as they free up; the lease keeps the allocation stable until the next round).
- **Placement preferences** (§4.3: agents bid for the GPU sets they value): every gang is placed by
  ``placement`` (``consolidated`` by default: fewest nodes, best fit; ``strict`` waits for the fewest nodes),
  and a renewed job stays where it is.

Nodes lost (``on_nodes_changed``): nothing here is kept per node. A job requeued by a lost node waits and contends
like any waiting job (its lease ended with its run), and ``G`` counts the GPUs that are up at each round.

Cost: each job's figures (submission, work, progress, start, GPUs, tenant) sit in columns of one numpy array,
kept incrementally by :meth:`ThemisPolicy.on_job_changed`; a round evaluates every active job's rho in a few
vectorized passes, then visits, in Python, only the jobs it launches, renews or preempts, plus one per job shape
that it finds cannot fit (shapes are pruned wholesale, as in :mod:`corral.policies.framework.queues`). A round
with nothing free and no lease ending, or with a single waiting job, ranks nothing; between lease rounds only the
head of the rank order is sorted (an O(n) partition picks it out), the rest only if the walk gets that far.
Nothing here is random.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum

import numpy as np
from mypy_extensions import mypyc_attr

from corral.core.decisions import Decision, Launch, Preempt
from corral.core.errors import ConfigError
from corral.core.job import FULL_GPU_MILLI, JobClass, JobPhase, JobSpec, JobView
from corral.core.options import option
from corral.core.placement import Placement
from corral.policies.framework.contract import BasePolicy, PolicyConfig, allowed_types
from corral.policies.framework.placement import PlacementStrategy, place
from corral.policies.framework.preemption import place_on_free
from corral.policies.framework.reasons import blocked_reason, fit_reason, quota_reason
from corral.policies.framework.round import Round
from corral.policies.framework.view import ClusterView

# Times within this many seconds are the same instant (lease rounds are multiples of lease_s in floating point).
_EPS_S = 1e-6
# Between lease rounds, how many of the best-placed waiting jobs are sorted before the walk starts.
_HEAD = 32


class Allocation(StrEnum):
    WELFARE = "welfare"  # Themis' auction objective: the largest rho improvement per GPU first
    RHO = "rho"  # worst rho first


@dataclass(frozen=True, slots=True)
class ThemisConfig(PolicyConfig):
    lease_s: float = option(
        600.0,
        "lease length in seconds: lease rounds fall at its multiples, and a job holds GPUs at least this long "
        "before it must bid again (Themis' evaluation used leases of about 10-20 minutes)",
    )
    fairness_knob: float = option(
        0.8,
        "f in [0, 1]: only the worst (1-f) fraction of contenders bid in a lease round (0: all bid, most "
        "efficient; 1: the worst one only, most fair)",
    )
    allocation: Allocation = option(
        Allocation.WELFARE,
        "how the bidders share the offer: welfare (Themis' auction: largest finish-time improvement per GPU "
        "first) or rho (worst rho first)",
    )
    placement: PlacementStrategy = option(
        PlacementStrategy.CONSOLIDATED,
        "where a gang's GPUs go: consolidated (fewest nodes, best fit), strict (fewest possible nodes or wait), "
        "spread (one per node), first-fit",
    )

    def __post_init__(self) -> None:
        if not (self.lease_s > 0 and math.isfinite(self.lease_s)):
            raise ConfigError(f"themis: lease_s must be a positive number of seconds, got {self.lease_s}")
        if not 0.0 <= self.fairness_knob <= 1.0:
            raise ConfigError(f"themis: fairness_knob must be in [0, 1], got {self.fairness_knob}")


# Columns of the active-job table.
_SUBMIT, _WORK, _DONE, _EXECUTED, _START, _DEMAND, _GPUS, _WHOLE, _TENANT, _SEQ = range(10)
_COLUMNS = 10


class _ActiveJobs:
    """Pending and running jobs as rows of one float array (compact: rows 0..n-1), for vectorized estimates.

    ``_WORK`` is NaN for a job without a duration; ``_START`` is NaN while the job waits, else its last launch.
    ``_DONE``/``_EXECUTED`` are the job's progress and time on GPUs at its last phase change.
    """

    __slots__ = ("ids", "n", "rows", "slot", "unknown_work")

    def __init__(self) -> None:
        self.rows = np.zeros((256, _COLUMNS))
        self.n = 0
        self.ids: list[str] = []
        self.slot: dict[str, int] = {}
        self.unknown_work = 0

    def put(self, job: JobView, tenant: int, seq: int, start: float) -> None:
        spec = job.spec
        i = self.slot.get(spec.job_id)
        if i is None:
            i = self.n
            if i == len(self.rows):
                self.rows = np.concatenate((self.rows, np.zeros_like(self.rows)))
            self.n += 1
            self.ids.append(spec.job_id)
            self.slot[spec.job_id] = i
            if spec.duration_s is None:
                self.unknown_work += 1
        work = math.nan if spec.duration_s is None else spec.duration_s
        self.rows[i] = (
            spec.submit_s,
            work,
            job.work_done_s,
            job.executed_s,
            start,
            spec.gpu_demand_milli / FULL_GPU_MILLI,
            spec.num_gpus,
            1.0 if spec.gpu_milli == FULL_GPU_MILLI else 0.0,
            tenant,
            seq,
        )

    def drop(self, job_id: str) -> None:
        i = self.slot.pop(job_id, None)
        if i is None:
            return
        if math.isnan(self.rows[i, _WORK]):
            self.unknown_work -= 1
        last = self.n - 1
        if i != last:
            self.rows[i] = self.rows[last]
            moved = self.ids[last]
            self.ids[i] = moved
            self.slot[moved] = i
        self.ids.pop()
        self.n = last


@dataclass(slots=True)
class _Estimates:
    """Per active row at one instant: rho, E (= now - submit + remaining) and whether it runs."""

    rho: np.ndarray
    elapsed: np.ndarray
    running: np.ndarray


@mypyc_attr(allow_interpreted_subclasses=True)  # a user's policy (and a test's) may extend it
class ThemisPolicy(BasePolicy):
    name = "themis"
    summary = "finish-time fairness (Themis): leases auctioned to the worst-rho tenants and jobs; preemptive"
    Config = ThemisConfig

    def __init__(self, config: PolicyConfig | None = None, *, seed: int = 0) -> None:
        super().__init__(config, seed=seed)
        cfg = self.config
        assert isinstance(cfg, ThemisConfig)
        self.cfg = cfg
        self._active = _ActiveJobs()
        self._tenant_ids: dict[str, int] = {}
        self._seq = 0
        self._seq_of: dict[str, int] = {}
        # Running jobs in launch order, for the earliest lease expiry: (start, job id), stale entries skipped.
        self._launches: deque[tuple[float, str]] = deque()
        self._start_of: dict[str, float] = {}

    # -- bookkeeping --------------------------------------------------------------------------------------
    def on_job_changed(self, job: JobView, before: Placement | None, now_s: float) -> None:
        job_id = job.spec.job_id
        phase = job.phase
        if phase is JobPhase.PENDING or phase is JobPhase.RUNNING:
            tenant = self._tenant_ids.setdefault(job.spec.tenant, len(self._tenant_ids))
            seq = self._seq_of.get(job_id)
            if seq is None:
                self._seq += 1
                seq = self._seq_of[job_id] = self._seq
            if phase is JobPhase.RUNNING:
                self._active.put(job, tenant, seq, now_s)
                self._start_of[job_id] = now_s
                self._launches.append((now_s, job_id))
            else:
                self._active.put(job, tenant, seq, math.nan)
                self._start_of.pop(job_id, None)
        else:
            self._active.drop(job_id)
            self._seq_of.pop(job_id, None)
            self._start_of.pop(job_id, None)

    # -- estimates ----------------------------------------------------------------------------------------
    def _estimate(self, now: float, num_gpus: int) -> _Estimates:
        act = self._active
        n = act.n
        rows = act.rows[:n]
        start = rows[:, _START]
        running = ~np.isnan(start)
        ran = np.where(running, now - start, 0.0)
        work = rows[:, _WORK]
        left = np.maximum(work - rows[:, _DONE] - ran, 0.0)
        if act.unknown_work:
            known = ~np.isnan(work)
            attained = rows[:, _EXECUTED] + ran
            guess = np.maximum(attained, self.cfg.lease_s)
            left = np.where(known, left, guess)
            work = np.where(known, work, attained + guess)
        elapsed = np.maximum(now - rows[:, _SUBMIT] + left, _EPS_S)
        ideal = np.maximum(work * np.maximum(1.0, rows[:, _DEMAND] * (n / max(num_gpus, 1))), 1.0)
        return _Estimates(elapsed / ideal, elapsed, running)

    def _tenant_positions(self, est: _Estimates, rows: np.ndarray) -> np.ndarray | None:
        """Each row's tenant's place in the tenant order: by the mean rho of the tenant's active jobs, worst
        first (ties: the tenant seen first). ``None`` when there is one tenant."""
        if len(self._tenant_ids) == 1:
            return None
        tenant = rows[:, _TENANT].astype(np.intp)
        score = np.bincount(tenant, weights=est.rho) / np.maximum(np.bincount(tenant), 1)
        order = np.lexsort((np.arange(len(score)), -score))
        position = np.empty(len(score), dtype=np.intp)
        position[order] = np.arange(len(score))
        result: np.ndarray = position[tenant]
        return result

    @staticmethod
    def _sort(est: _Estimates, rows: np.ndarray, which: np.ndarray, tenant_pos: np.ndarray | None) -> np.ndarray:
        """Rows ``which`` in rank order: by tenant (``tenant_pos``), then by rho, worst first (ties: the job seen
        first)."""
        keys = [rows[which, _SEQ], -est.rho[which]]
        if tenant_pos is not None:
            keys.append(tenant_pos[which])
        result: np.ndarray = which[np.lexsort(keys)]
        return result

    def _in_rank_order(
        self, est: _Estimates, rows: np.ndarray, which: np.ndarray, tenant_pos: np.ndarray | None
    ) -> Iterator[int]:
        """Rows ``which`` in rank order, lazily: a round between leases usually stops after a few jobs, so the
        first ``_HEAD`` are picked out (an O(n) partition, ties at the boundary included) and sorted; the rest
        is sorted only if the walk gets that far."""
        if len(which) <= 4 * _HEAD:
            yield from self._sort(est, rows, which, tenant_pos).tolist()
            return
        rho = est.rho[which]
        if tenant_pos is None:
            level = np.partition(rho, len(rho) - _HEAD)[len(rho) - _HEAD]
            head = rho >= level
        else:
            pos = tenant_pos[which]
            before = np.cumsum(np.bincount(pos))
            last = int(np.searchsorted(before, _HEAD))  # the tenant in which the head ends
            need = _HEAD - (int(before[last - 1]) if last else 0)
            in_last = pos == last
            rho_last = rho[in_last]
            level = np.partition(rho_last, len(rho_last) - need)[len(rho_last) - need]
            head = (pos < last) | (in_last & (rho >= level))
        yield from self._sort(est, rows, which[head], tenant_pos).tolist()
        yield from _lazy(self._sort(est, rows, which[~head], tenant_pos))

    # -- the round ----------------------------------------------------------------------------------------
    def schedule(self, view: ClusterView, now_s: float) -> Decision:
        if not view.num_pending:
            return Decision.NOTHING
        cfg = self.cfg
        rnd = Round(view, now_s)
        planner = rnd.planner
        lease = cfg.lease_s
        lease_round = (
            abs(now_s - round(now_s / lease) * lease) <= _EPS_S and self._oldest_start() <= now_s - lease + _EPS_S
        )
        if not lease_round:
            if planner.total_free() == 0 and not planner.has_partial():
                return self._decision(rnd)  # nothing free, and no lease ends now
            if view.num_pending == 1:
                spec = next(view.pending()).spec
                placement = self._try_free(rnd, spec)  # nothing to rank
                if placement is not None:
                    rnd.launch(spec.job_id, placement)
                else:
                    rnd.wait(spec.job_id, blocked_reason(planner, spec, allowed_types(view, spec), cfg.placement))
                return self._decision(rnd)

        rows = self._active.rows[: self._active.n]
        # G is the cluster's GPUs that are up: while nodes are down, an equal share is of what is left (§3.2's 1/N
        # share of the cluster a job could be given).
        est = self._estimate(now_s, sum(view.up_gpus(t) for t in range(len(view.topology.type_names))))
        tenant_pos = self._tenant_positions(est, rows)
        pending = np.flatnonzero(~est.running)
        capacity = float(planner.total_free())
        if not lease_round:
            # Between lease rounds: what is free goes to the waiting jobs in rank order. A whole-GPU job wider
            # than everything free cannot start: leave it out before ranking.
            fits = (rows[pending, _WHOLE] == 0.0) | (rows[pending, _GPUS] <= capacity)
            order = self._in_rank_order(est, rows, pending[fits], tenant_pos)
            self._allocate(rnd, order, {}, 0)
            return self._decision(rnd)

        expired = np.flatnonzero(est.running & (rows[:, _START] <= now_s - lease + _EPS_S))
        contenders = np.concatenate((pending, expired))
        ranked = self._sort(est, rows, contenders, tenant_pos)
        bidders = max(1, math.ceil((1.0 - cfg.fairness_knob) * len(contenders) - 1e-9))
        if cfg.allocation is Allocation.WELFARE:
            part = ranked[:bidders]
            gain = np.log1p(lease / est.elapsed[part]) / rows[part, _DEMAND]
            ranked = np.concatenate((part[np.lexsort((np.arange(len(part)), -gain))], ranked[bidders:]))
        # A whole-GPU job wider than everything on offer cannot win: leave it out of the walk.
        capacity += float(rows[expired, _GPUS].sum())
        fits = (rows[ranked, _WHOLE] == 0.0) | (rows[ranked, _GPUS] <= capacity) | est.running[ranked]
        bidders = int(fits[:bidders].sum())
        ranked = ranked[fits]
        positions = np.flatnonzero(est.running[ranked])
        running = dict(zip(positions.tolist(), ranked[positions].tolist(), strict=True))
        self._allocate(rnd, _lazy(ranked), running, bidders)
        return self._decision(rnd)

    def _allocate(self, rnd: Round, order: Iterator[int], running: dict[int, int], bidders: int) -> None:
        """Walk the contenders' rows in ``order``; ``running`` maps the positions of running contenders (whose
        lease ended) to their rows. The first ``bidders`` may preempt running contenders that come after them
        (the last first); the rest take only what is free. A running contender that nobody displaced keeps its
        GPUs: its lease is renewed where it is. Each job examined and not placed gets the reason it waits."""
        view, planner = rnd.view, rnd.planner
        ids = self._active.ids
        strategy = self.cfg.placement
        victims = sorted(running)  # positions, ascending; used from the end
        taken: set[int] = set()
        blocked = _Blocked(view)
        for pos, row in enumerate(order):
            if pos in running:
                continue
            while victims and victims[-1] in taken:
                victims.pop()
            can_preempt = pos < bidders and bool(victims) and victims[-1] > pos
            if not can_preempt and planner.total_free() == 0 and not planner.has_partial():
                break  # nothing free, and nobody after this may preempt either (their victims only ever shrink)
            spec = view.job(ids[row]).spec
            if blocked.has(spec):
                continue
            types = allowed_types(view, spec)
            if not planner.quota_allows(spec):
                rnd.wait(spec.job_id, quota_reason(planner, spec))
                blocked.add(spec, quota=True)
                continue
            placement = None
            if spec.gpu_milli < FULL_GPU_MILLI or any(planner.type_free(t) >= spec.num_gpus for t in types):
                placement = place(planner, spec, strategy, types)
            if placement is None and can_preempt:
                placement = self._displace(rnd, spec, types, running, pos, victims, taken)
            if placement is None:
                rnd.wait(spec.job_id, fit_reason(planner, spec, types, strategy))
                blocked.add(spec)
                continue
            rnd.launch(spec.job_id, placement)
        # A contender displaced from GPUs its winner needed moves to what is still free at once (a migration)
        # rather than waiting beside idle GPUs for the next lease round.
        for victim_id in [a.job_id for a in rnd.actions if type(a) is Preempt]:
            moved = place_on_free(view, planner, view.job(victim_id).spec, strategy)
            if moved is not None:
                rnd.launch(victim_id, moved)

    def _displace(
        self,
        rnd: Round,
        spec: JobSpec,
        types: tuple[int, ...],
        running: dict[int, int],
        pos: int,
        victims: list[int],
        taken: set[int],
    ) -> Placement | None:
        """Free GPUs for ``spec`` by releasing the running contenders after position ``pos``, from the last, until
        it fits; preempt (in ``rnd``) those whose GPUs it uses. ``None``, and nothing changed, if even all of them
        are not enough."""
        view, planner = rnd.view, rnd.planner
        ids = self._active.ids
        whole = spec.gpu_milli == FULL_GPU_MILLI
        freed: list[tuple[int, JobView]] = []
        placement = None
        for vpos in reversed(victims):
            if vpos <= pos:
                break
            if vpos in taken:
                continue
            victim = view.job(ids[running[vpos]])
            planner.release(victim)
            freed.append((vpos, victim))
            if whole and not any(planner.type_free(t) >= spec.num_gpus for t in types):
                continue
            placement = place(planner, spec, self.cfg.placement, types)
            if placement is not None:
                break
        used = set() if placement is None else set(placement.gpus)
        for vpos, victim in freed:
            assert victim.placement is not None
            if used.isdisjoint(victim.placement.gpus):
                planner.take(victim.spec, list(victim.placement.gpus))  # freed for nothing: it keeps running
            else:
                taken.add(vpos)
                rnd.preempt(victim, f"themis: lease ended; {spec.job_id} won it", release=False)
        return placement

    def _try_free(self, rnd: Round, spec: JobSpec) -> Placement | None:
        if rnd.fits(spec, self.cfg.placement) is not None:
            return None
        return rnd.place(spec, self.cfg.placement)

    # -- leases -------------------------------------------------------------------------------------------
    def _oldest_start(self) -> float:
        """The earliest launch among running jobs (``inf`` when none runs)."""
        launches = self._launches
        start_of = self._start_of
        while launches:
            start, job_id = launches[0]
            if start_of.get(job_id) == start:
                return start
            launches.popleft()
        return math.inf

    def _decision(self, rnd: Round) -> Decision:
        """The round's decision, with a wake-up for the next lease round if a job will still be waiting then."""
        actions, now_s = rnd.actions, rnd.now_s
        launched = sum(1 for a in actions if type(a) is Launch)
        preempted = len(actions) - launched
        if rnd.view.num_pending - launched + preempted <= 0:
            return rnd.decision()
        lease = self.cfg.lease_s
        oldest = self._oldest_start()
        if launched:
            oldest = min(oldest, now_s)
        if math.isinf(oldest):
            return rnd.decision()
        next_round = (math.floor(now_s / lease + 1e-9) + 1) * lease
        expiry = math.ceil((oldest + lease) / lease - 1e-9) * lease
        return rnd.decision(max(next_round, expiry))


def _lazy(rows: np.ndarray) -> Iterator[int]:
    """The items of ``rows`` as Python ints, converted a growing chunk at a time: a round usually stops early."""
    lo, size = 0, 16
    while lo < len(rows):
        yield from rows[lo : lo + size].tolist()
        lo += size
        size = min(size * 4, 4096)


class _Blocked:
    """Job shapes found not to fit this round (as in :class:`corral.policies.framework.queues.PendingWalk`): a job
    fits or fails like every job of its kind (whole or share, GPU types, memory) that is no smaller, and a
    guaranteed job of a tenant with a quota fails like every no larger demand of that tenant once the quota is the
    obstacle."""

    __slots__ = ("_fit", "_quota", "_view")

    def __init__(self, view: ClusterView) -> None:
        self._view = view
        self._fit: dict[tuple[bool, tuple[str, ...], int | None], int] = {}
        self._quota: dict[str, int] = {}

    @staticmethod
    def _kind(spec: JobSpec) -> tuple[tuple[bool, tuple[str, ...], int | None], int]:
        whole = spec.gpu_milli == FULL_GPU_MILLI
        return (whole, spec.gpu_types, spec.gpu_mem_mib), spec.num_gpus if whole else spec.gpu_milli

    def _quota_tenant(self, spec: JobSpec) -> str | None:
        if spec.job_class is not JobClass.GUARANTEED:
            return None
        tenant = self._view.tenants.get(spec.tenant)
        return spec.tenant if tenant is not None and tenant.quota_gpus is not None else None

    def add(self, spec: JobSpec, *, quota: bool = False) -> None:
        if quota:
            tenant = self._quota_tenant(spec)
            if tenant is not None:
                old = self._quota.get(tenant)
                demand = spec.gpu_demand_milli
                self._quota[tenant] = demand if old is None else min(old, demand)
            return
        kind, size = self._kind(spec)
        old_size = self._fit.get(kind)
        self._fit[kind] = size if old_size is None else min(old_size, size)

    def has(self, spec: JobSpec) -> bool:
        if self._fit:
            kind, size = self._kind(spec)
            limit = self._fit.get(kind)
            if limit is not None and size >= limit:
                return True
        if self._quota:
            tenant = self._quota_tenant(spec)
            if tenant is not None:
                cap = self._quota.get(tenant)
                if cap is not None and spec.gpu_demand_milli >= cap:
                    return True
        return False
