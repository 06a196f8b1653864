"""How the controller reaches its node agents: in-process on one machine (the agent object itself, or several
:class:`corral.live.transport.inprocess.LocalNode`), or as Ray actor calls across machines
(:mod:`corral.live.transport.ray`).
Both carry the same requests (:class:`corral.live.agent.LaunchRequest`, stop, pause, resume, limits) and the
same reports (:data:`corral.live.agent.AgentReport`)."""
