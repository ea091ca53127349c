"""Scalar rules: merged and folded Scalars keep the value (float64), broadcasting shapes exact."""

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from circuits import Add, Array, Einsum, GeneralFunction, Scalar
from circuits.testing import einsum_specs, shapes
from rewrites.rules import fold_add_scalars, fold_function_of_scalars, merge_einsum_scalars

from .rewrite_helpers import NONZERO, RULE_SETTINGS, broadcast_shapes_of, fire, must_not_fire, operands


@st.composite
def einsums_with_scalars(draw):
    """An Einsum in which some operands are nonzero Scalars (of their operand's shape)."""
    spec = draw(einsum_specs(max_operands=4).filter(lambda s: len(s.input_shapes) >= 1))
    n = len(spec.input_shapes)
    scalar_at = set(draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=n, unique=True)))
    kids = [Scalar(draw(NONZERO), s) if i in scalar_at else draw(operands(s, scalars=False))
            for i, s in enumerate(spec.input_shapes)]
    return Einsum(*kids, in_axes=spec.in_axes, out_axes=spec.out_axes)


@RULE_SETTINGS
@given(einsums_with_scalars())
def test_merge_einsum_scalars_fires_and_keeps_value(node):
    out = merge_einsum_scalars(node)
    scalars = [c for c in node.children if type(c) is Scalar]
    if out is None:
        # already a single Scalar carrying only axes nothing else provides
        assert len(scalars) == 1
        return
    out = fire(merge_einsum_scalars, node)
    if type(out) is Scalar:
        assert all(type(c) is Scalar for c in node.children)
    else:
        assert sum(1 for c in out.children if type(c) is Scalar) == 1
        assert merge_einsum_scalars(out) is None  # merged once is merged


def test_merge_einsum_scalars_exact():
    w = Array(np.arange(6, dtype=np.float32).reshape(2, 3))
    # b summed over and carried by w: the Scalars are constants along it (2·3 = 6)
    out = merge_einsum_scalars(Einsum.from_spec("ab,,b->a", w, Scalar(2.0), Scalar(3.0, (3,))))
    assert out.spec == "ab,->a" and out.children[1] == Scalar(6.0)
    # c summed over and carried only by a Scalar: a factor of its length 4
    out = merge_einsum_scalars(Einsum.from_spec("ab,c->a", w, Scalar(0.5, (4,))))
    assert out.children[1] == Scalar(2.0)
    np.testing.assert_allclose(out.evaluate(dtype="float64"), 2.0 * w.value.sum(1))
    # an output axis only a Scalar carries stays on the merged Scalar
    out = merge_einsum_scalars(Einsum.from_spec("a,c,c->ac", Array(np.ones(2, np.float32)),
                                                Scalar(2.0, (4,)), Scalar(3.0, (4,))))
    assert out.spec == "a,c->ac" and out.children[1] == Scalar(6.0, (4,))
    # Scalars alone
    assert merge_einsum_scalars(Einsum.from_spec("ab,b->a", Scalar(2.0, (2, 3)), Scalar(5.0, (3,)))) == Scalar(30.0, (2,))
    assert merge_einsum_scalars(Einsum.from_spec("->")) == Scalar(1.0)


def test_merge_einsum_scalars_must_not_fire():
    w = Array(np.ones((2, 3), np.float32))
    must_not_fire(merge_einsum_scalars, Einsum.from_spec("ab,->a", w, Scalar(2.0)))
    must_not_fire(merge_einsum_scalars, Einsum.from_spec("ab,c->ac", w, Scalar(2.0, (4,))))
    must_not_fire(merge_einsum_scalars, Einsum.from_spec("ab->a", w))


@st.composite
def adds_with_scalars(draw):
    shape = draw(shapes(max_rank=3, max_side=3))
    kids = [Scalar(draw(NONZERO), draw(broadcast_shapes_of(shape))) for _ in range(draw(st.integers(2, 4)))]
    others = [draw(operands(draw(broadcast_shapes_of(shape)), scalars=False)) for _ in range(draw(st.integers(0, 2)))]
    kids = draw(st.permutations(kids + others))
    node = Add(*kids)
    if node.shape != shape:
        node = Add(*kids, draw(operands(shape, scalars=False)))
    return node


@RULE_SETTINGS
@given(adds_with_scalars())
def test_fold_add_scalars_fires_and_keeps_value(node):
    out = fire(fold_add_scalars, node)
    kids = out.children if type(out) is Add else (out,)
    assert sum(1 for c in kids if type(c) is Scalar) == 1


def test_fold_add_scalars_exact_and_must_not_fire():
    x = Array(np.ones((2, 3), np.float32))
    out = fold_add_scalars(Add(Scalar(1.0, (3,)), x, Scalar(2.5)))
    assert out.children == (Scalar(3.5, (3,)), x)
    assert fold_add_scalars(Add(Scalar(1.0, (2, 1)), Scalar(2.0, (3,)))) == Scalar(3.0, (2, 3))
    must_not_fire(fold_add_scalars, Add(x, Scalar(1.0)))


@RULE_SETTINGS
@given(st.sampled_from(["exp", "tanh", "sin", "sigmoid", "relu", "abs", "square", "gelu"]),
       st.floats(-3, 3), shapes(max_rank=2, max_side=3))
def test_fold_function_of_scalars_fires_and_keeps_value(fn, value, shape):
    node = GeneralFunction(fn, Scalar(value, shape))
    out = fire(fold_function_of_scalars, node)
    assert type(out) is Scalar and out.shape == shape


def test_fold_function_of_scalars_exact_and_must_not_fire():
    assert np.isclose(fold_function_of_scalars(GeneralFunction("exp", Scalar(1.0))).value, np.e, rtol=1e-15, atol=0)
    assert fold_function_of_scalars(GeneralFunction("pow", Scalar(2.0, (3,)), Scalar(3.0))) == Scalar(8.0, (3,))
    x = Array(np.ones((2, 3), np.float32))
    must_not_fire(fold_function_of_scalars, GeneralFunction("exp", x))
    must_not_fire(fold_function_of_scalars, GeneralFunction("softmax", Scalar(1.0, (3,))))  # not elementwise
