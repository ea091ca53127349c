"""Deep circuits: a 50,000-deep chain prints compactly (definition blocks) and parses back equal.

Printing and parsing are iterative; the recursion limit is lowered in these tests so that any
recursion proportional to depth would fail loudly.
"""

import pytest

from circuits import Add, Scalar, Symbol, toposort
from circuits.testing import store_of
from circuits.text import parse, parse_many, print_many, to_text
from circuits.text.printer import DEFAULT_MAX_INDENT
from tests.deep import DEPTH, build_deep_chain


def _indent(line):
    return len(line) - len(line.lstrip(" "))


@pytest.mark.usefixtures("low_recursion_limit")
def test_deep_chain_prints_and_parses(deep_chain):
    deep = deep_chain
    text = to_text(deep)
    lines = text.split("\n")
    assert max(_indent(l) for l in lines) <= 2 * DEFAULT_MAX_INDENT
    # About one line per node plus a reference line per Add ('one') and per block; no blow-up.
    assert len(lines) < 2 * DEPTH
    assert len(text) < 2 * DEPTH * (2 * DEFAULT_MAX_INDENT + 20)
    blocks = [l for l in lines if l.startswith("~ ")]
    assert len(blocks) >= DEPTH // DEFAULT_MAX_INDENT - 1
    store = store_of(deep)  # the text and its tensor: the lossless round trip
    assert parse(text, store=store) == deep
    assert parse_many(text, store=store) == [deep]
    assert parse(text) != deep  # the text alone gives a placeholder leaf


@pytest.mark.usefixtures("low_recursion_limit")
def test_deep_chain_in_tree_mode(deep_chain):
    deep = deep_chain
    text = to_text(deep, tree=True, max_indent=16)
    assert max(len(l) for l in text.split("\n")) < 3 * 17 + 60
    assert parse(text, store=store_of(deep)) == deep


@pytest.mark.usefixtures("low_recursion_limit")
def test_deep_shared_dag_with_forward_references():
    # Every node also uses the node 500 levels below it, so blocks refer to nodes that other
    # blocks define, before and after them in the text.
    x = Symbol((2,), name="x")
    nodes = [x]
    for i in range(1, 5_000):
        kids = (nodes[-1], nodes[max(0, i - 500)]) if i % 3 else (nodes[-1],)
        nodes.append(Add(*kids, name=f"a{i % 7}" if i % 2 else None))
    root = nodes[-1]
    for max_indent in (DEFAULT_MAX_INDENT, 7):
        text = to_text(root, max_indent=max_indent)
        assert max(_indent(l) for l in text.split("\n")) <= 2 * max_indent
        assert parse(text) == root
    # Several roots over the same deep DAG share every node.
    roots = [nodes[4_999], nodes[2_500], nodes[10]]
    assert parse_many(print_many(roots, max_indent=9)) == roots


@pytest.mark.usefixtures("low_recursion_limit")
def test_naive_indentation_on_request():
    c = build_deep_chain(2_000)
    text = to_text(c, max_indent=None)
    assert max(_indent(l) for l in text.split("\n")) == 2 * 2_000  # the leaf, 2,000 levels down
    assert "~" not in text
    assert parse(text, store=store_of(c)) == c


def test_wide_circuit():
    xs = [Scalar(float(i), (2,)) for i in range(20_000)]
    s = Add(*xs, name="wide")
    text = to_text(s)
    assert text.count("\n") == 20_000
    assert parse(text) == s
    assert len(toposort(parse(text))) == 20_001
