"""The event loop shared by simulation and live mode.

- :mod:`corral.engine.event_queue`: events keyed (time, priority, sequence number).
- :mod:`corral.engine.clock`: the clock seam (virtual here; the live controller brings a wall clock).
- :mod:`corral.engine.state`: the single mutable cluster state; it applies decisions and checks invariants.
- :mod:`corral.engine.executor`: the seam through which decisions are carried out (and the optional seams: batch
  sizes, lost nodes).
- :mod:`corral.engine.loop`: :class:`Engine`, which ties them to a policy.
"""

from corral.engine.clock import Clock, VirtualClock
from corral.engine.event_queue import EventQueue
from corral.engine.executor import EventSink, Executor, NodeLossExecutor
from corral.engine.loop import Engine
from corral.engine.state import ClusterState

__all__ = [
    "Clock",
    "ClusterState",
    "Engine",
    "EventQueue",
    "EventSink",
    "Executor",
    "NodeLossExecutor",
    "VirtualClock",
]
