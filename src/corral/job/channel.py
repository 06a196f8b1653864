"""The job's end of the local channel to its agent (:mod:`corral.core.contract`): a Unix stream socket carrying
JSON lines.

All socket work happens on one background thread, so that the training thread never waits on the agent:

- The thread connects, sends the greeting (a :class:`~corral.core.contract.Hello`, plus whatever the job needs
  the agent to know again after a reconnection), then waits in ``poll`` on the socket and on a wake-up pipe. The
  channel signs the greeting's hello with the run's secret (``CORRAL_RUN_SECRET``), without which the agent
  drops the connection.
- Received directives are decoded there and appended to :attr:`AgentChannel.inbox`, a deque. The training thread
  checks it at each step boundary (a truth test of a deque: tens of nanoseconds) and applies what it finds; the
  thread never applies anything itself.
- :meth:`AgentChannel.send` appends the encoded message to an outgoing buffer and pokes the wake-up pipe; the
  thread writes it out. Step reports are *droppable*: while the agent is not reading and the buffer holds more
  than ``max_backlog_bytes``, new reports are dropped rather than queued, so a stalled agent costs bounded memory
  and no time.
- When the connection fails or breaks (the agent or controller restarted), the thread closes it, forgets what
  was unsent (a new connection starts afresh with the greeting) and tries again every ``retry_s`` seconds.
  Messages sent while disconnected are dropped.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import select
import socket
import threading
from collections import deque
from collections.abc import Callable, Sequence

from corral.core import contract
from corral.core.errors import InputError

logger = logging.getLogger("corral.job")

_READ_MASK = select.POLLIN | select.POLLPRI | select.POLLHUP | select.POLLERR
_CONNECT_TIMEOUT_S = 2.0


class AgentChannel:
    """A self-reconnecting connection to the agent's socket at ``path``.

    ``greeting`` is called (on the channel's thread) each time a connection opens; the messages it returns are
    the first ones sent on it, a :class:`~corral.core.contract.Hello` among them carrying ``secret`` (by default
    the process's ``CORRAL_RUN_SECRET``, which the agent set).
    """

    def __init__(
        self,
        path: str,
        greeting: Callable[[], Sequence[contract.Message]],
        *,
        retry_s: float = 2.0,
        max_backlog_bytes: int = 256 * 1024,
        secret: str | None = None,
    ) -> None:
        self.path = path
        self.inbox: deque[contract.Message] = deque()
        """Directives received and not yet taken by :meth:`poll`."""
        self.arrived = threading.Event()
        """Set whenever a message is appended to :attr:`inbox` (a paused job waits on it)."""
        self.connections = 0
        """How many connections have opened so far (1 after the first; more after reconnections)."""
        self.dropped = 0
        """Messages dropped: sent while disconnected or, for droppable ones, while the backlog was full."""
        self._greeting = greeting
        self._secret = os.environ.get(contract.ENV_RUN_SECRET, "") if secret is None else secret
        self._warned = False
        self._retry_s = retry_s
        self._max_backlog = max_backlog_bytes
        self._lock = threading.Lock()
        self._drained = threading.Condition(self._lock)
        self._out = bytearray()  # guarded by _lock
        self._connected = False  # guarded by _lock
        self._stopping = threading.Event()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._thread = threading.Thread(target=self._run, name="corral-job-channel", daemon=True)
        self._thread.start()

    # -- training thread ---------------------------------------------------------------------------------------
    @property
    def connected(self) -> bool:
        return self._connected

    def poll(self) -> list[contract.Message]:
        """Take every message received so far (never blocks)."""
        taken: list[contract.Message] = []
        while self.inbox:
            taken.append(self.inbox.popleft())
        return taken

    def send(self, message: contract.Message, *, droppable: bool = False) -> bool:
        """Queue ``message`` for the agent; never blocks. Returns whether it was queued (it is not while
        disconnected, nor, when ``droppable``, while the backlog is over its limit)."""
        data = contract.encode(message)
        with self._lock:
            if not self._connected or (droppable and len(self._out) > self._max_backlog):
                self.dropped += 1
                return False
            self._out += data
        self._poke()
        return True

    def flush(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for everything queued to be written; returns whether it was (vacuously true
        when disconnected, since nothing can be)."""
        with self._drained:
            return self._drained.wait_for(lambda: not self._out or not self._connected, timeout_s)

    def close(self, flush_timeout_s: float = 1.0) -> None:
        """Flush (bounded), stop the thread, close the socket. Idempotent."""
        if self._stopping.is_set():
            return
        self.flush(flush_timeout_s)
        self._stopping.set()
        self._poke()
        self._thread.join(timeout=flush_timeout_s + 1.0)
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)

    def _poke(self) -> None:
        with contextlib.suppress(OSError):  # a full pipe already wakes the thread; a closed one means stopping
            os.write(self._wake_w, b"\0")

    # -- channel thread ----------------------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stopping.is_set():
            sock = self._connect()
            if sock is None:
                self._stopping.wait(self._retry_s)
                continue
            try:
                self._serve(sock)
            except OSError as e:
                logger.debug("corral.job: agent connection lost: %s", e)
            finally:
                with self._lock:
                    self._connected = False
                    self._out.clear()
                    self._drained.notify_all()
                sock.close()
            if not self._stopping.is_set():
                self._stopping.wait(self._retry_s)

    def _connect(self) -> socket.socket | None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(_CONNECT_TIMEOUT_S)
            sock.connect(self.path)
            sock.setblocking(False)
        except OSError as e:
            sock.close()
            if not self._warned:  # once: a wrong path must be visible in the job's log, a restart need not be
                self._warned = True
                logger.warning(
                    "corral.job: cannot reach the agent at %s (%s); training goes on, retrying", self.path, e
                )
            return None
        greeting = b"".join(contract.encode(self._signed(m)) for m in self._greeting())
        with self._lock:
            self._out[:0] = greeting
            self._connected = True
        self.connections += 1
        return sock

    def _signed(self, message: contract.Message) -> contract.Message:
        if isinstance(message, contract.Hello) and not message.secret:
            return dataclasses.replace(message, secret=self._secret)
        return message

    def _serve(self, sock: socket.socket) -> None:
        poller = select.poll()
        buffer = bytearray()
        while not self._stopping.is_set():
            with self._lock:
                want_write = bool(self._out)
            poller.register(sock, _READ_MASK | (select.POLLOUT if want_write else 0))
            poller.register(self._wake_r, select.POLLIN)
            ready = dict(poller.poll())
            if ready.get(self._wake_r):
                with contextlib.suppress(BlockingIOError):
                    os.read(self._wake_r, 4096)
            events = ready.get(sock.fileno(), 0)
            if events & (select.POLLIN | select.POLLPRI | select.POLLHUP | select.POLLERR):
                try:
                    data = sock.recv(65536)
                except BlockingIOError:
                    data = None
                if data is not None:
                    if not data:
                        logger.debug("corral.job: the agent closed the connection")
                        return
                    buffer += data
                    if not self._take_lines(buffer):
                        return
            if events & select.POLLOUT:
                with self._lock:
                    try:
                        sent = sock.send(self._out)
                    except BlockingIOError:
                        sent = 0
                    del self._out[:sent]
                    if not self._out:
                        self._drained.notify_all()

    def _take_lines(self, buffer: bytearray) -> bool:
        """Decode the complete lines at the front of ``buffer`` into the inbox; False on a protocol error that
        ends the connection (an over-long line)."""
        arrived = False
        while True:
            end = buffer.find(b"\n")
            if end < 0:
                if len(buffer) > contract.MAX_MESSAGE_BYTES:
                    logger.warning(
                        "corral.job: agent sent a line over %d bytes; reconnecting", contract.MAX_MESSAGE_BYTES
                    )
                    return False
                break
            line = bytes(buffer[:end])
            del buffer[: end + 1]
            if not line.strip():
                continue
            try:
                message = contract.decode(line)
            except InputError as e:  # skip it: one bad line (or a newer agent's message) must not stop the job
                logger.warning("corral.job: ignoring a message from the agent: %s", e)
                continue
            self.inbox.append(message)
            arrived = True
        if arrived:
            self.arrived.set()
        return True
