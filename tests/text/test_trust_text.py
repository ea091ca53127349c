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


# ---------------------------------------------------------------------------- issue 21
HOSTILE = "a\x1b[31m\x07\x9b\u202e"  # ESC (a colour), BEL, C1 CSI, a right-to-left override


def _hostile_circuit(name=HOSTILE):
    import numpy as np

    x = C.Symbol((2,), name=name + ".q")
    k = C.Einsum.from_spec("a,a->a", x, x, name=name + ".k")
    return C.Add(k, C.Array(np.ones(2, np.float32), name=name + ".w"), name=name)


def test_summary_diff_cost_and_describe_show_no_raw_control_character():
    c = _hostile_circuit()
    other = C.Add(c.children[0], C.Scalar(2.0, (2,), name="s" + HOSTILE), name=HOSTILE)
    views = {
        "summary": str(C.summary(c)), "summary html": C.summary(c)._repr_html_(),
        "diff": str(C.diff(c, other)), "diff html": C.diff(c, other)._repr_html_(),
        "cost": str(C.cost(c)), "cost table": C.cost(c).table(), "cost html": C.cost(c)._repr_html_(),
        "summary of repeats": str(C.summary(c, repeats=1)), "full diff": str(C.diff(c, other, full=True)),
        "circuit html": c._repr_html_(),
    }
    for what, text in views.items():
        assert not _unprintable(text), (what, [hex(ord(ch)) for ch in _unprintable(text)])
        assert "\\x1b[31m" in text, what  # shown escaped, not dropped


def test_the_diff_view_keeps_a_quote_in_a_path_inside_its_attribute():
    c = C.Add(C.Symbol((2,), name="x"), name="p' onmouseover='alert(1)")
    page = C.diff(c, C.Add(C.Symbol((2,), name="y"), name="p' onmouseover='alert(1)"), full=True)._repr_html_()
    from html.parser import HTMLParser

    attributes = []

    class Attributes(HTMLParser):
        def handle_starttag(self, tag, attrs):
            attributes.extend(name for name, _ in attrs)

    Attributes().feed(page)
    assert "title" in attributes and "onmouseover" not in attributes


def test_the_sweep_result_shows_no_raw_control_character():
    import numpy as np

    from circuits.interp import sweep

    x = C.Array(np.arange(4, dtype=np.float32), name="x")
    total = C.Add(C.Einsum.from_spec("a,->a", x, C.Scalar(2.0)), x, name="total")
    zero = C.Array(np.zeros(4, np.float32), name="zero")
    result = sweep(total, {"drop" + HOSTILE: C.traversal.replace(total, {x: zero})})
    for text in (repr(result), result.table(), result._repr_html_()):
        assert not _unprintable(text) and "\\x1b" in text


def test_errors_quoting_a_path_show_no_raw_control_character(tmp_path):
    path = tmp_path / ("no" + HOSTILE + ".circuit")
    for action in (lambda: C.load(path), lambda: C.save(C.Symbol((2,)), tmp_path / HOSTILE / "x.circuit")):
        with pytest.raises(CircuitError) as info:
            action()
        assert not _unprintable(str(info.value)) and "\\x1b[31m" in str(info.value)


def test_every_library_error_message_is_printable():
    for cls in (CircuitError, C.EvaluationError, C.ShapeError):
        message = str(cls("bad /tmp/" + HOSTILE + "\nsecond line"))
        assert not _unprintable(message) and message.endswith("\nsecond line")


def test_the_html_view_of_a_small_text_stays_small():
    # 2 nodes with 60,000-character names, referred to 600 times: a 0.12 MB text whose notebook
    # view was 30-50 MB and str() 24-40 MB
    long = "n" * 60_000
    refs = "\n".join("  0" for _ in range(600))
    c = C.parse(f"'top' Add\n  0 '{long}' [1] Symbol\n  1 '{long}' [2] Symbol\n{refs}")
    assert len(c._repr_html_()) < 500_000
    assert len(str(c)) < 500_000 and len(repr(c)) < 500_000
    assert "n" * 150 in c._repr_html_() and "…" in c._repr_html_()  # cut, not dropped
    assert len(c.to_text()) > 30_000_000  # the text itself is whole (allowed by the default budget)


def test_max_line_chars_cuts_long_lines_only():
    c = C.Add(C.Symbol((2,), name="x" * 50), C.Symbol((2,), name="y"), name="z")
    text = c.to_text(max_line_chars=20)
    assert text.split("\n") == ["'z' Add", "  '" + "x" * 16 + "…", "  'y' [2] Symbol"]
    assert c.to_text(max_line_chars=10_000) == c.to_text()


def test_a_module_argument_line_ending_in_a_bare_bang_is_a_parse_error():
    base = "'m' Module\n  'body' Add\n    'x' [0s] Symbol\n  'arg' [3] Scalar 1.5 ! {}"
    for info in ("'y' [3] Symbol !", "'y' [3] Symbol float99", "'y' [3] Scalar !", "", "!"):
        with pytest.raises(ParseError) as err:  # the first three raised a raw TypeError
            C.parse(base.format(info))
        message = str(err.value)
        if err.value.column is not None:  # the caret sits under the character at fault
            shown, caret = message.split("\n")[-2:]
            assert shown[caret.index("^")] == err.value.line[err.value.column - 1]


@pytest.mark.parametrize("shape", ["[9223372036854775808]", "[99999999999999999999999]", "[18446744073709551616,2]"])
def test_scatter_shapes_past_int64_are_parse_errors(shape):
    with pytest.raises(ParseError, match="2\\*\\*63"):  # was struct.error / OverflowError
        C.parse(f"'s' {shape} Scatter [0:2]\n  'a' [2] Scalar 1")


def test_scatter_refuses_a_negative_or_huge_shape():
    for shape in ((-1,), (2**64,)):
        with pytest.raises(C.ShapeError, match="sizes are 0 to 2"):
            C.Scatter(C.Scalar(1.0, (2,)), (slice(0, 2),), shape)


def _doubling(levels):
    x = C.Symbol((2,), name="x")
    for i in range(levels):
        x = C.Add(x, x, name=f"d{i}")
    return x


def test_number_leaves_on_a_doubling_dag_refuses_at_once():
    # its tree has 2**41 lines: refused after counting them over the DAG, not after writing 67M
    # of them (37-73 s and 3.7 GB before)
    with pytest.raises(CircuitError, match="number_leaves prints 'd39' Add as a tree"):
        _doubling(40).to_text(number_leaves=True)
    # within the budget it prints as before; depth and max_lines bound the tree
    assert len(_doubling(4).to_text(number_leaves=True).split("\n")) == 2**5 - 1
    assert len(_doubling(40).to_text(number_leaves=True, depth=3).split("\n")) == 2**4 - 1 + 2**3
    assert len(_doubling(40).to_text(number_leaves=True, max_lines=100).split("\n")) == 101


def test_number_leaves_refuses_before_walking_the_tree(monkeypatch):
    from circuits.text import printer

    walked = []
    real = printer._child_infos
    monkeypatch.setattr(printer, "_child_infos", lambda node: walked.append(node) or real(node))
    with pytest.raises(CircuitError, match="as a tree, which is over 1000 lines"):
        _doubling(40).to_text(number_leaves=True, max_chars=4000)
    assert walked == []  # counted over the DAG's 41 nodes, not found out line by line


@settings(max_examples=60, deadline=None)
@given(circuit_strategy(max_nodes=15), st.sampled_from([None, 0, 1, 2, 3]), st.booleans())
def test_the_tree_line_count_is_the_printed_line_count(c, depth, as_traversal):
    from circuits.text.printer import _tree_lines

    opts = dict(number_leaves=True)
    if depth is not None:
        opts["traversal" if as_traversal else "depth"] = depth + 1 if as_traversal else depth
    printed = len(c.to_text(**opts).split("\n"))
    cut = None if depth is None else depth
    assert _tree_lines(c, cut, None, as_traversal and depth is not None, 10**9) == printed


# ---------------------------------------------------------------------------- issue 33 item 10
def test_a_random_array_of_a_parsed_text_peaks_at_its_own_size():
    """Drawn piece by piece into the memory the Array keeps: the peak is the tensor plus one piece,
    not a float64 draw or a second copy on top of it (a legal 2.6 GiB 'Array rand' under a 4 GiB
    budget ran out of memory)."""
    import tracemalloc

    from circuits.nodes.leaves import RandomTensors

    n = 8 * RandomTensors.PIECE
    nbytes = n * 4
    gc.collect()
    tracemalloc.start()
    try:
        node = C.parse(f"'r' [{n}] Array rand")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert node.value.dtype == "float32" and node.value.nbytes == nbytes
    piece = RandomTensors.PIECE * 8  # one piece of float64 standard normal draws
    assert peak < nbytes + piece + (1 << 20), (peak, nbytes)
