"""What corral knows about common deep-learning models: the traits that placement and sharing decisions use.

A job's ``model`` names what it trains. The model-aware policies need three traits of it:

- ``placement_sensitive``: does the job slow down much when its GPUs span several nodes? Tiresias (NSDI'19 §2.2,
  §4.1) found that this follows the model's tensor-size distribution: models with a few very large tensors
  (VGG, AlexNet: big fully-connected layers; large-embedding language models) are sensitive, models with many
  small tensors (ResNet, Inception, GoogLeNet) are not. Tiresias consolidates only the sensitive ones.
- ``spread_rate``: the speed of such a job spread over more nodes than it needs, relative to consolidated. The
  values are rounded readings of the kind of slowdowns Tiresias reports (up to ~2x for VGG over 10 GbE, a few
  percent for ResNet); they are the simulator's default, not corral's own measurements, and the performance
  model can override them.
- ``colocation_type``: the job type in Gavel's measured co-location throughputs (OSDI'20; see
  :mod:`corral.workloads.colocation`) that stands for this model. Gavel measured ResNet-18/50, Transformer,
  LM, Recommendation, A3C and CycleGAN; models it did not measure map to the nearest measured one (the VGG
  family, AlexNet and Inception to ResNet-50, a large convolutional network at batch size 64; GoogLeNet to
  ResNet-18), and that mapping is recorded in :data:`MODELS` so a report can say it.

For GPU sharing (AntMan's opportunistic jobs, OSDI'20) the simulator also needs each model's resource profile
on a 16 GiB V100 at the batch size above: ``mem_mib``, its peak GPU memory in a mini-batch; ``mem_mean_frac``,
the mean over a mini-batch as a fraction of the peak (activations pile up in the forward pass and are freed in
the backward pass, so the footprint cycles; AntMan §2.2 builds on this); ``sm_util``, the fraction of the
time its kernels keep the GPU busy when it runs alone; ``mem_bw``, the fraction of the GPU's memory bandwidth it
draws. **These four are corral's rounded assumptions**, of the order that public profiles of these models at
these batch sizes show (large convolutional networks at batch 64 use most of a V100's SMs and 8-12 GiB; RL and
small recommendation models use little of either); no file in the shared data measures them. They feed the
simulator's sharing model only where Gavel's measured pairs do not apply (see ``corral.sim.sharing``) and its
memory and utilization figures; change them here, in one table.

**Batch size** (the simulator's job model; IADeep, SC'23, tunes it). A job's work is counted at its model's
*reference batch size* ``ref_batch``: the batch size of its Gavel job type (``ResNet-50 (batch size 64)`` -> 64),
the one at which the traces' durations are taken to be measured. Three functions of the batch size ``b``:

- *throughput* (samples/s): **measured**. Gavel measured each of its job families at several batch sizes (ResNet-18
  and Transformer at 16-256, ResNet-50 at 16-128, LM at 5-80, Recommendation at 512-8192), so the simulator reads
  it from the same file (:mod:`corral.workloads.batching`); a stand-in model follows its stand-in's curve (an
  assumption, like the stand-in itself). A3C and CycleGAN were measured at one batch size only: their batch size
  is not tunable.
- *GPU memory*: ``mem_mib x (mem_fixed_frac + (1 - mem_fixed_frac) x b / ref_batch)``: weights, gradients,
  optimizer state and workspace do not grow with the batch, activations grow linearly with it. **Assumed**:
  ``mem_fixed_frac`` is corral's rounded estimate per model (large convolutional networks at batch 64 are mostly
  activations, 0.15; recommendation models mostly embeddings, 0.5); no file in the shared data measures it.
- *statistical efficiency* per sample, relative to the reference batch size, in the gradient-noise-scale form of
  Pollux (Qiao et al., OSDI'21, §3.1): ``E(b) = (phi + ref_batch) / (phi + b)``, where ``phi`` (``noise_scale``)
  is the model's gradient noise scale in samples. Pollux measures ``phi`` during training, and it grows as
  training goes on; corral takes one **assumed** constant per model, of the order McCandlish et al. ("An Empirical
  Model of Large-Batch Training", 2018) and Pollux report early in training: about 2-4x the reference batch for
  the vision and language models, 4x for recommendation (large batches lose little there).

A job at batch size ``b`` makes progress at ``throughput(b) / throughput(ref_batch) x E(b)`` reference-batch
seconds per second (its *goodput* relative to the reference); at the reference batch size exactly 1, so nothing
changes for jobs whose batch size nobody sets.

Names are matched case-insensitively after dropping ``-`` and ``_`` (``ResNet-50``, ``resnet_50`` and
``resnet50`` are the same model). An unknown model gets :data:`UNKNOWN`'s traits.
"""

from __future__ import annotations

import functools
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from corral.core.errors import ConfigError


@dataclass(frozen=True, slots=True)
class ModelTraits:
    name: str
    placement_sensitive: bool
    spread_rate: float
    colocation_type: str  # Gavel job type, e.g. "ResNet-50 (batch size 64)"
    measured: bool  # is colocation_type this very model (True) or a stand-in (False)?
    mem_mib: int = 6 * 1024  # peak GPU memory within a mini-batch (assumed; see the module docstring)
    mem_mean_frac: float = 0.7  # mean memory over a mini-batch / peak
    sm_util: float = 0.6  # fraction of the time the GPU is busy with its kernels, alone
    mem_bw: float = 0.5  # fraction of the GPU's memory bandwidth it draws, alone
    noise_scale: float | None = None  # gradient noise scale phi in samples (assumed); None: no batch model
    mem_fixed_frac: float = 0.3  # share of the peak memory at ref_batch that does not grow with the batch (assumed)

    @property
    def family(self) -> str:
        """The Gavel job family of ``colocation_type`` without its batch size (``"ResNet-50"``; ``"A3C"``)."""
        return _BATCH_RE.sub("", self.colocation_type)

    @property
    def ref_batch(self) -> int | None:
        """The reference batch size: the one of its Gavel job type, at which trace durations count (None: the
        type names none, as A3C and CycleGAN, or the model is unknown)."""
        return _ref_batch(self.colocation_type)


_BATCH_RE = re.compile(r" \(batch size (\d+)\)$")


@functools.cache
def _ref_batch(colocation_type: str) -> int | None:
    """The batch size a Gavel job type names (None: none). Cached: a replay asks for it at every memory estimate
    (IADeep's tuner, the simulator's profiles), and a regular expression search each time was a visible share of
    such replays (issue 20); there are a few dozen job types."""
    found = _BATCH_RE.search(colocation_type)
    return int(found.group(1)) if found else None


_GIB = 1024


def _m(
    name: str,
    sensitive: bool,
    spread: float,
    coloc: str,
    measured: bool,
    mem_gib: float,
    mean_frac: float,
    sm: float,
    bw: float,
    phi: float | None = None,
    fixed: float = 0.3,
) -> ModelTraits:
    return ModelTraits(name, sensitive, spread, coloc, measured, round(mem_gib * _GIB), mean_frac, sm, bw, phi, fixed)


MODELS: Mapping[str, ModelTraits] = {
    m.name: m
    for m in (
        # Measured by Gavel (their default batch sizes for these job types). Columns after the Gavel type:
        # measured?, peak memory GiB, mean/peak memory, SM busy fraction, memory-bandwidth fraction, gradient noise
        # scale (samples), fixed share of the memory (all assumed but the type; see the module docstring).
        _m("resnet18", False, 0.95, "ResNet-18 (batch size 64)", True, 1.5, 0.6, 0.55, 0.4, 128, 0.35),
        _m("resnet50", False, 0.9, "ResNet-50 (batch size 64)", True, 9.0, 0.6, 0.9, 0.6, 256, 0.15),
        _m("transformer", True, 0.7, "Transformer (batch size 64)", True, 6.0, 0.65, 0.75, 0.5, 192, 0.3),
        _m("lm", True, 0.7, "LM (batch size 20)", True, 3.0, 0.7, 0.5, 0.5, 60, 0.4),
        _m("recommendation", True, 0.6, "Recommendation (batch size 2048)", True, 2.0, 0.8, 0.35, 0.7, 8192, 0.5),
        _m("a3c", False, 0.95, "A3C", True, 1.0, 0.8, 0.2, 0.2),
        _m("cyclegan", False, 0.9, "CycleGAN", True, 5.0, 0.6, 0.85, 0.6),
        # The Tiresias 60-job trace's models (not in Gavel: stand-ins, see the module docstring); their batch curves
        # are their stand-in's.
        _m("resnet101", False, 0.9, "ResNet-50 (batch size 64)", False, 12.0, 0.6, 0.9, 0.6, 256, 0.15),
        _m("resnet152", False, 0.9, "ResNet-50 (batch size 64)", False, 14.0, 0.6, 0.9, 0.6, 256, 0.15),
        _m("vgg11", True, 0.55, "ResNet-50 (batch size 64)", False, 8.0, 0.6, 0.85, 0.6, 256, 0.25),
        _m("vgg16", True, 0.5, "ResNet-50 (batch size 64)", False, 10.0, 0.6, 0.9, 0.6, 256, 0.25),
        _m("vgg19", True, 0.5, "ResNet-50 (batch size 64)", False, 11.0, 0.6, 0.9, 0.6, 256, 0.25),
        _m("alexnet", True, 0.6, "ResNet-50 (batch size 64)", False, 3.0, 0.7, 0.6, 0.5, 256, 0.4),
        _m("inception3", False, 0.9, "ResNet-50 (batch size 64)", False, 9.0, 0.6, 0.85, 0.55, 256, 0.15),
        _m("inception4", False, 0.9, "ResNet-50 (batch size 64)", False, 12.0, 0.6, 0.9, 0.55, 256, 0.15),
        _m("googlenet", False, 0.95, "ResNet-18 (batch size 64)", False, 4.0, 0.6, 0.75, 0.5, 128, 0.2),
    )
}

UNKNOWN = ModelTraits("unknown", placement_sensitive=False, spread_rate=0.8, colocation_type="", measured=False)

# Gavel's workload generator draws job types uniformly; with no model in the trace, corral does the same over
# the models Gavel measured.
DEFAULT_MIX: Mapping[str, float] = {
    name: 1.0 for name in ("resnet18", "resnet50", "transformer", "lm", "recommendation", "a3c", "cyclegan")
}


def statistical_efficiency(model: ModelTraits, batch: int | None) -> float:
    """Progress per sample at ``batch`` relative to the reference batch size: Pollux's (OSDI'21 §3.1)
    ``(phi + ref) / (phi + batch)``; 1.0 for ``None``, the reference itself, or a model without a batch model."""
    ref = model.ref_batch
    phi = model.noise_scale
    if batch is None or ref is None or phi is None or batch == ref:
        return 1.0
    return (phi + ref) / (phi + batch)


def batch_mem_factor(model: ModelTraits, batch: int | None) -> float:
    """GPU memory at ``batch`` relative to the reference batch size (fixed share + activations, linear in the
    batch); 1.0 for ``None``, the reference itself, or a model without a reference batch size."""
    ref = model.ref_batch
    if batch is None or ref is None or batch == ref:
        return 1.0
    fixed = model.mem_fixed_frac
    return fixed + (1.0 - fixed) * batch / ref


def canonical(name: str) -> str:
    return name.strip().lower().replace("-", "").replace("_", "")


_ALIASES = {"inceptionv3": "inception3", "inceptionv4": "inception4", "languagemodel": "lm", "rnnlm": "lm"}


def traits(model: str | None) -> ModelTraits:
    """The traits of ``model`` (:data:`UNKNOWN`'s for ``None`` or a model corral does not know)."""
    if model is None:
        return UNKNOWN
    key = canonical(model)
    return MODELS.get(_ALIASES.get(key, key), UNKNOWN)


def parse_mix(text: str) -> dict[str, float]:
    """``"resnet50=2,vgg16=1"`` -> normalised weights; ``"default"`` is :data:`DEFAULT_MIX`."""
    if text.strip().lower() == "default":
        raw: dict[str, float] = dict(DEFAULT_MIX)
    else:
        raw = {}
        for part in text.split(","):
            if not part.strip():
                continue
            name, sep, weight = part.partition("=")
            key = canonical(name)
            key = _ALIASES.get(key, key)
            if key not in MODELS:
                known = ", ".join(sorted(MODELS))
                raise ConfigError(f"model mix: unknown model {name.strip()!r} (known: {known})")
            try:
                value = float(weight) if sep else 1.0
            except ValueError:
                raise ConfigError(f"model mix: weight of {name.strip()!r} must be a number, got {weight!r}") from None
            if not value >= 0:
                raise ConfigError(f"model mix: weight of {name.strip()!r} must be >= 0, got {value}")
            raw[key] = raw.get(key, 0.0) + value
    total = sum(raw.values())
    if not raw or total <= 0:
        raise ConfigError(f"model mix {text!r} has no positive weight")
    return {k: v / total for k, v in raw.items()}


def draw_models(count: int, mix: Mapping[str, float], seed: int) -> Sequence[str]:
    """``count`` model names drawn from ``mix`` with a generator seeded by ``seed`` (same seed, same draw)."""
    names = sorted(mix)
    rng = random.Random(seed)
    return rng.choices(names, weights=[mix[n] for n in names], k=count)
