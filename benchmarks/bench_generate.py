"""Generation on a GPT-2-small-sized model (124M parameters, random weights saved by
``transformers``; CPU, float32): 64 greedy tokens from a 16-token prompt with
``circuits.models.Model.generate`` (KV cache, one compiled step) against ``transformers``'
``generate`` on the same folder.

- warm: both sides in this process after a first call (our step compiled); 5 interleaved runs,
  medians (wall time; the steered ratio also in process CPU time, all threads, which other
  processes' load on a shared machine barely moves); torch at its fastest thread count; also with
  a steering edit (a vector added to the residual after block 6 at every step) and a batch of 8
  prompts of 9 to 16 tokens (padded on the left on both sides);
- first call: a fresh process that loads the model then generates once, its own imports
  outside the timing: ours with an empty compilation cache (a new folder), then again with the
  cache that run filled; ``transformers``' first ``generate`` after ``from_pretrained``; and the
  peak resident memory of each process (load and generate).

Run: ``python -m benchmarks.bench_generate``.  Targets (issue 37): warm <= 1.5x ``generate``;
first call with an empty cache <= 3x; steering <= 1.1x without; batch of 8 <= 1.5x batched
``generate``; peak memory <= 1.2x.
"""

from __future__ import annotations

import shutil
import statistics
import tempfile

import numpy as np

from .common import interleaved_times, medians_of, report
from .hf_folder import child, gpt2_small_folder

NEW, PROMPT, BATCH = 64, 16, 8

FIRST_OURS = """
import time, json
from benchmarks.hf_folder import peak_mb
import numpy as np
import circuits.models as M
t = time.perf_counter()
m = M.load({folder!r})
loaded = time.perf_counter() - t
prompt = np.random.default_rng(0).integers(0, 50257, {prompt})
t = time.perf_counter()
m.generate(prompt, {new}, stop_at_eos=False)
first = time.perf_counter() - t
print(json.dumps({{"load": loaded, "first": first, "peak_mb": peak_mb()}}))
"""

FIRST_THEIRS = """
import time, json
from benchmarks.hf_folder import peak_mb
import numpy as np, torch, transformers
transformers.logging.set_verbosity_error()
torch.set_num_threads({threads})
t = time.perf_counter()
m = transformers.AutoModelForCausalLM.from_pretrained({folder!r}).eval()
loaded = time.perf_counter() - t
prompt = torch.tensor(np.random.default_rng(0).integers(0, 50257, {prompt})[None])
t = time.perf_counter()
with torch.inference_mode():
    m.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens={new}, do_sample=False,
               eos_token_id=None, pad_token_id=0)
first = time.perf_counter() - t
print(json.dumps({{"load": loaded, "first": first, "peak_mb": peak_mb()}}))
"""


def warm(folder, runs: int):
    import torch
    import transformers

    import circuits as C
    import circuits.models as M

    transformers.logging.set_verbosity_error()
    ours = M.load(folder)
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, 50257, PROMPT)
    rows = [rng.integers(0, 50257, n) for n in np.linspace(9, PROMPT, BATCH).astype(int)]
    width = max(len(r) for r in rows)
    ids = torch.tensor(np.stack([np.pad(r, (width - len(r), 0)) for r in rows]))
    mask = torch.tensor(np.stack([np.r_[np.zeros(width - len(r)), np.ones(len(r))] for r in rows]).astype(np.int64))
    vector = rng.normal(size=768).astype(np.float32)
    steer = lambda c: c.update("h6", lambda n: C.Add(n, C.Array(vector, name="steer")))  # noqa: E731

    def theirs(ids=torch.tensor(prompt[None]), mask=None):
        with torch.inference_mode():
            return hf.generate(ids, attention_mask=torch.ones_like(ids) if mask is None else mask, max_new_tokens=NEW,
                               do_sample=False, eos_token_id=None, pad_token_id=0)

    # torch at its fastest thread count on this machine (a 64-token generation each)
    by_threads = {}
    for n in sorted({1, torch.get_num_threads()}):
        torch.set_num_threads(n)
        theirs()
        by_threads[n] = medians_of(interleaved_times({"t": theirs}, runs=2, warmup=0))["t"]
    threads = min(by_threads, key=by_threads.get)
    torch.set_num_threads(threads)

    got, want = ours.generate(prompt, NEW, stop_at_eos=False), theirs()[0].numpy()
    agree = int(np.argmax(got != want)) if np.any(got != want) else len(got)
    fns = {"transformers generate": theirs,
           "circuits generate": lambda: ours.generate(prompt, NEW, stop_at_eos=False),
           "circuits generate, steered": lambda: ours.generate(prompt, NEW, edit=steer, stop_at_eos=False),
           "transformers generate, batch of 8": lambda: theirs(ids, mask),
           "circuits generate, batch of 8": lambda: ours.generate(rows, NEW, stop_at_eos=False)}
    wall, cpu = interleaved_times(fns, runs=runs, warmup=1, cpu=True)
    return threads, medians_of(wall), medians_of(cpu), agree - PROMPT


def main(runs: int = 5, first_runs: int = 2):
    folder = gpt2_small_folder()
    try:
        threads, wall, cpu, agree = warm(str(folder), runs)
        rows = [(k, f"{v:.2f} s") for k, v in wall.items()]
        rows += [
            ("greedy tokens equal to transformers' before the first difference (float32)", f"{agree} of {NEW}"),
            ("ratio warm circuits / transformers (target <= 1.5)",
             f"{wall['circuits generate'] / wall['transformers generate']:.2f}"),
            ("ratio steered / not steered (target <= 1.1)",
             f"{wall['circuits generate, steered'] / wall['circuits generate']:.2f}"),
            ("ratio steered / not steered, process CPU time (all threads)",
             f"{cpu['circuits generate, steered'] / cpu['circuits generate']:.2f}"),
            ("ratio batch of 8 circuits / transformers (target <= 1.5)",
             f"{wall['circuits generate, batch of 8'] / wall['transformers generate, batch of 8']:.2f}"),
        ]
        report(f"GPT-2 small, {NEW} greedy tokens from {PROMPT}; warm, one process, median of {runs} interleaved runs "
               f"(torch on {threads} thread{'s' if threads > 1 else ''})", rows)

        firsts = {"circuits, empty cache": [], "circuits, cache filled": [], "transformers": []}
        for _ in range(first_runs):
            cache = tempfile.mkdtemp(prefix="circuits-cache-")
            try:
                ours_code = FIRST_OURS.format(folder=str(folder), prompt=PROMPT, new=NEW)
                env = {"CIRCUITS_COMPILATION_CACHE": cache}
                firsts["circuits, empty cache"].append(child(ours_code, env))
                firsts["circuits, cache filled"].append(child(ours_code, env))
                firsts["transformers"].append(child(FIRST_THEIRS.format(folder=str(folder), prompt=PROMPT, new=NEW,
                                                                        threads=threads)))
            finally:
                shutil.rmtree(cache, ignore_errors=True)
        med = {k: {f: statistics.median(r[f] for r in v) for f in ("load", "first", "peak_mb")}
               for k, v in firsts.items()}
        hf = med["transformers"]
        rows = [(k, f"load {v['load']:.2f} s, first generate {v['first']:.2f} s, peak {v['peak_mb']:.0f} MB")
                for k, v in med.items()]
        rows += [
            ("ratio first generate, empty cache, circuits / transformers (target <= 3)",
             f"{med['circuits, empty cache']['first'] / hf['first']:.2f}"),
            ("ratio first generate, cache filled, circuits / transformers",
             f"{med['circuits, cache filled']['first'] / hf['first']:.2f}"),
            ("ratio peak memory (load and generate) circuits / transformers (target <= 1.2)",
             f"{med['circuits, empty cache']['peak_mb'] / hf['peak_mb']:.2f}"),
        ]
        report(f"first call in a fresh process (after load; imports outside), median of {first_runs} runs", rows)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
