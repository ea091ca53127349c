"""The shared blocks the families of issue 38 are made of, each against its oracle: ALiBi against
``transformers``' BLOOM and Falcon tensors, GPT-J's interleaved rotary against its
``apply_rotary_pos_emb``, BLOOM's GELU against its own, the exact top-k against ``torch.topk`` and
its tie rule, the mixture of experts and the fused projections' three row layouts against numpy,
per-head LayerNorms against ``torch.nn.functional.layer_norm``."""

import numpy as np
import pytest

import circuits as C
from circuits.models import blocks
from circuits.models.sequence import Layout

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")


@pytest.mark.parametrize("n_heads", [1, 4, 6, 12, 16, 40])
def test_alibi_tables_are_transformers_tensors(n_heads):
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor as bloom_alibi
    from transformers.models.falcon.modeling_falcon import build_alibi_tensor as falcon_alibi

    mask = torch.ones(1, 300, dtype=torch.int64)
    want = bloom_alibi(mask, n_heads, torch.float32)[:, 0, :].numpy().T  # [positions, heads]
    got = blocks.alibi_table(n_heads, 300, "float32")
    # torch's float32 pow may land a slope on the neighbouring float (see alibi_slopes)
    np.testing.assert_allclose(got, want, rtol=2e-7, atol=0)
    want = falcon_alibi(mask, n_heads, torch.float32)[:, 0, :].numpy().T
    np.testing.assert_array_equal(blocks.alibi_table(n_heads, 300, "bfloat16"), want)  # bfloat16 rounding: exact
    slopes64 = blocks.alibi_slopes(n_heads, "float64")
    np.testing.assert_allclose(slopes64, blocks.alibi_slopes(n_heads), rtol=1e-6)  # float32 powers drift
    assert slopes64.dtype == np.float64


def test_alibi_of_a_step_gathers_the_keys_positions():
    table = blocks.alibi_table(4, 16, "float64")
    step = Layout.step(1, 3)
    bias = step.alibi(table, 2, 2)
    assert bias.shape == (2, 2, 4)
    got = C.evaluate(bias, {"key_positions": np.array([0, 1, 0, 2])}, dtype="float64")
    np.testing.assert_array_equal(got.reshape(4, 4), table[[0, 1, 0, 2]].T)
    with pytest.raises(C.CircuitError, match=r"a table \[positions, 2\] is needed, got \[16, 4\]"):
        step.alibi(table, 1, 2)


def test_interleaved_rotary_is_gptj_apply_rotary_pos_emb():
    from transformers.models.gptj.modeling_gptj import apply_rotary_pos_emb, create_sinusoidal_positions

    rng = np.random.default_rng(0)
    heads, n, head_dim, rot = 3, 7, 10, 6
    x = rng.standard_normal((1, n, heads, head_dim)).astype(np.float32)  # GPT-J's [batch, seq, heads, dim]
    sincos = create_sinusoidal_positions(32, rot)[torch.arange(2, 2 + n)][None]
    sin, cos = torch.split(sincos, rot // 2, dim=-1)
    xt = torch.tensor(x)
    want = torch.cat([apply_rotary_pos_emb(xt[..., :rot], sin, cos), xt[..., rot:]], dim=-1)[0].numpy()
    cos_t, sin_t = blocks.rotary_tables(np.arange(2, 2 + n), head_dim, 10000.0, "float32", rot, interleaved=True)
    got = C.evaluate(blocks.apply_rotary(C.Array(x[0].transpose(1, 0, 2)), "nsc", C.Array(cos_t),
                                         C.Array(blocks.rotary_sin_signed(sin_t, rot, interleaved=True)), "r", rot,
                                         interleaved=True))
    np.testing.assert_allclose(got.transpose(1, 0, 2), want, atol=1e-6)


def test_bloom_gelu_is_bloom_gelu_forward():
    from transformers.models.bloom.modeling_bloom import bloom_gelu_forward

    x = np.linspace(-6, 6, 101)
    got = C.evaluate(blocks.bloom_gelu(C.Array(x.reshape(1, -1)), "g"), dtype="float64")[0]
    np.testing.assert_allclose(got, bloom_gelu_forward(torch.tensor(x)).numpy(), rtol=1e-15, atol=1e-15)


def test_top_k_mask_is_torch_topk_and_breaks_exact_ties_by_index():
    rng = np.random.default_rng(1)
    scores = rng.standard_normal((50, 7))
    for k in (1, 2, 3, 7):
        got = C.evaluate(blocks.top_k_mask(C.Array(scores), k, "t"), dtype="float64")
        want = np.zeros_like(scores)
        np.put_along_axis(want, torch.topk(torch.tensor(scores), k).indices.numpy(), 1.0, axis=1)
        np.testing.assert_array_equal(got, want)
    ties = np.array([[1.0, 1.0, 1.0, 0.0, 1.0], [0.5, 0.5, 0.5, 0.5, 0.5]])
    got = C.evaluate(blocks.top_k_mask(C.Array(ties), 2, "t"), dtype="float64")
    np.testing.assert_array_equal(got, [[1, 1, 0, 0, 0], [1, 1, 0, 0, 0]])  # lower indices first
    with pytest.raises(C.CircuitError, match=r"top_k=6 must be an int from 1 to the number of experts \(5\)"):
        blocks.top_k_mask(C.Array(ties), 6, "t")


def test_moe_is_the_sparse_sum_of_the_picked_experts():
    rng = np.random.default_rng(2)
    s, d, f, n_experts, k = 6, 4, 5, 4, 2
    x = rng.standard_normal((s, d))
    router = rng.standard_normal((n_experts, d))
    experts = [(rng.standard_normal((f, d)), rng.standard_normal((f, d)), rng.standard_normal((d, f)))
               for _ in range(n_experts)]
    got = C.evaluate(blocks.moe(C.Array(x), C.Array(router), [tuple(map(C.Array, e)) for e in experts], top_k=k,
                                activation="silu", name="m"), dtype="float64")
    want = np.zeros((s, d))
    for i in range(s):  # per token: softmax, the k best, renormalised, each picked expert's SwiGLU
        logits = router @ x[i]
        p = np.exp(logits - logits.max())
        p /= p.sum()
        picked = np.argsort(-p)[:k]
        for e in picked:
            g, u, dn = experts[e]
            gate = g @ x[i]
            want[i] += p[e] / p[picked].sum() * (dn @ (gate / (1 + np.exp(-gate)) * (u @ x[i])))
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("layout, n_kv, group", [("blocks", 1, 4), ("blocks", 2, 2), ("heads", 3, 1), ("grouped", 2, 3)])
def test_fused_projections_cut_each_layout_as_its_family_does(layout, n_kv, group):
    rng = np.random.default_rng(3)
    s, d, c = 5, 6, 4
    rows = (n_kv * group + 2 * n_kv) * c
    x, w, b = rng.standard_normal((s, d)), rng.standard_normal((rows, d)), rng.standard_normal(rows)
    y = x @ w.T + b
    if layout == "blocks":  # all queries, all keys, all values
        nq = n_kv * group * c
        q = y[:, :nq].reshape(s, n_kv, group, c)
        k, v = (y[:, nq + i * n_kv * c:nq + (i + 1) * n_kv * c].reshape(s, n_kv, c) for i in range(2))
    else:  # per key-value head: its queries, its key, its value ('heads': one query each)
        per = y.reshape(s, n_kv, group + 2, c)
        q, k, v = per[:, :, :group], per[:, :, group], per[:, :, group + 1]
    got = blocks.fused_projections(C.Array(x), C.Array(w), C.Array(b), layout=layout, n_kv=n_kv, group=group,
                                   head_dim=c, name="p")
    for node, want in zip(got, (q.transpose(1, 2, 0, 3), k.transpose(1, 0, 2), v.transpose(1, 0, 2))):
        np.testing.assert_allclose(C.evaluate(node, dtype="float64"), want, rtol=1e-12)


def test_layer_norm_with_a_scale_per_head_is_stablelms_per_head_norm():
    rng = np.random.default_rng(4)
    n, g, s, c = 2, 3, 5, 4
    x, scale = rng.standard_normal((n, g, s, c)), rng.standard_normal((n, g, c))
    got = C.evaluate(blocks.layer_norm(C.Array(x), C.Array(scale), None, "ln", axes="ngsc", scale_axes="ngc"),
                     dtype="float64")
    want = torch.nn.functional.layer_norm(torch.tensor(x), (c,), eps=1e-5).numpy() * scale[:, :, None, :]
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
