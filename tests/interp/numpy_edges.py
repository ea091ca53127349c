"""An independent numpy forward pass of the seed's attention-only model with a hook per edge.

It must not call the library.  Every reader of the residual stream (each head's q, k and v input,
and the output) sums its own terms, one per upstream source (``'embeds'``, ``'b{l}.a.head{h}'``),
so each edge ``'<source> -> <reader>'`` can carry its own value:

    term = value + w[edge] * (patched - value)

where ``value`` is the source as computed in this pass, ``patched`` the source's patched value
(``senders[source]``) and ``w`` the edge's weight (1: patched; missing: 0).  ``delta=`` instead
gives each source a fixed difference (``term = value + w * delta[source]``), and ``embeds=``
overrides the token embeddings (both for EAP-IG).  float64 throughout.
"""

import numpy as np

from benchmarks.numpy_attn_only import layer_norm, log_softmax, softmax


def edge_names(n_layers: int, n_heads: int) -> list[str]:
    """Every edge, grouped by reader in topological order (the library's order)."""
    names = []
    sources = ["embeds"]
    for layer in range(n_layers):
        for h in range(n_heads):
            for role in "qkv":
                names += [f"{s} -> b{layer}.a.head{h}.a.{role}" for s in sources]
        sources = sources + [f"b{layer}.a.head{h}" for h in range(n_heads)]
    names += [f"{s} -> output" for s in sources]
    return names


def forward(weights, tokens, *, targets=None, weights_of=None, senders=None, delta=None, embeds=None,
            return_logits=False):
    """``(per-token loss, {source: value})`` of the pass described in the module docstring
    (``return_logits``: the logits in place of the loss)."""
    weights_of = weights_of or {}
    w = {k: np.asarray(v, dtype=np.float64) for k, v in weights.items()}
    tokens = np.asarray(tokens)
    target = np.asarray(tokens if targets is None else targets)[1:-1]
    inp = tokens[:-2]
    n = len(inp)
    values = {"embeds": w["t.w.tok_embeds"][inp] if embeds is None else np.asarray(embeds, np.float64)}
    pos = w["t.w.pos_embeds"][:n]
    allowed = np.tril(np.ones((n, n), dtype=bool))

    def read(reader):
        total = 0.0
        for s, v in values.items():
            wt = weights_of.get(f"{s} -> {reader}", 0.0)
            if delta is not None:
                total = total + v + wt * delta[s]
            else:
                total = total + v + (wt * (senders[s] - v) if wt else 0.0)
        return total

    layer = 0
    while f"a{layer}.w.q" in w:
        scale, bias = w[f"a{layer}.ln.w.scale"], w[f"a{layer}.ln.w.bias"]
        outs = {}
        for h in range(w[f"a{layer}.w.q"].shape[0]):
            name = f"b{layer}.a.head{h}"
            normed = {role: layer_norm(read(f"{name}.a.{role}"), scale, bias) for role in "qkv"}
            q = (normed["q"] + pos) @ w[f"a{layer}.w.q"][h].T
            k = (normed["k"] + pos) @ w[f"a{layer}.w.k"][h].T
            v = normed["v"] @ w[f"a{layer}.w.v"][h].T
            scores = np.where(allowed, q @ k.T / np.sqrt(q.shape[-1]), -10000.0)
            outs[name] = softmax(scores) @ v @ w[f"a{layer}.w.o"][h].T
        values.update(outs)
        layer += 1
    x = read("output")
    logits = layer_norm(x, w["final.ln.w.scale"], w["final.ln.w.bias"]) @ w["t.w.unembed"].T
    if return_logits:
        return logits, values
    return -log_softmax(logits)[np.arange(n), target], values


def sources_on(weights, tokens):
    """Every source's value on ``tokens`` (a plain run)."""
    return forward(weights, tokens)[1]
