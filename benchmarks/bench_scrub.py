"""Causal scrubbing with 1,000 samples on the induction model vs hand-written ``jax.jit`` forward passes.

Run: ``.venv/bin/python -m benchmarks.bench_scrub``.  Target (issue 10): ``scrub`` ≤ 1.5× the time
of evaluating the same 1,000 resampled inputs through one hand-written ``jax.jit`` forward pass.
Two baselines, in the same process: the plain model on the 1,000 reference rows (one forward
pass per sample), and the plain model on every resampled input batch the scrub reads (one
forward pass per sample and input slot, plus the original and fully scrubbed runs).  Uses the
shipped induction model when present, else random weights of its sizes.
"""

from __future__ import annotations

import jax
import numpy as np

import circuits.models as M
from circuits.interp import scrub
from circuits.interp.hypothesis import Claim
from circuits.interp.induction import induction_hypothesis
from circuits.interp.scrubbing import sample_slots
from circuits.interp.treeify import plan_slots

from .common import interleaved_medians, report
from .handwritten_attn_only import loss_naive

SAMPLES = 1000


def main(runs: int = 5):
    if hasattr(M, "induction_weights"):
        w, which = M.induction_weights(), "shipped induction model"
    else:
        w = M.random_weights(0, vocab=64, d_model=64, n_heads=4, head_size=16, max_positions=32)
        which = "random weights of the induction model's sizes"
    c = M.attn_only(w, M.tokens_symbol(34))
    rng = np.random.default_rng(0)
    a = np.stack([rng.permutation(np.arange(1, 64))[:16] for _ in range(2000)])
    z = np.zeros((2000, 1), np.int64)
    data = {"toks_int_var": np.concatenate([z, a, a, z], axis=1)}
    hyp = induction_hypothesis(2, [0, 1, 2, 3])
    plan = plan_slots(Claim(hyp.site, children=[*hyp.children, Claim("true_toks_int", name="labels")]))
    idx = sample_slots(plan, data, SAMPLES, 0)
    wj = {k: jax.device_put(v) for k, v in w.items()}
    hand = jax.jit(jax.vmap(loss_naive, in_axes=(None, 0)))
    ref = jax.device_put(data["toks_int_var"][idx[0]].astype(np.int32))
    every = jax.device_put(data["toks_int_var"][np.concatenate([idx.ravel(), idx[0]])].astype(np.int32))

    def run_scrub():
        return scrub(c, hyp, data, samples=SAMPLES, labels="true_toks_int", seed=0)

    t = interleaved_medians({
        "scrub": run_scrub,
        "hand_ref": lambda: hand(wj, ref).block_until_ready(),
        "hand_all": lambda: hand(wj, every).block_until_ready(),
    }, runs=runs, warmup=1)
    r = run_scrub()
    rows = [
        ("model", which),
        ("input slots of the scrubbed circuit", f"{r.n_slots} (+ original and fully scrubbed runs)"),
        (f"scrub, {SAMPLES} samples", f"{t['scrub'] * 1e3:8.1f} ms"),
        (f"hand-written jit forward, {SAMPLES} reference rows", f"{t['hand_ref'] * 1e3:8.1f} ms"),
        (f"hand-written jit forward, every resampled batch ({every.shape[0]} rows)", f"{t['hand_all'] * 1e3:8.1f} ms"),
        ("ratio vs reference rows (target ≤ 1.5)", f"{t['scrub'] / t['hand_ref']:8.2f}"),
        ("ratio vs every resampled batch", f"{t['scrub'] / t['hand_all']:8.2f}"),
    ]
    report(f"causal scrubbing, {jax.devices()[0].platform} ({jax.devices()[0].device_kind})", rows)


if __name__ == "__main__":
    main()
