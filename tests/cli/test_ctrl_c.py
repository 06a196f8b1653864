"""Ctrl-C at the worst moment: inside httpx's connection pool, just after it took its lock (corral.live.client).

httpcore's ``ThreadLock.__enter__`` is Python code: a SIGINT whose handler runs right after its ``acquire()`` returns
raises KeyboardInterrupt before the ``with`` block is entered, so the lock is never released, and closing the pool
then waits for it forever. ``corral events -f`` once ignored Ctrl-C this way (a flake of
test_live_cli.py's follow test). The fixture below makes that moment happen at the next request, every time; each
command must still end at once, with exit status 130.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from click.testing import CliRunner, Result
from httpcore._synchronization import ThreadLock

from corral.cli.main import cli
from corral.live.client import Client, ClientError

NOBODY = "http://127.0.0.1:9"  # no server needed: the interrupt comes before any connection
HUNG_S = 10.0


@pytest.fixture
def interrupt_in_pool_lock(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The next request's pool lock is taken, then KeyboardInterrupt is raised before ``__enter__`` returns."""
    real = ThreadLock.__enter__
    fired: list[bool] = []

    def enter(self: ThreadLock) -> ThreadLock:
        real(self)
        if not fired:
            fired.append(True)
            raise KeyboardInterrupt
        return self

    monkeypatch.setattr(ThreadLock, "__enter__", enter)
    yield
    assert fired, "no request reached the pool"


def bounded(fn: Callable[[], Any]) -> Any:
    """``fn()`` in a thread: its result, or what it raised; fails if it has not ended within HUNG_S."""
    out: list[Any] = []

    def target() -> None:
        try:
            out.append(fn())
        except BaseException as e:  # handed to the test, which checks what it was
            out.append(e)

    thread = threading.Thread(target=target, daemon=True)  # a daemon: a hung one does not hold up pytest's exit
    thread.start()
    thread.join(HUNG_S)
    assert not thread.is_alive(), f"still running after {HUNG_S:g} s: hung on the pool's lock"
    return out[0]


def test_an_interrupted_request_leaves_a_client_that_closes_and_says_why_it_cannot_go_on(
    interrupt_in_pool_lock: None,
) -> None:
    api = Client(NOBODY, "token")

    def interrupted() -> None:
        with api:
            api.health()

    assert isinstance(bounded(interrupted), KeyboardInterrupt)
    error = bounded(api.health)  # another request would wait for the lock forever: it fails at once instead
    assert isinstance(error, ClientError) and error.status == 0 and "interrupted" in error.message


@pytest.mark.parametrize(
    "args",
    [["events", "-f"], ["events", "--all"], ["logs", "-f", "abc"], ["wait", "abc"]],
    ids=["events -f", "events --all", "logs -f", "wait"],
)
def test_ctrl_c_in_a_request_ends_the_command_with_130(interrupt_in_pool_lock: None, args: list[str]) -> None:
    env = {"CORRAL_URL": NOBODY, "CORRAL_TOKEN": "token"}
    result = bounded(lambda: CliRunner().invoke(cli, args, env=env))
    assert isinstance(result, Result)
    assert result.exit_code == 130, (result.output, result.exception)
