"""``corral submit``: a job from flags, a TOML job file (:func:`load_job_file`) or both.

It prints the job's id, then watches the job for a second (not with ``--no-check``): one that ended in that time
other than finished (a typo in the command, a missing file, a policy's rejection) is said, as ``corral wait`` says
it, and the command exits 1. ``--wait`` waits for the job's end as ``corral wait`` does; ``--test-only`` submits
nothing and says where and when the job would start. A job gets none of the submitter's environment but what
``--env`` and ``--export-env`` (:func:`exported_env`: ``ALL`` or ``NAME[,NAME...]``, as Slurm's ``--export``) give.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from corral.cli import live
from corral.cli.live.common import ENDED_PHASES, _errors, _print_json, make_client, safe, visible
from corral.cli.live.following import WAIT_FAILED, WAIT_INTERRUPTED, _await, _tell_outcome
from corral.cli.live.inspecting import _gpus, _job_class
from corral.cli.options import client_options, json_option
from corral.core import contract
from corral.core.errors import ConfigError
from corral.core.toml import read_toml
from corral.core.wording import start_words
from corral.live.config import ConfigFileError

if TYPE_CHECKING:
    from corral.live.client import Client, JobJson, TestStartJson

SUBMIT_CHECK_S = 1.0  # how long `corral submit` watches a job before it says it was submitted

_JOB_FILE_KEYS = ("command", "tenant", "num_gpus", "gpu_milli", "opportunistic", "name", "cwd", "env", "gpu_mem_mib",
                  "priority", "warm", "expected_duration")  # fmt: skip


def load_job_file(path: Path) -> dict[str, Any]:
    """A job file: TOML with the submission's fields (``command`` a list of strings, or one string split like a
    shell would; ``env`` a table; ``cwd`` relative to the file's folder). Errors name the file and key."""
    import shlex

    file = str(path)
    # A file that cannot be read, is not UTF-8 or is not TOML raises a located TomlError (an InputError).
    data = read_toml(path, what="job file")
    out: dict[str, Any] = {}
    for key, value in data.items():
        if key not in _JOB_FILE_KEYS:
            raise ConfigFileError("unknown key", file=file, column=key, expected=f"one of {', '.join(_JOB_FILE_KEYS)}")
        if key == "command":
            if isinstance(value, str):
                value = shlex.split(value)
            if not isinstance(value, list) or not value or not all(isinstance(a, str) and a for a in value):
                raise ConfigFileError(
                    "bad value",
                    file=file,
                    column=key,
                    expected="a non-empty list of strings (or one string)",
                    got=value,
                )
        elif key in ("tenant", "name", "cwd"):
            if not isinstance(value, str) or not value:
                raise ConfigFileError("bad value", file=file, column=key, expected="a non-empty string", got=value)
            if key == "cwd":
                value = str((path.resolve().parent / value).resolve())
        elif key in ("num_gpus", "gpu_milli", "gpu_mem_mib", "priority"):
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigFileError("bad value", file=file, column=key, expected="an integer", got=value)
        elif key in ("opportunistic", "warm"):
            if not isinstance(value, bool):
                raise ConfigFileError("bad value", file=file, column=key, expected="true or false", got=value)
        elif key == "env" and (not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values())):
            raise ConfigFileError("bad value", file=file, column=key, expected="a table of strings", got=value)
        elif key == "expected_duration":
            value = _span(value, lambda why: ConfigFileError("bad value", file=file, column="expected_duration", **why))
        out[key] = value
    return out


def _span(value: object, error: Callable[[dict[str, Any]], Exception]) -> float:
    """An expected duration: seconds (a number), or a string such as ``"2h"``; ``error`` makes the exception."""
    from corral.live.export import SPAN_FORM, parse_span

    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise error({"expected": SPAN_FORM, "got": value})
    try:
        return parse_span(str(value))
    except ValueError:
        raise error({"expected": SPAN_FORM, "got": value}) from None


def _parse_env(pairs: Sequence[str]) -> dict[str, str]:
    env: dict[str, str] = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq or not key:
            raise click.BadParameter(f"expected KEY=VALUE, got {pair!r}", param_hint="--env")
        env[key] = value
    return env


# What `--export-env ALL` leaves out besides CORRAL_*: variables the agent sets for the job itself (its user's
# HOME, USER and LOGNAME, its GPUs) or that describe the submitter's shell, not the job (its directories). Named
# one by one, they are passed all the same.
_NOT_EXPORTED = frozenset((*contract.USER_ENV, "PWD", "OLDPWD", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER"))


def exported_env(specs: Sequence[str], environ: Mapping[str, str]) -> dict[str, str]:
    """The variables of ``environ`` (the submitter's environment) that ``--export-env`` names: each spec is ``ALL``
    or ``NAME[,NAME...]``. ``ALL`` is every variable but ``CORRAL_*`` (corral's own, the submitter's token among
    them) and :data:`_NOT_EXPORTED`; a name that is not set, or a ``CORRAL_*`` name, is a :class:`ConfigError`."""
    out: dict[str, str] = {}
    for spec in specs:
        for name in (part.strip() for part in spec.split(",")):
            if name == "ALL":
                out.update((k, v) for k, v in environ.items() if not k.startswith("CORRAL_") and k not in _NOT_EXPORTED)
            elif not name or "=" in name:
                raise ConfigError(
                    f"--export-env: expected ALL or NAME[,NAME...], got {spec!r}"
                    + (" (give a value with --env KEY=VALUE)" if "=" in name else "")
                )
            elif name.startswith("CORRAL_"):
                raise ConfigError(
                    f"--export-env: {name} is corral's own (CORRAL_* variables, your token among them, are never "
                    "passed to a job)"
                )
            elif name not in environ:
                raise ConfigError(f"--export-env: {name} is not set in this environment")
            else:
                out[name] = environ[name]
    return out


@click.command(context_settings={"allow_interspersed_args": False})
@click.option("--tenant", help="Tenant to run for (default: your token's; required with the admin token if several).")
@click.option("--gpus", "num_gpus", type=int, help="GPUs the job needs (default 1).")
@click.option("--gpu-milli", type=int, help="Share of one GPU in milli-GPU, 1..1000 (default 1000 = whole).")
@click.option("--opportunistic", is_flag=True, default=None, help="Run on spare GPUs outside the quota (preemptible).")
@click.option("--name", help="A name to show in listings.")
@click.option(
    "--env",
    "env_pairs",
    multiple=True,
    metavar="KEY=VALUE",
    help="An environment variable for the job (repeat); the job does not get yours unless --export-env says so.",
)
@click.option(
    "--export-env",
    "export_specs",
    multiple=True,
    metavar="ALL|NAME[,NAME...]",
    help="Pass these variables of your environment to the job, as Slurm's --export (repeat). ALL: every one but "
    "CORRAL_* and those the job has of its own (HOME, USER, LOGNAME, PWD, OLDPWD, CUDA_VISIBLE_DEVICES, "
    "CUDA_DEVICE_ORDER). --env and the job file's env win over them.",
)
@click.option("--cwd", type=click.Path(file_okay=False), help="Working directory (default: the current one).")
@click.option("--gpu-mem-mib", type=int, help="GPU memory the job needs on each GPU, MiB.")
@click.option("--priority", type=int, help="Priority (higher first, for policies that use it).")
@click.option("--file", "job_file", type=click.Path(dir_okay=False), help="A TOML job file; flags override it.")
@click.option(
    "--expect",
    "expected",
    metavar="DURATION",
    help="How long the job is expected to run (90s, 30m, 12h, 2d): the start-time estimates of the jobs behind it "
    "use it. Nothing stops the job when it runs longer.",
)
@click.option(
    "--test-only",
    is_flag=True,
    help="Submit nothing: say where and when the job would start if it were submitted now (as Slurm's "
    "sbatch --test-only), from a forecast of the queue.",
)
@click.option(
    "--warm",
    is_flag=True,
    default=None,
    help="Start it from the node's warm workers, torch already imported (a server with warm_starts; the command "
    "must be python [-u] SCRIPT ... or python [-u] -m MODULE ...).",
)
@click.option(
    "--wait",
    "wait_end",
    is_flag=True,
    help="Then wait until the job ends, and exit with its outcome as `corral wait` does (--json: the job as it ended).",
)
@click.option(
    "--no-check",
    "no_check",
    is_flag=True,
    help=f"Return at once, without watching the job for {SUBMIT_CHECK_S:g} s (for scripts that submit many).",
)
@json_option
@client_options
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def submit(
    command: tuple[str, ...],
    tenant: str | None,
    num_gpus: int | None,
    gpu_milli: int | None,
    opportunistic: bool | None,
    name: str | None,
    env_pairs: tuple[str, ...],
    export_specs: tuple[str, ...],
    cwd: str | None,
    gpu_mem_mib: int | None,
    priority: int | None,
    job_file: str | None,
    expected: str | None,
    test_only: bool,
    warm: bool | None,
    wait_end: bool,
    no_check: bool,
    as_json: bool,
    **client: Any,
) -> None:
    """Submit a job: corral submit [OPTIONS] -- COMMAND [ARGS]... Prints the job's id, then watches the job for
    one second: if it ended in that time (failed, rejected), says how, as `corral wait` does, and exits 1
    (--json: prints the job as it stood after that second). --wait: waits for the job to end instead.

    The job does not get your environment: it gets the server's PATH, LANG, LANGUAGE, LC_*, TZ and TMPDIR, the
    HOME and USER of the user it runs as, and what --env, --export-env and the job file's env give."""
    with _errors():
        fields = load_job_file(Path(job_file)) if job_file else {}
        given = {
            "command": list(command) or None,
            "tenant": tenant,
            "num_gpus": num_gpus,
            "gpu_milli": gpu_milli,
            "opportunistic": opportunistic,
            "name": name,
            "cwd": str(Path(cwd).resolve()) if cwd else None,
            "gpu_mem_mib": gpu_mem_mib,
            "priority": priority,
            "warm": warm,
            "expected_duration": None
            if expected is None
            else _span(expected, lambda why: click.BadParameter(f"expected {why['expected']}", param_hint="--expect")),
        }
        fields.update({k: v for k, v in given.items() if v is not None})
        # Explicit values win over exported ones: the job file's env, then --env over it.
        env = exported_env(export_specs, os.environ)
        env.update(fields.get("env") or {})
        env.update(_parse_env(env_pairs))
        if not fields.get("command"):
            raise ConfigError("no command: give it after `--` (corral submit -- python train.py), or in --file")
        with make_client(**client) as api:
            body: dict[str, Any] = {
                "tenant": fields.get("tenant"),
                "num_gpus": fields.get("num_gpus", 1),
                "gpu_milli": fields.get("gpu_milli", 1000),
                "opportunistic": bool(fields.get("opportunistic", False)),
                "name": fields.get("name"),
                "cwd": fields.get("cwd") or str(Path.cwd().resolve()),
                "env": env,
                "gpu_mem_mib": fields.get("gpu_mem_mib"),
                "priority": fields.get("priority", 0),
                "warm": bool(fields.get("warm", False)),
                "expected_duration_s": fields.get("expected_duration"),
            }
            if test_only:
                _test_only(api.test_start(fields["command"], **body), as_json)
                return
            job = api.submit(fields["command"], **body)
            if not as_json:
                click.echo(visible(job["job_id"]))
                live.err_console.print(
                    f"submitted job {safe(job['job_id'])} ({_job_class(job)}, {_gpus(job)} GPU, tenant "
                    f"{safe(job['tenant'])}): {safe(job['phase'])}",
                    highlight=False,
                )
            if wait_end:  # with --json, the job as it ended is printed
                _await(api, job["job_id"], None, as_json)
            if not no_check:
                job = _check_submitted(api, job, as_json)
            if as_json:
                _print_json(job)
            if job["phase"] in ENDED_PHASES and job["phase"] != "finished":
                sys.exit(WAIT_FAILED)


def _test_only(found: TestStartJson, as_json: bool) -> None:
    """What ``corral submit --test-only`` prints: where and when the job would start."""
    if as_json:
        _print_json(found)
        return
    now = time.time()
    when = start_words(found["start_s"], found["earliest_s"], found["latest_s"], now)
    where = ""
    if found["gpus"]:
        nodes = ", ".join(safe(n) for n in found["nodes"])
        where = f" on GPU{'s' if len(found['gpus']) > 1 else ''} {','.join(map(str, found['gpus']))} ({nodes})"
    live.console.print(f"would start {when}{where}; nothing was submitted", highlight=False)
    live.console.print(
        "[dim]a forecast of the queue under the server's policy, assuming no other submissions; "
        "see docs/live.md, 'Estimated start times'[/]"
    )


def _check_submitted(api: Client, job: JobJson, as_json: bool) -> JobJson:
    """The job after :data:`SUBMIT_CHECK_S` seconds, or sooner if it ended: a command that fails at once (a typo,
    a missing file) is then seen here, not later in ``corral logs``. If it ended other than finished, says how
    on stderr (stdout keeps the id alone, for ``ID=$(corral submit ...)``), as ``corral wait`` does."""
    from corral.live.client import ClientError

    try:
        job = api.wait(job["job_id"], timeout_s=SUBMIT_CHECK_S)
    except ClientError as e:  # the job was submitted all the same: not a failed submission
        live.err_console.print(f"warning: could not check on job {safe(job['job_id'])}: {safe(e)}", highlight=False)
        return job
    except KeyboardInterrupt:
        if as_json:
            _print_json(job)
        live.err_console.print(f"stopped checking; job {safe(job['job_id'])} goes on", highlight=False)
        sys.exit(WAIT_INTERRUPTED)
    if not as_json and job["phase"] in ENDED_PHASES and job["phase"] != "finished":
        _tell_outcome(api, job, SUBMIT_CHECK_S, err=True)
    return job
