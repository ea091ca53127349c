"""Gemma (the first generation): the rotary decoder with Gemma's RMS norms (scaled by ``1 +
weight``), embeddings scaled by ``sqrt(hidden_size)``, a GELU-gated MLP (``hidden_act='gelu'`` in
the released configs means GELU's tanh approximation, as ``transformers`` reads it), a head
dimension of its own (``head_dim``, 256 by default) and a tied unembedding.

>>> from circuits.models.gemma import gemma
>>> cfg = dict(model_type='gemma', hidden_size=8, num_attention_heads=2, num_key_value_heads=1, head_dim=4,
...            num_hidden_layers=1, intermediate_size=16, vocab_size=11)
>>> c = gemma(cfg, None, [1, 2, 3])
>>> c.name, c.get_unique('h0.ln1.scale').children[0].name
('logits', 'h0.ln1.one')
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import CircuitError
from .common import MAX_LAYERS, MAX_POSITIONS, Config, activation, rope_theta
from .decoder import DecoderSpec, random_decoder_weights, rotary_decoder
from .sequence import Layout


def gemma_spec(config) -> DecoderSpec:
    """The ``DecoderSpec`` of a Gemma config (every field read and checked)."""
    cfg = Config(config, "gemma")
    cfg.reject_alibi()
    cfg.common()
    d, n_heads = cfg.size("hidden_size"), cfg.size("num_attention_heads")
    n_layers = cfg.size("num_hidden_layers", most=MAX_LAYERS)
    if cfg.get("use_bidirectional_attention"):
        raise CircuitError("gemma: config use_bidirectional_attention=True is not supported (a causal LM)")
    if cfg.get("hidden_act", "gelu_pytorch_tanh") == "gelu":  # transformers reads Gemma's 'gelu' as the tanh form
        act = "gelu_new"
    else:
        act = activation(cfg, "hidden_act", "gelu_pytorch_tanh")
    cfg.understood("hidden_activation")  # an older twin of hidden_act that transformers 5 no longer reads
    theta, fraction = rope_theta(cfg)
    bias = cfg.require("attention_bias", (True, False), False)
    spec = DecoderSpec(
        family="gemma", d=d, n_heads=n_heads, n_kv=cfg.size("num_key_value_heads", n_heads),
        head_dim=cfg.size("head_dim", 256), ffn=cfg.size("intermediate_size"), vocab=cfg.size("vocab_size"),
        n_layers=n_layers, eps=cfg.number("rms_norm_eps", 1e-6), act=act, theta=theta, rotary_fraction=fraction,
        q_bias=bias, o_bias=bias, norm_offset=True,
        # a float32 buffer in transformers: even its float64 model multiplies by sqrt(d) rounded to float32
        embed_scale=float(np.float32(math.sqrt(d))),
        tie=cfg.require("tie_word_embeddings", (True, False), True),
        context=cfg.size("max_position_embeddings", 8192, most=MAX_POSITIONS))
    cfg.check_understood()
    return spec


def gemma(config, weights, tokens, *, loss: bool = False, split_heads: bool = False, past_len: int = 0,
          dtype: str = "float32", layout: Layout | None = None):
    """Gemma logits ``'logits'`` [len(tokens), vocab] (``loss=True``: ``'loss'``); the options as
    for ``llama``."""
    return rotary_decoder(gemma_spec(config), weights, tokens, loss=loss, split_heads=split_heads,
                          past_len=past_len, layout=layout, dtype=dtype)


def random_gemma_weights(config, seed: int = 0, dtype=np.float32) -> dict[str, np.ndarray]:
    """Random weights for a Gemma config, keyed like ``GemmaForCausalLM.state_dict()``."""
    return random_decoder_weights(gemma_spec(config), seed, dtype)
