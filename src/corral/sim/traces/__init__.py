"""Job traces: readers of real trace formats, filters that reshape a trace, and a synthetic generator.

Readers (each returns a :class:`~corral.sim.traces.Trace`, jobs sorted by submit time, ties in file order):

- :func:`read_philly`: Microsoft Philly (ATC'19), tenant = virtual cluster;
- :func:`read_tiresias`: the Tiresias (NSDI'19) format;
- :func:`read_openb`: Alibaba's GPU-sharing trace (ATC'23), with fractional GPUs and QoS classes;
- :func:`read_csv`: any CSV, with a mapping of columns (:func:`parse_columns` reads the CLI's form), or without
  one when the file uses corral's own column names (``job_id,submit_s,duration_s,num_gpus``...).

:func:`read_trace` picks one by name. Bad input raises :class:`~corral.core.errors.TraceError` naming the
file, line, column and expected form; with ``skip_invalid`` bad rows are skipped and counted in
``Trace.skipped`` instead. Filters (:mod:`corral.sim.traces.filters`) and :func:`synthesize` build new traces.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from corral.core.errors import ConfigError
from corral.sim.traces._rows import PathArg
from corral.sim.traces.filters import assign_models, drop_shorter_than, head, sample, scale_load, select_tenants, window
from corral.sim.traces.generic import parse_columns, read_csv
from corral.sim.traces.openb import PendingMode, read_openb
from corral.sim.traces.philly import read_philly
from corral.sim.traces.tiresias import read_tiresias
from corral.sim.traces.trace import Trace

if TYPE_CHECKING:
    from corral.sim.traces.synthetic import synthesize

FORMATS = ("philly", "tiresias", "openb", "csv")


def read_trace(
    path: PathArg,
    fmt: str,
    *,
    columns: Mapping[str, str] | str | None = None,
    skip_invalid: bool = False,
    pending: PendingMode = "drop",
) -> Trace:
    """Read a trace in format ``fmt`` (one of :data:`FORMATS`).

    ``columns`` is for "csv" only, as a mapping or in the CLI's ``id=a,submit=b,...`` form; without it a csv file
    is read by corral's own column names (see :mod:`corral.sim.traces.generic`).
    ``pending`` is openb's treatment of Pending pods ("drop" or "wait", see :func:`read_openb`).
    """
    if fmt not in FORMATS:
        raise ConfigError(f"unknown trace format {fmt!r}; expected one of {', '.join(FORMATS)}")
    if fmt != "csv" and columns is not None:
        raise ConfigError(f"columns are only for the csv format, not {fmt!r} (its columns are fixed)")
    if fmt != "openb" and pending != "drop":
        raise ConfigError(f"pending={pending!r} is only for the openb format, not {fmt!r}")
    if fmt == "philly":
        return read_philly(path, skip_invalid=skip_invalid)
    if fmt == "tiresias":
        return read_tiresias(path, skip_invalid=skip_invalid)
    if fmt == "openb":
        return read_openb(path, skip_invalid=skip_invalid, pending=pending)
    mapping = parse_columns(columns) if isinstance(columns, str) else columns
    return read_csv(path, mapping, skip_invalid=skip_invalid)


def __getattr__(name: str) -> Any:
    # synthesize is loaded on first use, with numpy: replaying a trace file needs neither (issue 20).
    if name == "synthesize":
        from corral.sim.traces.synthetic import synthesize

        return synthesize
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "FORMATS",
    "PendingMode",
    "Trace",
    "assign_models",
    "drop_shorter_than",
    "head",
    "parse_columns",
    "read_csv",
    "read_openb",
    "read_philly",
    "read_tiresias",
    "read_trace",
    "sample",
    "scale_load",
    "select_tenants",
    "synthesize",
    "window",
]
