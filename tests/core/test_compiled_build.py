"""The optional compiled core's build (setup.py, build_backend/corral_build.py) and how an install tells which it is.

The compiled build itself is made and tested by .ci/run (CORRAL_COMPILE=1 pip install ., then the replay's tests
against that install); here, what a user sees around it: the backend's requirements, its refusal of an editable
compiled install, and ``corral --version``.
"""

from __future__ import annotations

import importlib.util
import sys
import tomllib
from pathlib import Path
from types import ModuleType

import pytest
from click.testing import CliRunner

import corral
from corral.cli.main import cli

ROOT = Path(__file__).resolve().parents[2]


def backend() -> ModuleType:
    spec = importlib.util.spec_from_file_location("corral_build", ROOT / "build_backend" / "corral_build.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_backend_asks_for_mypyc_and_the_dependencies_only_when_compiling(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    build = backend()
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    monkeypatch.chdir(ROOT)  # a build runs in the project's folder
    monkeypatch.setenv("CORRAL_COMPILE", "1")
    assert build.get_requires_for_build_wheel() == [build.MYPYC, *dependencies]
    assert build.MYPYC.startswith("mypy==")  # pinned: the mypyc the core was compiled and tested with
    for off in ("", "0"):
        monkeypatch.setenv("CORRAL_COMPILE", off)
        assert not build.compiling()
        assert build.MYPYC not in build.get_requires_for_build_wheel()


def test_an_editable_install_is_not_compiled_and_says_why(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    build = backend()
    monkeypatch.setenv("CORRAL_COMPILE", "1")
    with pytest.raises(RuntimeError, match=r"regular install .* not an editable one"):
        build.get_requires_for_build_editable()
    with pytest.raises(RuntimeError, match="hide every later edit"):
        build.build_editable(str(tmp_path))


def test_the_compiled_list_names_existing_modules() -> None:
    text = (ROOT / "setup.py").read_text()
    listed = text.split("COMPILED = [", 1)[1].split("]", 1)[0]
    modules = [line.strip().strip('",') for line in listed.splitlines() if line.strip()]
    assert modules and modules == sorted(modules)
    for module in modules:
        assert (ROOT / "src" / "corral" / module).is_file(), module


def test_version_says_whether_the_core_is_compiled() -> None:
    out = CliRunner().invoke(cli, ["--version"]).output
    assert out.startswith(f"corral {corral.__version__}")
    assert ("(compiled core)" in out) is corral.compiled()
    # compiled() looks for the event loop's extension module next to its source, the way the import system would
    loop = importlib.util.find_spec("corral.engine.loop")
    assert loop is not None and loop.origin is not None
    assert corral.compiled() is (not loop.origin.endswith(".py")), (loop.origin, sys.path[:3])
