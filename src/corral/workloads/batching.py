"""Batch-size curves from Gavel's measurements: a job's throughput, interference type and goodput at a batch size.

The simulator's job model (its truth) and IADeep's predictions (SC'23) read the same measurements, as the
packing model and Gandiva share :mod:`corral.workloads.colocation`. Gavel (OSDI'20) measured five job families
at several batch sizes each, alone and in every pair packed on one GPU (``gavel-throughputs``; see
:mod:`corral.workloads.colocation` for the file and its license):

========================  =========================  ==================
family                    batch sizes measured       reference (Gavel's default)
========================  =========================  ==================
ResNet-18                 16, 32, 64, 128, 256       64
ResNet-50                 16, 32, 64, 128            64
Transformer               16, 32, 64, 128, 256       64
LM                        5, 10, 20, 40, 80          20
Recommendation            512 ... 8192               2048
A3C, CycleGAN             one (no batch size named)  not tunable
========================  =========================  ==================

- :class:`BatchCurve` is one family's throughput on one Gavel GPU type: steps/s where measured; between two
  measured sizes the step time is interpolated linearly (a step's time grows about linearly with its batch, the
  model Pollux, OSDI'21 §3.2, fits for a GPU's compute time); above the measured range samples/s stays at the
  largest size's (no extrapolated gain), below it a step takes as long as at the smallest size (no extrapolated
  saving). ``throughput_ratio(b)`` is samples/s at ``b`` over samples/s at the
  reference batch size. The simulator also scales a job's SM busy fraction and memory-bandwidth use by it (a GPU
  doing more samples per second is busier; an assumption, capped at the whole GPU).
- :func:`goodput_ratio` multiplies it by the statistical efficiency of :mod:`corral.workloads.models` (Pollux's
  gradient-noise-scale form): how fast a job's work (counted in reference-batch seconds) gets done at ``b``.
- :func:`type_at_batch` names the Gavel job type a model runs as at a batch size (the measured size nearest in
  log scale, ties to the smaller), so that pair interference at other batch sizes is Gavel's measured one too.

A model corral does not know, or one of a family measured at one batch size only, has no curve (``None``): its
batch size is not tunable and every ratio is 1.0.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from corral.workloads.colocation import ColocationTable
from corral.workloads.models import ModelTraits, statistical_efficiency

_TYPE_RE = re.compile(r"^(.*) \(batch size (\d+)\)$")


@dataclass(frozen=True, slots=True)
class BatchCurve:
    """One job family's measured throughput against batch size on one Gavel GPU type (see the module docstring)."""

    family: str
    ref_batch: int
    steps_per_s: Mapping[int, float]  # measured: batch size -> steps/s

    @property
    def batch_sizes(self) -> tuple[int, ...]:
        """The measured batch sizes, ascending: what a tuner chooses from."""
        return tuple(sorted(self.steps_per_s))

    def step_s(self, batch: int) -> float:
        """Seconds per mini-batch of ``batch`` samples, alone on the GPU (see the module docstring)."""
        got = self.steps_per_s.get(batch)
        if got:
            return 1.0 / got
        sizes = self.batch_sizes
        if batch < sizes[0]:
            return 1.0 / self.steps_per_s[sizes[0]]
        if batch > sizes[-1]:
            return batch / self.samples_per_s(sizes[-1])
        hi = next(b for b in sizes if b > batch)
        lo = max(b for b in sizes if b < batch)
        t_lo, t_hi = 1.0 / self.steps_per_s[lo], 1.0 / self.steps_per_s[hi]
        return t_lo + (t_hi - t_lo) * (batch - lo) / (hi - lo)

    def samples_per_s(self, batch: int) -> float:
        return batch / self.step_s(batch)

    def throughput_ratio(self, batch: int | None) -> float:
        """Samples/s at ``batch`` over samples/s at the reference batch size (1.0 for ``None`` or the reference)."""
        if batch is None or batch == self.ref_batch:
            return 1.0
        return self.samples_per_s(batch) / self.samples_per_s(self.ref_batch)


def _family_points(table: ColocationTable, gpu: str) -> dict[str, dict[int, float]]:
    out: dict[str, dict[int, float]] = {}
    for job_type, steps in table.isolated.get(gpu, {}).items():
        found = _TYPE_RE.match(job_type)
        if found and steps > 0:
            out.setdefault(found.group(1), {})[int(found.group(2))] = steps
    return out


# (id of the table, Gavel GPU, Gavel job type) -> (the table, kept alive so its id stays its own; the curve).
# Tables come from the cached loader, so this holds a handful of entries.
_CACHE: dict[tuple[int, str, str], tuple[ColocationTable, BatchCurve | None]] = {}


def batch_curve(table: ColocationTable, model: ModelTraits, gpu: str) -> BatchCurve | None:
    """``model``'s throughput curve on Gavel GPU type ``gpu`` (:func:`corral.workloads.colocation.gavel_gpu`), or
    ``None`` when its batch size is not tunable (unknown model, a family measured at one size, no reference)."""
    key = (id(table), gpu, model.colocation_type)
    got = _CACHE.get(key)
    if got is not None and got[0] is table:
        return got[1]
    curve = None
    ref = model.ref_batch
    if ref is not None:
        points = _family_points(table, gpu).get(model.family, {})
        if len(points) >= 2 and ref in points:
            curve = BatchCurve(model.family, ref, MappingProxyType(dict(points)))
    _CACHE[key] = (table, curve)
    return curve


def goodput_ratio(curve: BatchCurve | None, model: ModelTraits, batch: int | None) -> float:
    """Reference-batch seconds of work done per second at ``batch``, alone: throughput ratio x statistical
    efficiency (exactly 1.0 for ``None``, the reference, or no curve)."""
    if curve is None or batch is None or batch == curve.ref_batch:
        return 1.0
    return curve.throughput_ratio(batch) * statistical_efficiency(model, batch)


def nearest_measured(curve: BatchCurve, batch: int) -> int:
    """The measured batch size nearest ``batch`` in log scale (ties: the smaller)."""
    return min(curve.batch_sizes, key=lambda b: (abs(math.log(b / batch)), b))


def type_at_batch(table: ColocationTable, model: ModelTraits, gpu: str, batch: int | None) -> str:
    """The Gavel job type ``model`` runs as at ``batch`` on ``gpu``: its own type at the reference (or ``None``),
    else its family at the nearest measured batch size; ``""`` for a model with no Gavel type."""
    if batch is None or not model.colocation_type:
        return model.colocation_type
    curve = batch_curve(table, model, gpu)
    if curve is None or batch == curve.ref_batch:
        return model.colocation_type
    return f"{curve.family} (batch size {nearest_measured(curve, batch)})"
