"""IADeep (Chen et al., SC'23): the policy (:mod:`corral.policies.iadeep.policy`, ``iadeep``), its online
interference predictor (:mod:`corral.policies.iadeep.interference`), its batch-size tuner
(:mod:`corral.policies.iadeep.tuner`) and the Gaussian process the tuner searches with
(:mod:`corral.policies.iadeep.gp`)."""
