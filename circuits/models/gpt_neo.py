"""GPT-Neo: GPT-2's blocks (learned positions, pre-LN, a GELU MLP, a tied unembedding) with
separate q/k/v projections without biases, attention scores that are not scaled by
``1 / sqrt(head_dim)``, and layers alternating (as ``attention_types`` says) between global
attention and local attention over the last ``window_size`` positions (``sequence.Layout.mask``'s
sliding window, exact).

Weights keep their state-dict key with ``transformer.`` dropped and ``h.{l}.`` written ``h{l}.``
(``h3.attn.attention.q_proj.weight``, ``h3.mlp.c_fc.bias``); nodes as ``gpt2`` names them.

>>> from circuits.models.gpt_neo import gpt_neo
>>> cfg = dict(model_type='gpt_neo', hidden_size=8, num_heads=2, num_layers=2, max_position_embeddings=16,
...            vocab_size=11, window_size=2, attention_types=[[['global', 'local'], 1]])
>>> c = gpt_neo(cfg, None, [1, 2, 3])
>>> c.get_unique('h0.attn.scores').children[-1].name, c.get_unique('h1.attn.scores').children[-1].name
('a.score_neg_inf_bias', 'sliding_mask.neg_inf_bias')
"""

from __future__ import annotations

import numpy as np

from ..errors import CircuitError
from ..nodes import Add, Circuit, Einsum, Rearrange
from .blocks import attention, head_projections, layer_norm, mlp, neg_inf_bias, residual_block
from .common import MAX_LAYERS, MAX_POSITIONS, Config, Weights, activation, embed, layout_for, loss_head, tokens_node
from .gpt2 import tied_unembed
from .sequence import Layout

PREFIXES = ("transformer.",)
IGNORED = (r"attn\.attention\.bias$", r"attn\.attention\.masked_bias$")
ATTENTION_KINDS = ("global", "local")


def attention_kinds(cfg: Config, n_layers: int) -> list[str]:
    """Each layer's kind from ``attention_types`` (``[[kinds, repeats], ...]``, expanded as
    ``transformers`` expands it) and, if given, ``attention_layers`` (it must agree)."""
    types = cfg.get("attention_types", [[["global", "local"], 12]])
    kinds = []
    try:
        for pattern, times in types:
            if isinstance(times, bool) or not isinstance(times, int) or times < 0 or times > MAX_LAYERS:
                raise TypeError
            for _ in range(times):
                kinds.extend(pattern)
    except (TypeError, ValueError):
        raise CircuitError(f"gpt_neo: config attention_types={str(types)[:80]} is not a list of [kinds, repeats] "
                           "pairs") from None
    bad = [k for k in kinds if k not in ATTENTION_KINDS]
    if bad:
        raise CircuitError(f"gpt_neo: config attention_types has the kind {bad[0]!r}; supported: "
                           f"{', '.join(map(repr, ATTENTION_KINDS))}")
    if len(kinds) != n_layers:
        raise CircuitError(f"gpt_neo: config attention_types gives {len(kinds)} layers but num_layers={n_layers}")
    given = cfg.get("attention_layers")
    if given is not None and list(given) != kinds:
        raise CircuitError(f"gpt_neo: config attention_layers={str(given)[:80]} disagrees with attention_types")
    return kinds


def gpt_neo(config, weights, tokens, *, loss: bool = False, split_heads: bool = False, past_len: int = 0,
            layout: Layout | None = None, dtype: str = "float32") -> Circuit:
    """GPT-Neo logits ``'logits'`` [len(tokens), vocab] (``loss=True``: ``'loss'``); the options as
    for ``gpt2``."""
    cfg = Config(config, "gpt_neo")
    cfg.reject_alibi()
    cfg.common()
    d, n_heads, n_layers = cfg.size("hidden_size"), cfg.size("num_heads"), cfg.size("num_layers", most=MAX_LAYERS)
    vocab, n_pos = cfg.size("vocab_size"), cfg.size("max_position_embeddings", most=MAX_POSITIONS)
    inner = cfg.size("intermediate_size", 4 * d)
    eps = cfg.number("layer_norm_epsilon", 1e-5)
    act = activation(cfg, "activation_function", "gelu_new")
    tie = cfg.require("tie_word_embeddings", (True, False), True)
    kinds = attention_kinds(cfg, n_layers)
    window = cfg.size("window_size", 256, most=MAX_POSITIONS)
    cfg.understood("embed_dropout", "resid_dropout")
    cfg.check_understood()
    if d % n_heads:
        raise CircuitError(f"gpt_neo: config hidden_size={d} is not a multiple of num_heads={n_heads}")
    c = d // n_heads
    w = Weights(weights, PREFIXES, "gpt_neo", ignored=IGNORED, dtype=dtype)
    toks = tokens_node(tokens, vocab)
    layout = layout_for(layout, toks.shape[0], past_len, "gpt_neo")
    layout.check_context("gpt_neo", n_pos, "max_position_embeddings")
    masks = {kind: layout.mask(window if kind == "local" else None) for kind in dict.fromkeys(kinds)}
    biases = {kind: neg_inf_bias(m, None if m.name in ("causal_mask", "attention_mask") else m.name)
              for kind, m in masks.items()}
    wte = w.take("wte.weight", (vocab, d))
    resid = Add(embed(wte, toks, "tok_embeds"), layout.learned(w.take("wpe.weight", (n_pos, d)), "pos_embeds"),
                name="embeds")

    def ln(x, key, name):
        return layer_norm(x, w.take(key + ".weight", (d,)), w.take(key + ".bias", (d,)), name, eps=eps, prefix=name)

    for l in range(n_layers):
        p, h, kind = f"h.{l}.", f"h{l}", kinds[l]
        a, pa = f"{h}.attn", f"h.{l}.attn.attention."

        def attn(x, pa=pa, a=a, kind=kind):
            q, k, v = head_projections(x, w.take(pa + "q_proj.weight", (d, d)), None, w.take(pa + "k_proj.weight", (d, d)),
                                       None, w.take(pa + "v_proj.weight", (d, d)), None, n_kv=n_heads, group=1,
                                       name=a)
            k = Layout.with_past(layout.past_symbol(a, "k", (n_heads, layout.past, c), dtype), k, a, "k")
            v = Layout.with_past(layout.past_symbol(a, "v", (n_heads, layout.past, c), dtype), v, a, "v")
            wo = Rearrange(w.take(pa + "out_proj.weight", (d, d)), "d (n g c) -> d n g c", n=n_heads, g=1,
                           name=f"{a}.w_o")
            return attention(x, q, k, v, wo, w.take(pa + "out_proj.bias", (d,)), mask=masks[kind],
                             mask_bias=biases[kind], scale=1.0, name=a, split_heads=split_heads)

        def feed_forward(x, p=p, h=h):
            return mlp(x, w.take(p + "mlp.c_fc.weight", (inner, d)), w.take(p + "mlp.c_fc.bias", (inner,)),
                       w.take(p + "mlp.c_proj.weight", (d, inner)), w.take(p + "mlp.c_proj.bias", (d,)), act, f"{h}.mlp")

        resid = residual_block(resid, h, attn, feed_forward, lambda x, name, p=p: ln(x, p + "ln_1", name),
                               lambda x, name, p=p: ln(x, p + "ln_2", name))
    final = ln(resid, "ln_f", "final.ln")
    out = Einsum.from_spec("sd,vd->sv", final, tied_unembed(w, wte, tie, (vocab, d)), name="logits")
    w.finish()
    return loss_head(out, toks) if loss else out


def random_gpt_neo_weights(config, seed: int = 0, dtype=np.float32) -> dict[str, np.ndarray]:
    """Random weights for a GPT-Neo config, keyed like ``GPTNeoForCausalLM.state_dict()`` (without
    the tied ``lm_head.weight``)."""
    cfg = Config(config, "gpt_neo")
    d, n_layers, vocab = cfg.size("hidden_size"), cfg.size("num_layers", most=MAX_LAYERS), cfg.size("vocab_size")
    n_pos, inner = cfg.size("max_position_embeddings", most=MAX_POSITIONS), cfg.size("intermediate_size", 4 * d)
    rng = np.random.default_rng(seed)

    def normal(*shape, scale=0.1):
        return (rng.standard_normal(shape) * scale).astype(dtype)

    out = {"transformer.wte.weight": normal(vocab, d, scale=1.0), "transformer.wpe.weight": normal(n_pos, d),
           "transformer.ln_f.weight": 1 + normal(d), "transformer.ln_f.bias": normal(d)}
    for l in range(n_layers):
        p = f"transformer.h.{l}."
        out.update({p + "ln_1.weight": 1 + normal(d), p + "ln_1.bias": normal(d),
                    p + "ln_2.weight": 1 + normal(d), p + "ln_2.bias": normal(d),
                    **{p + f"attn.attention.{k}_proj.weight": normal(d, d, scale=d ** -0.5) for k in ("q", "k", "v", "out")},
                    p + "attn.attention.out_proj.bias": normal(d),
                    p + "mlp.c_fc.weight": normal(inner, d, scale=d ** -0.5), p + "mlp.c_fc.bias": normal(inner),
                    p + "mlp.c_proj.weight": normal(d, inner, scale=inner ** -0.5), p + "mlp.c_proj.bias": normal(d)})
    return out
