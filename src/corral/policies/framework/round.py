"""One scheduling decision in the making: the plan so far, the filter every policy asks, and the decision it ends in.

Like the Kubernetes scheduling framework's ``CycleState`` and Volcano's and KAI's ``Session`` with its
``Statement``: a :class:`Round` lives for one ``schedule`` call. It holds

- the round's :class:`~corral.policies.framework.planner.Planner` (what the actions planned so far leave free),
- the actions in order, and the jobs they act on (``busy``: no job gets two actions in a round unless the policy
  means it, as a migration's ``Preempt`` then ``Launch``),
- why each job the round examined and left waiting waits (:mod:`corral.policies.framework.reasons`),

and offers the steps every policy otherwise writes by hand: :meth:`fits` (quota, GPU types and memory, free
count: the filter), :meth:`place` (a placement strategy on the planner), :meth:`launch`, :meth:`preempt`,
:meth:`resize`, :meth:`wait`, :meth:`checkpoint` and :meth:`rollback` (tentative changes, as a preemption plan
that may not work out), and :meth:`decision`.

A policy with state of its own for the round (Gandiva's slice counts, AntMan's opportunistic layer, IADeep's
memory reservations and batch sizes) subclasses it and adds fields; a policy that needs nothing more than a walk of
the queue (FIFO) uses :func:`corral.policies.baseline.fill` and never sees it. ``schedule()`` stays the one
required method of a policy.

A subclass whose round plans on a planner of its own (a :class:`Planner` subclass: AntMan's allocation layer,
Gandiva's and IADeep's shares) passes it to ``__init__`` and keeps it in a field of its own as well, declared with
its class (AntMan's ``alloc``, Gandiva's and IADeep's ``shares``): the same object as ``planner``, which stays
declared ``Planner``. Redeclaring ``planner`` with the subclass is what mypy allows but mypyc (the compiled core,
setup.py) does not: a compiled class cannot narrow the type of an attribute of its base. Nor is this class generic
in its planner's type: mypyc compiles no overloaded ``__init__``, so a plain ``Round(view, now_s)`` could not
default to ``Round[Planner]`` and every plain round would spell out its planner's type.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from mypy_extensions import mypyc_attr

from corral.core.decisions import Action, Decision, Launch, Preempt, Resize
from corral.core.job import FULL_GPU_MILLI, JobSpec, JobView
from corral.core.placement import Placement
from corral.policies.framework.contract import allowed_types
from corral.policies.framework.placement import PlacementStrategy, place
from corral.policies.framework.placement.fgd import FragmentationScorer
from corral.policies.framework.planner import Planner, PlannerCheckpoint
from corral.policies.framework.reasons import fit_reason, quota_reason
from corral.policies.framework.view import ClusterView


class RoundCheckpoint(NamedTuple):
    """Where a round stood (see :meth:`Round.checkpoint`)."""

    planner: PlannerCheckpoint
    actions: int
    busy: frozenset[str]
    waiting: dict[str, str]


@mypyc_attr(allow_interpreted_subclasses=True)  # subclassed by users' own policies (Python: setup.py)
class Round:
    """The plan of one ``schedule`` call (see the module docstring)."""

    __slots__ = ("actions", "busy", "now_s", "planner", "view", "waiting")

    def __init__(self, view: ClusterView, now_s: float, planner: Planner | None = None) -> None:
        self.view = view
        self.now_s = now_s
        self.planner = planner if planner is not None else Planner(view)
        self.actions: list[Action] = []
        self.busy: set[str] = set()  # jobs acted on this round
        self.waiting: dict[str, str] = {}  # why each job examined and not started waits

    # -- the filter -------------------------------------------------------------------------------------------
    def types(self, spec: JobSpec) -> tuple[int, ...]:
        """The GPU types ``spec`` may run on (its requested types with memory enough for it)."""
        return allowed_types(self.view, spec)

    def fits(
        self,
        spec: JobSpec,
        strategy: PlacementStrategy = PlacementStrategy.CONSOLIDATED,
        types: Sequence[int] | None = None,
    ) -> str | None:
        """``None`` if nothing rules ``spec`` out on what the round leaves free, else why it waits: its tenant's
        quota, or too few free GPUs of a type it accepts (for a whole-GPU job). Passing does not promise a
        placement (the free GPUs may be on too many nodes): :meth:`place` finds out, and a ``None`` there is
        explained by :func:`~corral.policies.framework.reasons.fit_reason`."""
        planner = self.planner
        if not planner.quota_allows(spec):
            return quota_reason(planner, spec)
        if spec.gpu_milli == FULL_GPU_MILLI:
            kinds = self.types(spec) if types is None else types
            n = spec.num_gpus
            if not any(planner.type_free(t) >= n for t in kinds):
                return fit_reason(planner, spec, kinds, strategy)
        return None

    def place(
        self,
        spec: JobSpec,
        strategy: PlacementStrategy,
        types: tuple[int, ...] | None = None,
        scorer: FragmentationScorer | None = None,
    ) -> Placement | None:
        """Find GPUs for ``spec`` with ``strategy`` and take them in the planner (``None``: none fit now). Taking is
        tentative until :meth:`launch`; :meth:`rollback` undoes it."""
        return place(self.planner, spec, strategy, self.types(spec) if types is None else types, scorer)

    # -- actions ----------------------------------------------------------------------------------------------
    def launch(self, job_id: str, placement: Placement) -> None:
        """Start pending ``job_id`` on ``placement`` (taken in the planner already, by :meth:`place` or the
        policy's own planning)."""
        self.actions.append(Launch(job_id, placement))
        self.busy.add(job_id)
        self.waiting.pop(job_id, None)

    def preempt(
        self, job: JobView, reason: str, *, suspend: bool = False, downgrade: bool = False, release: bool = True
    ) -> None:
        """Stop running ``job`` (see :class:`~corral.core.decisions.Preempt`); with ``release`` (the default) its
        GPUs come back in the planner. ``release=False`` is for a victim whose GPUs the planning released already
        (:class:`~corral.policies.framework.preemption.Victims` does)."""
        if release:
            self.planner.release(job)
        job_id = job.spec.job_id
        self.actions.append(Preempt(job_id, reason, suspend=suspend, downgrade=downgrade))
        self.busy.add(job_id)

    def resize(self, job_id: str, gpu_milli: int | None = None, mem_mib: int | None = None, reason: str = "") -> None:
        """Change running ``job_id``'s share or memory in place (the policy plans the change in its planner)."""
        self.actions.append(Resize(job_id, gpu_milli, mem_mib, reason))
        self.busy.add(job_id)

    def act(self, action: Action) -> None:
        """Any other action (an ``Upgrade``, a ``SetBatchSize``, a ``Reject``), in order with the rest."""
        self.actions.append(action)
        self.busy.add(action.job_id)

    def wait(self, job_id: str, reason: str) -> None:
        """``job_id`` was examined and stays waiting, because of ``reason`` (the last reason given wins)."""
        self.waiting[job_id] = reason

    # -- tentative changes ------------------------------------------------------------------------------------
    def checkpoint(self) -> RoundCheckpoint:
        """Where the round stands now, to come back to with :meth:`rollback` if a tentative plan (a preemption
        that may not free enough, a migration that may not help) does not work out. Costs what the round has
        changed so far, not the cluster's size."""
        return RoundCheckpoint(self.planner.checkpoint(), len(self.actions), frozenset(self.busy), dict(self.waiting))

    def rollback(self, cp: RoundCheckpoint) -> None:
        """Undo everything planned since ``cp``: the planner's takes and releases, the actions, the reasons."""
        self.planner.rollback(cp.planner)
        del self.actions[cp.actions :]
        self.busy = set(cp.busy)
        self.waiting = dict(cp.waiting)

    # -- the end ----------------------------------------------------------------------------------------------
    def decision(self, wake_at_s: float | None = None) -> Decision:
        """The round's actions in order, with the reasons of the jobs it examined and left alone. It ends the round:
        the reasons of the jobs acted on are dropped from the round's own (a round examines many more jobs than it
        acts on, so they are not copied)."""
        waiting = self.waiting
        for job_id in self.busy:
            waiting.pop(job_id, None)
        if not self.actions and not waiting and wake_at_s is None:
            return Decision.NOTHING
        return Decision(tuple(self.actions), wake_at_s=wake_at_s, waiting=waiting)
