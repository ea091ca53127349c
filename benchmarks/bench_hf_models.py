"""GPT-2-small-sized model (124M parameters, random weights): building its circuit from a state
dict, and its logits for 128 tokens through ``C.compile`` (and after ``rewrites.optimize``)
against the ``transformers`` model's eager torch forward, in this process, on this CPU; plus the
seed-002 123B architecture built from its config alone (placeholders, one decode step).

Run: ``.venv/bin/python -m benchmarks.bench_hf_models``.  Targets (issue 11): build ≤ 2 s beyond
hashing the weights; compiled logits ≤ 1.0× torch eager.
"""

from __future__ import annotations

import time

import numpy as np

import circuits as C
from circuits.hashing import content_hash
from circuits.models import from_huggingface, gpt2, llama

from .common import interleaved_medians, report

SEED_002 = dict(model_type="mistral", hidden_size=12288, num_attention_heads=96, num_key_value_heads=8,
                head_dim=128, num_hidden_layers=88, intermediate_size=28672, vocab_size=32768, hidden_act="silu",
                rope_theta=1e6, rms_norm_eps=1e-5)


def main(runs: int = 10, n_tokens: int = 128):
    import torch
    import transformers

    import rewrites

    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config()).eval()  # GPT-2 small sizes
    config = model.config.to_dict()
    weights = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    n_params = sum(v.numel() for v in model.parameters())
    toks = np.random.default_rng(0).integers(0, config["vocab_size"], n_tokens)

    t = time.perf_counter()
    for v in weights.values():
        content_hash(v)
    hash_s = time.perf_counter() - t
    fresh = {k: v.copy() for k, v in weights.items()}  # new arrays: nothing cached by identity
    t = time.perf_counter()
    circuit = gpt2(config, fresh, toks)
    build_s = time.perf_counter() - t

    compiled = C.compile(circuit)
    optimized = C.compile(rewrites.optimize(circuit))
    tt = torch.tensor(toks[None])

    def torch_forward():
        with torch.no_grad():
            return model(tt).logits

    want = torch_forward()[0].numpy()
    assert np.abs(compiled() - want).max() <= 1e-3, np.abs(compiled() - want).max()
    assert np.abs(optimized() - want).max() <= 1e-3
    med = interleaved_medians({"torch": torch_forward, "compile": lambda: compiled(),
                               "optimize": lambda: optimized()}, runs=runs)

    t = time.perf_counter()
    big = llama(SEED_002, None, [5], past_len=4096)
    big_s = time.perf_counter() - t
    t = time.perf_counter()
    from_huggingface(SEED_002, [5])
    big_full_s = time.perf_counter() - t
    del big
    report(f"GPT-2 small ({n_params / 1e6:.1f}M params), {n_tokens} tokens, torch {torch.__version__}, "
           f"{torch.get_num_threads()} torch threads", [
               ("hash all weights (content_hash)", f"{hash_s:.3f} s"),
               ("gpt2(config, state_dict, tokens)", f"{build_s:.3f} s  (beyond hashing: {build_s - hash_s:.3f} s)"),
               ("torch eager forward", f"{med['torch'] * 1e3:.1f} ms"),
               ("C.compile(circuit)()", f"{med['compile'] * 1e3:.1f} ms  ratio {med['compile'] / med['torch']:.2f}"),
               ("C.compile(rewrites.optimize(c))()", f"{med['optimize'] * 1e3:.1f} ms  ratio "
                                                     f"{med['optimize'] / med['torch']:.2f}"),
               ("seed-002 123B placeholders, decode step vs 4096 cached", f"{big_s:.3f} s"),
               ("seed-002 123B placeholders, 1-token forward", f"{big_full_s:.3f} s"),
           ])


if __name__ == "__main__":
    main()
