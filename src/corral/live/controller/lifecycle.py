"""The life cycle of a job's process, as a table of the moves it may make; every phase change of the controller
and its executor goes through here, so an impossible one (a process started twice, a resume of nothing) stops
the loop at once with :class:`~corral.core.errors.InvariantViolation` instead of corrupting what the store says.

A move to STARTING is always a *new run* (:func:`start_run`): the run number goes up, and a run still alive (asked
to stop, paused, or moved elsewhere) is kept in ``earlier`` until its exit is heard. Every other move keeps the
run: started (STARTING -> RUNNING), suspended (-> PAUSED), resumed in place (PAUSED -> RUNNING), asked to stop
(-> STOPPING; again while stopping, when a preemption becomes a cancel), exited or found gone (-> NONE)."""

from __future__ import annotations

from collections.abc import Mapping

from corral.core.errors import InvariantViolation
from corral.live.records import ProcessPhase, ProcessState

NONE, STARTING, RUNNING, PAUSED, STOPPING = (
    ProcessPhase.NONE,
    ProcessPhase.STARTING,
    ProcessPhase.RUNNING,
    ProcessPhase.PAUSED,
    ProcessPhase.STOPPING,
)

# from -> the phases it may move to. A process may exit (-> NONE) whatever it was doing; a new run (-> STARTING)
# may replace any run, since the one it replaces is asked to stop and kept in ``earlier`` (a migration or an
# upgrade onto other GPUs replaces a STARTING or RUNNING one).
TRANSITIONS: Mapping[ProcessPhase, frozenset[ProcessPhase]] = {
    NONE: frozenset({STARTING}),
    STARTING: frozenset({STARTING, RUNNING, PAUSED, STOPPING, NONE}),
    RUNNING: frozenset({STARTING, PAUSED, STOPPING, NONE}),
    PAUSED: frozenset({STARTING, RUNNING, STOPPING, NONE}),
    STOPPING: frozenset({STARTING, STOPPING, NONE}),
}


def move(job_id: str, proc: ProcessState, to: ProcessPhase) -> ProcessPhase:
    """Move the job's current run to ``to``; returns the phase it had. A new run goes through :func:`start_run`."""
    was = proc.phase
    if to is STARTING:
        raise InvariantViolation(f"job {job_id}: run {proc.run} cannot start again; a new run is start_run's")
    if to not in TRANSITIONS[was]:
        raise InvariantViolation(f"job {job_id}: run {proc.run} cannot go from {was.value} to {to.value}")
    proc.phase = to
    return was


def start_run(job_id: str, proc: ProcessState) -> int:
    """Begin the job's next run (STARTING), keeping a previous run that is still alive in ``earlier`` (it is
    watched until it exits, across restarts too). Returns the new run's number."""
    was = proc.phase
    if STARTING not in TRANSITIONS[was]:
        raise InvariantViolation(f"job {job_id}: no new run may start while run {proc.run} is {was.value}")
    if was is not NONE:
        proc.earlier.append(proc.run)
    proc.run += 1
    proc.phase = STARTING
    proc.pid = None
    proc.exit_code = proc.exit_signal = None
    proc.stopping_for = None
    return proc.run


def stop(job_id: str, proc: ProcessState, why: str) -> None:
    """The current run is asked to stop: ``why`` is ``"preempt"`` (checkpoint and exit) or ``"cancel"``."""
    move(job_id, proc, STOPPING)
    proc.stopping_for = why


def exited(job_id: str, proc: ProcessState, exit_code: int | None, exit_signal: int | None) -> ProcessPhase:
    """The current run's process is over; returns the phase it had."""
    was = move(job_id, proc, NONE)
    proc.exit_code, proc.exit_signal = exit_code, exit_signal
    proc.stopping_for = None
    return was
