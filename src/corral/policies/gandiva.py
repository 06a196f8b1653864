"""Gandiva (Xiao et al., OSDI'18): time-slicing, packing and migrating deep-learning jobs, by introspection.

The rules, each with the section of the paper it comes from:

- **Reactive placement** (§4.1): a job that arrives, or waits, takes free GPUs at once, consolidated where it can
  (fewest nodes, best fit). A suspended job goes back to the very GPUs it was suspended from when they are free
  (its state is in that node's host memory, so resuming there is cheap); one that is not movable
  (``JobView.movable``: live, a run that does not checkpoint) resumes only there, and is never migrated. Jobs
  behind one that does not fit may start (backfilling), except that a job waiting ``reserve_after_s`` holds the
  queue until it fits, so that big gangs are not starved by a stream of small ones (corral's addition: Gandiva
  admits every job at once by oversubscribing GPUs, which a strict-gang simulator cannot express).
- **Time-slicing** (§3.1 suspend-resume, §4.1): when jobs outnumber GPUs, jobs of the same GPU count share GPUs
  round-robin. A running job that has had its quantum (``quantum_s``, 60 s as in the paper) while a job of its
  size waits is suspended at a mini-batch boundary (``Preempt(suspend=True)``: its state stays in its node's host
  memory) and the waiting job that has waited longest takes its GPUs. The suspended job goes to the back of the
  queue (the queue is ordered by when a job last entered it). Each switch costs the switched jobs the simulator's
  ``suspend_resume_s`` (same node) or ``restore_s`` (elsewhere).
- **Packing** (§3.1, §4.2): a waiting job shares the GPUs of a running job of the same size (each at half of
  every GPU: ``Launch`` with ``gpu_milli=500``) when their *predicted* combined progress beats running them in
  turn: the normalised rates measured by Gavel for the two models' job types on that GPU type
  (:mod:`corral.workloads.colocation`) must sum to at least ``1 + pack_threshold`` (time-slicing gives 0.5 + 0.5).
  The running job is re-seated at half share (a suspend and an immediate resume on the same GPUs: the only way
  corral's decisions change a share). Jobs whose model corral does not know are predicted at 0.5 + 0.5 and are
  never packed. A packed job whose partner leaves gets a new partner from the queue if one is predicted to gain,
  else is re-seated at a whole share.
- **Unpacking by introspection** (§4.2): ``introspect_s`` after a pair is formed, its *observed* rates (the
  executor's measure of each job's speed relative to running alone, ``JobView.observed_rate``) are compared: if
  they sum to less than ``1 + unpack_threshold``, packing was worse than taking turns, and the job that joined
  last is suspended back to the queue; the pair is never packed again.
- **Migration** (§3.2, §4.2), a checkpoint and a restore elsewhere (``Preempt`` then ``Launch`` in one decision):
  *defragmentation*: a waiting multi-GPU job that fits in one node but finds no node with enough free GPUs, while
  enough are free across nodes, gets one: single-GPU jobs on the node with the most free GPUs are moved to free
  GPUs elsewhere; *locality*: a running job spread over more nodes than its size needs is moved onto fewer nodes
  once they have room. At most ``max_migrations`` jobs move per round. *A job sent back to the queue* (a time
  slice gives its GPUs to a job that needs their type, or an unpacking) that can run on GPUs the round leaves idle
  moves there at once, as reactive placement (§4.1) would place it in the next round, instead of waiting beside
  them for its own GPUs (this is a waiting job's placement: neither ``max_migrations`` nor ``migration`` bound it).

Gandiva does not know job durations, and this policy never reads them. Every index it keeps (running jobs by
size and slice start, packable running jobs by size, GPU type and co-location type, waiting jobs by size and
co-location type, packed pairs, spread jobs) is updated in :meth:`GandivaPolicy.on_job_changed` (where a job ran
is read from the change, not kept), so a round costs O(jobs it acts on + size classes), never a scan of all jobs
or GPUs. A round is a :class:`~corral.policies.framework.round.Round` that also counts what the wake-up needs,
in these steps: judge packed pairs and re-seat packed jobs left alone; place waiting jobs (defragmenting for a
gang); pack; time-slice; resume elsewhere the jobs it sent back to the queue; consolidate spread jobs.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from corral.core.cluster import Topology
from corral.core.decisions import Decision
from corral.core.errors import ConfigError
from corral.core.job import FULL_GPU_MILLI, JobClass, JobPhase, JobSpec, JobView
from corral.core.options import option
from corral.core.placement import Placement
from corral.core.sorted_groups import Group, bisect_right_entry
from corral.policies.framework.contract import BasePolicy, PolicyConfig
from corral.policies.framework.placement import PlacementStrategy
from corral.policies.framework.planner import Planner
from corral.policies.framework.queues import KeyedQueue, PendingWalk
from corral.policies.framework.reasons import blocked_reason, fit_reason, quota_reason
from corral.policies.framework.round import Round
from corral.policies.framework.view import ClusterView
from corral.workloads.colocation import ColocationTable, gavel_gpu, load_colocation, pair_rates
from corral.workloads.models import traits

PACK_SHARE = FULL_GPU_MILLI // 2  # two packed jobs split each of their GPUs evenly
_SCAN = 32  # candidates looked at per waiting job before giving up on it this round (bounds a round's cost)
_DEFRAG_NODES = 16  # nodes examined per defragmentation attempt
_MAX_ID = "\U0010ffff"  # sorts after every job id: (t, _MAX_ID) bounds the slices that started at or before t


@dataclass(frozen=True, slots=True)
class GandivaConfig(PolicyConfig):
    quantum_s: float = option(60.0, "time slice (s) of jobs that share GPUs round-robin")
    time_slicing: bool = option(True, "when jobs outnumber GPUs, rotate jobs of the same size every quantum")
    packing: bool = option(True, "co-locate two jobs on the same GPUs when predicted to beat taking turns")
    pack_threshold: float = option(0.1, "pack only if the pair's predicted normalised rates sum to >= 1 + this")
    unpack_threshold: float = option(0.0, "unpack a pair whose observed rates sum to < 1 + this")
    introspect_s: float = option(60.0, "seconds a packed pair runs before its observed progress is judged")
    migration: bool = option(True, "move jobs to give a waiting gang one node, and to consolidate spread jobs")
    max_migrations: int = option(16, "most jobs moved (migrated) per round")
    reserve_after_s: float | None = option(
        None,
        "a job that has waited this long stops backfilling past it until it fits (none: never)",
        annotation=float | None,
    )

    def __post_init__(self) -> None:
        for name in ("quantum_s", "introspect_s"):
            value = getattr(self, name)
            if not 0 < value < float("inf"):
                raise ConfigError(f"gandiva: {name} must be > 0 and finite, got {value}")
        if not -1 < self.pack_threshold < 1 or not -1 < self.unpack_threshold < 1:
            raise ConfigError("gandiva: pack_threshold and unpack_threshold must be in (-1, 1)")
        if self.max_migrations < 0:
            raise ConfigError(f"gandiva: max_migrations must be >= 0, got {self.max_migrations}")
        if self.reserve_after_s is not None and not self.reserve_after_s >= 0:
            raise ConfigError(f"gandiva: reserve_after_s must be >= 0, got {self.reserve_after_s}")


class _Planner(Planner):
    """The round's planner, with shares: packed launches take half a GPU, and a packed job's quota use is what
    it holds (the engine's state counts ``num_gpus * placement.gpu_milli``, and so does this)."""

    __slots__ = ()

    def take_share(self, spec: JobSpec, gpus: list[int] | tuple[int, ...], milli: int) -> Placement:
        mem = spec.gpu_mem_mib or 0
        for g in gpus:
            self._set(g, self.gpu_free_milli(g) - milli, self.gpu_free_mem_mib(g) - mem)
        if spec.job_class is JobClass.GUARANTEED:
            self._tenant[spec.tenant] = self.tenant_guaranteed_milli(spec.tenant) + len(gpus) * milli
        return Placement(tuple(sorted(gpus)), milli)

    def release(self, job: JobView) -> None:
        if job.placement is not None:
            self.untake(job.spec, job.placement)

    def can_take(self, spec: JobSpec, gpus: tuple[int, ...], milli: int) -> bool:
        """Do ``gpus`` have ``milli`` free each (and the job's memory), of a type it accepts, within its quota?"""
        mem = spec.gpu_mem_mib or 0
        topo = self.topo
        allowed = set(topo.type_indices(spec.gpu_types)) if spec.gpu_types else None
        for g in gpus:
            if self.gpu_free_milli(g) < milli or self.gpu_free_mem_mib(g) < mem:
                return False
            if allowed is not None and topo.gpu_type[g] not in allowed:
                return False
        if spec.job_class is not JobClass.GUARANTEED:
            return True
        tenant = self.view.tenants.get(spec.tenant)
        if tenant is None or tenant.quota_gpus is None:
            return True
        used = self.tenant_guaranteed_milli(spec.tenant)
        return used + len(gpus) * milli <= tenant.quota_gpus * FULL_GPU_MILLI


class _Due:
    """The running jobs of one size whose quantum is over, oldest slice first, consumed within one round."""

    __slots__ = ("_end", "_next", "_skipped", "_slices")

    def __init__(self, slices: Group, end: int) -> None:
        self._slices = slices
        self._end = end  # slices[:end] are due
        self._next = 0
        self._skipped: dict[str, None] = {}  # due, looked at, not taken yet

    def empty(self) -> bool:
        return self._next >= self._end and not self._skipped

    def candidates(self) -> Iterator[str]:
        yield from list(self._skipped)
        while self._next < self._end:
            job_id: str = self._slices[self._next][1]
            self._next += 1
            self._skipped[job_id] = None
            yield job_id

    def drop(self, job_id: str) -> None:
        self._skipped.pop(job_id, None)


class _Cursor:
    """Walks one bucket of candidates within a round; a candidate passed over for one job is offered first to
    the next. Buckets do not change during a round (the policy's indexes change only between rounds)."""

    __slots__ = ("_it", "_skipped")

    def __init__(self, bucket: dict[str, None]) -> None:
        self._it: Iterator[str] = iter(bucket)
        self._skipped: list[str] = []

    def candidates(self) -> Iterator[str]:
        yield from list(self._skipped)
        yield from self._it

    def skip(self, job_id: str) -> None:
        self._skipped.append(job_id)

    def took(self, job_id: str) -> None:
        if job_id in self._skipped:
            self._skipped.remove(job_id)


class _Round(Round):
    """One scheduling round, with what Gandiva counts while it plans: how many waiting jobs of each size it
    launched and sent back to the queue, and whether it packed a pair (for the wake-up, :meth:`_next_wake`)."""

    __slots__ = ("backfill", "fresh", "moves_left", "packed", "queued", "requeued", "shares", "taken")

    def __init__(self, view: ClusterView, now_s: float, moves_left: int) -> None:
        shares = _Planner(view)
        super().__init__(view, now_s, shares)
        self.shares = shares  # the round's planner (``planner``), as its own class (see Round's module docstring)
        self.moves_left = moves_left
        self.packed = False
        self.taken: dict[int, int] = {}  # size -> waiting whole-GPU jobs launched this round
        self.queued: dict[int, int] = {}  # size -> jobs sent back to the queue this round
        self.fresh: set[int] = set()  # sizes of jobs that start a slice (a whole share) now
        self.requeued: list[JobView] = []  # jobs sent back to the queue this round, in order
        self.backfill = True  # False: a job that waited reserve_after_s holds what is free (see _fill)

    def start(self, job: JobView, placement: Placement, waiting: bool) -> None:
        """:meth:`launch` ``job`` (``waiting``: from the queue, not a running job re-seated or moved), counted."""
        spec = job.spec
        self.launch(spec.job_id, placement)
        if spec.gpu_milli == FULL_GPU_MILLI:
            k = spec.num_gpus
            if waiting:
                self.taken[k] = self.taken.get(k, 0) + 1
            if placement.gpu_milli == FULL_GPU_MILLI:
                self.fresh.add(k)

    def suspend(self, job: JobView, reason: str) -> None:
        """Send a running whole-GPU job back to the queue, suspended (its GPUs back in the planner)."""
        self.preempt(job, reason, suspend=True)
        self.requeued.append(job)
        k = job.spec.num_gpus
        self.queued[k] = self.queued.get(k, 0) + 1


class GandivaPolicy(BasePolicy):
    name = "gandiva"
    summary = "time-slicing, packing by measured co-location, migration (Gandiva, OSDI'18)"
    Config = GandivaConfig
    needs_models = True

    def __init__(
        self, config: PolicyConfig | None = None, *, seed: int = 0, table: ColocationTable | None = None
    ) -> None:
        # ``table``: the co-location measurements to predict from (default: Gavel's, loaded on the first need).
        super().__init__(config, seed=seed)
        self._table_loaded: ColocationTable | None = table
        self._topo: Topology | None = None
        self._gavel: tuple[str, ...] = ()
        self._node_size: tuple[int, ...] = ()  # per GPU type: the most GPUs a node of it has
        # Running whole-GPU jobs at a whole share: by size, (slice start, id) sorted (time-slicing victims).
        self._slices: KeyedQueue[int] = KeyedQueue()
        # The same jobs with a known co-location type, by size -> (GPU type, co-location type) (packing hosts).
        self._hosts: dict[int, dict[tuple[int, str], dict[str, None]]] = {}
        # Running jobs spread over more nodes than they need: (GPU type, size) -> ids (locality migration).
        self._spread: dict[tuple[int, int], dict[str, None]] = {}
        # Pending whole-GPU jobs in queue order, entries (when it entered, id): by size, and by (size, co-location
        # type) for packing.
        # (Insertion-ordered dicts, not KeyedQueues: a job enters at the back, so a dict keeps the queue order at O(1).)
        self._waiting: dict[int, dict[str, None]] = {}
        self._waiting_pack: dict[tuple[int, str], dict[str, None]] = {}
        # Packed jobs: partner (None once it left), lone ones, partners planned this round, pairs to judge.
        self._partner: dict[str, str | None] = {}
        self._lone: dict[str, None] = {}
        self._planned: dict[str, str] = {}
        self._judge: dict[str, float] = {}
        self._bad: dict[str, set[str]] = {}
        self._pred: dict[tuple[str, str, int], float] = {}
        self._ctypes: dict[str | None, str] = {}
        self.counts: dict[str, int] = {"suspend": 0, "pack": 0, "unpack": 0, "reseat": 0, "migrate": 0}

    # -- hooks ------------------------------------------------------------------------------------------------
    def queue_key(self, job: JobView) -> tuple[Any, ...]:
        # Round-robin: a job goes to the back of the queue each time it enters it (on submission or suspension).
        return (job.queued_since_s,)

    def admit(self, view: ClusterView, spec: JobSpec) -> str | None:
        self._bind(view)
        return super().admit(view, spec)

    def on_job_changed(self, job: JobView, before: Placement | None, now_s: float) -> None:
        spec = job.spec
        if spec.gpu_milli != FULL_GPU_MILLI:
            return  # fractional jobs are placed like any other, never time-sliced, packed or moved
        job_id = spec.job_id
        self._forget_running(spec, before)
        self._forget_waiting(spec)
        phase = job.phase
        if phase is JobPhase.RUNNING:
            placement = job.placement
            assert placement is not None
            if placement.gpu_milli < FULL_GPU_MILLI:
                self._joined(job_id, now_s)
            else:
                self._index_running(job, placement)
        elif phase is JobPhase.PENDING:
            self._unpair(job_id)
            k = spec.num_gpus
            self._waiting.setdefault(k, {})[job_id] = None
            ctype = self._ctype(spec.model)
            if ctype:
                self._waiting_pack.setdefault((k, ctype), {})[job_id] = None
        else:
            self._unpair(job_id)
            for other in self._bad.pop(job_id, ()):
                peers = self._bad.get(other)
                if peers is not None:
                    peers.discard(job_id)
                    if not peers:
                        del self._bad[other]

    def on_job_restored(self, view: ClusterView, job: JobView, now_s: float) -> None:
        """A job taken back after a live restart. A packed job is paired again with the other packed job on its
        GPU once both are back (their pairing is judged afresh, as after a new pack); a suspended one waits in
        the queue as it did."""
        self._bind(view)
        placement = job.placement
        job_id = job.spec.job_id
        if (
            job.phase is JobPhase.RUNNING
            and placement is not None
            and job.spec.gpu_milli == FULL_GPU_MILLI
            and placement.gpu_milli < FULL_GPU_MILLI
        ):
            for other in view.gpu_jobs(placement.gpus[0]):
                if other != job_id and other in self._partner and self._partner[other] is None:
                    self._planned[job_id] = other
                    break
        self.on_job_changed(job, None, now_s)

    def schedule(self, view: ClusterView, now_s: float) -> Decision:
        cfg = self.config
        assert isinstance(cfg, GandivaConfig)
        self._bind(view)
        rnd = _Round(view, now_s, cfg.max_migrations if cfg.migration else 0)
        lone = list(self._lone)
        if self._judge:
            lone += self._introspect(rnd, cfg)
        if lone:
            self._resettle(rnd, lone, cfg)
        if view.num_pending:
            self._fill(rnd, cfg)
            if cfg.packing and self._waiting_pack:
                self._pack_waiting(rnd, cfg)
            if cfg.time_slicing and self._waiting:
                self._time_slice(rnd, cfg)
        if rnd.requeued:
            self._resume_elsewhere(rnd)
        if rnd.moves_left and self._spread:
            self._consolidate(rnd)
        return rnd.decision(self._next_wake(rnd, cfg))

    # -- indexes ----------------------------------------------------------------------------------------------
    def _bind(self, view: ClusterView) -> None:
        if self._topo is None:
            topo = self._topo = view.topology
            self._gavel = tuple(
                gavel_gpu(n, m, s) for n, m, s in zip(topo.type_names, topo.type_mem_mib, topo.type_speed, strict=True)
            )
            self._node_size = tuple(view.max_node_gpus(t) for t in range(len(topo.type_names)))

    def _forget_running(self, spec: JobSpec, before: Placement | None) -> None:
        """Take a job that ran on ``before`` (``None``: it ran nowhere) out of the running jobs' indexes."""
        job_id = spec.job_id
        if job_id in self._slices.entry:
            self._slices.remove(job_id)
        if before is None:
            return
        topo = self._topo
        assert topo is not None
        t, k = topo.gpu_type[before.gpus[0]], spec.num_gpus
        buckets = self._hosts.get(k)
        if buckets is not None:
            bucket_key = (t, self._ctype(spec.model))
            bucket = buckets.get(bucket_key)
            if bucket is not None and job_id in bucket:
                del bucket[job_id]
                if not bucket:
                    del buckets[bucket_key]
                    if not buckets:
                        del self._hosts[k]
        spread = self._spread.get((t, k))
        if spread is not None and job_id in spread:
            del spread[job_id]
            if not spread:
                del self._spread[(t, k)]

    def _forget_waiting(self, spec: JobSpec) -> None:
        k = spec.num_gpus
        waiting = self._waiting.get(k)
        if waiting is None or spec.job_id not in waiting:
            return
        del waiting[spec.job_id]
        if not waiting:
            del self._waiting[k]
        ctype = self._ctype(spec.model)
        if ctype:
            key = (k, ctype)
            bucket = self._waiting_pack[key]
            del bucket[spec.job_id]
            if not bucket:
                del self._waiting_pack[key]

    def _index_running(self, job: JobView, placement: Placement) -> None:
        spec = job.spec
        job_id = spec.job_id
        k = spec.num_gpus
        start = job.last_start_s if job.last_start_s is not None else 0.0
        self._slices.add(k, (start, job_id))
        topo = self._topo
        assert topo is not None
        t = topo.gpu_type[placement.gpus[0]]
        ctype = self._ctype(spec.model)
        if ctype:
            bucket_key = (t, ctype)
            self._hosts.setdefault(k, {}).setdefault(bucket_key, {})[job_id] = None
        if k > 1 and _nodes(topo, placement.gpus) > -(-k // max(1, self._node_size[t])):
            self._spread.setdefault((t, k), {})[job_id] = None

    def _joined(self, job_id: str, now_s: float) -> None:
        """A packed launch: pair it with the partner planned for it, once both run."""
        partner = self._planned.pop(job_id, None)
        self._partner[job_id] = partner
        if partner is not None and partner in self._partner:
            self._partner[partner] = job_id
            self._lone.pop(partner, None)
            cfg = self.config
            assert isinstance(cfg, GandivaConfig)
            self._judge[job_id] = now_s + cfg.introspect_s
        elif partner is None:
            self._lone[job_id] = None  # packed by someone else's decision: treat its slot as open

    def _unpair(self, job_id: str) -> None:
        if job_id not in self._partner:
            return
        partner = self._partner.pop(job_id)
        self._lone.pop(job_id, None)
        self._judge.pop(job_id, None)
        if partner is not None and self._partner.get(partner) == job_id:
            self._partner[partner] = None
            self._lone[partner] = None
            self._judge.pop(partner, None)

    # -- predictions ------------------------------------------------------------------------------------------
    def _ctype(self, model: str | None) -> str:
        """The Gavel job type standing for ``model`` ("" when corral does not know the model)."""
        got = self._ctypes.get(model)
        if got is None:
            got = self._ctypes[model] = traits(model).colocation_type
        return got

    def _table(self) -> ColocationTable:
        table = self._table_loaded
        if table is None:
            table = self._table_loaded = load_colocation()
        return table

    def _gain(self, type_a: str, type_b: str, gpu_type: int) -> float:
        """Predicted sum of the normalised rates of two Gavel job types packed on a GPU of this type."""
        key = (type_a, type_b, gpu_type)
        got = self._pred.get(key)
        if got is None:
            table = self._table()
            rates = table.rates(type_a, type_b, self._gavel[gpu_type])
            rate_a, rate_b = rates if rates is not None else pair_rates(table, None, None, self._gavel[gpu_type])
            # A pair that does not fit in memory (a 0 in the table) never gains, whatever the other's rate.
            got = self._pred[key] = 0.0 if min(rate_a, rate_b) <= 0 else rate_a + rate_b
        return got

    def _is_bad(self, a: str, b: str) -> bool:
        peers = self._bad.get(a)
        return peers is not None and b in peers

    # -- introspection and packed jobs ------------------------------------------------------------------------
    def _introspect(self, rnd: _Round, cfg: GandivaConfig) -> list[str]:
        """Judge the pairs whose time has come; unpack those whose observed rates show interference. Returns the
        partners left alone."""
        now = rnd.now_s
        alone: list[str] = []
        for job_id in [j for j, at in self._judge.items() if at <= now]:
            del self._judge[job_id]
            partner = self._partner.get(job_id)
            if partner is None or self._partner.get(partner) != job_id:
                continue
            job, other = rnd.view.job(job_id), rnd.view.job(partner)
            mine, theirs = job.observed_rate, other.observed_rate
            if mine is None or theirs is None:
                self._judge[job_id] = now + cfg.introspect_s  # nothing measured yet: look again later
                continue
            if mine + theirs >= 1.0 + cfg.unpack_threshold:
                continue
            self._bad.setdefault(job_id, set()).add(partner)
            self._bad.setdefault(partner, set()).add(job_id)
            rnd.suspend(job, f"gandiva: unpack from {partner} (observed {mine:.2f} + {theirs:.2f})")
            self.counts["unpack"] += 1
            alone.append(partner)
        return alone

    def _resettle(self, rnd: _Round, lone: list[str], cfg: GandivaConfig) -> None:
        """Each packed job whose partner left: a new partner from the queue, or back to a whole share."""
        view, planner = rnd.view, rnd.shares
        for job_id in lone:
            if job_id in rnd.busy:
                continue
            job = view.job(job_id)
            placement = job.placement
            if job.phase is not JobPhase.RUNNING or placement is None or placement.gpu_milli >= FULL_GPU_MILLI:
                continue
            rnd.busy.add(job_id)
            if cfg.packing and self._partner_from_queue(rnd, job, placement, cfg):
                continue
            planner.release(job)
            if not planner.can_take(job.spec, placement.gpus, FULL_GPU_MILLI):
                # A whole share would take the tenant over its quota (the packed job held half): stay at half.
                planner.take_share(job.spec, placement.gpus, placement.gpu_milli)
                continue
            whole = planner.take_share(job.spec, placement.gpus, FULL_GPU_MILLI)
            rnd.preempt(job, "gandiva: alone again, back to a whole share", suspend=True, release=False)
            rnd.start(job, whole, waiting=False)
            self.counts["reseat"] += 1

    def _partner_from_queue(self, rnd: _Round, host: JobView, placement: Placement, cfg: GandivaConfig) -> bool:
        """Give the open half of ``host``'s GPUs to the waiting job predicted to gain most with it."""
        host_type = self._ctype(host.spec.model)
        if not host_type:
            return False
        topo = rnd.shares.topo
        t = topo.gpu_type[placement.gpus[0]]
        k = host.spec.num_gpus
        host_id = host.spec.job_id
        ranked = sorted(
            (
                (gain, wtype)
                for (size, wtype) in self._waiting_pack
                if size == k and (gain := self._gain(wtype, host_type, t)) >= 1.0 + cfg.pack_threshold
            ),
            reverse=True,
        )
        slot = FULL_GPU_MILLI - placement.gpu_milli
        for _gain, wtype in ranked:
            for looked, wid in enumerate(self._waiting_pack[(k, wtype)]):
                if looked >= _SCAN:
                    break
                if wid in rnd.busy or self._is_bad(wid, host_id):
                    continue
                job = rnd.view.job(wid)
                if _pinned_elsewhere(job, placement.gpus) or not rnd.shares.can_take(job.spec, placement.gpus, slot):
                    continue
                rnd.start(job, rnd.shares.take_share(job.spec, placement.gpus, slot), waiting=True)
                self._planned[wid] = host_id
                rnd.packed = True
                self.counts["pack"] += 1
                return True
        return False

    # -- reactive placement -----------------------------------------------------------------------------------
    def _fill(self, rnd: _Round, cfg: GandivaConfig) -> None:
        """Launch waiting jobs on free GPUs in queue order (see the module docstring: backfilling, reservation,
        resuming in place, defragmentation)."""
        view, planner = rnd.view, rnd.shares
        backfill = True
        if cfg.reserve_after_s is not None:
            head = next(iter(view.pending()), None)
            backfill = head is None or rnd.now_s - head.queued_since_s < cfg.reserve_after_s
        rnd.backfill = backfill
        walk = PendingWalk(view)
        for shape, job in walk:
            spec = job.spec
            if spec.job_id in rnd.busy:
                continue
            types = rnd.types(spec)
            if planner.total_free() == 0 and (shape.whole or not planner.has_partial()):
                rnd.wait(spec.job_id, blocked_reason(planner, spec, types, PlacementStrategy.CONSOLIDATED))
                if not backfill or not planner.has_partial():
                    break
                walk.block(shape)
                continue
            if not planner.quota_allows(spec):
                rnd.wait(spec.job_id, quota_reason(planner, spec))
                walk.block(shape, quota=True)
                if not backfill:
                    break
                continue
            placement = None
            held = job.suspended_from
            if held is not None and planner.can_take(spec, held.gpus, spec.gpu_milli):
                placement = planner.take_share(spec, held.gpus, spec.gpu_milli)
            elif held is not None and not job.movable:
                # Its state cannot leave those GPUs (live: a run that does not checkpoint): it waits for them.
                rnd.wait(spec.job_id, "waiting for the GPUs it was suspended from (its run does not checkpoint)")
                if not backfill:
                    break
                continue
            if placement is None and rnd.moves_left and shape.whole and spec.num_gpus > 1:
                placement = self._defragment(rnd, spec, types)
            if placement is None:
                placement = rnd.place(spec, PlacementStrategy.CONSOLIDATED, types)
            if placement is not None:
                rnd.start(job, placement, waiting=True)
                continue
            rnd.wait(spec.job_id, fit_reason(planner, spec, types, PlacementStrategy.CONSOLIDATED))
            walk.block(shape)
            if not backfill:
                break

    # -- migration --------------------------------------------------------------------------------------------
    def _resume_elsewhere(self, rnd: _Round) -> None:
        """Each job this round suspends back to the queue (a time slice that gives its GPUs to a job needing their
        type, an unpacking) that can run on GPUs the round leaves idle is resumed there at once, in the same
        decision: a migration (§3.2; the executor charges a restore elsewhere, a resume on the same node), as
        reactive placement (§4.1) would place it next round, rather than waiting beside them for its own GPUs. One
        that is not movable (its state cannot leave its GPUs) stays suspended; none moves while a job that waited
        ``reserve_after_s`` holds what is free. Placed in the order they were suspended."""
        if not rnd.backfill:
            return
        for job in rnd.requeued:
            if not job.movable:
                continue
            spec = job.spec
            if rnd.fits(spec) is not None:
                continue
            placement = rnd.place(spec, PlacementStrategy.CONSOLIDATED)
            if placement is None:
                continue
            rnd.start(job, placement, waiting=False)
            rnd.queued[spec.num_gpus] -= 1
            self.counts["migrate"] += 1

    def _defragment(self, rnd: _Round, spec: JobSpec, types: tuple[int, ...]) -> Placement | None:
        """One node for a waiting gang that fits in a node, by moving single-GPU jobs off the node with the most
        free GPUs to free GPUs elsewhere; ``None`` if no node needs it or none can be freed cheaply."""
        view, planner = rnd.view, rnd.shares
        topo = planner.topo
        k = spec.num_gpus
        for t in types:
            size = view.max_node_gpus(t)
            if k > size or planner.type_free(t) < k:
                continue
            if any(next(iter(planner.nodes_with_free(t, c)), None) is not None for c in range(k, size + 1)):
                return None  # a consolidated placement exists without moving anyone
            checked = 0
            for free in range(k - 1, -1, -1):
                need = k - free
                if need > rnd.moves_left or planner.type_free(t) - free < need:
                    break  # fewer free GPUs on the node means more movers: no later bucket can do better
                for node in list(planner.nodes_with_free(t, free)):
                    if checked >= _DEFRAG_NODES:
                        break
                    checked += 1
                    if topo.node_num_gpus[node] < k:
                        continue
                    movers = self._movers(rnd, node, need)
                    if movers is None:
                        continue
                    for mover in movers:
                        planner.release(mover)
                    placement = planner.take(spec, planner.node_free_gpus(node)[:k])
                    reason = f"gandiva: defragment node {topo.node_names[node]} for {spec.job_id}"
                    for mover in movers:
                        moved = rnd.place(mover.spec, PlacementStrategy.CONSOLIDATED, (t,))
                        assert moved is not None  # enough free GPUs of type t off this node (checked above)
                        rnd.preempt(mover, reason, release=False)
                        rnd.start(mover, moved, waiting=False)
                    rnd.moves_left -= need
                    self.counts["migrate"] += need
                    return placement
        return None

    def _movers(self, rnd: _Round, node: int, need: int) -> list[JobView] | None:
        """``need`` single-GPU jobs on ``node`` that can be moved (whole share, not acted on this round)."""
        view, planner = rnd.view, rnd.shares
        out: list[JobView] = []
        for g in planner.topo.node_gpus(node):
            if planner.gpu_free_milli(g) != 0:
                continue
            holders = view.gpu_jobs(g)
            if len(holders) != 1:
                continue
            (holder,) = holders
            if holder in rnd.busy:
                continue
            job = view.job(holder)
            if job.spec.num_gpus != 1 or job.placement is None or job.placement.gpu_milli != FULL_GPU_MILLI:
                continue
            if not job.movable:  # a move would restart it from the beginning
                continue
            out.append(job)
            if len(out) == need:
                return out
        return None

    def _consolidate(self, rnd: _Round) -> None:
        """Locality: move spread jobs onto fewer nodes where some now have room."""
        view, planner = rnd.view, rnd.shares
        topo = planner.topo
        for (t, k), jobs in list(self._spread.items()):
            if not rnd.moves_left:
                return
            size = view.max_node_gpus(t)
            least = min(k, size)
            if not any(next(iter(planner.nodes_with_free(t, c)), None) is not None for c in range(least, size + 1)):
                continue
            for job_id in list(jobs):
                if not rnd.moves_left:
                    return
                if job_id in rnd.busy:
                    continue
                job = view.job(job_id)
                if not job.movable:  # a move would restart it from the beginning
                    continue
                old = job.placement
                assert old is not None
                planner.release(job)
                new = rnd.place(job.spec, PlacementStrategy.CONSOLIDATED, (t,))
                if new is not None and _nodes(topo, new.gpus) < _nodes(topo, old.gpus):
                    rnd.preempt(job, "gandiva: consolidate for locality", release=False)
                    rnd.start(job, new, waiting=False)
                    rnd.moves_left -= 1
                    self.counts["migrate"] += 1
                    continue
                if new is not None:
                    planner.untake(job.spec, new)
                planner.take_share(job.spec, old.gpus, old.gpu_milli)
                break  # the best placement for this size is no better: the others of this size would not move

    # -- introspective mode: packing and time-slicing ---------------------------------------------------------
    def _pack_waiting(self, rnd: _Round, cfg: GandivaConfig) -> None:
        """Pack waiting jobs beside running jobs of their size where the pair is predicted to gain most."""
        view = rnd.view
        cursors: dict[tuple[int, tuple[int, str]], _Cursor] = {}
        for (k, wtype), waiting in self._waiting_pack.items():
            buckets = self._hosts.get(k)
            if not buckets:
                continue
            ranked = sorted(
                (
                    (gain, key)
                    for key in buckets
                    if (gain := self._gain(wtype, key[1], key[0])) >= 1.0 + cfg.pack_threshold
                ),
                reverse=True,
            )
            misses = 0
            for wid in waiting:
                if not ranked or misses >= _SCAN:
                    break
                if wid in rnd.busy:
                    continue
                job = view.job(wid)
                if job.suspended_from is not None and not job.movable:
                    continue  # it resumes only where it was suspended (_fill, _time_slice)
                types = rnd.types(job.spec)
                host = None
                for _gain, key in ranked:
                    if key[0] not in types:
                        continue
                    cursor = cursors.get((k, key))
                    if cursor is None:
                        cursor = cursors[(k, key)] = _Cursor(buckets[key])
                    host = self._take_host(rnd, cursor, job)
                    if host is not None:
                        break
                if host is None:
                    misses += 1
                    continue
                self._pack(rnd, host, job)

    def _take_host(self, rnd: _Round, cursor: _Cursor, job: JobView) -> JobView | None:
        view, planner = rnd.view, rnd.shares
        wid = job.spec.job_id
        for looked, host_id in enumerate(cursor.candidates()):
            if looked >= _SCAN:
                return None
            if host_id in rnd.busy:
                continue
            if self._is_bad(wid, host_id):
                cursor.skip(host_id)
                continue
            host = view.job(host_id)
            placement = host.placement
            assert placement is not None
            # Would the waiting job fit in half of the host's GPUs (type, memory beside the host's, quota)?
            planner.release(host)
            ok = planner.can_take(host.spec, placement.gpus, PACK_SHARE)
            if ok:
                half = planner.take_share(host.spec, placement.gpus, PACK_SHARE)
                ok = planner.can_take(job.spec, placement.gpus, PACK_SHARE)
                planner.untake(host.spec, half)
            planner.take_share(host.spec, placement.gpus, placement.gpu_milli)
            if not ok:
                cursor.skip(host_id)
                continue
            cursor.took(host_id)
            return host
        return None

    def _pack(self, rnd: _Round, host: JobView, job: JobView) -> None:
        planner = rnd.shares
        host_id, wid = host.spec.job_id, job.spec.job_id
        placement = host.placement
        assert placement is not None
        rnd.preempt(host, f"gandiva: pack {wid} beside it", suspend=True)
        rnd.start(host, planner.take_share(host.spec, placement.gpus, PACK_SHARE), waiting=False)
        rnd.start(job, planner.take_share(job.spec, placement.gpus, PACK_SHARE), waiting=True)
        self._planned[host_id] = wid
        self._planned[wid] = host_id
        rnd.packed = True
        self.counts["pack"] += 1

    def _time_slice(self, rnd: _Round, cfg: GandivaConfig) -> None:
        """Round-robin among jobs of one size: each running job that has had its quantum gives its GPUs to the
        job of its size that has waited longest (preferring, for a suspended job, the GPUs it left)."""
        view, planner = rnd.view, rnd.shares
        cutoff = rnd.now_s - cfg.quantum_s
        for k, waiting in self._waiting.items():
            slices = self._slices.groups.get(k)
            if not slices or slices[0][0] > cutoff:
                continue
            due = _Due(slices, bisect_right_entry(slices, (cutoff, _MAX_ID)))
            misses = 0
            for wid in waiting:
                if misses >= _SCAN or due.empty():
                    break
                if wid in rnd.busy:
                    continue
                job = view.job(wid)
                victim = self._home_victim(rnd, job, cutoff)
                if victim is None and (job.movable or job.suspended_from is None):
                    victim = self._due_victim(rnd, job, due)
                if victim is None:
                    misses += 1
                    continue
                placement = victim.placement
                assert placement is not None
                rnd.suspend(victim, f"gandiva: time slice, {wid} waits")
                rnd.start(job, planner.take_share(job.spec, placement.gpus, FULL_GPU_MILLI), waiting=True)
                self.counts["suspend"] += 1

    def _home_victim(self, rnd: _Round, job: JobView, cutoff: float) -> JobView | None:
        """The due job of the same size now on exactly the GPUs ``job`` was suspended from, if any."""
        held = job.suspended_from
        if held is None:
            return None
        holders = rnd.view.gpu_jobs(held.gpus[0])
        if len(holders) != 1:
            return None
        (holder,) = holders
        entry = self._slices.entry.get(holder)
        if holder in rnd.busy or entry is None or entry[0] != job.spec.num_gpus or entry[1][0] > cutoff:
            return None
        victim = rnd.view.job(holder)
        placement = victim.placement
        assert placement is not None
        if placement.gpus != held.gpus or not self._swappable(rnd, victim, job):
            return None
        return victim

    def _due_victim(self, rnd: _Round, job: JobView, due: _Due) -> JobView | None:
        """The running job of ``job``'s size whose slice started first and whose GPUs ``job`` can take."""
        for looked, victim_id in enumerate(due.candidates()):
            if looked >= _SCAN:
                break
            if victim_id in rnd.busy:
                due.drop(victim_id)
                continue
            victim = rnd.view.job(victim_id)
            if self._swappable(rnd, victim, job):
                due.drop(victim_id)
                return victim
        return None

    def _swappable(self, rnd: _Round, victim: JobView, job: JobView) -> bool:
        """Could ``job`` take ``victim``'s GPUs, whole (type, memory, quota)?"""
        placement = victim.placement
        assert placement is not None
        planner = rnd.shares
        planner.release(victim)
        ok = planner.can_take(job.spec, placement.gpus, FULL_GPU_MILLI)
        planner.take_share(victim.spec, placement.gpus, placement.gpu_milli)
        return ok

    # -- wake-ups ---------------------------------------------------------------------------------------------
    def _next_wake(self, rnd: _Round, cfg: GandivaConfig) -> float | None:
        now = rnd.now_s
        wake: float | None = None

        def sooner(at: float) -> None:
            nonlocal wake
            if at > now and (wake is None or at < wake):
                wake = at

        if rnd.packed:
            sooner(now + cfg.introspect_s)
        for at in self._judge.values():
            sooner(at)
        if cfg.time_slicing and (self._waiting or rnd.queued):
            # A size whose waiting jobs were not all launched: the next slice of that size to end.
            cutoff = now - cfg.quantum_s
            for k in self._waiting.keys() | rnd.queued.keys():
                if len(self._waiting.get(k, ())) + rnd.queued.get(k, 0) <= rnd.taken.get(k, 0):
                    continue
                if k in rnd.fresh:
                    sooner(_slice_due(now, cfg.quantum_s))
                slices = self._slices.groups.get(k)
                if slices:
                    i = bisect_right_entry(slices, (cutoff, _MAX_ID))
                    if i < len(slices):
                        sooner(_slice_due(slices[i][0], cfg.quantum_s))
        return wake


def _slice_due(start: float, quantum: float) -> float:
    """When a slice that started at ``start`` is due, as :meth:`GandivaPolicy._time_slice` tests it
    (``start <= now - quantum``): ``start + quantum``, or the next float up where rounding makes
    ``(start + quantum) - quantum`` fall below ``start`` (near 2^23 s with a 60 s quantum). Waking at a time that
    test finds not due would set no later wake, and the slice would stall."""
    due = start + quantum
    while due - quantum < start:
        due = math.nextafter(due, math.inf)
    return due


def _pinned_elsewhere(job: JobView, gpus: tuple[int, ...]) -> bool:
    """Is ``job`` suspended on other GPUs than ``gpus`` with state that cannot move (see ``JobView.movable``)?"""
    held = job.suspended_from
    return held is not None and not job.movable and held.gpus != tuple(gpus)


def _nodes(topo: Topology, gpus: tuple[int, ...] | list[int]) -> int:
    node = topo.gpu_node
    return len({node[g] for g in gpus})
