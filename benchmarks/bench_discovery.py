"""Circuit discovery (issue 22).  Run: ``.venv/bin/python -m benchmarks.bench_discovery [--small]``.

1. GPT-2 width (d 768, 12 heads of 64), 12 layers, 32 tokens, random weights, split heads:
   ``discover(method='eap')`` over every head-level edge vs one forward and backward pass of the
   plain model: the hand-written ``jax.jit`` GPT-2 (``handwritten_gpt2``, weights as arguments)
   and the library's compiled ``value_and_grad``, each the same metric's value and gradient with
   respect to the embeddings, all warm; ``'eap-ig-mask'`` with 10 steps likewise.  Targets: EAP
   <= 2x, EAP-IG-mask <= 15x.  The discover times are end to end (the corrupted senders computed
   in the same program); medians of interleaved runs, ratios within one process.  First, each
   method's first call as a user makes it (``mode='auto'``: op by op); the warm rows time the
   compiled programs (``mode='jit'``, what ``'auto'`` runs once their background compile is done).
2. The shipped induction model: ``discover(method='exact')`` over every edge (81) vs a loop of
   per-edge patched forwards of a hand-written ``jax.jit`` model (the edge mask an argument, the
   corrupted senders computed once), both warm.  Target: ratio <= 0.3.  ACDC's time, cold and warm.

``--small``: section 1 at 2 layers and width 64 (a quick check on a CPU); ``--induction-only``,
``--gpt2-only``: one section; ``--no-ig``: section 1 without EAP-IG-mask; ``--eap-ig``: section 1
also times Hanna et al.'s ``'eap-ig'`` with 10 steps (no target).
"""

from __future__ import annotations

import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from circuits.interp import discover, edges
from circuits.models import attn_only, gpt2, induction_tokens, induction_weights
from circuits.models.gpt2 import random_gpt2_weights
from circuits.models.induction import REPEATED_HALF

from .common import interleaved_medians, report
from .handwritten_attn_only import _embed, _ln, _unembed
from .handwritten_gpt2 import logits


def _timed(fn, runs=3):
    fn()  # warm: compiled
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return float(np.median(times))


# ---------------------------------------------------------------------------- 1. GPT-2 width
def _interleaved(fns: dict, runs: int) -> dict:
    """Median seconds of each function, runs interleaved (a noisy machine slows all alike)."""
    return interleaved_medians(fns, runs=runs, warmup=0)


def gpt2_eap(small: bool, runs: int = 5):
    cfg = dict(n_embd=64 if small else 768, n_head=4 if small else 12, n_layer=2 if small else 12,
               vocab_size=50257, n_positions=64, activation_function="gelu_new")
    rng = np.random.default_rng(0)
    clean, corrupt = rng.integers(0, 50257, 32), rng.integers(0, 50257, 32)
    weights_dict = random_gpt2_weights(cfg)
    c = gpt2(cfg, weights_dict, clean, split_heads=True)
    weights = rng.standard_normal(c.shape).astype(np.float32) / np.prod(c.shape)
    src = {"tokens": corrupt}
    n = len(edges(c))
    from circuits.backend import value_and_grad
    from circuits.interp.metric import metric_node

    # The baseline: the hand-written jax.jit GPT-2 (weights as arguments), the same metric's value
    # and gradient with respect to the embeddings; and the library's own compiled one.
    jw = {k: jnp.asarray(v) for k, v in weights_dict.items()}
    toks, jm = jnp.asarray(clean), jnp.asarray(weights)

    def metric(x, w, t, m):
        return jnp.sum(logits(w, t, cfg["n_layer"], cfg["n_head"], embeds=x) * m)

    fb = jax.jit(jax.value_and_grad(metric))
    x0 = jw["transformer.wte.weight"][toks] + jw["transformer.wpe.weight"][: len(clean)]
    target, embeds = metric_node(c, weights), c.get_unique("embeds")
    fns = {
        "hand": lambda: fb(x0, jw, toks, jm)[1].block_until_ready(),
        "lib": lambda: value_and_grad(target, embeds, mode="jit"),
        "eap": lambda: discover(c, src, weights, method="eap", mode="jit"),
    }
    if "--no-ig" not in sys.argv:
        fns["ig"] = lambda: discover(c, src, weights, method="eap-ig-mask", steps=10, mode="jit")
    if "--eap-ig" in sys.argv:
        fns["hanna"] = lambda: discover(c, src, weights, method="eap-ig", steps=10, mode="jit")
    # A first call as a user makes it (mode 'auto': op by op, through the kernels every evaluation
    # shares), before anything compiled the programs whole; then the compiled programs' first
    # calls and their warm medians (mode 'jit': what 'auto' runs once its background compile is done).
    eager = {}
    for k, method in (("eap", "eap"), ("ig", "eap-ig-mask"), ("hanna", "eap-ig")):
        if k in fns:
            t0 = time.perf_counter()
            discover(c, src, weights, method=method, steps=10, mode="auto")
            eager[k] = time.perf_counter() - t0
    cold = {}
    for k, fn in fns.items():
        t0 = time.perf_counter()
        fn()
        cold[k] = time.perf_counter() - t0
    t = _interleaved(fns, runs)
    r = discover(c, src, weights, method="eap")
    assert np.isfinite(r.scores).all()
    hand = t["hand"]
    rows = [
        (f"model: d {cfg['n_embd']}, {cfg['n_layer']} layers, {cfg['n_head']} heads, 32 tokens; edges", f"{n}"),
        ("one forward+backward, hand-written jax.jit (warm)", f"{hand * 1e3:9.1f} ms"),
        ("one forward+backward, the library's compiled value_and_grad", f"{t['lib'] * 1e3:9.1f} ms"),
        ("discover eap, first call, op by op ('auto')", f"{eager['eap']:9.2f} s"),
        ("discover eap, the compiled program's first call (compiles)", f"{cold['eap']:9.2f} s"),
        ("discover eap (warm, end to end)", f"{t['eap'] * 1e3:9.1f} ms"),
        ("  ratio to the hand-written forward+backward (target <= 2)", f"{t['eap'] / hand:9.2f}"),
        ("  ratio to the library's forward+backward", f"{t['eap'] / t['lib']:9.2f}"),
    ]
    if "ig" in t:
        rows += [
            ("discover eap-ig-mask, 10 steps, first call, op by op ('auto')", f"{eager['ig']:9.2f} s"),
            ("discover eap-ig-mask, 10 steps, the compiled program's first call", f"{cold['ig']:9.2f} s"),
            ("discover eap-ig-mask, 10 steps (warm)", f"{t['ig'] * 1e3:9.1f} ms"),
            ("  ratio to the hand-written forward+backward (target <= 15)", f"{t['ig'] / hand:9.2f}"),
            ("  ratio to the library's forward+backward", f"{t['ig'] / t['lib']:9.2f}"),
        ]
    if "hanna" in t:
        rows += [
            ("discover eap-ig (Hanna et al.), 10 steps, first call, op by op ('auto')", f"{eager['hanna']:9.2f} s"),
            ("discover eap-ig (Hanna et al.), 10 steps, the compiled program's first call", f"{cold['hanna']:9.2f} s"),
            ("discover eap-ig (Hanna et al.), 10 steps (warm)", f"{t['hanna'] * 1e3:9.1f} ms"),
            ("  ratio to the hand-written forward+backward (no target)", f"{t['hanna'] / hand:9.2f}"),
        ]
    rows.append((f"(medians of {runs} interleaved runs)", ""))
    return rows


# ---------------------------------------------------------------------------- 2. induction model
def _heads(w, l, inputs, pos, mask):
    """Head outputs ``[H, s, d]`` from per-head, per-role residual inputs ``[H, 3, s, d]``."""
    h = _ln(inputs, w[f"a{l}.ln.w.scale"], w[f"a{l}.ln.w.bias"])
    q = jnp.einsum("hsd,hcd->hsc", h[:, 0] + pos, w[f"a{l}.w.q"])
    k = jnp.einsum("hsd,hcd->hsc", h[:, 1] + pos, w[f"a{l}.w.k"])
    v = jnp.einsum("hsd,hcd->hsc", h[:, 2], w[f"a{l}.w.v"])
    scores = jnp.einsum("hqc,hkc->hqk", q, k) * jax.lax.rsqrt(jnp.float32(q.shape[-1]))
    probs = jax.nn.softmax(scores * mask - 10000.0 * (1 - mask), -1)
    return jnp.einsum("hqk,hkc,hdc->hqd", probs, v, w[f"a{l}.w.o"])


def edge_masked_metric(w, tokens, corrupt_sources, edge_mask, metric):
    """The hand-written model with every edge's term ``sender + m * (corrupted sender - sender)``
    (edges in ``edges(circuit)``'s order: per reader, per source)."""
    x, pos, mask = _embed(w, tokens)
    sources = [x]
    at = 0
    n_heads = w["a0.w.q"].shape[0]
    for l in range(2):
        cur = jnp.stack(sources)
        delta = corrupt_sources[: len(sources)] - cur
        k = len(sources)
        m = edge_mask[at: at + n_heads * 3 * k].reshape(n_heads, 3, k)
        at += n_heads * 3 * k
        inputs = cur.sum(0) + jnp.einsum("hrn,nsd->hrsd", m, delta)
        sources += list(_heads(w, l, inputs, pos, mask))
    cur = jnp.stack(sources)
    final = cur.sum(0) + jnp.einsum("n,nsd->sd", edge_mask[at: at + len(sources)], corrupt_sources - cur)
    lp = jax.nn.log_softmax(_unembed(w, final), -1)
    loss = -jnp.take_along_axis(lp, tokens[1:-1][:, None], axis=1)[:, 0]
    return jnp.sum(loss * metric)


def induction_exact():
    w = induction_weights()
    clean = induction_tokens(1, seed=0)[0]
    corrupt = clean.copy()
    corrupt[1:17] = np.random.default_rng(1).integers(1, 64, 16)
    loss = attn_only(w, clean, unique_names=True)
    metric = np.zeros(loss.shape, np.float32)
    metric[REPEATED_HALF] = 1 / 15
    src = {"toks_int_var": corrupt}
    n = len(edges(loss))
    jw = {k: jnp.asarray(v) for k, v in w.items()}
    # the corrupted senders, once (a plain run on the corrupted tokens)
    x, pos, mask = _embed(jw, jnp.asarray(corrupt))
    outs = [x]
    for l in range(2):
        inputs = jnp.broadcast_to(sum(outs), (4, 3) + x.shape)
        outs += list(_heads(jw, l, inputs, pos, mask))
    corrupt_sources = jnp.stack(outs)
    f = jax.jit(edge_masked_metric)
    toks, jm = jnp.asarray(clean), jnp.asarray(metric)
    eye = np.eye(n, dtype=np.float32)

    def loop():
        base = f(jw, toks, corrupt_sources, jnp.zeros(n, jnp.float32), jm)
        return np.array([float(f(jw, toks, corrupt_sources, jnp.asarray(eye[i]), jm) - base) for i in range(n)])

    loop()  # compiled
    t0 = time.perf_counter()
    r = discover(loss, src, metric, method="exact")
    t_cold = time.perf_counter() - t0
    t = _interleaved({"loop": loop, "exact": lambda: discover(loss, src, metric, method="exact")}, 15)
    t_loop, t_exact = t["loop"], t["exact"]
    np.testing.assert_allclose(r.scores, loop(), rtol=2e-3, atol=2e-3)
    t0 = time.perf_counter()
    acdc = discover(loss, src, metric, method="acdc", tau=0.02)
    t_acdc_cold = time.perf_counter() - t0
    t_acdc = _timed(lambda: discover(loss, src, metric, method="acdc", tau=0.02), runs=1)
    return [
        (f"induction model, {n} edges: hand-written jit loop of per-edge forwards (warm)", f"{t_loop * 1e3:9.1f} ms"),
        ("discover exact, first call (builds, compiles)", f"{t_cold:9.2f} s"),
        ("discover exact (warm)", f"{t_exact * 1e3:9.1f} ms"),
        ("  ratio (target <= 0.3; medians of 15 interleaved runs)", f"{t_exact / t_loop:9.3f}"),
        (f"discover acdc (tau 0.02, kept {len(acdc.found.edges)} edges), first call", f"{t_acdc_cold:9.2f} s"),
        ("discover acdc (warm)", f"{t_acdc:9.2f} s"),
    ]


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    print(f"jax backend: {jax.default_backend()}, devices: {jax.devices()}")
    if "--gpt2-only" not in argv:
        report("Shipped induction model: exact and ACDC", induction_exact())
    if "--induction-only" in argv:
        return
    report("GPT-2 width: EAP and EAP-IG-mask vs one forward+backward", gpt2_eap("--small" in argv))


if __name__ == "__main__":
    main()
