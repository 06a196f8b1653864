"""Gangs across nodes: the ranks of one job agree on the step at which each directive applies.

A job too big for one node runs as a gang (:mod:`corral.core.contract`, "Gangs across nodes"): a process per
node, or per GPU under torchrun, training together with ``torch.distributed``. The controller sends each directive
to every rank's agent, and the copies arrive at slightly different times (or, after a broken channel, not at all).
Were each rank to apply its copy at its own next boundary, one rank would pause or exit while the others wait for
it inside a collective: a deadlock. So the ranks agree on the step first, through a small key-value store
(``torch.distributed.TCPStore``) that rank 0's process hosts at ``CORRAL_GANG_ADDR:CORRAL_GANG_PORT``.

The agreement, as the store sees it (all keys under ``corral/JOB/RUN/``):

``log/K`` (K = 0, 1, ...)
    The gang's log of directives, one slot each, filled with compare-and-set (the first writer of a slot wins; a
    loser tries the next slot), so that every rank reads the same directives in the same order. An entry is
    ``{"key", "kind", "msg", "step", "by"}``: ``key`` names the directive (``seq:N`` for the controller's
    directive number N, ``sigterm``, ``script:...`` for ``Job.request_checkpoint``); ``msg`` the directive itself;
    ``step`` the step its proposer asked for: its own step plus a margin that covers the time the others take to
    hear of it (:func:`margin_steps`: 50 ms worth, at least 2 steps). A rank that receives a directive from its
    agent proposes it unless the log has it already; a later entry with a key the log already holds is skipped
    by everyone, so a directive is applied once, whichever copy arrives first. A copy that never arrives does
    not matter: the entry carries the directive to every rank.
``ack/K/R``
    Rank R's answer to entry K, written by R's watcher thread as soon as it reads the entry: R's step + 1. The
    watcher reads the step *after* raising the rank's attention flag, and the training thread looks at pending
    entries at every boundary while any is pending, so R is sure to look at entry K at some boundary no later
    than its answer.
The agreed step
    The largest of the proposer's step and every rank's answer; each rank reads all answers (one wait, one read)
    when it reaches the proposer's step, then applies the directive at the agreed step. Since the agreed step is
    at least every rank's answer, no rank can be past it when it learns it; a rank that would be is a bug and
    raises :class:`GangError`. In a synchronous data-parallel job the ranks are within a step of each other, so
    with the margin the answers are in before anyone needs them and nobody waits. Entries apply in log order:
    an entry's step is at least its predecessor's; and while the gang is paused (a ``Pause``, a zero share),
    the next entry applies at the step where it is paused (every rank is paused there and looks at it there), so
    that a ``Resume`` or a ``Checkpoint`` reaches a paused gang.
``rng/K/R``, ``ckpt/K``
    A checkpoint (entry K) is written by rank 0 alone, with each rank's random generator states (which differ
    from rank to rank: dropout, a per-rank loader) that the others put in ``rng/K/R``. On checkpoint-and-exit
    rank 0 then puts the checkpoint's path (or its error) in ``ckpt/K``; the other ranks wait for it before they
    report ``Checkpointed`` and exit, so no rank says the gang is checkpointed before the checkpoint exists.
``start/R``
    Rank R's step at its first boundary: all must be equal (every rank resumed from rank 0's checkpoint, in a
    directory all nodes share), or the ranks raise :class:`GangError` rather than train out of step.
``closed/R``
    Written by rank R as it closes; rank 0 keeps its store (and so its process) up until every other rank has
    closed, at most :data:`LINGER_S` seconds, so that none loses the store during its last boundaries.

The training thread's per-step cost is unchanged (two truth tests): a watcher thread per rank blocks on the
store for the next log slot and raises the job's attention flag when an entry arrives. A gang costs a few store
round trips per directive and nothing per step.
"""

from __future__ import annotations

import json
import logging
import math
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from corral.core import contract
from corral.core.errors import CorralError, InputError
from corral.job.env import GangEnvironment

if TYPE_CHECKING:
    from torch.distributed.distributed_c10d import Store

logger = logging.getLogger("corral.job")

GANG_TIMEOUT_S = 300.0
"""How long a rank waits for the gang: for rank 0's store at start, for the other ranks' answers, for rank 0's
checkpoint. Past it the rank raises :class:`GangError` (a dead rank must not hang the others forever)."""
LINGER_S = 30.0
"""How long rank 0, closing, keeps its store up for the other ranks to close."""
MARGIN_S = 0.05
"""How far ahead, in time, a rank proposes to apply a directive: enough for the others to hear of it."""
MIN_MARGIN_STEPS = 2
MAX_MARGIN_STEPS = 10_000
_WATCH_TIMEOUT = timedelta(hours=1)  # the watcher's wait is re-armed after this; c10d logs each timeout

KIND_DIRECTIVE = "directive"  # an agent's directive (or SIGTERM, or the script's checkpoint-and-exit)
KIND_SAVE = "save"  # Job.request_checkpoint(exit=False): a checkpoint, and training goes on
KIND_BYE = "bye"  # a rank closing: stops its own watcher, ignored by the others


class GangError(CorralError):
    """The gang cannot agree: its store is unreachable or gone, a rank did not answer in time, rank 0 could not
    write the checkpoint, or (a bug) a rank found itself past an agreed step."""


def margin_steps(step_s: float) -> int:
    """How many steps ahead to propose a directive, given the last step's wall time: :data:`MARGIN_S` worth, at
    least :data:`MIN_MARGIN_STEPS`, at most :data:`MAX_MARGIN_STEPS`."""
    if not step_s > 0:
        return MIN_MARGIN_STEPS
    return max(MIN_MARGIN_STEPS, min(MAX_MARGIN_STEPS, math.ceil(MARGIN_S / step_s)))


@dataclass(slots=True)
class Entry:
    """One directive of the gang's log."""

    index: int
    key: str
    kind: str
    message: contract.Message | None
    proposed: int
    """The step its proposer asked for."""
    by: int
    """The rank that proposed it."""
    agreed: int | None = None
    """The step at which every rank applies it, once known."""


class Gang:
    """This process's membership of its gang: the store (hosted here on rank 0), the watcher thread, the entries
    learnt and not yet applied.

    ``horizon()`` (called on the watcher thread, after ``on_entry()``) is the step + 1 of the training thread;
    ``on_entry()`` raises the job's attention flag and wakes a paused job. ``first_step`` is the step the job
    starts at (the checkpoint's). Blocks until rank 0's store answers (at most ``timeout_s``)."""

    def __init__(
        self,
        env: GangEnvironment,
        *,
        prefix: str,
        horizon: Callable[[], int],
        on_entry: Callable[[], None],
        first_step: int = 0,
        timeout_s: float = GANG_TIMEOUT_S,
        linger_s: float = LINGER_S,
    ) -> None:
        try:
            import torch.distributed as dist
        except ImportError:
            raise GangError(
                f"a gang job ({contract.ENV_GANG_PORT} is set) needs torch.distributed for corral.job's gang store; "
                "install PyTorch (pip install -e '.[torch]')"
            ) from None
        self.env = env
        self.rank = env.rank
        self.size = env.size
        self.where = f"{env.addr}:{env.port}"
        self.agreed: deque[Entry] = deque(maxlen=100)
        """The last entries applied, with the step each was proposed for and agreed at (for logs and tests)."""
        self._dist = dist
        self._prefix = prefix
        self._horizon = horizon
        self._on_entry = on_entry
        self._timeout = timedelta(seconds=timeout_s)
        self._timeout_s = timeout_s
        self._linger = timedelta(seconds=linger_s)
        self._pending: deque[Entry] = deque()  # learnt, not applied; appended by the watcher, taken by training
        self._seen: set[str] = set()  # keys of the log's entries read so far (the watcher's)
        self._proposed: set[str] = set()  # keys this rank proposed
        self._cursor = 0  # the next log slot the watcher reads
        self._next_slot = 0  # where this rank tries to write its next proposal
        self._last_agreed = first_step
        self._failure: BaseException | None = None
        self._closed = False
        self._bye = f"bye:{self.rank}"
        try:
            # Rank 0 hosts the store (in this process, on a thread of its own); everyone connects to it, the
            # watcher on a connection of its own, since a client's wait holds the connection.
            tcp_store = dist.TCPStore  # type: ignore[attr-defined]  # re-exported by torch.distributed, untyped
            self._store: Store | None = tcp_store(
                env.addr, env.port, is_master=self.rank == 0, wait_for_workers=False, timeout=self._timeout
            )
            self._watch_store: Store | None = tcp_store(env.addr, env.port, is_master=False, timeout=_WATCH_TIMEOUT)
        except (RuntimeError, OSError) as e:
            doing = "host" if self.rank == 0 else "reach rank 0's"
            raise GangError(
                f"rank {self.rank} of {self.size}: cannot {doing} gang store at {self.where}: {e}"
            ) from None
        self._thread = threading.Thread(target=self._watch, name="corral-job-gang", daemon=True)
        self._thread.start()

    # -- training thread -------------------------------------------------------------------------------------
    @property
    def pending(self) -> bool:
        """Whether an entry has been learnt and not yet applied."""
        return bool(self._pending)

    def propose(self, key: str, kind: str, message: contract.Message | None, step: int) -> None:
        """Ask the gang to apply ``message`` (named ``key``) at ``step`` or later; nothing if the log has ``key``
        already (another rank's copy came first) or this rank proposed it before."""
        if key in self._seen or key in self._proposed:
            return
        self._proposed.add(key)
        body = {
            "key": key,
            "kind": kind,
            "msg": contract.encode(message).decode().rstrip("\n") if message is not None else None,
            "step": step,
            "by": self.rank,
        }
        value = json.dumps(body, separators=(",", ":"))
        mine = value.encode()
        store = self._live_store()
        slot = max(self._cursor, self._next_slot)
        try:
            while True:
                got = store.compare_set(self._key(f"log/{slot}"), "", value)
                slot += 1
                if got == mine or _entry_key(got) == key:  # ours, or the same directive from another rank
                    break
        except self._dist.DistError as e:
            raise self._lost(e) from None
        self._next_slot = slot

    def next_due(self, step: int, *, paused: bool) -> Entry | None:
        """The next entry to apply at boundary ``step`` (in log order), or ``None`` when none is due here; the
        caller applies it before asking again. ``paused``: whether the job is paused at ``step`` (then the next
        entry applies here). Blocks (bounded) for the ranks' answers when an entry's proposed step is reached."""
        if self._failure is not None and not self._pending:
            raise self._lost(self._failure)
        if not self._pending:
            return None
        entry = self._pending[0]
        if paused:
            # Every rank is paused at this step (a pause applies at an agreed step) and looks here.
            entry.agreed = step
        elif entry.agreed is None:
            if entry.proposed > step:
                return None
            entry.agreed = max(self._final_step(entry), self._last_agreed)
        if entry.agreed > step:
            return None
        if entry.agreed < step:
            raise GangError(
                f"bug: rank {self.rank} of {self.size} is at step {step}, past step {entry.agreed} at which the gang "
                f"agreed to apply {entry.key} (proposed by rank {entry.by} for step {entry.proposed})"
            )
        self._pending.popleft()
        self._last_agreed = step
        self.agreed.append(entry)
        return entry

    def check_start(self, step: int) -> None:
        """At the first boundary: every rank starts at the same step, that of rank 0's checkpoint. A rank that
        did not find it (a checkpoint directory that is not shared) would train out of step with the others;
        raises :class:`GangError` naming each rank's step. Waits (bounded) for every rank's first boundary."""
        try:
            self._live_store().set(self._key(f"start/{self.rank}"), str(step))
        except self._dist.DistError as e:
            raise self._lost(e) from None
        ranks = range(self.size)
        keys = [self._key(f"start/{r}") for r in ranks]
        steps = [int(v) for v in self._get_all(keys, "every rank's first step", [f"rank {r}" for r in ranks])]
        if len(set(steps)) > 1:
            each = ", ".join(f"rank {r}: {s}" for r, s in enumerate(steps))
            raise GangError(
                f"the gang's ranks start at different steps ({each}): each must resume from rank 0's checkpoint, so "
                f"{contract.ENV_CHECKPOINT_DIR} must name a directory that every node shares"
            )

    def put_rng(self, index: int, blob: str) -> None:
        """This rank's random generator states for the checkpoint of entry ``index`` (ranks other than 0)."""
        try:
            self._live_store().set(self._key(f"rng/{index}/{self.rank}"), blob)
        except self._dist.DistError as e:
            raise self._lost(e) from None

    def gather_rng(self, index: int) -> dict[int, str]:
        """Rank 0: every other rank's random generator states for the checkpoint of entry ``index``."""
        others = list(range(1, self.size))
        keys = [self._key(f"rng/{index}/{r}") for r in others]
        what = f"the other ranks' random generator states for the checkpoint of gang entry {index}"
        values = self._get_all(keys, what, [f"rank {r}" for r in others])
        return {r: v.decode() for r, v in zip(others, values, strict=True)}

    def publish_checkpoint(self, index: int, path: str | None, error: str | None = None) -> None:
        """Rank 0: the checkpoint of entry ``index`` is written at ``path`` (``None``: checkpointing is off), or
        could not be (``error``)."""
        body = json.dumps({"path": path, "error": error})
        try:
            self._live_store().set(self._key(f"ckpt/{index}"), body)
        except self._dist.DistError as e:
            raise self._lost(e) from None

    def await_checkpoint(self, index: int) -> str | None:
        """Other ranks: wait until rank 0 has written the checkpoint of entry ``index``; its path (``None`` when
        checkpointing is off). Raises :class:`GangError` if rank 0 could not write it."""
        (raw,) = self._get_all([self._key(f"ckpt/{index}")], f"the checkpoint of gang entry {index}", ["rank 0"])
        body = json.loads(raw)
        if body.get("error"):
            raise GangError(f"rank 0 could not write the checkpoint of gang entry {index}: {body['error']}")
        path = body.get("path")
        return str(path) if path else None

    def close(self) -> None:
        """Leave the gang: stop the watcher; on rank 0, keep the store up until every other rank has closed (at
        most ``linger_s``). Idempotent; never raises."""
        if self._closed:
            return
        self._closed = True
        store = self._store
        try:
            if store is not None and self._failure is None:
                self.propose(self._bye, KIND_BYE, None, 0)
                if self.rank != 0:
                    store.set(self._key(f"closed/{self.rank}"), "1")
                elif self.size > 1:
                    keys = [self._key(f"closed/{r}") for r in range(1, self.size)]
                    try:
                        store.wait(keys, self._linger)
                    except self._dist.DistStoreError:
                        late = [r for r, k in zip(range(1, self.size), keys, strict=True) if not store.check([k])]
                        logger.warning(
                            "corral.job: rank 0 closes the gang store at %s before ranks %s closed", self.where, late
                        )
        except (GangError, self._dist.DistError) as e:
            logger.debug("corral.job: leaving the gang: %s", e)
        self._thread.join(timeout=2.0)
        self._store = None
        self._watch_store = None  # the last references: rank 0's store server stops here

    # -- helpers -----------------------------------------------------------------------------------------------
    def _key(self, name: str) -> str:
        return self._prefix + name

    def _live_store(self) -> Store:
        if self._store is None:
            raise GangError(f"rank {self.rank}: the gang is closed")
        return self._store

    def _lost(self, error: BaseException) -> GangError:
        who = "this process (rank 0)" if self.rank == 0 else "rank 0's process"
        return GangError(f"rank {self.rank} of {self.size}: the gang store at {self.where}, in {who}, is gone: {error}")

    def _get_all(self, keys: Sequence[str], what: str, names: Sequence[str]) -> list[bytes]:
        """The values of ``keys``, once all are set (at most the gang timeout); ``names`` says whose each is."""
        store = self._live_store()
        try:
            store.wait(list(keys), self._timeout)
            return list(store.multi_get(list(keys)))
        except self._dist.DistStoreError:
            missing = [n for k, n in zip(keys, names, strict=True) if not store.check([k])]
            raise GangError(
                f"rank {self.rank} of {self.size}: waited {self._timeout_s:g} s for {what}; "
                f"nothing from {', '.join(missing)}"
            ) from None
        except self._dist.DistError as e:
            raise self._lost(e) from None

    def _final_step(self, entry: Entry) -> int:
        """The agreed step of ``entry``: the largest of its proposed step and every rank's answer."""
        keys = [self._key(f"ack/{entry.index}/{r}") for r in range(self.size)]
        what = f"every rank's answer to gang entry {entry.index} ({entry.key})"
        answers = self._get_all(keys, what, [f"rank {r}" for r in range(self.size)])
        return max(entry.proposed, *(int(a) for a in answers))

    # -- watcher thread ----------------------------------------------------------------------------------------
    def _watch(self) -> None:
        store = self._watch_store
        assert store is not None
        slot = 0
        while True:
            key = self._key(f"log/{slot}")
            try:
                store.wait([key])
                raw = store.get(key)
            except self._dist.DistStoreError:  # no entry within _WATCH_TIMEOUT: wait again
                continue
            except self._dist.DistError as e:
                if not self._closed:
                    logger.error("corral.job: rank %d lost the gang store at %s: %s", self.rank, self.where, e)
                    self._failure = e
                    self._on_entry()
                return
            try:
                entry = _parse(raw, slot)
            except (ValueError, KeyError, TypeError, InputError) as e:
                logger.error("corral.job: rank %d: unreadable gang entry %d (%s): %r", self.rank, slot, e, raw[:200])
                self._failure = e
                self._on_entry()
                return
            slot += 1
            self._cursor = slot
            if entry.kind == KIND_BYE:
                if entry.key == self._bye:
                    return
                continue
            if entry.key in self._seen:
                continue  # another rank's copy of a directive the log has already
            self._seen.add(entry.key)
            self._pending.append(entry)
            self._on_entry()
            # Read after raising the flag: the training thread looks at this entry at its next boundary at the
            # latest, which is at most this step + 1 (it may be closing the current step right now).
            answer = self._horizon()
            try:
                store.set(self._key(f"ack/{entry.index}/{self.rank}"), str(answer))
            except self._dist.DistError as e:
                if not self._closed:
                    logger.error("corral.job: rank %d lost the gang store at %s: %s", self.rank, self.where, e)
                    self._failure = e
                    self._on_entry()
                return


def _entry_key(raw: bytes) -> str | None:
    try:
        key = json.loads(raw)["key"]
    except (ValueError, KeyError, TypeError):
        return None
    return key if isinstance(key, str) else None


def _parse(raw: bytes, index: int) -> Entry:
    body: dict[str, Any] = json.loads(raw)
    msg = body["msg"]
    message = contract.decode(msg) if msg is not None else None
    return Entry(
        index=index,
        key=str(body["key"]),
        kind=str(body["kind"]),
        message=message,
        proposed=int(body["step"]),
        by=int(body["by"]),
    )
