"""Rules for Module, Scatter and SetSymbolicShape, and batch_to_concat / split_to_concat: each
fires on generated circuits and keeps the value (float64)."""

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

import circuits as C
from circuits import Array, Index, Module, Scatter
from circuits.check import check
from circuits.testing import circuits_with_inputs
from rewrites.rules.modules import (
    batch_to_concat,
    inline_module,
    push_index_through_scatter,
    scatter_full,
    split_to_concat,
)

from .rewrite_helpers import RULE_SETTINGS, assert_same, fire


def test_scatter_is_zeros_around_its_block():
    x = np.arange(6.0).reshape(2, 3)
    s = Scatter(Array(x), (slice(1, 3), slice(2, 5)), (4, 6))
    want = np.zeros((4, 6))
    want[1:3, 2:5] = x
    np.testing.assert_array_equal(C.evaluate(s, dtype="float64"), want)
    assert C.parse(s.to_text()).to_text() == s.to_text() == "0 [4,6] Scatter [1:3,2:5]\n  1 [2,3] Array " + \
        s.children[0].payload_text()
    for bad in [(slice(0, 3),), (slice(0, 4, 2), slice(None)), (0,)]:
        try:
            Scatter(Array(x), bad, (4, 3))
        except C.ShapeError as e:
            assert "Scatter" in str(e)
        else:  # pragma: no cover
            raise AssertionError(f"{bad} accepted")


@st.composite
def index_of_scatter(draw):
    rank = draw(st.integers(1, 3))
    shape = tuple(draw(st.integers(1, 5)) for _ in range(rank))
    block, out_index = [], []
    for n in shape:
        lo = draw(st.integers(0, n))
        hi = draw(st.integers(lo, n))
        block.append(slice(lo, hi))
    child = Array(np.random.default_rng(draw(st.integers(0, 9))).standard_normal(
        tuple(b.stop - b.start for b in block)).astype(np.float32))
    sc = Scatter(child, tuple(block), shape)
    for n in shape:
        if draw(st.booleans()):
            out_index.append(draw(st.integers(-n, n - 1)))
        else:
            lo = draw(st.integers(-n, n))
            hi = draw(st.integers(-n, n))
            out_index.append(slice(lo, hi))
    return Index(sc, tuple(out_index))


@RULE_SETTINGS
@given(node=index_of_scatter())
def test_push_index_through_scatter_keeps_the_value(node):
    fire(push_index_through_scatter, node)


@RULE_SETTINGS
@given(data=st.data())
def test_inline_module_keeps_the_value(data):
    circuit, inputs = data.draw(circuits_with_inputs(root_types=[Module], max_nodes=6, max_depth=3))
    fire(inline_module, circuit, inputs)


def test_scatter_full_drops_a_whole_block():
    x = Array(np.ones((2, 3)))
    assert scatter_full(Scatter(x, (), (2, 3))) is x
    assert scatter_full(Scatter(x, (slice(0, 2),), (3, 3))) is None


@RULE_SETTINGS
@given(data=st.data())
def test_split_to_concat_keeps_the_value(data):
    shape = (data.draw(st.integers(2, 5)), data.draw(st.integers(1, 3)))
    circuit, inputs = data.draw(circuits_with_inputs(
        shape=shape, functions=["exp", "tanh", "softmax"],
        max_nodes=8, max_depth=4))
    n = circuit.shape[0]
    cut = data.draw(st.integers(1, n - 1))
    out = split_to_concat(circuit, 0, [cut, n - cut])
    check(out)
    assert_same(circuit, out, inputs)
    size = data.draw(st.integers(1, n))
    batched = batch_to_concat(circuit, 0, size)
    assert [c.shape[0] for c in batched.children] == [min(size, n - i) for i in range(0, n, size)]
    assert_same(circuit, batched, inputs)


def test_split_to_concat_computes_pieces():
    from circuits import Einsum, Symbol

    x, w = Symbol((6, 4), name="x"), Symbol((4, 3), name="w")
    out = batch_to_concat(Einsum.from_spec("ab,bc->ac", x, w, name="y"), 0, 3)
    # each piece is an einsum over a slice of x: the Index went below the product
    assert [type(p).__name__ for p in out.children] == ["Einsum", "Einsum"]
    assert [p.children[0].shape for p in out.children] == [(3, 4), (3, 4)]
