"""Causal scrubbing with 1,000 samples on the induction model vs hand-written ``jax.jit`` forward passes.

Run: ``.venv/bin/python -m benchmarks.bench_scrub``.  Target (issue 10): ``scrub`` ≤ 1.5× the time
of evaluating the same 1,000 resampled inputs through one hand-written ``jax.jit`` forward pass.
Baselines, interleaved in the same process:

- ``hand_scrub`` (the target's baseline): the hand-written scrubbed forward of this hypothesis
  (``benchmarks.handwritten_scrub``: layer 0 on every resampled row each path reads, layer 1's
  q/k/v residuals assembled per path, the loss) on the very rows ``scrub`` drew;
- ``hand_ref``: the plain hand-written forward over the 1,000 reference rows (one forward pass
  per sample: what the original run alone costs).

``scrub`` also runs the original and the fully scrubbed model (three runs to the baseline's one),
and its time includes sampling, treeifying and the result's bootstrap.  ``scrub (no reuse)`` is
``reuse_rows=False``: every sample's subcircuits computed anew, as before row reuse.  Uses the
shipped induction model when present, else random weights of its sizes.
"""

from __future__ import annotations

import os

import jax
import numpy as np

import circuits.models as M
from circuits.interp import scrub
from circuits.interp.induction import induction_hypothesis

from .common import agreement_tolerance, interleaved_medians, report
from .handwritten_attn_only import loss_naive
from .handwritten_scrub import scrubbed_losses, slot_rows

SAMPLES = 1000
PREV, HEADS = 2, (0, 1, 2, 3)


def main(runs: int = 5, rows: int = 2000):
    if hasattr(M, "induction_weights"):
        w, which = M.induction_weights(), "shipped induction model"
    else:
        w = M.random_weights(0, vocab=64, d_model=64, n_heads=4, head_size=16, max_positions=32)
        which = "random weights of the induction model's sizes"
    c = M.attn_only(w, M.tokens_symbol(34))
    rng = np.random.default_rng(0)
    a = np.stack([rng.permutation(np.arange(1, 64))[:16] for _ in range(rows)])
    z = np.zeros((rows, 1), np.int64)
    data = {"toks_int_var": np.concatenate([z, a, a, z], axis=1)}
    hyp = induction_hypothesis(PREV, list(HEADS))

    def run_scrub(reuse=None):
        return scrub(c, hyp, data, samples=SAMPLES, labels="true_toks_int", seed=0, reuse_rows=reuse)

    r = run_scrub()
    wj = {k: jax.device_put(v) for k, v in w.items()}
    hand_ref_fn = jax.jit(jax.vmap(loss_naive, in_axes=(None, 0)))
    hand_scrub_fn = scrubbed_losses(PREV, HEADS)
    ref = jax.device_put(data["toks_int_var"][r.indices[0]].astype(np.int32))
    per_slot = jax.device_put(np.stack([data["toks_int_var"][x] for x in slot_rows(r, HEADS)], 1).astype(np.int32))
    # sanity: the baseline computes what scrub computes
    hand = np.asarray(hand_scrub_fn(wj, per_slot)).mean(axis=1)
    tol = agreement_tolerance()
    np.testing.assert_allclose(r.rows["scrubbed"], hand, rtol=tol, atol=tol)
    t = interleaved_medians({
        "scrub": run_scrub,
        "scrub_fresh": lambda: run_scrub(False),
        "hand_scrub": lambda: hand_scrub_fn(wj, per_slot).block_until_ready(),
        "hand_ref": lambda: hand_ref_fn(wj, ref).block_until_ready(),
    }, runs=runs, warmup=1)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    out = [
        ("model", which),
        ("dataset rows / samples", f"{rows} / {SAMPLES}"),
        ("input slots of the scrubbed circuit", f"{r.n_slots} (+ original and fully scrubbed runs)"),
        (f"scrub, {SAMPLES} samples", f"{t['scrub'] * 1e3:8.1f} ms"),
        (f"scrub, {SAMPLES} samples, reuse_rows=False", f"{t['scrub_fresh'] * 1e3:8.1f} ms"),
        ("hand-written jit scrubbed forward, same resampled rows", f"{t['hand_scrub'] * 1e3:8.1f} ms"),
        (f"hand-written jit plain forward, {SAMPLES} reference rows", f"{t['hand_ref'] * 1e3:8.1f} ms"),
        ("ratio vs hand-written scrubbed forward (target ≤ 1.5)", f"{t['scrub'] / t['hand_scrub']:8.2f}"),
        ("ratio vs plain forward over the reference rows", f"{t['scrub'] / t['hand_ref']:8.2f}"),
        ("ratio, reuse_rows=False vs hand-written scrubbed", f"{t['scrub_fresh'] / t['hand_scrub']:8.2f}"),
        ("load average (1 min) at the end", f"{load:.1f}"),
    ]
    report(f"causal scrubbing, {jax.devices()[0].platform} ({jax.devices()[0].device_kind})", out)


if __name__ == "__main__":
    main()
