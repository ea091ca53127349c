"""A hand-written torch forward pass of the seed's attention-only model with TransformerLens's hook
names and hook functions: the oracle for positions in sites, the activation cache, the logit lens,
direct logit attribution, steering and the patching grids.

It never calls the library.  ``run(tokens, hooks={name: fn})`` computes the model on a batch of
token rows (batch first, float64), calling ``fn(value)`` at each named point and going on with
what it returns (TransformerLens's ``run_with_hooks``), and returns the logits, the per-token
loss and every hook's value in TransformerLens's layout (``hook_q`` ``[batch, pos, head,
d_head]``, ``hook_pattern`` ``[batch, head, query, key]``...).  Layouts: ``'seed'`` (positions +
2 tokens, position ``i`` predicts token ``i + 1``) and ``'next_token'`` (n tokens, n - 1 losses).
"""

from __future__ import annotations

import numpy as np
import torch

NEG = -10000.0


class AttnOnly:
    def __init__(self, weights: dict):
        self.w = {k: torch.from_numpy(np.asarray(v, np.float64)) for k, v in weights.items()}
        self.n_layers = 0
        while f"a{self.n_layers}.w.q" in self.w:
            self.n_layers += 1
        self.n_heads = self.w["a0.w.q"].shape[0]

    @staticmethod
    def _ln(x, scale, bias, hooks, cache, name):
        centred = x - x.mean(-1, keepdim=True)
        s = _hook(hooks, cache, f"{name}.hook_scale", torch.sqrt((centred ** 2).mean(-1, keepdim=True) + 1e-5))
        # TransformerLens's LayerNorm hooks its output, after the weight and bias
        return _hook(hooks, cache, f"{name}.hook_normalized", centred / s * scale + bias)

    def run(self, tokens, hooks=None, layout="seed"):
        """``(logits [batch, pos, vocab], loss [batch, pos'], cache {hook name: value})``."""
        hooks = hooks or {}
        cache: dict = {}
        toks = torch.as_tensor(np.atleast_2d(np.asarray(tokens)))
        inputs, targets = (toks[:, :-2], toks[:, 1:-1]) if layout == "seed" else (toks[:, :-1], toks[:, 1:])
        n = inputs.shape[1]
        w = self.w
        x = _hook(hooks, cache, "hook_embed", w["t.w.tok_embeds"][inputs])
        pos = _hook(hooks, cache, "hook_pos_embed", w["t.w.pos_embeds"][:n].expand(x.shape[0], n, -1))
        allowed = torch.tril(torch.ones(n, n, dtype=torch.bool))
        for l in range(self.n_layers):
            p = f"blocks.{l}"
            x = _hook(hooks, cache, f"{p}.hook_resid_pre", x)
            normed = self._ln(x, w[f"a{l}.ln.w.scale"], w[f"a{l}.ln.w.bias"], hooks, cache, f"{p}.ln1")
            qk_in = normed + pos  # shortformer: positions enter queries and keys only
            q = _hook(hooks, cache, f"{p}.attn.hook_q", torch.einsum("bsd,hcd->bshc", qk_in, w[f"a{l}.w.q"]))
            k = _hook(hooks, cache, f"{p}.attn.hook_k", torch.einsum("bsd,hcd->bshc", qk_in, w[f"a{l}.w.k"]))
            v = _hook(hooks, cache, f"{p}.attn.hook_v", torch.einsum("bsd,hcd->bshc", normed, w[f"a{l}.w.v"]))
            scores = torch.einsum("bqhc,bkhc->bhqk", q, k) / np.sqrt(q.shape[-1])
            scores = _hook(hooks, cache, f"{p}.attn.hook_attn_scores", torch.where(allowed, scores, torch.tensor(NEG, dtype=scores.dtype)))
            pattern = _hook(hooks, cache, f"{p}.attn.hook_pattern", torch.softmax(scores, -1))
            z = _hook(hooks, cache, f"{p}.attn.hook_z", torch.einsum("bhqk,bkhc->bqhc", pattern, v))
            result = _hook(hooks, cache, f"{p}.attn.hook_result", torch.einsum("bqhc,hdc->bqhd", z, w[f"a{l}.w.o"]))
            attn_out = _hook(hooks, cache, f"{p}.hook_attn_out", result.sum(2))
            x = _hook(hooks, cache, f"{p}.hook_resid_post", x + attn_out)
        final = self._ln(x, w["final.ln.w.scale"], w["final.ln.w.bias"], hooks, cache, "ln_final")
        logits = final @ w["t.w.unembed"].T
        logp = torch.log_softmax(logits, -1)
        loss = -logp.gather(-1, targets[..., None])[..., 0] if targets.shape[1] else None
        return logits, loss, cache


def _hook(hooks, cache, name, value):
    fn = hooks.get(name)
    if fn is not None:
        value = fn(value)
    cache[name] = value
    return value


def at_positions(source, positions, head=None):
    """A hook function putting ``source``'s entries at ``positions`` (of the position axis, 1 of
    ``[batch, pos, ...]``; ``head``: only that head of ``[batch, pos, head, ...]``) into the value."""

    def fn(value):
        out = value.clone()
        if head is None:
            out[:, positions] = source[:, positions]
        else:
            out[:, positions, head] = source[:, positions, head]
        return out

    return fn
