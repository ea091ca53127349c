"""One prepared script for a session lent a GPU machine (see BENCHMARKS.md): checks that
evaluation on the accelerator agrees with the plain-numpy oracle, then runs the evaluation,
optimize, batched, head-batched and sharded benchmarks there, printing the card first.
``bench_throughput`` comes first: one sequence, a batch of 16 and ``optimize`` against the best
hand-written JAX (logit minus a fused logsumexp, heads batched; ``vmap`` / ``lax.map`` / chunked
``vmap`` for the batch) and the card's own square-matmul rate, its title naming the card; then
``bench_call_overhead``, the microseconds each call adds to the hand-written function's.  Runs on
the CPU too (the same checks), which is how it is tested (``tests/test_device_check.py``).

    python -m benchmarks.device_check                     # checks + benchmarks (< 5 minutes on a GPU)
    python -m benchmarks.device_check --quick             # checks only
    python -m benchmarks.device_check --heads 2 12        # the head-batching benchmark's sizes (layers)
    python -m benchmarks.device_check --small --heads 1   # everything on small models (a smoke test)

Every check runs at JAX's default matmul precision and at ``highest``: JAX multiplies float32
matrices in TF32 on recent NVIDIA GPUs by default (about 1e-3 relative error on the seed model),
so the default-precision checks use a tolerance for that, and ``highest``
(``jax.default_matmul_precision('highest')``) is held to full float32 accuracy.  Checked: the seed
model's loss through ``evaluate`` (heads batched, the default), head by head, ``compile``,
``rewrites.optimize``, ``evaluate_batched`` over all devices (data parallel), ``compile`` with the
attention weights split over a mesh (tensor parallel: over however many devices divide the 8
heads, the one-device mesh on one GPU), and float64.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="checks only, no benchmarks")
    parser.add_argument("--heads", type=int, nargs="+", default=[2, 6, 12, 24],
                        help="layers of the head-batching benchmark's models (default 2 6 12 24)")
    parser.add_argument("--small", action="store_true",
                        help="the benchmarks on small models with few runs: a smoke test of this script on a CPU")
    args = parser.parse_args(argv)

    import jax

    import circuits as C
    from circuits.models import attn_only, random_weights, tokens_symbol

    from .numpy_attn_only import forward

    dev = jax.devices()[0]
    print(f"card: {dev.device_kind} ({dev.platform}; {len(jax.devices())} device(s): {jax.devices()})", flush=True)
    w = random_weights(0)
    toks = np.random.default_rng(0).integers(0, 50259, 302)
    want = forward(w, toks)
    circuit = attn_only(w, toks)
    failures = []

    def check(label, got, tol):
        err = float(np.max(np.abs(got - want) / np.maximum(1.0, np.abs(want))))
        ok = np.isfinite(got).all() and err <= tol
        print(f"  {'ok ' if ok else 'BAD'} {label:<62} max rel error {err:.2e} (tolerance {tol:.0e})", flush=True)
        if not ok:
            failures.append(label)

    from jax.sharding import PartitionSpec as P

    import rewrites

    from .bench_sharding import HEAD_WEIGHTS, mesh_devices

    sym = attn_only(w, tokens_symbol(302))
    batch = np.stack([toks, toks[::-1]])
    mesh = mesh_devices()
    t = time.perf_counter()
    optimized = rewrites.optimize(circuit)
    compiled = C.compile(circuit)
    sharded = C.compile(circuit, mesh=mesh, shard={HEAD_WEIGHTS: P("model")})
    # (label, function giving the loss of the token row `toks`)
    cases = [
        ("evaluate, heads batched", lambda: C.evaluate(circuit)),
        ("evaluate, head by head", lambda: C.evaluate(circuit, batch_heads=False)),
        ("compile", compiled),
        ("rewrites.optimize", lambda: C.evaluate(optimized)),
        (f"evaluate_batched over {len(jax.devices())} device(s) (row 0)",
         lambda: C.evaluate_batched(sym, {"toks_int_var": batch}, devices="all")[0]),
        (f"compile, heads sharded over {len(mesh)} device(s)",
         sharded),
    ]
    for label, fn in cases:
        check(f"{label}, default precision", fn(), 5e-3)
        with jax.default_matmul_precision("highest"):
            check(f"{label}, highest precision", fn(), 1e-4)
    check("evaluate, float64", C.evaluate(circuit, dtype="float64"), 1e-9)
    print(f"checks took {time.perf_counter() - t:.1f} s", flush=True)

    if not args.quick:
        from . import (
            bench_call_overhead,
            bench_heads,
            bench_optimize,
            bench_seed_model,
            bench_sharding,
            bench_throughput,
        )

        small = dict(runs=2, positions=30) if args.small else {}
        heads_small = dict(d_model=64, n_heads=4, head_size=16, vocab=1000) if args.small else {}
        for name, run in [("bench_throughput", lambda: bench_throughput.main(
                              runs=2, batch=4, batch_runs=1, chunk_sizes=(1, 4), positions=30, vocab=1000)
                              if args.small else bench_throughput.main(runs=10, batch=16, batch_runs=5)),
                          ("bench_call_overhead", lambda: bench_call_overhead.main(runs=2, calls=10, launches_too=False)
                              if args.small else bench_call_overhead.main(launches_too=False)),
                          ("bench_seed_model", lambda: bench_seed_model.main(runs=2, batch=4) if args.small else bench_seed_model.main()),
                          ("bench_optimize", lambda: bench_optimize.main(**small)),
                          ("bench_heads", lambda: bench_heads.main(tuple(args.heads), **small, **heads_small)),
                          ("bench_sharding", lambda: bench_sharding.main(**small, batch=4 if args.small else 32))]:
            t = time.perf_counter()
            print(f"\n=== benchmarks.{name}", flush=True)
            run()
            print(f"({name} took {time.perf_counter() - t:.1f} s)", flush=True)
    if failures:
        sys.exit(f"failed: {', '.join(failures)}")


if __name__ == "__main__":
    main()
