"""The rotary decoder that Llama, Mistral, Qwen2/3, Gemma, Gemma-2, Phi-3, Mixtral and StableLM are
variants of, as one assembly.

A family reads its config into a ``DecoderSpec`` (sizes, which projections have biases, RMS or
layer norms, norms of each head's queries and keys, fused projections, a parallel residual, the
attention window of each layer, Gemma's norm offset and sandwich norms, softcapping, embedding
scale, a mixture of experts) and ``rotary_decoder`` builds the circuit from the shared blocks
(``blocks``: norms, rotary embeddings, grouped-query attention, gated MLP, ``residual_block``,
``fused_projections``, ``moe``; ``sequence``: positions, masks, KV cache).  A new family of this
kind is a config reader, not a copy of a builder.

Names (``circuits.models.common``'s scheme): ``embeds``; per layer ``h{l}.ln1``,
``h{l}.attn.proj.q`` / ``.k`` / ``.v`` (projections), ``h{l}.attn.q_norm`` / ``.k_norm`` (Qwen3,
StableLM), ``h{l}.attn.q`` / ``.k`` (after rotary), ``h{l}.attn.k_all`` / ``.v_all`` (after the
cache), ``h{l}.attn.probs`` (or per head ``h{l}.attn.head{h}.probs`` ... ``h{l}.attn.head{h}``),
``h{l}.attn`` (the attention output), ``h{l}.attn.post_ln`` (Gemma-2), ``h{l}.mid`` (not in a
parallel block), ``h{l}.ln2``, ``h{l}.mlp.gate`` / ``.up`` / ``.act`` / ``.hidden``, ``h{l}.mlp``
(Mixtral: ``h{l}.mlp.router...`` and ``h{l}.mlp.expert{e}``), ``h{l}.mlp.post_ln`` (Gemma-2),
``h{l}``; ``final.ln``, ``logits`` (``logits.raw`` before Gemma-2's final softcap).

>>> spec = DecoderSpec(family='llama', d=8, n_heads=2, n_kv=1, head_dim=4, ffn=16, vocab=11, n_layers=1)
>>> rotary_decoder(spec, None, [1, 2, 3]).shape
(3, 11)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import CircuitError
from ..nodes import Add, Circuit, Concat, Einsum, GeneralFunction, Index, Rearrange, Scalar
from .blocks import (
    ALL,
    apply_rotary,
    attention,
    fused_projections,
    head_projections,
    layer_norm,
    mlp,
    moe,
    neg_inf_bias,
    residual_block,
    rms_norm,
)
from .common import MAX_POSITIONS, Config, Weights, embed, layout_for, loss_head, stack_layers, tokens_node
from .sequence import Layout

IGNORED = (r"rotary_emb\.inv_freq$",)
PREFIXES = ("model.",)
LAYER_TYPES = {"full_attention": False, "sliding_attention": True}
NORMS = ("rms", "layer")
QK_NORMS = (None, "rms", "layer_per_head")


@dataclass
class DecoderSpec:
    """What distinguishes one rotary decoder family from another (see the module docstring)."""

    family: str
    d: int
    n_heads: int
    n_kv: int
    head_dim: int
    ffn: int
    vocab: int
    n_layers: int
    eps: float = 1e-6
    act: str = "silu"
    theta: float = 10000.0
    rotary_fraction: float = 1.0
    norm: str = "rms"  # 'rms' (RMSNorm) or 'layer' (LayerNorm with a bias: StableLM)
    q_bias: bool = False  # q, k and v projections' biases
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: str | None = None  # None, 'rms' (Qwen3: one RMSNorm over each head's dims), 'layer_per_head' (StableLM)
    fused_qkv: bool = False  # Phi-3: one qkv_proj, rows [q | k | v]
    fused_gate_up: bool = False  # Phi-3: one gate_up_proj, rows [gate | up]
    parallel: bool = False  # StableLM's use_parallel_residual: attention and MLP read the same norm
    experts: int = 0  # Mixtral: the MLP is a mixture of this many experts
    top_k: int = 0  # ... of which each position uses this many
    windows: list = field(default_factory=list)  # per layer: None (full) or the window size
    norm_offset: bool = False  # Gemma: RMS norms scale by (1 + weight)
    sandwich_norms: bool = False  # Gemma-2: norms after attention and MLP too
    embed_scale: float | None = None  # Gemma: embeddings times sqrt(d)
    attn_scale: float | None = None  # None: head_dim ** -0.5
    attn_softcap: float | None = None
    final_softcap: float | None = None
    tie: bool = False
    context: int | None = None  # max_position_embeddings (None: not enforced)

    def check(self):
        if self.n_heads % self.n_kv:
            raise CircuitError(f"{self.family}: num_attention_heads={self.n_heads} is not a multiple of "
                               f"num_key_value_heads={self.n_kv}")
        if len(self.windows) not in (0, self.n_layers):
            raise CircuitError(f"{self.family}: {len(self.windows)} layer types for {self.n_layers} layers")
        if self.norm not in NORMS or self.qk_norm not in QK_NORMS:
            raise CircuitError(f"{self.family}: norm={self.norm!r} / qk_norm={self.qk_norm!r}: norms are one of "
                               f"{NORMS}, query-key norms one of {QK_NORMS}")
        if self.experts and not 1 <= self.top_k <= self.experts:
            raise CircuitError(f"{self.family}: num_experts_per_tok={self.top_k} must be from 1 to the "
                               f"{self.experts} experts")
        rot = int(self.head_dim * self.rotary_fraction)  # as transformers rounds it
        if rot < 2 or rot % 2:
            raise CircuitError(f"{self.family}: config partial_rotary_factor={self.rotary_fraction} rotates {rot} of "
                               f"head_dim={self.head_dim} dimensions; rotary embeddings need an even number from 2")
        if self.parallel and self.sandwich_norms:
            raise CircuitError(f"{self.family}: a parallel block with sandwich norms is not a known architecture")


def read_windows(cfg: Config, n_layers: int, window: int | None) -> list:
    """Each layer's attention window from ``layer_types`` (``'full_attention'`` or
    ``'sliding_attention'``; any other type is refused naming it) and ``window`` (the config's
    ``sliding_window``), or ``window`` for every layer when there is no ``layer_types``."""
    types = cfg.get("layer_types")
    if types is None:
        return [window] * n_layers
    if not isinstance(types, (list, tuple)) or len(types) != n_layers:
        raise CircuitError(f"{cfg.family}: config layer_types must list one type per layer ({n_layers}), "
                           f"got {str(types)[:80]}")
    out = []
    for l, t in enumerate(types):
        if t not in LAYER_TYPES:
            raise CircuitError(f"{cfg.family}: config layer_types[{l}]={t!r} is not supported (supported: "
                               f"{', '.join(map(repr, LAYER_TYPES))})")
        if LAYER_TYPES[t] and window is None:
            raise CircuitError(f"{cfg.family}: config layer_types[{l}]='sliding_attention' but sliding_window "
                               "is not set")
        out.append(window if LAYER_TYPES[t] else None)
    return out


def sliding_window(cfg: Config, key: str = "sliding_window") -> int | None:
    value = cfg.get(key)
    return None if value is None else cfg.size(key, most=MAX_POSITIONS)


def qwen_windows(cfg: Config, n_layers: int) -> list:
    """Qwen2's and Qwen3's windows: ``sliding_window`` on the layers from ``max_window_layers`` on
    when ``use_sliding_window`` (or as ``layer_types`` says)."""
    window = sliding_window(cfg) if cfg.require("use_sliding_window", (True, False), False) else None
    cfg.understood("sliding_window")
    if cfg.get("layer_types") is None and window is not None:
        from .common import MAX_LAYERS

        first = cfg.size("max_window_layers", n_layers, most=MAX_LAYERS) if cfg.get("max_window_layers") else 0
        types = ["sliding_attention" if l >= first else "full_attention" for l in range(n_layers)]
        return read_windows(Config(dict(cfg.d, layer_types=types), cfg.family), n_layers, window)
    cfg.understood("max_window_layers")
    return read_windows(cfg, n_layers, window)


def layer_keys(spec: DecoderSpec, legacy_experts: bool = False) -> dict:
    """The state-dict keys of one layer (without ``model.layers.{l}.``) and their shapes."""
    d, hd, ffn = spec.d, spec.head_dim, spec.ffn
    q_size, kv_size = spec.n_heads * hd, spec.n_kv * hd
    keys = {"input_layernorm.weight": (d,), "self_attn.o_proj.weight": (d, q_size)}
    if spec.fused_qkv:
        keys["self_attn.qkv_proj.weight"] = (q_size + 2 * kv_size, d)
    else:
        keys.update({"self_attn.q_proj.weight": (q_size, d), "self_attn.k_proj.weight": (kv_size, d),
                     "self_attn.v_proj.weight": (kv_size, d)})
    if not spec.parallel:
        keys["post_attention_layernorm.weight"] = (d,)
    if spec.norm == "layer":
        keys.update({k.replace(".weight", ".bias"): v for k, v in keys.items() if "layernorm" in k})
    if spec.experts and legacy_experts:
        keys["block_sparse_moe.gate.weight"] = (spec.experts, d)
        for e in range(spec.experts):
            p = f"block_sparse_moe.experts.{e}."
            keys.update({p + "w1.weight": (ffn, d), p + "w3.weight": (ffn, d), p + "w2.weight": (d, ffn)})
    elif spec.experts:
        keys.update({"mlp.gate.weight": (spec.experts, d), "mlp.experts.gate_up_proj": (spec.experts, 2 * ffn, d),
                     "mlp.experts.down_proj": (spec.experts, d, ffn)})
    elif spec.fused_gate_up:
        keys.update({"mlp.gate_up_proj.weight": (2 * ffn, d), "mlp.down_proj.weight": (d, ffn)})
    else:
        keys.update({"mlp.up_proj.weight": (ffn, d), "mlp.down_proj.weight": (d, ffn), "mlp.gate_proj.weight": (ffn, d)})
    if spec.sandwich_norms:
        keys.update({"pre_feedforward_layernorm.weight": (d,), "post_feedforward_layernorm.weight": (d,)})
    if spec.q_bias:
        keys.update({"self_attn.q_proj.bias": (q_size,), "self_attn.k_proj.bias": (kv_size,),
                     "self_attn.v_proj.bias": (kv_size,)})
    if spec.o_bias:
        keys["self_attn.o_proj.bias"] = (d,)
    if spec.mlp_bias:
        keys.update({"mlp.up_proj.bias": (ffn,), "mlp.down_proj.bias": (d,), "mlp.gate_proj.bias": (ffn,)})
    if spec.qk_norm == "rms":
        keys.update({"self_attn.q_norm.weight": (hd,), "self_attn.k_norm.weight": (hd,)})
    elif spec.qk_norm == "layer_per_head":
        keys.update({f"self_attn.q_layernorm.norms.{h}.weight": (hd,) for h in range(spec.n_heads)})
        keys.update({f"self_attn.k_layernorm.norms.{h}.weight": (hd,) for h in range(spec.n_kv)})
    return keys


def rotary_decoder(spec: DecoderSpec, weights, tokens, *, loss: bool = False, split_heads: bool = False,
                   past_len: int = 0, layout: Layout | None = None, dtype: str = "float32",
                   modules: bool = False) -> Circuit:
    """The logits ``'logits'`` [len(tokens), vocab] (``loss=True``: ``'loss'``) of the decoder
    ``spec`` describes, from a state dict keyed like ``LlamaForCausalLM``'s (``model.`` optional;
    ``weights=None``: placeholders of ``dtype``).  ``past_len`` / ``layout`` as for ``gpt2``;
    ``modules=True``: the block written once (``common.stack_layers``)."""
    spec.check()
    fam, d, hd = spec.family, spec.d, spec.head_dim
    n_kv, group = spec.n_kv, spec.n_heads // spec.n_kv
    w = Weights(weights, PREFIXES, fam, ignored=IGNORED, dtype=dtype)
    toks = tokens_node(tokens, spec.vocab)
    n = toks.shape[0]
    layout = layout_for(layout, n, past_len, fam, modules)
    layout.check_context(fam, spec.context, "max_position_embeddings")
    rot = int(hd * spec.rotary_fraction)
    cos, sin = layout.rotary(hd, spec.theta, dtype, rotary_dim=rot)
    windows = spec.windows or [None] * spec.n_layers
    masks = {win: layout.mask(win) for win in dict.fromkeys(windows)}
    biases = {win: neg_inf_bias(m, None if m.name in ('causal_mask', 'attention_mask') else m.name)
              for win, m in masks.items()}
    table = w.take("embed_tokens.weight", (spec.vocab, d))
    if spec.embed_scale is None:
        resid = embed(table, toks, "embeds")
    else:
        resid = Einsum.from_spec("sd,->sd", embed(table, toks, "tok_embeds"),
                                 Scalar(float(spec.embed_scale), name="embeds.scale"), name="embeds")
    legacy = spec.experts > 0 and not w.placeholders and w.has("layers.0.block_sparse_moe.gate.weight")
    keys = layer_keys(spec, legacy)

    def norm(x, ws, key, name):
        weight = ws[key + ".weight"]
        if spec.norm == "layer":
            return layer_norm(x, weight, ws[key + ".bias"], name, eps=spec.eps, prefix=name)
        if spec.norm_offset:
            weight = Add(Scalar(1.0, name=f"{name}.one"), weight, name=f"{name}.scale")
        return rms_norm(x, weight, name, eps=spec.eps)

    def inputs(l):
        out = {key: w.take(f"layers.{l}.{key}", shape) for key, shape in keys.items()}
        for kv in ("k", "v"):
            past = layout.past_symbol(f"h{l}.attn", kv, (n_kv, layout.past, hd), dtype)
            if past is not None:
                out[f"attn.past_{kv}"] = past
        return out

    def head_norms(q, k, ws, a):
        """Qwen3's RMSNorm / StableLM's per-head LayerNorm of each head's queries and keys."""
        if spec.qk_norm == "rms":
            return (rms_norm(q, ws["self_attn.q_norm.weight"], f"{a}.q_norm", eps=spec.eps, axes="ngsc"),
                    rms_norm(k, ws["self_attn.k_norm.weight"], f"{a}.k_norm", eps=spec.eps, axes="nsc"))
        per_q = [Rearrange(ws[f"self_attn.q_layernorm.norms.{h}.weight"], "c -> 1 c", name=f"{a}.q_norm.w{h}")
                 for h in range(spec.n_heads)]
        per_k = [Rearrange(ws[f"self_attn.k_layernorm.norms.{h}.weight"], "c -> 1 c", name=f"{a}.k_norm.w{h}")
                 for h in range(n_kv)]
        wq = Rearrange(Concat(*per_q, axis=0, name=f"{a}.q_norm.weights"), "(n g) c -> n g c", n=n_kv,
                       name=f"{a}.q_norm.scale")
        wk = Concat(*per_k, axis=0, name=f"{a}.k_norm.scale") if n_kv > 1 else per_k[0]
        return (layer_norm(q, wq, None, f"{a}.q_norm", eps=spec.eps, prefix=f"{a}.q_norm", axes="ngsc",
                           scale_axes="ngc"),
                layer_norm(k, wk, None, f"{a}.k_norm", eps=spec.eps, prefix=f"{a}.k_norm", axes="nsc",
                           scale_axes="nc"))

    def attention_part(x, ws, h, window):
        a = f"{h}.attn"
        if spec.fused_qkv:
            q, k, v = fused_projections(x, ws["self_attn.qkv_proj.weight"], None, layout="blocks", n_kv=n_kv,
                                        group=group, head_dim=hd, name=f"{a}.proj")
        else:
            q, k, v = head_projections(
                x, ws["self_attn.q_proj.weight"], ws.get("self_attn.q_proj.bias"),
                ws["self_attn.k_proj.weight"], ws.get("self_attn.k_proj.bias"),
                ws["self_attn.v_proj.weight"], ws.get("self_attn.v_proj.bias"),
                n_kv=n_kv, group=group, name=f"{a}.proj")
        if spec.qk_norm is not None:
            q, k = head_norms(q, k, ws, a)
        q = apply_rotary(q, "ngsc", cos, sin, f"{a}.q", rotary_dim=rot)
        k = Layout.with_past(ws.get("attn.past_k"), apply_rotary(k, "nsc", cos, sin, f"{a}.k", rotary_dim=rot), a, "k")
        v = Layout.with_past(ws.get("attn.past_v"), v, a, "v")
        wo = Rearrange(ws["self_attn.o_proj.weight"], "d (n g c) -> d n g c", n=n_kv, g=group, name=f"{a}.w_o")
        out = attention(x, q, k, v, wo, ws.get("self_attn.o_proj.bias"), mask=masks[window],
                        mask_bias=biases[window], scale=hd ** -0.5 if spec.attn_scale is None else spec.attn_scale,
                        name=a, split_heads=split_heads, softcap=spec.attn_softcap)
        if spec.sandwich_norms:
            out = norm(out, ws, "post_attention_layernorm", f"{a}.post_ln")
        return out

    def mlp_part(x, ws, h):
        name = f"{h}.mlp"
        if spec.experts:
            if legacy:
                p = "block_sparse_moe."
                router = ws[p + "gate.weight"]
                experts = [(ws[p + f"experts.{e}.w1.weight"], ws[p + f"experts.{e}.w3.weight"],
                            ws[p + f"experts.{e}.w2.weight"]) for e in range(spec.experts)]
            else:
                router, gate_up, down = ws["mlp.gate.weight"], ws["mlp.experts.gate_up_proj"], ws["mlp.experts.down_proj"]
                f = spec.ffn
                experts = [(Index(gate_up, (e, slice(0, f), ALL), name=f"{name}.expert{e}.w_gate"),
                            Index(gate_up, (e, slice(f, 2 * f), ALL), name=f"{name}.expert{e}.w_up"),
                            Index(down, (e,), name=f"{name}.expert{e}.w_down")) for e in range(spec.experts)]
            out = moe(x, router, experts, top_k=spec.top_k, activation=spec.act, name=name)
        elif spec.fused_gate_up:
            f = spec.ffn
            gate_up = ws["mlp.gate_up_proj.weight"]
            out = mlp(x, Index(gate_up, (slice(f, 2 * f), ALL), name=f"{name}.w_up"), None, ws["mlp.down_proj.weight"],
                      None, spec.act, name, w_gate=Index(gate_up, (slice(0, f), ALL), name=f"{name}.w_gate"))
        else:
            out = mlp(x, ws["mlp.up_proj.weight"], ws.get("mlp.up_proj.bias"), ws["mlp.down_proj.weight"],
                      ws.get("mlp.down_proj.bias"), spec.act, name, w_gate=ws["mlp.gate_proj.weight"],
                      b_gate=ws.get("mlp.gate_proj.bias"))
        if spec.sandwich_norms:
            out = norm(out, ws, "post_feedforward_layernorm", f"{name}.post_ln")
        return out

    def layer(resid, ws, h, window):
        ln2 = "pre_feedforward_layernorm" if spec.sandwich_norms else "post_attention_layernorm"
        return residual_block(resid, h, lambda x: attention_part(x, ws, h, window), lambda x: mlp_part(x, ws, h),
                              lambda x, name: norm(x, ws, "input_layernorm", name),
                              None if spec.parallel else (lambda x, name: norm(x, ws, ln2, name)),
                              parallel=spec.parallel)

    if modules:
        if len(set(windows)) > 1:
            raise CircuitError(f"{fam}: modules=True needs one attention window for every layer")
        resid = stack_layers(resid, (inputs(l) for l in range(spec.n_layers)),
                             lambda r, ws, h: layer(r, ws, h, windows[0]), modules=True)
    else:
        for l in range(spec.n_layers):
            resid = layer(resid, inputs(l), f"h{l}", windows[l])
    final_keys = {"weight": w.take("norm.weight", (d,))}
    if spec.norm == "layer":
        final_keys["bias"] = w.take("norm.bias", (d,))
    final = norm(resid, {f"norm.{k}": v for k, v in final_keys.items()}, "norm", "final.ln")
    from .gpt2 import tied_unembed

    unembed = tied_unembed(w, table, spec.tie, (spec.vocab, d))
    if spec.final_softcap is None:
        out = Einsum.from_spec("sd,vd->sv", final, unembed, name="logits")
    else:
        raw = Einsum.from_spec("sd,vd->sv", final, unembed, name="logits.raw")
        over = Einsum.from_spec("sv,->sv", raw, Scalar(1.0 / spec.final_softcap, name="logits.inv_softcap"),
                                name="logits.over_softcap")
        out = Einsum.from_spec("sv,->sv", GeneralFunction("tanh", over, name="logits.tanh"),
                               Scalar(float(spec.final_softcap), name="logits.softcap"), name="logits")
    w.finish()
    return loss_head(out, toks) if loss else out


def random_decoder_weights(spec: DecoderSpec, seed: int = 0, dtype=np.float32) -> dict[str, np.ndarray]:
    """Random weights for ``spec``, keyed like ``LlamaForCausalLM.state_dict()`` (the family's own
    keys: Phi-3's fused projections, Mixtral's stacked experts...), with the activations kept O(1)."""
    rng = np.random.default_rng(seed)
    d = spec.d

    def random(key, shape):
        if key.endswith("norm.weight") or ".norms." in key or key.endswith("layernorm.weight"):
            return (rng.standard_normal(shape) * 0.1 + (0.0 if spec.norm_offset else 1.0)).astype(dtype)
        if len(shape) == 1:
            return (rng.standard_normal(shape) * 0.1).astype(dtype)
        return (rng.standard_normal(shape) * shape[-1] ** -0.5).astype(dtype)

    out = {"model.embed_tokens.weight": rng.standard_normal((spec.vocab, d)).astype(dtype),
           "model.norm.weight": random("norm.weight", (d,))}
    if spec.norm == "layer":
        out["model.norm.bias"] = random("norm.bias", (d,))
    if not spec.tie:
        out["lm_head.weight"] = random("lm_head.weight", (spec.vocab, d))
    keys = layer_keys(spec)
    for l in range(spec.n_layers):
        out.update({f"model.layers.{l}.{key}": random(key, shape) for key, shape in keys.items()})
    return out
