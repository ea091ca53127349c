"""Seed model loss through circuits.compile vs a hand-written jax.jit of the same math (CPU).

Run: ``.venv/bin/python -m benchmarks.bench_seed_model``.  Target (issue 2): ratio ≤ 1.10 for one
sequence and for a batch of 32 sequences.  Two hand-written sides (issue 24): the naive math
(``log_softmax`` of the whole logit matrix, then gather) and the best a careful JAX user writes
(the true token's logit minus a logsumexp computed in 32 vocabulary chunks in a loop, ``loss_fused``; for the
batch the faster of ``vmap`` and ``lax.map`` of it); ``bench_throughput`` has the full set.
"""

from __future__ import annotations

import jax
import numpy as np

import circuits as C
from circuits.models import attn_only, random_weights, tokens_symbol

from .common import agreement_tolerance, interleaved_medians, report
from .handwritten_attn_only import loss_fused, loss_naive, loss_naive_per_head


def main(runs: int = 20, batch: int = 32):
    w = random_weights(0)
    rng = np.random.default_rng(0)
    toks = rng.integers(0, 50259, 302)
    circuit = attn_only(w, toks)
    compiled = C.compile(circuit)
    wj = {k: jax.device_put(v) for k, v in w.items()}
    hand = jax.jit(loss_naive)
    fused = jax.jit(lambda w, t: loss_fused(w, t, chunks=32, loop=True))
    tj = jax.device_put(toks.astype(np.int32))
    np.testing.assert_allclose(compiled(), np.asarray(hand(wj, tj)), rtol=agreement_tolerance(), atol=1e-4)
    np.testing.assert_allclose(compiled(), np.asarray(fused(wj, tj)), rtol=agreement_tolerance(), atol=1e-4)
    single = interleaved_medians(
        {"circuit": lambda: compiled(), "hand": lambda: hand(wj, tj).block_until_ready(),
         "fused": lambda: fused(wj, tj).block_until_ready()}, runs=runs
    )
    rows = [
        ("one sequence, circuits.compile", f"{single['circuit'] * 1e3:8.1f} ms"),
        ("one sequence, hand-written jit (naive)", f"{single['hand'] * 1e3:8.1f} ms"),
        ("one sequence, hand-written jit (logit - chunked logsumexp)", f"{single['fused'] * 1e3:8.1f} ms"),
        ("ratio vs naive", f"{single['circuit'] / single['hand']:8.3f}"),
        ("ratio vs best hand-written", f"{single['circuit'] / min(single['hand'], single['fused']):8.3f}"),
    ]

    batch_toks = rng.integers(0, 50259, (batch, 302))
    sym_circuit = attn_only(w, tokens_symbol(302))
    hand_b = jax.jit(jax.vmap(loss_naive, in_axes=(None, 0)))
    hand_ph = jax.jit(jax.vmap(loss_naive_per_head, in_axes=(None, 0)))
    hand_map = jax.jit(lambda w, t: jax.lax.map(lambda r: loss_fused(w, r, chunks=32, loop=True), t))
    tb = jax.device_put(batch_toks.astype(np.int32))
    def run_circuit_batch():
        return C.evaluate_batched(sym_circuit, {"toks_int_var": batch_toks})

    try:
        np.testing.assert_allclose(run_circuit_batch(), np.asarray(hand_b(wj, tb)), rtol=agreement_tolerance(), atol=1e-4)
        b = interleaved_medians(
            {"circuit": run_circuit_batch, "hand": lambda: hand_b(wj, tb).block_until_ready(),
             "per_head": lambda: hand_ph(wj, tb).block_until_ready(),
             "map": lambda: hand_map(wj, tb).block_until_ready()},
            runs=runs,
        )
        rows += [
            (f"batch of {batch}, circuits.evaluate_batched", f"{b['circuit'] * 1e3:8.1f} ms"),
            (f"batch of {batch}, hand-written vmap+jit (heads batched)", f"{b['hand'] * 1e3:8.1f} ms"),
            (f"batch of {batch}, hand-written vmap+jit (head by head)", f"{b['per_head'] * 1e3:8.1f} ms"),
            (f"batch of {batch}, hand-written lax.map of the fused loss", f"{b['map'] * 1e3:8.1f} ms"),
            ("ratio vs heads batched", f"{b['circuit'] / b['hand']:8.3f}"),
            ("ratio vs best hand-written", f"{b['circuit'] / min(b['hand'], b['map']):8.3f}"),
            ("ratio vs head by head (the circuit's own math)", f"{b['circuit'] / b['per_head']:8.3f}"),
        ]
    except TypeError as e:  # batched evaluation not available
        rows.append(("batch", f"skipped: {e}"))
    report(f"seed model loss, {jax.devices()[0].platform} ({jax.devices()[0].device_kind})", rows)


if __name__ == "__main__":
    main()
