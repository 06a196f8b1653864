"""Small dense linear algebra and Gaussian-process regression in pure Python, for IADeep's batch-size tuner.

IADeep (SC'23) tunes the batch sizes of the jobs sharing a GPU with Bayesian optimisation: a Gaussian process
(GP) models the objective over the configurations tried so far, and GP-LCB picks the next one (the lower
confidence bound, since the objective, a performance degradation, is minimised). This module holds the parts
that do not know about jobs:

- :func:`cholesky` and :func:`cho_solve`: the factorisation every solve here uses (matrices of a dozen rows, so
  plain Python is fast enough and gives the same bits on every platform, which numpy's BLAS would not promise);
- :class:`GaussianProcess`: exact GP regression with a squared-exponential kernel and fixed hyperparameters
  (length scale, signal variance, noise variance), zero prior mean (the caller subtracts its own prior mean);
- :func:`lcb_beta`: the exploration weight ``beta_t = 2 ln(|D| t^2 pi^2 / (6 delta))`` of GP-UCB for a finite
  candidate set D (Srinivas et al., "Gaussian Process Optimization in the Bandit Setting", ICML'10, Theorem 1),
  used as ``mean - sqrt(beta_t) x sd`` when minimising.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from corral.core.errors import ConfigError

_JITTER = 1e-10


def cholesky(a: Sequence[Sequence[float]]) -> list[list[float]]:
    """Lower-triangular L with L L^T = a, for a symmetric positive (semi-)definite ``a`` (a tiny jitter is added to
    a pivot that rounding made non-positive)."""
    n = len(a)
    low = [[0.0] * n for _ in range(n)]
    for i in range(n):
        row_i = low[i]
        for j in range(i + 1):
            row_j = low[j]
            total = a[i][j] - sum((row_i[k] * row_j[k] for k in range(j)), 0.0)
            if i == j:
                row_i[j] = math.sqrt(total if total > _JITTER else _JITTER)
            else:
                row_i[j] = total / row_j[j]
    return low


def solve_lower(low: Sequence[Sequence[float]], b: Sequence[float]) -> list[float]:
    """x with L x = b."""
    x: list[float] = []
    for i, row in enumerate(low):
        x.append((b[i] - sum((row[k] * x[k] for k in range(i)), 0.0)) / row[i])
    return x


def solve_upper_t(low: Sequence[Sequence[float]], b: Sequence[float]) -> list[float]:
    """x with L^T x = b."""
    n = len(low)
    x = [0.0] * n
    for i in range(n - 1, -1, -1):
        x[i] = (b[i] - sum((low[k][i] * x[k] for k in range(i + 1, n)), 0.0)) / low[i][i]
    return x


def cho_solve(low: Sequence[Sequence[float]], b: Sequence[float]) -> list[float]:
    """x with (L L^T) x = b."""
    return solve_upper_t(low, solve_lower(low, b))


class GaussianProcess:
    """Exact GP regression, squared-exponential kernel ``s2 exp(-|x - x'|^2 / (2 l^2))``, zero prior mean."""

    __slots__ = ("_alpha", "_low", "_xs", "length", "noise", "signal")

    def __init__(self, length: float, signal: float, noise: float) -> None:
        if not length > 0 or not signal > 0 or not noise >= 0:
            raise ConfigError(
                f"gaussian process: need length > 0, signal variance > 0, noise variance >= 0; got {length}, "
                f"{signal}, {noise}"
            )
        self.length = length
        self.signal = signal
        self.noise = noise
        self._xs: list[tuple[float, ...]] = []
        self._low: list[list[float]] = []
        self._alpha: list[float] = []

    def kernel(self, x: Sequence[float], y: Sequence[float]) -> float:
        d2 = sum(((a - b) ** 2 for a, b in zip(x, y, strict=True)), 0.0)
        return self.signal * math.exp(-d2 / (2.0 * self.length**2))

    def fit(self, xs: Sequence[Sequence[float]], ys: Sequence[float]) -> None:
        """Condition on observations ``ys`` at ``xs`` (replaces what was fitted before)."""
        self._xs = [tuple(x) for x in xs]
        n = len(self._xs)
        k = [
            [self.kernel(self._xs[i], self._xs[j]) + (self.noise if i == j else 0.0) for j in range(n)]
            for i in range(n)
        ]
        self._low = cholesky(k)
        self._alpha = cho_solve(self._low, list(ys))

    def predict(self, x: Sequence[float]) -> tuple[float, float]:
        """Posterior ``(mean, variance)`` at ``x``."""
        if not self._xs:
            return 0.0, self.signal
        ks = [self.kernel(x, xi) for xi in self._xs]
        mean = sum((a * b for a, b in zip(ks, self._alpha, strict=True)), 0.0)
        v = solve_lower(self._low, ks)
        var = self.signal - sum((vi * vi for vi in v), 0.0)
        return mean, max(var, 0.0)


def lcb_beta(num_candidates: int, t: int, delta: float = 0.1) -> float:
    """GP-UCB's ``beta_t`` for a finite candidate set of ``num_candidates`` at step ``t`` >= 1 (see the module
    docstring); confidence ``1 - delta``."""
    if not 0 < delta < 1:
        raise ConfigError(f"gp-lcb: delta must be in (0, 1), got {delta}")
    d = max(1, num_candidates)
    step = max(1, t)
    return 2.0 * math.log(d * step * step * math.pi**2 / (6.0 * delta))
