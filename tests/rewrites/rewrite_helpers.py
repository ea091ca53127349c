"""Helpers for the rewrite tests: operand strategies, value comparison, rule firing."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from circuits import Add, Array, Einsum, GeneralFunction, Scalar
from circuits.backend import evaluate
from circuits.testing import arrays, dags, einsum_specs
from rewrites import Trace, apply, at_root, check

# Property tests: modest example counts (the suite runs on 2 shared cores).
RULE_SETTINGS = settings(max_examples=20, deadline=None,
                         suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])

NONZERO = st.floats(0.5, 1.5) | st.floats(-1.5, -0.5)


def value64(node, inputs=None):
    return evaluate(node, inputs, dtype="float64")


def assert_same(before, after, inputs=None, rtol=1e-9):
    """``after`` computes what ``before`` does (float64; NaN exactly where it has NaN)."""
    assert after.shape == before.shape and after.dtype == before.dtype
    # One compiled program for both (each example is a new structure: compiling dominates).
    _, values = evaluate(Add(before, after), inputs, dtype="float64", also=[before, after])
    want, got = values[before], values[after]
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    finite = np.abs(want[np.isfinite(want)])
    scale = max(1.0, float(finite.max())) if finite.size else 1.0
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * scale)



def fire(rule, node, inputs=None):
    """Apply ``rule`` once at the root of ``node`` through the engine; assert that it fired and that
    the result is a valid circuit of the same value; return it."""
    trace = Trace()
    out = apply(at_root(rule), node, trace=trace)
    assert out != node, f"{rule.name} did not fire on\n{node.to_text()}"
    assert trace.rules() == [rule.name], f"{rule.name} did not fire on\n{node.to_text()}"
    check(out)
    assert_same(node, out, inputs)
    return out


def must_not_fire(rule, node):
    assert rule(node) is None, f"{rule.name} fired on\n{node.to_text()}"


# ---------------------------------------------------------------------------- operands
@st.composite
def operands(draw, shape, scalars=True):
    """A node of ``shape``: mostly an Array, sometimes a small circuit or a nonzero Scalar."""
    shape = tuple(shape)
    kinds = ["array", "array", "circuit"] + (["scalar"] if scalars else [])
    kind = draw(st.sampled_from(kinds))
    if kind == "array":
        return Array(draw(arrays(shape, "float32")))
    if kind == "scalar":
        return Scalar(draw(NONZERO), shape)
    return draw(dags(shape=shape, types=(Array, Scalar, Einsum, Add, GeneralFunction),
                         functions=("tanh", "sin", "sigmoid"), max_nodes=4, max_depth=2, names=["p"]))


@st.composite
def broadcast_shapes_of(draw, shape):
    """A shape that broadcasts to ``shape`` (a suffix of it, some sizes set to 1)."""
    shape = tuple(shape)
    keep = draw(st.integers(0, len(shape)))
    suffix = list(shape[len(shape) - keep:])
    for i in range(len(suffix)):
        if draw(st.booleans()) and draw(st.booleans()):
            suffix[i] = 1
    return tuple(suffix)


@st.composite
def einsums(draw, shape=None, min_operands=1, max_operands=3, operand=None):
    """An Einsum whose operands come from ``operand(shape)`` (default ``operands``)."""
    spec = draw(einsum_specs(shape, max_operands=max_operands).filter(
        lambda s: len(s.input_shapes) >= min_operands))
    make = operand or operands
    kids = [draw(make(s)) for s in spec.input_shapes]
    return Einsum(*kids, in_axes=spec.in_axes, out_axes=spec.out_axes)
