"""BLOOM: ALiBi position biases instead of position embeddings (each head's scores get
``slope[h] * key_position``, ``blocks.alibi_table``), a LayerNorm on the embeddings, pre-LN blocks,
a fused ``query_key_value`` projection laid out head by head (``[q, k, v]`` of head 0, then head
1...), BLOOM's GELU (``blocks.bloom_gelu``), biases everywhere, a tied unembedding.

The ALiBi bias is what ``transformers`` adds: absolute key positions times the slopes, computed
at the model's precision (``transformers`` computes it in float32 even for a float64 model;
``matrix.float64_oracle`` computes it in float64).  The context is not bounded.

Weights keep their state-dict key with ``transformer.`` dropped and ``h.{l}.`` written ``h{l}.``
(``h3.self_attention.query_key_value.weight``); nodes ``tok_embeds``, ``embeds`` (after the
embeddings' LayerNorm), ``alibi`` (the bias [heads, 1, keys]), ``h3.ln1``, ``h3.attn.proj.q``, ``h3.attn.head5``,
``h3.attn``, ``h3.mid``, ``h3.ln2``, ``h3.mlp``, ``h3``; ``final.ln``, ``logits``.

>>> from circuits.models.bloom import bloom
>>> cfg = dict(model_type='bloom', hidden_size=8, n_head=2, n_layer=1, vocab_size=11)
>>> c = bloom(cfg, None, [1, 2, 3])
>>> c.get_unique('h0.attn.position_bias').children[0].name
'alibi'
"""

from __future__ import annotations

import numpy as np

from ..errors import CircuitError
from ..nodes import Circuit, Einsum, Rearrange
from .blocks import alibi_table, attention, bloom_gelu, fused_projections, layer_norm, mlp, neg_inf_bias, residual_block
from .common import MAX_LAYERS, Config, Weights, embed, layout_for, loss_head, tokens_node
from .gpt2 import tied_unembed
from .sequence import Layout

PREFIXES = ("transformer.",)
# Megatron-DeepSpeed training switches some released configs carry; transformers' model ignores them
TRAINING_KEYS = ("attention_softmax_in_fp32", "bias_dropout_fusion", "masked_softmax_fusion", "offset_alibi",
                 "skip_bias_add", "skip_bias_add_qkv", "seq_length", "unk_token_id")


def bloom(config, weights, tokens, *, loss: bool = False, split_heads: bool = False, past_len: int = 0,
          layout: Layout | None = None, dtype: str = "float32") -> Circuit:
    """BLOOM logits ``'logits'`` [len(tokens), vocab] (``loss=True``: ``'loss'``); the options as for
    ``gpt2``.  ``apply_residual_connection_post_layernorm=True`` (the residual stream taken after
    the norm) is refused naming the field."""
    cfg = Config(config, "bloom")
    cfg.common()
    d = cfg.size("hidden_size") if cfg.get("n_embed") is None else cfg.size("n_embed")
    cfg.understood("hidden_size")
    n_heads, n_layers = cfg.size("n_head"), cfg.size("n_layer", most=MAX_LAYERS)
    vocab = cfg.size("vocab_size")
    eps = cfg.number("layer_norm_epsilon", 1e-5)
    cfg.require("apply_residual_connection_post_layernorm", (False,), False,
                "the residual stream would be the norm's output, not a sum of the blocks' outputs")
    # transformers' slow_but_exact path (pretraining_tp > 1) sums the output projections by slices and
    # leaves out their biases: another map, refused; pretraining_tp alone changes nothing
    if cfg.require("slow_but_exact", (True, False), False) and cfg.size("pretraining_tp", 1) > 1:
        raise CircuitError(f"bloom: config slow_but_exact=True with pretraining_tp={cfg.d['pretraining_tp']} is not "
                           "supported (transformers then leaves out the output projections' biases); "
                           "with slow_but_exact=False it builds")
    cfg.size("pretraining_tp", 1)
    if cfg.get("n_inner") is not None and cfg.d["n_inner"] != 4 * d:
        raise CircuitError(f"bloom: config n_inner={cfg.d['n_inner']!r}: BLOOM's MLP is 4 * hidden_size = {4 * d} wide")
    tie = cfg.require("tie_word_embeddings", (True, False), True)
    cfg.understood(*TRAINING_KEYS)
    cfg.check_understood()
    if d % n_heads:
        raise CircuitError(f"bloom: config hidden_size={d} is not a multiple of n_head={n_heads}")
    c = d // n_heads
    w = Weights(weights, PREFIXES, "bloom", dtype=dtype)
    toks = tokens_node(tokens, vocab)
    layout = layout_for(layout, toks.shape[0], past_len, "bloom")
    mask = layout.mask()
    mbias = neg_inf_bias(mask)
    alibi = layout.alibi(alibi_table(n_heads, layout.keys, dtype), n_heads, 1, name="alibi")

    def ln(x, key, name):
        return layer_norm(x, w.take(key + ".weight", (d,)), w.take(key + ".bias", (d,)), name, eps=eps, prefix=name)

    table = w.take("word_embeddings.weight", (vocab, d))
    resid = ln(embed(table, toks, "tok_embeds"), "word_embeddings_layernorm", "embeds")
    for l in range(n_layers):
        p, h = f"h.{l}.", f"h{l}"
        a = f"{h}.attn"

        def attn(x, p=p, a=a):
            q, k, v = fused_projections(x, w.take(p + "self_attention.query_key_value.weight", (3 * d, d)),
                                        w.take(p + "self_attention.query_key_value.bias", (3 * d,)), layout="heads",
                                        n_kv=n_heads, group=1, head_dim=c, name=f"{a}.proj")
            k = Layout.with_past(layout.past_symbol(a, "k", (n_heads, layout.past, c), dtype), k, a, "k")
            v = Layout.with_past(layout.past_symbol(a, "v", (n_heads, layout.past, c), dtype), v, a, "v")
            wo = Rearrange(w.take(p + "self_attention.dense.weight", (d, d)), "d (n g c) -> d n g c", n=n_heads, g=1,
                           name=f"{a}.w_o")
            return attention(x, q, k, v, wo, w.take(p + "self_attention.dense.bias", (d,)), mask=mask, mask_bias=mbias,
                             scale=c ** -0.5, name=a, split_heads=split_heads,
                             position_bias=alibi)

        def feed_forward(x, p=p, h=h):
            return mlp(x, w.take(p + "mlp.dense_h_to_4h.weight", (4 * d, d)), w.take(p + "mlp.dense_h_to_4h.bias", (4 * d,)),
                       w.take(p + "mlp.dense_4h_to_h.weight", (d, 4 * d)), w.take(p + "mlp.dense_4h_to_h.bias", (d,)),
                       bloom_gelu, f"{h}.mlp")

        resid = residual_block(resid, h, attn, feed_forward, lambda x, name, p=p: ln(x, p + "input_layernorm", name),
                               lambda x, name, p=p: ln(x, p + "post_attention_layernorm", name))
    final = ln(resid, "ln_f", "final.ln")
    out = Einsum.from_spec("sd,vd->sv", final, tied_unembed(w, table, tie, (vocab, d)), name="logits")
    w.finish()
    return loss_head(out, toks) if loss else out


def random_bloom_weights(config, seed: int = 0, dtype=np.float32) -> dict[str, np.ndarray]:
    """Random weights for a BLOOM config, keyed like ``BloomForCausalLM.state_dict()`` (without the
    tied ``lm_head.weight``)."""
    cfg = Config(config, "bloom")
    d, n_layers, vocab = cfg.size("hidden_size"), cfg.size("n_layer", most=MAX_LAYERS), cfg.size("vocab_size")
    rng = np.random.default_rng(seed)

    def normal(*shape, scale=0.1):
        return (rng.standard_normal(shape) * scale).astype(dtype)

    out = {"transformer.word_embeddings.weight": normal(vocab, d, scale=1.0)}
    for key in ("word_embeddings_layernorm", "ln_f"):
        out.update({f"transformer.{key}.weight": 1 + normal(d), f"transformer.{key}.bias": normal(d)})
    for l in range(n_layers):
        p = f"transformer.h.{l}."
        for key in ("input_layernorm", "post_attention_layernorm"):
            out.update({p + key + ".weight": 1 + normal(d), p + key + ".bias": normal(d)})
        for key, (o, i) in {"self_attention.query_key_value": (3 * d, d), "self_attention.dense": (d, d),
                            "mlp.dense_h_to_4h": (4 * d, d), "mlp.dense_4h_to_h": (d, 4 * d)}.items():
            out.update({p + key + ".weight": normal(o, i, scale=i ** -0.5), p + key + ".bias": normal(o)})
    return out
