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
from dataclasses import dataclass

from corral.core.errors import InvariantViolation


@dataclass(frozen=True, slots=True)
class Telemetry:
    time_s: float
    step_time_s: float
    solo_step_time_s: float | None
    mem_peak_mib: int
    mem_mean_mib: int
    mem_need_mib: int
    sm_util: float

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
