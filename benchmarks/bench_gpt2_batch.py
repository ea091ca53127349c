"""GPT-2 small's loss over a dataset of short sequences (random weights, 64 rows of 32 tokens):
``evaluate_batched`` against the best hand-written batch, and ``scrub`` called with one seed after
another on the same data, in one process.

Run: ``.venv/bin/python -m benchmarks.bench_gpt2_batch [--rows 64] [--tokens 32] [--runs 3]``.

- *Batch*: ``evaluate_batched(circuit, {'tokens': rows})`` as a user calls it (device tokens in,
  result left on the device), its chunk size measured by its first calls (``batch_tuning``), against
  the hand-written loss (``benchmarks.handwritten_gpt2``: heads batched, the logits' ``logsumexp``
  minus the true token's logit) as ``jax.vmap`` and as ``lax.map`` over groups of 2, 4, 8 and 16
  rows, the fastest of them.  ``groups of 2`` is the same ``evaluate_batched`` with its map form's
  group held at two rows, as it was before groups were sized by the rows' matmuls (issue 24's rule).
- *Scrub*: ``scrub`` of a one-claim hypothesis (``h3.attn`` reads the first two tokens) with
  ``samples`` equal to the rows, seeds 0, 1, 2, ...: each call's time and its XLA compilations (a
  new seed should compile nothing), beside the hand-written forward of the three runs' samples
  (``3 x samples`` rows through the best hand-written batch: what the three runs cost without
  reusing rows).
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

import circuits as C
from circuits.backend import batched
from circuits.interp import Claim, Feature, scrub
from circuits.models.common import tokens_symbol
from circuits.models.gpt2 import gpt2, random_gpt2_weights

from .common import CompileClock, interleaved_medians, report
from .handwritten_gpt2 import logits

CONFIG = dict(model_type="gpt2", n_layer=12, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024,
              layer_norm_epsilon=1e-5, activation_function="gelu_new")
GROUPS = (2, 4, 8, 16)


def hand_loss(w, tokens):
    lg = logits(w, tokens, n_layer=CONFIG["n_layer"], n_head=CONFIG["n_head"], eps=CONFIG["layer_norm_epsilon"])[:-1]
    return jax.nn.logsumexp(lg, -1) - jnp.take_along_axis(lg, tokens[1:, None], -1)[:, 0]


def hand_batches() -> dict:
    fns = {"vmap": jax.jit(jax.vmap(hand_loss, in_axes=(None, 0)))}
    for g in GROUPS:
        fns[f"lax.map, {g} rows a group"] = jax.jit(functools.partial(
            lambda g, w, t: jax.lax.map(lambda r: hand_loss(w, r), t, batch_size=g), g))
    return fns


def main(rows: int = 64, n_tokens: int = 32, runs: int = 3, seeds: int = 5):
    weights = random_gpt2_weights(CONFIG)
    data = np.random.default_rng(0).integers(0, CONFIG["vocab_size"], (rows, n_tokens))
    circuit = gpt2(CONFIG, weights, tokens_symbol(n_tokens), loss=True)
    wj = {k: jax.device_put(v) for k, v in weights.items() if not k.endswith((".attn.bias", ".attn.masked_bias"))}
    dj = jax.device_put(data.astype(np.int32))
    hands = hand_batches()
    want = np.asarray(hands["vmap"](wj, dj))

    def ours(group_max=None):
        saved = batched.MAP_GROUP_MAX
        if group_max is not None:
            batched.MAP_GROUP_MAX = group_max
        try:
            return C.evaluate_batched(circuit, {"tokens": dj}, return_jax=True)
        finally:
            batched.MAP_GROUP_MAX = saved

    fns = {"ours": ours, "ours, groups of 2": functools.partial(ours, 2)}
    fns.update({f"hand {k}": functools.partial(lambda f: f(wj, dj), f) for k, f in hands.items()})
    clock = CompileClock()
    firsts = {}
    for k, f in fns.items():  # the chunk tuning measures over its first calls
        before, t = clock.read(), time.perf_counter()
        got = np.asarray(f())
        firsts[k] = (time.perf_counter() - t, clock.since(before))
        assert np.abs(got - want).max() <= 1e-3, (k, np.abs(got - want).max())
        for _ in range(3 if k.startswith("ours") else 0):
            f()
    t = interleaved_medians(fns, runs=runs, warmup=1, block=jax.block_until_ready)
    hand_best = min((k for k in t if k.startswith("hand")), key=t.get)
    rows_out = [(f"{k} (first call {firsts[k][0]:.1f} s: {firsts[k][1]})" if k.startswith("ours") else k,
                 f"{t[k] * 1e3 / rows:8.1f} ms a row") for k in fns]
    rows_out += [(f"ratio ours / best hand-written ({hand_best})", f"{t['ours'] / t[hand_best]:8.3f}"),
                 ("ratio ours, groups of 2 / best hand-written", f"{t['ours, groups of 2'] / t[hand_best]:8.3f}")]
    report(f"GPT-2 small loss, {rows} rows of {n_tokens} tokens, {jax.devices()[0].platform}, "
           f"medians of {runs} interleaved runs", rows_out)

    hyp = Claim("loss", children=[Claim("h3.attn", feature=Feature.tokens([0, 1]))])
    three = jax.device_put(np.concatenate([data] * 3).astype(np.int32))
    best = hands[hand_best.removeprefix("hand ")]
    best(wj, three).block_until_ready()
    hand_three = interleaved_medians({"h": lambda: best(wj, three)}, runs=runs, warmup=0,
                                     block=jax.block_until_ready)["h"]
    lines, later = [], []
    for seed in range(seeds):
        before, t0 = clock.read(), time.perf_counter()
        r = scrub(circuit, hyp, {"tokens": data}, samples=rows, seed=seed)
        took = time.perf_counter() - t0
        later += [took] if seed else []
        lines.append((f"scrub, seed {seed} ({clock.since(before)})", f"{took:8.2f} s"))
    lines.append((f"hand-written forward of the three runs' {3 * rows} rows ({hand_best})", f"{hand_three:8.2f} s"))
    if later:
        lines.append(("ratio scrub, a new seed (median) / hand-written forward of the three runs",
                      f"{statistics.median(later) / hand_three:8.3f}"))
    report(f"scrub on GPT-2 small, {rows} samples of {n_tokens} tokens, seed after seed "
           f"(recovered {r.recovered:.2f})", lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seeds", type=int, default=5)
    args = parser.parse_args()
    main(rows=args.rows, n_tokens=args.tokens, runs=args.runs, seeds=args.seeds)
