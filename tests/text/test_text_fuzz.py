"""Fuzz: any text parses to circuits or raises ParseError, never anything else.

Inputs: random text, random lines built from the format's own tokens, and valid texts (the seed
and generated circuits printed with every option) mutated by inserting, deleting and replacing
characters, duplicating, dropping and swapping lines, and re-indenting them.  rust_circuit's
syntax is covered the same way: Module argument lines (``! 'sym' ftt``), Scatter, symbolic sizes
(``0s``, ``2*1s``), SetSymbolicShape and DiscreteVar, hand-written and drawn by the strategies.
"""

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from circuits import Array, Circuit, ParseError, Symbol, toposort
from circuits.text import parse_many, print_many, to_text

SEED_TEXT = (Path(__file__).resolve().parents[1] / "golden" / "attn_only_loss.txt").read_text(encoding="utf-8")
SEED_LINES = SEED_TEXT.split("\n")

TOKENS = [
    "'a'", "'b'", "'it\\'s'", "0", "1", "7", "20", "[]", "[2]", "[2,3]", "[3,2]", "[300,256]", "[0,:,:]",
    "[:-2]", "[1:-1]", "[::2]", "[[1,0],:]", "Array", "Scalar", "Symbol", "Einsum", "Add", "GeneralFunction",
    "Index", "Rearrange", "Concat", "Tag", "ab,bc->ac", "a,->a", "->", "ab->b", "softmax", "gen_index_at_0_c",
    "exp", "(a b) -> a b a=2", "a b -> b a", "00000000-0000-0000-0000-000000000001", "int64", "nan", "-1",
    "0.00001", "abc123", "~", "#", "...", "├─", "│", "\x1b[1m", "\x1b[0m", "\\", "'", "  ", "\t", "-", ":",
    # rust_circuit's syntax: modules, scatters, symbolic sizes, and sizes past 2**63
    "Module", "Scatter", "SetSymbolicShape", "DiscreteVar", "!", "! 'a'", "! 'a' ftt", "ftt", "ttt", "0s", "[0s]",
    "[2*1s]", "[0s,3]", "[0s*0s*1s*3s]", "[0s*0s*1s*3s*4s]", "[9223372036854775808]", "[0:9223372036854775808]",
    "[0:2,1:3]", "[18446744073709551616,2]", "[0,4611686018427387904]", "├‣", "└‣",
]


def check(text):
    try:
        roots = parse_many(text)
    except ParseError as e:
        assert isinstance(e.expected, str) and e.expected
        if e.line_number is not None:
            assert e.line is not None
            assert e.line_number >= 1
        return None
    assert roots and all(isinstance(r, Circuit) for r in roots)
    # Whatever parsed prints and parses back to the same circuits; an Array with a value (an
    # 'Array' line without hash gets random values) comes back a placeholder, which is never
    # equal to it (no store), so then the text is what must come back the same.
    text = print_many(roots)
    again = parse_many(text)
    if any(type(n) is Array and n.value is not None for n in toposort(roots)):
        assert print_many(again) == text
    else:
        assert again == roots
    return roots


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200))
def test_random_text(text):
    check(text)


@st.composite
def token_lines(draw):
    lines = []
    for _ in range(draw(st.integers(1, 8))):
        indent = "  " * draw(st.integers(0, 3))
        words = draw(st.lists(st.sampled_from(TOKENS), min_size=1, max_size=6))
        lines.append(indent + " ".join(words))
    return "\n".join(lines)


@settings(max_examples=300, deadline=None)
@given(token_lines())
def test_token_soup(text):
    check(text)


@st.composite
def mutated(draw, lines):
    lines = list(lines)
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.integers(0, 6))
        i = draw(st.integers(0, len(lines) - 1))
        line = lines[i]
        if kind == 0 and line:  # replace a character
            j = draw(st.integers(0, len(line) - 1))
            lines[i] = line[:j] + draw(st.sampled_from(list("'[]0123456789,:- ab#\\~.\t") + ["", "  "])) + line[j + 1:]
        elif kind == 1:  # insert a token
            j = draw(st.integers(0, len(line)))
            lines[i] = line[:j] + draw(st.sampled_from(TOKENS)) + line[j:]
        elif kind == 2 and len(lines) > 1:  # drop a line
            del lines[i]
        elif kind == 3:  # duplicate a line
            lines.insert(i, line)
        elif kind == 4:  # re-indent a line
            lines[i] = " " * draw(st.integers(0, 12)) + line.lstrip(" ")
        elif kind == 5:  # swap two lines
            j = draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
        else:  # truncate a line
            lines[i] = line[: draw(st.integers(0, len(line)))]
    return "\n".join(lines)


def _seed_subtrees():
    from circuits import parse, toposort

    nodes = toposort(parse(SEED_TEXT))
    # Subtrees of a few sizes, each printed on its own (so its text is valid before mutation).
    return [to_text(n).split("\n") for n in nodes[::7] if 3 <= to_text(n).count("\n") <= 60]


SEED_SUBTREES = _seed_subtrees()


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(range(len(SEED_SUBTREES))).flatmap(lambda i: mutated(SEED_SUBTREES[i])))
def test_mutated_seed_subtrees(text):
    check(text)


@settings(max_examples=15, deadline=None)
@given(mutated(SEED_LINES))
def test_mutated_whole_seed(text):
    check(text)


def _printed_examples():
    from circuits import Add, Einsum, GeneralFunction, Index, Rearrange, Scalar, Tag

    x = Symbol((2, 3), name="x")
    e = GeneralFunction("exp", x, name="e")
    c = Add(Einsum.from_spec("ab,ab->b", e, x, name="y"), Scalar(1.0, (3,)), name="s")
    d = Tag(Rearrange(Index(c, (slice(None, None, -1),)), "a -> a"), "00000000-0000-0000-0000-000000000002")
    texts = []
    for opts in ({}, dict(tree=True), dict(color=True, comments=True), dict(max_indent=1), dict(shapes=True)):
        texts.append(print_many([c, d], **opts).split("\n"))
    return texts


PRINTED = _printed_examples()


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(range(len(PRINTED))).flatmap(lambda i: mutated(PRINTED[i])))
def test_mutated_printed_options(text):
    check(text)


def _fast_and_slow_agree(line):
    """The parser reads printer-style lines with ``FAST_LINE``; ``read_line`` reads every line.
    Where the fast path accepts a line, both must read the same fields."""
    from circuits.text.lexer import FAST_LINE, read_line, read_shape

    m = FAST_LINE.match(line)
    if m is None:
        return
    indent, serial, name, shape, type_name, payload = m.groups()
    if (type_name is None and (shape is not None or (serial is None and name is None))) or len(indent) & 1:
        return  # the parser hands these to read_line
    try:
        shape = read_shape(shape, 1, line, 0) if shape is not None else None
    except ParseError:
        return
    fast = (len(indent) >> 1, False, int(serial) if serial else None, name, shape, type_name,
            payload.rstrip(" ") if payload else None, m.start("payload") if payload else 0, None)
    assert read_line(line, 1) == fast


@settings(max_examples=150, deadline=None)
@given(st.one_of(token_lines(),
                 st.sampled_from(range(len(PRINTED))).flatmap(lambda i: mutated(PRINTED[i])),
                 st.sampled_from(range(len(SEED_SUBTREES))).flatmap(lambda i: mutated(SEED_SUBTREES[i]))))
def test_fast_line_reader_agrees_with_full_reader(text):
    for line in text.split("\n"):
        _fast_and_slow_agree(line)


# ---------------------------------------------------------------------------- rust_circuit's syntax
RUST_EXAMPLES = [
    """'double' Module
  'body' Add
    'x' [0s] Symbol
    'x'
  'arg' [3] Scalar 1.5 ! 'x'""",
    """'m' Module
  'body' Einsum ab,b->a
    'w' [2,0s] Symbol
    'v' [0s] Symbol
  'w.arg' [2,3] Scalar 0.5 ! 'w' ftt
  'v.arg' [3] Scalar 2 ! 'v' ttf""",
    """'s' Add
  'sc' [5,3,6] Scatter [0:5,0:3,0:3]
    'a' [5,3,3] Scalar 1
  'sc1' [3,1] Scatter [0:2,0:1]
    'b' [2,1] Scalar 2""",
    """'r' Rearrange a b c -> (a b c)
  'c' [1s,3s,1s] Symbol 0b108f80-b37f-4e2c-821f-45cbedcbde75""",
    """'set' [0s,3] SetSymbolicShape
  'y' [2,3] Scalar 1""",
    """'dv' DiscreteVar
  'vals' [4,2] Scalar 1
  'group' Tag 2ef9f1ac-28bb-4bed-ab7b-09b9050483ac
    'probs' [4] Scalar 0.25""",
]


def _rust_printed():
    from circuits import parse

    texts = []
    for text in RUST_EXAMPLES:
        c = parse(text)
        for opts in ({}, dict(rust=True), dict(tree=True, rust=True), dict(shapes=True, comments=True),
                     dict(color=True)):
            texts.append(to_text(c, **opts).split("\n"))
    return texts


RUST_PRINTED = _rust_printed()


def test_rust_examples_parse_and_round_trip():
    for lines in RUST_PRINTED:
        assert check("\n".join(lines)) is not None


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(range(len(RUST_PRINTED))).flatmap(lambda i: mutated(RUST_PRINTED[i])))
def test_mutated_rust_syntax(text):
    check(text)


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_drawn_rust_circuits_print_parse_and_survive_mutation(data):
    from circuits.testing import dags
    from circuits.testing.strategies import ALL_TYPES, RUST_TYPES

    c = data.draw(dags(types=(*ALL_TYPES, *RUST_TYPES), max_nodes=10))
    opts = data.draw(st.sampled_from([{}, dict(rust=True), dict(tree=True), dict(shapes=True)]))
    text = to_text(c, **opts)
    assert check(text) is not None
    check(data.draw(mutated(text.split("\n"))))
