"""IADeep's batch-size tuner: GP-LCB over the batch sizes of the jobs sharing a GPU, within its memory.

IADeep (SC'23) lowers the interference between co-located tasks by changing their training configuration, chiefly
the batch size, rather than by throttling kernels: a smaller batch leaves more of the GPU to a partner, a larger
one amortises a step's fixed costs, and each changes how much a sample teaches (statistical efficiency). The
tuner searches the joint configuration of the tasks on one device with Bayesian optimisation (GP-LCB) under the
device's memory, predicted for each task by a polynomial of its batch size fitted to what it used. This module
is that search, for one GPU at a time; :mod:`corral.policies.iadeep.policy` decides when to run it.

**Objective** (minimised): the jobs' total *performance degradation*. For job j at batch size b_j beside the
others at theirs, its progress rate relative to running alone at its reference batch size is
``P_j = I_j x T_j(b_j) x E_j(b_j)``: interference (its speed beside the others over alone, at b_j), throughput
ratio (samples/s at b_j over the reference's) and statistical efficiency (per-sample progress, Pollux's form); its
degradation is ``D_j = 1 / P_j``, the factor by which its remaining work takes longer than alone at the reference.
The configuration's score is ``sum_j D_j``. The *prior* score comes from the interference predictor and the
batch curves (:func:`degradation`); the *measured* score from the jobs' telemetry (their step times beside each
other over alone).

**GP-LCB** (:class:`GroupTuner`): a Gaussian process over the configurations, inputs ``log2(b_j / reference)``
per job, models the measured score minus the prior one (so with no observation the tuner trusts the prior, and
each measurement corrects it around the configurations tried). The next configuration is the feasible one with
the least ``prior + mean - sqrt(scale x beta_t) x sd``, with Srinivas et al.'s ``beta_t``
(:func:`corral.policies.iadeep.gp.lcb_beta`) scaled down by ``scale`` as practical Bayesian optimisation does. After
``steps`` measurements, or when the LCB picks a configuration already measured (nothing left worth trying), the
tuner settles on the best one measured.

**Memory** (:class:`MemoryCurve`): each job's GPU memory need against its batch size is a polynomial of degree at
most 2 fitted by least squares to the needs it reported (degree 0 or 1 when it reported at one or two batch
sizes), never below what it reported at a smaller batch size; with no report, the model catalogue's linear curve
(an upper bound of what the simulator draws). A report more than ``tolerance`` away from the curve at its own
batch size means the job's footprint changed (a new phase of training): the older reports are dropped. A
configuration is *feasible* when the jobs' predicted needs, each plus a margin, fit in the memory the GPU has for
them; the tuner never proposes any other.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from corral.core.errors import ConfigError
from corral.policies.iadeep.gp import GaussianProcess, cho_solve, cholesky, lcb_beta
from corral.workloads.models import ModelTraits, batch_mem_factor

Config = tuple[int, ...]


class MemoryCurve:
    """One job's GPU memory need (MiB) against its batch size (see the module docstring)."""

    __slots__ = ("_fit", "_points", "_predicted", "model", "ref_mib", "tolerance")

    def __init__(self, ref_mib: float, model: ModelTraits, tolerance: float = 0.1) -> None:
        self.ref_mib = ref_mib  # the need at the reference batch size, before any report (the prior)
        self.model = model
        self.tolerance = tolerance
        self._points: dict[int, float] = {}
        self._fit: list[float] | None = None  # polynomial coefficients in x = batch / scale, lowest first
        # predict()'s answers by batch size until the curve changes: a round asks for the same few many times
        self._predicted: dict[int, float] = {}

    @property
    def points(self) -> dict[int, float]:
        """Reported needs by batch size (the current phase only)."""
        return dict(self._points)

    def prior(self, batch: int | None) -> float:
        return self.ref_mib * batch_mem_factor(self.model, batch)

    def observe(self, batch: int | None, need_mib: float) -> bool:
        """Record a reported need at ``batch``; returns whether the curve changed (a new or different report)."""
        key = _key(batch, self.model)
        if self._points.get(key) == float(need_mib):
            return False
        if self._points:
            others = {b: m for b, m in self._points.items() if b != key}
            expected = self.predict(batch) if not others else self._predict_from(others, key)
            if abs(need_mib - expected) > self.tolerance * max(expected, 1.0):
                self._points.clear()  # the footprint changed: a new phase of training
        self._points[key] = float(need_mib)
        self._fit = None
        self._predicted.clear()
        return True

    def predict(self, batch: int | None) -> float:
        """Predicted need at ``batch``, MiB."""
        key = _key(batch, self.model)
        got = self._predicted.get(key)
        if got is None:
            got = self._predicted[key] = self._predict_from(self._points, key)
        return got

    def _predict_from(self, points: dict[int, float], b: int) -> float:
        if not points:
            return self.prior(b)
        xs = sorted(points)
        if len(xs) == 1:
            b0 = xs[0]
            base = self.prior(b0)
            return points[b0] * (self.prior(b) / base if base > 0 else 1.0)
        if points is self._points and self._fit is not None:
            coeffs = self._fit
        else:
            coeffs = _polyfit([x / xs[-1] for x in xs], [points[x] for x in xs], min(2, len(xs) - 1))
            if points is self._points:
                self._fit = coeffs
        x = b / xs[-1]
        value = sum((c * x**i for i, c in enumerate(coeffs)), 0.0)
        # Memory does not shrink as the batch grows: never below a report at a batch size at most b.
        floor = max((points[x0] for x0 in xs if x0 <= b), default=0.0)
        return max(value, floor, 0.0)


def _key(batch: int | None, model: ModelTraits) -> int:
    if batch is not None:
        return batch
    return model.ref_batch or 1


def _polyfit(xs: Sequence[float], ys: Sequence[float], degree: int) -> list[float]:
    """Least-squares polynomial coefficients (lowest first) of ``degree`` through the points."""
    d = degree + 1
    a = [[sum((x ** (i + j) for x in xs), 0.0) for j in range(d)] for i in range(d)]
    for i in range(d):
        a[i][i] += 1e-12
    b = [sum((y * x**i for x, y in zip(xs, ys, strict=True)), 0.0) for i in range(d)]
    return cho_solve(cholesky(a), b)


@dataclass(frozen=True, slots=True)
class TunerConfig:
    steps: int = 6  # measurements before settling on the best
    delta: float = 0.1  # GP-LCB confidence 1 - delta
    scale: float = 0.2  # multiplies beta_t
    length: float = 1.0  # GP length scale, in doublings of a batch size
    signal: float = 0.09  # GP signal variance per job (score units squared)
    noise: float = 1e-4  # GP noise variance per job
    max_configs: int = 256  # configurations considered at most (the grid is cut to this)

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ConfigError(f"tuner: steps must be >= 1, got {self.steps}")
        if not 0 < self.delta < 1:
            raise ConfigError(f"tuner: delta must be in (0, 1), got {self.delta}")
        if not self.scale >= 0:
            raise ConfigError(f"tuner: scale must be >= 0, got {self.scale}")
        if not self.length > 0 or not self.signal > 0 or not self.noise >= 0:
            raise ConfigError("tuner: need length > 0, signal > 0 and noise >= 0")
        if self.max_configs < 1:
            raise ConfigError(f"tuner: max_configs must be >= 1, got {self.max_configs}")


def config_grid(choices: Sequence[Sequence[int]], current: Config, limit: int) -> list[Config]:
    """Every combination of each job's batch-size choices (the current configuration first), cut to ``limit`` by
    keeping, job by job, the choices nearest its current size when the product is too large."""
    opts = [list(c) if c else [cur] for c, cur in zip(choices, current, strict=True)]
    while math.prod(len(o) for o in opts) > limit:
        widest = max(range(len(opts)), key=lambda i: (len(opts[i]), -i))
        cur = current[widest]
        far = max(opts[widest], key=lambda b: (abs(math.log(b / cur)), b))
        opts[widest].remove(far)
    grid = [tuple(c) for c in itertools.product(*opts)]
    if current in grid:
        grid.remove(current)
    return [current, *grid]


class GroupTuner:
    """GP-LCB over the batch sizes of one GPU's co-located jobs (see the module docstring)."""

    __slots__ = ("_gp", "cfg", "configs", "done", "members", "observed", "prior", "progress", "refs")

    def __init__(
        self,
        members: tuple[str, ...],
        choices: Sequence[Sequence[int]],
        current: Config,
        refs: Sequence[int],
        cfg: TunerConfig,
    ) -> None:
        self.members = members
        self.cfg = cfg
        self.refs = tuple(refs)
        self.configs = config_grid(choices, current, cfg.max_configs)
        n = len(members)
        self._gp = GaussianProcess(cfg.length, cfg.signal * n, cfg.noise * n)
        self.observed: dict[Config, float] = {}  # measured score by configuration
        self.prior: dict[Config, float] = {}  # the prior score each measured configuration had
        self.progress: dict[Config, float] = {}  # the jobs' total progress measured there, when the caller gave it
        self.done = False

    def _x(self, config: Config) -> tuple[float, ...]:
        return tuple(math.log2(max(b, 1) / max(r, 1)) for b, r in zip(config, self.refs, strict=True))

    def record(self, config: Config, measured: float, prior: float, progress: float | None = None) -> None:
        """A measurement of ``config``: its score was ``measured`` where the prior said ``prior`` (and the jobs'
        total progress rate ``progress``, kept for the caller)."""
        self.observed[config] = measured
        self.prior[config] = prior
        if progress is not None:
            self.progress[config] = progress
        configs = list(self.observed)
        self._gp.fit([self._x(c) for c in configs], [self.observed[c] - self.prior[c] for c in configs])
        if len(self.observed) >= self.cfg.steps:
            self.done = True

    def lcb(self, config: Config, prior: float) -> float:
        mean, var = self._gp.predict(self._x(config))
        beta = self.cfg.scale * lcb_beta(len(self.configs), len(self.observed) + 1, self.cfg.delta)
        return prior + mean - math.sqrt(beta * var)

    def propose(self, prior: Callable[[Config], float], feasible: Callable[[Config], bool]) -> Config | None:
        """The next configuration to measure (None: none is feasible). Marks the search done when the LCB's choice
        was already measured."""
        best: tuple[float, int, Config] | None = None
        for i, config in enumerate(self.configs):
            if not feasible(config):
                continue
            score = self.lcb(config, prior(config))
            if best is None or (score, i) < best[:2]:
                best = (score, i, config)
        if best is None:
            return None
        if best[2] in self.observed:
            self.done = True
        return best[2]

    def best(self, prior: Callable[[Config], float], feasible: Callable[[Config], bool]) -> Config | None:
        """The configuration to keep: the best measured that is still feasible, else the best by the GP's mean."""
        measured = [(score, self.configs.index(c), c) for c, score in self.observed.items() if feasible(c)]
        if measured:
            return min(measured)[2]
        scored = []
        for i, config in enumerate(self.configs):
            if feasible(config):
                mean, _ = self._gp.predict(self._x(config))
                scored.append((prior(config) + mean, i, config))
        return min(scored)[2] if scored else None


def degradation(interference: float, goodput: float) -> float:
    """``1 / (I x T x E)`` with ``goodput`` = T x E (see the module docstring); very large for a stalled job."""
    progress = interference * goodput
    return 1.0 / progress if progress > 1e-6 else 1e6
