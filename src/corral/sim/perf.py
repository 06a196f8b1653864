"""The performance model: how fast a job runs where it is placed, and what a preemption costs.

Assumptions (each configurable in :class:`PerfModel`):

- A trace's ``duration_s`` is the job's run time when placed *consolidated* (on as few nodes as its GPU count
  allows) on GPUs of speed 1.0. Traces record what happened, and production schedulers consolidate when they
  can, so this is the natural reading; it also means a replay with consolidated placement on a homogeneous
  cluster reproduces the trace's run times exactly.
- A gang runs at the pace of its slowest GPU: ``rate = speed of its GPU type``. All GPUs of a gang are of one
  type (see :mod:`corral.policies.placement`).
- A job spread over more nodes than it needs runs at ``spread_rate`` of its consolidated speed, once more
  multiplied by ``cross_rack_rate`` if it also spans more than one rack. Tiresias (NSDI'19 §2.2, Fig. 4)
  measured up to ~2x slowdowns for communication-heavy models (VGG) and almost none for others (ResNet). With
  ``model_spread`` (the default), a job whose model corral knows uses that model's rate
  (:mod:`corral.core.models`: 0.5 for VGG-16, 0.9 for ResNet-50, ...); other jobs use ``spread_rate`` (0.8, a
  middle ground). ``cross_rack_rate`` (0.9) applies to every model.
- A job with a fractional share runs at its trace speed (its duration was measured at that share).
- Preemption: the job's state is checkpointed when it is stopped and restored when it restarts. The model
  charges both at restart: a resumed job holds its new GPUs for ``restore_s`` seconds before making progress.
  Progress is otherwise never lost (jobs checkpoint at the preemption point, as corral's job library does).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from corral.core.cluster import Topology
from corral.core.errors import ConfigError
from corral.core.job import JobSpec
from corral.core.models import UNKNOWN, traits
from corral.core.placement import Placement


@dataclass(frozen=True, slots=True)
class PerfModel:
    spread_rate: float = field(default=0.8, metadata={"help": "speed of a job spread over more nodes than needed"})
    cross_rack_rate: float = field(default=0.9, metadata={"help": "extra factor when such a job spans racks"})
    restore_s: float = field(default=30.0, metadata={"help": "checkpoint + restore seconds paid at each restart"})
    gpu_speed: bool = field(default=True, metadata={"help": "use the GPU types' relative speeds"})
    model_spread: bool = field(
        default=True, metadata={"help": "a known model's own spread rate instead of spread_rate (core.models)"}
    )

    def __post_init__(self) -> None:
        for name in ("spread_rate", "cross_rack_rate"):
            value = getattr(self, name)
            if not 0 < value <= 1:
                raise ConfigError(f"perf model: {name} must be in (0, 1], got {value}")
        if self.restore_s < 0:
            raise ConfigError(f"perf model: restore_s must be >= 0, got {self.restore_s}")

    def bind(self, topology: Topology) -> BoundPerfModel:
        return BoundPerfModel(self, topology)


class BoundPerfModel:
    """The model specialised to one cluster (precomputes per-type node sizes)."""

    __slots__ = ("_max_node", "model", "topo")

    def __init__(self, model: PerfModel, topology: Topology) -> None:
        self.model = model
        self.topo = topology
        max_node = [0] * len(topology.type_names)
        for n in range(topology.num_nodes):
            t = topology.node_type[n]
            max_node[t] = max(max_node[t], topology.node_num_gpus[n])
        self._max_node = max_node

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
