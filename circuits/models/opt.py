"""OPT: learned positions with their offset of 2, ReLU MLP, pre-LN (``do_layer_norm_before``,
the default) or post-LN blocks, and ``word_embed_proj_dim`` < ``hidden_size`` with
``project_in`` / ``project_out`` (OPT-350m).

``opt(config, weights, tokens)`` takes the ``transformers`` config (or its ``config.json`` dict)
and the state dict (keys with or without ``model.decoder.``) and returns ``'logits'``
[len(tokens), vocab]; names as ``circuits.models.common`` describes (weights ``h3.fc1.weight``,
``h3.self_attn.q_proj.weight``, ``embed_tokens.weight``; nodes ``h3.attn.probs``, ``h3.mlp``...).

>>> import numpy as np
>>> from circuits.models import opt
>>> from circuits.models.opt import random_opt_weights
>>> cfg = dict(hidden_size=8, num_attention_heads=2, num_hidden_layers=1, ffn_dim=16, vocab_size=11,
...            max_position_embeddings=16, activation_function='relu', word_embed_proj_dim=4)
>>> opt(cfg, random_opt_weights(cfg), np.array([2, 5, 7])).shape
(3, 11)
"""

from __future__ import annotations

import numpy as np

from ..errors import CircuitError
from ..nodes import Add, Circuit, Einsum, Rearrange
from .blocks import attention, head_projections, layer_norm, linear, mlp, neg_inf_bias
from .common import MAX_LAYERS, MAX_POSITIONS, Config, Weights, activation, embed, layout_for, loss_head, tokens_node
from .gpt2 import tied_unembed
from .sequence import Layout

POSITION_OFFSET = 2
PREFIXES = ("model.decoder.", "decoder.")


def opt(config, weights, tokens, *, loss: bool = False, split_heads: bool = False, past_len: int = 0,
        layout: Layout | None = None, dtype: str = "float32") -> Circuit:
    """OPT logits ``'logits'`` [len(tokens), vocab] (``loss=True``: ``'loss'``).  Positions are
    ``arange(len(tokens)) + 2`` (no padding; after ``past_len`` cached tokens, see ``gpt2``).
    ``weights=None`` builds with placeholders; ``layout``: a generation step (see
    ``circuits.models.sequence``)."""
    cfg = Config(config, "opt")
    cfg.reject_alibi()
    cfg.common()
    d, n_heads = cfg.size("hidden_size"), cfg.size("num_attention_heads")
    n_layers = cfg.size("num_hidden_layers", most=MAX_LAYERS)
    ffn, vocab = cfg.size("ffn_dim"), cfg.size("vocab_size")
    max_pos = cfg.size("max_position_embeddings", most=MAX_POSITIONS)
    proj = cfg.size("word_embed_proj_dim", d)
    act = activation(cfg, "activation_function", "relu")
    pre_ln = cfg.require("do_layer_norm_before", (True, False), True)
    bias_on = cfg.require("enable_bias", (True, False), True)
    affine = cfg.require("layer_norm_elementwise_affine", (True, False), True)
    remove_final = cfg.require("_remove_final_layer_norm", (True, False), False)
    final_ln = pre_ln and not remove_final
    tie = cfg.require("tie_word_embeddings", (True, False), True)
    cfg.require("scale_embedding", (False,), False)
    cfg.understood("num_attention_heads", "init_std")
    cfg.check_understood()
    if d % n_heads:
        raise CircuitError(f"opt: config hidden_size={d} is not a multiple of num_attention_heads={n_heads}")
    c = d // n_heads
    eps = 1e-5
    w = Weights(weights, PREFIXES, "opt", dtype=dtype)
    toks = tokens_node(tokens, vocab)
    n = toks.shape[0]
    layout = layout_for(layout, n, past_len, "opt")
    layout.check_context("opt", max_pos, "max_position_embeddings")

    def b(key, size):
        return w.take(key, (size,)) if bias_on else None

    def ln(x, key, name):
        scale = w.take(key + ".weight", (d,)) if affine else None
        shift = w.take(key + ".bias", (d,)) if affine else None
        return layer_norm(x, scale, shift, name, eps=eps, prefix=name)

    table = w.take("embed_tokens.weight", (vocab, proj))
    tok = embed(table, toks, "tok_embeds")
    if proj != d:
        tok = linear(tok, w.take("project_in.weight", (d, proj)), None, "project_in")
    positions = w.take("embed_positions.weight", (max_pos + POSITION_OFFSET, d))
    pos = layout.learned(positions, "pos_embeds", offset=POSITION_OFFSET)
    resid = Add(tok, pos, name="embeds")
    mask = layout.mask()
    mbias = neg_inf_bias(mask)
    for l in range(n_layers):
        p = f"layers.{l}."
        a = f"h{l}.attn"
        x = ln(resid, p + "self_attn_layer_norm", f"h{l}.ln1") if pre_ln else resid
        q, k, v = head_projections(
            x, w.take(p + "self_attn.q_proj.weight", (d, d)), b(p + "self_attn.q_proj.bias", d),
            w.take(p + "self_attn.k_proj.weight", (d, d)), b(p + "self_attn.k_proj.bias", d),
            w.take(p + "self_attn.v_proj.weight", (d, d)), b(p + "self_attn.v_proj.bias", d),
            n_kv=n_heads, group=1, name=a)
        k = Layout.with_past(layout.past_symbol(a, "k", (n_heads, layout.past, c), dtype), k, a, "k")
        v = Layout.with_past(layout.past_symbol(a, "v", (n_heads, layout.past, c), dtype), v, a, "v")
        wo = Rearrange(w.take(p + "self_attn.out_proj.weight", (d, d)), "d (n g c) -> d n g c", n=n_heads, g=1,
                       name=f"{a}.w_o")
        attn = attention(x, q, k, v, wo, b(p + "self_attn.out_proj.bias", d), mask=mask, mask_bias=mbias,
                         scale=c ** -0.5, name=a, split_heads=split_heads)
        if pre_ln:
            mid = Add(attn, resid, name=f"h{l}.mid")
            x2 = ln(mid, p + "final_layer_norm", f"h{l}.ln2")
        else:
            mid = ln(Add(attn, resid, name=f"h{l}.mid.pre_ln"), p + "self_attn_layer_norm", f"h{l}.mid")
            x2 = mid
        m = mlp(x2, w.take(p + "fc1.weight", (ffn, d)), b(p + "fc1.bias", ffn), w.take(p + "fc2.weight", (d, ffn)),
                b(p + "fc2.bias", d), act, f"h{l}.mlp")
        if pre_ln:
            resid = Add(m, mid, name=f"h{l}")
        else:
            resid = ln(Add(m, mid, name=f"h{l}.pre_ln"), p + "final_layer_norm", f"h{l}")
    if final_ln:
        resid = ln(resid, "final_layer_norm", "final.ln")
    if proj != d:
        resid = linear(resid, w.take("project_out.weight", (proj, d)), None, "project_out")
    unembed = tied_unembed(w, table, tie, (vocab, proj))
    out = Einsum.from_spec("sd,vd->sv", resid, unembed, name="logits")
    w.finish()
    return loss_head(out, toks) if loss else out


def random_opt_weights(config, seed: int = 0, dtype=np.float32) -> dict[str, np.ndarray]:
    """Random weights for an OPT config, keyed like ``OPTForCausalLM.state_dict()`` (without the
    tied ``lm_head.weight``)."""
    cfg = Config(config, "opt")
    d, n_layers, ffn = cfg.size("hidden_size"), cfg.size("num_hidden_layers", most=MAX_LAYERS), cfg.size("ffn_dim")
    vocab, proj = cfg.size("vocab_size"), cfg.size("word_embed_proj_dim", d)
    max_pos = cfg.size("max_position_embeddings", most=MAX_POSITIONS)
    pre_ln = cfg("do_layer_norm_before", True)
    rng = np.random.default_rng(seed)

    def normal(*shape, scale=0.02):
        return (rng.standard_normal(shape) * scale).astype(dtype)

    p0 = "model.decoder."
    out = {p0 + "embed_tokens.weight": normal(vocab, proj),
           p0 + "embed_positions.weight": normal(max_pos + POSITION_OFFSET, d, scale=0.01)}
    if pre_ln:
        out.update({p0 + "final_layer_norm.weight": 1 + normal(d, scale=0.1), p0 + "final_layer_norm.bias": normal(d)})
    if proj != d:
        out.update({p0 + "project_in.weight": normal(d, proj, scale=0.3), p0 + "project_out.weight": normal(proj, d)})
    for l in range(n_layers):
        p = f"{p0}layers.{l}."
        for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
            out[p + f"self_attn.{name}.weight"] = normal(d, d, scale=d ** -0.5)
            out[p + f"self_attn.{name}.bias"] = normal(d)
        for name in ("self_attn_layer_norm", "final_layer_norm"):
            out[p + f"{name}.weight"] = 1 + normal(d, scale=0.1)
            out[p + f"{name}.bias"] = normal(d)
        out.update({p + "fc1.weight": normal(ffn, d, scale=d ** -0.5), p + "fc1.bias": normal(ffn),
                    p + "fc2.weight": normal(d, ffn, scale=ffn ** -0.5), p + "fc2.bias": normal(d)})
    return out
