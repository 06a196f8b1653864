"""Login sessions of the dashboard: a random id in a cookie, the :class:`~corral.live.api.app.Principal` it stands
for kept here, in memory.

A browser cannot send ``Authorization: Bearer TOKEN`` on a page load, and the token must never sit in a cookie,
a URL or a page (it would end up in proxies' logs, the browser's history, screenshots). So ``POST /login`` checks
the token once (with the API's own :class:`~corral.live.api.app._Tokens`, in constant time) and hands out a
session id instead: ``secrets.token_urlsafe(32)``, 256 random bits, unguessable. The id maps to the principal
here and nowhere else; a restart of the server ends every session (people log in again), which is also what
revoking a token by restarting with a new configuration wants.

Bounded: at most :data:`MAX_SESSIONS` live sessions (the oldest is dropped first), each ~200 bytes, so a flood
of logins costs at most a few MiB. Expired sessions are swept as new ones are made.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from corral.live.api.app import Principal

COOKIE = "corral_session"
DEFAULT_TTL_S = 12 * 3600.0  # a working day: long enough not to nag, short enough that a lost laptop's ends
MAX_SESSIONS = 10_000


@dataclass(frozen=True, slots=True)
class Session:
    principal: Principal
    expires_at: float  # on the clock of the Sessions that made it (monotonic by default)


class Sessions:
    """Session id -> principal, with an expiry. Thread-safe (the routes run in FastAPI's thread pool)."""

    def __init__(
        self, ttl_s: float = DEFAULT_TTL_S, clock: Callable[[], float] = time.monotonic, limit: int = MAX_SESSIONS
    ) -> None:
        self.ttl_s = ttl_s
        self._clock = clock  # monotonic: a wall-clock jump must neither end nor extend sessions
        self._limit = limit
        self._lock = threading.Lock()
        self._by_id: OrderedDict[str, Session] = OrderedDict()  # oldest first

    def create(self, principal: Principal) -> str:
        """A new session for ``principal``; its id (what the cookie holds)."""
        session_id = secrets.token_urlsafe(32)
        now = self._clock()
        with self._lock:
            self._sweep(now)
            while len(self._by_id) >= self._limit:
                self._by_id.popitem(last=False)
            self._by_id[session_id] = Session(principal, now + self.ttl_s)
        return session_id

    def get(self, session_id: str | None) -> Principal | None:
        """The principal of a live session, or ``None`` (no cookie, an unknown id, or an expired session)."""
        if not session_id:
            return None
        with self._lock:
            session = self._by_id.get(session_id)
            if session is None:
                return None
            if self._clock() >= session.expires_at:
                del self._by_id[session_id]
                return None
            return session.principal

    def end(self, session_id: str | None) -> None:
        if session_id:
            with self._lock:
                self._by_id.pop(session_id, None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._by_id)

    def _sweep(self, now: float) -> None:
        # Sessions are made in order and share one ttl: the expired ones are at the front.
        while self._by_id:
            first = next(iter(self._by_id.values()))
            if first.expires_at > now:
                break
            self._by_id.popitem(last=False)
