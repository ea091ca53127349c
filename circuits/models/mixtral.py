"""Mixtral: the Mistral decoder whose MLP is a sparse mixture of experts: a router (``mlp.gate``)
scores ``num_local_experts`` experts per position, the ``num_experts_per_tok`` best are picked and
their softmax probabilities renormalised, and the MLP's output is the picked experts' SwiGLU
outputs weighted by them (``blocks.moe``: the router and each expert are nodes,
``'h{l}.mlp.router.weights'``, ``'h{l}.mlp.expert{e}'``; the routing is exact, see
``blocks.top_k_mask`` for ties).

Weights as ``transformers`` 5 keeps them (``mlp.gate.weight``, the experts stacked in
``mlp.experts.gate_up_proj`` [experts, 2 * ffn, d] and ``mlp.experts.down_proj``), or as the
released checkpoints store them (``block_sparse_moe.gate.weight``,
``block_sparse_moe.experts.{e}.w1`` / ``w3`` / ``w2``).

>>> from circuits.models.mixtral import mixtral
>>> cfg = dict(model_type='mixtral', hidden_size=8, num_attention_heads=2, num_key_value_heads=1,
...            num_hidden_layers=1, intermediate_size=16, vocab_size=11, num_local_experts=4, num_experts_per_tok=2)
>>> [n.name for n in mixtral(cfg, None, [1, 2, 3]).get_unique('h0.mlp').children]
['h0.mlp.expert0', 'h0.mlp.expert1', 'h0.mlp.expert2', 'h0.mlp.expert3']
"""

from __future__ import annotations

import numpy as np

from .common import MAX_LAYERS, MAX_POSITIONS, Config, activation, rope_theta
from .decoder import DecoderSpec, random_decoder_weights, read_windows, rotary_decoder, sliding_window
from .sequence import Layout


def mixtral_spec(config) -> DecoderSpec:
    """The ``DecoderSpec`` of a Mixtral config (every field read and checked)."""
    cfg = Config(config, "mixtral")
    cfg.reject_alibi()
    cfg.common()
    d, n_heads = cfg.size("hidden_size"), cfg.size("num_attention_heads")
    n_layers = cfg.size("num_hidden_layers", most=MAX_LAYERS)
    theta, fraction = rope_theta(cfg, default=1e6)
    # training-only: the auxiliary loss, its coefficient, the jitter noise (applied in training mode)
    cfg.understood("router_aux_loss_coef", "router_jitter_noise", "output_router_logits")
    spec = DecoderSpec(
        family="mixtral", d=d, n_heads=n_heads, n_kv=cfg.size("num_key_value_heads", n_heads),
        head_dim=cfg.size("head_dim", max(d // n_heads, 1)), ffn=cfg.size("intermediate_size"),
        vocab=cfg.size("vocab_size"), n_layers=n_layers, eps=cfg.number("rms_norm_eps", 1e-5),
        act=activation(cfg, "hidden_act", "silu"), theta=theta, rotary_fraction=fraction,
        experts=cfg.size("num_local_experts", 8, most=4096), top_k=cfg.size("num_experts_per_tok", 2, most=4096),
        windows=read_windows(cfg, n_layers, sliding_window(cfg)),
        tie=cfg.require("tie_word_embeddings", (True, False), False),
        context=cfg.size("max_position_embeddings", 131072, most=MAX_POSITIONS))
    cfg.check_understood()
    spec.check()
    return spec


def mixtral(config, weights, tokens, *, loss: bool = False, split_heads: bool = False, past_len: int = 0,
            dtype: str = "float32", layout: Layout | None = None):
    """Mixtral logits ``'logits'`` [len(tokens), vocab] (``loss=True``: ``'loss'``); the options as
    for ``llama``."""
    return rotary_decoder(mixtral_spec(config), weights, tokens, loss=loss, split_heads=split_heads,
                          past_len=past_len, layout=layout, dtype=dtype)


def random_mixtral_weights(config, seed: int = 0, dtype=np.float32) -> dict[str, np.ndarray]:
    """Random weights for a Mixtral config, keyed like ``MixtralForCausalLM.state_dict()``."""
    return random_decoder_weights(mixtral_spec(config), seed, dtype)
