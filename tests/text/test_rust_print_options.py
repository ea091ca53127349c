"""The print options rust_circuit's researchers used (``PrintOptions`` in ``circuit_base/src/print.rs``):
a traversal limit, numbered leaves, comment functions, leaves on top.  Printed forms as rust
writes them where its tests and demos show them; round trips wherever the output parses."""

import re

import pytest
from hypothesis import HealthCheck, given, settings

from circuits import Add, Einsum, Scalar, Symbol
from circuits.errors import CircuitError, ParseError
from circuits.testing import dags
from circuits.testing.roundtrip import store_of
from circuits.text import parse
from circuits.text.printer import to_text

from .rust_demo import DEMO as SHARED  # rust's demo circuit

DEEP = parse("""
0 Rearrange ->
  1 Rearrange ->
    2 Rearrange ->
      'sym' [] Symbol
""")


# ---------------------------------------------------------------------------- traversal
def test_traversal_end_depth_as_rusts_demo():
    # rust's printing_parsing demo: new_traversal(start_depth=0, end_depth=1 / 2); a node whose
    # children are cut ends its line with ' ...'
    assert to_text(DEEP, traversal=1) == "0 Rearrange -> ..."
    assert to_text(DEEP, traversal=2) == "0 Rearrange ->\n  1 Rearrange -> ..."
    assert to_text(DEEP, traversal=0) == "0 Rearrange -> ..."
    assert to_text(DEEP, traversal=4) == to_text(DEEP)  # deep enough: nothing cut, so it parses
    assert parse(to_text(DEEP, traversal=4)) == DEEP


def test_traversal_matcher_stops_at_matching_nodes():
    # rust's term_early_at: the matching node is printed, its children are not
    assert to_text(SHARED, traversal="a2") == (
        "'a0' Add\n  'a1' Add\n    'sym1' [2] Symbol\n    'sym2' [2] Symbol\n  'a2' Add ...")
    assert to_text(SHARED, traversal=Add) == "'a0' Add ..."
    # a leaf that matches has nothing to cut
    assert to_text(SHARED, traversal="sym1") == to_text(SHARED)


def test_traversal_comment_follows_the_ellipsis():
    # rust's causal-scrubbing print test: "  A Einsum ,-> ... # cond_sampler=..."
    x = Symbol((), name="x")
    c = Add(Einsum.from_spec(",->", x, Scalar(2.0), name="A"), name="C")
    assert to_text(c, traversal=2, commenters=[lambda n: "note" if n.name == "A" else ""]) == \
        "'C' Add\n  'A' Einsum ,-> ... # note"


def test_traversal_output_is_for_reading():
    # rust refuses traversal with bijection: its text does not parse back, nor does ours
    with pytest.raises(ParseError, match="payload"):
        parse(to_text(SHARED, traversal=2))
    with pytest.raises(ValueError, match="traversal"):
        to_text(SHARED, traversal=-1)


# ---------------------------------------------------------------------------- number_leaves
def test_number_leaves_prints_a_tree_with_numbered_leaves():
    assert to_text(SHARED, number_leaves=True) == """'a0' Add
  'a1' Add
    'sym1' [2] Symbol # 0
    'sym2' [2] Symbol # 1
  'a2' Add
    'sym1' [2] Symbol # 2
    'sym2' [2] Symbol # 3
    'sym2' [2] Symbol # 4"""
    # a node written again keeps its identifier; repeated leaves parse back to the circuit
    assert parse(to_text(SHARED, number_leaves=True)) == SHARED


def test_number_leaves_counts_nodes_a_traversal_cuts():
    # rust's nest demo: number_leaves with a traversal that stops at non-Einsum nodes
    x, y = Symbol((2,), name="x"), Symbol((2,), name="y")
    inner = Add(x, y, name="s")
    c = Einsum.from_spec("a,a->a", Einsum.from_spec("a,a->a", inner, x, name="e1"), inner, name="e0")
    assert to_text(c, number_leaves=True, traversal=lambda n: type(n) is not Einsum) == """'e0' Einsum a,a->a
  'e1' Einsum a,a->a
    's' Add ... # 0
    'x' [2] Symbol # 1
  's' Add ... # 2"""


def test_number_leaves_repeated_inner_node_is_written_in_full():
    x = Symbol((2,), name="x")
    s = Add(x, x, name="s")
    text = to_text(Add(s, s, name="top"), number_leaves=True)
    assert text == ("'top' Add\n  's' Add\n    'x' [2] Symbol # 0\n    'x' [2] Symbol # 1\n"
                    "  's' Add\n    'x' [2] Symbol # 2\n    'x' [2] Symbol # 3")
    # rust cannot parse this mode at all; ours reads it unless a node with children repeats
    with pytest.raises(ParseError, match="children"):
        parse(text)


def test_number_leaves_refuses_an_exponential_tree():
    node = Symbol((2,), name="x")
    for i in range(40):  # 2**40 paths
        node = Add(node, node, name=f"n{i}")
    with pytest.raises(CircuitError, match="as a tree"):
        to_text(node, number_leaves=True)
    assert to_text(node, number_leaves=True, traversal=3).count(" # ") == 4


def test_unnamed_repeats_keep_their_serial_under_number_leaves():
    one = Scalar(1.0, (2,))
    text = to_text(Add(one, one), number_leaves=True)
    assert text == "0 Add\n  1 [2] Scalar 1 # 0\n  1 [2] Scalar 1 # 1"
    assert parse(text) == Add(one, one)


# ---------------------------------------------------------------------------- commenters
def test_commenters_as_rusts_demo():
    # rust's demo: PrintOptions(commenters=[lambda x: str(rc.count_nodes(x))])
    text = to_text(SHARED, commenters=[lambda n: str(n.count_nodes())])
    assert text == """'a0' Add # 5
  'a1' Add # 3
    'sym1' [2] Symbol # 1
    'sym2' [2] Symbol # 1
  'a2' Add # 3
    'sym1' # 1
    'sym2' # 1
    'sym2' # 1"""
    assert parse(text) == SHARED


def test_several_commenters_in_order_empty_ones_skipped_control_characters_escaped():
    text = to_text(SHARED, commenters=[lambda n: n.type_name, lambda n: "", lambda n: "two\nlines"])
    first = text.split("\n")[0]
    assert first == "'a0' Add # Add # two\\nlines"
    assert parse(text) == SHARED
    with pytest.raises(ValueError, match="commenters"):
        to_text(SHARED, commenters=["not callable"])


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(c=dags(max_nodes=10, max_depth=4))
def test_commented_and_numbered_texts_parse_back(c):
    text = to_text(c, commenters=[lambda n: f"{n.type_name} {n.shape}"])
    assert parse(text, store=store_of(c)) == c
    numbered = to_text(c, number_leaves=True, commenters=[lambda n: "#"])
    if not _repeated_inner_nodes(c):
        assert parse(numbered, store=store_of(c)) == c
    leaves = [int(m) for m in re.findall(r" # (\d+) # #$", numbered, flags=re.M)]
    assert leaves == list(range(len(leaves))) and leaves  # numbered 0, 1, ... in text order


def _repeated_inner_nodes(c):
    """Nodes with children reached along more than one path (a tree print writes them twice)."""
    seen, stack, again = set(), [c], False
    while stack and not again:
        n = stack.pop()
        for k in n.children:
            if k.children and k.hash in seen:
                again = True
            seen.add(k.hash)
            stack.append(k)
    return again


# ---------------------------------------------------------------------------- leaves_on_top
def test_leaves_on_top_reverses_the_lines():
    plain = to_text(SHARED)
    assert to_text(SHARED, leaves_on_top=True).split("\n") == plain.split("\n")[::-1]
    tree = to_text(SHARED, leaves_on_top=True, tree=True)
    assert tree.split("\n")[0] == "   ┌─ 'sym2'" and tree.split("\n")[-1] == "'a0' Add"
    assert "└" not in tree


# ---------------------------------------------------------------------------- rust's arrows, commenters
# rust's test_print_options circuit.  Its expected texts there differ from ours in two ways that are
# not layout: bijection=False (names unquoted) and Scatter slices as written ([0:2,0:1]; ours
# are normalised, [0:2]).
RUST_OPTIONS_CIRCUIT = """
0 [5, 3, 6] Add
  1 [3, 1] Scatter [0:2,0:1]
    2 [2, 1] Scalar 1.0
  10 [5, 3, 6] Scatter [0:5,0:3,0:3]
    4 [5, 3, 3] Concat 0
      5 'yoyo ' [2, 3, 3] Scalar 1.0
      6 'hihi' [3, 3, 3] Scalar 1.0"""


def test_rust_tree_arrows_two_columns_a_level_and_they_parse_back():
    c = parse(RUST_OPTIONS_CIRCUIT)
    text = to_text(c, rust=True, tree=True)
    assert text == """0 Add
├‣1 [3,1] Scatter [0:2]
│ └‣2 [2,1] Scalar 1
└‣3 [5,3,6] Scatter [:,:,0:3]
  └‣4 Concat 0
    ├‣'yoyo ' [2,3,3] Scalar 1
    └‣'hihi' [3,3,3] Scalar 1"""
    assert parse(text) == c
    assert to_text(c, rust=True, tree=True, leaves_on_top=True) == """    ┌‣'hihi' [3,3,3] Scalar 1
    ├‣'yoyo ' [2,3,3] Scalar 1
  ┌‣4 Concat 0
┌‣3 [5,3,6] Scatter [:,:,0:3]
│ ┌‣2 [2,1] Scalar 1
├‣1 [3,1] Scatter [0:2]
0 Add"""
    assert to_text(c, rust=True, tree=True, traversal=3).endswith("\n  └‣4 Concat 0 ...")
    assert "├─ " in to_text(c, tree=True)  # our own glyphs without rust=True


def test_rusts_size_threshold_and_dtype_commenters():
    import numpy as np

    from circuits import Array
    from circuits.text import dtype_commenter, size_threshold_commenter

    c = parse(RUST_OPTIONS_CIRCUIT)
    # rust: '0 Add # 90', the Scatters 3 and 90, 'yoyo ' 18, 'hihi' 27 (it paints them red)
    assert to_text(c, commenters=[size_threshold_commenter(16)]) == """0 Add # 90
  1 [3,1] Scatter [0:2]
    2 [2,1] Scalar 1
  3 [5,3,6] Scatter [:,:,0:3] # 90
    4 Concat 0 # 45
      'yoyo ' [2,3,3] Scalar 1 # 18
      'hihi' [3,3,3] Scalar 1 # 27"""
    a = Array(np.zeros(5, np.int8))
    text = to_text(Add(a, a), commenters=[dtype_commenter()])
    assert re.fullmatch(r"0 Add # int8\n  1 \[5\] Array [0-9a-f]{24} # int8\n  1 # int8", text)
    only = to_text(Add(a, a), commenters=[dtype_commenter(only_arrays=True)])
    assert only.startswith("0 Add\n") and only.endswith("# int8")
    assert parse(only, store=store_of(Add(a, a))) == Add(a, a)


def test_bijection_false_writes_bare_names_as_rust():
    # rust's test_print_options, but for its Scatter slices (see RUST_OPTIONS_CIRCUIT)
    c = parse(RUST_OPTIONS_CIRCUIT)
    assert to_text(c, bijection=False, traversal=3) == """0 Add
  1 [3,1] Scatter [0:2]
    2 [2,1] Scalar 1
  3 [5,3,6] Scatter [:,:,0:3]
    4 Concat 0 ..."""
    assert to_text(c, bijection=False, rust=True, tree=True) == """0 Add
├‣1 [3,1] Scatter [0:2]
│ └‣2 [2,1] Scalar 1
└‣3 [5,3,6] Scatter [:,:,0:3]
  └‣4 Concat 0
    ├‣yoyo  [2,3,3] Scalar 1
    └‣hihi [3,3,3] Scalar 1"""
    # names shared by several nodes get no serial: the text is for reading and does not parse
    x = Symbol((2,), name="x")
    shared = Add(Add(x, Scalar(1.0, name="x")), Add(x, x), name="x")
    text = to_text(shared, bijection=False)
    assert text == "x Add\n  0 Add\n    x [2] Symbol\n    x [] Scalar 1\n  1 Add\n    x\n    x"
    with pytest.raises(ParseError):
        parse(text)
