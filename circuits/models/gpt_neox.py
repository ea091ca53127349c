"""GPT-NeoX and Pythia: LayerNorm blocks whose attention and MLP read the same residual (the
parallel residual, ``use_parallel_residual``, the default) or follow each other, a fused
``query_key_value`` projection laid out head by head (``[q, k, v]`` of head 0, then head 1...),
rotary embeddings on the first ``partial_rotary_factor`` of each head's dimensions (``rotary_pct``
in older configs), biases everywhere, an untied unembedding.

Weights keep their state-dict key with ``gpt_neox.`` dropped and ``layers.{l}.`` written
``h{l}.`` (``h3.attention.query_key_value.weight``); the unembedding is ``lm_head.weight``
(``embed_out.weight`` in checkpoints saved before transformers 5).  Nodes as the other
builders name them: ``h3.ln1``, ``h3.attn.qkv``, ``h3.attn.q`` / ``.k`` (after rotary),
``h3.attn.head5``, ``h3.attn``, ``h3.ln2``, ``h3.mlp``, ``h3``; ``final.ln``, ``logits``.

>>> from circuits.models import gpt_neox
>>> cfg = dict(model_type='gpt_neox', hidden_size=8, num_attention_heads=2, num_hidden_layers=1,
...            intermediate_size=16, vocab_size=11, rotary_pct=0.5)
>>> c = gpt_neox(cfg, None, [1, 2, 3], split_heads=True)
>>> c.shape, [n.name for n in c.get_unique('h0').children]
((3, 11), ['h0.mlp', 'h0.attn', 'embeds'])
"""

from __future__ import annotations

import numpy as np

from ..errors import CircuitError
from ..nodes import Add, Circuit, Einsum, Index, Rearrange
from .blocks import apply_rotary, attention, layer_norm, mlp, neg_inf_bias
from .common import (
    MAX_LAYERS,
    MAX_POSITIONS,
    Config,
    Weights,
    activation,
    embed,
    layout_for,
    loss_head,
    positive_number,
    rope_theta,
    tokens_node,
)
from .sequence import Layout

PREFIXES = ("gpt_neox.",)
IGNORED = (r"attention\.bias$", r"attention\.masked_bias$", r"rotary_emb\.inv_freq$")


def gpt_neox(config, weights, tokens, *, loss: bool = False, split_heads: bool = False, past_len: int = 0,
             layout: Layout | None = None, dtype: str = "float32") -> Circuit:
    """GPT-NeoX / Pythia logits ``'logits'`` [len(tokens), vocab] (``loss=True``: ``'loss'``);
    ``weights=None`` builds with placeholders of ``dtype``; ``past_len`` / ``layout`` as for
    ``gpt2``.  A config field this builder does not read, a rotary scaling type, or weights the
    config does not account for are errors naming them."""
    cfg = Config(config, "gpt_neox")
    cfg.reject_alibi()
    cfg.common()
    d, n_heads = cfg.size("hidden_size"), cfg.size("num_attention_heads")
    n_layers = cfg.size("num_hidden_layers", most=MAX_LAYERS)
    ffn, vocab = cfg.size("intermediate_size"), cfg.size("vocab_size")
    context = cfg.size("max_position_embeddings", 2048, most=MAX_POSITIONS)
    eps = cfg.number("layer_norm_eps", 1e-5)
    act = activation(cfg, "hidden_act", "gelu")
    parallel = cfg.require("use_parallel_residual", (True, False), True)
    bias_on = cfg.require("attention_bias", (True, False), True)
    tie = cfg.require("tie_word_embeddings", (True, False), False)
    # the rotary base and fraction: rope_parameters (transformers 5) or rotary_emb_base / rotary_pct
    theta, fraction = rope_theta(cfg, "rotary_emb_base")
    params = cfg.get("rope_parameters")
    if not (isinstance(params, dict) and params.get("partial_rotary_factor") is not None):
        fraction = positive_number("gpt_neox", "rotary_pct", cfg.get("rotary_pct", 0.25))
        if fraction > 1:
            raise CircuitError(f"gpt_neox: config rotary_pct={fraction} must be at most 1")
    cfg.understood("rotary_pct", "rotary_emb_base")
    cfg.check_understood()
    if d % n_heads:
        raise CircuitError(f"gpt_neox: config hidden_size={d} is not a multiple of num_attention_heads={n_heads}")
    c = d // n_heads
    rot = int(c * fraction)
    w = Weights(weights, PREFIXES, "gpt_neox", ignored=IGNORED, dtype=dtype)
    toks = tokens_node(tokens, vocab)
    n = toks.shape[0]
    layout = layout_for(layout, n, past_len, "gpt_neox")
    layout.check_context("gpt_neox", context, "max_position_embeddings")
    cos, sin = layout.rotary(c, theta, dtype, rotary_dim=rot) if rot else (None, None)
    mask = layout.mask()
    mbias = neg_inf_bias(mask)
    table = w.take("embed_in.weight", (vocab, d))
    resid = embed(table, toks, "embeds")

    def b(key, size):
        return w.take(key, (size,)) if bias_on else None

    def ln(x, key, name):
        return layer_norm(x, w.take(key + ".weight", (d,)), w.take(key + ".bias", (d,)), name, eps=eps, prefix=name)

    for l in range(n_layers):
        p, h = f"layers.{l}.", f"h{l}"
        a = f"{h}.attn"
        x = ln(resid, p + "input_layernorm", f"{h}.ln1")
        w_qkv = Rearrange(w.take(p + "attention.query_key_value.weight", (3 * d, d)), "(n e c) d -> e n c d",
                          n=n_heads, e=3, name=f"{a}.w_qkv")
        qkv = Einsum.from_spec("sd,encd->ensc", x, w_qkv, name=f"{a}.qkv" if not bias_on else f"{a}.qkv.matmul")
        if bias_on:
            b_qkv = Rearrange(w.take(p + "attention.query_key_value.bias", (3 * d,)), "(n e c) -> e n 1 c",
                              n=n_heads, e=3, name=f"{a}.b_qkv")
            qkv = Add(qkv, b_qkv, name=f"{a}.qkv")
        q = Rearrange(Index(qkv, (0,), name=f"{a}.proj.q"), "n s c -> n 1 s c", name=f"{a}.proj.q_grouped")
        k = Index(qkv, (1,), name=f"{a}.proj.k")
        v = Index(qkv, (2,), name=f"{a}.proj.v")
        if rot:
            q = apply_rotary(q, "ngsc", cos, sin, f"{a}.q", rotary_dim=rot)
            k = apply_rotary(k, "nsc", cos, sin, f"{a}.k", rotary_dim=rot)
        k = Layout.with_past(layout.past_symbol(a, "k", (n_heads, layout.past, c), dtype), k, a, "k")
        v = Layout.with_past(layout.past_symbol(a, "v", (n_heads, layout.past, c), dtype), v, a, "v")
        wo = Rearrange(w.take(p + "attention.dense.weight", (d, d)), "d (n g c) -> d n g c", n=n_heads, g=1,
                       name=f"{a}.w_o")
        attn = attention(x, q, k, v, wo, b(p + "attention.dense.bias", d), mask=mask, mask_bias=mbias,
                         scale=c ** -0.5, name=a, split_heads=split_heads)
        if parallel:
            x2 = ln(resid, p + "post_attention_layernorm", f"{h}.ln2")
            mid = None
        else:
            mid = Add(attn, resid, name=f"{h}.mid")
            x2 = ln(mid, p + "post_attention_layernorm", f"{h}.ln2")
        m = mlp(x2, w.take(p + "mlp.dense_h_to_4h.weight", (ffn, d)), w.take(p + "mlp.dense_h_to_4h.bias", (ffn,)),
                w.take(p + "mlp.dense_4h_to_h.weight", (d, ffn)), w.take(p + "mlp.dense_4h_to_h.bias", (d,)),
                act, f"{h}.mlp")
        resid = Add(m, attn, resid, name=h) if parallel else Add(m, mid, name=h)
    final = ln(resid, "final_layer_norm", "final.ln")
    if tie:
        from .gpt2 import tied_unembed

        unembed = tied_unembed(w, table, True, (vocab, d))
    else:
        key = "embed_out.weight" if not w.placeholders and "embed_out.weight" in w.raw else "lm_head.weight"
        unembed = w.take(key, (vocab, d))
    out = Einsum.from_spec("sd,vd->sv", final, unembed, name="logits")
    w.finish()
    return loss_head(out, toks) if loss else out


def random_gpt_neox_weights(config, seed: int = 0, dtype=np.float32) -> dict[str, np.ndarray]:
    """Random weights for a GPT-NeoX config, keyed like ``GPTNeoXForCausalLM.state_dict()``."""
    cfg = Config(config, "gpt_neox")
    d, n_layers, ffn = cfg.size("hidden_size"), cfg.size("num_hidden_layers", most=MAX_LAYERS), cfg.size("intermediate_size")
    vocab = cfg.size("vocab_size")
    rng = np.random.default_rng(seed)

    def normal(*shape, scale=0.1):
        return (rng.standard_normal(shape) * scale).astype(dtype)

    out = {"gpt_neox.embed_in.weight": normal(vocab, d, scale=1.0), "lm_head.weight": normal(vocab, d, scale=d ** -0.5),
           "gpt_neox.final_layer_norm.weight": 1 + normal(d), "gpt_neox.final_layer_norm.bias": normal(d)}
    for l in range(n_layers):
        p = f"gpt_neox.layers.{l}."
        out.update({
            p + "input_layernorm.weight": 1 + normal(d), p + "input_layernorm.bias": normal(d),
            p + "post_attention_layernorm.weight": 1 + normal(d), p + "post_attention_layernorm.bias": normal(d),
            p + "attention.query_key_value.weight": normal(3 * d, d, scale=d ** -0.5),
            p + "attention.query_key_value.bias": normal(3 * d),
            p + "attention.dense.weight": normal(d, d, scale=d ** -0.5), p + "attention.dense.bias": normal(d),
            p + "mlp.dense_h_to_4h.weight": normal(ffn, d, scale=d ** -0.5), p + "mlp.dense_h_to_4h.bias": normal(ffn),
            p + "mlp.dense_4h_to_h.weight": normal(d, ffn, scale=ffn ** -0.5), p + "mlp.dense_4h_to_h.bias": normal(d),
        })
    return out
