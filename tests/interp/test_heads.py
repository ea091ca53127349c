"""split_heads on a hand-built fused-head attention layer, against per-head numpy attention."""

import numpy as np
import pytest

import circuits as C
from circuits.errors import CircuitError
from circuits.interp import split_heads
from circuits.models.blocks import attention_fused, causal_mask, layer_norm, neg_inf_bias

H, P, D, DH = 3, 5, 6, 4


def _numpy_head(x, qk, wq, wk, wv, wo):
    q, k, v = qk @ wq.T, qk @ wk.T, x @ wv.T
    scores = np.where(np.tril(np.ones((P, P), bool)), q @ k.T / np.sqrt(DH), -10000.0)
    e = np.exp(scores - scores.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)) @ v @ wo.T


def _layer(dtype):
    rng = np.random.default_rng(1)
    raw = {n: rng.standard_normal(s).astype(dtype) for n, s in
           [("x", (P, D)), ("pos", (P, D)), ("q", (H, DH, D)), ("k", (H, DH, D)), ("v", (H, DH, D)),
            ("o", (H, D, DH))]}
    x = C.Array(raw["x"], name="resid")
    norm = layer_norm(x, C.Array(np.ones(D, dtype), name="ln.w"), C.Array(np.zeros(D, dtype), name="ln.b"), "norm")
    qk = C.Add(norm, C.Array(raw["pos"], name="pos"), name="a.qk_input")
    mask = C.Array(causal_mask(P).astype(dtype), name="mask")
    w = [C.Array(raw[n], name=f"w.{n}") for n in "qkvo"]
    attn = attention_fused(norm, qk, *w, mask, neg_inf_bias(mask), "b0.a")
    return C.Add(attn, x, name="b0"), raw


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_each_head_is_numpy_attention(dtype):
    circuit, raw = _layer(dtype)
    split = split_heads(circuit, "b0.a")
    attn = split.get_unique("b0.a")
    assert [c.name for c in attn.children] == [f"b0.a.head{h}" for h in range(H)]
    x = raw["x"].astype(np.float64)
    n = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)
    tol = 1e-9 if dtype == np.float64 else 2e-4
    _, values = C.evaluate(attn, dtype="float64", also=list(attn.children))
    for h in range(H):
        want = _numpy_head(n, n + raw["pos"], raw["q"][h], raw["k"][h], raw["v"][h], raw["o"][h])
        np.testing.assert_allclose(values[attn.children[h]], want, atol=tol, rtol=tol)
        # each head reads only its own slice of every weight
        slices = [i for i in C.toposort(attn.children[h]) if isinstance(i, C.Index)]
        assert {i.children[0].name for i in slices} == {"w.q", "w.k", "w.v", "w.o"}
        assert all(i.index[0] == h for i in slices)
    np.testing.assert_allclose(C.evaluate(split, dtype="float64"), C.evaluate(circuit, dtype="float64"),
                               atol=tol, rtol=tol)


def test_nodes_outside_the_layer_are_untouched():
    circuit, _ = _layer(np.float32)
    split = split_heads(circuit, "b0.a")
    assert split.children[1] is circuit.children[1]                    # the residual input
    assert split.get_unique("norm") is circuit.get_unique("norm")      # the LayerNorm the heads read
    assert split.get_unique("mask") is circuit.get_unique("mask")


def test_not_a_fused_output_is_a_clear_error():
    circuit, _ = _layer(np.float32)
    with pytest.raises(CircuitError, match="not an Einsum"):
        split_heads(circuit, "b0")
    with pytest.raises(CircuitError, match="head axis"):
        split_heads(circuit, circuit.get_unique("a.v"))  # sums over the model axis, not a head axis


def test_split_and_batch_heads_are_inverses_and_their_three_homes_name_each_other():
    import rewrites
    from circuits.backend.lower import head_batching
    from circuits.interp import heads

    circuit, _ = _layer(np.float64)
    split = split_heads(circuit, "b0.a")
    fused = rewrites.batch_heads(split)
    attn = fused.get_unique("b0.a")
    assert isinstance(attn, C.Einsum) and len(split.get_unique("b0.a").children) == H
    assert not fused.get(C.select.Regex(r"^b0\.a\.head\d$"), require=False)  # no per-head node left
    np.testing.assert_allclose(C.evaluate(fused, dtype="float64", batch_heads=False),
                               C.evaluate(circuit, dtype="float64"), atol=1e-9)
    # one idea, three jobs: each home says where the other two are
    homes = {"circuits.backend.lower.head_batching": head_batching.__doc__, "rewrites.batch_heads":
             rewrites.heads.__doc__, "circuits.interp.split_heads": heads.__doc__}
    for doc in homes.values():
        assert all(name in doc for name in homes)
