"""``circuits.models.load`` and ``Model``: a HuggingFace folder (random weights saved by
``transformers``, a tokenizer trained here), or a hub id from a pre-filled HuggingFace cache under
``HF_HUB_OFFLINE=1``, loaded into circuits of text, tokens and batches whose values agree with the
``transformers`` model; tokens and strings as TransformerLens gives them; bad input refused."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import circuits as C
from circuits.models import Model, load
from circuits.models.checkpoint import read_safetensors
from tests.models.hf_folders import VOCAB, hf_model, hf_tokenizer, rng_tokens, save

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

TOL = 1e-4


@pytest.fixture(scope="module")
def gpt2_folder(tmp_path_factory):
    model = hf_model("gpt2", seed=1)
    return save(model, tmp_path_factory.mktemp("gpt2")), model


def _logits(model, toks):
    with torch.no_grad():
        return model(torch.tensor(np.asarray(toks)[None])).logits[0].numpy()


def test_load_folder_logits_and_tokens(gpt2_folder):
    folder, hf = gpt2_folder
    m = load(folder)
    assert m.family == "gpt2" and m.context == 64 and m.tokenizer is not None
    text = "the cat sat on the mat"
    toks = m.to_tokens(text)
    want = hf_tokenizer()(text)["input_ids"]
    assert toks.shape == (1, len(want) + 1) and toks[0, 0] == 0 and toks[0, 1:].tolist() == want  # BOS first
    c = m.circuit(text)
    assert c.name == "logits" and c.shape == (toks.shape[1], VOCAB)
    np.testing.assert_allclose(C.evaluate(c), _logits(hf, toks[0]), atol=TOL)
    assert C.evaluate(m.circuit(toks)).shape == c.shape  # [1, n] tokens: the same single sequence
    assert c.get_unique("h1.attn.head3").name == "h1.attn.head3"  # per-head sites by default


def test_load_reads_no_torch_and_copies_no_weight_twice(gpt2_folder):
    folder, _ = gpt2_folder
    code = (
        "import sys, circuits as C\n"
        f"m = C.models.load({str(folder)!r})\n"
        "print(C.evaluate(m.circuit('a cat')).shape)\n"
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, 'torch or transformers imported'\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert out.returncode == 0, out.stderr
    # every tensor read once into read-only 64-byte aligned memory, which its Array keeps as it is
    arrays = read_safetensors(folder / "model.safetensors")
    assert all(not a.flags.writeable and a.ctypes.data % 64 == 0 for a in arrays.values())
    m = load(folder)
    assert all(a.value.ctypes.data % 64 == 0 for a in m.weights.values())
    from circuits.models.model import named_arrays

    # (names unlike the loaded model's: equal Arrays are one node, and `m` holds its own)
    owned = named_arrays(arrays, ("unused.",), "gpt2", owned=True)
    assert all(owned[k].value is arrays[k] for k in arrays)  # not copied
    copied = named_arrays({"x." + k: v for k, v in arrays.items()}, ("unused.",), "gpt2")  # a user's arrays: copied
    assert not any(np.shares_memory(copied["x." + k].value, arrays[k]) for k in arrays)


def test_bfloat16_and_float16_checkpoints_widen_exactly(tmp_path):
    from safetensors.torch import save_file

    t = torch.randn(3, 5)
    save_file({"b": t.to(torch.bfloat16), "h": t.to(torch.float16), "f": t}, str(tmp_path / "w.safetensors"))
    got = read_safetensors(tmp_path / "w.safetensors")
    assert got["b"].dtype == np.float32 and got["h"].dtype == np.float32
    np.testing.assert_array_equal(got["b"], t.to(torch.bfloat16).float().numpy())
    np.testing.assert_array_equal(got["h"], t.to(torch.float16).float().numpy())
    np.testing.assert_array_equal(got["f"], t.numpy())


def test_strings_as_transformerlens_gives_them(gpt2_folder):
    folder, _ = gpt2_folder
    m = load(folder)
    text = "naïve café 🙂 the dog"
    ids = m.to_tokens(text)[0]
    hf = hf_tokenizer()
    assert m.to_str_tokens(text) == [hf.decode([int(i)]) for i in ids]  # one token at a time, BOS included
    assert m.to_str_tokens(text)[0] == "<|endoftext|>"
    assert m.to_str_tokens(ids[None]) == m.to_str_tokens(ids)
    assert m.to_string(ids) == "<|endoftext|>" + text  # decoding is exact: no space clean-up
    assert m.to_string(m.to_tokens(text, prepend_bos=False)) == [text]
    batch = m.to_tokens(["a cat", "the quick brown fox"])
    assert batch.shape[0] == 2 and batch[0, -1] == 0  # padded on the right with the pad (= EOS) token
    left = m.to_tokens(["a cat", "the quick brown fox"], padding_side="left")
    assert left[0, 0] == 0 and left[0, -1] == batch[0, len(m.to_tokens("a cat")[0]) - 1]
    assert m.to_str_tokens(["a", "b"]) == [m.to_str_tokens("a"), m.to_str_tokens("b")]


def test_batch_circuits_and_the_loss_convention(gpt2_folder):
    folder, hf = gpt2_folder
    m = load(folder)
    rows = [rng_tokens(1, 9), rng_tokens(2, 6), rng_tokens(3, 9)]
    c = m.circuit(rows)
    assert c.shape == (9, VOCAB)
    inputs = m.inputs(rows)
    got = C.evaluate(c, inputs)
    for i, r in enumerate(rows):  # padding on the right never reaches a real token
        np.testing.assert_allclose(got[i, :len(r)], _logits(hf, r), atol=TOL)
    loss = m.circuit(rows, output="loss")
    assert loss.shape == (8,)  # n tokens give n - 1 losses (TransformerLens's convention)
    got_loss = C.evaluate(loss, inputs)
    for i, r in enumerate(rows):
        logits = torch.tensor(_logits(hf, r))
        want = torch.nn.functional.cross_entropy(logits[:-1], torch.tensor(r[1:]), reduction="none").numpy()
        np.testing.assert_allclose(got_loss[i, :len(r) - 1], want, atol=TOL)
        assert np.all(got_loss[i, len(r) - 1:] == 0)  # the padding's losses are masked out
    assert inputs["loss_mask"].shape == (3, 8)
    # an equal-length batch needs no mask; a 2-d array is such a batch
    same = np.stack([rows[0], rows[2]])
    assert set(m.inputs(same)) == {"tokens"}
    np.testing.assert_allclose(C.evaluate(m.circuit(same, "loss"), m.inputs(same))[1],
                               C.evaluate(m.circuit(rows[2], "loss")), atol=TOL)


@pytest.mark.parametrize("family", ["gpt_neox", "gemma2", "qwen2", "mistral", "opt", "llama"])
def test_each_family_loads_from_its_folder(tmp_path, family):
    hf = hf_model(family, seed=5)
    m = load(save(hf, tmp_path))
    toks = rng_tokens(5, 11)
    np.testing.assert_allclose(C.evaluate(m.circuit(toks, split_heads=False)), _logits(hf, toks), atol=TOL)


def _fill_cache(cache, repo_id, folder, revision="0123456789abcdef0123456789abcdef01234567"):
    """The HuggingFace cache layout: models--org--name/{refs/main, snapshots/<commit>/<files>}."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snap = repo / "snapshots" / revision
    snap.mkdir(parents=True)
    for f in folder.iterdir():
        (snap / f.name).write_bytes(f.read_bytes())
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    return snap


def test_hub_id_from_a_prefilled_cache_offline(gpt2_folder, tmp_path, monkeypatch):
    pytest.importorskip("huggingface_hub")
    folder, hf = gpt2_folder
    cache = tmp_path / "hub"
    _fill_cache(cache, "tiny-org/tiny-gpt2", folder)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    m = load("tiny-org/tiny-gpt2")
    assert "snapshots" in m.path
    np.testing.assert_allclose(C.evaluate(m.circuit("a cat")), _logits(hf, m.to_tokens("a cat")[0]), atol=TOL)
    with pytest.raises(C.CircuitError, match=r"'tiny-org/absent' is not in the HuggingFace cache.*HF_HUB_OFFLINE"):
        load("tiny-org/absent")
    with pytest.raises(C.CircuitError, match="no such model directory"):
        load(str(tmp_path / "nowhere" / "deeper"))


# ---------------------------------------------------------------------------- bad input
def _config(folder):
    return json.loads((folder / "config.json").read_text())


def test_a_tokenizer_larger_than_the_vocabulary_is_refused(tmp_path):
    hf = hf_model("gpt2", seed=2, vocab_size=300)  # the tokenizer has 320 ids
    with pytest.raises(C.CircuitError, match=r"tokenizer has ids up to 319 but the model's vocabulary is vocab_size=300"):
        load(save(hf, tmp_path))


def test_a_prompt_longer_than_the_context_names_both_lengths(gpt2_folder):
    m = load(gpt2_folder[0])
    with pytest.raises(C.CircuitError, match=r"70 tokens, longer than the model's context of 64 \(n_positions\)"):
        m.circuit(np.ones(70, np.int64))
    with pytest.raises(C.CircuitError, match=r"60 tokens plus max_new_tokens=10 needs 70 positions; .*context is 64"):
        m.generate(np.ones(60, np.int64), 10)


@pytest.mark.parametrize("family, field, value, match", [
    ("gpt2", "use_flash_mlp", True, r"config field 'use_flash_mlp' \(True\) is not understood"),
    ("llama", "rope_scaling", {"rope_type": "yarn", "factor": 4.0}, r"rope_type='yarn'"),
    ("llama", "rope_parameters", {"rope_type": "default", "rope_theta": 1e4, "mrope_section": [1]},
     r"rope_parameters\.mrope_section"),
    ("qwen2", "layer_types", ["full_attention", "chunked_attention", "full_attention"],
     r"layer_types\[1\]='chunked_attention'"),
    ("gemma2", "use_bidirectional_attention", True, "use_bidirectional_attention"),
    ("gemma2", "sliding_window_size", 3, "sliding_window_size=3 differs from sliding_window=5"),
    ("gpt_neox", "rope_scaling", {"type": "dynamic", "factor": 2.0}, "rope_type='dynamic'"),
    ("opt", "quantization_config", {"quant_method": "gptq"}, "quantization_config"),
])
def test_config_variants_are_refused_naming_the_field(family, field, value, match):
    hf = hf_model(family)
    cfg = dict(hf.config.to_dict(), **{field: value})
    with pytest.raises(C.CircuitError, match=match):
        Model(cfg, {k: v.numpy() for k, v in hf.state_dict().items()})


def test_an_unknown_architecture_names_the_route(gpt2_folder, tmp_path):
    cfg = _config(gpt2_folder[0])
    with pytest.raises(C.CircuitError, match=r"model_type='mamba' has no builder.*from_torch"):
        Model(dict(cfg, model_type="mamba"), {})


def test_the_step_circuit_and_the_attention_view_with_token_strings(gpt2_folder):
    from circuits import interp

    m = load(gpt2_folder[0])
    step = m.circuit([5], output="step", past=16)
    symbols = {n.name: n.shape for n in C.toposort(step) if isinstance(n, C.Symbol)}
    assert symbols["positions"] == (1,) and symbols["attention_mask"] == (1, 17)
    assert symbols["h1.attn.past_k"] == (4, 16, 8) and "tokens" not in symbols  # the new token is an Array here
    text = "the cat sat"
    view = interp.attention_patterns(m.circuit(text), m.to_str_tokens(text))
    assert view.tokens == m.to_str_tokens(text) and view.patterns.shape[:2] == (2, 4)


@pytest.mark.parametrize("mangle, match", [
    (lambda b: b[:-4], "cut short|does not fit"),
    (lambda b: (10 ** 12).to_bytes(8, "little") + b[8:], "header length"),
    (lambda b: b[:8] + b"{" * (int.from_bytes(b[:8], "little")) + b[8 + int.from_bytes(b[:8], "little"):], "not valid JSON"),
    (lambda b: b.replace(b'"F32"', b'"F8_"'), "dtype F8_"),
])
def test_malformed_safetensors_are_clear_errors(tmp_path, mangle, match):
    from safetensors.numpy import save_file

    save_file({"w": np.ones((4, 4), np.float32)}, str(tmp_path / "a.safetensors"))
    data = (tmp_path / "a.safetensors").read_bytes()
    (tmp_path / "a.safetensors").write_bytes(mangle(data))
    with pytest.raises(C.CircuitError, match=match):
        read_safetensors(tmp_path / "a.safetensors")
