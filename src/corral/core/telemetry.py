"""Telemetry: what a running job measures about itself, as the scheduler sees it.

In live mode the job-side library measures each mini-batch and the node's agent adds what NVML reports; in a
replay the simulator's performance model produces the same record. Policies read the latest one
(``JobView.telemetry``) and never know which of the two wrote it: AntMan's local coordinator (OSDI'20 §3.3)
runs unchanged on both.

Figures are per GPU of the job (a gang's GPUs behave alike):

- ``step_time_s``: the job's recent mini-batch time;
- ``solo_step_time_s``: its mini-batch time alone on the same GPUs, when the reporter knows it (the simulator
  always does; a live job knows it once it has run alone), else ``None`` and the coordinator learns a baseline;
- ``mem_peak_mib`` / ``mem_mean_mib``: GPU memory in use at the peak of a mini-batch and on average over it
  (a training step's footprint cycles: activations pile up in the forward pass and are freed in the backward);
- ``mem_need_mib``: the peak the job would reach with no cap (above ``mem_peak_mib`` when a cap makes it spill
  tensors to host memory);
- ``sm_util``: the fraction of the GPU's time its kernels kept the GPU busy, 0..1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from mypy_extensions import mypyc_attr

from corral.core.errors import InvariantViolation


@mypyc_attr(allow_interpreted_subclasses=True)  # the live controller's ObservedTelemetry extends it
@dataclass(frozen=True, slots=True)
class Telemetry:
    time_s: float
    step_time_s: float
    solo_step_time_s: float | None
    mem_peak_mib: int
    mem_mean_mib: int
    mem_need_mib: int
    sm_util: float

    # Written out (a test checks it against the fields): compiled (setup.py), a dataclass's generated __init__ would
    # run as interpreted code, and a replay makes one at every change of a running job's speed (issue 20).
    def __init__(
        self,
        time_s: float,
        step_time_s: float,
        solo_step_time_s: float | None,
        mem_peak_mib: int,
        mem_mean_mib: int,
        mem_need_mib: int,
        sm_util: float,
    ) -> None:
        object.__setattr__(self, "time_s", time_s)
        object.__setattr__(self, "step_time_s", step_time_s)
        object.__setattr__(self, "solo_step_time_s", solo_step_time_s)
        object.__setattr__(self, "mem_peak_mib", mem_peak_mib)
        object.__setattr__(self, "mem_mean_mib", mem_mean_mib)
        object.__setattr__(self, "mem_need_mib", mem_need_mib)
        object.__setattr__(self, "sm_util", sm_util)
        self.__post_init__()

    def __reduce__(self) -> tuple[type[Telemetry], tuple[object, ...]]:
        # Copies and pickles (the live controller's forecasts) go through the constructor: a compiled class with a
        # written __init__ cannot be made empty and then filled in (setup.py).
        return type(self), tuple([getattr(self, f.name) for f in fields(self)])

    def __post_init__(self) -> None:
        if not (self.step_time_s > 0 and math.isfinite(self.step_time_s)):
            raise InvariantViolation(f"telemetry: step_time_s must be finite and > 0, got {self.step_time_s!r}")
        if self.solo_step_time_s is not None and not self.solo_step_time_s > 0:
            raise InvariantViolation(f"telemetry: solo_step_time_s must be > 0, got {self.solo_step_time_s!r}")
        if not 0 <= self.mem_mean_mib <= self.mem_peak_mib:
            raise InvariantViolation(
                f"telemetry: need 0 <= mem_mean_mib <= mem_peak_mib, got {self.mem_mean_mib}, {self.mem_peak_mib}"
            )
        if self.mem_need_mib < 0:
            raise InvariantViolation(f"telemetry: mem_need_mib must be >= 0, got {self.mem_need_mib}")
        if not 0.0 <= self.sm_util <= 1.0:
            raise InvariantViolation(f"telemetry: sm_util must be in [0, 1], got {self.sm_util!r}")

    @property
    def slowdown(self) -> float | None:
        """Step time over the solo step time (1.0 = as fast as alone), when the solo time is known."""
        solo = self.solo_step_time_s
        return None if solo is None else self.step_time_s / solo
