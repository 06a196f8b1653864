"""The replay's statistics without numpy are numpy's, to the last bit (:mod:`corral.sim.stats`), and so is the
contention sweep that replaced numpy's vectorised one (:func:`corral.sim.metrics.mean_contention`).

numpy stays a dependency (synthetic traces, random filters, Themis), so it is the oracle here: sums and means of
every length up to a few pairwise-summation blocks and a few long ones, percentiles at numpy's edge cases (q = 0,
100, weights of exactly 0.5), and the sweep against the numpy code it replaced, on data full of ties.
"""

from __future__ import annotations

import numpy as np
import pytest

from corral.sim.metrics import mean_contention
from corral.sim.stats import fsum_pairwise, mean, percentiles

LENGTHS = [*range(1, 300), 1000, 4097, 8191, 8192, 8193, 100_003]


def _samples(rng: np.random.Generator, n: int) -> list[np.ndarray]:
    return [rng.random(n) * 1e5, rng.lognormal(5, 3, n), np.round(rng.exponential(1000, n), 3), rng.normal(0, 1e4, n)]


def test_sum_and_mean_are_numpys_bit_for_bit() -> None:
    rng = np.random.default_rng(1)
    for n in LENGTHS:
        for a in _samples(rng, n):
            values = a.tolist()
            assert fsum_pairwise(values) == float(np.sum(a)), n
            assert mean(values) == float(np.mean(a)), n
    assert fsum_pairwise([]) == 0.0


def test_percentiles_are_numpys_bit_for_bit() -> None:
    rng = np.random.default_rng(2)
    qs = [0, 1, 25, 33.3, 50, 90, 95, 99, 99.9, 100]
    for n in [*range(1, 120), 1001, 65_537]:
        for a in _samples(rng, n):
            assert percentiles(a.tolist(), qs) == np.percentile(a, qs).tolist(), n
    # Interpolation weights of exactly 0.5 take numpy's upper-neighbour formula.
    assert percentiles([0.1, 0.7], [50]) == np.percentile([0.1, 0.7], [50]).tolist()
    with pytest.raises(ValueError, match="empty"):
        percentiles([], [50])


def _numpy_contention(submit_s: np.ndarray, end_s: np.ndarray) -> list[float]:
    # The vectorised version mean_contention replaced (corral before issue 20's numpy-free metrics).
    n = len(submit_s)
    both = np.concatenate((submit_s, end_s))
    points = np.unique(both)
    inverse = np.searchsorted(points, both)
    change = np.bincount(inverse, weights=np.concatenate((np.ones(n), -np.ones(n))), minlength=len(points))
    count = np.cumsum(change)
    area = np.concatenate(([0.0], np.cumsum(count[:-1] * np.diff(points))))
    i_start, i_end = inverse[:n], inverse[n:]
    length = end_s - submit_s
    with np.errstate(invalid="ignore", divide="ignore"):
        avg = (area[i_end] - area[i_start]) / length
    result: list[float] = np.where(length > 0, avg, count[i_start] + 1.0).tolist()
    return result


@pytest.mark.parametrize("n", [1, 2, 7, 50, 1000, 20_000])
@pytest.mark.parametrize("ordered", [True, False], ids=["submits-sorted", "submits-shuffled"])
def test_contention_sweep_is_the_numpy_version_bit_for_bit(n: int, ordered: bool) -> None:
    rng = np.random.default_rng(n)
    for spread in (10, 1e6):  # many ties (and zero lengths), then few
        submit = np.round(rng.random(n) * spread)
        if ordered:
            submit.sort()
        end = submit + np.round(rng.exponential(spread / 10, n)) * (rng.random(n) > 0.1)
        assert mean_contention(submit.tolist(), end.tolist()).tolist() == _numpy_contention(submit, end)
