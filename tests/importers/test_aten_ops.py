"""The converters' shape helpers against numpy (no torch needed): reshape as Rearranges,
broadcasting products, batched matmuls with broadcast batch axes, reductions, diagonals."""

import math

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

import circuits as C
from circuits.importers.aten_ops import CONVERTERS, Site, reshape

SITE = Site("t", materialize=None)


def _array(shape, seed=0):
    return C.Array(np.random.default_rng(seed).normal(size=shape).astype(np.float32), name="x")


@st.composite
def reshapes(draw):
    """A shape and another of the same size (factors regrouped, unit axes sprinkled in)."""
    factors = draw(st.lists(st.sampled_from([2, 3, 4, 5]), min_size=0, max_size=5))

    def grouping():
        out, rest = [], list(draw(st.permutations(factors))) if draw(st.booleans()) else list(factors)
        while rest:
            k = draw(st.integers(1, len(rest)))
            out.append(math.prod(rest[:k]))
            rest = rest[k:]
            if draw(st.integers(0, 4)) == 0:
                out.append(1)
        return tuple(out)

    return grouping(), grouping()


@given(reshapes())
def test_reshape_is_numpy_reshape(shapes):
    src, dst = shapes
    x = _array(src)
    got = reshape(x, dst, "r")
    assert got.shape == dst
    np.testing.assert_array_equal(C.evaluate(got), x.value.reshape(dst))


def test_reshape_of_one_axis_into_several_is_one_rearrange():
    r = reshape(_array((2, 7, 12)), (2, 7, -1, 4), "split")
    assert isinstance(r, C.Rearrange) and r.payload_text() == "a b (c d) -> a b c d d=4"
    two_step = reshape(_array((6, 4)), (4, 6), "swap")  # regroups several axes: via a flat axis
    assert two_step.children[0].shape == (24,)


BROADCASTS = [((3, 1, 4), (5, 1)), ((1,), (2, 3)), ((2, 1, 1), (1, 3, 1)), ((), (4,))]


def test_products_broadcast_like_numpy():
    for a_shape, b_shape in BROADCASTS:
        a, b = _array(a_shape, 1), _array(b_shape, 2)
        np.testing.assert_allclose(C.evaluate(CONVERTERS["mul"](SITE, a, b)), a.value * b.value, rtol=1e-6)
        np.testing.assert_allclose(C.evaluate(CONVERTERS["div"](SITE, a, b)), a.value / b.value, rtol=1e-5)
        np.testing.assert_allclose(C.evaluate(CONVERTERS["sub"](SITE, a, b, alpha=2)), a.value - 2 * b.value,
                                   rtol=1e-6)


MATMULS = [((3,), (3,)), ((3,), (3, 4)), ((2, 3), (3,)), ((5, 2, 3), (3, 4)), ((2, 1, 2, 3), (1, 4, 3, 5)),
           ((1, 2, 3), (6, 3, 2))]


def test_matmul_broadcasts_batch_axes_like_numpy():
    for a_shape, b_shape in MATMULS:
        a, b = _array(a_shape, 3), _array(b_shape, 4)
        np.testing.assert_allclose(C.evaluate(CONVERTERS["matmul"](SITE, a, b)), np.matmul(a.value, b.value),
                                   rtol=1e-5, atol=1e-6)


def test_reductions_softmax_and_diagonal_match_numpy():
    x = _array((2, 3, 4), 5)
    v = x.value
    np.testing.assert_allclose(C.evaluate(CONVERTERS["mean"](SITE, x, [0, -1], True)), v.mean((0, 2), keepdims=True),
                               rtol=1e-5)
    np.testing.assert_allclose(C.evaluate(CONVERTERS["sum"](SITE, x)), v.sum(), rtol=1e-5)
    e = np.exp(v - v.max(1, keepdims=True))
    np.testing.assert_allclose(C.evaluate(CONVERTERS["softmax"](SITE, x, 1)), e / e.sum(1, keepdims=True), rtol=1e-5)
    for offset in (0, 1, -1):
        np.testing.assert_allclose(C.evaluate(CONVERTERS["diagonal"](SITE, x, offset, 1, 2)),
                                   np.diagonal(v, offset, 1, 2), rtol=1e-6)
