"""The scrubbed forward pass of the induction hypothesis, written by hand in JAX (plain
``jax.numpy`` on the weight dict, none of the library's circuit machinery): the baseline that
``interp.scrub`` is measured against, and an independent oracle for its scrubbed losses.

``induction_hypothesis(prev, heads)`` on a two-layer attention-only model says: the loss reads
the token embeddings directly and through the induction heads ``heads`` of layer 1, whose values
read the embeddings, whose queries read the embeddings and whose keys read the previous-token
head ``prev`` of layer 0; every other path is resampled.  With rust_circuit's sampling (unclaimed
paths under one claim share one random datum) each sample reads these token rows:

- ``ref``: the reference datum (direct path, the values' embeddings, the labels);
- ``other``: the root claim's random datum (layer 0's heads into the output directly, and the
  layer-1 heads that are not claimed);
- per induction head ``h``: ``V`` (layer 0 into its values), ``P`` (the pattern claim's datum:
  the query embeddings and the previous-token head into its keys), ``Q`` (layer 0 into its
  queries), ``K`` (the embeddings and the other layer-0 heads into its keys).

``scrubbed_loss(w, toks, prev, heads)`` takes ``toks`` ``[2 + 4 * len(heads), positions + 2]`` in
the order ``ref, other, V_h0, P_h0, Q_h0, K_h0, V_h1, ...`` and returns the per-position loss.  Like
a researcher would write it: embeddings and layer 0 (all heads at once) on every resampled row,
then the layer-1 residuals assembled per induction head and q/k/v, and the claimed heads batched.
"""

import jax
import jax.numpy as jnp

from .handwritten_attn_only import _ln, _unembed


def _attend(q, k, v, mask):
    """Causal attention per head: ``q``, ``k``, ``v`` ``[..., heads, positions, head_size]``."""
    scores = jnp.einsum("...hqc,...hkc->...hqk", q, k) * jax.lax.rsqrt(jnp.float32(q.shape[-1]))
    scores = scores * mask - 10000.0 * (1 - mask)
    return jnp.einsum("...hqk,...hkc->...hqc", jax.nn.softmax(scores, -1), v)


def _layer0_heads(w, x, pos, mask):
    """Each layer-0 head's output ``[..., heads, positions, d_model]`` on residuals ``x`` ``[..., positions, d_model]``."""
    h = _ln(x, w["a0.ln.w.scale"], w["a0.ln.w.bias"])
    qk = h + pos
    q = jnp.einsum("...sd,hcd->...hsc", qk, w["a0.w.q"])
    k = jnp.einsum("...sd,hcd->...hsc", qk, w["a0.w.k"])
    v = jnp.einsum("...sd,hcd->...hsc", h, w["a0.w.v"])
    return jnp.einsum("...hqc,hdc->...hqd", _attend(q, k, v, mask), w["a0.w.o"])


def _layer1(w, x, pos, mask, heads):
    """The output of layer 1's heads ``heads`` (summed) on residuals ``x`` ``[positions, d_model]``."""
    h = _ln(x, w["a1.ln.w.scale"], w["a1.ln.w.bias"])
    qk = h + pos
    sel = jnp.asarray(heads)
    q = jnp.einsum("sd,hcd->hsc", qk, w["a1.w.q"][sel])
    k = jnp.einsum("sd,hcd->hsc", qk, w["a1.w.k"][sel])
    v = jnp.einsum("sd,hcd->hsc", h, w["a1.w.v"][sel])
    return jnp.einsum("hqc,hdc->qd", _attend(q, k, v, mask), w["a1.w.o"][sel])


def scrubbed_loss(w, toks, prev: int, heads: tuple):
    """Per-position loss ``[positions]`` of one sample of the scrubbed model (module docstring)."""
    n = toks.shape[1] - 2
    emb = w["t.w.tok_embeds"][toks[:, :-2]]                       # [slots, P, d]
    pos = w["t.w.pos_embeds"][:n]
    mask = jnp.tril(jnp.ones((n, n), emb.dtype))
    l0 = _layer0_heads(w, emb[1:], pos, mask)                     # [slots - 1, H, P, d]; row s - 1 is slot s
    n_heads = w["a1.w.q"].shape[0]
    others = [g for g in range(n_heads) if g not in heads]
    not_prev = jnp.asarray([g for g in range(w["a0.w.q"].shape[0]) if g != prev])
    # the residual each claimed head's queries, keys and values read: [heads, 3, P, d]
    resid = []
    for j in range(len(heads)):
        v_slot, p_slot, q_slot, k_slot = 2 + 4 * j, 3 + 4 * j, 4 + 4 * j, 5 + 4 * j
        q_res = emb[p_slot] + l0[q_slot - 1].sum(0)
        k_res = emb[k_slot] + l0[p_slot - 1, prev] + l0[k_slot - 1, not_prev].sum(0)
        v_res = emb[0] + l0[v_slot - 1].sum(0)
        resid.append(jnp.stack([q_res, k_res, v_res]))
    norm = _ln(jnp.stack(resid), w["a1.ln.w.scale"], w["a1.ln.w.bias"])
    sel = jnp.asarray(heads)
    q = jnp.einsum("hsd,hcd->hsc", norm[:, 0] + pos, w["a1.w.q"][sel])
    k = jnp.einsum("hsd,hcd->hsc", norm[:, 1] + pos, w["a1.w.k"][sel])
    v = jnp.einsum("hsd,hcd->hsc", norm[:, 2], w["a1.w.v"][sel])
    layer1 = jnp.einsum("hqc,hdc->qd", _attend(q, k, v, mask), w["a1.w.o"][sel])
    b0_other = emb[1] + l0[0].sum(0)
    if others:
        layer1 = layer1 + _layer1(w, b0_other, pos, mask, others)
    final = emb[0] + l0[0].sum(0) + layer1
    lp = jax.nn.log_softmax(_unembed(w, final), -1)
    return -jnp.take_along_axis(lp, toks[0, 1:-1, None], axis=1)[:, 0]


def scrubbed_losses(prev: int, heads):
    """A jitted ``(w, toks [samples, slots, positions + 2]) -> [samples, positions]``."""
    heads = tuple(int(h) for h in heads)
    return jax.jit(jax.vmap(lambda w, t: scrubbed_loss(w, t, prev, heads), in_axes=(None, 0)))


def slot_rows(result, heads) -> list:
    """The rows of the dataset each slot of ``scrubbed_loss`` reads, from a ``ScrubResult``'s
    sampling (``result.plan``, ``result.indices``), in ``scrubbed_loss``'s order."""
    plan, idx = result.plan, result.indices
    names = {c.name: i for i, c in enumerate(plan.claims)}
    out = [idx[0], idx[plan.o[0]]]
    for h in heads:
        out += [idx[plan.o[names[f"values {h}"]]], idx[plan.d[names[f"pattern {h}"]]],
                idx[plan.o[names[f"queries {h}"]]], idx[plan.o[names[f"keys {h}"]]]]
    return out
