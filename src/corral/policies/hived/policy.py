"""HiveD (Zhao et al., "HiveD: Sharing a GPU Cluster for Deep Learning with Guarantees", OSDI'20): virtual
clusters of cells, buddy cell allocation, and low-priority jobs on borrowed cells. ``hived:cells=false`` is the
quota-only scheduler HiveD is measured against (§2.2), for the sharing-anomaly comparison.

The cells and the buddy allocator are :mod:`corral.policies.hived.cells`, the cell quotas that make up each
virtual cluster :mod:`corral.policies.hived.vc`. The rules here:

- **Virtual clusters** (§3.1). Each tenant with cells is a VC: ``vc_cells`` names them, or they are derived from
  the tenants' GPU quotas (:func:`~corral.policies.hived.vc.derive_vc_cells`: a VC of n nodes' worth of GPUs owns
  n node cells). A VC's guaranteed jobs are its *high-priority* jobs; everything else (opportunistic jobs, jobs of
  tenants without cells) is *low-priority* (§3.4).
- **Intra-VC placement** (§3.2, §4). A high-priority job runs inside its VC's virtual cells, as in a private
  cluster made of them: a job of n GPUs up to a node's worth goes to one cell of the lowest level that holds it
  (best fit: the cell with the fewest free GPUs that still hold it, among the cells the VC already uses; then an
  unbound cell of that level), a larger job to ``n // node`` whole nodes and the rest in one cell of the lowest
  level that holds it. GPUs lent to low-priority jobs count as free: those jobs are preempted. Every choice
  depends on the VC's own jobs only, in the order of its own history, so the VC behaves exactly as its private
  cluster would.
- **Dynamic binding** (§3.2). A virtual cell is bound to a physical cell of its level by the buddy allocator
  when the VC first puts a job in it, and released (buddies merged back) when the VC's last job there ends. The
  allocator keeps ``C_k >= D_k`` (free GPUs at level k and above cover the VCs' unbound cells there), so a bind
  never fails: **sharing safety** (§3.3): a sequence of requests that fits the VC's private cluster fits at once.
- **Low-priority jobs** (§3.4) run on any idle GPU and are preempted when a high-priority job needs one. To make
  that rare they go first to GPUs bound to no VC (bound GPUs are where a VC's next job lands), packed where the
  fewest idle GPUs are left (a lowest-level best fit keeps whole free cells for the VCs), and only then, with
  ``borrow_bound``, to idle GPUs of bound cells; the buddy allocator binds the free cells with the fewest
  borrowed GPUs, splitting a clean higher cell instead when safety allows.
- **Quota-only** (``cells=false``, HiveD §2.2's baseline): the same rounds, affinity rule, priorities and
  preemption of low-priority jobs, but a high-priority job (a guaranteed job of a tenant with a quota) needs only
  its tenant's GPU count within quota and any GPUs of the right shape: other tenants' jobs fragment nodes, and a
  job that needs a whole node can wait although its tenant's quota is free (the *sharing anomaly*).

- **Bad hardware** (HiveD OSDI'20 §3.2: binding virtual cells to physical ones only when used is what lets a VC
  keep its cells while hardware fails; its scheduler marks cells on failed nodes bad and binds them only when
  "doomed"). A lost node's jobs are requeued by the engine; its GPUs then count as used for good in the
  policy's picture (no job of any priority goes there, none is preempted for them) and as down (a VC's cell
  over them offers only its other GPUs); the buddy allocator binds a cell with down GPUs only when no healthy cell
  of the level is free or can be split safely, and a plan that such a cell cannot hold is undone (the job waits).
  Safety counts bad cells as free, as HiveD does: a VC is never refused a cell, but until the node is back a
  doomed cell may hold less than its size. A job that fits the VC's cells only with the lost node waits; it is
  not rejected (admission judges the whole cluster).

Rounds: high-priority jobs first, one FIFO (submission order) over all VCs; a job that does not fit skips every
job of its VC and kind at least as large (quota-only: of every VC, the GPUs being shared), or of its tenant when
the quota is what stops it. Then low-priority jobs, FIFO, on idle GPUs only. HiveD allocates whole GPUs: a job
asking for a share of one gets a whole GPU. A gang runs on one chain (one node shape of one GPU type). The
pending jobs of each priority are a :class:`~corral.policies.framework.queues.KeyedQueue` by VC and shape; a round
is a :class:`~corral.policies.framework.round.Round` (its launches and preemptions, why each job it examined waits)
that keeps the tenants' guaranteed GPUs as it goes, for the engine's quota check (which holds with cells too). Its
planner plans nothing: the cells are the policy's own picture, changed as the round decides.

Cost: the policy keeps its own picture of the cells, changed in the round that decides (and checked against
each change the engine reports): per cell the GPUs used by high- and low-priority jobs and the GPUs bound to no
VC, indexed per level by free count (:class:`~corral.policies.hived.cells.Buckets`); a placement is a few bucket
look-ups and a walk down one cell, O(levels x fanout), never a scan of every GPU or job.
"""

from __future__ import annotations

import heapq
import itertools
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mypy_extensions import mypyc_attr

from corral.core.decisions import Decision
from corral.core.errors import InvariantViolation
from corral.core.job import FULL_GPU_MILLI, JobClass, JobPhase, JobSpec, JobView
from corral.core.options import option
from corral.core.placement import Placement
from corral.core.wording import gpus
from corral.policies.framework.contract import BasePolicy, PolicyConfig, allowed_types, capacity_reason
from corral.policies.framework.queues import KeyedQueue
from corral.policies.framework.round import Round
from corral.policies.framework.view import ClusterView
from corral.policies.hived.cells import BOUND, Buckets, BuddyAllocator, CellTree, Chain
from corral.policies.hived.vc import CellQuota, VcCells, check_vc_cells, derive_vc_cells, describe_vc, parse_vc_cells


@dataclass(frozen=True, slots=True)
class HivedConfig(PolicyConfig):
    cells: bool = option(
        True, "virtual clusters of cells (false: the quota-only baseline, GPU counts per tenant, no cells)"
    )
    vc_cells: str = option(
        "",
        "explicit cell quotas, TENANT=CELL+CELL...;TENANT=... with CELL = COUNTxLEVEL@TYPE/GPUS (COUNTx, @TYPE and "
        "/GPUS optional; LEVEL gpu, switch, node or rack; GPUS per node); empty: derived from the GPU quotas",
    )
    borrow_bound: bool = option(
        True, "low-priority jobs may use idle GPUs of cells bound to a VC when no unbound GPUs fit them"
    )
    backfill: bool = option(
        True,
        "a job that does not fit lets later jobs of its VC (and later low-priority jobs) start; false: each VC's "
        "queue, and the low-priority queue, stop at their first job that does not fit (YARN-CS queues)",
    )


_Key = tuple[int, tuple[str, ...], int | None, int, int]  # (VC or -1, GPU types, memory, milli, GPUs)
_Entry = tuple[float, int, str]  # (submission time, arrival number, job): FIFO order


class _Walk:
    """The merged FIFO order of a pending queue's groups, skipping wholesale every group a failure blocks (as
    ``policies.framework.queues.PendingWalk``). The queue must not change while it is walked."""

    __slots__ = ("_by_group", "_by_kind", "_by_vc", "_heap", "_queue")

    def __init__(self, queue: KeyedQueue[_Key]) -> None:
        self._queue = queue
        self._heap: list[tuple[_Entry, int, _Key]] = [(group[0], 0, key) for key, group in queue.groups.items()]
        heapq.heapify(self._heap)
        self._by_group: dict[tuple[int, tuple[str, ...], int | None, int], int] = {}
        self._by_kind: dict[tuple[tuple[str, ...], int | None, int], int] = {}
        self._by_vc: dict[int, int] = {}

    def block_group(self, key: _Key) -> None:
        """Jobs of this VC and kind at least this large cannot fit either."""
        family = key[:4]
        self._by_group[family] = min(self._by_group.get(family, key[4]), key[4])

    def block_kind(self, key: _Key) -> None:
        """Jobs of this kind at least this large, of any VC, cannot fit either."""
        kind = key[1:4]
        self._by_kind[kind] = min(self._by_kind.get(kind, key[4]), key[4])

    def block_vc(self, key: _Key, *, everything: bool = False) -> None:
        """This tenant's quota has no room for a demand this large (``everything``: its queue stops here)."""
        demand = 0 if everything else key[3] * key[4]
        self._by_vc[key[0]] = min(self._by_vc.get(key[0], demand), demand)

    def _blocked(self, key: _Key) -> bool:
        size = key[4]
        got = self._by_group.get(key[:4])
        if got is not None and size >= got:
            return True
        got = self._by_kind.get(key[1:4])
        if got is not None and size >= got:
            return True
        got = self._by_vc.get(key[0])
        return got is not None and key[3] * size >= got

    def __iter__(self) -> Iterator[tuple[_Key, str]]:
        heap, groups = self._heap, self._queue.groups
        while heap:
            entry, i, key = heap[0]
            if self._blocked(key):
                heapq.heappop(heap)
                continue
            yield key, entry[2]
            group = groups[key]
            if i + 1 < len(group):
                heapq.heapreplace(heap, (group[i + 1], i + 1, key))
            else:
                heapq.heappop(heap)


@dataclass(slots=True)
class _VC:
    index: int
    tenant: str
    cells: tuple[CellQuota, ...]
    chains: tuple[int, ...]  # chains it has cells in, in order
    unbound: dict[tuple[int, int], int]  # (chain, level) -> virtual cells not bound now
    tops: dict[int, None] = field(default_factory=dict)  # the physical cells bound to it now


@dataclass(frozen=True, slots=True)
class _Run:
    """What this policy made of a running job: its priority and VC (a job adopted where its VC's cells cannot be
    bound runs as a borrower). Where it runs is in ``_gpu_job``, per GPU; each change the engine reports says where
    the job ran (``before``), so no copy of its placement is kept."""

    high: bool
    vc: int  # -1: none

    # Written out (a test checks it against the fields): the compiled core runs a dataclass's generated __init__ as
    # interpreted code (issue 20; setup.py).
    def __init__(self, high: bool, vc: int) -> None:
        object.__setattr__(self, "high", high)
        object.__setattr__(self, "vc", vc)


_Plan = tuple[Any, ...]  # ("cell", cell) | ("bind", level) | ("spare",)


class _Round(Round):
    """One HiveD round: the base's actions and reasons, and the tenants' guaranteed GPUs launched and preempted so
    far. The planner plans nothing (the policy's picture of the cells is what the round changes), so launches and
    preemptions leave it alone and the quota is counted here."""

    __slots__ = ("added",)

    def __init__(self, view: ClusterView, now_s: float) -> None:
        super().__init__(view, now_s)
        self.added: dict[str, int] = {}  # guaranteed milli-GPUs launched (+) and preempted (-) this round, per tenant

    def quota_allows(self, job: JobView) -> bool:
        """Does the job's tenant have quota room for it (the engine's check, which holds with cells too)?"""
        if job.job_class is not JobClass.GUARANTEED:
            return True
        spec = job.spec
        tenant = self.view.tenants.get(spec.tenant)
        if tenant is None or tenant.quota_gpus is None:
            return True
        used = self.view.tenant_guaranteed_milli(spec.tenant) + self.added.get(spec.tenant, 0)
        return used + spec.gpu_demand_milli <= tenant.quota_gpus * FULL_GPU_MILLI

    def start(self, job: JobView, gpus: list[int]) -> None:
        """Launch pending ``job`` on whole ``gpus`` (at the share it asked for)."""
        spec = job.spec
        self.launch(spec.job_id, Placement(tuple(sorted(gpus)), spec.gpu_milli))
        self._charge(job, +1)

    def stop(self, victim: JobView, reason: str) -> None:
        """Preempt running ``victim``."""
        self.preempt(victim, reason, release=False)  # nothing to give back in the planner
        self._charge(victim, -1)

    def _charge(self, job: JobView, sign: int) -> None:
        if job.job_class is JobClass.GUARANTEED:
            self.added[job.spec.tenant] = self.added.get(job.spec.tenant, 0) + sign * job.spec.gpu_demand_milli


@mypyc_attr(allow_interpreted_subclasses=True)  # a user's policy (and a test's) may extend it
class HivedPolicy(BasePolicy):
    name = "hived"
    summary = "HiveD (OSDI'20): virtual clusters of cells, buddy allocation, borrowers preempted; cells=false: quotas"
    Config = HivedConfig

    def __init__(self, config: PolicyConfig | None = None, *, seed: int = 0) -> None:
        super().__init__(config, seed=seed)
        cfg = self.config
        assert isinstance(cfg, HivedConfig)
        self.cfg = cfg
        self.tree: CellTree | None = None
        self.buddy: BuddyAllocator | None = None
        self.vcs: list[_VC] = []
        self._vc_of: dict[str, int] = {}
        self._limit: list[list[int]] = []  # per VC and chain: GPUs of its cells (what quota-only counts against)
        self._used: list[list[int]] = []  # per VC and chain: GPUs its high-priority jobs hold
        self._hi: list[int] = []
        self._lo: list[int] = []
        self._ub: list[int] = []  # GPUs bound to no VC, per cell
        self._lo_ub: list[int] = []  # of those, lent to low-priority jobs
        self._owner: list[int] = []  # the VC a cell is bound to (itself or an ancestor), -1 none
        self._indexed: list[bool] = []
        self._gpu_job: list[str | None] = []  # per GPU: the running job on it (the victims of a placement)
        self._av: dict[int, Buckets] = {}  # owner -> cells by GPUs not used by high-priority jobs
        self._idle: Buckets | None = None  # cells by idle GPUs
        self._ui: Buckets | None = None  # cells by idle GPUs bound to no VC (HiveD only)
        self._chain_idle: list[int] = []
        self._chain_ui: list[int] = []
        self._down: list[int] = []  # per cell: GPUs under it on nodes that are down
        self._down_nodes: dict[int, None] = {}
        self._runs: dict[str, _Run] = {}
        self._hi_q: KeyedQueue[_Key] = KeyedQueue()  # pending jobs of each priority, by shape (_Key), FIFO
        self._lo_q: KeyedQueue[_Key] = KeyedQueue()
        self._order: dict[str, tuple[float, int]] = {}
        self._seq = 0
        self._stopping: set[str] = set()  # jobs this policy preempted in its last decision
        self._deferred: list[JobView] = []  # running jobs reported before the first look at the cluster
        self._chains_cache: dict[tuple[tuple[str, ...], int | None], tuple[Chain, ...]] = {}

    # -- setting up ---------------------------------------------------------------------------------------------
    def _ensure(self, view: ClusterView) -> CellTree:
        if self.tree is not None:
            return self.tree
        tree = self.tree = CellTree(view.topology)
        n = tree.num_cells
        self._hi, self._lo, self._lo_ub, self._down = [0] * n, [0] * n, [0] * n, [0] * n
        self._ub = list(tree.size)
        self._owner = [-1] * n
        self._indexed = [
            min(1, tree.chains[tree.chain[c]].node_level) <= tree.level[c] <= tree.chains[tree.chain[c]].node_level
            for c in range(n)
        ]
        self._gpu_job = [None] * view.topology.num_gpus
        self._chain_idle = [c.num_gpus for c in tree.chains]
        self._chain_ui = [c.num_gpus for c in tree.chains]
        indexed = [c for c in range(n) if self._indexed[c]]
        self._idle = Buckets(tree)
        for c in indexed:
            self._idle.add(c, tree.size[c])
        # The same VCs in both modes: quota-only counts each VC's GPUs per chain against what its cells hold.
        cells: VcCells = (
            parse_vc_cells(self.cfg.vc_cells, tree)
            if self.cfg.vc_cells.strip()
            else derive_vc_cells(tree, view.tenants)
        )
        check_vc_cells(tree, cells)
        for tenant, quota in sorted(cells.items()):
            if not quota:
                continue
            vc = _VC(
                index=len(self.vcs),
                tenant=tenant,
                cells=quota,
                chains=tuple(sorted({q.chain for q in quota})),
                unbound={(q.chain, q.level): q.count for q in quota},
            )
            self.vcs.append(vc)
            self._vc_of[tenant] = vc.index
            limit = [0] * len(tree.chains)
            for q in quota:
                limit[q.chain] += q.count * tree.chains[q.chain].sizes[q.level]
            self._limit.append(limit)
            self._used.append([0] * len(tree.chains))
        if self.cfg.cells:
            self.buddy = BuddyAllocator(tree, cost=self._lo)
            self._ui = Buckets(tree)
            for c in indexed:
                self._ui.add(c, tree.size[c])
            for vc in self.vcs:
                for q in vc.cells:
                    self.buddy.reserve(q.chain, q.level, q.count)
                self._av[vc.index] = Buckets(tree)
        else:
            av = self._av[-1] = Buckets(tree)
            for c in indexed:
                av.add(c, tree.size[c])
        for job in self._deferred:
            self.on_job_changed(job, None, 0.0)
        self._deferred = []
        for node in view.down_nodes():
            self._set_down(node, +1)
        return tree

    def vc_cells(self) -> dict[str, str]:
        """Each VC's cells, in words (after the first round; for reports and tests)."""
        assert self.tree is not None
        return {vc.tenant: describe_vc(self.tree, vc.cells) for vc in self.vcs}

    def _chains(self, view: ClusterView, spec: JobSpec) -> tuple[Chain, ...]:
        key = (spec.gpu_types, spec.gpu_mem_mib)
        got = self._chains_cache.get(key)
        if got is None:
            assert self.tree is not None
            types = set(allowed_types(view, spec))
            got = self._chains_cache[key] = tuple(c for c in self.tree.chains if c.gpu_type in types)
        return got

    def _is_high(self, job: JobView) -> bool:
        return job.job_class is JobClass.GUARANTEED and job.spec.tenant in self._vc_of

    # -- admission ------------------------------------------------------------------------------------------------
    def admit(self, view: ClusterView, spec: JobSpec) -> str | None:
        self._ensure(view)
        reason = capacity_reason(view, spec)
        if reason is not None:
            return reason
        n = spec.num_gpus
        chains = self._chains(view, spec)
        if not any(c.num_gpus >= n for c in chains):
            most = max((c.num_gpus for c in chains), default=0)
            return f"needs {gpus(n)} of one node shape and GPU type; the largest such group has {most}"
        vc_index = self._vc_of.get(spec.tenant)
        if spec.job_class is JobClass.GUARANTEED and vc_index is not None:
            vc = self.vcs[vc_index]
            if self.cfg.cells:
                fits = any(c.index in vc.chains and self._fits_empty(vc, c, n) for c in chains)
            else:
                fits = any(self._limit[vc_index][c.index] >= n for c in chains)
            if not fits:
                assert self.tree is not None
                return (
                    f"needs {gpus(n)} on {-(-n // max(c.node_gpus for c in chains))} node(s); the cells of "
                    f"{spec.tenant!r} are {describe_vc(self.tree, vc.cells)}"
                )
        return None

    def _fits_empty(self, vc: _VC, chain: Chain, n: int) -> bool:
        """Would ``n`` GPUs fit the VC's cells of ``chain`` with none of them in use (the private cluster)?"""
        g, nl = chain.node_gpus, chain.node_level
        cells = [(q.level, q.count) for q in vc.cells if q.chain == chain.index]
        if n <= g:
            return any(chain.sizes[level] >= n for level, _ in cells)
        m, r = divmod(n, g)
        whole = sum(count * (chain.sizes[level] // g) for level, count in cells if level >= nl)
        return whole >= m and (r == 0 or whole > m or any(lv < nl and chain.sizes[lv] >= r for lv, _ in cells))

    # -- the policy's picture of the cells --------------------------------------------------------------------------
    def _use(self, gpus: tuple[int, ...] | list[int], high: bool, sign: int) -> None:
        """Count ``gpus`` as taken (``sign`` +1) or given back (-1) by a job of that priority."""
        tree = self.tree
        assert tree is not None and self._idle is not None
        hi, lo, lo_ub, ub, size = self._hi, self._lo, self._lo_ub, self._ub, tree.size
        indexed, owner, avs, idle, ui, down = self._indexed, self._owner, self._av, self._idle, self._ui, self._down
        for g in gpus:
            leaf = tree.gpu_leaf[g]
            unbound = ub[leaf] == 1
            chain = tree.chain[leaf]
            self._chain_idle[chain] -= sign
            if not high and unbound:
                self._chain_ui[chain] -= sign
            for a in tree.ancestors[leaf]:
                if high:
                    hi[a] += sign
                else:
                    lo[a] += sign
                    if unbound:
                        lo_ub[a] += sign
                if indexed[a]:
                    idle.move(a, size[a] - hi[a] - lo[a])
                    if high:
                        av = avs.get(owner[a])
                        if av is not None:
                            av.move(a, size[a] - hi[a] - down[a])
                    elif unbound and ui is not None:
                        ui.move(a, ub[a] - lo_ub[a])
            if not high and self.buddy is not None:
                self.buddy.cost_changed(leaf)

    def _bind(self, vc: _VC, chain: int, level: int) -> int:
        """Bind one of the VC's unbound virtual cells of ``level`` to a physical cell (buddy allocation, §3.2)."""
        assert self.buddy is not None
        cell = self.buddy.bind(chain, level)
        self._attach(vc, cell)
        return cell

    def _attach(self, vc: _VC, cell: int) -> None:
        tree = self.tree
        assert tree is not None and self._ui is not None
        av, ui, ub, lo_ub, size = self._av[vc.index], self._ui, self._ub, self._lo_ub, tree.size
        self._chain_ui[tree.chain[cell]] -= ub[cell] - lo_ub[cell]
        gone, gone_lo = ub[cell], lo_ub[cell]
        # Depth first, children in order: the VC's index lists the cell's parts in the same order every time.
        for d in tree.subtree(cell):
            self._owner[d] = vc.index
            ub[d] = lo_ub[d] = 0
            if self._indexed[d]:
                av.add(d, size[d] - self._hi[d] - self._down[d])
                ui.move(d, 0)
        a = tree.parent[cell]
        while a >= 0:
            ub[a] -= gone
            lo_ub[a] -= gone_lo
            if self._indexed[a]:
                ui.move(a, ub[a] - lo_ub[a])
            a = tree.parent[a]
        vc.tops[cell] = None
        vc.unbound[(tree.chain[cell], tree.level[cell])] -= 1

    def _detach(self, vc: _VC, cell: int) -> None:
        tree = self.tree
        assert tree is not None and self._ui is not None and self.buddy is not None
        av, ui, ub, lo_ub, lo, size = self._av[vc.index], self._ui, self._ub, self._lo_ub, self._lo, tree.size
        for d in tree.subtree(cell):
            self._owner[d] = -1
            ub[d] = size[d]
            lo_ub[d] = lo[d]
            if self._indexed[d]:
                av.remove(d)
                ui.move(d, size[d] - lo[d] - self._hi[d])
        a = tree.parent[cell]
        while a >= 0:
            ub[a] += size[cell]
            lo_ub[a] += lo[cell]
            if self._indexed[a]:
                ui.move(a, ub[a] - lo_ub[a])
            a = tree.parent[a]
        self._chain_ui[tree.chain[cell]] += size[cell] - lo[cell] - self._hi[cell]
        del vc.tops[cell]
        vc.unbound[(tree.chain[cell], tree.level[cell])] += 1
        self.buddy.release(cell)

    def _start(self, job_id: str, gpus: list[int], high: bool, vc: int) -> None:
        for g in gpus:
            if self._gpu_job[g] is not None:
                raise InvariantViolation(f"hived: GPU {g} is given to {job_id!r} but {self._gpu_job[g]!r} holds it")
            self._gpu_job[g] = job_id
        self._use(gpus, high, +1)
        self._runs[job_id] = _Run(high, vc)
        if vc >= 0:
            assert self.tree is not None
            self._used[vc][self.tree.chain[self.tree.gpu_leaf[gpus[0]]]] += len(gpus)

    def _stop(self, job_id: str, placement: Placement | None) -> None:
        """Count running ``job_id``'s GPUs (those of ``placement``, where it ran) as given back."""
        if placement is None:
            raise InvariantViolation(f"hived: running job {job_id!r} stopped without a placement")
        gpus = tuple(sorted(placement.gpus))
        gpu_job = self._gpu_job
        for g in gpus:
            if gpu_job[g] != job_id:
                raise InvariantViolation(f"hived: {job_id!r} stopped on GPU {g}, which {gpu_job[g]!r} holds")
            gpu_job[g] = None
        run = self._runs.pop(job_id)
        self._use(gpus, run.high, -1)
        if run.vc >= 0:
            assert self.tree is not None
            self._used[run.vc][self.tree.chain[self.tree.gpu_leaf[gpus[0]]]] -= len(gpus)
        if run.vc >= 0 and self.cfg.cells:
            # A bound cell the VC no longer uses goes back to the buddy allocator (§3.2).
            vc = self.vcs[run.vc]
            tree = self.tree
            assert tree is not None and self.buddy is not None
            state = self.buddy.state
            for top in {next(a for a in tree.ancestors[tree.gpu_leaf[g]] if state[a] == BOUND) for g in gpus}:
                if self._hi[top] == 0:
                    self._detach(vc, top)

    # -- finding GPUs -----------------------------------------------------------------------------------------------
    def _avail(self, cell: int) -> int:
        """GPUs of ``cell`` a high-priority job may take: not used by one, and not down."""
        assert self.tree is not None
        return self.tree.size[cell] - self._hi[cell] - self._down[cell]

    def _idle_of(self, cell: int) -> int:
        assert self.tree is not None
        return self.tree.size[cell] - self._hi[cell] - self._lo[cell]

    def _ui_of(self, cell: int) -> int:
        return self._ub[cell] - self._lo_ub[cell]

    def _pick(self, cell: int, n: int, count: Callable[[int], int]) -> list[int]:
        """``n`` GPUs of ``cell`` (which has at least ``n`` by ``count``): in the best-fitting child that holds
        them all, else over the children with the most first; among GPUs, idle ones before lent ones."""
        tree = self.tree
        assert tree is not None
        if tree.level[cell] == 0:
            return [tree.leaf_gpu[cell]]
        kids = tree.children[cell]
        if tree.level[kids[0]] == 0:
            ok = sorted((k for k in kids if count(k) >= 1), key=lambda k: self._lo[k] > 0)
            return [tree.leaf_gpu[k] for k in ok[:n]]
        best, best_count = -1, 0
        for k in kids:
            c = count(k)
            if c >= n and (best < 0 or c < best_count):
                best, best_count = k, c
        if best >= 0:
            return self._pick(best, n, count)
        out: list[int] = []
        for k in sorted(kids, key=lambda k: -count(k)):
            c = count(k)
            if c <= 0:
                break
            out += self._pick(k, min(c, n - len(out)), count)
            if len(out) == n:
                break
        return out

    def _find(self, index: Buckets, count: Callable[[int], int], chain: Chain, n: int) -> list[int] | None:
        """GPUs for ``n`` by ``count`` over the cells of ``index``: up to a node's worth in one cell of the lowest
        level that holds them (best fit), more in ``n // node`` whole nodes plus the rest in one cell."""
        ci, nl, g = chain.index, chain.node_level, chain.node_gpus
        start = min(1, nl)
        if n <= g:
            for level in range(max(chain.affinity(n), start), nl + 1):
                cell = index.first(ci, level, n)
                if cell >= 0:
                    return self._pick(cell, n, count)
            return None
        m, r = divmod(n, g)
        whole = list(itertools.islice(index.bucket(ci, nl, g), m))
        if len(whole) < m:
            return None
        assert self.tree is not None
        gpus: list[int] = []
        if r:
            skip = dict.fromkeys(whole)
            for level in range(max(chain.affinity(r), start), nl + 1):
                cell = index.first(ci, level, r, skip)
                if cell >= 0:
                    gpus = self._pick(cell, r, count)
                    break
            else:
                return None
        for node in whole:
            gpus += self.tree.gpus(node)
        return gpus

    def _vc_single(
        self, vc: _VC, chain: Chain, n: int, skip: Mapping[int, object] | None = None, used: Counter[int] | None = None
    ) -> _Plan | None:
        """Where ``n`` GPUs (at most a node's worth) go in the VC: per level from the lowest that holds them, a
        cell it already uses (best fit), then one of its unbound virtual cells of the level; above the node level,
        a node inside a larger unbound cell. ``skip``: node cells already chosen; ``used``: unbound cells already
        planned, by level."""
        ci, nl = chain.index, chain.node_level
        av = self._av[vc.index]
        low = chain.affinity(n)
        start = max(low, min(1, nl))

        def left(level: int) -> int:
            return vc.unbound.get((ci, level), 0) - (used[level] if used else 0)

        for level in range(start, nl + 1):
            cell = av.first(ci, level, n, skip)
            if cell >= 0:
                return ("cell", cell)
            for lv in range(low, level + 1) if level == start else (level,):
                if left(lv) > 0:
                    return ("bind", lv)
        if used and used.get(-1):
            return ("spare",)
        for level in range(nl + 1, len(chain.sizes)):
            if left(level) > 0:
                return ("bind", level)
        return None

    def _vc_place(self, vc: _VC, chain: Chain, n: int) -> list[int] | None:
        """Plan ``n`` GPUs in the VC's cells of ``chain`` and, if they fit, bind what the plan needs and return
        the GPUs (the intra-VC rule of the module docstring). A cell bound for the plan that turns out to be bad (a
        doomed bad cell: nodes of it are down, see :mod:`corral.policies.hived.cells`) may not hold them: then
        every cell bound here is released again and the job waits."""
        tree = self.tree
        assert tree is not None
        ci, nl, g = chain.index, chain.node_level, chain.node_gpus
        count = self._avail
        tops = len(vc.tops)
        if n <= g:
            plan = self._vc_single(vc, chain, n)
            if plan is None:
                return None
            cell = plan[1] if plan[0] == "cell" else self._bind(vc, ci, plan[1])
            if tree.level[cell] > nl:
                cell = self._node_under(cell, nl, n)
            picked = self._pick(cell, n, count) if cell >= 0 else []
            if len(picked) < n:
                self._unbind_since(vc, tops)
                return None
            return picked
        m, r = divmod(n, g)
        whole = list(itertools.islice(self._av[vc.index].bucket(ci, nl, g), m))
        binds: list[int] = []
        need = m - len(whole)
        for level in range(nl, len(chain.sizes)):
            per = chain.sizes[level] // g
            for _ in range(vc.unbound.get((ci, level), 0)):
                if need <= 0:
                    break
                binds.append(level)
                need -= per
        if need > 0:
            return None
        rest: _Plan | None = None
        if r:
            used = Counter(binds)
            used[-1] = -need  # nodes left over in the last cell bound: a node for the rest, before a new bind
            rest = self._vc_single(vc, chain, r, dict.fromkeys(whole), used)
            if rest is None:
                return None
        nodes = list(whole)
        for level in binds:
            cell = self._bind(vc, ci, level)
            # Its nodes that are whole (all of them, unless the cell is bad: a down node is no node to use).
            nodes += [d for d in tree.subtree(cell) if tree.level[d] == nl and self._avail(d) == g]
        if len(nodes) < m + (1 if rest is not None and rest[0] == "spare" else 0):
            self._unbind_since(vc, tops)
            return None
        gpus: list[int] = []
        for node in nodes[:m]:
            gpus += tree.gpus(node)
        if rest is not None:
            if rest[0] == "spare":
                cell = nodes[m]
            else:
                cell = rest[1] if rest[0] == "cell" else self._bind(vc, ci, rest[1])
                if tree.level[cell] > nl:
                    cell = self._node_under(cell, nl, r)
            if cell >= 0:
                gpus += self._pick(cell, r, count)
        if len(gpus) < n:
            self._unbind_since(vc, tops)
            return None
        return gpus

    def _node_under(self, cell: int, node_level: int, n: int) -> int:
        """The first node cell under ``cell`` with ``n`` GPUs available (-1: none, only in a bad cell)."""
        assert self.tree is not None
        level = self.tree.level
        return next((d for d in self.tree.subtree(cell) if level[d] == node_level and self._avail(d) >= n), -1)

    def _unbind_since(self, vc: _VC, tops: int) -> None:
        """Release the cells bound to ``vc`` after its first ``tops`` (bound for a plan that does not fit)."""
        for top in list(vc.tops)[tops:]:
            self._detach(vc, top)

    def _place_high(self, view: ClusterView, job: JobView) -> tuple[list[int] | None, bool]:
        """GPUs for a high-priority job, or None; and whether only its own VC's state stopped it (so a failure
        blocks its VC's larger jobs only, not every tenant's)."""
        spec = job.spec
        n = spec.num_gpus
        vc = self.vcs[self._vc_of[spec.tenant]]
        chains = [c for c in self._chains(view, spec) if c.index in vc.chains]
        if self.cfg.cells:
            for chain in chains:
                got = self._vc_place(vc, chain, n)
                if got is not None:
                    return got, True
            return None, True
        # Quota-only: within the VC's GPU count on the chain; idle GPUs first (no preemption), then GPUs lent to
        # low-priority jobs too.
        assert self._idle is not None
        limit, used = self._limit[vc.index], self._used[vc.index]
        room = [c for c in chains if used[c.index] + n <= limit[c.index]]
        for chain in room:
            if self._chain_idle[chain.index] >= n:
                got = self._find(self._idle, self._idle_of, chain, n)
                if got is not None:
                    return got, False
        for chain in room:
            got = self._find(self._av[-1], self._avail, chain, n)
            if got is not None:
                return got, False
        return None, len(room) < len(chains)

    def _place_low(self, view: ClusterView, job: JobView) -> list[int] | None:
        spec = job.spec
        n = spec.num_gpus
        chains = self._chains(view, spec)
        assert self._idle is not None
        if self._ui is not None:  # GPUs bound to no VC first (§3.4)
            for chain in chains:
                if self._chain_ui[chain.index] >= n:
                    got = self._find(self._ui, self._ui_of, chain, n)
                    if got is not None:
                        return got
            if not self.cfg.borrow_bound:
                return None
        for chain in chains:
            if self._chain_idle[chain.index] >= n:
                got = self._find(self._idle, self._idle_of, chain, n)
                if got is not None:
                    return got
        return None

    # -- the engine's reports ----------------------------------------------------------------------------------------
    def _key(self, job: JobView, high: bool) -> _Key:
        spec = job.spec
        vc = -1
        if high:
            vc = self._vc_of[spec.tenant]
        return (vc, spec.gpu_types, spec.gpu_mem_mib, spec.gpu_milli, spec.num_gpus)

    def _enqueue(self, job: JobView) -> None:
        job_id = job.spec.job_id
        order = self._order.get(job_id)
        if order is None:
            self._seq += 1
            order = self._order[job_id] = (job.spec.submit_s, self._seq)
        high = self._is_high(job)
        (self._hi_q if high else self._lo_q).add(self._key(job, high), (order[0], order[1], job_id))

    def on_job_changed(self, job: JobView, before: Placement | None, now_s: float) -> None:
        if self.tree is None:  # restored before this policy saw the cluster: taken into account at the first look
            if job.phase in (JobPhase.RUNNING, JobPhase.PENDING):
                self._deferred.append(job)
            return
        job_id = job.spec.job_id
        phase = job.phase
        run = self._runs.get(job_id)
        if phase is JobPhase.RUNNING:
            placement = job.placement
            assert placement is not None
            if run is not None:
                gpu_job = self._gpu_job
                for g in placement.gpus:
                    if gpu_job[g] != job_id:
                        self._stop(job_id, before)  # moved by something else
                        break
                else:
                    return  # as this policy decided (it holds no other GPU: a placement has the job's count)
            self._hi_q.remove(job_id)
            self._lo_q.remove(job_id)
            self._adopt(job)
            return
        if phase is JobPhase.PENDING:
            if job_id in self._stopping:
                self._stopping.discard(job_id)  # preempted as decided (it may be running again elsewhere)
                return
            if run is not None:
                self._stop(job_id, before)  # stopped by something else (live mode: its process went away)
            if job_id not in self._hi_q and job_id not in self._lo_q:
                self._enqueue(job)
            return
        if run is not None:
            self._stop(job_id, before)
        self._hi_q.remove(job_id)
        self._lo_q.remove(job_id)
        self._order.pop(job_id, None)

    def _adopt(self, job: JobView) -> None:
        """Take into account a job running where this policy did not put it (live mode: restored after a
        restart). A high-priority job's GPUs are bound to its VC where the buddy allocator can do it safely;
        otherwise the job counts as a borrower."""
        assert job.placement is not None and self.tree is not None
        gpus = list(job.placement.gpus)
        high = self._is_high(job)
        vc_index = self._vc_of.get(job.spec.tenant, -1) if high and self.cfg.cells else -1
        if vc_index >= 0 and not self._bind_for(self.vcs[vc_index], gpus):
            high, vc_index = False, -1
        self._start(job.spec.job_id, gpus, high, vc_index)

    def _bind_for(self, vc: _VC, gpus: list[int]) -> bool:
        tree = self.tree
        assert tree is not None and self.buddy is not None
        for g in gpus:
            leaf = tree.gpu_leaf[g]
            if self._owner[leaf] == vc.index:
                continue
            for cell in reversed(tree.ancestors[leaf]):  # the largest of the VC's cells first
                key = (tree.chain[cell], tree.level[cell])
                if vc.unbound.get(key, 0) > 0 and self.buddy.bind_at(cell):
                    self._attach(vc, cell)
                    break
            else:
                for top in [t for t in vc.tops if self._hi[t] == 0]:
                    self._detach(vc, top)
                return False
        return True

    # -- nodes lost and back ------------------------------------------------------------------------------------------
    def on_nodes_changed(self, view: ClusterView, nodes: Sequence[int], now_s: float) -> None:
        if self.tree is None:
            return  # the first look at the cluster reads which nodes are down
        for node in nodes:
            down = not view.node_up(node)
            if down != (node in self._down_nodes):
                self._set_down(node, +1 if down else -1)

    def _set_down(self, node: int, sign: int) -> None:
        """Node ``node`` went down (``sign`` +1) or came back (-1). Its GPUs count in the picture of the cells as
        lent for good (idle to nobody, never a preemption victim: nothing runs there) and as down (available to
        no VC); the buddy allocator files the cells over them as bad or healthy again (HiveD's handling of bad
        hardware, see :mod:`corral.policies.hived.cells`). The engine requeued the node's jobs before this."""
        tree = self.tree
        assert tree is not None
        gpus = list(tree.topology.node_gpus(node))
        for g in gpus:
            if self._gpu_job[g] is not None:
                raise InvariantViolation(f"hived: GPU {g} of node {node} changes state under {self._gpu_job[g]!r}")
        if sign > 0:
            self._down_nodes[node] = None
        else:
            del self._down_nodes[node]
        down, hi, size, owner, avs, indexed = self._down, self._hi, tree.size, self._owner, self._av, self._indexed
        for g in gpus:
            leaf = tree.gpu_leaf[g]
            if leaf < 0:
                continue
            self._use([g], False, sign)  # neither idle nor unbound-idle any more (or again)
            for a in tree.ancestors[leaf]:
                down[a] += sign
                av = avs.get(owner[a]) if indexed[a] else None
                if av is not None:
                    av.move(a, size[a] - hi[a] - down[a])
            if self.buddy is not None:
                self.buddy.set_bad(leaf, sign)

    # -- the round ---------------------------------------------------------------------------------------------------
    def schedule(self, view: ClusterView, now_s: float) -> Decision:
        self._ensure(view)
        self._stopping.clear()
        if not self._hi_q and not self._lo_q:
            return Decision.NOTHING
        rnd = _Round(view, now_s)
        waiting = rnd.waiting  # why each job examined and not started waits (Round.wait, inlined: a hot loop)
        if self._hi_q:
            launched: list[str] = []
            stopped: list[JobView] = []
            what = "virtual cluster of" if self.cfg.cells else "quota of"
            walk = _Walk(self._hi_q)
            for key, job_id in walk:
                job = view.job(job_id)
                tenant = job.spec.tenant
                if not rnd.quota_allows(job):
                    waiting[job_id] = f"{what} {tenant} full"
                    walk.block_vc(key, everything=not self.cfg.backfill)
                    continue
                gpus, own = self._place_high(view, job)
                if gpus is None:
                    waiting[job_id] = f"no free cell of {job.spec.num_gpus} GPU(s) for the {what} {tenant}"
                    if not self.cfg.backfill:
                        walk.block_vc(key, everything=True)
                    else:
                        (walk.block_group if own else walk.block_kind)(key)
                    continue
                victims = sorted({v for g in gpus if (v := self._gpu_job[g]) is not None})
                for victim_id in victims:
                    victim = view.job(victim_id)
                    if self._runs[victim_id].high:
                        raise InvariantViolation(f"hived: {job_id!r} was placed on high-priority job {victim_id!r}")
                    self._stop(victim_id, victim.placement)
                    self._stopping.add(victim_id)
                    stopped.append(victim)
                    rnd.stop(victim, f"hived: lent GPUs needed by {job_id} ({what} {tenant!r})")
                self._launch(rnd, job, gpus, high=True)
                launched.append(job_id)
            for job_id in launched:
                self._hi_q.remove(job_id)
            for victim in stopped:
                self._enqueue(victim)
            # Back in the queue: the low-priority walk examines them again, and a reason it gives them is why they
            # wait now (the round's decision keeps reasons only of jobs it did not act on).
            rnd.busy.difference_update(victim.spec.job_id for victim in stopped)
        if self._lo_q and any(self._chain_idle):
            launched = []
            walk = _Walk(self._lo_q)
            for key, job_id in walk:
                if not any(self._chain_idle):
                    break
                job = view.job(job_id)
                if not rnd.quota_allows(job):
                    waiting[job_id] = f"quota of {job.spec.tenant} full"
                    continue  # a guaranteed job of a tenant with a quota and no cells: rare, not worth a block
                gpus = self._place_low(view, job)
                if gpus is None:
                    waiting[job_id] = f"low priority: no idle cell of {job.spec.num_gpus} GPU(s)"
                    if not self.cfg.backfill:
                        break
                    walk.block_kind(key)
                    continue
                self._launch(rnd, job, gpus, high=False)
                launched.append(job_id)
            for job_id in launched:
                self._lo_q.remove(job_id)
        return rnd.decision()

    def _launch(self, rnd: _Round, job: JobView, gpus: list[int], high: bool) -> None:
        spec = job.spec
        self._start(spec.job_id, gpus, high, self._vc_of[spec.tenant] if high else -1)
        rnd.start(job, gpus)

    # -- checks (tests) ---------------------------------------------------------------------------------------------
    def check(self) -> None:
        """Recompute the policy's picture of the cells from the GPUs its running jobs hold and compare (O(cells));
        raise InvariantViolation on any difference. For tests."""
        tree = self.tree
        if tree is None:
            return
        n = tree.num_cells
        hi, lo = [0] * n, [0] * n
        gpu_job = self._gpu_job
        holding: set[str] = set()
        for g, job_id in enumerate(gpu_job):
            if job_id is None:
                continue
            run = self._runs.get(job_id)
            if run is None:
                raise InvariantViolation(f"GPU {g} is held by {job_id!r}, which is not running here")
            holding.add(job_id)
            for a in tree.ancestors[tree.gpu_leaf[g]]:
                (hi if run.high else lo)[a] += 1
            if self.cfg.cells and run.high and self._owner[tree.gpu_leaf[g]] != run.vc:
                raise InvariantViolation(f"high-priority job {job_id!r} has GPU {g} outside its VC's cells")
        if holding != self._runs.keys():
            raise InvariantViolation(f"running jobs without GPUs: {sorted(self._runs.keys() - holding)}")
        down = [0] * n
        for node in self._down_nodes:
            for g in tree.topology.node_gpus(node):
                if gpu_job[g] is not None:
                    raise InvariantViolation(f"GPU {g} of down node {node} is held by {gpu_job[g]!r}")
                for a in tree.ancestors[tree.gpu_leaf[g]]:
                    lo[a] += 1  # a down GPU counts as lent for good (see _set_down)
                    down[a] += 1
        if hi != self._hi or lo != self._lo or down != self._down:
            raise InvariantViolation("per-cell GPU counts are off")
        if self.buddy is not None and self.buddy.bad != down:
            raise InvariantViolation("the buddy allocator's bad-GPU counts are off")
        for vc in self.vcs:
            for top in vc.tops:
                if self.buddy is None or self.buddy.state[top] != BOUND or self._hi[top] == 0:
                    raise InvariantViolation(f"VC {vc.tenant!r}: cell {top} is bound but unused or not bound")
            bound = Counter((tree.chain[t], tree.level[t]) for t in vc.tops)
            for q in vc.cells:
                if vc.unbound.get((q.chain, q.level), 0) + bound[(q.chain, q.level)] != q.count:
                    raise InvariantViolation(f"VC {vc.tenant!r}: bound + unbound cells != its quota")
        if self.buddy is not None:
            self.buddy.check()
        assert self._idle is not None
        for c in range(n):
            ub = sum(1 for leaf in tree.leaves[tree.leaves_from[c] : tree.leaves_to[c]] if self._owner[leaf] < 0)
            lo_ub = sum(
                1 for leaf in tree.leaves[tree.leaves_from[c] : tree.leaves_to[c]] if self._owner[leaf] < 0 and lo[leaf]
            )
            if ub != self._ub[c] or lo_ub != self._lo_ub[c]:
                raise InvariantViolation(f"cell {c}: unbound counts are off")
            if self._indexed[c]:
                if self._idle.count(c) != tree.size[c] - hi[c] - lo[c]:
                    raise InvariantViolation(f"cell {c}: idle index is off")
                if self._ui is not None and self._ui.count(c) != ub - lo_ub:
                    raise InvariantViolation(f"cell {c}: unbound idle index is off")
                for owner, av in self._av.items():
                    have = tree.size[c] - hi[c] - down[c]
                    if (c in av) != (self._owner[c] == owner) or (c in av and av.count(c) != have):
                        raise InvariantViolation(f"cell {c}: free index of owner {owner} is off")
