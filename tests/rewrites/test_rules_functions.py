"""Constant folding of GeneralFunctions: functions of Scalars and ``last_dim_size``."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from circuits import Array, GeneralFunction, Scalar, Symbol
from circuits.testing import shapes
from rewrites.rules.functions import RULES, fold_function_of_scalars, fold_last_dim_size

from .rewrite_helpers import RULE_SETTINGS, fire, must_not_fire, operands

# Elementwise functions and a safe range for their argument, with numpy as the oracle.
NUMPY = {
    "exp": (np.exp, -3, 3), "log": (np.log, 0.1, 5), "sin": (np.sin, -5, 5), "cos": (np.cos, -5, 5),
    "tanh": (np.tanh, -5, 5), "sqrt": (np.sqrt, 0, 5), "abs": (np.abs, -5, 5),
    "rsqrt": (lambda v: 1 / np.sqrt(v), 0.1, 5), "reciprocal": (lambda v: 1 / v, 0.1, 5),
    "sigmoid": (lambda v: 1 / (1 + np.exp(-v)), -5, 5), "relu": (lambda v: np.maximum(v, 0), -5, 5),
    "square": (np.square, -5, 5),
}


@given(name=st.sampled_from(sorted(NUMPY)), shape=shapes(max_rank=2), data=st.data())
@RULE_SETTINGS
def test_fold_function_of_scalars_matches_numpy(name, shape, data):
    fn, lo, hi = NUMPY[name]
    v = data.draw(st.floats(lo, hi))
    out = fire(fold_function_of_scalars, GeneralFunction(name, Scalar(v, shape)))
    assert isinstance(out, Scalar) and out.shape == shape
    assert math.isclose(out.value, float(fn(np.float64(v))), rel_tol=1e-12, abs_tol=1e-12)


@given(shape=shapes(max_rank=2), x=st.floats(0.5, 3), y=st.floats(-2, 2))
@RULE_SETTINGS
def test_fold_function_of_scalars_broadcasts(shape, x, y):
    out = fire(fold_function_of_scalars, GeneralFunction("pow", Scalar(x, (1,) * len(shape)), Scalar(y, shape)))
    assert out.shape == shape and math.isclose(out.value, x**y, rel_tol=1e-12)


def test_fold_function_of_scalars_does_not_fire():
    must_not_fire(fold_function_of_scalars, GeneralFunction("exp", Symbol((2,), name="x")))
    must_not_fire(fold_function_of_scalars, GeneralFunction("pow", Scalar(2.0), Symbol((2,), name="x")))
    # softmax is not elementwise: a Scalar row is not a Scalar result
    must_not_fire(fold_function_of_scalars, GeneralFunction("softmax", Scalar(1.0, (3,))))


@given(shape=shapes(min_rank=1, max_rank=3), data=st.data())
@RULE_SETTINGS
def test_fold_last_dim_size_of_anything(shape, data):
    node = GeneralFunction("last_dim_size", data.draw(operands(shape)))
    out = fire(fold_last_dim_size, node)
    assert out == Scalar(float(shape[-1]), shape[:-1])


def test_fold_last_dim_size_keeps_float64_nodes():
    x = Array(np.zeros((2, 3), np.float64))
    must_not_fire(fold_last_dim_size, GeneralFunction("last_dim_size", x))
    must_not_fire(fold_last_dim_size, GeneralFunction("mean", Symbol((2, 3), name="x")))


def test_rules_list():
    assert [r.name for r in RULES] == ["fold_last_dim_size", "fold_function_of_scalars"]
