"""Tiresias (Gu et al., NSDI'19): preemptive scheduling of distributed DL jobs without knowing their durations.

The rules, each with the section of the paper it comes from:

- **Two-dimensional attained service** (§3.1): a job's attained service is its GPU count times the time it has
  held GPUs (GPU-seconds), so a wide job ages as fast as it consumes the cluster.
- **2D-LAS** (§3.2): least attained service first. **2D-Gittins** (§3.2): when the distribution of jobs' total
  GPU-time is known, the Gittins index of a job that has attained ``a`` with service quantum ``Δ`` is
  ``P(S - a <= Δ | S > a) / E[min(S - a, Δ) | S > a]``: the chance it finishes within the next quantum per
  GPU-second it is expected to use meanwhile. A higher index runs first. The distribution is given (the
  ``yarn-gput*.csv`` samples of production jobs published with the paper, or any one-column CSV) or learned
  from the GPU-time of the jobs that have finished so far.
- **Discretized priorities** (§3.2, Fig. 7): a multi-level feedback queue. K queues split by attained-service
  thresholds; a job enters the top queue and is demoted to the next one the moment its attained service
  crosses that queue's threshold. Within a queue 2D-LAS is FIFO (by the time the job entered the queue);
  2D-Gittins orders a queue by Gittins index, then FIFO.
- **Starvation guard** (§3.2, "PromoteKnob"): a job that has waited, since it last stopped, longer than
  ``starvation_knob`` times the time it ran since its last promotion goes back to the top queue, with the
  attained service counted for queueing reset (the authors' simulator does the same).
- **Preemption at queue changes** (§3.2): a waiting job preempts running jobs of strictly lower queues (the
  lowest first) when that frees enough GPUs for it; jobs of one queue never preempt each other. The
  simulator charges each restart its checkpoint/restore cost (``PerfModel.restore_s``).
- **Placement** (§3.3, §4.1): only placement-sensitive jobs (models with large, skewed tensors: see
  :mod:`corral.core.models`) are consolidated, strictly: they wait for the fewest nodes their size allows.
  The others take any free GPUs at once (the fewest nodes among what is free, never waiting for better).

Defaults follow the authors' simulator: two queues split at 3,600 GPU-seconds, a Gittins quantum of
3,250 GPU-seconds, and the starvation guard off (``starvation_knob=0``): on loaded Philly replays a knob of 2
to 8 traded a few percent of average JCT for seven to nine times the preemptions (docs/reproduction.md).
Every event the policy reacts to (a demotion, a promotion) is a timer it asks the engine
for, so a round costs O(jobs it touches), never a scan of every job.

Incremental bookkeeping: a pending job's queue and index cannot change while it waits (it attains no
service), except through a promotion, after which the engine re-files it (``on_timer`` returns it). A
pending job under a learned Gittins distribution keeps the index it had when it entered the queue.
"""

from __future__ import annotations

import bisect
import csv
import heapq
import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from sortedcontainers import SortedList

from corral.core.data import data_file
from corral.core.decisions import Action, Decision, Launch, Preempt
from corral.core.errors import ConfigError, InputError
from corral.core.job import JobPhase, JobSpec, JobView
from corral.core.models import traits
from corral.core.placement import Placement
from corral.policies.base import BasePolicy, PolicyConfig, allowed_types, option
from corral.policies.placement import PlacementStrategy, place
from corral.policies.planner import Planner
from corral.policies.preemption import Victims
from corral.policies.queue import PendingWalk
from corral.policies.registry import register_policy
from corral.policies.view import ClusterView


class Priority(StrEnum):
    LAS = "las"
    GITTINS = "gittins"


class Sensitivity(StrEnum):
    MODEL = "model"  # by the job's model (core.models); unknown models are not sensitive
    ALL = "all"
    NONE = "none"


@dataclass(frozen=True, slots=True)
class TiresiasConfig(PolicyConfig):
    priority: Priority = option(Priority.LAS, "las (least attained GPU-service) or gittins (Gittins index)")
    thresholds_gpu_s: tuple[float, ...] = option(
        (3600.0,), "attained GPU-seconds at which a job moves down a queue (K-1 ascending values for K queues)"
    )
    starvation_knob: float = option(
        0.0, "promote a job to the top queue after waiting this many times the time it ran (0: never)"
    )
    preempt: bool = option(True, "let a waiting job preempt jobs of lower queues")
    sensitive: Sensitivity = option(
        Sensitivity.MODEL, "which jobs get strict consolidation: model (by model), all, none"
    )
    distribution: str = option(
        "yarn-gput10000",
        "gittins: GPU-time samples: yarn-gput1000|yarn-gput5000|yarn-gput10000 (shared data), a CSV path, "
        "or 'learned' (finished jobs, starting from yarn-gput10000)",
    )
    gittins_quantum_gpu_s: float = option(3250.0, "gittins: the service quantum Δ in GPU-seconds")
    learn_after: int = option(100, "gittins learned: finished jobs needed before their distribution is used")

    def __post_init__(self) -> None:
        th = self.thresholds_gpu_s
        if any(not (t > 0 and math.isfinite(t)) for t in th) or list(th) != sorted(set(th)):
            raise ConfigError(f"tiresias: thresholds_gpu_s must be positive and strictly ascending, got {th}")
        if not self.starvation_knob >= 0:
            raise ConfigError(f"tiresias: starvation_knob must be >= 0, got {self.starvation_knob}")
        if not self.gittins_quantum_gpu_s > 0:
            raise ConfigError(f"tiresias: gittins_quantum_gpu_s must be > 0, got {self.gittins_quantum_gpu_s}")
        if self.learn_after < 1:
            raise ConfigError(f"tiresias: learn_after must be >= 1, got {self.learn_after}")


# ----------------------------------------------------------------------------------------------------------
# Gittins index
# ----------------------------------------------------------------------------------------------------------
class GittinsIndex:
    """The Gittins index over an empirical distribution of total GPU-service, in O(log n) per query."""

    __slots__ = ("_prefix", "_samples", "quantum")

    def __init__(self, samples: Sequence[float], quantum: float) -> None:
        if not samples:
            raise ConfigError("a Gittins index needs at least one GPU-time sample")
        self._samples = sorted(float(s) for s in samples)
        prefix = [0.0]
        for s in self._samples:
            prefix.append(prefix[-1] + s)
        self._prefix = prefix
        self.quantum = quantum

    def __len__(self) -> int:
        return len(self._samples)

    def __call__(self, attained: float) -> float:
        s, n, q = self._samples, len(self._samples), self.quantum
        i = bisect.bisect_right(s, attained)  # samples still alive: S > a
        alive = n - i
        if alive == 0:
            return 0.0  # the job has outlived every sample: nothing says it ends soon
        j = bisect.bisect_right(s, attained + q)  # of those, ending within the quantum: a < S <= a + Δ
        finish_prob = (j - i) / alive
        expected_use = (self._prefix[j] - self._prefix[i] - attained * (j - i) + q * (n - j)) / alive
        return finish_prob / expected_use


def read_gpu_time_samples(path: Path) -> list[float]:
    """GPU-seconds, one per row, from a CSV whose first column holds them (a header row is allowed)."""
    out: list[float] = []
    with path.open(newline="") as fh:
        for line_no, row in enumerate(csv.reader(fh), start=1):
            if not row or not row[0].strip():
                continue
            cell = row[0].strip()
            try:
                value = float(cell)
            except ValueError:
                if line_no == 1:
                    continue  # header
                raise InputError(
                    "bad GPU-time sample", file=str(path), line=line_no, column="1", expected="seconds", got=cell
                ) from None
            if not (value >= 0 and math.isfinite(value)):
                raise InputError(
                    "bad GPU-time sample", file=str(path), line=line_no, column="1", expected=">= 0", got=cell
                )
            out.append(value)
    if not out:
        raise ConfigError(f"{path}: no GPU-time samples")
    return out


def _samples_for(name: str) -> list[float]:
    if name.startswith("yarn-gput") and "/" not in name and not name.endswith(".csv"):
        return read_gpu_time_samples(data_file("tiresias", f"{name}.csv"))
    path = Path(name)
    if not path.is_file():
        raise ConfigError(f"tiresias: no GPU-time distribution {name!r} (a yarn-gput* name or a CSV file path)")
    return read_gpu_time_samples(path)


# ----------------------------------------------------------------------------------------------------------
# The policy
# ----------------------------------------------------------------------------------------------------------
_DEMOTE, _PROMOTE = 0, 1


@register_policy
class TiresiasPolicy(BasePolicy):
    name = "tiresias"
    summary = "discretized 2D-LAS or 2D-Gittins (no durations needed); preemptive; consolidates sensitive jobs"
    Config = TiresiasConfig
    needs_models = True

    def __init__(self, config: PolicyConfig | None = None, *, seed: int = 0) -> None:
        super().__init__(config, seed=seed)
        cfg = self.config
        assert isinstance(cfg, TiresiasConfig)
        self.cfg = cfg
        self._thresholds = list(cfg.thresholds_gpu_s)
        self._last_queue = len(self._thresholds)
        self._gittins: GittinsIndex | None = None
        self._learning = False
        self._learned: list[float] = []
        self._learned_built = 0
        if cfg.priority is Priority.GITTINS:
            self._learning = cfg.distribution.strip().lower() == "learned"
            prior = "yarn-gput10000" if self._learning else cfg.distribution.strip()
            self._gittins = GittinsIndex(_samples_for(prior), cfg.gittins_quantum_gpu_s)
        # Per job: executed seconds at its last promotion (attained service for queueing restarts there), its
        # queue, and when it entered that queue (FIFO order inside a queue).
        self._offset: dict[str, float] = {}
        self._queue: dict[str, int] = {}
        self._entered: dict[str, float] = {}
        # Running jobs in priority order (highest first); victims come from the end.
        self._running: SortedList = SortedList()
        self._run_entry: dict[str, tuple[Any, ...]] = {}
        self._queue_gpus = [0] * (self._last_queue + 1)  # GPUs held by running jobs, per queue
        # Demotions of running jobs and promotions of waiting ones: (time, kind, job), a heap. A job's entry is the
        # one in _event_of; one replaced or cancelled stays in the heap, stale, until it comes to the top (taking it
        # out of the middle would cost a search, and a burst round replaces thousands).
        self._events: list[tuple[float, int, str]] = []
        self._event_of: dict[str, tuple[float, int, str]] = {}
        self._sensitive_of: dict[str | None, bool] = {}  # by model name

    # -- priorities -------------------------------------------------------------------------------------------
    def _queue_attained(self, job: JobView) -> float:
        """GPU-seconds counted for queueing: attained service since the last promotion (job not running)."""
        return job.spec.num_gpus * (job.executed_s - self._offset.get(job.spec.job_id, 0.0))

    def _queue_for(self, attained: float) -> int:
        # A hair of slack so a job demoted by a timer at exactly its threshold is not put back by rounding.
        return bisect.bisect_right(self._thresholds, attained + 1e-6)

    def _key(self, job: JobView, q: int, entered: float) -> tuple[Any, ...]:
        if self._gittins is None:
            return (q, entered, job.spec.submit_s)
        index = self._gittins(job.spec.num_gpus * job.executed_s)
        return (q, -index, entered, job.spec.submit_s)

    def queue_key(self, job: JobView) -> tuple[Any, ...]:
        job_id = job.spec.job_id
        q = self._queue_for(self._queue_attained(job))
        entered = self._entered[job_id] if self._queue.get(job_id) == q else job.queued_since_s
        return self._key(job, q, entered)

    def _sensitive(self, spec: JobSpec) -> bool:
        mode = self.cfg.sensitive
        if mode is Sensitivity.ALL:
            return True
        if mode is Sensitivity.NONE:
            return False
        got = self._sensitive_of.get(spec.model)
        if got is None:
            got = self._sensitive_of[spec.model] = traits(spec.model).placement_sensitive
        return got

    # -- bookkeeping --------------------------------------------------------------------------------------------
    def _demotion_at(self, job: JobView, q: int, now_s: float) -> float | None:
        """When a job launched now in queue ``q`` crosses its queue's threshold (None in the last queue)."""
        if q >= self._last_queue:
            return None
        return now_s + (self._thresholds[q] - self._queue_attained(job)) / job.spec.num_gpus

    def _promotion_at(self, q: int, ran_s: float, now_s: float) -> float | None:
        """When a job that stopped now, in queue ``q`` after running ``ran_s`` since its last promotion, starves."""
        knob = self.cfg.starvation_knob
        if knob <= 0 or q == 0 or ran_s <= 0:
            return None
        return now_s + knob * ran_s

    def _set_event(self, job_id: str, when: float | None, kind: int) -> None:
        if when is None:
            self._event_of.pop(job_id, None)
            return
        entry = (when, kind, job_id)
        self._event_of[job_id] = entry
        events = self._events
        heapq.heappush(events, entry)
        if len(events) > 2 * len(self._event_of) + 64:  # mostly stale: keep the heap in proportion to the jobs
            events[:] = self._event_of.values()
            heapq.heapify(events)

    def _next_event(self) -> tuple[float, int, str] | None:
        """The earliest event still due (stale entries on top of the heap are dropped on the way)."""
        events, current = self._events, self._event_of
        while events:
            entry = events[0]
            if current.get(entry[2]) is entry:
                return entry
            heapq.heappop(events)
        return None

    def _set_running(self, job: JobView, q: int, entered: float) -> None:
        self._drop_running(job)
        entry = (*self._key(job, q, entered), job.spec.job_id)
        self._run_entry[job.spec.job_id] = entry
        self._running.add(entry)
        self._queue_gpus[q] += job.spec.num_gpus

    def _drop_running(self, job: JobView) -> None:
        old = self._run_entry.pop(job.spec.job_id, None)
        if old is not None:
            self._running.remove(old)
            self._queue_gpus[old[0]] -= job.spec.num_gpus

    def on_job_changed(self, job: JobView, now_s: float) -> None:
        job_id = job.spec.job_id
        phase = job.phase
        if phase is JobPhase.RUNNING:
            q = self._queue[job_id]
            self._set_running(job, q, self._entered[job_id])
            self._set_event(job_id, self._demotion_at(job, q, now_s), _DEMOTE)
            return
        self._drop_running(job)
        if phase is JobPhase.PENDING:
            q = self._queue_for(self._queue_attained(job))
            if self._queue.get(job_id) != q:
                self._queue[job_id] = q
                self._entered[job_id] = now_s
            ran = job.executed_s - self._offset.get(job_id, 0.0)
            self._set_event(job_id, self._promotion_at(q, ran, now_s), _PROMOTE)
            return
        # Finished or rejected: forget it (learning from the finished ones).
        self._set_event(job_id, None, _DEMOTE)
        for table in (self._offset, self._queue, self._entered):
            table.pop(job_id, None)
        if phase is JobPhase.FINISHED and self._learning:
            self._learn(job.spec.num_gpus * job.executed_s)

    def on_job_restored(self, view: ClusterView, job: JobView, now_s: float) -> None:
        """A job taken back after a live restart: its queue follows from its attained service, as for a job
        seen for the first time. What is lost with the old controller is a starvation promotion's offset (a
        promoted job counts its service from the start again, so it may be demoted sooner than it would have
        been) and how long it had waited in its queue (a restored job enters its queue now)."""
        job_id = job.spec.job_id
        if job.phase is JobPhase.RUNNING:
            started = job.last_start_s if job.last_start_s is not None else now_s
            self._queue[job_id] = self._queue_for(self._queue_attained(job))
            self._entered[job_id] = started
        self.on_job_changed(job, now_s)

    def _learn(self, gpu_s: float) -> None:
        self._learned.append(gpu_s)
        n = len(self._learned)
        # Rebuild when the sample has grown by a tenth: O(n log n) in total, and the index tracks the workload.
        if n >= self.cfg.learn_after and n >= self._learned_built * 1.1:
            self._gittins = GittinsIndex(self._learned, self.cfg.gittins_quantum_gpu_s)
            self._learned_built = n

    def on_timer(self, view: ClusterView, now_s: float) -> Collection[str]:
        promoted: list[str] = []
        while (entry := self._next_event()) is not None and entry[0] <= now_s:
            heapq.heappop(self._events)
            _when, kind, job_id = entry
            del self._event_of[job_id]
            job = view.job(job_id)
            if kind == _DEMOTE:
                q = self._queue[job_id] + 1
                self._queue[job_id] = q
                self._entered[job_id] = now_s
                self._set_running(job, q, now_s)
                if q < self._last_queue:
                    start = job.last_start_s if job.last_start_s is not None else now_s
                    attained = job.spec.num_gpus * (job.executed_s + now_s - start - self._offset.get(job_id, 0.0))
                    when = now_s + (self._thresholds[q] - attained) / job.spec.num_gpus
                    self._set_event(job_id, when, _DEMOTE)
            else:
                self._offset[job_id] = job.executed_s
                self._queue[job_id] = 0
                self._entered[job_id] = now_s
                promoted.append(job_id)
        return promoted

    # -- the round ----------------------------------------------------------------------------------------------
    def schedule(self, view: ClusterView, now_s: float) -> Decision:
        first = self._next_event()
        wake = first[0] if first is not None else None
        if not view.num_pending:
            return Decision((), wake_at_s=wake)
        planner = Planner(view)
        launches = self._fill(view, planner)
        actions: list[Action] = list(launches)
        if self.cfg.preempt and self._running and len(launches) < view.num_pending:
            actions += self._preemptions(view, planner, {a.job_id for a in launches}, now_s)
        # The engine applies the actions after this returns, so ask now for the timers they will need.
        starving = self.cfg.starvation_knob > 0  # else a preempted job is never promoted: no timer for it
        for action in actions:
            job_id = action.job_id
            if isinstance(action, Launch):
                when = self._demotion_at(view.job(job_id), self._queue[job_id], now_s)
            elif starving:
                job = view.job(job_id)
                assert job.last_start_s is not None
                ran = job.executed_s + now_s - job.last_start_s - self._offset.get(job_id, 0.0)
                when = self._promotion_at(self._queue_for(job.spec.num_gpus * ran), ran, now_s)
            else:
                continue
            if when is not None and when > now_s and (wake is None or when < wake):
                wake = when
        return Decision(tuple(actions), wake_at_s=wake)

    def _strategy(self, spec: JobSpec) -> PlacementStrategy:
        return PlacementStrategy.STRICT if self._sensitive(spec) else PlacementStrategy.CONSOLIDATED

    def _fill(self, view: ClusterView, planner: Planner) -> list[Launch]:
        """Launch waiting jobs in priority order wherever they fit (Tiresias is work-conserving)."""
        launches: list[Launch] = []
        walk = PendingWalk(view)
        strict_blocked: dict[tuple[tuple[str, ...], int | None], int] = {}
        for shape, job in walk:
            if planner.total_free() == 0 and not planner.has_partial():
                break
            spec = job.spec
            if not planner.quota_allows(spec):
                walk.block(shape, quota=True)
                continue
            types = allowed_types(view, spec)
            if shape.whole and not any(planner.type_free(t) >= spec.num_gpus for t in types):
                walk.block(shape)
                continue
            strategy = self._strategy(spec)
            strict = strategy is PlacementStrategy.STRICT and shape.whole
            kind = (shape.gpu_types, shape.gpu_mem_mib)
            if strict and shape.size >= strict_blocked.get(kind, math.inf):
                continue
            placement = place(planner, spec, strategy, types)
            if placement is not None:
                launches.append(Launch(spec.job_id, placement))
            elif strict:
                # A larger sensitive job cannot have its fewest nodes either; insensitive ones of this shape may
                # still fit anywhere, so the shape stays open.
                strict_blocked[kind] = min(strict_blocked.get(kind, shape.size), shape.size)
            else:
                walk.block(shape)
        return launches

    def _preemptions(self, view: ClusterView, planner: Planner, launched: set[str], now_s: float) -> list[Action]:
        """For each waiting job in priority order, free GPUs by preempting running jobs of strictly lower queues,
        lowest priority first, until it fits."""
        actions: list[Action] = []
        # Running jobs lowest priority first, ranked by queue: a job of queue q may preempt those ranked above q.
        victims = Victims(view, ((entry[0], entry[-1]) for entry in reversed(self._running)))
        walk = PendingWalk(view)
        strict_blocked: dict[tuple[tuple[str, ...], int | None], int] = {}
        for shape, job in walk:
            job_id = job.spec.job_id
            if job_id in launched:
                continue
            q = self._queue[job_id]
            lowest = victims.first_rank()
            if lowest is None or lowest <= q:
                break  # the queue is in priority order: nobody later outranks a running job either
            spec = job.spec
            # A job its tenant's quota holds back may still preempt the tenant's own lower-queue jobs: that frees
            # the quota as well as the GPUs (Victims.place checks both).
            over_quota = not planner.quota_allows(spec)
            strategy = self._strategy(spec)
            strict = strategy is PlacementStrategy.STRICT and shape.whole
            kind = (shape.gpu_types, shape.gpu_mem_mib)
            if strict and shape.size >= strict_blocked.get(kind, math.inf):
                continue
            if shape.whole and planner.total_free() + self._gpus_below(q) < spec.num_gpus:
                # Even preempting every lower-queue job would not free enough; later jobs of this shape are in
                # the same queue or lower, so they can free no more.
                walk.block(shape)
                continue
            placement = self._free_for(planner, spec, strategy, q, victims, actions)
            if placement is None:
                if over_quota:  # the tenant's later jobs of this size or more cannot get in either
                    walk.block(shape, quota=True)
                    continue
                # Later jobs of this shape can preempt no more than this one could: skip them (sensitive jobs
                # only block sensitive ones, as insensitive ones may still fit where they did not).
                if strict:
                    strict_blocked[kind] = min(strict_blocked.get(kind, shape.size), shape.size)
                else:
                    walk.block(shape)
                continue
            actions.append(Launch(job_id, placement))
        return actions

    def _gpus_below(self, q: int) -> int:
        """GPUs held by running jobs of queues below ``q`` (what preempting all of them would free)."""
        return sum(self._queue_gpus[q + 1 :])

    def _free_for(
        self,
        planner: Planner,
        spec: JobSpec,
        strategy: PlacementStrategy,
        q: int,
        victims: Victims,
        actions: list[Action],
    ) -> Placement | None:
        # Candidates: running jobs of strictly lower queues, lowest priority first.
        found = victims.place(planner, spec, strategy, q)
        if found is None:
            return None
        placement, preempted = found
        for victim in preempted:
            actions.append(Preempt(victim.spec.job_id, f"tiresias: {spec.job_id} is in a higher queue"))
        return placement
