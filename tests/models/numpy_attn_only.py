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


def forward(weights, tokens, *, return_logits=False):
    w = {k: np.asarray(v, dtype=np.float64) for k, v in weights.items()}
    tokens = np.asarray(tokens)
    inp, target = tokens[:-2], tokens[1:-1]
    n = len(inp)
    x = w["t.w.tok_embeds"][inp]
    pos = w["t.w.pos_embeds"][:n]
    allowed = np.tril(np.ones((n, n), dtype=bool))
    layer = 0
    while f"a{layer}.w.q" in w:
        h_in = layer_norm(x, w[f"a{layer}.ln.w.scale"], w[f"a{layer}.ln.w.bias"])
        qk_in = h_in + pos
        out = np.zeros_like(x)
        for h in range(w[f"a{layer}.w.q"].shape[0]):
            q = qk_in @ w[f"a{layer}.w.q"][h].T
            k = qk_in @ w[f"a{layer}.w.k"][h].T
            v = h_in @ w[f"a{layer}.w.v"][h].T
            scores = q @ k.T / np.sqrt(q.shape[-1])
            scores = np.where(allowed, scores, -10000.0)
            out += softmax(scores) @ v @ w[f"a{layer}.w.o"][h].T
        x = x + out
        layer += 1
    logits = layer_norm(x, w["final.ln.w.scale"], w["final.ln.w.bias"]) @ w["t.w.unembed"].T
    if return_logits:
        return logits
    return -log_softmax(logits)[np.arange(n), target]
