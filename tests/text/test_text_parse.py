"""Parser behaviour beyond round trips: comments, references, stores, dtype inference, errors."""

import numpy as np
import pytest

import circuits as C
from circuits import Add, Array, Einsum, GeneralFunction, ParseError, Scalar, Symbol
from circuits.io.store import TensorStore
from circuits.text import parse, parse_many, to_text


def test_comments_blank_lines_crlf_and_loose_spacing():
    text = (
        "# a circuit\r\n"
        "\r\n"
        "'s' Add   # the sum\r\n"
        "  # a comment between children\r\n"
        "  'x'   [2]   Symbol\r\n"
        "\r\n"
        "  'x'\r\n"
    )
    s = parse(text)
    x = Symbol((2,), name="x")
    assert s == Add(x, x, name="s")
    assert s.children[0] is s.children[1]


def test_hash_prefixes_and_store_lookup(tmp_path):
    store = TensorStore(tmp_path)
    value = np.arange(6, dtype=np.float32).reshape(2, 3)
    key = store.put(value)
    full_text = to_text(Array(value, name="a"))
    for digits in (4, 10, 24):
        a = parse(f"'a' [2,3] Array {key[:digits]}", store=store)
        assert not a.is_placeholder and a.content_hash == key
        np.testing.assert_array_equal(a.value, value)
        assert to_text(a) == full_text
    # Not in the store: a placeholder that prints back as written.
    missing = "f" * 24 if not key.startswith("f" * 24) else "e" * 24
    p = parse(f"'a' [2,3] Array {missing}", store=store)
    assert p.is_placeholder and to_text(p) == f"'a' [2,3] Array {missing}"
    # The store's array must have the printed shape.
    with pytest.raises(ParseError, match=r"shape \[2,3\]") as info:
        parse(f"'a' [3,2] Array {key[:12]}", store=store)
    assert info.value.line_number == 1


def test_ambiguous_store_prefix_is_a_parse_error(tmp_path):
    store = TensorStore(tmp_path)
    keys = [store.put(np.full(3, i, np.float32)) for i in range(40)]
    # With 40 keys, some pair shares its first hex digit.
    first = [k[0] for k in keys]
    shared = next(c for c in first if first.count(c) > 1)
    with pytest.raises(ParseError) as info:
        parse(f"'a' [3] Array {shared}", store=store)
    assert info.value.expected and "longer" in info.value.expected


def test_placeholder_dtypes_follow_gathers():
    text = """
'out' Add
  'emb' GeneralFunction gen_index_at_0_c
    'table' [10,4] Array 0a
    'picked' [3] Index [[0,2,4]]
      'cat' [6] Concat 0
        'ids' [4] Array 0b
        'more' Tag 00000000-0000-0000-0000-000000000003
          'rest' [2] Array 0c
  'bias' [4] Array 0d
"""
    out = parse(text)
    dtypes = {n.name: n.dtype for n in C.toposort(out) if isinstance(n, Array)}
    assert dtypes == {"table": "float32", "ids": "int64", "rest": "int64", "bias": "float32"}


def test_references_to_existing_nodes():
    a = Scalar(2.0, (3,), name="a")
    b = Symbol((3,), name="b")
    text = "'s' Add\n  'a'\n  'b'\n  'a'"
    for refs in ({"a": a, "b": b}, [a, b]):
        s = parse(text, references=refs)
        assert s == Add(a, b, a, name="s")
        assert s.children[0] is a
    # A node defined in the text wins over a reference of the same name.
    s = parse("'s' Add\n  'a' [] Scalar 5\n  'a'", references={"a": a})
    assert s.children[1].value == 5.0
    with pytest.raises(ParseError, match="no node named 'a'") as info:
        parse(text)
    assert info.value.line_number == 2 and "references=" in info.value.expected


def test_forward_references_and_definition_blocks():
    text = """
~ 'e1' GeneralFunction exp
  'x'
'r' Add
  'e1'
  'x' [2] Symbol
"""
    r = parse(text)
    x = Symbol((2,), name="x")
    assert r == Add(GeneralFunction("exp", x, name="e1"), x, name="r")
    assert parse_many(text) == [r]  # '~' blocks are definitions, not roots


def test_scalar_forms():
    for text, value in (("0.00001", 1e-5), ("-10000", -1e4), ("1", 1.0), ("inf", np.inf), ("-inf", -np.inf),
                        ("1e-3", 1e-3), ("-0", -0.0)):
        s = parse(f"[] Scalar {text}")
        assert s.value == value and np.signbit(s.value) == np.signbit(value)
    assert np.isnan(parse("[2] Scalar nan").value)


def test_index_forms_keep_slices_as_written():
    x = Symbol((10, 4), name="x")
    for payload, index in (
        ("[:-2]", (slice(None, -2),)),
        ("[1:-1]", (slice(1, -1),)),
        ("[::2]", (slice(None, None, 2),)),
        ("[:-2:1]", (slice(None, -2, 1),)),
        ("[3]", (3,)),
        ("[[1,3,5],:]", (np.array([1, 3, 5]), slice(None))),
        ("[-1,::-1]", (-1, slice(None, None, -1))),
    ):
        node = parse(f"'i' Index {payload}\n  'x' [10,4] Symbol")
        assert node == C.Index(x, index, name="i")
        assert node.payload_text() == payload
    # slice(None, -2) and slice(None, -2, 1) are different nodes that print differently.
    assert parse("Index [:-2]\n  'x' [10,4] Symbol") != parse("Index [:-2:1]\n  'x' [10,4] Symbol")


def test_one_scalar_operand_einsum():
    s = Scalar(3.0)
    e = Einsum(s, in_axes=((),), out_axes=())
    assert to_text(e) == "0 Einsum ->\n  1 [] Scalar 3"
    assert parse(to_text(e)) == e
    assert parse("0 Einsum ->") == Einsum(in_axes=(), out_axes=())


def test_same_name_and_hash_with_other_shapes_are_two_placeholders():
    """A placeholder's identity includes its shape (its hash prefix alone does not imply one)."""
    a, b = parse_many("'w' [2] Array 0a\n'v' Add\n  'w' [3] Array 0a")
    assert a.shape == (2,) and b.children[0].shape == (3,) and a != b.children[0]


# ---- errors: line number, the line, column and what was expected
ERRORS = [
    # (text, line number, column or None, message part, expected part)
    ("'a' Add\n  'b' [2] Scalar 1\n      'c' [] Scalar 1", 3, 1, "indented 3 levels", "one level"),
    ("  'a' Add\n 'b' [] Scalar 1", 2, 1, "less indented than the first node line", "at least 2 spaces"),
    ("'a' Add\n   'b' [] Scalar 1", 2, 4, "not a whole number", "two spaces"),
    ("'a' Ad", 1, 5, "unknown node type 'Ad'", "Array"),
    ("'a [] Scalar 1", 1, 1, "never closed", "closing '"),
    ("'a' [2,x] Scalar 1", 1, 6, "cannot read the shape", "[300,256]"),
    ("'a' [2]", 1, 8, "no node type", "node type"),
    ("'a' [] Scalar one", 1, 15, "not a number", "0.00001"),
    ("'a' Scalar 1", 1, None, "needs its shape", "shape like"),
    ("'a' [2] Array xyz", 1, 15, "not a hex hash", "hex"),
    ("'e' Einsum ab->c\n  'x' [2,3] Symbol", 1, None, "appears in no input", "fit together"),
    ("'e' Einsum ab,bc->ac\n  'x' [2,3] Symbol\n  'y' [4,5] Symbol", 1, None, "axis b has size 3", "fit together"),
    ("'f' GeneralFunction nope\n  'x' [2] Symbol", 1, 21, "unknown GeneralFunction 'nope'", "registered"),
    ("'i' Index [0,:,5]\n  'x' [2,3] Symbol", 1, None, "3 index entries", "fit together"),
    ("'i' Index [0,1:2:0]\n  'x' [2,3] Symbol", 1, 14, "step cannot be 0", "[0,:,:]"),
    ("'i' Index [a]\n  'x' [2,3] Symbol", 1, 12, "not an int or a slice", "[1:-1]"),
    ("'s' Add\n  'x'", 2, None, "no node named 'x'", "defined somewhere"),
    ("'s' Add\n  7", 2, None, "no node has serial 7", "serial"),
    ("'s' Add\n  0 'x' [] Scalar 1\n  0 'y' [] Scalar 2", 3, 1, "repeats line 2 with another name", "the name line 2 gives"),
    ("'s' Add\n  0 'x' [] Scalar 1\n  0 'y'", 3, None, "serial 0 is 'x'", "serial and name"),
    ("'s' Add\n  0 'x' [] Scalar 1\n  1 'x' [] Scalar 2\n  'x'", 4, None, "2 nodes are named 'x'", "serial"),
    ("'s' Add\n  'x'\n    'y' [] Scalar 1\n'x' [] Scalar 1", 3, 1, "cannot have children", "node type"),
    ("'x' [] Scalar 1\n  'y' [] Scalar 1", 2, 1, "Scalar, which has no children", "takes them"),
    ("0 'a' Add\n  0 'a'", 1, None, "a cycle", "outside"),
    ("'s' Add extra", 1, 9, "no payload", "nothing after"),
    ("'t' Tag not-a-uuid\n  'x' [] Scalar 1", 1, 9, "not a uuid", "uuid"),
    ("'t' Tag 00000000-0000-0000-0000-000000000001", 1, None, "one child", "indented child"),
    ("'c' Concat x\n  'x' [] Scalar 1", 1, 12, "not an axis", "int axis"),
    ("'r' Rearrange a b -> c\n  'x' [2,3] Symbol", 1, None, "on the left only", "fit together"),
    ("'s' Add\n  ...", 2, 3, "cannot be parsed", "depth=None"),
    ("'a' Add\n  'x' [2]  Symbol int65", 2, 19, "'int65'", "optional dtype"),
    ("'a'Add", 1, 4, "right after the name", "a space"),
    ("\t'a' Add", 1, 1, "tab", "spaces"),
    ("'a\\q' Add", 1, 3, "unknown escape", "\\n"),
    ("'r' Add\n  ~ 'a' Add", 2, 3, "'~' marks a definition block", "unindented"),
    ("~ 'a'", 1, 1, "needs a node type", "Type"),
    ("# only a comment\n\n", None, None, "holds no circuit", "node line"),
    ("1" * 30, 1, 1, "too long", "18 digits"),
    ("'x' [99999999999999999999] Scalar 1", 1, None, "cannot build this Scalar", "fit together"),
]


@pytest.mark.parametrize("text, line_number, column, message, expected", ERRORS,
                         ids=[str(i) for i in range(len(ERRORS))])
def test_parse_errors(text, line_number, column, message, expected):
    with pytest.raises(ParseError) as info:
        parse(text)
    err = info.value
    assert err.line_number == line_number
    if line_number is not None:
        assert err.line == text.split("\n")[line_number - 1]
        assert f"line {line_number}" in str(err)
        # (shown with unprintable characters escaped: a tab as \t)
        assert err.line.replace("\t", "\\t") in str(err)
    assert err.column == column
    assert message in str(err)
    assert expected in err.expected
    assert f"(expected {err.expected})" in str(err)


def test_error_message_points_at_the_column():
    with pytest.raises(ParseError) as info:
        parse("'a' Add\n  'b' [] Scalar 1\n  'c' [] Scalar 1.2.3")
    lines = str(info.value).split("\n")
    assert lines[0].startswith("line 3, column 17:")
    assert lines[1] == "      'c' [] Scalar 1.2.3"
    assert lines[2] == "    " + " " * 16 + "^"


def test_parse_refuses_non_text():
    with pytest.raises(TypeError):
        parse(b"'a' [] Scalar 1")
