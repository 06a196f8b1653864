"""The job-side library: what a training script imports to run under corral (live mode).

It wraps the script's training loop so that every step ends at a *boundary* where the library measures the
step, reports to the node's agent, and obeys the scheduler's directives: pause, resume, checkpoint and exit, a new
batch size, new GPU limits. The same script runs unchanged without a scheduler. The environment variables,
exit codes and messages it exchanges with the agent are defined in :mod:`corral.core.contract`.

Using it
--------
::

    import corral.job

    model, optimizer, scheduler = ...
    with corral.job.Job(model=model, optimizer=optimizer, scheduler=scheduler) as job:
        for epoch in job.epochs(10):               # starts at the checkpoint's epoch when resumed
            for x, y in job.loop(loader):          # each next() is a step boundary; resumes mid-epoch
                loss = ...; loss.backward(); optimizer.step(); optimizer.zero_grad()
            scheduler.step()

    # no per-epoch code:            for batch in job.loop(loader, epochs=10): ...
    # a loop of the script's own:   while ...:
    #                                   with job.step(): ...   # entering the block is the boundary

    # steps that fit a GPU memory cap (the degradation ladder of corral.job.memory):
            for x, y in job.loop(loader):
                loss = job.train_step((x, y), lambda b: loss_fn(model(b[0]), b[1]))  # zero_grad, backward, step

``Job()`` reads the contract's environment. Without ``CORRAL_AGENT_SOCKET`` it runs *standalone*: no socket,
no reports, no directives, but still checkpoint and resume when ``CORRAL_CHECKPOINT_DIR`` (or
``Job(checkpoint_dir=...)``) is set. What the script can read: ``job.global_step`` (steps done over all runs),
``job.start_step`` (where this run started), ``job.epoch``, ``job.step_in_epoch``, ``job.resumed``,
``job.batch_size``, ``job.gpu_milli``, ``job.mem_limit_mib``, ``job.mem_cap_mib``, ``job.mem_mode``, ``job.prefetched``,
``job.duty_cycle``, ``job.standalone``, ``job.connected``. Use one
:meth:`Job.loop` (or :meth:`Job.step`) at a time, and call ``job.close()`` (or use ``with``) at the end; it also
runs at interpreter exit.

At each boundary
----------------
The step's wall time (``time.perf_counter``) and busy time (CUDA events on a GPU, the wall time on a CPU) are
added to an aggregate; once per ``CORRAL_REPORT_INTERVAL_S`` a :class:`~corral.core.contract.StepReport` goes to
the agent with the mean step time (idle of the duty cycle included), the mean busy time, the peak GPU memory the
CUDA caching allocator reserved over those steps (0 on a CPU), the cap in force, the batch size, and, for steps run
through :meth:`Job.train_step`, the memory need with no degradation and the ladder's rung. Measurement and
everything CUDA-specific is behind a seam (:mod:`corral.job.device`). Directives are received by a background
thread and *applied* only at a boundary, by the training thread:

``Pause``
    Send ``Paused``, wait at the boundary (GPU memory kept) until ``Resume`` (then send ``Resumed``) or
    ``Checkpoint``. With ``evict``: first move the model's parameters, buffers and gradients and the optimizer's
    state to pinned host memory and empty the CUDA cache (``Paused`` says ``evicted`` and how long it took); on
    ``Resume`` copy them back into the same ``Parameter`` objects, bit for bit (``Resumed.took_s``). Needs
    ``Job(model=..., optimizer=...)``; without them the pause keeps GPU memory and says so.
``Resume``
    End a pause.
``Checkpoint``
    Save a checkpoint, send ``Checkpointed``, exit with :data:`~corral.core.contract.EXIT_PREEMPTED` (75) by
    raising ``SystemExit``, so the script's ``finally`` blocks and ``with`` exits run. Without a checkpoint
    directory the job exits with 75 without saving (it will start over).
``SetBatchSize``
    Call ``Job(on_batch_size=...)`` with the new size; the hook applies it (e.g. from the next epoch) and
    returns the batch size now in use (``None`` meaning the new one), which ``job.batch_size`` records and reports
    carry. Without a hook the request is logged and ignored.
``SetLimits``
    A compute share ``gpu_milli`` (``job.gpu_milli``) and a memory cap ``mem_mib`` (``job.mem_limit_mib``), as
    AntMan scales a job (OSDI'20 §3). A share between 0 and 1000 is a duty cycle (:mod:`corral.job.throttle`):
    after each step the job idles so that busy / (busy + idle) equals the share, the busy time measured with
    CUDA events. A share of 0 pauses the job as ``Pause`` does (memory kept, ``Paused``/``Resumed`` sent) until a
    later ``SetLimits`` gives a share above 0; ``Resume`` alone does not end such a pause. The memory cap goes to
    the CUDA caching allocator (``torch.cuda.set_per_process_memory_fraction``, then ``empty_cache``; applied
    once the script has initialised CUDA; ``job.mem_cap_mib`` is the cap in force) and to the memory ladder of
    :meth:`Job.train_step` (:mod:`corral.job.memory`): a step that would not fit is run again with
    micro-batches and gradient accumulation, then with activations and then the optimizer state in host memory,
    and climbs back when the cap grows. A script that runs its own backward pass instead gets the allocator's
    limit only: past it, PyTorch raises ``torch.OutOfMemoryError``.
``SIGTERM``
    (when running under an agent or with a checkpoint directory; installed from the main thread, restored by
    ``close``) does what ``Checkpoint`` does, at the next boundary. ``Ctrl-C`` stays a plain
    ``KeyboardInterrupt``. ``job.request_checkpoint()`` asks the same from the script;
    ``job.request_checkpoint(exit=False)`` saves at the next boundary and goes on.

Steps in ``StepReport``, ``Paused`` and ``Resumed`` count this run's steps, as the contract says;
``Checkpointed.step`` is the global step the checkpoint holds.

The agent connection is made on a background thread: ``Hello`` first (and ``Paused`` again if the job is
paused), and if the agent is unreachable or the connection breaks (the controller restarted), training goes on
and the thread tries again every few seconds. Reports are dropped, never queued without bound, when the agent
does not read them; the training thread never waits on the socket.

Gangs across nodes
------------------
A rank of a gang (the agent set ``CORRAL_GANG_PORT`` and the other variables of
:func:`corral.core.contract.gang_env`) uses ``Job`` as any job does; ``job.gang`` says its ``rank`` and ``size``
(with one process per node, what ``torch.distributed.init_process_group`` wants; under torchrun, torchrun's own
``RANK`` applies). Directives, ``SIGTERM`` and ``request_checkpoint`` are agreed among the ranks and applied by all
at the same step (:mod:`corral.job.gang`), so that no rank pauses or exits inside a collective the others wait in;
the per-step cost is the same. Rank 0 writes the checkpoints (only its ``save`` hook runs), with every rank's
random generator states; every rank loads them (each its own generators; every ``load`` hook runs). The model and
optimizer state must be the same on every rank, as DDP keeps them (a sharded state needs the script's own hooks).
Under torchrun only the worker with ``LOCAL_RANK`` 0 talks to the agent. A rank that cannot reach the gang, or
that the others stop answering, raises :class:`GangError`.

Checkpoint and resume
---------------------
A checkpoint is written when the job is asked to stop (or by ``request_checkpoint``), atomically, into
``CORRAL_CHECKPOINT_DIR``, keeping only the latest (layout in :mod:`corral.job.checkpoint`). ``Job()`` loads the
latest checkpoint when one exists, before the script's loop begins. Two ways to say what to save, combinable:

- the helper, ``Job(model=..., optimizer=..., scheduler=..., state={"scaler": scaler})``: each object's
  ``state_dict()``, restored with ``load_state_dict()`` (tensors loaded to the CPU with ``weights_only=True``,
  then copied to where the object's own are);
- the script's hooks ``Job(save=fn, load=fn)``, each called with the checkpoint directory (names starting with
  ``corral`` are the library's).

The library itself always saves the data position (epoch, batches consumed in it, global step), the batch size
in use, and the random generators: Python's ``random``, NumPy's global generator (if the script imported NumPy),
torch's CPU and CUDA generators (if it imported torch), and the loader's own ``torch.Generator`` if it has one.

Resume is **bit-exact** with :meth:`Job.loop` over a ``DataLoader`` (shuffled or not): the generators' state at
the start of the interrupted epoch is restored before that epoch's iterator is made, so the sampler draws the
same order; the batches already consumed are skipped (a single-process loader over a map-style dataset skips
indices without loading data; otherwise the batches are loaded and discarded); then the generators' state at the
checkpoint is restored, for dropout and the like. Bit-exactness also needs deterministic kernels (true on the
CPU; on a GPU see ``torch.use_deterministic_algorithms``). Limits:

- Worker processes (``num_workers > 0``) are fine, the sampler runs in the main process and the workers' seeds
  come from the restored generators; but with ``persistent_workers=True`` the workers' seeds are drawn once per
  run, so randomness *inside* workers (random augmentation) differs after a resume.
- An ``IterableDataset``, a generator or a stream has no position to restore: the library re-creates the
  iterator and discards the consumed batches, which is exact only if iterating again yields the same items
  (a one-shot stream is not rewound).
- With :meth:`Job.step` the data position is the script's: skip ``job.start_step`` steps of its own data.
- Generators the script creates itself (``numpy.random.default_rng()``, its own ``torch.Generator``) and any
  state kept outside the saved objects are the script's to save, in its hooks.
- A batch size changed in the middle of an epoch breaks the batch count of that epoch's position; apply new
  batch sizes from the next epoch (as ``examples/train_mlp.py`` does).
- A finished job's last checkpoint is left in place: running the same command again with the same directory
  resumes from it.

Checkpoint prefetch: when ``corral.job`` is imported (a warm-started run: as soon as its worker is handed the job)
with ``CORRAL_CHECKPOINT_DIR`` holding a checkpoint whose state file is at least 64 MiB
(``CORRAL_CHECKPOINT_PREFETCH_MIN_MIB``) and, by default (``CORRAL_CHECKPOINT_PREFETCH=auto``), not in the page
cache (``1``: whether it is or not; ``0``: never), a background thread starts reading that state into host memory
(pinned memory where CUDA is available and the job sees one GPU), without holding the interpreter lock while it
reads, so that the read overlaps the script's own start-up (its imports, building the model). ``Job()``'s restore
uses it if the file is still the one read, else reads the file as it would have, after a line in the log that
says why; the result is the same either way (``job.prefetched`` says which). A script that passes
``Job(checkpoint_dir=...)`` may call :func:`prefetch_checkpoint` itself, before building its model. See
:class:`corral.job.prefetch.Prefetch`.
"""

import os as _os

from corral.job.checkpoint import CheckpointError, CheckpointStore, Stateful
from corral.job.device import Device, SimulatedDevice, TorchDevice
from corral.job.env import GangEnvironment, JobEnvironment
from corral.job.gang import GangError
from corral.job.loop import Job
from corral.job.memory import Rung
from corral.job.prefetch import prefetch_checkpoint, prefetch_from_env
from corral.job.throttle import DutyCycle

__all__ = [
    "CheckpointError",
    "CheckpointStore",
    "Device",
    "DutyCycle",
    "GangEnvironment",
    "GangError",
    "Job",
    "JobEnvironment",
    "Rung",
    "SimulatedDevice",
    "Stateful",
    "TorchDevice",
    "prefetch_checkpoint",
]

# As early as a run can: the checkpoint it resumes from is read while the script goes on importing and building.
prefetch_from_env(_os.environ)
