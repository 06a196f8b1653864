"""The :class:`Job`: the step loop, its boundaries, and what happens at them (see :mod:`corral.job` for the
user's guide).

Per-step cost when nothing changes is two ``perf_counter`` calls, a few additions and two truth tests (the
attention flag and the channel's inbox); everything else (reports, directives, signals, checkpoints) is off that
path. Reports are sent once per report interval from the training thread by appending to the channel's buffer;
all socket I/O is on the channel's own thread (:mod:`corral.job.channel`). A rank of a gang across nodes takes
the same path: its directives go through the gang's agreement (:mod:`corral.job.gang`), whose watcher thread
raises the same attention flag.
"""

from __future__ import annotations

import atexit
import json
import logging
import math
import os
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from corral.core import contract
from corral.job.channel import AgentChannel
from corral.job.checkpoint import (
    STATE_NAME,
    CheckpointError,
    CheckpointStore,
    RngState,
    Stateful,
    fast_forward,
    load_state,
    loader_generators,
    read_meta,
    save_state,
    write_meta,
)
from corral.job.device import Device, TorchDevice
from corral.job.env import GangEnvironment, JobEnvironment
from corral.job.gang import KIND_DIRECTIVE, KIND_SAVE, Entry, Gang, margin_steps
from corral.job.memory import DEFAULT_MAX_MICRO_BATCHES, ElasticStep, LossFn, Residency
from corral.job.prefetch import claim_prefetch
from corral.job.throttle import DutyCycle

if TYPE_CHECKING:
    import torch

T = TypeVar("T")
logger = logging.getLogger("corral.job")

_PAUSE_POLL_S = 0.2  # how often a paused job looks at its signal flag (directives wake it at once)
_FINAL_FLUSH_S = 1.0  # at most this long spent, at exit, handing the last messages to the agent

_DIRECTIVES = (contract.Pause, contract.Resume, contract.Checkpoint, contract.SetBatchSize, contract.SetLimits)

_SignalHandler = Callable[[int, FrameType | None], Any] | int | None


class _StepBlock(AbstractContextManager[None]):
    """``with job.step():`` (a plain class: cheaper per step than a generator-based context manager)."""

    __slots__ = ("_job",)

    def __init__(self, job: Job) -> None:
        self._job = job

    def __enter__(self) -> None:
        self._job._enter_step()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._job._exit_step()


class Job:
    """The running job as the training script sees it. See :mod:`corral.job` for how to use it.

    Every argument is optional. ``model``, ``optimizer``, ``scheduler`` and ``state`` (more named objects with
    ``state_dict``/``load_state_dict``) are saved in each checkpoint and restored from it; ``save(path)`` and
    ``load(path)`` are the script's own hooks, called with the checkpoint directory (files whose names start with
    ``corral`` are the library's). ``on_batch_size(n)`` applies a batch size the scheduler asks for and returns
    the batch size now in use (``None`` meaning ``n``). ``batch_size`` is the one in use at the start (a
    checkpoint's overrides it). ``checkpoint_dir`` overrides ``CORRAL_CHECKPOINT_DIR``; ``handle_sigterm``
    forces the ``SIGTERM`` handler on or off (by default it is installed from the main thread when running under
    an agent or with a checkpoint directory); ``env`` replaces ``os.environ``; ``device`` replaces the default
    :class:`~corral.job.device.TorchDevice`; ``reconnect_s`` is the pause between attempts to reach the agent;
    ``verbose`` prints one line to stderr when the job resumes or checkpoints; ``max_micro_batches`` is the
    deepest split of a batch the memory ladder of :meth:`train_step` uses (:mod:`corral.job.memory`);
    ``pipelined_restore`` puts an evicted job's state back on the GPU in layer groups that the first step's
    layers wait for each (:mod:`corral.job.pipeline`); off by default: on an H100 it has not been faster yet
    (docs/measurements.md, section 5), and a model that reads a parameter outside its module's forward must not
    use it. ``total_steps`` is how many steps (``global_step``) the job does in all, when the script knows: its
    step reports then say how many are left, and the scheduler's start-time estimates of the jobs waiting for its
    GPUs use it (docs/live.md, "Estimated start times").
    """

    def __init__(
        self,
        *,
        model: Stateful | None = None,
        optimizer: Stateful | None = None,
        scheduler: Stateful | None = None,
        state: Mapping[str, Stateful] | None = None,
        save: Callable[[Path], None] | None = None,
        load: Callable[[Path], None] | None = None,
        on_batch_size: Callable[[int], int | None] | None = None,
        batch_size: int | None = None,
        checkpoint_dir: str | os.PathLike[str] | None = None,
        handle_sigterm: bool | None = None,
        env: Mapping[str, str] | None = None,
        device: Device | None = None,
        reconnect_s: float = 2.0,
        verbose: bool = True,
        max_micro_batches: int = DEFAULT_MAX_MICRO_BATCHES,
        pipelined_restore: bool = False,
        total_steps: int | None = None,
    ) -> None:
        self.environment = JobEnvironment.from_env(os.environ if env is None else env)
        e = self.environment
        self.job_id = e.job_id
        self.run = e.run
        self.report_interval_s = e.report_interval_s
        self.grace_s = e.grace_s
        self.batch_size = batch_size
        if total_steps is not None and (isinstance(total_steps, bool) or not isinstance(total_steps, int)):
            raise TypeError(f"Job(total_steps=...) must be an integer, got {total_steps!r}")
        if total_steps is not None and total_steps < 0:
            raise ValueError(f"Job(total_steps=...) must be >= 0, got {total_steps}")
        self.total_steps = total_steps
        """The batch size in use, as the script told the library (reported to the agent, saved in checkpoints)."""
        self.gpu_milli = e.gpu_milli
        """The compute share the scheduler gives the job (milli-GPU); ``None`` when not set. 0 pauses the job."""
        self.mem_limit_mib = e.gpu_mem_mib
        """The GPU memory cap the scheduler set (MiB); ``None`` when not set."""
        self.mem_cap_mib: int | None = None
        """The memory cap the device applies (reported to the agent); ``None`` when none is in force (none was
        set, or the script has not initialised CUDA yet)."""

        self.global_step = 0
        """Steps done, over all runs of the job (a resumed job starts at the checkpoint's count)."""
        self.start_step = 0
        """``global_step`` when this run started: 0, or the step the checkpoint was taken at."""
        self.epoch = 0
        """The current epoch (0-based), as :meth:`epochs` and :meth:`loop` count them."""
        self.step_in_epoch = 0
        """Steps done in the current epoch (inside a step: the index of the current batch in its epoch)."""
        self.resumed = False
        """Whether this run started from a checkpoint."""
        self.checkpoint_path: Path | None = None
        """The checkpoint this run resumed from, or (once written) the one it saved."""
        self.prefetched = False
        """Whether the restore used the checkpoint state read ahead in the background (:mod:`corral.job.checkpoint`,
        "checkpoint prefetch")."""
        self.last_step_s = 0.0
        """Wall time of the last completed step (seconds)."""

        self._objects: dict[str, Stateful] = {}
        for name, obj in (("model", model), ("optimizer", optimizer), ("scheduler", scheduler)):
            if obj is not None:
                self._objects[name] = obj
        for name, obj in (state or {}).items():
            if name in self._objects:
                raise ValueError(f"state name {name!r} is already used by the {name} argument")
            self._objects[name] = obj
        self._save_hook = save
        self._load_hook = load
        self._on_batch_size = on_batch_size
        self._device: Device = device if device is not None else TorchDevice()
        # GPU memory (the degradation ladder, eviction) needs to know the model and optimizer.
        self._residency: Residency | None = None
        self._elastic: ElasticStep | None = None
        if model is not None or optimizer is not None:
            self._residency = Residency(model, optimizer, self._device)
            self._device.attach(self._residency)
            if optimizer is not None:
                self._elastic = ElasticStep(self._residency, self._device, max_micro_batches=max_micro_batches)
        self._elastic_used = False  # the script runs its steps through train_step (reports name the rung)
        self._pipelined_restore = pipelined_restore
        self._duty = DutyCycle()
        self._throttled = False  # the duty cycle idles after each step (0 < share < 1)
        self._verbose = verbose
        self._pid = os.getpid()

        # step loop state
        self._t_step = 0.0
        self._step_open = False
        self._in_loop = False
        self._epoch_finished = False
        self._epoch_started = False  # the epoch's generator state has been recorded (or restored)
        self._epoch_rng: RngState | None = None  # the generators' state just before this epoch's iterator
        self._resume_epoch_rng: RngState | None = None  # from the checkpoint, used once to rebuild the epoch
        self._pending_rng: RngState | None = None  # from the checkpoint, restored at the first boundary
        self._loader_gens: list[torch.Generator] = []
        self._attention = True  # the boundary's slow path is needed for more than directives (once at the start)
        self._preempt_reason: str | None = None
        self._save_requested = False
        self._pause_requested = False
        self._evict_requested = False
        self._paused = False
        self._closed = False
        self._step_block = _StepBlock(self)

        # a rank of a gang across nodes (corral.job.gang): what it asks the gang to agree on, and what was agreed
        self._gang: Gang | None = None
        self._sigterm = False  # SIGTERM arrived: to be proposed as a checkpoint-and-exit
        self._requests: deque[tuple[str, str, contract.Message | None]] = deque()  # the script's, to propose
        self._save_index: int | None = None  # an agreed checkpoint without exit, to take at this boundary
        self._preempt_index: int | None = None  # the agreed checkpoint-and-exit
        self._gang_rngs: dict[str, Any] | None = None  # rank 0, writing: the other ranks' generator states
        self._unnumbered = 0  # directives without seq received (each agreed on its own)
        self._gang_started = False  # the ranks' starting steps have been compared

        # aggregation for reports
        self._agg_steps = 0
        self._agg_wall = 0.0
        self._agg_busy = 0.0
        self._next_report_at = math.inf

        dir_ = checkpoint_dir if checkpoint_dir is not None else e.checkpoint_dir
        self._store = CheckpointStore(dir_) if dir_ is not None else None
        if self._store is not None:
            self._restore()
        if self.gpu_milli is not None or self.mem_limit_mib is not None:
            self._apply_limits()

        self._channel: AgentChannel | None = None
        self._inbox: deque[contract.Message] = deque()  # the channel's, or one that stays empty
        # Only one process per node talks to the agent (torchrun's other workers learn through the gang).
        if e.agent_socket is not None and (e.gang is None or e.gang.talks_to_agent):
            if not e.job_id:
                logger.warning("corral.job: %s is set but %s is not", contract.ENV_AGENT_SOCKET, contract.ENV_JOB_ID)
            self._channel = AgentChannel(e.agent_socket, self._greeting, retry_s=reconnect_s)
            self._inbox = self._channel.inbox
            self._next_report_at = time.perf_counter() + self.report_interval_s
        # What wakes a paused job: a directive from the agent, or (a gang) an entry of the gang's log.
        self._wake = self._channel.arrived if self._channel is not None else threading.Event()
        if e.gang is not None:
            try:
                self._gang = Gang(
                    e.gang,
                    prefix=f"corral/{self.job_id}/{self.run}/",
                    horizon=self._gang_horizon,
                    on_entry=self._on_gang_entry,
                    first_step=self.global_step,
                )
            except BaseException:
                if self._channel is not None:
                    self._channel.close(flush_timeout_s=0)
                raise

        self._previous_sigterm: _SignalHandler = None
        self._sigterm_installed = False
        if handle_sigterm is None:
            handle_sigterm = e.agent_socket is not None or self._store is not None or e.gang is not None
        if handle_sigterm:
            if threading.current_thread() is not threading.main_thread():
                logger.warning("corral.job: SIGTERM handler not installed: Job() was created outside the main thread")
            else:
                self._previous_sigterm = signal.signal(signal.SIGTERM, self._on_sigterm)
                self._sigterm_installed = True
        atexit.register(self.close)

    # -- what the script reads ---------------------------------------------------------------------------------
    @property
    def standalone(self) -> bool:
        """True when no agent is set (``CORRAL_AGENT_SOCKET`` absent): the job runs without a scheduler."""
        return self._channel is None

    @property
    def gang(self) -> GangEnvironment | None:
        """The gang across nodes this process is a rank of (its ``rank`` and ``size`` in corral.job's numbering),
        or ``None`` for a one-node job."""
        return self.environment.gang

    @property
    def connected(self) -> bool:
        """Whether the job is connected to its agent right now."""
        return self._channel is not None and self._channel.connected

    @property
    def checkpoint_dir(self) -> Path | None:
        """Where checkpoints are kept, or ``None`` when checkpointing is off."""
        return self._store.root if self._store is not None else None

    @property
    def paused(self) -> bool:
        """True while the job waits at a boundary for :class:`~corral.core.contract.Resume` (only visible to
        other threads: the training thread is the one waiting)."""
        return self._paused

    @property
    def evicted(self) -> bool:
        """True while a pause has the job's state in host memory (only visible to other threads)."""
        return self._residency is not None and self._residency.evicted

    @property
    def mem_mode(self) -> str | None:
        """The rung of the memory ladder :meth:`train_step` uses now (``"full"``, ``"micro4"``, ...), or ``None``
        without an optimizer."""
        return self._elastic.rung.name if self._elastic is not None else None

    @property
    def duty_cycle(self) -> DutyCycle:
        """The compute-share throttle (its ``share``, and the busy and idle time it has seen)."""
        return self._duty

    @property
    def preempt_requested(self) -> str | None:
        """Why the job will checkpoint and exit at its next boundary (``"SIGTERM"``, a directive's reason), or
        ``None``."""
        return self._preempt_reason

    def __repr__(self) -> str:
        where = "standalone" if self.standalone else f"agent {self.environment.agent_socket}"
        return f"Job(job_id={self.job_id!r}, run={self.run}, step={self.global_step}, epoch={self.epoch}, {where})"

    # -- the loop ----------------------------------------------------------------------------------------------
    def epochs(self, count: int) -> Iterator[int]:
        """The epochs still to run out of ``count``: ``range(count)``, but starting at the checkpoint's epoch when
        resumed. Inside, :meth:`loop` iterates the current epoch's batches; code after it (an LR scheduler's
        ``step()``, an evaluation) runs once per epoch as usual. The generators' state is recorded as each epoch
        begins (restored, when resuming into it), so randomness the script draws to build the epoch's data
        (shuffling its own list) repeats exactly too."""
        while True:
            if self._epoch_finished:
                self._next_epoch()
            if self.epoch >= count:
                return
            self._start_epoch()
            yield self.epoch
            self._epoch_finished = True  # whatever the body did, this epoch is over

    def loop(self, iterable: Iterable[T], epochs: int | None = None) -> Iterator[T]:
        """Iterate ``iterable`` (a ``DataLoader``, any iterable); every ``next`` is a step boundary.

        Without ``epochs``: one epoch, the current one (continuing mid-epoch when resumed; a later call starts
        the next epoch). With ``epochs=n``: ``n`` epochs in a row (as ``for e in job.epochs(n): job.loop(...)``),
        for scripts with nothing to do between epochs.
        """
        if epochs is None:
            return self._one_epoch(iterable)
        return self._many_epochs(iterable, epochs)

    def _many_epochs(self, iterable: Iterable[T], count: int) -> Iterator[T]:
        for _ in self.epochs(count):
            yield from self._one_epoch(iterable)

    def _one_epoch(self, iterable: Iterable[T]) -> Iterator[T]:
        if self._in_loop:
            raise RuntimeError("job.loop() is already running; use one loop (or job.step()) at a time")
        if self._epoch_finished:
            self._next_epoch()
        self._in_loop = True
        try:
            it = self._epoch_iterator(iterable)
            while True:
                self._boundary()
                try:
                    item = next(it)
                except StopIteration:
                    self._epoch_finished = True
                    return
                self._step_open = True
                yield item
        finally:
            if self._step_open:  # the script left the loop (break, exception) during a step: that step ended
                self._close_step(time.perf_counter())
            self._in_loop = False
            self._loader_gens = []

    def step(self) -> AbstractContextManager[None]:
        """One step, for loops that :meth:`loop` does not fit: ``with job.step(): ...``; entering the block is the
        step boundary.

        The data position is then the script's business: ``job.start_step`` says how many steps the checkpoint
        had done (the library saves and restores the generators and the objects given to :class:`Job`)."""
        if self._in_loop:
            raise RuntimeError("job.step() inside job.loop(): the loop already marks each step")
        return self._step_block

    def _enter_step(self) -> None:
        self._boundary()
        self._step_open = True

    def _exit_step(self) -> None:
        if self._step_open:
            self._close_step(time.perf_counter())

    def _next_epoch(self) -> None:
        self.epoch += 1
        self.step_in_epoch = 0
        self._epoch_finished = False
        self._epoch_started = False
        self._epoch_rng = None
        self._resume_epoch_rng = None

    def _start_epoch(self) -> None:
        """The epoch begins (at :meth:`epochs`' yield, or else at the first :meth:`loop` of it): set the global
        generators back to the epoch's start when resuming into it, or record them for a later checkpoint."""
        if self._epoch_started:
            return
        self._epoch_started = True
        if self._resume_epoch_rng is not None:
            self._resume_epoch_rng.restore()
            self._epoch_rng = self._resume_epoch_rng
        elif self.step_in_epoch > 0:
            logger.warning(
                "corral.job: continuing epoch %d after %d steps without its start state: the data order may "
                "differ from an uninterrupted run",
                self.epoch,
                self.step_in_epoch,
            )
        elif self._store is not None:
            self._epoch_rng = RngState.capture()

    def _epoch_iterator(self, iterable: Iterable[T]) -> Iterator[T]:
        gens = loader_generators(iterable)
        self._loader_gens = gens
        self._start_epoch()
        if self._resume_epoch_rng is not None:
            # Rebuilding the interrupted epoch: the loader's generators as they were before its iterator was
            # made, so that a shuffling sampler draws the same order; then skip what was consumed. The state at
            # the checkpoint is restored at the first boundary (_pending_rng), after the skip.
            self._resume_epoch_rng.restore_generators(gens)
            self._resume_epoch_rng = None
        elif self._epoch_rng is not None and self._epoch_rng.generators is None:
            self._epoch_rng.capture_generators(gens)
        it = iter(iterable)
        if self.step_in_epoch > 0:
            done = fast_forward(it, self.step_in_epoch)
            if done < self.step_in_epoch:
                logger.warning(
                    "corral.job: %d batches of epoch %d were consumed before, but the data now has %d",
                    self.step_in_epoch,
                    self.epoch,
                    done,
                )
        return it

    # -- the boundary ------------------------------------------------------------------------------------------
    def _boundary(self) -> None:
        now = time.perf_counter()
        if self._step_open:
            self._close_step(now)
        if self._attention or self._inbox:
            self._attend()
        self._device.begin_step()
        self._t_step = time.perf_counter()

    def _close_step(self, now: float) -> None:
        wall = now - self._t_step
        busy = self._device.end_step(wall, self._throttled)
        self._step_open = False
        self.global_step += 1
        self.step_in_epoch += 1
        self.last_step_s = wall
        self._agg_steps += 1
        self._agg_busy += busy
        if self._throttled:
            # The compute share's duty cycle (AntMan §3.2): idle after the step, before the next one begins.
            idle = self._duty.after_step(busy)
            wall += idle
            now += idle
        self._agg_wall += wall
        if now >= self._next_report_at:
            self._report(now)

    def _report(self, now: float) -> None:
        self._next_report_at = now + self.report_interval_s
        if self._channel is None or not self._agg_steps:
            return
        n = self._agg_steps
        if self.mem_limit_mib is not None and self.mem_cap_mib is None:
            self._apply_limits()  # a cap that waited for the script to initialise CUDA
        elastic = self._elastic if self._elastic_used else None
        report = contract.StepReport(
            job_id=self.job_id,
            run=self.run,
            step=self.global_step - self.start_step,
            steps=n,
            step_time_s=self._agg_wall / n,
            busy_s=self._agg_busy / n,
            mem_peak_mib=self._device.peak_mem_mib(),
            mem_cap_mib=self.mem_cap_mib,
            batch_size=self.batch_size,
            mem_need_mib=elastic.ladder.need_mib if elastic is not None else None,
            mem_mode=elastic.rung.name if elastic is not None else None,
            steps_left=None if self.total_steps is None else max(0, self.total_steps - self.global_step),
        )
        self._agg_steps = 0
        self._agg_wall = 0.0
        self._agg_busy = 0.0
        self._channel.send(report, droppable=True)

    def _attend(self) -> None:
        """The boundary's slow path: restore generators after a resume, apply directives, checkpoint, pause."""
        self._attention = False
        if self._residency is not None:
            self._residency.settle()  # a pipelined restore's copies, before anything reads the state
        if self._pending_rng is not None:
            self._pending_rng.restore(self._loader_gens)
            self._pending_rng = None
        if self._gang is not None:
            self._attend_gang(self._gang)
            return
        self._apply_all()
        if self._save_requested and self._preempt_reason is None:
            self._save_requested = False
            if self._save() is None:
                logger.warning("corral.job: a checkpoint was requested but checkpointing is off (no directory)")
        if self._preempt_reason is None and self._must_pause():
            self._pause()
        if self._preempt_reason is not None:
            self._checkpoint_and_exit(self._preempt_reason)

    def _apply_all(self) -> None:
        while self._inbox:
            self._apply(self._inbox.popleft())

    def _apply(self, message: contract.Message) -> None:
        if isinstance(message, contract.Pause):
            self._pause_requested = True
            self._evict_requested = message.evict
        elif isinstance(message, contract.Resume):
            self._pause_requested = False
            self._evict_requested = False
        elif isinstance(message, contract.Checkpoint):
            if self._preempt_reason is None:
                self._preempt_reason = message.reason or "checkpoint requested"
        elif isinstance(message, contract.SetBatchSize):
            self._set_batch_size(message.batch_size)
        elif isinstance(message, contract.SetLimits):
            if message.gpu_milli is not None:
                self.gpu_milli = message.gpu_milli
            if message.mem_mib is not None:
                self.mem_limit_mib = message.mem_mib
            self._apply_limits()
        else:
            logger.warning("corral.job: ignoring a %s message from the agent", message.type)

    def _apply_limits(self) -> None:
        """The share goes to the duty cycle, the cap to the device and to the memory ladder."""
        self.mem_cap_mib = self._device.apply_limits(self.gpu_milli, self.mem_limit_mib)
        if self._elastic is not None:
            self._elastic.set_cap(self.mem_cap_mib)
        self._duty.set_share(self.gpu_milli)
        self._throttled = self._duty.active

    # -- training steps ----------------------------------------------------------------------------------------
    def train_step(
        self, batch: Any, loss_fn: LossFn, *, before_step: Callable[[], object] | None = None
    ) -> torch.Tensor:
        """Run one training step on ``batch`` so that it fits the GPU memory cap (:mod:`corral.job.memory`):
        ``optimizer.zero_grad()``, the forward and backward passes of ``loss_fn(micro_batch)`` (which must
        return the *mean* loss over the micro-batch it is given) over as many micro-batches as the cap needs,
        ``before_step()`` (gradient clipping, ...), then ``optimizer.step()``. Returns the batch's mean loss,
        detached. Needs ``Job(optimizer=...)`` (and ``model=...`` for eviction). Call it inside a step (``for
        batch in job.loop(...)`` or ``with job.step():``)::

            for x, y in job.loop(loader):
                loss = job.train_step((x, y), lambda b: F.cross_entropy(model(b[0]), b[1]))
        """
        elastic = self._elastic
        if elastic is None:
            raise RuntimeError("Job.train_step needs the optimizer: create the job with Job(model=..., optimizer=...)")
        self._elastic_used = True
        return elastic.run(batch, loss_fn, before_step=before_step)

    def _set_batch_size(self, n: int) -> None:
        if self._on_batch_size is None:
            logger.warning("corral.job: the scheduler asked for batch size %d but Job(on_batch_size=...) is not set", n)
            return
        in_use = self._on_batch_size(n)
        self.batch_size = n if in_use is None else in_use

    def _must_pause(self) -> bool:
        # a zero share pauses only under an agent (or a gang, whose ranks must agree): standalone, nothing could
        # ever resume the job
        return self._pause_requested or (self.gpu_milli == 0 and (self._channel is not None or self._gang is not None))

    def _pause(self) -> None:
        """Wait at this boundary until resumed (or asked to checkpoint): GPU memory kept, or, when the pause asks
        to evict, the model and optimizer state moved to host memory and put back on resume."""
        channel = self._channel
        self._enter_pause()
        try:
            while channel is not None and self._preempt_reason is None and self._must_pause():
                channel.arrived.clear()
                self._apply_all()
                if self._preempt_reason is not None or not self._must_pause():
                    break
                channel.arrived.wait(_PAUSE_POLL_S)
        finally:
            self._paused = False
        if self._preempt_reason is None:
            self._leave_pause()

    def _enter_pause(self) -> None:
        """Stop at this boundary: evict if asked, tell the agent."""
        self._paused = True
        took: float | None = None
        if self._evict_requested:
            took = self._evict()
        self._send(
            contract.Paused(
                job_id=self.job_id,
                run=self.run,
                step=self.global_step - self.start_step,
                evicted=self.evicted,
                took_s=took,
            )
        )

    def _leave_pause(self) -> None:
        """Go on after a pause: the state back on the GPU if it was evicted, tell the agent."""
        self._paused = False
        took = self._restore_evicted()
        self._send(
            contract.Resumed(job_id=self.job_id, run=self.run, step=self.global_step - self.start_step, took_s=took)
        )
        # the pause is no step: the next report covers only steps run after it
        self._next_report_at = time.perf_counter() + self.report_interval_s if self._channel else math.inf

    def _evict(self) -> float | None:
        """Move the job's state to host memory and release GPU memory; the time it took, or ``None`` when there
        is nothing to move (no model or optimizer given to the Job: the pause then keeps GPU memory)."""
        if self._residency is None:
            logger.warning("corral.job: asked to evict, but Job(model=..., optimizer=...) is not set: GPU memory kept")
            return None
        t0 = time.perf_counter()
        self._residency.evict()
        return time.perf_counter() - t0

    def _restore_evicted(self) -> float | None:
        if self._residency is None or not self._residency.evicted:
            return None
        t0 = time.perf_counter()
        self._residency.restore(pipelined=self._pipelined_restore)
        if self._residency.pending:
            self._attention = True  # the next boundary settles it (the copies overlap the step in between)
        return time.perf_counter() - t0

    def _send(self, message: contract.Message) -> None:
        if self._channel is not None:
            self._channel.send(message)

    def _greeting(self) -> list[contract.Message]:
        """What a new connection starts with (called on the channel's thread)."""
        hello: list[contract.Message] = [
            contract.Hello(job_id=self.job_id, run=self.run, pid=self._pid, checkpoints=self._store is not None)
        ]
        if self._paused:
            step = self.global_step - self.start_step
            hello.append(contract.Paused(job_id=self.job_id, run=self.run, step=step, evicted=self.evicted))
        return hello

    # -- gangs across nodes (corral.job.gang) ----------------------------------------------------------------
    def _attend_gang(self, gang: Gang) -> None:
        """The boundary's slow path of a gang's rank: propose what this rank was asked, apply what the gang agreed
        to apply at this step, in the log's order, and act on it (checkpoint, exit, pause) exactly as a one-node
        job would, all ranks at the same step."""
        step = self.global_step
        if not self._gang_started:
            gang.check_start(step)  # every rank resumed from the same checkpoint (a shared directory)
            self._gang_started = True
        said_paused = False
        try:
            while True:
                self._wake.clear()  # before looking: whatever arrives after the look wakes the wait below
                self._propose_local(gang)
                while (entry := gang.next_due(step, paused=self._must_pause())) is not None:
                    self._apply_agreed(entry)
                if self._save_index is not None and self._preempt_reason is None:
                    index, self._save_index = self._save_index, None
                    self._gang_save(gang, index)
                if self._preempt_reason is not None:
                    self._gang_checkpoint_and_exit(gang, self._preempt_reason)
                if not self._must_pause():
                    break
                if not said_paused:
                    said_paused = True
                    self._enter_pause()
                self._wake.wait(_PAUSE_POLL_S)
        finally:
            self._paused = False
        if said_paused:
            self._leave_pause()
        if gang.pending:
            self._attention = True  # look again at every boundary until the pending entries are applied

    def _propose_local(self, gang: Gang) -> None:
        """Propose to the gang the directives this rank received, a SIGTERM, the script's checkpoint requests."""
        step = self.global_step + margin_steps(self.last_step_s)
        while self._inbox:
            message = self._inbox.popleft()
            if not isinstance(message, _DIRECTIVES):
                logger.warning("corral.job: ignoring a %s message from the agent", message.type)
                continue
            if message.seq is not None:
                key = f"seq:{message.seq}"
            else:
                self._unnumbered += 1
                key = f"rank{gang.rank}:{self._unnumbered}"
                if self._unnumbered == 1:
                    logger.warning(
                        "corral.job: a %s directive without seq reached rank %d of a gang: it is agreed as a "
                        "directive of its own, so copies sent to other ranks apply again",
                        message.type,
                        gang.rank,
                    )
            gang.propose(key, KIND_DIRECTIVE, message, step)
        if self._sigterm:
            self._sigterm = False
            gang.propose("sigterm", KIND_DIRECTIVE, contract.Checkpoint(reason="SIGTERM"), step)
        while self._requests:
            key, kind, request = self._requests.popleft()
            gang.propose(key, kind, request, step)

    def _apply_agreed(self, entry: Entry) -> None:
        if entry.kind == KIND_SAVE:
            self._save_index = entry.index
            return
        if entry.message is None:
            return
        if isinstance(entry.message, contract.Checkpoint) and self._preempt_reason is None:
            self._preempt_index = entry.index
        self._apply(entry.message)

    def _gang_horizon(self) -> int:
        # On the gang's watcher thread, after it raised the attention flag: the training thread looks at the
        # pending entries at its next boundary, at step + 1 at the latest.
        return self.global_step + 1

    def _on_gang_entry(self) -> None:
        # On the gang's watcher thread: an entry arrived (or the store was lost).
        self._attention = True
        self._wake.set()

    def _rng_json(self) -> dict[str, Any]:
        return {
            "now": RngState.capture(self._loader_gens).to_json(),
            "epoch_start": self._epoch_rng.to_json() if self._epoch_rng is not None else None,
        }

    def _gang_save(self, gang: Gang, index: int) -> Path | None:
        """The gang's checkpoint of entry ``index``, at this step: rank 0 writes it, with every rank's generator
        states; the others hand theirs over. Returns the path on rank 0."""
        if gang.rank != 0:
            gang.put_rng(index, json.dumps(self._rng_json(), separators=(",", ":")))
            return None
        if self._store is None:
            logger.warning("corral.job: a checkpoint was requested but checkpointing is off (no directory)")
            return None
        self._gang_rngs = {str(r): json.loads(blob) for r, blob in gang.gather_rng(index).items()}
        try:
            return self._save()
        finally:
            self._gang_rngs = None

    def _gang_checkpoint_and_exit(self, gang: Gang, reason: str) -> None:
        """Checkpoint-and-exit of a gang: rank 0 writes the checkpoint and says where; the other ranks wait for it
        (so none reports ``Checkpointed`` before it exists), then every rank reports and exits."""
        index = self._preempt_index
        assert index is not None
        path: Path | None
        if gang.rank == 0:
            try:
                path = self._gang_save(gang, index)
            except BaseException as e:
                gang.publish_checkpoint(index, None, error=f"{type(e).__name__}: {e}")
                raise
            gang.publish_checkpoint(index, str(path) if path is not None else None)
        else:
            self._gang_save(gang, index)
            written = gang.await_checkpoint(index)
            path = Path(written) if written is not None else None
            self.checkpoint_path = path
        self._exit_checkpointed(path, reason)

    # -- signals -----------------------------------------------------------------------------------------------
    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        if os.getpid() != self._pid:
            # A forked child (a DataLoader worker) inherited this handler: let SIGTERM end it as usual.
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        if self._gang is not None:
            self._sigterm = True  # proposed to the gang at the next boundary: every rank exits at the same step
        elif self._preempt_reason is None:
            self._preempt_reason = "SIGTERM"
        self._attention = True

    def request_checkpoint(self, *, exit: bool = True, reason: str = "requested by the script") -> None:
        """At the next boundary, save a checkpoint and, with ``exit`` (the default), exit with
        :data:`~corral.core.contract.EXIT_PREEMPTED` as on ``SIGTERM``. Without ``exit`` the job goes on: a
        periodic checkpoint, e.g. ``if job.global_step % 1000 == 999: job.request_checkpoint(exit=False)``.
        Safe to call from any thread. In a gang, the ranks agree on the step first (a few steps later); calls made by
        several ranks during the same step are one request."""
        if self._gang is not None:
            kind = KIND_DIRECTIVE if exit else KIND_SAVE
            key = f"script:{kind}:{self.global_step}"
            self._requests.append((key, kind, contract.Checkpoint(reason=reason) if exit else None))
            self._attention = True
            return
        if exit:
            if self._preempt_reason is None:
                self._preempt_reason = reason
        else:
            self._save_requested = True
        self._attention = True

    # -- checkpoints -------------------------------------------------------------------------------------------
    def _restore(self) -> None:
        assert self._store is not None
        # The checkpoint prefetch started when corral.job was imported (or when a warm worker was handed the job):
        # taken now, used or not, so that its memory goes with this restore.
        prefetch = claim_prefetch()
        path = self._store.latest()
        if path is None:
            if prefetch is not None:
                logger.warning("corral.job: checkpoint prefetch not used: %s has no checkpoint now", self._store.root)
            return
        meta = read_meta(path)
        try:
            self.global_step = int(meta["step"])
            self.epoch = int(meta["epoch"])
            self.step_in_epoch = int(meta["step_in_epoch"])
            self._epoch_finished = bool(meta["epoch_finished"])
            saved_batch = meta.get("batch_size")
            rng = meta["rng"]
            gang = self.environment.gang
            if gang is not None and gang.rank != 0:
                # rank 0 wrote the checkpoint, its own generator states in "rng", the other ranks' in "ranks"
                mine = (meta.get("ranks") or {}).get(str(gang.rank))
                if mine is not None:
                    rng = mine
                else:
                    logger.warning(
                        "corral.job: %s holds no random generator state for rank %d (written by a gang of %s); "
                        "rank 0's is used",
                        path,
                        gang.rank,
                        meta.get("gang_size", 1),
                    )
            self._pending_rng = RngState.from_json(rng["now"])
            if rng.get("epoch_start") is not None:
                self._resume_epoch_rng = RngState.from_json(rng["epoch_start"])
        except (KeyError, TypeError, ValueError) as e:
            raise CheckpointError(f"{path}: malformed checkpoint metadata: {e!r}") from None
        if saved_batch is not None:
            self.batch_size = int(saved_batch)
        if self._objects:
            saved = prefetch.take(path / STATE_NAME) if prefetch is not None else None
            load_state(path / STATE_NAME, self._objects, saved)
            self.prefetched = saved is not None
        elif prefetch is not None:
            logger.info("corral.job: checkpoint prefetch not used: Job() was given no objects to restore")
        if self._load_hook is not None:
            self._load_hook(path)
        self.start_step = self.global_step
        self.resumed = True
        self.checkpoint_path = path
        if self._verbose:
            print(
                f"corral.job: resumed from {path} at step {self.global_step} "
                f"(epoch {self.epoch}, step {self.step_in_epoch} of the epoch"
                f"{'; state prefetched' if self.prefetched else ''})",
                file=sys.stderr,
                flush=True,
            )

    def _write_checkpoint(self, path: Path) -> None:
        if self._objects:
            save_state(path / STATE_NAME, self._objects)
        if self._save_hook is not None:
            self._save_hook(path)
        meta: dict[str, Any] = {
            "job_id": self.job_id,
            "run": self.run,
            "step": self.global_step,
            "epoch": self.epoch,
            "step_in_epoch": self.step_in_epoch,
            "epoch_finished": self._epoch_finished,
            "batch_size": self.batch_size,
            "saved_at": time.time(),
            "rng": self._rng_json(),
        }
        if self._gang is not None:
            meta["gang_size"] = self._gang.size
            meta["ranks"] = self._gang_rngs or {}  # the other ranks' generator states, by rank
        write_meta(path, meta)

    def _save(self) -> Path | None:
        if self._store is None:
            return None
        path = self._store.save(self._write_checkpoint, step=self.global_step)
        self.checkpoint_path = path
        return path

    def _checkpoint_and_exit(self, reason: str) -> None:
        self._exit_checkpointed(self._save(), reason)

    def _exit_checkpointed(self, path: Path | None, reason: str) -> None:
        """Tell the agent where the checkpoint is (if there is one), close, exit with ``EXIT_PREEMPTED``."""
        if path is not None:
            self._send(contract.Checkpointed(job_id=self.job_id, run=self.run, step=self.global_step, path=str(path)))
            if self._verbose:
                print(
                    f"corral.job: checkpointed step {self.global_step} to {path} ({reason}); "
                    f"exiting with {contract.EXIT_PREEMPTED}",
                    file=sys.stderr,
                    flush=True,
                )
        else:
            print(
                f"corral.job: {reason}: no checkpoint directory ({contract.ENV_CHECKPOINT_DIR} unset), exiting with "
                f"{contract.EXIT_PREEMPTED} without a checkpoint",
                file=sys.stderr,
                flush=True,
            )
        self.close(final_report=False)
        raise SystemExit(contract.EXIT_PREEMPTED)

    # -- lifetime ----------------------------------------------------------------------------------------------
    def close(self, final_report: bool = True) -> None:
        """Send the last report, close the channel, restore the ``SIGTERM`` handler. Idempotent; also run at
        interpreter exit."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        if self._channel is not None:
            if final_report and self._agg_steps:
                self._report(time.perf_counter())
            self._channel.close(flush_timeout_s=_FINAL_FLUSH_S)
        if self._gang is not None:
            self._gang.close()  # rank 0 waits (bounded) for the other ranks to close before its store goes
        if self._sigterm_installed and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._previous_sigterm)
            self._sigterm_installed = False

    def __enter__(self) -> Job:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
