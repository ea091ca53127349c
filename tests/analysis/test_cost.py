"""circuits.cost: FLOPs, bytes and peak memory, each checked against counts worked out by hand
(or, for the seed model, an analytic count of its matmuls)."""

import numpy as np
import pytest

import circuits as C
from circuits.analysis.cost import KINDS
from circuits.backend.lower.memory import live_bytes, toposort_order
from circuits.models import attn_only, random_weights


def placeholder(shape, name):
    return C.Array.placeholder(shape, "0" * 24, name=name)


def test_seed_model_matmul_multiplies_equal_the_analytic_count():
    w = random_weights(seed=0)
    toks = np.random.default_rng(0).integers(0, 50259, 302)
    c = C.cost(attn_only(w, toks))
    layers, heads, P, d, dh, V = 2, 8, 300, 256, 32, 50259
    per_head = 3 * P * d * dh + P * P * dh + P * P * dh + P * dh * d  # q, k, v; scores; mix values; out
    layer_norms = (layers + 1) * P * d  # the variance: sum over d of squares, one per position
    unembed = P * d * V
    assert c.matmul_multiplies == layers * heads * per_head + layer_norms + unembed
    # every multiply of a contraction is a mul, and every kind is a known one
    assert c.flops_by_kind["mul"] >= c.matmul_multiplies
    assert set(c.flops_by_kind) <= set(KINDS)
    assert c.flops == sum(c.flops_by_kind.values())
    assert c.unknown_functions == []


def test_matmul_counts_multiplies_and_adds_exactly():
    x, w = placeholder((5, 7), "x"), placeholder((7, 3), "w")
    c = C.cost(C.Einsum.from_spec("ab,bc->ac", x, w, name="y"))
    assert c.flops_by_kind == {"mul": 5 * 3 * 7, "add": 5 * 3 * 6}
    assert c.matmul_multiplies == 105
    assert c["y"].bytes_read == (35 + 21) * 4 and c.bytes_written == 15 * 4
    assert c.input_bytes == (35 + 21) * 4
    assert c.peak_bytes == 15 * 4


def test_sum_outer_product_add_and_functions_by_hand():
    x = C.Symbol((4, 6), name="x")
    total = C.Einsum.from_spec("ab->a", x, name="rows")            # 4 * 5 adds
    outer = C.Einsum.from_spec("a,b->ab", total, total, name="o")   # 16 muls, no adds (nothing summed)
    s = C.Add(outer, outer, C.Scalar(1.0), name="s")               # 2 adds per entry
    sm = C.GeneralFunction("softmax", s, name="sm")                 # per row of 4: 3 cmp, 7 add, 4 exp, 4 div
    c = C.cost(sm)
    assert c["rows"].flops == {"add": 20}
    assert c["o"].flops == {"mul": 16} and c["o"].matmul_multiplies == 0
    assert c["s"].flops == {"add": 32}
    assert c["sm"].flops == {"cmp": 12, "add": 28, "exp": 16, "div": 16}
    assert c.flops_by_kind == {"mul": 16, "add": 80, "exp": 16, "div": 16, "cmp": 12}
    assert list(c.flops_by_kind) == ["mul", "add", "div", "exp", "cmp"]  # KINDS order


def test_gather_reads_what_it_selects():
    table = placeholder((1000, 8), "table")
    idx = C.Array(np.array([3, 1, 4], np.int64), name="idx")
    g = C.GeneralFunction("gen_index_at_0_c", table, idx, name="g")
    i = C.Index(table, (slice(0, 2),), name="i")
    c = C.cost([g, i])
    assert c["g"].bytes_read == 3 * 8 * 4 + 3 * 8 and c["g"].flops == {}
    assert c["i"].bytes_read == 2 * 8 * 4
    assert c.flops == 0


def test_peak_follows_last_uses_and_tags_alias():
    x = C.Symbol((100,), name="x")
    a = C.GeneralFunction("exp", x, name="a")        # 400 bytes, used by b and d
    b = C.GeneralFunction("sin", a, name="b")        # 400
    t = C.Tag(b, name="t")                           # no storage of its own
    d = C.Add(a, t, name="d")                        # 400
    e = C.Einsum.from_spec("a->", d, name="e")       # 4
    order = toposort_order(e)
    assert [n.name for n in order] == ["a", "b", "t", "d", "e"]
    # a; a+b; a+b (tag); a+b+d then a, b freed; d+e then d freed
    assert live_bytes(order, [e]) == [400, 800, 800, 1200, 404]
    assert C.cost(e).peak_bytes == 1200


def test_memory_aware_order_lowers_the_peak():
    y = C.Symbol((500,), name="y")
    x = C.Symbol((1000,), name="x")
    big_out = C.Einsum.from_spec("a,b->ab", y, y, name="big_out")            # 1 MB result, no temps
    small_out = C.Einsum.from_spec("ab->", C.Einsum.from_spec("a,b->ab", x, x, name="outer"), name="small_out")
    root = C.Add(big_out, small_out, name="root")
    c = C.cost(root)
    MB4, MB1 = 1000 * 1000 * 4, 500 * 500 * 4
    # backend order: big_out first, then outer (4 MB) and its sum while big_out is held
    assert c.peak_bytes == MB1 + MB4 + 4
    # memory-aware: outer, its sum, free it, then big_out; root: big_out + small_out + root
    assert [n.name for n in c.memory_order] == ["outer", "small_out", "big_out", "root"]
    assert c.memory_order_peak_bytes == MB4 + 4 < c.peak_bytes


def test_placeholders_and_unknown_functions_and_reports():
    import jax.numpy as jnp

    C.register_function("cumsum_cost_demo", lambda shapes: shapes[0], lambda x: jnp.cumsum(x, -1), core_ndim=1)
    try:
        w = placeholder((64, 64), "w")
        h = C.GeneralFunction("cumsum_cost_demo", C.Einsum.from_spec("ab,bc->ac", w, w, name="ww"), name="h")
        c = C.cost(h)
    finally:
        C.unregister_function("cumsum_cost_demo")
    assert c.unknown_functions == ["cumsum_cost_demo"] and c["h"].flops == {}
    text = str(c)
    assert text.startswith("Cost of 'h'") and "Total cost:" in text and "matmul multiplies: 262144" in text
    assert "#0 'ww' Einsum ab,bc->ac" in text and "x: 'w' [64,64]" in text
    assert "not counted (no FunctionSpec.cost): cumsum_cost_demo" in text
    rows = c.table(sort="flops").splitlines()
    assert rows[1].split()[1] == "'ww'" and len(rows) == 3
    assert "<table>" in c._repr_html_() and "ww" in c._repr_html_()
    with pytest.raises(C.CircuitError, match="no computed node named 'nope'"):
        c["nope"]
    with pytest.raises(C.CircuitError, match="sort="):
        c.table(sort="time")


def test_float64_doubles_bytes_but_not_int_bytes():
    x = C.Symbol((10,), name="x")
    i = C.Symbol((10,), name="i", dtype="int32")
    c32, c64 = C.cost([C.GeneralFunction("exp", x, name="e"), C.Add(i, i, name="ii")]), None
    c64 = C.cost([C.GeneralFunction("exp", x, name="e"), C.Add(i, i, name="ii")], dtype="float64")
    assert c64["e"].bytes_written == 2 * c32["e"].bytes_written == 80
    assert c64["ii"].bytes_written == c32["ii"].bytes_written == 40


def test_deep_chain_costs_without_recursion(low_recursion_limit):
    x = C.Symbol((3,), name="x")
    node = x
    for _ in range(3000):
        node = C.GeneralFunction("exp", node)
    c = C.cost(node)
    assert c.flops_by_kind == {"exp": 9000} and c.peak_bytes == 24


def test_seed_002_decode_step_from_the_llama_builder_matches_the_analytic_matmul_count():
    """The seed-002 architecture (88 layers, d 12288, 96 query / 8 KV heads of 128, SwiGLU 28672,
    vocab 32768): one decode step against a 4096-long KV cache given as Symbols, built from its
    config alone (placeholders), costed without weights."""
    from circuits.models import llama

    config = dict(model_type="mistral", hidden_size=12288, num_attention_heads=96, num_key_value_heads=8,
                  head_dim=128, num_hidden_layers=88, intermediate_size=28672, vocab_size=32768,
                  hidden_act="silu", rope_theta=1e6, rms_norm_eps=1e-5)
    c = C.cost(llama(config, None, [5], past_len=4096))
    d, layers, ffn, heads, kv, dh, vocab, past = 12288, 88, 28672, 96, 8, 128, 32768, 4096
    per_layer = (d * heads * dh + 2 * d * kv * dh      # q, k, v projections
                 + 2 * heads * (past + 1) * dh          # scores and the weighted sum of values
                 + heads * dh * d                       # output projection
                 + 3 * d * ffn                          # SwiGLU: gate, up, down
                 + 2 * d)                               # two RMS norms: the sum of squares
    assert c.matmul_multiplies == layers * per_layer + d + d * vocab  # + the final norm, the unembedding
    assert c.flops_by_kind["exp"] > 0 and c.peak_bytes > 0
    text = str(c)
    assert "matmul multiplies" in text and "'h87.mlp'" in text


def test_gpt2_small_matmul_multiplies_equal_the_analytic_count():
    from circuits.models import gpt2

    cfg = dict(n_embd=768, n_head=12, n_layer=12, vocab_size=50257, n_positions=1024, activation_function="gelu_new")
    c = C.cost(gpt2(cfg, None, np.arange(128)))  # placeholders: no weights needed
    d, layers, vocab, P, heads, dh, ff = 768, 12, 50257, 128, 12, 64, 3072
    per_layer = (3 * P * d * d           # fused q, k, v
                 + 2 * heads * P * P * dh  # scores, weighted values
                 + P * d * d             # output projection
                 + 2 * P * d * ff        # MLP in and out
                 + 2 * P * d)            # two layer norms: the sum of squares of the variance
    assert c.matmul_multiplies == layers * per_layer + P * d + P * d * vocab  # final norm, tied unembedding
