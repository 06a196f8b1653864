"""The policy framework: the mechanics every policy needs, written once, so that policies stay small.

Like the Kubernetes scheduling framework (one-method extension points) and Volcano's and KAI's session
(tentative changes committed or rolled back):

- :mod:`~corral.policies.framework.contract`: the policy contract (:class:`BasePolicy` and its hooks with neutral
  defaults, :class:`PolicyConfig`) and the capacity checks every ``admit`` starts from;
- :mod:`~corral.policies.framework.view`: :class:`ClusterView`, the read-only view a policy decides from;
- :mod:`~corral.policies.framework.planner`: :class:`Planner`, a round's scratch overlay of tentative takes and
  releases over the view;
- :mod:`~corral.policies.framework.queues`: walks of the pending queue that prune whole shapes that cannot fit;
- :mod:`~corral.policies.framework.preemption`: choosing victims to make room;
- :mod:`~corral.policies.framework.reasons`: why a waiting job waits, in words;
- :mod:`~corral.policies.framework.placement`: the placement strategies, as a table.
"""
