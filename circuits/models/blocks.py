"""Building blocks shared by every model builder: layer norm, RMS norm, linear layers, causal and
sliding-window masks, rotary embeddings, attention (heads fused or split, grouped-query), MLPs
(GELU / ReLU / SwiGLU), and the seed's attention head.

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

from ..errors import CircuitError
from ..nodes import Add, Array, Circuit, Einsum, GeneralFunction, Index, Rearrange, Scalar

LN_EPS = 1e-5
NEG_INF = -10000.0
ALL = slice(None)


def _norm_axes(x: Circuit, axes: str | None, scale_axes: str | None) -> tuple[str, str, str]:
    """``(leading axes, normalised axis, scale's axes)`` of a norm over the last axis of ``x``:
    ``'i'``, ``'h'``, ``'h'`` for [positions, d_model] (the seed's specs); ``axes`` names each
    axis of ``x`` otherwise (``'ngsc'``: heads, positions, head dimension)."""
    if axes is None:
        if x.ndim != 2:
            raise CircuitError(f"a norm over {x.line()}: give axes= for an input of rank {x.ndim}")
        axes = "ih"
    if len(axes) != x.ndim or len(set(axes)) != len(axes) or "z" in axes:
        raise CircuitError(f"a norm over {x.line()}: axes={axes!r} must name its {x.ndim} axes once each (not 'z')")
    return axes[:-1], axes[-1], axes[-1] if scale_axes is None else scale_axes


def layer_norm(x: Circuit, scale: Circuit | None, bias: Circuit | None, name: str, *, eps: float = LN_EPS,
               prefix: str = "ln", axes: str | None = None, scale_axes: str | None = None) -> Circuit:
    """LayerNorm over the last axis of ``x`` ([positions, d_model]) in the seed's node layout;
    the result is named ``name``, the nodes inside it ``prefix + '.neg_mean'`` etc. (the seed's
    ``'ln'`` by default; builders pass ``prefix=name`` for names unique per site).  ``scale`` and
    ``bias`` may be None (no elementwise affine).  ``axes``: the axes of an ``x`` of another rank
    (``'ngsc'``, normalised over ``c``), ``scale_axes`` those of ``scale`` and ``bias`` (default:
    the last axis; ``'ngc'``: one scale per head, StableLM's per-head norms)."""
    lead, h, s_axes = _norm_axes(x, axes, scale_axes)
    A = lead if axes is not None else "A"
    neg = Scalar(-1.0, (1,), name=f"{prefix}.neg")
    hidden_size = GeneralFunction("last_dim_size", x, name=f"{prefix}.c.hidden_size")
    recip = GeneralFunction("reciprocal", hidden_size, name=f"{prefix}.c.recip_hidden_size")
    neg_mean = Einsum.from_spec(f"{A}{h},z,{A}->{A}z", x, neg, recip, name=f"{prefix}.neg_mean")
    mean_subbed = Add(x, neg_mean, name=f"{prefix}.mean_subbed")
    var = Einsum.from_spec(f"{lead}{h},{lead}{h},{lead}->{lead}", mean_subbed, mean_subbed, recip, name=f"{prefix}.var")
    var_p_eps = Add(Scalar(float(eps), name=f"{prefix}.c.eps"), var, name=f"{prefix}.var_p_eps")
    rsqrt = GeneralFunction("rsqrt", var_p_eps, name=f"{prefix}.rsqrt")
    if scale is None and bias is None:
        return Einsum.from_spec(f"{lead}{h},{lead}->{lead}{h}", mean_subbed, rsqrt, name=name)
    y = Einsum.from_spec(f"{lead}{h},{lead}->{lead}{h}", mean_subbed, rsqrt, name=f"{prefix}.y")
    if bias is not None and s_axes != h:
        bias = _broadcast_to(bias, s_axes, lead + h, f"{prefix}.bias_b")
    if scale is None:
        return Add(bias, y, name=name)
    y_scaled = Einsum.from_spec(f"{lead}{h},{s_axes}->{lead}{h}", y, scale,
                                name=f"{prefix}.y_scaled" if bias is not None else name)
    return y_scaled if bias is None else Add(bias, y_scaled, name=name)


def _broadcast_to(t: Circuit, t_axes: str, axes: str, name: str) -> Circuit:
    """``t`` (axes ``t_axes``) with size-1 axes where ``axes`` has axes it lacks (an Add broadcasts
    the rest)."""
    spec = f"{' '.join(t_axes)} -> " + " ".join(a if a in t_axes else "1" for a in axes[axes.index(t_axes[0]):])
    return Rearrange(t, spec, name=name)


def rms_norm(x: Circuit, scale: Circuit, name: str, *, eps: float = 1e-6, axes: str | None = None,
             scale_axes: str | None = None) -> Circuit:
    """RMSNorm over the last axis of ``x`` ([positions, d_model]): ``x * rsqrt(mean(x**2) + eps) *
    scale``, named ``name`` (inner nodes ``name + '.mean_sq'`` ...), as Llama and Mistral use it;
    ``axes`` / ``scale_axes`` as for ``layer_norm`` (Qwen3's norms of each head's queries and keys).

    >>> import numpy as np
    >>> from circuits import Array, evaluate
    >>> x = Array(np.array([[3.0, 4.0]], np.float32), name='x')
    >>> [round(float(v), 4) for v in evaluate(rms_norm(x, Array(np.ones(2, np.float32), name="s"), "n", eps=0.0))[0]]
    [0.8485, 1.1314]
    """
    lead, h, s_axes = _norm_axes(x, axes, scale_axes)
    hidden_size = GeneralFunction("last_dim_size", x, name=f"{name}.c.hidden_size")
    recip = GeneralFunction("reciprocal", hidden_size, name=f"{name}.c.recip_hidden_size")
    mean_sq = Einsum.from_spec(f"{lead}{h},{lead}{h},{lead}->{lead}", x, x, recip, name=f"{name}.mean_sq")
    p_eps = Add(Scalar(float(eps), name=f"{name}.c.eps"), mean_sq, name=f"{name}.mean_sq_p_eps")
    rsqrt = GeneralFunction("rsqrt", p_eps, name=f"{name}.rsqrt")
    return Einsum.from_spec(f"{lead}{h},{lead},{s_axes}->{lead}{h}", x, rsqrt, scale, name=name)


def linear(x: Circuit, w: Circuit, b: Circuit | None, name: str, *, w_in_out: bool = False) -> Circuit:
    """``x @ w.T + b`` for a torch ``Linear`` weight ``w`` [out, in], or ``x @ w + b`` for a weight
    stored [in, out] (GPT-2's ``Conv1D``, ``w_in_out=True``); named ``name`` (the product alone is
    ``name + '.matmul'`` when there is a bias).

    >>> import numpy as np
    >>> from circuits import Array, evaluate
    >>> x = Array(np.ones((1, 2), np.float32), name='x')
    >>> w = Array(np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], np.float32), name='w')
    >>> evaluate(linear(x, w, None, 'y')).tolist()
    [[3.0, 7.0, 11.0]]
    """
    spec = "si,io->so" if w_in_out else "si,oi->so"
    y = Einsum.from_spec(spec, x, w, name=name if b is None else f"{name}.matmul")
    return y if b is None else Add(y, b, name=name)


def neg_inf_bias(mask: Circuit, name: str | None = None) -> Circuit:
    """``-10000`` where ``mask`` is 0, else 0: the additive bias that hides masked attention scores
    (``'a.score_neg_inf_bias'``, or ``name + '.neg_inf_bias'`` for a model with several masks).
    ``exp(-10000 - max)`` is 0 in float32 and float64: a hidden key gets exactly no weight."""
    p = "a" if name is None else name
    neg_mask = Einsum.from_spec("ab,->ab", mask, Scalar(-1.0, name="neg_one"),
                                name="not_mask.neg_mask" if name is None else f"{p}.neg_mask")
    not_mask = Add(Scalar(1.0, name="one"), neg_mask, name=f"{p}.not_mask")
    return Einsum.from_spec("qk,->qk", not_mask, Scalar(NEG_INF, name="a.neg_inf"),
                            name="a.score_neg_inf_bias" if name is None else f"{p}.neg_inf_bias")


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


def sliding_causal_mask(n_queries: int, n_keys: int, window: int | None = None) -> np.ndarray:
    """``mask[q, k] = 1`` where key ``k`` may be attended from query ``q``: queries are the last
    ``n_queries`` of ``n_keys`` positions (the earlier ones come from a KV cache), ``k`` is not
    after ``q`` and, with a ``window``, fewer than ``window`` positions before it (Mistral's
    sliding window: ``q - window < k <= q``).

    >>> sliding_causal_mask(2, 4, window=2).tolist()
    [[0.0, 1.0, 1.0, 0.0], [0.0, 0.0, 1.0, 1.0]]
    """
    if window is not None and window < 1:  # an empty window masks every key: rows would attend anywhere
        raise CircuitError(f"sliding window {window}: give at least 1 (a query sees itself)")
    q = np.arange(n_keys - n_queries, n_keys)[:, None]
    k = np.arange(n_keys)[None, :]
    ok = k <= q
    if window is not None:
        ok &= q - k < window
    return ok.astype(np.float32)


def rotary_tables(positions, head_dim: int, theta: float, dtype: str = "float32",
                  rotary_dim: int | None = None, *, interleaved: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Rotary cos and sin tables [positions, head_dim] in HuggingFace's half-split layout (the
    frequencies ``theta ** (-2i / rotary_dim)`` repeated for both halves), computed at ``dtype``:
    in float32 as ``transformers`` computes them, in float64 throughout (a float64 model's own
    tables).  With ``rotary_dim < head_dim`` (GPT-NeoX's partial rotary) only the first
    ``rotary_dim`` dimensions rotate: the rest get cos 1 and sin 0, which leaves them unchanged.
    ``interleaved`` (GPT-J's layout): each frequency twice in a row (``f0 f0 f1 f1 ...``), the
    pairs ``(x[2i], x[2i + 1])`` rotating together.

    >>> cos, sin = rotary_tables([0, 1], 4, 10000.0)
    >>> cos.shape, float(cos[0, 0]), round(float(sin[1, 0]), 4)
    ((2, 4), 1.0, 0.8415)
    >>> [round(float(v), 4) for v in rotary_tables([1], 4, 10000.0, rotary_dim=2)[1][0]]
    [0.8415, 0.8415, 0.0, 0.0]
    >>> [round(float(v), 4) for v in rotary_tables([1], 4, 10000.0, interleaved=True)[1][0]]
    [0.8415, 0.8415, 0.01, 0.01]
    """
    rotary_dim = head_dim if rotary_dim is None else int(rotary_dim)
    if rotary_dim % 2 or not 0 < rotary_dim <= head_dim:
        raise CircuitError(f"rotary embeddings need an even rotary dimension from 2 to head_dim={head_dim}, "
                           f"got {rotary_dim}")
    dt = np.dtype(dtype)
    inv_freq = (1.0 / (dt.type(theta) ** (np.arange(0, rotary_dim, 2, dtype=np.int64).astype(dt)
                                           / dt.type(rotary_dim)))).astype(dt)
    freqs = np.asarray(positions, dt)[:, None] * inv_freq[None, :]
    emb = np.repeat(freqs, 2, axis=-1) if interleaved else np.concatenate([freqs, freqs], axis=-1)
    cos, sin = np.cos(emb).astype(dt), np.sin(emb).astype(dt)
    if rotary_dim < head_dim:
        rest = (len(cos), head_dim - rotary_dim)
        cos = np.concatenate([cos, np.ones(rest, dt)], axis=-1)
        sin = np.concatenate([sin, np.zeros(rest, dt)], axis=-1)
    return cos, sin


def rotary_sin_signed(sin: np.ndarray, rotary_dim: int | None = None, *, interleaved: bool = False) -> np.ndarray:
    """``sin`` with the signs of ``rotate_half`` folded in: ``rotate_half(x) * sin ==
    swap(x) * signed`` (``rotary_swap``), so rotary embeddings need no matrix product.
    HuggingFace's ``rotate_half`` is ``concat(-x[half:], x[:half])``: the first half of the
    rotary part is negated; GPT-J's ``rotate_every_two`` is ``(-x[1], x[0], -x[3], x[2], ...)``:
    the even dimensions are.

    >>> rotary_sin_signed(np.array([[1.0, 2.0, 3.0, 4.0]])).tolist()
    [[-1.0, -2.0, 3.0, 4.0]]
    >>> rotary_sin_signed(np.array([[1.0, 2.0, 3.0, 4.0]]), interleaved=True).tolist()
    [[-1.0, 2.0, -3.0, 4.0]]
    """
    r = sin.shape[-1] if rotary_dim is None else rotary_dim
    out = sin.copy()
    if interleaved:
        out[..., 0:r:2] = -out[..., 0:r:2]
    else:
        out[..., :r // 2] = -out[..., :r // 2]
    return out


def rotary_swap(d: int, rotary_dim: int | None = None, *, interleaved: bool = False) -> np.ndarray:
    """The permutation of a head's ``d`` dimensions that ``rotate_half`` (or, ``interleaved``,
    GPT-J's ``rotate_every_two``) applies before its signs: the rotary part's halves swapped (or
    each pair ``2i, 2i + 1`` swapped), the dimensions past ``rotary_dim`` in place.

    >>> rotary_swap(6, 4).tolist(), rotary_swap(6, 4, interleaved=True).tolist()
    ([2, 3, 0, 1, 4, 5], [1, 0, 3, 2, 4, 5])
    """
    r = d if rotary_dim is None else rotary_dim
    if interleaved:
        head = np.arange(r).reshape(-1, 2)[:, ::-1].reshape(-1)
    else:
        head = np.concatenate([np.arange(r // 2, r), np.arange(r // 2)])
    return np.concatenate([head, np.arange(r, d)])


def apply_rotary(x: Circuit, axes: str, cos: Circuit, sin_signed: Circuit, name: str,
                 rotary_dim: int | None = None, *, interleaved: bool = False) -> Circuit:
    """``x * cos + rotate_half(x) * sin`` for ``x`` whose axes are ``axes`` (ending in the position
    ``s`` and the head dimension ``c``, e.g. ``'ngsc'``); ``cos`` is [positions, head_dim] and
    ``sin_signed`` is ``rotary_sin_signed(sin)``.  ``rotate_half`` is a swap of the two halves of
    the head dimension's rotary part (an Index, ``name + '.swapped'``) times the signed sine:
    elementwise work only, no matrix product (so ``cost`` counts rotary as the few multiplies it
    is).  Dimensions past ``rotary_dim`` keep their value (their cos is 1 and their sin 0).
    ``interleaved``: GPT-J's pairwise rotation (tables from ``rotary_tables(interleaved=True)``).

    >>> import numpy as np
    >>> from circuits import Array, evaluate
    >>> x = np.arange(1.0, 7.0).reshape(1, 6)  # one position, head_dim 6, rotary on the first 4
    >>> cos, sin = rotary_tables([3], 6, 10000.0, 'float64', 4, interleaved=True)
    >>> got = evaluate(apply_rotary(Array(x), 'sc', Array(cos), Array(rotary_sin_signed(sin, 4, interleaved=True)),
    ...                             'r', 4, interleaved=True), dtype='float64')
    >>> every_two = np.stack([-x[:, 1:4:2], x[:, 0:4:2]], -1).reshape(1, 4)  # GPT-J's rotate_every_two
    >>> bool(np.allclose(got[:, :4], x[:, :4] * cos[:, :4] + every_two * sin[:, :4])), got[0, 4:].tolist()
    (True, [5.0, 6.0])
    """
    swap = rotary_swap(x.shape[-1], rotary_dim, interleaved=interleaved)
    swapped = Index(x, (ALL,) * (x.ndim - 1) + (swap,), name=f"{name}.swapped")
    a = Einsum.from_spec(f"{axes},sc->{axes}", x, cos, name=f"{name}.cos")
    b = Einsum.from_spec(f"{axes},sc->{axes}", swapped, sin_signed, name=f"{name}.sin")
    return Add(a, b, name=name)


def alibi_slopes(n_heads: int, dtype: str = "float32") -> np.ndarray:
    """ALiBi's per-head slopes [n_heads] as BLOOM and Falcon compute them: for the largest power
    of two ``p <= n_heads``, ``2 ** (-8 / p)`` to the powers ``1 .. p``, then for the remaining
    heads ``2 ** (-4 / p)`` to the odd powers ``1, 3, 5, ...``.  ``dtype='float32'``: the base
    rounded to float32 as ``transformers`` makes it, each power rounded to float32 (``torch.pow``'s
    float32 power may round a few of them to the neighbouring float: 1 ulp, 6e-8 relative);
    ``'float64'``: computed in float64.

    >>> alibi_slopes(4).tolist(), alibi_slopes(6).tolist()
    ([0.25, 0.0625, 0.015625, 0.00390625], [0.25, 0.0625, 0.015625, 0.00390625, 0.5, 0.125])
    """
    if isinstance(n_heads, bool) or not isinstance(n_heads, (int, np.integer)) or n_heads < 1:
        raise CircuitError(f"alibi_slopes: n_heads={n_heads!r} must be an int >= 1")
    dt = np.dtype(dtype)
    p = 2 ** int(np.floor(np.log2(n_heads)))
    base = dt.type(2 ** (-(2 ** -(np.log2(p) - 3))))
    slopes = [np.float64(base) ** np.arange(1, 1 + p)]
    if p != n_heads:
        extra = dt.type(2 ** (-(2 ** -(np.log2(2 * p) - 3))))
        slopes.append(np.float64(extra) ** np.arange(1, 1 + 2 * min(p, n_heads - p), 2))
    return np.concatenate(slopes).astype(dt)


def alibi_table(n_heads: int, n_positions: int, precision: str = "float32") -> np.ndarray:
    """ALiBi's bias ``slope[h] * k`` [n_positions, n_heads] for key positions ``k``: the bias
    ``transformers`` adds to every query's scores (absolute key positions; softmax makes it the
    relative form), computed in ``precision``: ``'float32'`` or ``'float64'`` (BLOOM: the slopes
    times the position at the model's precision; ``transformers`` makes them in float32 even for
    a float64 model, ``matrix.float64_oracle`` in float64), or ``'bfloat16'`` (Falcon: the slopes
    rounded to bfloat16 and the product too, whatever the model's dtype: returned as float32).

    >>> alibi_table(2, 3)[:, 0].tolist(), alibi_table(2, 259, 'bfloat16')[257:, 0].tolist()
    ([0.0, 0.0625, 0.125], [16.0, 16.125])
    """
    pos = np.arange(n_positions)
    if precision in ("float32", "float64"):
        slopes = alibi_slopes(n_heads, precision)
        return pos.astype(slopes.dtype)[:, None] * slopes[None, :]
    if precision == "bfloat16":
        import ml_dtypes

        bf16 = ml_dtypes.bfloat16
        slopes = alibi_slopes(n_heads).astype(bf16)
        return (pos.astype(bf16)[:, None] * slopes[None, :]).astype(np.float32)
    raise CircuitError(f"alibi_table: precision={precision!r}; 'float32', 'float64' (BLOOM) or 'bfloat16' (Falcon)")


def attention(x: Circuit, q: Circuit, k: Circuit, v: Circuit, wo: Circuit, bo: Circuit | None, *,
              mask: Circuit, mask_bias: Circuit, scale: float, name: str, split_heads: bool = False,
              wo_spec: str = "ngsc,dngc->sd", softcap: float | None = None,
              position_bias: Circuit | None = None) -> Circuit:
    """Multi-head attention given queries ``q`` [kv_heads, group, queries, head_dim], keys and
    values ``k``/``v`` [kv_heads, keys, head_dim] (grouped-query attention when ``group > 1``;
    plain multi-head when ``group == 1``) and the output weight ``wo`` (axes as ``wo_spec`` says,
    e.g. ``'dngc'``); ``mask`` [queries, keys] is 1 where attending is allowed and ``mask_bias``
    (``neg_inf_bias(mask)``) hides the rest.  Fused (one node per step, ``name + '.probs'`` is
    [kv_heads, group, queries, keys]) or with ``split_heads`` one node per head and step
    (``name + '.head{h}.probs'``, head ``h`` uses KV head ``h // group``), summed into ``name``.
    ``softcap`` (Gemma-2's ``attn_logit_softcapping``): the scores become ``softcap *
    tanh(scores / softcap)`` before masking (``'.scores_raw'`` holds ``scores / softcap``,
    ``'.scores_tanh'`` its tanh).  ``position_bias`` [kv_heads, group, keys] (ALiBi: ``Layout.alibi``)
    is added to every query's scores where the mask allows (``'.position_bias'``; hidden keys keep
    exactly ``mask_bias``).  ``x`` is unused except to check the positions agree."""
    n_kv, group, n_q, head_dim = q.shape
    if x.shape[0] != n_q:
        raise CircuitError(f"{name}: {n_q} query positions but the input has {x.shape[0]}")
    if softcap is not None and not softcap > 0:
        raise CircuitError(f"{name}: softcap={softcap!r} must be a positive number")
    if position_bias is not None and position_bias.shape != (n_kv, group, k.shape[1]):
        raise CircuitError(f"{name}: position_bias has shape {list(position_bias.shape)}; expected "
                           f"{[n_kv, group, k.shape[1]]} (kv_heads, group, keys)")

    def scores(q_, k_, q_axes, k_axes, out_axes, p, bias=None):
        """Masked scores ``p + '.scores'`` of queries ``q_`` against keys ``k_``."""
        mask_axes = out_axes[-2:]
        if softcap is None:
            sc = Scalar(float(scale), name=f"{name}.c.scale")
            raw = Einsum.from_spec(f"{q_axes},{k_axes},,{mask_axes}->{out_axes}", q_, k_, sc, mask,
                                   name=f"{p}.scores_raw")
        else:
            sc = Scalar(float(scale) / float(softcap), name=f"{name}.c.scale_over_softcap")
            over = Einsum.from_spec(f"{q_axes},{k_axes},->{out_axes}", q_, k_, sc, name=f"{p}.scores_raw")
            capped = GeneralFunction("tanh", over, name=f"{p}.scores_tanh")
            raw = Einsum.from_spec(f"{out_axes},,{mask_axes}->{out_axes}", capped,
                                   Scalar(float(softcap), name=f"{name}.c.softcap"), mask, name=f"{p}.scores_capped")
        if bias is None:
            return Add(raw, mask_bias, name=f"{p}.scores")
        # the bias where the mask allows (a hidden key's score stays exactly mask_bias)
        masked = Einsum.from_spec(f"{out_axes[:-2]}{out_axes[-1]},{mask_axes}->{out_axes}", bias, mask,
                                  name=f"{p}.position_bias")
        return Add(raw, masked, mask_bias, name=f"{p}.scores")

    if not split_heads:
        probs = GeneralFunction("softmax", scores(q, k, "ngsc", "ntc", "ngst", name, position_bias),
                                name=f"{name}.probs")
        z = Einsum.from_spec("ngst,ntc->ngsc", probs, v, name=f"{name}.z")
        out = Einsum.from_spec(wo_spec, z, wo, name=name if bo is None else f"{name}.out")
        return out if bo is None else Add(out, bo, name=name)
    in_spec, out_spec = wo_spec.split("->")
    zs, ws = in_spec.split(",")
    # Heads along one leading axis (query head h = (h // group, h % group)), each head's slices
    # Index [h] of it: the form ``circuits.backend``'s head batching fuses back into one
    # computation over the head axis when the circuit is compiled.
    q_heads = Rearrange(q, "n g s c -> (n g) s c", name=f"{name}.q_heads")
    w_heads = Rearrange(wo, f"{' '.join(ws)} -> (n g) c {out_spec[1]}", name=f"{name}.w_o_heads")
    bias_heads = None if position_bias is None else Rearrange(position_bias, "n g t -> (n g) t",
                                                              name=f"{name}.position_bias_heads")
    heads = []
    for h in range(n_kv * group):
        n, g = divmod(h, group)
        p = f"{name}.head{h}"
        q_h = Index(q_heads, (h,), name=f"{p}.q")
        k_h = Index(k, (n,), name=f"{p}.k" if group == 1 else f"{name}.kv{n}.k")
        v_h = Index(v, (n,), name=f"{p}.v" if group == 1 else f"{name}.kv{n}.v")
        bias_h = None if bias_heads is None else Index(bias_heads, (h,), name=f"{p}.alibi")
        probs = GeneralFunction("softmax", scores(q_h, k_h, "sc", "tc", "st", p, bias_h), name=f"{p}.probs")
        z = Einsum.from_spec("st,tc->sc", probs, v_h, name=f"{p}.z")
        w_h = Index(w_heads, (h,), name=f"{p}.w_o")
        heads.append(Einsum.from_spec(f"sc,c{out_spec[1]}->{out_spec}", z, w_h, name=p))
    if bo is None:
        return Add(*heads, name=name)
    return Add(Add(*heads, name=f"{name}.heads"), bo, name=name)


def mlp(x: Circuit, w_in, b_in, w_out, b_out, activation, name: str, *, w_in_out: bool = False,
        w_gate=None, b_gate=None, prefix: str | None = None) -> Circuit:
    """The feed-forward block: ``fc -> activation -> proj`` (``name + '.fc'``, ``'.act'``,
    named ``name``); with ``w_gate`` the gated form (SwiGLU when ``activation='silu'``):
    ``proj(act(gate(x)) * up(x))`` (``'.gate'``, ``'.up'``, ``'.act'``, ``'.hidden'``).  Weights as
    for ``linear`` (``w_in_out`` for [in, out]).  ``activation``: a function name, or a function
    of (node, name) building it (BLOOM's GELU, ``bloom_gelu``); ``prefix``: the inner nodes' names
    start with it instead of ``name``."""
    p = name if prefix is None else prefix

    def act(node):
        if callable(activation):
            return activation(node, f"{p}.act")
        return GeneralFunction(activation, node, name=f"{p}.act")

    if w_gate is None:
        hidden = act(linear(x, w_in, b_in, f"{p}.fc", w_in_out=w_in_out))
    else:
        gate = linear(x, w_gate, b_gate, f"{p}.gate", w_in_out=w_in_out)
        up = linear(x, w_in, b_in, f"{p}.up", w_in_out=w_in_out)
        hidden = Einsum.from_spec("sf,sf->sf", act(gate), up, name=f"{p}.hidden")
    return linear(hidden, w_out, b_out, name, w_in_out=w_in_out)


def bloom_gelu(x: Circuit, name: str) -> Circuit:
    """BLOOM's GELU, ``x * 0.5 * (1 + tanh(0.79788456 * x * (1 + 0.044715 * x * x)))``, with its
    rounded constant (``gelu_new`` uses sqrt(2 / pi) = 0.7978845608...: a 1e-9 relative
    difference, visible in float64), named ``name`` (inner nodes ``name + '.inner'``...).

    >>> import numpy as np
    >>> from circuits import Array, evaluate
    >>> v = np.array([-2.0, 0.5, 3.0])
    >>> got = evaluate(bloom_gelu(Array(v), 'g'), dtype='float64')
    >>> bool(np.allclose(got, v * 0.5 * (1.0 + np.tanh(0.79788456 * v * (1 + 0.044715 * v * v))), rtol=1e-15))
    True
    """
    axes = "abcdefgh"[:x.ndim]
    cube = Einsum.from_spec(f"{axes},{axes},{axes},->{axes}", x, x, x, Scalar(0.79788456 * 0.044715, name=f"{name}.c.k3"),
                            name=f"{name}.cube")
    lin = Einsum.from_spec(f"{axes},->{axes}", x, Scalar(0.79788456, name=f"{name}.c.k1"), name=f"{name}.lin")
    tanh = GeneralFunction("tanh", Add(lin, cube, name=f"{name}.inner"), name=f"{name}.tanh")
    one_p = Add(Scalar(1.0, name=f"{name}.c.one"), tanh, name=f"{name}.one_p_tanh")
    return Einsum.from_spec(f"{axes},{axes},->{axes}", x, one_p, Scalar(0.5, name=f"{name}.c.half"), name=name)


def residual_block(resid: Circuit, h: str, attention_fn, mlp_fn, norm1, norm2=None, *,
                   parallel: bool = False) -> Circuit:
    """One transformer block over the residual stream ``resid``, named ``h`` (``'h3'``), from
    functions building its parts: ``norm1(x, name)`` / ``norm2``, ``attention_fn(x)`` and
    ``mlp_fn(x)`` (each naming its own nodes ``h + '.attn'``...).

    - sequential (GPT-2, Llama, BLOOM): ``mid = resid + attn(norm1(resid))`` (``h + '.mid'``),
      ``h = mid + mlp(norm2(mid))``;
    - ``parallel`` (GPT-J, GPT-NeoX, Falcon, StableLM's ``use_parallel_residual``): both read the
      block's input, ``h = mlp(x2) + attn(x1) + resid`` with ``x1 = norm1(resid)`` and ``x2 =
      norm2(resid)``, or ``x2 = x1`` when ``norm2`` is None (one norm that both read: GPT-J,
      Falcon-7B).

    The norms' outputs are ``h + '.ln1'`` and ``h + '.ln2'``.

    >>> import numpy as np
    >>> from circuits import Array, Einsum, Scalar, evaluate
    >>> r = Array(np.arange(4.0).reshape(2, 2), name='r')
    >>> double = lambda x: Einsum.from_spec('sd,->sd', x, Scalar(2.0), name='h0.attn')
    >>> square = lambda x: Einsum.from_spec('sd,sd->sd', x, x, name='h0.mlp')
    >>> same = lambda x, name: Einsum.from_spec('sd->sd', x, name=name)
    >>> evaluate(residual_block(r, 'h0', double, square, same, parallel=True)).tolist()  # r + 2r + r*r
    [[0.0, 4.0], [10.0, 18.0]]
    >>> evaluate(residual_block(r, 'h0', double, square, same, same)).tolist()  # 3r + (3r)^2
    [[0.0, 12.0], [42.0, 90.0]]
    """
    x = norm1(resid, f"{h}.ln1")
    attn = attention_fn(x)
    if parallel:
        x2 = x if norm2 is None else norm2(resid, f"{h}.ln2")
        return Add(mlp_fn(x2), attn, resid, name=h)
    if norm2 is None:
        raise CircuitError(f"{h}: a sequential block needs the norm before its MLP (norm2)")
    mid = Add(attn, resid, name=f"{h}.mid")
    return Add(mlp_fn(norm2(mid, f"{h}.ln2")), mid, name=h)


def head_projections(x: Circuit, wq, bq, wk, bk, wv, bv, *, n_kv: int, group: int, name: str):
    """Queries [n_kv, group, positions, head_dim], keys and values [n_kv, positions, head_dim]
    from torch ``Linear`` weights ``wq`` [(heads head_dim), d], ``wk``/``wv`` [(n_kv head_dim), d]
    and optional biases; query head ``h`` is ``(h // group, h % group)`` (HuggingFace's order, in
    which head ``h`` reads KV head ``h // group``).  Only reshapes of the weights are made (no
    transposed copies), named ``name + '.q'`` / ``'.k'`` / ``'.v'``."""

    def proj(w, b, key, grouped):
        if grouped:
            w_h = Rearrange(w, "(n g c) d -> n g c d", n=n_kv, g=group, name=f"{name}.w_{key}")
            spec, b_spec = "sd,ngcd->ngsc", "(n g c) -> n g 1 c"
        else:
            w_h = Rearrange(w, "(n c) d -> n c d", n=n_kv, name=f"{name}.w_{key}")
            spec, b_spec = "sd,ncd->nsc", "(n c) -> n 1 c"
        y = Einsum.from_spec(spec, x, w_h, name=f"{name}.{key}" if b is None else f"{name}.{key}.matmul")
        if b is None:
            return y
        b_h = Rearrange(b, b_spec, n=n_kv, **({"g": group} if grouped else {}), name=f"{name}.b_{key}")
        return Add(y, b_h, name=f"{name}.{key}")

    return proj(wq, bq, "q", True), proj(wk, bk, "k", False), proj(wv, bv, "v", False)


FUSED_LAYOUTS = ("blocks", "heads", "grouped")


def fused_projections(x: Circuit, w, b, *, layout: str, n_kv: int, group: int, head_dim: int, name: str):
    """Queries [n_kv, group, positions, head_dim], keys and values [n_kv, positions, head_dim] from
    one fused projection: a torch ``Linear`` weight ``w`` [rows, d] (and bias ``b`` [rows] or None)
    whose rows are laid out as ``layout`` says:

    - ``'blocks'``: every query head, then every key head, then every value head (Phi-3's
      ``qkv_proj``; Falcon's multi-query ``query_key_value`` with one key-value head);
    - ``'heads'``: head by head, ``[q, k, v]`` of head 0, then of head 1... (GPT-NeoX, BLOOM and
      Falcon's classic layout; multi-head only);
    - ``'grouped'``: key-value head by key-value head, its ``group`` queries then its key and its
      value (Falcon's ``new_decoder_architecture``).

    The product is computed once, positions first (``name + '.rows'`` [positions, rows]: no
    transposed copy of the weight), then cut into ``name + '.q'`` / ``'.k'`` / ``'.v'``.

    >>> import numpy as np
    >>> from circuits import Array, evaluate
    >>> x = Array(np.eye(2), name='x')
    >>> w = Array(np.arange(24.0).reshape(12, 2), name='w')  # head_dim 2: rows per head [q q k k v v]
    >>> q, k, v = fused_projections(x, w, None, layout='heads', n_kv=2, group=1, head_dim=2, name='p')
    >>> q.shape, evaluate(k, dtype='float64')[1].tolist()  # head 1's keys: rows 8, 9 of w
    ((2, 1, 2, 2), [[16.0, 18.0], [17.0, 19.0]])
    """
    if layout not in FUSED_LAYOUTS:
        raise CircuitError(f"{name}: fused projection layout {layout!r}; one of {', '.join(map(repr, FUSED_LAYOUTS))}")
    if layout == "heads" and group != 1:
        raise CircuitError(f"{name}: the 'heads' layout has one query per key-value head (group=1), got group={group}")
    n_q, n_kvc = n_kv * group * head_dim, n_kv * head_dim
    rows = Einsum.from_spec("sd,od->so", x, w, name=f"{name}.rows" if b is None else f"{name}.rows.matmul")
    if b is not None:
        rows = Add(rows, b, name=f"{name}.rows")
    if layout == "blocks":
        q = Rearrange(Index(rows, (ALL, slice(0, n_q)), name=f"{name}.q_rows"), "s (n g c) -> n g s c", n=n_kv,
                      g=group, name=f"{name}.q")
        k = Rearrange(Index(rows, (ALL, slice(n_q, n_q + n_kvc)), name=f"{name}.k_rows"), "s (n c) -> n s c",
                      n=n_kv, name=f"{name}.k")
        v = Rearrange(Index(rows, (ALL, slice(n_q + n_kvc, n_q + 2 * n_kvc)), name=f"{name}.v_rows"),
                      "s (n c) -> n s c", n=n_kv, name=f"{name}.v")
        return q, k, v
    e = 3 if layout == "heads" else group + 2
    parts = Rearrange(rows, "s (n e c) -> e n s c", n=n_kv, e=e, name=f"{name}.parts")
    q = Rearrange(Index(parts, (slice(0, e - 2),), name=f"{name}.q_parts"), "g n s c -> n g s c", name=f"{name}.q")
    return q, Index(parts, (e - 2,), name=f"{name}.k"), Index(parts, (e - 1,), name=f"{name}.v")


# ---------------------------------------------------------------------------- mixture of experts
def top_k_mask(scores: Circuit, k: int, name: str) -> Circuit:
    """1 where an entry of ``scores`` [positions, experts] is among the ``k`` largest of its row,
    else 0: the experts a router picks, as exact comparisons of the scores themselves (no
    approximation, and no function the node set lacks).

    Expert ``e``'s rank is how many experts beat it: ``f`` beats ``e`` when its score is larger,
    or equal and ``f < e`` (exact ties go to the lower index, as ``jax.lax.top_k`` breaks them;
    torch's ``topk`` breaks exact ties in an order of its own, e.g. ``[1, 1, 1, 0, 1]`` top-2 gives
    indices ``[2, 4]``: an exact tie at the k-th place is the one case where the picks can
    differ).  With ``D[s, e, f] = scores[s, f] - scores[s, e]`` (exactly 0 only for equal scores),
    ``rank = sum_{f < e} (1 - step(-D)) + sum_{f > e} step(D)`` and the mask is
    ``step(k - 1/2 - rank)``.  Nodes: ``name + '.diff'``, ``'.rank'``; the mask is ``name``.

    >>> import numpy as np
    >>> from circuits import Array, evaluate
    >>> s = Array(np.array([[0.1, 0.7, 0.2, 0.7], [3.0, 1.0, 2.0, 0.0]]), name='s')
    >>> evaluate(top_k_mask(s, 2, 'top2')).tolist()
    [[0.0, 1.0, 0.0, 1.0], [1.0, 0.0, 1.0, 0.0]]
    """
    n_experts = scores.shape[-1]
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= n_experts:
        raise CircuitError(f"{name}: top_k={k!r} must be an int from 1 to the number of experts ({n_experts})")
    ones = Array(np.ones(n_experts, np.float32), name=f"{name}.ones")
    later = Einsum.from_spec("sf,e->sef", scores, ones, name=f"{name}.of_f")
    neg_earlier = Einsum.from_spec("se,f,->sef", scores, ones, Scalar(-1.0, name=f"{name}.c.neg"), name=f"{name}.neg_of_e")
    diff = Add(later, neg_earlier, name=f"{name}.diff")  # scores[f] - scores[e]
    f_greater = GeneralFunction("step", diff, name=f"{name}.f_greater")
    e_greater = GeneralFunction("step", Einsum.from_spec("sef,->sef", diff, Scalar(-1.0, name=f"{name}.c.neg_diff"),
                                                         name=f"{name}.neg_diff"), name=f"{name}.e_greater")
    idx = np.arange(n_experts)
    before = Array((idx[None, :] < idx[:, None]).astype(np.float32), name=f"{name}.f_before_e")  # [e, f]
    after = Array((idx[None, :] > idx[:, None]).astype(np.float32), name=f"{name}.f_after_e")
    # rank = #{f < e} - #{f < e: e strictly greater} + #{f > e: f strictly greater}
    rank = Add(Array(idx.astype(np.float32), name=f"{name}.earlier"),
               Einsum.from_spec("sef,ef,->se", e_greater, before, Scalar(-1.0, name=f"{name}.c.minus"),
                                name=f"{name}.beaten_by_e"),
               Einsum.from_spec("sef,ef->se", f_greater, after, name=f"{name}.later_greater"), name=f"{name}.rank")
    room = Add(Scalar(k - 0.5, name=f"{name}.c.k"),
               Einsum.from_spec("se,->se", rank, Scalar(-1.0, name=f"{name}.c.neg_rank"), name=f"{name}.neg_rank"),
               name=f"{name}.room")
    return GeneralFunction("step", room, name=name)


def moe(x: Circuit, router: Circuit, experts, *, top_k: int, activation: str, name: str) -> Circuit:
    """A sparse mixture-of-experts MLP (Mixtral's), computed exactly: the router's logits
    ``name + '.router'`` [positions, experts] (``router``: a torch ``Linear`` weight [experts, d]),
    their softmax ``'.router.probs'``, the ``top_k`` picked per position (``top_k_mask``:
    ``'.router.top_k'``), their probabilities renormalised to sum to 1 (``'.router.weights'``), and
    each expert as nodes of its own: ``experts[e]`` is ``(w_gate, w_up, w_down)`` (torch layouts
    [f, d], [f, d], [d, f]) and expert ``e``'s gated MLP is ``name + '.expert{e}.out'`` (inner
    ``'.expert{e}.gate'``, ``'.up'``, ``'.act'``, ``'.hidden'``), its contribution
    ``name + '.expert{e}'`` that output times its routing weight (0 where not picked), and the
    block's output ``name`` the sum of the contributions.

    Every expert is computed at every position (the unpicked ones times 0), which is exactly the
    sparse sum ``transformers`` computes; an expert's weights taken as ``Index [e]`` of one
    stacked tensor let the backend's head batching compute all experts as one einsum.

    >>> import numpy as np
    >>> from circuits import Array, evaluate
    >>> rng = np.random.default_rng(0)
    >>> x = Array(rng.standard_normal((3, 4)), name='x')
    >>> ws = [tuple(Array(rng.standard_normal(s)) for s in [(5, 4), (5, 4), (4, 5)]) for _ in range(3)]
    >>> out = moe(x, Array(rng.standard_normal((3, 4))), ws, top_k=2, activation='silu', name='m')
    >>> [round(float(v), 6) for v in evaluate(out.get_unique('m.router.weights'), dtype='float64').sum(1)]
    [1.0, 1.0, 1.0]
    """
    n_experts = len(experts)
    if router.shape[0] != n_experts:
        raise CircuitError(f"{name}: the router scores {router.shape[0]} experts but {n_experts} are given")
    logits = linear(x, router, None, f"{name}.router")
    probs = GeneralFunction("softmax", logits, name=f"{name}.router.probs")
    picked = top_k_mask(probs, top_k, f"{name}.router.top_k")
    kept = Einsum.from_spec("se,se->se", probs, picked, name=f"{name}.router.kept")
    total = GeneralFunction("reciprocal", Einsum.from_spec("se->s", kept, name=f"{name}.router.kept_sum"),
                            name=f"{name}.router.recip_sum")
    weights = Einsum.from_spec("se,s->se", kept, total, name=f"{name}.router.weights")
    by_expert = Rearrange(weights, "s e -> e s", name=f"{name}.router.weights_by_expert")
    parts = []
    for e, (w_gate, w_up, w_down) in enumerate(experts):
        p = f"{name}.expert{e}"
        out = mlp(x, w_up, None, w_down, None, activation, f"{p}.out", w_gate=w_gate, prefix=p)
        parts.append(Einsum.from_spec("sd,s->sd", out, Index(by_expert, (e,), name=f"{p}.weight"), name=p))
    return Add(*parts, name=name)
