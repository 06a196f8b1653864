"""What every live command shares: the API client, and how user text and errors are printed.

- :func:`make_client`: the client of ``corral serve``'s API, the server's URL and the token from ``--url``/
  ``--token`` or, where not given, from the files the server keeps in its state directory; :func:`_print_json`,
  what ``--json`` prints.
- :func:`visible` and :func:`safe`: text that users wrote, its control characters made visible, for ``click.echo``
  and for rich markup; :func:`_errors`: errors the user can fix as one ``error:`` line, exit status 2.
- The phases a job waits, runs or ends in, and :func:`_when`, a time as the tables show it.

The consoles are the package's (``corral.cli.live.console`` and ``err_console``), looked up there at each print.
"""

from __future__ import annotations

import json
import time
import unicodedata
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.markup import escape

from corral.cli import live
from corral.cli.errors import user_errors
from corral.live.config import DEFAULT_STATE_DIR

if TYPE_CHECKING:
    from corral.live.client import Client

ACTIVE_PHASES = ("pending", "running")
ENDED_PHASES = ("finished", "failed", "cancelled", "rejected")
FAILED_PHASES = ("failed", "rejected")  # ended without anyone asking: what `corral jobs` shows next to the active

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
    return user_errors(live.err_console, safe)


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


def _when(t: float | None) -> str:
    return "-" if t is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))
