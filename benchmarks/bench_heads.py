"""Cost grows with the model: the seed's architecture at GPT-2-small width (heads of 64, d 768,
512 positions, vocabulary 50259, random weights) at 2, 6, 12 and 24 layers, the loss through
``circuits.compile`` vs a hand-written heads-batched ``jax.jit`` in the same process.

Two figures per size: the first call (trace + XLA compile + one run) and the steady-state median
of interleaved runs, each as a ratio to the hand-written model.  ``circuits.compile`` batches the
per-head einsums of each layer (``circuits.backend.head_batching``) unless ``batch_heads=False``;
the head-by-head row shows what it was before.

Run: ``.venv/bin/python -m benchmarks.bench_heads [layers ...]`` (default 2 6 12 24).  Targets
(issue 12): steady state ≤ 1.05, first call ≤ 1.5 at 12 layers.
"""

from __future__ import annotations

import sys
import time

import jax
import numpy as np

import circuits as C
from circuits.backend import clear_cache
from circuits.models import attn_only, random_weights

from .common import agreement_tolerance, interleaved_medians, report
from .handwritten_attn_only import loss_naive


def _first_call(fn):
    t = time.perf_counter()
    out = fn()
    if hasattr(out, "block_until_ready"):
        out.block_until_ready()
    return time.perf_counter() - t, out


def one_size(n_layers: int, runs: int = 5, positions: int = 512, head_by_head: bool = True):
    w = random_weights(0, d_model=768, n_heads=12, head_size=64, n_layers=n_layers, max_positions=positions)
    toks = np.random.default_rng(0).integers(0, 50259, positions + 2)
    circuit = attn_only(w, toks)
    wj = {k: jax.device_put(v) for k, v in w.items()}
    tj = jax.device_put(toks.astype(np.int32))
    clear_cache()
    hand = jax.jit(lambda w, t: loss_naive(w, t, n_layers))
    t_hand, ref = _first_call(lambda: hand(wj, tj))
    compiled = C.compile(circuit)
    t_circ, got = _first_call(compiled)
    np.testing.assert_allclose(got, np.asarray(ref), rtol=agreement_tolerance(), atol=1e-3)
    fns = {"circuit": compiled, "hand": lambda: hand(wj, tj).block_until_ready()}
    out = {"first_circuit": t_circ, "first_hand": t_hand}
    if head_by_head:
        per_head = C.compile(circuit, batch_heads=False)
        t_ph, got_ph = _first_call(per_head)
        np.testing.assert_allclose(got_ph, np.asarray(ref), rtol=agreement_tolerance(), atol=1e-3)
        fns["per_head"] = per_head
        out["first_per_head"] = t_ph
    out.update(interleaved_medians(fns, runs=runs, warmup=1))
    return out


def main(layers=(2, 6, 12, 24), runs: int = 5):
    rows = []
    for n in layers:
        r = one_size(n, runs)
        rows.append((f"{n:2d} layers: steady circuit / hand",
                     f"{r['circuit'] * 1e3:8.1f} ms / {r['hand'] * 1e3:8.1f} ms = {r['circuit'] / r['hand']:.3f}"
                     + (f"   (head by head {r['per_head'] / r['hand']:.3f})" if "per_head" in r else "")))
        rows.append((f"{n:2d} layers: first call circuit / hand",
                     f"{r['first_circuit']:8.2f} s  / {r['first_hand']:8.2f} s  = "
                     f"{r['first_circuit'] / r['first_hand']:.3f}"
                     + (f"   (head by head {r['first_per_head'] / r['first_hand']:.3f})" if "per_head" in r else "")))
        print(rows[-2][1], "|", rows[-1][1], flush=True)
    report(f"seed architecture at GPT-2-small width, {jax.devices()[0].platform}", rows)


if __name__ == "__main__":
    main(tuple(int(a) for a in sys.argv[1:]) or (2, 6, 12, 24))
