"""The seed's attention-only transformer written by hand in JAX, the way a researcher would
(heads batched in one einsum): the baseline that circuit evaluation is measured against."""

import jax
import jax.numpy as jnp


def _ln(x, scale, bias, eps=1e-5):
    mean = x.mean(-1, keepdims=True)
    xc = x - mean
    var = (xc * xc).mean(-1, keepdims=True)
    return xc * jax.lax.rsqrt(var + eps) * scale + bias


def _embed(w, tokens):
    """Token embeddings of all but the last two tokens, their positional embeddings, the mask."""
    inp = tokens[:-2]
    n = inp.shape[0]
    x = w["t.w.tok_embeds"][inp]
    return x, w["t.w.pos_embeds"][:n], jnp.tril(jnp.ones((n, n), x.dtype))


def _unembed(w, x):
    return _ln(x, w["final.ln.w.scale"], w["final.ln.w.bias"]) @ w["t.w.unembed"].T


def logits(w, tokens, n_layers=2):
    return final_residual(w, tokens, n_layers) @ w["t.w.unembed"].T


def loss_naive(w, tokens, n_layers=2):
    """log_softmax over the whole vocabulary, then gather the true token."""
    lp = jax.nn.log_softmax(logits(w, tokens, n_layers), -1)
    target = tokens[1:-1]
    return -jnp.take_along_axis(lp, target[:, None], axis=1)[:, 0]


def logits_per_head(w, tokens, n_layers=2):
    """The same math head by head, as the seed's circuit computes it (eight small einsums per
    layer instead of one batched one)."""
    x, pos, mask = _embed(w, tokens)
    for l in range(n_layers):
        h = _ln(x, w[f"a{l}.ln.w.scale"], w[f"a{l}.ln.w.bias"])
        qk = h + pos
        out = 0
        for hd in range(w[f"a{l}.w.q"].shape[0]):
            q = qk @ w[f"a{l}.w.q"][hd].T
            k = qk @ w[f"a{l}.w.k"][hd].T
            v = h @ w[f"a{l}.w.v"][hd].T
            s = (q @ k.T) * jax.lax.rsqrt(jnp.float32(q.shape[-1])) * mask - 10000.0 * (1 - mask)
            out = out + (jax.nn.softmax(s, -1) @ v) @ w[f"a{l}.w.o"][hd].T
        x = x + out
    return _unembed(w, x)


def loss_naive_per_head(w, tokens, n_layers=2):
    lp = jax.nn.log_softmax(logits_per_head(w, tokens, n_layers), -1)
    return -jnp.take_along_axis(lp, tokens[1:-1][:, None], axis=1)[:, 0]


def final_residual(w, tokens, n_layers=2):
    """The final layer norm's output [positions, d_model] (what the unembedding reads)."""
    x, pos, mask = _embed(w, tokens)
    for l in range(n_layers):
        h = _ln(x, w[f"a{l}.ln.w.scale"], w[f"a{l}.ln.w.bias"])
        qk = h + pos
        q = jnp.einsum("sd,hcd->hsc", qk, w[f"a{l}.w.q"])
        k = jnp.einsum("sd,hcd->hsc", qk, w[f"a{l}.w.k"])
        v = jnp.einsum("sd,hcd->hsc", h, w[f"a{l}.w.v"])
        scores = jnp.einsum("hqc,hkc->hqk", q, k) * jax.lax.rsqrt(jnp.float32(q.shape[-1]))
        scores = scores * mask - 10000.0 * (1 - mask)
        probs = jax.nn.softmax(scores, -1)
        x = x + jnp.einsum("hqk,hkc,hdc->qd", probs, v, w[f"a{l}.w.o"])
    return _ln(x, w["final.ln.w.scale"], w["final.ln.w.bias"])


def chunked_logsumexp(x, unembed, chunks):
    """``logsumexp(x @ unembed.T, -1)`` a slice of the vocabulary at a time (``chunks`` slices,
    static: XLA sees ``chunks`` small matmuls), then combined.  XLA may run the slices at once,
    every slice's logits live together: see ``looped_logsumexp``."""
    n = unembed.shape[0]
    if chunks <= 1:
        return jax.nn.logsumexp(x @ unembed.T, -1)
    size = -(-n // chunks)
    parts = [jax.nn.logsumexp(x @ unembed[s:s + size].T, -1) for s in range(0, n, size)]
    return jax.nn.logsumexp(jnp.stack(parts, -1), -1)


def looped_logsumexp(x, unembed, chunks):
    """``logsumexp(x @ unembed.T, -1)`` in ``chunks`` slices of the vocabulary taken one after
    another in a ``lax.scan`` (one slice's logits live at a time, so they stay in cache), the
    remainder after the loop, then combined."""
    n = unembed.shape[0]
    size = -(-n // chunks)
    full = n // size

    def step(carry, start):
        w = jax.lax.dynamic_slice_in_dim(unembed, start, size, 0)
        return carry, jax.nn.logsumexp(x @ w.T, -1)

    _, parts = jax.lax.scan(step, None, jnp.arange(full) * size)
    if full * size < n:
        tail = jax.nn.logsumexp(x @ unembed[full * size:].T, -1)
        parts = jnp.concatenate([parts, tail[None]], 0)
    return jax.nn.logsumexp(parts.T, -1)


def loss_fused(w, tokens, n_layers=2, chunks=1, loop=False):
    """The loss as a careful JAX user writes it: heads batched, the true token's logit as one dot
    product per position (its unembedding row gathered) minus the vocabulary's logsumexp
    (``chunks`` > 1: computed slice by slice, static slices or with ``loop`` a ``lax.scan`` over
    them), so no [positions, vocab] log_softmax is formed."""
    x = final_residual(w, tokens, n_layers)
    target = tokens[1:-1]
    picked = jnp.einsum("sd,sd->s", x, w["t.w.unembed"][target])
    lse = looped_logsumexp if loop and chunks > 1 else chunked_logsumexp
    return lse(x, w["t.w.unembed"], chunks) - picked
