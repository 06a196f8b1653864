"""HiveD (Zhao et al., OSDI'20): the policy (:mod:`corral.policies.hived.policy`, ``hived``), the cell tree and
buddy cell allocator (:mod:`corral.policies.hived.cells`), and virtual clusters as cell quotas
(:mod:`corral.policies.hived.vc`)."""
