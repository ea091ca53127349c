"""Residual-stream path expansion against a plain-numpy forward pass written here (never the library)."""

import numpy as np
import pytest

import circuits as C
from circuits.errors import CircuitError
from circuits.interp import expand_residual, residual_terms
from circuits.models import attn_only, random_weights

N_HEADS = 2


def _weights(dtype=np.float32):
    return random_weights(seed=3, vocab=13, d_model=8, n_heads=N_HEADS, head_size=4, n_layers=2,
                          max_positions=16, dtype=dtype)


TOKENS = np.array([1, 5, 2, 7, 3, 9, 4])


def _reference(weights, tokens):
    """Per-source pieces of the seed model in float64: embeddings, per-layer LN statistics,
    attention patterns and OV maps, head outputs."""
    w = {k: np.asarray(v, np.float64) for k, v in weights.items()}
    inp = tokens[:-2]
    n = len(inp)
    pos = w["t.w.pos_embeds"][:n]
    allowed = np.tril(np.ones((n, n), bool))
    ref = {"embeds": w["t.w.tok_embeds"][inp]}
    x = ref["embeds"]

    def center(t):
        t = np.broadcast_to(t, x.shape)
        return t - t.mean(-1, keepdims=True)

    for layer in range(2):
        mean = x.mean(-1, keepdims=True)
        s = 1 / np.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + 1e-5)
        ln = (x - mean) * s * w[f"a{layer}.ln.w.scale"] + w[f"a{layer}.ln.w.bias"]
        ref[f"s{layer}"] = s
        ref[f"ln{layer}"] = ln
        out = 0
        for h in range(N_HEADS):
            q = (ln + pos) @ w[f"a{layer}.w.q"][h].T
            k = (ln + pos) @ w[f"a{layer}.w.k"][h].T
            scores = np.where(allowed, q @ k.T / np.sqrt(q.shape[-1]), -10000.0)
            e = np.exp(scores - scores.max(-1, keepdims=True))
            probs = e / e.sum(-1, keepdims=True)
            ov = lambda v, layer=layer, h=h, probs=probs: probs @ (  # noqa: E731
                np.broadcast_to(v, x.shape) @ w[f"a{layer}.w.v"][h].T) @ w[f"a{layer}.w.o"][h].T
            ref[f"ov{layer}.{h}"] = ov
            ref[f"b{layer}.a.head{h}"] = ov(ln)
            out = out + ov(ln)
        x = x + out
        ref[f"b{layer}"] = x
    mean = x.mean(-1, keepdims=True)
    ref["sF"] = 1 / np.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + 1e-5)
    ref["center"] = center
    ref["w"] = w
    return ref


def _values(terms):
    """Every term's value from one evaluation (one compile)."""
    nodes = list(terms.values())
    _, values = C.evaluate(C.Add(*nodes), dtype="float64", also=nodes)
    return {k: np.asarray(values[t]) for k, t in terms.items()}


def test_depth1_residual_sum_is_each_source():
    weights = _weights()
    loss = attn_only(weights, TOKENS)
    ref = _reference(weights, TOKENS)
    got = _values(residual_terms(loss, "b1"))
    assert sorted(got) == ["b0.a.head0", "b0.a.head1", "b1.a.head0", "b1.a.head1", "idxed_embeds"]
    np.testing.assert_allclose(got["idxed_embeds"], ref["embeds"], atol=1e-6)
    for name in ["b0.a.head0", "b0.a.head1", "b1.a.head0", "b1.a.head1"]:
        np.testing.assert_allclose(got[name], ref[name], atol=2e-5)
    np.testing.assert_allclose(sum(got.values()), ref["b1"], atol=5e-5)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_frozen_final_layer_norm_terms(dtype):
    weights = _weights(dtype)
    loss = attn_only(weights, TOKENS)
    ref = _reference(weights, TOKENS)
    w = ref["w"]
    got = _values(residual_terms(loss, "final.call", layer_norm="freeze"))
    assert list(got) == ["final.ln.w.bias", "b1.a.head0", "b1.a.head1", "b0.a.head0", "b0.a.head1",
                         "idxed_embeds"]
    tol = 1e-9 if dtype == np.float64 else 5e-5
    # every term has the value's full shape: the bias [d] broadcast over the positions (it was [d]
    # alone, and a direct-logit-attribution loop over the terms indexed positions and crashed)
    assert {v.shape for v in got.values()} == {(len(TOKENS) - 2, w["final.ln.w.bias"].shape[0])}
    np.testing.assert_allclose(got["final.ln.w.bias"], np.broadcast_to(w["final.ln.w.bias"], got["b1.a.head0"].shape),
                               atol=tol)
    for name, source in [("b1.a.head0", ref["b1.a.head0"]), ("b0.a.head1", ref["b0.a.head1"]),
                         ("idxed_embeds", ref["embeds"])]:
        want = ref["center"](source) * ref["sF"] * w["final.ln.w.scale"]
        np.testing.assert_allclose(got[name], want, atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_depth2_paths_through_layer0_heads(dtype):
    weights = _weights(dtype)
    loss = attn_only(weights, TOKENS)
    ref = _reference(weights, TOKENS)
    w, center = ref["w"], ref["center"]
    got = _values(residual_terms(loss, "b1", depth=2, layer_norm="freeze"))
    tol = 1e-9 if dtype == np.float64 else 5e-5
    for j in range(N_HEADS):
        ov1 = ref[f"ov1.{j}"]
        lin1 = lambda t: center(t) * ref["s1"] * w["a1.ln.w.scale"]  # noqa: E731
        np.testing.assert_allclose(got[f"b1.a.head{j}<-a1.ln.w.bias"], ov1(w["a1.ln.w.bias"]), atol=tol)
        np.testing.assert_allclose(got[f"b1.a.head{j}<-idxed_embeds"], ov1(lin1(ref["embeds"])), atol=tol)
        for i in range(N_HEADS):
            np.testing.assert_allclose(got[f"b1.a.head{j}<-b0.a.head{i}"], ov1(lin1(ref[f"b0.a.head{i}"])),
                                       atol=tol)
    for i in range(N_HEADS):
        lin0 = center(ref["embeds"]) * ref["s0"] * w["a0.ln.w.scale"]
        np.testing.assert_allclose(got[f"b0.a.head{i}<-idxed_embeds"], ref[f"ov0.{i}"](lin0), atol=tol)
    assert len(got) == N_HEADS * (N_HEADS + 2) + N_HEADS * 2 + 1  # the embeddings stay one term
    np.testing.assert_allclose(sum(got.values()), ref["b1"], atol=tol * 10)


def test_depth3_paths_add_up_and_name_the_whole_path():
    weights = _weights(np.float64)
    loss = attn_only(weights, TOKENS)
    terms = residual_terms(loss, "final.call", depth=3, layer_norm="freeze")
    assert "b1.a.head1<-b0.a.head0<-idxed_embeds" in terms
    assert "b1.a.head1<-b0.a.head0<-a0.ln.w.bias" in terms
    total = sum(_values(terms).values())
    np.testing.assert_allclose(total, C.evaluate(loss.get_unique("final.call"), dtype="float64"), atol=1e-9)


@pytest.mark.parametrize("at, kw", [("b1", {}), ("a1.norm", {}), ("a1.norm", {"layer_norm": "freeze"}),
                                    ("final.call", {"depth": 2, "layer_norm": "freeze"})])
def test_expanded_circuit_keeps_the_value(at, kw):
    weights = _weights(np.float64)
    loss = attn_only(weights, TOKENS)
    expanded = expand_residual(loss, at, **kw)
    assert expanded != loss
    np.testing.assert_allclose(C.evaluate(expanded, dtype="float64"), C.evaluate(loss, dtype="float64"),
                               rtol=1e-9, atol=1e-9)
    C.parse(expanded.to_text())  # it prints and parses


def test_keep_rewrites_only_the_layer_norm_input():
    loss = attn_only(_weights(), TOKENS)
    expanded = expand_residual(loss, "a1.norm")
    norm = expanded.get_unique("a1.norm")
    x = norm.get_unique("b0")
    assert [t.name for t in x.children] == ["b0.a.head0", "b0.a.head1", "idxed_embeds"]
    # b1 still adds the original b0 (only the LayerNorm's input was rewritten)
    assert loss.get_unique("b0") in expanded.get_unique("b1").children


def test_stop_at_keeps_a_summand_whole():
    loss = attn_only(_weights(), TOKENS)
    terms = residual_terms(loss, "b1", stop_at="b0")
    assert list(terms) == ["b1.a.head0", "b1.a.head1", "b0"]


def test_bad_input_is_a_clear_error():
    loss = attn_only(_weights(), TOKENS)
    with pytest.raises(CircuitError, match="neither a residual sum"):
        residual_terms(loss, "b1.a.head0")
    with pytest.raises(CircuitError, match="layer_norm='freeze'"):
        residual_terms(loss, "b1", depth=2)
    with pytest.raises(CircuitError, match="expected 'keep'"):
        residual_terms(loss, "b1", layer_norm="frozen")
    with pytest.raises(C.SelectionError):
        residual_terms(loss, "no.such.node")
