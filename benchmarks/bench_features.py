"""Attribution graph of a 32-token prompt on the induction model with an SAE at every layer
(``circuits.interp.attribution_graph``, the shipped SAEs on 'b0' and 'b1'), against computing
each edge by its own ablation in the same frozen circuit.

Baseline: the frozen circuit as one jitted JAX function of its leaves (compiled once, outside
the timing); an edge = one call with the source's leaf entry set to 0, minus the clean readout.
Timing every edge that way takes minutes, so the benchmark times a random sample of 200 edges and
extrapolates to the graph's nonzero edges (the number it reports).  The graph's time includes
everything it does on each call: the clean forward pass, freezing, tracing and compiling the
batched transpose, all rows, pruning.

    python -m benchmarks.bench_features
"""

from __future__ import annotations

import time

import numpy as np

from benchmarks.common import median_time, report


def main() -> None:
    import jax
    import jax.numpy as jnp

    from circuits.interp import attribution_graph, induction_saes
    from circuits.interp.attribution_graph import _jax_function
    from circuits.models import attn_only, induction_tokens, induction_weights

    w = induction_weights()
    toks = induction_tokens(1, seed=0)[0]
    logits = attn_only(w, toks, logits=True, unique_names=True)
    saes = induction_saes()
    run = lambda: attribution_graph(logits, saes, dtype="float32")  # noqa: E731
    graph_time = median_time(run, runs=3, warmup=1)
    g = run()

    frozen = g.frozen
    names = list(frozen["leaves"])
    f, leaf_values = _jax_function(frozen["targets"], list(frozen["leaves"].values()), frozen["values"], "float32")
    fj = jax.jit(f)
    clean = [jnp.asarray(v) for v in leaf_values]
    jax.block_until_ready(fj(*clean))
    sites = frozen["sites"]
    nonzero = np.argwhere(g.adjacency != 0)
    rng = np.random.default_rng(0)
    sample = nonzero[rng.choice(len(nonzero), 200, replace=False)]

    def leaf_of(node):
        if node["kind"] == "feature":
            return names.index(f"{node['site']}.sae.acts"), (node["pos"], node["feature"])
        if node["kind"] == "error":
            return names.index(f"{node['site']}.sae.error"), (node["pos"],)
        return len(names) - 1, (node["pos"],)

    def readout(outs, node):
        if node["kind"] == "feature":
            return outs[sites.index(node["site"])][node["pos"], node["feature"]]
        row = outs[-1][frozen["position"]]
        return row[node["token"]] - row.mean()

    base = fj(*clean)
    worst = 0.0
    t0 = time.perf_counter()
    for t, s in sample:
        target, source = g.nodes[t], g.nodes[s]
        i, where = leaf_of(source)
        vals = list(clean)
        vals[i] = vals[i].at[where].set(0.0)
        outs = fj(*vals)
        edge = float(readout(base, target) - readout(outs, target))
        worst = max(worst, abs(edge - g.adjacency[t, s]) / max(1.0, abs(g.adjacency[t, s])))
    per_edge = (time.perf_counter() - t0) / len(sample)
    baseline = per_edge * len(nonzero)
    report("attribution graph, induction model, 32 tokens, SAEs (256 latents, k=8) on b0 and b1", [
        ("nodes / nonzero edges", f"{len(g.nodes)} / {len(nonzero)}"),
        ("graph (all edges, pruned)", f"{graph_time:.2f} s"),
        ("one edge by ablation (jitted frozen circuit)", f"{per_edge * 1e3:.2f} ms (mean over 200 sampled edges)"),
        ("every nonzero edge by ablation (extrapolated)", f"{baseline:.1f} s"),
        ("ratio graph / ablation", f"{graph_time / baseline:.4f}"),
        ("largest relative edge difference (sampled)", f"{worst:.1e}"),
    ])


if __name__ == "__main__":
    main()
