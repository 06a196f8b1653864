"""The live commands of ``corral``: run the server, and talk to it.

- ``corral serve``: the controller and its HTTP API in the foreground (Ctrl-C or SIGTERM stops it; job processes
  keep running and are taken back on the next start).
- ``corral submit``, ``jobs``, ``job``, ``logs``, ``wait``, ``cancel``, ``tenants``, and ``cluster`` without a
  SPEC: clients of the API.

The client commands find the server by ``--url``/``CORRAL_URL`` and the token by ``--token``/``CORRAL_TOKEN``;
whichever is not given comes from the files ``corral serve`` keeps in its state directory (``--state-dir``/
``CORRAL_STATE_DIR``, default ``.corral``): ``server.json`` and ``admin.token``. Every read command takes
``--json`` for scripts. Errors are one ``error:`` line and exit status 2, as in the rest of the CLI.

Text that users wrote (job names, commands, environment, reasons, event details, tenant names) is shown with
its control characters made visible (``\x1b``, ``\n``, ``\u202e``), never sent raw: a tenant's job name must
not be able to move the admin's cursor, recolour the screen, set the terminal's title or reorder a line.
``corral logs`` is the exception: it prints the job's own output as the job wrote it.

``corral jobs`` reads one page (50 jobs unless ``--limit``), says how many match in all, and prints the
``--cursor`` of the next page. Its default view (the active jobs) also shows the jobs that failed or were
rejected in the last 10 minutes, in a table of their own: a job that fails at once is otherwise never seen there.

``corral submit`` prints the job's id, then watches the job for a second (not with ``--no-check``): one that
ended in that time other than finished (a typo in the command, a missing file, a policy's rejection) is said, as
``corral wait`` says it, and the command exits 1. A job gets none of the submitter's environment but what
``--env`` and ``--export-env`` (``ALL`` or ``NAME[,NAME...]``, as Slurm's ``--export``) give.

``corral wait ID`` and ``corral submit --wait`` block until the job ends and exit with its outcome, so that a
script can chain jobs: 0 finished; 1 failed, cancelled or rejected; 124 ``--timeout`` ran out (as ``timeout(1)``);
130 Ctrl-C, which leaves the job alone. Errors stay 2.

Heavy imports (FastAPI, uvicorn, the controller, httpx) happen inside the commands, so ``corral simulate`` does not
pay for them.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import queue
import signal
import socket
import sys
import threading
import time
import unicodedata
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from corral.cli.errors import user_errors
from corral.cli.options import client_options, json_option
from corral.core import contract
from corral.core.errors import ConfigError
from corral.core.toml import read_toml
from corral.core.wording import duration, start_words
from corral.live.config import DEFAULT_STATE_DIR, ConfigFileError

if TYPE_CHECKING:
    from corral.live.client import Client, ClusterJson, JobJson, TenantJson, TestStartJson, WhatifJson
    from corral.live.config import ServeConfig
    from corral.live.records import ClusterSnapshot

console = Console()
err_console = Console(stderr=True)

F = TypeVar("F", bound=Callable[..., Any])

ACTIVE_PHASES = ("pending", "running")
ENDED_PHASES = ("finished", "failed", "cancelled", "rejected")
FAILED_PHASES = ("failed", "rejected")  # ended without anyone asking: what `corral jobs` shows next to the active
SUBMIT_CHECK_S = 1.0  # how long `corral submit` watches a job before it says it was submitted
RECENT_FAILURES_S = 600  # failures `corral jobs` shows: those that ended this recently
RECENT_FAILURES_SCAN = 200  # the failed jobs it reads for them, newest submitted first (the API has no end filter)
FOLLOW_POLL_S = 0.5
DEFAULT_PAGE = 50  # jobs `corral jobs` shows unless --limit says otherwise
WAIT_FAILED = 1  # `corral wait`: the job failed, was cancelled or rejected
WAIT_TIMED_OUT = 124  # --timeout ran out, as timeout(1) says it
WAIT_INTERRUPTED = 130  # Ctrl-C: 128 + SIGINT, as a shell reports it
LOG_TAIL_LINES = 10  # the lines of a failed job's log that `corral wait` shows
LOG_TAIL_BYTES = 16 * 1024  # where it looks for them: the log's end, however long the log
EVENT_BACKLOG = 10_000  # turns of job events `corral serve` holds for printing before it drops some
_PHASE_STYLE = {
    "pending": "yellow",
    "running": "green",
    "finished": "blue",
    "failed": "red",
    "cancelled": "magenta",
    "rejected": "red",
}


# Shown as escapes: C0 and C1 controls (ESC starts the terminal's sequences), DEL, format characters (the
# bidirectional overrides reorder what follows them; zero-width ones hide text), surrogates, line and paragraph
# separators. Everything else printable, spaces of every script included, is shown as it is.
_HIDDEN_CATEGORIES = frozenset(("Cc", "Cf", "Cs", "Zl", "Zp"))
_NAMED_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def visible(text: str) -> str:
    """``text`` with every control character written as an escape (``\x1b``, ``\n``, ``\u202e``), so that
    printing it cannot move the cursor, change colours, set the terminal's title or reorder the line."""
    if text.isprintable():  # the usual case, at C speed
        return text
    out = []
    for ch in text:
        if unicodedata.category(ch) in _HIDDEN_CATEGORIES:
            code = ord(ch)
            out.append(
                _NAMED_ESCAPES.get(ch)
                or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
            )
        else:
            out.append(ch)
    return "".join(out)


def safe(text: object) -> str:
    """User text for rich markup: control characters made visible (:func:`visible`), markup escaped."""
    return escape(visible(str(text)))


def _errors() -> AbstractContextManager[None]:
    # The message may quote what a user (another tenant) wrote: shown, never obeyed.
    return user_errors(err_console, safe)


# ==============================================================================================================
# corral serve
# ==============================================================================================================
def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _listen(host: str, port: int) -> socket.socket:
    """Bind the API's socket now, so that a busy port is a clear error before anything starts."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise ConfigError(f"--host {host}: cannot resolve it ({e.strerror})") from None
    family, kind, proto, _name, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError as e:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {e.strerror or e} (choose another with --port)") from None
    sock.set_inheritable(False)
    return sock


@contextmanager
def _state_lock(state_dir: Path) -> Iterator[None]:
    """One server per state directory: two controllers on one database would start every job twice."""
    import fcntl

    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = state_dir / "server.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise ConfigError(
                f"another corral server uses the state directory {state_dir} (see {state_dir / 'server.json'}); "
                "stop it first, or give another --state-dir"
            ) from None
        yield
    finally:
        os.close(fd)


class _Stop(Exception):
    """SIGTERM (or SIGINT outside uvicorn's own handling): stop cleanly."""


def _raise_stop(signum: int, frame: FrameType | None) -> None:
    raise _Stop(signal.Signals(signum).name)


def _gpus_words(snapshot: ClusterSnapshot) -> str:
    gpus = snapshot.gpus
    if gpus and all(g.stand_in for g in gpus):
        return click.style(f"{len(gpus)} STAND-IN GPUs (no real GPU: jobs run on the CPU)", fg="yellow", bold=True)
    counts: dict[str, int] = {}
    for g in gpus:
        counts[g.type_name] = counts.get(g.type_name, 0) + 1
    kinds = ", ".join(f"{n}x {t}" for t, n in counts.items())
    return f"{len(gpus)} GPUs ({kinds})"


@click.command()
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    help="A TOML file: [server] and [[tenants]] (see corral.live.config). Flags override it.",
)
@click.option("--gpus", type=int, help="Declare N stand-in GPUs (jobs run on the CPU); default: the real GPUs (NVML).")
@click.option("--policy", "policy", metavar="SPEC", help="Scheduling policy, as in simulate (default fifo).")
@click.option("--host", help="Address to listen on (default 127.0.0.1; another must be given here explicitly).")
@click.option("--port", type=int, help="Port to listen on (default 8473).")
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False),
    help=f"Where the database, logs, checkpoints and tokens live (default ./{DEFAULT_STATE_DIR}).",
)
@click.option("--grace", "grace_s", type=float, help="Seconds a preempted job has to checkpoint and exit (default 30).")
@click.option(
    "--ray",
    "ray",
    metavar="auto|ADDRESS|local:NxG",
    help="Schedule the GPU nodes of a Ray cluster (pip install 'corral[ray]'): join one (auto, or its address), "
    "or start N local nodes of G stand-in GPUs for trying multi-node on one machine.",
)
@click.option(
    "--ray-expect",
    "ray_expect",
    multiple=True,
    metavar="NAME:GPUS[:TYPE]",
    help="With --ray: a node that may join later (its corral.node label, GPU count, GPU type); it counts as lost "
    "until it is alive, then its GPUs are used. Repeat for several.",
)
@click.option(
    "--checkpoint-dir",
    type=click.Path(file_okay=False),
    help="With --ray: a directory every node shares, for checkpoints (default STATE_DIR/checkpoints).",
)
@click.option("--quiet", is_flag=True, help="Do not print a line per job event (launched, preempted, finished, ...).")
def serve(
    config_path: str | None,
    gpus: int | None,
    policy: str | None,
    host: str | None,
    port: int | None,
    state_dir: str | None,
    grace_s: float | None,
    ray: str | None,
    ray_expect: tuple[str, ...],
    checkpoint_dir: str | None,
    quiet: bool,
) -> None:
    """Run the live scheduler and its HTTP API in the foreground (Ctrl-C stops it; jobs keep running). Prints a
    line per job event (submitted, launched, preempted, paused, resized, finished, failed, ...) unless --quiet."""
    with _errors():
        from corral.live.config import ensure_admin_token, load_config

        config = load_config(
            Path(config_path) if config_path else None,
            gpus=gpus,
            policy=policy,
            host=host,
            port=port,
            state_dir=state_dir,
            grace_s=grace_s,
            ray=ray,
            ray_expect=ray_expect,
            checkpoint_dir=checkpoint_dir,
        )
        if host is None and not _is_loopback(config.host):
            raise ConfigError(
                f"{config_path}: server.host = {config.host!r} exposes the API beyond this machine; "
                f"pass --host {config.host} to confirm"
            )
        logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        with _state_lock(config.state_dir):
            token_given = config.admin_token is not None
            config = ensure_admin_token(config)
            sock = _listen(config.host, config.port)
            previous = {sig: signal.signal(sig, _raise_stop) for sig in (signal.SIGTERM, signal.SIGINT)}
            try:
                _serve(config, sock, token_given, quiet)
            except (_Stop, KeyboardInterrupt):
                pass
            finally:
                sock.close()
                for sig, handler in previous.items():
                    signal.signal(sig, handler)
        err_console.print("corral stopped (job processes keep running; the next `corral serve` takes them back)")


def _serve(config: ServeConfig, sock: socket.socket, token_given: bool, quiet: bool) -> None:
    from corral.live.server import serve
    from corral.live.store import JobEvent

    # The controller's loop hands each turn's events over and goes on; a thread of its own prints them, so that a
    # terminal or pipe that does not keep up never holds the scheduler back (past EVENT_BACKLOG lines, it drops
    # them and says how many).
    lines: queue.Queue[list[JobEvent]] = queue.Queue(maxsize=EVENT_BACKLOG)
    dropped = [0]

    def events(batch: list[JobEvent]) -> None:
        try:
            lines.put_nowait(batch)
        except queue.Full:
            dropped[0] += len(batch)

    def printer() -> None:
        while True:
            batch = lines.get()
            if dropped[0]:
                click.echo(f"({dropped[0]} job events not printed: the output did not keep up)", color=None)
                dropped[0] = 0
            for e in batch:
                stamp = time.strftime("%H:%M:%S", time.localtime(e.time_s))
                click.echo(f"{stamp} {e.job_id} {e.kind}" + (f": {e.detail}" if e.detail else ""), color=None)
            sys.stdout.flush()

    if not quiet:
        threading.Thread(target=printer, name="corral-events", daemon=True).start()

    def ready(snapshot: ClusterSnapshot) -> None:
        where = "from the configuration" if token_given else str(config.admin_token_path)
        click.echo(
            f"corral serving {config.url} | policy {snapshot.policy} | {_gpus_words(snapshot)} | "
            f"{len(config.tenants)} tenant(s) | admin token: {where}",
            color=None,
        )
        sys.stdout.flush()

    serve(config, sock, ready, None if quiet else events)


# ==============================================================================================================
# Client commands
# ==============================================================================================================
def make_client(url: str | None, token: str | None, client_state_dir: str | None) -> Client:
    from corral.live.client import Client, read_admin_token, read_server_url

    state = Path(client_state_dir or DEFAULT_STATE_DIR)
    if url is None:
        url = read_server_url(state)
    if token is None:
        token = read_admin_token(state)
    return Client(url, token)


def _print_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2))


# -- submit -----------------------------------------------------------------------------------------------------
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
                err_console.print(
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
    console.print(f"would start {when}{where}; nothing was submitted", highlight=False)
    console.print(
        "[dim]a forecast of the queue under the server's policy, assuming no other submissions; "
        "see docs/live.md, 'Estimated start times'[/]"
    )


def _estimate(job: JobJson, now: float) -> str | None:
    """A pending job's estimated start in words, if the server made one."""
    e = job.get("estimated_start")
    if job["phase"] != "pending" or not e:
        return None
    return start_words(e["start_s"], e["earliest_s"], e["latest_s"], now)


def _check_submitted(api: Client, job: JobJson, as_json: bool) -> JobJson:
    """The job after :data:`SUBMIT_CHECK_S` seconds, or sooner if it ended: a command that fails at once (a typo,
    a missing file) is then seen here, not later in ``corral logs``. If it ended other than finished, says how
    on stderr (stdout keeps the id alone, for ``ID=$(corral submit ...)``), as ``corral wait`` does."""
    from corral.live.client import ClientError

    try:
        job = api.wait(job["job_id"], timeout_s=SUBMIT_CHECK_S)
    except ClientError as e:  # the job was submitted all the same: not a failed submission
        err_console.print(f"warning: could not check on job {safe(job['job_id'])}: {safe(e)}", highlight=False)
        return job
    except KeyboardInterrupt:
        if as_json:
            _print_json(job)
        err_console.print(f"stopped checking; job {safe(job['job_id'])} goes on", highlight=False)
        sys.exit(WAIT_INTERRUPTED)
    if not as_json and job["phase"] in ENDED_PHASES and job["phase"] != "finished":
        _tell_outcome(api, job, SUBMIT_CHECK_S, err=True)
    return job


# -- listing and details ----------------------------------------------------------------------------------------
def _gpus(job: JobJson) -> str:
    if job["gpu_milli"] == 1000:
        return str(job["num_gpus"])
    return f"{job['gpu_milli'] / 1000:g}"


def _job_class(job: JobJson) -> str:
    return "opportunistic" if job["job_class"] == "opportunistic" else "guaranteed"


def _runtime_s(job: JobJson, now: float) -> float:
    held = job["executed_s"]
    if job["phase"] == "running" and job["last_start_s"] is not None:
        held += max(0.0, now - job["last_start_s"])
    return held


def _queued_s(job: JobJson, now: float) -> float:
    """Seconds the job has waited, across preemptions: while it is pending, the wait it is in counts up to ``now``
    (a server without ``queued_since_s`` gives the ended waits only)."""
    waited = job["queued_s"]
    since = job.get("queued_since_s")
    if job["phase"] == "pending" and since is not None:
        waited += max(0.0, now - since)
    return waited


def _placement(job: JobJson) -> str:
    p = job["placement"]
    if p is None:
        why = job.get("wait_reason")
        return safe(why) if job["phase"] == "pending" and why else "-"
    gpus = ",".join(map(str, p["gpus"]))
    share = "" if p["gpu_milli"] == 1000 else f" @{p['gpu_milli']}m"
    return f"GPU {gpus}{share}{' (opp)' if p['opportunistic'] else ''}"


def _ranks(job: JobJson, snap: ClusterJson | None) -> str:
    """Where each rank of a job runs, with several nodes: ``rank 0: node0 GPUs 0,1; rank 1: node1 GPUs 2,3``
    (ranks by node order, as the gang environment numbers them)."""
    p = job["placement"]
    if p is None or snap is None or len(snap["nodes"]) < 2:
        return ""
    nodes = [n["name"] for n in snap["nodes"]]
    by_node: dict[str, list[int]] = {}
    for g in p["gpus"]:
        by_node.setdefault(snap["gpus"][g]["node"], []).append(g)
    ranked = sorted(by_node.items(), key=lambda kv: nodes.index(kv[0]) if kv[0] in nodes else len(nodes))
    return "; ".join(f"rank {r}: {safe(node)} GPUs {','.join(map(str, gpus))}" for r, (node, gpus) in enumerate(ranked))


def _job_phase(job: JobJson) -> str:
    """The job's phase, styled; a pending job whose state waits in host memory shows as suspended."""
    if job["phase"] == "pending" and job.get("suspended_on"):
        return "[yellow]suspended[/]"
    return _phase(job["phase"])


def _phase(phase: str) -> str:
    style = _PHASE_STYLE.get(phase)
    return f"[{style}]{phase}[/]" if style else safe(phase)


def _when(t: float | None) -> str:
    return "-" if t is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


@click.command()
@click.option("--tenant", help="Only this tenant's jobs.")
@click.option(
    "--phase", "phases", multiple=True, help="Only jobs in this phase (repeat): pending, running, finished, ..."
)
@click.option(
    "--all",
    "show_all",
    is_flag=True,
    help="Every job, ended ones too (default: pending and running, then those that failed or were rejected in the "
    f"last {RECENT_FAILURES_S // 60} minutes).",
)
@click.option(
    "--limit",
    type=click.IntRange(min=1, max=1000),
    default=DEFAULT_PAGE,
    show_default=True,
    help="Jobs in the page shown.",
)
@click.option("--cursor", help="Start where the page before ended (the cursor it printed).")
@click.option("--newest", is_flag=True, help="Newest first (default: in submission order, oldest first).")
@json_option
@client_options
def jobs(
    tenant: str | None,
    phases: tuple[str, ...],
    show_all: bool,
    limit: int,
    cursor: str | None,
    newest: bool,
    as_json: bool,
    **client: Any,
) -> None:
    """List jobs (by default the pending and running ones, then those that failed or were rejected in the last
    10 minutes), a page at a time."""
    with _errors():
        wanted: Sequence[str] | None = phases or (None if show_all else ACTIVE_PHASES)
        # The default view also shows what failed lately: a job that fails at once is never pending or running
        # long enough to be seen there.
        recent = not phases and not show_all and cursor is None and not as_json
        with make_client(**client) as api:
            page = api.jobs_page(tenant=tenant, phases=wanted, limit=limit, cursor=cursor, newest_first=newest)
            now = time.time()
            failures = _recent_failures(api, tenant, now) if recent else []
        if as_json:
            _print_json(page)
            return
        found = page["jobs"]
        what = "all jobs" if wanted is None else f"{', '.join(safe(w) for w in wanted)} jobs"
        shown = f"{page['total']:,}" if len(found) == page["total"] else f"{len(found):,} of {page['total']:,}"
        table = Table(title=f"{what}: {shown}{' (newest first)' if newest else ''}")
        starts = [_estimate(job, now) for job in found]
        estimated = any(starts)  # a column only when the server has estimated some (docs/live.md)
        for col, justify in (("id", "left"), ("name", "left"), ("tenant", "left"), ("class", "left"),
                             ("GPUs", "right"), ("phase", "left"), ("placement", "left"), ("queued", "right"),
                             ("runtime", "right"), ("preempted", "right")):  # fmt: skip
            table.add_column(col, justify=justify)  # type: ignore[arg-type]
        if estimated:
            table.add_column("est. start")
        for job, start in zip(found, starts, strict=True):
            table.add_row(
                safe(job["job_id"]),
                safe(job["name"] or ""),
                safe(job["tenant"]),
                "opp" if _job_class(job) == "opportunistic" else "guar",
                _gpus(job),
                _job_phase(job),
                _placement(job),
                duration(_queued_s(job, now)),
                duration(_runtime_s(job, now)),
                str(job["preemptions"]),
                *([start or "-"] if estimated else []),
            )
        if page["next_cursor"] is not None:
            table.caption = f"next page: the same command with --cursor {safe(page['next_cursor'])}"
        console.print(table)
        if failures:
            console.print(_failure_table(failures, now))


def _recent_failures(api: Client, tenant: str | None, now: float) -> list[JobJson]:
    """The jobs that failed or were rejected in the last :data:`RECENT_FAILURES_S` seconds, the latest first.

    The API filters by phase, not by end time, and pages in submission order: this reads the
    :data:`RECENT_FAILURES_SCAN` failed jobs submitted last and keeps those that ended lately (an older job that
    failed lately behind as many newer failures is not shown: ``corral jobs --phase failed`` lists them all)."""
    page = api.jobs_page(tenant=tenant, phases=FAILED_PHASES, limit=RECENT_FAILURES_SCAN, newest_first=True)
    since = now - RECENT_FAILURES_S
    found = [j for j in page["jobs"] if j["end_s"] is not None and j["end_s"] >= since]
    return sorted(found, key=lambda j: j["end_s"] or 0.0, reverse=True)


def _failure_table(failures: Sequence[JobJson], now: float, most: int = 10) -> Table:
    minutes = RECENT_FAILURES_S // 60
    why = "why: corral job ID, corral logs ID"
    table = Table(title=f"[bold red]failed or rejected in the last {minutes} minutes: {len(failures)}[/]", caption=why)
    for col in ("id", "name", "tenant", "phase", "ended", "reason"):
        table.add_column(col)
    for job in failures[:most]:
        table.add_row(
            safe(job["job_id"]),
            safe(job["name"] or ""),
            safe(job["tenant"]),
            _phase(job["phase"]),
            f"{duration(now - (job['end_s'] or now))} ago",
            safe(job["reason"] or ""),
        )
    if len(failures) > most:
        table.caption = f"{len(failures) - most} more: corral jobs --phase failed,rejected --newest; {why}"
    return table


@click.command()
@click.argument("job_id")
@json_option
@client_options
def job(job_id: str, as_json: bool, **client: Any) -> None:
    """Show one job: what it is, where it runs, its history and its latest telemetry."""
    with _errors():
        with make_client(**client) as api:
            record = api.job(job_id)
            events = api.events(job_id)
            snap = api.cluster() if record["placement"] is not None else None
        if as_json:
            _print_json({"job": record, "events": events})
            return
        import shlex

        now = time.time()
        table = Table(title=f"job {safe(record['job_id'])}" + (f" ({safe(record['name'])})" if record["name"] else ""))
        table.add_column("", style="bold")
        table.add_column("")
        proc = record["process"]
        rows = [
            ("phase", _job_phase(record) + (f": {safe(record['reason'])}" if record["reason"] else "")),
            *(
                [("state", "in host memory of " + ", ".join(safe(n) for n in record["suspended_on"] or []))]
                if record.get("suspended_on")
                else []
            ),
            *([("waiting", safe(record["wait_reason"]))] if record.get("wait_reason") else []),
            *([("estimated start", start)] if (start := _estimate(record, now)) else []),
            *(
                [("expected duration", duration(float(record["expected_duration_s"] or 0)))]
                if record.get("expected_duration_s")
                else []
            ),
            ("tenant", safe(record["tenant"])),
            ("class", _job_class(record)),
            ("GPUs", _gpus(record) + (f", {record['gpu_mem_mib']} MiB each" if record["gpu_mem_mib"] else "")),
            ("placement", _placement(record)),
            ("command", safe(shlex.join(record["command"]))),
            ("cwd", safe(record["cwd"])),
            ("submitted", _when(record["submit_s"])),
            ("first start", _when(record["first_start_s"])),
            ("ended", _when(record["end_s"])),
            ("queued", duration(_queued_s(record, now))),
            ("runtime", duration(_runtime_s(record, now))),
            ("preemptions", str(record["preemptions"])),
            ("process", f"run {proc['run']}, {safe(proc['phase'])}" + (f", pid {proc['pid']}" if proc["pid"] else "")
             + (f", exit code {proc['exit_code']}" if proc["exit_code"] is not None else "")
             + (f", signal {proc['exit_signal']}" if proc["exit_signal"] is not None else "")),
        ]  # fmt: skip
        ranks = _ranks(record, snap)
        if ranks:
            rows.insert(5, ("ranks", ranks))
        if record["env"]:
            rows.append(("env", safe(" ".join(f"{k}={v}" for k, v in sorted(record["env"].items())))))
        tel = record["telemetry"]
        if tel is not None:
            rows.append(
                (
                    "telemetry",
                    f"step {tel['step_time_s'] * 1000:.1f} ms, busy {tel['sm_util']:.0%}, "
                    f"GPU memory peak {tel['mem_peak_mib']} MiB (at {_when(tel['time_s'])})",
                )
            )
            if tel["slowdown"] is not None and tel["baseline_step_time_s"] is not None:
                rows.append(
                    (
                        "slowdown",
                        f"{tel['slowdown']:.2f}x its step time alone ({tel['baseline_step_time_s'] * 1000:.1f} ms, "
                        f"median of {tel['baseline_reports']} reports)",
                    )
                )
        for key, value in rows:
            table.add_row(key, value)
        console.print(table)
        history = Table(title="events")
        history.add_column("time")
        history.add_column("event")
        history.add_column("detail")
        for e in events:
            history.add_row(_when(e["time_s"]), safe(e["kind"]), safe(e["detail"]))
        console.print(history)


@click.command()
@click.argument("job_id")
@click.option("-f", "--follow", is_flag=True, help="Keep printing output as it comes, until the job ends.")
@client_options
def logs(job_id: str, follow: bool, **client: Any) -> None:
    """Print a job's output (stdout and stderr)."""
    with _errors():
        offset = 0
        out = sys.stdout
        try:
            with make_client(**client) as api:
                while True:
                    chunk = api.logs(job_id, offset=offset)
                    if chunk["text"]:
                        out.write(chunk["text"])
                        out.flush()
                    moved = chunk["next_offset"] > offset
                    offset = chunk["next_offset"]
                    if chunk["complete"]:
                        break
                    if not follow and offset >= chunk["size"]:
                        break
                    if not moved:
                        time.sleep(FOLLOW_POLL_S)
        except KeyboardInterrupt:
            sys.exit(130)


@click.command()
@click.option("-f", "--follow", is_flag=True, help="Keep printing events as they come (Ctrl-C stops).")
@click.option(
    "--last", type=click.IntRange(min=0), default=20, show_default=True, help="Start with the last N events so far."
)
@click.option("--all", "from_start", is_flag=True, help="Start with every event so far.")
@client_options
def events(follow: bool, last: int, from_start: bool, **client: Any) -> None:
    """Print job events, every job's (a tenant's token: its own jobs'): time, job, kind, detail."""
    with _errors(), make_client(**client) as api:
        after = 0
        if not from_start:  # find the end of the feed, then step back `last` events
            while True:
                page = api.event_feed(after=after)
                if not page["events"]:
                    break
                after = page["next_after"]
            after = max(0, after - last)
        try:
            while True:
                page = api.event_feed(after=after)
                for e in page["events"]:
                    stamp = time.strftime("%H:%M:%S", time.localtime(e["time_s"]))
                    detail = f": {visible(e['detail'])}" if e["detail"] else ""
                    click.echo(f"{stamp} {e['job_id']} {visible(e['kind'])}{detail}")
                after = page["next_after"]
                if not page["events"]:
                    if not follow:
                        return
                    time.sleep(FOLLOW_POLL_S)
        except KeyboardInterrupt:
            sys.exit(130)


@click.command()
@click.argument("job_id")
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=0),
    metavar="SECONDS",
    help=f"Give up after this long (exit status {WAIT_TIMED_OUT}); default: as long as it takes.",
)
@json_option
@client_options
def wait(job_id: str, timeout_s: float | None, as_json: bool, **client: Any) -> None:
    """Wait until a job ends; exit 0 if it finished, 1 if it failed, was cancelled or rejected."""
    with _errors(), make_client(**client) as api:
        _await(api, job_id, timeout_s, as_json)


def _await(api: Client, job_id: str, timeout_s: float | None, as_json: bool) -> NoReturn:
    """Wait for the job (``timeout_s``: at most that long), say how it ended, and exit with its outcome: 0 finished;
    1 failed, cancelled or rejected; 124 still pending or running at the deadline; 130 on Ctrl-C, the job left
    as it is."""
    try:
        job = api.wait(job_id, timeout_s=timeout_s)
        if as_json:
            _print_json(job)
        else:
            _tell_outcome(api, job, timeout_s)
    except KeyboardInterrupt:
        err_console.print(
            f"stopped waiting; job {safe(job_id)} goes on (corral cancel {safe(job_id)} stops it)", highlight=False
        )
        sys.exit(WAIT_INTERRUPTED)
    phase = job["phase"]
    sys.exit(0 if phase == "finished" else WAIT_FAILED if phase in ENDED_PHASES else WAIT_TIMED_OUT)


def _tell_outcome(api: Client, job: JobJson, timeout_s: float | None, *, err: bool = False) -> None:
    """Print how the job ended (or what it still does at the timeout) and, for a failed job, the end of its log;
    on stderr with ``err``."""
    click.echo(_outcome(job, timeout_s), err=err)
    if job["phase"] == "failed":
        tail = _log_tail(api, job["job_id"])
        if tail:
            click.echo(f"its log ends with (all of it: corral logs {visible(job['job_id'])}):", err=err)
            out = sys.stderr if err else sys.stdout
            out.write(tail)  # the job's own output, as `corral logs` prints it
            out.flush()


def _outcome(job: JobJson, timeout_s: float | None) -> str:
    """One line: how the job ended, or what it still does when the wait ran out."""
    jid, phase = visible(job["job_id"]), job["phase"]
    if phase == "finished":
        return f"job {jid} finished (ran {duration(job['executed_s'])})"
    if phase in ENDED_PHASES:
        return f"job {jid} {phase}" + (f": {visible(job['reason'])}" if job["reason"] else "")
    waiting = f" ({visible(why)})" if phase == "pending" and (why := job.get("wait_reason")) else ""
    return f"job {jid} is still {visible(phase)}{waiting} after {timeout_s or 0:g} s"


def _log_tail(api: Client, job_id: str, lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of the job's log, as the job wrote them ("" if there is none or it cannot be read:
    the outcome is said all the same)."""
    from corral.live.client import ClientError

    try:
        size = api.logs(job_id, offset=0, limit=1)["size"]
        start = max(0, size - LOG_TAIL_BYTES)
        text = api.logs(job_id, offset=start, limit=LOG_TAIL_BYTES)["text"]
    except ClientError:
        return ""
    cut = text.split("\n")
    if start > 0:
        cut = cut[1:]  # a line cut at its start (or a character cut in two) is not shown
    if cut and cut[-1] == "":
        cut = cut[:-1]  # the log's last newline ends a line; it does not start one
    return "".join(line + "\n" for line in cut[-lines:])


@click.command()
@click.argument("job_id")
@json_option
@client_options
def cancel(job_id: str, as_json: bool, **client: Any) -> None:
    """Cancel a pending or running job."""
    with _errors():
        with make_client(**client) as api:
            record = api.cancel(job_id)
        if as_json:
            _print_json(record)
            return
        state = record["phase"]
        if record["process"]["phase"] == "stopping":
            state += " (its process is stopping)"
        click.echo(f"job {visible(record['job_id'])}: {visible(state)}")


@click.command()
@json_option
@client_options
def tenants(as_json: bool, **client: Any) -> None:
    """Each tenant's quota and what it holds."""
    with _errors():
        with make_client(**client) as api:
            found = api.tenants()
        if as_json:
            _print_json(found)
            return
        console.print(_tenant_table(found))


def _tenant_table(found: Sequence[TenantJson]) -> Table:
    table = Table(title="tenants")
    table.add_column("tenant")
    table.add_column("quota", justify="right")
    table.add_column("held (guaranteed)", justify="right")
    table.add_column("opportunistic", justify="right")
    table.add_column("running", justify="right")
    table.add_column("pending", justify="right")
    for t in found:
        table.add_row(
            safe(t["name"]),
            "none" if t["quota_gpus"] is None else str(t["quota_gpus"]),
            f"{t['guaranteed_gpus']:g}",
            f"{t['opportunistic_gpus']:g}",
            str(t["running"]),
            str(t["pending"]),
        )
    return table


def show_live_cluster(url: str | None, token: str | None, client_state_dir: str | None, as_json: bool = False) -> None:
    """``corral cluster`` without a SPEC: the running server's GPUs, who is on each, quotas and utilization."""
    with _errors():
        with make_client(url, token, client_state_dir) as api:
            snap = api.cluster()
            found = api.tenants()
        if as_json:
            _print_json({"cluster": snap, "tenants": found})
            return
        if len(snap["nodes"]) > 1 or any(n["state"] != "alive" for n in snap["nodes"]):
            console.print(_node_table(snap))
        console.print(_cluster_table(snap))
        console.print(_tenant_table(found))


def _node_table(snap: ClusterJson) -> Table:
    """The nodes, alive or lost, with the jobs on each (several machines: ``corral serve --ray``)."""
    on_node: dict[str, set[str]] = {}
    for g in snap["gpus"]:
        names = on_node.setdefault(g["node"], set())
        names.update(safe(j["job_id"]) for j in g["jobs"])
        if g["busy"] and not g["jobs"]:
            names.add("another tenant's")
    table = Table(title=f"{len(snap['nodes'])} nodes")
    table.add_column("node")
    table.add_column("state")
    table.add_column("GPUs", justify="right")
    table.add_column("jobs")
    for n in snap["nodes"]:
        state = "[bold red]lost[/]" if n["state"] == "lost" else "alive"
        table.add_row(safe(n["name"]), state, str(n["num_gpus"]), ", ".join(sorted(on_node.get(n["name"], ()))) or "-")
    return table


def _cluster_table(snap: ClusterJson) -> Table:
    stand_in = bool(snap["gpus"]) and all(g["stand_in"] for g in snap["gpus"])
    title = (
        f"{snap['num_gpus']} GPUs, {snap['allocated_gpus']:g} allocated | {snap['running']} running, "
        f"{snap['pending']} pending | policy {safe(snap['policy'])}"
    )
    if stand_in:
        title += "\n[bold yellow]STAND-IN GPUs: no real GPU, jobs run on the CPU[/]"
    table = Table(title=title)
    table.add_column("GPU", justify="right")
    table.add_column("node")
    table.add_column("type")
    table.add_column("memory", justify="right")
    table.add_column("allocated", justify="right")
    table.add_column("jobs: id (tenant, share)")
    table.add_column("busy", justify="right")
    table.add_column("mem used", justify="right")
    for g in snap["gpus"]:
        jobs_text = ", ".join(
            f"{safe(j['job_id'])} ({safe(j['tenant'])}, "
            f"{'opp ' if j['opportunistic'] else ''}{j['gpu_milli'] / 1000:g})"
            for j in g["jobs"]
        )
        if g["busy"] and not g["jobs"]:
            jobs_text = "busy (another tenant's)"  # with a tenant's token, others' jobs are not listed
        kind = f"[bold yellow]{safe(g['type_name'])}[/]" if g["stand_in"] else safe(g["type_name"])
        table.add_row(
            str(g["index"]),
            safe(g["node"]),
            kind,
            f"{g['mem_mib']:,} MiB",
            f"{g['allocated_milli'] / 1000:g}",
            jobs_text or "-",
            "-" if g["sm_util"] is None else f"{g['sm_util']:.0%}",
            "-" if g["mem_used_mib"] is None else f"{g['mem_used_mib']:,} MiB",
        )
    return table


@click.command("export-trace")
@click.option("--since", help="Jobs submitted since then: a time ago (7d, 12h, 30m) or a date (2026-11-20[T08:00]).")
@click.option(
    "--out", "out_path", required=True, type=click.Path(dir_okay=False), help="The trace to write (CSV; '-': stdout)."
)
@click.option(
    "--cluster-out",
    type=click.Path(dir_okay=False),
    help="Also write the cluster (GPUs, nodes, tenants, quotas) as a cluster file for --cluster.",
)
@click.option("--overwrite", is_flag=True, help="Replace files that exist.")
@client_options
def export_trace(since: str | None, out_path: str, cluster_out: str | None, overwrite: bool, **client: Any) -> None:
    """Write the jobs that ran here as a trace (and the cluster as a cluster file), for what-if replays:

    \b
    corral export-trace --since 7d --out week.csv --cluster-out here.toml
    corral compare --format csv --trace week.csv --cluster here.toml --policy fifo --policy tiresias --policy antman

    A row's duration is the time the job held GPUs here; jobs still pending or running are left out (docs/live.md,
    "This cluster's history as a trace"). With a tenant's token, that tenant's jobs only."""
    from corral.live.export import cluster_toml, parse_since, trace_csv, trace_rows

    with _errors():
        since_s = None
        if since is not None:
            try:
                since_s = parse_since(since, time.time())
            except ValueError as e:
                raise ConfigError(str(e)) from None
        targets = [t for t in (out_path, cluster_out) if t is not None and t != "-"]
        for target in targets:
            if Path(target).exists() and not overwrite:
                raise ConfigError(f"{target} exists; pass --overwrite to replace it")
        with make_client(**client) as api:
            export = trace_rows(api.iter_jobs(), since_s=since_s)
            cluster_text = cluster_toml(api.cluster(), api.tenants()) if cluster_out else None
        text = trace_csv(export)
        if out_path == "-":
            click.echo(text, nl=False)
        else:
            Path(out_path).write_text(text)
        if cluster_out is not None and cluster_text is not None:
            Path(cluster_out).write_text(cluster_text)
        left = ", ".join(f"{n} {why}" for why, n in sorted(export.left_out.items())) or "none"
        origin = "" if export.origin_s is None else f"; submit_s counts from {_when(export.origin_s)} (local time)"
        where = "stdout" if out_path == "-" else out_path
        click.echo(f"{len(export.rows)} jobs written to {visible(where)}{origin}; left out: {visible(left)}", err=True)


@click.group(invoke_without_command=True)
@click.option("--policy", "policies", multiple=True, help="A policy to try (repeat): NAME[:key=value,...].")
@click.option(
    "--current",
    help="The server's own policy as NAME[:key=value,...] (default: its name, with default options).",
)
@click.option("--since", default="7d", show_default=True, help="The history to replay, as for export-trace.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), help="Where to write it all.")
@click.option("--overwrite", is_flag=True, help="Let --out name a folder that is not empty (corral's files go).")
@click.option("--progress/--no-progress", default=True, help="Show the replays' progress.")
@client_options
@click.pass_context
def whatif(
    ctx: click.Context,
    /,
    policies: tuple[str, ...],
    current: str | None,
    since: str,
    out_dir: str | None,
    overwrite: bool,
    progress: bool,
    **client: Any,
) -> None:
    """What other policies would do with this cluster's queue, and would have done with its history.

    For each --policy: the current queue forecast under it and under the server's policy, from one snapshot: per
    tenant, the median wait and how many jobs would start earlier or later if the server switched now. With
    --out, also export-trace, then compare the server's policy with each --policy on that history; writes
    trace.csv and cluster.toml (the inputs), the comparison and report.html to --out.

    `corral whatif accuracy`: how good the server's start-time estimates have been."""
    from corral.live.export import cluster_toml, parse_since, trace_csv, trace_rows
    from corral.sim.report import prepare_out

    if ctx.invoked_subcommand is not None:
        return  # `corral whatif accuracy`
    with _errors():
        if not policies:
            raise ConfigError("corral whatif needs --policy NAME (one or more), or a subcommand (accuracy)")
        with make_client(**client) as api:
            for policy in policies:
                console.print(_queue_table(api.whatif_queue(policy)))
        if out_dir is None:
            return
        try:
            since_s = parse_since(since, time.time())
        except ValueError as e:
            raise ConfigError(str(e)) from None
        out = prepare_out(out_dir, overwrite=overwrite, per_policy=True)
        with make_client(**client) as api:
            export = trace_rows(api.iter_jobs(), since_s=since_s)
            cluster = api.cluster()
            found = cluster_toml(cluster, api.tenants())
        if not export.rows:
            raise ConfigError(f"no job ran and ended here since {_when(since_s)}: nothing to replay")
        (out / "trace.csv").write_text(trace_csv(export))
        (out / "cluster.toml").write_text(found)
        mine = current or str(cluster["policy"]).split("(", 1)[0]
        click.echo(
            f"{len(export.rows)} jobs since {_when(since_s)}; replaying them under {mine} (this server's)", err=True
        )
        root = ctx.find_root()
        compare = root.command.get_command(root, "compare") if isinstance(root.command, click.Group) else None
        assert compare is not None, "corral's command group has a compare command"
        ctx.invoke(
            compare,
            policies=(mine, *(p for p in policies if p != mine)),
            out_dir=str(out),
            overwrite=True,  # only this command's own inputs are there (prepare_out cleared the rest)
            fmt="csv",
            trace_path=str(out / "trace.csv"),
            cluster_spec=str(out / "cluster.toml"),
            progress=progress,
        )


def _queue_table(found: WhatifJson) -> Table:
    """``corral whatif --policy``'s table: the current queue's waits under the server's policy and another."""

    def wait(x: float | None) -> str:
        return "-" if x is None else duration(max(0.0, x))

    now, other = safe(found["policy"].split("(", 1)[0]), safe(found["other"].split("(", 1)[0])
    table = Table(title=f"the current queue under {now} (this server's) and under {other}")
    for col in ("tenant", "pending", f"median wait, {now}", f"median wait, {other}", "earlier", "later"):
        table.add_column(col, justify="left" if col == "tenant" else "right")
    for row in found["tenants"]:
        table.add_row(
            "all" if row["tenant"] is None else safe(row["tenant"]),
            str(row["pending"]),
            wait(row["wait_now_s"]),
            wait(row["wait_other_s"]),
            str(row["earlier"]),
            str(row["later"]),
        )
    table.caption = (
        f"starts forecast at {_when(found['made_s'])} ({found['took_s'] * 1000:.0f} ms), assuming no new "
        "submissions; earlier/later: jobs whose start would move by more than 1 s"
    )
    return table


@whatif.command("accuracy")
@json_option
@client_options
def whatif_accuracy(as_json: bool, **client: Any) -> None:
    """How far the server's estimated start times were from the real starts (admin token): each job's first
    estimate and its latest before it started (docs/live.md, "Estimated start times")."""
    with _errors():
        with make_client(**client) as api:
            found = api.estimate_accuracy()
            latest = api.estimates()
        if as_json:
            _print_json({"accuracy": found, "latest": latest})
            return
        if not found["jobs"]:
            console.print("no estimated job has started yet: nothing to judge")
            return

        def secs(x: float | None) -> str:
            return "-" if x is None else duration(abs(x)) if x >= 0 else f"-{duration(-x)}"

        table = Table(title=f"start-time estimates against real starts: {found['jobs']:,} jobs")
        for col in ("estimate", "median |error|", "p90 |error|"):
            table.add_column(col, justify="left" if col == "estimate" else "right")
        table.add_row("first (each job's first)", secs(found["first_median_s"]), secs(found["first_p90_s"]))
        table.add_row("latest (before it started)", secs(found["last_median_s"]), secs(found["last_p90_s"]))
        within = "-" if found["within"] is None else f"{found['within']:.0%}"
        bias = found["last_bias_s"]
        side = "late" if bias is not None and bias >= 0 else "early"
        late = "" if bias is None or abs(bias) < 0.5 else f"; latest estimates {side} by {secs(abs(bias))} on average"
        table.caption = f"real start within the latest estimate's range: {within}{late}"
        console.print(table)
        if latest["made_s"] is not None:
            every = f"every {duration(latest['interval_s'])}" if latest["interval_s"] else "on request only"
            console.print(
                f"[dim]last forecast {duration(time.time() - latest['made_s'])} ago, took "
                f"{(latest['took_s'] or 0) * 1000:.1f} ms ({every})[/]"
            )


LIVE_COMMANDS: tuple[click.Command, ...] = (
    serve, submit, jobs, job, logs, events, wait, cancel, tenants, export_trace, whatif
)  # fmt: skip
