"""The nine families of issue 38 (GPT-J, GPT-Neo, Gemma, Qwen3, Phi-3, Mixtral, StableLM, Falcon,
BLOOM) against ``transformers``' own modeling code with random weights: logits in float64 for every
family and layout, the decode step / ``generate`` for the families whose step differs in kind
(ALiBi's key positions and experts; local windows and interleaved rotary marked slow), the heads and MLPs in
``interp.edges`` (and patching every edge from another prompt is that prompt's run), the config
variants no builder implements refused naming the field.  Every cell of every family in both
precisions is ``test_matrix``'s slow matrix."""

import numpy as np
import pytest

import circuits as C
from circuits import interp
from circuits.models import Model, matrix
from tests.models.hf_folders import state

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

NEW = ["gptj", "gpt_neo", "gemma", "qwen3", "phi3", "mixtral", "stablelm", "falcon", "falcon-7b", "falcon-rw", "bloom"]


def _assert_ok(row):
    bad = {k: str(v) for k, v in row.cells.items() if v.status != "ok"}
    assert not bad, f"{row.family} {row.dtype}: {bad}"


@pytest.mark.parametrize("family", NEW)
def test_logits_equal_transformers_in_float64(family):
    _assert_ok(matrix.check(family, "float64", cells=("logits",)))


@pytest.mark.parametrize("family", ["bloom", "mixtral", pytest.param("gpt_neo", marks=pytest.mark.slow),
                                    pytest.param("gptj", marks=pytest.mark.slow)])
def test_generate_equals_transformers_token_for_token(family):
    row = matrix.check(family, "float64", cells=("generation",))
    _assert_ok(row)
    assert row.cells["generation"].detail == f"{matrix.NEW}/{matrix.NEW} tokens"


@pytest.mark.parametrize("family", NEW)
def test_heads_and_mlps_are_edges(family):
    hf = matrix.hf_model(family, 0)
    m = Model(hf.config.to_dict(), state(hf))
    g = interp.edges(m.circuit(np.arange(1, 7)))
    n_layers = len(m.attention_layers)
    n_heads = hf.config.num_attention_heads if hasattr(hf.config, "num_attention_heads") else hf.config.n_head
    heads = {f"h{l}.attn.head{h}" for l in range(n_layers) for h in range(n_heads)}
    mlps = {f"h{l}.mlp" for l in range(n_layers)}
    assert set(g.sources) == {"embeds"} | heads | mlps
    assert mlps <= set(g.destinations) and g.destinations[-1] == "output"
    assert f"h0.attn.head{n_heads - 1} -> h1.mlp" in g and "h1.mlp -> output" in g


@pytest.mark.parametrize("family", ["bloom", pytest.param("mixtral", marks=pytest.mark.slow)])
def test_patching_every_edge_is_the_source_run(family):
    """Each destination reads exactly the sum of its edges: patching all of them from another
    prompt gives that prompt's logits (ALiBi's biases and the router's top-k recomputed)."""
    hf = matrix.hf_model(family, 0, **({"n_head": 4} if family == "bloom" else {}))  # 4 heads: 4x fewer edges
    m = Model(hf.config.to_dict(), state(hf), dtype="float64")
    a, b = np.arange(1, 7), np.arange(11, 17)
    c = m.circuit(a)
    patched = interp.patch_edges(c, list(interp.edges(c)), {"tokens": b})
    np.testing.assert_allclose(C.evaluate(patched, dtype="float64"), C.evaluate(m.circuit(b), dtype="float64"),
                               rtol=0, atol=1e-9)
    one = interp.patch_edges(c, ["h0.mlp -> h1.mlp"], {"tokens": b})
    assert not np.allclose(C.evaluate(one, dtype="float64"), C.evaluate(c, dtype="float64"))


@pytest.mark.parametrize("family, field, value, match", [
    ("gptj", "rotary_dim", None, r"rotary_dim=None is not supported"),
    ("gpt_neo", "attention_types", [[["global", "sparse"], 1]], r"attention_types has the kind 'sparse'"),
    ("gemma", "use_bidirectional_attention", True, "use_bidirectional_attention"),
    ("qwen3", "rope_parameters", {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}, r"rope_type='yarn'"),
    ("phi3", "rope_parameters", {"rope_type": "longrope", "rope_theta": 1e4}, r"rope_type='longrope'"),
    ("mixtral", "num_experts_per_tok", 9, r"num_experts_per_tok"),
    ("stablelm", "qk_layernorm", "yes", r"qk_layernorm"),
    ("falcon", "apply_residual_connection_post_layernorm", True, r"apply_residual_connection_post_layernorm"),
    ("bloom", "apply_residual_connection_post_layernorm", True, r"apply_residual_connection_post_layernorm"),
])
def test_config_variants_are_refused_naming_the_field(family, field, value, match):
    hf = matrix.hf_model(family, 0)
    cfg = dict(hf.config.to_dict(), **{field: value})
    with pytest.raises(C.CircuitError, match=match):
        Model(cfg, state(hf))


def test_blooms_slow_but_exact_path_is_refused():
    """transformers' ``slow_but_exact`` path with ``pretraining_tp > 1`` leaves out the output
    projections' biases: refused, while ``pretraining_tp`` alone builds the usual map."""
    hf = matrix.hf_model("bloom", 0)
    cfg = dict(hf.config.to_dict(), pretraining_tp=2)
    Model(cfg, state(hf))
    with pytest.raises(C.CircuitError, match=r"slow_but_exact=True with pretraining_tp=2 is not supported"):
        Model(dict(cfg, slow_but_exact=True), state(hf))


def test_gemma2_blocks_behind_sandwich_norms_are_edge_sources():
    """Gemma-2 normalises each attention and MLP output before the residual stream adds it, so no
    head is a residual-stream term: each block's normalised output is one source ('h0.attn'),
    the heads stay destinations.  One edge patched is checked against the same change made by
    hand: the final residual with that block's output from the other prompt, read by the rest
    of the circuit."""
    hf = matrix.hf_model("gemma2", 0)
    m = Model(hf.config.to_dict(), state(hf), dtype="float64")
    a, b = np.arange(1, 7), np.arange(11, 17)
    c = m.circuit(a)
    g = interp.edges(c)
    n_layers = len(m.attention_layers)
    assert g.sources == ["embeds"] + [f"h{l}.{part}" for l in range(n_layers) for part in ("attn", "mlp")]
    assert "h1.attn.head3.q" in g.destinations and "h0.attn -> h1.attn.head3.q" in g
    everything = interp.patch_edges(c, list(g), {"tokens": b})
    np.testing.assert_allclose(C.evaluate(everything, dtype="float64"), C.evaluate(m.circuit(b), dtype="float64"),
                               rtol=0, atol=1e-9)
    # 'h0.attn -> output' by hand: swap that term of the final residual stream
    last = f"h{n_layers - 1}"
    block = c.get_unique("h0.attn.post_ln")
    _, va = C.evaluate(c, dtype="float64", also=[c.get_unique(last), block])
    _, vb = C.evaluate(m.circuit(b), dtype="float64", also=[m.circuit(b).get_unique("h0.attn.post_ln")])
    resid = va[c.get_unique(last)] - va[block] + vb[m.circuit(b).get_unique("h0.attn.post_ln")]
    by_hand = c.update(last, lambda n: C.Array(resid, name="resid.by_hand"))
    got = C.evaluate(interp.patch_edges(c, ["h0.attn -> output"], {"tokens": b}), dtype="float64")
    np.testing.assert_allclose(got, C.evaluate(by_hand, dtype="float64"), rtol=1e-10, atol=1e-10)
    assert not np.allclose(got, C.evaluate(c, dtype="float64"))
