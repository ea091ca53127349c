"""A fresh process, from interpreter start to the first clean loss over a batch (issue 35): circuits
with an empty and with a warm compilation cache, against a bare torch process doing the same.

    python -m benchmarks.bench_fresh_process [--runs 5]

Shipped induction model, 50 prompts of 34 tokens.  Every process reads the same weights and
tokens from ``.npz`` files and computes the mean per-token loss over the batch:

- torch: ``import torch``, the hand-written attention-only forward of ``bench_dataset``
  (``TorchBatched``), torch's default threads, no grad;
- circuits: ``import circuits``, ``attn_only(weights, tokens_symbol(34), unique_names=True)``,
  ``C.evaluate(circuit, {tokens: batch}).mean()``; with an empty ``CIRCUITS_COMPILATION_CACHE`` (a
  new folder each run) and with a warm one (the folder an earlier identical process filled, and
  then waited for its background work, as a session that went on would have).

Each time is from the parent's launch of the process to the loss being known inside it (the
process's exit is not counted).  The runs alternate torch, empty, warm; every run is printed, with
what the circuits process did (nodes computed with numpy, XLA compilations, whether JAX was
imported), then the medians and the ratios (targets: empty <= 1.0, warm <= 0.8).  One untimed
round first writes the bytecode caches (an installed package has them).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from .common import report

ROWS, TOKENS = 50, 34
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_TORCH = """
import json, sys, time
import numpy as np
import torch
from benchmarks.bench_dataset import TorchBatched
w = dict(np.load(sys.argv[1]))
toks = np.load(sys.argv[2])
loss = float(TorchBatched(w).forward(toks).mean())
print(json.dumps({"at": time.time(), "loss": loss, "threads": torch.get_num_threads()}))
"""

_OURS = """
import json, sys, time
import numpy as np
import circuits as C
from circuits.models import attn_only, tokens_symbol
w = dict(np.load(sys.argv[1]))
toks = np.load(sys.argv[2])
sym = tokens_symbol(toks.shape[1])
loss = float(C.evaluate(attn_only(w, sym, unique_names=True), {sym: toks}).mean())
at = time.time()
run = C.backend.tiers.last_run()
jax = "jax" in sys.modules
if len(sys.argv) > 3:  # filling the cache: wait for the background work, as a session going on would
    from circuits.backend.cache.background import wait_for_background
    wait_for_background()
print(json.dumps({"at": at, "loss": loss, "numpy": run["numpy"], "computed": run["computed"],
                  "compiled": run["kernels"]["compiled"], "loaded": run["kernels"]["loaded"], "jax": jax}))
"""


def _run(script: str, args: list, cache: str | None) -> dict:
    env = dict(os.environ, PYTHONPATH=ROOT)
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # an installed package has its bytecode compiled
    if cache is not None:
        env["CIRCUITS_COMPILATION_CACHE"] = cache
    start = time.time()
    out = subprocess.run([sys.executable, "-c", script, *args], env=env, capture_output=True, text=True, check=True,
                         cwd=ROOT)
    found = json.loads(out.stdout.strip().splitlines()[-1])
    found["seconds"] = found["at"] - start
    return found


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args(argv)
    from circuits.models import induction_weights

    with tempfile.TemporaryDirectory() as tmp:
        weights, tokens = os.path.join(tmp, "weights.npz"), os.path.join(tmp, "tokens.npy")
        np.savez(weights, **induction_weights())
        np.save(tokens, np.random.default_rng(0).integers(1, 64, (ROWS, TOKENS)))
        files = [weights, tokens]
        warm = os.path.join(tmp, "warm")
        # untimed: bytecode caches written, the warm folder filled by an identical process
        _run(_TORCH, files, None)
        _run(_OURS, files, os.path.join(tmp, "first"))
        _run(_OURS, [*files, "fill"], warm)
        times = {"torch": [], "empty": [], "warm": []}
        losses = set()
        for r in range(args.runs):
            for kind in times:
                if kind == "torch":
                    found = _run(_TORCH, files, None)
                    said = f"torch threads {found['threads']}"
                else:
                    cache = warm if kind == "warm" else os.path.join(tmp, f"empty{r}")
                    found = _run(_OURS, files, cache)
                    said = (f"{found['numpy']}/{found['computed']} nodes by numpy, {found['compiled']} XLA "
                            f"compilations, {found['loaded']} loaded, jax imported: {found['jax']}")
                times[kind].append(found["seconds"])
                losses.add(round(found["loss"], 4))
                print(f"run {r + 1} {kind:5s} {found['seconds']:.3f} s  loss {found['loss']:.6f}  ({said})", flush=True)
        assert len(losses) == 1, losses  # every process computed the same loss
        med = {k: statistics.median(v) for k, v in times.items()}
        report(f"a fresh process to the first clean loss over {ROWS} prompts of {TOKENS} tokens, median of {args.runs}", [
            ("bare torch process", f"{med['torch']:.3f} s"),
            ("circuits, empty compilation cache", f"{med['empty']:.3f} s: ratio {med['empty'] / med['torch']:.2f} "
                                                  "(target <= 1.0)"),
            ("circuits, warm compilation cache", f"{med['warm']:.3f} s: ratio {med['warm'] / med['torch']:.2f} "
                                                 "(target <= 0.8)"),
        ])


if __name__ == "__main__":
    main()
