"""Baseline policies: FIFO, YARN-CS, SJF and SRTF, each with a choice of placement, all strict gang schedulers.

- ``fifo``: first come, first served. By default a job that does not fit blocks those behind it (head-of-line
  blocking, as a plain FIFO queue does); ``backfill=true`` lets smaller jobs behind it start.
- ``yarn-cs``: FIFO with strict consolidation (a gang waits for the fewest nodes its size allows), the
  baseline Tiresias (NSDI'19 §6) measures itself against.
- ``sjf``: shortest job first, by the job's duration from the trace (an oracle no real scheduler has),
  non-preemptive. A reference point for what knowing durations buys.
- ``srtf``: shortest remaining time first, with the same oracle, preemptive: a pending job preempts running jobs
  with more remaining time when that frees enough GPUs for it. Tiresias (NSDI'19 §6) uses it as the
  perfect-knowledge bound that its 2D-Gittins scheduler is measured against.

SJF and SRTF backfill by default: they are meant as bounds on average JCT, and letting a job that fits start is
what such a bound assumes. Gang: a job gets all its GPUs at once or waits (no partial starts).

With ``placement=fgd`` each policy keeps a :class:`~corral.policies.framework.placement.fgd.FragmentationScorer` for the
run and feeds it every submitted job, so single-GPU requests go where they fragment the cluster least for the
workload seen so far (Weng et al., ATC'23).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mypy_extensions import mypyc_attr
from sortedcontainers import SortedList

from corral.core.decisions import Decision, Preempt
from corral.core.job import JobPhase, JobSpec, JobView
from corral.core.options import option
from corral.core.placement import Placement
from corral.policies.framework.contract import BasePolicy, PolicyConfig, allowed_types, capacity_reason
from corral.policies.framework.placement import PlacementStrategy, place
from corral.policies.framework.placement.fgd import FragmentationScorer
from corral.policies.framework.preemption import Victims, place_on_free
from corral.policies.framework.queues import PendingWalk, StrictBlocks
from corral.policies.framework.reasons import blocked_reason, fit_reason, quota_reason
from corral.policies.framework.round import Round
from corral.policies.framework.view import ClusterView

# Every class here allows interpreted subclasses (mypyc_attr): a user's policy may extend a baseline one.
PLACEMENT_HELP = (
    "where a job's GPUs go: consolidated (fewest nodes, best fit), strict (fewest possible nodes or wait), "
    "spread (one per node), first-fit, fgd (single-GPU requests where they fragment the cluster least)"
)


def fill(
    rnd: Round,
    strategy: PlacementStrategy,
    *,
    backfill: bool,
    scorer: FragmentationScorer | None = None,
    explain: bool = True,
) -> None:
    """Walk the pending queue in order and launch (in ``rnd``) every job that fits, stopping at the first that does
    not unless ``backfill``. With backfilling, a job that does not fit prunes every pending job that cannot fit
    either (see :mod:`corral.policies.framework.queues`), and the walk ends as soon as nothing at all is free.
    ``scorer`` is for ``strategy`` fgd (see :func:`corral.policies.framework.placement.place`). Jobs the round has
    acted on already are passed over (the view still lists them as waiting). With ``explain``, each job the walk
    examined and left waiting gets its reason (see :mod:`corral.policies.framework.reasons`); a second walk in a
    round leaves the first's reasons alone.
    """
    view, planner, busy = rnd.view, rnd.planner, rnd.busy
    why: dict[str, str] = rnd.waiting if explain else {}
    walk = PendingWalk(view)
    strict = StrictBlocks(view) if strategy is PlacementStrategy.STRICT else None
    for shape, job in walk:
        spec = job.spec
        if spec.job_id in busy:
            continue
        types = allowed_types(view, spec)
        if planner.total_free() == 0 and (shape.whole or not planner.has_partial()):
            why[spec.job_id] = blocked_reason(planner, spec, types, strategy)
            if not backfill or not planner.has_partial():
                break
            walk.block(shape)
            continue
        if not planner.quota_allows(spec):
            why[spec.job_id] = quota_reason(planner, spec)
            walk.block(shape, quota=True)
        else:
            if strict is not None and shape.whole and strict.blocked(shape, types):
                why[spec.job_id] = fit_reason(planner, spec, types, strategy)
                if not backfill:
                    break
                continue
            placement = place(planner, spec, strategy, types, scorer)
            if placement is not None:
                rnd.launch(spec.job_id, placement)
                continue
            why[spec.job_id] = fit_reason(planner, spec, types, strategy)
            if strict is not None and shape.whole and any(planner.type_free(t) >= spec.num_gpus for t in types):
                strict.block(shape, types)  # enough GPUs free, on too many nodes: a larger job may still fit
            else:
                walk.block(shape)
        if not backfill:
            break


def fgd_scorer(strategy: PlacementStrategy) -> FragmentationScorer | None:
    """A scorer for a run placing with ``strategy``: one for fgd, none otherwise."""
    return FragmentationScorer() if strategy is PlacementStrategy.FRAGMENTATION else None


def observe_submission(scorer: FragmentationScorer | None, job: JobView) -> None:
    """Count a newly submitted job's shape. Done from ``on_job_changed`` rather than ``admit``: the engine calls
    it on submission with the job pending and never started (a state no later change returns to: a preempted
    job has a start), and it is the hook meant for a policy's own indexes, while ``admit`` is a question that
    SJF and SRTF answer with overrides of their own. A job rejected right after still counts: its shape then
    fits nowhere, which moves every candidate's score alike (see :mod:`corral.policies.framework.placement.fgd`)."""
    if scorer is not None and job.phase is JobPhase.PENDING and job.last_start_s is None:
        scorer.observe(job.spec)


@mypyc_attr(allow_interpreted_subclasses=True)
@dataclass(frozen=True, slots=True)
class QueueConfig(PolicyConfig):
    placement: PlacementStrategy = option(PlacementStrategy.CONSOLIDATED, PLACEMENT_HELP)
    backfill: bool = option(False, "let jobs behind a job that does not fit start if they fit")


@mypyc_attr(allow_interpreted_subclasses=True)
class QueuePolicy(BasePolicy):
    """A non-preemptive queue: walk it in :meth:`queue_key` order and launch what fits (see :func:`fill`)."""

    Config = QueueConfig

    def __init__(self, config: PolicyConfig | None = None, *, seed: int = 0) -> None:
        super().__init__(config, seed=seed)
        assert isinstance(self.config, QueueConfig)
        self.scorer = fgd_scorer(self.config.placement)

    def on_job_changed(self, job: JobView, before: Placement | None, now_s: float) -> None:
        observe_submission(self.scorer, job)

    def schedule(self, view: ClusterView, now_s: float) -> Decision:
        cfg = self.config
        assert isinstance(cfg, QueueConfig)
        if not view.num_pending:
            return Decision.NOTHING
        rnd = Round(view, now_s)
        fill(rnd, cfg.placement, backfill=cfg.backfill, scorer=self.scorer)
        return rnd.decision()


@mypyc_attr(allow_interpreted_subclasses=True)
@dataclass(frozen=True, slots=True)
class FifoConfig(QueueConfig):
    """FIFO's options: those of every queue policy, with head-of-line blocking by default."""


@mypyc_attr(allow_interpreted_subclasses=True)
class FifoPolicy(QueuePolicy):
    name = "fifo"
    summary = "first come, first served; strict gang; optional backfilling"
    Config = FifoConfig


@mypyc_attr(allow_interpreted_subclasses=True)
@dataclass(frozen=True, slots=True)
class YarnCsConfig(QueueConfig):
    placement: PlacementStrategy = option(PlacementStrategy.STRICT, PLACEMENT_HELP)


@mypyc_attr(allow_interpreted_subclasses=True)
class YarnCsPolicy(QueuePolicy):
    """YARN's capacity scheduler as Tiresias (NSDI'19 §6) compares against it: FIFO, each gang strictly
    consolidated (it waits for the fewest nodes its size allows), no preemption, head-of-line blocking."""

    name = "yarn-cs"
    summary = "YARN capacity scheduler: FIFO, strict consolidation, no preemption (Tiresias' baseline)"
    Config = YarnCsConfig


def _oracle_reason(view: ClusterView, spec: JobSpec, policy: str) -> str | None:
    if spec.duration_s is None:
        return f"{policy} needs job durations (an oracle), and this job has none"
    return capacity_reason(view, spec)


@mypyc_attr(allow_interpreted_subclasses=True)
@dataclass(frozen=True, slots=True)
class SjfConfig(QueueConfig):
    backfill: bool = option(True, "let jobs behind a job that does not fit start if they fit")


@mypyc_attr(allow_interpreted_subclasses=True)
class SjfPolicy(QueuePolicy):
    name = "sjf"
    needs_durations = True
    summary = "shortest job first by trace duration (oracle); non-preemptive"
    Config = SjfConfig

    def queue_key(self, job: JobView) -> tuple[Any, ...]:
        # A job without a duration is rejected on admission, but it enters the queue first: its key must still
        # compare with the others' (None < float would raise).
        d = job.spec.duration_s
        return (float("inf") if d is None else d, job.spec.submit_s)

    def admit(self, view: ClusterView, spec: JobSpec) -> str | None:
        return _oracle_reason(view, spec, self.name)


@mypyc_attr(allow_interpreted_subclasses=True)
@dataclass(frozen=True, slots=True)
class SrtfConfig(SjfConfig):
    preempt: bool = option(True, "preempt running jobs with more remaining time for a waiting job")


def _remaining(job: JobView) -> float:
    return max(0.0, (job.spec.duration_s or 0.0) - job.work_done_s)


@mypyc_attr(allow_interpreted_subclasses=True)
class SrtfPolicy(BasePolicy):
    name = "srtf"
    needs_durations = True
    summary = "shortest remaining time first by trace duration (oracle); preemptive"
    Config = SrtfConfig

    def __init__(self, config: PolicyConfig | None = None, *, seed: int = 0) -> None:
        super().__init__(config, seed=seed)
        # Running jobs by nominal end = start + remaining work at start. Treating every running job's remaining
        # time as falling at one second per second keeps this order stable while jobs run (no re-sorting), at the
        # price of misjudging jobs on faster or slower GPUs, spread placements or during a restore: the policy
        # does not see the performance model, as a live scheduler would not. Exact at preemption time, since
        # the executor reports true progress then.
        self._by_end: SortedList = SortedList()
        self._entry: dict[str, tuple[float, str]] = {}
        assert isinstance(self.config, SrtfConfig)
        self.scorer = fgd_scorer(self.config.placement)

    def queue_key(self, job: JobView) -> tuple[Any, ...]:
        return (_remaining(job), job.spec.submit_s)

    def admit(self, view: ClusterView, spec: JobSpec) -> str | None:
        return _oracle_reason(view, spec, self.name)

    def on_job_changed(self, job: JobView, before: Placement | None, now_s: float) -> None:
        observe_submission(self.scorer, job)
        job_id = job.spec.job_id
        old = self._entry.pop(job_id, None)
        if old is not None:
            self._by_end.remove(old)
        if job.phase is JobPhase.RUNNING:
            entry = (now_s + _remaining(job), job_id)
            self._entry[job_id] = entry
            self._by_end.add(entry)

    def schedule(self, view: ClusterView, now_s: float) -> Decision:
        cfg = self.config
        assert isinstance(cfg, SrtfConfig)
        if not view.num_pending:
            return Decision.NOTHING
        rnd = Round(view, now_s)
        fill(rnd, cfg.placement, backfill=cfg.backfill, scorer=self.scorer)
        if cfg.preempt and self._by_end and len(rnd.actions) < view.num_pending:
            first = len(rnd.actions)
            # Placing by preemption (preemption.Victims.place) takes no scorer: under fgd it places without
            # workload knowledge, which is best fit (see placement.place).
            self._preemptions(rnd, cfg.placement)
            if len(rnd.actions) > first:
                # A victim frees all its GPUs, and its job may not take them all: the rest goes to a waiting job
                # that fits (the first fill passed it over when they were taken). A round ends work-conserving.
                fill(rnd, cfg.placement, backfill=cfg.backfill, scorer=self.scorer, explain=False)
                # A victim that fits on what is still free moves there at once (a migration) rather than waiting
                # beside idle GPUs for the next round; the shortest first.
                stopped = [view.job(a.job_id) for a in rnd.actions[first:] if isinstance(a, Preempt)]
                stopped.sort(key=lambda job: (_remaining(job), job.spec.submit_s))
                for job in stopped:
                    placement = place_on_free(view, rnd.planner, job.spec, cfg.placement)
                    if placement is not None:
                        rnd.launch(job.spec.job_id, placement)
        return rnd.decision()

    def _preemptions(self, rnd: Round, strategy: PlacementStrategy) -> None:
        """For each waiting job, shortest first: free GPUs by preempting the running jobs with the most remaining
        time (only those with strictly more than the waiting job), until it fits."""
        view, planner, now_s = rnd.view, rnd.planner, rnd.now_s
        # Running jobs latest nominal end first: a waiting job may preempt those ending after it would.
        victims = Victims(view, ((end, job_id) for end, job_id in reversed(self._by_end)))
        longest = self._by_end[-1][0] - now_s
        walk = PendingWalk(view)
        for shape, job in walk:
            if job.spec.job_id in rnd.busy:
                continue
            remaining = _remaining(job)
            if remaining >= longest:
                break  # queue order is by remaining time: no later job can preempt anyone either
            spec = job.spec
            # Held back by its tenant's quota, it may still preempt the tenant's own longer jobs (Victims.place
            # frees quota as well as GPUs).
            over_quota = not planner.quota_allows(spec)
            found = victims.place(planner, spec, strategy, now_s + remaining)
            if found is None:
                # Later jobs of this shape (of this tenant, when its quota held it back) have at least as much
                # remaining time, so fewer victims: skip them.
                walk.block(shape, quota=over_quota)
                continue
            placement, preempted = found
            for victim in preempted:  # released in the planner by Victims.place
                rnd.preempt(victim, f"srtf: {spec.job_id} has less remaining time", release=False)
            rnd.launch(spec.job_id, placement)
