"""The logit lens and direct logit attribution, against numpy on the hand-written torch model's
activations (``torch_hooks``: TransformerLens's ``apply_ln_to_stack`` and ``logit_attrs`` written
out), and the decomposition's sum on GPT-2 (split and fused heads) and Llama."""

import numpy as np
import pytest

import circuits as C
from circuits.errors import CircuitError
from circuits.interp import edges, logit_attribution, logit_lens
from circuits.models import attn_only, gpt2, llama, random_weights, tokens_symbol
from circuits.models.common import tokens_symbol as hf_tokens
from circuits.models.gpt2 import random_gpt2_weights
from circuits.models.llama import random_llama_weights

from .torch_hooks import AttnOnly

W = random_weights(7, vocab=29, d_model=16, n_heads=3, head_size=4, n_layers=2, max_positions=16)
BATCH = np.random.default_rng(5).integers(0, 29, (3, 11))
W64 = {k: np.asarray(v, np.float64) for k, v in W.items()}


def _ln(x, scale=None):
    centred = x - x.mean(-1, keepdims=True)
    s = np.sqrt((centred ** 2).mean(-1, keepdims=True) + 1e-5) if scale is None else scale
    return centred / s * W64["final.ln.w.scale"] + W64["final.ln.w.bias"]


@pytest.mark.parametrize("unique", [True, False])
def test_logit_lens_freeze_and_recompute_against_numpy(unique):
    circ = attn_only(W, tokens_symbol(11), unique_names=unique)
    _, _, cache = AttnOnly(W).run(BATCH)
    cache = {k: v.numpy() for k, v in cache.items()}
    stages = [cache["blocks.0.hook_resid_pre"], cache["blocks.1.hook_resid_pre"], cache["blocks.1.hook_resid_post"]]
    frozen = logit_lens(circ, {"toks_int_var": BATCH}, dtype="float64")
    fresh = logit_lens(circ, {"toks_int_var": BATCH}, layer_norm="recompute", dtype="float64")
    assert list(frozen) == list(fresh) == ["idxed_embeds", "b0", "b1"]
    scale = cache["ln_final.hook_scale"]  # the model's own final residual's scale, for every stage
    for stage, key in zip(stages, frozen):
        np.testing.assert_allclose(frozen[key], _ln(stage, scale) @ W64["t.w.unembed"].T, atol=1e-9)
        np.testing.assert_allclose(fresh[key], _ln(stage) @ W64["t.w.unembed"].T, atol=1e-9)
    np.testing.assert_allclose(frozen["b1"], fresh["b1"], atol=1e-9)  # the last stage: the model's logits
    assert not np.allclose(frozen["b0"], fresh["b0"], atol=1e-3)


def test_direct_logit_attribution_against_numpy():
    circ = attn_only(W, tokens_symbol(11), unique_names=True)
    direction = np.eye(29)[4] - np.eye(29)[17]
    got = logit_attribution(circ, direction, {"toks_int_var": BATCH}, dtype="float64")
    assert list(got) == ["embeds"] + [f"b{l}.a.head{h}" for l in range(2) for h in range(3)] + ["final.ln.w.bias"]
    assert list(got)[:-1] == list(edges(circ).sources)
    logits, _, cache = AttnOnly(W).run(BATCH)
    cache = {k: v.numpy() for k, v in cache.items()}
    scale = cache["ln_final.hook_scale"]
    u = W64["t.w.unembed"].T @ direction

    def direct(x):  # TransformerLens's logit_attrs: apply_ln_to_stack (centre, divide by the scale) then project
        return ((x - x.mean(-1, keepdims=True)) / scale * W64["final.ln.w.scale"]) @ u

    np.testing.assert_allclose(got["embeds"], direct(cache["hook_embed"]), atol=1e-9)
    for l in range(2):
        for h in range(3):
            np.testing.assert_allclose(got[f"b{l}.a.head{h}"], direct(cache[f"blocks.{l}.attn.hook_result"][:, :, h]),
                                       atol=1e-9)
    np.testing.assert_allclose(got["final.ln.w.bias"], np.broadcast_to(W64["final.ln.w.bias"] @ u, (3, 9)), atol=1e-12)
    assert all(v.shape == (3, 9) for v in got.values())  # every term the full shape, batch first
    np.testing.assert_allclose(sum(got.values()), logits.numpy() @ direction, atol=1e-9)
    # one direction per row and position: each prompt's own answer
    per_row = np.random.default_rng(2).standard_normal((3, 9, 29))
    rows = logit_attribution(circ, per_row, {"toks_int_var": BATCH}, dtype="float64")
    np.testing.assert_allclose(sum(rows.values()), (logits.numpy() * per_row).sum(-1), atol=1e-9)
    for r in range(3):
        one = logit_attribution(circ, per_row[r], {"toks_int_var": BATCH[r:r + 1]}, dtype="float64")
        np.testing.assert_allclose(rows["b1.a.head2"][r], one["b1.a.head2"][0], atol=1e-9)


@pytest.mark.parametrize("split", [True, False])
def test_gpt2_decomposition_sums_to_the_logit_difference(split):
    cfg = dict(n_embd=16, n_head=4, n_layer=2, vocab_size=31, n_positions=16, activation_function="gelu_new")
    circ = gpt2(cfg, random_gpt2_weights(cfg, seed=4), hf_tokens(6), split_heads=split)
    toks = np.random.default_rng(0).integers(0, 31, (2, 6))
    direction = np.random.default_rng(1).standard_normal((6, 31))  # one direction per position
    got = logit_attribution(circ, direction, {"tokens": toks}, dtype="float64")
    logits = C.evaluate(circ, {"tokens": toks}, dtype="float64")
    np.testing.assert_allclose(sum(got.values()), (logits * direction).sum(-1), atol=1e-9)
    biases = {"h0.attn.c_proj.bias", "h1.attn.c_proj.bias", "ln_f.bias"}
    if split:
        assert set(got) - biases == set(edges(circ).sources)
    else:
        assert list(got) == ["embeds", "h0.attn", "h0.mlp", "h1.attn", "h1.mlp", "ln_f.bias"]
    lens = logit_lens(circ, {"tokens": toks}, mid=True, dtype="float64")
    assert list(lens) == ["embeds", "h0.mid", "h0", "h1.mid", "h1"]
    np.testing.assert_allclose(lens["h1"], logits, atol=1e-9)


def test_llama_rms_norm_readout():
    cfg = dict(hidden_size=16, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
               intermediate_size=24, vocab_size=19, hidden_act="silu")
    circ = llama(cfg, random_llama_weights(cfg, seed=3), np.array([3, 1, 4, 1, 5]), split_heads=True)
    d = np.eye(19)[2] - np.eye(19)[7]
    got = logit_attribution(circ, d, dtype="float64")
    logits = C.evaluate(circ, dtype="float64")
    np.testing.assert_allclose(sum(got.values()), logits @ d, atol=1e-9)
    assert "h1.attn.head3" in got and "h0.mlp" in got and "embeds" in got
    lens = logit_lens(circ, dtype="float64")
    np.testing.assert_allclose(lens["h1"], logits, atol=1e-9)


def test_bad_arguments_are_errors():
    circ = attn_only(W, np.arange(11), unique_names=True)
    with pytest.raises(CircuitError, match=r"direction has shape \[5\]; give \[29\]"):
        logit_attribution(circ, np.ones(5))
    with pytest.raises(CircuitError, match="layer_norm='keep'; use 'freeze'"):
        logit_lens(circ, layer_norm="keep")
    with pytest.raises(CircuitError, match="not named as a builder names its nodes"):
        logit_lens(C.Einsum.from_spec("ab->a", C.Symbol((2, 3), name="x")))
