"""Phi-3: the Llama decoder with the query, key and value projections fused into one
``qkv_proj`` (rows ``[q | k | v]``) and the MLP's gate and up projections into one
``gate_up_proj`` (rows ``[gate | up]``), rotary on the first ``partial_rotary_factor`` of each
head (Phi-4-mini), and an optional sliding window on every layer.  The long-context variants'
``rope_type='longrope'`` (Phi-3-*-128k, Phi-3.5) is refused naming the field.

>>> from circuits.models.phi3 import phi3
>>> cfg = dict(model_type='phi3', hidden_size=8, num_attention_heads=2, num_key_value_heads=1,
...            num_hidden_layers=1, intermediate_size=16, vocab_size=11)
>>> phi3(cfg, None, [1, 2, 3], split_heads=True).get_unique('h0.attn.proj.rows').shape
(3, 16)
"""

from __future__ import annotations

import numpy as np

from .common import MAX_LAYERS, MAX_POSITIONS, Config, activation, rope_theta
from .decoder import DecoderSpec, random_decoder_weights, rotary_decoder, sliding_window
from .sequence import Layout


def phi3_spec(config) -> DecoderSpec:
    """The ``DecoderSpec`` of a Phi-3 config (every field read and checked)."""
    cfg = Config(config, "phi3")
    cfg.reject_alibi()
    cfg.common()
    d, n_heads = cfg.size("hidden_size"), cfg.size("num_attention_heads")
    n_layers = cfg.size("num_hidden_layers", most=MAX_LAYERS)
    theta, fraction = rope_theta(cfg)
    cfg.understood("original_max_position_embeddings")  # read by longrope only, which is refused above
    spec = DecoderSpec(
        family="phi3", d=d, n_heads=n_heads, n_kv=cfg.size("num_key_value_heads", n_heads),
        head_dim=cfg.size("head_dim", max(d // n_heads, 1)), ffn=cfg.size("intermediate_size"), vocab=cfg.size("vocab_size"),
        n_layers=n_layers, eps=cfg.number("rms_norm_eps", 1e-5), act=activation(cfg, "hidden_act", "silu"),
        theta=theta, rotary_fraction=fraction, fused_qkv=True, fused_gate_up=True,
        windows=[sliding_window(cfg)] * n_layers, tie=cfg.require("tie_word_embeddings", (True, False), False),
        context=cfg.size("max_position_embeddings", 4096, most=MAX_POSITIONS))
    cfg.check_understood()
    return spec


def phi3(config, weights, tokens, *, loss: bool = False, split_heads: bool = False, past_len: int = 0,
         dtype: str = "float32", layout: Layout | None = None):
    """Phi-3 logits ``'logits'`` [len(tokens), vocab] (``loss=True``: ``'loss'``); the options as
    for ``llama``."""
    return rotary_decoder(phi3_spec(config), weights, tokens, loss=loss, split_heads=split_heads,
                          past_len=past_len, layout=layout, dtype=dtype)


def random_phi3_weights(config, seed: int = 0, dtype=np.float32) -> dict[str, np.ndarray]:
    """Random weights for a Phi-3 config, keyed like ``Phi3ForCausalLM.state_dict()``."""
    return random_decoder_weights(phi3_spec(config), seed, dtype)
