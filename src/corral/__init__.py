"""corral: a GPU cluster scheduler for deep-learning jobs.

The same scheduling policies run in a fast trace-driven simulator (`corral.sim`) and, later, in a live
controller. Layers import inward only::

    core <- policies <- engine <- sim
                               <- live (future)

See ``DESIGN.md``-level notes in ``docs/architecture.md``.
"""

__version__ = "0.1.0"
