"""The vocabulary of corral: jobs, tenants, GPUs, nodes, the topology, placements, decisions, errors, options.

Nothing in here does I/O, reads a clock or draws random numbers: it is plain data and the rules that keep it
consistent, shared by the simulator and the live controller.
"""

from corral.core.cluster import Cluster, GpuType, NodeSpec, Topology, TopologyLevel
from corral.core.decisions import Action, Decision, Launch, Preempt, Reject
from corral.core.errors import (
    ClusterSpecError,
    ConfigError,
    CorralError,
    InputError,
    InvariantViolation,
    JobSpecError,
    TraceError,
)
from corral.core.events import Event, JobFinished, JobSubmitted, TimerFired
from corral.core.job import JobClass, JobPhase, JobSpec, JobView
from corral.core.placement import Placement
from corral.core.status import JobStatus
from corral.core.tenant import Tenant

__all__ = [
    "Action",
    "Cluster",
    "ClusterSpecError",
    "ConfigError",
    "CorralError",
    "Decision",
    "Event",
    "GpuType",
    "InputError",
    "InvariantViolation",
    "JobClass",
    "JobFinished",
    "JobPhase",
    "JobSpec",
    "JobSpecError",
    "JobStatus",
    "JobSubmitted",
    "JobView",
    "Launch",
    "NodeSpec",
    "Placement",
    "Preempt",
    "Reject",
    "Tenant",
    "TimerFired",
    "Topology",
    "TopologyLevel",
    "TraceError",
]
