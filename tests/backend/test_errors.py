"""Bad input raises one clear error naming the node and what was expected, before anything runs."""

from __future__ import annotations

import uuid

import numpy as np
import pytest

from circuits import (
    Add,
    Array,
    CircuitError,
    Einsum,
    EvaluationError,
    GeneralFunction,
    Index,
    ShapeError,
    Symbol,
    compile,
    evaluate,
    register_elementwise,
)
from circuits.backend import Eager, clear_cache, evaluate_batched

X = Symbol((2, 3), name="x")
TOK = Symbol((2,), name="tok", dtype="int64")
W = Array(np.ones((3, 4), np.float32), name="w")
HOLE = Array.placeholder((3, 4), "0123456789abcdef01234567", name="missing_w")

CALLS = []


def _counting_identity(x):
    CALLS.append(1)
    return x


register_elementwise("test_eval_counting_identity", _counting_identity, replace=True)


def counted(node):
    return GeneralFunction("test_eval_counting_identity", node)


def test_unbound_symbol_names_it_and_says_how_to_bind_it():
    c = Einsum.from_spec("ab,bc->ac", X, W)
    with pytest.raises(EvaluationError, match=r"unbound Symbol 'x' \[2,3\] Symbol: pass inputs=\{'x': value\}"):
        evaluate(c)


def test_placeholder_array_names_it_and_the_fix():
    c = Einsum.from_spec("ab,bc->ac", X, HOLE)
    with pytest.raises(EvaluationError, match=r"placeholder Array 'missing_w' \[3,4\] Array 0123456789abcdef01234567 "
                                              r"has no value.*circuits.bind.*fill_random"):
        evaluate(c, {"x": np.zeros((2, 3))})


def test_all_problems_are_reported_together():
    c = Add(Einsum.from_spec("ab,bc->ac", X, HOLE), Einsum.from_spec("ab,bc->ac", X, W))
    with pytest.raises(EvaluationError) as info:
        evaluate(c)
    text = str(info.value)
    assert "unbound Symbol 'x'" in text and "placeholder Array 'missing_w'" in text


def test_compiled_reports_missing_values_and_inputs_together():
    f = compile(Add(Einsum.from_spec("ab,bc->ac", X, HOLE), Einsum.from_spec("ab,bc->ac", X, W)))
    with pytest.raises(EvaluationError) as info:
        f()
    assert "unbound Symbol 'x'" in str(info.value) and "placeholder Array 'missing_w'" in str(info.value)


def test_wrong_shape_and_dtype_of_inputs():
    gather = GeneralFunction("gen_index_at_0_c", W, TOK, name="rows")
    with pytest.raises(EvaluationError, match=r"Symbol 'x' \[2,3\] Symbol has shape \[3, 2\]; expected \[2, 3\]"):
        evaluate(Einsum.from_spec("ab->", X), {"x": np.zeros((3, 2))})
    with pytest.raises(EvaluationError, match=r"Symbol 'tok' \[2\] Symbol int64 has dtype float64; expected int64 "
                                              r"\(a float array cannot be used as indices\)"):
        evaluate(gather, {"tok": np.array([0.0, 1.0])})
    with pytest.raises(EvaluationError, match="has dtype bool; expected float32"):
        evaluate(Einsum.from_spec("ab->", X), {"x": np.zeros((2, 3), bool)})
    with pytest.raises(EvaluationError, match="has dtype <U1"):
        evaluate(Einsum.from_spec("ab->", X), {"x": np.full((2, 3), "a")})


def test_a_float_array_as_a_gather_index_is_refused_when_built():
    with pytest.raises(ShapeError, match=r"'rows'.*index argument must have an int dtype, got float32"):
        GeneralFunction("gen_index_at_0_c", W, Array(np.array([0.0, 1.0], np.float32)), name="rows")
    with pytest.raises(CircuitError, match="a float array is not an index"):
        Index(W, (np.array([0.0, 1.0]),))


def test_input_keys_are_checked():
    c = Einsum.from_spec("ab->", X)
    with pytest.raises(EvaluationError, match="is not a Symbol"):
        evaluate(c, {W: np.zeros((3, 4))})
    with pytest.raises(EvaluationError, match="keys must be Symbols or their names"):
        evaluate(c, {3: np.zeros((2, 3))})
    with pytest.raises(EvaluationError, match="inputs must be a dict"):
        evaluate(c, [np.zeros((2, 3))])
    twin = Symbol((2, 3), name="x", uuid=uuid.UUID(int=7))
    both = Add(X, twin)
    with pytest.raises(EvaluationError, match="'x' matches 2 distinct Symbols"):
        evaluate(both, {"x": np.zeros((2, 3))})
    # by node there is no ambiguity
    np.testing.assert_array_equal(evaluate(both, {X: np.ones((2, 3)), twin: np.ones((2, 3))}), np.full((2, 3), 2.0))


def test_options_are_checked():
    c = Einsum.from_spec("ab->", W)
    with pytest.raises(EvaluationError, match="dtype='int32'"):
        evaluate(c, dtype="int32")
    with pytest.raises(EvaluationError, match="mode='fast'"):
        evaluate(c, mode="fast")


@pytest.mark.parametrize("run", [
    lambda c, i: evaluate(c, i, mode="jit"),
    lambda c, i: evaluate(c, i, mode="ops"),
    lambda c, i: compile(c)(i),
    lambda c, i: Eager(c, i)(c),
    lambda c, i: evaluate_batched(c, {"x": np.zeros((4, 2, 3))}),
], ids=["jit", "ops", "compiled", "Eager", "batched"])
def test_nothing_runs_before_every_check_passed(run):
    # the counting function is reached first in toposort order, the placeholder after it
    c = Add(Einsum.from_spec("ab->", counted(X)), Einsum.from_spec("ab->", HOLE))
    clear_cache()  # so that jitted paths trace (and would call the function) again
    CALLS.clear()
    with pytest.raises(EvaluationError, match="missing_w"):
        run(c, {"x": np.zeros((2, 3))})
    assert CALLS == []
    # and the function does run once the circuit is whole
    whole = Add(Einsum.from_spec("ab->", counted(X)), Einsum.from_spec("ab->", W))
    run(whole, {"x": np.zeros((2, 3))})
    assert CALLS
