"""IADeep (Chen et al., SC'23): interference-aware placement of co-located DL jobs, and their batch sizes tuned.

"Interference-Aware Multiplexing for Deep Learning in GPU Clusters: A Middleware Approach" multiplexes training
tasks on GPUs (several tasks running at once on a device, as under MPS) and co-optimises two things the paper
shows are coupled: which tasks share a device (its cluster scheduler) and how each co-located task is configured
(its per-device tuner, chiefly the batch size). ``docs/policies/iadeep.md`` says what differs from the paper. The
rules (section names are the paper's parts; corral's rendering of each is documented where it is coded):

- **Online interference prediction** (scheduler): the slowdown a job would suffer beside the jobs on a GPU, and
  cause them, is predicted from the jobs' features by a model learned online from the co-locations the policy
  observes, warm-started from Gavel's measured pairs (:mod:`corral.policies.iadeep.interference`). Observations
  come from telemetry (``JobView.telemetry``: step time over solo step time) and the executor's observed rates.
- **Placement** (scheduler): jobs are taken first come, first served (later ones may start when an earlier one
  cannot: backfilling). A single-GPU job goes to an idle GPU when one of its types is free (no interference: the
  least degradation there is), consolidated (the fullest node first). Otherwise it is a candidate for
  co-location: every GPU shared by fewer than ``max_colocate`` such jobs, and nothing else, is scored by the
  *total degradation* it would have with the job added (:func:`corral.policies.iadeep.tuner.degradation`, summed over
  the GPU's jobs at the best configuration the tuner's prior predicts within the GPU's memory), and the job goes
  where that total grows least. **Co-locating against waiting**: it goes there only if the GPU's jobs together
  are predicted to progress at least ``min_gain`` faster than before it joined (their rates relative to running
  alone, summed: co-location must beat running the jobs one after the other, as running in turn gives 1);
  otherwise it waits for a better slot or an idle GPU. Multi-GPU gangs and fractional (openb) jobs are placed
  whole or at their share, consolidated, never co-located.
- **Batch-size tuning** (tuner): the batch sizes of a GPU's co-located jobs are searched with GP-LCB, the
  objective their total degradation (interference x throughput drop / statistical efficiency), each measurement
  a tuning step of ``tune_interval_s``, within the GPU's memory as predicted by a polynomial of each job's batch
  size fitted to what it reported (:mod:`corral.policies.iadeep.tuner`). The first configuration, applied with the
  placement, is the prior's best; after ``tune_steps`` measurements the GPU keeps the best one measured. A job
  left alone on its GPU goes back to its own batch size.
- **Memory** (both): every co-locatable job holds a memory reservation on its GPU (``Placement.mem_mib``): its
  predicted need at its batch size plus ``mem_margin_mib``, right-sized when it reports (and grown when its need
  grows, within what the GPU has); the engine's state then refuses any over-commitment. A GPU whose jobs' needs
  no longer fit at any configuration sends its newest job back to the queue (suspended).
- **Work-conserving round end** (corral): a job a round sends back to the queue takes an idle GPU of its types in
  the same round if one is free, as Placement gives a waiting job one (the round's walk of the queue ran while it
  was still running), instead of waiting beside it for the next round.

Mechanism, in corral's terms: co-located jobs are *packed* (``Launch`` at a share of ``1000 // max_colocate``),
which the simulator runs at Gavel's measured pair rates at their batch sizes; a job alone holds its whole GPU, so
the first job on a GPU is re-seated at the packed share (a suspend and a resume in place, as Gandiva's packing
does) when a second joins, and at the whole share again when it is left alone. ``aware=false`` co-locates
without predictions (the first GPU with room, whenever no GPU is idle: the "MPS-style" comparison point),
``tune=false`` keeps the batch sizes.

Nodes lost and back (``on_nodes_changed``): the jobs of a lost node come back to the queue through
``on_job_changed`` (their GPUs' co-location groups and tuners go with them); a node that changed marks its GPUs for
re-filing and invalidates the memo of job kinds that could not be placed, since the free capacity changed.

A round is a :class:`~corral.policies.framework.round.Round` on IADeep's planner (packed shares, reservations of
its own sizes), with the reservations and batch sizes it plans for running jobs: it takes in telemetry
(reservations right-sized, interference observed), runs the tuners that are due, walks the queue, places what it
sent back, gives lone jobs their whole GPU back and shrinks reservations, then ends in its decision.

Cost: the policy keeps its own indexes, updated in :meth:`IADeepPolicy.on_job_changed` (which is told where a job
ran before the change, so no copy of every job's GPUs is kept): pending jobs grouped by kind in a
:class:`~corral.policies.framework.queues.KeyedQueue` (single-GPU jobs by model, batch size, GPU types, memory and
quota tenant; others by shape: a kind that cannot be placed this round is skipped wholesale), the co-locatable jobs
on each GPU, and per GPU type the GPUs open to co-location. Candidate GPUs are scored once per kind of job and kind
of GPU (its jobs' models and batch sizes, its free memory) in a round, and at most ``scan_gpus`` are examined per
job.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from mypy_extensions import mypyc_attr

from corral.core.cluster import Topology
from corral.core.decisions import Decision, Launch, SetBatchSize
from corral.core.errors import ConfigError
from corral.core.job import FULL_GPU_MILLI, JobClass, JobPhase, JobSpec, JobView, mem_given
from corral.core.options import option
from corral.core.placement import Placement
from corral.policies.framework.contract import BasePolicy, PolicyConfig
from corral.policies.framework.placement import PlacementStrategy, find_whole
from corral.policies.framework.planner import Planner
from corral.policies.framework.queues import KeyedQueue
from corral.policies.framework.reasons import fit_reason, quota_reason
from corral.policies.framework.round import Round
from corral.policies.framework.view import ClusterView
from corral.policies.iadeep.interference import InterferencePredictor, JobFeatures, gavel_features, job_features
from corral.policies.iadeep.tuner import Config as Sizes
from corral.policies.iadeep.tuner import GroupTuner, MemoryCurve, TunerConfig, config_grid, degradation
from corral.workloads.batching import BatchCurve, batch_curve, goodput_ratio, type_at_batch
from corral.workloads.colocation import ColocationTable, gavel_gpu, load_colocation
from corral.workloads.models import batch_mem_factor, statistical_efficiency, traits

_Entry = tuple[float, int, str]  # (submission time, arrival number, job): first come, first served
_PLACE_CONFIGS = 64  # configurations the placement search scores per candidate GPU
_MEM_STEP_MIB = 64  # reservations are whole multiples of this, plus the margin
_MEASURE_AFTER_S = 1.0  # a round this long after jobs start or change batch size, to take in what they report
_SCORE_CACHE = 200_000  # most predicted scores (and co-location evaluations) remembered before starting over


@dataclass(frozen=True, slots=True)
class IADeepConfig(PolicyConfig):
    aware: bool = option(
        True, "interference-aware placement (false: co-locate on the first GPU with room, MPS-style, to compare)"
    )
    tune: bool = option(True, "tune co-located jobs' batch sizes with GP-LCB (false: keep them)")
    max_colocate: int = option(2, "most jobs sharing one GPU")
    min_gain: float = option(
        0.0, "co-locate only if the GPU's jobs are predicted to progress at least this much faster together (else wait)"
    )
    evict_below: float = option(
        0.9, "a GPU whose jobs, once tuned, measure a total progress below this sends its newest job back to the queue"
    )
    mem_margin_mib: int = option(512, "GPU memory (MiB) reserved above each co-locatable job's predicted need")
    tune_interval_s: float = option(60.0, "seconds each configuration runs before the tuner measures it")
    tune_steps: int = option(6, "configurations measured on a GPU before the tuner settles on the best")
    lcb_scale: float = option(0.2, "GP-LCB: multiplies the exploration weight beta_t (Srinivas et al.)")
    lcb_delta: float = option(0.1, "GP-LCB: confidence 1 - delta of beta_t")
    learn_weight: float = option(4.0, "weight of an observed co-location against one of Gavel's measured pairs")
    scan_gpus: int = option(256, "co-location candidate GPUs examined per job")

    def __post_init__(self) -> None:
        if not 2 <= self.max_colocate <= 10:
            raise ConfigError(f"iadeep: max_colocate must be in 2..10, got {self.max_colocate}")
        if not math.isfinite(self.min_gain):
            raise ConfigError(f"iadeep: min_gain must be a finite number, got {self.min_gain}")
        if not 0 <= self.evict_below < math.inf:
            raise ConfigError(f"iadeep: evict_below must be >= 0 and finite, got {self.evict_below}")
        if self.mem_margin_mib < 0:
            raise ConfigError(f"iadeep: mem_margin_mib must be >= 0, got {self.mem_margin_mib}")
        if not 0 < self.tune_interval_s < math.inf:
            raise ConfigError(f"iadeep: tune_interval_s must be > 0 and finite, got {self.tune_interval_s}")
        if self.scan_gpus < 1:
            raise ConfigError(f"iadeep: scan_gpus must be >= 1, got {self.scan_gpus}")
        if not self.learn_weight > 0:
            raise ConfigError(f"iadeep: learn_weight must be > 0, got {self.learn_weight}")
        self.tuner_config()  # its own checks, with its own messages

    def tuner_config(self) -> TunerConfig:
        try:
            return TunerConfig(steps=self.tune_steps, delta=self.lcb_delta, scale=self.lcb_scale)
        except ConfigError as err:
            raise ConfigError(f"iadeep: {str(err).removeprefix('tuner: ')}") from None

    @property
    def slot_milli(self) -> int:
        return FULL_GPU_MILLI // self.max_colocate


def colocatable(spec: JobSpec) -> bool:
    """Jobs IADeep co-locates and tunes: single-GPU jobs that ask for a whole GPU."""
    return spec.num_gpus == 1 and spec.gpu_milli == FULL_GPU_MILLI


class _Planner(Planner):
    """The round's planner, with packed shares and memory reservations of IADeep's own choosing."""

    __slots__ = ()

    def take_as(self, spec: JobSpec, gpu: int, milli: int, mem_mib: int) -> Placement:
        self._set(gpu, self.gpu_free_milli(gpu) - milli, self.gpu_free_mem_mib(gpu) - mem_mib)
        if spec.job_class is JobClass.GUARANTEED:
            self._tenant[spec.tenant] = self.tenant_guaranteed_milli(spec.tenant) + milli
        return Placement((gpu,), milli, mem_mib)

    def quota_allows_milli(self, spec: JobSpec, milli: int) -> bool:
        if spec.job_class is not JobClass.GUARANTEED:
            return True
        tenant = self.view.tenants.get(spec.tenant)
        if tenant is None or tenant.quota_gpus is None:
            return True
        return self.tenant_guaranteed_milli(spec.tenant) + milli <= tenant.quota_gpus * FULL_GPU_MILLI


class _JobModel:
    """What the policy knows of one co-locatable job: its model, batch curves, memory curve and solo steps."""

    __slots__ = ("curves", "mem", "model", "ref", "solo")

    def __init__(self, spec: JobSpec) -> None:
        self.model = traits(spec.model)
        self.ref = self.model.ref_batch
        ref_mib = float(spec.gpu_mem_mib) if spec.gpu_mem_mib else float(self.model.mem_mib)
        self.mem = MemoryCurve(ref_mib, self.model)
        self.curves: dict[str, BatchCurve | None] = {}
        self.solo: dict[int, float] = {}  # batch size -> solo step time reported there

    def curve(self, table: ColocationTable | None, column: str) -> BatchCurve | None:
        if column in self.curves:
            return self.curves[column]
        got = self.curves[column] = batch_curve(table, self.model, column) if table is not None else None
        return got

    def resolve(self, batch: int | None) -> int:
        """The batch size a job with ``batch`` (None: its reference) trains at, as a number (0: unknown)."""
        if batch is not None:
            return batch
        return self.ref or 0


class _Round(Round):
    """One round's plan (the framework's :class:`~corral.policies.framework.round.Round`, on IADeep's planner), with
    what the round changed of the running jobs: their reservations and batch sizes as planned, the GPUs it placed
    on, the jobs it moved or sent back, and memos for the round."""

    __slots__ = ("batch", "evicted", "feats", "moved", "needs", "reserve", "shares", "shrink", "touched")

    def __init__(self, view: ClusterView, now_s: float) -> None:
        shares = _Planner(view)
        super().__init__(view, now_s, shares)
        self.shares = shares  # the round's planner (``planner``), as its own class (see Round's module docstring)
        self.reserve: dict[str, int] = {}  # job -> memory reservation as planned
        self.batch: dict[str, int] = {}  # job -> batch size as planned
        self.touched: set[int] = set()  # GPUs this round placed on or re-seated
        self.moved: set[str] = set()  # running jobs this round preempts (to re-seat or evict)
        self.evicted: list[str] = []  # jobs this round sends back to the queue (suspended), in order
        self.shrink: dict[str, tuple[int, int]] = {}  # job -> (its GPU, the smaller reservation it needs)
        # Memos for the round: features by (model, batch, GPU type); reservations needed by (job, batch).
        self.feats: dict[tuple[str, int, int], JobFeatures] = {}
        self.needs: dict[tuple[str, int], int] = {}

    def reservation(self, job: JobView) -> int:
        got = self.reserve.get(job.spec.job_id)
        if got is not None:
            return got
        assert job.placement is not None
        return mem_given(job.spec, job.placement)


@mypyc_attr(allow_interpreted_subclasses=True)  # a user's policy (and a test's) may extend it
class IADeepPolicy(BasePolicy):
    name = "iadeep"
    summary = "interference-aware co-location and GP-LCB batch-size tuning within GPU memory (IADeep, SC'23)"
    Config = IADeepConfig
    needs_models = True
    needs_telemetry = True

    def __init__(self, config: PolicyConfig | None = None, *, seed: int = 0) -> None:
        super().__init__(config, seed=seed)
        cfg = self.config
        assert isinstance(cfg, IADeepConfig)
        self.cfg = cfg
        self.tuner_cfg = cfg.tuner_config()
        self._topo: Topology | None = None
        self._table: ColocationTable | None = None
        self.predictor: InterferencePredictor | None = None
        self._column: list[str] = []  # GPU type -> Gavel column
        self._quota: set[str] = set()  # tenants with a quota
        self._seq = 0
        self._arrival: dict[str, int] = {}
        self._pending: KeyedQueue[Hashable] = KeyedQueue()  # pending jobs by kind, each kind FIFO (_Entry)
        self._models: dict[str, _JobModel] = {}  # co-locatable jobs not yet terminal
        self._members: dict[int, list[str]] = {}  # GPU -> co-locatable running jobs on it, in arrival order
        self._open: list[dict[int, None]] = []  # GPU type -> GPUs open to co-location
        self._tuners: dict[int, GroupTuner] = {}
        self._batch_s: dict[str, float] = {}  # job -> when this policy last changed its batch size
        self._avoid: dict[str, set[str]] = {}  # job -> the jobs it was measured to share a GPU badly with
        # Memos kept across rounds: goodput by (model, batch, GPU type); predicted scores by (GPU type, the jobs'
        # models and batch sizes), with the predictor's version they were made at; co-location evaluations by
        # (GPU, pending kind), with what they depended on (see _evaluate).
        self._goodputs: dict[tuple[str, int, int], float] = {}
        self._scores: dict[tuple[int, tuple[tuple[str, int], ...]], tuple[int, tuple[float, float]]] = {}
        self._evals: dict[tuple[int, Hashable], tuple[Hashable, tuple[float, float, Sizes] | None]] = {}
        self._gpu_version: dict[int, int] = {}  # GPU -> bumped when its co-located jobs or their needs change
        self._due: dict[int, float] = {}  # GPU -> when its tuner measures next
        self._changed: dict[int, None] = {}  # GPUs whose co-located jobs changed since the last round
        self._noted: dict[str, None] = {}  # jobs that reported telemetry since the last round
        self._epoch = 0  # bumped whenever what is on the GPUs, or what the predictor knows, changes
        self._failed: dict[Hashable, int] = {}  # pending kind -> the epoch at which it last could not be placed
        # Each settled search: (when, the jobs, the configuration kept, its measured score); a diagnostic.
        self.settled: list[tuple[float, tuple[str, ...], Sizes, float]] = []
        self.counts: dict[str, int] = {
            "alone": 0,
            "colocate": 0,
            "wait": 0,
            "reseat": 0,
            "tune_steps": 0,
            "batch_changes": 0,
            "evict": 0,
            "observations": 0,
        }

    # -- hooks ------------------------------------------------------------------------------------------------
    def admit(self, view: ClusterView, spec: JobSpec) -> str | None:
        self._bind(view)
        return super().admit(view, spec)

    def on_telemetry(self, job: JobView, now_s: float) -> None:
        # Only take note (this may run while a decision is being applied): the next round reads it.
        if job.spec.job_id in self._models:
            self._noted[job.spec.job_id] = None

    def on_nodes_changed(self, view: ClusterView, nodes: Sequence[int], now_s: float) -> None:
        # What is free changed without any job changing (a node back): the kinds that could not be placed must be
        # tried again, and the nodes' GPUs re-filed (a lost node's jobs left through on_job_changed already).
        self._epoch += 1
        topo = view.topology
        for n in nodes:
            self._changed.update(dict.fromkeys(topo.node_gpus(n)))

    def on_job_changed(self, job: JobView, before: Placement | None, now_s: float) -> None:
        spec = job.spec
        job_id = spec.job_id
        if job.phase is not JobPhase.PENDING or job.preemptions:
            self._epoch += 1  # the GPUs changed (an arrival changes nothing there)
        if colocatable(spec) and job_id not in self._models and not job.phase.is_terminal:
            self._models[job_id] = _JobModel(spec)
        after = job.placement if job.phase is JobPhase.RUNNING else None
        if colocatable(spec):
            # Where it ran (``before``) and runs: its GPU's co-location group changes when the two differ.
            old = before.gpus[0] if before is not None else None
            new = after.gpus[0] if after is not None else None
            for g in (old, new):
                if g is not None:
                    self._gpu_version[g] = self._gpu_version.get(g, 0) + 1
            if old != new:
                if old is not None:
                    members = self._members[old]
                    members.remove(job_id)
                    if not members:
                        del self._members[old]
                    self._changed[old] = None
                if new is not None:
                    self._members.setdefault(new, []).append(job_id)
                    self._changed[new] = None
            elif new is not None:
                self._changed[new] = None  # its share or batch size changed
        else:
            # Another kind of job coming or going opens or closes its GPUs to co-location.
            if before is not None:
                self._changed.update(dict.fromkeys(before.gpus))
            if after is not None:
                self._changed.update(dict.fromkeys(after.gpus))
        if job.phase is JobPhase.PENDING:
            if job_id not in self._pending:
                self._enqueue(job)
        else:
            self._pending.remove(job_id)
            if job.phase.is_terminal:
                self._arrival.pop(job_id, None)
                self._models.pop(job_id, None)
                self._noted.pop(job_id, None)
                self._batch_s.pop(job_id, None)
                self._avoid.pop(job_id, None)
                if self.predictor is not None:
                    self.predictor.forget(job_id)

    def schedule(self, view: ClusterView, now_s: float) -> Decision:
        self._bind(view)
        if not (self._changed or self._noted or self._pending) and all(t > now_s for t in self._due.values()):
            # No GPU changed, no telemetry to take in, no job waiting, no tuner due: every step below would find
            # nothing to do, and the round would decide nothing but its wake-up. Said without building the round
            # (a replay has about one such round per three jobs: issue 20).
            wake = min(self._due.values(), default=None)
            return Decision.NOTHING if wake is None else Decision((), wake_at_s=wake)
        rnd = _Round(view, now_s)
        for g in self._changed:
            self._refresh(view, g)
        self._absorb(rnd)
        self._tune(rnd)
        if self._pending:
            self._place_waiting(rnd)
        if rnd.evicted:
            self._refill(rnd)
        self._reseat_alone(rnd)
        self._shrink(rnd)
        self._changed.clear()  # what this round did comes back through on_job_changed
        wake = min((t for t in self._due.values() if t > now_s), default=None)
        if any(type(a) is Launch or type(a) is SetBatchSize for a in rnd.actions):
            # Jobs that start, or change batch size, report what they use: take it in soon (reservations are
            # right-sized in a round, and telemetry alone does not call one).
            soon = now_s + _MEASURE_AFTER_S
            wake = soon if wake is None else min(wake, soon)
        return rnd.decision(wake)

    # -- indexes ----------------------------------------------------------------------------------------------
    def _bind(self, view: ClusterView) -> None:
        if self._topo is not None:
            return
        topo = self._topo = view.topology
        try:
            self._table = load_colocation()
        except ConfigError:
            self._table = None  # no Gavel file: predictions start from nothing, batch sizes stay as they are
        self._column = [
            gavel_gpu(name, mem, speed)
            for name, mem, speed in zip(topo.type_names, topo.type_mem_mib, topo.type_speed, strict=True)
        ]
        table = self._table
        self.predictor = InterferencePredictor(
            table, gavel_features(table) if table is not None else (), learn_weight=self.cfg.learn_weight
        )
        self._open = [{} for _ in topo.type_names]
        self._quota = {name for name, t in view.tenants.items() if t.quota_gpus is not None}

    def _kind(self, job: JobView) -> Hashable:
        """The pending group of ``job``: jobs of one kind fit or fail alike in a round (see the module docstring)."""
        spec = job.spec
        quota = spec.tenant if job.job_class is JobClass.GUARANTEED and spec.tenant in self._quota else None
        if colocatable(spec):
            # A job with GPUs to avoid (it was sent back from one) fits or fails on its own.
            alone = spec.job_id if spec.job_id in self._avoid else None
            return ("c", traits(spec.model).name, job.batch_size, spec.gpu_types, spec.gpu_mem_mib, quota, alone)
        whole = spec.gpu_milli == FULL_GPU_MILLI
        size = spec.num_gpus if whole else spec.gpu_milli
        return ("x", whole, size, spec.gpu_types, spec.gpu_mem_mib, quota)

    def _enqueue(self, job: JobView) -> None:
        job_id = job.spec.job_id
        seq = self._arrival.get(job_id)
        if seq is None:
            self._seq += 1
            seq = self._arrival[job_id] = self._seq
        entry: _Entry = (job.spec.submit_s, seq, job_id)
        self._pending.add(self._kind(job), entry)

    def _refresh(self, view: ClusterView, g: int) -> None:
        """Re-file GPU ``g`` in the index of GPUs open to co-location (what is on it is in the view)."""
        topo = self._topo
        assert topo is not None
        members = self._members.get(g, ())
        holders = view.gpu_jobs(g)
        is_open = 0 < len(members) < self.cfg.max_colocate and len(holders) == len(members)
        opened = self._open[topo.gpu_type[g]]
        if is_open:
            opened[g] = None
        else:
            opened.pop(g, None)

    # -- what the policy knows of jobs ------------------------------------------------------------------------
    def _features(self, rnd: _Round, job_id: str, batch: int, gpu_type: int) -> JobFeatures:
        """A job's features at ``batch`` on a GPU of ``gpu_type``: its model's (the catalogue's profile and memory
        at that batch size), so jobs of one model and batch size are alike to the predictor."""
        model = self._models[job_id].model
        key = (model.name, batch, gpu_type)
        got = rnd.feats.get(key)
        if got is None:
            topo = self._topo
            assert topo is not None
            column = self._column[gpu_type]
            b = batch or None
            table = self._table
            job_type = type_at_batch(table, model, column, b) if table is not None else model.colocation_type
            mem = model.mem_mib * batch_mem_factor(model, b)
            got = rnd.feats[key] = job_features(table, model, column, b, mem, topo.type_mem_mib[gpu_type], job_type)
        return got

    def _goodput(self, job_id: str, batch: int, gpu_type: int) -> float:
        m = self._models[job_id]
        key = (m.model.name, batch, gpu_type)
        got = self._goodputs.get(key)
        if got is None:
            curve = m.curve(self._table, self._column[gpu_type])
            got = self._goodputs[key] = goodput_ratio(curve, m.model, batch or None)
        return got

    def _choices(self, job_id: str, current: int, gpu_type: int) -> tuple[int, ...]:
        """The batch sizes a job may be given: its family's measured ones, when tuning (else only its own)."""
        if not self.cfg.tune:
            return (current,)
        curve = self._models[job_id].curve(self._table, self._column[gpu_type])
        if curve is None or not current:
            return (current,)
        return curve.batch_sizes

    def _need(self, rnd: _Round, job_id: str, batch: int) -> int:
        """The memory reservation a job needs at ``batch``: its predicted need plus the margin (MiB)."""
        key = (job_id, batch)
        got = rnd.needs.get(key)
        if got is None:
            m = self._models[job_id]
            # Rounded up to 64 MiB (less a hair of float noise), so that refits moving a prediction by a MiB do not
            # re-size reservations back and forth.
            pred = m.mem.predict(batch or None)
            got = rnd.needs[key] = _MEM_STEP_MIB * math.ceil(pred / _MEM_STEP_MIB - 1e-9) + self.cfg.mem_margin_mib
        return got

    def _batch_of(self, rnd: _Round, job: JobView) -> int:
        job_id = job.spec.job_id
        got = rnd.batch.get(job_id)
        return got if got is not None else self._models[job_id].resolve(job.batch_size)

    def _score(self, rnd: _Round, ids: tuple[str, ...], config: Sizes, gpu_type: int) -> tuple[float, float]:
        """Predicted (total degradation, total progress) of jobs ``ids`` at ``config`` together on one GPU."""
        predictor = self.predictor
        assert predictor is not None and self._topo is not None
        name = self._topo.type_names[gpu_type]
        column = self._column[gpu_type]
        key = (gpu_type, tuple(sorted((self._models[j].model.name, b) for j, b in zip(ids, config, strict=True))))
        version = predictor.version(name, column)
        cached = self._scores.get(key)
        if cached is not None and cached[0] == version:
            return cached[1]
        feats = [self._features(rnd, j, b, gpu_type) for j, b in zip(ids, config, strict=True)]
        total_d = total_p = 0.0
        for i, j in enumerate(ids):
            partners = feats[:i] + feats[i + 1 :]
            rate = predictor.rate(feats[i], partners, name, column) if partners else 1.0
            goodput = self._goodput(j, config[i], gpu_type)
            total_d += degradation(rate, goodput)
            total_p += rate * goodput
        if len(self._scores) > _SCORE_CACHE:
            self._scores.clear()
        got = (total_d, total_p)
        self._scores[key] = (version, got)
        return got

    def _measured(self, rnd: _Round, ids: tuple[str, ...], config: Sizes, gpu_type: int) -> tuple[float, float] | None:
        """(total degradation, total progress) the jobs' telemetry shows at ``config``, or None while a job has not
        reported since its batch size last changed (a job whose speed did not change need not report again).
        Interference from the jobs' step times over their solo step times; throughput from their solo step times at
        this batch size and at the reference, when both were reported (else the batch curve)."""
        view = rnd.view
        total_d = total_p = 0.0
        for j, b in zip(ids, config, strict=True):
            job = view.job(j)
            tel = job.telemetry
            if tel is None or tel.time_s < self._batch_s.get(j, -math.inf):
                return None
            rate = tel.solo_step_time_s / tel.step_time_s if tel.solo_step_time_s else job.observed_rate
            if rate is None:
                return None
            m = self._models[j]
            ref = m.ref
            if b and ref and b in m.solo and ref in m.solo:
                goodput = (b / m.solo[b]) / (ref / m.solo[ref]) * statistical_efficiency(m.model, b)
            else:
                goodput = self._goodput(j, b, gpu_type)
            total_d += degradation(rate, goodput)
            total_p += rate * goodput
        return total_d, total_p

    def _capacity(self, rnd: _Round, g: int, ids: tuple[str, ...]) -> int:
        """GPU memory ``g`` has for jobs ``ids`` (running there): what is free plus what they hold, as planned."""
        view = rnd.view
        return rnd.shares.gpu_free_mem_mib(g) + sum(rnd.reservation(view.job(j)) for j in ids)

    def _fits(self, rnd: _Round, ids: tuple[str, ...], config: Sizes, capacity: int) -> bool:
        return sum(self._need(rnd, j, b) for j, b in zip(ids, config, strict=True)) <= capacity

    # -- telemetry: memory, solo steps, interference observations ------------------------------------------------
    def _absorb(self, rnd: _Round) -> None:
        view = rnd.view
        predictor = self.predictor
        topo = self._topo
        assert predictor is not None and topo is not None
        repair: dict[int, None] = {}
        for job_id in self._noted:
            job = view.job(job_id)
            if job.phase is not JobPhase.RUNNING:
                continue
            assert job.placement is not None
            g = job.placement.gpus[0]
            tel = job.telemetry
            if tel is None:
                continue
            m = self._models[job_id]
            b = m.resolve(job.batch_size)
            if m.mem.observe(b or None, tel.mem_need_mib):
                self._gpu_version[g] = self._gpu_version.get(g, 0) + 1  # its needs changed
            if tel.solo_step_time_s is not None and b:
                m.solo[b] = tel.solo_step_time_s
            t = topo.gpu_type[g]
            partners = [p for p in self._members.get(g, ()) if p != job_id]
            rate = tel.solo_step_time_s / tel.step_time_s if tel.solo_step_time_s else job.observed_rate
            if partners and rate is not None:
                batches = [self._models[p].resolve(view.job(p).batch_size) for p in partners]
                seen = (tuple(zip(partners, batches, strict=True)), b)
                feats = [self._features(rnd, p, pb, t) for p, pb in zip(partners, batches, strict=True)]
                if predictor.observe(
                    self._features(rnd, job_id, b, t),
                    feats,
                    topo.type_names[t],
                    self._column[t],
                    rate,
                    seen=(job_id, seen),
                ):
                    self.counts["observations"] += 1
                    self._epoch += 1
            # Right-size the reservation to the need now reported (hysteresis: one margin), within the GPU.
            target = self._need(rnd, job_id, b)
            held = rnd.reservation(job)
            if target > held:
                room = rnd.shares.gpu_free_mem_mib(g)
                if room >= target - held:
                    self._resize(rnd, job, g, target)
                elif len(self._members.get(g, ())) > 1:
                    repair[g] = None
                elif room > 0:
                    self._resize(rnd, job, g, held + room)
            elif held - target > self.cfg.mem_margin_mib:
                rnd.shrink[job_id] = (g, target)  # at the end of the round, unless a change sets it meanwhile
        self._noted.clear()
        for g in repair:
            self._repair(rnd, g)

    def _shrink(self, rnd: _Round) -> None:
        """Reservations larger than reported needs (by more than the margin) come down to them, for the jobs this
        round did not otherwise re-size or move."""
        for job_id, (g, target) in rnd.shrink.items():
            if job_id not in rnd.reserve and job_id not in rnd.moved:
                self._resize(rnd, rnd.view.job(job_id), g, target)

    def _resize(self, rnd: _Round, job: JobView, g: int, mem_mib: int) -> None:
        held = rnd.reservation(job)
        if mem_mib == held:
            return
        rnd.resize(job.spec.job_id, mem_mib=mem_mib, reason="iadeep: memory reservation")
        rnd.shares.add_memory(g, held - mem_mib)
        rnd.reserve[job.spec.job_id] = mem_mib

    def _repair(self, rnd: _Round, g: int) -> None:
        """The jobs on ``g`` need more memory than it has at their configuration: the best feasible configuration,
        else the newest job back to the queue."""
        view = rnd.view
        topo = self._topo
        assert topo is not None
        ids = tuple(self._members.get(g, ()))
        if len(ids) < 2:
            return
        t = topo.gpu_type[g]
        current = tuple(self._batch_of(rnd, view.job(j)) for j in ids)
        capacity = self._capacity(rnd, g, ids)
        tuner = self._tuners.get(g)
        choice: Sizes | None
        if tuner is not None and set(tuner.members) == set(ids) and tuner.members == ids:
            choice = tuner.best(lambda c: self._score(rnd, ids, c, t)[0], lambda c: self._fits(rnd, ids, c, capacity))
        else:
            grid = config_grid([self._choices(j, b, t) for j, b in zip(ids, current, strict=True)], current, 256)
            fitting = [
                (self._score(rnd, ids, c, t)[0], i, c) for i, c in enumerate(grid) if self._fits(rnd, ids, c, capacity)
            ]
            choice = min(fitting)[2] if fitting else None
        if choice is not None:
            self._apply_config(rnd, g, ids, choice, "iadeep: memory")
            return
        self._evict(rnd, g, ids[-1], "iadeep: GPU memory exhausted")

    def _evict(self, rnd: _Round, g: int, job_id: str, reason: str) -> None:
        """Send a co-located job back to the queue (suspended: resumed on this node it pays little)."""
        job = rnd.view.job(job_id)
        if job_id in rnd.moved or job.placement is None:
            return
        self._preempt(rnd, job, reason)
        rnd.evicted.append(job_id)
        rnd.touched.add(g)
        self.counts["evict"] += 1

    @staticmethod
    def _kept_progress(tuner: GroupTuner, config: Sizes) -> float:
        """The total progress measured at ``config`` (infinite when it was not measured: no verdict)."""
        return tuner.progress.get(config, math.inf)

    def _preempt(self, rnd: _Round, job: JobView, reason: str) -> None:
        """Suspend running ``job`` (to re-seat it or send it back to the queue): its GPU share comes back in the
        planner, with the reservation planned for it this round."""
        assert job.placement is not None
        rnd.moved.add(job.spec.job_id)
        planned = rnd.reserve.pop(job.spec.job_id, None)
        rnd.preempt(job, reason, suspend=True)
        if planned is not None:
            rnd.shares.add_memory(job.placement.gpus[0], planned - mem_given(job.spec, job.placement))

    def _apply_config(self, rnd: _Round, g: int, ids: tuple[str, ...], config: Sizes, reason: str) -> None:
        """Give the running jobs ``ids`` on ``g`` the batch sizes ``config`` and the reservations they need: what
        frees memory first, so that the state accepts each step."""
        view = rnd.view
        grow: list[tuple[JobView, int, int]] = []
        for j, b in zip(ids, config, strict=True):
            job = view.job(j)
            need = self._need(rnd, j, b)
            if need < rnd.reservation(job):
                self._set_batch(rnd, job, b, reason)
                self._resize(rnd, job, g, need)
            else:
                grow.append((job, b, need))
        for job, b, need in grow:
            self._resize(rnd, job, g, need)
            self._set_batch(rnd, job, b, reason)

    def _set_batch(self, rnd: _Round, job: JobView, batch: int, reason: str) -> None:
        if not batch or batch == self._batch_of(rnd, job):
            return
        rnd.act(SetBatchSize(job.spec.job_id, batch, reason))
        rnd.batch[job.spec.job_id] = batch
        self._batch_s[job.spec.job_id] = rnd.now_s
        self.counts["batch_changes"] += 1

    # -- the tuner ------------------------------------------------------------------------------------------------
    def _tune(self, rnd: _Round) -> None:
        view = rnd.view
        topo = self._topo
        assert topo is not None
        now = rnd.now_s
        interval = self.cfg.tune_interval_s
        for g in self._changed:
            ids = tuple(self._members.get(g, ()))
            tuner = self._tuners.get(g)
            if len(ids) < 2:
                if tuner is not None:
                    del self._tuners[g]
                    self._due.pop(g, None)
                continue
            if tuner is None or set(tuner.members) != set(ids):
                self._start_tuner(rnd, g, ids)
        for g, due in sorted(self._due.items(), key=lambda item: (item[1], item[0])):
            if due > now:
                continue
            tuner = self._tuners[g]
            ids = tuner.members
            if g in rnd.touched or not rnd.moved.isdisjoint(ids):
                continue  # a job there was just sent back to the queue: the next round starts a new search
            t = topo.gpu_type[g]
            current = tuple(self._batch_of(rnd, view.job(j)) for j in ids)
            got = self._measured(rnd, ids, current, t)
            if got is None:
                self._due[g] = now + interval
                continue
            measured, progress = got
            capacity = self._capacity(rnd, g, ids)

            def prior(c: Sizes, ids: tuple[str, ...] = ids, t: int = t) -> float:
                return self._score(rnd, ids, c, t)[0]

            def fits(c: Sizes, ids: tuple[str, ...] = ids, capacity: int = capacity) -> bool:
                return self._fits(rnd, ids, c, capacity)

            tuner.record(current, measured, prior(current), progress)
            if self.cfg.tune:
                self.counts["tune_steps"] += 1
            choice = None if tuner.done else tuner.propose(prior, fits)
            if tuner.done:
                choice = tuner.best(prior, fits)
            if choice is not None and choice != current:
                self._apply_config(rnd, g, ids, choice, "iadeep: tuner")
            if not tuner.done:
                self._due[g] = now + interval
                continue
            del self._due[g]
            if choice is None:
                continue
            if self.cfg.tune:
                self.settled.append((now, ids, choice, tuner.observed.get(choice, math.nan)))
            # Co-locating against waiting, judged on measurements: a GPU whose jobs, at the configuration kept,
            # progress clearly less together than running one after the other would (rates summing below
            # evict_below) sends its newest job back to the queue, never to be put beside them again; the predictor
            # has learnt from what they measured. (Not MPS-style: that comparison point co-locates blindly.)
            kept = progress if choice == current else self._kept_progress(tuner, choice)
            if self.cfg.aware and kept < self.cfg.evict_below:
                self._evict(rnd, g, ids[-1], "iadeep: co-location measured worse than taking turns")
                self._avoid.setdefault(ids[-1], set()).update(ids[:-1])

    def _start_tuner(self, rnd: _Round, g: int, ids: tuple[str, ...], current: Sizes | None = None) -> None:
        """A new search over the batch sizes of the jobs ``ids`` now sharing ``g`` (at ``current``, default the
        sizes they have). Without tuning the search has one configuration: it only measures it, once."""
        view = rnd.view
        topo = self._topo
        assert topo is not None
        t = topo.gpu_type[g]
        if current is None:
            current = tuple(self._batch_of(rnd, view.job(j)) for j in ids)
        choices = [self._choices(j, b, t) for j, b in zip(ids, current, strict=True)]
        refs = [self._models[j].ref or b or 1 for j, b in zip(ids, current, strict=True)]
        self._tuners[g] = GroupTuner(ids, choices, current, refs, self.tuner_cfg)
        self._due[g] = rnd.now_s + self.cfg.tune_interval_s

    # -- placement ------------------------------------------------------------------------------------------------
    def _place_waiting(self, rnd: _Round) -> None:
        view = rnd.view
        heap: list[tuple[_Entry, int, Hashable]] = []
        iters: list[Any] = []
        for kind, group in self._pending.items():
            if self._failed.get(kind) == self._epoch:
                continue  # nothing changed on the GPUs since it failed
            it = iter(group)
            iters.append(it)
            heap.append((next(it), len(iters) - 1, kind))
        heapq.heapify(heap)
        while heap:
            entry, i, kind = heap[0]
            job = view.job(entry[2])
            placed = self._place_one(rnd, job) if colocatable(job.spec) else self._place_other(rnd, job)
            if not placed:
                rnd.wait(job.spec.job_id, self._wait_reason(rnd, job))
                self._failed[kind] = self._epoch
                heapq.heappop(heap)
                continue
            nxt = next(iters[i], None)
            if nxt is None:
                heapq.heappop(heap)
            else:
                heapq.heapreplace(heap, (nxt, i, kind))

    def _wait_reason(self, rnd: _Round, job: JobView) -> str:
        spec = job.spec
        planner = rnd.shares
        if not planner.quota_allows(spec):
            return quota_reason(planner, spec)
        if colocatable(spec):
            return "waiting for an idle GPU or a co-location worth its interference"
        return fit_reason(planner, spec, rnd.types(spec), PlacementStrategy.CONSOLIDATED)

    def _place_other(self, rnd: _Round, job: JobView) -> bool:
        """A gang or a fractional job: whole GPUs (or its share), consolidated, never co-located."""
        spec = job.spec
        if not rnd.shares.quota_allows(spec):
            return False
        placement = rnd.place(spec, PlacementStrategy.CONSOLIDATED)
        if placement is None:
            return False
        rnd.launch(spec.job_id, placement)
        rnd.touched.update(placement.gpus)
        return True

    def _place_one(self, rnd: _Round, job: JobView) -> bool:
        """A single-GPU job: an idle GPU if one is free, else the co-location of least added degradation."""
        types = rnd.types(job.spec)
        return self._place_alone(rnd, job, types) or self._colocate(rnd, job, types)

    def _place_alone(self, rnd: _Round, job: JobView, types: tuple[int, ...]) -> bool:
        """``job`` alone on an idle GPU of ``types``, consolidated, if one is free (within its tenant's quota)."""
        planner = rnd.shares
        spec = job.spec
        if not planner.quota_allows(spec):
            return False
        # the GPU rnd.place would take, taken below with the memory reservation the job needs
        gpus = find_whole(planner, 1, PlacementStrategy.CONSOLIDATED, types)
        if gpus is None:
            return False
        g = gpus[0]
        need = self._need(rnd, spec.job_id, self._batch_of(rnd, job))
        mem = min(need, planner.gpu_free_mem_mib(g))
        rnd.launch(spec.job_id, planner.take_as(spec, g, FULL_GPU_MILLI, mem))
        rnd.touched.add(g)
        self.counts["alone"] += 1
        return True

    def _refill(self, rnd: _Round) -> None:
        """A work-conserving round end: each job this round sent back to the queue (a co-location that ran out of
        memory or measured worse than taking turns) takes an idle GPU at once if one of its types is free, as
        Placement gives a waiting single-GPU job one, instead of waiting beside it for the next round (the round's
        walk of the queue did not see it: it was running then). It is resumed there from its suspension (what
        that costs is the executor's: little on the same node, a restore elsewhere), in the order the jobs were
        sent back; one that finds no idle GPU stays suspended in the queue."""
        view = rnd.view
        for job_id in rnd.evicted:
            job = view.job(job_id)
            self._place_alone(rnd, job, rnd.types(job.spec))

    def _colocate(self, rnd: _Round, job: JobView, types: tuple[int, ...]) -> bool:
        cfg = self.cfg
        planner = rnd.shares
        spec = job.spec
        slot = cfg.slot_milli
        if not planner.quota_allows_milli(spec, slot):
            return False
        best: tuple[float, int, Sizes, tuple[str, ...]] | None = None
        declined = False  # a GPU had room, but the gain was too small: the job waits
        avoid = self._avoid.get(spec.job_id)
        scanned = 0
        for t in types:
            for g in self._open[t]:
                if g in rnd.touched:
                    continue
                scanned += 1
                if scanned > cfg.scan_gpus:
                    break
                ids = tuple(self._members[g])
                if len(ids) > 1 and planner.gpu_free_milli(g) < slot:
                    continue
                if avoid and not avoid.isdisjoint(ids):
                    continue
                got = self._evaluate(rnd, g, ids, job)
                if got is None:
                    continue
                added, gain, config = got
                if not cfg.aware:
                    best = (0.0, g, config, ids)
                    break
                if gain < cfg.min_gain:
                    declined = True
                    continue
                if best is None or (added, g) < best[:2]:
                    best = (added, g, config, ids)
            if best is not None and not cfg.aware:
                break
        if best is None:
            if declined:
                self.counts["wait"] += 1
            return False
        _, g, config, ids = best
        self._join(rnd, g, ids, job, config)
        return True

    def _evaluate(self, rnd: _Round, g: int, ids: tuple[str, ...], job: JobView) -> tuple[float, float, Sizes] | None:
        """Co-locating ``job`` on ``g`` beside ``ids``: (added degradation, gain in total progress, configuration) at
        the best configuration predicted within the GPU's memory, or None when none fits.

        Remembered per (GPU, kind of pending job) with what it depends on (the GPU's jobs and their needs, the
        memory the GPU has for them, the job's own needs), so a round caused by something elsewhere does not score
        the same candidates again. What the predictor learns meanwhile counts from the GPU's next change."""
        view = rnd.view
        topo = self._topo
        predictor = self.predictor
        assert topo is not None and predictor is not None
        t = topo.gpu_type[g]
        job_id = job.spec.job_id
        every = (*ids, job_id)
        current = (*[self._batch_of(rnd, view.job(j)) for j in ids], self._batch_of(rnd, job))
        capacity = self._capacity(rnd, g, ids)
        if not self.cfg.aware:
            return (0.0, 0.0, current) if self._fits(rnd, every, current, capacity) else None
        choices = [self._choices(j, b, t) for j, b in zip(every, current, strict=True)]
        own = tuple(self._need(rnd, job_id, b) for b in choices[-1])
        kind = self._pending.key_of(job_id)
        if kind is None:
            kind = job_id
        stamp = (self._gpu_version.get(g, 0), capacity, current, own)
        cached = self._evals.get((g, kind))
        if cached is not None and cached[0] == stamp:
            return cached[1]
        # Each job's current size too: the grid starts with the current configuration, which a job whose size is not
        # one of its family's measured ones (a trace's own batch size) is not among its choices.
        needs = [
            {b: self._need(rnd, j, b) for b in (cur, *c)} for j, c, cur in zip(every, choices, current, strict=True)
        ]
        best: tuple[float, int, float, Sizes] | None = None
        for i, config in enumerate(config_grid(choices, current, _PLACE_CONFIGS)):
            if sum(n[b] for n, b in zip(needs, config, strict=True)) > capacity:
                continue
            d, p = self._score(rnd, every, config, t)
            if best is None or (d, i) < best[:2]:
                best = (d, i, p, config)
        result = None
        if best is not None:
            before_d, before_p = self._score(rnd, ids, current[:-1], t)
            result = (best[0] - before_d, best[2] - before_p, best[3])
        if len(self._evals) > _SCORE_CACHE:
            self._evals.clear()
        self._evals[(g, kind)] = (stamp, result)
        return result

    def _join(self, rnd: _Round, g: int, ids: tuple[str, ...], job: JobView, config: Sizes) -> None:
        """Launch ``job`` on ``g`` beside ``ids`` at ``config``: residents alone on their whole GPU are re-seated at
        the packed share (suspended and resumed in place) with their new batch size and reservation; the others
        change in place, what frees memory before the launch and what takes it after."""
        view = rnd.view
        planner = rnd.shares
        slot = self.cfg.slot_milli
        reason = f"iadeep: {job.spec.job_id} joins"
        grow: list[tuple[JobView, int, int]] = []
        for r, b in zip(ids, config[:-1], strict=True):
            resident = view.job(r)
            assert resident.placement is not None
            need = self._need(rnd, r, b)
            if resident.placement.gpu_milli > slot:
                self._preempt(rnd, resident, reason)
                self._set_batch(rnd, resident, b, reason)
                rnd.launch(r, planner.take_as(resident.spec, g, slot, need))
                rnd.reserve[r] = need
                self.counts["reseat"] += 1
            elif need < rnd.reservation(resident):
                self._set_batch(rnd, resident, b, reason)
                self._resize(rnd, resident, g, need)
            else:
                grow.append((resident, b, need))
        job_id = job.spec.job_id
        b_new = config[-1]
        self._set_batch(rnd, job, b_new, reason)
        need = self._need(rnd, job_id, b_new)
        rnd.launch(job_id, planner.take_as(job.spec, g, slot, need))
        for resident, b, need in grow:
            self._resize(rnd, resident, g, need)
            self._set_batch(rnd, resident, b, reason)
        rnd.touched.add(g)
        self.counts["colocate"] += 1
        self._start_tuner(rnd, g, (*ids, job_id), config)

    def _reseat_alone(self, rnd: _Round) -> None:
        """A job left alone at the packed share gets its whole GPU (and its own batch size) back."""
        view = rnd.view
        planner = rnd.shares
        for g in self._changed:
            if g in rnd.touched:
                continue
            ids = self._members.get(g, ())
            if len(ids) != 1:
                continue
            job = view.job(ids[0])
            placement = job.placement
            assert placement is not None
            if placement.gpu_milli >= FULL_GPU_MILLI or set(view.gpu_jobs(g)) != {ids[0]}:
                continue
            if not planner.quota_allows_milli(job.spec, FULL_GPU_MILLI - placement.gpu_milli):
                continue  # its tenant's quota has no room for the rest of the GPU: it stays at its share
            own = self._models[ids[0]].resolve(job.spec.batch_size)
            self._preempt(rnd, job, "iadeep: alone again")
            free = planner.gpu_free_mem_mib(g)
            batch = own if self._need(rnd, ids[0], own) <= free else self._batch_of(rnd, job)
            self._set_batch(rnd, job, batch, "iadeep: alone again")
            mem = min(self._need(rnd, ids[0], batch), free)
            rnd.launch(ids[0], planner.take_as(job.spec, g, FULL_GPU_MILLI, mem))
            rnd.touched.add(g)
            self.counts["reseat"] += 1
