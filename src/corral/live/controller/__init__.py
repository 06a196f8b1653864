"""The live controller (:mod:`corral.live.controller.controller`: the loop, its inbox, recovery and the requests
it answers), its executor (:mod:`~corral.live.controller.executor`), the life cycle of a job's process
(:mod:`~corral.live.controller.lifecycle`) and its model of the machines (:mod:`~corral.live.controller.cluster`)."""

from corral.live.controller.cluster import cluster_for, cluster_for_nodes
from corral.live.controller.controller import Controller
from corral.live.controller.executor import AgentLike, ExecutorLinks, LiveExecutor

__all__ = ["AgentLike", "Controller", "ExecutorLinks", "LiveExecutor", "cluster_for", "cluster_for_nodes"]
