"""One prepared script for a session lent a GPU machine (see BENCHMARKS.md): checks that
evaluation on the accelerator agrees with the plain-numpy oracle, then runs the evaluation and
optimize benchmarks there.  Runs on the CPU too (the same checks), which is how it is tested.

    python -m benchmarks.device_check            # checks + benchmarks
    python -m benchmarks.device_check --quick    # checks only

JAX multiplies float32 matrices in TF32 on recent NVIDIA GPUs by default (about 1e-3 relative
error on the seed model): the default-precision check uses a tolerance for that, and a second
check asks for full precision with ``jax.default_matmul_precision('highest')``.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="checks only, no benchmarks")
    args = parser.parse_args(argv)

    import jax

    import circuits as C
    from circuits.models import attn_only, random_weights, tokens_symbol
    from tests.models.numpy_attn_only import forward

    dev = jax.devices()[0]
    print(f"devices: {jax.devices()}  ({dev.platform}, {dev.device_kind})", flush=True)
    w = random_weights(0)
    toks = np.random.default_rng(0).integers(0, 50259, 302)
    want = forward(w, toks)
    circuit = attn_only(w, toks)
    failures = []

    def check(label, got, tol):
        err = float(np.max(np.abs(got - want) / np.maximum(1.0, np.abs(want))))
        ok = np.isfinite(got).all() and err <= tol
        print(f"  {'ok ' if ok else 'BAD'} {label:<44} max rel error {err:.2e} (tolerance {tol:.0e})", flush=True)
        if not ok:
            failures.append(label)

    t = time.perf_counter()
    check("float32, default matmul precision", C.evaluate(circuit), 5e-3)
    with jax.default_matmul_precision("highest"):
        check("float32, highest matmul precision", C.evaluate(circuit), 1e-4)
    check("float64", C.evaluate(circuit, dtype="float64"), 1e-9)
    import rewrites

    with jax.default_matmul_precision("highest"):
        check("rewrites.optimize, highest precision", C.evaluate(rewrites.optimize(circuit)), 1e-4)
    batch = np.stack([toks, toks[::-1]])
    with jax.default_matmul_precision("highest"):
        got = C.evaluate_batched(attn_only(w, tokens_symbol(302)), {"toks_int_var": batch}, devices="all")
    check("evaluate_batched over all devices (row 0)", got[0], 1e-4)
    print(f"checks took {time.perf_counter() - t:.1f} s", flush=True)

    if not args.quick:
        from . import bench_optimize, bench_seed_model

        bench_seed_model.main()
        bench_optimize.main()
    if failures:
        sys.exit(f"failed: {', '.join(failures)}")


if __name__ == "__main__":
    main()
