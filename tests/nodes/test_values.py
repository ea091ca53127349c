"""Every node type's shape rule and value against plain numpy (float64), on generated inputs."""

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import circuits as C
from circuits.backend import evaluate
from circuits.nodes.einsum import axis_letter
from circuits.testing import (
    CLOSED_TYPES,
    arrays,
    circuits_with_inputs,
    dags,
    einsum_specs,
    indices,
    int_arrays,
    rearrange_specs,
    shapes,
)

from . import oracle

TOL = dict(rtol=1e-9, atol=1e-9)


def value(node, inputs=None):
    return evaluate(node, inputs, dtype="float64")


def leaf_of(draw, shape, positive=False):
    return C.Array(draw(arrays(shape, "float64", positive=positive)))


# ---------------------------------------------------------------------------- leaves
@given(shapes().flatmap(lambda s: arrays(s, "float64")))
def test_array_value_and_shape(v):
    node = C.Array(v, name="w")
    assert node.shape == v.shape and node.dtype == "float64"
    np.testing.assert_array_equal(value(node), v)


@given(shapes(), st.floats(-1e3, 1e3))
def test_scalar_broadcasts_to_its_shape(shape, v):
    node = C.Scalar(v, shape)
    assert node.shape == shape and node.dtype == "float32"
    np.testing.assert_array_equal(value(node), np.full(shape, v))


@given(shapes(), st.sampled_from(["float32", "float64", "int64"]))
def test_symbol_takes_its_input(shape, dtype):
    sym = C.Symbol(shape, name="tokens", dtype=dtype)
    assert sym.shape == shape and sym.dtype == dtype
    v = np.arange(int(np.prod(shape)), dtype=dtype).reshape(shape)
    np.testing.assert_array_equal(value(sym, {sym: v}), v)


# ---------------------------------------------------------------------------- Einsum
@given(st.data())
def test_einsum_shape_and_value(data):
    spec = data.draw(einsum_specs())
    children = [leaf_of(data.draw, s) for s in spec.input_shapes]
    node = C.Einsum.from_spec(spec.spec, *children, name="e")
    assert node.shape == spec.shape
    assert node.in_axes == spec.in_axes and node.out_axes == spec.out_axes
    expected = oracle.einsum(node, [c.numpy() for c in children])
    np.testing.assert_allclose(value(node), expected, **TOL)


def test_einsum_edge_cases_by_hand():
    a = C.Array(np.arange(9.0).reshape(3, 3))
    np.testing.assert_allclose(value(C.Einsum.from_spec("aa->a", a)), [0.0, 4.0, 8.0])  # diagonal
    np.testing.assert_allclose(value(C.Einsum.from_spec("aa->", a)), 12.0)  # trace
    assert value(C.Einsum.from_spec("->")) == 1.0  # zero operands
    s = C.Scalar(2.5)
    np.testing.assert_allclose(value(C.Einsum.from_spec("ab,->ba", a, s)), 2.5 * np.arange(9.0).reshape(3, 3).T)
    # ids past 'Z' print as Greek letters and evaluate like any other
    g = C.Einsum(a, in_axes=((60, 61),), out_axes=(61,))
    assert g.spec == f"{axis_letter(60)}{axis_letter(61)}->{axis_letter(61)}"
    assert axis_letter(60) not in "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
    np.testing.assert_allclose(value(g), np.arange(9.0).reshape(3, 3).sum(0))


# ---------------------------------------------------------------------------- Add
@given(hnp.mutually_broadcastable_shapes(num_shapes=3, min_side=1, max_side=3), st.integers(1, 3), st.data())
def test_add_broadcasts_like_numpy(bshapes, n, data):
    in_shapes = bshapes.input_shapes[:n]
    children = [leaf_of(data.draw, s) for s in in_shapes]
    node = C.Add(*children)
    assert node.shape == np.broadcast_shapes(*in_shapes)
    np.testing.assert_allclose(value(node), sum(c.numpy() for c in children), **TOL)


def test_add_of_nothing_is_zero():
    node = C.Add()
    assert node.shape == ()
    assert value(node) == 0.0


# ---------------------------------------------------------------------------- GeneralFunction
ELEMENTWISE = ["exp", "sin", "cos", "tanh", "abs", "sigmoid", "relu", "gelu", "gelu_new", "silu", "square"]
POSITIVE_ONLY = ["log", "sqrt", "rsqrt", "reciprocal"]
LAST_AXIS = ["softmax", "log_softmax"]
REDUCTIONS = ["logsumexp", "max", "min", "mean", "last_dim_size"]


@given(st.sampled_from(ELEMENTWISE + POSITIVE_ONLY), shapes(), st.data())
def test_elementwise_functions(fname, shape, data):
    x = leaf_of(data.draw, shape, positive=fname in POSITIVE_ONLY)
    node = C.GeneralFunction(fname, x, name="f")
    assert node.shape == shape and node.dtype == "float64"
    np.testing.assert_allclose(value(node), oracle.UNARY[fname](x.numpy()), rtol=1e-7, atol=1e-9)


@given(st.sampled_from(LAST_AXIS + REDUCTIONS), shapes(min_rank=1), st.data())
def test_last_axis_functions(fname, shape, data):
    x = leaf_of(data.draw, shape)
    node = C.GeneralFunction(fname, x)
    assert node.shape == (shape if fname in LAST_AXIS else shape[:-1])
    np.testing.assert_allclose(value(node), oracle.UNARY[fname](x.numpy()), rtol=1e-9, atol=1e-9)


@given(hnp.mutually_broadcastable_shapes(num_shapes=2, min_side=1, max_side=3), st.data())
def test_pow_broadcasts(bshapes, data):
    base = leaf_of(data.draw, bshapes.input_shapes[0], positive=True)
    expo = leaf_of(data.draw, bshapes.input_shapes[1])
    node = C.GeneralFunction("pow", base, expo)
    assert node.shape == bshapes.result_shape
    np.testing.assert_allclose(value(node), np.power(base.numpy(), expo.numpy()), **TOL)


@given(st.data())
def test_gen_index_gathers_like_loops(data):
    x_shape = data.draw(shapes(min_rank=1, max_rank=3))
    batch = data.draw(st.booleans())
    checked = data.draw(st.booleans())
    if batch:
        r = data.draw(st.integers(0, len(x_shape) - 1))
        ax = data.draw(st.integers(r, len(x_shape) - 1))
        idx_shape = x_shape[:r]
        d = ax - r if data.draw(st.booleans()) else ax - len(x_shape)
    else:
        ax = data.draw(st.integers(0, len(x_shape) - 1))
        idx_shape = data.draw(shapes(max_rank=2))
        d = ax if data.draw(st.booleans()) else ax - len(x_shape)
    n = x_shape[ax]
    idx = data.draw(int_arrays(idx_shape, 0 if checked else -n, n))
    fname = f"gen_index_at_{d}{'_batch_x' if batch else ''}{'_c' if checked else ''}"
    x = leaf_of(data.draw, x_shape)
    node = C.GeneralFunction(fname, x, C.Array(idx))
    expected = oracle.gen_index(fname, x.numpy(), idx)
    assert node.shape == expected.shape
    np.testing.assert_allclose(value(node), expected, **TOL)


def test_checked_gen_index_out_of_range_is_nan_not_wrapped():
    x = C.Array(np.arange(3.0))
    # (an index Array is checked when the node is built; a computed index is not)
    computed = C.Add(C.Array(np.array([0, -1, 2])), C.Array(np.array([0, 0, 0]), name="zeros"))
    node = C.GeneralFunction("gen_index_at_0_c", x, computed)
    out = value(node)
    assert out[0] == 0.0 and np.isnan(out[1]) and out[2] == 2.0
    unchecked = C.GeneralFunction("gen_index_at_0", x, C.Array(np.array([-1])))
    assert value(unchecked)[0] == 2.0


# ---------------------------------------------------------------------------- Index
@given(shapes(min_rank=1, max_rank=4), st.data())
def test_index_is_outer_indexing(shape, data):
    index = data.draw(indices(shape))
    x = leaf_of(data.draw, shape)
    node = C.Index(x, index, name="i")
    expected = oracle.index_outer(x.numpy(), index)
    assert node.shape == expected.shape
    np.testing.assert_array_equal(value(node), expected)


def test_index_keeps_slices_as_written():
    x = C.Array(np.arange(10.0))
    node = C.Index(x, (slice(-2, None, None),))
    assert node.payload_text() == "[-2:]" and node.shape == (2,)
    assert C.Index(x, (slice(None, None, -3),)).payload_text() == "[::-3]"
    assert C.Index(x, (slice(1, -1),)).line() == "[8] Index [1:-1]"


# ---------------------------------------------------------------------------- Rearrange
@given(shapes(max_rank=4), st.data())
def test_rearrange_matches_einops(shape, data):
    spec = data.draw(rearrange_specs(shape))
    x = leaf_of(data.draw, shape)
    node = C.Rearrange(x, spec.spec, **spec.sizes)
    assert node.shape == spec.shape
    np.testing.assert_array_equal(value(node), oracle.rearrange(x.numpy(), node))


@given(shapes(max_rank=3), st.data())
def test_rearrange_to_a_given_output_shape(out_shape, data):
    spec = data.draw(rearrange_specs(output_shape=out_shape))
    x = leaf_of(data.draw, spec.input_shape)
    node = C.Rearrange(x, spec.spec, **spec.sizes)
    assert node.shape == out_shape
    np.testing.assert_array_equal(value(node), oracle.rearrange(x.numpy(), node))


def test_rearrange_payload_round_trips():
    x = C.Array(np.arange(30.0).reshape(6, 5))
    node = C.Rearrange(x, "(h d) s -> h s d", h=2)
    again = C.Rearrange.from_payload(C.Rearrange.parse_payload(node.payload_text()), [x])
    assert again is node
    np.testing.assert_array_equal(value(node), np.arange(30.0).reshape(2, 3, 5).transpose(0, 2, 1))


# ---------------------------------------------------------------------------- Concat, Tag
@given(shapes(min_rank=1), st.data())
def test_concat_like_numpy(shape, data):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    sizes = data.draw(st.lists(st.integers(1, 3), min_size=1, max_size=3))
    parts = []
    for n in sizes:
        s = list(shape)
        s[axis] = n
        parts.append(leaf_of(data.draw, tuple(s)))
    node = C.Concat(*parts, axis=axis)
    assert node.axis == axis % len(shape)
    expected = np.concatenate([p.numpy() for p in parts], axis=axis)
    assert node.shape == expected.shape
    np.testing.assert_array_equal(value(node), expected)


@given(shapes(), st.uuids(), st.data())
def test_tag_is_identity_with_identity_of_its_own(shape, uuid, data):
    x = leaf_of(data.draw, shape)
    tag = C.Tag(x, uuid=uuid)
    assert tag.shape == x.shape and tag.uuid == uuid
    assert tag != C.Tag(x, uuid=None)  # a fresh uuid: a distinct node
    assert C.Tag(x, uuid=str(uuid)) is tag
    np.testing.assert_array_equal(value(tag), x.numpy())


# ---------------------------------------------------------------------------- whole circuits
@given(circuits_with_inputs(max_nodes=14))
def test_generated_circuits_evaluate_like_the_numpy_oracle(case):
    circuit, inputs = case
    expected = oracle.evaluate(circuit, inputs)
    got = value(circuit, inputs)
    assert got.shape == circuit.shape
    np.testing.assert_allclose(got, expected, rtol=1e-7, atol=1e-7)


@given(dags(types=CLOSED_TYPES, max_nodes=10))
def test_float32_evaluation_is_close_to_float64(circuit):
    lo = evaluate(circuit)
    hi = value(circuit)
    assert np.all(np.isfinite(hi))
    scale = max(1.0, float(np.abs(hi).max(initial=0.0)))
    np.testing.assert_allclose(lo, hi, rtol=1e-3, atol=1e-3 * scale)
