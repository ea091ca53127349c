"""Everyday analysis against TransformerLens (issue 36), on the shipped induction model:

- **a (site x position) patching grid**: every head's output patched at every position alone
  (8 heads x 32 positions = 256 patches) over 50 prompts of 34 tokens, ``head_patch_grid``
  against TransformerLens's ``patching.get_act_patch_attn_head_out_by_pos`` (a hooked run per
  patch) on the same weights (``tl_models.hooked_induction``), with the same metric (the mean
  over prompts of the summed per-token loss); target <= 0.5x, first call.  *First call*: the
  first grid in a new process (after building the circuit; nothing evaluated before), measured
  with an empty compilation cache (a new folder) and again in a second process that finds the
  cache the first one filled.  TransformerLens has nothing to compile: its time is the median of
  three calls on its best torch thread count.  Both grids are checked to agree.
- **the cache of every activation** over 50 prompts: ``run_with_cache(circuit, batch)`` against
  ``evaluate(circuit, batch, also=<the same nodes>, mode='jit')``, both on a second call with new
  inputs and the value cache off (``cache=False``); target <= 1.5x.  TransformerLens's
  ``run_with_cache`` on the same batch is printed for reference.

Runs in the side-by-side environment (``benchmarks/tl_models.py`` has the recipe)::

    /work/ac-env/bin/python -m benchmarks.bench_everyday            # both rows
    /work/ac-env/bin/python -m benchmarks.bench_everyday --no-tl    # ours only (any environment)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

from .common import report

PROMPTS, TOKENS = 50, 34

DATA = r"""
import numpy as np
from circuits.models import induction_tokens, induction_weights
w = induction_weights()
clean = induction_tokens(PROMPTS, seed=0)[:, :TOKENS]
corrupt = clean.copy()
rng = np.random.default_rng(1)
corrupt[:, 1:] = rng.integers(1, 64, corrupt[:, 1:].shape)   # BOS kept, the rest random: no repeats to copy
""".replace("PROMPTS", str(PROMPTS)).replace("TOKENS", str(TOKENS))

CHILD = DATA + r"""
import json, statistics, sys, time
import circuits as C
from circuits.interp import head_patch_grid
from circuits.models import attn_only, tokens_symbol
from benchmarks.common import CompileClock

clock = CompileClock()
circ = attn_only(w, tokens_symbol(clean.shape[1]), unique_names=True)
before = clock.read()
t = time.perf_counter()
grid = head_patch_grid(circ, {"toks_int_var": clean}, inputs={"toks_int_var": corrupt}).mean(0)
first = time.perf_counter() - t
compiled = clock.since(before)
again = []
for _ in range(3):
    t = time.perf_counter()
    head_patch_grid(circ, {"toks_int_var": clean}, inputs={"toks_int_var": corrupt})
    again.append(time.perf_counter() - t)
out = {"first": first, "compiled": compiled, "again": statistics.median(again), "grid": grid.tolist()}
if sys.argv[1] == "tl":
    import torch
    from transformer_lens import patching
    from benchmarks.common import fastest_torch_threads
    from benchmarks.tl_models import hooked_induction

    model = hooked_induction(w)
    ct, xt = torch.from_numpy(clean[:, :-2]), torch.from_numpy(corrupt[:, :-2])
    targets = torch.from_numpy(corrupt[:, 1:-1])
    _, clean_cache = model.run_with_cache(ct)

    def metric(logits):
        logp = torch.log_softmax(logits, -1)
        return -logp.gather(-1, targets[..., None])[..., 0].sum(-1).mean()

    def run():
        with torch.no_grad():
            return patching.get_act_patch_attn_head_out_by_pos(model, xt, clean_cache, metric)

    threads, _ = fastest_torch_threads(lambda: model(xt[:8]), [1, 2], runs=5)
    times, tl = [], None
    for _ in range(3):
        t = time.perf_counter()
        tl = run()
        times.append(time.perf_counter() - t)
    out.update(tl=statistics.median(times), threads=threads, tl_grid=tl.numpy().tolist())
print("RESULT " + json.dumps(out))
"""


def _grid_rows(with_tl: bool) -> list[tuple[str, str]]:
    import numpy as np

    rows = []
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, TQDM_DISABLE="1", PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    with tempfile.TemporaryDirectory() as cache:
        env["CIRCUITS_COMPILATION_CACHE"] = cache
        for label in ("empty cache", "warm cache, new process"):
            done = subprocess.run([sys.executable, "-c", CHILD, "tl" if with_tl else "ours"], env=env,
                                  capture_output=True, text=True, cwd=root)
            if done.returncode:
                raise SystemExit(done.stderr[-3000:])
            line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
            r = json.loads(line[len("RESULT "):])
            text = f"first call {r['first'] * 1e3:8.1f} ms ({r['compiled']}); again {r['again'] * 1e3:7.1f} ms"
            if with_tl:
                ours, theirs = np.asarray(r["grid"]), np.asarray(r["tl_grid"])
                # TransformerLens: [layer, pos, head]; ours the same after the mean over prompts
                gap = float(np.abs(ours - theirs).max())
                text += (f"; TransformerLens {r['tl'] * 1e3:8.1f} ms ({r['threads']} torch thread(s)): "
                         f"ratio first {r['first'] / r['tl']:.2f}x, again {r['again'] / r['tl']:.2f}x; "
                         f"grids agree to {gap:.1e}")
            rows.append((f"grid 8 heads x 32 positions x {PROMPTS} prompts, {label}", text))
    return rows


def _cache_rows(with_tl: bool) -> list[tuple[str, str]]:
    import statistics
    import time

    import numpy as np

    import circuits as C
    from circuits.interp import run_with_cache
    from circuits.interp.cache import activations
    from circuits.models import attn_only, induction_tokens, induction_weights, tokens_symbol

    w = induction_weights()
    circ = attn_only(w, tokens_symbol(TOKENS), unique_names=True)
    first = induction_tokens(PROMPTS, seed=0)[:, :TOKENS]
    batches = [induction_tokens(PROMPTS, seed=s)[:, :TOKENS] for s in range(1, 8)]
    nodes = activations(circ)
    run_with_cache(circ, {"toks_int_var": first}, mode="jit", cache=False)
    C.evaluate(circ, {"toks_int_var": first}, also=nodes, mode="jit", cache=False)
    ours, plain = [], []
    for b in batches:  # each call: new inputs; interleaved
        t = time.perf_counter()
        got = run_with_cache(circ, {"toks_int_var": b}, mode="jit", cache=False)
        ours.append(time.perf_counter() - t)
        t = time.perf_counter()
        _, want = C.evaluate(circ, {"toks_int_var": b}, also=nodes, mode="jit", cache=False)
        plain.append(time.perf_counter() - t)
    assert all(np.array_equal(got[n], want[n]) for n in nodes[:5])
    o, p = statistics.median(ours), statistics.median(plain)
    text = (f"run_with_cache {o * 1e3:7.2f} ms, evaluate(also=same {len(nodes)} nodes) {p * 1e3:7.2f} ms: "
            f"ratio {o / p:.2f}x")
    if with_tl:
        import torch

        from .tl_models import hooked_induction

        model = hooked_induction(w)
        tl = []
        for b in batches:
            x = torch.from_numpy(b[:, :-2])
            t = time.perf_counter()
            with torch.no_grad():
                model.run_with_cache(x)
            tl.append(time.perf_counter() - t)
        text += f"; TransformerLens run_with_cache {statistics.median(tl) * 1e3:7.2f} ms"
    return [(f"cache of every activation, {PROMPTS} prompts, second call, new inputs", text)]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-tl", action="store_true", help="ours only (no TransformerLens)")
    args = parser.parse_args(argv)
    with_tl = not args.no_tl
    if with_tl:
        from .tl_models import require

        require("torch", "transformer_lens")
    rows = _grid_rows(with_tl) + _cache_rows(with_tl)
    report("everyday analysis on the shipped induction model (CPU)", rows)


if __name__ == "__main__":
    main()
