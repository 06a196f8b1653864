"""What the agent told the job through its environment, parsed once (the variables are defined in
:mod:`corral.core.contract`), gang variables included (:class:`GangEnvironment`).

A variable that is absent or empty counts as not set: a job run by hand sees none of them and runs standalone.
A value that cannot be parsed is the agent's bug or a typo in a hand-set variable, so it stops the job at start
with an error that names the variable, rather than being guessed at.

Two variables are the job's own, not the agent's: :data:`ENV_CHECKPOINT_PREFETCH` and
:data:`ENV_CHECKPOINT_PREFETCH_MIN_MIB`, the checkpoint prefetch of :mod:`corral.job.checkpoint` (the user sets them,
with ``corral submit --env`` or by hand).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from corral.core import contract
from corral.core.errors import ConfigError

ENV_CHECKPOINT_PREFETCH = "CORRAL_CHECKPOINT_PREFETCH"
"""Whether a run that resumes from a checkpoint starts reading it in the background as soon as ``corral.job`` is
imported (or, warm-started, as soon as its worker is handed the job), so that the read overlaps the script's own
start-up (:func:`corral.job.prefetch.prefetch_from_env`): ``auto`` (the default when unset) when the checkpoint is
not in the page cache (after a migration, on a node that has not read it), ``1`` whether or not it is, ``0`` never."""
PREFETCH_MODES = ("auto", "1", "0")
DEFAULT_CHECKPOINT_PREFETCH = "auto"
ENV_CHECKPOINT_PREFETCH_MIN_MIB = "CORRAL_CHECKPOINT_PREFETCH_MIN_MIB"
"""The smallest state file (MiB) the prefetch reads ahead (default 64: below that the read takes milliseconds, little
to overlap; 0 prefetches every checkpoint)."""
DEFAULT_CHECKPOINT_PREFETCH_MIN_MIB = 64


def checkpoint_prefetch(env: Mapping[str, str]) -> str:
    """:data:`ENV_CHECKPOINT_PREFETCH` in ``env``: ``"auto"`` (also when unset or empty), ``"1"`` or ``"0"``;
    raises :class:`ConfigError` for any other value."""
    value = env.get(ENV_CHECKPOINT_PREFETCH, "").strip().lower()
    if not value:
        return DEFAULT_CHECKPOINT_PREFETCH
    if value not in PREFETCH_MODES:
        raise ConfigError(
            f"{ENV_CHECKPOINT_PREFETCH}={value!r}: expected auto (when not in the page cache), 1 (always) or 0 (never)"
        )
    return value


def checkpoint_prefetch_min_mib(env: Mapping[str, str]) -> int:
    """:data:`ENV_CHECKPOINT_PREFETCH_MIN_MIB` in ``env`` (unset or empty: the default); raises
    :class:`ConfigError` for anything but an integer >= 0."""
    value = env.get(ENV_CHECKPOINT_PREFETCH_MIN_MIB, "").strip()
    if not value:
        return DEFAULT_CHECKPOINT_PREFETCH_MIN_MIB
    try:
        number = int(value)
    except ValueError:
        number = -1
    if number < 0:
        raise ConfigError(f"{ENV_CHECKPOINT_PREFETCH_MIN_MIB}={value!r}: expected an integer >= 0 (MiB)")
    return number


@dataclass(frozen=True, slots=True)
class GangEnvironment:
    """What a process of a gang across nodes knows of its gang (``contract.GANG_ENV``, and torchrun's
    ``LOCAL_RANK``, ``RANK`` and ``WORLD_SIZE`` where it started the process).

    :mod:`corral.job`'s numbering of the gang's processes (``rank``, 0 to ``size - 1``): a process without
    ``LOCAL_RANK`` is its node's only one, rank ``NODE_RANK`` of ``NNODES`` (what such a script gives
    ``torch.distributed.init_process_group``); a process with ``LOCAL_RANK`` is one of several on its node
    (torchrun's workers, which may differ in number from node to node), rank ``RANK`` of ``WORLD_SIZE`` as torchrun
    numbers them (rank 0 on node 0). Rank 0 hosts the gang store and writes the checkpoints."""

    addr: str
    """Where the gang store listens (``CORRAL_GANG_ADDR``, else ``MASTER_ADDR``)."""
    port: int
    """The gang store's port (``CORRAL_GANG_PORT``)."""
    nnodes: int
    node_rank: int
    local_rank: int | None = None
    """``LOCAL_RANK`` (set by torchrun for each of its workers), or ``None``."""
    global_rank: int | None = None
    """``RANK``, where ``LOCAL_RANK`` is set (torchrun's number of the worker), else ``None``."""
    master_addr: str | None = None
    master_port: int | None = None
    world_size: int | None = None
    """``WORLD_SIZE`` as the process sees it (the agent's: all the gang's GPUs; or torchrun's)."""

    @property
    def rank(self) -> int:
        """This process's number in the gang."""
        return self.global_rank if self.global_rank is not None else self.node_rank

    @property
    def size(self) -> int:
        """How many processes the gang has."""
        if self.global_rank is not None and self.world_size is not None:
            return self.world_size
        return self.nnodes

    @property
    def talks_to_agent(self) -> bool:
        """Whether this process connects to its node's agent: the node's only process, or torchrun's worker of
        ``LOCAL_RANK`` 0 (the others learn the directives through the gang store)."""
        return not self.local_rank

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> GangEnvironment | None:
        """The gang this process belongs to, or ``None`` when ``CORRAL_GANG_PORT`` is not set (a one-node job);
        raises :class:`ConfigError` naming a missing or malformed variable."""

        def text(name: str) -> str | None:
            value = env.get(name, "").strip()
            return value or None

        def integer(name: str, low: int, high: int | None = None, *, required: bool = True) -> int | None:
            value = text(name)
            if value is None:
                if required:
                    because = contract.ENV_LOCAL_RANK if name == contract.ENV_RANK else contract.ENV_GANG_PORT
                    raise ConfigError(f"{name} is not set, but {because} is: a gang needs it")
                return None
            try:
                number = int(value)
            except ValueError:
                raise ConfigError(f"{name}={value!r}: expected an integer") from None
            if number < low or (high is not None and number > high):
                expected = f"from {low} to {high}" if high is not None else f">= {low}"
                raise ConfigError(f"{name}={value!r}: expected an integer {expected}")
            return number

        if text(contract.ENV_GANG_PORT) is None:
            return None
        port = integer(contract.ENV_GANG_PORT, 1, 65535)
        nnodes = integer(contract.ENV_NNODES, 1)
        assert port is not None and nnodes is not None
        node_rank = integer(contract.ENV_NODE_RANK, 0, nnodes - 1)
        assert node_rank is not None
        local_rank = integer(contract.ENV_LOCAL_RANK, 0, required=False)
        world_size = integer(contract.ENV_WORLD_SIZE, 1, required=False)
        global_rank = None
        if local_rank is not None:  # one of several processes of its node: torchrun's numbering
            if world_size is None:
                raise ConfigError(f"{contract.ENV_WORLD_SIZE} is not set, but {contract.ENV_LOCAL_RANK} is")
            global_rank = integer(contract.ENV_RANK, 0, world_size - 1)
        addr = text(contract.ENV_GANG_ADDR) or text(contract.ENV_MASTER_ADDR)
        if addr is None:
            raise ConfigError(
                f"{contract.ENV_GANG_ADDR} (or {contract.ENV_MASTER_ADDR}) is not set, but {contract.ENV_GANG_PORT} "
                "is: a gang needs the address of its store"
            )
        return cls(
            addr=addr,
            port=port,
            nnodes=nnodes,
            node_rank=node_rank,
            local_rank=local_rank,
            global_rank=global_rank,
            master_addr=text(contract.ENV_MASTER_ADDR),
            master_port=integer(contract.ENV_MASTER_PORT, 1, 65535, required=False),
            world_size=world_size,
        )


@dataclass(frozen=True, slots=True)
class JobEnvironment:
    """The contract's environment variables as typed values; ``None`` where a variable is not set."""

    job_id: str = ""
    run: int = 1
    agent_socket: str | None = None
    checkpoint_dir: str | None = None
    gpu_milli: int | None = None
    gpu_mem_mib: int | None = None
    stand_in: bool = False
    gpus: tuple[str, ...] = ()
    grace_s: float = contract.DEFAULT_GRACE_S
    report_interval_s: float = contract.DEFAULT_REPORT_INTERVAL_S
    gang: GangEnvironment | None = None
    """The gang across nodes this process belongs to; ``None`` for a one-node job."""
    checkpoint_prefetch: str = DEFAULT_CHECKPOINT_PREFETCH
    """When the checkpoint is read ahead: ``auto``, ``1`` or ``0`` (:data:`ENV_CHECKPOINT_PREFETCH`)."""
    checkpoint_prefetch_min_mib: int = DEFAULT_CHECKPOINT_PREFETCH_MIN_MIB
    """The smallest state file it reads ahead (:data:`ENV_CHECKPOINT_PREFETCH_MIN_MIB`)."""

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> JobEnvironment:
        """Parse ``env`` (normally ``os.environ``); raises :class:`ConfigError` naming a malformed variable."""

        def text(name: str) -> str | None:
            value = env.get(name, "").strip()
            return value or None

        def integer(name: str, minimum: int) -> int | None:
            value = text(name)
            if value is None:
                return None
            try:
                number = int(value)
            except ValueError:
                raise ConfigError(f"{name}={value!r}: expected an integer") from None
            if number < minimum:
                raise ConfigError(f"{name}={value!r}: expected an integer >= {minimum}")
            return number

        def seconds(name: str, default: float) -> float:
            value = text(name)
            if value is None:
                return default
            try:
                number = float(value)
            except ValueError:
                raise ConfigError(f"{name}={value!r}: expected a number of seconds") from None
            if not number >= 0 or number == float("inf"):  # also rejects NaN
                raise ConfigError(f"{name}={value!r}: expected a finite number of seconds >= 0")
            return number

        run = integer(contract.ENV_RUN, 1)
        gpus = text(contract.ENV_GPUS)
        return cls(
            job_id=text(contract.ENV_JOB_ID) or "",
            run=1 if run is None else run,
            agent_socket=text(contract.ENV_AGENT_SOCKET),
            checkpoint_dir=text(contract.ENV_CHECKPOINT_DIR),
            gpu_milli=integer(contract.ENV_GPU_MILLI, 0),
            gpu_mem_mib=integer(contract.ENV_GPU_MEM_MIB, 0),
            stand_in=text(contract.ENV_STAND_IN) == "1",
            gpus=tuple(g.strip() for g in gpus.split(",") if g.strip()) if gpus else (),
            grace_s=seconds(contract.ENV_GRACE_S, contract.DEFAULT_GRACE_S),
            report_interval_s=seconds(contract.ENV_REPORT_INTERVAL_S, contract.DEFAULT_REPORT_INTERVAL_S),
            gang=GangEnvironment.from_env(env),
            checkpoint_prefetch=checkpoint_prefetch(env),
            checkpoint_prefetch_min_mib=checkpoint_prefetch_min_mib(env),
        )
