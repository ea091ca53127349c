"""GPT-J: one LayerNorm per block read by both the attention and the MLP (a parallel block,
``blocks.residual_block``), separate q/k/v projections without biases, rotary embeddings in
GPT-J's interleaved layout (pairs of dimensions rotate together, ``rotate_every_two``) on the
first ``rotary_dim`` dimensions of each head, a GELU MLP with biases, and an unembedding with a
bias.

Weights keep their state-dict key with ``transformer.`` dropped and ``h.{l}.`` written ``h{l}.``
(``h3.attn.q_proj.weight``, ``h3.mlp.fc_in.bias``); ``lm_head.weight`` / ``lm_head.bias``.  Nodes
as the other builders name them: ``h3.ln1``, ``h3.attn.proj.q`` (before rotary), ``h3.attn.q``,
``h3.attn.head5``, ``h3.attn``, ``h3.mlp``, ``h3``; ``final.ln``, ``logits``.

>>> from circuits.models.gptj import gptj
>>> cfg = dict(model_type='gptj', n_embd=8, n_head=2, n_layer=1, n_positions=16, rotary_dim=2, vocab_size=11)
>>> [n.name for n in gptj(cfg, None, [1, 2, 3], split_heads=True).get_unique('h0').children]
['h0.mlp', 'h0.attn', 'embeds']
"""

from __future__ import annotations

import numpy as np

from ..errors import CircuitError
from ..nodes import Circuit, Rearrange
from .blocks import apply_rotary, attention, head_projections, layer_norm, linear, mlp, neg_inf_bias, residual_block
from .common import MAX_LAYERS, MAX_POSITIONS, Config, Weights, activation, embed, layout_for, loss_head, tokens_node
from .gpt2 import tied_unembed
from .sequence import Layout

PREFIXES = ("transformer.",)
IGNORED = (r"attn\.bias$", r"attn\.masked_bias$")
THETA = 10000.0  # GPT-J's rotary base (not a config field)


def gptj(config, weights, tokens, *, loss: bool = False, split_heads: bool = False, past_len: int = 0,
         layout: Layout | None = None, dtype: str = "float32") -> Circuit:
    """GPT-J logits ``'logits'`` [len(tokens), vocab] (``loss=True``: ``'loss'``); ``weights=None``
    builds with placeholders of ``dtype``; ``past_len`` / ``layout`` as for ``gpt2``.  A config
    field this builder does not read, ``rotary_dim`` unset (``transformers`` then rotates with
    tables as wide as the model, which only fits one head), or weights the config does not
    account for are errors naming them."""
    cfg = Config(config, "gptj")
    cfg.reject_alibi()
    cfg.common()
    d, n_heads, n_layers = cfg.size("n_embd"), cfg.size("n_head"), cfg.size("n_layer", most=MAX_LAYERS)
    vocab, n_pos = cfg.size("vocab_size"), cfg.size("n_positions", 2048, most=MAX_POSITIONS)
    inner = cfg.size("n_inner", 4 * d)
    eps = cfg.number("layer_norm_epsilon", 1e-5)
    act = activation(cfg, "activation_function", "gelu_new")
    tie = cfg.require("tie_word_embeddings", (True, False), False)
    if d % n_heads:
        raise CircuitError(f"gptj: config n_embd={d} is not a multiple of n_head={n_heads}")
    c = d // n_heads
    if cfg.get("rotary_dim") is None:
        raise CircuitError("gptj: config rotary_dim=None is not supported (transformers then builds rotary tables "
                           f"n_embd={d} wide for heads of {c} dimensions); give rotary_dim")
    rot = cfg.size("rotary_dim", most=c)
    cfg.check_understood()
    w = Weights(weights, PREFIXES, "gptj", ignored=IGNORED, dtype=dtype)
    toks = tokens_node(tokens, vocab)
    layout = layout_for(layout, toks.shape[0], past_len, "gptj")
    layout.check_context("gptj", n_pos, "n_positions")
    cos, sin = layout.rotary(c, THETA, dtype, rotary_dim=rot, interleaved=True)
    mask = layout.mask()
    mbias = neg_inf_bias(mask)
    table = w.take("wte.weight", (vocab, d))
    resid = embed(table, toks, "embeds")

    def ln(x, key, name):
        return layer_norm(x, w.take(key + ".weight", (d,)), w.take(key + ".bias", (d,)), name, eps=eps, prefix=name)

    for l in range(n_layers):
        p, h = f"h.{l}.", f"h{l}"
        a = f"{h}.attn"

        def attn(x, p=p, a=a):
            q, k, v = head_projections(x, w.take(p + "attn.q_proj.weight", (d, d)), None,
                                       w.take(p + "attn.k_proj.weight", (d, d)), None,
                                       w.take(p + "attn.v_proj.weight", (d, d)), None, n_kv=n_heads, group=1,
                                       name=f"{a}.proj")
            q = apply_rotary(q, "ngsc", cos, sin, f"{a}.q", rotary_dim=rot, interleaved=True)
            k = apply_rotary(k, "nsc", cos, sin, f"{a}.k", rotary_dim=rot, interleaved=True)
            k = Layout.with_past(layout.past_symbol(a, "k", (n_heads, layout.past, c), dtype), k, a, "k")
            v = Layout.with_past(layout.past_symbol(a, "v", (n_heads, layout.past, c), dtype), v, a, "v")
            wo = Rearrange(w.take(p + "attn.out_proj.weight", (d, d)), "d (n g c) -> d n g c", n=n_heads, g=1,
                           name=f"{a}.w_o")
            return attention(x, q, k, v, wo, None, mask=mask, mask_bias=mbias, scale=c ** -0.5, name=a,
                             split_heads=split_heads)

        def feed_forward(x, p=p, h=h):
            return mlp(x, w.take(p + "mlp.fc_in.weight", (inner, d)), w.take(p + "mlp.fc_in.bias", (inner,)),
                       w.take(p + "mlp.fc_out.weight", (d, inner)), w.take(p + "mlp.fc_out.bias", (d,)), act,
                       f"{h}.mlp")

        resid = residual_block(resid, h, attn, feed_forward, lambda x, name, p=p: ln(x, p + "ln_1", name),
                               parallel=True)
    final = ln(resid, "ln_f", "final.ln")
    out = linear(final, tied_unembed(w, table, tie, (vocab, d)), w.take("lm_head.bias", (vocab,)), "logits")
    w.finish()
    return loss_head(out, toks) if loss else out


def random_gptj_weights(config, seed: int = 0, dtype=np.float32) -> dict[str, np.ndarray]:
    """Random weights for a GPT-J config, keyed like ``GPTJForCausalLM.state_dict()``."""
    cfg = Config(config, "gptj")
    d, n_layers, vocab = cfg.size("n_embd"), cfg.size("n_layer", most=MAX_LAYERS), cfg.size("vocab_size")
    inner = cfg.size("n_inner", 4 * d)
    rng = np.random.default_rng(seed)

    def normal(*shape, scale=0.1):
        return (rng.standard_normal(shape) * scale).astype(dtype)

    out = {"transformer.wte.weight": normal(vocab, d, scale=1.0), "lm_head.weight": normal(vocab, d, scale=d ** -0.5),
           "lm_head.bias": normal(vocab), "transformer.ln_f.weight": 1 + normal(d), "transformer.ln_f.bias": normal(d)}
    for l in range(n_layers):
        p = f"transformer.h.{l}."
        out.update({p + "ln_1.weight": 1 + normal(d), p + "ln_1.bias": normal(d),
                    **{p + f"attn.{k}_proj.weight": normal(d, d, scale=d ** -0.5) for k in ("q", "k", "v", "out")},
                    p + "mlp.fc_in.weight": normal(inner, d, scale=d ** -0.5), p + "mlp.fc_in.bias": normal(inner),
                    p + "mlp.fc_out.weight": normal(d, inner, scale=inner ** -0.5), p + "mlp.fc_out.bias": normal(d)})
    return out
