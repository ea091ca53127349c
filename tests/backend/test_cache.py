"""The compile cache: keyed by name-blind, value-blind structure plus shapes and dtypes, bounded,
and holding no tensors."""

from __future__ import annotations

import gc
import weakref
from functools import partial

import numpy as np
import pytest

from circuits import Add, Array, Einsum, GeneralFunction, Index, Scalar, Symbol, Tag, compile
from circuits import evaluate as evaluate_any_tier
from circuits.backend import cache_stats, clear_cache, set_cache_size
from circuits.backend.lower.program import Program

# The compile cache serves the whole-program tier (``evaluate(mode='auto')`` runs a new circuit op
# by op first: tests/backend/test_incremental.py).
evaluate = partial(evaluate_any_tier, mode="jit")


def compilations():
    return cache_stats()["compilations"]


def model(w, b, scale=0.5, names=("w", "b", "h", "out")):
    """A small circuit whose structure only this module uses (odd shapes)."""
    wn, bn, hn, on = names
    W = Array(w, name=wn)
    Bb = Array(b, name=bn)
    h = GeneralFunction("tanh", Add(Einsum.from_spec("ab,b->a", W, Bb), Scalar(scale)), name=hn)
    return Einsum.from_spec("a,a->", h, Index(W, (slice(None), 0)), name=on)


def reference(w, b, scale=0.5):
    return np.tanh(w @ b + scale) @ w[:, 0]


def rand(seed, shape=(7, 11)):
    r = np.random.default_rng(seed)
    return r.standard_normal(shape).astype(np.float32), r.standard_normal(shape[1]).astype(np.float32)


def test_patched_arrays_reuse_compiled_code_and_give_their_own_values():
    w0, b0 = rand(0)
    before = compilations()
    np.testing.assert_allclose(evaluate(model(w0, b0)), reference(w0, b0), rtol=1e-5)
    first = compilations() - before
    assert first <= 1
    for seed in (1, 2, 3):
        w, b = rand(seed)
        np.testing.assert_allclose(evaluate(model(w, b)), reference(w, b), rtol=1e-5)
    assert compilations() - before == first


def test_other_names_and_scalar_values_reuse_compiled_code():
    w, b = rand(4)
    evaluate(model(w, b))
    before = compilations()
    renamed = model(w, b, scale=-1.25, names=("W", "bias", "hidden", "y"))
    np.testing.assert_allclose(evaluate(renamed), reference(w, b, -1.25), rtol=1e-5)
    unnamed = model(w, b, scale=3.0, names=(None, None, None, None))
    np.testing.assert_allclose(evaluate(unnamed), reference(w, b, 3.0), rtol=1e-5)
    assert compilations() == before


def test_keys_ignore_names_values_and_tag_uuids_but_not_structure():
    w, b = rand(5)
    key = Program([model(w, b)], "float32").key
    w2, b2 = rand(6)
    assert Program([model(w2, b2, scale=9.0, names=("p", "q", "r", "s"))], "float32").key == key
    assert Program([model(w, b)], "float64").key != key
    w3, b3 = rand(7, shape=(7, 12))
    assert Program([model(w3, b3)], "float32").key != key
    x = Array(w)
    assert Program([Tag(x, uuid=None)], "float32").key == Program([Tag(x, uuid=None)], "float32").key
    # sharing is structure: one node used twice is not two equal-valued nodes
    y = Array(w.copy() + 1)
    assert Program([Add(x, x)], "float32").key != Program([Add(x, y)], "float32").key
    assert Program([GeneralFunction("exp", x)], "float32").key != Program([GeneralFunction("log", x)], "float32").key


def test_new_shapes_and_precisions_compile_again():
    w, b = rand(8, shape=(5, 13))
    evaluate(model(w, b))
    before = compilations()
    evaluate(model(w, b), dtype="float64")
    assert compilations() == before + 1
    w, b = rand(9, shape=(6, 13))
    evaluate(model(w, b))
    assert compilations() == before + 2


def test_compiled_function_reuses_code_across_symbol_values():
    x = Symbol((9, 2), name="x_cache")
    f = compile(GeneralFunction("softmax", x))
    before = compilations()
    for k in range(4):
        v = np.full((9, 2), float(k)) + np.arange(2)
        e = np.exp(v - v.max(-1, keepdims=True))
        np.testing.assert_allclose(f({"x_cache": v}), e / e.sum(-1, keepdims=True), rtol=1e-6)
    assert compilations() - before <= 1


def test_cache_is_bounded_and_evicts_least_recently_used():
    set_cache_size(2)
    try:
        before = cache_stats()
        for n in (17, 18, 19):
            evaluate(GeneralFunction("exp", Array(np.zeros(n, np.float32))))
        after = cache_stats()
        assert after["size"] <= 2 and after["max_size"] == 2
        assert after["evictions"] > before["evictions"]
        # the evicted first structure compiles again
        c0 = compilations()
        evaluate(GeneralFunction("exp", Array(np.ones(17, np.float32))))
        assert compilations() == c0 + 1
    finally:
        set_cache_size(128)


def test_cached_code_holds_no_tensors():
    from circuits.backend import evaluate_batched, grad
    from circuits.backend.cache import compiled as eval_runtime

    value = np.random.default_rng(10).standard_normal((3, 31)).astype(np.float32)
    node = Array(value, name="big")
    x = Symbol((31,), name="x_no_tensors")
    circuit = Einsum.from_spec("ab,b->a", GeneralFunction("sin", node), x)
    inputs = {"x_no_tensors": np.ones(31)}
    f = compile(circuit)
    f(inputs)
    evaluate(circuit, inputs)
    grad(circuit, node, inputs, mode="jit")
    evaluate_batched(circuit, {"x_no_tensors": np.ones((2, 31))}, mode="jit")  # the whole program's vmap
    key = Program([circuit], "float32").key
    probe = weakref.ref(node)
    del node, circuit, f
    gc.collect()
    kinds = {k[1] for k in eval_runtime._functions.keys() if k[0] == key}
    assert kinds == {"run", "grad", "vmap"}
    assert probe() is None


def test_hits_are_counted():
    w, b = rand(11, shape=(4, 3))
    evaluate(model(w, b))
    hits = cache_stats()["hits"]
    evaluate(model(w, b))
    assert cache_stats()["hits"] == hits + 1


def test_clear_cache_forces_a_new_compilation():
    c = GeneralFunction("cos", Array(np.zeros(23, np.float32)))
    evaluate(c)
    clear_cache()
    before = compilations()
    evaluate(c)
    assert compilations() == before + 1


@pytest.mark.parametrize("bad", [0, -3])
def test_cache_size_must_be_positive(bad):
    from circuits import EvaluationError

    with pytest.raises(EvaluationError):
        set_cache_size(bad)
