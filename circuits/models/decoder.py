"""The rotary decoder that Llama, Mistral, Qwen2 and Gemma-2 are variants of, as one assembly.

A family reads its config into a ``DecoderSpec`` (sizes, which projections have biases, the
attention window of each layer, Gemma's norm offset and sandwich norms, softcapping, embedding
scale) and ``rotary_decoder`` builds the circuit from the shared blocks (``blocks``: RMS norm,
rotary embeddings, grouped-query attention, gated MLP; ``sequence``: positions, masks, KV cache).
A new family of this kind is a config reader, not a copy of a builder.

Names (``circuits.models.common``'s scheme): ``embeds``; per layer ``h{l}.ln1``,
``h{l}.attn.proj.q`` / ``.k`` / ``.v`` (projections), ``h{l}.attn.q`` / ``.k`` (after rotary),
``h{l}.attn.k_all`` / ``.v_all`` (after the cache), ``h{l}.attn.probs`` (or per head
``h{l}.attn.head{h}.probs`` ... ``h{l}.attn.head{h}``), ``h{l}.attn`` (the attention output),
``h{l}.attn.post_ln`` (Gemma-2), ``h{l}.mid``, ``h{l}.ln2``, ``h{l}.mlp.gate`` / ``.up`` /
``.act`` / ``.hidden``, ``h{l}.mlp``, ``h{l}.mlp.post_ln`` (Gemma-2), ``h{l}``; ``final.ln``,
``logits`` (``logits.raw`` before Gemma-2's final softcap).

>>> spec = DecoderSpec(family='llama', d=8, n_heads=2, n_kv=1, head_dim=4, ffn=16, vocab=11, n_layers=1)
>>> rotary_decoder(spec, None, [1, 2, 3]).shape
(3, 11)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import CircuitError
from ..nodes import Add, Circuit, Einsum, GeneralFunction, Rearrange, Scalar
from .blocks import apply_rotary, attention, head_projections, mlp, neg_inf_bias, rms_norm
from .common import MAX_POSITIONS, Config, Weights, embed, layout_for, loss_head, stack_layers, tokens_node
from .sequence import Layout

IGNORED = (r"rotary_emb\.inv_freq$",)
PREFIXES = ("model.",)
LAYER_TYPES = {"full_attention": False, "sliding_attention": True}


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
    q_bias: bool = False  # q, k and v projections' biases
    o_bias: bool = False
    mlp_bias: bool = False
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
    q_size, kv_size = spec.n_heads * hd, n_kv * hd
    keys = {"input_layernorm.weight": (d,), "self_attn.q_proj.weight": (q_size, d),
            "self_attn.k_proj.weight": (kv_size, d), "self_attn.v_proj.weight": (kv_size, d),
            "self_attn.o_proj.weight": (d, q_size), "post_attention_layernorm.weight": (d,),
            "mlp.up_proj.weight": (spec.ffn, d), "mlp.down_proj.weight": (d, spec.ffn),
            "mlp.gate_proj.weight": (spec.ffn, d)}
    if spec.sandwich_norms:
        keys.update({"pre_feedforward_layernorm.weight": (d,), "post_feedforward_layernorm.weight": (d,)})
    if spec.q_bias:
        keys.update({"self_attn.q_proj.bias": (q_size,), "self_attn.k_proj.bias": (kv_size,),
                     "self_attn.v_proj.bias": (kv_size,)})
    if spec.o_bias:
        keys["self_attn.o_proj.bias"] = (d,)
    if spec.mlp_bias:
        keys.update({"mlp.up_proj.bias": (spec.ffn,), "mlp.down_proj.bias": (d,), "mlp.gate_proj.bias": (spec.ffn,)})

    def norm(x, weight, name):
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

    def layer(resid, ws, h, window):
        a = f"{h}.attn"
        x = norm(resid, ws["input_layernorm.weight"], f"{h}.ln1")
        q, k, v = head_projections(
            x, ws["self_attn.q_proj.weight"], ws.get("self_attn.q_proj.bias"),
            ws["self_attn.k_proj.weight"], ws.get("self_attn.k_proj.bias"),
            ws["self_attn.v_proj.weight"], ws.get("self_attn.v_proj.bias"),
            n_kv=n_kv, group=group, name=f"{a}.proj")
        q = apply_rotary(q, "ngsc", cos, sin, f"{a}.q", rotary_dim=rot)
        k = Layout.with_past(ws.get("attn.past_k"), apply_rotary(k, "nsc", cos, sin, f"{a}.k", rotary_dim=rot), a, "k")
        v = Layout.with_past(ws.get("attn.past_v"), v, a, "v")
        wo = Rearrange(ws["self_attn.o_proj.weight"], "d (n g c) -> d n g c", n=n_kv, g=group, name=f"{a}.w_o")
        attn = attention(x, q, k, v, wo, ws.get("self_attn.o_proj.bias"), mask=masks[window],
                         mask_bias=biases[window], scale=hd ** -0.5 if spec.attn_scale is None else spec.attn_scale,
                         name=a, split_heads=split_heads, softcap=spec.attn_softcap)
        if spec.sandwich_norms:
            attn = norm(attn, ws["post_attention_layernorm.weight"], f"{a}.post_ln")
            mid = Add(attn, resid, name=f"{h}.mid")
            x2 = norm(mid, ws["pre_feedforward_layernorm.weight"], f"{h}.ln2")
        else:
            mid = Add(attn, resid, name=f"{h}.mid")
            x2 = norm(mid, ws["post_attention_layernorm.weight"], f"{h}.ln2")
        m = mlp(x2, ws["mlp.up_proj.weight"], ws.get("mlp.up_proj.bias"), ws["mlp.down_proj.weight"],
                ws.get("mlp.down_proj.bias"), spec.act, f"{h}.mlp", w_gate=ws["mlp.gate_proj.weight"],
                b_gate=ws.get("mlp.gate_proj.bias"))
        if spec.sandwich_norms:
            m = norm(m, ws["post_feedforward_layernorm.weight"], f"{h}.mlp.post_ln")
        return Add(m, mid, name=h)

    if modules:
        if len(set(windows)) > 1:
            raise CircuitError(f"{fam}: modules=True needs one attention window for every layer")
        resid = stack_layers(resid, (inputs(l) for l in range(spec.n_layers)),
                             lambda r, ws, h: layer(r, ws, h, windows[0]), modules=True)
    else:
        for l in range(spec.n_layers):
            resid = layer(resid, inputs(l), f"h{l}", windows[l])
    final = norm(resid, w.take("norm.weight", (d,)), "final.ln")
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
    """Random weights for ``spec``, keyed like ``LlamaForCausalLM.state_dict()``, with the
    activations kept O(1)."""
    rng = np.random.default_rng(seed)
    d, hd, ffn = spec.d, spec.head_dim, spec.ffn

    def normal(*shape, scale):
        return (rng.standard_normal(shape) * scale).astype(dtype)

    def norm_weight():
        return normal(d, scale=0.1) if spec.norm_offset else 1 + normal(d, scale=0.1)

    out = {"model.embed_tokens.weight": normal(spec.vocab, d, scale=1.0), "model.norm.weight": norm_weight()}
    if not spec.tie:
        out["lm_head.weight"] = normal(spec.vocab, d, scale=d ** -0.5)
    q_size, kv_size = spec.n_heads * hd, spec.n_kv * hd
    for l in range(spec.n_layers):
        p = f"model.layers.{l}."
        out.update({
            p + "input_layernorm.weight": norm_weight(), p + "post_attention_layernorm.weight": norm_weight(),
            p + "self_attn.q_proj.weight": normal(q_size, d, scale=d ** -0.5),
            p + "self_attn.k_proj.weight": normal(kv_size, d, scale=d ** -0.5),
            p + "self_attn.v_proj.weight": normal(kv_size, d, scale=d ** -0.5),
            p + "self_attn.o_proj.weight": normal(d, q_size, scale=q_size ** -0.5),
            p + "mlp.gate_proj.weight": normal(ffn, d, scale=d ** -0.5),
            p + "mlp.up_proj.weight": normal(ffn, d, scale=d ** -0.5),
            p + "mlp.down_proj.weight": normal(d, ffn, scale=ffn ** -0.5),
        })
        if spec.sandwich_norms:
            out[p + "pre_feedforward_layernorm.weight"] = norm_weight()
            out[p + "post_feedforward_layernorm.weight"] = norm_weight()
        if spec.q_bias:
            for key, size in (("q", q_size), ("k", kv_size), ("v", kv_size)):
                out[p + f"self_attn.{key}_proj.bias"] = normal(size, scale=0.1)
        if spec.o_bias:
            out[p + "self_attn.o_proj.bias"] = normal(d, scale=0.1)
        if spec.mlp_bias:
            out.update({p + "mlp.up_proj.bias": normal(ffn, scale=0.1), p + "mlp.down_proj.bias": normal(d, scale=0.1),
                        p + "mlp.gate_proj.bias": normal(ffn, scale=0.1)})
    return out
