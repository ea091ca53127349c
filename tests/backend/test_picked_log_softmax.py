"""``picked_log_softmax``: a gather of a log-softmax of a product computed a block of the
vocabulary at a time, against numpy, and the shapes it refuses."""

import numpy as np
import pytest

import circuits as C
from circuits.backend.lower.picked_log_softmax import chain, picked_op


def _numpy_loss(logits, index, checked):
    n = logits.shape[-1]
    peak = logits.max(-1, keepdims=True)
    lp = logits - peak - np.log(np.exp(logits - peak).sum(-1, keepdims=True))
    idx = index if checked else np.where(index < 0, index + n, index)
    bad = (idx < 0) | (idx >= n)
    got = np.take_along_axis(lp, np.clip(idx, 0, n - 1)[..., None], -1)[..., 0]
    return np.where(bad, np.nan, got)


@pytest.mark.parametrize("vocab,block", [(40, 8), (37, 8), (5000, 1024), (9, 16)])
@pytest.mark.parametrize("weight_first", [False, True])
@pytest.mark.parametrize("checked", [True, False])
def test_picked_log_probabilities_equal_numpys(vocab, block, weight_first, checked):
    """Two prompts x 6 positions, the last position's logits sliced off (the loss's ``[:-1]``),
    the weight as either operand with the vocabulary first in it; unchecked gathers count
    negative indices from the end, and an index outside the vocabulary gives NaN."""
    import jax.numpy as jnp

    rng = np.random.default_rng(vocab + block)
    h = rng.normal(size=(2, 6, 8)).astype(np.float32)
    w = rng.normal(size=(vocab, 8)).astype(np.float32)
    index = rng.integers(0, vocab, (2, 5))
    index[0, 0] = -1 if not checked else vocab  # from the end / outside: NaN
    index[1, 4] = vocab + 3  # outside either way
    hs, ws = C.Symbol(h.shape, name="h"), C.Symbol(w.shape, name="w")
    ts = C.Symbol(index.shape, name="t", dtype="int64")
    if weight_first:
        logits = C.Einsum.from_spec("vd,bsd->bsv", ws, hs)
    else:
        logits = C.Einsum.from_spec("bsd,vd->bsv", hs, ws)
    lp = C.GeneralFunction("log_softmax", C.Index(logits, (slice(None), slice(None, -1))))
    gather = C.GeneralFunction("gen_index_at_0_batch_x" + ("_c" if checked else ""), lp, ts)
    found = chain(gather)
    assert found is not None or vocab < 4096
    import circuits.backend.lower.picked_log_softmax as pl

    if found is None:
        old = pl.LONG
        pl.LONG = 1
        try:
            found = chain(gather)
        finally:
            pl.LONG = old
    args = (w, h) if weight_first else (h, w)
    got = np.asarray(picked_op(*found, block=block)(*map(jnp.asarray, args), jnp.asarray(index)))
    want = _numpy_loss((h @ w.T)[:, :-1], index, checked)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, equal_nan=True)
    assert np.isnan(got[1, 4]) and np.isnan(got[0, 0]) == checked


def test_chain_refuses_what_it_cannot_compute_a_block_at_a_time():
    """The vocabulary in both operands, the gather along another axis, an Index picking with an
    int or cutting the vocabulary, a short vocabulary: None (the plain ops)."""
    h = C.Symbol((5, 8), name="h")
    w = C.Symbol((8, 5000), name="w")
    t = C.Symbol((4,), name="t", dtype="int64")

    def loss(logits, index=(slice(None, -1),), gather="gen_index_at_0_batch_x_c", idx=t):
        lp = C.GeneralFunction("log_softmax", C.Index(logits, index))
        return C.GeneralFunction(gather, lp, idx)

    product = C.Einsum.from_spec("sd,dv->sv", h, w)
    assert chain(loss(product)) is not None
    assert chain(loss(product, (slice(None, -1), slice(0, 4000)))) is None  # cuts the vocabulary
    both = C.Einsum.from_spec("sv,dv->sv", C.Symbol((5, 5000), name="x"), C.Symbol((8, 5000), name="y"))
    assert chain(loss(both)) is None  # the vocabulary in both operands
    assert chain(loss(C.Einsum.from_spec("sd,dv->sv", h, C.Symbol((8, 100), name="short")))) is None
    assert chain(C.GeneralFunction("gen_index_at_0_c", C.GeneralFunction("log_softmax", product),
                                   C.Symbol((3,), name="i", dtype="int64"))) is None  # picks rows, not entries


def test_blocks_of_minus_infinity_before_the_first_finite_one():
    """Logits of -inf filling the first blocks (a vocabulary masked by -inf rows of the
    unembedding): the running maximum starts at -inf without making the sum NaN; the picked
    entries equal numpy's log-softmax (-inf where a masked entry is picked)."""
    import jax.numpy as jnp

    rng = np.random.default_rng(3)
    h = np.abs(rng.normal(size=(4, 8))).astype(np.float32) + 0.1
    w = rng.normal(size=(30, 8)).astype(np.float32)
    w[:16] = -np.inf
    index = np.array([20, 3, 29, 17])
    hs, ws = C.Symbol(h.shape, name="h"), C.Symbol(w.shape, name="w")
    lp = C.GeneralFunction("log_softmax", C.Einsum.from_spec("sd,vd->sv", hs, ws))
    gather = C.GeneralFunction("gen_index_at_0_batch_x_c", lp, C.Symbol((4,), name="t", dtype="int64"))
    import circuits.backend.lower.picked_log_softmax as pl

    old, pl.LONG = pl.LONG, 1
    try:
        found = chain(gather)
    finally:
        pl.LONG = old
    got = np.asarray(picked_op(*found, block=8)(jnp.asarray(h), jnp.asarray(w), jnp.asarray(index)))
    with np.errstate(invalid="ignore"):
        want = _numpy_loss(h @ w.T, index, True)
    assert np.isneginf(got[1]) and np.all(np.isfinite(got[[0, 2, 3]]))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
