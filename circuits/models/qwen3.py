"""Qwen3: the Llama decoder with an RMSNorm over each head's queries and over each head's keys
before rotary (``'h{l}.attn.q_norm'`` / ``'.k_norm'``: one weight [head_dim] shared by the heads),
a head dimension of its own, biases on every attention projection when ``attention_bias``, and
Qwen2's optional sliding windows from ``max_window_layers`` on.

>>> from circuits.models.qwen3 import qwen3
>>> cfg = dict(model_type='qwen3', hidden_size=8, num_attention_heads=2, num_key_value_heads=1, head_dim=4,
...            num_hidden_layers=1, intermediate_size=16, vocab_size=11)
>>> qwen3(cfg, None, [1, 2, 3]).get_unique('h0.attn.q.cos').children[0].name
'h0.attn.q_norm'
"""

from __future__ import annotations

import numpy as np

from .common import MAX_LAYERS, MAX_POSITIONS, Config, activation, rope_theta
from .decoder import DecoderSpec, qwen_windows, random_decoder_weights, rotary_decoder
from .sequence import Layout


def qwen3_spec(config) -> DecoderSpec:
    """The ``DecoderSpec`` of a Qwen3 config (every field read and checked)."""
    cfg = Config(config, "qwen3")
    cfg.reject_alibi()
    cfg.common()
    d, n_heads = cfg.size("hidden_size"), cfg.size("num_attention_heads")
    n_layers = cfg.size("num_hidden_layers", most=MAX_LAYERS)
    theta, fraction = rope_theta(cfg)
    bias = cfg.require("attention_bias", (True, False), False)
    spec = DecoderSpec(
        family="qwen3", d=d, n_heads=n_heads, n_kv=cfg.size("num_key_value_heads", n_heads),
        head_dim=cfg.size("head_dim", max(d // n_heads, 1)), ffn=cfg.size("intermediate_size"),
        vocab=cfg.size("vocab_size"), n_layers=n_layers, eps=cfg.number("rms_norm_eps", 1e-6),
        act=activation(cfg, "hidden_act", "silu"), theta=theta, rotary_fraction=fraction, q_bias=bias, o_bias=bias,
        qk_norm="rms", windows=qwen_windows(cfg, n_layers), tie=cfg.require("tie_word_embeddings", (True, False), False),
        context=cfg.size("max_position_embeddings", 32768, most=MAX_POSITIONS))
    cfg.check_understood()
    return spec


def qwen3(config, weights, tokens, *, loss: bool = False, split_heads: bool = False, past_len: int = 0,
          dtype: str = "float32", layout: Layout | None = None):
    """Qwen3 logits ``'logits'`` [len(tokens), vocab] (``loss=True``: ``'loss'``); the options as
    for ``llama``."""
    return rotary_decoder(qwen3_spec(config), weights, tokens, loss=loss, split_heads=split_heads,
                          past_len=past_len, layout=layout, dtype=dtype)


def random_qwen3_weights(config, seed: int = 0, dtype=np.float32) -> dict[str, np.ndarray]:
    """Random weights for a Qwen3 config, keyed like ``Qwen3ForCausalLM.state_dict()``."""
    return random_decoder_weights(qwen3_spec(config), seed, dtype)
