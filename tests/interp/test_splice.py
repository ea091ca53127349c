"""splice: the value is unchanged (float64), latents match the numpy SAE, features and errors are
sites for ablate / patch / attribute, transcoders replace the MLPs of the GPT-2 / OPT / Llama builders."""

import numpy as np
import pytest

import circuits as C
from circuits.errors import CircuitError, ShapeError
from circuits.interp import SAE, ablate, attribute, feature_site, patch, path_patch, splice
from circuits.models import attn_only, random_weights
from circuits.traversal import replace

from .test_sae import np_decode, np_encode

W = random_weights(vocab=13, d_model=8, n_heads=2, head_size=4, n_layers=2, max_positions=16, dtype=np.float64)
CLEAN = np.array([0, 3, 5, 7, 3, 5, 7, 2])
CORRUPT = np.array([0, 4, 6, 1, 4, 6, 1, 2])


def f64(c):
    return np.asarray(C.evaluate(c, dtype="float64", mode="ops"), np.float64)


ARCHS = [("standard", {}), ("topk", {"k": 3}), ("jumprelu", {}), ("gated", {}),
         ("standard", {"normalize_activations": "layer_norm"})]


@pytest.mark.parametrize("arch,kw", ARCHS, ids=[a + ("-ln" if kw.get("normalize_activations") else "") for a, kw in ARCHS])
def test_value_unchanged_and_latents_match_numpy(arch, kw):
    loss = attn_only(W, CLEAN, unique_names=True)
    sae = SAE.random(8, 24, arch, seed=2, dtype="float64", **kw)
    spliced = splice(splice(loss, "b0", sae), "b1", SAE.random(8, 24, arch, seed=3, dtype="float64", **kw))
    assert np.abs(f64(spliced) - f64(loss)).max() <= 1e-12
    x = f64(loss.get_unique("b0"))
    acts = f64(spliced.get_unique("b0.sae.acts"))
    np.testing.assert_allclose(acts, np_encode(sae, x), atol=1e-12)
    assert acts.shape == (6, 24) and (acts != 0).any()
    np.testing.assert_allclose(f64(spliced.get_unique("b0.sae.error")), x - np_decode(sae, acts, x), atol=1e-12)


def test_feature_ablation_and_error_ablation():
    loss = attn_only(W, CLEAN, unique_names=True)
    sae = SAE.random(8, 24, "standard", seed=4, dtype="float64")
    x = f64(loss.get_unique("b0"))
    acts = np_encode(sae, x)
    i = int(np.argmax((acts > 0).sum(0)))  # a feature active somewhere
    spliced = splice(loss, "b0", sae, features=[i, (i + 1) % 24])
    assert np.abs(f64(spliced) - f64(loss)).max() <= 1e-12
    np.testing.assert_allclose(f64(spliced.get_unique(feature_site("b0", i))), acts[:, i], atol=1e-12)
    # Ablating feature i: b0 becomes x - a_i W_dec[i]; downstream as if b0 had that value.
    ablated = ablate(spliced, feature_site("b0", i))
    want_b0 = x - np.outer(acts[:, i], sae.W_dec[i])
    oracle = replace(loss, {loss.get_unique("b0"): C.Array(want_b0, name="b0.oracle")})
    np.testing.assert_allclose(f64(ablated), f64(oracle), atol=1e-10)
    assert np.abs(f64(ablated) - f64(loss)).max() > 1e-4
    # Ablating the error: b0 becomes the reconstruction.
    no_err = ablate(spliced, "b0.sae.error")
    np.testing.assert_allclose(f64(no_err.get_unique("b0.sae.out")), np_decode(sae, acts, x), atol=1e-12)


def test_error_live_or_frozen_under_patching():
    loss = attn_only(W, CLEAN, unique_names=True)
    sae = SAE.random(8, 24, "topk", k=4, seed=5, dtype="float64")
    live = splice(loss, "b0", sae)
    frozen = splice(loss, "b0", sae, error="frozen")
    assert isinstance(frozen.get_unique("b0.sae.error"), C.Array)
    assert np.abs(f64(frozen) - f64(loss)).max() <= 1e-12
    x_clean = f64(loss.get_unique("b0"))
    x_corrupt = f64(attn_only(W, CORRUPT, unique_names=True).get_unique("b0"))
    # Patching the latents from the corrupt run: recon(corrupt latents) + the clean error.
    p = patch(live, "b0.sae.acts", {"toks_int_var": CORRUPT})
    want = np_decode(sae, np_encode(sae, x_corrupt), x_corrupt) + (x_clean - np_decode(sae, np_encode(sae, x_clean), x_clean))
    np.testing.assert_allclose(f64(p.get_unique("b0.sae.out")), want, atol=1e-12)
    # Patching the tokens: a live error follows them (the value is the corrupt run's), a frozen one does not.
    corrupt_loss = f64(attn_only(W, CORRUPT, unique_names=True, targets=CLEAN))
    live_t = attn_only(W, C.Symbol((8,), name="toks_int_var", dtype="int64"), unique_names=True,
                       targets=CLEAN)
    sym_spliced = splice(live_t, "b0", sae)
    np.testing.assert_allclose(np.asarray(C.evaluate(sym_spliced, {"toks_int_var": CORRUPT}, dtype="float64", mode="ops")),
                               corrupt_loss, atol=1e-10)


def test_features_are_sites_for_attribute_and_path_patch():
    loss = attn_only(W, CLEAN, unique_names=True)
    sae = SAE.random(8, 24, "standard", seed=6, dtype="float64")
    feats = list(range(24))
    spliced = splice(loss, "b0", sae, features=feats)
    src = {"toks_int_var": CORRUPT}
    whole = attribute(spliced, "b0.sae.acts", src, dtype="float64", mode="ops")["b0.sae.acts"]
    per = attribute(spliced, [feature_site("b0", i) for i in feats], src, dtype="float64", mode="ops")
    assert abs(sum(per.values()) - whole) <= 1e-9 * max(1.0, abs(whole))
    assert sum(abs(v) > 1e-9 for v in per.values()) >= 2
    # path patching a feature into one head's value input changes the loss, and only through that head
    i = max(per, key=lambda k: abs(per[k]))
    pp = path_patch(spliced, i, "b1.a.head0.a.v", src)
    assert np.abs(f64(pp) - f64(loss)).max() > 0
    assert np.abs(f64(pp.get_unique("b1.a.head1")) - f64(spliced.get_unique("b1.a.head1"))).max() == 0


def test_errors():
    loss = attn_only(W, CLEAN, unique_names=True)
    with pytest.raises(ShapeError, match="reads \\[..., 6\\]"):
        splice(loss, "b0", SAE.random(6, 12))
    with pytest.raises(CircuitError, match="error='later'"):
        splice(loss, "b0", SAE.random(8, 12), error="later")
    once = splice(loss, "b0", SAE.random(8, 12))
    with pytest.raises(CircuitError, match="already has an SAE"):
        splice(once, "b0", SAE.random(8, 12))
    with pytest.raises(CircuitError, match="distinct indices"):
        splice(loss, "b0", SAE.random(8, 12), features=[12])
    with pytest.raises(CircuitError, match="input= is for transcoders"):
        splice(loss, "b0", SAE.random(8, 12), input="idxed_embeds")


# ---------------------------------------------------------------------------- transcoders
def _builders():
    from circuits.models.gpt2 import gpt2, random_gpt2_weights
    from circuits.models.llama import llama, random_llama_weights
    from circuits.models.opt import opt, random_opt_weights

    g = dict(n_embd=8, n_head=2, n_layer=2, vocab_size=11, n_positions=16, activation_function="gelu_new")
    o = dict(hidden_size=8, num_attention_heads=2, num_hidden_layers=2, ffn_dim=16, vocab_size=11,
             max_position_embeddings=16, word_embed_proj_dim=8, do_layer_norm_before=True, activation_function="relu")
    lcfg = dict(hidden_size=8, num_attention_heads=2, num_key_value_heads=1, num_hidden_layers=2,
                intermediate_size=16, vocab_size=11, max_position_embeddings=16, rms_norm_eps=1e-6, hidden_act="silu")
    toks = np.array([1, 4, 2, 7, 4, 2])
    return {
        "gpt2": lambda: gpt2(g, random_gpt2_weights(g, dtype=np.float64), toks),
        "opt": lambda: opt(o, random_opt_weights(o, dtype=np.float64), toks),
        "llama": lambda: llama(lcfg, random_llama_weights(lcfg, dtype=np.float64), toks),
    }


@pytest.mark.parametrize("family", ["gpt2", "opt", "llama"])
@pytest.mark.parametrize("arch", ["transcoder", "jumprelu_skip_transcoder"])
def test_transcoder_replaces_the_mlp(family, arch):
    logits = _builders()[family]()
    tc = SAE.random(8, 32, arch, d_out=8, seed=7, dtype="float64")
    spliced = splice(logits, "h1.mlp", tc)
    assert np.abs(f64(spliced) - f64(logits)).max() <= 1e-12
    x_in = f64(logits.get_unique("h1.ln2"))  # the MLP's input, found by splice on its own
    acts = f64(spliced.get_unique("h1.mlp.sae.acts"))
    np.testing.assert_allclose(acts, np_encode(tc, x_in), atol=1e-12)
    no_err = ablate(spliced, "h1.mlp.sae.error")
    np.testing.assert_allclose(f64(no_err.get_unique("h1.mlp.sae.out")), np_decode(tc, acts, x_in), atol=1e-12)
    np.testing.assert_allclose(f64(spliced.get_unique("h1.mlp.sae.error")),
                               f64(logits.get_unique("h1.mlp")) - np_decode(tc, acts, x_in), atol=1e-12)


def test_transcoder_shape_errors():
    logits = _builders()["gpt2"]()
    with pytest.raises(ShapeError, match="transcoder reads"):
        splice(logits, "h0.mlp", SAE.random(6, 32, "transcoder", d_out=8), input="h0.ln2")
