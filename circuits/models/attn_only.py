"""The seed's model: an attention-only transformer computing its per-token loss.

``attn_only(weights, tokens)`` builds exactly the circuit printed in
``shared/seeds/001_8fc6c5056666d56f.txt``: same node types, names, einsum specs, index specs,
function names, scalars and child order.  Sizes (layers, heads, widths, vocabulary, positions)
come from the weights and the tokens, so small configurations build the same structure.

The computation, per layer ``l`` with residual stream ``r`` (tokens ``t``, ``P = len(t) - 2``
positions in the seed's layout; ``len(t) - 1`` in the next-token one, see ``attn_only``)::

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


# What each layout of the tokens reads: the positions' input tokens and the loss's next tokens,
# and how many tokens the positions leave over (see ``attn_only``).
LAYOUTS = {
    "seed": (slice(None, -2), slice(1, -1), 2),  # positions + 2 tokens; the last one unused
    "next_token": (slice(None, -1), slice(1, None), 1),  # TransformerLens: n tokens, n - 1 losses
    "every_token": (slice(None), None, 0),  # next_token's logits: every token is a position
}


def _layout(layout: str):
    if layout not in ("seed", "next_token"):
        raise CircuitError(f"attn_only: layout={layout!r}; use 'seed' (positions + 2 tokens) or "
                           "'next_token' (n tokens -> n - 1 losses, as TransformerLens)")
    return LAYOUTS[layout]


def context_of(weights: Mapping) -> int:
    """The most positions a model takes: the rows of ``'t.w.pos_embeds'``, and the size of
    ``'t.a.c.causal_mask'`` where the weights hold one.

    >>> w = random_weights(vocab=11, d_model=8, n_heads=2, head_size=4, n_layers=1, max_positions=16)
    >>> context_of(w), context_of(dict(w, **{'t.a.c.causal_mask': np.ones((12, 12))}))
    (16, 12)
    """
    sizes = [weights["t.w.pos_embeds"].shape[0]]
    if "t.a.c.causal_mask" in weights:
        sizes.append(min(weights["t.a.c.causal_mask"].shape))
    return int(min(sizes))


def _mask(w: dict, n_pos: int) -> Circuit:
    """The causal mask of ``n_pos`` positions: the weights' own where it has that size (the seed's
    placeholder), its top-left corner where it is bigger (a model's context), else built."""
    mask = w.get("t.a.c.causal_mask")
    if mask is None:
        return Array(causal_mask(n_pos), name="t.a.c.causal_mask")
    if mask.shape == (n_pos, n_pos):
        return mask
    if len(mask.shape) != 2 or min(mask.shape) < n_pos:
        raise CircuitError(f"attn_only: {n_pos} positions but 't.a.c.causal_mask' has shape "
                           f"{list(mask.shape)}: give at most {min(mask.shape[-2:] or (0,))} positions")
    return Index(mask, (slice(None, n_pos), slice(None, n_pos)), name="t.a.c.causal_mask_idxed")


def attn_only_residual(weights: Mapping, tokens, *, unique_names: bool = False,
                       layout: str = "seed") -> tuple[Circuit, Circuit, dict]:
    """The final residual stream ``'b{L-1}'`` and the tokens node (``layout``: see ``attn_only``;
    ``'every_token'`` makes every token a position, as ``'next_token'`` logits do)."""
    n_layers = n_layers_of(weights)
    _check_weights(weights, n_layers)
    w = _weight_arrays(weights)
    toks = _tokens_node(tokens)
    if layout not in LAYOUTS:
        _layout(layout)
    inputs, _, extra = LAYOUTS[layout]
    n_pos = toks.shape[0] - extra
    hint = (" (layout='seed', the seed's: positions + 2 tokens, the last one read by nothing; "
            "layout='next_token' is TransformerLens's: n tokens give n - 1 losses)") if layout == "seed" else ""
    if n_pos < 1:
        what = {"seed": "positions + 2", "next_token": "n tokens give n - 1 losses"}.get(layout, "positions")
        raise CircuitError(f"tokens must have length >= {extra + 1} ({what}), got {toks.shape[0]}{hint}")
    context = context_of(w)
    if n_pos > context:
        raise CircuitError(
            f"attn_only: {toks.shape[0]} tokens are {n_pos} positions in the {layout!r} layout, but the "
            f"model's context is {context} positions ('t.w.pos_embeds' rows, 't.a.c.causal_mask'): "
            f"give at most {context + extra} tokens{hint}"
        )
    mask = _mask(w, n_pos)
    input_toks = Index(toks, (inputs,), name="input_toks_int")
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
              targets=None, layout: str = "seed") -> Circuit:
    """The seed's loss circuit ``'t.loss'`` ([positions]): the negative log-probability of each next
    token.  ``weights`` maps the seed's Array names (``'t.w.tok_embeds'``, ``'a0.w.q'``, ...,
    ``'t.w.unembed'``; ``'t.a.c.causal_mask'`` optional) to arrays (or Array nodes); ``tokens`` is the
    int array the seed calls ``'toks_int_var'`` or a Symbol for it (see ``tokens_symbol``).
    ``logits=True`` returns the logits ``'t.call'`` ([positions, vocab]).

    Any number of positions up to the model's context (``context_of``: the rows of
    ``'t.w.pos_embeds'``, the size of a given ``'t.a.c.causal_mask'``, whose top-left corner is
    taken for fewer positions) is accepted.  ``layout`` says how the tokens are read:

    - ``'seed'`` (default, the seed's circuit byte for byte): ``positions + 2`` tokens; position
      ``i`` reads token ``i`` and predicts token ``i + 1`` (inputs ``t[:-2]``, next tokens
      ``t[1:-1]``); the last token is read by nothing.  34 tokens for a 32-position context.
    - ``'next_token'`` (TransformerLens' convention): ``n`` tokens give ``n - 1`` losses (inputs
      ``t[:-1]``, next tokens ``t[1:]``), as ``model(t, return_type='loss',
      loss_per_token=True)``; with ``logits=True`` every token is a position and the logits are
      ``[n, vocab]``, as ``model(t)``.  Up to ``context + 1`` tokens for the losses.

    ``unique_names=True`` gives every node a name of its own, for interventions: the nodes of
    head ``h`` of layer ``l`` are ``'b{l}.a.head{h}.<seed name>'`` (``'b1.a.head3.a.k'``,
    ``'b1.a.head3.a.attn_probs'``), a LayerNorm's inner nodes ``'a{l}.norm.<seed name>'`` and
    ``'final.norm.<seed name>'`` (``'a0.norm.ln.y'``), a layer's query/key input
    ``'a{l}.qk_input'`` (a LayerNorm's constants too: ``'a0.norm.ln.c.eps'``); constants shared
    by all heads (``'a.score_neg_inf_bias'``) keep their names.  The default keeps the seed's names byte for byte.

    ``targets`` (same layout as ``tokens``: an int array or Symbol of its length, read where the
    layout reads next tokens; an Array is named ``'targets_int_var'``) gives the loss its own
    targets, so the input tokens can be corrupted while the loss is measured against clean next
    tokens.

    >>> w = random_weights(vocab=11, d_model=8, n_heads=2, head_size=4, n_layers=1, max_positions=16)
    >>> c = attn_only(w, np.arange(6), unique_names=True, targets=np.arange(6)[::-1])
    >>> c.get_unique('b0.a.head1.a.k').line(), c.get_unique('true_toks_int').children[0].name
    ("'b0.a.head1.a.k' Einsum kd,cd->kc", 'targets_int_var')
    >>> attn_only(w, np.arange(6)).shape, attn_only(w, np.arange(6), layout='next_token').shape
    ((4,), (5,))
    >>> attn_only(w, np.arange(6), layout='next_token', logits=True).shape
    (6, 11)
    """
    _, next_tokens, _ = _layout(layout)
    every = logits and layout == "next_token"  # every token is a position, its logits predicting the next
    resid, toks, w = attn_only_residual(weights, tokens, unique_names=unique_names,
                                        layout="every_token" if every else layout)
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
                f"({list(toks.shape)}, read at [{next_tokens.start}:{next_tokens.stop or ''}])"
            )
        toks = target_node
    true_toks = Index(toks, (next_tokens,), name="true_toks_int")
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
