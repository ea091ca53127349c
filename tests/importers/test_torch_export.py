"""from_torch: transformers models and a hand-written module agree with torch itself (the oracle);
unsupported ops are listed together with their module paths; imported circuits print, save, load."""

import subprocess
import sys

import numpy as np
import pytest

import circuits as C

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from circuits.importers import from_torch  # noqa: E402

TOL = 1e-4


def _random_ids(seed, vocab, shape):
    return torch.from_numpy(np.random.default_rng(seed).integers(0, vocab, shape))


def _agrees(model, circuit, inputs_list):
    """The circuit's value equals the model's logits on each of the inputs (one dict each)."""
    for inputs in inputs_list:
        want = model(**inputs).logits.detach().numpy()
        got = C.evaluate(circuit, {k: v.numpy() for k, v in inputs.items()})
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, atol=TOL, rtol=0)


def _causal_lm(kind):
    torch.manual_seed(0)
    common = dict(vocab_size=61, use_cache=False, attn_implementation="eager")
    if kind == "gpt2":
        cfg = transformers.GPT2Config(n_layer=2, n_head=4, n_embd=32, n_positions=64, **common)
        return transformers.GPT2LMHeadModel(cfg).eval()
    if kind == "opt":
        cfg = transformers.OPTConfig(num_hidden_layers=2, num_attention_heads=4, hidden_size=32, ffn_dim=48,
                                     max_position_embeddings=64, word_embed_proj_dim=24, **common)
        return transformers.OPTForCausalLM(cfg).eval()
    cfg = transformers.LlamaConfig(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                   hidden_size=32, intermediate_size=48, max_position_embeddings=64, **common)
    return transformers.LlamaForCausalLM(cfg).eval()


@pytest.fixture(scope="module", params=["gpt2", "opt", "llama"])
def imported(request):
    model = _causal_lm(request.param)
    ids = _random_ids(0, 61, (2, 9))
    return request.param, model, from_torch(model, (ids,))


def test_causal_lms_agree_with_torch(imported):
    kind, model, circuit = imported
    assert circuit.shape == (2, 9, 61)
    # The token ids are a Symbol: the same circuit evaluates other inputs of that shape.
    _agrees(model, circuit, [{"input_ids": _random_ids(s, 61, (2, 9))} for s in (0, 1, 2)])


def test_names_follow_module_paths(imported):
    kind, model, circuit = imported
    names = {n.name for n in circuit.toposort()}
    params = model.state_dict()
    arrays = [n for n in circuit.toposort() if isinstance(n, C.Array)]
    # Parameters are Arrays named by their state-dict keys, with their values.
    for a in arrays:
        if a.name in params:
            np.testing.assert_array_equal(a.value, params[a.name].detach().numpy())
    layer = {"gpt2": "transformer.h.1", "opt": "model.decoder.layers.1", "llama": "model.layers.1"}[kind]
    assert {"gpt2": f"{layer}.ln_1", "opt": f"{layer}.self_attn.q_proj",
            "llama": f"{layer}.self_attn.q_proj"}[kind] in names
    # Eager attention keeps the attention probabilities as one node per layer.
    probs = circuit.get_unique(f"{layer}.self_attn.softmax" if kind != "gpt2" else f"{layer}.attn.softmax")
    assert probs.shape == (2, 4, 9, 9)
    assert [s.name for s in circuit.toposort() if isinstance(s, C.Symbol)] == ["input_ids"]


def test_masks_and_rotary_tables_fold_to_constants(imported):
    kind, model, circuit = imported
    # Every Array is a parameter or one folded constant (a mask, a rotary table, positions):
    # nothing computed from the mask's pieces (arange, comparisons, cumsum) is left as an op.
    params = set(model.state_dict())
    constants = [n for n in circuit.toposort() if isinstance(n, C.Array) and n.name not in params]
    # one attention mask; Llama adds its rotary cos and sin tables (inv_freq, a buffer, folded in)
    assert len(constants) == {"gpt2": 1, "opt": 1, "llama": 3}[kind], [c.name for c in constants]
    functions = {n.function.name for n in circuit.toposort() if isinstance(n, C.GeneralFunction)}
    assert functions <= {"softmax", "rsqrt", "gelu", "gelu_new", "relu", "silu", "tanh", "pow",
                         "gen_index_at_0_c", "reciprocal"}
    if kind == "llama":
        assert not any("inv_freq" in (n.name or "") for n in circuit.toposort())  # a buffer, folded


def test_imported_circuit_prints_saves_and_loads(imported, tmp_path):
    kind, model, circuit = imported
    text = circuit.to_text()
    assert C.parse(text).to_text() == text
    C.save(circuit, tmp_path / "m.circuit")
    back = C.load(tmp_path / "m.circuit")
    assert back == circuit
    ids = _random_ids(5, 61, (2, 9))
    # one tier pinned: 'auto' may move to the whole program between the two calls (a background
    # compilation finishing), and the tiers agree to float rounding, not bit for bit
    np.testing.assert_array_equal(C.evaluate(back, {"input_ids": ids.numpy()}, mode="jit"),
                                  C.evaluate(circuit, {"input_ids": ids.numpy()}, mode="jit"))


def _as_loaded(kind):
    """A tiny random model as ``AutoModelForCausalLM.from_config`` gives it: ``use_cache=True``
    and transformers' default attention (sdpa), as a user has it."""
    torch.manual_seed(1)
    common = dict(vocab_size=61, bos_token_id=0, eos_token_id=0)
    if kind == "gpt2":
        cfg = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=16, n_positions=32, **common)
    else:
        cfg = transformers.LlamaConfig(num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                       hidden_size=16, intermediate_size=24, max_position_embeddings=32, **common)
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    assert model.config.use_cache
    return model


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_model_as_loaded_with_its_cache_on_imports_its_logits(kind):
    model = _as_loaded(kind)
    circuit = from_torch(model, (_random_ids(0, 61, (1, 7)),))  # raised a raw 'DynamicCache' error
    assert circuit.shape == (1, 7, 61)
    _agrees(model, circuit, [{"input_ids": _random_ids(s, 61, (1, 7))} for s in (0, 3)])
    assert model.config.use_cache  # the model itself is left as it was


def test_an_explicit_cache_gets_a_library_error_with_the_fix():
    model = _as_loaded("gpt2")
    with pytest.raises(C.CircuitError, match=r"DynamicCache.*\n.*use_cache': False"):
        from_torch(model, (_random_ids(0, 61, (1, 7)),), {"use_cache": True})


def test_marian_encoder_decoder_forward_agrees_with_torch():
    torch.manual_seed(0)
    cfg = transformers.MarianConfig(
        vocab_size=60, d_model=16, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=64,
        pad_token_id=59, decoder_start_token_id=59, use_cache=False, attn_implementation="eager")
    model = transformers.MarianMTModel(cfg).eval()
    src, tgt = _random_ids(0, 59, (1, 6)), _random_ids(1, 59, (1, 5))
    logits, encoded = from_torch(model, (), {"input_ids": src, "decoder_input_ids": tgt})
    assert "model.decoder.layers.0.encoder_attn.k_proj" in {n.name for n in logits.toposort()}
    for seed in (0, 1):
        inputs = {"input_ids": _random_ids(seed, 59, (1, 6)), "decoder_input_ids": _random_ids(seed + 7, 59, (1, 5))}
        out = model(**inputs)
        feed = {k: v.numpy() for k, v in inputs.items()}
        np.testing.assert_allclose(C.evaluate(logits, feed), out.logits.detach().numpy(), atol=TOL, rtol=0)
        np.testing.assert_allclose(C.evaluate(encoded, feed), out.encoder_last_hidden_state.detach().numpy(),
                                   atol=TOL, rtol=0)


class Unusual(torch.nn.Module):
    """Ops transformers rarely show together: chunk/unbind/stack/cat, gathers by an input index,
    masked_fill and where with constant masks, softmax over a middle axis, keepdim reductions,
    rsub/pow/div, SDPA (causal, grouped), broadcasting batched matmuls, RMS and 2-axis layer norm."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 12)
        self.norm = torch.nn.LayerNorm([3, 4])
        self.rms = torch.nn.RMSNorm(8, eps=1e-6)
        self.table = torch.nn.Embedding(10, 8)
        self.register_buffer("mask", torch.tensor([True, False, True, False, False, True]))
        self.register_buffer("scale", torch.linspace(0.5, 1.5, 8), persistent=False)

    def forward(self, x, idx):  # x [2, 6, 8], idx [2, 3] ints
        h = self.rms(x) * self.scale + self.table(idx).mean(dim=1, keepdim=True)
        a, b, c = self.proj(h).chunk(3, dim=-1)                       # 3 x [2, 6, 4]
        q = torch.stack([a, b], dim=1)                                # [2, 2, 6, 4]
        k = torch.cat([c.unsqueeze(1)], dim=1)                        # [2, 1, 6, 4]
        att = torch.nn.functional.scaled_dot_product_attention(
            q, k, k, is_causal=True, enable_gqa=True)                 # [2, 2, 6, 4]
        s = att.permute(0, 2, 1, 3).flatten(2)                        # [2, 6, 8]
        s = s.masked_fill(self.mask[None, :, None], -2.0)
        s = torch.where(self.mask[:, None], s, 1.0 - s.pow(2))
        s = torch.log_softmax(s, dim=1) / (1.5 + s.sigmoid())
        g = s[:, idx[0]]                                              # gather by an input: [2, 3, 8]
        t = self.norm(g.unflatten(-1, (2, 4))[:, :, 1].reshape(2, 1, 3, 4).expand(2, 2, 3, 4))
        m = torch.matmul(t, t.transpose(-1, -2)[:1])                  # broadcast batch: [2, 2, 3, 3]
        u = torch.unbind(m, dim=1)[1].sum(dim=-1) - torch.rsub(m[:, 0, ::2, -1], 3.0).sqrt().abs().sum(-1, keepdim=True)
        return u.relu() + torch.bmm(g, g.transpose(1, 2)).diagonal(dim1=1, dim2=2).tanh()


def test_hand_written_module_with_unusual_ops_agrees_with_torch():
    torch.manual_seed(0)
    module = Unusual().eval()
    x, idx = torch.randn(2, 6, 8), torch.tensor([[0, 5, 2], [3, 3, 1]])
    circuit = from_torch(module, (x, idx))
    for seed in (0, 1):
        x = torch.from_numpy(np.random.default_rng(seed).normal(size=(2, 6, 8)).astype(np.float32))
        idx = _random_ids(seed, 6, (2, 3))
        got = C.evaluate(circuit, {"x": x.numpy(), "idx": idx.numpy()})
        np.testing.assert_allclose(got, module(x, idx).detach().numpy(), atol=TOL, rtol=0)


class _Erf(torch.nn.Module):
    def forward(self, x):
        return torch.special.erf(x)


class _Offenders(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.first = torch.nn.Linear(4, 4)
        self.second = torch.nn.Sequential(torch.nn.Linear(4, 4), _Erf())

    def forward(self, x):
        y = torch.cumsum(self.first(x), dim=0)
        return torch.cummax(y + self.second(x), dim=1).values


def test_unsupported_ops_are_listed_together_with_their_module_paths():
    with pytest.raises(C.CircuitError) as info:
        from_torch(_Offenders().eval(), (torch.ones(3, 4),))
    message = str(info.value)
    assert "3 op(s) cannot be converted" in message
    assert "aten.cumsum.default in (top level)" in message
    assert "aten.special_erf.default in second.1 (node special_erf)" in message
    assert "aten.cummax.default in (top level)" in message  # downstream of the others, listed too
    assert "CONVERTERS" in message  # the fix


def test_dropout_in_training_mode_is_refused():
    module = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.5)).train()
    with pytest.raises(C.CircuitError, match=r"dropout in training mode.*eval\(\)"):
        from_torch(module, (torch.ones(1, 2),))


def test_from_torch_refuses_other_objects():
    with pytest.raises(C.CircuitError, match="torch.nn.Module or a torch.export.ExportedProgram"):
        from_torch(lambda x: x, (torch.ones(1),))


def test_importing_circuits_does_not_import_torch():
    code = "import sys, circuits, circuits.importers; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


class _Returns(torch.nn.Module):
    def __init__(self, value):
        super().__init__()
        self.value = value

    def forward(self, x):
        return self.value(x)


def test_a_python_number_returned_is_a_constant_circuit():
    # a module returning 3.0 gave the Python float 3.0, not a circuit
    c = from_torch(_Returns(lambda x: 3.0).eval(), (torch.ones(2),))
    assert isinstance(c, C.Circuit) and C.evaluate(c) == np.float32(3.0)
    doubled, seven = from_torch(_Returns(lambda x: (x * 2, 7)).eval(), (torch.ones(2),))
    assert C.evaluate(doubled, {"x": np.array([1.0, 2.0], np.float32)}).tolist() == [2.0, 4.0]
    assert C.evaluate(seven) == 7 and seven.dtype == "int64"


def test_a_module_returning_a_dict_gives_a_dict_of_circuits_with_its_keys_in_its_order():
    # a tuple before, the keys lost (issue 33 item 11)
    def forward(x):
        return {"z": x * 2, "a": x + 1, "pair": (x - 1, x.sum()), "three": 3.0}

    module = _Returns(forward).eval()
    x = np.array([1.0, -2.0], np.float32)
    got = from_torch(module, (torch.ones(2),))
    want = forward(torch.from_numpy(x))
    assert type(got) is dict and list(got) == ["z", "a", "pair", "three"]
    for key in ("z", "a"):
        np.testing.assert_array_equal(C.evaluate(got[key], {"x": x}), want[key].numpy())
    assert isinstance(got["pair"], tuple) and len(got["pair"]) == 2
    for ours, theirs in zip(got["pair"], want["pair"]):
        np.testing.assert_array_equal(C.evaluate(ours, {"x": x}), theirs.numpy())
    assert C.evaluate(got["three"]) == 3.0
    one = from_torch(_Returns(lambda x: {"only": x * 3}).eval(), (torch.ones(2),))
    assert list(one) == ["only"] and C.evaluate(one["only"], {"x": x}).tolist() == [3.0, -6.0]


def test_a_none_output_is_a_clear_error():
    with pytest.raises(C.CircuitError, match="output 1 of the module is NoneType"):
        from_torch(_Returns(lambda x: (x * 2, None)).eval(), (torch.ones(2),))


class _Branches(torch.nn.Module):
    def forward(self, x):
        if x.sum() > 0:  # data-dependent control flow: torch.export cannot capture it
            return x
        return -x


@pytest.mark.parametrize("module, args, kwargs", [
    (_Branches(), (torch.ones(3),), None),
    (torch.nn.Linear(3, 2), (torch.ones(4),), None),  # wrong input shape
    (torch.nn.Linear(3, 2), ("abc",), None),  # not a tensor
    (torch.nn.Linear(3, 2), (torch.ones(3),), {"bad": 1}),  # no such argument
])
def test_torch_export_failures_are_circuit_errors(module, args, kwargs):
    with pytest.raises(C.CircuitError, match="torch.export could not capture"):
        from_torch(module.eval(), args, kwargs)


def test_example_inputs_must_be_a_tuple():
    with pytest.raises(C.CircuitError, match="example_inputs is a Tensor"):
        from_torch(torch.nn.Linear(3, 2).eval(), torch.ones(3))
