"""What corral knows about deep-learning jobs, shared by the policies and by the simulator's truth.

A policy that predicts how a job will run (Tiresias' placement sensitivity, Gandiva's and IADeep's packing, IADeep's
batch sizes) and the simulator that decides how it does run (:mod:`corral.sim.perf`, :mod:`corral.sim.sharing`)
read one model of the job, as AdaptDL's goodput model is shared by its job library and its scheduler:

- :mod:`corral.workloads.models`: model profiles (placement sensitivity, spread rate, Gavel stand-in, the resource
  profile the sharing model uses, batch-size memory and statistical efficiency);
- :mod:`corral.workloads.colocation`: Gavel's measured co-location rates of two jobs packed on one GPU;
- :mod:`corral.workloads.batching`: throughput and goodput at a batch size, from the same measurements;
- :mod:`corral.workloads.data`: where the data files they come from lie.

It imports :mod:`corral.core` only; policies and the simulator import it, never the other way round.
"""
