"""Placements: which GPUs a job holds, and at what share of each.

GPUs are numbered densely 0..G-1 across the cluster (see :class:`corral.core.cluster.Topology`), so a placement
is a sorted tuple of GPU indices plus the share taken on each. Integers keep the simulator's hot path cheap.

Two layers share a GPU (AntMan, OSDI'20 §4):

- an ordinary placement *allocates* ``gpu_milli`` of each GPU: the shares allocated on a GPU add up to at most
  1000, and guaranteed jobs' allocations count against their tenant's quota;
- an *opportunistic* placement (``opportunistic=True``) allocates nothing. The job runs on what the allocated
  jobs leave unused, and ``gpu_milli`` is the cap on its compute share that the node's coordinator sets (0 = paused,
  its memory kept). A guaranteed job may be placed on such a GPU at any time; the opportunistic jobs there are
  shrunk, suspended or preempted to make room, never the other way round.

``mem_mib`` is the GPU memory given on each GPU: for an ordinary placement, what is reserved for the job (``None``:
the job spec's ``gpu_mem_mib``, or nothing when that is unknown); for an opportunistic one, its memory cap. What
is given on a GPU, over both layers, never exceeds the GPU's memory.
"""

from __future__ import annotations

from dataclasses import dataclass

from corral.core.errors import JobSpecError


@dataclass(frozen=True, slots=True)
class Placement:
    """Checked as it is made (:class:`~corral.core.errors.JobSpecError`), in ``__new__`` on the arguments as given,
    before ``__init__`` stores them: in the compiled core (``setup.py``) ``__init__`` converts each argument to its
    field's type itself, with a ``TypeError`` that names no field, as :class:`~corral.core.job.JobSpec` does."""

    gpus: tuple[int, ...]
    gpu_milli: int = 1000
    mem_mib: int | None = None
    opportunistic: bool = False

    # The same parameters as __init__, untyped (type checkers read __init__'s types).
    def __new__(
        cls, gpus: object, gpu_milli: object = 1000, mem_mib: object = None, opportunistic: object = False
    ) -> Placement:
        _check_placement(gpus, gpu_milli, mem_mib, opportunistic)
        return object.__new__(cls)

    # Written out (a test checks it against the fields): compiled, the one dataclasses generates would run as
    # interpreted code, and every launch makes a placement (issue 20).
    def __init__(
        self, gpus: tuple[int, ...], gpu_milli: int = 1000, mem_mib: int | None = None, opportunistic: bool = False
    ) -> None:
        object.__setattr__(self, "gpus", gpus)
        object.__setattr__(self, "gpu_milli", gpu_milli)
        object.__setattr__(self, "mem_mib", mem_mib)
        object.__setattr__(self, "opportunistic", opportunistic)

    def __reduce__(self) -> tuple[type[Placement], tuple[object, ...]]:
        # Copies and pickles go through the constructor: compiled, a placement cannot be made empty and filled in.
        return Placement, (self.gpus, self.gpu_milli, self.mem_mib, self.opportunistic)

    @property
    def num_gpus(self) -> int:
        return len(self.gpus)


def _check_placement(gpus: object, gpu_milli: object, mem_mib: object, opportunistic: object) -> None:
    if not isinstance(gpus, tuple) or not all(type(g) is int for g in gpus):
        raise JobSpecError(f"a placement's gpus must be a tuple of GPU indices, got {gpus!r}")
    if not gpus:
        raise JobSpecError("a placement needs at least one GPU")
    if len(set(gpus)) != len(gpus):
        raise JobSpecError(f"a placement lists a GPU twice: {gpus}")
    if type(opportunistic) is not bool:
        raise JobSpecError(f"a placement's opportunistic must be True or False, got {opportunistic!r}")
    low = 0 if opportunistic else 1  # an opportunistic job at share 0 is paused, not gone
    if type(gpu_milli) is not int or not low <= gpu_milli <= 1000:
        raise JobSpecError(f"placement share must be in {low}..1000 milli-GPU, got {gpu_milli!r}")
    if mem_mib is not None and (type(mem_mib) is not int or mem_mib < 0):
        raise JobSpecError(f"placement memory must be >= 0 MiB, got {mem_mib!r}")
