"""`make demo`: build the seed's two-layer attention-only model with random weights, evaluate its
per-token loss on the CPU and show what the library sees.

Run: ``python examples/demo.py``.
"""

from __future__ import annotations

import time

import numpy as np


def _median_ms(f, runs: int = 5):
    """The last value of ``f()`` and the median time of ``runs`` calls, in ms."""
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        value = f()
        times.append(time.perf_counter() - t)
    return value, float(np.median(times)) * 1e3


def main() -> None:
    t0 = time.perf_counter()
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
    loss, eval_ms = _median_ms(f)
    print(f"\nloss per token: mean {loss.mean():.4f}, min {loss.min():.4f}, max {loss.max():.4f}, "
          f"finite: {bool(np.isfinite(loss).all())} (uniform guess: {np.log(weights['t.w.unembed'].shape[0]):.4f})")
    print(f"evaluation: first call (trace + XLA compile) {first_s:.2f} s, "
          f"then median {eval_ms:.1f} ms per sequence of {len(loss)} positions")

    import rewrites

    t = time.perf_counter()
    fast = rewrites.optimize(circuit)
    opt_s = time.perf_counter() - t
    g = C.compile(fast)
    g()
    fast_loss, fast_ms = _median_ms(g)
    print(f"rewrites.optimize ({opt_s * 1e3:.0f} ms): median {fast_ms:.1f} ms, "
          f"max |difference| {np.max(np.abs(fast_loss - loss)):.2e}")
    print(f"\ntotal {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
