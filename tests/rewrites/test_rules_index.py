"""Index rules: each push fires on generated circuits and keeps the value (float64); targeted
cases for broadcasting, residual indexes and gathers; exact proofs with sympy."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from circuits import Add, Array, Concat, Einsum, GeneralFunction, Index, Rearrange, Scalar, Symbol, Tag
from circuits.backend.symbolic import symbolic_equal
from circuits.testing import arrays, indices, int_arrays, rearrange_specs, shapes
from rewrites import check
from rewrites.rules.index import (
    compose_entries,
    fold_index_of_scalar,
    fuse_index_index,
    push_index_through_add,
    push_index_through_concat,
    push_index_through_einsum,
    push_index_through_function,
    push_index_through_gen_index,
    push_index_through_rearrange,
    range_to_slice,
)

from .rewrite_helpers import (
    RULE_SETTINGS,
    assert_same,
    broadcast_shapes_of,
    einsums,
    fire,
    must_not_fire,
    operands,
    value64,
)


# ---------------------------------------------------------------------------- oracles
def keeps_axis(entry, n) -> bool:
    """Whether an entry leaves an axis of size n unchanged (numpy decides)."""
    if isinstance(entry, int):
        return False
    picked = np.arange(n)[entry]
    return picked.shape == (n,) and bool(np.array_equal(picked, np.arange(n)))


def trivial(entries, shape) -> bool:
    return all(keeps_axis(e, n) for e, n in zip(entries, shape))


def numpy_index(value, entries):
    """Outer-style indexing, axis by axis, in plain numpy."""
    axis = 0
    for e in entries:
        if isinstance(e, int):
            value = np.take(value, e, axis=axis)
        elif isinstance(e, slice):
            value = value[(slice(None),) * axis + (e,)]
            axis += 1
        else:
            value = np.take(value, e, axis=axis)
            axis += 1
    return value


@st.composite
def indexed(draw, node_strategy):
    """``Index(node, entries)`` with a non-trivial index."""
    node = draw(node_strategy)
    entries = draw(indices(node.shape))
    if trivial(entries, node.shape):
        # An int on the first axis always does something (rather than filtering: for small
        # shapes most drawn indices select everything).
        assume(node.shape and node.shape[0] > 0)
        n = node.shape[0]
        entries = (draw(st.integers(-n, n - 1)),) + tuple(entries[1:])
    return Index(node, entries)


# ---------------------------------------------------------------------------- entry algebra
@given(n=st.integers(0, 7), data=st.data())
@RULE_SETTINGS
def test_range_to_slice_reads_the_same_positions(n, data):
    s = data.draw(st.builds(slice, st.none() | st.integers(-9, 9), st.none() | st.integers(-9, 9),
                            st.sampled_from([None, 1, 2, 3, -1, -2, -3])))
    r = range(*s.indices(n))
    assert list(range(*range_to_slice(r, n).indices(n))) == list(r)


@given(shape=shapes(min_rank=1, max_rank=3, min_side=1), data=st.data())
@RULE_SETTINGS
def test_compose_entries_matches_numpy(shape, data):
    n = shape[0]
    first = data.draw(indices((n,)).filter(lambda t: t and not isinstance(t[0], int)))[0]
    m = len(np.arange(n)[first])
    assume(m > 0)
    second = data.draw(indices((m,)).filter(bool))[0]
    want = np.arange(n)[first][second]
    got = np.arange(n)[compose_entries(first, n, second)]
    np.testing.assert_array_equal(got, want)


# ---------------------------------------------------------------------------- fuse and fold
@given(data=st.data(), shape=shapes(min_rank=1, max_rank=3))
@RULE_SETTINGS
def test_fuse_index_index_fires_and_matches_numpy(data, shape):
    value = data.draw(arrays(shape, "float64"))
    first = data.draw(indices(shape))
    inner = Index(Array(value), first)
    second = data.draw(indices(inner.shape))
    node = Index(inner, second)
    out = fire(fuse_index_index, node)
    assert not isinstance(out, Index) or not isinstance(out.children[0], Index)
    np.testing.assert_array_equal(value64(out), numpy_index(numpy_index(value, first), second))


def test_fuse_index_index_does_not_fire_on_other_children():
    must_not_fire(fuse_index_index, Index(Symbol((3, 4), name="x"), (1,)))
    must_not_fire(fuse_index_index, Index(Tag(Index(Symbol((3, 4), name="x"), (1,))), (2,)))


@given(data=st.data(), shape=shapes(min_rank=1))
@RULE_SETTINGS
def test_fold_index_of_scalar(data, shape):
    node = data.draw(indexed(st.just(Scalar(data.draw(st.floats(-2, 2)), shape))))
    out = fire(fold_index_of_scalar, node)
    assert isinstance(out, Scalar) and out.shape == node.shape


# ---------------------------------------------------------------------------- Einsum
@given(node=indexed(einsums(max_operands=3)))
@RULE_SETTINGS
def test_push_index_through_einsum(node):
    out = fire(push_index_through_einsum, node)
    assert isinstance(out, Einsum)


def test_push_index_through_einsum_diagonal_and_summed_axes():
    w = Array(np.arange(36, dtype=np.float64).reshape(3, 3, 4))
    v = Array(np.arange(4, dtype=np.float64) + 1)
    node = Index(Einsum.from_spec("aab,b->a", w, v), (np.array([2, 0, 2]),))
    out = fire(push_index_through_einsum, node)
    assert out.children[0].line() == "[3,3,4] Index [[2,0,2],[2,0,2]]"


def test_push_index_through_einsum_is_exact():
    x, w = Symbol((3, 2), name="x"), Symbol((2, 4), name="w")
    node = Index(Einsum.from_spec("ab,bc->ac", x, w), (slice(1, None), np.array([3, 0])))
    assert symbolic_equal(node, push_index_through_einsum(node))


def test_push_index_through_einsum_does_not_fire():
    x = Symbol((3, 2), name="x")
    must_not_fire(push_index_through_einsum, Index(Einsum.from_spec("ab->ba", x), (slice(None), slice(0, 3))))
    must_not_fire(push_index_through_einsum, Index(Add(x, x), (0,)))


# ---------------------------------------------------------------------------- Add
@st.composite
def broadcasting_adds(draw):
    shape = draw(shapes(min_rank=1, max_rank=3))
    terms = [draw(operands(shape))]
    for _ in range(draw(st.integers(0, 2))):
        terms.append(draw(operands(draw(broadcast_shapes_of(shape)))))
    order = draw(st.permutations(terms))
    return Add(*order)


@given(node=indexed(broadcasting_adds()))
@RULE_SETTINGS
def test_push_index_through_add(node):
    out = fire(push_index_through_add, node)
    assert isinstance(out, Add)


def test_push_index_through_add_keeps_size_one_axes():
    x = Array(np.arange(6.0).reshape(2, 3))
    b = Array(np.array([[10.0, 20.0, 30.0]]))
    c = Array(np.array([100.0, 200.0, 300.0]))
    node = Index(Add(x, b, c), (1, np.array([2, 2, 0])))
    out = fire(push_index_through_add, node)
    assert [k.line() for k in out.children] == [
        "[3] Index [1,[2,2,0]]", "[3] Index [0,[2,2,0]]", "[3] Index [[2,2,0]]"]
    # An output axis of size 1 everywhere: the index applies to every term that has it.
    ones = Array(np.ones((1, 2)))
    node = Index(Add(ones, Array(np.array([1.0, 2.0]))), (np.array([0, 0, 0]),))
    assert fire(push_index_through_add, node).shape == (3, 2)


def test_push_index_through_add_is_exact():
    x, b = Symbol((2, 3), name="x"), Symbol((1, 3), name="b")
    node = Index(Add(x, b), (np.array([1, 1, 0]), slice(None, None, -1)))
    assert symbolic_equal(node, push_index_through_add(node))


# ---------------------------------------------------------------------------- functions
ELEMENTWISE = ("tanh", "sin", "exp", "sigmoid", "square")
CORE = ("softmax", "log_softmax", "logsumexp", "mean", "max", "last_dim_size")


@given(node=indexed(st.builds(lambda f, x: GeneralFunction(f, x), st.sampled_from(ELEMENTWISE),
                              shapes(min_rank=1).flatmap(operands))))
@RULE_SETTINGS
def test_push_index_through_elementwise_function(node):
    out = fire(push_index_through_function, node)
    assert isinstance(out, GeneralFunction)


@st.composite
def pows(draw):
    shape = draw(shapes(min_rank=1, max_rank=3))
    base_shape, exponent_shape = shape, draw(broadcast_shapes_of(shape))
    if draw(st.booleans()):
        base_shape, exponent_shape = exponent_shape, base_shape
    base = Array(draw(arrays(base_shape, "float32", positive=True)))
    exponent = Array(draw(arrays(exponent_shape, "float32")))
    return GeneralFunction("pow", base, exponent)


@given(node=indexed(pows()))
@RULE_SETTINGS
def test_push_index_through_broadcasting_function(node):
    fire(push_index_through_function, node)


@given(f=st.sampled_from(CORE), data=st.data())
@RULE_SETTINGS
def test_push_index_through_last_axis_function(f, data):
    x = data.draw(shapes(min_rank=1, max_rank=3).flatmap(operands))
    node = data.draw(indexed(st.just(GeneralFunction(f, x))))
    leading = x.ndim - 1
    if trivial(node.full_index()[:leading], x.shape[:leading]):
        must_not_fire(push_index_through_function, node)
        return
    out = fire(push_index_through_function, node)
    # What could not move (entries on the function's own axis) stays above as an Index.
    if not trivial(node.full_index()[leading:], node.children[0].shape[leading:]):
        assert isinstance(out, Index) and isinstance(out.children[0], GeneralFunction)


def test_push_index_through_softmax_leaves_a_residual():
    x = Symbol((3, 4), name="x")
    node = Index(GeneralFunction("softmax", x), (np.array([2, 0]), slice(1, 3)))
    out = push_index_through_function(node)
    assert out.line() == "[2,2] Index [:,1:3]"
    assert out.children[0].children[0].line() == "[2,4] Index [[2,0]]"
    # Holds for any row function (uninterpreted), not only for softmax's definition.
    assert symbolic_equal(node, out, interpret=False)


def test_push_index_through_function_does_not_fire():
    x = Symbol((3, 4), name="x")
    must_not_fire(push_index_through_function, Index(GeneralFunction("softmax", x), (slice(None), 1)))
    must_not_fire(push_index_through_function, Index(GeneralFunction("logsumexp", x), (slice(0, 3),)))
    idx = Symbol((2,), name="i", dtype="int64")
    must_not_fire(push_index_through_function, Index(GeneralFunction("gen_index_at_0", x, idx), (0,)))


# ---------------------------------------------------------------------------- Rearrange
def rearrange_push_expected(r: Rearrange, entries) -> bool:
    """Independent statement of when an entry can move below a Rearrange."""
    in_single = {g[0] for g in r.in_groups if len(g) == 1}
    in_names = {a for g in r.in_groups for a in g}
    for g, e, n in zip(r.out_groups, entries, r.shape):
        if keeps_axis(e, n):
            continue
        if len(g) == 1 and (g[0] in in_single or g[0] not in in_names):
            return True
        if not g and isinstance(e, int):
            return True
    return False


@st.composite
def rearranges(draw):
    shape = draw(shapes(min_rank=1, max_rank=3))
    spec = draw(rearrange_specs(shape))
    return Rearrange(draw(operands(shape)), spec.spec, **spec.sizes)


@given(node=indexed(rearranges()))
@RULE_SETTINGS
def test_push_index_through_rearrange(node):
    r = node.children[0]
    if rearrange_push_expected(r, node.full_index()):
        fire(push_index_through_rearrange, node)
    else:
        must_not_fire(push_index_through_rearrange, node)


def test_push_index_through_rearrange_cases():
    x = Array(np.arange(24.0).reshape(2, 3, 4))
    # a whole axis moves; the merged one stays behind
    node = Index(Rearrange(x, "a b c -> c (a b)"), (slice(1, 3), np.array([5, 0])))
    out = fire(push_index_through_rearrange, node)
    assert out.line() == "[2,2] Index [:,[5,0]]"
    assert out.children[0].children[0].line() == "[2,3,2] Index [:,:,1:3]"
    # a repeated (new) axis changes its size; an int drops it
    node = Index(Rearrange(x, "a b c -> a r b c", r=5), (0, slice(1, 3)))
    out = fire(push_index_through_rearrange, node)
    assert out.payload_text() == "b c -> r b c r=2"
    node = Index(Rearrange(x, "a b c -> a 1 b c"), (slice(None), 0))
    assert fire(push_index_through_rearrange, node).payload_text() == "a b c -> a b c"
    assert symbolic_equal(node, push_index_through_rearrange(node))


def test_push_index_through_rearrange_does_not_fire():
    x = Symbol((2, 3), name="x")
    must_not_fire(push_index_through_rearrange, Index(Rearrange(x, "a b -> (a b)"), (slice(0, 3),)))
    must_not_fire(push_index_through_rearrange, Index(Rearrange(Symbol((6,), name="y"), "(a b) -> a b", a=2), (1,)))


# ---------------------------------------------------------------------------- Concat
@st.composite
def concats(draw):
    shape = draw(shapes(min_rank=1, max_rank=3))
    axis = draw(st.integers(0, len(shape) - 1))
    kids = []
    for _ in range(draw(st.integers(1, 3))):
        s = list(shape)
        s[axis] = draw(st.integers(0, 3))
        kids.append(draw(operands(tuple(s), scalars=False)) if s[axis] else Array(np.zeros(s, np.float32)))
    assume(sum(k.shape[axis] for k in kids) > 0)
    return Concat(*kids, axis=axis)


def concat_runs(cat: Concat, entry) -> int:
    ends = np.cumsum([c.shape[cat.axis] for c in cat.children])
    owner = np.searchsorted(ends, np.arange(cat.shape[cat.axis])[entry], side="right")
    return int(np.count_nonzero(np.diff(owner))) + 1 if owner.size else 0


@given(node=indexed(concats()))
@RULE_SETTINGS
def test_push_index_through_concat(node):
    cat = node.children[0]
    entries = node.full_index()
    e = entries[cat.axis]
    scattered = isinstance(e, np.ndarray) and concat_runs(cat, e) > len(cat.children)
    others = [x for k, x in enumerate(entries) if k != cat.axis]
    other_shape = [n for k, n in enumerate(cat.shape) if k != cat.axis]
    if scattered and trivial(others, other_shape):
        must_not_fire(push_index_through_concat, node)
    else:
        fire(push_index_through_concat, node)


def test_push_index_through_concat_cases():
    a, b = Array(np.arange(6.0).reshape(2, 3)), Array(np.arange(9.0).reshape(3, 3) + 10)
    cat = Concat(a, b, axis=0)
    assert fire(push_index_through_concat, Index(cat, (3, 1))).line() == "[] Index [1,1]"
    out = fire(push_index_through_concat, Index(cat, (slice(None, None, -2),)))
    assert [k.line() for k in out.children] == ["[2,3] Index [::-2]", "[1,3] Index [0::-2]"]
    out = fire(push_index_through_concat, Index(cat, (np.array([4, 0, 1]), 2)))
    assert isinstance(out, Concat) and out.axis == 0
    # An array jumping between the children more often than there are children stays behind.
    scattered = Index(cat, (np.array([0, 2, 1, 3, 0]),))
    must_not_fire(push_index_through_concat, scattered)
    out = fire(push_index_through_concat, Index(cat, (np.array([0, 2, 1, 3, 0]), 1)))
    assert out.line() == "[5] Index [[0,2,1,3,0]]"
    # An int child alone is int: pushing would change the dtype.
    mixed = Concat(Array(np.arange(2)), Array(np.ones(2, np.float32)), axis=0)
    must_not_fire(push_index_through_concat, Index(mixed, (slice(0, 2),)))


# ---------------------------------------------------------------------------- gen_index
@st.composite
def gathers(draw):
    """A gather in one of rust_circuit's layouts: plain (index axes first), ``_batch_x``,
    ``_no_batch_index`` (index axes where the gathered axis was)."""
    layout = draw(st.sampled_from(("first", "at", "batch")))
    checked = draw(st.booleans())
    if layout == "batch":
        idx_shape = draw(shapes(min_rank=0, max_rank=2))
        rest = draw(shapes(min_rank=1, max_rank=2))
        x_shape = idx_shape + rest
        d = draw(st.integers(0, len(rest) - 1))
        ax = len(idx_shape) + d
        if draw(st.booleans()):
            d = ax - len(x_shape)
    else:
        x_shape = draw(shapes(min_rank=1, max_rank=3))
        idx_shape = draw(shapes(min_rank=0, max_rank=2))
        ax = draw(st.integers(0, len(x_shape) - 1))
        d = ax if draw(st.booleans()) else ax - len(x_shape)
    n = x_shape[ax]
    # In range (out-of-range index Arrays are refused when built); unchecked ones take negatives.
    lo, hi = (0, n) if checked else (-n, n)
    idx = Array(draw(int_arrays(idx_shape, lo, hi)))
    x = draw(operands(x_shape, scalars=False))
    name = (f"gen_index_at_{d}{'_batch_x' if layout == 'batch' else ''}"
            f"{'_no_batch_index' if layout == 'at' else ''}{'_c' if checked else ''}")
    return GeneralFunction(name, x, idx)


@given(node=indexed(gathers()))
@RULE_SETTINGS
def test_push_index_through_gen_index(node):
    out = push_index_through_gen_index(node)
    assert isinstance(out, GeneralFunction) and out.function.name.startswith("gen_index_at_")
    assert out.shape == node.shape and out.dtype == node.dtype
    check(out)
    assert_same(node, out)


def test_push_index_through_gen_index_cases():
    x = Array(np.arange(24.0).reshape(2, 3, 4))
    idx = Array(np.array([[3, 0, 1], [2, 2, 0]]))
    node = Index(GeneralFunction("gen_index_at_2_no_batch_index", x, idx), (1, slice(None), 0))
    out = fire(push_index_through_gen_index, node)
    assert out.function.name == "gen_index_at_1_no_batch_index"
    assert [k.line() for k in out.children] == ["[3,4] Index [1]", "[3] Index [0]"]
    assert symbolic_equal(node, out)
    # plain (rust_circuit's): the index's axes come first, then x's other axes
    node = Index(GeneralFunction("gen_index_at_2", x, idx), (1, slice(None), 0))
    assert node.children[0].shape == (2, 3, 2, 3)
    out = fire(push_index_through_gen_index, node)
    assert out.function.name == "gen_index_at_1"
    assert [k.line() for k in out.children] == ["[3,4] Index [0]", "[3] Index [1]"]
    assert symbolic_equal(node, out)
    # batch axes index x and idx alike; d counted from the end follows the dropped axes
    bx = Array(np.arange(24.0).reshape(2, 3, 4))
    bidx = Array(np.array([3, 0]))
    node = Index(GeneralFunction("gen_index_at_-1_batch_x_c", bx, bidx), (1,))
    out = fire(push_index_through_gen_index, node)
    assert out.function.name == "gen_index_at_-1_batch_x_c"
    assert symbolic_equal(node, out)


def test_push_index_through_gen_index_does_not_fire():
    x = Symbol((3, 4), name="x")
    must_not_fire(push_index_through_gen_index, Index(GeneralFunction("softmax", x), (0,)))
    idx = Array(np.array([1, 2]))
    must_not_fire(push_index_through_gen_index, Index(GeneralFunction("gen_index_at_0", x, idx), (slice(None),)))


# ---------------------------------------------------------------------------- no push through Tag
@pytest.mark.parametrize("rule", [push_index_through_einsum, push_index_through_add, push_index_through_function,
                                  push_index_through_rearrange, push_index_through_concat,
                                  push_index_through_gen_index, fuse_index_index, fold_index_of_scalar])
def test_index_rules_stop_at_tags(rule):
    x = Symbol((3, 4), name="x")
    must_not_fire(rule, Index(Tag(Einsum.from_spec("ab->ab", x)), (0,)))
