"""Does a fused attention-pattern lowering pay on this machine?  (issue 24, item 2: "softmax-
attention patterns where it pays").

Run: ``.venv/bin/python -m benchmarks.bench_attention_fusion [--runs 9] [--layers 4]``.  The
seed's loss and GPT-2 small's logits (``--layers`` layers, 128 tokens), hand-written in JAX, with
the attention written three ways and everything else equal, in one process, runs interleaved,
medians:

- *plain*: scores, causal mask, ``softmax``, probabilities times values (what ``compile`` lowers
  the circuits' attention to, heads batched);
- ``jax.nn.dot_product_attention`` (``is_causal=True``): JAX's fused attention entry point;
- *blocked*: keys in blocks of 64 or 128 with an online softmax (flash-style: the ``[heads,
  queries, keys]`` scores are never held whole).

A fused lowering in the backend would pay where a fused form runs faster than *plain*.  The
ratios are against *plain* of the same model.
"""

from __future__ import annotations

import argparse
import functools

import jax
import jax.numpy as jnp
import numpy as np

from circuits.models import random_weights
from circuits.models.gpt2 import random_gpt2_weights

from . import handwritten_attn_only as seed
from .bench_throughput import medians
from .common import report
from .handwritten_gpt2 import _ln as gpt2_ln


def attn_plain(q, k, v, causal):
    """``q, k, v``: ``[heads, positions, head_dim]``; ``causal``: ``[queries, keys]`` bool."""
    s = jnp.einsum("hqc,hkc->hqk", q, k) * jax.lax.rsqrt(jnp.float32(q.shape[-1]))
    return jnp.einsum("hqk,hkc->hqc", jax.nn.softmax(jnp.where(causal, s, -10000.0), -1), v)


def attn_dot_product(q, k, v, causal):
    t = lambda x: jnp.transpose(x, (1, 0, 2))[None]  # noqa: E731 - [batch, positions, heads, head_dim]
    return jnp.transpose(jax.nn.dot_product_attention(t(q), t(k), t(v), is_causal=True)[0], (1, 0, 2))


def attn_blocked(q, k, v, causal, block=64):
    scale = jax.lax.rsqrt(jnp.float32(q.shape[-1]))
    m = jnp.full(q.shape[:2], -jnp.inf, q.dtype)
    total = jnp.zeros(q.shape[:2], q.dtype)
    acc = jnp.zeros(q.shape, q.dtype)
    for s0 in range(0, k.shape[1], block):
        sc = jnp.where(causal[:, s0:s0 + block], jnp.einsum("hqc,hkc->hqk", q, k[:, s0:s0 + block]) * scale, -10000.0)
        new_m = jnp.maximum(m, sc.max(-1))
        p = jnp.exp(sc - new_m[..., None])
        corr = jnp.exp(m - new_m)
        total = total * corr + p.sum(-1)
        acc = acc * corr[..., None] + jnp.einsum("hqk,hkc->hqc", p, v[:, s0:s0 + block])
        m = new_m
    return acc / total[..., None]


ATTENTION = {"plain": attn_plain, "dot_product_attention": attn_dot_product,
             "blocked 64": attn_blocked, "blocked 128": functools.partial(attn_blocked, block=128)}


def seed_loss(w, tokens, attn, n_layers=2):
    """``handwritten_attn_only.loss_fused`` (16 vocabulary chunks) with the attention as ``attn``."""
    x, pos, mask = seed._embed(w, tokens)
    causal = mask > 0
    for l in range(n_layers):
        h = seed._ln(x, w[f"a{l}.ln.w.scale"], w[f"a{l}.ln.w.bias"])
        q = jnp.einsum("sd,hcd->hsc", h + pos, w[f"a{l}.w.q"])
        k = jnp.einsum("sd,hcd->hsc", h + pos, w[f"a{l}.w.k"])
        v = jnp.einsum("sd,hcd->hsc", h, w[f"a{l}.w.v"])
        x = x + jnp.einsum("hqc,hdc->qd", attn(q, k, v, causal), w[f"a{l}.w.o"])
    x = seed._ln(x, w["final.ln.w.scale"], w["final.ln.w.bias"])
    picked = jnp.einsum("sd,sd->s", x, w["t.w.unembed"][tokens[1:-1]])
    return seed.chunked_logsumexp(x, w["t.w.unembed"], 16) - picked


def gpt2_logits(w, tokens, attn, n_layer, n_head=12, eps=1e-5):
    """``handwritten_gpt2.logits`` with the attention as ``attn``."""
    p = "transformer."
    n = tokens.shape[0]
    wte = w[p + "wte.weight"]
    x = wte[tokens] + w[p + "wpe.weight"][:n]
    d = x.shape[-1]
    causal = jnp.tril(jnp.ones((n, n), bool))
    for l in range(n_layer):
        b = f"{p}h.{l}."
        h = gpt2_ln(x, w[b + "ln_1.weight"], w[b + "ln_1.bias"], eps)
        qkv = (h @ w[b + "attn.c_attn.weight"] + w[b + "attn.c_attn.bias"]).reshape(n, 3, n_head, d // n_head)
        q, k, v = (jnp.transpose(qkv[:, i], (1, 0, 2)) for i in range(3))
        o = jnp.transpose(attn(q, k, v, causal), (1, 0, 2)).reshape(n, d)
        x = x + o @ w[b + "attn.c_proj.weight"] + w[b + "attn.c_proj.bias"]
        h = gpt2_ln(x, w[b + "ln_2.weight"], w[b + "ln_2.bias"], eps)
        m = jax.nn.gelu(h @ w[b + "mlp.c_fc.weight"] + w[b + "mlp.c_fc.bias"], approximate=True)
        x = x + m @ w[b + "mlp.c_proj.weight"] + w[b + "mlp.c_proj.bias"]
    return gpt2_ln(x, w[p + "ln_f.weight"], w[p + "ln_f.bias"], eps) @ wte.T


def main(runs: int = 9, n_layer: int = 4):
    ws = {k: jax.device_put(v) for k, v in random_weights(0, vocab=50259, d_model=256).items()}
    ts = jax.device_put(np.random.default_rng(0).integers(0, 50259, 302).astype(np.int32))
    cfg = dict(n_embd=768, n_head=12, n_layer=n_layer, vocab_size=50257, n_positions=1024)
    wg = {k: jax.device_put(v) for k, v in random_gpt2_weights(cfg).items()}
    tg = jax.device_put(np.random.default_rng(0).integers(0, 50257, 128).astype(np.int32))
    fns, want = {}, {}
    for name, attn in ATTENTION.items():
        for model, fn, args, tol in (("seed", functools.partial(seed_loss, attn=attn), (ws, ts), 1e-4),
                                     ("gpt2", functools.partial(gpt2_logits, attn=attn, n_layer=n_layer), (wg, tg), 1e-3)):
            jitted = jax.jit(fn)
            got = np.asarray(jitted(*args))
            np.testing.assert_allclose(got, want.setdefault(model, got), rtol=tol, atol=tol)
            fns[f"{model} {name}"] = functools.partial(jitted, *args)
    t = medians(fns, runs)
    rows = [(f"{k}", f"{v * 1e3:8.1f} ms") for k, v in t.items()]
    rows += [(f"ratio {k} / {k.split()[0]} plain", f"{v / t[k.split()[0] + ' plain']:8.3f}")
             for k, v in t.items() if not k.endswith(" plain")]
    report(f"attention written plain, fused and blocked: seed loss, GPT-2 logits ({n_layer} layers, 128 tokens), "
           f"{jax.devices()[0].platform}, medians of {runs} interleaved runs", rows)
    return t


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--layers", type=int, default=4)
    args = parser.parse_args()
    main(runs=args.runs, n_layer=args.layers)
