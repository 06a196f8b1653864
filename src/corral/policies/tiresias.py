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
  crosses that queue's threshold. Within a queue 2D-LAS is FIFO by entry into the queue: a demoted job goes to
  the back of its new queue, behind the jobs already waiting there. 2D-Gittins orders a queue by Gittins index
  (with ``gittins_rerank``, running jobs' indices recomputed as their service grows), then by submit time,
  then FIFO.
- **Order inside a queue** (``within_queue``): ``running-first``, as the authors' simulator keeps its queue lists,
  moves a queue's running jobs ahead of its waiting ones after every round (a job that just entered the queue
  stays behind the waiting ones for that round only, so they may preempt it; a preempted job goes to the front
  of the waiting ones); ``entry`` keeps FIFO by entry for running and waiting jobs alike at every round, as the
  Pollux artifact's Tiresias does, so an earlier waiting job preempts a later running one of its queue as soon
  as that frees enough GPUs.
- **Starvation guard** (§3.2, "PromoteKnob"): a job that has waited, since it last stopped, longer than
  ``starvation_knob`` times the time it ran since its last promotion goes back to the top queue, with the
  attained service counted for queueing reset (the authors' simulator does the same).
- **Minimum run** (corral's addition to the starvation guard, §3.2 "PromoteKnob"): a running job is not preempted
  before it has run ``min_run_s`` seconds since it last started. The guard makes priorities cyclic: a promoted job
  preempts one that is promoted in turn, and where a queue's threshold is crossed sooner than a restart's restore
  ends (8-GPU jobs demoted after 200 GPU-s, 25 s, against a 30 s restore), jobs take the GPUs from each other before
  any of them makes progress, for ever. A run longer than the restore ends that. Without the guard priorities only
  fall (a job is preempted by an arrival or by a job above it, which will be demoted in turn), so preemptions are
  bounded and the paper's rule is kept as it is: the minimum run is 0 by default there, and 60 s (twice the
  simulator's default restore, ``PerfModel.restore_s``) with the guard on. A policy does not see the executor's
  restore cost: set ``min_run_s`` above it.
- **Preemption** (§3.2): the round walks the waiting jobs in priority order, as the authors' simulator walks its
  queues; a job that does not fit on free GPUs preempts running jobs of lower priority (lower queues, and in its
  own queue those behind it), the lowest first, when that frees enough GPUs for it. So a higher-priority job
  gets GPUs before a lower one takes the free ones. The simulator charges each restart its checkpoint/restore
  cost (``PerfModel.restore_s``). What the preemptions freed and their jobs did not take goes to the jobs that
  fit: the round ends work-conserving.
- **Placement** (§3.3, §4.1): only placement-sensitive jobs (models with large, skewed tensors: see
  :mod:`corral.workloads.models`) are consolidated, strictly: they wait for the fewest nodes their size allows.
  The others take any free GPUs at once (the fewest nodes among what is free, never waiting for better).
- **Periodic rounds** (``round_s``, off by default): decide only at multiples of ``round_s`` seconds, as the
  Pollux artifact's simulator does every 60 s.

Defaults follow the authors' simulator for its 2D schedules (``run_sim.py``, ``jobs.py``): three queues split at
3,250 and 7,200 GPU-seconds, running-first order, a Gittins quantum of 3,250 GPU-seconds over the
``yarn-gput1000`` samples, and the starvation guard off (``starvation_knob=0``): on loaded Philly replays a knob
of 2 to 8 traded a few percent of average JCT for seven to nine times the preemptions (docs/reproduction.md).
With the peers' assumptions matched, corral's average JCT is within 2% of the authors' simulator (2D-LAS and
2D-Gittins, 60-job trace, 2x4 and 4x4) and of the Pollux artifact's Tiresias on six of its eight workloads
(``benchmarks/bench_peers.py``; docs/policies/tiresias.md gives the figures and the two workloads still off).
Every event the policy reacts to (a demotion, a promotion) is a timer it asks the engine for, so a round costs
O(jobs it touches), never a scan of every job (with ``gittins_rerank``, Gittins re-ranks the running jobs when a
round needs victims).

Incremental bookkeeping: a pending job's queue and index cannot change while it waits (it attains no
service), except through a promotion, after which the engine re-files it (``on_timer`` returns it). A
pending job under a learned Gittins distribution keeps the index it had when it was filed.
"""

from __future__ import annotations

import bisect
import csv
import heapq
import math
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from sortedcontainers import SortedList

from corral.core.decisions import Action, Decision, Launch, Preempt
from corral.core.errors import ConfigError, InputError
from corral.core.job import JobPhase, JobSpec, JobView
from corral.core.options import option
from corral.core.placement import Placement
from corral.policies.framework.contract import BasePolicy, PolicyConfig, allowed_types
from corral.policies.framework.placement import PlacementStrategy, place
from corral.policies.framework.preemption import Victims, place_on_free
from corral.policies.framework.queues import PendingWalk, StrictBlocks
from corral.policies.framework.reasons import blocked_reason, fit_reason
from corral.policies.framework.round import Round
from corral.policies.framework.view import ClusterView
from corral.workloads.data import data_file
from corral.workloads.models import traits


class Priority(StrEnum):
    LAS = "las"
    GITTINS = "gittins"


class WithinQueue(StrEnum):
    RUNNING_FIRST = "running-first"  # the authors' simulator: after each round a queue's running jobs lead it
    ENTRY = "entry"  # FIFO by entry into the queue, running or not, re-walked every round (the Pollux artifact)


class Sensitivity(StrEnum):
    MODEL = "model"  # by the job's model (workloads.models); unknown models are not sensitive
    ALL = "all"
    NONE = "none"


@dataclass(frozen=True, slots=True)
class TiresiasConfig(PolicyConfig):
    priority: Priority = option(Priority.LAS, "las (least attained GPU-service) or gittins (Gittins index)")
    thresholds_gpu_s: tuple[float, ...] = option(
        (3250.0, 7200.0),
        "attained GPU-seconds at which a job moves down a queue (K-1 ascending values for K queues)",
        annotation=tuple[float, ...],
    )
    within_queue: WithinQueue = option(
        WithinQueue.RUNNING_FIRST,
        "order inside a queue: running-first (the authors' simulator: a queue's running jobs stay ahead of its "
        "waiting ones; a job entering it goes behind them) or entry (FIFO by entry, running or not)",
    )
    round_s: float = option(0.0, "decide only every round_s seconds, as a periodic scheduler does (0: at every event)")
    starvation_knob: float = option(
        0.0, "promote a job to the top queue after waiting this many times the time it ran (0: never)"
    )
    preempt: bool = option(True, "let a waiting job preempt jobs of lower queues")
    min_run_s: float | None = option(
        None,
        "do not preempt a job before it has run this many seconds since it (re)started; keep it above the restore "
        "cost (default: 60 with the starvation guard on, else 0)",
        annotation=float | None,
    )
    sensitive: Sensitivity = option(
        Sensitivity.MODEL, "which jobs get strict consolidation: model (by model), all, none"
    )
    distribution: str = option(
        "yarn-gput1000",
        "gittins: GPU-time samples: yarn-gput1000|yarn-gput5000|yarn-gput10000 (shared data), a CSV path, "
        "or 'learned' (finished jobs, starting from yarn-gput1000)",
    )
    gittins_quantum_gpu_s: float = option(3250.0, "gittins: the service quantum Δ in GPU-seconds")
    gittins_rerank: bool = option(
        False,
        "gittins: rank running jobs again by their index as their service grows and let a queue's waiting jobs "
        "preempt its running ones (the authors' simulator, which charges no restore); false: a running job keeps "
        "its index from launch and only lower queues are preempted",
    )
    learn_after: int = option(100, "gittins learned: finished jobs needed before their distribution is used")

    def __post_init__(self) -> None:
        th = self.thresholds_gpu_s
        if any(not (t > 0 and math.isfinite(t)) for t in th) or list(th) != sorted(set(th)):
            raise ConfigError(f"tiresias: thresholds_gpu_s must be positive and strictly ascending, got {th}")
        if not self.starvation_knob >= 0:
            raise ConfigError(f"tiresias: starvation_knob must be >= 0, got {self.starvation_knob}")
        if self.min_run_s is not None and not (self.min_run_s >= 0 and math.isfinite(self.min_run_s)):
            raise ConfigError(f"tiresias: min_run_s must be >= 0, got {self.min_run_s}")
        if not self.gittins_quantum_gpu_s > 0:
            raise ConfigError(f"tiresias: gittins_quantum_gpu_s must be > 0, got {self.gittins_quantum_gpu_s}")
        if not (self.round_s >= 0 and math.isfinite(self.round_s)):
            raise ConfigError(f"tiresias: round_s must be >= 0, got {self.round_s}")
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
_GUARD_MIN_RUN_S = 60.0  # min_run_s by default with the starvation guard on (see TiresiasConfig.min_run_s)
_RUNNING, _WAITING = 0, 1  # a job's section of its queue, in running-first order


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
            prior = "yarn-gput1000" if self._learning else cfg.distribution.strip()
            self._gittins = GittinsIndex(_samples_for(prior), cfg.gittins_quantum_gpu_s)
        self._running_first = cfg.within_queue is WithinQueue.RUNNING_FIRST
        # Per job: executed seconds at its last promotion (attained service for queueing restarts there), its
        # queue, and its place in that queue's order. A queue is ordered as a list the authors' simulator keeps:
        # a job entering it (arriving, demoted, promoted) goes to the back (``_pos`` from a rising counter).
        # Running-first, after every round the queue's running jobs go ahead of its waiting ones, each part in
        # the order it had: a running job's place is ``_run_pos`` (given in queue order as it starts), and a job
        # preempted goes to the front of the waiting part (``_pos`` from a falling counter).
        self._offset: dict[str, float] = {}
        self._queue: dict[str, int] = {}
        self._pos: dict[str, int] = {}
        self._run_pos: dict[str, int] = {}
        self._back = 0
        self._front = 0
        self._run_next = 0
        # Running jobs demoted at this instant (running-first: they are behind the waiting jobs of their new
        # queue until the round has passed, so those may preempt them).
        self._demoted: set[str] = set()
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
        # The minimum run (module docstring; §3.2 "PromoteKnob"): only the starvation guard's promotions can make
        # jobs preempt each other without end, so by default only the guard brings one. _protected_until: the
        # earliest end of a minimum run that kept a running job out of this round's victims (None: none did).
        guard = cfg.starvation_knob > 0
        self._min_run_s = cfg.min_run_s if cfg.min_run_s is not None else (_GUARD_MIN_RUN_S if guard else 0.0)
        self._protected_until: float | None = None

    # -- priorities -------------------------------------------------------------------------------------------
    def _queue_attained(self, job: JobView, now_s: float | None = None) -> float:
        """GPU-seconds counted for queueing: attained service since the last promotion (at ``now_s`` for a
        running job; else as of its last stop)."""
        executed = job.executed_s
        if now_s is not None and job.phase is JobPhase.RUNNING and job.last_start_s is not None:
            executed += now_s - job.last_start_s
        return job.spec.num_gpus * (executed - self._offset.get(job.spec.job_id, 0.0))

    def _queue_for(self, attained: float) -> int:
        # A hair of slack so a job demoted by a timer at exactly its threshold is not put back by rounding.
        return bisect.bisect_right(self._thresholds, attained + 1e-6)

    def _enter(self, job_id: str, q: int) -> None:
        """``job_id`` enters queue ``q`` at its back."""
        self._queue[job_id] = q
        self._back += 1
        self._pos[job_id] = self._back

    def _key(self, job: JobView, section: int, place: int, now_s: float | None = None) -> tuple[Any, ...]:
        """Priority (lower first): the queue, then (Gittins) the index and submit time, then the queue's order."""
        q = self._queue[job.spec.job_id]
        if self._gittins is None:
            return (q, section, place)
        # The authors' simulator sorts each queue by (index, earlier submit) at every event, running jobs too.
        return (q, -self._gittins(self._queue_attained(job, now_s)), job.spec.submit_s, section, place)

    def _running_key(self, job: JobView, now_s: float | None = None) -> tuple[Any, ...]:
        job_id = job.spec.job_id
        run_pos = self._run_pos.get(job_id)
        if run_pos is None or not self._running_first:
            return self._key(job, _WAITING, self._pos[job_id], now_s)
        return self._key(job, _RUNNING, run_pos, now_s)

    def queue_key(self, job: JobView) -> tuple[Any, ...]:
        """The waiting job's key, filed by the engine as it starts waiting (before :meth:`on_job_changed`): a job
        seen for the first time, or whose queue changed (a demotion at the instant it stopped), enters its queue
        at the back here."""
        job_id = job.spec.job_id
        q = self._queue_for(self._queue_attained(job))
        if self._queue.get(job_id) != q or job_id not in self._pos:
            self._enter(job_id, q)
        return self._key(job, _WAITING, self._pos[job_id])

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
        """When a job running (or launched) now in queue ``q`` crosses its queue's threshold (None in the last
        queue). A running job's current run counts: a job taken back after a restart, or copied into a forecast,
        has run since its last start."""
        if q >= self._last_queue:
            return None
        left = self._thresholds[q] - self._queue_attained(job, now_s)
        return now_s + max(0.0, left) / job.spec.num_gpus

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
            # Equal, not identical: compiled (setup.py), a tuple is rebuilt when it is stored, so identity is lost; an
            # equal stale entry is the same event (time, kind and job), so either copy may stand for it.
            if current.get(entry[2]) == entry:
                return entry
            heapq.heappop(events)
        return None

    def _set_running(self, job: JobView, now_s: float | None = None) -> None:
        self._drop_running(job)
        job_id = job.spec.job_id
        entry = (*self._running_key(job, now_s), job_id)
        self._run_entry[job_id] = entry
        self._running.add(entry)
        self._queue_gpus[entry[0]] += job.spec.num_gpus

    def _drop_running(self, job: JobView) -> None:
        old = self._run_entry.pop(job.spec.job_id, None)
        if old is not None:
            self._running.remove(old)
            self._queue_gpus[old[0]] -= job.spec.num_gpus

    def on_job_changed(self, job: JobView, before: Placement | None, now_s: float) -> None:
        job_id = job.spec.job_id
        phase = job.phase
        if phase is JobPhase.RUNNING:
            self._set_running(job, now_s)
            self._set_event(job_id, self._demotion_at(job, self._queue[job_id], now_s), _DEMOTE)
            return
        self._drop_running(job)
        self._run_pos.pop(job_id, None)
        self._demoted.discard(job_id)
        if phase is JobPhase.PENDING:
            q = self._queue[job_id]  # queue_key has filed it
            ran = job.executed_s - self._offset.get(job_id, 0.0)
            self._set_event(job_id, self._promotion_at(q, ran, now_s), _PROMOTE)
            return
        # Finished or rejected: forget it (learning from the finished ones).
        self._set_event(job_id, None, _DEMOTE)
        for table in (self._offset, self._queue, self._pos):
            table.pop(job_id, None)
        if phase is JobPhase.FINISHED and self._learning:
            self._learn(job.spec.num_gpus * job.executed_s)

    def on_job_restored(self, view: ClusterView, job: JobView, now_s: float) -> None:
        """A job taken back after a live restart: its queue follows from its attained service, as for a job
        seen for the first time, and it enters that queue now (at the back; a running one in the running part).
        What is lost with the old controller is a starvation promotion's offset (a promoted job counts its
        service from the start again, so it may be demoted sooner than it would have been) and its place in
        its queue."""
        job_id = job.spec.job_id
        if job.phase is JobPhase.RUNNING:
            self._enter(job_id, self._queue_for(self._queue_attained(job, now_s)))
            self._run_next += 1
            self._run_pos[job_id] = self._run_next
        self.on_job_changed(job, None, now_s)

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
                # Demoted: to the back of the next queue, behind the jobs waiting there (§3.2; running-first, it
                # stays there for this round only).
                q = self._queue[job_id] + 1
                self._enter(job_id, q)
                self._run_pos.pop(job_id, None)
                self._demoted.add(job_id)
                self._set_running(job, now_s)
                if q < self._last_queue:
                    attained = self._queue_attained(job, now_s)
                    when = now_s + (self._thresholds[q] - attained) / job.spec.num_gpus
                    self._set_event(job_id, when, _DEMOTE)
            else:
                self._offset[job_id] = job.executed_s
                self._enter(job_id, 0)
                promoted.append(job_id)
        return promoted

    # -- the round ----------------------------------------------------------------------------------------------
    def schedule(self, view: ClusterView, now_s: float) -> Decision:
        first = self._next_event()
        wake = first[0] if first is not None else None
        round_s = self.cfg.round_s
        if round_s > 0:
            # A periodic scheduler (the Pollux artifact's 60 s rounds): decide at multiples of round_s only; what
            # happens in between (arrivals, GPUs freed) waits for the next one, which is only asked for while a job
            # waits.
            k = math.ceil(now_s / round_s - 1e-9)
            if k * round_s > now_s + 1e-9:
                if view.num_pending:
                    wake = k * round_s if wake is None else min(wake, k * round_s)
                return Decision((), wake_at_s=wake)
            if view.num_pending:
                wake = (k + 1) * round_s if wake is None else min(wake, (k + 1) * round_s)
        if not view.num_pending:
            self._settle_demoted()
            return Decision((), wake_at_s=wake)
        rnd = Round(view, now_s)
        self._walk(rnd)
        actions = rnd.actions
        stopped = [view.job(a.job_id) for a in actions if isinstance(a, Preempt)]
        if stopped:
            # A preemption frees whole jobs: what its job did not take goes to a waiting job that fits, the walk
            # having passed some of them already. A round ends work-conserving.
            self._walk(rnd, preempt=False, explain=False)
            # A victim that fits on what is still free moves there at once (a migration: Preempt then Launch in
            # one decision) rather than waiting beside idle GPUs for the next round.
            stopped.sort(key=lambda job: self._running_key(job, now_s))
            for job in stopped:
                placement = place_on_free(view, rnd.planner, job.spec, self._strategy(job.spec))
                if placement is not None:
                    rnd.launch(job.spec.job_id, placement)
        if actions or self._demoted:
            self._settle(view, actions)
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
        until, self._protected_until = self._protected_until, None  # (set by _victims during the round)
        if rnd.waiting and until is not None and (wake is None or until < wake):
            wake = until  # a job left waiting may preempt one whose minimum run ends then
        return rnd.decision(wake)

    def _victims(self, view: ClusterView, now_s: float) -> Iterator[tuple[Any, str]]:
        """Running jobs past their minimum run, lowest priority first, as ``(rank, job)`` for :class:`Victims`,
        which reads them only when a waiting job does not fit on free GPUs. Under Gittins a running job's index
        moves with its attained service (the authors' simulator re-sorts every queue at every event): they are
        ranked again first, at once."""
        if self._gittins is not None and self.cfg.gittins_rerank:
            entries = []
            run_entry = self._run_entry
            for job_id in run_entry:
                entry = run_entry[job_id] = (*self._running_key(view.job(job_id), now_s), job_id)
                entries.append(entry)
            self._running = SortedList(entries)
        min_run = self._min_run_s
        for entry in reversed(self._running):
            if min_run > 0:
                # Within its minimum run a job is no victim (§3.2, "PromoteKnob": see the module docstring); the
                # round asks to be woken when the first such run ends, if it leaves a job waiting.
                started = view.job(entry[-1]).last_start_s
                if started is not None and started + min_run > now_s + 1e-9:
                    until = started + min_run
                    if self._protected_until is None or until < self._protected_until:
                        self._protected_until = until
                    continue
            yield entry[:-1], entry[-1]

    def _settle(self, view: ClusterView, actions: list[Action]) -> None:
        """Running-first order after the round: the jobs it starts join their queue's running part in queue
        order, behind the jobs already running there; a job it preempts goes to the front of its queue's waiting
        part (those preempted together keep their order)."""
        if not self._running_first:
            return
        started = [a.job_id for a in actions if isinstance(a, Launch)]
        started.sort(key=lambda job_id: self._key(view.job(job_id), _WAITING, self._pos[job_id]))
        for job_id in started:
            self._run_next += 1
            self._run_pos[job_id] = self._run_next
        stopped = [a.job_id for a in actions if isinstance(a, Preempt) and a.job_id in self._run_pos]
        stopped.sort(key=lambda job_id: self._run_pos[job_id], reverse=True)
        for job_id in stopped:
            self._front -= 1
            self._pos[job_id] = self._front
        self._settle_demoted({a.job_id for a in actions if isinstance(a, Preempt)})

    def _settle_demoted(self, preempted: Collection[str] = ()) -> None:
        """Jobs demoted at this round's instant that keep running join the running part of their new queue,
        behind the jobs that started in the round (they were behind them in the queue)."""
        if not self._demoted or not self._running_first:
            self._demoted.clear()
            return
        for job_id in sorted(self._demoted, key=self._pos.__getitem__):
            if job_id in preempted:
                continue
            self._run_next += 1
            self._run_pos[job_id] = self._run_next
            entry = self._run_entry.get(job_id)
            if entry is not None:
                self._running.remove(entry)
                new = (*entry[:-3], _RUNNING, self._run_next, job_id)
                self._run_entry[job_id] = new
                self._running.add(new)
        self._demoted.clear()

    def _strategy(self, spec: JobSpec) -> PlacementStrategy:
        return PlacementStrategy.STRICT if self._sensitive(spec) else PlacementStrategy.CONSOLIDATED

    def _walk(self, rnd: Round, *, preempt: bool = True, explain: bool = True) -> None:
        """One walk of the waiting jobs in priority order, as the authors' simulator walks its queues: each job
        starts on free GPUs if it fits (Tiresias is work-conserving), else, with ``preempt``, by preempting
        running jobs of lower priority (lower queues, and in its own queue those behind it), lowest first, until
        it fits (§3.2). So a waiting job of higher priority gets GPUs before a lower one takes the free ones.
        With ``explain``, each job examined and left waiting gets its reason; jobs the round acted on already are
        passed over."""
        view, planner, now_s, skip = rnd.view, rnd.planner, rnd.now_s, rnd.busy
        waiting = rnd.waiting if explain else {}
        victims: Victims | None = None
        if preempt and self.cfg.preempt and self._running:
            victims = Victims(view, self._victims(view, now_s))
        walk = PendingWalk(view)
        strict_blocks = StrictBlocks(view)
        for shape, job in walk:
            if victims is None and planner.total_free() == 0 and not planner.has_partial():
                break
            spec = job.spec
            job_id = spec.job_id
            if job_id in skip:
                continue
            strategy = self._strategy(spec)
            strict = strategy is PlacementStrategy.STRICT and shape.whole
            types = allowed_types(view, spec)
            if strict and strict_blocks.blocked(shape, types):
                waiting[job_id] = fit_reason(planner, spec, types, strategy)
                continue
            quota_ok = planner.quota_allows(spec)
            if quota_ok and (not shape.whole or any(planner.type_free(t) >= spec.num_gpus for t in types)):
                placement = place(planner, spec, strategy, types)
                if placement is not None:
                    rnd.launch(job_id, placement)
                    continue
            if victims is not None:
                key = self._key(job, _WAITING, self._pos[job_id], now_s)
                if self._gittins is not None and not self.cfg.gittins_rerank:
                    # Indices taken at different times do not compare: only lower queues are preempted, or a
                    # waiting job and the one it preempted would take the GPUs back from each other, each time
                    # paying a restore (a 41,000-job Philly VC went from 18,000 preemptions to millions).
                    key = (key[0], math.inf)
                lowest = victims.first_rank()
                if lowest is None or lowest <= key:
                    victims = None  # in priority order: nobody later outranks a running job either
                elif not shape.whole or planner.total_free() + sum(self._queue_gpus[key[0] :]) >= spec.num_gpus:
                    # (Else even preempting every job of its queue and the lower ones would not free enough.) A
                    # job its tenant's quota holds back may still preempt the tenant's own lower-priority jobs:
                    # that frees the quota as well as the GPUs (Victims.place checks both).
                    found = victims.place(planner, spec, strategy, key)
                    if found is not None:
                        placement, preempted = found
                        for victim in preempted:  # released in the planner by Victims.place
                            rnd.preempt(victim, f"tiresias: {job_id} has priority", release=False)
                        rnd.launch(job_id, placement)
                        continue
            waiting[job_id] = blocked_reason(planner, spec, types, strategy)
            # Later jobs of this shape have no more priority and no more room: skip them (sensitive jobs only
            # block sensitive ones needing as many nodes, as others may still fit where they did not).
            if not quota_ok:
                walk.block(shape, quota=True)
            elif strict:
                strict_blocks.block(shape, types)
            else:
                walk.block(shape)
