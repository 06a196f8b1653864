"""Each running job's step time alone, measured live, and its slowdown: what ``GET /metrics``, the API and the
dashboard show (observation only: no policy reads it).

A live job does not know its solo step time (its step reports carry none: the controller's telemetry says
``solo_step_time_s=None``), so the controller measures one, as AntMan's local coordinator learns a holder's
baseline (Xiao et al., OSDI'20 §3.3; :mod:`corral.policies.antman.coordinator`, ``observe`` and ``_base``): the
**median of the job's latest** :data:`WINDOW` **step reports made alone**, once there are :data:`MIN_REPORTS` of
them. The median, not the least: on a real GPU consecutive one-second reports of one job alone vary by several
percent (the coordinator notes a ResNet-50 alone on an H100 at 27.8 to 34.6 ms), so the least of them is an
outlier against which every ordinary report reads as a slowdown; the median also shrugs off the slow first steps
of a run (CUDA context, autotuning) and a report that a neighbour's brief visit slowed.

- **Alone**: no other job with a share above 0 ran on any of the job's GPUs (an opportunistic job at share 0 is
  paused), as the engine's GPU tables say, at this report *and at the job's previous one*: a report is the mean of
  the steps since the previous, and a neighbour that left in between slowed some of them. The job must also have
  run undegraded (memory rung ``full``, or none said): a step slowed by a memory cap is a slowdown, not a baseline.
- **Of what**: one run of the job, on one placement (its GPUs), at one compute share and one batch size. A new
  run, other GPUs (a new run on other GPUs is another baseline: another GPU type, another PCIe switch), another
  batch size, or a share that moved by more than :data:`SHARE_CHANGE` from the one the baseline was learned at
  start it over (a job throttled to half a GPU by its duty cycle steps twice as slowly, by design).
- **A solo time the job reports wins** (``Telemetry.solo_step_time_s``), as it does for the coordinator.
- **Slowdown** = the latest step time / the baseline (1.0: as fast as alone); none while there is no baseline.

The engine and the policies get the telemetry exactly as before (:class:`ObservedTelemetry` is a separate copy the
controller keeps for its readers). Cost: O(1) per step report (a ring of :data:`WINDOW` floats; the median of at
most :data:`WINDOW` samples when an alone report comes); about 0.5 KB per running job, forgotten when it ends.
Threads: :class:`Baselines` lives on the controller's loop thread; readers (``/metrics``, the API, the dashboard's
sampler) see only the immutable :class:`ObservedTelemetry` the controller publishes under its telemetry lock
with each report, so a step time and its baseline are always read together.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass

from corral.core.telemetry import Telemetry

WINDOW = 30  # the latest step reports alone whose median is the baseline (AntMan's coordinator keeps as many)
MIN_REPORTS = 3  # fewer reports alone: no baseline yet (three: the median outvotes one slow first report)
SHARE_CHANGE = 0.05  # a compute share moved by more than this (relative) is another baseline
UNDEGRADED = frozenset({None, "full"})  # memory ladder rungs whose steps may make a baseline


@dataclass(frozen=True, slots=True)
class Placing:
    """What a baseline is of: one run, on these GPUs (engine numbers), at this share and batch size."""

    run: int
    gpus: tuple[int, ...]
    gpu_milli: int
    batch_size: int | None = None

    def same(self, other: Placing) -> bool:
        """Whether ``other`` (now) is still what this baseline was learned on (the share within
        :data:`SHARE_CHANGE` of this one's)."""
        return (
            self.run == other.run
            and self.gpus == other.gpus
            and self.batch_size == other.batch_size
            and abs(other.gpu_milli - self.gpu_milli) <= SHARE_CHANGE * self.gpu_milli
        )


# No slots of its own: with them, dataclasses would declare its base's fields again (a compiled Telemetry lists no
# __slots__ to inherit), and the compiled base would never see the values set (setup.py).
@dataclass(frozen=True)
class ObservedTelemetry(Telemetry):
    """A job's latest telemetry as the controller's readers see it: the report, with the job's baseline then."""

    baseline_step_time_s: float | None = None  # the reported solo time, else the measured one; None: not yet
    baseline_reports: int = 0  # how many reports alone the measured baseline is the median of (0: reported or none)

    @property
    def slowdown(self) -> float | None:
        """The step time over the baseline (1.0 = as fast as alone), when there is one."""
        base = self.baseline_step_time_s
        return None if base is None else self.step_time_s / base


class _Track:
    """One job's baseline: what it is of, and a ring of its latest step times alone."""

    __slots__ = ("alone_before", "base", "count", "next", "placing", "samples")

    def __init__(self, placing: Placing, window: int) -> None:
        self.placing = placing
        self.samples = array("d", bytes(8 * window))  # a ring, oldest overwritten first
        self.count = 0  # samples in it (up to window)
        self.next = 0  # where the next one goes
        self.base: float | None = None  # median of the samples, once there are enough
        self.alone_before = True  # the job was alone at its previous report (a first one has none before it)

    def restart(self, placing: Placing) -> None:
        self.placing = placing
        self.count = self.next = 0
        self.base = None


class Baselines:
    """Every running job's measured baseline (module docstring). Loop thread only; not thread-safe."""

    __slots__ = ("_min_reports", "_tracks", "_window")

    def __init__(self, window: int = WINDOW, min_reports: int = MIN_REPORTS) -> None:
        if not 1 <= min_reports <= window:
            raise ValueError(f"baselines: need 1 <= min_reports <= window, got {min_reports}, {window}")
        self._window = window
        self._min_reports = min_reports
        self._tracks: dict[str, _Track] = {}

    def observe(
        self,
        job_id: str,
        telemetry: Telemetry,
        placing: Placing,
        *,
        alone: bool,
        undegraded: bool = True,
    ) -> ObservedTelemetry:
        """Take the job's step report (as ``telemetry``, made on ``placing``; ``alone``: no other job ran on its
        GPUs now; ``undegraded``: on the full memory rung) and return it with the job's baseline."""
        track = self._tracks.get(job_id)
        if track is None:
            track = self._tracks[job_id] = _Track(placing, self._window)
        elif not track.placing.same(placing):
            track.restart(placing)
        if alone and track.alone_before and undegraded:
            samples = track.samples
            samples[track.next] = telemetry.step_time_s
            track.next = (track.next + 1) % len(samples)
            track.count = min(track.count + 1, len(samples))
            if track.count >= self._min_reports:
                track.base = _median(samples, track.count)
        track.alone_before = alone
        solo = telemetry.solo_step_time_s
        base, reports = (solo, 0) if solo is not None else (track.base, track.count if track.base is not None else 0)
        return ObservedTelemetry(
            time_s=telemetry.time_s,
            step_time_s=telemetry.step_time_s,
            solo_step_time_s=telemetry.solo_step_time_s,
            mem_peak_mib=telemetry.mem_peak_mib,
            mem_mean_mib=telemetry.mem_mean_mib,
            mem_need_mib=telemetry.mem_need_mib,
            sm_util=telemetry.sm_util,
            baseline_step_time_s=base,
            baseline_reports=reports,
        )

    def baseline(self, job_id: str) -> float | None:
        """The job's measured baseline now (``None``: none yet, or the job is not followed)."""
        track = self._tracks.get(job_id)
        return None if track is None else track.base

    def forget(self, job_id: str) -> None:
        """The job ended: drop what was kept for it."""
        self._tracks.pop(job_id, None)

    def __len__(self) -> int:
        return len(self._tracks)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._tracks


def _median(samples: array[float], count: int) -> float:
    """The median of the first ``count`` samples (the ring's order does not matter to a median)."""
    ordered = sorted(samples[:count])
    mid = count // 2
    return ordered[mid] if count % 2 else (ordered[mid - 1] + ordered[mid]) / 2
