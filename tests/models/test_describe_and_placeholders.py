"""describe() on builder circuits, and the placeholder / KV-cache build of the seed-002
architecture (123B parameters) from its config alone."""

import numpy as np

import circuits as C
from circuits.models import describe, gpt2, llama
from circuits.models.gpt2 import random_gpt2_weights

SEED_002 = dict(model_type="mistral", hidden_size=12288, num_attention_heads=96, num_key_value_heads=8,
                head_dim=128, num_hidden_layers=88, intermediate_size=28672, vocab_size=32768, hidden_act="silu",
                rope_theta=1e6, rms_norm_eps=1e-5)


def test_describe_collapses_layers_and_counts_params():
    cfg = dict(n_embd=8, n_head=2, n_layer=4, vocab_size=11, n_positions=16, activation_function="gelu_new")
    w = random_gpt2_weights(cfg)
    c = gpt2(cfg, w, np.array([1, 2, 3]), split_heads=True)
    text = str(describe(c))
    per_layer = sum(v.size for k, v in w.items() if k.startswith("transformer.h.0."))
    layer_line = next(line for line in text.splitlines() if line.startswith("├── h{0..3} ×4"))
    assert f"each {per_layer} params" in layer_line
    assert "head{0..1} ×2" in text  # heads collapsed inside the layer
    arrays = {n for n in C.toposort(c) if isinstance(n, C.Array)}
    assert describe(c).params == sum(a.value.size for a in arrays)
    assert describe(c).nodes == sum(1 for n in C.toposort(c) if n.children)
    shallow = str(describe(c, max_depth=1))
    assert "head{" not in shallow and len(shallow.splitlines()) < len(text.splitlines())


def test_layers_that_differ_are_not_merged():
    cfg = dict(n_embd=8, n_head=2, n_layer=2, vocab_size=11, n_positions=16, activation_function="relu")
    c = gpt2(cfg, random_gpt2_weights(cfg), np.array([1, 2, 3]))
    text = str(describe(c))
    assert "h{0..1} ×2" in text
    other = C.Add(c, C.Array(np.zeros((3, 11), np.float32), name="h5.extra"), name="out")
    lines = str(describe(other)).splitlines()
    assert not any("h{0..1}" in line or "×3" in line for line in lines)  # h0, h1, h5 differ: listed one by one
    assert any(line.startswith("├── h5.extra") for line in lines)


def test_seed_002_architecture_from_config_alone():
    c = llama(SEED_002, None, [5], past_len=4096)
    assert c.shape == (1, 32768)
    arrays = [n for n in C.toposort(c) if isinstance(n, C.Array)]
    weights = [a for a in arrays if a.is_placeholder]
    d, L, ffn, kv = 12288, 88, 28672, 8 * 128
    per_layer = 2 * d + d * d * 2 + 2 * kv * d + 3 * d * ffn
    assert sum(a.size if hasattr(a, "size") else int(np.prod(a.shape)) for a in weights) == \
        L * per_layer + 2 * 32768 * d + d
    symbols = [n for n in C.toposort(c) if isinstance(n, C.Symbol)]
    assert len(symbols) == 2 * L and all(s.shape == (8, 4096, 128) for s in symbols)
    text = str(describe(c, max_depth=1))
    assert "h{0..87} ×88" in text and "122.61B params" in text.splitlines()[0]


def test_placeholder_decode_step_evaluates_after_fill_random():
    cfg = dict(SEED_002, hidden_size=16, num_attention_heads=4, num_key_value_heads=2, head_dim=4,
               num_hidden_layers=2, intermediate_size=24, vocab_size=13)
    c = C.fill_random(llama(cfg, None, [5, 6], past_len=3), seed=1)
    rng = np.random.default_rng(0)
    inputs = {f"h{l}.attn.past_{kv}": rng.standard_normal((2, 3, 4)).astype(np.float32)
              for l in range(2) for kv in "kv"}
    out = C.evaluate(c, inputs)
    assert out.shape == (2, 13) and np.isfinite(out).all()
