"""The GPT-2, OPT and Llama/Mistral builders against the original ``transformers`` models (small
random-weight models built from configs; nothing is downloaded): logits agree within 1e-4 in
float32 for every family and variant, from the model object and from a ``save_pretrained``
directory."""

import subprocess
import sys

import numpy as np
import pytest

import circuits as C
from circuits.models import from_huggingface, gpt2, llama, opt

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

TOL = 1e-4
VOCAB = 61


def _randomize(model, seed):
    """Weights large enough that every part of the model moves the logits (the default init
    leaves them near zero)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1 and ("norm" in name or "ln" in name):
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g))
            elif p.ndim == 1:
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) * min(p.shape) ** -0.5)
    return model.eval()


def _torch_logits(model, toks):
    with torch.no_grad():
        return model(torch.tensor(np.asarray(toks)[None])).logits[0].numpy()


def _inputs(seed, n=3, length=9):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, VOCAB, length - i) for i in range(n)]


def _gpt2(**kw):
    cfg = dict(n_embd=32, n_head=4, n_layer=2, vocab_size=VOCAB, n_positions=24)
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(**{**cfg, **kw}))


def _opt(**kw):
    cfg = dict(hidden_size=32, num_attention_heads=4, num_hidden_layers=2, ffn_dim=48, vocab_size=VOCAB,
               max_position_embeddings=24, word_embed_proj_dim=32)
    return transformers.OPTForCausalLM(transformers.OPTConfig(**{**cfg, **kw}))


def _llama(**kw):
    cfg = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=4, num_hidden_layers=2,
               intermediate_size=48, vocab_size=VOCAB, attn_implementation="eager")
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**{**cfg, **kw}))


def _mistral(**kw):
    cfg = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
               intermediate_size=48, vocab_size=VOCAB, attn_implementation="eager", sliding_window=3)
    return transformers.MistralForCausalLM(transformers.MistralConfig(**{**cfg, **kw}))


VARIANTS = {
    "gpt2": (_gpt2, {}, {}),
    "gpt2-split-heads": (_gpt2, {}, {"split_heads": True}),
    "gpt2-modules": (_gpt2, {"n_layer": 3}, {"modules": True}),
    "gpt2-relu-untied": (_gpt2, {"activation_function": "relu", "tie_word_embeddings": False}, {}),
    "opt-pre-ln": (_opt, {}, {}),
    "opt-post-ln": (_opt, {"do_layer_norm_before": False}, {}),
    "opt-project-in-out": (_opt, {"word_embed_proj_dim": 16}, {"split_heads": True}),
    "llama-mha": (_llama, {}, {}),
    "llama-gqa": (_llama, {"num_key_value_heads": 2}, {}),
    "llama-gqa-split-heads-theta": (_llama, {"num_key_value_heads": 1, "rope_theta": 500.0}, {"split_heads": True}),
    "llama-biases-head-dim": (_llama, {"attention_bias": True, "mlp_bias": True, "head_dim": 16}, {}),
    "llama-gqa-biases-modules": (_llama, {"num_key_value_heads": 2, "attention_bias": True, "mlp_bias": True},
                                 {"modules": True}),
    "mistral-sliding-window": (_mistral, {}, {}),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_logits_match_transformers(variant):
    make, cfg, kw = VARIANTS[variant]
    model = _randomize(make(**cfg), seed=len(variant))
    rows = np.random.default_rng(len(variant)).integers(0, VOCAB, (3, 9))
    c = from_huggingface(model, C.Symbol((9,), name="tokens", dtype="int64"), **kw)
    assert c.name == "logits" and c.shape == (9, VOCAB)
    f = C.compile(c)
    for toks in rows:
        want = _torch_logits(model, toks)
        assert np.abs(want).max() > 0.5  # the weights really move the logits
        assert np.max(np.abs(f({"tokens": toks}) - want)) <= TOL, variant
    if variant in ("gpt2", "opt-post-ln", "mistral-sliding-window"):  # another length, tokens as an Array
        short = rows[0][:5]
        assert np.max(np.abs(C.evaluate(from_huggingface(model, short, **kw)) - _torch_logits(model, short))) <= TOL


def test_sliding_window_is_exercised():
    """Without the window the circuit differs from Mistral's output: the test above checks it."""
    model = _randomize(_mistral(), seed=3)
    toks = _inputs(3)[0]
    cfg = model.config.to_dict()
    weights = {k: v.numpy() for k, v in model.state_dict().items()}
    no_window = C.evaluate(llama(dict(cfg, sliding_window=None), weights, toks))
    assert np.max(np.abs(no_window - _torch_logits(model, toks))) > 1e-2


@pytest.mark.parametrize("make,cfg", [(_gpt2, {}), (_opt, {"word_embed_proj_dim": 16}),
                                      (_llama, {"num_key_value_heads": 2})])
def test_safetensors_directory_matches(tmp_path, make, cfg):
    model = _randomize(make(**cfg), seed=7)
    model.save_pretrained(tmp_path, safe_serialization=True)
    toks = _inputs(8)[0]
    got = C.evaluate(from_huggingface(tmp_path, toks))
    assert np.max(np.abs(got - _torch_logits(model, toks))) <= TOL


def test_checkpoint_directory_loads_without_torch(tmp_path):
    model = _randomize(_llama(num_key_value_heads=2), seed=9)
    model.save_pretrained(tmp_path, safe_serialization=True)
    toks = [3, 1, 4, 1, 5]
    np.save(tmp_path / "want.npy", _torch_logits(model, toks))
    code = (
        "import sys, numpy as np, circuits as C\n"
        "from circuits.models import from_huggingface\n"
        f"got = C.evaluate(from_huggingface({str(tmp_path)!r}, np.array({toks})))\n"
        f"want = np.load({str(tmp_path / 'want.npy')!r})\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
        "print(float(np.abs(got - want).max()))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert float(out.stdout.strip()) <= TOL


def test_symbol_tokens_evaluate_batched():
    model = _randomize(_llama(num_key_value_heads=2), seed=11)
    rows = np.random.default_rng(11).integers(0, VOCAB, (4, 7))
    c = from_huggingface(model, C.Symbol((7,), name="tokens", dtype="int64"))
    got = C.evaluate_batched(c, {"tokens": rows})
    with torch.no_grad():
        want = model(torch.tensor(rows)).logits.numpy()
    assert got.shape == (4, 7, VOCAB)
    assert np.max(np.abs(got - want)) <= TOL


@pytest.mark.parametrize("make", [_gpt2, _opt, _llama])
def test_loss_variant_matches_torch_cross_entropy(make):
    model = _randomize(make(), seed=13)
    toks = _inputs(13)[0]
    c = from_huggingface(model, toks, loss=True)
    assert c.name == "loss" and c.shape == (len(toks) - 1,)
    logits = torch.tensor(_torch_logits(model, toks))
    want = torch.nn.functional.cross_entropy(logits[:-1], torch.tensor(toks[1:]), reduction="none").numpy()
    assert np.max(np.abs(C.evaluate(c) - want)) <= TOL


def _cache_tensors(cache, layer):
    if hasattr(cache, "layers"):
        return cache.layers[layer].keys, cache.layers[layer].values
    if hasattr(cache, "key_cache"):
        return cache.key_cache[layer], cache.value_cache[layer]
    return cache[layer]


@pytest.mark.filterwarnings("ignore:`past_key_values` is deprecated")
@pytest.mark.parametrize("cfg,split,modules", [({"num_key_value_heads": 2}, False, False),
                                               ({"num_key_value_heads": 1}, True, False),
                                               ({"num_key_value_heads": 2}, False, True)])
def test_decode_step_against_kv_cache(cfg, split, modules):
    model = _randomize(_llama(**cfg), seed=17)
    toks = _inputs(17, n=1, length=9)[0]
    prefix, step = toks[:7], toks[7:]
    with torch.no_grad():
        first = model(torch.tensor(prefix[None]), use_cache=True)
        want = model(torch.tensor(step[None]), past_key_values=first.past_key_values, use_cache=True).logits[0]
    config = model.config.to_dict()
    weights = {k: v.numpy() for k, v in model.state_dict().items()}
    c = llama(config, weights, step, past_len=len(prefix), split_heads=split, modules=modules)
    inputs = {}
    for l in range(config["num_hidden_layers"]):
        k, v = _cache_tensors(first.past_key_values, l)
        inputs[f"h{l}.attn.past_k"], inputs[f"h{l}.attn.past_v"] = k[0, :, :len(prefix)].numpy(), v[0, :, :len(prefix)].numpy()
    got = C.evaluate(c, inputs)
    assert got.shape == (2, VOCAB)
    assert np.max(np.abs(got - want.numpy())) <= TOL
    # the same step equals the last rows of the full forward
    assert np.max(np.abs(got - _torch_logits(model, toks)[7:])) <= TOL


def test_placeholders_bind_to_the_built_circuit():
    model = _randomize(_llama(num_key_value_heads=2), seed=19)
    config = model.config.to_dict()
    weights = {k: v.numpy() for k, v in model.state_dict().items()}
    toks = [1, 2, 3, 4]
    empty = llama(config, None, toks)
    arrays = [n for n in C.toposort(empty) if isinstance(n, C.Array) and n.is_placeholder]
    assert len(arrays) == 2 + 1 + 9 * 2  # embed, norm, lm_head + 9 per layer
    by_short = {}
    for k, v in weights.items():
        k = k.removeprefix("model.")
        if k.startswith("layers."):
            _, l, rest = k.split(".", 2)
            k = f"h{l}.{rest}"
        by_short[k] = v
    bound = C.bind(empty, by_short)
    assert bound == llama(config, weights, toks)
    assert np.max(np.abs(C.evaluate(bound) - _torch_logits(model, toks))) <= TOL


# ---------------------------------------------------------------------------- bad input
def _state(model):
    return model.config.to_dict(), {k: v.numpy() for k, v in model.state_dict().items()}


def test_unknown_activation_names_the_key():
    cfg, w = _state(_gpt2())
    with pytest.raises(C.CircuitError, match="activation_function='quick_gelu'"):
        gpt2(dict(cfg, activation_function="quick_gelu"), w, [1, 2])


def test_alibi_is_rejected():
    cfg, w = _state(_llama())
    with pytest.raises(C.CircuitError, match="alibi"):
        llama(dict(cfg, alibi=True), w, [1, 2])


def test_rope_scaling_is_rejected():
    cfg, w = _state(_llama())
    bad = dict(cfg, rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0})
    with pytest.raises(C.CircuitError, match="rope_type='llama3'"):
        llama(bad, w, [1, 2])


def test_missing_weight_names_the_key():
    cfg, w = _state(_opt())
    del w["model.decoder.layers.1.fc2.bias"]
    with pytest.raises(C.CircuitError, match=r"model\.decoder\.layers\.1\.fc2\.bias"):
        opt(cfg, w, [2, 3])


def test_shape_mismatch_names_the_key():
    cfg, w = _state(_llama())
    w["model.layers.0.mlp.up_proj.weight"] = w["model.layers.0.mlp.up_proj.weight"][:-1]
    with pytest.raises(C.ShapeError, match=r"model\.layers\.0\.mlp\.up_proj\.weight.*\[47, 32\].*\[48, 32\]"):
        llama(cfg, w, [1, 2])


def test_unaccounted_weight_is_an_error():
    cfg, w = _state(_gpt2())
    w["transformer.h.0.attn.q_norm.weight"] = np.ones(8, np.float32)
    with pytest.raises(C.CircuitError, match=r"transformer\.h\.0\.attn\.q_norm\.weight"):
        gpt2(cfg, w, [1, 2])


def test_untied_lm_head_that_differs_is_an_error():
    cfg, w = _state(_gpt2())
    w["lm_head.weight"] = w["lm_head.weight"] + 1
    with pytest.raises(C.CircuitError, match="tie_word_embeddings"):
        gpt2(cfg, w, [1, 2])


def test_tokens_out_of_vocabulary():
    cfg, w = _state(_gpt2())
    with pytest.raises(C.CircuitError, match=r"\[0, 61\)"):
        gpt2(cfg, w, [1, VOCAB])


def test_unsupported_model_type():
    with pytest.raises(C.CircuitError, match="model_type='bert'"):
        from_huggingface({"model_type": "bert"}, [1])


@pytest.mark.parametrize("make,build", [(_gpt2, gpt2), (_llama, llama)])
def test_builders_with_modules_write_the_block_once(make, build):
    # the same logits as the plain builder (and so as torch, above), the block's nodes printed once,
    # and the text parses back; pushed down or substituted, the modules leave the same value
    from circuits.testing.roundtrip import store_of
    from rewrites import push_down_modules

    model = make(**({"n_layer": 3} if make is _gpt2 else {"num_hidden_layers": 3}))
    cfg, w = _state(model)
    toks = np.array([1, 5, 2, 7, 3])
    plain, mod = build(cfg, w, toks), build(cfg, w, toks, modules=True)
    want = C.evaluate(plain, dtype="float64")
    np.testing.assert_allclose(C.evaluate(mod, dtype="float64"), want, rtol=1e-9, atol=1e-9)
    text = mod.to_text()
    assert sum(" Module" in line for line in text.splitlines()) == 3
    assert sum("'h.attn.probs'" in line for line in text.splitlines()) == 1  # the body, once
    assert len(text.splitlines()) < len(plain.to_text().splitlines())
    assert C.parse(text, store=store_of(mod)) == mod
    for flat in (C.substitute_all_modules(mod), push_down_modules(mod)):
        assert not any(type(n) is C.Module for n in C.toposort(flat))
        np.testing.assert_allclose(C.evaluate(flat, dtype="float64"), want, rtol=1e-9, atol=1e-9)
    with pytest.raises(TypeError):
        from_huggingface(_opt(), toks, modules=True)  # OPT's builder has no such option
