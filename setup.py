"""The optional compiled core (see build_backend/corral_build.py): with ``CORRAL_COMPILE=1``, mypyc compiles the
modules in ``COMPILED``, the replay's hot path: the event loop and cluster state with the engine's job record, the
simulated executor with its performance and sharing models, the policy framework (contract, planner, round,
queues, placement, preemption, reasons), the baseline policies, Tiresias, Themis and HiveD's cells, the Philly and
synthetic trace readers, and the metrics with their statistics. Everything else stays Python in either build; the
project's metadata is all in pyproject.toml.

Chosen by profile (issue 20): a replay's time is spread over a few hundred small calls per job in these modules,
the kind of code mypyc speeds up most. Left out on purpose, each because mypyc would change what it does:

- the records at the seams (``corral.core`` but ``status.py``: job specs, placements, clusters, events,
  decisions): a compiled class checks its attributes' declared types itself, so a bad job spec would fail with a
  TypeError before its own validation could name the field; and mypyc supports no class variables on dataclasses;
- the executor protocols (``runtime_checkable``);
- HiveD's policy: the conformance suite (tests/policies/test_contract.py) wraps the ``schedule`` of a policy
  that has a ``check`` on the instance, which a compiled class does not allow;
- AntMan, Gandiva and IADeep: they subclass the framework's Round and Planner with a narrowed attribute type,
  which mypyc rejects (the base classes allow interpreted subclasses: ``mypyc_attr`` in their modules);
- ``sim/runner.py``: mypyc's C for its ``_thread`` attribute does not compile.

A compiled frozen dataclass cannot be unpickled field by field, so ``PolicyConfig`` pickles through its
constructor (``__reduce__``); sums of floats start from ``0.0`` (mypyc typed an int start as the result's type); a
config field whose type is not a plain class repeats it in ``option(..., annotation=...)`` (a compiled dataclass
keeps only ``tuple`` or ``type`` for it); and no compiled code compares tuples by identity (``is``), since mypyc
rebuilds a tuple where it stores one (Tiresias' event heap did, and lost every event).
"""

from __future__ import annotations

import sys

from setuptools import setup

sys.path.insert(0, "build_backend")  # the backend's own test of CORRAL_COMPILE (setup.py runs in the project folder)
from corral_build import compiling

COMPILED = [
    "core/status.py",
    "engine/clock.py",
    "engine/event_queue.py",
    "engine/loop.py",
    "engine/state.py",
    "policies/baseline.py",
    "policies/framework/contract.py",
    "policies/framework/placement/__init__.py",
    "policies/framework/placement/fgd.py",
    "policies/framework/placement/packing.py",
    "policies/framework/planner.py",
    "policies/framework/preemption.py",
    "policies/framework/queues.py",
    "policies/framework/reasons.py",
    "policies/framework/round.py",
    "policies/hived/cells.py",
    "policies/hived/vc.py",
    "policies/themis.py",
    "policies/tiresias.py",
    "sim/executor.py",
    "sim/metrics.py",
    "sim/perf.py",
    "sim/sharing.py",
    "sim/stats.py",
    "sim/traces/_rows.py",
    "sim/traces/philly.py",
    "sim/traces/synthetic.py",
]

ext_modules = []
if compiling():
    try:
        from mypyc.build import mypycify
    except ImportError as e:  # e.g. --no-build-isolation in an environment without mypy
        raise SystemExit(f"CORRAL_COMPILE is set but mypyc cannot be imported ({e}): pip install mypy") from e

    ext_modules = mypycify([f"src/corral/{m}" for m in COMPILED], opt_level="3")

setup(ext_modules=ext_modules)
