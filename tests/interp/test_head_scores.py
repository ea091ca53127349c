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
    return np.stack([np.stack([record[("probs", l, h)] for h in range(n_heads)]) for l in range(2)])


def numpy_scores(w, tokens):
    prev, ind = [], []
    for row in tokens:
        pats = attention_patterns(w, row)  # [layer, head, q, k]
        n = pats.shape[-1]
        prev.append(pats[0][:, np.arange(1, n), np.arange(n - 1)])
        qs, ks = [], []
        for q in range(n):
            earlier = [p for p in range(q) if row[p] == row[q] and row[q] != 0]
            if earlier:
                qs.append(q)
                ks.append(earlier[-1] + 1)
        ind.append(pats[1][:, qs, ks])
    return (np.concatenate(prev, axis=1).mean(axis=1), np.concatenate(ind, axis=1).mean(axis=1))


@pytest.mark.parametrize("unique", [False, True])
def test_head_scores_match_numpy_on_the_shipped_model(unique):
    w = induction_weights()
    toks = induction_tokens(6, seed=4)
    prev, ind = head_scores(attn_only(w, tokens_symbol(toks.shape[1]), unique_names=unique), toks)
    want_prev, want_ind = numpy_scores(w, toks)
    np.testing.assert_allclose(prev, want_prev, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(ind, want_ind, rtol=1e-4, atol=1e-5)
    assert max(prev) > 0.5 and min(ind) > 0.4  # the trained model: one previous-token head, induction heads


def test_head_scores_on_random_weights_with_other_head_counts():
    w = random_weights(1, vocab=13, d_model=12, n_heads=3, head_size=4, n_layers=2, max_positions=16)
    toks = np.random.default_rng(0).integers(0, 13, (5, 12))
    prev, ind = head_scores(attn_only(w, tokens_symbol(12)), toks)
    assert len(prev) == len(ind) == 3
    want_prev, want_ind = numpy_scores(w, toks)
    np.testing.assert_allclose(prev, want_prev, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(ind, want_ind, rtol=1e-4, atol=1e-5)


def test_head_scores_errors():
    w = random_weights(1, vocab=13, d_model=12, n_heads=3, head_size=4, n_layers=2, max_positions=16)
    c = attn_only(w, tokens_symbol(12))
    with pytest.raises(C.errors.CircuitError, match=r"\[rows, tokens\]"):
        head_scores(c, np.arange(12))
    with pytest.raises(C.errors.CircuitError, match="no token repeats"):
        head_scores(c, np.arange(12)[None] + 1)
