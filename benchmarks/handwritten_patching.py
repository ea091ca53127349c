"""Interventions on the seed model written by hand in JAX, the way a researcher would: one
jitted function whose patch is an argument, called once per patch (the baseline sweeps are
measured against).  Heads are batched in one einsum, as in ``handwritten_attn_only``."""

import jax
import jax.numpy as jnp

from .handwritten_attn_only import _embed, _ln, _unembed


def _heads(w, l, qk_in, v_in, mask):
    """Per-head outputs ``[heads, positions, d_model]``; ``qk_in``/``v_in`` are ``[positions,
    d_model]`` or one per head ``[heads, positions, d_model]``."""
    spec = "hsd,hcd->hsc" if qk_in.ndim == 3 else "sd,hcd->hsc"
    q = jnp.einsum(spec, qk_in, w[f"a{l}.w.q"])
    k = jnp.einsum(spec, qk_in, w[f"a{l}.w.k"])
    v = jnp.einsum(spec if v_in.ndim == 3 else "sd,hcd->hsc", v_in, w[f"a{l}.w.v"])
    return _attend(w, l, q, k, v, mask)


def _attend(w, l, q, k, v, mask):
    scores = jnp.einsum("hqc,hkc->hqk", q, k) * jax.lax.rsqrt(jnp.float32(q.shape[-1]))
    probs = jax.nn.softmax(scores * mask - 10000.0 * (1 - mask), -1)
    return jnp.einsum("hqk,hkc,hdc->hqd", probs, v, w[f"a{l}.w.o"])


def head_outputs(w, tokens):
    """Every head's output on ``tokens``: ``[2, heads, positions, d_model]``."""
    x, pos, mask = _embed(w, tokens)
    outs = []
    for l in range(2):
        h = _ln(x, w[f"a{l}.ln.w.scale"], w[f"a{l}.ln.w.bias"])
        out = _heads(w, l, h + pos, h, mask)
        outs.append(out)
        x = x + out.sum(0)
    return jnp.stack(outs)


def _loss(w, tokens, x):
    lp = jax.nn.log_softmax(_unembed(w, x), -1)
    return -jnp.take_along_axis(lp, tokens[1:-1][:, None], axis=1)[:, 0]


def path_patched_loss(w, tokens, corrupted_heads, sender, receiver, direct):
    """The loss with one exact path patch, given as one-hot arguments: ``sender`` ``[heads]``
    (a layer-0 sender into layer-1 receivers), ``receiver`` ``[3, heads]`` (the receiving heads'
    query, key or value inputs see the patched residual stream), ``direct`` ``[2, heads]`` (a
    sender of layer 0 or 1 whose corrupted output only the unembedding sees).
    ``corrupted_heads`` is ``head_outputs`` on the corrupted tokens."""
    x, pos, mask = _embed(w, tokens)
    scale0, bias0 = w["a0.ln.w.scale"], w["a0.ln.w.bias"]
    h0 = _ln(x, scale0, bias0)
    out0 = _heads(w, 0, h0 + pos, h0, mask)
    x1 = x + out0.sum(0)
    delta0 = corrupted_heads[0] - out0
    patched = x1 + jnp.einsum("h,hsd->sd", sender, delta0)
    # each layer-1 head reads x1, or the patched stream for the roles it receives on
    inputs = [_ln(x1 + receiver[r][:, None, None] * (patched - x1), w["a1.ln.w.scale"], w["a1.ln.w.bias"])
              for r in range(3)]
    q = jnp.einsum("hsd,hcd->hsc", inputs[0] + pos, w["a1.w.q"])
    k = jnp.einsum("hsd,hcd->hsc", inputs[1] + pos, w["a1.w.k"])
    v = jnp.einsum("hsd,hcd->hsc", inputs[2], w["a1.w.v"])
    out1 = _attend(w, 1, q, k, v, mask)
    x2 = x1 + out1.sum(0)
    x2 = x2 + jnp.einsum("h,hsd->sd", direct[0], delta0)
    x2 = x2 + jnp.einsum("h,hsd->sd", direct[1], corrupted_heads[1] - out1)
    return _loss(w, tokens, x2)
