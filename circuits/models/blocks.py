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
from ..nodes import Add, Circuit, Einsum, GeneralFunction, Index, Rearrange, Scalar

LN_EPS = 1e-5
NEG_INF = -10000.0
ALL = slice(None)


def layer_norm(x: Circuit, scale: Circuit | None, bias: Circuit | None, name: str, *, eps: float = LN_EPS,
               prefix: str = "ln") -> Circuit:
    """LayerNorm over the last axis of ``x`` ([positions, d_model]) in the seed's node layout;
    the result is named ``name``, the nodes inside it ``prefix + '.neg_mean'`` etc. (the seed's
    ``'ln'`` by default; builders pass ``prefix=name`` for names unique per site).  ``scale`` and
    ``bias`` may be None (no elementwise affine)."""
    neg = Scalar(-1.0, (1,), name=f"{prefix}.neg")
    hidden_size = GeneralFunction("last_dim_size", x, name=f"{prefix}.c.hidden_size")
    recip = GeneralFunction("reciprocal", hidden_size, name=f"{prefix}.c.recip_hidden_size")
    neg_mean = Einsum.from_spec("Ah,z,A->Az", x, neg, recip, name=f"{prefix}.neg_mean")
    mean_subbed = Add(x, neg_mean, name=f"{prefix}.mean_subbed")
    var = Einsum.from_spec("ih,ih,i->i", mean_subbed, mean_subbed, recip, name=f"{prefix}.var")
    var_p_eps = Add(Scalar(float(eps), name=f"{prefix}.c.eps"), var, name=f"{prefix}.var_p_eps")
    rsqrt = GeneralFunction("rsqrt", var_p_eps, name=f"{prefix}.rsqrt")
    if scale is None and bias is None:
        return Einsum.from_spec("ih,i->ih", mean_subbed, rsqrt, name=name)
    y = Einsum.from_spec("ih,i->ih", mean_subbed, rsqrt, name=f"{prefix}.y")
    if scale is None:
        return Add(bias, y, name=name)
    y_scaled = Einsum.from_spec("ih,h->ih", y, scale, name=f"{prefix}.y_scaled" if bias is not None else name)
    return y_scaled if bias is None else Add(bias, y_scaled, name=name)


def rms_norm(x: Circuit, scale: Circuit, name: str, *, eps: float = 1e-6) -> Circuit:
    """RMSNorm over the last axis of ``x`` ([positions, d_model]): ``x * rsqrt(mean(x**2) + eps) *
    scale``, named ``name`` (inner nodes ``name + '.mean_sq'`` ...), as Llama and Mistral use it.

    >>> import numpy as np
    >>> from circuits import Array, evaluate
    >>> x = Array(np.array([[3.0, 4.0]], np.float32), name='x')
    >>> [round(float(v), 4) for v in evaluate(rms_norm(x, Array(np.ones(2, np.float32), name="s"), "n", eps=0.0))[0]]
    [0.8485, 1.1314]
    """
    hidden_size = GeneralFunction("last_dim_size", x, name=f"{name}.c.hidden_size")
    recip = GeneralFunction("reciprocal", hidden_size, name=f"{name}.c.recip_hidden_size")
    mean_sq = Einsum.from_spec("ih,ih,i->i", x, x, recip, name=f"{name}.mean_sq")
    p_eps = Add(Scalar(float(eps), name=f"{name}.c.eps"), mean_sq, name=f"{name}.mean_sq_p_eps")
    rsqrt = GeneralFunction("rsqrt", p_eps, name=f"{name}.rsqrt")
    return Einsum.from_spec("ih,i,h->ih", x, rsqrt, scale, name=name)


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
                  rotary_dim: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Rotary cos and sin tables [positions, head_dim] in HuggingFace's half-split layout (the
    frequencies ``theta ** (-2i / rotary_dim)`` repeated for both halves), computed at ``dtype``:
    in float32 as ``transformers`` computes them, in float64 throughout (a float64 model's own
    tables).  With ``rotary_dim < head_dim`` (GPT-NeoX's partial rotary) only the first
    ``rotary_dim`` dimensions rotate: the rest get cos 1 and sin 0, which leaves them unchanged.

    >>> cos, sin = rotary_tables([0, 1], 4, 10000.0)
    >>> cos.shape, float(cos[0, 0]), round(float(sin[1, 0]), 4)
    ((2, 4), 1.0, 0.8415)
    >>> [round(float(v), 4) for v in rotary_tables([1], 4, 10000.0, rotary_dim=2)[1][0]]
    [0.8415, 0.8415, 0.0, 0.0]
    """
    rotary_dim = head_dim if rotary_dim is None else int(rotary_dim)
    if rotary_dim % 2 or not 0 < rotary_dim <= head_dim:
        raise CircuitError(f"rotary embeddings need an even rotary dimension from 2 to head_dim={head_dim}, "
                           f"got {rotary_dim}")
    dt = np.dtype(dtype)
    inv_freq = (1.0 / (dt.type(theta) ** (np.arange(0, rotary_dim, 2, dtype=np.int64).astype(dt)
                                           / dt.type(rotary_dim)))).astype(dt)
    freqs = np.asarray(positions, dt)[:, None] * inv_freq[None, :]
    emb = np.concatenate([freqs, freqs], axis=-1)
    cos, sin = np.cos(emb).astype(dt), np.sin(emb).astype(dt)
    if rotary_dim < head_dim:
        rest = (len(cos), head_dim - rotary_dim)
        cos = np.concatenate([cos, np.ones(rest, dt)], axis=-1)
        sin = np.concatenate([sin, np.zeros(rest, dt)], axis=-1)
    return cos, sin


def rotary_sin_signed(sin: np.ndarray, rotary_dim: int | None = None) -> np.ndarray:
    """``sin`` with the first half of its rotary part negated: ``rotate_half(x) * sin ==
    swap_halves(x) * signed``, so rotary embeddings need no matrix product (HuggingFace's
    ``rotate_half`` is ``concat(-x[half:], x[:half])``).

    >>> rotary_sin_signed(np.array([[1.0, 2.0, 3.0, 4.0]])).tolist()
    [[-1.0, -2.0, 3.0, 4.0]]
    """
    half = (sin.shape[-1] if rotary_dim is None else rotary_dim) // 2
    out = sin.copy()
    out[..., :half] = -out[..., :half]
    return out


def apply_rotary(x: Circuit, axes: str, cos: Circuit, sin_signed: Circuit, name: str,
                 rotary_dim: int | None = None) -> Circuit:
    """``x * cos + rotate_half(x) * sin`` for ``x`` whose axes are ``axes`` (ending in the position
    ``s`` and the head dimension ``c``, e.g. ``'ngsc'``); ``cos`` is [positions, head_dim] and
    ``sin_signed`` is ``rotary_sin_signed(sin)``.  ``rotate_half`` is a swap of the two halves of
    the head dimension's rotary part (an Index, ``name + '.swapped'``) times the signed sine:
    elementwise work only, no matrix product (so ``cost`` counts rotary as the few multiplies it
    is).  Dimensions past ``rotary_dim`` keep their value (their cos is 1 and their sin 0)."""
    d = x.shape[-1]
    r = d if rotary_dim is None else rotary_dim
    swap = np.concatenate([np.arange(r // 2, r), np.arange(r // 2), np.arange(r, d)])
    swapped = Index(x, (ALL,) * (x.ndim - 1) + (swap,), name=f"{name}.swapped")
    a = Einsum.from_spec(f"{axes},sc->{axes}", x, cos, name=f"{name}.cos")
    b = Einsum.from_spec(f"{axes},sc->{axes}", swapped, sin_signed, name=f"{name}.sin")
    return Add(a, b, name=name)


def attention(x: Circuit, q: Circuit, k: Circuit, v: Circuit, wo: Circuit, bo: Circuit | None, *,
              mask: Circuit, mask_bias: Circuit, scale: float, name: str, split_heads: bool = False,
              wo_spec: str = "ngsc,dngc->sd", softcap: float | None = None) -> Circuit:
    """Multi-head attention given queries ``q`` [kv_heads, group, queries, head_dim], keys and
    values ``k``/``v`` [kv_heads, keys, head_dim] (grouped-query attention when ``group > 1``;
    plain multi-head when ``group == 1``) and the output weight ``wo`` (axes as ``wo_spec`` says,
    e.g. ``'dngc'``); ``mask`` [queries, keys] is 1 where attending is allowed and ``mask_bias``
    (``neg_inf_bias(mask)``) hides the rest.  Fused (one node per step, ``name + '.probs'`` is
    [kv_heads, group, queries, keys]) or with ``split_heads`` one node per head and step
    (``name + '.head{h}.probs'``, head ``h`` uses KV head ``h // group``), summed into ``name``.
    ``softcap`` (Gemma-2's ``attn_logit_softcapping``): the scores become ``softcap *
    tanh(scores / softcap)`` before masking (``'.scores_raw'`` holds ``scores / softcap``,
    ``'.scores_tanh'`` its tanh).  ``x`` is unused except to check the positions agree."""
    n_kv, group, n_q, head_dim = q.shape
    if x.shape[0] != n_q:
        raise CircuitError(f"{name}: {n_q} query positions but the input has {x.shape[0]}")
    if softcap is not None and not softcap > 0:
        raise CircuitError(f"{name}: softcap={softcap!r} must be a positive number")

    def scores(q_, k_, q_axes, k_axes, out_axes, p):
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
        return Add(raw, mask_bias, name=f"{p}.scores")

    if not split_heads:
        probs = GeneralFunction("softmax", scores(q, k, "ngsc", "ntc", "ngst", name), name=f"{name}.probs")
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
    heads = []
    for h in range(n_kv * group):
        n, g = divmod(h, group)
        p = f"{name}.head{h}"
        q_h = Index(q_heads, (h,), name=f"{p}.q")
        k_h = Index(k, (n,), name=f"{p}.k" if group == 1 else f"{name}.kv{n}.k")
        v_h = Index(v, (n,), name=f"{p}.v" if group == 1 else f"{name}.kv{n}.v")
        probs = GeneralFunction("softmax", scores(q_h, k_h, "sc", "tc", "st", p), name=f"{p}.probs")
        z = Einsum.from_spec("st,tc->sc", probs, v_h, name=f"{p}.z")
        w_h = Index(w_heads, (h,), name=f"{p}.w_o")
        heads.append(Einsum.from_spec(f"sc,c{out_spec[1]}->{out_spec}", z, w_h, name=p))
    if bo is None:
        return Add(*heads, name=name)
    return Add(Add(*heads, name=f"{name}.heads"), bo, name=name)


def mlp(x: Circuit, w_in, b_in, w_out, b_out, activation: str, name: str, *, w_in_out: bool = False,
        w_gate=None, b_gate=None) -> Circuit:
    """The feed-forward block: ``fc -> activation -> proj`` (``name + '.fc'``, ``'.act'``,
    named ``name``); with ``w_gate`` the gated form (SwiGLU when ``activation='silu'``):
    ``proj(act(gate(x)) * up(x))`` (``'.gate'``, ``'.up'``, ``'.act'``, ``'.hidden'``).  Weights as
    for ``linear`` (``w_in_out`` for [in, out])."""
    if w_gate is None:
        fc = linear(x, w_in, b_in, f"{name}.fc", w_in_out=w_in_out)
        hidden = GeneralFunction(activation, fc, name=f"{name}.act")
    else:
        gate = linear(x, w_gate, b_gate, f"{name}.gate", w_in_out=w_in_out)
        up = linear(x, w_in, b_in, f"{name}.up", w_in_out=w_in_out)
        act = GeneralFunction(activation, gate, name=f"{name}.act")
        hidden = Einsum.from_spec("sf,sf->sf", act, up, name=f"{name}.hidden")
    return linear(hidden, w_out, b_out, name, w_in_out=w_in_out)


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
