"""An independent plain-numpy implementation of the seed's attention-only transformer.

It must not call the library: it is the oracle the circuit builder is tested against.  It uses
the textbook formulas (mean/variance layer norm, masked softmax attention) in float64.
"""

import numpy as np


def layer_norm(x, scale, bias, eps=1e-5):
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * scale + bias


def softmax(x):
    x = x - x.max(axis=-1, keepdims=True)
    e = np.exp(x)
    return e / e.sum(axis=-1, keepdims=True)


def log_softmax(x):
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def forward(weights, tokens, *, return_logits=False, targets=None, hooks=None, record=None):
    """Per-token loss (or logits) of the seed's model.

    ``targets``: a token array in the tokens' layout whose ``[1:-1]`` are the next tokens (default:
    ``tokens``).  ``hooks`` maps a hook point to ``fn(value) -> value`` replacing it; ``record``
    (a dict) receives every hook point's value as computed (before its hook).  Hook points:
    ``('resid', l)`` the residual stream entering layer ``l``; ``('resid_in', l, h, role)`` the
    residual stream as head ``h`` of layer ``l`` reads it for its query, key or value (``role``
    ``'q'``, ``'k'``, ``'v'``; layer-normalised after the hook); ``('probs', l, h)`` the attention
    pattern; ``('head', l, h)`` the head's output; ``('final_resid',)`` the residual stream
    entering the final layer norm.
    """
    hooks = hooks or {}
    record = {} if record is None else record

    def at(key, value):
        record[key] = value
        fn = hooks.get(key)
        return value if fn is None else np.asarray(fn(value), dtype=np.float64)

    w = {k: np.asarray(v, dtype=np.float64) for k, v in weights.items()}
    tokens = np.asarray(tokens)
    target = np.asarray(tokens if targets is None else targets)[1:-1]
    inp = tokens[:-2]
    n = len(inp)
    x = w["t.w.tok_embeds"][inp]
    pos = w["t.w.pos_embeds"][:n]
    allowed = np.tril(np.ones((n, n), dtype=bool))
    layer = 0
    while f"a{layer}.w.q" in w:
        x = at(("resid", layer), x)
        scale, bias = w[f"a{layer}.ln.w.scale"], w[f"a{layer}.ln.w.bias"]
        out = np.zeros_like(x)
        for h in range(w[f"a{layer}.w.q"].shape[0]):
            normed = {role: layer_norm(at(("resid_in", layer, h, role), x), scale, bias) for role in "qkv"}
            q = (normed["q"] + pos) @ w[f"a{layer}.w.q"][h].T
            k = (normed["k"] + pos) @ w[f"a{layer}.w.k"][h].T
            v = normed["v"] @ w[f"a{layer}.w.v"][h].T
            scores = q @ k.T / np.sqrt(q.shape[-1])
            scores = np.where(allowed, scores, -10000.0)
            probs = at(("probs", layer, h), softmax(scores))
            out = out + at(("head", layer, h), probs @ v @ w[f"a{layer}.w.o"][h].T)
        x = x + out
        layer += 1
    x = at(("final_resid",), x)
    logits = layer_norm(x, w["final.ln.w.scale"], w["final.ln.w.bias"]) @ w["t.w.unembed"].T
    if return_logits:
        return logits
    return -log_softmax(logits)[np.arange(n), target]
