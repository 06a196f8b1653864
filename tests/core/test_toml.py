"""The one TOML reader: a valid document reads exactly as tomllib reads it; every way a text can fail (a syntax
error, nesting deep enough to exhaust Python's stack, an integer beyond TOML's range, bytes that are not UTF-8)
is a TomlError naming the file and line, never another exception."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.core.errors import InputError, TomlError
from corral.core.toml import INT_MAX, INT_MIN, MAX_DEPTH, parse_toml, read_toml

VALID = [
    'name = "lab"\n[[nodes]]\ngpu_type = "T4"\ngpus = 8\n',
    '[server]\nport = 8473\n[[tenants]]\nname = "a"\nquota_gpus = 4\n[[tenants]]\nname = "b"\n',
    # brackets, dots, "=" and "#" inside strings and comments are not structure
    'a = "[[[{{{.=#"  # [[[[ {{{\nb = \'[[.]]\'\nc = """x\\"""[[\n]"""\nd = \'\'\'\n[[[\n\'\'\'\n',
    # a closing run of quotes may hold two more quotes than the delimiter
    'a = """ends with two quotes"""""\nb = [1.5, 2.5e3, {x.y = 1}, [[]]]\n',
    "p.q.r = 1\n[s.t]\nu = [{v = {w = [1]}}]\n[[x.y]]\nz = 2020-01-01T00:00:00Z\n",
    f"big = {INT_MAX}\nsmall = {INT_MIN}\nf = inf\ng = -nan\n",
    "a = [\n  1, # one\n  2,\n]\n",
]


@pytest.mark.parametrize("text", VALID)
def test_valid_documents_read_as_tomllib_reads_them(text: str) -> None:
    assert repr(parse_toml(text, file="x.toml")) == repr(tomllib.loads(text))  # repr: NaN != NaN


def _nested(depth: int, open_: str, close: str, leaf: str = "") -> str:
    return open_ * depth + leaf + close * depth


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("x = 1\na = " + _nested(500, "[", "]"), 2),
        ("x = 1\n\na = " + _nested(500, "{b = ", "}", "1"), 3),
        ("a = 1\n" + "a1." * 2000 + "b = 1\n", 2),  # tomllib parses it; repr() of it would recurse
        ("x = 1\n[" + "t." * 2000 + "u]\nv = 1\n", 2),
        ("a = " + _nested(MAX_DEPTH + 1, "[", "]"), 1),
        ("k" + ".k" * (MAX_DEPTH + 1) + " = 1\n", 1),  # MAX_DEPTH + 1 tables, then the value
    ],
    ids=["arrays-500", "inline-tables-500", "dotted-key-2000", "header-2000", "arrays-limit+1", "dotted-limit+1"],
)
def test_too_deep_is_located(text: str, line: int) -> None:
    with pytest.raises(TomlError) as info:
        parse_toml(text, file="deep.toml")
    err = info.value
    assert (err.file, err.line) == ("deep.toml", line)
    assert err.expected == f"tables and arrays nested at most {MAX_DEPTH} deep"
    assert err.syntax is None
    assert str(err).startswith(f"deep.toml:{line}: ")


def test_up_to_the_limit_reads() -> None:
    arrays = "a = " + _nested(MAX_DEPTH, "[", "]")
    assert parse_toml(arrays) == tomllib.loads(arrays)
    dotted = "k" + ".k" * MAX_DEPTH + " = 1\n"  # MAX_DEPTH tables below the root, then the value
    assert parse_toml(dotted) == tomllib.loads(dotted)


def test_the_column_of_a_deep_key_is_its_path_shortened() -> None:
    with pytest.raises(TomlError) as info:
        parse_toml("[server]\n" + "a." * 100 + "b = 1\n", file="c.toml")
    assert info.value.column == f"server.a.a.a.<{MAX_DEPTH + 1 - 7} more>.a.a.a"
    assert info.value.line == 2


def test_syntax_error_keeps_tomllib_message_and_line() -> None:
    with pytest.raises(TomlError) as info:
        parse_toml('a = 1\nb = "x"\nc = = 3\n', file="s.toml")
    err = info.value
    assert err.line == 3
    assert err.syntax is not None and "(at line 3, column 5)" in err.syntax
    assert err.message == f"not valid TOML: {err.syntax}"
    assert isinstance(err, InputError)


@pytest.mark.parametrize(
    ("text", "line", "column", "got"),
    [
        ("a = 1\nb = 9223372036854775808\n", 2, "b", "9223372036854775808"),
        ("[t]\nx = [1, -9223372036854775809]\n", 2, "t.x[1]", "-9223372036854775809"),
        ("a = 1\nb = " + "1" * 5000 + "\n", 2, None, None),  # int() refuses more than 4,300 digits
        ("a = 1\n\nb = 0x" + "f" * 5000 + "\n", 3, "b", "an integer of 20,000 bits"),  # tomllib reads it; str() cannot
        ("a = 1\nb = 0x1_0000_0000_0000_0000\n", 2, "b", "18446744073709551616"),
    ],
)
def test_integers_beyond_tomls_range(text: str, line: int, column: str | None, got: str | None) -> None:
    with pytest.raises(TomlError) as info:
        parse_toml(text, file="n.toml")
    err = info.value
    assert (err.line, err.column, err.got) == (line, column, got)
    assert err.expected is not None and "64-bit" in err.expected


def test_read_toml(tmp_path: Path) -> None:
    good = tmp_path / "good.toml"
    good.write_text('a = "b"\n')
    assert read_toml(good) == {"a": "b"}
    with pytest.raises(TomlError, match=r"nope\.toml: cannot read the job file: No such file"):
        read_toml(tmp_path / "nope.toml", what="job file")
    latin = tmp_path / "latin.toml"
    latin.write_bytes(b'a = "b"\n\nc = "caf\xe9"\n')
    with pytest.raises(TomlError) as info:
        read_toml(latin, what="job file")
    assert (info.value.line, info.value.message, info.value.expected) == (
        3,
        "not UTF-8 text",
        "a TOML job file (UTF-8 text)",
    )
    deep = tmp_path / "deep.toml"
    deep.write_text("a = " + _nested(500, "[", "]"))
    with pytest.raises(TomlError, match=r"deep\.toml:1: arrays and inline tables nested more than"):
        read_toml(deep)


# -- fuzz: any text gives a document or a located TomlError --------------------------------------------------

_PIECES = st.sampled_from(
    ['[', ']', '{', '}', '[[', ']]', '"', "'", '"""', "'''", "\\", ".", ",", "=", "#", "\n", " ", "a", "b = ",
     "1", "1_0", "9223372036854775808", "1e400", "inf", "true", "2020-01-01", "x.y.z", "\r\n", "\t", "é", "\x00"]
)  # fmt: skip
_TEXTS = st.one_of(
    st.lists(_PIECES, max_size=60).map("".join),
    st.text(max_size=200),
    st.builds(
        lambda n, o, c: "a = " + o * n + c * n, st.integers(0, 300), st.sampled_from("[{"), st.sampled_from("]}")
    ),
    st.builds(lambda n: "k." * n + "v = 1", st.integers(0, 300)),
)


@settings(max_examples=300, deadline=1000, suppress_health_check=[HealthCheck.too_slow])
@given(_TEXTS)
def test_any_text_reads_or_fails_located(text: str) -> None:
    try:
        doc = parse_toml(text, file="f.toml")
    except TomlError as err:
        assert err.file == "f.toml"
        assert err.line is None or 1 <= err.line <= text.count("\n") + 1 + text.count("\r")
        str(err)  # renders without recursing
        return
    assert repr(doc) == repr(tomllib.loads(text))  # what it accepts, it reads as tomllib does
