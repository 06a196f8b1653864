"""Scheduling policies: pure decision logic over a read-only view of the cluster.

One module per policy family (:mod:`corral.policies.baseline` for FIFO, SJF and SRTF), or one package for a family
with private parts (:mod:`corral.policies.antman`, :mod:`corral.policies.hived`, :mod:`corral.policies.iadeep`);
one registry (:mod:`corral.policies.registry`). The contract every policy follows is written in
:mod:`corral.policies.framework.contract`; the mechanics policies share are :mod:`corral.policies.framework`.
"""

from corral.core.options import option
from corral.policies.framework.contract import BasePolicy, PolicyConfig
from corral.policies.framework.placement import PlacementStrategy
from corral.policies.framework.view import ClusterView
from corral.policies.registry import make_policy, policy_class, policy_names, register_policy

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
