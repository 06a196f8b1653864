"""The single mutable cluster state: every job's phase, every GPU's free share, and the indexes over them.

Only this class changes a job's phase or a GPU's allocation, and it checks each change before making it:

- no GPU gives out more share (milli-GPU) or memory than it has;
- a job is in exactly one phase, and moves only along PENDING -> RUNNING -> (PENDING | FINISHED) or
  PENDING -> REJECTED;
- gang: a launch takes all of a job's GPUs at its share, or nothing changes. A whole-GPU job may be *packed*:
  launched at a smaller share of each of its GPUs (``0 < placement.gpu_milli <= 1000``), so that another packed
  job can share them (Gandiva, OSDI'18 §3.1); a fractional job always gets exactly the share it asked for;
- a tenant's guaranteed jobs stay within its quota, counting what each running job holds
  (``num_gpus * placement.gpu_milli``: a packed job counts its packed share) at launch and at release alike;
- two layers per GPU (see :mod:`corral.core.placement`): ordinary placements allocate share (at most 1000 per
  GPU); opportunistic placements allocate none, only a compute-share cap (their caps add up to at most 1000 per
  GPU) and memory. Only a job whose class is opportunistic may run opportunistically; an ``Upgrade`` moves it
  to the ordinary layer within its tenant's quota;
- the GPU memory given on a GPU (ordinary reservations plus opportunistic caps) never exceeds its memory.

Telemetry (:class:`~corral.core.telemetry.Telemetry`) reported for a running job is kept on the job and summed
per GPU (SM utilization, peak memory), with a per-type index of GPUs by measured SM use, so that a policy can
find lightly used GPUs (AntMan places opportunistic jobs by measured, not allocated, use) without a scan.

Per tenant with a quota, the state integrates over time what its guaranteed jobs hold and its *quota shortfall*:
``min(quota - held, pending guaranteed demand)``, the promised share it wanted and did not have (an upper bound:
a pending gang wider than the room left counts for the room).

A job's batch size (``SetBatchSize``) is recorded on the job (``JobStatus.batch_size_set``) and changes no
allocation: the GPU memory a new batch size needs is the policy's to reserve, with a ``Resize`` the state checks.

A preemption followed by a launch of the same job (a migration, or a change of share) is two checked steps: the
job is PENDING in between, exactly as after any preemption.

Nodes can be *down* (lost: ``NodeLost``; back: ``NodeJoined``, see :mod:`corral.engine.loop`). A down node's GPUs
are out of the cluster: its node is in no free-count bucket and not among the nodes with a free GPU, its GPUs
count in no per-type free total, are in no partial-GPU or SM-use index, and read as having no free share and no
free memory (``gpu_free_milli`` and ``gpu_free_mem_mib`` are 0), so a policy that reads the view finds no room
there; a launch, upgrade or restore onto one is refused. ``node_up`` tells which nodes are up, ``up_gpus`` the GPUs
of a type on up nodes; ``topology`` and ``max_node_gpus`` stay those of the whole cluster (a job that only the
down nodes could hold waits for them: it is not rejected). A node goes down only once no job holds any of its GPUs
and no pending job is suspended on it: the engine first requeues the jobs that ran there (``requeue_lost``) and
drops what suspended jobs kept in its host memory (``forget_suspended``), finding both through per-node indexes
(``jobs_on_node``, ``suspended_on_node``) without a scan of all jobs. Invariants: no job holds a GPU of a down
node, and every per-type free count and capacity is the sum over up nodes.

A refused change raises :class:`InvariantViolation` before touching anything, so the state is never half-applied.

Indexes are kept incrementally so that a scheduling round never scans all GPUs or all jobs:

- per node, its entirely free GPUs; per GPU type, nodes bucketed by how many entirely free GPUs they have
  (best-fit is "the first non-empty bucket at or above k"), and the nodes with any free GPU in index order
  (first-fit);
- per GPU type, partly taken GPUs sorted by free share (best-fit for fractional requests);
- the pending queue sorted by the policy's key, in one sorted group per job shape (see ``PendingShape``), and the
  running jobs in launch order;
- per node, the pending jobs suspended there (their state waits in its host memory).

Buckets are insertion-ordered dicts used as ordered sets: deterministic (insertion history is) and O(1).
"""

from __future__ import annotations

import heapq
from array import array
from bisect import insort
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from typing import Any

from sortedcontainers import SortedList

from corral.core.cluster import Topology
from corral.core.errors import InvariantViolation, JobSpecError
from corral.core.job import FULL_GPU_MILLI, JobClass, JobPhase, JobSpec, JobView, mem_given
from corral.core.placement import Placement
from corral.core.sorted_groups import Group, add_entry, has_entry, remove_entry, remove_sorted
from corral.core.status import JobStatus
from corral.core.telemetry import Telemetry
from corral.core.tenant import Tenant
from corral.policies.framework.view import ClusterView, PendingEntry, PendingShape

QueueKey = Callable[[JobView], tuple[Any, ...]]


def submission_order(job: JobView) -> tuple[Any, ...]:
    """The default queue order: by submission time (ties: the order jobs reached the engine)."""
    return (job.spec.submit_s,)


def _drop_sorted(items: list[int], item: int) -> None:
    """Remove ``item`` from ``items``, a list kept sorted (it must be there: else the index is wrong, a bug)."""
    try:
        remove_sorted(items, item)
    except ValueError:
        raise InvariantViolation(f"{item} is not in the sorted index it is being removed from") from None


class ClusterState(ClusterView):
    """Implements :class:`corral.policies.framework.view.ClusterView` (read side) plus the checked mutations."""

    def __init__(
        self,
        topology: Topology,
        tenants: Iterable[Tenant] = (),
        queue_key: QueueKey = submission_order,
        *,
        timeline: bool = True,
    ) -> None:
        self._topo = topology
        self._tenants: dict[str, Tenant] = {t.name: t for t in tenants}
        self._queue_key = queue_key
        topo = topology
        n_types = len(topo.type_names)

        self._gpu_free_milli: list[int] = [FULL_GPU_MILLI] * topo.num_gpus
        self._gpu_free_mem: list[int] = list(topo.gpu_mem_mib)
        self._gpu_jobs: list[dict[str, None]] = [{} for _ in range(topo.num_gpus)]
        self._node_free: list[int] = list(topo.node_num_gpus)
        self._node_free_gpus: list[dict[int, None]] = [dict.fromkeys(topo.node_gpus(n)) for n in range(topo.num_nodes)]
        self._max_node_gpus: list[int] = [0] * n_types
        for n in range(topo.num_nodes):
            t = topo.node_type[n]
            self._max_node_gpus[t] = max(self._max_node_gpus[t], topo.node_num_gpus[n])
        self._buckets: list[list[dict[int, None]]] = [[{} for _ in range(m + 1)] for m in self._max_node_gpus]
        # Per type, the nodes with an entirely free GPU, in index order: a plain list kept sorted with bisect (a
        # node is filed in or out at about every placement; a sorted container's Python cost 3% of a replay).
        self._any_free: list[list[int]] = [[] for _ in range(n_types)]
        for n in range(topo.num_nodes):
            t, k = topo.node_type[n], topo.node_num_gpus[n]
            self._buckets[t][k][n] = None
            if k:
                self._any_free[t].append(n)  # in index order
        self._type_free: list[int] = list(topo.type_num_gpus)
        self._partial: list[SortedList] = [SortedList() for _ in range(n_types)]
        # The opportunistic layer, and what telemetry says each GPU uses (SM in milli, peak memory in MiB).
        self._gpu_opp_jobs: list[dict[str, None]] = [{} for _ in range(topo.num_gpus)]
        self._gpu_opp_milli: list[int] = [0] * topo.num_gpus
        self._gpu_sm_used: list[int] = [0] * topo.num_gpus
        self._gpu_mem_used: list[int] = [0] * topo.num_gpus
        # (SM used, GPU) per GPU type, up GPUs only, least used first: built when first asked for
        # (gpus_by_sm_used), kept from then on. No built-in policy asks, and keeping it cost AntMan and IADeep a
        # remove and an add at every telemetry report, a tenth of their replays (issue 20).
        self._by_sm_used: list[SortedList] | None = None

        self._jobs: dict[str, JobStatus] = {}
        self._pending_entry: dict[str, tuple[tuple[Any, ...], int, JobStatus]] = {}
        # The pending queue, split by shape: each group's entries sorted (corral.core.sorted_groups).
        self._groups: dict[PendingShape, Group] = {}
        self._shape_of: dict[str, PendingShape] = {}  # pending jobs only
        self._shapes: dict[tuple[bool, tuple[str, ...], int | None, int, str | None], PendingShape] = {}
        self._running: dict[str, JobStatus] = {}
        self._seq = 0
        self._guaranteed_milli: dict[str, int] = {}
        # Per tenant with a quota: pending guaranteed demand (milli), and since when the integrals are current.
        self._pending_milli: dict[str, int] = {}
        self._tenant_since: dict[str, float] = {}
        self._tenant_held_area: dict[str, float] = {}  # milli x s
        self._tenant_short_area: dict[str, float] = {}  # milli x s

        # Nodes up or down: which, the GPUs of each type on up nodes, the pending jobs suspended on each node, and
        # what node losses did (for the simulator's metrics).
        self._node_index: dict[str, int] = {name: n for n, name in enumerate(topo.node_names)}
        self._up: list[bool] = [True] * topo.num_nodes
        self._down: dict[int, None] = {}
        self._type_up: list[int] = list(topo.type_num_gpus)
        self._suspended_on: list[dict[str, None]] = [{} for _ in range(topo.num_nodes)]
        self.node_failures = 0  # nodes lost
        self.failure_requeues = 0  # runs stopped and requeued because a node of theirs was lost
        self._down_gpus = 0
        self.down_timeline: list[tuple[float, int]] = []  # (time, GPUs down from then on), at each node change

        # Allocation over time: the integral for mean utilization, and the change points for plots (kept only with
        # ``timeline``: 16 bytes per change, two changes per job; a replay that writes no utilization.csv needs none).
        self._timeline = timeline
        self._alloc_milli = 0
        self._alloc_area = 0.0  # milli-GPU x seconds
        self._last_change_s: float | None = None
        self.timeline_s: array[float] = array("d")
        self.timeline_milli: array[int] = array("q")
        # The queue's length over time (reports): the pending count from each change time on, every wait counted
        # (preempted and requeued jobs wait again). Recorded only once record_queue() asks: a replay that writes
        # no report pays one test per queue change.
        self.timeline_queue_s: array[float] | None = None
        self.timeline_queue: array[int] = array("q")

    # ------------------------------------------------------------------------------------------------------
    # ClusterView (read side)
    # ------------------------------------------------------------------------------------------------------
    @property
    def topology(self) -> Topology:
        return self._topo

    @property
    def tenants(self) -> Mapping[str, Tenant]:
        return self._tenants

    def job(self, job_id: str) -> JobStatus:
        return self._jobs[job_id]

    def jobs(self) -> Iterator[JobStatus]:
        """Every job the state has seen, in the order they were added."""
        return iter(self._jobs.values())

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._jobs

    def pending(self) -> Iterator[JobStatus]:
        # The queue is kept only as per-shape groups (what rounds use); the whole order is their merge.
        # Entries are (key, seq, job) with a unique seq, so the merge never compares jobs.
        return (entry[2] for entry in heapq.merge(*self._groups.values()))

    @property
    def num_pending(self) -> int:
        return len(self._pending_entry)

    def pending_groups(self) -> Iterator[tuple[PendingShape, Sequence[PendingEntry]]]:
        return iter(self._groups.items())

    def running(self) -> Iterator[JobStatus]:
        return iter(self._running.values())

    @property
    def num_running(self) -> int:
        return len(self._running)

    def free_gpus(self, gpu_type: int) -> int:
        return self._type_free[gpu_type]

    def node_free(self, node: int) -> int:
        return self._node_free[node]

    def node_free_gpus(self, node: int) -> Collection[int]:
        return self._node_free_gpus[node].keys()

    def nodes_with_free(self, gpu_type: int, count: int) -> Collection[int]:
        buckets = self._buckets[gpu_type]
        return buckets[count].keys() if count < len(buckets) else ()

    def nodes_with_any_free(self, gpu_type: int) -> Sequence[int]:
        seq: Sequence[int] = self._any_free[gpu_type]
        return seq

    def max_node_gpus(self, gpu_type: int) -> int:
        return self._max_node_gpus[gpu_type]

    def node_up(self, node: int) -> bool:
        return self._up[node]

    def down_nodes(self) -> Collection[int]:
        return self._down.keys()

    def up_gpus(self, gpu_type: int) -> int:
        return self._type_up[gpu_type]

    def gpu_free_milli(self, gpu: int) -> int:
        return self._gpu_free_milli[gpu]

    def gpu_free_mem_mib(self, gpu: int) -> int:
        return self._gpu_free_mem[gpu]

    def partial_gpus(self, gpu_type: int) -> Sequence[tuple[int, int]]:
        seq: Sequence[tuple[int, int]] = self._partial[gpu_type]
        return seq

    def gpu_jobs(self, gpu: int) -> Collection[str]:
        return self._gpu_jobs[gpu].keys()

    def tenant_guaranteed_milli(self, tenant: str) -> int:
        return self._guaranteed_milli.get(tenant, 0)

    def gpu_opportunistic_jobs(self, gpu: int) -> Collection[str]:
        return self._gpu_opp_jobs[gpu].keys()

    def gpu_opportunistic_milli(self, gpu: int) -> int:
        return self._gpu_opp_milli[gpu]

    def gpu_sm_used(self, gpu: int) -> int:
        return self._gpu_sm_used[gpu]

    def gpu_mem_used_mib(self, gpu: int) -> int:
        return self._gpu_mem_used[gpu]

    def gpus_by_sm_used(self, gpu_type: int) -> Sequence[tuple[int, int]]:
        index = self._by_sm_used
        if index is None:
            topo = self._topo
            index = self._by_sm_used = [SortedList() for _ in topo.type_names]
            for g in range(topo.num_gpus):
                if self._up[topo.gpu_node[g]]:
                    index[topo.gpu_type[g]].add((self._gpu_sm_used[g], g))
        seq: Sequence[tuple[int, int]] = index[gpu_type]
        return seq

    # ------------------------------------------------------------------------------------------------------
    # Per-tenant quota accounting
    # ------------------------------------------------------------------------------------------------------
    def tenant_areas(self, tenant: str, until_s: float) -> tuple[float, float]:
        """``(held, shortfall)`` integrals in milli-GPU x s up to ``until_s`` for a tenant with a quota: what its
        guaranteed jobs held, and ``min(quota room, pending guaranteed demand)`` (see the module docstring)."""
        self._tenant_tick(tenant, until_s)
        return self._tenant_held_area.get(tenant, 0.0), self._tenant_short_area.get(tenant, 0.0)

    def _tenant_tick(self, tenant: str, now_s: float) -> None:
        """Bring the tenant's integrals up to ``now_s`` before its held or pending amount changes."""
        t = self._tenants.get(tenant)
        if t is None or t.quota_gpus is None:
            return
        last = self._tenant_since.get(tenant)
        if last is not None and now_s > last:
            held = self._guaranteed_milli.get(tenant, 0)
            room = max(0, t.quota_gpus * FULL_GPU_MILLI - held)
            short = min(room, self._pending_milli.get(tenant, 0))
            dt = now_s - last
            self._tenant_held_area[tenant] = self._tenant_held_area.get(tenant, 0.0) + held * dt
            self._tenant_short_area[tenant] = self._tenant_short_area.get(tenant, 0.0) + short * dt
        if last is None or now_s > last:
            self._tenant_since[tenant] = now_s

    # ------------------------------------------------------------------------------------------------------
    # Utilization accounting
    # ------------------------------------------------------------------------------------------------------
    @property
    def allocated_milli(self) -> int:
        return self._alloc_milli

    def allocated_area(self, until_s: float) -> float:
        """Integral of allocated milli-GPUs over time up to ``until_s`` (milli-GPU x s)."""
        last = self._last_change_s
        extra = 0.0 if last is None else self._alloc_milli * max(0.0, until_s - last)
        return self._alloc_area + extra

    def _account(self, now_s: float, delta_milli: int) -> None:
        last = self._last_change_s
        if last is not None:
            self._alloc_area += self._alloc_milli * (now_s - last)
        self._last_change_s = now_s
        self._alloc_milli += delta_milli
        if not self._timeline:
            return
        if last is not None and last == now_s:  # the timeline's last point is the last change's: overwrite it
            self.timeline_milli[-1] = self._alloc_milli
        else:
            self.timeline_s.append(now_s)
            self.timeline_milli.append(self._alloc_milli)

    def record_queue(self) -> None:
        """Record the queue's length from now on (:attr:`timeline_queue_s`, :attr:`timeline_queue`)."""
        if self.timeline_queue_s is None:
            self.timeline_queue_s = array("d")

    def _queue_tick(self, now_s: float) -> None:
        # The replay's hot paths (add, launch, preempt, ...) test timeline_queue_s before calling, to save the call;
        # the rare ones (cancel, restore) call it as it is.
        times = self.timeline_queue_s
        if times is None:
            return
        n = len(self._pending_entry)
        if times and times[-1] == now_s:
            self.timeline_queue[-1] = n
        else:
            times.append(now_s)
            self.timeline_queue.append(n)

    # ------------------------------------------------------------------------------------------------------
    # Checked mutations
    # ------------------------------------------------------------------------------------------------------
    def add(self, spec: JobSpec, now_s: float) -> JobStatus:
        """A newly submitted job enters the pending queue."""
        if spec.job_id in self._jobs:
            raise JobSpecError(f"job id {spec.job_id!r} was submitted twice")
        job = JobStatus(spec=spec, queued_since_s=now_s)
        self._tenant_tick(spec.tenant, now_s)
        self._enqueue(job)  # first: if the policy's queue key fails, nothing has been recorded
        self._jobs[spec.job_id] = job
        if self.timeline_queue_s is not None:
            self._queue_tick(now_s)
        return job

    def reject(self, job_id: str, reason: str, now_s: float) -> JobStatus:
        job = self._expect(job_id, JobPhase.PENDING, "reject")
        self._tenant_tick(job.spec.tenant, now_s)
        self._dequeue(job)
        if self.timeline_queue_s is not None:
            self._queue_tick(now_s)
        job.queued_s += now_s - job.queued_since_s
        job.phase = JobPhase.REJECTED
        job.reason = reason
        return job

    def launch(self, job_id: str, placement: Placement, now_s: float) -> JobStatus:
        job = self._expect(job_id, JobPhase.PENDING, "launch")
        spec = job.spec
        self._check_placement(job, placement)
        self._tenant_tick(spec.tenant, now_s)
        held = self._take(job, placement)
        self._dequeue(job)
        if self.timeline_queue_s is not None:
            self._queue_tick(now_s)
        if now_s != job.queued_since_s:  # adding +0.0 changes nothing but makes a new float, kept per job to the end
            job.queued_s += now_s - job.queued_since_s
        job.phase = JobPhase.RUNNING
        job.placement = placement
        if job.first_start_s is None:
            job.first_start_s = now_s
        job.last_start_s = now_s
        job.run_epoch += 1
        self._running[job_id] = job
        if held:
            self._account(now_s, held)
        return job

    def resize(self, job_id: str, now_s: float, gpu_milli: int | None = None, mem_mib: int | None = None) -> Placement:
        """Change a running job's share (opportunistic placements only) or GPU memory in place; returns the
        placement it had. Refused, with nothing changed, if the GPUs cannot give it (see the module docstring)."""
        job = self._expect(job_id, JobPhase.RUNNING, "resize")
        before = job.placement
        assert before is not None
        if gpu_milli is not None and gpu_milli != before.gpu_milli and not before.opportunistic:
            raise InvariantViolation(
                f"cannot resize job {job_id!r}: the share of an ordinary placement changes by preempt and launch"
            )
        try:
            after = Placement(
                before.gpus,
                before.gpu_milli if gpu_milli is None else gpu_milli,
                before.mem_mib if mem_mib is None else mem_mib,
                before.opportunistic,
            )
        except JobSpecError as err:
            raise InvariantViolation(f"cannot resize job {job_id!r}: {err}") from None
        # Checked against what the GPUs would have without the job, then applied as a change of amounts only, so
        # that neither a refusal nor a success reorders any index.
        self._check_placement(job, after, credit=before)
        mem_delta = mem_given(job.spec, after) - mem_given(job.spec, before)
        milli_delta = after.gpu_milli - before.gpu_milli if after.opportunistic else 0
        for g in after.gpus:
            self._gpu_free_mem[g] -= mem_delta
            self._gpu_opp_milli[g] += milli_delta
        job.placement = after
        return before

    def upgrade(self, job_id: str, placement: Placement, now_s: float) -> Placement:
        """Make a running opportunistic job guaranteed on ``placement`` (an ordinary placement within its tenant's
        quota); returns the opportunistic placement it had."""
        job = self._expect(job_id, JobPhase.RUNNING, "upgrade")
        before = job.placement
        assert before is not None
        if not before.opportunistic or job.job_class is not JobClass.OPPORTUNISTIC:
            raise InvariantViolation(f"cannot upgrade job {job_id!r}: it is not running opportunistically")
        if placement.opportunistic:
            raise InvariantViolation(f"cannot upgrade job {job_id!r} to an opportunistic placement")
        self._check_placement(job, placement, credit=before, job_class=JobClass.GUARANTEED)
        self._tenant_tick(job.spec.tenant, now_s)
        self._measure(before, job.telemetry, -1)  # its measured use moves with it
        self._give_back(job, before)
        job.upgraded = True
        held = self._take(job, placement)
        job.placement = placement
        self._measure(placement, job.telemetry, +1)
        self._account(now_s, held)
        return before

    def set_batch_size(self, job_id: str, batch_size: int) -> int | None:
        """Record that a pending or running job trains with ``batch_size`` from now on; returns the batch size it had
        (``None``: its model's reference). Nothing else changes (see the module docstring)."""
        job = self._jobs.get(job_id)
        if job is None:
            raise InvariantViolation(f"cannot set the batch size of unknown job {job_id!r}")
        if job.phase is not JobPhase.PENDING and job.phase is not JobPhase.RUNNING:
            raise InvariantViolation(f"cannot set the batch size of job {job_id!r}: it is {job.phase.value}")
        if type(batch_size) is not int or batch_size < 1:
            raise InvariantViolation(f"job {job_id!r}: a batch size must be an integer >= 1, got {batch_size!r}")
        before = job.batch_size
        job.batch_size_set = batch_size
        return before

    def set_movable(self, job_id: str, movable: bool) -> JobStatus:
        """Record whether a job keeps its progress when moved (see :class:`~corral.core.status.JobStatus`): live, a
        new run is not movable until it says it checkpoints."""
        job = self._jobs.get(job_id)
        if job is None:
            raise InvariantViolation(f"cannot mark unknown job {job_id!r} movable or not")
        job.movable = movable
        return job

    def report(self, job_id: str, telemetry: Telemetry) -> JobStatus:
        """Record a running job's latest telemetry, and what it adds to each of its GPUs' measured use."""
        job = self._expect(job_id, JobPhase.RUNNING, "record telemetry of")
        placement = job.placement
        assert placement is not None
        self._measure(placement, job.telemetry, -1)
        job.telemetry = telemetry
        self._measure(placement, telemetry, +1)
        return job

    def preempt(
        self, job_id: str, now_s: float, work_done_s: float, *, suspend: bool = False, downgrade: bool = False
    ) -> JobStatus:
        """Take a running job's GPUs back; it returns to the queue with its progress. With ``suspend``, its state
        stays in the host memory of the node(s) it ran on: ``suspended_from`` records where. With ``downgrade``, an
        upgraded job returns as the opportunistic job it was submitted as (no longer ``upgraded``)."""
        job = self._expect(job_id, JobPhase.RUNNING, "preempt")
        if downgrade and not job.upgraded:
            raise InvariantViolation(f"cannot downgrade job {job_id!r}: it was not upgraded")
        placement = job.placement
        self._tenant_tick(job.spec.tenant, now_s)
        self._release(job, now_s)  # its quota use as the guaranteed job it was
        if downgrade:
            job.upgraded = False
        job.suspended_from = placement if suspend else None
        job.work_done_s = work_done_s
        job.preemptions += 1
        job.phase = JobPhase.PENDING
        job.queued_since_s = now_s
        self._enqueue(job)
        if self.timeline_queue_s is not None:
            self._queue_tick(now_s)
        return job

    def note_waiting(self, reasons: Mapping[str, str]) -> None:
        """Keep, for each job a round examined and left waiting, the reason it gave (jobs no longer waiting, or
        not known, are skipped: the reason is advice, never an order)."""
        jobs = self._jobs
        for job_id, reason in reasons.items():
            job = jobs.get(job_id)
            if job is not None and job.phase is JobPhase.PENDING:
                job.wait_reason = reason

    def requeue(self, job_id: str) -> JobStatus:
        """File a pending job again under its current queue key (the policy changed it, e.g. a promotion)."""
        job = self._expect(job_id, JobPhase.PENDING, "requeue")
        self._dequeue(job)
        self._enqueue(job)
        return job

    def finish_preempted(self, job_id: str, now_s: float) -> JobStatus:
        """Live mode: a preempted (PENDING) job completed after all: its process finished after the preemption
        had taken its GPUs back, before it reached the step boundary where it would have stopped."""
        return self._finished(self._ended_after_stop(job_id, now_s, "finish"), now_s)

    def fail_preempted(self, job_id: str, now_s: float, reason: str) -> JobStatus:
        """Live mode: a suspended (PENDING) job failed after all: its process ended in error on its own before the
        pause reached it. It leaves the queue, FAILED for good."""
        job = self._ended_after_stop(job_id, now_s, "fail")
        job.phase = JobPhase.FAILED
        job.end_s = now_s
        job.reason = reason
        return job

    def _ended_after_stop(self, job_id: str, now_s: float, verb: str) -> JobStatus:
        """A preempted or suspended (PENDING) job whose run ended after all: out of the queue, its wait counted."""
        job = self._expect(job_id, JobPhase.PENDING, f"{verb} a preempted")
        if job.preemptions == 0:
            raise InvariantViolation(f"cannot {verb} job {job_id!r} after a stop: it is pending and never ran")
        self._tenant_tick(job.spec.tenant, now_s)
        self._dequeue(job)
        if self.timeline_queue_s is not None:
            self._queue_tick(now_s)
        job.queued_s += now_s - job.queued_since_s
        job.suspended_from = None
        return job

    def finish(self, job_id: str, now_s: float) -> JobStatus:
        job = self._expect(job_id, JobPhase.RUNNING, "finish")
        self._tenant_tick(job.spec.tenant, now_s)
        self._release(job, now_s)
        return self._finished(job, now_s)

    def _finished(self, job: JobStatus, now_s: float) -> JobStatus:
        if job.spec.duration_s is not None:
            job.work_done_s = job.spec.duration_s
        job.phase = JobPhase.FINISHED
        job.end_s = now_s
        return job

    def fail(self, job_id: str, now_s: float, reason: str) -> JobStatus:
        """A running job's run ended in error (live mode): it releases its GPUs and is FAILED for good."""
        job = self._expect(job_id, JobPhase.RUNNING, "fail")
        self._tenant_tick(job.spec.tenant, now_s)
        self._release(job, now_s)
        job.phase = JobPhase.FAILED
        job.end_s = now_s
        job.reason = reason
        return job

    def cancel(self, job_id: str, now_s: float, reason: str = "cancelled") -> JobStatus:
        """A user cancelled a pending or running job: it leaves the queue or releases its GPUs."""
        job = self._jobs.get(job_id)
        if job is None:
            raise InvariantViolation(f"cannot cancel job {job_id!r}: no such job")
        self._tenant_tick(job.spec.tenant, now_s)
        if job.phase is JobPhase.RUNNING:
            self._release(job, now_s)
        elif job.phase is JobPhase.PENDING:
            self._dequeue(job)
            self._queue_tick(now_s)
            job.queued_s += now_s - job.queued_since_s
        else:
            raise InvariantViolation(f"cannot cancel job {job_id!r}: it is {job.phase.value}")
        job.phase = JobPhase.CANCELLED
        job.end_s = now_s
        job.reason = reason
        return job

    def restore(self, record: JobStatus, now_s: float) -> JobStatus:
        """Take back a job known from before a restart (live mode recovery), in the phase ``record`` has, with its
        counters: a PENDING one joins the queue; a RUNNING one takes its placement again, checked like a launch
        but keeping its run epoch (its process is still that run). Terminal jobs are not kept: they take no part
        in scheduling."""
        spec = record.spec
        if spec.job_id in self._jobs:
            raise JobSpecError(f"job id {spec.job_id!r} was submitted twice")
        if record.phase is JobPhase.PENDING:
            if record.placement is not None:
                raise InvariantViolation(f"pending job {spec.job_id!r} cannot hold {record.placement}")
            job = record
            self._tenant_tick(spec.tenant, now_s)
            self._enqueue(job)
            self._queue_tick(now_s)
            self._jobs[spec.job_id] = job
            return job
        if record.phase is not JobPhase.RUNNING or record.placement is None or record.last_start_s is None:
            raise InvariantViolation(f"cannot restore job {spec.job_id!r} as {record.phase.value}")
        placement = record.placement
        record.placement = None
        try:
            self._check_placement(record, placement)
        finally:
            record.placement = placement
        self._tenant_tick(spec.tenant, now_s)
        held = self._take(record, placement)
        # Its last telemetry counts in its GPUs' measured use, as it did before the restart: its next report, its
        # end or a move takes it out again (without this, that left the GPUs' measured use negative).
        self._measure(placement, record.telemetry, +1)
        self._jobs[spec.job_id] = record
        self._running[spec.job_id] = record
        if held:
            self._account(now_s, held)
        return record

    def observe_rate(self, job_id: str, rate: float) -> JobStatus:
        """Record the executor's measure of a running job's speed relative to running alone (see ``JobStatus``)."""
        job = self._expect(job_id, JobPhase.RUNNING, "record the rate of")
        if not rate >= 0:
            raise InvariantViolation(f"job {job_id!r}: observed rate must be >= 0, got {rate!r}")
        job.observed_rate = rate
        return job

    # ------------------------------------------------------------------------------------------------------
    # Nodes lost and joined (see the module docstring)
    # ------------------------------------------------------------------------------------------------------
    def node_index(self, name: str) -> int:
        """The index of the node called ``name``; InvariantViolation if the cluster has none (the edge, a failure
        file or the live controller, checks names before they reach the engine)."""
        got = self._node_index.get(name)
        if got is None:
            raise InvariantViolation(f"no node {name!r} in cluster {self._topo.cluster.name!r}")
        return got

    def jobs_on_node(self, node: int) -> list[JobStatus]:
        """The running jobs holding a GPU of ``node`` (either layer), each once, by GPU then by arrival there."""
        seen: dict[str, None] = {}
        for g in self._topo.node_gpus(node):
            seen.update(self._gpu_jobs[g])
            seen.update(self._gpu_opp_jobs[g])
        return [self._jobs[job_id] for job_id in seen]

    def suspended_on_node(self, node: int) -> list[JobStatus]:
        """The pending jobs whose state was suspended to ``node``'s host memory (``suspended_from``)."""
        return [self._jobs[job_id] for job_id in self._suspended_on[node]]

    def requeue_lost(self, job_id: str, now_s: float, work_done_s: float) -> JobStatus:
        """A running job stopped because a node it held a GPU of was lost: like a preemption (its GPUs on every
        node come back, it waits in the queue again, counted in ``preemptions``), from ``work_done_s``, the
        progress of its last checkpoint."""
        job = self.preempt(job_id, now_s, work_done_s)
        self.failure_requeues += 1
        return job

    def forget_suspended(self, job_id: str, work_done_s: float) -> JobStatus:
        """A pending job suspended to the host memory of a node that was lost: that state is gone. It restarts
        from ``work_done_s``, its last checkpoint, wherever it is launched next (``suspended_from`` is cleared)."""
        job = self._expect(job_id, JobPhase.PENDING, "forget the suspended state of")
        held = job.suspended_from
        if held is None:
            raise InvariantViolation(f"cannot forget the suspended state of job {job_id!r}: it has none")
        if not 0 <= work_done_s <= job.work_done_s:
            raise InvariantViolation(
                f"job {job_id!r}: a lost suspended state leaves work between 0 and {job.work_done_s}, got {work_done_s}"
            )
        self._unsuspend(job_id, held)
        job.suspended_from = None
        job.work_done_s = work_done_s
        return job

    def lose_node(self, node: int, now_s: float) -> None:
        """Take ``node``'s GPUs out of the cluster. Refused while a job holds one of them or is suspended there
        (the engine requeues those first), or when the node is down already."""
        topo = self._topo
        name = topo.node_names[node]
        if not self._up[node]:
            raise InvariantViolation(f"node {name!r} is down already")
        if self._suspended_on[node]:
            raise InvariantViolation(
                f"node {name!r} still holds suspended job {next(iter(self._suspended_on[node]))!r}"
            )
        gpus = topo.node_gpus(node)
        for g in gpus:
            if self._gpu_jobs[g] or self._gpu_opp_jobs[g]:
                holder = next(iter({**self._gpu_jobs[g], **self._gpu_opp_jobs[g]}))
                raise InvariantViolation(f"cannot take node {name!r} down: job {holder!r} holds GPU {g}")
        t, k = topo.node_type[node], topo.node_num_gpus[node]
        # Nothing holds the node's GPUs: every one is entirely free, its memory whole, its measured use 0.
        del self._buckets[t][k][node]
        if k:
            _drop_sorted(self._any_free[t], node)
        self._type_free[t] -= k
        self._node_free[node] = 0
        self._node_free_gpus[node].clear()
        by_sm = self._by_sm_used[t] if self._by_sm_used is not None else None
        for g in gpus:
            self._gpu_free_milli[g] = 0
            self._gpu_free_mem[g] = 0
            if by_sm is not None:
                by_sm.remove((self._gpu_sm_used[g], g))
        self._type_up[t] -= k
        self._up[node] = False
        self._down[node] = None
        self._count_down(now_s, k)
        self.node_failures += 1

    def join_node(self, node: int, now_s: float) -> None:
        """Bring a down node's GPUs back into the cluster, entirely free."""
        topo = self._topo
        if self._up[node]:
            raise InvariantViolation(f"node {topo.node_names[node]!r} is up already")
        t, k = topo.node_type[node], topo.node_num_gpus[node]
        gpus = topo.node_gpus(node)
        by_sm = self._by_sm_used[t] if self._by_sm_used is not None else None
        for g in gpus:
            self._gpu_free_milli[g] = FULL_GPU_MILLI
            self._gpu_free_mem[g] = topo.gpu_mem_mib[g]
            if by_sm is not None:
                by_sm.add((0, g))
        self._node_free[node] = k
        self._node_free_gpus[node] = dict.fromkeys(gpus)
        self._buckets[t][k][node] = None
        if k:
            insort(self._any_free[t], node)
        self._type_free[t] += k
        self._type_up[t] += k
        self._up[node] = True
        del self._down[node]
        self._count_down(now_s, -k)

    def down_gpu_area(self, start_s: float, end_s: float) -> float:
        """GPUs down x seconds over ``[start_s, end_s]``: the capacity lost to down nodes in that window."""
        area = 0.0
        timeline = self.down_timeline
        for i, (t, down) in enumerate(timeline):
            until = timeline[i + 1][0] if i + 1 < len(timeline) else end_s
            lo, hi = max(t, start_s), min(until, end_s)
            if hi > lo:
                area += down * (hi - lo)
        return area

    def _count_down(self, now_s: float, delta: int) -> None:
        self._down_gpus += delta
        self.down_timeline.append((now_s, self._down_gpus))

    def _unsuspend(self, job_id: str, held: Placement) -> None:
        gpu_node = self._topo.gpu_node
        for node in {gpu_node[g] for g in held.gpus}:
            self._suspended_on[node].pop(job_id, None)

    # ------------------------------------------------------------------------------------------------------
    # Internals
    # ------------------------------------------------------------------------------------------------------
    def _expect(self, job_id: str, phase: JobPhase, what: str) -> JobStatus:
        job = self._jobs.get(job_id)
        if job is None:
            raise InvariantViolation(f"cannot {what} unknown job {job_id!r}")
        if job.phase is not phase:
            raise InvariantViolation(f"cannot {what} job {job_id!r}: it is {job.phase.value}, not {phase.value}")
        return job

    def _shape(self, job: JobStatus) -> PendingShape:
        spec = job.spec
        whole = spec.gpu_milli == FULL_GPU_MILLI
        quota_tenant = None
        if job.job_class is JobClass.GUARANTEED:
            tenant = self._tenants.get(spec.tenant)
            if tenant is not None and tenant.quota_gpus is not None:
                quota_tenant = spec.tenant
        size = spec.num_gpus if whole else spec.gpu_milli
        # One PendingShape per shape, looked up by an equal plain tuple (equal hash): a named tuple is made by
        # interpreted code, and most jobs share a few shapes.
        key = (whole, spec.gpu_types, spec.gpu_mem_mib, size, quota_tenant)
        shape = self._shapes.get(key)
        if shape is None:
            shape = self._shapes[key] = PendingShape(whole, spec.gpu_types, spec.gpu_mem_mib, size, quota_tenant)
        return shape

    def _enqueue(self, job: JobStatus) -> None:
        self._seq += 1
        job_id = job.spec.job_id
        entry = (self._queue_key(job), self._seq, job)
        self._pending_entry[job_id] = entry
        shape = self._shape_of[job_id] = self._shape(job)
        if shape.quota_tenant is not None:
            self._pending_milli[job.spec.tenant] = (
                self._pending_milli.get(job.spec.tenant, 0) + job.spec.gpu_demand_milli
            )
        add_entry(self._groups, shape, entry)
        held = job.suspended_from
        if held is not None:
            gpu_node = self._topo.gpu_node
            for node in {gpu_node[g] for g in held.gpus}:
                self._suspended_on[node][job_id] = None

    def _dequeue(self, job: JobStatus) -> None:
        job_id = job.spec.job_id
        entry = self._pending_entry.pop(job_id)
        shape = self._shape_of.pop(job_id)
        if shape.quota_tenant is not None:
            self._pending_milli[job.spec.tenant] -= job.spec.gpu_demand_milli
        remove_entry(self._groups, shape, entry)
        held = job.suspended_from
        if held is not None:
            self._unsuspend(job_id, held)

    def _check_placement(
        self,
        job: JobStatus,
        placement: Placement,
        *,
        credit: Placement | None = None,
        job_class: JobClass | None = None,
    ) -> None:
        """Can ``job`` (of class ``job_class``, default its own) hold ``placement`` now, counting what it holds in
        ``credit`` (its current placement, for a change in place) as free?"""
        topo = self._topo
        spec = job.spec
        cls = job.job_class if job_class is None else job_class
        if credit is None:  # a launch (most calls): nothing of its own to count as free
            own: Collection[int] = ()
            own_mem = own_opp = own_alloc = 0
        else:
            own = set(credit.gpus)
            own_mem = mem_given(spec, credit)
            own_opp = credit.gpu_milli if credit.opportunistic else 0
            own_alloc = credit.gpu_milli if not credit.opportunistic else 0
        if placement.num_gpus != spec.num_gpus:
            raise InvariantViolation(
                f"gang: job {spec.job_id!r} needs {spec.num_gpus} GPUs, placement has {placement.num_gpus}"
            )
        opportunistic = placement.opportunistic
        if opportunistic and cls is not JobClass.OPPORTUNISTIC:
            raise InvariantViolation(f"job {spec.job_id!r} is guaranteed: it cannot run opportunistically")
        # A whole-GPU job may run packed at a smaller share (Placement checks 0 < share <= 1000); a fractional
        # job's share is what its trace measured, so it gets exactly that. An opportunistic job's share is a cap
        # its coordinator moves anywhere in 0..its request.
        if opportunistic:
            if placement.gpu_milli > spec.gpu_milli:
                raise InvariantViolation(
                    f"job {spec.job_id!r} asked for {spec.gpu_milli} milli-GPU per GPU, its share cap is "
                    f"{placement.gpu_milli}"
                )
        elif spec.gpu_milli != FULL_GPU_MILLI and placement.gpu_milli != spec.gpu_milli:
            raise InvariantViolation(
                f"job {spec.job_id!r} asked for {spec.gpu_milli} milli-GPU per GPU, placement gives "
                f"{placement.gpu_milli}"
            )
        allowed = set(topo.type_indices(spec.gpu_types)) if spec.gpu_types else None
        mem = mem_given(spec, placement)
        up, gpu_node, num_gpus = self._up, topo.gpu_node, topo.num_gpus
        gpu_free_milli, gpu_free_mem = self._gpu_free_milli, self._gpu_free_mem
        for g in placement.gpus:
            if not 0 <= g < num_gpus:
                raise InvariantViolation(f"job {spec.job_id!r}: GPU {g} does not exist")
            if not up[gpu_node[g]]:
                raise InvariantViolation(
                    f"job {spec.job_id!r}: GPU {g} is on node {topo.node_names[gpu_node[g]]!r}, which is down"
                )
            mine = g in own
            if opportunistic:
                left = FULL_GPU_MILLI - self._gpu_opp_milli[g] + (own_opp if mine else 0)
                if left < placement.gpu_milli:
                    raise InvariantViolation(
                        f"GPU {g} has {left} milli of opportunistic share left, job {spec.job_id!r} wants "
                        f"{placement.gpu_milli}"
                    )
            else:
                free = gpu_free_milli[g] + (own_alloc if mine else 0)
                if free < placement.gpu_milli:
                    raise InvariantViolation(
                        f"GPU {g} has {free} milli free, job {spec.job_id!r} wants {placement.gpu_milli}"
                    )
            free_mem = gpu_free_mem[g] + (own_mem if mine else 0)
            if free_mem < mem:
                raise InvariantViolation(f"GPU {g} has {free_mem} MiB free, job {spec.job_id!r} wants {mem} MiB")
            if allowed is not None and topo.gpu_type[g] not in allowed:
                raise InvariantViolation(
                    f"job {spec.job_id!r} may only use GPU types {spec.gpu_types}, GPU {g} is "
                    f"{topo.type_names[topo.gpu_type[g]]}"
                )
        if not opportunistic and cls is JobClass.GUARANTEED:
            held = spec.num_gpus * own_alloc if job.job_class is JobClass.GUARANTEED else 0
            self._check_quota(spec, spec.num_gpus * placement.gpu_milli, held)

    def _check_quota(self, spec: JobSpec, milli: int, held: int = 0) -> None:
        """Would ``milli`` more guaranteed share (the job already holding ``held`` of its tenant's) fit the quota?"""
        tenant = self._tenants.get(spec.tenant)
        if tenant is None or tenant.quota_gpus is None:
            return
        used = self._guaranteed_milli.get(spec.tenant, 0) - held
        if used + milli > tenant.quota_gpus * FULL_GPU_MILLI:
            raise InvariantViolation(
                f"quota: tenant {spec.tenant!r} holds {used / 1000:g} of {tenant.quota_gpus} guaranteed GPUs, "
                f"job {spec.job_id!r} would add {milli / 1000:g}"
            )

    def _take(self, job: JobStatus, placement: Placement) -> int:
        """Give ``placement`` to ``job`` in the GPU tables (checked before); returns the share it allocates."""
        spec = job.spec
        job_id = spec.job_id
        milli = placement.gpu_milli
        mem = mem_given(spec, placement)
        if placement.opportunistic:
            for g in placement.gpus:
                self._gpu_opp_milli[g] += milli
                self._gpu_free_mem[g] -= mem
                self._gpu_opp_jobs[g][job_id] = None
            return 0
        self._shift_free(placement.gpus, -milli)
        gpu_free_mem, gpu_jobs = self._gpu_free_mem, self._gpu_jobs
        for g in placement.gpus:
            gpu_free_mem[g] -= mem
            gpu_jobs[g][job_id] = None
        held = spec.num_gpus * milli
        if job.job_class is JobClass.GUARANTEED:
            self._guaranteed_milli[spec.tenant] = self._guaranteed_milli.get(spec.tenant, 0) + held
        return held

    def _give_back(self, job: JobStatus, placement: Placement) -> int:
        """Undo :meth:`_take`; returns the share that was allocated."""
        spec = job.spec
        job_id = spec.job_id
        milli = placement.gpu_milli
        mem = mem_given(spec, placement)
        if placement.opportunistic:
            for g in placement.gpus:
                self._gpu_opp_milli[g] -= milli
                self._gpu_free_mem[g] += mem
                del self._gpu_opp_jobs[g][job_id]
            return 0
        self._shift_free(placement.gpus, milli)
        gpu_free_mem, gpu_jobs = self._gpu_free_mem, self._gpu_jobs
        for g in placement.gpus:
            gpu_free_mem[g] += mem
            del gpu_jobs[g][job_id]
        held = spec.num_gpus * milli
        if job.job_class is JobClass.GUARANTEED:
            self._guaranteed_milli[spec.tenant] -= held
        return held

    def _measure(self, placement: Placement, telemetry: Telemetry | None, sign: int) -> None:
        """Add (``sign`` +1) or remove (-1) one job's telemetry to its GPUs' measured use."""
        if telemetry is None:
            return
        sm = round(telemetry.sm_util * FULL_GPU_MILLI) * sign
        mem = telemetry.mem_peak_mib * sign
        if not sm and not mem:
            return
        gpu_type = self._topo.gpu_type
        by_sm = self._by_sm_used
        for g in placement.gpus:
            old = self._gpu_sm_used[g]
            if sm:
                if by_sm is not None:
                    index = by_sm[gpu_type[g]]
                    index.remove((old, g))
                    index.add((old + sm, g))
                self._gpu_sm_used[g] = old + sm
            self._gpu_mem_used[g] += mem

    def _release(self, job: JobStatus, now_s: float) -> None:
        placement = job.placement
        assert placement is not None  # RUNNING jobs always have one (checked by launch)
        self._measure(placement, job.telemetry, -1)
        held = self._give_back(job, placement)
        del self._running[job.spec.job_id]
        last = job.last_start_s
        assert last is not None
        job.executed_s += now_s - last
        job.placement = None
        job.observed_rate = None
        job.telemetry = None
        if held:
            self._account(now_s, -held)

    def _shift_free(self, gpus: Sequence[int], milli: int) -> None:
        """Give each of ``gpus`` ``milli`` more free share (negative: less) and keep every index in step.

        A node is re-filed in the free-count buckets once, by its GPUs' net change, after the loop (issue 20: an
        8-GPU gang used to move its node through eight buckets). The buckets keep nodes in the order they reached
        their count, and a node moved one GPU at a time ends at the end of its last bucket: so the nodes are
        re-filed in the order of their last change (``moved`` re-inserts a node at each change), which leaves every
        bucket as moving one GPU at a time did. A node's own free GPUs are still kept GPU by GPU, in order."""
        topo = self._topo
        gpu_type, gpu_node = topo.gpu_type, topo.gpu_node
        free, partial, node_gpus = self._gpu_free_milli, self._partial, self._node_free_gpus
        if len(gpus) == 1 and abs(milli) == FULL_GPU_MILLI and free[gpus[0]] == (0 if milli > 0 else FULL_GPU_MILLI):
            # One whole GPU taken or given back (most placements): its node moves by one, nothing is partial.
            g = gpus[0]
            node = gpu_node[g]
            if milli > 0:
                free[g] = FULL_GPU_MILLI
                node_gpus[node][g] = None
                self._refile(node, 1)
            else:
                free[g] = 0
                del node_gpus[node][g]
                self._refile(node, -1)
            return
        moved: dict[int, int] = {}  # node -> net change of its entirely free GPUs, in order of last change
        for g in gpus:
            old = free[g]
            new = old + milli
            free[g] = new
            if 0 < old < FULL_GPU_MILLI:
                partial[gpu_type[g]].remove((old, g))
            if 0 < new < FULL_GPU_MILLI:
                partial[gpu_type[g]].add((new, g))
            if old == FULL_GPU_MILLI and new < FULL_GPU_MILLI:
                node = gpu_node[g]
                del node_gpus[node][g]
                moved[node] = moved.pop(node, 0) - 1
            elif new == FULL_GPU_MILLI and old < FULL_GPU_MILLI:
                node = gpu_node[g]
                node_gpus[node][g] = None
                moved[node] = moved.pop(node, 0) + 1
        for node, delta in moved.items():
            self._refile(node, delta)

    def _refile(self, node: int, delta: int) -> None:
        """``node`` has ``delta`` more entirely free GPUs: move it to the end of its new free-count bucket."""
        t = self._topo.node_type[node]
        before = self._node_free[node]
        after = before + delta
        self._node_free[node] = after
        buckets = self._buckets[t]
        del buckets[before][node]
        buckets[after][node] = None
        self._type_free[t] += delta
        if before > 0 and after == 0:
            _drop_sorted(self._any_free[t], node)
        elif before == 0 and after > 0:
            insort(self._any_free[t], node)

    # ------------------------------------------------------------------------------------------------------
    # A full consistency check (tests and debugging; O(GPUs + jobs))
    # ------------------------------------------------------------------------------------------------------
    def check_invariants(self) -> None:
        topo = self._topo
        by_sm = self._by_sm_used  # checked once built
        used = [0] * topo.num_gpus
        holders: list[set[str]] = [set() for _ in range(topo.num_gpus)]
        opp_holders: list[set[str]] = [set() for _ in range(topo.num_gpus)]
        opp_milli = [0] * topo.num_gpus
        given_mem = [0] * topo.num_gpus
        sm_used = [0] * topo.num_gpus
        mem_used = [0] * topo.num_gpus
        guaranteed: dict[str, int] = {}
        alloc = 0
        for job in self._jobs.values():
            in_pending = job.spec.job_id in self._pending_entry
            shape = self._shape_of.get(job.spec.job_id)
            grouped = shape is not None and has_entry(self._groups.get(shape, ()), self._pending_entry[job.spec.job_id])
            if in_pending != grouped:
                raise InvariantViolation(f"job {job.spec.job_id!r} is missing from its pending group")
            in_running = job.spec.job_id in self._running
            if (job.phase is JobPhase.PENDING) != in_pending or (job.phase is JobPhase.RUNNING) != in_running:
                raise InvariantViolation(f"job {job.spec.job_id!r} is {job.phase.value} but indexed otherwise")
            if job.phase is JobPhase.RUNNING:
                p = job.placement
                spec = job.spec
                if p is None or p.num_gpus != spec.num_gpus:
                    raise InvariantViolation(f"running job {spec.job_id!r} has a bad placement {p}")
                if p.gpu_milli > spec.gpu_milli or (
                    not p.opportunistic and spec.gpu_milli != FULL_GPU_MILLI and p.gpu_milli != spec.gpu_milli
                ):
                    raise InvariantViolation(f"running job {spec.job_id!r} holds {p.gpu_milli} milli per GPU")
                if p.opportunistic and job.job_class is not JobClass.OPPORTUNISTIC:
                    raise InvariantViolation(f"guaranteed job {spec.job_id!r} runs opportunistically")
                tel = job.telemetry
                for g in p.gpus:
                    given_mem[g] += mem_given(spec, p)
                    if tel is not None:
                        sm_used[g] += round(tel.sm_util * FULL_GPU_MILLI)
                        mem_used[g] += tel.mem_peak_mib
                    if p.opportunistic:
                        opp_milli[g] += p.gpu_milli
                        opp_holders[g].add(spec.job_id)
                    else:
                        used[g] += p.gpu_milli
                        holders[g].add(spec.job_id)
                if not p.opportunistic:
                    held = spec.num_gpus * p.gpu_milli
                    alloc += held
                    if job.job_class is JobClass.GUARANTEED:
                        guaranteed[spec.tenant] = guaranteed.get(spec.tenant, 0) + held
            elif job.placement is not None:
                raise InvariantViolation(f"{job.phase.value} job {job.spec.job_id!r} still holds {job.placement}")
            elif job.observed_rate is not None or job.telemetry is not None:
                raise InvariantViolation(f"{job.phase.value} job {job.spec.job_id!r} still has a rate or telemetry")
        if alloc != self._alloc_milli:
            raise InvariantViolation(f"allocated total {self._alloc_milli} != sum over jobs {alloc}")
        for name, milli in guaranteed.items():
            tenant = self._tenants.get(name)
            if tenant is not None and tenant.quota_gpus is not None and milli > tenant.quota_gpus * 1000:
                raise InvariantViolation(f"tenant {name!r} is over its quota: {milli} milli")
            if self._guaranteed_milli.get(name, 0) != milli:
                raise InvariantViolation(f"tenant {name!r} usage index is off")
        type_free = [0] * len(topo.type_names)
        type_up = [0] * len(topo.type_names)
        bucketed = [0] * len(topo.type_names)
        if list(self._down) != [n for n in self._down if not self._up[n]] or len(self._down) != self._up.count(False):
            raise InvariantViolation("the down-node index is off")
        for n in range(topo.num_nodes):
            t = topo.node_type[n]
            if not self._up[n]:
                # A down node: no free GPU, in no bucket, and (below) no job and no free share or memory on its GPUs.
                if self._node_free[n] or self._node_free_gpus[n] or n in self._any_free[t]:
                    raise InvariantViolation(f"down node {n} is indexed as having free GPUs")
                if any(n in bucket for bucket in self._buckets[t]):
                    raise InvariantViolation(f"down node {n} is in a free-count bucket")
                if self._suspended_on[n]:
                    raise InvariantViolation(f"down node {n} still holds suspended jobs {list(self._suspended_on[n])}")
                continue
            type_up[t] += topo.node_num_gpus[n]
            free = [g for g in topo.node_gpus(n) if self._gpu_free_milli[g] == FULL_GPU_MILLI]
            if len(free) != self._node_free[n] or set(free) != set(self._node_free_gpus[n]):
                raise InvariantViolation(f"node {n} free index is off")
            if n not in self._buckets[t][len(free)]:
                raise InvariantViolation(f"node {n} is in the wrong bucket")
            if (len(free) > 0) != (n in self._any_free[t]):
                raise InvariantViolation(f"node {n} any-free index is off")
            type_free[t] += len(free)
            bucketed[t] += 1
        if type_free != self._type_free:
            raise InvariantViolation("per-type free totals are off")
        if type_up != self._type_up:
            raise InvariantViolation("per-type capacity of up nodes is off")
        if bucketed != [sum(len(bucket) for bucket in buckets) for buckets in self._buckets]:
            raise InvariantViolation("a node is in more than one free-count bucket")
        suspended: list[set[str]] = [set() for _ in range(topo.num_nodes)]
        for job_id in self._pending_entry:
            kept = self._jobs[job_id].suspended_from
            if kept is not None:
                for g in kept.gpus:
                    suspended[topo.gpu_node[g]].add(job_id)
        if suspended != [set(on) for on in self._suspended_on]:
            raise InvariantViolation("the per-node index of suspended jobs is off")
        for g in range(topo.num_gpus):
            left = self._gpu_free_milli[g]
            if not self._up[topo.gpu_node[g]]:
                if left or used[g] or opp_milli[g] or given_mem[g] or self._gpu_free_mem[g] or sm_used[g]:
                    raise InvariantViolation(f"GPU {g} of a down node is given out or reads as free")
                if self._gpu_jobs[g] or self._gpu_opp_jobs[g] or self._gpu_sm_used[g] or self._gpu_mem_used[g]:
                    raise InvariantViolation(f"GPU {g} of a down node is indexed")
                continue
            if left < 0 or used[g] + left != FULL_GPU_MILLI:
                raise InvariantViolation(f"GPU {g}: {used[g]} given + {left} free != 1000")
            if set(self._gpu_jobs[g]) != holders[g]:
                raise InvariantViolation(f"GPU {g}: holder index is off")
            in_partial = (left, g) in self._partial[topo.gpu_type[g]]
            if in_partial != (0 < left < FULL_GPU_MILLI):
                raise InvariantViolation(f"GPU {g}: partial index is off")
            if opp_holders[g] != set(self._gpu_opp_jobs[g]) or opp_milli[g] != self._gpu_opp_milli[g]:
                raise InvariantViolation(f"GPU {g}: opportunistic index is off")
            if opp_milli[g] > FULL_GPU_MILLI:
                raise InvariantViolation(f"GPU {g}: opportunistic caps add up to {opp_milli[g]} milli")
            if given_mem[g] > topo.gpu_mem_mib[g] or topo.gpu_mem_mib[g] - given_mem[g] != self._gpu_free_mem[g]:
                raise InvariantViolation(
                    f"GPU {g}: {given_mem[g]} MiB given of {topo.gpu_mem_mib[g]}, {self._gpu_free_mem[g]} recorded free"
                )
            if sm_used[g] != self._gpu_sm_used[g] or mem_used[g] != self._gpu_mem_used[g]:
                raise InvariantViolation(f"GPU {g}: measured use index is off")
            if by_sm is not None and (sm_used[g], g) not in by_sm[topo.gpu_type[g]]:
                raise InvariantViolation(f"GPU {g}: SM-use index is off")
        if by_sm is not None and sum(len(index) for index in by_sm) != sum(type_up):
            raise InvariantViolation("the SM-use index lists GPUs that are down (or misses some that are up)")
