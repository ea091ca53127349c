"""Gemma-2: the rotary decoder with Gemma's RMS norms (scaled by ``1 + weight``), a norm after
attention and after the MLP as well as before them, embeddings scaled by ``sqrt(hidden_size)``,
``tanh`` soft-capping of the attention scores and of the logits, and layers alternating between
a sliding window (even layers) and full attention (``layer_types``).

The heads ``'h{l}.attn.head{h}'`` are each head's part of the attention output before the norm
after attention (``'h{l}.attn.post_ln'``), as a torch hook on ``o_proj``'s input sees them.

>>> from circuits.models import gemma2
>>> cfg = dict(model_type='gemma2', hidden_size=8, num_attention_heads=2, num_key_value_heads=1, head_dim=4,
...            num_hidden_layers=2, intermediate_size=16, vocab_size=11, sliding_window=2,
...            query_pre_attn_scalar=4)
>>> c = gemma2(cfg, None, [1, 2, 3])
>>> c.name, c.get_unique('h0.attn.scores').children[1].name, c.get_unique('h1.attn.scores').children[1].name
('logits', 'sliding_mask.neg_inf_bias', 'a.score_neg_inf_bias')
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import CircuitError
from .common import MAX_LAYERS, MAX_POSITIONS, Config, activation, positive_number, rope_theta
from .decoder import DecoderSpec, random_decoder_weights, read_windows, rotary_decoder, sliding_window
from .sequence import Layout

# transformers' Gemma2Config defaults, for a config.json that leaves a field out
DEFAULTS = {"query_pre_attn_scalar": 256, "final_logit_softcapping": 30.0, "attn_logit_softcapping": 50.0,
            "sliding_window": 4096, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
            "tie_word_embeddings": True}


def _optional_number(cfg: Config, key: str):
    """A positive number, or None when the config says null (absent: transformers' default)."""
    cfg.understood(key)
    value = cfg.d[key] if key in cfg.d else DEFAULTS[key]
    return None if value is None else positive_number(cfg.family, key, value)


def gemma2_spec(config) -> DecoderSpec:
    """The ``DecoderSpec`` of a Gemma-2 config (every field read and checked)."""
    cfg = Config(dict(config) if isinstance(config, dict) else config, "gemma2")
    cfg.reject_alibi()
    cfg.common()
    d, n_heads = cfg.size("hidden_size"), cfg.size("num_attention_heads")
    n_layers = cfg.size("num_hidden_layers", most=MAX_LAYERS)
    if cfg.get("use_bidirectional_attention"):
        raise CircuitError("gemma2: config use_bidirectional_attention=True is not supported (a causal LM)")
    window = sliding_window(cfg) if "sliding_window" in cfg.d else DEFAULTS["sliding_window"]
    cfg.understood("sliding_window")
    if cfg.get("sliding_window_size") is not None and cfg.d["sliding_window_size"] != window:
        # an older spelling some Gemma-2 configs carry beside sliding_window; transformers reads sliding_window
        raise CircuitError(f"gemma2: config sliding_window_size={cfg.d['sliding_window_size']!r} differs from "
                           f"sliding_window={window}; which one the checkpoint means is unclear")
    if cfg.get("layer_types") is None:
        types = ["sliding_attention" if (l + 1) % 2 else "full_attention" for l in range(n_layers)]
        windows = read_windows(Config(dict(cfg.d, layer_types=types), "gemma2"), n_layers, window)
    else:
        windows = read_windows(cfg, n_layers, window)
    act_key = "hidden_activation" if cfg.get("hidden_activation") is not None else None
    if act_key is None:  # transformers reads hidden_activation only; its default when absent
        act = activation(Config(dict(hidden_activation=DEFAULTS["hidden_activation"]), "gemma2"), "hidden_activation")
    else:
        act = activation(cfg, act_key)
    cfg.understood("hidden_act", "cache_implementation")  # hidden_act: an older twin transformers ignores
    theta, fraction = rope_theta(cfg)
    spec = DecoderSpec(
        family="gemma2", d=d, n_heads=n_heads, n_kv=cfg.size("num_key_value_heads", n_heads),
        head_dim=cfg.size("head_dim", DEFAULTS["head_dim"]), ffn=cfg.size("intermediate_size"),
        vocab=cfg.size("vocab_size"), n_layers=n_layers, eps=cfg.number("rms_norm_eps", 1e-6), act=act,
        theta=theta, rotary_fraction=fraction,
        q_bias=cfg.require("attention_bias", (True, False), False), windows=windows, norm_offset=True,
        sandwich_norms=True,
        # transformers keeps the scale as a float32 buffer, so even its float64 model uses sqrt(d) rounded to float32
        embed_scale=float(np.float32(math.sqrt(d))),
        attn_scale=_optional_number(cfg, "query_pre_attn_scalar") ** -0.5,
        attn_softcap=_optional_number(cfg, "attn_logit_softcapping"),
        final_softcap=_optional_number(cfg, "final_logit_softcapping"),
        tie=cfg.require("tie_word_embeddings", (True, False), DEFAULTS["tie_word_embeddings"]),
        context=cfg.size("max_position_embeddings", most=MAX_POSITIONS) if "max_position_embeddings" in cfg.d
        else None)
    spec.o_bias = spec.q_bias
    cfg.check_understood()
    return spec


def gemma2(config, weights, tokens, *, loss: bool = False, split_heads: bool = False, past_len: int = 0,
           dtype: str = "float32", layout: Layout | None = None):
    """Gemma-2 logits ``'logits'`` [len(tokens), vocab] (``loss=True``: ``'loss'``); the options
    as for ``llama``."""
    return rotary_decoder(gemma2_spec(config), weights, tokens, loss=loss, split_heads=split_heads,
                          past_len=past_len, layout=layout, dtype=dtype)


def random_gemma2_weights(config, seed: int = 0, dtype=np.float32) -> dict[str, np.ndarray]:
    """Random weights for a Gemma-2 config, keyed like ``Gemma2ForCausalLM.state_dict()``."""
    return random_decoder_weights(gemma2_spec(config), seed, dtype)
