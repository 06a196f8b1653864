"""Options shared by a replay command and the live client commands, in a module that imports no live-mode code.

``corral cluster`` takes the client options (without a spec it shows the running server's cluster), and it is
defined with the replay commands; so the options live here rather than in :mod:`corral.cli.live`, whose imports
(the live configuration, HTTP client, controller) a replay must not pay for (issue 20: ``corral simulate`` on a
small trace is mostly imports).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])

# corral.live.config.DEFAULT_STATE_DIR, repeated so as not to import live mode for a replay; a test
# (tests/sim/test_replay_imports.py) holds the two equal.
DEFAULT_STATE_DIR = ".corral"


def client_options(fn: F) -> F:
    """``--url``, ``--token``, ``--state-dir``: how a client command finds the server (shared with ``cluster``)."""
    options = [
        click.option(
            "--url", envvar="CORRAL_URL", help="The server's URL [env CORRAL_URL] (default: from the state dir)."
        ),
        click.option(
            "--token",
            envvar="CORRAL_TOKEN",
            help="API token [env CORRAL_TOKEN] (default: the admin token in the state dir).",
        ),
        click.option(
            "--state-dir",
            "client_state_dir",
            envvar="CORRAL_STATE_DIR",
            default=DEFAULT_STATE_DIR,
            show_default=True,
            type=click.Path(file_okay=False),
            help="The server's state dir, to find its URL and admin token [env CORRAL_STATE_DIR].",
        ),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def json_option(fn: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Print the server's JSON answer.")(fn)
