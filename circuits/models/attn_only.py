"""The seed's model: an attention-only transformer computing its per-token loss.

``attn_only(weights, tokens)`` builds exactly the circuit printed in
``shared/seeds/001_8fc6c5056666d56f.txt``: same node types, names, einsum specs, index specs,
function names, scalars and child order.  Sizes (layers, heads, widths, vocabulary, positions)
come from the weights and the tokens, so small configurations build the same structure.

The computation, per layer ``l`` with residual stream ``r`` (tokens ``t``, ``P = len(t) - 2``
positions)::

    r0  = tok_embeds[t[:-2]]                       'idxed_embeds'
    n   = LN_l(r)                                  'a{l}.norm'  (LN: mean-subtract, rsqrt(var+eps), scale, bias)
    qk  = n + pos_embeds[:P]                       'a.qk_input' (positions enter queries and keys only)
    head h: softmax(q k^T / sqrt(d_head) * mask - 10000 * (1 - mask)) (n W_v^T) W_o^T
    r'  = sum_h head_h + r                         'b{l}'
    loss = -log_softmax(LN_final(r) unembed^T)[i, t[i+1]]   't.loss'

>>> from circuits.models import attn_only, random_weights
>>> import numpy as np
>>> w = random_weights(vocab=11, d_model=8, n_heads=2, head_size=4, n_layers=1, max_positions=16)
>>> c = attn_only(w, np.array([1, 2, 3, 4, 5, 6]))
>>> c.name, c.shape
('t.loss', (4,))
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from ..errors import CircuitError
from ..nodes import Add, Array, Circuit, Einsum, GeneralFunction, Index, Scalar, Symbol
from .blocks import ALL, attention_head, causal_mask, layer_norm, neg_inf_bias


def _head(layer: int, head: int, norm: Circuit, qk_input: Circuit, w, mask: Circuit, bias: Circuit,
          unique_names: bool) -> Circuit:
    """Head ``head`` of layer ``layer``: its slices of the layer's weights, then the shared block."""
    p = f"a{layer}.w"
    sel = (head, ALL, ALL)
    wq, wk, wv, wo = (Index(w[f"{p}.{k}"], sel, name=f"{p}.{k}.head{head}") for k in "qkvo")
    name = f"b{layer}.a.head{head}"
    return attention_head(norm, qk_input, wq, wk, wv, wo, mask, bias, name=name,
                          prefix=name + "." if unique_names else "")


def _weight_arrays(weights: Mapping) -> dict[str, Circuit]:
    out = {}
    for k, v in weights.items():
        out[k] = v if isinstance(v, Circuit) else Array(np.asarray(v), name=k)
        if out[k].name != k:
            raise CircuitError(f"weight {k!r} is a node named {out[k].name!r}; name it {k!r}")
    return out


def n_layers_of(weights: Mapping) -> int:
    n = 0
    while f"a{n}.w.q" in weights:
        n += 1
    if n == 0:
        raise CircuitError("weights have no 'a0.w.q': expected keys like 't.w.tok_embeds', 'a0.w.q', ...")
    return n


REQUIRED_GLOBAL = ("t.w.tok_embeds", "t.w.pos_embeds", "final.ln.w.bias", "final.ln.w.scale", "t.w.unembed")
LAYER_KEYS = ("ln.w.bias", "ln.w.scale", "w.q", "w.k", "w.v", "w.o")


def _check_weights(weights: Mapping, n_layers: int):
    needed = list(REQUIRED_GLOBAL) + [f"a{l}.{k}" for l in range(n_layers) for k in LAYER_KEYS]
    missing = [k for k in needed if k not in weights]
    if missing:
        raise CircuitError(f"attn_only: weights are missing {', '.join(missing)}")


def _tokens_node(tokens, what: str = "tokens", name: str = "toks_int_var") -> Circuit:
    if isinstance(tokens, Circuit):
        if len(tokens.shape) != 1:
            raise CircuitError(f"{what} must be 1-d, got {tokens.line()}")
        return tokens
    arr = np.asarray(tokens)
    if arr.ndim != 1 or arr.dtype.kind not in "iu":
        raise CircuitError(f"{what} must be a 1-d int array, got dtype {arr.dtype} shape {list(arr.shape)}")
    return Array(arr.astype(np.int64), name=name)


def tokens_symbol(length: int) -> Symbol:
    """The tokens input as a Symbol (``'toks_int_var'``, int64) for evaluating many sequences."""
    return Symbol((length,), name="toks_int_var", dtype="int64")


def attn_only_residual(weights: Mapping, tokens, *, unique_names: bool = False) -> tuple[Circuit, Circuit, dict]:
    """The final residual stream ``'b{L-1}'`` and the tokens node."""
    n_layers = n_layers_of(weights)
    _check_weights(weights, n_layers)
    w = _weight_arrays(weights)
    toks = _tokens_node(tokens)
    n_pos = toks.shape[0] - 2
    if n_pos < 1:
        raise CircuitError(f"tokens must have length >= 3 (positions + 2), got {toks.shape[0]}")
    if w["t.w.pos_embeds"].shape[0] < n_pos:
        raise CircuitError(
            f"{n_pos} positions but 't.w.pos_embeds' has only {w['t.w.pos_embeds'].shape[0]} rows"
        )
    mask = w.get("t.a.c.causal_mask")
    if mask is None:
        mask = Array(causal_mask(n_pos), name="t.a.c.causal_mask")
    input_toks = Index(toks, (slice(None, -2),), name="input_toks_int")
    resid = GeneralFunction("gen_index_at_0_c", w["t.w.tok_embeds"], input_toks, name="idxed_embeds")
    pos = Index(w["t.w.pos_embeds"], (slice(None, n_pos), ALL), name="t.w.pos_embeds_idxed")
    bias = neg_inf_bias(mask)
    n_heads = w["a0.w.q"].shape[0]
    for layer in range(n_layers):
        norm = layer_norm(resid, w[f"a{layer}.ln.w.scale"], w[f"a{layer}.ln.w.bias"], f"a{layer}.norm",
                          prefix=f"a{layer}.norm.ln" if unique_names else "ln")
        qk_input = Add(norm, pos, name=f"a{layer}.qk_input" if unique_names else "a.qk_input")
        heads = [_head(layer, h, norm, qk_input, w, mask, bias, unique_names) for h in range(n_heads)]
        resid = Add(Add(*heads, name=f"b{layer}.a"), resid, name=f"b{layer}")
    return resid, toks, w


def attn_only(weights: Mapping, tokens, *, logits: bool = False, unique_names: bool = False,
              targets=None) -> Circuit:
    """The seed's loss circuit ``'t.loss'`` ([positions]): the negative log-probability of each next
    token.  ``weights`` maps the seed's Array names (``'t.w.tok_embeds'``, ``'a0.w.q'``, ...,
    ``'t.w.unembed'``; ``'t.a.c.causal_mask'`` optional) to arrays (or Array nodes); ``tokens`` is the
    int array the seed calls ``'toks_int_var'`` (positions + 2 long) or a Symbol for it (see
    ``tokens_symbol``).  ``logits=True`` returns the logits ``'t.call'`` ([positions, vocab]).

    ``unique_names=True`` gives every node a name of its own, for interventions: the nodes of
    head ``h`` of layer ``l`` are ``'b{l}.a.head{h}.<seed name>'`` (``'b1.a.head3.a.k'``,
    ``'b1.a.head3.a.attn_probs'``), a LayerNorm's inner nodes ``'a{l}.norm.<seed name>'`` and
    ``'final.norm.<seed name>'`` (``'a0.norm.ln.y'``), a layer's query/key input
    ``'a{l}.qk_input'`` (a LayerNorm's constants too: ``'a0.norm.ln.c.eps'``); constants shared
    by all heads (``'a.score_neg_inf_bias'``) keep their names.  The default keeps the seed's names byte for byte.

    ``targets`` (same layout as ``tokens``: an int array or Symbol of positions + 2, read at
    ``[1:-1]``; an Array is named ``'targets_int_var'``) gives the loss its own targets, so the
    input tokens can be corrupted while the loss is measured against clean next tokens.

    >>> w = random_weights(vocab=11, d_model=8, n_heads=2, head_size=4, n_layers=1, max_positions=16)
    >>> c = attn_only(w, np.arange(6), unique_names=True, targets=np.arange(6)[::-1])
    >>> c.get_unique('b0.a.head1.a.k').line(), c.get_unique('true_toks_int').children[0].name
    ("'b0.a.head1.a.k' Einsum kd,cd->kc", 'targets_int_var')
    """
    resid, toks, w = attn_only_residual(weights, tokens, unique_names=unique_names)
    final = layer_norm(resid, w["final.ln.w.scale"], w["final.ln.w.bias"], "final.call",
                       prefix="final.norm.ln" if unique_names else "ln")
    out = Einsum.from_spec("sh,vh->sv", final, w["t.w.unembed"], name="t.call")
    if logits:
        if targets is not None:
            raise CircuitError("attn_only: targets= only matters for the loss; logits=True takes none")
        return out
    log_probs = GeneralFunction("log_softmax", out, name="log_probs")
    if targets is not None:
        target_node = _tokens_node(targets, "targets", "targets_int_var")
        if target_node.shape != toks.shape:
            raise CircuitError(
                f"targets has shape {list(target_node.shape)}; give it the tokens' layout "
                f"({list(toks.shape)}: positions + 2, read at [1:-1])"
            )
        toks = target_node
    true_toks = Index(toks, (slice(1, -1),), name="true_toks_int")
    ll = GeneralFunction("gen_index_at_0_batch_x_c", log_probs, true_toks, name="ll")
    return Einsum.from_spec("a,->a", ll, Scalar(-1.0, name="nll.neg"), name="t.loss")


def random_weights(seed: int = 0, *, vocab: int = 50259, d_model: int = 256, n_heads: int = 8,
                   head_size: int = 32, n_layers: int = 2, max_positions: int = 2048,
                   dtype=np.float32) -> dict[str, np.ndarray]:
    """Random weights keyed by the seed's names (the seed's sizes by default), scaled so the
    activations stay O(1)."""
    rng = np.random.default_rng(seed)

    def normal(*shape, scale):
        return (rng.standard_normal(shape) * scale).astype(dtype)

    w = {
        "t.w.tok_embeds": normal(vocab, d_model, scale=1.0),
        "t.w.pos_embeds": normal(max_positions, d_model, scale=0.5),
        "final.ln.w.bias": normal(d_model, scale=0.1),
        "final.ln.w.scale": (1.0 + normal(d_model, scale=0.1)).astype(dtype),
        "t.w.unembed": normal(vocab, d_model, scale=d_model**-0.5),
    }
    for l in range(n_layers):
        w[f"a{l}.ln.w.bias"] = normal(d_model, scale=0.1)
        w[f"a{l}.ln.w.scale"] = (1.0 + normal(d_model, scale=0.1)).astype(dtype)
        for k in ("q", "k", "v"):
            w[f"a{l}.w.{k}"] = normal(n_heads, head_size, d_model, scale=d_model**-0.5)
        w[f"a{l}.w.o"] = normal(n_heads, d_model, head_size, scale=(n_heads * head_size) ** -0.5)
    return w
