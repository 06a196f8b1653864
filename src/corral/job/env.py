"""What the agent told the job through its environment, parsed once (the variables are defined in
:mod:`corral.core.contract`).

A variable that is absent or empty counts as not set: a job run by hand sees none of them and runs standalone.
A value that cannot be parsed is the agent's bug or a typo in a hand-set variable, so it stops the job at start
with an error that names the variable, rather than being guessed at.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from corral.core import contract
from corral.core.errors import ConfigError


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
        )
