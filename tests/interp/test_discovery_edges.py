"""edges / patch_edges against the independent numpy model with a hook per edge
(tests/interp/numpy_edges.py), in float64: exact edge patching, the masked form at interpolated
weights, zero and mean ablation, and the bad inputs."""

import numpy as np
import pytest

import circuits as C
from circuits.errors import CircuitError, SelectionError, ShapeError
from circuits.interp import edges, patch_edges
from circuits.models import attn_only, random_weights
from tests.interp.numpy_edges import edge_names, forward, sources_on

SMALL = dict(vocab=13, d_model=8, n_heads=2, head_size=4, n_layers=2, max_positions=16)
CLEAN = np.array([3, 4, 5, 9, 2, 6, 5, 3])
CORRUPT = np.array([3, 11, 8, 12, 1, 8, 5, 4])
TOL = dict(rtol=1e-9, atol=1e-10)


@pytest.fixture(scope="module")
def model():
    w = random_weights(0, dtype=np.float64, **SMALL)
    return w, attn_only(w, CLEAN, unique_names=True)


def run(c, inputs=None):
    return C.evaluate(c, inputs, dtype="float64", mode="ops")


def test_edges_are_the_oracles(model):
    w, loss = model
    g = edges(loss)
    assert list(g) == edge_names(2, 2)
    assert g.sources == ["embeds", "b0.a.head0", "b0.a.head1", "b1.a.head0", "b1.a.head1"]
    assert g.destinations[-1] == "output" and len(g.destinations) == 2 * 2 * 3 + 1
    assert g.index("b0.a.head1 -> b1.a.head0.a.k") == list(g).index("b0.a.head1 -> b1.a.head0.a.k")


def test_patching_some_edges_matches_the_oracle(model):
    w, loss = model
    senders = sources_on(w, CORRUPT)
    names = list(edges(loss))
    rng = np.random.default_rng(0)
    for _ in range(3):
        chosen = [names[i] for i in sorted(rng.choice(len(names), 6, replace=False))]
        got = run(patch_edges(loss, chosen, {"toks_int_var": CORRUPT}))
        want, _ = forward(w, CLEAN, weights_of={e: 1.0 for e in chosen}, senders=senders)
        np.testing.assert_allclose(got, want, **TOL)


def test_one_edge_is_exactly_path_patching(model):
    w, loss = model
    got = run(patch_edges(loss, ["b0.a.head1 -> b1.a.head0.a.k"], {"toks_int_var": CORRUPT}))
    pp = C.interp.path_patch(loss, "b0.a.head1", "b1.a.head0.a.k", {"toks_int_var": CORRUPT})
    np.testing.assert_allclose(got, run(pp), **TOL)


def test_no_edge_is_the_clean_circuit_and_every_edge_the_corrupted_run(model):
    w, loss = model
    assert patch_edges(loss, [], {"toks_int_var": CORRUPT}) is loss
    every = patch_edges(loss, list(edges(loss)), {"toks_int_var": CORRUPT})
    corrupted_run = attn_only(w, CORRUPT, targets=CLEAN)
    np.testing.assert_allclose(run(every), run(corrupted_run), **TOL)
    assert not np.allclose(run(every), run(loss))


def test_masked_form_matches_the_oracle_at_interpolated_weights(model):
    w, loss = model
    masked = patch_edges(loss, None, {"toks_int_var": CORRUPT}, mask=True)
    names = list(edges(loss))
    senders = sources_on(w, CORRUPT)
    rng = np.random.default_rng(1)
    for weights in (np.zeros(len(names)), np.ones(len(names)), rng.uniform(0, 1, len(names))):
        got = run(masked, {"edges.mask": weights})
        want, _ = forward(w, CLEAN, weights_of=dict(zip(names, weights)), senders=senders)
        np.testing.assert_allclose(got, want, **TOL)


def test_masked_form_over_some_edges(model):
    w, loss = model
    cover = ["embeds -> b1.a.head1.a.q", "b0.a.head0 -> output", "b1.a.head1 -> output"]
    masked = patch_edges(loss, cover, {"toks_int_var": CORRUPT}, mask=True)
    got = run(masked, {"edges.mask": np.array([1.0, 0.5, 0.25])})
    want, _ = forward(w, CLEAN, weights_of=dict(zip(cover, [1.0, 0.5, 0.25])), senders=sources_on(w, CORRUPT))
    np.testing.assert_allclose(got, want, **TOL)


def test_zero_and_mean_ablation(model):
    w, loss = model
    chosen = ["embeds -> b0.a.head0.a.v", "b0.a.head1 -> b1.a.head1.a.q", "b1.a.head0 -> output"]
    zeros = {k: np.zeros_like(v) for k, v in sources_on(w, CLEAN).items()}
    want, _ = forward(w, CLEAN, weights_of={e: 1.0 for e in chosen}, senders=zeros)
    np.testing.assert_allclose(run(patch_edges(loss, chosen, None, ablation="zero")), want, **TOL)

    batch = np.random.default_rng(2).integers(0, 13, (4, len(CLEAN)))
    runs = [sources_on(w, row) for row in batch]
    means = {k: np.mean([r[k] for r in runs], axis=0) for k in runs[0]}
    want, _ = forward(w, CLEAN, weights_of={e: 1.0 for e in chosen}, senders=means)
    got = run(patch_edges(loss, chosen, {"toks_int_var": batch}, ablation="mean"))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)  # means computed in float32


def test_patched_circuit_is_a_plain_circuit(model, tmp_path):
    w, loss = model
    p = patch_edges(loss, ["b0.a.head1 -> b1.a.head0.a.k"], {"toks_int_var": CORRUPT})
    assert p.get_unique("b1.a.head0.a.k").children[0].name == "a1.qk_input@b1.a.head0.a.k"
    C.save(p, tmp_path / "p.circuit")
    np.testing.assert_allclose(run(C.load(tmp_path / "p.circuit")), run(p), **TOL)
    assert "b1.a.head0.a.k.resid" in str(C.diff(loss, p))


def test_bad_edges_are_named(model):
    w, loss = model
    src = {"toks_int_var": CORRUPT}
    with pytest.raises(SelectionError, match="no edge 'b0.a.head1 -> b1.a.head0.a.kk'.*did you mean"):
        patch_edges(loss, ["b0.a.head1 -> b1.a.head0.a.kk"], src)
    with pytest.raises(SelectionError, match="empty edge name"):
        patch_edges(loss, [""], src)
    with pytest.raises(SelectionError, match="not of the form"):
        patch_edges(loss, ["b0.a.head1"], src)
    with pytest.raises(SelectionError, match="'b1.a.head0' is not upstream of 'b0.a.head0.a.q'"):
        patch_edges(loss, ["b1.a.head0 -> b0.a.head0.a.q"], src)
    with pytest.raises(CircuitError, match="given twice"):
        patch_edges(loss, ["b1.a.head0 -> output", "b1.a.head0 -> output"], src)
    with pytest.raises(CircuitError, match="give a list of edge names"):
        patch_edges(loss, None, src)


def test_bad_sources_and_models_are_named(model):
    w, loss = model
    edge = ["b1.a.head0 -> output"]
    with pytest.raises(ShapeError, match=r"source\['toks_int_var'\] has shape \[5\]"):
        patch_edges(loss, edge, {"toks_int_var": CORRUPT[:5]})
    with pytest.raises(SelectionError, match="no input .*named 'tokens'"):
        patch_edges(loss, edge, {"tokens": CORRUPT})
    with pytest.raises(CircuitError, match="ablation='zero' takes no source"):
        patch_edges(loss, edge, {"toks_int_var": CORRUPT}, ablation="zero")
    with pytest.raises(CircuitError, match="ablation='bogus'"):
        patch_edges(loss, edge, {"toks_int_var": CORRUPT}, ablation="bogus")
    with pytest.raises(CircuitError, match="needs source="):
        patch_edges(loss, edge, None)
    with pytest.raises(CircuitError, match="no heads"):
        edges(C.Array(np.ones(3, np.float32), name="x"))


# ---------------------------------------------------------------------------- GPT-2, OPT, Llama
def _hf_models():
    from circuits.models import gpt2, llama, opt
    from circuits.models.gpt2 import random_gpt2_weights
    from circuits.models.llama import random_llama_weights
    from circuits.models.opt import random_opt_weights

    return {
        "gpt2": (gpt2, random_gpt2_weights, dict(n_embd=8, n_head=2, n_layer=2, vocab_size=11, n_positions=16,
                                                 activation_function="gelu_new")),
        "opt": (opt, random_opt_weights, dict(hidden_size=8, num_attention_heads=2, num_hidden_layers=2,
                                              vocab_size=11, max_position_embeddings=16, ffn_dim=16,
                                              word_embed_proj_dim=8, do_layer_norm_before=True,
                                              activation_function="relu")),
        "llama": (llama, random_llama_weights, dict(hidden_size=8, num_attention_heads=4, num_key_value_heads=2,
                                                    num_hidden_layers=2, vocab_size=11, intermediate_size=16,
                                                    max_position_embeddings=16, hidden_act="silu")),
    }


HF_CLEAN, HF_CORRUPT = np.array([1, 2, 3, 4, 5]), np.array([1, 7, 3, 9, 6])


@pytest.mark.parametrize("family", ["gpt2", "opt", "llama"])
def test_split_head_builders(family):
    build, random_w, cfg = _hf_models()[family]
    w = random_w(cfg)
    c = build(cfg, w, HF_CLEAN, split_heads=True)
    g = edges(c)
    n_heads = cfg.get("n_head", cfg.get("num_attention_heads"))
    heads = [f"h{l}.attn.head{h}" for l in range(2) for h in range(n_heads)]
    assert g.sources == ["embeds"] + heads[:n_heads] + ["h0.mlp"] + heads[n_heads:] + ["h1.mlp"]
    assert "h0.mlp -> h1.mlp" in g and "embeds -> output" in g and "h1.mlp -> output" in g
    if family == "llama":  # grouped-query attention: one k and one v destination per key-value head
        assert "h0.attn.head1 -> h1.attn.kv0.k" in g and "h0.attn.head1 -> h1.attn.head3.q" in g
        assert not any(d.endswith("head0.k") for d in g.destinations)
    else:
        assert "h0.attn.head1 -> h1.attn.head0.k" in g
    src = {"tokens": HF_CORRUPT}
    every = run(patch_edges(c, list(g), src))
    np.testing.assert_allclose(every, run(build(cfg, w, HF_CORRUPT, split_heads=True)), rtol=1e-9, atol=1e-10)
    some = [g[i] for i in range(0, len(g), 3)]
    mask = np.zeros(len(g))
    mask[::3] = 1
    masked = patch_edges(c, None, src, mask=True)
    np.testing.assert_allclose(run(masked, {"edges.mask": mask}), run(patch_edges(c, some, src)), rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(run(masked, {"edges.mask": np.zeros(len(g))}), run(c), rtol=1e-9, atol=1e-10)


def test_gpt2_one_edge_is_path_patching_with_the_mlp_frozen():
    build, random_w, cfg = _hf_models()["gpt2"]
    c = build(cfg, random_w(cfg), HF_CLEAN, split_heads=True)
    src = {"tokens": HF_CORRUPT}
    got = run(patch_edges(c, ["h0.attn.head1 -> h1.attn.head0.k"], src))
    pp = C.interp.path_patch(c, "h0.attn.head1", "h1.attn.head0.k", src, freeze=C.select.Glob("h0.mlp"))
    np.testing.assert_allclose(got, run(pp), rtol=1e-9, atol=1e-10)
    assert not np.allclose(got, run(c))


def test_fused_attention_is_refused():
    build, random_w, cfg = _hf_models()["gpt2"]
    with pytest.raises(CircuitError, match="split_heads=True"):
        edges(build(cfg, random_w(cfg), HF_CLEAN))
