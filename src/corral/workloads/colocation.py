"""Measured co-location throughputs: how fast two jobs run when packed on the same GPU, relative to alone.

The numbers are Gavel's (Narayanan et al., "Heterogeneity-Aware Cluster Scheduling Policies for Deep Learning
Workloads", OSDI'20): training throughput (steps/s) of 26 model/batch-size job types on K80, P100 and V100 GPUs,
each alone and each pair packed on one GPU. The file (``gavel-throughputs/simulation_throughputs.json`` in the
shared data folder, MIT license, (c) 2020 Stanford Future Data Systems, see the ``LICENSE`` beside it) is read
where it lies; nothing of it is copied into corral. Its layout: GPU type -> ``"('<job type>', <scale factor>)"``
-> ``{"null": isolated steps/s, "<partner key>": [own steps/s, partner steps/s] when packed}``. Only scale
factor 1 (single-GPU jobs) and the consolidated GPU types ``k80``, ``p100``, ``v100`` are used.

A pair's **normalised rates** ``(rate_a, rate_b)`` are each job's packed throughput over its isolated throughput
on the same GPU type: 1.0 = no slowdown; ``rate_a + rate_b > 1`` means packing makes more progress than running
the two in turn (time-slicing gives each 0.5). A measured 0.0 is a pair that did not fit in GPU memory. Ratios
above 1.0 (measurement noise) are capped at 1.0.

How a corral job finds its row (:func:`pair_rates`):

- **Model**: the job's ``model`` maps to a Gavel job type through :data:`corral.workloads.models.MODELS`
  (``colocation_type``: measured types are themselves, others a stand-in, e.g. VGG-16 -> ResNet-50).
- **GPU type** (:func:`gavel_gpu`): a cluster type whose name contains ``k80``, ``p100`` or ``v100``
  (case-insensitive) uses that column; any other type uses the Gavel type nearest in relative speed (K80 0.25,
  P100 0.8, V100 1.0: the speeds of corral's built-in types, themselves medians of this file's isolated
  throughputs relative to V100), ties going to the one nearest in memory. So the anonymous ``gpu`` type of the
  Tiresias presets (speed 1.0) and Philly's ``12GB``/``24GB`` types (speed 1.0) read the V100 column, and faster
  types (A100, H100) the V100 column too: the newest hardware Gavel measured.
- **Fallback**: a job without a model, or with a model corral does not know, gets :data:`FALLBACK_RATES`
  (0.5, 0.5) with any partner: exactly what running in turn gives, so such a pair is never predicted to gain and
  a policy with a positive packing threshold never packs it. (The table itself covers every pair of its 26 job
  types on each of the three GPU types, so a known pair is always measured.)
"""

from __future__ import annotations

import ast
import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from types import MappingProxyType

from corral.core.errors import ConfigError
from corral.workloads.data import data_file
from corral.workloads.models import traits

GAVEL_GPUS: tuple[str, ...] = ("k80", "p100", "v100")
# Relative speed (V100 = 1.0) and memory (MiB) of Gavel's GPU types, to map other types to the nearest.
_GAVEL_SPEED: Mapping[str, tuple[float, int]] = MappingProxyType(
    {"k80": (0.25, 12 * 1024), "p100": (0.8, 16 * 1024), "v100": (1.0, 16 * 1024)}
)
FALLBACK_RATES: tuple[float, float] = (0.5, 0.5)
DATA_PARTS: tuple[str, ...] = ("gavel-throughputs", "simulation_throughputs.json")


@dataclass(frozen=True, slots=True)
class ColocationTable:
    """Gavel's single-GPU measurements: ``isolated[gpu][job_type]`` steps/s and ``packed[gpu][(a, b)]`` =
    (steps/s of a, steps/s of b) when a and b share one GPU. Read-only mappings."""

    isolated: Mapping[str, Mapping[str, float]]
    packed: Mapping[str, Mapping[tuple[str, str], tuple[float, float]]]
    source: str = ""

    @property
    def job_types(self) -> tuple[str, ...]:
        """Every Gavel job type measured (on the first GPU type), sorted."""
        first = next(iter(self.isolated.values()), {})
        return tuple(sorted(first))

    def rates(self, type_a: str, type_b: str, gpu: str) -> tuple[float, float] | None:
        """Normalised rates of Gavel job types ``type_a`` and ``type_b`` packed on Gavel GPU ``gpu``, or ``None``
        when that pair was not measured there."""
        pair = self.packed.get(gpu, {}).get((type_a, type_b))
        if pair is None:
            return None
        alone = self.isolated[gpu]
        return (_ratio(pair[0], alone[type_a]), _ratio(pair[1], alone[type_b]))


def _ratio(packed: float, alone: float) -> float:
    return 0.0 if alone <= 0 else min(1.0, max(0.0, packed / alone))


def _parse_key(key: str, where: str) -> tuple[str, int]:
    try:
        value = ast.literal_eval(key)
    except (ValueError, SyntaxError):
        value = None
    if not (isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], str) and isinstance(value[1], int)):
        raise ConfigError(f"{where}: expected a key like \"('ResNet-18 (batch size 16)', 1)\", got {key!r}")
    return value[0], value[1]


@lru_cache(maxsize=4)
def load_colocation(path: str | None = None) -> ColocationTable:
    """Read Gavel's throughput file (default: the shared data folder's copy); cached, so every caller shares
    one frozen table."""
    file = Path(path) if path is not None else data_file(*DATA_PARTS)
    try:
        raw = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read co-location throughputs from {file}: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{file}: expected a JSON object keyed by GPU type")
    isolated: dict[str, Mapping[str, float]] = {}
    packed: dict[str, Mapping[tuple[str, str], tuple[float, float]]] = {}
    for gpu in GAVEL_GPUS:
        rows = raw.get(gpu)
        if not isinstance(rows, dict):
            raise ConfigError(f"{file}: no measurements for GPU type {gpu!r}")
        alone: dict[str, float] = {}
        pairs: dict[tuple[str, str], tuple[float, float]] = {}
        for key, row in rows.items():
            where = f"{file}: {gpu}"
            job_type, scale = _parse_key(key, where)
            if scale != 1:
                continue
            if not isinstance(row, dict) or not isinstance(row.get("null"), int | float):
                raise ConfigError(f"{where} {key}: expected an object with an isolated throughput under 'null'")
            alone[job_type] = float(row["null"])
            for other, value in row.items():
                if other == "null":
                    continue
                partner, partner_scale = _parse_key(other, f"{where} {key}")
                if partner_scale != 1:
                    continue
                if not (isinstance(value, list) and len(value) == 2 and all(isinstance(v, int | float) for v in value)):
                    raise ConfigError(f"{where} {key} -> {other}: expected [own, partner] throughputs")
                pairs[(job_type, partner)] = (float(value[0]), float(value[1]))
        isolated[gpu] = MappingProxyType(alone)
        packed[gpu] = MappingProxyType(pairs)
    return ColocationTable(MappingProxyType(isolated), MappingProxyType(packed), str(file))


def gavel_gpu(name: str, mem_mib: int, speed: float) -> str:
    """The Gavel GPU type whose column stands for a cluster GPU type (see the module docstring)."""
    low = name.lower()
    for gpu in GAVEL_GPUS:
        if gpu in low:
            return gpu
    return min(GAVEL_GPUS, key=lambda g: (abs(_GAVEL_SPEED[g][0] - speed), abs(_GAVEL_SPEED[g][1] - mem_mib)))


def pair_rates(table: ColocationTable, model_a: str | None, model_b: str | None, gpu: str) -> tuple[float, float]:
    """Normalised rates ``(rate_a, rate_b)`` of jobs training ``model_a`` and ``model_b`` packed on Gavel GPU type
    ``gpu`` (from :func:`gavel_gpu`), with the documented fallback for models corral does not know."""
    type_a = traits(model_a).colocation_type
    type_b = traits(model_b).colocation_type
    if not type_a or not type_b:
        return FALLBACK_RATES
    rates = table.rates(type_a, type_b, gpu)
    return FALLBACK_RATES if rates is None else rates
