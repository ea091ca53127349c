"""The per-call fast path of ``Compiled`` and ``evaluate_batched`` (``circuits.backend.lower.calling``):
arguments bound once, each input's shape and dtype checked once per signature, values still
checked at every call, inputs passed on as they are, results left on the device on request.
The oracle is plain numpy (rows of ``W`` gathered by the tokens, plus ``x``)."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from circuits import Add, Array, EvaluationError, GeneralFunction, Symbol, compile
from circuits.backend import evaluate, evaluate_batched
from circuits.backend.lower.calling import ArgumentBinder, binder_of
from circuits.backend.lower.lowering import cached_program

RNG = np.random.default_rng(0)
W_VALUE = RNG.standard_normal((3, 4)).astype(np.float32)
W = Array(W_VALUE, name="w")
TOK = Symbol((2,), name="tok", dtype="int64")
X = Symbol((2, 4), name="x")
CIRCUIT = Add(GeneralFunction("gen_index_at_0_c", W, TOK, name="rows"), X, name="out")


def oracle(tok, x):
    return W_VALUE[np.asarray(tok)] + np.asarray(x)


def test_repeated_calls_rebind_every_input_value():
    f = compile(CIRCUIT)
    for _ in range(3):  # the first call binds the full way, the next ones take the fast path
        tok, x = RNG.integers(0, 3, 2), RNG.standard_normal((2, 4)).astype(np.float32)
        np.testing.assert_allclose(f({"tok": tok, "x": x}), oracle(tok, x), rtol=1e-6)
        # keyed by the Symbols, in another order, the values of another dtype (cast as before)
        np.testing.assert_allclose(f({X: x.astype(np.float64), TOK: tok.astype(np.int32)}), oracle(tok, x),
                                   rtol=1e-6)


def test_a_bad_input_after_fast_calls_still_raises_the_librarys_error():
    f = compile(CIRCUIT)
    good = {"tok": np.array([0, 2]), "x": np.zeros((2, 4), np.float32)}
    f(good)
    f(good)
    with pytest.raises(EvaluationError, match=r"Symbol 'x' \[2,4\] Symbol has shape \[4, 2\]; expected \[2, 4\]"):
        f({"tok": good["tok"], "x": np.zeros((4, 2), np.float32)})
    with pytest.raises(EvaluationError, match=r"has dtype float64; expected int64 \(a float array cannot be used"):
        f({"tok": np.array([0.0, 1.0]), "x": good["x"]})
    with pytest.raises(EvaluationError, match=r"holds index 3, outside \[0, 3\)"):
        f({"tok": np.array([0, 3]), "x": good["x"]})
    with pytest.raises(EvaluationError, match=r"holds 4294967299, outside the int32"):
        f({"tok": np.array([0, 2 ** 32 + 3]), "x": good["x"]})
    with pytest.raises(EvaluationError, match=r"unbound Symbol 'x'"):
        f({"tok": good["tok"]})
    with pytest.raises(EvaluationError, match="keys must be Symbols or their names"):
        f({"tok": good["tok"], "x": good["x"], 3: 0})
    np.testing.assert_allclose(f(good), oracle(good["tok"], good["x"]))  # and good calls go on


def test_a_numpy_input_changed_in_place_gives_its_new_value_and_is_checked_again():
    f = compile(CIRCUIT)
    tok, x = np.array([0, 1]), np.ones((2, 4), np.float32)
    inputs = {"tok": tok, "x": x}
    first = f(inputs)
    np.testing.assert_allclose(first, oracle(tok, x))
    tok[:] = [2, 2]
    x *= 3
    np.testing.assert_allclose(f(inputs), oracle([2, 2], np.full((2, 4), 3.0)))
    tok[1] = 5  # out of range now: the values are checked at every call, not once per array
    with pytest.raises(EvaluationError, match=r"holds index 5, outside \[0, 3\)"):
        f(inputs)
    batch = np.array([[0, 1], [2, 0]])
    xs = np.zeros((2, 2, 4), np.float32)
    np.testing.assert_allclose(evaluate_batched(CIRCUIT, {"tok": batch, "x": xs}), W_VALUE[batch])
    batch[0] = [1, 1]
    np.testing.assert_allclose(evaluate_batched(CIRCUIT, {"tok": batch, "x": xs}), W_VALUE[batch])
    batch[1, 0] = -1
    with pytest.raises(EvaluationError, match=r"holds index -1, outside \[0, 3\)"):
        evaluate_batched(CIRCUIT, {"tok": batch, "x": xs})


def test_device_inputs_are_checked_once_per_array_and_passed_as_they_are():
    tok = jax.device_put(np.array([2, 0], np.int32))
    x = jax.device_put(np.ones((2, 4), np.float32))
    f = compile(CIRCUIT)
    np.testing.assert_allclose(f({"tok": tok, "x": x}), oracle([2, 0], np.ones((2, 4))))
    args = f._binder.bind({"tok": tok, "x": x})
    assert any(a is tok for a in args) and any(a is x for a in args)  # no copy, no cast, no slice
    host_x = np.ones((2, 4), np.float32)
    assert any(a is host_x for a in f._binder.bind({"tok": tok, "x": host_x}))  # numpy: JAX moves it in the call
    with pytest.raises(EvaluationError, match=r"holds index 7, outside \[0, 3\)"):
        f({"tok": jax.device_put(np.array([0, 7], np.int32)), "x": x})


def test_results_stay_on_the_device_on_request_and_nothing_crosses_after_warm_up():
    tok = jax.device_put(np.array([1, 2], np.int32))
    x = jax.device_put(np.zeros((2, 4), np.float32))
    f = compile(CIRCUIT)
    assert isinstance(f({"tok": tok, "x": x}), np.ndarray)
    assert isinstance(f({"tok": tok, "x": x}, return_jax=True), jax.Array)
    batch = {"tok": jax.device_put(np.array([[1, 2], [0, 0], [2, 1]], np.int32)),
             "x": jax.device_put(np.zeros((3, 2, 4), np.float32))}
    assert isinstance(evaluate_batched(CIRCUIT, batch), np.ndarray)
    assert isinstance(evaluate_batched(CIRCUIT, batch, return_jax=True), jax.Array)
    with jax.transfer_guard("disallow"):  # no host <-> device copy the caller did not ask for
        out = f({"tok": tok, "x": x}, return_jax=True)
        bout = evaluate_batched(CIRCUIT, batch, return_jax=True)
    np.testing.assert_allclose(np.asarray(out), W_VALUE[[1, 2]])
    np.testing.assert_allclose(np.asarray(bout), W_VALUE[np.asarray(batch["tok"])])


def test_batched_fast_path_equals_row_by_row_evaluation():
    toks = RNG.integers(0, 3, (5, 2))
    xs = RNG.standard_normal((5, 2, 4)).astype(np.float32)
    shared_x = RNG.standard_normal((2, 4)).astype(np.float32)
    for _ in range(2):
        got = evaluate_batched(CIRCUIT, {"tok": toks, "x": xs}, batch_size=2)
        np.testing.assert_allclose(got, np.stack([oracle(t, x) for t, x in zip(toks, xs)]), rtol=1e-6)
        got = evaluate_batched(CIRCUIT, {"tok": toks, "x": shared_x})  # one input shared by every row
        np.testing.assert_allclose(got, np.stack([oracle(t, shared_x) for t in toks]), rtol=1e-6)
    with pytest.raises(EvaluationError, match=r"has shape \[5, 3, 4\]; expected \[2, 4\] \(or \[batch, \.\.\.\] of it\)"):
        evaluate_batched(CIRCUIT, {"tok": toks, "x": np.zeros((5, 3, 4))})
    with pytest.raises(EvaluationError, match="batched inputs disagree on the batch size"):
        evaluate_batched(CIRCUIT, {"tok": toks, "x": np.zeros((4, 2, 4))})


def test_the_binder_lives_with_the_cached_program_and_other_precisions_bind_their_own():
    program, _ = cached_program(CIRCUIT, "float32", None, True)
    evaluate_batched(CIRCUIT, {"tok": np.zeros((2, 2), np.int64), "x": np.zeros((2, 2, 4))}, mode="jit", cache=False)
    assert isinstance(program.call_state, ArgumentBinder)
    assert binder_of(program, "float32") is program.call_state
    f64 = compile(CIRCUIT, dtype="float64")
    for _ in range(2):
        out = f64({"tok": np.array([0, 1]), "x": np.full((2, 4), 0.1)})
        assert out.dtype == np.float64
        np.testing.assert_allclose(out, W_VALUE[[0, 1]].astype(np.float64) + 0.1, rtol=1e-15)


def test_inputs_the_fast_path_does_not_take_still_work():
    f = compile(CIRCUIT)
    f({"tok": np.array([0, 1]), "x": np.zeros((2, 4))})
    # lists, and a Mapping that is not a dict, go the full way
    np.testing.assert_allclose(f({"tok": [2, 1], "x": [[1.0] * 4] * 2}), oracle([2, 1], np.ones((2, 4))))
    from types import MappingProxyType

    np.testing.assert_allclose(f(MappingProxyType({"tok": np.array([1, 1]), "x": np.zeros((2, 4))})),
                               oracle([1, 1], np.zeros((2, 4))))
    # called inside a jax transformation: the inputs are tracers (no values to read); a float
    # input is bound the full way as before
    g = compile(Add(X, X))
    np.testing.assert_allclose(jax.jit(lambda v: g({"x": v}, return_jax=True))(np.ones((2, 4), np.float32)),
                               np.full((2, 4), 2.0))
    # a circuit without Symbols: the same arguments at every call
    h = compile(Add(W, W))
    for _ in range(2):
        np.testing.assert_allclose(h(), 2 * W_VALUE)
    np.testing.assert_allclose(evaluate(CIRCUIT, {"tok": np.array([2, 2]), "x": np.zeros((2, 4))}), W_VALUE[[2, 2]])


def test_evaluate_whole_program_binds_through_the_same_binder():
    tok, x = np.array([1, 0]), np.zeros((2, 4), np.float32)
    for _ in range(2):
        np.testing.assert_allclose(evaluate(CIRCUIT, {"tok": tok, "x": x}, mode="jit"), oracle(tok, x))
        tok[:] = tok[::-1]
        x += 1
    assert isinstance(evaluate(CIRCUIT, {"tok": tok, "x": x}, mode="jit", return_jax=True), jax.Array)
    program, _ = cached_program(CIRCUIT, "float32", None, True)
    assert isinstance(program.call_state, ArgumentBinder)
    tok[0] = 3
    with pytest.raises(EvaluationError, match=r"holds index 3, outside \[0, 3\)"):
        evaluate(CIRCUIT, {"tok": tok, "x": x}, mode="jit")


def test_a_first_call_refused_for_its_values_does_not_turn_the_fast_path_off():
    f = compile(CIRCUIT)
    x = np.zeros((2, 4), np.float32)
    with pytest.raises(EvaluationError, match="would wrap silently"):
        f({"tok": np.array([0, 2 ** 40]), "x": x})  # the first int64 tokens seen: out of int32
    np.testing.assert_allclose(f({"tok": np.array([0, 1]), "x": x}), W_VALUE[[0, 1]])
    args = f._binder.bind({"tok": np.array([2, 1]), "x": x})
    assert args is not None and any(a is x for a in args)
