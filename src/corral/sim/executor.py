"""The simulated executor: carries decisions out in virtual time, through the performance model.

On launch it predicts the job's completion (a start-up cost if it is a restart, then remaining work at the
placement's rate) and schedules a ``JobFinished`` event tagged with the launch's epoch. On preemption it works
out how much the job progressed and returns it; the stale completion event is ignored by the engine.

Start-up cost of a restart: ``suspend_resume_s`` when the job was suspended (``Preempt(suspend=True)``) and comes
back on the same set of nodes, whose host memory holds its state; ``restore_s`` otherwise (a checkpoint restore,
as after a migration, including an ``Upgrade`` that moves a job to other GPUs).

Sharing (:mod:`corral.sim.sharing`): jobs that share a GPU slow each other when they *interact*: an
opportunistic job interacts with every job on its GPUs, and two packed jobs (whole-GPU jobs launched at a share
below 1000) interact with each other. Jobs at their own allocated share (whole GPUs, openb's fractions) do not
slow each other: a fractional job's trace duration was measured while it shared. Whenever a job starts, stops,
finishes or is resized, every job it interacts with is re-rated: its progress so far is settled at the old rate
and its completion re-predicted at the new one. The superseded ``JobFinished`` stays in the event queue;
:meth:`SimExecutor.is_current` tells the engine to ignore it. Each new rate is reported to the engine
(``EventSink.observe_rate``) as the job's speed relative to running alone, and, when the policy reads telemetry,
a :class:`~corral.core.telemetry.Telemetry` record made from the model (``EventSink.report``).

Progress: a run's progress is ``done_s`` at ``start_s`` plus the time since times its rate, and it is settled
(``done_s`` brought up to now, ``start_s`` moved to now) only when its rate changes or the run ends, never at an
event that leaves its speed as it was (a demand change of a job alone, or packed at table rates; a forced
re-rate to the same speed). Each stretch of constant speed is thus one product, so the sums, and every
completion predicted from them, depend only on when the speed changed, not on which other events happened in
between: ``dt1 * r + dt2 * r`` and ``(dt1 + dt2) * r`` differ in the last bits, and a demand change comes at a
time drawn from the perf model's ``seed``, so settling there made ``--perf seed`` move the completions, hence the
schedules, of policies that use none of the seeded draws (issue 15). For the same reason an unchanged prediction
keeps the ``JobFinished`` already queued rather than queue an equal one behind the events due at that instant.

Batch size: a run trains at ``job.batch_size`` (``SetBatchSize``; ``None`` = its model's reference). Its rate is
the performance model's rate times its goodput ratio at that batch size (:meth:`BoundPerfModel.batch_rate`), and
its profile and pair interference are those at that batch size (:mod:`corral.sim.sharing`). A change while it
runs (:meth:`SimExecutor.batch_size_changed`) settles its progress at the old rate, then re-rates it and every job
it interacts with, like a resize. Progress stays in reference-batch seconds, the unit of ``duration_s``.

Node loss (:class:`~corral.engine.executor.NodeLossExecutor`): a run on a lost node is settled and dropped like a
preemption, but the job keeps only the progress of its last checkpoint (:meth:`PerfModel.last_checkpoint`: the
progress it launched from, or the last multiple of ``checkpoint_interval_s`` it reached). The explicit checkpoint a
run starts from is its progress at launch, except for a job resumed from a suspend on the same node(s), whose
state came from host memory, not a checkpoint: it keeps the checkpoint of the run it was suspended from. A job
suspended to the lost node's host memory restarts from that checkpoint too. ``lost_work_gpu_s`` adds up the work
lost (seconds of progress x GPUs, shares counted).

Measured use, for every policy: each GPU's SM use (its jobs' SM busy fractions times their current speed, at
most 1) and memory in use (their mean footprint over a mini-batch, within their caps) are kept as sums over the
cluster and integrated over time, with change points for plots. Per job, the executor adds up the seconds it ran
(``run_s``, after any start-up cost) and the seconds the same progress would have taken alone on the same GPUs
(``solo_s``): ``run_s / solo_s`` is its slowdown from sharing. It also adds up the progress each job made on
GPUs of each speed (:meth:`BoundPerfModel.speed`), from which :meth:`SimExecutor.job_speeds` gives the speed a
job's time alone runs at in its finish-time fairness (:mod:`corral.sim.metrics`).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable

from corral.core.cluster import Topology
from corral.core.errors import InvariantViolation
from corral.core.events import DemandChanged, JobFinished
from corral.core.job import FULL_GPU_MILLI, JobSpec
from corral.core.placement import Placement
from corral.core.status import JobStatus
from corral.core.telemetry import Telemetry
from corral.engine.executor import EventSink
from corral.sim.perf import PerfModel
from corral.sim.sharing import Profile, activity, demand_change, guest_rate, pair_slowdown, scaled, spill_rate

_PAUSED_STEP_FACTOR = 1e6  # a paused job's reported step time: its solo time x this (telemetry needs a number)


class _Run:
    """One run of a job: progress is ``done_s`` at ``start_s`` and grows at ``base_rate * factor`` after it."""

    __slots__ = (
        "activity",
        "base_rate",
        "batch",
        "checkpoint_s",
        "demand",
        "demand_event",
        "demand_event_s",
        "done_s",
        "epoch",
        "event",
        "event_s",
        "factor",
        "opportunistic",
        "packed",
        "placement",
        "profile",
        "run_s",
        "seg_done_s",
        "solo_s",
        "spec",
        "spill",
        "start_s",
        "switch",
    )

    def __init__(
        self, spec: JobSpec, placement: Placement, epoch: int, start_s: float, done_s: float, rate: float, p: Profile
    ):
        self.spec = spec
        self.epoch = epoch
        self.start_s = start_s
        self.done_s = done_s
        self.base_rate = rate
        self.factor = 1.0
        self.event: JobFinished | None = None
        self.event_s = 0.0  # when ``event`` is due (meaningless while it is None)
        self.profile = p
        self.run_s = 0.0
        self.solo_s = 0.0
        self.placement = placement
        self.opportunistic = False
        self.packed = False
        self.activity = 1.0
        self.spill = 1.0
        self.switch: tuple[float, float] | None = None  # (work done at which demand changes, factor)
        self.demand_event: DemandChanged | None = None
        self.demand_event_s = 0.0  # when ``demand_event`` is due
        self.batch: int | None = None  # batch size it trains at (None: its model's reference)
        self.demand = 1.0  # the demand change applied to its profile so far (1.0: none yet)
        self.checkpoint_s = done_s  # progress of the last explicit checkpoint (the one it started from)
        self.seg_done_s = done_s  # progress when it last took its GPUs (a migration moves it to others)

    def seat(self, placement: Placement, spill_penalty: float) -> None:
        """Take ``placement``'s share and caps into account (its own throttles; partners are the executor's)."""
        self.placement = placement
        self.opportunistic = placement.opportunistic
        self.packed = not placement.opportunistic and placement.gpu_milli < self.spec.gpu_milli
        if placement.opportunistic:
            self.activity = activity(self.profile, placement.gpu_milli)
            self.spill = spill_rate(self.profile.mem_need_mib, placement.mem_mib, spill_penalty)
        else:
            self.activity = self.spill = 1.0

    def settle(self, now_s: float) -> None:
        """Count the progress made up to ``now_s`` (nothing while the start-up cost is still being paid).

        Called only where the run's rate is about to change or the run ends (see "Progress" in the module
        docstring): a settle at a time when nothing changes would split a constant-rate stretch in two, and
        ``dt1 * r + dt2 * r`` is not ``(dt1 + dt2) * r`` in floating point."""
        if now_s > self.start_s:
            dt = now_s - self.start_s
            self.done_s += dt * self.base_rate * self.factor
            self.run_s += dt
            self.solo_s += dt * self.factor
            self.start_s = now_s

    def interacts(self, other: _Run) -> bool:
        return self.opportunistic or other.opportunistic or (self.packed and other.packed)

    def mem_used_mib(self) -> int:
        peak = self.profile.mem_need_mib
        cap = self.placement.mem_mib
        if self.opportunistic and cap is not None:
            peak = min(peak, cap)
        return peak


class SimExecutor:
    __slots__ = (
        "_area_mem",
        "_area_sm",
        "_gpu_mem",
        "_gpu_sm",
        "_jobs_on",
        "_last_s",
        "_mem_sum",
        "_pairs",
        "_runs",
        "_sink",
        "_sm_sum",
        "_suspended_checkpoint",
        "_timeline",
        "job_times",
        "job_work_by_speed",
        "lost_work_gpu_s",
        "perf",
        "telemetry",
        "timeline_mem_mib",
        "timeline_s",
        "timeline_sm",
    )

    def __init__(
        self, topology: Topology, perf: PerfModel | None = None, *, telemetry: bool = False, timeline: bool = True
    ) -> None:
        self.perf = (perf or PerfModel()).bind(topology)
        self.telemetry = telemetry
        self._sink: EventSink | None = None
        self._runs: dict[str, _Run] = {}
        # Per GPU (lists indexed by GPU: a dictionary's lookups were 2% of a replay in _measure alone, issue 20): the
        # running jobs on it (None when it has none), and its measured SM use and memory in use.
        num_gpus = self.perf.topo.num_gpus
        self._jobs_on: list[dict[str, None] | None] = [None] * num_gpus
        # (a, b, GPU type, packed pair?) -> full-activity rates; a job's entries go when it stops.
        self._pairs: dict[tuple[str, str, int, bool], tuple[float, float]] = {}
        # Measured use: per GPU (0.0 where none), the cluster sums, their integrals and change points.
        self._gpu_sm: list[float] = [0.0] * num_gpus
        self._gpu_mem: list[float] = [0.0] * num_gpus
        self._sm_sum = 0.0
        self._mem_sum = 0.0
        self._area_sm = 0.0  # GPU-busy fraction x s, summed over GPUs
        self._area_mem = 0.0  # MiB x s
        self._last_s: float | None = None
        # The change points, for plots, kept only with ``timeline`` (24 bytes per change, three per job).
        self._timeline = timeline
        self.timeline_s: array[float] = array("d")
        self.timeline_sm: array[float] = array("d")  # SM-busy GPUs (sum of fractions) from each change on
        self.timeline_mem_mib: array[float] = array("d")
        self.job_times: dict[str, list[float]] = {}  # job -> [run_s, solo_s] over all its runs
        # job -> {GPU speed: progress made there}, for the jobs that made progress off speed 1.0 (the rest: 1.0)
        self.job_work_by_speed: dict[str, dict[float, float]] = {}
        # Suspended jobs: the explicit checkpoint of the run they were suspended from (see the module docstring).
        self._suspended_checkpoint: dict[str, float] = {}
        self.lost_work_gpu_s = 0.0  # work lost to node losses, progress seconds x GPUs

    def bind(self, sink: EventSink) -> None:
        self._sink = sink

    # -- Executor ---------------------------------------------------------------------------------------------
    def launch(self, job: JobStatus, now_s: float) -> None:
        spec = job.spec
        placement = job.placement
        if spec.duration_s is None or placement is None or self._sink is None:
            raise InvariantViolation(f"cannot simulate job {spec.job_id!r} without a duration and a placement")
        start = now_s + self._startup_s(job, placement) if job.preemptions else now_s  # 0 s: a first start
        checkpoint = job.work_done_s
        if job.suspended_from is not None:
            kept = self._suspended_checkpoint.pop(spec.job_id, None)
            if kept is not None and self._same_nodes(job.suspended_from, placement):
                checkpoint = kept  # resumed from host memory: its last checkpoint is the suspended run's
        batch = job.batch_size
        gpu = placement.gpus[0]
        profile = self.perf.profile(spec, gpu, batch)
        model = self.perf.model
        change = demand_change(spec.job_id, model.seed, model.demand_variation)
        switch = None
        demand = 1.0
        if change is not None:
            at = change[0] * spec.duration_s
            if job.work_done_s >= at:  # changed in an earlier run
                demand = change[1]
                profile = scaled(profile, demand, self.perf.topo.gpu_mem_mib[gpu])
            else:
                switch = (at, change[1])
        rate = self.perf.rate(spec, placement)
        if batch is not None:
            rate *= self.perf.batch_rate(spec, gpu, batch)
        run = _Run(spec, placement, job.run_epoch, start, job.work_done_s, rate, profile)
        run.switch = switch
        run.batch = batch
        run.demand = demand
        run.checkpoint_s = checkpoint
        run.seat(placement, model.spill_penalty)
        self._runs[spec.job_id] = run
        self._enter(run, now_s)

    def _startup_s(self, job: JobStatus, placement: Placement) -> float:
        if not job.preemptions:
            return 0.0
        model = self.perf.model
        held = job.suspended_from
        if held is not None and self._same_nodes(held, placement):
            return model.suspend_resume_s
        return model.restore_s

    def _same_nodes(self, a: Placement, b: Placement) -> bool:
        node = self.perf.topo.gpu_node
        return {node[g] for g in a.gpus} == {node[g] for g in b.gpus}

    def preempt(self, job: JobStatus, now_s: float, *, suspend: bool = False) -> float:
        run = self._runs.pop(job.spec.job_id)
        run.settle(now_s)
        self._leave(run, now_s)
        if suspend:
            self._suspended_checkpoint[job.spec.job_id] = run.checkpoint_s
        duration = job.spec.duration_s
        return run.done_s if duration is None else min(run.done_s, duration)

    # -- NodeLossExecutor -------------------------------------------------------------------------------------
    def run_lost(self, job: JobStatus, now_s: float, node: str) -> float:
        """The run ends without a checkpoint (its node is gone): settle it, drop it, and return the progress of its
        last checkpoint, counting the rest as lost."""
        checkpoint = self._runs[job.spec.job_id].checkpoint_s
        done = self.preempt(job, now_s)
        return self._lose(job, done, checkpoint)

    def suspended_lost(self, job: JobStatus, now_s: float, node: str) -> float:
        """The host-memory state of suspended ``job`` is gone: it restarts from its last checkpoint."""
        checkpoint = self._suspended_checkpoint.pop(job.spec.job_id, job.work_done_s)
        return self._lose(job, job.work_done_s, checkpoint)

    def _lose(self, job: JobStatus, done_s: float, checkpoint_s: float) -> float:
        kept = self.perf.model.last_checkpoint(checkpoint_s, done_s)
        self.lost_work_gpu_s += (done_s - kept) * job.spec.gpu_demand_milli / FULL_GPU_MILLI
        return kept

    def resized(self, job: JobStatus, now_s: float, before: Placement) -> None:
        run = self._runs[job.spec.job_id]
        after = job.placement
        assert after is not None
        if set(after.gpus) != set(before.gpus):  # an upgrade onto other GPUs: a migration
            run.settle(now_s)
            self._leave(run, now_s, keep_times=True)
            run.start_s = now_s + self.perf.model.restore_s
            rate = self.perf.rate(run.spec, after)
            if run.batch is not None:
                rate *= self.perf.batch_rate(run.spec, after.gpus[0], run.batch)
            run.base_rate = rate
            # The profile is rebuilt unscaled (a demand change already passed is not re-applied here, as before
            # batch sizes existed), so the run's applied demand is reset with it.
            run.profile = self.perf.profile(run.spec, after.gpus[0], run.batch)
            run.demand = 1.0
            run.seat(after, self.perf.model.spill_penalty)
            self._enter(run, now_s)
            return
        # Same GPUs, same base rate: only the throttles may change, and _rerate settles the run if its speed does.
        before_partners = self._partners(run)
        run.seat(after, self.perf.model.spill_penalty)
        now_partners = self._partners(run)
        left = [j for j in before_partners if j not in now_partners]  # no longer slowed by it: they speed up
        self._rerate([run.spec.job_id, *left], now_s, force=True)
        self._rerate(now_partners, now_s)

    def batch_size_changed(self, job: JobStatus, now_s: float, before: int | None) -> None:
        """``job`` trains at ``job.batch_size`` from now on: settle it if its rate changes, then re-rate it (goodput,
        profile, pair interference at the new size) and the jobs it interacts with."""
        run = self._runs[job.spec.job_id]
        batch = job.batch_size
        run.batch = batch
        spec = run.spec
        gpu = run.placement.gpus[0]
        rate = self.perf.rate(spec, run.placement)
        if batch is not None:
            rate *= self.perf.batch_rate(spec, gpu, batch)
        if rate != run.base_rate:
            run.settle(now_s)  # at the old rate (a change of factor is settled by _rerate the same way)
            run.base_rate = rate
        profile = self.perf.profile(spec, gpu, batch)
        if run.demand != 1.0:
            profile = scaled(profile, run.demand, self.perf.topo.gpu_mem_mib[gpu])
        run.profile = profile
        run.seat(run.placement, self.perf.model.spill_penalty)
        partners = self._partners(run)
        self._forget_pairs(run, partners)  # pair rates depend on the batch sizes
        self._rerate([spec.job_id], now_s, force=True)
        self._rerate(partners, now_s)

    def finished(self, job: JobStatus, now_s: float) -> None:
        self._suspended_checkpoint.pop(job.spec.job_id, None)
        run = self._runs.pop(job.spec.job_id, None)
        if run is not None:
            run.settle(now_s)
            self._leave(run, now_s)

    def cancel(self, job: JobStatus, now_s: float) -> None:
        self.finished(job, now_s)  # a replay never cancels; an embedding that does just drops the run

    def demand_changed(self, job: JobStatus, now_s: float) -> None:
        run = self._runs[job.spec.job_id]
        assert run.switch is not None
        # Not settled here: the change comes at a seeded time, and its speed often stays the same (alone, or
        # packed at table rates); _rerate settles it if its speed does change.
        factor = run.switch[1]
        run.switch = None
        run.demand_event = None
        run.demand = factor
        run.profile = scaled(run.profile, factor, self.perf.topo.gpu_mem_mib[run.placement.gpus[0]])
        if run.opportunistic:
            # Its share cap's bite and its memory spill depend on its profile; a guaranteed run's seat does not
            # (activity and spill 1.0, packed by its share), so it is not re-seated (issue 20: every job of every
            # replay has one demand change).
            run.seat(run.placement, self.perf.model.spill_penalty)
        partners = self._partners(run)
        if not partners and not run.opportunistic:
            # Alone and unthrottled its speed does not change: only its measured use and telemetry do.
            self._measure(run.placement.gpus, now_s)
            if self.telemetry:
                self._report(run, now_s)
            return
        self._forget_pairs(run, partners)  # modelled pair rates depend on the profiles
        self._rerate([run.spec.job_id], now_s, force=True)
        self._rerate(partners, now_s)

    def _forget_pairs(self, run: _Run, partners: list[str]) -> None:
        job_id = run.spec.job_id
        types = {self.perf.topo.gpu_type[g] for g in run.placement.gpus}
        for other in partners:
            a, b = (job_id, other) if job_id <= other else (other, job_id)
            for t in types:
                self._pairs.pop((a, b, t, True), None)
                self._pairs.pop((a, b, t, False), None)

    def is_current(self, event: JobFinished | DemandChanged) -> bool:
        run = self._runs.get(event.job_id)
        if run is None:
            return False
        return run.event is event if type(event) is JobFinished else run.demand_event is event

    # -- measured use -----------------------------------------------------------------------------------------
    def job_speeds(self) -> dict[str, float]:
        """Per job that made progress off speed 1.0, the GPU speed it made it at: its GPU type's speed, or, for a
        job that ran on types of several speeds, their harmonic mean weighted by the progress made on each (so
        that duration / speed is the sum over types of progress / speed: the time its work takes alone on the GPUs
        it got). A job not listed ran at speed 1.0."""
        speeds = {}
        for job_id, works in self.job_work_by_speed.items():
            if len(works) == 1:
                speeds[job_id] = next(iter(works))  # exact: no rounding for the common case of one type
            else:
                # Float starts: mypyc (setup.py) types sum()'s int start as the result's type. Same sums either way.
                speeds[job_id] = sum(works.values(), 0.0) / sum((w / v for v, w in works.items()), 0.0)
        return speeds

    def usage_areas(self, until_s: float) -> tuple[float, float]:
        """``(SM-busy GPU x s, memory-in-use MiB x s)`` integrated over the cluster up to ``until_s``."""
        last = self._last_s
        extra = 0.0 if last is None else max(0.0, until_s - last)
        return self._area_sm + self._sm_sum * extra, self._area_mem + self._mem_sum * extra

    # -- internals --------------------------------------------------------------------------------------------
    def _enter(self, run: _Run, now_s: float) -> None:
        """``run`` starts holding its GPUs: rate it, predict it, re-rate the jobs it interacts with."""
        job_id = run.spec.job_id
        jobs_on = self._jobs_on
        gpus = run.placement.gpus
        alone = True
        for g in gpus:
            on = jobs_on[g]
            if on is None:  # _leave drops a GPU's jobs with its last one: a GPU's jobs are never an empty dict
                jobs_on[g] = {job_id: None}
            else:
                on[job_id] = None
                alone = False
        if alone:
            # Nobody else on its GPUs (most runs, in most replays): no partner to re-rate, and its speed is its own
            # throttles', exactly what _factor computes with no one beside it (1.0 x activity x spill).
            run.factor = run.activity * run.spill
            self._predict(run)
        else:
            partners = self._partners(run)
            run.factor = self._factor(run)
            self._predict(run)
            self._rerate(partners, now_s)
        self._measure(gpus, now_s)
        assert self._sink is not None
        self._sink.observe_rate(job_id, run.factor)
        if self.telemetry:
            self._report(run, now_s)

    def _leave(self, run: _Run, now_s: float, *, keep_times: bool = False) -> None:
        """``run`` stops holding its GPUs: the jobs it interacted with speed up."""
        job_id = run.spec.job_id
        partners = self._partners(run)
        if partners:
            self._forget_pairs(run, partners)
        jobs_on = self._jobs_on
        for g in run.placement.gpus:
            on = jobs_on[g]
            assert on is not None
            del on[job_id]
            if not on:
                jobs_on[g] = None
        progress = run.done_s - run.seg_done_s
        if progress > 0:
            speed = self.perf.speed(run.placement.gpus[0])  # a gang's GPUs are of one type
            works = self.job_work_by_speed.get(job_id)
            if works is None and speed != 1.0:
                # Kept only for jobs that ran off speed 1.0 (a million-job replay on one GPU type keeps nothing):
                # all its progress so far was at 1.0.
                works = self.job_work_by_speed[job_id] = {1.0: run.seg_done_s} if run.seg_done_s > 0 else {}
            if works is not None:
                works[speed] = works.get(speed, 0.0) + progress
        run.seg_done_s = run.done_s
        if not keep_times:
            times = self.job_times.get(job_id)
            if times is None:
                # Equal when the run never slowed down (most runs): then one float object for both, not two, which
                # a million-job replay keeps to its end (issue 20: 24 MB at 1M jobs).
                run_s, solo_s = run.run_s, run.solo_s
                self.job_times[job_id] = [run_s, run_s if solo_s == run_s else solo_s]
            else:
                times[0] += run.run_s
                times[1] += run.solo_s
        if partners:
            self._rerate(partners, now_s)
        self._measure(run.placement.gpus, now_s)

    def _predict(self, run: _Run) -> None:
        """Schedule ``run``'s completion at its current rate (none while the rate is 0: a re-rate will come)."""
        assert self._sink is not None and run.spec.duration_s is not None
        rate = run.base_rate * run.factor
        if rate <= 0:
            run.event = run.demand_event = None
            return
        # An unchanged prediction keeps its queued event: a new one would come after the others due at the same
        # instant, and their order would then depend on whether the job was re-rated to the same speed.
        at = run.start_s + max(0.0, run.spec.duration_s - run.done_s) / rate
        if run.event is None or at != run.event_s:
            run.event = JobFinished(run.spec.job_id, run.epoch)
            run.event_s = at
            self._sink.schedule(at, run.event)
        if run.switch is not None:
            at = run.start_s + max(0.0, run.switch[0] - run.done_s) / rate
            if run.demand_event is None or at != run.demand_event_s:
                run.demand_event = DemandChanged(run.spec.job_id, run.epoch)
                run.demand_event_s = at
                self._sink.schedule(at, run.demand_event)

    def _full_rates(self, a: _Run, b: _Run, gpu: int) -> tuple[float, float]:
        """Full-activity rates of ``a`` and ``b`` together on ``gpu`` (cached per pair and GPU type)."""
        ida, idb = a.spec.job_id, b.spec.job_id
        t = self.perf.topo.gpu_type[gpu]
        packed = a.packed and b.packed
        key = (ida, idb, t, packed) if ida <= idb else (idb, ida, t, packed)
        rates = self._pairs.get(key)
        if rates is None:
            if packed:  # Gandiva's packing: the table a packing policy predicts from
                if a.batch is None and b.batch is None:
                    rates = self.perf.pair_rates(a.spec, b.spec, gpu)
                else:
                    rates = self.perf.pair_rates(a.spec, b.spec, gpu, a.batch, b.batch)
            else:
                rates = self.perf.sharing_rates(a.spec, a.profile, b.spec, b.profile, gpu)
            if ida > idb:
                rates = (rates[1], rates[0])
            self._pairs[key] = rates
        return rates if ida <= idb else (rates[1], rates[0])

    def _factor(self, run: _Run) -> float:
        """Speed relative to alone: per GPU the product of the slowdowns from each interacting partner there;
        the gang goes at its slowest GPU's pace; then the run's own throttles (share cap, memory spill)."""
        job_id = run.spec.job_id
        worst = 1.0
        runs = self._runs
        guest = run.opportunistic
        residual = self.perf.model.antman_residual
        for g in run.placement.gpus:
            here = 1.0
            held_sm = 0.0  # a guest: the SM use of the holders beside it, whose idle slots it runs in
            guests_sm = 0.0  # ... and of the other guests there at their share caps, which share those slots
            pairs = 1.0  # ... and its symmetric pair slowdowns from the other guests (used only without holders)
            for other_id in self._jobs_on[g] or ():
                if other_id == job_id:
                    continue
                other = runs[other_id]
                if guest:
                    if other.opportunistic:
                        guests_sm += other.profile.sm_util * other.activity
                        pairs *= pair_slowdown(self._full_rates(run, other, g)[0], other.activity)
                    else:
                        held_sm += other.profile.sm_util
                elif other.opportunistic:
                    here *= 1.0 - residual * other.activity  # AntMan: only the residual (sim.sharing)
                elif run.interacts(other):
                    here *= pair_slowdown(self._full_rates(run, other, g)[0], other.activity)
            if guest:
                if held_sm > 0:
                    here = guest_rate(run.profile, held_sm, run.activity, guests_sm)
                else:
                    here = pairs * run.activity
            worst = min(worst, here)
        return worst * run.spill if guest else worst * run.activity * run.spill

    def _partners(self, run: _Run) -> list[str]:
        job_id = run.spec.job_id
        jobs_on = self._jobs_on
        for g in run.placement.gpus:
            on = jobs_on[g]
            if on and (len(on) > 1 or job_id not in on):
                break
        else:
            return []  # alone on every one of its GPUs (the common case: answered without building anything)
        seen: dict[str, None] = {}
        runs = self._runs
        for g in run.placement.gpus:
            for other in jobs_on[g] or ():
                if other != job_id and other not in seen and run.interacts(runs[other]):
                    seen[other] = None
        return list(seen)

    def _rerate(self, job_ids: list[str], now_s: float, *, force: bool = False) -> None:
        """Settle, re-rate, re-predict and report each of ``job_ids`` whose speed changed (all, with ``force``)."""
        sink = self._sink
        assert sink is not None
        gpus: set[int] = set()
        for job_id in job_ids:
            run = self._runs.get(job_id)
            if run is None:
                continue
            factor = self._factor(run)
            changed = factor != run.factor
            if changed or force:
                if changed:  # settled only when its speed changes (see _Run.settle)
                    run.settle(now_s)
                    run.factor = factor
                self._predict(run)
                sink.observe_rate(job_id, factor)
                self._report(run, now_s)
                gpus.update(run.placement.gpus)
        if gpus:
            self._measure(gpus, now_s)

    def _report(self, run: _Run, now_s: float) -> None:
        sink = self._sink
        assert sink is not None
        if not self.telemetry or run.spec.job_id not in self._runs:
            return
        p = run.profile
        factor = run.factor
        step = p.solo_step_s / factor if factor > 0 else p.solo_step_s * _PAUSED_STEP_FACTOR
        peak = run.mem_used_mib()
        sink.report(
            run.spec.job_id,
            Telemetry(
                time_s=now_s,
                step_time_s=step,
                solo_step_time_s=p.solo_step_s,
                mem_peak_mib=peak,
                mem_mean_mib=round(peak * p.mem_mean_frac),
                mem_need_mib=p.mem_need_mib,
                sm_util=min(1.0, p.sm_util * factor),
            ),
        )

    def _measure(self, gpus: Iterable[int], now_s: float) -> None:
        """Re-sum the measured use of ``gpus`` after their jobs changed."""
        last = self._last_s
        if last is not None and now_s > last:
            dt = now_s - last
            self._area_sm += self._sm_sum * dt
            self._area_mem += self._mem_sum * dt
        self._last_s = now_s
        # The sums are carried in locals and stored once (the same operations in the same order as adding to the
        # attributes: the figures do not move); this runs at every start, stop and demand change.
        runs, jobs_on, gpu_sm, gpu_mem = self._runs, self._jobs_on, self._gpu_sm, self._gpu_mem
        sm_sum, mem_sum = self._sm_sum, self._mem_sum
        for g in gpus:
            sm = mem = 0.0
            on = jobs_on[g]
            if on is not None:
                for job_id in on:
                    run = runs[job_id]
                    p = run.profile
                    sm += p.sm_util * run.factor
                    peak = p.mem_need_mib  # run.mem_used_mib(), inlined
                    if run.opportunistic:
                        cap = run.placement.mem_mib
                        if cap is not None:
                            peak = min(peak, cap)
                    mem += peak * p.mem_mean_frac
            sm = min(1.0, sm)
            sm_sum += sm - gpu_sm[g]
            mem_sum += mem - gpu_mem[g]
            gpu_sm[g] = sm
            gpu_mem[g] = mem
        self._sm_sum, self._mem_sum = sm_sum, mem_sum
        if not self._timeline:
            return
        if last is not None and last == now_s:  # the timeline's last point is the last measure's: overwrite it
            self.timeline_sm[-1] = sm_sum
            self.timeline_mem_mib[-1] = mem_sum
        else:
            self.timeline_s.append(now_s)
            self.timeline_sm.append(sm_sum)
            self.timeline_mem_mib.append(mem_sum)
