"""How every ``corral`` command ends on an error: one rule, shared by the replay and the live commands.

An error the user can fix (a :class:`~corral.core.errors.CorralError`: a bad option, a malformed file, a refused
request) is one ``error:`` line and exit status 2. An engine invariant broken
(:class:`~corral.core.errors.InvariantViolation`) is corral's own bug: a ``bug:`` line, then the exception is
raised on so that Python prints its traceback (exit status 1). Anything else is a bug too and keeps its
traceback untouched.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console

from corral.core.errors import CorralError, InvariantViolation

BUG = (
    "[bold red]bug:[/] corral broke one of its own invariants (traceback below); please report it with the command "
    "line and its inputs"
)


@contextmanager
def user_errors(console: Console, shown: Callable[[CorralError], str]) -> Iterator[None]:
    """Run a command's body under the rule above; ``shown`` renders an error's message as safe rich text."""
    try:
        yield
    except InvariantViolation:
        console.print(BUG, highlight=False)
        raise
    except CorralError as exc:
        console.print(f"[bold red]error:[/] {shown(exc)}", highlight=False, markup=True, soft_wrap=True)
        sys.exit(2)
