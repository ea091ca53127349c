"""Building blocks shared by every model builder: layer norm, causal mask, attention head.

Each block builds nodes in the layout (names, einsum specs, function names) of the seed circuit
``shared/seeds/001_8fc6c5056666d56f.txt``, so a builder made of them prints like the seed.

>>> import numpy as np
>>> from circuits import Array, evaluate
>>> x = Array(np.arange(6, dtype=np.float32).reshape(2, 3), name='x')
>>> ln = layer_norm(x, Array(np.ones(3, np.float32), name='s'), Array(np.zeros(3, np.float32), name='b'), 'ln')
>>> [[round(float(v), 3) for v in row] for row in evaluate(ln)]
[[-1.225, 0.0, 1.225], [-1.225, 0.0, 1.225]]
>>> causal_mask(3).tolist()
[[1.0, 0.0, 0.0], [1.0, 1.0, 0.0], [1.0, 1.0, 1.0]]
"""

from __future__ import annotations

import numpy as np

from ..nodes import Add, Circuit, Einsum, GeneralFunction, Scalar

LN_EPS = 1e-5
NEG_INF = -10000.0
ALL = slice(None)


def layer_norm(x: Circuit, scale: Circuit, bias: Circuit, name: str, *, prefix: str = "") -> Circuit:
    """LayerNorm over the last axis of ``x`` ([positions, d_model]) in the seed's node layout;
    the result is named ``name``.  ``prefix`` goes before the name of every node computed from
    ``x`` (``'a0.norm.'`` gives ``'a0.norm.ln.y'``); the shared constants keep their names."""
    neg = Scalar(-1.0, (1,), name="ln.neg")
    hidden_size = GeneralFunction("last_dim_size", x, name=prefix + "ln.c.hidden_size")
    recip = GeneralFunction("reciprocal", hidden_size, name=prefix + "ln.c.recip_hidden_size")
    neg_mean = Einsum.from_spec("Ah,z,A->Az", x, neg, recip, name=prefix + "ln.neg_mean")
    mean_subbed = Add(x, neg_mean, name=prefix + "ln.mean_subbed")
    var = Einsum.from_spec("ih,ih,i->i", mean_subbed, mean_subbed, recip, name=prefix + "ln.var")
    var_p_eps = Add(Scalar(LN_EPS, name="ln.c.eps"), var, name=prefix + "ln.var_p_eps")
    rsqrt = GeneralFunction("rsqrt", var_p_eps, name=prefix + "ln.rsqrt")
    y = Einsum.from_spec("ih,i->ih", mean_subbed, rsqrt, name=prefix + "ln.y")
    y_scaled = Einsum.from_spec("ih,h->ih", y, scale, name=prefix + "ln.y_scaled")
    return Add(bias, y_scaled, name=name)


def neg_inf_bias(mask: Circuit) -> Circuit:
    """``-10000`` where ``mask`` is 0, else 0: the additive bias that hides masked attention scores."""
    neg_mask = Einsum.from_spec("ab,->ab", mask, Scalar(-1.0, name="neg_one"), name="not_mask.neg_mask")
    not_mask = Add(Scalar(1.0, name="one"), neg_mask, name="a.not_mask")
    return Einsum.from_spec("qk,->qk", not_mask, Scalar(NEG_INF, name="a.neg_inf"), name="a.score_neg_inf_bias")


def attention_head(norm: Circuit, qk_input: Circuit, wq: Circuit, wk: Circuit, wv: Circuit, wo: Circuit,
                   mask: Circuit, neg_inf_bias: Circuit, name: str, *, prefix: str = "") -> Circuit:
    """One attention head's contribution to the residual stream, named ``name``, in the seed's layout.

    ``qk_input`` ([positions, d_model]) feeds queries and keys, ``norm`` values; ``wq``/``wk``/``wv``
    are ``[head_size, d_model]``, ``wo`` is ``[d_model, head_size]``; ``mask`` is 1 where a key may
    be attended and ``neg_inf_bias`` (from ``neg_inf_bias(mask)``) is added to the masked scores.
    ``prefix`` goes before every inner node's name (``'b1.a.head3.'`` gives ``'b1.a.head3.a.k'``).
    """
    q = Einsum.from_spec("qd,cd->qc", qk_input, wq, name=prefix + "a.q")
    k = Einsum.from_spec("kd,cd->kc", qk_input, wk, name=prefix + "a.k")
    head_dim = Einsum.from_spec("jk->j", wk, name=prefix + "a.c.bias_for_head_size")
    head_size = GeneralFunction("last_dim_size", head_dim, name=prefix + "a.c.head_size")
    scale = GeneralFunction("rsqrt", head_size, name=prefix + "a.c.div_head_size")
    raw = Einsum.from_spec("qc,kc,,qk->qk", q, k, scale, mask, name=prefix + "a.attn_scores_raw")
    scores = Add(raw, neg_inf_bias, name=prefix + "a.attn_scores")
    probs = GeneralFunction("softmax", scores, name=prefix + "a.attn_probs")
    v = Einsum.from_spec("kd,Vd->kV", norm, wv, name=prefix + "a.v")
    comb_v = Einsum.from_spec("qk,kV->qV", probs, v, name=prefix + "a.comb_v")
    return Einsum.from_spec("sV,dV->sd", comb_v, wo, name=name)


def causal_mask(n: int) -> np.ndarray:
    """``mask[q, k] = 1`` where key ``k`` may be attended from query ``q`` (``k <= q``), else 0."""
    return np.tril(np.ones((n, n), dtype=np.float32))


def attention_fused(norm: Circuit, qk_input: Circuit, wq: Circuit, wk: Circuit, wv: Circuit, wo: Circuit,
                    mask: Circuit, neg_inf_bias: Circuit, name: str) -> Circuit:
    """All heads of one attention layer in one computation over a head axis (as GPT-2-style
    builders and torch imports produce), named ``name``: the sum over heads of ``attention_head``.

    ``wq``/``wk``/``wv`` are ``[heads, head_size, d_model]``, ``wo`` ``[heads, d_model, head_size]``;
    q, k and v are ``[heads, positions, head_size]``.  ``circuits.interp.split_heads`` splits it
    into per-head subcircuits.

    >>> import numpy as np
    >>> from circuits import Array, evaluate
    >>> rng = np.random.default_rng(0)
    >>> x = Array(rng.standard_normal((3, 4)).astype(np.float32), name='x')
    >>> w = [Array(rng.standard_normal(s).astype(np.float32), name=n)
    ...      for n, s in [('q', (2, 5, 4)), ('k', (2, 5, 4)), ('v', (2, 5, 4)), ('o', (2, 4, 5))]]
    >>> m = Array(causal_mask(3), name='mask')
    >>> fused = attention_fused(x, x, *w, m, neg_inf_bias(m), 'attn')
    >>> from circuits import Index
    >>> per_head = [attention_head(x, x, *(Index(t, (h, ALL, ALL)) for t in w), m, neg_inf_bias(m), 'h')
    ...             for h in range(2)]
    >>> bool(np.allclose(evaluate(fused), evaluate(per_head[0]) + evaluate(per_head[1]), atol=1e-4))
    True
    """
    q = Einsum.from_spec("qd,hcd->hqc", qk_input, wq, name="a.q")
    k = Einsum.from_spec("kd,hcd->hkc", qk_input, wk, name="a.k")
    head_dim = Einsum.from_spec("hjk->j", wk, name="a.c.bias_for_head_size")
    scale = GeneralFunction("rsqrt", GeneralFunction("last_dim_size", head_dim, name="a.c.head_size"),
                            name="a.c.div_head_size")
    raw = Einsum.from_spec("hqc,hkc,,qk->hqk", q, k, scale, mask, name="a.attn_scores_raw")
    probs = GeneralFunction("softmax", Add(raw, neg_inf_bias, name="a.attn_scores"), name="a.attn_probs")
    v = Einsum.from_spec("kd,hVd->hkV", norm, wv, name="a.v")
    comb_v = Einsum.from_spec("hqk,hkV->hqV", probs, v, name="a.comb_v")
    return Einsum.from_spec("hqV,hdV->qd", comb_v, wo, name=name)
