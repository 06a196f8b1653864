"""Where the shared data lives (real traces and cluster lists), without copying it into the project.

Lookup order: the ``CORRAL_DATA_DIR`` environment variable; then a ``shared/data`` folder beside the current
directory or any of its parents (``../shared/data`` from the project root); then the same next to the installed
source tree (for an editable install).

It lives in ``workloads`` because policies read shared data too (Tiresias' GPU-time distributions, Gavel's
co-location throughputs), and policies may not import the simulator; the simulator (its cluster lists, its
truth) finds its files here as well.
"""

from __future__ import annotations

import os
from pathlib import Path

from corral.core.errors import ConfigError

ENV_VAR = "CORRAL_DATA_DIR"


def _candidates() -> list[Path]:
    out: list[Path] = []
    env = os.environ.get(ENV_VAR)
    if env:
        out.append(Path(env))
    for base in (Path.cwd(), Path(__file__).resolve()):
        for parent in (base, *base.parents):
            out.append(parent / "shared" / "data")
    return out


def data_dir() -> Path:
    """The shared data folder, or a :class:`ConfigError` saying where we looked."""
    tried = _candidates()
    for path in tried:
        if path.is_dir():
            return path
    raise ConfigError(
        f"cannot find the shared data folder (set {ENV_VAR}); looked in: " + ", ".join(str(p) for p in tried[:6])
    )


def data_file(*parts: str) -> Path:
    """A file under the shared data folder, with a clear error when it is missing."""
    path = data_dir().joinpath(*parts)
    if not path.is_file():
        raise ConfigError(f"missing data file {path}")
    return path
