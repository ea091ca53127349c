"""run_with_cache and TransformerLens's hook names, against hand-written torch (the seed's model,
``torch_hooks``) and transformers' GPT-2 and Llama with hooks on their modules, on the same
weights; ``also=`` and ``get`` / ``update`` with every matcher and with hook names."""

import numpy as np
import pytest
import torch

import circuits as C
from circuits.errors import SelectionError
from circuits.interp import patch, run_with_cache
from circuits.models import attn_only, gpt2, llama, random_weights, tokens_symbol
from circuits.models.common import tokens_symbol as hf_tokens
from circuits.models.gpt2 import random_gpt2_weights
from circuits.models.llama import random_llama_weights
from circuits.select import Glob, Regex, Type
from circuits.select.hooks import hook_names, hook_table, naming_convention

from .torch_hooks import AttnOnly

W = random_weights(5, vocab=29, d_model=16, n_heads=3, head_size=4, n_layers=2, max_positions=16)
BATCH = np.random.default_rng(2).integers(0, 29, (4, 12))


@pytest.mark.parametrize("unique", [True, False])
def test_every_hook_of_the_seed_model_against_torch(unique):
    circ = attn_only(W, tokens_symbol(12), unique_names=unique)
    cache = run_with_cache(circ, {"toks_int_var": BATCH}, dtype="float64")
    _, _, want = AttnOnly(W).run(BATCH)
    assert cache.hook_names() == hook_names(circ) == list(want)  # every hook, in TransformerLens's order
    for name, value in want.items():
        got = cache[name]
        assert got.shape == tuple(value.shape), name
        np.testing.assert_allclose(got, value.numpy(), atol=1e-9, err_msg=name)
    assert cache.output.shape == (4, 10)


def test_our_names_keep_the_node_value_and_repeated_names_are_numbered():
    seed_names = run_with_cache(attn_only(W, np.arange(12)))
    assert "a.q#1" in seed_names and "a.q#6" in seed_names and "a.q#7" not in seed_names
    with pytest.raises(KeyError, match="several nodes"):
        seed_names["a.q"]
    unique = run_with_cache(attn_only(W, np.arange(12), unique_names=True))
    np.testing.assert_array_equal(unique["b1.a.head2.a.q"], seed_names["a.q#6"])
    assert unique["b0.a.head1.a.attn_probs"].shape == (10, 10)
    assert "a0.w.q" not in unique and "t.w.unembed" not in unique  # weights are not activations
    assert "blocks.1.hook_resid_post" in unique and "blocks.2.hook_resid_post" not in unique


def test_names_select_by_every_matcher():
    circ = attn_only(W, np.arange(12), unique_names=True)
    assert list(run_with_cache(circ, names=Glob("*.attn_probs"))) == [
        f"b{l}.a.head{h}.a.attn_probs" for l in range(2) for h in range(3)]
    assert list(run_with_cache(circ, names=[Regex(r"^b\d$"), "idxed_embeds"])) == ["idxed_embeds", "b0", "b1"]
    with pytest.raises(SelectionError, match=r"Type\(Symbol\) matched nothing"):  # tokens as an Array here
        run_with_cache(circ, names=Type("Symbol"))
    assert list(run_with_cache(attn_only(W, tokens_symbol(12)), {"toks_int_var": BATCH}, names=Type("Symbol"))) == [
        "toks_int_var"]
    z = run_with_cache(circ, names="blocks.1.attn.hook_z")
    assert list(z) == [f"b1.a.head{h}.a.comb_v" for h in range(3)] and z["blocks.1.attn.hook_z"].shape == (10, 3, 4)
    with pytest.raises(KeyError, match="did not keep"):
        z["blocks.0.attn.hook_z"]
    with pytest.raises(SelectionError, match="no such hook"):
        run_with_cache(circ, names="blocks.7.attn.hook_z")


def test_also_takes_every_matcher_get_takes():
    circ = attn_only(W, tokens_symbol(12))
    _, got = C.evaluate(circ, {"toks_int_var": BATCH}, also=[Glob("b?"), "blocks.0.attn.hook_pattern"])
    assert [k for k in got if isinstance(k, str)] == ["b0", "b1"]
    probs = [k for k in got if not isinstance(k, str)]  # the seed's names repeat: keyed by node
    assert len(probs) == 3 and all(got[k].shape == (4, 10, 10) for k in probs)
    cache = run_with_cache(circ, {"toks_int_var": BATCH}, names="blocks.0.attn.hook_pattern")
    np.testing.assert_array_equal(np.stack([got[k] for k in probs], 1), cache["blocks.0.attn.hook_pattern"])


def test_hook_names_select_in_get_update_and_patch():
    circ = attn_only(W, np.arange(12), unique_names=True)
    assert [n.name for n in circ.get("blocks.1.attn.hook_v")] == [f"b1.a.head{h}.a.v" for h in range(3)]
    zeroed = circ.update("blocks.0.attn.hook_pattern", lambda n: C.Array(np.zeros(n.shape, np.float32)))
    assert np.allclose(run_with_cache(zeroed, names="blocks.0.attn.hook_z")["blocks.0.attn.hook_z"], 0)
    same = patch(circ, "blocks.1.hook_resid_pre", {"toks_int_var": np.arange(12)[::-1].copy()})
    assert same.get_unique("b0.source").name == "b0.source"
    with pytest.raises(SelectionError, match="computed from"):
        circ.get("blocks.0.ln1.hook_scale")
    with pytest.raises(SelectionError, match=r"no such hook.*did you mean 'blocks.1.hook_resid_post'"):
        circ.get("blocks.1.hook_resid_pots")


def _hf_gpt2(cfg, weights):
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(**cfg, attn_implementation="eager")).eval().double()
    model.load_state_dict({k: torch.from_numpy(np.asarray(v, np.float64)) for k, v in weights.items()}, strict=False)
    return model


@pytest.mark.parametrize("split", [False, True])
def test_gpt2_hooks_against_transformers_modules(split):
    cfg = dict(n_embd=16, n_head=4, n_layer=2, vocab_size=31, n_positions=16, activation_function="gelu_new")
    weights = random_gpt2_weights(cfg, seed=1)
    toks = np.random.default_rng(3).integers(0, 31, (3, 7))
    circ = gpt2(cfg, weights, hf_tokens(7), split_heads=split)
    assert naming_convention(circ) == "hf"
    cache = run_with_cache(circ, {"tokens": toks}, dtype="float64")
    model = _hf_gpt2(cfg, weights)
    seen = {}

    def keep(name, pre=False):
        def fn(module, args, out=None):
            seen[name] = (args[0] if pre else out[0] if isinstance(out, tuple) else out).detach()
        return fn

    hooks = []
    for l, block in enumerate(model.transformer.h):
        hooks += [block.ln_1.register_forward_hook(keep(f"ln1.{l}")), block.attn.c_attn.register_forward_hook(keep(f"qkv.{l}")),
                  block.attn.c_proj.register_forward_pre_hook(keep(f"z.{l}", pre=True)),
                  block.attn.register_forward_hook(keep(f"attn.{l}")), block.mlp.c_fc.register_forward_hook(keep(f"pre.{l}")),
                  block.mlp.act.register_forward_hook(keep(f"post.{l}")), block.mlp.register_forward_hook(keep(f"mlp.{l}"))]
    with torch.no_grad():
        out = model(torch.from_numpy(toks), output_hidden_states=True, output_attentions=True)
    for h in hooks:
        h.remove()
    d, heads = 16, 4

    def per_head(x):  # [b, s, (h c)] -> [b, s, h, c]
        return x.reshape(*x.shape[:2], heads, d // heads).numpy()

    for l in range(2):
        b = f"blocks.{l}"
        checks = {f"{b}.hook_resid_pre": out.hidden_states[l].numpy(),
                  f"{b}.ln1.hook_normalized": seen[f"ln1.{l}"].numpy(),  # LayerNorm: after weight and bias
                  f"{b}.attn.hook_q": per_head(seen[f"qkv.{l}"][..., :d]),
                  f"{b}.attn.hook_k": per_head(seen[f"qkv.{l}"][..., d:2 * d]),
                  f"{b}.attn.hook_v": per_head(seen[f"qkv.{l}"][..., 2 * d:]),
                  f"{b}.attn.hook_pattern": out.attentions[l].numpy(),
                  f"{b}.attn.hook_z": per_head(seen[f"z.{l}"]),
                  f"{b}.hook_attn_out": seen[f"attn.{l}"].numpy(),
                  f"{b}.mlp.hook_pre": seen[f"pre.{l}"].numpy(), f"{b}.mlp.hook_post": seen[f"post.{l}"].numpy(),
                  f"{b}.hook_mlp_out": seen[f"mlp.{l}"].numpy()}
        for name, want in checks.items():
            np.testing.assert_allclose(cache[name], want, atol=1e-9, err_msg=name)
    resid_post = out.hidden_states[1].numpy() + seen["attn.1"].numpy() + seen["mlp.1"].numpy()
    np.testing.assert_allclose(cache["blocks.1.hook_resid_post"], resid_post, atol=1e-9)
    np.testing.assert_allclose(cache["blocks.1.hook_resid_mid"], resid_post - seen["mlp.1"].numpy(), atol=1e-9)
    final = out.hidden_states[2].numpy()  # transformers' last hidden state is after ln_f
    np.testing.assert_allclose(cache["ln_final.hook_normalized"], final, atol=1e-9)
    assert ("blocks.0.attn.hook_result" in cache) == split


def test_llama_rms_norm_rotary_and_grouped_query_layouts():
    cfg = dict(hidden_size=16, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=1,
               intermediate_size=24, vocab_size=19, hidden_act="silu")
    weights = random_llama_weights(cfg, seed=2)
    toks = np.array([3, 1, 4, 1, 5, 9])
    for split in (False, True):
        circ = llama(cfg, weights, toks, split_heads=split)
        cache = run_with_cache(circ, dtype="float64")
        x = cache["h0"]
        rms = np.sqrt((x ** 2).mean(-1, keepdims=True) + 1e-6)
        np.testing.assert_allclose(cache["ln_final.hook_scale"], rms, rtol=1e-9)
        np.testing.assert_allclose(cache["ln_final.hook_normalized"], x / rms, rtol=1e-9)
        assert cache["blocks.0.attn.hook_q"].shape == (6, 4, 4)     # [pos, head, d_head]
        assert cache["blocks.0.attn.hook_k"].shape == (6, 2, 4)     # [pos, kv head, d_head]
        assert cache["blocks.0.attn.hook_rot_k"].shape == (6, 2, 4)
        assert cache["blocks.0.attn.hook_pattern"].shape == (4, 6, 6)
        np.testing.assert_allclose(cache["blocks.0.attn.hook_pattern"].sum(-1), 1, rtol=1e-9)
        wq = weights["model.layers.0.self_attn.q_proj.weight"]
        want_q = cache["blocks.0.ln1.hook_normalized"] * weights["model.layers.0.input_layernorm.weight"] @ wq.T
        np.testing.assert_allclose(cache["blocks.0.attn.hook_q"], want_q.reshape(6, 4, 4), atol=1e-9)


def test_the_docs_table_is_the_code_table():
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "transformerlens.md").read_text()
    assert hook_table() in doc


def test_every_huggingface_family_answers_to_the_hook_names():
    """Every family of the models' verification matrix (GPT-2, OPT, Llama, Mistral, GPT-NeoX,
    Gemma-2, Qwen2): hook_resid_pre and hook_pattern against
    transformers' hidden states and attentions; the direct logit attribution sums to the logit
    difference; the logit lens's last stage is the unembedding's output (before Gemma-2's cap)."""
    from circuits.interp import logit_attribution, logit_lens
    from circuits.models import matrix
    from circuits.models.model import Model

    toks = np.random.default_rng(0).integers(1, 50, 7)
    for family in matrix.FAMILIES:
        hf = matrix.hf_model(family, seed=1)
        cfg = dict(hf.config.to_dict(), model_type=hf.config.model_type)
        circ = Model(cfg, {k: v.detach().numpy() for k, v in hf.state_dict().items()}).circuit(toks)
        assert naming_convention(circ) == "hf", family
        cache = run_with_cache(circ, dtype="float64")
        with torch.no_grad():
            out = hf(torch.from_numpy(toks[None]), output_hidden_states=True, output_attentions=True)
        for l, pattern in enumerate(out.attentions):
            np.testing.assert_allclose(cache[f"blocks.{l}.hook_resid_pre"], out.hidden_states[l][0].numpy(), atol=1e-4,
                                       err_msg=family)
            np.testing.assert_allclose(cache[f"blocks.{l}.attn.hook_pattern"], pattern[0].numpy(), atol=1e-4,
                                       err_msg=family)
        raw = next((n for n in C.toposort(circ) if n.name == "logits.raw"), circ)
        logits = C.evaluate(raw, dtype="float64")
        d = np.eye(logits.shape[-1])[3] - np.eye(logits.shape[-1])[5]
        np.testing.assert_allclose(sum(logit_attribution(circ, d, dtype="float64").values()), logits @ d, atol=1e-9)
        np.testing.assert_allclose(list(logit_lens(circ, dtype="float64").values())[-1], logits, atol=1e-9)
