"""The performance model: how fast a job runs where it is placed, and what a preemption costs.

Assumptions (each configurable in :class:`PerfModel`):

- A trace's ``duration_s`` is the job's run time when placed *consolidated* (on as few nodes as its GPU count
  allows) on GPUs of speed 1.0. Traces record what happened, and production schedulers consolidate when they
  can, so this is the natural reading; it also means a replay with consolidated placement on a homogeneous
  cluster reproduces the trace's run times exactly.
- A gang runs at the pace of its slowest GPU: ``rate = speed of its GPU type``. All GPUs of a gang are of one
  type (see :mod:`corral.policies.framework.placement`).
- A job spread over more nodes than it needs runs at ``spread_rate`` of its consolidated speed, once more
  multiplied by ``cross_rack_rate`` if it also spans more than one rack. Tiresias (NSDI'19 §2.2, Fig. 4)
  measured up to ~2x slowdowns for communication-heavy models (VGG) and almost none for others (ResNet). With
  ``model_spread`` (the default), a job whose model corral knows uses that model's rate
  (:mod:`corral.workloads.models`: 0.5 for VGG-16, 0.9 for ResNet-50, ...); other jobs use ``spread_rate`` (0.8, a
  middle ground). ``cross_rack_rate`` (0.9) applies to every model.
- A job with a fractional share runs at its trace speed (its duration was measured at that share).
- Preemption: the job's state is checkpointed when it is stopped and restored when it restarts. The model
  charges both at restart: a resumed job holds its new GPUs for ``restore_s`` seconds before making progress.
  Progress is not lost to a preemption (jobs checkpoint at the preemption point, as corral's job library does).
- Node loss (``NodeLost``, :mod:`corral.sim.failures`): a job also checkpoints every ``checkpoint_interval_s``
  seconds of work (each time its progress crosses a multiple of it), and a run that starts from a checkpoint
  starts at one. A lost node takes its processes with it, without a checkpoint: every job that held a GPU there
  restarts (paying ``restore_s``) from its last checkpoint, the larger of its progress at the launch of the run
  and the last multiple of the interval it reached; the work since is lost (``lost_work_gpu_h``). A job suspended
  to that node's host memory loses that state the same way. ``checkpoint_interval_s=0``: a checkpoint at every
  step, nothing lost. The default, 30 minutes, is a common interval for long training jobs.
- Suspend/resume (``Preempt(suspend=True)``): the job stops at a mini-batch boundary and its state stays in the
  host memory of its node(s). Launched again on the same node(s) (the same set of nodes; any GPUs there) it pays
  ``suspend_resume_s`` instead of ``restore_s``; anywhere else, ``restore_s``. Gandiva (OSDI'18 §3.1) suspends at
  the mini-batch boundary, where a job's GPU memory is smallest, and reports suspend/resume costing well under a
  second for typical models, against tens of seconds for a checkpoint and restore; the default of 1 s is a
  rounded-up figure of that order. Host memory is not modelled (it is taken to be enough).
- Switching presets (``switching``, issue 19): ``assumed`` keeps ``restore_s`` and ``suspend_resume_s`` as given
  (30 s and 1 s by default: the literature's orders of magnitude); ``cold`` and ``warm`` set both to what corral's
  own live switching measured (:data:`SWITCHING`): a restart from a checkpoint into a fresh interpreter, or into a
  process forked from the node's warm workers, and a resume from host memory; ``cold-h100`` and ``warm-h100`` the
  same with the new run's start measured on an H100 (CUDA's context included). Giving a preset and either figure
  is an error.
- Packing: a whole-GPU job launched at a share below 1000 (see :mod:`corral.engine.state`) shares its GPUs with
  the other packed jobs on them. Two packed jobs run at the normalised rates Gavel measured for their models'
  job types on the GPU's type (:func:`corral.workloads.colocation.pair_rates`, with its fallback of 0.5 each for
  unknown models); with several partners a job's rate is the product of its pair rates (an extrapolation: Gavel
  measured pairs only); a gang runs at the pace of its slowest GPU. Jobs at their own asked share (whole or
  fractional) are neither slowed nor slowing: a fractional job's trace duration was measured while sharing.
- Sharing beyond Gandiva's pairs (AntMan's opportunistic jobs; pairs Gavel did not measure; compute-share caps;
  memory caps that make a job spill to host memory): :mod:`corral.sim.sharing`, with the knobs
  ``usage_spread``, ``bandwidth_kappa``, ``spill_penalty`` and ``antman_residual`` below. AntMan's guests run in
  the idle slots their holders leave, which slows the holders only by ``antman_residual``.
- Batch size (:mod:`corral.workloads.models`, :mod:`corral.workloads.batching`): a trace's ``duration_s`` is the run
  time at the model's reference batch size, and work is counted in reference-batch seconds. A job at another
  batch size ``b`` progresses at ``goodput_ratio(b)`` = throughput(b) / throughput(reference) (Gavel's measured
  samples/s on the GPU's Gavel type) x statistical efficiency(b) (Pollux's gradient-noise-scale form, the model's
  assumed noise scale), times every factor above (:meth:`BoundPerfModel.batch_rate`). Packed pairs interfere at
  the rates Gavel measured for their job types at their batch sizes. A job whose batch size nobody set runs at its
  reference: ratio 1.0, nothing differs.
- ``interference_noise`` makes the simulator's truth differ from the table a policy predicts from: each packed
  pair's two rates are multiplied by one factor drawn uniformly from ``[1 - noise, 1 + noise]`` (capped at
  1.0), the same for the whole run, from a generator seeded by ``seed`` and the pair's job ids. A policy that
  packs on the table's prediction then sees, in the observed rates, pairs that interfere more than predicted
  (Gandiva's reason to introspect and unpack, OSDI'18 §4.2). 0 (the default) = the table is the truth.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from corral.core.cluster import Topology
from corral.core.errors import ConfigError
from corral.core.job import JobSpec
from corral.core.placement import Placement
from corral.sim.sharing import Profile, job_profile, measured_pair_rates, modelled_pair_rates
from corral.workloads.batching import batch_curve, goodput_ratio, type_at_batch
from corral.workloads.colocation import FALLBACK_RATES, ColocationTable, gavel_gpu, load_colocation, pair_rates
from corral.workloads.models import UNKNOWN, traits

# Measured switching costs, seconds: (restore_s, suspend_resume_s). restore_s: a preempted job's checkpoint, exit,
# new run and first step resumed, on the 2-core CPU machine, a 512-wide MLP with Adam (benchmarks/bench_switch.py,
# median of 10: cold 2.26 s, warm 0.099 s; CUDA's own start and the copy to a GPU are not in them). The -h100
# presets put the GPU in: the new run's launch to its first step on an H100 (docs/measurements.md, section 6: a small
# model resumed, cold 3.41 s, warm 0.331 s, CUDA's context made in both) plus the checkpoint and exit as measured on
# the CPU (0.661 s cold, 0.062 s warm; not measured on the GPU). suspend_resume_s: a resume from pinned host memory
# plus its first step, less a normal step, on an H100 (docs/measurements.md, section 4: 25-34 ms for ResNet-50,
# 44-52 ms for a BERT-base-sized encoder): 0.05 s.
SWITCHING: dict[str, tuple[float, float]] = {
    "cold": (2.26, 0.05),
    "warm": (0.099, 0.05),
    "cold-h100": (0.661 + 3.41, 0.05),
    "warm-h100": (0.062 + 0.331, 0.05),
}
_RESTORE_S, _SUSPEND_RESUME_S = 30.0, 1.0  # the assumed defaults


@dataclass(frozen=True, slots=True)
class PerfModel:
    spread_rate: float = field(default=0.8, metadata={"help": "speed of a job spread over more nodes than needed"})
    cross_rack_rate: float = field(default=0.9, metadata={"help": "extra factor when such a job spans racks"})
    restore_s: float = field(default=_RESTORE_S, metadata={"help": "checkpoint + restore seconds paid at each restart"})
    gpu_speed: bool = field(default=True, metadata={"help": "use the GPU types' relative speeds"})
    model_spread: bool = field(
        default=True, metadata={"help": "a known model's own spread rate instead of spread_rate (workloads.models)"}
    )
    suspend_resume_s: float = field(
        default=_SUSPEND_RESUME_S,
        metadata={"help": "seconds a suspended job pays to resume on the node(s) it was suspended on"},
    )
    switching: str = field(
        default="assumed",
        metadata={
            "help": "restore_s and suspend_resume_s: assumed (as given), or measured on corral's live switching: "
            "cold (a fresh interpreter) or warm (forked from the warm workers), on the CPU; cold-h100 or warm-h100, "
            "the new run's start measured on an H100"
        },
    )
    interference_noise: float = field(
        default=0.0, metadata={"help": "packed pairs' true rates = table rates x U(1-noise, 1+noise), per pair"}
    )
    seed: int = field(default=0, metadata={"help": "seed of the interference noise and usage draws"})
    usage_spread: float = field(
        default=0.5, metadata={"help": "each job uses its model's SM and memory x U(1-spread, 1) (sim.sharing)"}
    )
    bandwidth_kappa: float = field(
        default=0.3, metadata={"help": "speed lost per unit of a partner's memory-bandwidth use (sim.sharing)"}
    )
    demand_variation: float = field(
        default=0.3, metadata={"help": "each job's SM/memory demand changes once mid-run by U(1-v, 1+v) (sim.sharing)"}
    )
    spill_penalty: float = field(
        default=2.0, metadata={"help": "slowdown per fraction of a job's memory spilled to host (sim.sharing)"}
    )
    antman_residual: float = field(
        default=0.02,
        metadata={"help": "speed a holder loses per unit of an AntMan guest's activity beside it (sim.sharing)"},
    )
    checkpoint_interval_s: float = field(
        default=1800.0,
        metadata={
            "help": "seconds of work between a job's checkpoints; a lost node loses the work since (0: none lost)"
        },
    )

    @classmethod
    def neutral(cls) -> PerfModel:
        """Every job at rate 1.0 from start to end: no locality penalty, no GPU speed, no restore or resume cost,
        no demand variation. On it a replay's times are those of a bare scheduler's (the live-parity tests, the
        bare-bones reference of benchmarks/bare_fifo.py)."""
        return cls(
            spread_rate=1.0,
            cross_rack_rate=1.0,
            model_spread=False,
            gpu_speed=False,
            restore_s=0.0,
            suspend_resume_s=0.0,
            demand_variation=0.0,
        )

    def __post_init__(self) -> None:
        if self.switching != "assumed":
            measured = SWITCHING.get(self.switching)
            if measured is None:
                raise ConfigError(
                    f"perf model: switching must be assumed, {' or '.join(SWITCHING)}, got {self.switching!r}"
                )
            given = (self.restore_s, self.suspend_resume_s)
            if given not in ((_RESTORE_S, _SUSPEND_RESUME_S), measured):  # (a copy by replace() gives the preset's)
                raise ConfigError(
                    "perf model: give switching or restore_s/suspend_resume_s, not both "
                    f"(switching={self.switching} sets them to {measured[0]:g} s and {measured[1]:g} s)"
                )
            object.__setattr__(self, "restore_s", measured[0])  # frozen: set once, here
            object.__setattr__(self, "suspend_resume_s", measured[1])
        for name in ("spread_rate", "cross_rack_rate"):
            value = getattr(self, name)
            if not 0 < value <= 1:
                raise ConfigError(f"perf model: {name} must be in (0, 1], got {value}")
        for name in ("restore_s", "suspend_resume_s"):
            value = getattr(self, name)
            if not 0 <= value < float("inf"):
                raise ConfigError(f"perf model: {name} must be finite and >= 0, got {value}")
        if not 0 <= self.interference_noise < 1:
            raise ConfigError(f"perf model: interference_noise must be in [0, 1), got {self.interference_noise}")
        for name in ("usage_spread", "bandwidth_kappa", "demand_variation", "antman_residual"):
            value = getattr(self, name)
            if not 0 <= value < 1:
                raise ConfigError(f"perf model: {name} must be in [0, 1), got {value}")
        if not 0 <= self.checkpoint_interval_s < float("inf"):
            raise ConfigError(
                f"perf model: checkpoint_interval_s must be finite and >= 0, got {self.checkpoint_interval_s}"
            )
        if not 0 <= self.spill_penalty < float("inf"):
            raise ConfigError(f"perf model: spill_penalty must be finite and >= 0, got {self.spill_penalty}")

    def bind(self, topology: Topology) -> BoundPerfModel:
        return BoundPerfModel(self, topology)

    def last_checkpoint(self, checkpoint_s: float, done_s: float) -> float:
        """The progress a job restarts from after losing its process at ``done_s`` of work, its last explicit
        checkpoint (a launch from one, a preemption) being at ``checkpoint_s``: that, or the last multiple of
        ``checkpoint_interval_s`` it reached since, whichever is later (see the module docstring)."""
        every = self.checkpoint_interval_s
        if every <= 0:
            return done_s
        return min(done_s, max(checkpoint_s, math.floor(done_s / every) * every))


class BoundPerfModel:
    """The model specialised to one cluster (precomputes per-type node sizes)."""

    __slots__ = ("_gavel_gpu", "_max_node", "_noise", "_table", "model", "topo")

    def __init__(self, model: PerfModel, topology: Topology) -> None:
        self.model = model
        self.topo = topology
        max_node = [0] * len(topology.type_names)
        for n in range(topology.num_nodes):
            t = topology.node_type[n]
            max_node[t] = max(max_node[t], topology.node_num_gpus[n])
        self._max_node = max_node
        self._table: ColocationTable | None = None  # loaded on the first packed pair
        self._gavel_gpu = tuple(
            gavel_gpu(name, mem, speed)
            for name, mem, speed in zip(topology.type_names, topology.type_mem_mib, topology.type_speed, strict=True)
        )
        self._noise: dict[tuple[str, str], float] = {}

    def table(self) -> ColocationTable:
        table = self._table
        if table is None:
            table = self._table = load_colocation()
        return table

    def profile(self, spec: JobSpec, gpu: int, batch: int | None = None) -> Profile:
        """The job's resource profile on ``gpu``'s type at batch size ``batch`` (see :mod:`corral.sim.sharing`)."""
        topo = self.topo
        t = topo.gpu_type[gpu]
        model = self.model
        return job_profile(
            spec,
            topo.type_mem_mib[t],
            topo.type_speed[t] if model.gpu_speed else 1.0,
            self._gavel_gpu[t],
            self.table() if spec.model is not None else None,
            seed=model.seed,
            usage_spread=model.usage_spread,
            batch=batch,
        )

    def batch_rate(self, spec: JobSpec, gpu: int, batch: int | None) -> float:
        """Work done per second at ``batch`` relative to the reference batch size, on ``gpu``'s type: the goodput
        ratio of :mod:`corral.workloads.batching` (exactly 1.0 for ``None``, the reference, or no batch model)."""
        if batch is None or spec.model is None:
            return 1.0
        known = traits(spec.model)
        if known is UNKNOWN or batch == known.ref_batch:
            return 1.0
        curve = batch_curve(self.table(), known, self._gavel_gpu[self.topo.gpu_type[gpu]])
        return goodput_ratio(curve, known, batch)

    def pair_rates(
        self, a: JobSpec, b: JobSpec, gpu: int, batch_a: int | None = None, batch_b: int | None = None
    ) -> tuple[float, float]:
        """True normalised rates of ``a`` and ``b`` packed on ``gpu`` at batch sizes ``batch_a`` and ``batch_b``:
        the co-location table's, times the pair's noise factor (see the module docstring)."""
        column = self._gavel_gpu[self.topo.gpu_type[gpu]]
        if batch_a is None and batch_b is None:
            rate_a, rate_b = pair_rates(self.table(), a.model, b.model, column)
        else:
            table = self.table()
            type_a = type_at_batch(table, traits(a.model), column, batch_a)
            type_b = type_at_batch(table, traits(b.model), column, batch_b)
            rates = table.rates(type_a, type_b, column) if type_a and type_b else None
            rate_a, rate_b = FALLBACK_RATES if rates is None else rates
        return self._noisy(a, b, rate_a, rate_b)

    def sharing_rates(self, a: JobSpec, pa: Profile, b: JobSpec, pb: Profile, gpu: int) -> tuple[float, float]:
        """Full-activity rates of ``a`` and ``b`` on ``gpu``: Gavel's measured pair when there is one, else the
        profile model of :mod:`corral.sim.sharing`; times the pair's noise factor."""
        type_a, type_b = pa.colocation_type, pb.colocation_type
        rates = None
        if type_a and type_b:
            rates = self.table().rates(type_a, type_b, self._gavel_gpu[self.topo.gpu_type[gpu]])
        if rates is None:
            rates = modelled_pair_rates(pa, pb, self.model.bandwidth_kappa)
        else:
            rates = measured_pair_rates(rates, pa, pb)
        return self._noisy(a, b, rates[0], rates[1])

    def _noisy(self, a: JobSpec, b: JobSpec, rate_a: float, rate_b: float) -> tuple[float, float]:
        noise = self.model.interference_noise
        if noise:
            factor = self.noise_factor(a.job_id, b.job_id)
            rate_a, rate_b = min(1.0, rate_a * factor), min(1.0, rate_b * factor)
        return rate_a, rate_b

    def noise_factor(self, x: str, y: str) -> float:
        """The multiplicative noise of the pair of jobs ``x`` and ``y`` (1.0 without noise): drawn once per pair."""
        key = (x, y) if x <= y else (y, x)
        factor = self._noise.get(key)
        if factor is None:
            noise = self.model.interference_noise
            # A string seed is hashed with SHA-512 by `random`: the same on every run and platform.
            rng = random.Random(f"{self.model.seed}:{key[0]}:{key[1]}")
            factor = self._noise[key] = rng.uniform(1.0 - noise, 1.0 + noise)
        return factor

    def speed(self, gpu: int) -> float:
        """The speed of ``gpu``'s type as the model counts it (1.0 for every type without ``gpu_speed``): the
        pace :meth:`rate` starts from, and the pace of a job's time alone in its finish-time fairness
        (:mod:`corral.sim.metrics`)."""
        return self.topo.gpu_speed[gpu] if self.model.gpu_speed else 1.0

    def rate(self, spec: JobSpec, placement: Placement) -> float:
        """Progress per second (1.0 = the trace's pace)."""
        topo = self.topo
        gpus = placement.gpus
        first = gpus[0]
        rate = topo.gpu_speed[first] if self.model.gpu_speed else 1.0
        if len(gpus) > 1:
            node_of = topo.gpu_node
            nodes = {node_of[g] for g in gpus}
            needed = -(-len(gpus) // self._max_node[topo.gpu_type[first]])
            if len(nodes) > needed:
                known = traits(spec.model) if self.model.model_spread else UNKNOWN
                rate *= known.spread_rate if known is not UNKNOWN else self.model.spread_rate
                rack_of = topo.node_rack
                if len({rack_of[n] for n in nodes}) > 1:
                    rate *= self.model.cross_rack_rate
        return rate
