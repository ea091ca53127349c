"""attn_only at any length up to the context, in the seed's layout (positions + 2 tokens) and in
TransformerLens' next-token one (n tokens -> n - 1 losses), against the plain-numpy oracle.

The shipped induction model holds its 32 x 32 causal mask as a weight: before issue 23 every length
but 34 tokens was a ShapeError.  The next-token oracle is written TransformerLens' way: the logits
of every token, the last position's dropped, each position scored on the token after it.
(Each distinct length compiles once, so the tests evaluate few lengths.)
"""

import numpy as np
import pytest

import circuits as C
from benchmarks.numpy_attn_only import forward, log_softmax
from circuits.models import attn_only, induction_weights, random_weights, tokens_symbol
from circuits.models.attn_only import context_of
from circuits.models.induction import CONTEXT, VOCAB


@pytest.fixture(scope="module")
def shipped():
    return induction_weights()


def _tokens(n, seed=0, vocab=VOCAB):
    return np.random.default_rng(seed).integers(0, vocab, n)


def _every_token_logits(w, toks):
    """The logits of every token (the numpy oracle reads its tokens at ``[:-2]``: two pad tokens)."""
    return forward(w, np.concatenate([toks, [0, 0]]), return_logits=True)


def _next_token_loss(logits, targets):
    """TransformerLens' per-token loss: the last position's logits dropped, each position scored
    on the token after it."""
    return -log_softmax(logits)[np.arange(len(targets) - 1), targets[1:]]


def _sliced_mask(c):
    return [x.name for x in C.toposort(c) if x.name == "t.a.c.causal_mask_idxed"]


def test_shipped_model_takes_a_shorter_sequence_in_the_seed_layout(shipped):
    assert shipped["t.a.c.causal_mask"].shape == (CONTEXT, CONTEXT) and context_of(shipped) == CONTEXT
    toks = _tokens(20, 1)
    c = attn_only(shipped, toks)  # was a ShapeError: the 32 x 32 mask against 18 positions
    assert c.shape == (18,) and _sliced_mask(c) == ["t.a.c.causal_mask_idxed"]
    np.testing.assert_allclose(C.evaluate(c), forward(shipped, toks), atol=1e-4, rtol=0)
    # at the full context the shipped mask is used whole, as before
    assert _sliced_mask(attn_only(shipped, tokens_symbol(CONTEXT + 2))) == []


def test_next_token_layout_is_transformer_lens_loss(shipped):
    clean, corrupt = _tokens(20, 2), _tokens(20, 3)
    c = attn_only(shipped, tokens_symbol(20), layout="next_token", targets=clean)
    assert c.shape == (19,)
    f = C.compile(c)
    for toks in (clean, corrupt):  # the loss against clean next tokens, whatever the input
        want = _next_token_loss(_every_token_logits(shipped, toks)[:-1], clean)
        np.testing.assert_allclose(f({"toks_int_var": toks}), want, atol=1e-4, rtol=0)


def test_next_token_logits_are_every_tokens(shipped):
    toks = _tokens(20, 4)
    c = attn_only(shipped, toks, layout="next_token", logits=True)
    assert c.shape == (20, VOCAB)
    np.testing.assert_allclose(C.evaluate(c), _every_token_logits(shipped, toks), atol=1e-4, rtol=0)


@pytest.mark.parametrize("layout, n", [("seed", 3), ("seed", 8), ("next_token", 2), ("next_token", 7)])
def test_shortest_and_longest_sequences_of_a_small_model(layout, n):
    """A 6-position model with its mask as a weight: one position and the whole context."""
    w = random_weights(1, vocab=13, d_model=8, n_heads=2, head_size=4, n_layers=1, max_positions=6)
    w["t.a.c.causal_mask"] = np.tril(np.ones((6, 6), np.float32))
    toks = _tokens(n, n, vocab=13)
    got = C.evaluate(attn_only(w, toks, layout=layout))
    if layout == "seed":
        want = forward(w, toks)
    else:
        want = _next_token_loss(_every_token_logits(w, toks[:-1]), toks)  # the last token's logits unused
    assert got.shape == want.shape == (n - (2 if layout == "seed" else 1),)
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)


@pytest.mark.parametrize("layout, n, most", [("seed", CONTEXT + 3, CONTEXT + 2),
                                             ("next_token", CONTEXT + 2, CONTEXT + 1)])
def test_longer_than_the_context_is_refused_with_the_limit(shipped, layout, n, most):
    with pytest.raises(C.CircuitError, match=rf"context is {CONTEXT} positions.*at most {most} tokens"):
        attn_only(shipped, _tokens(n), layout=layout)
    with pytest.raises(C.CircuitError, match=f"at most {CONTEXT} tokens"):
        attn_only(shipped, _tokens(CONTEXT + 1), layout="next_token", logits=True)


def test_the_seed_layout_errors_name_transformerlens_layout(shipped):
    with pytest.raises(C.CircuitError, match="layout='next_token' is TransformerLens's: n tokens give n - 1 losses"):
        attn_only(shipped, _tokens(CONTEXT + 3))
    with pytest.raises(C.CircuitError, match="layout='next_token'"):
        attn_only(shipped, _tokens(2))


def test_too_short_and_unknown_layouts_are_refused(shipped):
    with pytest.raises(C.CircuitError, match="length >= 3"):
        attn_only(shipped, _tokens(2))
    with pytest.raises(C.CircuitError, match="length >= 2"):
        attn_only(shipped, _tokens(1), layout="next_token")
    with pytest.raises(C.CircuitError, match="'seed'.*'next_token'"):
        attn_only(shipped, _tokens(5), layout="tl")
    with pytest.raises(C.CircuitError, match=r"targets has shape \[6\].*\[5\], read at \[1:\]"):
        attn_only(shipped, _tokens(5), layout="next_token", targets=_tokens(6))
    small = dict(shipped, **{"t.a.c.causal_mask": np.ones((4, 4), np.float32)})
    with pytest.raises(C.CircuitError, match="context is 4 positions"):
        attn_only(small, _tokens(7))
