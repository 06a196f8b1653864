"""The agent's end of the local channel, for the job-side library's tests.

The peer is a real Unix stream socket server speaking the contract with :func:`corral.core.contract.encode` and
:func:`~corral.core.contract.decode`: it accepts the job's connections (one at a time, as the agent does),
records every message the job sends, and sends directives. It can go away and come back at the same path, as a
restarted agent would.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from corral.core import contract

M = TypeVar("M")


class AgentPeer:
    def __init__(self, path: str) -> None:
        self.path = path
        self.messages: list[contract.Message] = []
        self.connections = 0
        self._cursor = 0
        self._cond = threading.Condition()
        self._conn: socket.socket | None = None
        self._listener: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self.start()

    # -- lifetime -----------------------------------------------------------------------------------------------
    def start(self) -> None:
        """Listen at :attr:`path` (again, after :meth:`stop`)."""
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(self.path)
        listener.listen(4)
        self._listener = listener
        self._thread = threading.Thread(target=self._serve, args=(listener,), daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Go away: close the connection and the listening socket, remove the socket file."""
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        conn = self._conn
        if conn is not None:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(timeout=5)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    def _serve(self, listener: socket.socket) -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            self._conn = conn
            with self._cond:
                self.connections += 1
                self._cond.notify_all()
            buffer = b""
            with conn:
                while True:
                    try:
                        data = conn.recv(65536)
                    except OSError:
                        break
                    if not data:
                        break
                    buffer += data
                    *lines, buffer = buffer.split(b"\n")
                    with self._cond:
                        self.messages.extend(contract.decode(line) for line in lines if line)
                        self._cond.notify_all()
            self._conn = None

    # -- talking ------------------------------------------------------------------------------------------------
    def send(self, message: contract.Message) -> None:
        deadline = time.monotonic() + 10
        while self._conn is None:
            if time.monotonic() > deadline:
                raise AssertionError("no job connected to the peer")
            time.sleep(0.005)
        self._conn.sendall(contract.encode(message))

    def expect(self, kind: type[M], where: Callable[[M], bool] = lambda m: True, timeout: float = 15.0) -> M:
        """The next message of type ``kind`` (satisfying ``where``) after the last one expected; waits for it."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for i in range(self._cursor, len(self.messages)):
                    m = self.messages[i]
                    if isinstance(m, kind) and where(m):
                        self._cursor = i + 1
                        return m
                left = deadline - time.monotonic()
                if left <= 0:
                    seen = [type(m).__name__ for m in self.messages[self._cursor :]]
                    raise AssertionError(f"no {kind.__name__} from the job within {timeout} s; got {seen}")
                self._cond.wait(left)

    def received(self, kind: type[M]) -> list[M]:
        with self._cond:
            return [m for m in self.messages if isinstance(m, kind)]

    def wait_connections(self, n: int, timeout: float = 15.0) -> None:
        with self._cond:
            if not self._cond.wait_for(lambda: self.connections >= n, timeout):
                raise AssertionError(f"{self.connections} connection(s), expected {n}")


def wait_until(condition: Callable[[], bool], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(0.005)


def agent_env(peer: AgentPeer | str, *, job_id: str = "job-1", run: int = 1, **extra: str) -> dict[str, str]:
    """The environment an agent gives a job connected to ``peer`` (or a socket path); reports every 20 ms."""
    return {
        contract.ENV_JOB_ID: job_id,
        contract.ENV_RUN: str(run),
        contract.ENV_AGENT_SOCKET: peer if isinstance(peer, str) else peer.path,
        contract.ENV_REPORT_INTERVAL_S: "0.02",
        **extra,
    }


class Runner:
    """Runs ``body`` (a training loop) on a thread, as a job's main thread would, and records how it ended: the
    ``SystemExit`` code, or 0 when it returned."""

    def __init__(self, body: Callable[[], None]) -> None:
        self.exit_code: int | str | None = None
        self.error: BaseException | None = None
        self._body = body
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self._body()
            self.exit_code = 0
        except SystemExit as e:
            self.exit_code = e.code
        except BaseException as e:
            self.error = e

    def join(self, timeout: float = 15.0) -> int | str | None:
        self.thread.join(timeout)
        if self.thread.is_alive():
            raise AssertionError("the job's loop did not end")
        if self.error is not None:
            raise self.error
        return self.exit_code
