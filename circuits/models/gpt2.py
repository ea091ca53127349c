"""GPT-2: learned positions, pre-LN blocks, fused ``c_attn`` (q, k, v in one [d, 3d] ``Conv1D``
weight stored [in, out]), GELU (tanh approximation) MLP, tied unembedding.

``gpt2(config, weights, tokens)`` takes the ``transformers`` config (or its ``config.json``
dict) and the state dict (numpy arrays, torch tensors or Arrays; keys with or without the
``transformer.`` prefix) and returns the logits ``'logits'`` [len(tokens), vocab].  Names follow
``circuits.models.common``: ``h3.attn.qkv``, ``h3.attn.probs`` (or ``h3.attn.head5.probs`` with
``split_heads=True``), ``h3.mlp.act``, ``h3`` ...

>>> import numpy as np
>>> from circuits.models import gpt2
>>> from circuits.models.gpt2 import random_gpt2_weights
>>> cfg = dict(n_embd=8, n_head=2, n_layer=1, vocab_size=11, n_positions=16, activation_function='gelu_new')
>>> c = gpt2(cfg, random_gpt2_weights(cfg), np.array([1, 2, 3]))
>>> c.name, c.shape
('logits', (3, 11))
"""

from __future__ import annotations

import numpy as np

from ..errors import CircuitError
from ..nodes import Add, Array, Circuit, Einsum, Index, Rearrange
from .blocks import ALL, attention, layer_norm, mlp, neg_inf_bias
from .common import (
    MAX_LAYERS,
    MAX_POSITIONS,
    Config,
    Weights,
    activation,
    embed,
    layout_for,
    loss_head,
    stack_layers,
    tokens_node,
)
from .sequence import Layout

IGNORED = (r"(^|\.)attn\.bias$", r"(^|\.)attn\.masked_bias$")
PREFIXES = ("transformer.",)


def gpt2(config, weights, tokens, *, loss: bool = False, split_heads: bool = False,
         modules: bool = False, past_len: int = 0, layout: Layout | None = None, dtype: str = "float32") -> Circuit:
    """GPT-2 logits ``'logits'`` [len(tokens), vocab] (``loss=True``: the per-token next-token
    loss ``'loss'`` [len(tokens) - 1]).  ``tokens``: an int array or a 1-d int Symbol (see
    ``tokens_symbol``); ``weights=None`` builds with placeholder Arrays of ``dtype``.  Unsupported
    config values (``scale_attn_by_inverse_layer_idx``, cross-attention, an unknown
    ``activation_function``, any field this builder does not read) and weights the config does
    not account for are errors.  ``past_len=P``: one decode step after ``P`` cached tokens, whose
    keys and values are the Symbols ``'h{l}.attn.past_k'`` / ``'past_v'`` [heads, P, head_dim];
    ``layout``: a ``circuits.models.sequence.Layout`` (a generation step) instead.

    ``modules=True`` writes the block once, as rust_circuit's module library does: a
    ``ModuleSpec`` over Symbols ``'h.resid'``, ``'h.ln_1.weight'``... whose nodes are named
    ``h.ln1``, ``h.attn.probs``..., and layer ``l`` is the Module ``'h{l}'`` applying it to the
    residual and that layer's weights (the same value; the text prints the block once).  Tools
    that select heads by layer name (``h3.attn...``) want the plain form:
    ``circuits.substitute_all_modules`` gives the block's nodes, named as in the spec."""
    cfg = Config(config, "gpt2")
    cfg.reject_alibi()
    cfg.common()
    d, n_heads, n_layers = cfg.size("n_embd"), cfg.size("n_head"), cfg.size("n_layer", most=MAX_LAYERS)
    vocab, n_pos = cfg.size("vocab_size"), cfg.size("n_positions", most=MAX_POSITIONS)
    cfg.understood("n_ctx")  # the legacy twin of n_positions (the table's size decides)
    inner = cfg.size("n_inner", 4 * d)
    eps = cfg.number("layer_norm_epsilon", 1e-5)
    act = activation(cfg, "activation_function", "gelu_new")
    cfg.require("scale_attn_by_inverse_layer_idx", (False,), False)
    cfg.require("reorder_and_upcast_attn", (False, True), False)  # float32 scores either way: the same value
    scale_attn = cfg.require("scale_attn_weights", (True, False), True)
    tie = cfg.require("tie_word_embeddings", (True, False), True)
    cfg.check_understood()
    if d % n_heads:
        raise CircuitError(f"gpt2: config n_embd={d} is not a multiple of n_head={n_heads}")
    c = d // n_heads
    w = Weights(weights, PREFIXES, "gpt2", ignored=IGNORED, dtype=dtype)
    toks = tokens_node(tokens, vocab)
    n = toks.shape[0]
    layout = layout_for(layout, n, past_len, "gpt2", modules)
    layout.check_context("gpt2", n_pos, "n_positions")
    wte = w.take("wte.weight", (vocab, d))
    tok = embed(wte, toks, "tok_embeds")
    pos = layout.learned(w.take("wpe.weight", (n_pos, d)), "pos_embeds")
    resid = Add(tok, pos, name="embeds")
    mask = layout.mask()
    bias = neg_inf_bias(mask)
    layer_keys = {"ln_1.weight": (d,), "ln_1.bias": (d,), "attn.c_attn.weight": (d, 3 * d),
                  "attn.c_attn.bias": (3 * d,), "attn.c_proj.weight": (d, d), "attn.c_proj.bias": (d,),
                  "ln_2.weight": (d,), "ln_2.bias": (d,), "mlp.c_fc.weight": (d, inner),
                  "mlp.c_fc.bias": (inner,), "mlp.c_proj.weight": (inner, d), "mlp.c_proj.bias": (d,)}

    def inputs(l):
        out = {key: w.take(f"h.{l}.{key}", shape) for key, shape in layer_keys.items()}
        for kv in ("k", "v"):
            past = layout.past_symbol(f"h{l}.attn", kv, (n_heads, layout.past, c), dtype)
            if past is not None:
                out[f"attn.past_{kv}"] = past
        return out

    def layer(resid, ws, h):
        """One block over the residual ``resid``; ``ws``: the layer's weights by key; names ``h.*``."""
        x = layer_norm(resid, ws["ln_1.weight"], ws["ln_1.bias"], f"{h}.ln1", eps=eps, prefix=f"{h}.ln1")
        w_qkv = Rearrange(ws["attn.c_attn.weight"], "d (e n g c) -> d e n g c", e=3,
                          n=n_heads, g=1, name=f"{h}.attn.c_attn.w_heads")
        b_qkv = Rearrange(ws["attn.c_attn.bias"], "(e n g c) -> e n g 1 c", e=3, n=n_heads,
                          g=1, name=f"{h}.attn.c_attn.b_heads")
        # positions first, then the head layout: with the head axes first XLA transposed the whole
        # [d, 3d] weight at every call (a decode step of GPT-2 small took 4x its memory floor)
        rows = Einsum.from_spec("sd,dengc->sengc", x, w_qkv, name=f"{h}.attn.qkv.rows")
        qkv = Add(Rearrange(rows, "s e n g c -> e n g s c", name=f"{h}.attn.qkv.matmul"), b_qkv, name=f"{h}.attn.qkv")
        q = Index(qkv, (0,), name=f"{h}.attn.q")
        k = Layout.with_past(ws.get("attn.past_k"), Index(qkv, (1, ALL, 0), name=f"{h}.attn.k"), f"{h}.attn", "k")
        v = Layout.with_past(ws.get("attn.past_v"), Index(qkv, (2, ALL, 0), name=f"{h}.attn.v"), f"{h}.attn", "v")
        wo = Rearrange(ws["attn.c_proj.weight"], "(n g c) d -> n g c d", n=n_heads, g=1,
                       name=f"{h}.attn.c_proj.w_heads")
        attn = attention(x, q, k, v, wo, ws["attn.c_proj.bias"], mask=mask, mask_bias=bias,
                         scale=c ** -0.5 if scale_attn else 1.0, name=f"{h}.attn", split_heads=split_heads,
                         wo_spec="ngsc,ngcd->sd")
        mid = Add(attn, resid, name=f"{h}.mid")
        x2 = layer_norm(mid, ws["ln_2.weight"], ws["ln_2.bias"], f"{h}.ln2", eps=eps, prefix=f"{h}.ln2")
        m = mlp(x2, ws["mlp.c_fc.weight"], ws["mlp.c_fc.bias"], ws["mlp.c_proj.weight"], ws["mlp.c_proj.bias"],
                act, f"{h}.mlp", w_in_out=True)
        return Add(m, mid, name=h)

    resid = stack_layers(resid, (inputs(l) for l in range(n_layers)), layer, modules=modules)
    final = layer_norm(resid, w.take("ln_f.weight", (d,)), w.take("ln_f.bias", (d,)), "final.ln", eps=eps,
                       prefix="final.ln")
    unembed = tied_unembed(w, wte, tie, (vocab, d))
    out = Einsum.from_spec("sd,vd->sv", final, unembed, name="logits")
    w.finish()
    return loss_head(out, toks) if loss else out


def tied_unembed(w: Weights, embed_table: Circuit, tie: bool, shape) -> Circuit:
    """The unembedding: the embedding table when tied (a given ``lm_head.weight`` must then equal
    it), else ``lm_head.weight``."""
    if not tie:
        return w.take("lm_head.weight", shape)
    if not w.placeholders and "lm_head.weight" in w.raw:
        given = w.take("lm_head.weight", shape)
        same = given is embed_table or (
            isinstance(given, Array) and isinstance(embed_table, Array) and given.value is not None
            and embed_table.value is not None and np.array_equal(given.value, embed_table.value))
        if not same:
            raise CircuitError(
                f"{w.family}: config tie_word_embeddings=True but 'lm_head.weight' differs from the embedding; "
                "set tie_word_embeddings=False to use it")
    return embed_table


def random_gpt2_weights(config, seed: int = 0, dtype=np.float32) -> dict[str, np.ndarray]:
    """Random weights for a GPT-2 config, keyed like ``GPT2LMHeadModel.state_dict()`` (without
    the tied ``lm_head.weight``), with the activations kept O(1)."""
    cfg = Config(config, "gpt2")
    d, n_layers, vocab = cfg.size("n_embd"), cfg.size("n_layer", most=MAX_LAYERS), cfg.size("vocab_size")
    n_pos = cfg.size("n_positions", most=MAX_POSITIONS)
    inner = cfg.size("n_inner", 4 * d)
    rng = np.random.default_rng(seed)

    def normal(*shape, scale=0.02):
        return (rng.standard_normal(shape) * scale).astype(dtype)

    out = {"transformer.wte.weight": normal(vocab, d), "transformer.wpe.weight": normal(n_pos, d, scale=0.01),
           "transformer.ln_f.weight": 1 + normal(d, scale=0.1), "transformer.ln_f.bias": normal(d)}
    for l in range(n_layers):
        p = f"transformer.h.{l}."
        out.update({
            p + "ln_1.weight": 1 + normal(d, scale=0.1), p + "ln_1.bias": normal(d),
            p + "attn.c_attn.weight": normal(d, 3 * d), p + "attn.c_attn.bias": normal(3 * d),
            p + "attn.c_proj.weight": normal(d, d), p + "attn.c_proj.bias": normal(d),
            p + "ln_2.weight": 1 + normal(d, scale=0.1), p + "ln_2.bias": normal(d),
            p + "mlp.c_fc.weight": normal(d, inner), p + "mlp.c_fc.bias": normal(inner),
            p + "mlp.c_proj.weight": normal(inner, d), p + "mlp.c_proj.bias": normal(d),
        })
    return out
