"""IADeep's online interference predictor: how much a job slows down beside the jobs already on a GPU.

IADeep (Chen et al., "Interference-Aware Multiplexing for Deep Learning in GPU Clusters: A Middleware Approach",
SC'23) places each new task by a prediction of the interference it would suffer and cause, made from the tasks'
features by a model that keeps learning from the co-locations it observes (the scheduler part of the paper). This
module is corral's rendering of that predictor: small, deterministic, pure Python, documented below.

**Target.** The *slowdown* of job x beside partner y: ``s = -ln(rate)``, where ``rate`` is x's speed beside y
relative to alone at the same batch size (1.0 = no interference), as the executor reports it
(``JobView.observed_rate``; the step time over the solo step time in telemetry). Slowdowns from several partners
add (rates multiply: the extrapolation the simulator also makes, since pairs are what was measured).

**Features** (:class:`JobFeatures`) of each job: its Gavel job family (categorical: the model, or the model it
stands in for), its batch size (``log2`` of it over the reference), its SM busy fraction and memory-bandwidth
fraction alone at that batch size (the model catalogue's, scaled by the throughput ratio), and its GPU memory
need over the GPU's memory. These are what corral knows of a job before it runs, the counterpart of the paper's
profiled per-task features.

**Model**, per GPU type, two levels of ridge regression:

1. a *shared* linear model of the pair features (:func:`shared_features`: both jobs' SM and bandwidth use and
   their products, their memory together, their batch sizes), which generalises to any pair, models corral does
   not know included;
2. a *per family pair* correction ``a + b x log_batch_x + c x log_batch_y`` fitted to what the shared model
   leaves over, shrunk towards 0 by its own ridge penalty: the families Gavel measured have very specific
   interference that one linear model of resource use does not capture (on the V100 column the shared model alone
   misses by 0.20 in rate (root mean square), with the corrections by 0.10).

Both are kept as sufficient statistics (``lambda I + sum w phi phi^T``, ``sum w phi s``) and re-solved, lazily,
by a Cholesky factorisation: an observation costs O(d^2) with d = 12.

**Warm start** from Gavel's measured pairs (``gavel-throughputs``, :mod:`corral.workloads.colocation`): every pair
of its 26 job types on the Gavel GPU type that stands for the cluster's type, each with weight 1. A pair Gavel
measured at 0 (it did not fit in GPU memory together) is not a slowdown to regress on: it is recorded as a
*stall* (predicted rate 0, never co-located), as is any pair later observed at a rate below ``stall_rate``.

**Online learning**: each observed co-location adds one sample with weight ``learn_weight`` (default 4: what
happens on this cluster counts more than a benchmark of other hardware). A sample for a single partner also
updates the family-pair correction. The same co-location (same jobs, same batch sizes) counts once.

Everything is a function of the order of observations, which the engine makes deterministic.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass

from corral.core.errors import ConfigError
from corral.policies.iadeep.gp import cho_solve, cholesky
from corral.workloads.batching import batch_curve
from corral.workloads.colocation import GAVEL_GPUS, ColocationTable
from corral.workloads.models import MODELS, ModelTraits, batch_mem_factor

SHARED_DIM = 12
PAIR_DIM = 3


@dataclass(frozen=True, slots=True)
class JobFeatures:
    """What the predictor knows of one job at one batch size (see the module docstring)."""

    family: str  # Gavel job family ("" for a model corral does not know)
    job_type: str  # Gavel job type at its batch size ("" for none)
    log_batch: float  # log2(batch / reference batch); 0 at the reference or when not tunable
    sm: float  # SM busy fraction alone at this batch size, 0..1
    bw: float  # memory-bandwidth fraction alone, 0..1
    mem: float  # GPU memory need / the GPU's memory

    # Written out (a test checks it against the fields): the compiled core runs a dataclass's generated __init__ as
    # interpreted code, and the predictor makes these for every job it weighs (issue 20; setup.py).
    def __init__(self, family: str, job_type: str, log_batch: float, sm: float, bw: float, mem: float) -> None:
        object.__setattr__(self, "family", family)
        object.__setattr__(self, "job_type", job_type)
        object.__setattr__(self, "log_batch", log_batch)
        object.__setattr__(self, "sm", sm)
        object.__setattr__(self, "bw", bw)
        object.__setattr__(self, "mem", mem)


def job_features(
    table: ColocationTable | None,
    model: ModelTraits,
    column: str,
    batch: int | None,
    mem_mib: float,
    gpu_mem_mib: int,
    job_type: str,
) -> JobFeatures:
    """The features of a job training ``model`` at ``batch`` on a GPU of Gavel type ``column`` with
    ``gpu_mem_mib`` of memory, needing ``mem_mib`` there (``job_type``: its Gavel type at that batch size)."""
    curve = batch_curve(table, model, column) if table is not None else None
    ratio = curve.throughput_ratio(batch) if curve is not None else 1.0
    ref = model.ref_batch
    log_batch = math.log2(batch / ref) if curve is not None and batch and ref else 0.0
    return JobFeatures(
        family=model.family,
        job_type=job_type,
        log_batch=log_batch,
        sm=min(1.0, model.sm_util * ratio),
        bw=min(1.0, model.mem_bw * ratio),
        mem=mem_mib / max(gpu_mem_mib, 1),
    )


# Memory of the GPUs Gavel measured on (MiB): a K80 die has 12 GiB, the P100 and V100 16 GiB.
GAVEL_GPU_MEM_MIB = {"k80": 12 * 1024, "p100": 16 * 1024, "v100": 16 * 1024}


def gavel_features(table: ColocationTable) -> list[tuple[str, JobFeatures]]:
    """``(column, features)`` of every Gavel job type on each Gavel GPU type, from the catalogue model measured as
    that family (its memory at the type's batch size is the catalogue's, as a job before any report)."""
    family_model: dict[str, ModelTraits] = {}
    for m in MODELS.values():
        if m.measured:
            family_model.setdefault(m.family, m)
    out: list[tuple[str, JobFeatures]] = []
    for column in GAVEL_GPUS:
        for job_type in sorted(table.isolated.get(column, {})):
            family = job_type.split(" (batch size ")[0]
            model = family_model.get(family)
            if model is None:
                continue
            batch = int(job_type.rsplit(" ", 1)[1].rstrip(")")) if " (batch size " in job_type else None
            mem = model.mem_mib * batch_mem_factor(model, batch)
            out.append((column, job_features(table, model, column, batch, mem, GAVEL_GPU_MEM_MIB[column], job_type)))
    return out


def shared_features(x: JobFeatures, y: JobFeatures) -> tuple[float, ...]:
    """The shared model's features of "x beside y" (not symmetric: the first job is the one slowed)."""
    return (
        1.0,
        x.sm,
        y.sm,
        x.sm * y.sm,
        x.bw,
        y.bw,
        x.bw * y.bw,
        x.mem + y.mem,
        x.log_batch,
        y.log_batch,
        y.sm * y.log_batch,
        x.sm * x.log_batch,
    )


def pair_features(x: JobFeatures, y: JobFeatures) -> tuple[float, ...]:
    return (1.0, x.log_batch, y.log_batch)


class Ridge:
    """Weighted ridge regression kept as sufficient statistics; solved when asked after a change."""

    __slots__ = ("_a", "_b", "_w", "count", "dim", "lam")

    def __init__(self, dim: int, lam: float) -> None:
        self.dim = dim
        self.lam = lam
        self._a = [[lam if i == j else 0.0 for j in range(dim)] for i in range(dim)]
        self._b = [0.0] * dim
        self._w: list[float] | None = [0.0] * dim
        self.count = 0

    def copy(self) -> Ridge:
        # Made by its constructor, then overwritten: a compiled class (setup.py) is not made by ``Ridge.__new__``.
        other = Ridge(self.dim, self.lam)
        other.count = self.count
        other._a = [row[:] for row in self._a]
        other._b = self._b[:]
        other._w = None if self._w is None else self._w[:]
        return other

    def add(self, phi: Sequence[float], target: float, weight: float = 1.0) -> None:
        a, b = self._a, self._b
        for i, pi in enumerate(phi):
            if pi == 0.0:
                continue
            wpi = weight * pi
            row = a[i]
            for j, pj in enumerate(phi):
                row[j] += wpi * pj
            b[i] += wpi * target
        self._w = None
        self.count += 1

    @property
    def weights(self) -> list[float]:
        w = self._w
        if w is None:
            w = self._w = cho_solve(cholesky(self._a), self._b)
        return w

    def predict(self, phi: Sequence[float]) -> float:
        return sum((wi * pi for wi, pi in zip(self.weights, phi, strict=True)), 0.0)


class _GpuModel:
    """The predictor for one GPU type: the shared model, the family-pair corrections and the stalls."""

    __slots__ = ("cache", "pairs", "shared", "stalls", "version")

    def __init__(self, shared: Ridge, pairs: dict[tuple[str, str], Ridge], stalls: set[tuple[str, str]]) -> None:
        self.shared = shared
        self.pairs = pairs
        self.stalls = stalls
        self.cache: dict[tuple[JobFeatures, JobFeatures], float] = {}  # predictions since the last observation
        self.version = 0  # bumped by every observation

    def copy(self) -> _GpuModel:
        """A fresh model with the same knowledge (its own cache and version)."""
        return _GpuModel(self.shared.copy(), {k: r.copy() for k, r in self.pairs.items()}, set(self.stalls))


class InterferencePredictor:
    """Predicts co-location rates per GPU type (keyed by any name, warm-started from a Gavel column)."""

    def __init__(
        self,
        table: ColocationTable | None,
        features: Iterable[tuple[str, JobFeatures]] = (),
        *,
        ridge: float = 1.0,
        pair_ridge: float = 1.0,
        learn_weight: float = 4.0,
        stall_rate: float = 0.02,
    ) -> None:
        """``features`` gives the :class:`JobFeatures` of each Gavel job type, per Gavel GPU column, as
        ``(column, features)`` pairs (the policy builds them from the model catalogue); with no table or no
        features the predictor starts from nothing (every slowdown 0 until it observes)."""
        for name, value in (("ridge", ridge), ("pair_ridge", pair_ridge)):
            if not value > 0:
                raise ConfigError(f"interference predictor: {name} must be > 0, got {value}")
        if not learn_weight > 0:
            raise ConfigError(f"interference predictor: learn_weight must be > 0, got {learn_weight}")
        if not 0 <= stall_rate < 1:
            raise ConfigError(f"interference predictor: stall_rate must be in [0, 1), got {stall_rate}")
        self.ridge = ridge
        self.pair_ridge = pair_ridge
        self.learn_weight = learn_weight
        self.stall_rate = stall_rate
        self._table = table
        self._features: dict[str, dict[str, JobFeatures]] = {}
        for column, f in features:
            self._features.setdefault(column, {})[f.job_type] = f
        self._warm: dict[str, _GpuModel] = {}  # Gavel column -> warm-started model (copied for each GPU key)
        self._models: dict[str, _GpuModel] = {}  # GPU key -> its model
        self._seen: dict[str, set[Hashable]] = {}  # observed job -> the co-locations of it already learnt from
        self.errors: list[float] = []  # |predicted - observed| rate of each observation, before learning from it

    # -- models ---------------------------------------------------------------------------------------------------
    def _model(self, key: str, column: str) -> _GpuModel:
        got = self._models.get(key)
        if got is None:
            warm = self._warm.get(column)
            if warm is None:
                warm = self._warm[column] = self._warm_start(column)
            got = self._models[key] = warm.copy()
        return got

    def _warm_start(self, column: str) -> _GpuModel:
        shared = Ridge(SHARED_DIM, self.ridge)
        pairs: dict[tuple[str, str], Ridge] = {}
        stalls: set[tuple[str, str]] = set()
        known = self._features.get(column, {})
        table = self._table
        samples: list[tuple[JobFeatures, JobFeatures, float]] = []
        if table is not None and known:
            for (type_a, type_b), _ in sorted(table.packed.get(column, {}).items()):
                fa, fb = known.get(type_a), known.get(type_b)
                rates = table.rates(type_a, type_b, column)
                if fa is None or fb is None or rates is None:
                    continue
                if rates[0] <= self.stall_rate:
                    stalls.add((type_a, type_b))
                    continue
                samples.append((fa, fb, -math.log(rates[0])))
        for fa, fb, s in samples:
            shared.add(shared_features(fa, fb), s)
        for fa, fb, s in samples:
            residual = s - shared.predict(shared_features(fa, fb))
            key = (fa.family, fb.family)
            ridge = pairs.get(key)
            if ridge is None:
                ridge = pairs[key] = Ridge(PAIR_DIM, self.pair_ridge)
            ridge.add(pair_features(fa, fb), residual)
        return _GpuModel(shared, pairs, stalls)

    # -- predictions ----------------------------------------------------------------------------------------------
    def slowdown(self, x: JobFeatures, y: JobFeatures, key: str, column: str) -> float:
        """Predicted ``-ln(rate)`` of x beside y (``inf``: a stall), never below 0."""
        model = self._model(key, column)
        got = model.cache.get((x, y))
        if got is not None:
            return got
        if x.job_type and y.job_type and (x.job_type, y.job_type) in model.stalls:
            s = math.inf
        else:
            s = model.shared.predict(shared_features(x, y))
            pair = model.pairs.get((x.family, y.family)) if x.family and y.family else None
            if pair is not None:
                s += pair.predict(pair_features(x, y))
            s = max(0.0, s)
        model.cache[(x, y)] = s
        return s

    def version(self, key: str, column: str) -> int:
        """How many observations GPU ``key``'s model has learnt from: predictions change only when it does."""
        return self._model(key, column).version

    def rate(self, x: JobFeatures, partners: Sequence[JobFeatures], key: str, column: str) -> float:
        """Predicted speed of x beside ``partners`` relative to alone (0.0: a stall)."""
        total = 0.0
        for y in partners:
            total += self.slowdown(x, y, key, column)
            if total == math.inf:
                return 0.0
        return math.exp(-total)

    # -- learning -------------------------------------------------------------------------------------------------
    def observe(
        self,
        x: JobFeatures,
        partners: Sequence[JobFeatures],
        key: str,
        column: str,
        rate: float,
        *,
        seen: tuple[str, Hashable] | None = None,
    ) -> bool:
        """Learn from one observed co-location: x ran at ``rate`` beside ``partners``. ``seen`` = (x's job id, what
        identifies the co-location: partners and batch sizes): a co-location already learnt from is ignored.
        Returns whether the observation was used."""
        if not partners:
            return False
        if seen is not None:
            done = self._seen.setdefault(seen[0], set())
            if seen[1] in done:
                return False
            done.add(seen[1])
        model = self._model(key, column)
        self.errors.append(abs(self.rate(x, partners, key, column) - rate))
        model.cache.clear()
        model.version += 1
        if rate <= self.stall_rate:
            if len(partners) == 1 and x.job_type and partners[0].job_type:
                model.stalls.add((x.job_type, partners[0].job_type))
            return True
        s = -math.log(min(1.0, rate))
        phi = [0.0] * SHARED_DIM
        for y in partners:
            for i, v in enumerate(shared_features(x, y)):
                phi[i] += v
        w = self.learn_weight
        if len(partners) == 1 and x.family and partners[0].family:
            y = partners[0]
            residual = s - model.shared.predict(phi)
            fam = (x.family, y.family)
            ridge = model.pairs.get(fam)
            if ridge is None:
                ridge = model.pairs[fam] = Ridge(PAIR_DIM, self.pair_ridge)
            ridge.add(pair_features(x, y), residual, w)
        model.shared.add(phi, s, w)
        return True

    def forget(self, job_id: str) -> None:
        """``job_id`` left: drop what identified its co-locations (what it taught the model stays)."""
        self._seen.pop(job_id, None)
