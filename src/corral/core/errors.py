"""One error hierarchy for corral.

Every error a user can cause derives from :class:`CorralError`, so the CLI can print it cleanly and exit with a
non-zero status. Errors about input files carry the file, line, column and the expected form, because a user
with an 82,000-row trace needs to know exactly which cell to fix.

:class:`InvariantViolation` is different in kind: it means corral itself (a policy or the engine) tried to do
something impossible, such as giving out a GPU twice. It is a bug, never the user's fault.
"""

from __future__ import annotations


class CorralError(Exception):
    """Base class of every error corral raises on purpose."""


class ConfigError(CorralError):
    """A bad option: unknown policy, unknown policy option, a value of the wrong type."""


class JobSpecError(CorralError, ValueError):
    """A job description that cannot be a job (zero GPUs, a share above one GPU, a negative duration)."""


class InputError(CorralError):
    """A problem in an input file, located as precisely as we can.

    ``line`` is 1-based and counts the header line, as an editor shows it. ``column`` is the column (field)
    name. ``expected`` says what form the value should have, ``got`` what was found.
    """

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        line: int | None = None,
        column: str | None = None,
        expected: str | None = None,
        got: str | None = None,
    ) -> None:
        self.message = message
        self.file = file
        self.line = line
        self.column = column
        self.expected = expected
        self.got = got
        super().__init__(self._render())

    def _render(self) -> str:
        where = self.file or "<input>"
        if self.line is not None:
            where += f":{self.line}"
        parts = [f"{where}: {self.message}"]
        if self.column is not None:
            parts.append(f"column {self.column!r}")
        if self.expected is not None:
            parts.append(f"expected {self.expected}")
        if self.got is not None:
            parts.append(f"got {self.got!r}")
        return "; ".join(parts)


class TomlError(InputError):
    """A TOML file that cannot be read as TOML: a syntax error, nesting deeper than corral reads, or an integer
    outside TOML's 64-bit range (see :mod:`corral.core.toml`).

    ``syntax`` is tomllib's own message (with its line and column) when the file is not TOML at all, else None,
    so a caller can word a syntax error its own way and pass the other kinds on as they are.
    """

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        line: int | None = None,
        column: str | None = None,
        expected: str | None = None,
        got: str | None = None,
        syntax: str | None = None,
    ) -> None:
        self.syntax = syntax
        super().__init__(message, file=file, line=line, column=column, expected=expected, got=got)


class TraceError(InputError):
    """A malformed row or file in a job trace."""


class ClusterSpecError(InputError):
    """A malformed cluster description (file, preset or inline ``NxG`` form)."""


class InvariantViolation(CorralError):
    """The engine refused a decision that would break a cluster invariant. This is a bug in corral."""
