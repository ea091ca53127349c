"""Add rules: each fires on generated inputs and keeps the value (float64); targeted must-not-fire
cases; broadcasting kept exact."""

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from circuits import Add, Array, Einsum, Scalar, Symbol
from circuits.testing import shapes
from rewrites.rules import (
    add_single_term,
    dedupe_add_terms,
    factor_add,
    flatten_add,
    flatten_add_all,
    nest_add,
    nest_add_terms,
    remove_add_zeros,
)
from rewrites.rules.add import coefficient_form

from .rewrite_helpers import NONZERO, RULE_SETTINGS, broadcast_shapes_of, einsums, fire, must_not_fire, operands


@st.composite
def terms(draw, shape, min_size=1, max_size=4):
    """Terms that broadcast to exactly ``shape`` (the first one has it)."""
    out = [draw(operands(shape))]
    for _ in range(draw(st.integers(min_size - 1, max_size - 1))):
        out.append(draw(operands(draw(broadcast_shapes_of(shape)))))
    return draw(st.permutations(out))


# ---------------------------------------------------------------------------- flatten / nest
@st.composite
def nested_adds(draw):
    shape = draw(shapes(max_rank=3, max_side=3))
    outer = draw(terms(shape, 1, 3))
    inner_shape = draw(broadcast_shapes_of(shape))
    inner = Add(*draw(terms(inner_shape, 1, 3)))
    pos = draw(st.integers(0, len(outer)))
    return Add(*outer[:pos], inner, *outer[pos:], name=draw(st.sampled_from([None, "s"])))


@RULE_SETTINGS
@given(nested_adds())
def test_flatten_add_fires_and_keeps_value(node):
    out = fire(flatten_add, node)
    spliced = [g for c in node.children for g in (c.children if type(c) is Add and c.name is None else (c,))]
    assert list(out.children) == spliced
    assert out.name == node.name
    everything = fire(flatten_add_all, node)
    assert list(everything.children) == [g for c in node.children for g in (c.children if type(c) is Add else (c,))]


def test_flatten_add_keeps_named_children():
    a, b, c = Symbol((2,), name="a"), Symbol((2,), name="b"), Symbol((2,), name="c")
    must_not_fire(flatten_add, Add(a, Add(b, c, name="resid")))
    assert flatten_add_all(Add(a, Add(b, c, name="resid"))) == Add(a, b, c)


@RULE_SETTINGS
@given(st.data())
def test_nest_add_fires_and_keeps_value(data):
    shape = data.draw(shapes(max_rank=3, max_side=3))
    node = Add(*data.draw(terms(shape, 3, 5)))
    out = fire(nest_add, node)
    assert len(out.children) == len(node.children) - 1
    assert out.children[0].children == node.children[:2]
    # the chosen-positions variant
    k = len(node.children)
    picks = sorted(data.draw(st.lists(st.integers(0, k - 1), min_size=2, max_size=k - 1, unique=True)))
    nested = fire(nest_add_terms(picks), node)
    rest = [c for i, c in enumerate(node.children) if i not in picks]
    assert list(nested.children) == rest[:picks[0]] + [Add(*[node.children[p] for p in picks])] + rest[picks[0]:]


def test_nest_add_must_not_fire(symbols):
    a, b = symbols["a"], symbols["b"]
    must_not_fire(nest_add, Add(a, b))
    must_not_fire(nest_add_terms([0, 1]), Add(a, b))  # grouping everything is no change
    must_not_fire(flatten_add, Add(a, Einsum.from_spec("a->a", b)))


# ---------------------------------------------------------------------------- zeros, single terms
@st.composite
def adds_with_zeros(draw):
    shape = draw(shapes(max_rank=3, max_side=3))
    ts = draw(terms(shape, 0 if shape else 1, 3)) if draw(st.booleans()) else []
    zeros = [Scalar(0.0, draw(broadcast_shapes_of(shape))) for _ in range(draw(st.integers(1, 3)))]
    if not ts:
        zeros[0] = Scalar(0.0, shape)
    kids = draw(st.permutations(ts + zeros))
    node = Add(*kids)
    if node.shape != shape:
        node = Add(*kids, Scalar(0.0, shape))
    return node


@RULE_SETTINGS
@given(adds_with_zeros())
def test_remove_add_zeros_fires_and_keeps_value(node):
    zeros = [c for c in node.children if type(c) is Scalar and c.value == 0.0]
    rest = [c for c in node.children if c not in zeros]
    if len(zeros) == 1 and rest and Add(*rest).shape != node.shape:
        must_not_fire(remove_add_zeros, node)  # that zero carries the shape
        return
    out = fire(remove_add_zeros, node)
    if out in rest:
        assert rest == [out]
    else:
        left = [c for c in out.children if type(c) is Scalar and c.value == 0.0] if type(out) is Add else []
        assert len(left) <= 1


def test_remove_add_zeros_keeps_broadcast_shape():
    x = Symbol((3, 1), name="x")
    node = Add(x, Scalar(0.0, (1, 4)))
    must_not_fire(remove_add_zeros, node)  # without the zero the Add would have shape [3,1]
    node = Add(x, Scalar(0.0, (1, 4)), Scalar(0.0, ()))
    out = remove_add_zeros(node)
    assert out.shape == (3, 4) and [c.line() for c in out.children] == ["'x' [3,1] Symbol", "[1,4] Scalar 0"]


def test_remove_add_zeros_keeps_dtype():
    i = Array(np.arange(3))  # int64: dropping the float32 zero would change the Add's dtype
    assert Add(i, Scalar(0.0)).dtype == "float64"
    must_not_fire(remove_add_zeros, Add(i, Scalar(0.0)))


@RULE_SETTINGS
@given(shapes(max_rank=3, max_side=3).flatmap(operands))
def test_add_single_term_fires_and_keeps_value(x):
    out = fire(add_single_term, Add(x, name="s"))
    # the naming rule: the replacement takes the Add's name unless it has one or is an Array
    assert out == (x if x.name is not None or type(x) is Array else x.rename("s"))


def test_add_single_term_empty_and_must_not_fire(symbols):
    assert add_single_term(Add()) == Scalar(0.0)
    must_not_fire(add_single_term, Add(symbols["a"], symbols["b"]))


# ---------------------------------------------------------------------------- dedupe
@st.composite
def adds_with_repeats(draw):
    shape = draw(shapes(max_rank=3, max_side=3))
    pool = [draw(operands(shape, scalars=False)) for _ in range(draw(st.integers(1, 3)))]
    ids = tuple(range(len(shape)))
    kids = []
    for _ in range(draw(st.integers(2, 6))):
        base = draw(st.sampled_from(pool))
        if draw(st.booleans()):
            kids.append(Einsum(base, Scalar(draw(NONZERO)), in_axes=(ids, ()), out_axes=ids))
        else:
            kids.append(base)
    if len({coefficient_form(k)[0] for k in kids}) == len(kids):
        kids.append(kids[0])
    return Add(*kids)


@RULE_SETTINGS
@given(adds_with_repeats())
def test_dedupe_add_terms_fires_and_keeps_value(node):
    out = fire(dedupe_add_terms, node)
    kids = out.children if type(out) is Add else (out,)
    assert len(kids) < len(node.children)


def test_dedupe_add_terms_exact():
    x = Symbol((3,), name="x")
    two_x = Einsum.from_spec("a,->a", x, Scalar(2.0))
    out = dedupe_add_terms(Add(x, x, two_x))
    assert out.spec == "a,->a" and out.children == (x, Scalar(4.0))
    y = Symbol((3,), name="y")
    assert dedupe_add_terms(Add(x, y, Einsum.from_spec("a,->a", x, Scalar(-1.0)))) == Add(Scalar(0.0, (3,)), y)
    must_not_fire(dedupe_add_terms, Add(x, y))
    must_not_fire(dedupe_add_terms, Add(two_x, y))


# ---------------------------------------------------------------------------- factor
def _relabel(in_axes, out_axes, mapping):
    return [tuple(mapping[a] for a in t) for t in in_axes], tuple(mapping[a] for a in out_axes)


@st.composite
def sums_with_common_operand(draw):
    base = draw(einsums(min_operands=2, max_operands=3, operand=lambda s: operands(s, scalars=False)))
    common = base.children[0]
    ids = sorted({a for t in base.in_axes for a in t})
    kids = []
    for _ in range(draw(st.integers(2, 3))):
        others = [draw(operands(c.shape)) for c in base.children[1:]]
        new_ids = draw(st.permutations(list(range(max(ids, default=0) + 5))))
        mapping = dict(zip(ids, new_ids))
        in_axes, out_axes = _relabel(base.in_axes, base.out_axes, mapping)
        order = draw(st.permutations(range(len(base.children))))
        kids.append(Einsum(*[([common] + others)[i] for i in order], in_axes=[in_axes[i] for i in order],
                           out_axes=out_axes))
    return Add(*kids)


@RULE_SETTINGS
@given(sums_with_common_operand())
def test_factor_add_fires_and_keeps_value(node):
    out = fire(factor_add, node)
    assert type(out) is Einsum and len(out.children) == 2 and type(out.children[1]) in (Add, Scalar)


def test_factor_add_exact_and_must_not_fire():
    w = Symbol((2, 3), name="w")
    u, v = Symbol((3,), name="u"), Symbol((3,), name="v")
    out = factor_add(Add(Einsum.from_spec("ab,b->a", w, u), Einsum.from_spec("ab,b->a", w, v)))
    assert out.spec == "ab,b->a" and out.children == (w, Add(u, v))
    # w used transposed in one term: a different role, no factoring
    m = Symbol((3, 3), name="m")
    must_not_fire(factor_add, Add(Einsum.from_spec("ab,b->a", m, u), Einsum.from_spec("ba,b->a", m, v)))
    # no common operand
    must_not_fire(factor_add, Add(Einsum.from_spec("ab,b->a", w, u), Einsum.from_spec("ab,b->a", w.rename("w2"), v)))
    # a term that is not an Einsum
    must_not_fire(factor_add, Add(Einsum.from_spec("ab,b->a", w, u), Symbol((2,), name="z")))
