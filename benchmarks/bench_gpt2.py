"""GPT-2 small's logits (12 layers, random weights, 128 tokens) through ``C.compile`` against a
hand-written ``jax.jit`` GPT-2 (``benchmarks/handwritten_gpt2.py``) and the ``transformers`` model's
eager torch forward, in one process, runs interleaved, medians.

Run: ``.venv/bin/python -m benchmarks.bench_gpt2 [--runs 5] [--tokens 128]``.  Target (issue 24):
``compile`` <= 1.05x the hand-written ``jax.jit``; ``compile(rewrites.optimize(c))`` no slower than
``compile``.
"""

from __future__ import annotations

import argparse
import functools

import jax
import numpy as np

import circuits as C
from circuits.models import gpt2

from .common import interleaved_medians, report
from .handwritten_gpt2 import logits


def main(runs: int = 5, n_tokens: int = 128, n_layer: int = 12):
    import torch
    import transformers

    import rewrites

    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=n_layer)).eval()
    config = model.config.to_dict()
    weights = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    toks = np.random.default_rng(0).integers(0, config["vocab_size"], n_tokens)
    circuit = gpt2(config, weights, toks)
    compiled = C.compile(circuit)
    optimized = C.compile(rewrites.optimize(circuit))
    wj = {k: jax.device_put(v) for k, v in weights.items() if not k.endswith((".attn.bias", ".attn.masked_bias"))}
    tj = jax.device_put(toks.astype(np.int32))
    hand = jax.jit(functools.partial(logits, n_layer=config["n_layer"], n_head=config["n_head"],
                                     eps=config["layer_norm_epsilon"]))
    tt = torch.tensor(toks[None])

    def torch_forward():
        with torch.no_grad():
            return model(tt).logits

    want = torch_forward()[0].numpy()
    for got in (compiled(), optimized(), np.asarray(hand(wj, tj))):
        assert np.abs(got - want).max() <= 1e-3, np.abs(got - want).max()
    t = interleaved_medians({"compile": lambda: compiled(), "optimize": lambda: optimized(),
                             "hand": lambda: hand(wj, tj).block_until_ready(), "torch": torch_forward}, runs=runs)
    report(f"GPT-2 small logits ({config['n_layer']} layers, {n_tokens} tokens), {jax.devices()[0].platform}, "
           f"medians of {runs} interleaved runs", [
               ("C.compile(circuit)", f"{t['compile'] * 1e3:8.1f} ms"),
               ("C.compile(rewrites.optimize(circuit))", f"{t['optimize'] * 1e3:8.1f} ms"),
               ("hand-written jax.jit", f"{t['hand'] * 1e3:8.1f} ms"),
               ("torch eager", f"{t['torch'] * 1e3:8.1f} ms"),
               ("ratio compile / hand-written jit (target <= 1.05)", f"{t['compile'] / t['hand']:8.3f}"),
               ("ratio optimize / compile (target <= 1.0)", f"{t['optimize'] / t['compile']:8.3f}"),
               ("ratio compile / torch eager", f"{t['compile'] / t['torch']:8.3f}"),
           ])
    return t


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--layers", type=int, default=12)
    args = parser.parse_args()
    main(runs=args.runs, n_tokens=args.tokens, n_layer=args.layers)
