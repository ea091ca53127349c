"""``from_tracr`` / ``tracr_decode`` against tracr's own forward pass (``model.apply``).

tracr compiles slowly (seconds per program: haiku initialises every parameter), so each program
is compiled once per module; the default run compiles two small ones (a categorical program
with attention and MLPs, a numerical one), the slow run the ACDC tasks and more programs.
"""

import dataclasses
import os
import re

import jax
import numpy as np
import pytest
from tracr.compiler import compiling, lib
from tracr.rasp import rasp

import circuits
from circuits import Symbol
from circuits.errors import CircuitError
from circuits.importers import TracrTask, from_tracr, tracr_decode, tracr_task, tracr_tokens
from circuits.importers.tracr_tasks import ACDC_EDGES, TRUE_EDGES


def _compile(program, vocab, max_seq_len, causal=False):
    return compiling.compile_rasp_to_model(program, vocab=vocab, max_seq_len=max_seq_len, compiler_bos="BOS",
                                           causal=causal)


def _apply(model, inputs):
    """``model.apply(inputs)``, tracr's own forward pass, jitted (the same computation; tracr runs
    it op by op, which takes seconds per new length)."""
    return dataclasses.replace(model, forward=jax.jit(model.forward)).apply(inputs)


@pytest.fixture(scope="module")
def hist():
    """Categorical output; an attention layer and an MLP (SelectorWidth)."""
    return _compile(lib.make_hist(), {"a", "b"}, 4)


@pytest.fixture(scope="module")
def frac():
    """Numerical output; a numerical MLP and a numerical aggregate."""
    return _compile(lib.make_frac_prevs(rasp.tokens == "a"), {"a", "b"}, 4)


def check_against_tracr(model, inputs):
    """Our circuit on ``inputs`` against ``model.apply(inputs)``: the decoded output, the output
    (argmax / value), every residual stream and every head's attention logits."""
    c = from_tracr(model, inputs)
    out = _apply(model, inputs)
    cfg = model.model_config
    names = [f"b{l}{part}" for l in range(cfg.num_layers) for part in (".mid", "")]
    heads = [f"b{l}.a.head{h}.a.attn_scores_raw" for l in range(cfg.num_layers) for h in range(cfg.num_heads)]
    logits, ours = circuits.evaluate(c, also=names + heads + ["embeds"])
    logits = np.asarray(logits)
    assert logits.shape[0] == len(inputs)
    decoded = tracr_decode(model, logits)
    if model.output_encoder.__class__.__name__ == "CategoricalEncoder":
        assert decoded == out.decoded
        np.testing.assert_array_equal(np.argmax(logits, -1), np.asarray(out.unembedded)[0])
    else:
        assert decoded[0] == out.decoded[0]
        np.testing.assert_allclose(decoded[1:], out.decoded[1:], atol=1e-5)
        np.testing.assert_allclose(logits[:, 0], np.asarray(out.unembedded)[0], atol=1e-5)
    np.testing.assert_allclose(ours["embeds"], np.asarray(out.input_embeddings)[0], atol=1e-5)
    for name, theirs in zip(names, out.residuals):
        np.testing.assert_allclose(ours[name], np.asarray(theirs)[0], atol=1e-4, err_msg=name)
    for l in range(cfg.num_layers):
        theirs = np.asarray(out.attn_logits[l])[0]  # [heads, queries, keys]
        for h in range(cfg.num_heads):
            mine = ours[f"b{l}.a.head{h}.a.attn_scores_raw"]
            if cfg.causal:  # ours is 0 where masked (then -10000 is added), tracr's the unmasked score
                mine, theirs_h = np.tril(mine), np.tril(theirs[h])
            else:
                theirs_h = theirs[h]
            np.testing.assert_allclose(mine, theirs_h, atol=1e-3, rtol=1e-5)
    return c, logits


@pytest.mark.parametrize("inputs", [["BOS"], ["BOS", "b", "a", "b"], ["BOS", "a", "a", "b", "a"]])
def test_categorical_program_matches_tracr(hist, inputs):
    check_against_tracr(hist, inputs)


@pytest.mark.parametrize("inputs", [["BOS", "a", "b", "b"], ["BOS", "b", "a", "a", "b"]])
def test_numerical_program_matches_tracr(frac, inputs):
    check_against_tracr(frac, inputs)


def test_module_example(frac):
    """The example of ``circuits/importers/tracr.py``'s docstring (the ``frac`` program)."""
    logits = circuits.evaluate(from_tracr(frac, ["BOS", "a", "b", "a"]))
    assert logits.shape == (4, 1)
    decoded = tracr_decode(frac, logits)
    assert decoded[:3] == ["BOS", 1.0, 0.5] and decoded[3] == pytest.approx(2 / 3)


def test_layout_names_heads_and_mlps_for_edges(hist):
    c = from_tracr(hist, ["BOS", "a", "b"])
    cfg = hist.model_config
    assert c.name == "logits" and c.shape == (3, len(hist.output_encoder.encoding_map))
    for l in range(cfg.num_layers):
        for h in range(cfg.num_heads):
            head = c.get_unique(f"b{l}.a.head{h}")
            for role in "qkv":
                q = c.get_unique(f"b{l}.a.head{h}.a.{role}")
                # queries, keys and values read the residual stream itself (no LayerNorm in tracr)
                assert {ch.name for ch in q.children} >= {"embeds" if l == 0 else f"b{l - 1}"}
            assert head.shape == (3, hist.params["token_embed"]["embeddings"].shape[1])
        assert c.get_unique(f"h{l}.mlp.fc").children[0].name == f"b{l}.mid"
    assert {ch.name for ch in c.get_unique("embeds").children} == {"tok_embeds", "pos_embeds"}


def test_tokens_symbol_evaluates_many_inputs(hist):
    batch = [["BOS", "a", "b", "b"], ["BOS", "b", "b", "a"], ["BOS", "a", "a", "a"]]
    ids = np.stack([tracr_tokens(hist, x) for x in batch])
    c = from_tracr(hist, Symbol((4,), name="tokens", dtype="int64"))
    out = np.asarray(circuits.evaluate_batched(c, {"tokens": ids}))
    assert tracr_decode(hist, out) == [_apply(hist, x).decoded for x in batch]
    for x, o in zip(batch, out):
        np.testing.assert_allclose(o, circuits.evaluate(from_tracr(hist, x)), atol=1e-5)


def test_tracr_tokens_of_a_batch(hist):
    batch = [["BOS", "a", "b", "b"], ["BOS", "b", "b", "a"]]
    np.testing.assert_array_equal(tracr_tokens(hist, batch), np.stack([tracr_tokens(hist, x) for x in batch]))
    with pytest.raises(CircuitError, match=r"one length .*lengths \[3, 4\]"):
        tracr_tokens(hist, [["BOS", "a", "b", "b"], ["BOS", "a", "b"]])
    with pytest.raises(CircuitError, match="row 1 of the batch.*do not encode.*'c'"):
        tracr_tokens(hist, [["BOS", "a"], ["BOS", "c"]])
    with pytest.raises(CircuitError, match="for a batch build it over a tokens Symbol"):
        from_tracr(hist, batch)


def test_hook_names_and_the_cache_on_a_tracr_circuit(hist):
    from circuits.interp import run_with_cache
    from circuits.select.hooks import hook_names

    c = from_tracr(hist, ["BOS", "a", "b", "b"])
    names = hook_names(c)
    assert {"hook_embed", "blocks.0.hook_resid_pre", "blocks.0.attn.hook_pattern", "blocks.0.hook_resid_mid",
            "blocks.0.mlp.hook_post", "blocks.0.hook_mlp_out", "blocks.0.hook_resid_post"} <= set(names)
    cache = run_with_cache(c)
    heads = hist.model_config.num_heads
    assert cache["blocks.0.attn.hook_pattern"].shape == (heads, 4, 4)
    np.testing.assert_array_equal(cache["blocks.0.hook_resid_mid"], cache["b0.mid"])
    np.testing.assert_allclose(cache["blocks.0.hook_resid_post"],
                               cache["blocks.0.hook_resid_mid"] + cache["blocks.0.hook_mlp_out"], atol=1e-6)


def test_bad_inputs_are_clear_errors(hist):
    with pytest.raises(CircuitError, match="BOS"):
        from_tracr(hist, ["a", "b"])
    with pytest.raises(CircuitError, match="do not encode.*'c'"):
        from_tracr(hist, ["BOS", "c"])
    with pytest.raises(CircuitError, match="do not encode.*longer"):
        from_tracr(hist, ["BOS"] + ["a"] * 5)
    with pytest.raises(CircuitError, match="empty"):
        from_tracr(hist, [])
    with pytest.raises(CircuitError, match="must be a list"):
        from_tracr(hist, "BOS a")
    with pytest.raises(CircuitError, match="1-d"):
        from_tracr(hist, Symbol((2, 3), name="tokens", dtype="int64"))
    with pytest.raises(CircuitError, match="positions"):
        from_tracr(hist, Symbol((9,), name="tokens", dtype="int64"))
    with pytest.raises(CircuitError, match="int token ids"):
        from_tracr(hist, Symbol((3,), name="tokens"))
    with pytest.raises(CircuitError, match="AssembledTransformerModel"):
        from_tracr(object(), ["BOS"])
    with pytest.raises(CircuitError, match="positions, outputs"):
        tracr_decode(hist, np.zeros(3))
    with pytest.raises(CircuitError, match="outputs"):
        tracr_decode(hist, np.zeros((3, 7)))


def test_unsupported_models_are_clear_errors(hist):
    import jax

    def with_config(**changes):
        return dataclasses.replace(hist, model_config=dataclasses.replace(hist.model_config, **changes))

    with pytest.raises(CircuitError, match="layer_norm"):
        from_tracr(with_config(layer_norm=True), ["BOS", "a"])
    with pytest.raises(CircuitError, match="activation_function"):
        from_tracr(with_config(activation_function=jax.nn.gelu), ["BOS", "a"])

    def with_params(edit):
        params = {k: dict(v) for k, v in hist.params.items()}
        edit(params)
        return dataclasses.replace(hist, params=params)

    key = "transformer/layer_0/attn/query"

    def bias(p):
        p[key]["b"] = np.ones_like(p[key]["b"])

    with pytest.raises(CircuitError, match=f"nonzero bias '{key}'"):
        from_tracr(with_params(bias), ["BOS", "a"])
    with pytest.raises(CircuitError, match="'transformer/layer_norm'"):
        from_tracr(with_params(lambda p: p.update({"transformer/layer_norm": {"scale": np.ones(3)}})), ["BOS"])
    with pytest.raises(CircuitError, match="no 'transformer/layer_0/mlp/linear_1'"):
        from_tracr(with_params(lambda p: p.pop("transformer/layer_0/mlp/linear_1")), ["BOS"])


def test_mlp_biases_are_kept(frac):
    """tracr assembles zero biases; a model whose MLP biases were set still imports exactly."""
    params = {k: dict(v) for k, v in frac.params.items()}
    key = "transformer/layer_0/mlp/linear_1"
    params[key]["b"] = np.full_like(params[key]["b"], 0.25)
    model = dataclasses.replace(frac, params=params)
    inputs = ["BOS", "a", "b", "a"]
    np.testing.assert_allclose(circuits.evaluate(from_tracr(model, inputs))[:, 0],
                               np.asarray(_apply(model, inputs).unembedded)[0], atol=1e-5)


def test_squared_error_metric_checks_its_shape():
    from circuits import Array
    from circuits.importers.tracr_tasks import squared_error_to

    metric = squared_error_to(Array(np.zeros((3, 1), np.float32), name="clean"))
    out = Array(np.array([[1.0], [2.0], [2.0]], np.float32), name="out")
    assert float(circuits.evaluate(metric(out))) == pytest.approx(3.0)
    with pytest.raises(CircuitError, match="differ in shape"):
        metric(Array(np.zeros((2, 1), np.float32), name="out"))


def test_task_edge_sets_are_data():
    """The canonical edge sets, without compiling anything: the true circuit is inside ACDC's."""
    for name in ("reverse", "frac_prevs"):
        assert TRUE_EDGES[name] < ACDC_EDGES[name]
        for edge in ACDC_EDGES[name]:
            src, dst = edge.split(" -> ")
            assert src in ("embeds",) or src.startswith(("b", "h")), edge
    with pytest.raises(CircuitError, match="unknown task 'sort'"):
        tracr_task("sort")


def test_task_repr_names_sizes_not_weights(hist):
    """A task shown in a notebook cell is one line, not tracr's parameters."""
    task = TracrTask(name="hist", model=hist, vocab=frozenset({"a", "b"}), true_edges=TRUE_EDGES["reverse"],
                     acdc_edges=ACDC_EDGES["reverse"], clean=(("BOS", "a"),), corrupt=(("BOS", "b"),))
    assert repr(task) == ("<TracrTask 'hist', 1 layer, vocabulary {a, b}, 1 clean/corrupt examples, "
                          "2 true edges, 10 ACDC edges>")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["reverse", "frac_prevs"])
def test_acdc_tasks_match_tracr(name):
    task = tracr_task(name)
    assert isinstance(task, TracrTask)
    assert repr(task).startswith(f"<TracrTask {name!r}, ") and "\n" not in repr(task)
    assert len(task.clean) == len(task.corrupt) and all(a != b for a, b in zip(task.clean, task.corrupt))
    for inputs in list(task.clean[:3]) + [["BOS"], ["BOS", *sorted(task.vocab, key=str)[:1] * 5]]:
        check_against_tracr(task.model, list(inputs))
    if name == "reverse":
        assert sorted(task.clean) == sorted(task.corrupt)
        assert tracr_decode(task.model, circuits.evaluate(task.circuit(["BOS", 1, 2, 3]))) == ["BOS", 3, 2, 1]
        assert task.tokens(task.clean).shape == (6, 4)
        cfg = task.model.model_config
        assert (cfg.num_layers, cfg.num_heads) == (4, 1)
    else:
        assert task.tokens(task.clean).shape == (20, 5)
        assert task.model.model_config.num_layers == 2


@pytest.mark.slow
def test_task_compilation_is_kept_for_the_next_process(tmp_path):
    """tracr's compiler runs haiku's initialisation as many small XLA programs; ``tracr_task``
    switches the compilation cache on first, so they are written to it for the next process."""
    import subprocess
    import sys

    env = dict(os.environ, CIRCUITS_COMPILATION_CACHE=str(tmp_path))
    code = "from circuits.importers import tracr_task; tracr_task('frac_prevs')"
    subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True)
    entries = [p for p in tmp_path.iterdir() if p.name.startswith("jit_")]
    assert len(entries) >= 20, sorted(p.name for p in tmp_path.iterdir())


@pytest.mark.slow
@pytest.mark.parametrize("causal", [False, True])
def test_more_programs_match_tracr(causal):
    """Sorting (numerical MLPs feeding categorical attention), a sequence map of two SOps, and the
    causal (masked) models tracr compiles with ``causal=True``; several lengths each."""
    vocab = {1, 2, 3}
    programs = [lib.make_sort_unique(rasp.tokens, rasp.tokens),
                rasp.SequenceMap(lambda x, y: x * y, rasp.tokens, rasp.indices).named("times_index")]
    if causal:
        programs = [lib.make_frac_prevs(rasp.tokens == 2)]
    for program in programs:
        model = _compile(program, vocab, 5, causal=causal)
        assert model.model_config.causal == causal
        for inputs in (["BOS", 3], ["BOS", 2, 3, 1], ["BOS", 3, 1, 2, 2, 1] if causal else ["BOS", 3, 1, 2]):
            check_against_tracr(model, inputs)


# ---------------------------------------------------------------------------- issue 33 items 6 and 8
def test_a_config_claiming_a_billion_layers_is_refused_at_once(hist):
    """It took 169 s and then a raw MemoryError (names were built for every claimed layer)."""
    cfg = dataclasses.replace(hist.model_config, num_layers=10**9)
    with pytest.raises(CircuitError, match=r"num_layers=1000000000, but the params hold 1 layer\(s\) \(layer_0\)"):
        from_tracr(dataclasses.replace(hist, model_config=cfg), ["BOS", "a"])


@pytest.mark.parametrize("field, value, message", [
    ("causal", "no", "model_config.causal='no' must be True or False"),
    ("layer_norm", 0, "model_config.layer_norm=0 must be True or False"),
    ("num_heads", 1.5, "model_config.num_heads=1.5 must be an int >= 1"),
    ("key_size", 0, "model_config.key_size=0 must be an int >= 1"),
    ("mlp_hidden_size", True, "model_config.mlp_hidden_size=True must be an int >= 1"),
])
def test_config_fields_of_the_wrong_type_are_refused(hist, field, value, message):
    cfg = dataclasses.replace(hist.model_config, **{field: value})
    with pytest.raises(CircuitError, match=re.escape(message)):
        from_tracr(dataclasses.replace(hist, model_config=cfg), ["BOS", "a"])


def test_malformed_models_are_clear_errors(hist):
    with pytest.raises(CircuitError, match="model.model_config must be tracr's TransformerConfig, got None"):
        from_tracr(dataclasses.replace(hist, model_config=None), ["BOS", "a"])
    with pytest.raises(CircuitError, match="model.params must be haiku's parameters.*got a list"):
        from_tracr(dataclasses.replace(hist, params=list(hist.params.values())), ["BOS", "a"])
    with pytest.raises(CircuitError, match=r"model.params\['token_embed'\] must be a dict"):
        from_tracr(dataclasses.replace(hist, params={**hist.params, "token_embed": "abc"}), ["BOS", "a"])
    for bad in ("abc", np.array([["a", "b"]]), [[1.0], [1.0, 2.0]]):
        params = {**hist.params, "token_embed": {"embeddings": bad}}
        with pytest.raises(CircuitError, match=r"model.params\['token_embed'\]\['embeddings'\]"):
            from_tracr(dataclasses.replace(hist, params=params), ["BOS", "a"])


def test_a_model_without_input_encoder_takes_token_ids(hist):
    raw = dataclasses.replace(hist, input_encoder=None)
    ids = tracr_tokens(hist, ["BOS", "a", "b"]).tolist()
    np.testing.assert_array_equal(circuits.evaluate(from_tracr(raw, ids)),
                                  circuits.evaluate(from_tracr(hist, ["BOS", "a", "b"])))
    for bad in (["BOS", "a"], [0, 1.5], [0, True], [0, 2**70]):
        with pytest.raises(CircuitError, match="no input_encoder, so inputs are token ids"):
            from_tracr(raw, bad)
