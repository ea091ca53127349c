"""Loading a GPT-2-small-sized HuggingFace folder (random weights saved by ``transformers``, 498 MB
of float32 safetensors): ``circuits.models.load`` against ``transformers``'
``AutoModelForCausalLM.from_pretrained``, each in a fresh process with its own imports (jax and
circuits; torch and transformers), the two interleaved run after run; the time from the first
import to the loaded model, and the process's peak resident memory.  Medians.

Run: ``python -m benchmarks.bench_load``.  Target (issue 37): time <= 1.0x ``from_pretrained``.
The peak memory is printed too; the issue's memory target is over loading *and* generating
(``bench_generate``): ``from_pretrained`` leaves its memory-mapped weights untouched until the first
forward, where ``load`` reads and hashes every one.
"""

from __future__ import annotations

import shutil
import statistics

from .common import report
from .hf_folder import child, gpt2_small_folder

OURS = """
import time, json
from benchmarks.hf_folder import peak_mb
t = time.perf_counter()
import circuits.models as M
m = M.load({folder!r})
dt = time.perf_counter() - t
print(json.dumps({{"seconds": dt, "peak_mb": peak_mb()}}))
"""

THEIRS = """
import time, json
from benchmarks.hf_folder import peak_mb
t = time.perf_counter()
import torch, transformers
transformers.logging.set_verbosity_error()
m = transformers.AutoModelForCausalLM.from_pretrained({folder!r})
dt = time.perf_counter() - t
print(json.dumps({{"seconds": dt, "peak_mb": peak_mb()}}))
"""


def main(runs: int = 5):
    folder = gpt2_small_folder()
    try:
        sides = {"circuits.models.load": OURS.format(folder=str(folder)),
                 "transformers from_pretrained": THEIRS.format(folder=str(folder))}
        for code in sides.values():  # warm-up: the file in the page cache, the .pyc files written
            child(code)
        got = {k: [] for k in sides}
        for _ in range(runs):
            for k, code in sides.items():
                got[k].append(child(code))
        med = {k: (statistics.median(r["seconds"] for r in v), statistics.median(r["peak_mb"] for r in v))
               for k, v in got.items()}
        ours, theirs = med["circuits.models.load"], med["transformers from_pretrained"]
        rows = [(k, f"{s:.2f} s, peak {mb:.0f} MB") for k, (s, mb) in med.items()]
        rows += [("ratio load time circuits / transformers (target <= 1.0)", f"{ours[0] / theirs[0]:.2f}"),
                 ("peak memory circuits / transformers (from_pretrained maps its weights untouched)",
                  f"{ours[1] / theirs[1]:.2f}")]
        report(f"GPT-2 small folder (124M parameters, float32), fresh process each, median of {runs} interleaved runs",
               rows)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
