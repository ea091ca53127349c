"""GPT-2 written by hand in JAX from a ``transformers`` state dict (``transformer.h.{l}...``, Conv1D
weights ``[in, out]``), as a researcher would: fused qkv projection, heads batched, causal mask by
``where``: the baseline of ``bench_gpt2``."""

import jax
import jax.numpy as jnp


def _ln(x, scale, bias, eps):
    mean = x.mean(-1, keepdims=True)
    xc = x - mean
    return xc * jax.lax.rsqrt((xc * xc).mean(-1, keepdims=True) + eps) * scale + bias


def logits(w, tokens, n_layer, n_head, eps=1e-5, embeds=None):
    """``[len(tokens), vocab]`` logits (tied unembedding); ``embeds``: the residual stream's
    input ``[len(tokens), d]`` given instead of computed (token plus position embeddings)."""
    p = "transformer."
    n = tokens.shape[0]
    wte = w[p + "wte.weight"]
    x = wte[tokens] + w[p + "wpe.weight"][:n] if embeds is None else embeds
    d = x.shape[-1]
    c = d // n_head
    causal = jnp.tril(jnp.ones((n, n), bool))
    for l in range(n_layer):
        q = f"{p}h.{l}."
        h = _ln(x, w[q + "ln_1.weight"], w[q + "ln_1.bias"], eps)
        qkv = (h @ w[q + "attn.c_attn.weight"] + w[q + "attn.c_attn.bias"]).reshape(n, 3, n_head, c)
        scores = jnp.einsum("qhc,khc->hqk", qkv[:, 0], qkv[:, 1]) * (c ** -0.5)
        probs = jax.nn.softmax(jnp.where(causal, scores, -1e9), -1)
        o = jnp.einsum("hqk,khc->qhc", probs, qkv[:, 2]).reshape(n, d)
        x = x + o @ w[q + "attn.c_proj.weight"] + w[q + "attn.c_proj.bias"]
        h = _ln(x, w[q + "ln_2.weight"], w[q + "ln_2.bias"], eps)
        m = jax.nn.gelu(h @ w[q + "mlp.c_fc.weight"] + w[q + "mlp.c_fc.bias"], approximate=True)
        x = x + m @ w[q + "mlp.c_proj.weight"] + w[q + "mlp.c_proj.bias"]
    return _ln(x, w[p + "ln_f.weight"], w[p + "ln_f.bias"], eps) @ wte.T
