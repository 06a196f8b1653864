"""corral's build backend: setuptools' own, plus an optional compiled core.

With ``CORRAL_COMPILE=1`` in the environment, ``pip install .`` (or ``python -m build``) compiles the replay's hot
modules (the list is in ``setup.py``) with mypyc, the compiler that ships with mypy: the same sources, type-checked
by ``mypy --strict`` already, become C extensions next to them in the wheel, and Python imports the extension
rather than the source. Without it the package is pure Python, as always (issue 20: a compiled core is allowed only
if the pure-Python path stays, installs and passes the same tests).

Only the build needs mypyc, so this backend asks for it (pinned to the version the core was compiled and tested
with), and for the project's dependencies, whose types mypyc checks, only when compiling; a plain install builds
with setuptools alone. An editable install cannot be compiled: the extensions would sit in ``src/`` beside the
sources and shadow every later edit to them.
"""

from __future__ import annotations

import os
import shutil
import tomllib
from typing import Any

from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F403  (every hook this module does not override)

MYPYC = "mypy==2.4.1"  # the mypyc that compiles corral's core in CI


def compiling() -> bool:
    """``CORRAL_COMPILE`` is set to something other than empty or ``0``."""
    return os.environ.get("CORRAL_COMPILE", "") not in ("", "0")


def get_requires_for_build_wheel(config_settings: dict[str, Any] | None = None) -> list[str]:
    if compiling():
        # Not setuptools' hook: it runs setup.py to find the requirements, and setup.py needs mypyc to compile.
        # mypyc type-checks what it compiles, so the build needs the project's dependencies too (numpy's types).
        with open("pyproject.toml", "rb") as f:
            dependencies: list[str] = tomllib.load(f)["project"]["dependencies"]
        return [MYPYC, *dependencies]
    requires: list[str] = _setuptools.get_requires_for_build_wheel(config_settings)
    return requires


def build_wheel(
    wheel_directory: str, config_settings: dict[str, Any] | None = None, metadata_directory: str | None = None
) -> str:
    # setuptools packs whatever build/lib holds, and pip builds in the project's folder: an extension module left
    # there by an earlier compiled build would land in this wheel (a pure one included) and shadow its source.
    shutil.rmtree("build", ignore_errors=True)
    name: str = _setuptools.build_wheel(wheel_directory, config_settings, metadata_directory)
    return name


def get_requires_for_build_editable(config_settings: dict[str, Any] | None = None) -> list[str]:
    _refuse_editable()
    requires: list[str] = _setuptools.get_requires_for_build_editable(config_settings)
    return requires


def build_editable(
    wheel_directory: str, config_settings: dict[str, Any] | None = None, metadata_directory: str | None = None
) -> str:
    _refuse_editable()
    name: str = _setuptools.build_editable(wheel_directory, config_settings, metadata_directory)
    return name


def _refuse_editable() -> None:
    if compiling():
        raise RuntimeError(
            "CORRAL_COMPILE=1 needs a regular install (pip install .), not an editable one (-e): the compiled "
            "modules would sit in src/ beside their sources and hide every later edit to them. Unset CORRAL_COMPILE "
            "for an editable install."
        )
