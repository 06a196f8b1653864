"""numpy's mean and linear percentile in plain Python, bit for bit, for the replay's metrics.

A replay's summary needs a few means and percentiles. Importing numpy for them cost a 200-job replay a third of its
time (issue 20: ``corral simulate`` on 200 jobs within 0.15 s), and the summary's figures were defined as numpy's,
so these functions repeat numpy's arithmetic exactly, operation by operation; ``tests/sim/test_stats.py`` checks
them against numpy on random data, bit for bit.

- :func:`fsum_pairwise` is ``np.add.reduce`` on a contiguous float64 array: numpy's pairwise sum (in order below 8
  values, eight running sums over blocks of up to 128, the sums of two halves above that).
- :func:`mean` is ``np.mean``: that sum over the count.
- :func:`percentiles` is ``np.percentile(values, qs)`` with numpy's default method, "linear" (R's type 7): the
  virtual index ``(n - 1) * q / 100`` and numpy's two-sided interpolation (``_lerp``), which takes the upper
  neighbour's side for weights of 0.5 and above.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

_BLOCK = 128  # numpy's PW_BLOCKSIZE: pairwise summation's leaf size


def _pairwise(a: Sequence[float], lo: int, n: int) -> float:
    """numpy's ``pairwise_sum`` of ``a[lo:lo + n]`` (numpy/_core/src/umath/loops_utils.h.src)."""
    if n < 8:
        res = 0.0
        for i in range(lo, lo + n):
            res += a[i]
        return res
    if n <= _BLOCK:
        r0, r1, r2, r3 = a[lo], a[lo + 1], a[lo + 2], a[lo + 3]
        r4, r5, r6, r7 = a[lo + 4], a[lo + 5], a[lo + 6], a[lo + 7]
        i = lo + 8
        stop = lo + n - n % 8
        while i < stop:
            r0 += a[i]
            r1 += a[i + 1]
            r2 += a[i + 2]
            r3 += a[i + 3]
            r4 += a[i + 4]
            r5 += a[i + 5]
            r6 += a[i + 6]
            r7 += a[i + 7]
            i += 8
        res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
        while i < lo + n:
            res += a[i]
            i += 1
        return res
    half = n // 2
    half -= half % 8
    return _pairwise(a, lo, half) + _pairwise(a, lo + half, n - half)


def fsum_pairwise(values: Sequence[float]) -> float:
    """``float(np.sum(values))`` for float64 values (0.0 when empty): numpy's pairwise sum of the whole array."""
    return _pairwise(values, 0, len(values))


def mean(values: Sequence[float]) -> float:
    """``float(np.mean(values))``; the caller handles an empty sequence (numpy's would be NaN with a warning)."""
    return fsum_pairwise(values) / len(values)


def percentiles(values: Sequence[float], qs: Sequence[float]) -> list[float]:
    """``np.percentile(values, qs).tolist()`` (method "linear") for non-empty, NaN-free ``values``."""
    ordered = sorted(values)
    n = len(ordered)
    if not n:
        raise ValueError("percentiles of an empty sequence")
    out = []
    for q in qs:
        virtual = (n - 1) * (q / 100)
        if virtual >= n - 1:
            # numpy takes the last value, its interpolation weight applied to a zero difference.
            below = above = ordered[-1]
            gamma = virtual + 1.0  # numpy's gamma here is measured from index -1
        else:
            floor = math.floor(virtual)
            below, above = ordered[floor], ordered[floor + 1]
            gamma = virtual - floor
        diff = above - below
        out.append(above - diff * (1 - gamma) if gamma >= 0.5 else below + diff * gamma)
    return out
