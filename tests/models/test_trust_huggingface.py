"""Trust in the HuggingFace importer's config reading (issue 21, items 13 and 14): hostile or
malformed configs and checkpoint folders give a ``CircuitError`` naming the key or the file, fast;
torch is not needed."""

import json
import os

import numpy as np
import pytest

import circuits as C
from circuits.models import from_huggingface, load_checkpoint

GPT2 = dict(model_type="gpt2", n_embd=8, n_head=2, n_layer=1, vocab_size=11, n_positions=16,
            activation_function="gelu_new")
OPT = dict(model_type="opt", hidden_size=8, num_attention_heads=2, num_hidden_layers=1, ffn_dim=16, vocab_size=11,
           max_position_embeddings=20, activation_function="relu")
LLAMA = dict(model_type="llama", hidden_size=8, num_attention_heads=2, num_hidden_layers=1, intermediate_size=16,
             vocab_size=11, hidden_act="silu")
MISTRAL = dict(LLAMA, model_type="mistral", sliding_window=2)


@pytest.mark.parametrize("config", [GPT2, OPT, LLAMA, MISTRAL], ids=lambda c: c["model_type"])
def test_the_base_configs_build(config):
    assert from_huggingface(config, [1, 2, 3]).shape == (3, 11)


@pytest.mark.parametrize("config, key, value", [
    (GPT2, "n_head", 0),  # was ZeroDivisionError
    (OPT, "num_attention_heads", 0),
    (LLAMA, "num_attention_heads", 0),
    (LLAMA, "num_key_value_heads", 0),
    (GPT2, "n_head", "2"),  # strings where ints belong
    (GPT2, "n_embd", "8"),
    (LLAMA, "hidden_size", "8"),
    (OPT, "ffn_dim", "16"),
    (GPT2, "n_inner", "32"),
    (GPT2, "n_embd", 8.5),
    (GPT2, "n_head", True),
    (GPT2, "n_embd", -8),
    (GPT2, "layer_norm_epsilon", "1e-5"),
    (LLAMA, "rms_norm_eps", float("nan")),
    (LLAMA, "rope_theta", "10000"),
    (LLAMA, "rope_theta", -1.0),
    (LLAMA, "head_dim", 0),
    (GPT2, "activation_function", ["gelu"]),  # unhashable: was TypeError
    (GPT2, "n_layer", 10**9),  # config-only builds of 10**9 placeholder layers never returned
    (OPT, "num_hidden_layers", 10**9),
    (LLAMA, "num_hidden_layers", 10**9),
])
def test_bad_config_values_name_the_key(config, key, value):
    with pytest.raises(C.CircuitError, match=key):
        from_huggingface(dict(config, **{key: value}), [1, 2, 3])


def test_an_unhashable_model_type_is_a_clear_error():
    with pytest.raises(C.CircuitError, match="model_type"):
        from_huggingface(dict(GPT2, model_type=["gpt2"]), [1, 2])


@pytest.mark.parametrize("window", [0, -1, -5, "2", 2.5])
def test_mistral_sliding_window_must_be_a_positive_int(window):
    # a window <= 0 used to be accepted, and tokens then attended to the future
    with pytest.raises(C.CircuitError, match="sliding_window"):
        from_huggingface(dict(MISTRAL, sliding_window=window), [1, 2, 3])


def test_mistral_window_of_one_attends_to_itself_only():
    w = C.fill_random(from_huggingface(dict(MISTRAL, sliding_window=1), C.models.tokens_symbol(3)), seed=0)
    mask = w.get_unique("sliding_mask").value  # the windowed layers' mask (full attention's is 'causal_mask')
    np.testing.assert_array_equal(mask, np.eye(3, dtype=np.float32))  # q - 1 < k <= q


def _folder(tmp_path, config_bytes):
    (tmp_path / "config.json").write_bytes(config_bytes)
    return tmp_path


@pytest.mark.parametrize("content, match", [
    (b"{not json", "not valid JSON"),
    (b"\xff\xfe{}", "not UTF-8"),
    (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    (b'"a string"', "holds a JSON str"),
    (b"[1, 2]", "holds a JSON list"),
])
def test_bad_config_json_is_a_clear_error(tmp_path, content, match):
    with pytest.raises(C.CircuitError, match=match):
        load_checkpoint(_folder(tmp_path, content))


def test_a_fifo_named_safetensors_is_refused_not_read(tmp_path):
    if not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs on this platform")
    folder = _folder(tmp_path, json.dumps(GPT2).encode())
    os.mkfifo(folder / "model.safetensors")  # reading it would block for good
    with pytest.raises(C.CircuitError, match="not a regular file"):
        from_huggingface(folder, [1, 2])


def test_a_fifo_named_config_json_is_refused(tmp_path):
    if not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs on this platform")
    os.mkfifo(tmp_path / "config.json")
    with pytest.raises(C.CircuitError, match="config.json"):
        load_checkpoint(tmp_path)


def test_the_sliding_mask_refuses_an_empty_window():
    from circuits.models.blocks import sliding_causal_mask

    with pytest.raises(C.CircuitError, match="at least 1"):
        sliding_causal_mask(3, 3, window=0)
