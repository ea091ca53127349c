"""Trust in what is printed: names escaped (and read back exactly), errors that show no raw
control characters, no trailing spaces, bounded printer output and parser caches."""

import gc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import circuits as C
from circuits.errors import CircuitError, ParseError
from circuits.testing import dags as circuit_strategy
from circuits.text import lexer


def _unprintable(text: str) -> list:
    return [c for c in text if not c.isprintable() and c != "\n"]


@settings(max_examples=300, deadline=None)
@given(name=st.text(st.characters(codec=None, exclude_categories=()), max_size=12))
def test_every_name_round_trips_and_prints_no_raw_control_character(name):
    x = C.Symbol((2,), name=name)
    node = C.Add(x, C.Scalar(1.0, name=name + "'"), name=name)
    text = node.to_text()
    assert not _unprintable(text), text
    assert C.parse(text) == node
    assert not _unprintable(str(node)) and not _unprintable(repr(node))
    assert not _unprintable(C.Circuit._repr_html_(node))


@pytest.mark.parametrize("name, printed", [
    ("bell\x07", r"'bell\x07'"),
    ("esc\x1b[31mred", r"'esc\x1b[31mred'"),
    ("\u202eevil", r"'\u202eevil'"),
    ("tab\tnl\ncr\r", r"'tab\tnl\ncr\r'"),
    ("line\u2028sep", r"'line\u2028sep'"),
    ("tag\U000e0041", r"'tag\U000e0041'"),
    ("lone\ud800", r"'lone\ud800'"),
    ("it's a \\ name", r"'it\'s a \\ name'"),
    ("plain é 漢 😀", "'plain é 漢 😀'"),
])
def test_escapes(name, printed):
    s = C.Symbol((), name=name)
    assert s.to_text() == printed + " [] Symbol"
    assert C.parse(s.to_text()) is s


def test_bad_escapes_are_parse_errors():
    for bad in (r"'a\x4' [] Symbol", r"'a\uzzzz' [] Symbol", r"'a\U00110000' [] Symbol", r"'a\q' [] Symbol"):
        with pytest.raises(ParseError, match="escape"):
            C.parse(bad)


def test_parse_error_shows_the_line_escaped_with_the_caret_in_place():
    line = "  'q\u202e\x07' [2,x] Symbol"
    with pytest.raises(ParseError) as info:
        C.parse("'a' Add\n" + line)
    err = info.value
    assert err.line == line  # the attribute keeps the raw text
    message = str(err)
    assert not _unprintable(message)
    shown, caret = message.split("\n")[-2:]
    assert shown == r"      'q\u202e\x07' [2,x] Symbol"
    assert shown[caret.index("^")] == err.line[err.column - 1] == "2"  # same character as unescaped


def test_node_errors_show_names_escaped():
    with pytest.raises(CircuitError) as info:
        C.Add(C.Symbol((2,), name="a\x1b]0;pwned\x07"), C.Symbol((3,)), name="\u202e")
    assert not _unprintable(str(info.value))


@settings(max_examples=60, deadline=None)
@given(circuit_strategy(max_nodes=15))
def test_no_printed_line_ends_with_a_space(c):
    for options in ({}, {"shapes": True}, {"tree": True}, {"comments": True}):
        for line in c.to_text(**options).split("\n"):
            assert not line.endswith(" "), repr(line)


def test_rearrange_over_a_scalar_prints_without_trailing_space():
    r = C.Rearrange(C.Scalar(1.0), " -> ")
    assert r.to_text() == "0 Rearrange ->\n  1 [] Scalar 1"
    assert C.parse(r.to_text()) == r
    assert C.Rearrange(C.Scalar(1.0, (1,)), "a -> ").payload_text() == "a ->"
    assert C.Rearrange(C.Scalar(1.0), " -> 1").payload_text() == "-> 1"


def test_a_small_text_cannot_print_huge():
    # Two nodes share a long name, so every reference (written in the input as a short serial)
    # prints serial and name: 2,000 references of 5,000 characters from a ~30 kB text.
    long = "n" * 5000
    refs = "\n".join("  0" for _ in range(2000))
    text = f"'top' Add\n  0 '{long}' [1] Symbol\n  1 '{long}' [2] Symbol\n{refs}"
    c = C.parse(text)
    with pytest.raises(CircuitError, match="max_chars"):
        c.to_text(max_chars=1_000_000)
    assert len(c.to_text()) > 10_000_000  # allowed by the default budget
    assert len(str(c)) < 5_000_000  # str() stops at 400 lines


def test_parser_caches_keep_no_big_payload():
    big = "[" + ",".join(["0"] * 5000) + "]"
    with pytest.raises(ParseError):
        C.parse(f"'y' [5000] Index [{big[1:-1]}]\n  'x' [1] Symbol\n  'z'")
    # payloads are cached per parse (circuits.text.parser._Tree); the one global cache is the shapes'
    assert all(len(k) <= lexer.CACHED_PAYLOAD_CHARS for k in lexer._SHAPES)
    assert len(lexer._SHAPES) <= lexer.CACHE_ENTRIES


def test_gen_index_names_from_failed_parses_are_not_kept():
    from circuits.functions import registry as functions

    tried = {f"gen_index_at_{d}" for d in range(700_000, 700_300)}
    for name in sorted(tried):
        with pytest.raises(ParseError):
            C.parse(f"'g' GeneralFunction {name}\n  'x' [2] Symbol\n  'i' [2] Symbol int64")
    gc.collect()
    assert not tried & set(functions._REGISTRY)
    # only the few most recently used stay (strongly held, bounded); the rest are gone
    kept = tried & set(functions._FAMILY_SPECS)
    assert len(kept) <= functions._FAMILY_RECENT_SIZE and kept <= set(functions._FAMILY_RECENT)
