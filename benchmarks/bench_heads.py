"""Cost grows with the model: the seed's architecture at GPT-2-small width (heads of 64, d 768,
512 positions, vocabulary 50259, random weights) at 2, 6, 12 and 24 layers, the loss through
``circuits.compile`` vs a hand-written heads-batched ``jax.jit`` in the same process.

Two figures per size, each a ratio to the hand-written model:

- **first call**: for the circuit ``C.compile(circuit)`` (the lowering in Python: the program
  walk, head batching, the ops) plus its first call (binding the arguments, tracing, XLA's
  compile, one run); for the hand-written model ``jax.jit`` of it plus its first call.  Building
  the circuit (``attn_only``) is **not** included on either side, as writing the hand-written
  function is not; it is shown in the breakdown (``build``) and in ``with build``.
- **steady**: the median of interleaved runs.

Both in process CPU time (all threads: robust to other load on a shared machine, where wall time
stretches with everyone else's work) and in wall time.  ``circuits.compile`` batches the per-head
einsums of each layer (``circuits.backend.lower.head_batching``) unless ``batch_heads=False``; the
head-by-head column shows what that costs.  A breakdown line per size splits the first call
(CPU seconds, measured separately with ``jax.jit(...).lower`` / ``.compile`` after clearing JAX's
caches): circuit ``build``, ``lower`` (Python: program, head batching, ops), ``bind``, ``trace``,
``xla`` compile and the first ``run``, against the hand-written ``trace``, ``xla`` and ``run``.

Run: ``.venv/bin/python -m benchmarks.bench_heads [layers ...]`` (default 2 6 12 24).  Targets
(issue 12): steady state ≤ 1.05, first call ≤ 1.5 at 12 layers.
"""

from __future__ import annotations

import os
import sys
import time

import jax
import numpy as np

import circuits as C
from circuits.backend import clear_cache
from circuits.backend.lower.binding import bind_arguments
from circuits.backend.lower.lowering import program_with_also
from circuits.models import attn_only, random_weights

from .common import agreement_tolerance, interleaved_times, medians_of, report
from .handwritten_attn_only import loss_naive


def _block(out):
    if hasattr(out, "block_until_ready"):
        out.block_until_ready()
    return out


def _timed(fn):
    """``(wall seconds, process CPU seconds, result)`` of one call."""
    t, c = time.perf_counter(), time.process_time()
    out = _block(fn())
    return time.perf_counter() - t, time.process_time() - c, out


def _medians(fns: dict, runs: int):
    """Interleaved medians of wall time and of process CPU time (all threads).  The CPU time is
    what the ratios are read from on a shared machine: other processes' load stretches wall
    time by up to 3x here but barely moves the work done."""
    wall, cpu = interleaved_times(fns, runs=runs, warmup=0, block=_block, cpu=True)
    return medians_of(wall), medians_of(cpu)


def model(n_layers: int, positions: int = 512, d_model: int = 768, n_heads: int = 12, head_size: int = 64,
          vocab: int = 50259):
    """``(weights, tokens)`` of the benchmarked model (random weights, seed 0)."""
    w = random_weights(0, vocab=vocab, d_model=d_model, n_heads=n_heads, head_size=head_size, n_layers=n_layers,
                       max_positions=positions)
    return w, np.random.default_rng(0).integers(0, vocab, positions + 2)


def first_call_breakdown(w, toks, n_layers: int) -> dict:
    """CPU seconds of each stage of a first call, circuit and hand-written (JAX's caches cleared
    first, so nothing is reused from earlier calls): ``{'circuit': {stage: s}, 'hand': {...}}``."""
    cpu = time.process_time
    jax.clear_caches()
    t = cpu()
    circuit = attn_only(w, toks)
    out = {"build": cpu() - t}
    t = cpu()
    program, _ = program_with_also(circuit, "float32", None, True)
    run = program.skeleton().run
    out["lower"] = cpu() - t
    t = cpu()
    args = bind_arguments(program, None, "float32")
    out["bind"] = cpu() - t
    t = cpu()
    lowered = jax.jit(lambda a: run(a)).lower(args)
    out["trace"] = cpu() - t
    t = cpu()
    exe = lowered.compile()
    out["xla"] = cpu() - t
    t = cpu()
    _block(exe(args)[0])
    out["run"] = cpu() - t
    wj = {k: jax.device_put(v) for k, v in w.items()}
    tj = jax.device_put(toks.astype(np.int32))
    hand = {}
    t = cpu()
    lowered = jax.jit(lambda w, t: loss_naive(w, t, n_layers)).lower(wj, tj)
    hand["trace"] = cpu() - t
    t = cpu()
    exe = lowered.compile()
    hand["xla"] = cpu() - t
    t = cpu()
    _block(exe(wj, tj))
    hand["run"] = cpu() - t
    return {"circuit": out, "hand": hand}


def one_size(n_layers: int, runs: int = 5, head_by_head: bool = True, breakdown: bool = True, **sizes):
    w, toks = model(n_layers, **sizes)
    load = os.getloadavg()[0]
    t = time.process_time()
    circuit = attn_only(w, toks)
    build = time.process_time() - t
    wj = {k: jax.device_put(v) for k, v in w.items()}
    tj = jax.device_put(toks.astype(np.int32))
    clear_cache()
    first = {}
    hand = None

    def hand_first():
        nonlocal hand
        hand = jax.jit(lambda w, t: loss_naive(w, t, n_layers))
        return hand(wj, tj)

    *first["hand"], ref = _timed(hand_first)
    compiled = None

    def circuit_first(**kw):
        nonlocal compiled
        compiled = C.compile(circuit, **kw)
        return compiled()

    *first["circuit"], got = _timed(circuit_first)
    np.testing.assert_allclose(got, np.asarray(ref), rtol=agreement_tolerance(), atol=1e-3)
    fns = {"circuit": compiled, "hand": lambda: hand(wj, tj)}
    if head_by_head:
        *first["per_head"], got_ph = _timed(lambda: circuit_first(batch_heads=False))
        np.testing.assert_allclose(got_ph, np.asarray(ref), rtol=agreement_tolerance(), atol=1e-3)
        fns["per_head"] = compiled
    for fn in fns.values():  # warm-up
        _block(fn())
    wall, cpu = _medians(fns, runs)
    out = {"first": first, "wall": wall, "cpu": cpu, "build": build}
    if breakdown:
        out["breakdown"] = first_call_breakdown(w, toks, n_layers)
    out["load"] = (load, os.getloadavg()[0])
    return out


def _stages(d: dict) -> str:
    return " ".join(f"{k} {v:.2f}" for k, v in d.items())


def _warm_up():
    """Compile and run one small circuit and one small ``jax.jit`` first: the process's first
    compilation pays one-time costs (XLA's and JAX's initialisation) that belong to neither side."""
    small = attn_only(*model(1, positions=8, d_model=16, n_heads=2, head_size=8, vocab=32))
    C.compile(small)()
    _block(jax.jit(lambda x: (x @ x).sum())(np.ones((8, 8), np.float32)))


def main(layers=(2, 6, 12, 24), runs: int = 5, **sizes):
    """``sizes`` (``positions``, ``d_model``, ``n_heads``, ``head_size``, ``vocab``) shrink the model
    for a smoke test; the defaults are GPT-2 small's."""
    _warm_up()
    rows = []
    for n in layers:
        r = one_size(n, runs, **sizes)
        for what, label in (("steady", "steady"), ("first", "first call")):
            def pick(k):
                return (r["wall"][k], r["cpu"][k]) if what == "steady" else tuple(r["first"][k])

            cw, cc = pick("circuit")
            hw, hc = pick("hand")
            text = f"CPU {cc:6.2f} s / {hc:6.2f} s = {cc / hc:.3f}   wall {cw:6.2f} s / {hw:6.2f} s = {cw / hw:.3f}"
            if what == "first":
                text += f"   with build: CPU {(cc + r['build']) / hc:.3f}"
            if "per_head" in r["wall"]:
                pw, pc = pick("per_head")
                text += f"   head by head: CPU {pc / hc:.3f}, wall {pw / hw:.3f}"
            rows.append((f"{n:2d} layers, {label}: circuit / hand", text))
            print(rows[-1][0], rows[-1][1], flush=True)
        if "breakdown" in r:
            b = r["breakdown"]
            rows.append((f"{n:2d} layers, first call CPU s",
                         f"circuit: {_stages(b['circuit'])} | hand: {_stages(b['hand'])}"
                         f"   (load average {r['load'][0]:.1f} -> {r['load'][1]:.1f})"))
            print(rows[-1][0], rows[-1][1], flush=True)
    what = f"small model {sizes} (a smoke test)" if sizes else "seed architecture at GPT-2-small width"
    report(f"{what}, {jax.devices()[0].platform} "
           f"({os.cpu_count()} CPUs), CPU-time ratios read on a shared machine", rows)


if __name__ == "__main__":
    main(tuple(int(a) for a in sys.argv[1:]) or (2, 6, 12, 24))
