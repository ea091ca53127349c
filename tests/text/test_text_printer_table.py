"""Golden printer table: rows of (circuit, print options, expected text), written by hand.

Every row also parses back (with its circuit's tensors and placeholder dtypes, ``store_of``): to
the same circuit, or (``names=False``) to its name-stripped version; depth-limited views refuse to
parse.
"""

import uuid

import numpy as np
import pytest

import circuits as C
from circuits import (
    Add,
    Array,
    Concat,
    DiscreteVar,
    Einsum,
    GeneralFunction,
    Index,
    Module,
    ModuleArgSpec,
    ModuleSpec,
    Rearrange,
    Scalar,
    Scatter,
    SetSymbolicShape,
    Symbol,
    Tag,
)
from circuits.hashing import content_hash
from circuits.shapes import symbolic_size
from circuits.testing import store_of
from circuits.text import parse, parse_many, print_many, to_text

U1 = uuid.UUID("00000000-0000-0000-0000-000000000001")
U2 = uuid.UUID("12345678-1234-5678-1234-567812345678")

x = Symbol((2, 3), name="x")
w = Array.placeholder((3, 4), "abcdef0123", name="w")
toks = Array.placeholder((5,), "0f0f", name="toks", dtype="int64")
table = Array.placeholder((7, 3), "7ab1e", name="table")
m_in = Symbol((symbolic_size(0), 3), name="m.in")
y = Einsum.from_spec("ab,bc->ac", x, w, name="y")
e1 = GeneralFunction("exp", x, name="e1")
e2 = GeneralFunction("exp", e1, name="e2")
e3 = GeneralFunction("exp", e2, name="e3")
e4 = GeneralFunction("exp", e3, name="e4")
anon = Add(x, Scalar(1.0))  # unnamed, used twice below
# Two distinct nodes named 'h': both get serials; references repeat serial and name.
h0 = GeneralFunction("relu", x, name="h")
h1 = GeneralFunction("tanh", x, name="h")

ROWS = [
    # ---- leaves
    (w, {}, "'w' [3,4] Array abcdef0123"),
    (w.rename(None), {}, "0 [3,4] Array abcdef0123"),
    (toks, {}, "'toks' [5] Array 0f0f"),
    (Scalar(1e-5, name="ln.c.eps"), {}, "'ln.c.eps' [] Scalar 0.00001"),
    (Scalar(-10000.0, (1,), name="neg_inf"), {}, "'neg_inf' [1] Scalar -10000"),
    (Scalar(1.0, (2, 3)), {}, "0 [2,3] Scalar 1"),
    (Scalar(0.1), {}, "0 [] Scalar 0.1"),
    (Scalar(-0.0), {}, "0 [] Scalar -0"),
    (Scalar(float("nan")), {}, "0 [] Scalar nan"),
    (Scalar(float("inf")), {}, "0 [] Scalar inf"),
    (Scalar(float("-inf")), {}, "0 [] Scalar -inf"),
    (Scalar(1e20), {}, "0 [] Scalar 100000000000000000000"),
    (Scalar(2.5e-7), {}, "0 [] Scalar 0.00000025"),
    (x, {}, "'x' [2,3] Symbol"),
    (Symbol((300,), name="tokens", dtype="int64"), {}, "'tokens' [300] Symbol int64"),
    (Symbol((), name="s", uuid=U1), {}, "'s' [] Symbol 00000000-0000-0000-0000-000000000001"),
    (Symbol((4,), dtype="float64", uuid=U2), {}, "0 [4] Symbol float64 12345678-1234-5678-1234-567812345678"),
    # ---- operations
    (y, {}, "'y' Einsum ab,bc->ac\n  'x' [2,3] Symbol\n  'w' [3,4] Array abcdef0123"),
    (Einsum(in_axes=(), out_axes=()), {}, "0 Einsum ->"),
    (Einsum.from_spec("Ah,z,A->Az", x, Scalar(-1.0, (1,), name="neg"), Scalar(0.5, (2,))), {},
     "0 Einsum Ah,z,A->Az\n  'x' [2,3] Symbol\n  'neg' [1] Scalar -1\n  1 [2] Scalar 0.5"),
    (Einsum.from_spec("aa->a", Scalar(1.0, (3, 3)), name="diag"), {}, "'diag' Einsum aa->a\n  0 [3,3] Scalar 1"),
    (Add(name="zero"), {}, "'zero' Add"),
    (Add(x, Scalar(2.0, (3,)), name="s"), {}, "'s' Add\n  'x' [2,3] Symbol\n  0 [3] Scalar 2"),
    (GeneralFunction("softmax", x, name="p"), {}, "'p' GeneralFunction softmax\n  'x' [2,3] Symbol"),
    (GeneralFunction("gen_index_at_0_c", table, toks, name="emb"), {},
     "'emb' GeneralFunction gen_index_at_0_c\n  'table' [7,3] Array 7ab1e\n  'toks' [5] Array 0f0f"),
    (Index(Array.placeholder((8, 32, 256), "57386365", name="a0.w.q"), (0, slice(None), slice(None)),
           name="a0.w.q.head0"), {},
     "'a0.w.q.head0' [32,256] Index [0,:,:]\n  'a0.w.q' [8,32,256] Array 57386365"),
    (Index(toks, (slice(None, -2),), name="i"), {}, "'i' [3] Index [:-2]\n  'toks' [5] Array 0f0f"),
    (Index(toks, (slice(1, -1),)), {}, "0 [3] Index [1:-1]\n  'toks' [5] Array 0f0f"),
    (Index(toks, (slice(None, None, 2),)), {}, "0 [3] Index [::2]\n  'toks' [5] Array 0f0f"),
    (Index(toks, (slice(None, None, -1),)), {}, "0 [5] Index [::-1]\n  'toks' [5] Array 0f0f"),
    (Index(toks, (slice(0, 4, 1),)), {}, "0 [4] Index [0:4:1]\n  'toks' [5] Array 0f0f"),
    (Index(toks, (slice(None, None),)), {}, "0 [5] Index [:]\n  'toks' [5] Array 0f0f"),
    (Index(toks, ()), {}, "0 [5] Index []\n  'toks' [5] Array 0f0f"),
    (Index(x, (np.array([1, 0, 1]), slice(None))), {}, "0 [3,3] Index [[1,0,1],:]\n  'x' [2,3] Symbol"),
    (Index(x, (-1, np.array([], np.int64)))
     , {}, "0 [0] Index [-1,[]]\n  'x' [2,3] Symbol"),
    (Rearrange(Scalar(0.0, (6, 5)), "(h d) s -> h s d", h=2, name="r"), {},
     "'r' Rearrange (h d) s -> h s d h=2\n  0 [6,5] Scalar 0"),
    (Rearrange(x, "a b -> b a"), {}, "0 Rearrange a b -> b a\n  'x' [2,3] Symbol"),
    (Rearrange(x, "a b -> a r b", r=4), {}, "0 Rearrange a b -> a r b r=4\n  'x' [2,3] Symbol"),
    (Rearrange(x, "a b -> a 1 b"), {}, "0 Rearrange a b -> a 1 b\n  'x' [2,3] Symbol"),
    (Concat(x, Scalar(0.0, (2, 1)), axis=1, name="cat"), {}, "'cat' Concat 1\n  'x' [2,3] Symbol\n  0 [2,1] Scalar 0"),
    (Tag(x, U1, name="t"), {}, "'t' Tag 00000000-0000-0000-0000-000000000001\n  'x' [2,3] Symbol"),
    # ---- sharing, serials, references
    (Add(x, x, name="twice"), {}, "'twice' Add\n  'x' [2,3] Symbol\n  'x'"),
    (Add(anon, anon, name="z"), {}, "'z' Add\n  0 Add\n    'x' [2,3] Symbol\n    1 [] Scalar 1\n  0"),
    (Add(h0, h1, h0, h1, name="hs"), {},
     "'hs' Add\n  0 'h' GeneralFunction relu\n    'x' [2,3] Symbol\n  1 'h' GeneralFunction tanh\n"
     "    'x'\n  0 'h'\n  1 'h'"),
    (Add(h0, e1, name="h"), {}, "0 'h' Add\n  1 'h' GeneralFunction relu\n    'x' [2,3] Symbol\n  'e1' GeneralFunction exp\n    'x'"),
    # ---- names that need escapes
    (Scalar(1.0, name="it's"), {}, "'it\\'s' [] Scalar 1"),
    (Scalar(1.0, name="back\\slash"), {}, "'back\\\\slash' [] Scalar 1"),
    (Scalar(1.0, name="two\nlines\r"), {}, "'two\\nlines\\r' [] Scalar 1"),
    (Scalar(1.0, name="# not a comment"), {}, "'# not a comment' [] Scalar 1"),
    (Scalar(1.0, name=""), {}, "'' [] Scalar 1"),
    (Scalar(1.0, name=" spaced  ∑ name "), {}, "' spaced  ∑ name ' [] Scalar 1"),
    (Add(Scalar(1.0, name="7"), name="7 'x'"), {}, "'7 \\'x\\'' Add\n  '7' [] Scalar 1"),
    # ---- options
    (e3, dict(depth=0), "'e3' GeneralFunction exp\n  ..."),
    (e3, dict(depth=1), "'e3' GeneralFunction exp\n  'e2' GeneralFunction exp\n    ..."),
    (e3, dict(depth=3), "'e3' GeneralFunction exp\n  'e2' GeneralFunction exp\n    'e1' GeneralFunction exp\n"
                        "      'x' [2,3] Symbol"),
    (y, dict(shapes=True), "'y' [2,4] Einsum ab,bc->ac\n  'x' [2,3] Symbol\n  'w' [3,4] Array abcdef0123"),
    (Add(toks, toks, name="t2"), dict(comments=True),
     "'t2' Add  # [5] int64\n  'toks' [5] Array 0f0f  # [5] int64\n  'toks'  # [5] int64"),
    (Add(x, x, name="s"), dict(color=True),
     "\x1b[1m's'\x1b[0m \x1b[34mAdd\x1b[0m\n  \x1b[1m'x'\x1b[0m \x1b[35m[2,3] Symbol\x1b[0m\n  \x1b[2m'x'\x1b[0m"),
    (Add(anon, name="c"), dict(color=True, comments=True),
     "\x1b[1m'c'\x1b[0m \x1b[34mAdd\x1b[0m\x1b[2m  # [2,3] float32\x1b[0m\n"
     "  \x1b[2m0\x1b[0m \x1b[34mAdd\x1b[0m\x1b[2m  # [2,3] float32\x1b[0m\n"
     "    \x1b[1m'x'\x1b[0m \x1b[35m[2,3] Symbol\x1b[0m\x1b[2m  # [2,3] float32\x1b[0m\n"
     "    \x1b[2m1\x1b[0m \x1b[36m[] Scalar 1\x1b[0m\x1b[2m  # [] float32\x1b[0m"),
    (Concat(y, e2, x, axis=1, name="top"), dict(tree=True),
     "'top' Concat 1\n"
     "├─ 'y' Einsum ab,bc->ac\n"
     "│  ├─ 'x' [2,3] Symbol\n"
     "│  └─ 'w' [3,4] Array abcdef0123\n"
     "├─ 'e2' GeneralFunction exp\n"
     "│  └─ 'e1' GeneralFunction exp\n"
     "│     └─ 'x'\n"
     "└─ 'x'"),
    (e4, dict(tree=True, depth=1), "'e4' GeneralFunction exp\n└─ 'e3' GeneralFunction exp\n   └─ ..."),
    (Add(x, x, name="s"), dict(names=False), "0 Add\n  1 [2,3] Symbol\n  1"),
    (Add(h0, h1, name="hs"), dict(names=False),
     "0 Add\n  1 GeneralFunction relu\n    2 [2,3] Symbol\n  3 GeneralFunction tanh\n    2"),
    # ---- deep circuits: subtrees below max_indent become '~' definition blocks, deepest first
    (e4, dict(max_indent=2),
     "~ 'e2' GeneralFunction exp\n  'e1' GeneralFunction exp\n    'x' [2,3] Symbol\n"
     "'e4' GeneralFunction exp\n  'e3' GeneralFunction exp\n    'e2'"),
    (e4, dict(max_indent=1),
     "~ 'e1' GeneralFunction exp\n  'x' [2,3] Symbol\n~ 'e2' GeneralFunction exp\n  'e1'\n"
     "~ 'e3' GeneralFunction exp\n  'e2'\n'e4' GeneralFunction exp\n  'e3'"),
    # x is defined in the root block, so the definition block refers to it before it appears.
    (Add(e3, x, name="r"), dict(max_indent=2),
     "~ 'e2' GeneralFunction exp\n  'e1' GeneralFunction exp\n    'x'\n"
     "'r' Add\n  'e3' GeneralFunction exp\n    'e2'\n  'x' [2,3] Symbol"),
    (Add(GeneralFunction("exp", GeneralFunction("exp", anon)), name="r"), dict(max_indent=1),
     "~ 0 Add\n  'x' [2,3] Symbol\n  1 [] Scalar 1\n~ 2 GeneralFunction exp\n  0\n"
     "~ 3 GeneralFunction exp\n  2\n'r' Add\n  3"),
    # ---- rust_circuit's node types: a Module's argument lines say which Symbol they bind
    (Module(ModuleSpec(Add(m_in, m_in, name="dbl"), [ModuleArgSpec(m_in, batchable=False)]), x, name="m"), {},
     "'m' Module\n  'dbl' Add\n    'm.in' [0s,3] Symbol\n    'm.in'\n  'x' [2,3] Symbol ! 'm.in' ftt"),
    (Module(ModuleSpec(Scalar(1.0, (3,), name="c"), [ModuleArgSpec(m_in)], check_all_inputs_used=False), x,
            name="m"), {},
     "'m' Module\n  'c' [3] Scalar 1\n  'x' [2,3] Symbol ! 'm.in' [0s,3] Symbol"),
    (Module(ModuleSpec(Add(m_in, m_in), [ModuleArgSpec(m_in)]), x), dict(names=False),
     "0 Module\n  1 Add\n    2 [0s,3] Symbol\n    2\n  3 [2,3] Symbol ! 2"),
    (Scatter(x, (slice(1, 3),), (4, 3), name="sc"), {}, "'sc' [4,3] Scatter [1:3]\n  'x' [2,3] Symbol"),
    (SetSymbolicShape(x, (symbolic_size(0), symbolic_size(1, 3))), {},
     "0 [0s,3*1s] SetSymbolicShape\n  'x' [2,3] Symbol"),
    (DiscreteVar(x, Array.placeholder((2,), "9e0b", name="p"), name="v"), {},
     "'v' DiscreteVar\n  'x' [2,3] Symbol\n  'p' [2] Array 9e0b"),
]


def _ids(rows):
    return [f"{i}-{row[0].type_name}-{'-'.join(row[1]) or 'default'}" for i, row in enumerate(rows)]


@pytest.mark.parametrize("circuit, options, expected", ROWS, ids=_ids(ROWS))
def test_printer_table(circuit, options, expected):
    assert to_text(circuit, **options) == expected


@pytest.mark.parametrize("circuit, options, expected", ROWS, ids=_ids(ROWS))
def test_printer_table_parses_back(circuit, options, expected):
    if "..." in expected:
        with pytest.raises(C.ParseError, match="depth=None"):
            parse(expected)
    elif options.get("names") is False:
        stripped = C.strip_names(circuit)
        assert parse(expected, store=store_of(stripped)) == stripped
    else:
        # Exact with the circuit's tensors and placeholder dtypes; the text alone prints the same.
        parsed = parse(expected, store=store_of(circuit))
        assert parsed == circuit
        assert parsed.shape == circuit.shape and parsed.dtype == circuit.dtype
        assert to_text(parse(expected)) == to_text(circuit)


def test_every_node_type_has_a_row():
    types = {n.type_name for row in ROWS for n in C.toposort(row[0])}
    assert types == set(C.nodes.NODE_TYPE_BY_NAME)


def test_real_array_prints_its_content_hash():
    value = np.arange(6, dtype=np.float32).reshape(2, 3)
    a = Array(value, name="a")
    digest = content_hash(value)
    assert to_text(a) == f"'a' [2,3] Array {digest[:24]}"
    assert a.content_hash == digest
    # A prefix parses to a placeholder with that prefix (there is no store to look it up in).
    p = parse(f"'a' [2,3] Array {digest[:10]}")
    assert p.is_placeholder and p.content_hash == digest[:10]


def test_print_many_shares_serials_and_references():
    a = Add(anon, name="a")
    b = Add(anon, x, name="b")
    text = print_many([a, b, x])
    assert text == "'a' Add\n  0 Add\n    'x' [2,3] Symbol\n    1 [] Scalar 1\n'b' Add\n  0\n  'x'\n'x'"
    with pytest.raises(TypeError, match=r"print_many\(roots\)"):  # one spelling for several roots
        to_text([a, b, x])
    assert parse_many(text) == [a, b, x]
    assert parse(text) == x  # parse gives the last root


def test_to_text_is_str_and_repr_friendly():
    assert str(e2) == to_text(e2, depth=6)
    assert repr(w) == "<'w' [3,4] Array abcdef0123>"


def test_bad_options_are_refused():
    with pytest.raises(ValueError):
        to_text(x, depth=-1)
    with pytest.raises(ValueError):
        to_text(x, max_indent=0)
    with pytest.raises(TypeError):
        print_many([x, "not a node"])


def test_max_lines_cuts_wide_and_many_roots():
    xs = [Scalar(float(i), name=f"s{i}") for i in range(1000)]
    wide = Add(*xs, name="wide")
    assert to_text(wide, max_lines=3) == "'wide' Add\n  's0' [] Scalar 0\n  's1' [] Scalar 1\n  ..."
    assert to_text(wide, max_lines=3, tree=True).splitlines()[-1] == "├─ ..."
    a, b = Add(xs[0], name="a"), Add(xs[1], name="b")
    assert print_many([a, b], max_lines=2) == "'a' Add\n  's0' [] Scalar 0\n..."
    assert print_many([a, b], max_lines=4) == print_many([a, b])  # enough room: nothing cut
    # str() of a huge circuit stays short
    assert len(str(Add(*[Scalar(float(i)) for i in range(100_000)])).splitlines()) == 401  # 400 node lines, then "..."
    with pytest.raises(ValueError, match="max_lines"):
        to_text(wide, max_lines=0)
