"""Live mode: the controller (the engine on a wall clock, with a durable store and an HTTP API), the node agent
that starts and signals real job processes, and the pieces between them.

Layering (see ``../shared/DESIGN.md``): ``live`` imports ``engine``, ``policies`` and ``core``; nothing below
imports ``live``. The job-side library is :mod:`corral.job`; the contract between agent and job is
:mod:`corral.core.contract`.
"""
