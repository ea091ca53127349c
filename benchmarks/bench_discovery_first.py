"""Discovery's first calls, as a researcher meets them: ``discover`` on GPT-2 small's shape (12
layers, d 768, 12 heads, 32 tokens, random weights, split heads: 32,491 edges) in a new process,
twice: with an empty compilation cache, then with the cache the first process left.  Each method
is called twice in each process (the second call's time is the in-process repeat).

Run: ``.venv/bin/python -m benchmarks.bench_discovery_first [eap eap-ig eap-ig-mask]`` (a
temporary cache directory; nothing else is touched).  No target: the figures go to BENCHMARKS.md.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

from .common import report

CHILD = r"""
import sys, time
import numpy as np
from circuits.interp import discover
from circuits.models.gpt2 import gpt2, random_gpt2_weights
from benchmarks.common import CompileClock

cfg = dict(model_type="gpt2", n_layer=12, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024,
           layer_norm_epsilon=1e-5, activation_function="gelu_new")
toks = np.random.default_rng(0).integers(0, 50257, 32)
c = gpt2(cfg, random_gpt2_weights(cfg), toks, loss=True, split_heads=True)
clock = CompileClock()
for method in sys.argv[1:]:
    for call in ("first", "again"):
        before = clock.read()
        t = time.perf_counter()
        discover(c, {"tokens": toks[::-1].copy()}, method=method)
        print(f"{method}\t{call}\t{time.perf_counter() - t:.2f} s\t{clock.since(before)}", flush=True)
"""


def main(argv=None):
    methods = (argv if argv is not None else sys.argv[1:]) or ["eap", "eap-ig", "eap-ig-mask"]
    rows = []
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, CIRCUITS_COMPILATION_CACHE=cache)
        for label in ("empty cache", "warm cache, new process"):
            out = subprocess.run([sys.executable, "-c", CHILD, *methods], env=env, capture_output=True, text=True,
                                 check=True, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
            for line in out.stdout.splitlines():
                method, call, seconds, compiled = line.split("\t")
                rows.append((f"{label}: {method}, {call} call", f"{seconds:>9}  ({compiled})"))
    report("discover's first calls on GPT-2 small's shape (mode 'auto')", rows)


if __name__ == "__main__":
    main()
