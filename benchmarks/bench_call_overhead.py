"""Per-call cost of ``compile``d calls and ``evaluate_batched`` against hand-written ``jax.jit``.

Run: ``.venv/bin/python -m benchmarks.bench_call_overhead [--runs 60] [--calls 20] [--batch 16]``
(issue 24).  The seed's loss circuit on a tiny model (vocabulary 64, ``d_model`` 16, 8 positions),
so that the arithmetic is a few microseconds and what is left is the work each call does on the
host: binding and checking arguments, dispatch, results.  That is what separates ``compile`` from
the hand-written function on a GPU, where the seed's arithmetic is 0.1 ms (BENCHMARKS.md, "GPU:
NVIDIA H200 (issues 20 and 24)").

Every row is microseconds per call: ``calls`` calls in a block, blocks of every function
interleaved ``runs`` times in one process, the fastest block (and the median) reported; each
call blocks until its result is ready.  *ours - hand* is the difference of the fastest blocks
(on a shared machine, the fastest of many short blocks is the closest to an idle one), and beside
it the median over runs of the difference between the two blocks of one run.  The rows:

- *hand*: ``jax.jit(loss_fused)(weights, tokens)`` on device arrays (weights passed as
  arguments, the way the throughput benchmark's best hand-written function runs);
- *program*: our compiled program's own jitted function called on its prebuilt argument list
  (no Python of ours): the floor ``compile`` can reach with the program XLA gets;
- *compile, tokens in the circuit*: ``f(return_jax=True)`` of ``C.compile(attn_only(w, toks))``
  (``bench_throughput``'s spelling, but the result left on the device);
- *compile, device tokens*: ``f({'toks_int_var': tokens}, return_jax=True)``, a Symbol bound to a
  device array at every call;
- *compile, numpy in and out*: the same bound to a numpy int64 array, the result as numpy,
  against the hand-written function given the same numpy array and its result copied to numpy;
- the batch rows: ``evaluate_batched`` on ``batch`` rows of tokens (device or numpy, default
  chunk and ``batch_size=batch``) against ``jax.jit(jax.vmap(loss_fused))``;
- the empty circuit's rows: ``x + w`` on four numbers through ``compile``, ``evaluate`` and
  ``evaluate_batched`` against ``jax.jit`` (and its ``vmap``) of the same sum: host work alone.

*ours - hand* is the per-call overhead the library adds.  Then what one call launches, ours and
hand-written, from a ``jax.profiler`` trace: XLA executions (one each), and on an accelerator the
device's kernels and copies (``--no-launches`` skips the traces; ``device_check`` skips them, to
spare the lent machine's minutes: run this module alone there to count kernels).
"""

from __future__ import annotations

import argparse
import statistics

import jax
import numpy as np

import circuits as C
from circuits.models import attn_only, random_weights, tokens_symbol

from .common import agreement_tolerance, interleaved_times, report
from .handwritten_attn_only import loss_fused

TOKENS = "toks_int_var"


def per_call(fns: dict, runs: int, calls: int, warmup: int = 20) -> dict:
    """``{name: [microseconds per call, one block of calls each run]}`` for each of ``fns``: blocks
    of ``calls`` calls, every function's block once a run, ``runs`` runs."""
    times = interleaved_times(fns, runs=runs, warmup=warmup, calls=calls, block=jax.block_until_ready)
    return {k: [t * 1e6 for t in v] for k, v in times.items()}


def launches(fn, calls: int = 10) -> str:
    """XLA executions per call of ``fn`` (and on an accelerator, the device's own events per call:
    kernels and copies), counted in a ``jax.profiler`` trace of ``calls`` calls; ``'n/a'`` where
    the profiler cannot write one."""
    import collections
    import glob
    import gzip
    import json
    import tempfile

    try:
        with tempfile.TemporaryDirectory() as d:
            with jax.profiler.trace(d):
                for _ in range(calls):
                    jax.block_until_ready(fn())
            path = glob.glob(f"{d}/**/*.trace.json.gz", recursive=True)
            with gzip.open(path[0]) as f:
                events = json.load(f)["traceEvents"]
    except Exception as e:  # noqa: BLE001 - a profiler missing or failing: say so, measure the rest
        return f"n/a ({type(e).__name__})"
    procs = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
    count = collections.Counter()
    for e in events:
        if e.get("ph") != "X":
            continue
        if "ExecuteHelper" in e.get("name", ""):
            count["executions"] += 1
        elif procs.get(e.get("pid"), "").startswith("/device:"):
            count["device"] += 1
    out = f"{count['executions'] / calls:g} XLA executions"
    return out + (f", {count['device'] / calls:g} device events" if count["device"] else "")


def paired(ours: list, hand: list) -> float:
    """The median over runs of ``ours - hand`` (blocks of the same run: the load of the shared
    machine changes from run to run, and mostly cancels within one)."""
    return statistics.median(o - h for o, h in zip(ours, hand))


def cases(batch: int = 16, positions: int = 8, vocab: int = 64, d_model: int = 16):
    """``(single, batched)``: dicts of ``name -> (ours, hand)`` call pairs, checked to agree."""
    w = random_weights(0, vocab=vocab, d_model=d_model, n_heads=2, head_size=8, max_positions=2 * positions)
    rng = np.random.default_rng(0)
    toks = rng.integers(0, vocab, positions + 2)
    btoks = rng.integers(0, vocab, (batch, positions + 2))
    wj = {k: jax.device_put(v) for k, v in w.items()}
    tj, tbj = jax.device_put(toks.astype(np.int32)), jax.device_put(btoks.astype(np.int32))
    hand = jax.jit(loss_fused)
    bhand = jax.jit(jax.vmap(loss_fused, in_axes=(None, 0)))
    bound = C.compile(attn_only(w, toks))
    sym = attn_only(w, tokens_symbol(positions + 2))
    free = C.compile(sym)
    args = bound.arguments()
    bound(return_jax=True)  # compiles, and makes the program's jitted function
    program = bound._run
    single = {
        "program (our jitted function, prebuilt args)": (lambda: program(args)[0], lambda: hand(wj, tj)),
        "compile, tokens in the circuit": (lambda: bound(return_jax=True), lambda: hand(wj, tj)),
        "compile, device tokens": (lambda: free({TOKENS: tj}, return_jax=True), lambda: hand(wj, tj)),
        "compile, numpy in and out": (lambda: free({TOKENS: toks}), lambda: np.asarray(hand(wj, toks))),
    }
    batched = {
        "evaluate_batched, device tokens": (
            lambda: C.evaluate_batched(sym, {TOKENS: tbj}, return_jax=True), lambda: bhand(wj, tbj)),
        f"evaluate_batched, device tokens, batch_size={batch}": (
            lambda: C.evaluate_batched(sym, {TOKENS: tbj}, batch_size=batch, return_jax=True),
            lambda: bhand(wj, tbj)),
        "evaluate_batched, numpy in and out": (
            lambda: C.evaluate_batched(sym, {TOKENS: btoks}), lambda: np.asarray(bhand(wj, btoks))),
    }
    tol = agreement_tolerance()
    for ours, theirs in [*single.values(), *batched.values()]:
        np.testing.assert_allclose(np.asarray(ours()), np.asarray(theirs()), rtol=tol, atol=tol)
    return single, batched


def empty_cases(batch: int = 16):
    """Calls of a nearly empty circuit (``x + w`` on 4 numbers): what is left is host work alone,
    which a loaded machine disturbs far less than the model's arithmetic."""
    x = C.Symbol((4,), name="x")
    w = np.ones(4, np.float32)
    circuit = C.Add(x, C.Array(w, name="w"))
    wj, xj = jax.device_put(w), jax.device_put(np.arange(4, dtype=np.float32))
    xbj = jax.device_put(np.arange(4 * batch, dtype=np.float32).reshape(batch, 4))
    hand, bhand = jax.jit(lambda w, x: x + w), jax.jit(jax.vmap(lambda w, x: x + w, in_axes=(None, 0)))
    f = C.compile(circuit)
    group = {
        "x + w: compile, device input": (lambda: f({"x": xj}, return_jax=True), lambda: hand(wj, xj)),
        "x + w: evaluate(mode='jit'), device input": (
            lambda: C.evaluate(circuit, {"x": xj}, mode="jit", return_jax=True), lambda: hand(wj, xj)),
        f"x + w: evaluate_batched, {batch} device rows": (
            lambda: C.evaluate_batched(circuit, {"x": xbj}, return_jax=True), lambda: bhand(wj, xbj)),
    }
    for ours, theirs in group.values():
        np.testing.assert_allclose(np.asarray(ours()), np.asarray(theirs()))
    return group


def main(runs: int = 60, calls: int = 20, batch: int = 16, launches_too: bool = True):
    single, batched = cases(batch)
    for _ in range(4):  # evaluate_batched measures its default chunk over its first calls: warm it
        for ours, _ in batched.values():
            ours()
    rows = []
    empty = empty_cases(batch)
    for title, group in (("one sequence", single), (f"batch of {batch}", batched), ("empty circuit", empty)):
        fns = {}
        for name, (ours, theirs) in group.items():
            fns[name], fns[f"hand, {name}"] = ours, theirs
        t = per_call(fns, runs, calls)
        for name in group:
            ours, hand = t[name], t[f"hand, {name}"]
            rows.append((f"{title}: {name}",
                         f"{min(ours):7.1f} us (median {statistics.median(ours):7.1f})  hand {min(hand):7.1f} us "
                         f"(median {statistics.median(hand):7.1f})  ours - hand {min(ours) - min(hand):+7.1f} us "
                         f"(paired median {paired(ours, hand):+7.1f})"))
        for name, (ours, theirs) in group.items() if launches_too else ():
            rows.append((f"{title}: {name}, a call launches", f"ours {launches(ours)}; hand {launches(theirs)}"))
    dev = jax.devices()[0]
    report(f"per-call cost, tiny seed model and an empty circuit, {dev.platform} ({dev.device_kind}), microseconds per call: the "
           f"fastest block of {calls} calls over {runs} interleaved runs (the median beside it)", rows)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=60)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--no-launches", action="store_true", help="skip the profiler traces that count launches")
    args = parser.parse_args()
    main(runs=args.runs, calls=args.calls, batch=args.batch, launches_too=not args.no_launches)
