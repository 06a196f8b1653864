"""``corral serve``: the controller and its HTTP API in the foreground.

Ctrl-C or SIGTERM stops it; job processes keep running and are taken back on the next start. One server per state
directory (a lock file says so); the API's socket is bound before anything starts, so that a busy port is a clear
error. Unless ``--quiet``, a line per job event, printed by a thread of its own so that a slow terminal never holds
the scheduler back.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import queue
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

import click

from corral.cli import live
from corral.cli.live.common import _errors
from corral.core.errors import ConfigError
from corral.live.config import DEFAULT_STATE_DIR

if TYPE_CHECKING:
    from corral.live.config import ServeConfig
    from corral.live.records import ClusterSnapshot

EVENT_BACKLOG = 10_000  # turns of job events `corral serve` holds for printing before it drops some


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
        live.err_console.print("corral stopped (job processes keep running; the next `corral serve` takes them back)")


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
