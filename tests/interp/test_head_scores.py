"""``interp.head_scores`` against attention patterns computed in plain numpy (the test's own model,
``benchmarks/numpy_attn_only``), on the shipped induction model and on random weights."""

import numpy as np
import pytest

import circuits as C
from benchmarks.numpy_attn_only import forward
from circuits.interp import head_scores
from circuits.models import attn_only, induction_tokens, induction_weights, random_weights, tokens_symbol


def attention_patterns(w, row):
    record = {}
    forward(w, row, record=record)
    n_heads = w["a0.w.q"].shape[0]
    layers = sum(1 for k in w if k.endswith(".w.q"))
    return np.stack([np.stack([record[("probs", l, h)] for h in range(n_heads)]) for l in range(layers)])


def scores_of(patterns, tokens):
    """``[layers, heads]`` scores from each row's patterns ``[layer, head, q, k]``."""
    prev, ind = [], []
    for pats, row in zip(patterns, tokens):
        n = pats.shape[-1]
        prev.append(pats[:, :, np.arange(1, n), np.arange(n - 1)])
        qs, ks = [], []
        for q in range(n):
            earlier = [p for p in range(q) if row[p] == row[q] and row[q] != 0]
            if earlier:
                qs.append(q)
                ks.append(earlier[-1] + 1)
        ind.append(pats[:, :, qs, ks])
    return np.concatenate(prev, axis=2).mean(axis=2), np.concatenate(ind, axis=2).mean(axis=2)


def numpy_scores(w, tokens):
    return scores_of([attention_patterns(w, row) for row in tokens], tokens)


@pytest.mark.parametrize("unique", [False, True])
def test_head_scores_match_numpy_on_the_shipped_model(unique):
    w = induction_weights()
    toks = induction_tokens(6, seed=4)
    prev, ind = head_scores(attn_only(w, tokens_symbol(toks.shape[1]), unique_names=unique), toks)
    want_prev, want_ind = numpy_scores(w, toks)
    np.testing.assert_allclose(prev, want_prev, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(ind, want_ind, rtol=1e-4, atol=1e-5)
    assert prev.shape == ind.shape == (2, 4)
    assert max(prev[0]) > 0.5 and min(ind[1]) > 0.4  # the trained model: one previous-token head, induction heads


@pytest.mark.parametrize("layers", [1, 3])
def test_head_scores_on_random_weights_with_other_layer_and_head_counts(layers):
    w = random_weights(1, vocab=13, d_model=12, n_heads=3, head_size=4, n_layers=layers, max_positions=16)
    toks = np.random.default_rng(0).integers(0, 13, (5, 12))
    prev, ind = head_scores(attn_only(w, tokens_symbol(12)), toks)
    assert prev.shape == ind.shape == (layers, 3)
    want_prev, want_ind = numpy_scores(w, toks)
    np.testing.assert_allclose(prev, want_prev, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(ind, want_ind, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("split", [False, True])
def test_head_scores_on_gpt2_against_transformers_attentions(split):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from circuits.models import gpt2
    from circuits.models.common import tokens_symbol as hf_tokens
    from circuits.models.gpt2 import random_gpt2_weights

    cfg = dict(n_embd=16, n_head=2, n_layer=3, vocab_size=17, n_positions=16, activation_function="gelu_new")
    weights = random_gpt2_weights(cfg, seed=3)
    toks = np.random.default_rng(1).integers(1, 17, (4, 10))
    prev, ind = head_scores(gpt2(cfg, weights, hf_tokens(10), split_heads=split), toks)
    model = GPT2LMHeadModel(GPT2Config(**cfg, attn_implementation="eager")).eval()
    model.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()}, strict=False)
    with torch.no_grad():
        att = model(torch.from_numpy(toks), output_attentions=True).attentions  # per layer [rows, head, q, k]
    patterns = np.stack([a.numpy() for a in att], axis=1)  # [rows, layer, head, q, k]
    want_prev, want_ind = scores_of(patterns, toks)
    np.testing.assert_allclose(prev, want_prev, atol=1e-5)
    np.testing.assert_allclose(ind, want_ind, atol=1e-5)


def test_head_scores_errors():
    w = random_weights(1, vocab=13, d_model=12, n_heads=3, head_size=4, n_layers=2, max_positions=16)
    c = attn_only(w, tokens_symbol(12))
    with pytest.raises(C.errors.CircuitError, match=r"\[rows, tokens\]"):
        head_scores(c, np.arange(12))
    with pytest.raises(C.errors.CircuitError, match="no token repeats"):
        head_scores(c, np.arange(12)[None] + 1)
