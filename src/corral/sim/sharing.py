"""The simulator's model of jobs sharing a GPU: each job's resource profile, and how fast co-located jobs go.

This is the truth a replay runs on when jobs share GPUs (Gandiva's packing, AntMan's opportunistic jobs). The
policies never see it; they see what the executor reports (observed rates and :class:`Telemetry`).

**Profile of a job** (:class:`Profile`, built once per run by :func:`job_profile`): from its model's traits
(:mod:`corral.workloads.models`): peak GPU memory, mean/peak memory over a mini-batch, SM busy fraction and
memory-bandwidth fraction when alone, and its solo mini-batch time. Two adjustments:

- *usage spread*: production jobs use less of a GPU than the same model tuned for a benchmark (AntMan, OSDI'20
  §2.2, reports that most jobs in Alibaba's cluster leave much of their GPUs' memory and SMs idle). Each job's
  SM and memory use are its model's times one factor drawn uniformly from ``[1 - usage_spread, 1]``, from a
  generator seeded by the run's seed and the job id (the same job gets the same factor in every replay);
- *fractional shares*: a job allocated part of a GPU (openb's ``gpu_milli``) uses that part: SM use and memory
  scale by ``gpu_milli / 1000``.

The solo mini-batch time is Gavel's measured isolated throughput of the model's job type on the GPU's Gavel type
(``1 / steps per second``; ``corral.workloads.colocation``), else 0.25 s; divided by the GPU type's speed.

*Batch size* (:mod:`corral.workloads.models`, :mod:`corral.workloads.batching`): at a batch size other than its
model's reference, a job's solo mini-batch time is Gavel's measured one at that size (interpolated between
measured sizes), its memory need is its need at the reference times the model's memory factor at that size, its
SM busy fraction and memory-bandwidth fraction are scaled by its throughput ratio (samples/s against the
reference; capped at the whole GPU), and its Gavel job type for co-location is the one measured at that size, so
that its interference with a partner is Gavel's measured pair at those batch sizes. At the reference batch size
(or with none set) nothing differs from the above.

*Demand over a job's life* (:func:`demand_change`): with ``demand_variation`` v > 0, each job's SM use and
memory need change once, when its progress reaches a point drawn uniformly in [20%, 80%] of its work, by a factor
drawn uniformly in ``[1 - v, 1 + v]`` (capped at the GPU). Real jobs change phase (evaluation passes, a larger
batch or sequence length later in training, a second model); one step per job is the simplest change that makes
a coordinator re-read its telemetry rather than trust the first reading. The draws are keyed by the job id.

**Co-location** (:func:`pair_slowdown`): two jobs on one GPU each run at a *full-activity pair rate*: Gavel's
measured normalised rates when both models map to Gavel job types measured together on that GPU type, with each
job's loss scaled by its partner's ``usage`` (Gavel measured benchmark jobs that keep the GPU as busy as their
model does; a partner that uses half of that interferes half as much: :func:`measured_pair_rates`); otherwise a
documented model from the profiles: when their SM demands add up to more than the GPU (``u_a + u_b > 1``) they
time-share it, each getting ``1 / (u_a + u_b)`` of its speed, and each also loses ``bandwidth_kappa × b_other``
to memory-bandwidth contention (``b``: the partner's bandwidth fraction). A partner that is throttled to an
*activity* ``a`` in [0, 1] (an opportunistic job under a compute-share cap, beside other guests only: beside
holders see below) slows its neighbour proportionally less: the neighbour's rate is ``1 - (1 - pair_rate) × a``.
With several partners the factors multiply (pairs is all Gavel measured). A gang runs at the pace of its slowest GPU.

**Opportunistic jobs** (:func:`activity`, :func:`spill_rate`): a compute-share cap ``s`` (fraction of the GPU's
time) limits a job that would use ``u`` of it alone to ``min(1, s / u)`` of its speed (the duty cycle only bites
below its natural use). A memory cap below the job's peak need makes the excess spill to host memory: the job
runs at ``1 / (1 + spill_penalty × spilled fraction)`` of its speed instead of failing (AntMan §3.2 moves tensors
to host memory rather than failing with out-of-memory). ``spill_penalty`` (default 2: half the footprint in host
memory halves the speed... roughly what moving activations over PCIe every step costs against HBM) is an
assumption, configurable in the performance model.

**AntMan's guests beside holders** (:func:`guest_rate`; the executor): AntMan's GpuOpManager (OSDI'20 §3.3)
launches an opportunistic job's GPU kernels only in the idle slots of the guaranteed jobs' mini-batches, so the
two are *not* the symmetric pair above, which models plain time-slicing (measured on an H100: two ResNet-50s
sharing one GPU by time-slicing each ran 1.5x slower, docs/measurements.md). On a GPU with holders, a guest of
share activity ``a`` (:func:`activity`) runs at ``a x min(1, idle / demand)`` of its solo speed, where ``idle =
1 - Σ holders' SM use`` and ``demand`` is the busy time of all the guests there at their caps (``Σ u x a``): its
busy time fits into the idle fraction the holders leave, shared in proportion when several guests want more of
it than there is. A holder beside a guest runs at ``1 - antman_residual x a`` of its speed (several guests
multiply): the kernels run in its idle slots, but they still contend for caches and memory bandwidth, and a
kernel launched just before the holder's next one delays it. ``antman_residual`` (default 0.02) is an
assumption, not a measurement: the paper reports guaranteed jobs kept at their dedicated speed; corral has not
measured GpuOpManager's residual (it has no GpuOpManager: live, the guest's duty cycle is what it has). Guests on
a GPU without holders have no priority between them and interfere as a pair (the symmetric model, so the
"Co-location" rules above apply between guests only there). Gandiva's packing and IADeep's co-location keep the
symmetric pair model: they share without priority.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Final

from corral.core.job import FULL_GPU_MILLI, JobSpec
from corral.workloads.batching import batch_curve, type_at_batch
from corral.workloads.colocation import ColocationTable
from corral.workloads.models import UNKNOWN, ModelTraits, batch_mem_factor, traits

DEFAULT_STEP_S = 0.25  # solo mini-batch time of a job whose model Gavel did not measure


@dataclass(frozen=True, slots=True)
class Profile:
    """A job's use of one of its GPUs when it runs alone there (see the module docstring)."""

    sm_util: float  # 0..1
    mem_need_mib: int  # peak within a mini-batch
    mem_mean_frac: float  # mean / peak over a mini-batch
    mem_bw: float  # 0..1
    solo_step_s: float
    traits: ModelTraits
    usage: float = 1.0  # its usage factor times its share: how much of its model's benchmark GPU use it makes
    colocation_type: str = ""  # its Gavel job type at its batch size ("" : none); see the module docstring

    # Written out (a test checks it against the fields): the compiled core runs a dataclass's generated __init__ as
    # interpreted code, 15x slower, and every launch and demand change makes a profile (issue 20; setup.py).
    def __init__(
        self,
        sm_util: float,
        mem_need_mib: int,
        mem_mean_frac: float,
        mem_bw: float,
        solo_step_s: float,
        traits: ModelTraits,
        usage: float = 1.0,
        colocation_type: str = "",
    ) -> None:
        object.__setattr__(self, "sm_util", sm_util)
        object.__setattr__(self, "mem_need_mib", mem_need_mib)
        object.__setattr__(self, "mem_mean_frac", mem_mean_frac)
        object.__setattr__(self, "mem_bw", mem_bw)
        object.__setattr__(self, "solo_step_s", solo_step_s)
        object.__setattr__(self, "traits", traits)
        object.__setattr__(self, "usage", usage)
        object.__setattr__(self, "colocation_type", colocation_type)


_TWO_64: Final = 2.0**64


def _hasher(what: str, seed: int) -> Any:
    """A BLAKE2b-64 hasher keyed by ``what`` and the seed, which has taken its key."""
    return hashlib.blake2b(digest_size=8, key=f"{what}:{seed}".encode())


class _Keyed:
    """The keyed hashers of one seed, one per kind of draw. A copy of one hashes a job id as a new keyed hasher
    would, without hashing the key's block again; three draws per launch find theirs by one lookup of the seed
    (issue 20: a key tuple built and hashed per draw, and the module's dictionary looked up, cost 1.5% of a replay)."""

    __slots__ = ("demand_at", "demand_by", "usage")

    def __init__(self, seed: int) -> None:
        self.usage = _hasher("usage", seed)
        self.demand_at = _hasher("demand-at", seed)
        self.demand_by = _hasher("demand-by", seed)


_KEYED: Final[dict[int, _Keyed]] = {}


def _keyed(seed: int) -> _Keyed:
    keyed = _KEYED.get(seed)
    if keyed is None:
        keyed = _KEYED[seed] = _Keyed(seed)
    return keyed


def _fraction(hasher: Any, job_id: bytes) -> float:
    """The job id's digest by a copy of ``hasher``, read as a little-endian fraction in [0, 1)."""
    h = hasher.copy()
    h.update(job_id)
    return int.from_bytes(h.digest(), "little") / _TWO_64


def _uniform(what: str, job_id: str, seed: int) -> float:
    """A uniform draw in [0, 1) keyed by ``what``, the job id and the seed: the same on every run and platform, and
    cheaper than seeding a generator per job. The job id's keyed BLAKE2b-64 digest, read as a little-endian
    fraction."""
    keyed = _keyed(seed)
    if what == "usage":
        hasher = keyed.usage
    elif what == "demand-at":
        hasher = keyed.demand_at
    elif what == "demand-by":
        hasher = keyed.demand_by
    else:
        hasher = _hasher(what, seed)
    return _fraction(hasher, job_id.encode())


def usage_factor(job_id: str, seed: int, spread: float) -> float:
    """The job's production-usage factor in ``[1 - spread, 1]`` (1.0 when ``spread`` is 0): one draw per job."""
    if spread <= 0:
        return 1.0
    return 1.0 - spread * _fraction(_keyed(seed).usage, job_id.encode())  # _uniform("usage", ...)


def demand_change(job_id: str, seed: int, variation: float) -> tuple[float, float] | None:
    """``(fraction of the work at which the demand changes, factor)``, or None when ``variation`` is 0."""
    if variation <= 0:
        return None
    keyed = _keyed(seed)
    job = job_id.encode()
    at = 0.2 + 0.6 * _fraction(keyed.demand_at, job)  # _uniform("demand-at", ...)
    return at, 1.0 - variation + 2.0 * variation * _fraction(keyed.demand_by, job)  # _uniform("demand-by", ...)


def scaled(profile: Profile, factor: float, gpu_mem_mib: int) -> Profile:
    """``profile`` with its SM use and memory need times ``factor`` (within the GPU)."""
    # Positional arguments, in field order (sm_util, mem_need_mib, mem_mean_frac, mem_bw, solo_step_s, traits,
    # usage, colocation_type): keywords cost twice as much, and every job's demand change makes one (issue 20).
    return Profile(
        min(1.0, profile.sm_util * factor),
        max(1, min(gpu_mem_mib, round(profile.mem_need_mib * factor))),
        profile.mem_mean_frac,
        min(1.0, profile.mem_bw * factor),
        profile.solo_step_s,
        profile.traits,
        min(1.0, profile.usage * factor),
        profile.colocation_type,
    )


def job_profile(
    spec: JobSpec,
    gpu_mem_mib: int,
    gpu_speed: float,
    gavel_gpu: str,
    table: ColocationTable | None,
    *,
    seed: int,
    usage_spread: float,
    batch: int | None = None,
) -> Profile:
    known = traits(spec.model)
    share = spec.gpu_milli / FULL_GPU_MILLI
    usage = usage_factor(spec.job_id, seed, usage_spread)
    need = spec.gpu_mem_mib or round(known.mem_mib * usage * share)
    step = DEFAULT_STEP_S
    coloc = known.colocation_type
    ratio = 1.0  # throughput at its batch size over the reference's (1.0: the reference, or no batch model)
    if table is not None and known is not UNKNOWN:
        steps_per_s = table.isolated.get(gavel_gpu, {}).get(known.colocation_type)
        if steps_per_s:
            step = 1.0 / steps_per_s
        curve = batch_curve(table, known, gavel_gpu) if batch is not None else None
        if curve is not None and batch is not None and batch != curve.ref_batch:
            step = curve.step_s(batch)
            ratio = curve.throughput_ratio(batch)
            need = round(need * batch_mem_factor(known, batch))
            coloc = type_at_batch(table, known, gavel_gpu, batch)
    sm = known.sm_util * usage * share
    bw = known.mem_bw * usage * share
    if ratio != 1.0:
        sm *= ratio
        bw *= ratio
    return Profile(  # positional, in field order (see scaled)
        min(1.0, sm),
        max(1, min(need, gpu_mem_mib)),
        known.mem_mean_frac,
        min(1.0, bw),
        step / max(gpu_speed, 1e-9),
        known,
        usage * share,
        coloc,
    )


def measured_pair_rates(rates: tuple[float, float], a: Profile, b: Profile) -> tuple[float, float]:
    """Gavel's measured rates of a pair, each job's loss scaled by its partner's usage (see the module docstring)."""
    return 1.0 - (1.0 - rates[0]) * min(1.0, b.usage), 1.0 - (1.0 - rates[1]) * min(1.0, a.usage)


def modelled_pair_rates(a: Profile, b: Profile, kappa: float) -> tuple[float, float]:
    """Full-activity rates of two jobs on one GPU from their profiles (for pairs Gavel did not measure)."""
    share = 1.0 / max(1.0, a.sm_util + b.sm_util)
    return share * (1.0 - kappa * b.mem_bw), share * (1.0 - kappa * a.mem_bw)


def activity(profile: Profile, share_milli: int) -> float:
    """How much of its solo speed a compute-share cap of ``share_milli`` leaves a job (1.0 = unthrottled)."""
    if profile.sm_util <= 0:
        return 1.0
    return min(1.0, share_milli / FULL_GPU_MILLI / profile.sm_util)


def spill_rate(need_mib: int, cap_mib: int | None, penalty: float) -> float:
    """Speed left to a job whose memory cap is below its need (1.0 when it fits or is uncapped)."""
    if cap_mib is None or cap_mib >= need_mib or need_mib <= 0:
        return 1.0
    spilled = (need_mib - max(0, cap_mib)) / need_mib
    return 1.0 / (1.0 + penalty * spilled)


def guest_rate(profile: Profile, held_sm: float, share_activity: float, others_sm: float = 0.0) -> float:
    """An AntMan guest's speed on a GPU with holders (1.0 = its solo speed): the guests there run in the idle
    slots the holders leave (``1 - held_sm``), each at most at its compute-share cap (``share_activity``,
    :func:`activity`); when their busy time at those caps (its own ``sm_util x share_activity`` plus
    ``others_sm``) exceeds the idle time, they share it in proportion."""
    demand = profile.sm_util * share_activity
    if demand <= 0:
        return share_activity
    idle = max(0.0, 1.0 - held_sm)
    return share_activity * min(1.0, idle / (demand + others_sm))


def pair_slowdown(pair_rate: float, partner_activity: float) -> float:
    """A job's speed factor next to one partner: its full-activity pair rate, scaled by the partner's activity."""
    return 1.0 - (1.0 - pair_rate) * partner_activity
