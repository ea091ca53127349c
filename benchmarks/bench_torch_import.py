"""Benchmark: importing GPT-2 small with ``from_torch`` against ``torch.export.export`` itself.

Run: ``python -m benchmarks.bench_torch_import [--runs 3] [--layers 12] [--tokens 16]``.

A ``transformers`` GPT2LMHeadModel with GPT-2 small's config (124M parameters, random weights,
``use_cache=False``, eager attention) is built once.  Timed, interleaved in one process:

- the baseline: ``torch.export.export(model, (ids,))``;
- ours: ``from_torch(model, (ids,))``, which runs that same export and then converts the graph
  (parameters hashed into Arrays, constants folded, ops converted).

Target (issue 11): ratio <= 2.0, i.e. the conversion costs no more than the export.  The conversion
alone (``from_torch(program)`` on a program already exported) is reported too.  Interning: the
circuit of one run is dropped before the next, so every run hashes the weights anew.
"""

from __future__ import annotations

import argparse
import gc
import time

import numpy as np

from .common import report


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--tokens", type=int, default=16)
    args = parser.parse_args(argv)

    import torch
    import transformers

    from circuits.importers import from_torch

    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=args.layers, use_cache=False, attn_implementation="eager")
    model = transformers.GPT2LMHeadModel(config).eval()
    ids = torch.from_numpy(np.random.default_rng(0).integers(0, config.vocab_size, (1, args.tokens)))
    n_params = sum(p.numel() for p in model.parameters())

    def export():
        return torch.export.export(model, (ids,))

    def full():
        return from_torch(model, (ids,))

    program = export()  # warm-up of both paths
    circuit = full()
    want = model(ids).logits.detach().numpy()
    import circuits as C

    got = C.evaluate(circuit, {"input_ids": ids.numpy()})
    assert np.abs(got - want).max() < 1e-3, np.abs(got - want).max()
    del circuit
    times = {"export": [], "from_torch": [], "convert": []}
    for _ in range(args.runs):
        for key, fn in (("export", export), ("from_torch", full), ("convert", lambda: from_torch(program))):
            gc.collect()
            t = time.perf_counter()
            result = fn()
            times[key].append(time.perf_counter() - t)
            del result
    med = {k: float(np.median(v)) for k, v in times.items()}
    report(
        f"torch.export import of GPT-2 ({n_params / 1e6:.0f}M parameters, {args.layers} layers, "
        f"{args.tokens} tokens), medians of {args.runs}",
        [
            ("torch.export.export", f"{med['export']:.2f} s"),
            ("from_torch(model) (export + convert)", f"{med['from_torch']:.2f} s"),
            ("from_torch(program) (convert only)", f"{med['convert']:.2f} s"),
            ("ratio from_torch / export (target <= 2.0)", f"{med['from_torch'] / med['export']:.2f}"),
        ],
    )


if __name__ == "__main__":
    main()
