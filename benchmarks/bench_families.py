"""The families of issue 38 at a common small size: for each, a random-weight ``transformers``
model with two layers (hidden size 256, 8 heads, MLP 1024, vocabulary 4096; each family's own
features as the verification matrix configures them), its logits for 128 tokens through
``C.compile`` of ``Model.circuit`` (per-head sites, as users get it, and ``split_heads=False``)
against the torch model's eager forward, medians of interleaved runs in this process on this CPU.
The two sides are checked to agree (1e-4 relative) before timing.

Run: ``.venv/bin/python -m benchmarks.bench_families [family ...]``.  Target (issue 38): compiled
logits ≤ 1.0× torch eager.
"""

from __future__ import annotations

import sys

import numpy as np

import circuits as C
from circuits.models import Model, matrix

from .common import fastest_torch_threads, interleaved_medians, report

D, HEADS, FFN, VOCAB, TOKENS, POSITIONS = 256, 8, 1024, 4096, 128, 256
_DECODER = dict(hidden_size=D, num_attention_heads=HEADS, num_hidden_layers=2, intermediate_size=FFN,
                max_position_embeddings=POSITIONS)
SIZES = {
    "gptj": dict(n_embd=D, n_head=HEADS, n_layer=2, n_inner=FFN, n_positions=POSITIONS, rotary_dim=16),
    "gpt_neo": dict(hidden_size=D, num_heads=HEADS, num_layers=2, intermediate_size=FFN,
                    max_position_embeddings=POSITIONS, window_size=64),
    "gemma": dict(_DECODER, head_dim=32),
    "qwen3": dict(_DECODER, num_hidden_layers=2, num_key_value_heads=4, head_dim=32, max_window_layers=1,
                  sliding_window=64),
    "phi3": dict(_DECODER, num_key_value_heads=4, sliding_window=64),
    "mixtral": dict(_DECODER, num_key_value_heads=4, intermediate_size=FFN // 2),
    "stablelm": dict(_DECODER, num_key_value_heads=4),
    "falcon": dict(hidden_size=D, num_attention_heads=HEADS, num_hidden_layers=2, num_kv_heads=4,
                   ffn_hidden_size=FFN, max_position_embeddings=POSITIONS),
    "falcon-7b": dict(hidden_size=D, num_attention_heads=HEADS, num_hidden_layers=2, ffn_hidden_size=FFN,
                      max_position_embeddings=POSITIONS),
    "falcon-rw": dict(hidden_size=D, num_attention_heads=HEADS, num_hidden_layers=2, ffn_hidden_size=FFN,
                      max_position_embeddings=POSITIONS),
    "bloom": dict(hidden_size=D, n_head=HEADS, n_layer=2),
}


def one(family: str, runs: int) -> list[tuple[str, str]]:
    import torch

    hf = matrix.hf_model(family, 0, vocab=VOCAB, **SIZES[family])
    state = {k: v.detach().numpy().copy() for k, v in hf.state_dict().items()}
    m = Model(hf.config.to_dict(), state)
    toks = np.random.default_rng(1).integers(1, VOCAB, TOKENS)
    tt = torch.tensor(toks[None])

    def torch_forward():
        with torch.no_grad():
            return hf(tt).logits

    per_head = C.compile(m.circuit(toks))
    fused = C.compile(m.circuit(toks, split_heads=False))
    want = torch_forward()[0].numpy()
    scale = np.abs(want).max()
    for f in (per_head, fused):
        err = np.abs(np.asarray(f()) - want).max() / scale
        assert err <= 1e-4, (family, err)
    threads, _ = fastest_torch_threads(torch_forward, (1, 2), runs=5)
    med = interleaved_medians({"torch": torch_forward, "heads": lambda: per_head(), "fused": lambda: fused()},
                              runs=runs)
    n_params = sum(p.numel() for p in hf.parameters())
    return [(f"{family}: {n_params / 1e6:.1f}M params; torch eager forward ({threads} thread{'s' * (threads > 1)})",
             f"{med['torch'] * 1e3:.1f} ms"),
            (f"{family}: compiled per-head circuit", f"{med['heads'] * 1e3:.1f} ms"),
            (f"{family}: compiled split_heads=False", f"{med['fused'] * 1e3:.1f} ms"),
            (f"{family}: ratio per-head circuit / torch (target <= 1.0)", f"{med['heads'] / med['torch']:.2f}"),
            (f"{family}: ratio split_heads=False / torch", f"{med['fused'] / med['torch']:.2f}")]


def main(families=None, runs: int = 15):
    import torch

    rows = []
    for family in families or SIZES:
        rows += one(family, runs)
    report(f"two layers, d={D}, {HEADS} heads, MLP {FFN}, vocab {VOCAB}, {TOKENS} tokens, float32, torch "
           f"{torch.__version__}; medians of {runs} interleaved runs", rows)


if __name__ == "__main__":
    main(sys.argv[1:] or None)
