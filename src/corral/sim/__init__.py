"""The trace-driven simulator: traces, cluster specs, the performance model, the simulated executor, metrics.

It drives the same engine and policies as live mode, in virtual time.
"""
