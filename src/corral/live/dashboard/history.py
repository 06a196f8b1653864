"""The dashboard's time series: the last hour of the cluster, the tenants, the scheduler and the jobs, sampled in
the server process from the same controller snapshots ``GET /metrics`` reads.

A :class:`History` is filled by one daemon thread (:meth:`History.start`; stopped by the app's lifespan), every
``every_s`` seconds (default 5 s), and keeps ``window_s`` (default one hour) of samples in bounded rings:

- the cluster: per GPU its allocated share, opportunistic shares, measured SM use, memory given (the caps of its
  jobs) and used, and which tenant it serves alone (so that a tenant's view can hide the measured use of a GPU
  it shares with another tenant, as ``GET /v1/cluster`` does). Compact arrays: 22 bytes per GPU per sample and
  ~400 bytes of overhead, so 64 GPUs for an hour (721 samples) take 1.4 MiB, 1,000 GPUs 16 MiB;
- per tenant: quota, guaranteed use, opportunistic use, quota shortfall, running and pending jobs (~200 bytes per
  tenant per sample: 10 tenants for an hour, 1.4 MiB);
- the scheduler: rounds, their total latency, job events by kind, and jobs per phase (~600 bytes per sample,
  0.4 MiB an hour);
- per job, only for jobs that ran in the window: step time, step time alone (its baseline: the solo time it
  reports, else the one the controller measures, :mod:`corral.live.controller.baseline`), share,
  memory cap and use, SM use, the memory ladder's rung, and whether it ran alone. Column arrays, 36 bytes per
  job per sample: 64 running jobs for an hour take 1.6 MiB. At most :data:`MAX_JOBS` jobs are kept (the
  ones whose last sample is oldest go first).

The sampler thread never runs on the controller's loop thread: it asks for the cluster and tenant snapshots the
way an API request does (:meth:`Controller.cluster` builds them on the loop thread, as for ``/metrics``: one
pass over the GPUs and tenants, well under a millisecond at 64 GPUs), and reads the running jobs and the phase
counts from the store. The rung comes from the jobs' step reports (:attr:`Controller.on_report`), which say
it and which the controller does not keep.

Times are wall-clock Unix seconds (what the charts show); the sampler's own pacing uses the thread's wait.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from array import array
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from corral.core.job import FULL_GPU_MILLI, JobPhase
from corral.live.agent import JobReported
from corral.live.api.models import baseline_of
from corral.live.records import ClusterSnapshot, JobRecord, TenantSnapshot

if TYPE_CHECKING:
    from corral.live.controller import Controller
    from corral.live.nodes import NodeReport

log = logging.getLogger("corral.live.dashboard")

DEFAULT_EVERY_S = 5.0
DEFAULT_WINDOW_S = 3600.0
MAX_JOBS = 5_000
NO_JOB = -1  # owner of a GPU with no job
MIXED = -2  # owner of a GPU shared by several tenants' jobs
NAN = math.nan
SNAPSHOT_MAX_AGE_S = 1.0  # pages polled by many browsers share one snapshot a second


@dataclass(slots=True)
class ClusterSample:
    time_s: float
    alloc_milli: array[int]  # per GPU (engine order, as the snapshot's): share given to ordinary placements
    opp_milli: array[int]  # shares (compute caps) of its opportunistic jobs
    sm_used: array[float]  # measured, 0..1; NaN when nothing measured it
    mem_given_mib: array[float]  # the memory caps of its jobs, MiB
    mem_used_mib: array[float]  # NaN when unknown
    owner: array[int]  # index into History.tenant_names of the one tenant on it; NO_JOB, MIXED


@dataclass(frozen=True, slots=True)
class TenantPoint:
    quota_gpus: float  # NaN: no quota
    guaranteed_gpus: float
    opportunistic_gpus: float
    shortfall_gpus: float
    running: int
    pending: int


@dataclass(frozen=True, slots=True)
class SchedulerPoint:
    rounds: int  # cumulative, since the server started
    round_seconds: float  # cumulative
    events: Mapping[str, int]  # cumulative, by kind
    phases: Mapping[str, int]  # jobs per phase now


@dataclass(slots=True)
class JobSeries:
    """One job's samples, as columns (compact: a float32 each)."""

    tenant: str
    time_s: array[float] = field(default_factory=lambda: array("d"))
    step_s: array[float] = field(default_factory=lambda: array("f"))
    baseline_s: array[float] = field(default_factory=lambda: array("f"))  # its step time alone; NaN: none yet
    share: array[float] = field(default_factory=lambda: array("f"))  # 0..1 of each GPU
    mem_cap_mib: array[float] = field(default_factory=lambda: array("f"))  # NaN: no cap
    mem_used_mib: array[float] = field(default_factory=lambda: array("f"))
    sm_used: array[float] = field(default_factory=lambda: array("f"))
    rung: array[int] = field(default_factory=lambda: array("b"))  # index into rungs; -1: not said
    alone: array[int] = field(default_factory=lambda: array("b"))  # 1: no other job on its GPUs
    rungs: list[str] = field(default_factory=list)

    def trim(self, oldest_s: float) -> None:
        n = 0
        while n < len(self.time_s) and self.time_s[n] < oldest_s:
            n += 1
        if n:
            for column in self.columns():
                del column[:n]

    def columns(self) -> tuple[array[float] | array[int], ...]:
        return (
            self.time_s,
            self.step_s,
            self.baseline_s,
            self.share,
            self.mem_cap_mib,
            self.mem_used_mib,
            self.sm_used,
            self.rung,
            self.alone,
        )


class LatestCluster:
    """The controller's cluster snapshot, taken at most once per ``max_age_s`` whoever asks (the sampler, every
    page and every poll of every browser): the loop thread builds one snapshot a second at most."""

    def __init__(self, controller: Controller, max_age_s: float = SNAPSHOT_MAX_AGE_S) -> None:
        self._controller = controller
        self._max_age_s = max_age_s
        self._lock = threading.Lock()
        self._taken = -math.inf
        self._snapshot: ClusterSnapshot | None = None

    def get(self) -> ClusterSnapshot:
        with self._lock:  # a second caller waits for the first's snapshot instead of asking for its own
            now = time.monotonic()
            if self._snapshot is None or now - self._taken > self._max_age_s:
                self._snapshot = self._controller.cluster()
                self._taken = now
            return self._snapshot


class History:
    """The rings of the module docstring, and the thread that fills them."""

    def __init__(
        self,
        controller: Controller,
        latest: LatestCluster,
        every_s: float = DEFAULT_EVERY_S,
        window_s: float = DEFAULT_WINDOW_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.controller = controller
        self.latest = latest
        self.every_s = every_s
        self.window_s = window_s
        self._clock = clock
        size = max(2, math.ceil(window_s / every_s) + 1)
        self.cluster: deque[ClusterSample] = deque(maxlen=size)
        self.tenants: deque[tuple[float, dict[str, TenantPoint]]] = deque(maxlen=size)
        self.scheduler: deque[tuple[float, SchedulerPoint]] = deque(maxlen=size)
        self.jobs: dict[str, JobSeries] = {}
        self.tenant_names: list[str] = []
        self.lock = threading.Lock()  # readers copy what they need under it
        self._rungs: dict[str, str] = {}  # job -> the rung its latest step report named
        self._rung_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- the thread ------------------------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self.controller.on_report = self.heard
        self._thread = threading.Thread(target=self._run, name="corral-dashboard-history", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=15)  # at most one snapshot in flight (the controller answers within 10 s)
        if self.controller.on_report == self.heard:
            self.controller.on_report = None

    @property
    def running(self) -> bool:
        return self._thread is not None

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.sample()
            except Exception:  # a failed sample (the controller stopping) must not end the history
                log.exception("dashboard: a history sample failed")
            self._stop.wait(self.every_s)

    def heard(self, report: NodeReport) -> None:
        """An agent report (any thread): keep the rung a step report names. Never raises into the agent."""
        if isinstance(report, JobReported) and report.report.mem_mode is not None:
            with self._rung_lock:
                self._rungs[report.job_id] = report.report.mem_mode

    # -- one sample ------------------------------------------------------------------------------------------
    def sample(self) -> None:
        c = self.controller
        now = self._clock()
        snap = self.latest.get()
        tenants = c.tenants()
        running = c.jobs(phases=[JobPhase.RUNNING])
        stats = c.stats.snapshot()
        phases = c.store.count_by_phase()
        with self._rung_lock:
            rungs = dict(self._rungs)
        with self.lock:
            names = self.tenant_names
            for t in tenants:
                if t.name not in names:
                    names.append(t.name)
            index = {name: i for i, name in enumerate(names)}
            n = len(snap.gpus)
            sample = ClusterSample(
                now,
                array("H", [0] * n),
                array("I", [0] * n),
                array("f", [NAN] * n),
                array("f", [0.0] * n),
                array("f", [NAN] * n),
                array("i", [NO_JOB] * n),
            )
            for g, gpu in enumerate(snap.gpus):
                sample.alloc_milli[g] = min(gpu.allocated_milli, FULL_GPU_MILLI)
                sample.opp_milli[g] = sum(j.gpu_milli for j in gpu.jobs if j.opportunistic)
                if gpu.sm_util is not None:
                    sample.sm_used[g] = gpu.sm_util
                if gpu.mem_used_mib is not None:
                    sample.mem_used_mib[g] = gpu.mem_used_mib
                owners = {j.tenant for j in gpu.jobs}
                if len(owners) == 1:
                    sample.owner[g] = index.setdefault(next(iter(owners)), len(index))
                elif owners:
                    sample.owner[g] = MIXED
            for name in index:
                if name not in names:
                    names.append(name)
            jobs_on = [len(gpu.jobs) for gpu in snap.gpus]
            on_gpu = [{j.job_id for j in gpu.jobs} for gpu in snap.gpus]
            for record in running:
                placement = record.status.placement
                if placement is None:
                    continue
                for g in placement.gpus:
                    # Only jobs the snapshot has on that GPU: the running list is read a moment apart from it, and
                    # a cap counted on a GPU whose owner the snapshot does not know would show a tenant another's.
                    if 0 <= g < n and placement.mem_mib is not None and record.job_id in on_gpu[g]:
                        sample.mem_given_mib[g] += placement.mem_mib
                self._job_point(record, now, rungs, jobs_on)
            self.cluster.append(sample)
            self.tenants.append((now, {t.name: _tenant_point(t) for t in tenants}))
            self.scheduler.append((now, SchedulerPoint(stats.rounds, stats.round_seconds_sum, stats.events, phases)))
            self._trim(now)
        with self._rung_lock:  # forget the rungs of jobs no longer running
            for job_id in set(self._rungs) - {r.job_id for r in running}:
                self._rungs.pop(job_id, None)

    def _job_point(self, record: JobRecord, now: float, rungs: Mapping[str, str], jobs_on: list[int]) -> None:
        job_id, placement = record.job_id, record.status.placement
        assert placement is not None
        series = self.jobs.get(job_id)
        if series is None:
            series = self.jobs[job_id] = JobSeries(record.request.tenant)
        tel = record.telemetry
        series.time_s.append(now)
        series.step_s.append(tel.step_time_s if tel is not None else NAN)
        base = baseline_of(tel) if tel is not None else None  # the controller's, read with this very step time
        series.baseline_s.append(base if base is not None else NAN)
        series.share.append(placement.gpu_milli / FULL_GPU_MILLI)
        series.mem_cap_mib.append(placement.mem_mib if placement.mem_mib is not None else NAN)
        series.mem_used_mib.append(tel.mem_peak_mib if tel is not None else NAN)
        series.sm_used.append(tel.sm_util if tel is not None else NAN)
        rung = rungs.get(job_id)
        if rung is None:
            series.rung.append(-1)
        else:
            if rung not in series.rungs and len(series.rungs) < 100:
                series.rungs.append(rung)
            series.rung.append(series.rungs.index(rung) if rung in series.rungs else -1)
        alone = all(0 <= g < len(jobs_on) and jobs_on[g] == 1 for g in placement.gpus)
        series.alone.append(1 if alone else 0)

    def _trim(self, now: float) -> None:
        oldest = now - self.window_s
        for job_id in [j for j, s in self.jobs.items() if not s.time_s or s.time_s[-1] < oldest]:
            del self.jobs[job_id]
        for series in self.jobs.values():
            series.trim(oldest)
        if len(self.jobs) > MAX_JOBS:
            by_last = sorted(self.jobs, key=lambda j: self.jobs[j].time_s[-1])
            for job_id in by_last[: len(self.jobs) - MAX_JOBS]:
                del self.jobs[job_id]


def _tenant_point(t: TenantSnapshot) -> TenantPoint:
    # Shortfall: the part of its quota a tenant does not hold while jobs of its wait (a promise not kept now).
    quota = float(t.quota_gpus) if t.quota_gpus is not None else NAN
    short = max(0.0, quota - t.guaranteed_gpus) if t.quota_gpus is not None and t.pending > 0 else 0.0
    return TenantPoint(quota, t.guaranteed_gpus, t.opportunistic_gpus, short, t.running, t.pending)
