"""GPT-2 small's first calls with an empty and with a warm compilation cache, against
TransformerLens on the same weights (issue 35's GPT-2 rows), each row in a new process as a user
would see it.

Runs only in the side-by-side environment (``benchmarks/tl_models.py`` has the recipe)::

    /work/ac-env/bin/python -m benchmarks.bench_gpt2_first                 # every row
    /work/ac-env/bin/python -m benchmarks.bench_gpt2_first --rows forward eap

GPT-2 small's shape (12 layers, d_model 768, random weights: ``transformers``' initialisation, seed
0), 8 prompts of 32 random tokens, their corrupted copies 8 other random prompts; our circuit is
``gpt2(config, weights, tokens_symbol(32), loss=True, split_heads=True)`` bound to the prompts (a
batch), TransformerLens' ``HookedTransformer`` the same weights (``tl_models.hooked_gpt2``).
Rows, ours the first call of its kind in the process (after the clean run of the same prompts,
but for the forward itself), TransformerLens' first call and the median of its next ones at its
best torch thread count (the faster of one thread and all cores):

- ``forward``: the loss over the batch, ``C.evaluate(c, {tokens: prompts})`` against ``tl(prompts)``
  (target: ours <= 2x TransformerLens' first forward);
- ``patching``: activation patching of all 144 heads' outputs over the batch, ``sweep`` of the
  144 ``patch(c, head, {'tokens': corrupt})`` against TransformerLens' ``patching`` module
  (``get_act_patch_attn_head_out_all_pos`` on the clean prompts with the corrupted cache, the
  metric the mean loss) (target <= 0.5x);
- ``attribution``: attribution patching of the 144 heads (``attribute``) against its hooks
  (a clean forward+backward and a corrupted forward with ``hook_z`` caches) (target <= 1x);
- ``eap``: EAP over every edge of the head-level graph (``discover(..., method='eap')``), ours
  only (target: the empty-cache call within 3x the warm one).

Each row runs in a new process twice on one new cache folder (``CIRCUITS_COMPILATION_CACHE``):
the first process has the empty cache, the second the cache the first filled (warm).  Every row
says how many XLA compilations (traces and compilations, ``jax.monitoring``) our call made on the
calling thread and in all threads.  Every value is checked against TransformerLens'.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

import numpy as np

from .common import XlaCounter, timed
from .tl_models import require

PROMPTS, TOKENS, LAYERS, HEADS = 8, 32, 12, 12
ROWS = ("forward", "patching", "attribution", "eap")
TARGETS = {"forward": 2.0, "patching": 0.5, "attribution": 1.0}




def _loss(logits, tokens):
    import torch

    return -torch.log_softmax(logits[:, :-1], -1).gather(-1, tokens[:, 1:, None])[..., 0]


def run_row(row: str, runs: int) -> dict:
    """One row in this process: ours (first call) and TransformerLens', values checked."""
    import torch
    import transformers

    import circuits as C
    from circuits import Symbol
    from circuits.backend.cache.background import wait_for_background
    from circuits.interp import attribute, discover, patch, sweep
    from circuits.models import gpt2, tokens_symbol

    from .common import fastest_torch_threads
    from .tl_models import hooked_gpt2

    counter = XlaCounter()
    torch.manual_seed(0)
    config = transformers.GPT2Config(use_cache=False, attn_implementation="eager")
    hf = transformers.GPT2LMHeadModel(config).eval()
    tl = hooked_gpt2(hf)
    rng = np.random.default_rng(0)
    clean = rng.integers(0, config.vocab_size, (PROMPTS, TOKENS))
    corrupt = rng.integers(0, config.vocab_size, (PROMPTS, TOKENS))
    state = {k: v.detach().numpy() for k, v in hf.state_dict().items()}
    sym = tokens_symbol(TOKENS)
    corrupt_sym = Symbol((TOKENS,), name="corrupt_tokens", dtype="int64")
    c = gpt2(config.to_dict(), state, sym, loss=True, split_heads=True)
    tokens = "toks_int_var"  # the builder's name for its tokens input
    feed = {tokens: clean, corrupt_sym: corrupt}
    inp, cinp = torch.as_tensor(clean), torch.as_tensor(corrupt)
    sites = [f"h{l}.attn.head{h}" for l in range(LAYERS) for h in range(HEADS)]
    out = {"row": row, "load": os.getloadavg()[0]}

    def ours(fn):
        before = counter.counts()
        dt, value = timed(fn)
        after = counter.counts()
        out.update(ours_s=dt, xla_here=after[0] - before[0], xla_all=after[1] - before[1])
        return value

    def forward():
        with torch.no_grad():
            return tl(inp)

    def theirs(fn):
        """TransformerLens: its first call (one torch thread), then the median of ``runs`` at its
        best thread count (the faster of one and all cores for a forward: every call of a row
        is forwards and backwards of the same shapes)."""
        dt, value = timed(fn)
        if runs == 0:  # its first call only (TransformerLens' patching module: 144 forwards a call)
            out.update(tl_first_s=dt, tl_s=dt, tl_threads=1, tl_runs=0)
            return value
        best, _ = fastest_torch_threads(forward, (1, os.cpu_count() or 1), runs=5)
        times = [timed(fn)[0] for _ in range(runs)]
        out.update(tl_first_s=dt, tl_s=statistics.median(times), tl_threads=best, tl_runs=runs)
        return value

    if row == "forward":
        value = ours(lambda: C.evaluate(c, {tokens: clean}))
        with torch.no_grad():
            ref = theirs(lambda: _loss(tl(inp), inp))
        np.testing.assert_allclose(value, ref.numpy(), rtol=1e-4, atol=1e-4)
        out["ratio"] = out["ours_s"] / out["tl_first_s"]  # first against first
        out["ratio_against"] = "TransformerLens' first forward"
        return out

    C.evaluate(c, {tokens: clean})  # the clean run of the same prompts
    wait_for_background()
    if row == "patching":
        import transformer_lens.patching as patching

        result = ours(lambda: sweep(c, {s: patch(c, s, {tokens: corrupt_sym}) for s in sites}, feed,
                                    progress=False))
        with torch.no_grad():
            _, cache = tl.run_with_cache(cinp, names_filter=lambda n: n.endswith("hook_z"))
            metric = lambda logits: _loss(logits, inp).mean()  # noqa: E731
            ref = theirs(lambda: patching.get_act_patch_attn_head_out_all_pos(tl, inp, cache, metric))
        got = np.array([[float(np.mean(result[f"h{l}.attn.head{h}"])) for h in range(HEADS)] for l in range(LAYERS)])
        np.testing.assert_allclose(got, ref.numpy(), rtol=2e-3, atol=2e-3)
        out["ratio"] = out["ours_s"] / out["tl_s"]
        out["ratio_against"] = "TransformerLens' patching module (median)"
    elif row == "attribution":
        from .bench_latency_tl import tl_attribution

        est = ours(lambda: attribute(c, sites, {tokens: corrupt_sym}, inputs=feed))
        ref = theirs(tl_attribution(tl, inp, inp[:, 1:], cinp, LAYERS, HEADS, last=False))
        for l in range(LAYERS):
            for h in range(HEADS):
                np.testing.assert_allclose(np.sum(est[f"h{l}.attn.head{h}"]), ref[l][h], rtol=5e-3, atol=5e-3)
        out["ratio"] = out["ours_s"] / out["tl_s"]
        out["ratio_against"] = "TransformerLens hooks (median)"
    elif row == "eap":
        metric = np.full(c.shape, 1.0 / np.prod(c.shape), np.float32)  # the mean loss
        found = ours(lambda: discover(c, {tokens: corrupt}, metric, method="eap", inputs={tokens: clean}))
        out["edges"] = len(found.scores)
    else:
        raise SystemExit(f"unknown row {row!r}: one of {', '.join(ROWS)}")
    return out


def main(argv=None):
    require("transformer_lens", "transformers")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", nargs="+", default=list(ROWS), choices=ROWS)
    parser.add_argument("--runs", type=int, default=3,
                        help="TransformerLens' timed calls after its first (0: its first call is its figure)")
    parser.add_argument("--here", action="store_true", help="one row in this process (the cache in force)")
    args = parser.parse_args(argv)
    if args.here:
        import torch

        torch.set_num_threads(1)
        for row in args.rows:
            print("RESULT " + json.dumps(run_row(row, args.runs)), flush=True)
        return
    results = []
    for row in args.rows:
        with tempfile.TemporaryDirectory() as cache:
            env = dict(os.environ, CIRCUITS_COMPILATION_CACHE=cache, CIRCUITS_PROGRESS="0")
            for label in ("empty", "warm"):
                done = subprocess.run([sys.executable, "-m", "benchmarks.bench_gpt2_first", "--here", "--rows", row,
                                       "--runs", str(args.runs)], env=env, capture_output=True, text=True)
                if done.returncode != 0:
                    print(done.stdout, done.stderr, file=sys.stderr)
                    raise SystemExit(f"row {row} ({label} cache) failed")
                line = next(ln for ln in done.stdout.splitlines() if ln.startswith("RESULT "))
                result = dict(json.loads(line[len("RESULT "):]), cache=label)
                results.append(result)
                print(_line(result), flush=True)
    by = {(r["row"], r["cache"]): r for r in results}
    print(f"\nGPT-2 small ({LAYERS} layers, d_model 768, random weights), {PROMPTS} prompts of {TOKENS} tokens")
    for row in args.rows:
        e, w = by[(row, "empty")], by[(row, "warm")]
        print(f"  {row:<12} empty {e['ours_s']:.2f} s / warm {w['ours_s']:.2f} s: empty / warm "
              f"{e['ours_s'] / w['ours_s']:.2f} (target <= {3 if row == 'eap' else 2})")


def _line(r: dict) -> str:
    text = (f"{r['row']:<12} {r['cache']:<5} ours {r['ours_s']:.2f} s ({r['xla_here']} XLA traces/compilations "
            f"on the calling thread, {r['xla_all']} in all)")
    if "tl_s" in r:
        text += (f"; TransformerLens first {r['tl_first_s']:.2f} s, then {r['tl_s']:.2f} s (median of {r['tl_runs']}, "
                 f"torch at {r['tl_threads']}); ratio ours / {r['ratio_against']} {r['ratio']:.2f} "
                 f"(target <= {TARGETS[r['row']]})")
    return text + f"; load {r['load']:.1f}"


if __name__ == "__main__":
    main()
