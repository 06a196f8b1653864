"""The one TOML reader: every TOML file corral reads (cluster files, the serve configuration, job files) goes
through :func:`parse_toml` or :func:`read_toml`, so every way a file can fail to be TOML ends the same way: a
:class:`~corral.core.errors.TomlError` naming the file, the line and, where there is one, the key.

:mod:`tomllib` alone is not enough at the edge. Besides its own ``TOMLDecodeError`` it lets through:

- ``RecursionError`` on arrays or inline tables nested a few hundred deep (``a = [[[[...]]]]``), and on
  anything that walks a document built from a dotted key or table header a thousand keys long, such as
  ``repr`` of a value for an error message;
- ``ValueError`` on an integer of more than 4,300 digits (Python's limit on converting text to ``int``);
- integers beyond TOML's 64-bit range, which the TOML spec says a reader must refuse and which later
  overflow a float conversion.

So the text is scanned once before parsing, and arrays or inline tables nested deeper than :data:`MAX_DEPTH`
are refused with the line where the limit is crossed (tomllib never gets to recurse); the parsed document is
then walked, without recursion, and refused if its tables and arrays nest deeper than :data:`MAX_DEPTH` or
an integer lies outside TOML's range. No file corral reads needs more than four levels.
"""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path
from typing import Any, Final

from corral.core.errors import TomlError

__all__ = ["INT_MAX", "INT_MIN", "MAX_DEPTH", "decode_toml", "parse_toml", "read_toml"]

MAX_DEPTH: Final = 64  # tables and arrays inside one another; corral's own files use at most four
INT_MIN: Final = -(2**63)  # TOML integers are 64-bit signed (toml.io, v1.0.0, "Integer")
INT_MAX: Final = 2**63 - 1

_DEPTH_EXPECTED: Final = f"tables and arrays nested at most {MAX_DEPTH} deep"
_INT_EXPECTED: Final = f"an integer from {INT_MIN} to {INT_MAX} (TOML's 64-bit range)"

# One token of the scan. Strings and comments are consumed whole, so brackets, dots and "=" inside them are not
# seen; the multi-line forms come first, and a string left open runs to the end of its line (or of the file,
# for the multi-line forms), as far as tomllib would read before failing.
_TOKEN: Final = re.compile(
    r'"""(?:\\[\s\S]|[^\\])*?(?:"{3,5}|\Z)'  # multi-line basic string (a closing run may hold 2 more quotes)
    r"|'''[\s\S]*?(?:'{3,5}|\Z)"  # multi-line literal string
    r'|"(?:\\.|[^"\\\n])*"?'  # basic string
    r"|'[^'\n]*'?"  # literal string
    r"|#[^\n]*"  # comment
    r"|[\[\]{}.,=\n]"  # what the scan counts
    r"|[ \t\r]+"  # blanks
    r"|[^\"'#\[\]{}.,=\n \t\r]+"  # anything else: bare keys and values
)
_BLANK: Final = frozenset(" \t\r")
_COUNTED: Final = frozenset("[]{}.,=")
# A run of more digits than int() converts (4,300): where tomllib's ValueError came from.
_LONG_NUMBER: Final = re.compile(r"[0-9A-Fa-f_]{4301,}")
# A hexadecimal, octal or binary literal too long for 64 bits: where an integer out of range may be written.
_LONG_LITERAL: Final = re.compile(r"0(?:x[0-9A-Fa-f_]{17,}|o[0-7_]{22,}|b[01_]{65,})")


def read_toml(path: str | os.PathLike[str], *, what: str = "file") -> dict[str, Any]:
    """The document in the TOML file ``path``. ``what`` names the file in messages ("job file").

    A file that cannot be read, is not UTF-8 (the line of the first bad byte is named) or is not TOML raises
    :class:`~corral.core.errors.TomlError`.
    """
    file = os.fspath(path)
    try:
        raw = Path(file).read_bytes()
    except OSError as err:
        raise TomlError(f"cannot read the {what}: {err.strerror or err}", file=file) from None
    except ValueError as err:  # a NUL byte in the name
        raise TomlError(f"cannot read the {what}: {err}", file=file) from None
    return parse_toml(decode_toml(raw, file=file, what=what), file=file)


def decode_toml(raw: bytes, *, file: str | None = None, what: str = "file") -> str:
    """The text of a TOML file's bytes (TOML is UTF-8); bytes that are not UTF-8 raise a
    :class:`~corral.core.errors.TomlError` naming the line of the first bad one."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise TomlError(
            "not UTF-8 text",
            file=file,
            line=raw.count(b"\n", 0, err.start) + 1,
            expected=f"a TOML {what} (UTF-8 text)",
            got=repr(raw[err.start : err.start + 4]),
        ) from None


def parse_toml(text: str, *, file: str | None = None) -> dict[str, Any]:
    """The document in ``text``, TOML read from ``file`` (the name used in errors; None: ``<input>``).

    Raises :class:`~corral.core.errors.TomlError` for a syntax error (``syntax`` holds tomllib's message),
    nesting deeper than :data:`MAX_DEPTH`, or an integer outside TOML's 64-bit range; never another exception.
    """
    too_deep_line, deepest_line = _scan(text)
    if too_deep_line is not None:
        raise TomlError(
            f"arrays and inline tables nested more than {MAX_DEPTH} deep",
            file=file,
            line=too_deep_line,
            expected=_DEPTH_EXPECTED,
        )
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        m = re.search(r"at line (\d+)", str(err))
        # tomllib says "(at end of document)" instead of a line when the text stops short: the last line written.
        line = int(m.group(1)) if m else text.rstrip().count("\n") + 1
        raise TomlError(f"not valid TOML: {err}", file=file, line=line, syntax=str(err)) from None
    except ValueError:
        # Not TOMLDecodeError (caught above): int() refused a number too long to convert.
        raise TomlError(
            "not valid TOML: a number too long to read",
            file=file,
            line=_line_of(text, _LONG_NUMBER),
            expected=_INT_EXPECTED,
        ) from None
    except RecursionError:  # the scan should make this unreachable; kept so that no input gives a traceback
        raise TomlError("nested too deep to read", file=file, line=deepest_line, expected=_DEPTH_EXPECTED) from None
    _check(doc, text, file, deepest_line)
    return doc


def _scan(text: str) -> tuple[int | None, int | None]:
    """(the line where arrays and inline tables open more than MAX_DEPTH deep, else None; the line that looks
    deepest, counting table headers, dotted keys and brackets, for locating a document that is too deep).

    Linear in the text: one regular-expression token at a time, no recursion.
    """
    line = 1
    brackets: list[tuple[str, int]] = []  # open "[" or "{" in a value, each with the dots of its current key
    top_dots = 0  # dots in the current top-level key ("a.b.c = 1" has 2)
    dots = 0  # all dots of the keys being read, at every level
    table_depth = 0  # the depth of the table the last header opened
    header: int | None = None  # inside a header: its dots so far (a [[...]] header counts one more)
    line_start = True  # nothing but blanks yet on this line, outside brackets
    key = False  # reading a key (until its "=")
    deepest, deepest_line = 0, None
    for m in _TOKEN.finditer(text):
        tok = m.group()
        c = tok[0]
        if c == "\n":
            line += 1
            if not brackets:
                dots -= top_dots
                top_dots = 0
                line_start, key, header = True, False, None
            continue
        if c not in _COUNTED:  # a string, a comment, blanks, or a bare word
            if c in _BLANK or c == "#":
                continue
            line += tok.count("\n")  # a multi-line string
            if line_start:
                line_start, key = False, True
            continue
        if line_start:
            line_start = False
            if c == "[":
                header = 0
                continue
            key = True
        if header is not None:
            if c in "[.":  # the second bracket of [[...]], or a dot: one level more either way
                header += 1
            elif c == "]":
                table_depth, header = header + 1, None
                if table_depth > deepest:
                    deepest, deepest_line = table_depth, line
            continue
        if key and c == ".":
            dots += 1
            if brackets:
                kind, n = brackets[-1]
                brackets[-1] = (kind, n + 1)
            else:
                top_dots += 1
        elif c == "=":
            key = False
        elif c in "[{":
            brackets.append((c, 0))
            if len(brackets) > MAX_DEPTH:
                return line, line
            key = c == "{"
        elif c in "]}":
            if brackets:
                dots -= brackets.pop()[1]
            key = False
        elif c == "," and brackets and brackets[-1][0] == "{":
            dots -= brackets[-1][1]
            brackets[-1] = ("{", 0)
            key = True
        depth = table_depth + dots + len(brackets)
        if depth > deepest:
            deepest, deepest_line = depth, line
    return None, deepest_line


def _check(doc: dict[str, Any], text: str, file: str | None, deepest_line: int | None) -> None:
    """Refuse a document nested deeper than MAX_DEPTH or holding an integer outside TOML's range (no recursion)."""
    todo: list[tuple[Any, int, tuple[str | int, ...]]] = [(doc, 0, ())]
    while todo:
        value, depth, path = todo.pop()
        if isinstance(value, dict):
            children = value.items()
        elif isinstance(value, list):
            children = enumerate(value)  # type: ignore[assignment]
        else:
            if isinstance(value, int) and not isinstance(value, bool) and not INT_MIN <= value <= INT_MAX:
                raise _out_of_range(value, text, file, _path(path))
            continue
        if depth > MAX_DEPTH:
            raise TomlError(
                f"tables and arrays nested more than {MAX_DEPTH} deep",
                file=file,
                line=deepest_line,
                column=_path(path),
                expected=_DEPTH_EXPECTED,
            )
        for key, child in children:
            if isinstance(child, dict | list | int):  # strings, floats, dates: nothing to check
                todo.append((child, depth + 1, (*path, key)))


def _out_of_range(value: int, text: str, file: str | None, column: str) -> TomlError:
    """The error for an integer beyond TOML's range, found where its digits are written (decimal), else at the
    first long hexadecimal, octal or binary literal."""
    line = None
    if value.bit_length() <= 256:  # str() of it is cheap and short; tomllib reads hex of any length, str() cannot
        got = str(value)
        line = _line_of(text, re.compile(rf"(?<![0-9_]){re.escape(got)}(?![0-9_])"))
    else:
        got = f"an integer of {value.bit_length():,} bits"
    if line is None:
        line = _line_of(text, _LONG_LITERAL)
    return TomlError("integer out of range", file=file, line=line, column=column, expected=_INT_EXPECTED, got=got)


def _path(path: tuple[str | int, ...]) -> str:
    """A key path as written in errors elsewhere (``nodes[2].gpus``), its middle left out when it is long."""
    if len(path) > 8:
        return f"{_path(path[:4])}.<{len(path) - 7} more>.{_path(path[-3:])}".replace(".[", "[")
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else part
    return out


def _line_of(text: str, pattern: re.Pattern[str]) -> int | None:
    m = pattern.search(text)
    return None if m is None else text.count("\n", 0, m.start()) + 1
