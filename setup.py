"""The optional compiled core (see build_backend/corral_build.py): with ``CORRAL_COMPILE=1``, mypyc compiles the
modules in ``COMPILED``, the replay's hot path: the event loop and cluster state with the job spec, placements, the
engine's job record and jobs' telemetry, the simulated executor with its performance and sharing models, the policy
framework (the view, contract, planner, round, queues, placement, preemption, reasons), every registered policy
(the baselines, Tiresias, Themis, AntMan with its coordinator, Gandiva, HiveD with its cells, IADeep with its predictor,
tuner and Gaussian process), the Philly and synthetic trace readers, the metrics with their statistics, and the
writing of a replay's files (jobs.csv: a row per job). Everything else stays Python in either build; the project's
metadata is all in pyproject.toml.

Chosen by profile (issue 20): a replay's time is spread over a few hundred small calls per job in these modules,
the kind of code mypyc speeds up most. Left out on purpose, each because mypyc would change what it does:

- the other records at the seams (clusters, decisions): a compiled class checks its attributes' declared types
  itself, with a TypeError that names no field, and a class variable of a compiled dataclass becomes one of its
  fields (decisions have ``Decision.NOTHING``). Five are compiled all the same: the job spec, whose
  every field the replay reads (12% of a FIFO replay went to reading them from a Python class), and the placement
  check their arguments in ``__new__``, before the compiled ``__init__`` converts them, so that a bad field is
  still named (``corral.core.job``, ``corral.core.placement``); the engine's job record; telemetry, made by
  corral's own code (the simulator, the live controller), whose checks guard invariants, not user input; and the
  events, made only by corral's own code too, three per job of a replay (their priorities are a table,
  ``corral.core.events.PRIORITY``, not class variables). The live
  controller's ``ObservedTelemetry`` extends Telemetry without slots of its own (with them, ``dataclasses`` would
  declare the base's fields again, unseen by the compiled base);
- the executor protocols (``runtime_checkable``);
- ``sim/runner.py``: mypyc's C for its ``_thread`` attribute does not compile.

A compiled frozen dataclass cannot be unpickled field by field, so ``PolicyConfig`` pickles through its
constructor (``__reduce__``); sums of floats start from ``0.0`` (mypyc typed an int start as the result's type); a
config field whose type is not a plain class repeats it in ``option(..., annotation=...)`` (a compiled dataclass
keeps only ``tuple`` or ``type`` for it); and no compiled code compares tuples by identity (``is``), since mypyc
rebuilds a tuple where it stores one (Tiresias' event heap did, and lost every event). A compiled class cannot
narrow the type of an attribute of its base, so a round on a planner of the policy's own keeps it in a field of its
own too (AntMan's ``alloc``, Gandiva's and IADeep's ``shares``; see the framework's round module); it has no
instance dictionary, so a test that checks each round extends a policy's ``schedule`` in a subclass
(``tests/builders.py``'s ``checked``), never on the instance, and the policies that tests or users extend allow
interpreted subclasses (``mypyc_attr``); it is made by its constructor, never by ``Cls.__new__(Cls)`` (IADeep's
``Ridge.copy``); and a compiled module has no source for ``inspect.getsource`` (a test reads the file). A
compiled dataclass runs the ``__init__`` that ``dataclasses`` generates as interpreted code (a frozen one, 15x
slower than compiled), so the records made on the hot path write theirs out (``object.__setattr__`` for a frozen
one, which mypyc compiles to a direct store); tests/core/test_dataclass_inits.py checks each against its fields.

A compiled policy's call or attribute read through a ``Protocol`` is a generic Python one (looked up by name, its
arguments boxed). So what policies read of the engine, the view (``ClusterView``) and a job (``JobView``), and the
engine's ``Clock``, are interfaces that the cluster state, the job record and the clocks name as their base (mypyc
traits; in plain Python, bases with abstract methods): a direct call into compiled code. Full Philly: FIFO 3.6%
faster, AntMan 12% (issue 20). A compiled trait takes no interpreted subclass, so the executor seams, which the live
executor and the tests implement in Python, stay Protocols.
"""

from __future__ import annotations

import sys

from setuptools import setup

sys.path.insert(0, "build_backend")  # the backend's own test of CORRAL_COMPILE (setup.py runs in the project folder)
from corral_build import compiling

COMPILED = [
    "core/events.py",
    "core/job.py",
    "core/placement.py",
    "core/sorted_groups.py",
    "core/status.py",
    "core/telemetry.py",
    "engine/clock.py",
    "engine/event_queue.py",
    "engine/loop.py",
    "engine/state.py",
    "policies/antman/coordinator.py",
    "policies/antman/policy.py",
    "policies/antman/round.py",
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
    "policies/framework/view.py",
    "policies/gandiva.py",
    "policies/hived/cells.py",
    "policies/hived/policy.py",
    "policies/hived/vc.py",
    "policies/iadeep/gp.py",
    "policies/iadeep/interference.py",
    "policies/iadeep/policy.py",
    "policies/iadeep/tuner.py",
    "policies/themis.py",
    "policies/tiresias.py",
    "sim/executor.py",
    "sim/metrics.py",
    "sim/perf.py",
    "sim/report.py",
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
