"""Dataclasses whose ``__init__`` is written out must match their fields (issue 20).

The compiled core (``setup.py``) runs a dataclass's generated ``__init__`` as interpreted code, so the records made
on the replay's hot path (a job's status, the sharing model's profiles, AntMan's coordinator snapshots, ...) write
theirs out, which mypyc compiles. Written by hand, it could drift from the fields: this test reads every such class
in ``src/corral`` and checks that its ``__init__`` takes exactly the init fields, in order, with the same types and
defaults (``None`` for a field with a default factory, replaced by the factory's value), and sets every field from
its own parameter once, calling ``__post_init__`` when the class has one (a float field may store it as a float);
a ``__new__`` that checks the arguments (JobSpec) takes the same parameters, untyped.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "corral"


def _is_dataclass(node: ast.ClassDef) -> bool:
    for d in node.decorator_list:
        target = d.func if isinstance(d, ast.Call) else d
        if isinstance(target, ast.Name | ast.Attribute) and ast.unparse(target).endswith("dataclass"):
            return True
    return False


def _written() -> list[tuple[str, ast.ClassDef]]:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.ClassDef)
                and _is_dataclass(node)
                and any(isinstance(b, ast.FunctionDef) and b.name == "__init__" for b in node.body)
            ):
                found.append((f"{path.relative_to(SRC)}:{node.name}", node))
    return found


WRITTEN = _written()


def test_the_hot_records_write_their_init() -> None:
    names = {name.split(":")[1] for name, _ in WRITTEN}
    assert {"JobStatus", "Profile", "Holder", "Guest", "GpuSnapshot", "Snapshot", "Plan", "JobFeatures"} <= names


def _fields(node: ast.ClassDef) -> list[tuple[str, str, ast.expr | None, bool]]:
    """(name, annotation, default, has a factory) of each init field, in order."""
    out = []
    for stmt in node.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            annotation = ast.unparse(stmt.annotation)
            if annotation.startswith("ClassVar"):
                continue
            value = stmt.value
            factory = isinstance(value, ast.Call) and ast.unparse(value.func) == "field"
            if factory:
                assert isinstance(value, ast.Call)
                keywords = {k.arg for k in value.keywords}
                assert keywords == {"default_factory"}, f"{stmt.target.id}: only default_factory is handled here"
            out.append((stmt.target.id, annotation, value, factory))
    return out


@pytest.mark.parametrize(("where", "node"), WRITTEN, ids=[name for name, _ in WRITTEN])
def test_written_init_matches_the_fields(where: str, node: ast.ClassDef) -> None:
    init = next(b for b in node.body if isinstance(b, ast.FunctionDef) and b.name == "__init__")
    fields = _fields(node)
    args = init.args
    assert not args.posonlyargs and not args.kwonlyargs and args.vararg is None and args.kwarg is None
    params = args.args[1:]
    assert [p.arg for p in params] == [f[0] for f in fields], "parameters are the fields, in order"
    defaults: list[ast.expr | None] = [None] * (len(params) - len(args.defaults)) + list(args.defaults)
    for p, default, (name, annotation, value, factory) in zip(params, defaults, fields, strict=True):
        assert p.annotation is not None
        if factory:
            assert ast.unparse(p.annotation) == f"{annotation} | None", name
            assert default is not None and ast.unparse(default) == "None", name
        else:
            assert ast.unparse(p.annotation) == annotation, name
            want = None if value is None else ast.unparse(value)
            assert (None if default is None else ast.unparse(default)) == want, name
    # Every field set once, from its own parameter (a factory's field: the factory's value when None).
    set_from: dict[str, str] = {}
    for stmt in init.body:
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
            call = stmt.value
            if ast.unparse(call.func) == "self.__post_init__":
                continue
            assert ast.unparse(call.func) == "object.__setattr__", ast.unparse(stmt)
            target, value_node = call.args[1], call.args[2]
            assert isinstance(target, ast.Constant) and isinstance(target.value, str)
            name = target.value
        elif isinstance(stmt, ast.Assign):
            (target_node,) = stmt.targets
            assert isinstance(target_node, ast.Attribute) and ast.unparse(target_node.value) == "self"
            name, value_node = target_node.attr, stmt.value
        else:
            raise AssertionError(f"unexpected statement in {where}.__init__: {ast.unparse(stmt)}")
        assert name not in set_from, f"{name} set twice"
        set_from[name] = ast.unparse(value_node)
    for name, annotation, value, factory in fields:
        if factory:
            assert isinstance(value, ast.Call)
            made = ast.unparse(value.keywords[0].value)
            fresh = "{}" if made == "dict" else f"{made}()"
            assert set_from.get(name) == f"{fresh} if {name} is None else {name}", name
        else:
            # From its own parameter; a float field may store it as a float (JobSpec: what the compiled build does).
            allowed = {name}
            if annotation == "float":
                allowed.add(f"float({name})")
            elif annotation == "float | None":
                allowed.add(f"None if {name} is None else float({name})")
            assert set_from.get(name) in allowed, f"{name} is set from its own parameter"
    assert set(set_from) == {f[0] for f in fields}
    # A __new__ that checks the arguments as given (JobSpec) takes the same parameters, untyped, with the same
    # defaults, so that Python binds them the same way for both.
    new = next((b for b in node.body if isinstance(b, ast.FunctionDef) and b.name == "__new__"), None)
    if new is not None:
        assert not new.args.vararg and not new.args.kwarg and not new.args.kwonlyargs
        assert [p.arg for p in new.args.args[1:]] == [p.arg for p in params]
        assert all(p.annotation is not None and ast.unparse(p.annotation) == "object" for p in new.args.args[1:])
        assert [ast.unparse(d) for d in new.args.defaults] == [ast.unparse(d) for d in args.defaults]
    has_post_init = any(isinstance(b, ast.FunctionDef) and b.name == "__post_init__" for b in node.body)
    calls_post_init = any(
        isinstance(s, ast.Expr) and isinstance(s.value, ast.Call) and ast.unparse(s.value.func) == "self.__post_init__"
        for s in init.body
    )
    assert calls_post_init == has_post_init


def test_records_with_a_written_init_copy_and_pickle() -> None:
    """A compiled class with a written ``__init__`` cannot be made empty and filled in, as ``copy`` and ``pickle``
    do by default: JobStatus (copied and pickled for the live controller's forecasts) and Telemetry (inside it)
    go through their constructors, with every field, and so does the live controller's ObservedTelemetry."""
    import copy
    import pickle

    from corral.core.job import JobPhase, JobSpec
    from corral.core.placement import Placement
    from corral.core.status import JobStatus
    from corral.core.telemetry import Telemetry

    telemetry = Telemetry(5.0, 0.3, 0.25, 900, 600, 1000, 0.7)
    job = JobStatus(
        JobSpec("a", 1.0, 2, 50.0),
        phase=JobPhase.RUNNING,
        placement=Placement((0, 1)),
        work_done_s=3.5,
        preemptions=2,
        telemetry=telemetry,
        batch_size_set=64,
    )
    for twin in (copy.copy(job), pickle.loads(pickle.dumps(job))):
        assert type(twin) is JobStatus and twin is not job
        assert dataclasses.astuple(twin) == dataclasses.astuple(job)
    assert copy.copy(job).telemetry is telemetry  # shallow: the frozen values are shared
    assert pickle.loads(pickle.dumps(telemetry)) == telemetry
    try:
        from corral.live.controller.baseline import ObservedTelemetry
    except ImportError:  # the live extra is not installed
        return
    observed = ObservedTelemetry(5.0, 0.3, None, 900, 600, 1000, 0.7, baseline_step_time_s=0.2, baseline_reports=7)
    for twin in (copy.copy(observed), pickle.loads(pickle.dumps(observed))):
        assert type(twin) is ObservedTelemetry and twin == observed
        assert twin.slowdown == observed.slowdown
