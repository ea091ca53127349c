"""A plain-numpy forward pass of the seed's attention-only model with hooks for interventions.

It never calls the library: it is the oracle the interventions are tested against.  Hooks:
``heads`` replaces head outputs, ``role_inputs`` gives one head's query, key or value its own
residual stream (before the layer norm), ``final_delta`` is added to the residual stream that only
the unembedding reads (a head -> logits path).
"""

import numpy as np


def layer_norm(x, scale, bias, eps=1e-5):
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * scale + bias


def softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def log_softmax(x):
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def forward(weights, tokens, *, heads=None, role_inputs=None, final_delta=None):
    """``{'loss', 'head_out': {(layer, head): out}, 'resid': [input of each layer, final]}``."""
    w = {k: np.asarray(v, dtype=np.float64) for k, v in weights.items()}
    heads, role_inputs = heads or {}, role_inputs or {}
    tokens = np.asarray(tokens)
    inp, target = tokens[:-2], tokens[1:-1]
    n = len(inp)
    x = w["t.w.tok_embeds"][inp]
    pos = w["t.w.pos_embeds"][:n]
    allowed = np.tril(np.ones((n, n), dtype=bool))
    head_out, resid = {}, []
    layer = 0
    while f"a{layer}.w.q" in w:
        resid.append(x)
        ln = lambda r, l=layer: layer_norm(r, w[f"a{l}.ln.w.scale"], w[f"a{l}.ln.w.bias"])  # noqa: E731
        total = np.zeros_like(x)
        for h in range(w[f"a{layer}.w.q"].shape[0]):
            if (layer, h) in heads:
                out = np.asarray(heads[layer, h], dtype=np.float64)
            else:
                src = {role: role_inputs.get((layer, h, role), x) for role in "qkv"}
                q = (ln(src["q"]) + pos) @ w[f"a{layer}.w.q"][h].T
                k = (ln(src["k"]) + pos) @ w[f"a{layer}.w.k"][h].T
                v = ln(src["v"]) @ w[f"a{layer}.w.v"][h].T
                scores = np.where(allowed, q @ k.T / np.sqrt(q.shape[-1]), -10000.0)
                out = softmax(scores) @ v @ w[f"a{layer}.w.o"][h].T
            head_out[layer, h] = out
            total += out
        x = x + total
        layer += 1
    resid.append(x)
    final = x if final_delta is None else x + final_delta
    logits = layer_norm(final, w["final.ln.w.scale"], w["final.ln.w.bias"]) @ w["t.w.unembed"].T
    return {"loss": -log_softmax(logits)[np.arange(n), target], "head_out": head_out, "resid": resid}


def path_patched_losses(weights, tokens, corrupted, n_heads):
    """Exact path patching, by name as ``variants.path_patch_variants`` builds them:
    ``b0.a.head{s}->b1.a.head{r}.{role}`` and ``b{l}.a.head{s}->logits``."""
    clean = forward(weights, tokens)
    corr = forward(weights, corrupted)
    out = {}
    for s in range(n_heads):
        delta = corr["head_out"][0, s] - clean["head_out"][0, s]
        for r in range(n_heads):
            for role in "qkv":
                patched = forward(weights, tokens, role_inputs={(1, r, role): clean["resid"][1] + delta})
                out[f"b0.a.head{s}->b1.a.head{r}.{role}"] = patched["loss"]
    for layer in range(2):
        for s in range(n_heads):
            delta = corr["head_out"][layer, s] - clean["head_out"][layer, s]
            out[f"b{layer}.a.head{s}->logits"] = forward(weights, tokens, final_delta=delta)["loss"]
    return out


def zero_ablated_losses(weights, tokens, n_layers, n_heads):
    """``b{l}.a.head{h}`` -> the loss with that head's output replaced by zeros."""
    n = len(tokens) - 2
    d = np.asarray(weights["t.w.tok_embeds"]).shape[1]
    return {f"b{l}.a.head{h}": forward(weights, tokens, heads={(l, h): np.zeros((n, d))})["loss"]
            for l in range(n_layers) for h in range(n_heads)}
