"""StableLM (2): the rotary decoder with LayerNorms (weights and biases) instead of RMS norms,
rotary on the first ``partial_rotary_factor`` of each head (a quarter by default), optional
q/k/v biases (``use_qkv_bias``), an optional LayerNorm of each head's queries and keys with a
weight per head (``qk_layernorm``: ``'h{l}.attn.q_norm'`` / ``'.k_norm'``), and an optional
parallel residual (``use_parallel_residual``: attention and MLP read the same norm).

>>> from circuits.models.stablelm import stablelm
>>> cfg = dict(model_type='stablelm', hidden_size=16, num_attention_heads=2, num_key_value_heads=2,
...            num_hidden_layers=1, intermediate_size=16, vocab_size=11, use_parallel_residual=True)
>>> [n.name for n in stablelm(cfg, None, [1, 2, 3]).get_unique('h0').children]
['h0.mlp', 'h0.attn', 'embeds']
"""

from __future__ import annotations

import numpy as np

from ..errors import CircuitError
from .common import MAX_LAYERS, MAX_POSITIONS, Config, activation, rope_theta
from .decoder import DecoderSpec, random_decoder_weights, rotary_decoder
from .sequence import Layout


def stablelm_spec(config) -> DecoderSpec:
    """The ``DecoderSpec`` of a StableLM config (every field read and checked)."""
    cfg = Config(config, "stablelm")
    cfg.reject_alibi()
    cfg.common()
    d, n_heads = cfg.size("hidden_size"), cfg.size("num_attention_heads")
    n_layers = cfg.size("num_hidden_layers", most=MAX_LAYERS)
    if d % n_heads:
        raise CircuitError(f"stablelm: config hidden_size={d} is not a multiple of num_attention_heads={n_heads}")
    params = cfg.get("rope_parameters")
    given = cfg.get("partial_rotary_factor") is not None or (
        isinstance(params, dict) and params.get("partial_rotary_factor") is not None)
    theta, fraction = rope_theta(cfg)
    if not given:
        fraction = 0.25  # StableLM's default is a quarter of each head, not all of it
    spec = DecoderSpec(
        family="stablelm", d=d, n_heads=n_heads, n_kv=cfg.size("num_key_value_heads", n_heads), head_dim=d // n_heads,
        ffn=cfg.size("intermediate_size"), vocab=cfg.size("vocab_size"), n_layers=n_layers,
        eps=cfg.number("layer_norm_eps", 1e-5), act=activation(cfg, "hidden_act", "silu"), theta=theta,
        rotary_fraction=fraction, norm="layer", q_bias=cfg.require("use_qkv_bias", (True, False), False),
        qk_norm="layer_per_head" if cfg.require("qk_layernorm", (True, False), False) else None,
        parallel=cfg.require("use_parallel_residual", (True, False), False),
        tie=cfg.require("tie_word_embeddings", (True, False), False),
        context=cfg.size("max_position_embeddings", 4096, most=MAX_POSITIONS))
    cfg.check_understood()
    return spec


def stablelm(config, weights, tokens, *, loss: bool = False, split_heads: bool = False, past_len: int = 0,
             dtype: str = "float32", layout: Layout | None = None):
    """StableLM logits ``'logits'`` [len(tokens), vocab] (``loss=True``: ``'loss'``); the options as
    for ``llama``."""
    return rotary_decoder(stablelm_spec(config), weights, tokens, loss=loss, split_heads=split_heads,
                          past_len=past_len, layout=layout, dtype=dtype)


def random_stablelm_weights(config, seed: int = 0, dtype=np.float32) -> dict[str, np.ndarray]:
    """Random weights for a StableLM config, keyed like ``StableLmForCausalLM.state_dict()``."""
    return random_decoder_weights(stablelm_spec(config), seed, dtype)
