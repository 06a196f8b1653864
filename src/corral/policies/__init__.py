"""Scheduling policies: pure decision logic over a read-only view of the cluster.

One module per policy family (:mod:`corral.policies.baseline` for FIFO, SJF and SRTF), one registry
(:mod:`corral.policies.registry`). The contract every policy follows is written in :mod:`corral.policies.base`.
"""

from corral.policies.base import BasePolicy, PolicyConfig, option
from corral.policies.placement import PlacementStrategy
from corral.policies.registry import make_policy, policy_class, policy_names, register_policy
from corral.policies.view import ClusterView

__all__ = [
    "BasePolicy",
    "ClusterView",
    "PlacementStrategy",
    "PolicyConfig",
    "make_policy",
    "option",
    "policy_class",
    "policy_names",
    "register_policy",
]
