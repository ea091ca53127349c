"""Qwen2: the Llama decoder with biases on the query, key and value projections (none on the
output projection), and optional sliding windows on the layers from ``max_window_layers`` on.

>>> from circuits.models import qwen2
>>> cfg = dict(model_type='qwen2', hidden_size=8, num_attention_heads=2, num_key_value_heads=1,
...            num_hidden_layers=1, intermediate_size=16, vocab_size=11, hidden_act='silu')
>>> qwen2(cfg, None, [1, 2, 3], split_heads=True).get_unique('h0.attn.proj.q').children[1].name
'h0.attn.proj.b_q'
"""

from __future__ import annotations

import numpy as np

from .common import MAX_LAYERS, MAX_POSITIONS, Config, activation, rope_theta
from .decoder import DecoderSpec, qwen_windows, random_decoder_weights, rotary_decoder
from .sequence import Layout


def qwen2_spec(config) -> DecoderSpec:
    """The ``DecoderSpec`` of a Qwen2 config (every field read and checked)."""
    cfg = Config(config, "qwen2")
    cfg.reject_alibi()
    cfg.common()
    d, n_heads = cfg.size("hidden_size"), cfg.size("num_attention_heads")
    n_layers = cfg.size("num_hidden_layers", most=MAX_LAYERS)
    windows = qwen_windows(cfg, n_layers)
    theta, fraction = rope_theta(cfg)
    spec = DecoderSpec(
        family="qwen2", d=d, n_heads=n_heads, n_kv=cfg.size("num_key_value_heads", n_heads),
        head_dim=cfg.size("head_dim", max(d // n_heads, 1)), ffn=cfg.size("intermediate_size"),
        vocab=cfg.size("vocab_size"), n_layers=n_layers, eps=cfg.number("rms_norm_eps", 1e-6),
        act=activation(cfg, "hidden_act", "silu"), theta=theta, rotary_fraction=fraction, q_bias=True,
        windows=windows, tie=cfg.require("tie_word_embeddings", (True, False), False),
        context=cfg.size("max_position_embeddings", most=MAX_POSITIONS) if "max_position_embeddings" in cfg.d
        else None)
    cfg.check_understood()
    return spec


def qwen2(config, weights, tokens, *, loss: bool = False, split_heads: bool = False, past_len: int = 0,
          dtype: str = "float32", layout: Layout | None = None):
    """Qwen2 logits ``'logits'`` [len(tokens), vocab] (``loss=True``: ``'loss'``); the options as
    for ``llama``.  The q/k/v biases are ``'h{l}.attn.proj.b_q'`` / ``b_k`` / ``b_v``."""
    return rotary_decoder(qwen2_spec(config), weights, tokens, loss=loss, split_heads=split_heads,
                          past_len=past_len, layout=layout, dtype=dtype)


def random_qwen2_weights(config, seed: int = 0, dtype=np.float32) -> dict[str, np.ndarray]:
    """Random weights for a Qwen2 config, keyed like ``Qwen2ForCausalLM.state_dict()``."""
    return random_decoder_weights(qwen2_spec(config), seed, dtype)
