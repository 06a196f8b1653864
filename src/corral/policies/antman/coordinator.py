"""AntMan's local coordinator (Xiao et al., OSDI'20 §3.3): keep opportunistic jobs out of the guaranteed jobs' way.

The global scheduler (:mod:`corral.policies.antman.policy`) decides *where* jobs run; on each GPU that an
opportunistic job shares with guaranteed ones, this coordinator decides *how much* of it the opportunistic job may
use, from what the jobs measure at their mini-batch boundaries (:class:`~corral.core.telemetry.Telemetry`). It is pure
logic over a :class:`Snapshot` of some GPUs and the jobs on them, plus a small state of its own (baselines,
ceilings, last changes, wake-ups), so the live node agent can run it unchanged on real measurements: it gives
the agent a snapshot of its node and applies the :class:`Plan` that comes back. The rules:

- **Slowdown** of a guaranteed job (any job holding an allocation: "holder" below) = its mini-batch time over
  its baseline. The baseline is its step time alone (``Telemetry.solo_step_time_s``) when the reporter knows
  it, else the least step time seen while no opportunistic neighbour was active (share above 0); when both are
  known, the larger, so that only what the opportunistic jobs add counts (a holder slowed by another holder
  would otherwise pause its opportunistic neighbours for nothing). When another holder arrives on or leaves its
  GPUs, the learned time is stale: the next one measured without an active guest replaces it. No baseline yet:
  no information, and an opportunistic job never grows on no information.
- **Compute share, AIMD** (AntMan §3.3 scales opportunistic jobs down when a guaranteed job's mini-batches slow
  and back up when they do not; corral makes that additive-increase / multiplicative-decrease, as TCP does,
  because AIMD converges, and it converges to an even split between several opportunistic jobs on one GPU):
  if a holder on any of an opportunistic job's GPUs is slowed by more than ``slowdown_threshold``, its share
  is multiplied by ``decrease_factor`` (down to 0: paused, its memory kept); otherwise it grows by
  ``increase_milli``, up to what it asked for and to what the other opportunistic jobs on its GPUs leave. A guest
  that has not reported a step of its own since its launch is left as it is, up or down: it uses none of its share
  yet, so its holders' speed says nothing about that share (on an H100 a ResNet-50 guest took 53 s to its first
  step while its share climbed to the whole GPU; the guaranteed job then ran 1.4x slower). On a GPU without
  holders it takes its whole request at once: there is no one to protect.
- **Probing, but not endlessly; never parked for good**: in a deterministic simulator, plain AIMD would climb
  back to the share that hurt, be cut, climb again, forever, and every step costs the replay a wake-up. After a
  decrease from share ``s`` the job's share is capped by a *ceiling* just below ``s`` (``s - max(1,
  increase_milli // 4)``), so it settles under the first share that hurt; a ceiling that still hurts is lowered
  the same way (a few steps at most). A ceiling *lapses* ``_CEILING_LASTS_INTERVALS`` (15) control intervals
  after the last cut, and one set again by a probe after a lapse lasts twice as long (TCP's back-off): what hurt
  may have passed (a holder's burst, a measurement's noise), so a guest cut to 0 is tried again, at a cost of a
  few probes over a job's life. Ceilings are also forgotten (:meth:`LocalCoordinator.reset`) when the set of
  jobs on the job's GPUs changes or a holder's baseline moves by more than ``slowdown_threshold`` (a material
  change): the old limit no longer says anything.
- **Pace**: a decrease happens as soon as a measurement taken after the last change shows the slowdown; an
  increase at most once per ``control_interval_s``. Each change asks for a check one interval later. Checks
  fall on multiples of ``control_interval_s`` so that all jobs in transition share one wake-up, and a GPU whose
  jobs have settled (nothing left to grow, nothing slowed) asks for none: a steady cluster is never ticked.
- **Memory** (AntMan §3's dynamic memory scaling, §3.3): a holder's reservation is set to its measured peak (the
  larger of ``mem_peak_mib`` and ``mem_need_mib``) plus ``mem_margin_mib`` once it has measured: lowered when the
  reservation is at least one margin above that, raised at once when the peak grows into the margin (never above
  what the other holders on its GPUs leave). An opportunistic job's memory cap is what the holders' reservations and
  the other opportunistic jobs leave on each of its GPUs, at most its need plus the margin; it grows back when room
  appears. When a GPU gives out more than it has (a reservation grew), the newest opportunistic jobs there shrink
  first; one that would keep less than ``min_mem_fraction`` of its need is suspended instead (``Plan.evict``). Above
  that fraction a capped job keeps running, slower: the framework spills tensors to host memory rather than failing
  (AntMan §3, dynamic memory scaling).

A job whose GPUs are not all in the snapshot is *incomplete*: its memory cap and share may only go down (what the
coordinator cannot see it must not take), and a holder's reservation is left alone.
"""

from __future__ import annotations

import heapq
import math
import statistics
from collections import deque
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from corral.core.errors import ConfigError
from corral.core.job import FULL_GPU_MILLI, JobSpec
from corral.core.telemetry import Telemetry
from corral.workloads.models import UNKNOWN, traits

_EPS_S = 1e-6  # times this close are the same instant (checks are multiples of the interval in floating point)
# Measured baselines (live jobs, whose reporter does not know their solo time): see _measured_slowdown.
_SOLO_REPORTS = 30  # the latest step times alone that make a holder's baseline and its noise
_MIN_SOLO_REPORTS = 5  # fewer: no baseline yet (nor a measure of its noise)
_RECENT_REPORTS = 64  # the latest reports kept per holder (the evidence since a guest's last change)
_CEILING_LASTS_INTERVALS = 15  # a guest's first ceiling lasts this many control intervals; each next one, twice


def expected_mem_mib(spec: JobSpec, gpu_mem_mib: int) -> int:
    """GPU memory ``spec`` is expected to need on each of its GPUs (of ``gpu_mem_mib``), before it has measured.

    The job's own figure when it gives one; else its model's peak footprint (``corral.workloads.models``: measured
    at the model's reference batch size) scaled by its share of the GPU; else, for a model corral does not know,
    its whole share of the GPU's memory. Never more than the GPU has. One function, so the source of the
    estimate is changed in one place.
    """
    if spec.gpu_mem_mib is not None:
        return min(spec.gpu_mem_mib, gpu_mem_mib)
    known = traits(spec.model)
    if known is UNKNOWN:
        return gpu_mem_mib * spec.gpu_milli // FULL_GPU_MILLI
    return min(gpu_mem_mib, -(-known.mem_mib * spec.gpu_milli // FULL_GPU_MILLI))


@dataclass(frozen=True, slots=True)
class CoordinatorConfig:
    slowdown_threshold: float = 0.05  # a holder slowed by more than this (5%) makes its neighbours shrink
    decrease_factor: float = 0.5  # multiplicative decrease
    increase_milli: int = 100  # additive increase per control interval
    control_interval_s: float = 10.0  # at most one increase per interval; checks on multiples of it
    mem_margin_mib: int = 512  # head room above a holder's measured peak
    min_mem_fraction: float = 0.5  # an opportunistic job keeps at least this fraction of its need, or is suspended

    def __post_init__(self) -> None:
        if not 0 <= self.slowdown_threshold < math.inf:
            raise ConfigError(f"coordinator: slowdown_threshold must be >= 0, got {self.slowdown_threshold}")
        if not 0 <= self.decrease_factor < 1:
            raise ConfigError(f"coordinator: decrease_factor must be in [0, 1), got {self.decrease_factor}")
        if not 1 <= self.increase_milli <= FULL_GPU_MILLI:
            raise ConfigError(f"coordinator: increase_milli must be in 1..1000, got {self.increase_milli}")
        if not 0 < self.control_interval_s < math.inf:
            raise ConfigError(f"coordinator: control_interval_s must be > 0, got {self.control_interval_s}")
        if self.mem_margin_mib < 0:
            raise ConfigError(f"coordinator: mem_margin_mib must be >= 0, got {self.mem_margin_mib}")
        if not 0 <= self.min_mem_fraction <= 1:
            raise ConfigError(f"coordinator: min_mem_fraction must be in [0, 1], got {self.min_mem_fraction}")


# -- what the coordinator is shown ------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Holder:
    """A job holding an allocation on its GPUs (a guaranteed job, or any job on an ordinary placement)."""

    job_id: str
    gpus: tuple[int, ...]
    reserved_mib: int  # GPU memory reserved for it on each of its GPUs
    telemetry: Telemetry | None

    # Written out (a test checks it against the fields): the compiled core runs a dataclass's generated __init__ as
    # interpreted code, and every coordinator step makes these (issue 20; setup.py).
    def __init__(self, job_id: str, gpus: tuple[int, ...], reserved_mib: int, telemetry: Telemetry | None) -> None:
        object.__setattr__(self, "job_id", job_id)
        object.__setattr__(self, "gpus", gpus)
        object.__setattr__(self, "reserved_mib", reserved_mib)
        object.__setattr__(self, "telemetry", telemetry)


@dataclass(frozen=True, slots=True)
class Guest:
    """An opportunistic job: it allocates nothing and runs under a compute-share cap and a memory cap."""

    job_id: str
    gpus: tuple[int, ...]
    share_milli: int  # current compute-share cap (0: paused)
    request_milli: int  # what it asked for per GPU: the most it may grow to
    mem_cap_mib: int
    need_mib: int  # its measured need (Telemetry.mem_need_mib), else the expected one
    # Whether it has reported a step since its launch. Until it has, its holders' step times say nothing about
    # what its share costs them (a job still importing its framework uses none of it): it does not grow.
    stepping: bool = True

    # Written out, as Holder's.
    def __init__(
        self,
        job_id: str,
        gpus: tuple[int, ...],
        share_milli: int,
        request_milli: int,
        mem_cap_mib: int,
        need_mib: int,
        stepping: bool = True,
    ) -> None:
        object.__setattr__(self, "job_id", job_id)
        object.__setattr__(self, "gpus", gpus)
        object.__setattr__(self, "share_milli", share_milli)
        object.__setattr__(self, "request_milli", request_milli)
        object.__setattr__(self, "mem_cap_mib", mem_cap_mib)
        object.__setattr__(self, "need_mib", need_mib)
        object.__setattr__(self, "stepping", stepping)


@dataclass(frozen=True, slots=True)
class GpuSnapshot:
    mem_mib: int
    holders: tuple[str, ...]
    guests: tuple[str, ...]  # oldest first: the newest shrink first when memory runs short

    # Written out, as Holder's.
    def __init__(self, mem_mib: int, holders: tuple[str, ...], guests: tuple[str, ...]) -> None:
        object.__setattr__(self, "mem_mib", mem_mib)
        object.__setattr__(self, "holders", holders)
        object.__setattr__(self, "guests", guests)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Some GPUs, every job on them, and which jobs to act on (``focus``).

    Every job on a GPU of ``gpus`` must be in ``holders`` or ``guests``. Jobs outside ``focus`` are shown for the
    accounting only (their memory counts), except that memory running short on a GPU may shrink any guest on it.
    """

    gpus: Mapping[int, GpuSnapshot]
    holders: Mapping[str, Holder]
    guests: Mapping[str, Guest]
    focus: Collection[str]

    # Written out, as Holder's.
    def __init__(
        self,
        gpus: Mapping[int, GpuSnapshot],
        holders: Mapping[str, Holder],
        guests: Mapping[str, Guest],
        focus: Collection[str],
    ) -> None:
        object.__setattr__(self, "gpus", gpus)
        object.__setattr__(self, "holders", holders)
        object.__setattr__(self, "guests", guests)
        object.__setattr__(self, "focus", focus)


@dataclass(frozen=True, slots=True)
class Plan:
    """What to change: new reservations (holders), new shares and memory caps (guests), guests to suspend.

    Only changed values are listed. ``why`` says, per job, what the change is for (decision logs)."""

    reservations: Mapping[str, int] = field(default_factory=dict)
    shares: Mapping[str, int] = field(default_factory=dict)
    mem_caps: Mapping[str, int] = field(default_factory=dict)
    evict: tuple[str, ...] = ()
    why: Mapping[str, str] = field(default_factory=dict)

    # Written out, as Holder's (None: a new empty dict, as the fields' factories give).
    def __init__(
        self,
        reservations: Mapping[str, int] | None = None,
        shares: Mapping[str, int] | None = None,
        mem_caps: Mapping[str, int] | None = None,
        evict: tuple[str, ...] = (),
        why: Mapping[str, str] | None = None,
    ) -> None:
        object.__setattr__(self, "reservations", {} if reservations is None else reservations)
        object.__setattr__(self, "shares", {} if shares is None else shares)
        object.__setattr__(self, "mem_caps", {} if mem_caps is None else mem_caps)
        object.__setattr__(self, "evict", evict)
        object.__setattr__(self, "why", {} if why is None else why)

    def __bool__(self) -> bool:
        return bool(self.reservations or self.shares or self.mem_caps or self.evict)


class LocalCoordinator:
    """The coordinator's rules (module docstring) and its memory between steps. Deterministic: no clock of its
    own, no randomness; the same observations and snapshots give the same plans."""

    __slots__ = (
        "_baseline",
        "_ceiling",
        "_due",
        "_expiry",
        "_heap",
        "_last_change",
        "_learned",
        "_recent",
        "_solo",
        "_stale",
        "config",
    )

    def __init__(self, config: CoordinatorConfig | None = None) -> None:
        self.config = config if config is not None else CoordinatorConfig()
        self._learned: dict[str, float] = {}  # holder -> least step time with no active guest beside it
        # Measured baselines (a reporter that does not know the solo time: live jobs), see _measured_slowdown:
        self._solo: dict[str, deque[float]] = {}  # holder -> its latest step times with no active guest beside it
        self._recent: dict[str, deque[tuple[float, float]]] = {}  # holder -> its latest (time, step time)
        self._stale: set[str] = set()  # holders whose learned time predates a change around them
        self._baseline: dict[str, float] = {}  # holder -> its baseline when last observed (material changes)
        self._ceiling: dict[str, int] = {}  # guest -> share it must not grow past (after a decrease)
        # guest -> (when its ceiling lapses, how long the next one lasts)
        self._expiry: dict[str, tuple[float, float]] = {}
        self._last_change: dict[str, float] = {}  # guest -> when its share was last set
        self._due: dict[str, float] = {}  # job -> when it is next to be checked
        self._heap: list[tuple[float, str]] = []  # (due, job), lazily cleaned against _due

    # -- observations -----------------------------------------------------------------------------------------
    def observe(self, job_id: str, telemetry: Telemetry, *, guest_active: bool) -> bool:
        """Take note of a holder's latest telemetry (``guest_active``: an opportunistic job with a share above 0
        ran on one of its GPUs). Returns whether its baseline moved materially (its neighbours' ceilings are
        then stale: see :meth:`reset`)."""
        if telemetry.solo_step_time_s is None:
            recent = self._recent.get(job_id)
            if recent is None:
                recent = self._recent[job_id] = deque(maxlen=_RECENT_REPORTS)
            recent.append((telemetry.time_s, telemetry.step_time_s))
            if not guest_active:
                solo = self._solo.get(job_id)
                if solo is None or job_id in self._stale:
                    solo = self._solo[job_id] = deque(maxlen=_SOLO_REPORTS)
                solo.append(telemetry.step_time_s)
        if not guest_active:
            old = self._learned.get(job_id)
            if old is None or job_id in self._stale or telemetry.step_time_s < old:
                self._learned[job_id] = telemetry.step_time_s
                self._stale.discard(job_id)
        base = self._base(job_id, telemetry)
        if base is None:
            return False
        before = self._baseline.get(job_id)
        self._baseline[job_id] = base
        return before is not None and abs(base - before) > self.config.slowdown_threshold * before

    def slowdown(self, job_id: str, telemetry: Telemetry) -> float | None:
        """The holder's step time over its baseline (1.0: as fast as without opportunistic neighbours), or
        ``None`` while it has no baseline."""
        base = self._base(job_id, telemetry)
        return None if base is None else telemetry.step_time_s / base

    def _base(self, job_id: str, telemetry: Telemetry) -> float | None:
        solo = telemetry.solo_step_time_s
        learned = self._learned.get(job_id)
        if solo is None:
            samples = self._solo.get(job_id)
            return statistics.median(samples) if samples else None
        return solo if learned is None else max(solo, learned)

    def _measured_slowdown(self, job_id: str, since_s: float | None) -> tuple[bool, bool]:
        """For a holder whose reporter does not know its solo time (a live job): whether the reports taken since
        ``since_s`` (the guest's last change) show it slowed by more than ``slowdown_threshold``, and whether they
        show it is not; neither (too little evidence, or a slowdown too close to the threshold to tell) means
        hold.

        The baseline is the median of its latest step times with no active guest beside it, not the least of
        them: on a real GPU consecutive one-second reports of one job alone vary by several percent (a ResNet-50
        alone on an H100: 27.8 to 34.6 ms), so the least of them is an outlier, and every ordinary report would
        read as a slowdown. The noise is measured too: the robust standard deviation of those samples (1.4826 x
        their median absolute deviation, relative to the median). The slowdown is the mean of the ``n`` reports
        since ``since_s``; its standard error counts the baseline's own, ``noise * sqrt(1/n + 1/samples)``.

        - *Slowed*: the mean is above the threshold by more than two standard errors. One report is enough for
          a large slowdown (1.4x at 6% noise), a small one waits for more; noise alone (a wrong baseline
          included) rarely reaches it, so a guest is not cut for nothing.
        - *Not slowed*: at least ``(2 * noise / threshold)^2`` reports (one for a steady reporter), whose mean is
          within the threshold. Growing on a point estimate is safe: a growth that hurts is cut at once."""
        samples = self._solo.get(job_id)
        recent = self._recent.get(job_id)
        if not samples or len(samples) < _MIN_SOLO_REPORTS or not recent:
            return False, False
        fresh = [step for t, step in recent if since_s is None or t >= since_s - _EPS_S]
        if not fresh:
            return False, False
        base = statistics.median(samples)
        noise = 1.4826 * statistics.median(abs(x - base) for x in samples) / base
        threshold = self.config.slowdown_threshold
        excess = statistics.fmean(fresh) / base - 1.0 - threshold
        error = noise * math.sqrt(1 / len(fresh) + 1 / len(samples))
        needed = max(1, math.ceil((2.0 * noise / max(threshold, 1e-3)) ** 2))
        return excess > 2.0 * error, excess <= 0 and len(fresh) >= needed

    def reset(self, guest_id: str) -> None:
        """The guest's surroundings changed (a job arrived on or left its GPUs, a holder's baseline moved): its
        ceiling no longer applies, nor what its probes learned."""
        self._ceiling.pop(guest_id, None)
        self._expiry.pop(guest_id, None)

    def forget_baseline(self, holder_id: str) -> None:
        """The holder's surroundings changed (another holder arrived on or left its GPUs): its next step time
        measured with no active guest beside it replaces the learned one (until then the old one stands: it may
        be too low, which pauses the guests, which yields that very measurement)."""
        if holder_id in self._learned:
            self._stale.add(holder_id)

    def forget(self, job_id: str) -> None:
        """The job left (or changed layer): drop everything kept for it."""
        self._learned.pop(job_id, None)
        self._solo.pop(job_id, None)
        self._recent.pop(job_id, None)
        self._stale.discard(job_id)
        self._baseline.pop(job_id, None)
        self._ceiling.pop(job_id, None)
        self._expiry.pop(job_id, None)
        self._last_change.pop(job_id, None)
        self._due.pop(job_id, None)

    def touched(self, guest_id: str, now_s: float) -> None:
        """Someone else (the global scheduler) set the guest's share at ``now_s``: pace from there, and check it
        one interval later."""
        self._last_change[guest_id] = now_s
        self.check_after(guest_id, now_s, replace=True)

    # -- wake-ups ---------------------------------------------------------------------------------------------
    def check_after(self, job_id: str, since_s: float, *, replace: bool = False) -> None:
        """Ask for ``job_id`` to be looked at on the first check tick at least one interval after ``since_s`` (an
        earlier check already asked for stands, unless ``replace``)."""
        interval = self.config.control_interval_s
        due = math.ceil((since_s + interval) / interval - _EPS_S) * interval
        old = self._due.get(job_id)
        if old is None or replace or due < old - _EPS_S:
            self._due[job_id] = due
            heapq.heappush(self._heap, (due, job_id))

    def pop_due(self, now_s: float) -> list[str]:
        """The jobs whose check is due at ``now_s`` (each returned once)."""
        heap, due = self._heap, self._due
        out: list[str] = []
        while heap and heap[0][0] <= now_s + _EPS_S:
            t, job_id = heapq.heappop(heap)
            if due.get(job_id) == t:
                del due[job_id]
                out.append(job_id)
        return out

    def next_due_s(self) -> float | None:
        """When the next check is due (``None``: every job has settled)."""
        heap, due = self._heap, self._due
        while heap and due.get(heap[0][1]) != heap[0][0]:
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    @property
    def in_transition(self) -> int:
        """How many jobs still await a check."""
        return len(self._due)

    # -- one control step -------------------------------------------------------------------------------------
    def reservation_target(self, reserved_mib: int, telemetry: Telemetry | None) -> int | None:
        """The reservation a holder should have given what it measured, or ``None`` to leave ``reserved_mib``:
        its measured peak plus the margin, when it holds less than that or at least one margin more."""
        if telemetry is None:
            return None
        margin = self.config.mem_margin_mib
        target = max(telemetry.mem_peak_mib, telemetry.mem_need_mib) + margin
        return target if reserved_mib < target or reserved_mib >= target + margin else None

    def step(self, now_s: float, snap: Snapshot) -> Plan:
        """Decide the changes for the jobs in ``snap.focus`` (see the module docstring for the rules)."""
        cfg = self.config
        margin = cfg.mem_margin_mib
        gpus, holders, guests, focus = snap.gpus, snap.holders, snap.guests, snap.focus
        reservations: dict[str, int] = {}
        shares: dict[str, int] = {}
        caps: dict[str, int] = {}
        evicted: dict[str, None] = {}
        why: dict[str, str] = {}

        def complete(job_gpus: tuple[int, ...]) -> bool:
            return all(g in gpus for g in job_gpus)

        def reserved(h: str) -> int:
            got = reservations.get(h)
            return holders[h].reserved_mib if got is None else got

        def cap(x: str) -> int:
            got = caps.get(x)
            return guests[x].mem_cap_mib if got is None else got

        def share(x: str) -> int:
            got = shares.get(x)
            return guests[x].share_milli if got is None else got

        # 1. Holders' reservations: their measured peak plus the margin (§3: the framework knows its footprint).
        for h in holders.values():
            if h.job_id not in focus or not complete(h.gpus):
                continue
            current = h.reserved_mib
            target = self.reservation_target(current, h.telemetry)
            if target is None:
                continue
            if current < target:
                room = min(gpus[g].mem_mib - sum(reserved(o) for o in gpus[g].holders if o != h.job_id) for g in h.gpus)
                new = max(current, min(target, room))
            else:
                new = target
            if new != current:
                assert h.telemetry is not None
                reservations[h.job_id] = new
                why[h.job_id] = f"measured peak {h.telemetry.mem_peak_mib} MiB"

        # 2. Memory running short on a GPU (a reservation grew): the newest guests there shrink, or are suspended.
        floor = cfg.min_mem_fraction
        for gs in gpus.values():
            room = gs.mem_mib - sum(reserved(h) for h in gs.holders)
            deficit = sum(cap(x) for x in gs.guests if x not in evicted) - room
            for x in reversed(gs.guests):
                if deficit <= 0:
                    break
                if x in evicted:
                    continue
                c = cap(x)
                if c == 0:
                    continue
                guest = guests[x]
                if c - deficit < floor * guest.need_mib:
                    why[x] = f"memory: {max(0, c - deficit)} MiB left of {guest.need_mib} needed"
                    evicted[x] = None
                    deficit -= c
                else:
                    caps[x] = c - deficit
                    deficit = 0
                    why[x] = "memory: a reservation grew"

        # 3. Compute shares (AIMD with a ceiling) and 4. memory caps, oldest guest first (``guests`` is in that
        # order), so that the oldest get room first when several grow on one GPU.
        for x, guest in guests.items():
            if x not in focus or x in evicted or not complete(guest.gpus):
                continue
            room = min(
                FULL_GPU_MILLI - sum(share(o) for o in gpus[g].guests if o != x and o not in evicted)
                for g in guest.gpus
            )
            new_share = self._aimd(now_s, guest, gpus, holders, room)
            if new_share is not None and new_share != guest.share_milli:
                shares[x] = new_share
                why.setdefault(x, "slowdown" if new_share < guest.share_milli else "no slowdown")
            want = guest.need_mib + margin
            c = cap(x)
            if c > want:
                caps[x] = want
                why.setdefault(x, "memory: need fell")
            elif c < want:
                avail = min(
                    gpus[g].mem_mib
                    - sum(reserved(h) for h in gpus[g].holders)
                    - sum(cap(o) for o in gpus[g].guests if o != x and o not in evicted)
                    for g in guest.gpus
                )
                if avail > c:
                    caps[x] = min(want, avail)
                    why.setdefault(x, "memory: room appeared")
        for x in evicted:
            shares.pop(x, None)
            caps.pop(x, None)
            self.forget(x)
        return Plan(
            reservations,
            {x: s for x, s in shares.items() if s != guests[x].share_milli},
            {x: c for x, c in caps.items() if c != guests[x].mem_cap_mib},
            tuple(evicted),
            why,
        )

    def _aimd(
        self, now_s: float, guest: Guest, gpus: Mapping[int, GpuSnapshot], holders: Mapping[str, Holder], room: int
    ) -> int | None:
        """The guest's next share, or ``None`` to leave it (see the module docstring). ``room``: the share the
        other guests on its GPUs leave it."""
        cfg = self.config
        x = guest.job_id
        current = guest.share_milli
        last = self._last_change.get(x)
        paced = last is None or now_s >= last + cfg.control_interval_s - _EPS_S
        slowed = fresh = unknown = any_holder = False
        for g in guest.gpus:
            for h in gpus[g].holders:
                any_holder = True
                tel = holders[h].telemetry
                if tel is not None and tel.solo_step_time_s is None:
                    # A measured baseline: act on the evidence since the last change (see _measured_slowdown).
                    is_slowed, is_not = self._measured_slowdown(h, last)
                    if is_slowed:
                        slowed = fresh = True
                    elif not is_not:
                        unknown = True
                    continue
                ratio = None if tel is None else self.slowdown(h, tel)
                if tel is None or ratio is None:
                    unknown = True
                elif ratio > 1.0 + cfg.slowdown_threshold:
                    slowed = True
                    # Measured after the last change: the slowdown is what the current share does.
                    fresh |= last is None or tel.time_s >= last - _EPS_S
        if any_holder and not guest.stepping:
            # Not running yet: a holder's slowdown is not its doing, and no slowdown says nothing about its share.
            # Its first step report marks its GPUs changed, which brings it back here.
            self._due.pop(x, None)
            return None
        if slowed:
            if current == 0:
                self._due.pop(x, None)  # paused already: nothing left to give back
                return None
            if not (fresh or paced):
                assert last is not None
                self.check_after(x, last)
                return None
            # The ceiling lapses after a while (a guest is never parked for good: measured evidence can be wrong,
            # and what hurt may pass), and when a probe after a lapse hurts again the next one lasts twice as long
            # (as TCP backs off its retransmissions), so probing costs a few probes over a job's life. Cuts in one
            # descent, under a ceiling still in force, keep its length.
            before = self._expiry.get(x)
            if before is None:
                lasts = _CEILING_LASTS_INTERVALS * cfg.control_interval_s
            else:
                lasts = before[1] if x in self._ceiling else 2 * before[1]
            self._ceiling[x] = max(0, current - max(1, cfg.increase_milli // 4))
            self._expiry[x] = (now_s + lasts, lasts)
            self._changed(x, now_s)
            return int(current * cfg.decrease_factor)
        if unknown:
            # No information (or not enough yet): hold until measurements come (each marks the GPU changed).
            self._due.pop(x, None)
            return None
        lapse = self._expiry.get(x)
        if lapse is not None and x in self._ceiling:
            if now_s >= lapse[0] - _EPS_S:
                del self._ceiling[x]
            else:
                self._due[x] = lapse[0]  # look again when it lapses
                heapq.heappush(self._heap, (lapse[0], x))
        limit = min(guest.request_milli, self._ceiling.get(x, FULL_GPU_MILLI), room)
        if current >= limit:
            self._due.pop(x, None)  # settled
            return None
        if not any_holder:
            self._changed(x, now_s)
            return limit  # nobody to protect: the whole request at once
        if not paced:
            assert last is not None
            self.check_after(x, last)
            return None
        self._changed(x, now_s)
        return min(current + cfg.increase_milli, limit)

    def _changed(self, guest_id: str, now_s: float) -> None:
        self._last_change[guest_id] = now_s
        self.check_after(guest_id, now_s, replace=True)
