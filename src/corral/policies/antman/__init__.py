"""AntMan (Xiao et al., OSDI'20): the global scheduler (:mod:`corral.policies.antman.policy`, the ``antman``
policy, with the plan of each round in :mod:`corral.policies.antman.round`) and the local coordinator it runs on each
shared GPU (:mod:`corral.policies.antman.coordinator`: plain logic over telemetry, so the live agent can run the same
code)."""
