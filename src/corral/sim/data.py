"""Where the shared data lives: see :mod:`corral.core.data` (policies read it too, so it is defined there)."""

from __future__ import annotations

from corral.core.data import ENV_VAR, data_dir, data_file

__all__ = ["ENV_VAR", "data_dir", "data_file"]
