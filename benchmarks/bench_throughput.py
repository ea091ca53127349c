"""Throughput of the seed's loss against the best hand-written JAX and the machine's own matmul rate.

Run: ``.venv/bin/python -m benchmarks.bench_throughput [--runs 7] [--batch 16] [--batch-runs 3]``
(issue 24).  Everything in one process, runs interleaved, medians (the machine is shared: read
the ratios, not the times).

The hand-written side is the best a careful JAX user writes (``benchmarks/handwritten_attn_only``):
heads batched, the true token's logit as one dot product per position minus the vocabulary's
``logsumexp`` (``loss_fused``), unchunked and chunked over the vocabulary (16, 32, 64 static
slices, and 8, 16, 32 slices taken one after another in a ``lax.scan``): the fastest of them is
*best hand*; the naive one (``log_softmax`` of the whole logit matrix,
then gather) is printed beside it.  For a batch: ``vmap``, ``lax.map`` and ``lax.map`` over
chunks of ``vmap`` (``batch_size`` 2 and 4) of the best single function, the fastest of them.
The *physical line* is the model's FLOPs (2 x its matmul multiply-adds, ``circuits.cost``) at
this machine's square-matmul rate (``jnp.matmul`` at 2048², measured in the same interleaved
loop).

Targets: one sequence ``compile`` <= 1.05x best hand; the batch's ``evaluate_batched`` <= 1.0x
the best batched hand; ``compile(optimize(c))`` <= 1.5x the physical line, one sequence and
batched; the default chunk within 10% of the best fixed ``batch_size``.
"""

from __future__ import annotations

import argparse
import functools

import jax
import jax.numpy as jnp
import numpy as np

import circuits as C
from circuits.models import attn_only, random_weights, tokens_symbol
from rewrites import optimize

from .common import agreement_tolerance, interleaved_medians, report
from .handwritten_attn_only import loss_fused, loss_naive

CHUNKS = (1, 16, 32, 64)
LOOP_CHUNKS = (8, 16, 32)


def medians(fns: dict, runs: int, warmup: int = 1) -> dict:
    """Interleaved medians of ``fns`` (each returns something to block on, or a numpy array)."""
    return interleaved_medians(fns, runs=runs, warmup=warmup, block=jax.block_until_ready)


def matmul_case(n: int = 2048):
    """``(fn, flops)``: one jitted ``jnp.matmul`` of two ``n x n`` float32 matrices."""
    a = jax.device_put(np.random.default_rng(0).standard_normal((n, n)).astype(np.float32))
    mm = jax.jit(jnp.matmul)
    return (lambda: mm(a, a)), 2 * n ** 3


def best(times: dict, prefix: str) -> tuple[str, float]:
    k = min((k for k in times if k.startswith(prefix)), key=times.get)
    return k, times[k]


def main(runs: int = 7, batch: int = 16, batch_runs: int = 3, chunk_sizes=(1, 2, 4, 8, 16), *,
         positions: int = 300, vocab: int = 50259, d_model: int = 256):
    w = random_weights(0, vocab=vocab, d_model=d_model)
    rng = np.random.default_rng(0)
    toks = rng.integers(0, vocab, positions + 2)
    circuit = attn_only(w, toks)
    flops = 2 * C.cost(circuit).matmul_multiplies
    wj = {k: jax.device_put(v) for k, v in w.items()}
    tj = jax.device_put(toks.astype(np.int32))
    tol = agreement_tolerance()

    # ---------------------------------------------------------------- one sequence
    compiled = C.compile(circuit)
    optimized = C.compile(optimize(circuit))
    naive = jax.jit(loss_naive)
    fused = {f"hand{c}": jax.jit(functools.partial(loss_fused, chunks=c)) for c in CHUNKS}
    fused.update({f"hand loop{c}": jax.jit(functools.partial(loss_fused, chunks=c, loop=True)) for c in LOOP_CHUNKS})
    want = np.asarray(naive(wj, tj))
    for got in [compiled(), optimized(), *(np.asarray(f(wj, tj)) for f in fused.values())]:
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    mm, mm_flops = matmul_case()
    args = compiled.arguments()
    run = compiled._run  # the program's jitted function (made by the calls above)
    fns = {"compile": compiled, "optimize": optimized, "naive": lambda: naive(wj, tj), "matmul": mm,
           "compile jax": lambda: compiled(return_jax=True), "program": lambda: run(args)[0]}
    fns.update({k: (lambda f=f: f(wj, tj)) for k, f in fused.items()})
    t = medians(fns, runs)
    rate = mm_flops / t["matmul"]
    physical = flops / rate
    hand_key, hand = best(t, "hand")
    rows = [
        ("model", f"{flops / 1e9:.2f} GFLOP (2 x matmul multiply-adds); square matmul "
                  f"{rate / 1e9:.1f} GFLOP/s; physical line {physical * 1e3:.1f} ms"),
        ("one sequence, compile", f"{t['compile'] * 1e3:8.1f} ms"),
        ("one sequence, compile(optimize(c))", f"{t['optimize'] * 1e3:8.1f} ms"),
        ("one sequence, best hand-written", f"{hand * 1e3:8.1f} ms ({_hand_name(hand_key)})"),
        ("one sequence, hand-written by chunks", "  ".join(f"{c}: {t[f'hand{c}'] * 1e3:.1f} ms" for c in CHUNKS)),
        ("one sequence, hand-written by chunks in a loop",
         "  ".join(f"{c}: {t[f'hand loop{c}'] * 1e3:.1f} ms" for c in LOOP_CHUNKS)),
        ("one sequence, naive hand-written", f"{t['naive'] * 1e3:8.1f} ms"),
        ("ratio one sequence compile / best hand (target <= 1.05)", f"{t['compile'] / hand:8.3f}"),
        # where a gap lies: the result's copy to numpy, our Python per call, the program itself
        ("ratio one sequence compile(return_jax=True) / best hand", f"{t['compile jax'] / hand:8.3f}"),
        ("ratio one sequence our program's jitted function alone / best hand", f"{t['program'] / hand:8.3f}"),
        ("ratio one sequence compile / naive hand", f"{t['compile'] / t['naive']:8.3f}"),
        ("ratio one sequence optimize / compile", f"{t['optimize'] / t['compile']:8.3f}"),
        ("ratio one sequence optimize / physical line (target <= 1.5)", f"{t['optimize'] / physical:8.3f}"),
        ("ratio one sequence compile / physical line", f"{t['compile'] / physical:8.3f}"),
        ("ratio one sequence best hand / physical line", f"{hand / physical:8.3f}"),
    ]

    # ---------------------------------------------------------------- a batch
    if batch:
        sym = attn_only(w, tokens_symbol(positions + 2))
        sym_opt = optimize(sym)
        btoks = rng.integers(0, vocab, (batch, positions + 2))
        tb = jax.device_put(btoks.astype(np.int32))
        hands = {}
        static = {k: v for k, v in t.items() if k.startswith("hand") and not k.startswith("hand loop")}
        for key in (min(static, key=static.get), best(t, "hand loop")[0]):  # each form's best single, batched
            single = functools.partial(loss_fused, **_hand_options(key))
            name = f"{_hand_options(key)['chunks']}{' loop' if _hand_options(key)['loop'] else ''}"
            hands.update({
                f"bhand vmap ({name})": jax.jit(jax.vmap(single, in_axes=(None, 0))),
                f"bhand lax.map ({name})": jax.jit(lambda w, t, f=single: jax.lax.map(lambda r: f(w, r), t)),
                f"bhand lax.map batch_size 2 ({name})":
                    jax.jit(lambda w, t, f=single: jax.lax.map(lambda r: f(w, r), t, batch_size=2)),
                f"bhand lax.map batch_size 4 ({name})":
                    jax.jit(lambda w, t, f=single: jax.lax.map(lambda r: f(w, r), t, batch_size=4)),
            })
        inputs = {"toks_int_var": btoks}

        def fresh():  # a batch new to the process: the value cache holds every batch seen, so a
            # repeated one would time a lookup, not the model (hand-written JAX keeps no values)
            return {"toks_int_var": rng.integers(0, vocab, btoks.shape)}

        bfns = {
            "evaluate_batched": lambda: C.evaluate_batched(sym, fresh()),
            "evaluate_batched jax": lambda: C.evaluate_batched(
                sym, {"toks_int_var": jax.device_put(fresh()["toks_int_var"].astype(np.int32))}, return_jax=True),
            "optimize batched": lambda: C.evaluate_batched(sym_opt, fresh()),
            "matmul": mm,
        }
        for k in (k for k in chunk_sizes if k <= batch):
            bfns[f"batch_size {k}"] = lambda k=k: C.evaluate_batched(sym, fresh(), batch_size=k)
        bfns.update({k: (lambda f=f: f(wj, tb)) for k, f in hands.items()})
        bwant = np.asarray(next(iter(hands.values()))(wj, tb))
        checks = {"evaluate_batched": lambda: C.evaluate_batched(sym, inputs),
                  "evaluate_batched jax": lambda: C.evaluate_batched(sym, {"toks_int_var": tb}, return_jax=True),
                  "optimize batched": lambda: C.evaluate_batched(sym_opt, inputs),
                  **{k: bfns[k] for k in list(hands)[1:]}}
        for k, fn in checks.items():
            np.testing.assert_allclose(np.asarray(fn()), bwant, rtol=tol, atol=tol)
        for _ in range(4):  # the default chunk is measured over the first calls (batch_tuning): warm it
            bfns["evaluate_batched"]()
            bfns["evaluate_batched jax"]()
            bfns["optimize batched"]()
        bt = medians(bfns, batch_runs)
        brate = mm_flops / bt["matmul"]
        bphysical = batch * flops / brate
        bkey, bhand = best(bt, "bhand")
        fixed = {k: v for k, v in bt.items() if k.startswith("batch_size")}
        fkey = min(fixed, key=fixed.get)
        rows += [
            (f"batch of {batch}, evaluate_batched (default chunk)", f"{bt['evaluate_batched'] * 1e3:8.1f} ms"),
            (f"batch of {batch}, evaluate_batched(optimize(c))", f"{bt['optimize batched'] * 1e3:8.1f} ms"),
            (f"batch of {batch}, fixed chunks", "  ".join(f"{k[11:]}: {v * 1e3:.0f} ms" for k, v in fixed.items())),
            (f"batch of {batch}, best hand-written", f"{bhand * 1e3:8.1f} ms ({bkey[6:]})"),
            (f"batch of {batch}, hand-written", "  ".join(f"{k[6:]}: {bt[k] * 1e3:.0f} ms" for k in hands)),
            ("ratio batch evaluate_batched / best hand (target <= 1.0)", f"{bt['evaluate_batched'] / bhand:8.3f}"),
            ("ratio batch evaluate_batched, device tokens and result / best hand",
             f"{bt['evaluate_batched jax'] / bhand:8.3f}"),
            ("ratio batch default chunk / best fixed chunk (target <= 1.1)",
             f"{bt['evaluate_batched'] / fixed[fkey]:8.3f}"),
            ("ratio batch optimize / physical line (target <= 1.5)", f"{bt['optimize batched'] / bphysical:8.3f}"),
            ("ratio batch optimize / evaluate_batched", f"{bt['optimize batched'] / bt['evaluate_batched']:8.3f}"),
        ]
    dev = jax.devices()[0]
    report(f"seed loss throughput, {dev.platform} ({dev.device_kind}), medians of {runs} "
           f"(batch: {batch_runs}) interleaved runs", rows)
    return t


def _hand_options(key: str) -> dict:
    """``loss_fused``'s keywords for a hand-written key: ``hand16``, ``hand loop16``."""
    loop = key.startswith("hand loop")
    return {"chunks": int(key[9:] if loop else key[4:]), "loop": loop}


def _hand_name(key: str) -> str:
    o = _hand_options(key)
    if o["chunks"] == 1:
        return "logit - logsumexp, unchunked"
    return f"logit - logsumexp in {o['chunks']} vocabulary chunks" + (", a lax.scan over them" if o["loop"] else "")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--batch-runs", type=int, default=3)
    args = parser.parse_args()
    main(runs=args.runs, batch=args.batch, batch_runs=args.batch_runs)
