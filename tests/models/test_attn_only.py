"""The seed model builder against an independent numpy implementation, and its structure."""

import numpy as np
import pytest

import circuits as C
from benchmarks.numpy_attn_only import forward
from circuits.models import attn_only, random_weights, tokens_symbol

SMALL = dict(vocab=97, d_model=32, n_heads=4, head_size=8, n_layers=2, max_positions=64)


def _tokens(n, vocab, seed=1):
    return np.random.default_rng(seed).integers(0, vocab, n)


@pytest.mark.parametrize("seed", [0, 1])
def test_small_model_matches_numpy(seed):
    w = random_weights(seed, **SMALL)
    toks = _tokens(22, SMALL["vocab"], seed)
    got = C.evaluate(attn_only(w, toks))
    want = forward(w, toks)
    assert got.shape == (20,)
    assert np.max(np.abs(got - want)) <= 1e-4


def test_small_model_float64_is_exact():
    w = random_weights(3, **SMALL)
    toks = _tokens(30, SMALL["vocab"], 3)
    got = C.evaluate(attn_only(w, toks), dtype="float64")
    np.testing.assert_allclose(got, forward(w, toks), rtol=1e-10, atol=1e-10)


def test_logits_variant_matches_numpy():
    w = random_weights(4, **SMALL)
    toks = _tokens(12, SMALL["vocab"], 4)
    c = attn_only(w, toks, logits=True)
    assert c.name == "t.call" and c.shape == (10, SMALL["vocab"])
    got = C.evaluate(c)
    assert np.max(np.abs(got - forward(w, toks, return_logits=True))) <= 1e-4


def test_one_layer_and_given_mask():
    cfg = dict(SMALL, n_layers=1)
    w = random_weights(5, **cfg)
    toks = _tokens(10, cfg["vocab"], 5)
    w_mask = dict(w, **{"t.a.c.causal_mask": np.tril(np.ones((8, 8), np.float32))})
    a, b = attn_only(w, toks), attn_only(w_mask, toks)
    assert a == b  # the built mask is the same Array as the given one
    assert np.max(np.abs(C.evaluate(a) - forward(w, toks))) <= 1e-4


def test_symbol_tokens_evaluate_many_sequences():
    w = random_weights(6, **SMALL)
    sym = tokens_symbol(14)
    c = attn_only(w, sym)
    f = C.compile(c)
    for seed in range(3):
        toks = _tokens(14, SMALL["vocab"], 10 + seed)
        got = f({"toks_int_var": toks})
        assert np.max(np.abs(got - forward(w, toks))) <= 1e-4


def test_seed_sized_model_matches_numpy():
    w = random_weights(0)
    toks = _tokens(302, 50259, 0)
    c = attn_only(w, toks)
    got = C.evaluate(c)
    want = forward(w, toks)
    assert got.shape == (300,)
    assert np.max(np.abs(got - want)) <= 1e-4


def test_missing_weight_is_named():
    w = random_weights(0, **SMALL)
    del w["a1.w.v"]
    with pytest.raises(C.CircuitError, match="a1.w.v"):
        attn_only(w, _tokens(10, SMALL["vocab"]))


def test_bad_tokens():
    w = random_weights(0, **SMALL)
    with pytest.raises(C.CircuitError, match="int"):
        attn_only(w, np.zeros(10, np.float32))
    with pytest.raises(C.CircuitError, match="positions"):
        attn_only(w, np.zeros(100, np.int64))


@pytest.mark.slow
def test_seed_sized_model_float64_matches_numpy_tightly():
    """The seed's sizes in float64: the circuit and the numpy oracle agree to rounding."""
    w = random_weights(7)
    toks = _tokens(302, 50259, 7)
    got = C.evaluate(attn_only(w, toks), dtype="float64")
    np.testing.assert_allclose(got, forward(w, toks), rtol=1e-9, atol=1e-9)


@pytest.mark.slow
def test_seed_sized_batch_matches_numpy():
    w = random_weights(8)
    toks = np.stack([_tokens(302, 50259, 20 + i) for i in range(4)])
    got = C.evaluate_batched(attn_only(w, tokens_symbol(302)), {"toks_int_var": toks}, batch_size=3)
    want = np.stack([forward(w, t) for t in toks])
    assert got.shape == (4, 300)
    assert np.max(np.abs(got - want)) <= 1e-4
