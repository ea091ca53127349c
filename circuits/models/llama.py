"""Llama and Mistral: RMSNorm, rotary position embeddings (HuggingFace's half-split layout),
grouped-query attention, SwiGLU MLP; Mistral's sliding window as an exact banded mask.

``llama(config, weights, tokens)`` takes the ``transformers`` config (or ``config.json`` dict)
and the state dict (keys with or without ``model.``) and returns ``'logits'`` [len(tokens),
vocab].  ``weights=None`` builds from the config alone with placeholder Arrays (no values: for
cost analysis, or ``circuits.bind`` / ``circuits.fill_random`` later).  ``past_len=P`` builds
one decode step against a KV cache: the tokens sit at positions ``P, P+1, ...`` and each layer
reads Symbols ``'h{l}.attn.past_k'`` / ``'h{l}.attn.past_v'`` of shape [n_kv_heads, P,
head_dim] (keys after rotary, as ``transformers`` caches them).

>>> from circuits.models import llama
>>> cfg = dict(hidden_size=8, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=1,
...            intermediate_size=16, vocab_size=11, hidden_act='silu')
>>> c = llama(cfg, None, [1, 2, 3], past_len=5)
>>> c.shape, sorted(s.name for s in c.get(lambda n: n.type_name == 'Symbol'))
((3, 11), ['h0.attn.past_k', 'h0.attn.past_v'])
"""

from __future__ import annotations

import numpy as np

from .common import MAX_LAYERS, MAX_POSITIONS, Config, activation, rope_theta
from .decoder import DecoderSpec, read_windows, rotary_decoder, sliding_window
from .sequence import Layout


def llama_spec(config) -> DecoderSpec:
    """The ``DecoderSpec`` of a Llama or Mistral config (every field read and checked)."""
    family = Config(config, "llama").d.get("model_type", "llama") or "llama"
    cfg = Config(config, family if isinstance(family, str) else "llama")
    cfg.reject_alibi()
    cfg.common()
    d, n_heads = cfg.size("hidden_size"), cfg.size("num_attention_heads")
    n_layers = cfg.size("num_hidden_layers", most=MAX_LAYERS)
    window = None
    if cfg.get("use_sliding_window", True) is not False:
        window = sliding_window(cfg)  # <= 0 would let tokens see the future
    else:
        cfg.understood("sliding_window")
    theta, fraction = rope_theta(cfg)
    llama_kind = cfg.family != "mistral"  # Mistral's projections have no biases whatever the config says
    spec = DecoderSpec(
        family=cfg.family, d=d, n_heads=n_heads, n_kv=cfg.size("num_key_value_heads", n_heads),
        head_dim=cfg.size("head_dim", max(d // n_heads, 1)), ffn=cfg.size("intermediate_size"),
        vocab=cfg.size("vocab_size"), n_layers=n_layers, eps=cfg.number("rms_norm_eps", 1e-6),
        act=activation(cfg, "hidden_act", "silu"), theta=theta, rotary_fraction=fraction,
        q_bias=cfg.require("attention_bias", (True, False) if llama_kind else (False,), False),
        mlp_bias=cfg.require("mlp_bias", (True, False) if llama_kind else (False,), False),
        windows=read_windows(cfg, n_layers, window),
        tie=cfg.require("tie_word_embeddings", (True, False), False),
        context=cfg.size("max_position_embeddings", most=MAX_POSITIONS) if "max_position_embeddings" in cfg.d
        else None)
    spec.o_bias = spec.q_bias
    cfg.require("pretraining_tp", (1,), 1)
    cfg.understood("max_window_layers")  # Qwen-style key some Mistral configs carry; windows come from above
    cfg.check_understood()
    return spec


def llama(config, weights, tokens, *, loss: bool = False, split_heads: bool = False, past_len: int = 0,
          dtype: str = "float32", modules: bool = False, layout: Layout | None = None):
    """Llama / Mistral logits ``'logits'`` [len(tokens), vocab] (``loss=True``: ``'loss'``).
    ``weights=None``: placeholder Arrays of ``dtype``; ``past_len``: one decode step against a KV
    cache of Symbols (see the module docstring); ``layout``: a generation step.  Unsupported config
    values (rotary scaling, ``pretraining_tp`` > 1, an unknown ``hidden_act``, alibi, a field this
    builder does not read) are errors naming the key.  ``modules=True``: the block written once
    and applied per layer as the Module ``'h{l}'`` (see ``circuits.models.common.stack_layers``)."""
    return rotary_decoder(llama_spec(config), weights, tokens, loss=loss, split_heads=split_heads,
                          past_len=past_len, layout=layout, dtype=dtype, modules=modules)


def random_llama_weights(config, seed: int = 0, dtype=np.float32) -> dict[str, np.ndarray]:
    """Random weights for a Llama/Mistral config, keyed like ``LlamaForCausalLM.state_dict()``."""
    from .decoder import random_decoder_weights

    return random_decoder_weights(llama_spec(config), seed, dtype)
