"""Benchmark: what copying an Array's value costs when a big model is built or loaded.

Run: ``python -m benchmarks.bench_weight_copies [--runs 3] [--scale 1.0]``.

An Array keeps a value of its own (issue 33 item 3): a numpy value is copied unless the library
allocated it and alone holds it.  Each row builds GPT-2 small (124M float32 parameters, random
weights, 8 tokens) in a fresh process and reports the build's wall time and the process's peak
resident memory above what it held before building (``VmHWM``, reset first), median of ``--runs``:

- ``writeable``: the state dict as numpy arrays (what ``random_gpt2_weights`` or a torch
  ``state_dict()`` gives): copied once, as before;
- ``read-only mmap``: the same arrays from ``np.load(..., mmap_mode='r')``: copied now, kept
  before (a file rewritten in place changed them);
- ``load``: ``circuits.load`` of the built circuit saved to a file: the reader's own memory,
  never copied.
Run it on the commit before and after to compare; both are in BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

_CHILD = r"""
import json, os, sys, time
import numpy as np
import circuits
from circuits.models import gpt2
from circuits.models.gpt2 import random_gpt2_weights
kind, folder, scale = sys.argv[1], sys.argv[2], float(sys.argv[3])


def resident(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field))


def start():
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the peak resident size (VmHWM) starts again from the current one
    return resident("VmRSS:")


cfg = json.load(open(os.path.join(folder, "config.json")))
tokens = np.arange(8)
if kind == "load":
    before = start()
    t = time.perf_counter()
    c = circuits.load(os.path.join(folder, "gpt2.circuit"))
else:
    if kind == "writeable":
        weights = random_gpt2_weights(cfg, seed=0)
    else:
        weights = {k: np.load(os.path.join(folder, k + ".npy"), mmap_mode="r") for k in json.load(
            open(os.path.join(folder, "keys.json")))}
    before = start()
    t = time.perf_counter()
    c = gpt2(cfg, weights, tokens)
seconds = time.perf_counter() - t
peak = resident("VmHWM:") - before
print(json.dumps({"seconds": seconds, "peak_mb": peak / 1024}))
"""


def prepare(folder: str, scale: float) -> None:
    import numpy as np

    import circuits
    from circuits.models import gpt2
    from circuits.models.gpt2 import random_gpt2_weights

    d = max(8, int(768 * scale)) // 12 * 12
    cfg = dict(n_embd=d, n_head=12, n_layer=12, vocab_size=max(8, int(50257 * scale)),
               n_positions=max(16, int(1024 * scale)), activation_function="gelu_new")
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg, f)
    weights = random_gpt2_weights(cfg, seed=0)
    for k, v in weights.items():
        np.save(os.path.join(folder, k + ".npy"), v)
    with open(os.path.join(folder, "keys.json"), "w") as f:
        json.dump(list(weights), f)
    circuits.save(gpt2(cfg, weights, np.arange(8)), os.path.join(folder, "gpt2.circuit"))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--scale", type=float, default=1.0)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        prepare(folder, args.scale)
        rows = {}
        for kind in ("writeable", "read-only mmap", "load"):
            got = []
            for _ in range(args.runs):
                out = subprocess.run([sys.executable, "-c", _CHILD, kind.split()[0], folder, str(args.scale)],
                                     check=True, capture_output=True, text=True).stdout
                got.append(json.loads(out.strip().splitlines()[-1]))
            rows[kind] = (statistics.median(g["seconds"] for g in got), statistics.median(g["peak_mb"] for g in got))
    for kind, (seconds, peak) in rows.items():
        print(f"  {kind:15s} build {seconds:6.2f} s   peak memory above the start {peak:7.0f} MB")


if __name__ == "__main__":
    main()
