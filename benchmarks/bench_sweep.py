"""Sweeps of interventions on the seed model (random weights, the seed's sizes, 300 positions) vs
doing them one at a time (issue 9).  Run: ``.venv/bin/python -m benchmarks.bench_sweep``.

1. The 16 single-head zero-ablations in one ``interp.sweep`` (building the variants and the first
   call, compilation included) vs one ``C.evaluate(circuit.update(...))`` per head, each from an
   empty compile cache.  Target: ratio ≤ 0.3.
2. Exact path patching of every layer-0 head into every layer-1 head's query, key and value and
   of every head into the logits (8*8*3 + 16 = 208 patches) in one sweep vs a hand-written
   ``jax.jit`` function whose patch is an argument (``handwritten_patching.path_patched_loss``,
   the corrupted head outputs computed once), called once per patch; compilation included on
   both sides.  Target: ratio ≤ 0.75.

The path-patch variants are built with plain node operations (``benchmarks.variants``).
"""

from __future__ import annotations

import sys
import time

import jax
import numpy as np

import circuits as C
from circuits.backend import clear_cache
from circuits.interp import sweep
from circuits.models import attn_only, random_weights

from .common import agreement_tolerance, report
from .handwritten_patching import head_outputs, path_patched_loss

N_HEADS = 8


def _zero(node):
    return C.Array(np.zeros(node.shape, np.float32), name=node.name)


def ablations(w, toks):
    circuit = attn_only(w, toks)
    heads = [f"b{l}.a.head{h}" for l in range(2) for h in range(N_HEADS)]
    clear_cache()
    t = time.perf_counter()
    one_by_one = {name: C.evaluate(circuit.update(name, _zero)) for name in heads}
    t_one = time.perf_counter() - t
    clear_cache()
    t = time.perf_counter()
    result = sweep(circuit, {name: circuit.update(name, _zero) for name in heads}, progress=False)
    t_sweep = time.perf_counter() - t
    for name in heads:
        np.testing.assert_allclose(result[name], one_by_one[name], rtol=1e-5, atol=1e-5)
    return [
        ("16 zero-ablations, one evaluate(update(...)) each", f"{t_one:8.2f} s"),
        (f"16 zero-ablations, one sweep ({result.info['programs']} program(s))", f"{t_sweep:8.2f} s"),
        ("ratio (target <= 0.3)", f"{t_sweep / t_one:8.3f}"),
    ]


def _one_hot(n, i):
    v = np.zeros(n, np.float32)
    if i is not None:
        v[i] = 1.0
    return v


def _patch_arguments():
    """name -> (sender [8], receiver [3, 8], direct [2, 8]) for the 208 patches."""
    out = {}
    for s in range(N_HEADS):
        for r in range(N_HEADS):
            for k, role in enumerate("qkv"):
                receiver = np.zeros((3, N_HEADS), np.float32)
                receiver[k, r] = 1.0
                out[f"b0.a.head{s}->b1.a.head{r}.{role}"] = (_one_hot(N_HEADS, s), receiver,
                                                           np.zeros((2, N_HEADS), np.float32))
    for l in range(2):
        for s in range(N_HEADS):
            direct = np.zeros((2, N_HEADS), np.float32)
            direct[l, s] = 1.0
            out[f"b{l}.a.head{s}->logits"] = (_one_hot(N_HEADS, None), np.zeros((3, N_HEADS), np.float32), direct)
    return out


def path_patching(w, toks, corrupted, optimize=("auto", False)):
    from .variants import path_patch_variants

    wj = {k: jax.device_put(v) for k, v in w.items()}
    tj, cj = (jax.device_put(np.asarray(t, np.int32)) for t in (toks, corrupted))
    patches = _patch_arguments()
    t = time.perf_counter()
    corr_heads = jax.jit(head_outputs)(wj, cj)
    hand = jax.jit(path_patched_loss)
    by_hand = {name: np.asarray(hand(wj, tj, corr_heads, *args)) for name, args in patches.items()}
    t_hand = time.perf_counter() - t

    clean, corr = attn_only(w, toks), attn_only(w, corrupted)
    rows = [("208 path patches, hand-written jit with a patch argument", f"{t_hand:8.2f} s")]
    for opt in optimize:
        clear_cache()
        t = time.perf_counter()
        result = sweep(clean, path_patch_variants(clean, corr, N_HEADS), progress=False, optimize=opt)
        t_sweep = time.perf_counter() - t
        assert set(result) == set(by_hand) and len(result) == 208
        for name in result:
            np.testing.assert_allclose(result[name], by_hand[name], rtol=agreement_tolerance(), atol=1e-4,
                                       err_msg=name)
        rows += [
            (f"208 path patches, one sweep, optimize={opt!r} ({result.info['programs']} programs, "
             f"{result.info['optimized']} optimized, {result.info['chunks']} chunks)", f"{t_sweep:8.2f} s"),
            ("ratio (target <= 0.75)", f"{t_sweep / t_hand:8.3f}"),
        ]
    return rows


def main(which=("ablations", "paths")):
    w = random_weights(0)
    rng = np.random.default_rng(0)
    toks = rng.integers(0, 50259, 302)
    corrupted = rng.integers(0, 50259, 302)
    C.evaluate(C.GeneralFunction("exp", C.Scalar(0.0)))  # start JAX outside the timings
    rows = []
    if "ablations" in which:
        rows += ablations(w, toks)
    if "paths" in which:
        rows += path_patching(w, toks, corrupted)
    if "paths-optimized" in which:
        rows += path_patching(w, toks, corrupted, optimize=(True,))
    report(f"sweeps of interventions on the seed model, {jax.devices()[0].platform}", rows)


if __name__ == "__main__":
    main(tuple(sys.argv[1:]) or ("ablations", "paths"))
