"""C.summary on builder circuits (repeated layers and heads collapse: what models.describe did
before it merged into summary), and the placeholder / KV-cache build of the seed-002
architecture (123B parameters) from its config alone."""

import numpy as np

import circuits as C
from circuits.models import gpt2, llama
from circuits.models.gpt2 import random_gpt2_weights

SEED_002 = dict(model_type="mistral", hidden_size=12288, num_attention_heads=96, num_key_value_heads=8,
                head_dim=128, num_hidden_layers=88, intermediate_size=28672, vocab_size=32768, hidden_act="silu",
                rope_theta=1e6, rms_norm_eps=1e-5)


def test_summary_collapses_repeated_layers_and_counts_params():
    cfg = dict(n_embd=8, n_head=2, n_layer=4, vocab_size=11, n_positions=16, activation_function="gelu_new")
    w = random_gpt2_weights(cfg)
    c = gpt2(cfg, w, np.array([1, 2, 3]), split_heads=True)
    s = C.summary(c, repeats=1)
    text = str(s)
    per_layer = sum(v.size for k, v in w.items() if k.startswith("transformer.h.0."))
    layer_line = next(line for line in text.splitlines() if line.strip().startswith("layer {0..3} ×4"))
    assert f"each 75 nodes · {per_layer} params" in layer_line
    assert "h0.attn.head{0..1} ×2" in text  # heads collapsed inside the layer
    arrays = {n for n in C.toposort(c) if isinstance(n, C.Array)}
    assert s.params == sum(a.value.size for a in arrays if a.dtype.startswith("float"))  # not the tokens
    assert s.n_nodes == C.count_nodes(c)
    assert s.group("h3.attn.head1").node is c.get_unique("h3.attn.head1")  # members stay reachable
    shallow = str(C.summary(c, max_depth=1, repeats=1))
    assert "head{" not in shallow and len(shallow.splitlines()) < len(text.splitlines())
    # by default only runs of more than 8 collapse: 4 layers print one by one
    assert "layer 3" in str(C.summary(c)) and "×4" not in str(C.summary(c))


def test_layers_that_differ_are_not_merged():
    cfg = dict(n_embd=8, n_head=2, n_layer=2, vocab_size=11, n_positions=16, activation_function="relu")
    c = gpt2(cfg, random_gpt2_weights(cfg), np.array([1, 2, 3]))
    assert "layer {0..1} ×2" in str(C.summary(c, repeats=1))
    other = C.Add(c, C.Array(np.zeros((3, 11), np.float32), name="h5.extra"), name="out")
    lines = str(C.summary(other, repeats=1)).splitlines()
    assert not any("{0..1}" in line or "×3" in line for line in lines)  # layers 0, 1, 5 differ: one by one
    assert any(line.strip().startswith("layer 5") for line in lines)


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
    text = str(C.summary(c, max_depth=1))
    assert "layer {0..87} ×88  · each 55 nodes · 1,384,144,896 params" in text
    assert "122,610,073,857 params" in text.splitlines()[0] and len(text.splitlines()) < 20


def test_placeholder_decode_step_evaluates_after_fill_random():
    cfg = dict(SEED_002, hidden_size=16, num_attention_heads=4, num_key_value_heads=2, head_dim=4,
               num_hidden_layers=2, intermediate_size=24, vocab_size=13)
    c = C.fill_random(llama(cfg, None, [5, 6], past_len=3), seed=1)
    rng = np.random.default_rng(0)
    inputs = {f"h{l}.attn.past_{kv}": rng.standard_normal((2, 3, 4)).astype(np.float32)
              for l in range(2) for kv in "kv"}
    out = C.evaluate(c, inputs)
    assert out.shape == (2, 13) and np.isfinite(out).all()
