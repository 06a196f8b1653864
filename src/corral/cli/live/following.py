"""Following a job to its end, or ending it: ``corral logs``, ``events``, ``wait`` and ``cancel``.

``corral wait ID`` (and ``corral submit --wait``, :func:`_await`) blocks until the job ends and exits with its
outcome, so that a script can chain jobs: 0 finished; 1 failed, cancelled or rejected; 124 ``--timeout`` ran out
(as ``timeout(1)``); 130 Ctrl-C, which leaves the job alone. Errors stay 2. A failed job's outcome comes with the
end of its log. ``corral logs`` prints the job's own output as the job wrote it: the one place where text that
users wrote is not made visible.
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Any, NoReturn

import click

from corral.cli import live
from corral.cli.live.common import ENDED_PHASES, _errors, _print_json, make_client, safe, visible
from corral.cli.options import client_options, json_option
from corral.core.wording import duration

if TYPE_CHECKING:
    from corral.live.client import Client, JobJson

FOLLOW_POLL_S = 0.5
WAIT_FAILED = 1  # `corral wait`: the job failed, was cancelled or rejected
WAIT_TIMED_OUT = 124  # --timeout ran out, as timeout(1) says it
WAIT_INTERRUPTED = 130  # Ctrl-C: 128 + SIGINT, as a shell reports it
LOG_TAIL_LINES = 10  # the lines of a failed job's log that `corral wait` shows
LOG_TAIL_BYTES = 16 * 1024  # where it looks for them: the log's end, however long the log


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
            sys.exit(WAIT_INTERRUPTED)


@click.command()
@click.option("-f", "--follow", is_flag=True, help="Keep printing events as they come (Ctrl-C stops).")
@click.option(
    "--last", type=click.IntRange(min=0), default=20, show_default=True, help="Start with the last N events so far."
)
@click.option("--all", "from_start", is_flag=True, help="Start with every event so far.")
@client_options
def events(follow: bool, last: int, from_start: bool, **client: Any) -> None:
    """Print job events, every job's (a tenant's token: its own jobs'): time, job, kind, detail."""
    try:
        with _errors(), make_client(**client) as api:
            after = 0
            if not from_start:  # find the end of the feed, then step back `last` events
                while True:
                    page = api.event_feed(after=after)
                    if not page["events"]:
                        break
                    after = page["next_after"]
                after = max(0, after - last)
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
    except KeyboardInterrupt:  # at any point, finding the end of the feed included
        sys.exit(WAIT_INTERRUPTED)


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
        live.err_console.print(
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
