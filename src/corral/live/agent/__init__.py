"""The node agent (:mod:`corral.live.agent.agent`), the messages it exchanges with the controller
(:mod:`~corral.live.agent.messages`), the process and file helpers it runs jobs with
(:mod:`~corral.live.agent.processes`), the GPUs it finds (:mod:`~corral.live.agent.gpus`) and the shim it starts each
run through (:mod:`~corral.live.agent.shim`, a standalone file run as ``python -I -S``)."""

from corral.live.agent.agent import SHIM_PATH, Agent, safe_name
from corral.live.agent.messages import (
    AgentReport,
    JobMeasured,
    JobReported,
    JobSaid,
    LaunchRequest,
    ProcessExited,
    ProcessStarted,
    StopRequest,
)

__all__ = [
    "SHIM_PATH",
    "Agent",
    "AgentReport",
    "JobMeasured",
    "JobReported",
    "JobSaid",
    "LaunchRequest",
    "ProcessExited",
    "ProcessStarted",
    "StopRequest",
    "safe_name",
]
