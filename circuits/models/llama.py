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

from ..errors import CircuitError
from ..nodes import Add, Array, Circuit, Concat, Einsum, Rearrange, Symbol
from .blocks import (
    apply_rotary,
    attention,
    head_projections,
    mlp,
    neg_inf_bias,
    rms_norm,
    rotary_sin_signed,
    rotary_tables,
    sliding_causal_mask,
)
from .common import (
    MAX_LAYERS,
    MAX_POSITIONS,
    Config,
    Weights,
    activation,
    embed,
    loss_head,
    positive_number,
    stack_layers,
    tokens_node,
)
from .gpt2 import tied_unembed

IGNORED = (r"rotary_emb\.inv_freq$",)


def _rope_theta(cfg: Config) -> float:
    params = cfg.d.get("rope_parameters")
    scaling = cfg.d.get("rope_scaling")
    for key, value in (("rope_parameters", params), ("rope_scaling", scaling)):
        if isinstance(value, dict):
            kind = value.get("rope_type", value.get("type", "default"))
            if kind != "default":
                raise CircuitError(f"{cfg.family}: config {key} has rope_type={kind!r}; only 'default' rotary "
                                   "embeddings are supported")
            for extra in ("partial_rotary_factor",):
                if value.get(extra) not in (None, 1, 1.0):
                    raise CircuitError(f"{cfg.family}: config {key}.{extra}={value[extra]!r} is not supported")
        elif value is not None:
            raise CircuitError(f"{cfg.family}: config {key}={value!r} is not supported")
    if isinstance(params, dict) and params.get("rope_theta") is not None:
        return positive_number(cfg.family, "rope_parameters.rope_theta", params["rope_theta"])
    return cfg.number("rope_theta", 10000.0)


def llama(config, weights, tokens, *, loss: bool = False, split_heads: bool = False, past_len: int = 0,
          dtype: str = "float32", modules: bool = False) -> Circuit:
    """Llama / Mistral logits ``'logits'`` [len(tokens), vocab] (``loss=True``: ``'loss'``).
    ``weights=None``: placeholder Arrays of ``dtype``; ``past_len``: one decode step against a KV
    cache of Symbols (see the module docstring).  Unsupported config values (rotary scaling,
    ``pretraining_tp`` > 1, an unknown ``hidden_act``, alibi) are errors naming the key.
    ``modules=True``: the block written once and applied per layer as the Module ``'h{l}'``
    (see ``circuits.models.common.stack_layers``)."""
    family = Config(config, "llama").d.get("model_type", "llama") or "llama"
    cfg = Config(config, family)
    cfg.reject_alibi()
    d, n_heads = cfg.size("hidden_size"), cfg.size("num_attention_heads")
    n_layers = cfg.size("num_hidden_layers", most=MAX_LAYERS)
    n_kv = cfg.size("num_key_value_heads", n_heads)
    ffn, vocab = cfg.size("intermediate_size"), cfg.size("vocab_size")
    head_dim = cfg.size("head_dim", max(d // n_heads, 1))
    eps = cfg.number("rms_norm_eps", 1e-6)
    act = activation(cfg, "hidden_act")
    attn_bias = cfg.require("attention_bias", (True, False), False)
    mlp_bias = cfg.require("mlp_bias", (True, False), False)
    cfg.require("pretraining_tp", (1,), 1)
    tie = cfg.require("tie_word_embeddings", (True, False), False)
    window = None
    if cfg.d.get("use_sliding_window", True) is not False and cfg.d.get("sliding_window") is not None:
        window = cfg.size("sliding_window", most=MAX_POSITIONS)  # <= 0 would let tokens see the future
    theta = _rope_theta(cfg)
    if n_heads % n_kv:
        raise CircuitError(f"{family}: num_attention_heads={n_heads} is not a multiple of "
                           f"num_key_value_heads={n_kv}")
    group = n_heads // n_kv
    past_len = int(past_len)
    if past_len < 0:
        raise CircuitError(f"{family}: past_len={past_len} must be >= 0")
    w = Weights(weights, ("model.",), family, ignored=IGNORED, dtype=dtype)
    toks = tokens_node(tokens, vocab)
    n = toks.shape[0]
    total = past_len + n
    positions = np.arange(past_len, total)
    cos, sin = rotary_tables(positions, head_dim, theta)
    cos_n, sin_n = Array(cos, name="rotary.cos"), Array(rotary_sin_signed(sin), name="rotary.sin_signed")
    mask = Array(sliding_causal_mask(n, total, None if window is None or window >= total else int(window)),
                 name="causal_mask")
    mbias = neg_inf_bias(mask)
    table = w.take("embed_tokens.weight", (vocab, d))
    resid = embed(table, toks, "embeds")
    q_size, kv_size = n_heads * head_dim, n_kv * head_dim
    keys = {"input_layernorm.weight": (d,), "self_attn.q_proj.weight": (q_size, d),
            "self_attn.k_proj.weight": (kv_size, d), "self_attn.v_proj.weight": (kv_size, d),
            "self_attn.o_proj.weight": (d, q_size), "post_attention_layernorm.weight": (d,),
            "mlp.up_proj.weight": (ffn, d), "mlp.down_proj.weight": (d, ffn), "mlp.gate_proj.weight": (ffn, d)}
    if attn_bias:
        keys.update({"self_attn.q_proj.bias": (q_size,), "self_attn.k_proj.bias": (kv_size,),
                     "self_attn.v_proj.bias": (kv_size,), "self_attn.o_proj.bias": (d,)})
    if mlp_bias:
        keys.update({"mlp.up_proj.bias": (ffn,), "mlp.down_proj.bias": (d,), "mlp.gate_proj.bias": (ffn,)})

    def inputs(l):
        out = {key: w.take(f"layers.{l}.{key}", shape) for key, shape in keys.items()}
        if past_len:  # the KV cache: Symbols per layer, bound by name when evaluating
            for kv in ("k", "v"):
                out[f"attn.past_{kv}"] = Symbol((n_kv, past_len, head_dim), name=f"h{l}.attn.past_{kv}", dtype=dtype)
        return out

    def layer(resid, ws, h):
        """One block over ``resid``; ``ws``: the layer's inputs by key; node names ``h.*``."""
        a = f"{h}.attn"
        x = rms_norm(resid, ws["input_layernorm.weight"], f"{h}.ln1", eps=eps)
        q, k, v = head_projections(
            x, ws["self_attn.q_proj.weight"], ws.get("self_attn.q_proj.bias"),
            ws["self_attn.k_proj.weight"], ws.get("self_attn.k_proj.bias"),
            ws["self_attn.v_proj.weight"], ws.get("self_attn.v_proj.bias"),
            n_kv=n_kv, group=group, name=f"{a}.proj")
        q = apply_rotary(q, "ngsc", cos_n, sin_n, f"{a}.q")
        k = apply_rotary(k, "nsc", cos_n, sin_n, f"{a}.k")
        if past_len:
            k = Concat(ws["attn.past_k"], k, axis=1, name=f"{a}.k_all")
            v = Concat(ws["attn.past_v"], v, axis=1, name=f"{a}.v_all")
        wo = Rearrange(ws["self_attn.o_proj.weight"], "d (n g c) -> d n g c", n=n_kv, g=group, name=f"{a}.w_o")
        attn = attention(x, q, k, v, wo, ws.get("self_attn.o_proj.bias"), mask=mask, mask_bias=mbias,
                         scale=head_dim ** -0.5, name=a, split_heads=split_heads)
        mid = Add(attn, resid, name=f"{h}.mid")
        x2 = rms_norm(mid, ws["post_attention_layernorm.weight"], f"{h}.ln2", eps=eps)
        m = mlp(x2, ws["mlp.up_proj.weight"], ws.get("mlp.up_proj.bias"), ws["mlp.down_proj.weight"],
                ws.get("mlp.down_proj.bias"), act, f"{h}.mlp", w_gate=ws["mlp.gate_proj.weight"],
                b_gate=ws.get("mlp.gate_proj.bias"))
        return Add(m, mid, name=h)

    resid = stack_layers(resid, (inputs(l) for l in range(n_layers)), layer, modules=modules)
    final = rms_norm(resid, w.take("norm.weight", (d,)), "final.ln", eps=eps)
    unembed = tied_unembed(w, table, tie, (vocab, d))
    out = Einsum.from_spec("sd,vd->sv", final, unembed, name="logits")
    w.finish()
    return loss_head(out, toks) if loss else out


def random_llama_weights(config, seed: int = 0, dtype=np.float32) -> dict[str, np.ndarray]:
    """Random weights for a Llama/Mistral config, keyed like ``LlamaForCausalLM.state_dict()``."""
    cfg = Config(config, "llama")
    d, n_heads = cfg.size("hidden_size"), cfg.size("num_attention_heads")
    n_layers = cfg.size("num_hidden_layers", most=MAX_LAYERS)
    n_kv, ffn, vocab = cfg.size("num_key_value_heads", n_heads), cfg.size("intermediate_size"), cfg.size("vocab_size")
    head_dim = cfg.size("head_dim", max(d // n_heads, 1))
    rng = np.random.default_rng(seed)

    def normal(*shape, scale):
        return (rng.standard_normal(shape) * scale).astype(dtype)

    out = {"model.embed_tokens.weight": normal(vocab, d, scale=1.0), "model.norm.weight": 1 + normal(d, scale=0.1)}
    if not cfg("tie_word_embeddings", False):
        out["lm_head.weight"] = normal(vocab, d, scale=d ** -0.5)
    for l in range(n_layers):
        p = f"model.layers.{l}."
        out.update({
            p + "input_layernorm.weight": 1 + normal(d, scale=0.1),
            p + "post_attention_layernorm.weight": 1 + normal(d, scale=0.1),
            p + "self_attn.q_proj.weight": normal(n_heads * head_dim, d, scale=d ** -0.5),
            p + "self_attn.k_proj.weight": normal(n_kv * head_dim, d, scale=d ** -0.5),
            p + "self_attn.v_proj.weight": normal(n_kv * head_dim, d, scale=d ** -0.5),
            p + "self_attn.o_proj.weight": normal(d, n_heads * head_dim, scale=(n_heads * head_dim) ** -0.5),
            p + "mlp.gate_proj.weight": normal(ffn, d, scale=d ** -0.5),
            p + "mlp.up_proj.weight": normal(ffn, d, scale=d ** -0.5),
            p + "mlp.down_proj.weight": normal(d, ffn, scale=ffn ** -0.5),
        })
    return out
