"""Falcon, in its three layouts: Falcon-7B's multi-query attention (one key-value head; the
attention and the MLP read one LayerNorm: a parallel block), Falcon-40B/180B's
``new_decoder_architecture`` (grouped-query heads, ``num_kv_heads``, the fused projection laid out
key-value head by key-value head; a LayerNorm each for the attention and the MLP unless
``num_ln_in_parallel_attn=1``), and Falcon-RW's classic layout (multi-head, ``[q, k, v]`` head by
head, sequential blocks, ALiBi with ``alibi=True``).  Rotary embeddings (half-split) or ALiBi;
biases with ``bias=True``; a GELU MLP; a tied unembedding.

The ALiBi bias is what ``transformers`` adds: its slopes and the products ``slope * position``
rounded to bfloat16 (whatever the model's dtype), then divided by ``sqrt(head_dim)``.

Weights keep their state-dict key with ``transformer.`` dropped and ``h.{l}.`` written ``h{l}.``
(``h3.self_attention.query_key_value.weight``, ``h3.ln_attn.weight``); nodes ``h3.ln1`` (the
attention's norm), ``h3.ln2`` (the MLP's own norm, where it has one), ``h3.attn.proj.q``,
``h3.attn.q`` (after rotary), ``h3.attn.head5``, ``h3.attn``, ``h3.mlp``, ``h3``; ``final.ln``,
``logits``.

>>> from circuits.models.falcon import falcon
>>> cfg = dict(model_type='falcon', hidden_size=8, num_attention_heads=4, num_hidden_layers=1, vocab_size=11,
...            new_decoder_architecture=True, num_kv_heads=2)
>>> c = falcon(cfg, None, [1, 2, 3], split_heads=True)
>>> [n.name for n in c.get_unique('h0').children], c.get_unique('h0.attn.proj.k').shape
(['h0.mlp', 'h0.attn', 'embeds'], (2, 3, 2))
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import CircuitError
from ..nodes import Circuit, Einsum, Rearrange
from .blocks import (
    alibi_table,
    apply_rotary,
    attention,
    fused_projections,
    layer_norm,
    mlp,
    neg_inf_bias,
    residual_block,
)
from .common import (
    MAX_LAYERS,
    MAX_POSITIONS,
    Config,
    Weights,
    activation,
    embed,
    layout_for,
    loss_head,
    rope_theta,
    tokens_node,
)
from .gpt2 import tied_unembed
from .sequence import Layout

PREFIXES = ("transformer.",)


class FalconLayout:
    """What a Falcon config says about its blocks (every field read and checked)."""

    def __init__(self, cfg: Config):
        self.d = cfg.size("hidden_size") if cfg.get("n_embed") is None else cfg.size("n_embed")
        cfg.understood("hidden_size")
        self.n_heads = cfg.size("num_attention_heads")
        self.n_layers = cfg.size("num_hidden_layers", most=MAX_LAYERS)
        if self.d % self.n_heads:
            raise CircuitError(f"falcon: config hidden_size={self.d} is not a multiple of "
                               f"num_attention_heads={self.n_heads}")
        self.head_dim = self.d // self.n_heads
        self.new = cfg.require("new_decoder_architecture", (True, False), False)
        self.multi_query = cfg.require("multi_query", (True, False), True)
        self.parallel = cfg.require("parallel_attn", (True, False), True)
        self.bias = cfg.require("bias", (True, False), False)
        self.alibi = cfg.require("alibi", (True, False), False)
        cfg.require("apply_residual_connection_post_layernorm", (False,), False,
                    "the residual stream would be the norm's output, not a sum of the blocks' outputs")
        kv = cfg.size("num_kv_heads", self.n_heads)
        if self.new:
            if not self.parallel:
                raise CircuitError("falcon: config new_decoder_architecture=True with parallel_attn=False is not "
                                   "supported (transformers' layer has no norm for its MLP then)")
            self.n_kv, self.qkv = kv, "grouped"
            self.n_ln = cfg.require("num_ln_in_parallel_attn", (1, 2), 2)
        else:
            self.n_kv, self.qkv = (1, "blocks") if self.multi_query else (self.n_heads, "heads")
            cfg.require("num_ln_in_parallel_attn", (None, 1, 2), None)  # read only by the new architecture
            self.n_ln = 1
        if self.n_heads % self.n_kv:
            raise CircuitError(f"falcon: config num_attention_heads={self.n_heads} is not a multiple of "
                               f"num_kv_heads={self.n_kv}")
        derived = cfg.get("num_key_value_heads")
        if derived is not None and derived != self.n_kv:
            raise CircuitError(f"falcon: config num_key_value_heads={derived!r} disagrees with the {self.n_kv} "
                               "key-value heads that num_kv_heads, multi_query and new_decoder_architecture give")
        self.ffn = cfg.size("ffn_hidden_size", 4 * self.d)
        self.eps = cfg.number("layer_norm_epsilon", 1e-5)
        self.act = activation(cfg, "activation", "gelu")
        self.vocab = cfg.size("vocab_size")
        self.context = cfg.size("max_position_embeddings", 2048, most=MAX_POSITIONS)
        self.theta, fraction = rope_theta(cfg)
        if fraction != 1.0:
            raise CircuitError(f"falcon: config partial_rotary_factor={fraction}: Falcon rotates whole heads")
        self.tie = cfg.require("tie_word_embeddings", (True, False), True)


def falcon(config, weights, tokens, *, loss: bool = False, split_heads: bool = False, past_len: int = 0,
           layout: Layout | None = None, dtype: str = "float32") -> Circuit:
    """Falcon logits ``'logits'`` [len(tokens), vocab] (``loss=True``: ``'loss'``); the options as
    for ``gpt2``."""
    cfg = Config(config, "falcon")
    cfg.common()
    f = FalconLayout(cfg)
    cfg.check_understood()
    d, c, n_kv = f.d, f.head_dim, f.n_kv
    group = f.n_heads // n_kv
    w = Weights(weights, PREFIXES, "falcon", dtype=dtype)
    toks = tokens_node(tokens, f.vocab)
    layout = layout_for(layout, toks.shape[0], past_len, "falcon")
    layout.check_context("falcon", f.context, "max_position_embeddings")
    mask = layout.mask()
    mbias = neg_inf_bias(mask)
    if f.alibi:  # transformers adds alibi / sqrt(head_dim) at the model's precision
        table = alibi_table(f.n_heads, layout.keys, "bfloat16").astype(dtype) / np.dtype(dtype).type(math.sqrt(c))
        alibi, cos, sin = layout.alibi(table, n_kv, group, name="alibi"), None, None
    else:
        alibi = None
        cos, sin = layout.rotary(c, f.theta, dtype)
    rows = (f.n_heads + 2 * n_kv) * c

    def ln(x, key, name):
        return layer_norm(x, w.take(key + ".weight", (d,)), w.take(key + ".bias", (d,)), name, eps=f.eps, prefix=name)

    def b(key, size):
        return w.take(key, (size,)) if f.bias else None

    table = w.take("word_embeddings.weight", (f.vocab, d))
    resid = embed(table, toks, "embeds")
    for l in range(f.n_layers):
        p, h = f"h.{l}.", f"h{l}"
        a = f"{h}.attn"

        def attn(x, p=p, a=a):
            q, k, v = fused_projections(x, w.take(p + "self_attention.query_key_value.weight", (rows, d)),
                                        b(p + "self_attention.query_key_value.bias", rows), layout=f.qkv, n_kv=n_kv,
                                        group=group, head_dim=c, name=f"{a}.proj")
            if not f.alibi:
                q = apply_rotary(q, "ngsc", cos, sin, f"{a}.q")
                k = apply_rotary(k, "nsc", cos, sin, f"{a}.k")
            k = Layout.with_past(layout.past_symbol(a, "k", (n_kv, layout.past, c), dtype), k, a, "k")
            v = Layout.with_past(layout.past_symbol(a, "v", (n_kv, layout.past, c), dtype), v, a, "v")
            wo = Rearrange(w.take(p + "self_attention.dense.weight", (d, d)), "d (n g c) -> d n g c", n=n_kv, g=group,
                           name=f"{a}.w_o")
            return attention(x, q, k, v, wo, b(p + "self_attention.dense.bias", d), mask=mask, mask_bias=mbias,
                             scale=1.0 / math.sqrt(c), name=a, split_heads=split_heads, position_bias=alibi)

        def feed_forward(x, p=p, h=h):
            return mlp(x, w.take(p + "mlp.dense_h_to_4h.weight", (f.ffn, d)), b(p + "mlp.dense_h_to_4h.bias", f.ffn),
                       w.take(p + "mlp.dense_4h_to_h.weight", (d, f.ffn)), b(p + "mlp.dense_4h_to_h.bias", d), f.act,
                       f"{h}.mlp")

        if f.new and f.n_ln == 2:
            norm1, norm2 = "ln_attn", "ln_mlp"
        else:
            norm1, norm2 = "input_layernorm", None if f.parallel else "post_attention_layernorm"
        resid = residual_block(resid, h, attn, feed_forward, lambda x, name, p=p, k=norm1: ln(x, p + k, name),
                               None if norm2 is None else (lambda x, name, p=p, k=norm2: ln(x, p + k, name)),
                               parallel=f.parallel)
    final = ln(resid, "ln_f", "final.ln")
    out = Einsum.from_spec("sd,vd->sv", final, tied_unembed(w, table, f.tie, (f.vocab, d)), name="logits")
    w.finish()
    return loss_head(out, toks) if loss else out


def random_falcon_weights(config, seed: int = 0, dtype=np.float32) -> dict[str, np.ndarray]:
    """Random weights for a Falcon config, keyed like ``FalconForCausalLM.state_dict()`` (without a
    tied ``lm_head.weight``)."""
    cfg = Config(config, "falcon")
    f = FalconLayout(cfg)
    d = f.d
    rng = np.random.default_rng(seed)

    def normal(*shape, scale=0.1):
        return (rng.standard_normal(shape) * scale).astype(dtype)

    out = {"transformer.word_embeddings.weight": normal(f.vocab, d, scale=1.0),
           "transformer.ln_f.weight": 1 + normal(d), "transformer.ln_f.bias": normal(d)}
    if not f.tie:
        out["lm_head.weight"] = normal(f.vocab, d, scale=d ** -0.5)
    norms = ["ln_attn", "ln_mlp"] if f.new and f.n_ln == 2 else ["input_layernorm"] + (
        [] if f.parallel else ["post_attention_layernorm"])
    linears = {"self_attention.query_key_value": ((f.n_heads + 2 * f.n_kv) * f.head_dim, d),
               "self_attention.dense": (d, d), "mlp.dense_h_to_4h": (f.ffn, d), "mlp.dense_4h_to_h": (d, f.ffn)}
    for l in range(f.n_layers):
        p = f"transformer.h.{l}."
        for key in norms:
            out.update({p + key + ".weight": 1 + normal(d), p + key + ".bias": normal(d)})
        for key, (o, i) in linears.items():
            out[p + key + ".weight"] = normal(o, i, scale=i ** -0.5)
            if f.bias:
                out[p + key + ".bias"] = normal(o)
    return out
