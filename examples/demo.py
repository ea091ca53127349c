"""`make demo`: find the induction circuit of the shipped trained model, then build the seed's
two-layer attention-only model with random weights and show what the library sees.

The induction analysis (``induction_analysis``) loads ``circuits.models.induction_weights()``,
measures the repeated half's loss on ``[BOS, A, A]`` sequences, finds the previous-token head
and the induction heads by their attention, zero-ablates every head, path-patches the
previous-token head into layer 1's queries, keys and values (and directly into the logits),
and causally scrubs the induction hypothesis; it prints one headline table.

Run: ``python examples/demo.py``.
"""

from __future__ import annotations

import time

import numpy as np


def _medians_ms(*fs, runs: int = 5):
    """Each ``f``'s last value and median time over ``runs`` calls, in ms, the calls interleaved
    (one of each per round) so that a busy machine slows them alike."""
    times = [[] for _ in fs]
    values = [None] * len(fs)
    for _ in range(runs):
        for i, f in enumerate(fs):
            t = time.perf_counter()
            values[i] = f()
            times[i].append(time.perf_counter() - t)
    return values, [float(np.median(ts)) * 1e3 for ts in times]


def induction_analysis(n: int = 200, seed: int = 1, samples: int = 500) -> dict:
    """The headline figures of the shipped induction model (see the module docstring)."""
    import circuits as C
    from circuits import interp
    from circuits.interp.induction import induction_hypothesis
    from circuits.models import attn_only, induction_tokens, induction_weights, tokens_symbol
    from circuits.models.induction import FIRST_HALF, REPEATED_HALF
    from circuits.select import Regex

    out: dict = {"timings": {}}
    t = time.perf_counter()
    w = induction_weights()
    toks = induction_tokens(n, seed=seed)[:, :33]  # [BOS, A, A]: 33 tokens, 32 losses (TransformerLens's reading)
    circuit = attn_only(w, tokens_symbol(toks.shape[1]), unique_names=True, layout="next_token")
    data = {"toks_int_var": toks}
    rep = lambda loss: float(np.asarray(loss)[:, REPEATED_HALF].mean())  # noqa: E731
    loss = C.evaluate_batched(circuit, data)
    out["first_half"], out["repeated_half"] = float(loss[:, FIRST_HALF].mean()), rep(loss)
    prev, ind = interp.head_scores(circuit, toks)
    out["prev_head"] = prev_head = int(np.argmax(prev[0]))  # [layer, head] scores: layer 0's previous-token head
    out["prev_scores"], out["induction_scores"] = prev[0].tolist(), ind[1].tolist()
    out["induction_heads"] = heads = [h for h in range(4) if ind[1, h] > 0.4]
    out["timings"]["load, evaluate, attention scores"] = time.perf_counter() - t

    t = time.perf_counter()
    out["ablation"] = {f"b{l}.a.head{h}": rep(C.evaluate_batched(interp.ablate(circuit, f"b{l}.a.head{h}"), data))
                       for l in range(2) for h in range(4)}
    out["timings"]["zero-ablate each of 8 heads"] = time.perf_counter() - t

    t = time.perf_counter()
    corrupt = C.Symbol(circuit.get_unique("toks_int_var").shape, name="corrupt_toks", dtype="int64")
    feed = {**data, "corrupt_toks": induction_tokens(n, seed=seed + 1000)[:, :33]}
    sender = f"b0.a.head{prev_head}"
    out["path_patch"] = {
        role: rep(C.evaluate_batched(interp.path_patch(
            circuit, sender, [f"b1.a.head{h}.a.{role}" for h in range(4)], {"toks_int_var": corrupt}), feed))
        for role in "qkv"
    }
    out["path_patch"]["logits (direct)"] = rep(C.evaluate_batched(interp.path_patch(
        circuit, sender, "t.call", {"toks_int_var": corrupt}, freeze=Regex(r"^b1\.a\.head\d$")), feed))
    out["timings"]["path-patch the previous-token head (q, k, v, direct)"] = time.perf_counter() - t

    t = time.perf_counter()
    seed_names = attn_only(w, tokens_symbol(toks.shape[1]), layout="next_token")  # the hypothesis is written in the seed's names
    out["scrub"] = interp.scrub(seed_names, induction_hypothesis(prev_head, heads), data, samples=samples,
                                labels="true_toks_int", score=lambda v: np.asarray(v)[:, REPEATED_HALF].mean(axis=1),
                                seed=0)
    out["timings"][f"causal scrubbing ({samples} samples)"] = time.perf_counter() - t
    return out


def print_induction(out: dict) -> None:
    print("induction analysis of the shipped model (circuits.models.induction_weights())")
    print(f"  loss on [BOS, A, A]: first half {out['first_half']:.3f} (ln 63 = {np.log(63):.3f}), "
          f"repeated half {out['repeated_half']:.3f}")
    print(f"  previous-token head: b0.a.head{out['prev_head']} "
          f"(attention to the previous token {out['prev_scores'][out['prev_head']]:.2f}; other layer-0 heads "
          + ", ".join(f"{s:.2f}" for h, s in enumerate(out['prev_scores']) if h != out['prev_head']) + ")")
    print("  induction heads: " + ", ".join(f"b1.a.head{h} ({out['induction_scores'][h]:.2f})"
                                           for h in out["induction_heads"]))
    print("\n  repeated-half loss when ...")
    for name, v in out["ablation"].items():
        print(f"    {name} is zero-ablated{'':14s}{v:7.3f}")
    for role, v in out["path_patch"].items():
        target = f"layer-1 {role}" if len(role) == 1 else role
        print(f"    b0.a.head{out['prev_head']} -> {target:17s} is path-patched {v:7.3f}")
    s = out["scrub"]
    print(f"\n  causal scrubbing of the induction hypothesis: original {s.original:.3f}, scrubbed {s.scrubbed:.3f}, "
          f"fully scrubbed {s.random:.3f}: {100 * s.recovered:.0f}% of the loss reduction recovered")
    print("\n  " + "; ".join(f"{k} {v:.1f} s" for k, v in out["timings"].items()))


def main() -> None:
    t0 = time.perf_counter()
    print_induction(induction_analysis())
    print()
    import circuits as C
    from circuits.models import attn_only, random_weights

    print(f"circuits demo — JAX on {__import__('jax').devices()[0].platform.upper()}")
    weights = random_weights(seed=0)
    tokens = np.random.default_rng(0).integers(0, weights["t.w.tok_embeds"].shape[0], 302)
    t = time.perf_counter()
    circuit = attn_only(weights, tokens)
    build_s = time.perf_counter() - t
    n_params = sum(int(np.prod(v.shape)) for v in weights.values())
    print(f"built the seed model ('{circuit.name}', shape {list(circuit.shape)}): "
          f"{C.count_nodes(circuit)} distinct nodes, {n_params / 1e6:.1f}M parameters, {build_s * 1e3:.1f} ms")

    text = circuit.to_text()
    print(f"\nits text form has {text.count(chr(10)) + 1} lines; the first ten:")
    print("\n".join("  " + line for line in text.splitlines()[:10]))

    f = C.compile(circuit)
    t = time.perf_counter()
    loss = f()
    first_s = time.perf_counter() - t
    loss = f()
    print(f"\nloss per token: mean {loss.mean():.4f}, min {loss.min():.4f}, max {loss.max():.4f}, "
          f"finite: {bool(np.isfinite(loss).all())} (uniform guess: {np.log(weights['t.w.unembed'].shape[0]):.4f})")
    import rewrites

    t = time.perf_counter()
    fast = rewrites.optimize(circuit)
    opt_s = time.perf_counter() - t
    g = C.compile(fast)
    g()
    (loss, fast_loss), (eval_ms, fast_ms) = _medians_ms(f, g)
    print(f"evaluation: first call (trace + XLA compile) {first_s:.2f} s, "
          f"then median {eval_ms:.1f} ms per sequence of {len(loss)} positions")
    print(f"rewrites.optimize ({opt_s * 1e3:.0f} ms): median {fast_ms:.1f} ms (interleaved with the above), "
          f"max |difference| {np.max(np.abs(fast_loss - loss)):.2e}")
    print(f"\ntotal {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
