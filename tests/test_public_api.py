"""The public API: every promised name exists, with the promised call shapes (DESIGN.md §13)."""

import inspect

import numpy as np
import pytest

import circuits as C
import rewrites

PUBLIC = {
    "Add", "Array", "Circuit", "CircuitError", "Compiled", "Concat", "Eager", "Einsum",
    "EvaluationError", "FunctionSpec", "GeneralFunction", "Index", "ParseError", "Rearrange",
    "RewriteError", "RewriteLoopError", "Scalar", "SelectionError", "ShapeError", "StoreError",
    "Symbol", "Tag", "TensorStore", "backend", "bind", "cache_stats", "clear_cache", "set_cache_size", "compile", "cost", "count_nodes", "deep_map",
    "evaluate", "evaluate_batched", "fill_random", "grad", "importers", "interp", "diff", "save_many", "load_many",
    "load", "models", "parse", "parse_many", "print_many", "profile", "register_elementwise",
    "register_function", "replace", "save", "select", "strip_names", "summary", "symbolic_equal", "testing",
    "toposort", "unregister_function", "value_and_grad",
    # rust_circuit's node types and expansion
    "Module", "ModuleSpec", "ModuleArgSpec", "Scatter", "SetSymbolicShape", "DiscreteVar",
    "expand", "Expander", "substitute_all_modules", "sample", "symbolic_size",
}
# Selection is spelled c.get / c.get_unique / c.update / c.paths, or the same functions in
# circuits.select: there are no top-level aliases.  filter_nodes is c.get(predicate).
# One name each: rust_circuit's text diff is C.diff(old, new).rust_text() (no C.diff_circuits),
# the collapsed view of a circuit is C.summary (no circuits.models.describe).


def test_public_names_are_exactly_these():
    # A new public name is a decision: add it here as well.
    assert set(C.__all__) == PUBLIC
    for name in C.__all__:
        assert getattr(C, name) is not None
    with pytest.raises(AttributeError):
        C.no_such_name  # noqa: B018


def test_promised_call_shapes():
    x = C.Array(np.ones((2, 3), np.float32), name="x")
    assert C.Scalar(2.0, (3,), name="s").shape == (3,)
    t = C.Symbol((3,), name="t", dtype="int64")
    e = C.Einsum.from_spec("ab,b->a", x, C.Scalar(1.0, (3,)), name="e")
    a = C.Add(e, C.Scalar(1.0), name="a")
    g = C.GeneralFunction("softmax", x, name="g")
    i = C.Index(x, (0,), name="i")
    for node in (x, t, e, a, g, i):
        assert {"name", "children", "shape", "dtype"} <= set(dir(node))
    # The text alone parses to placeholders; binding the true values gives the circuit itself.
    assert C.bind(C.parse(a.to_text()), {"x": x.value}) == a
    assert [C.bind(p, {"x": x.value}) for p in C.parse_many(a.to_text())] == [a]
    np.testing.assert_allclose(C.evaluate(a), [4.0, 4.0])
    np.testing.assert_allclose(C.compile(a)(), [4.0, 4.0])
    bound = C.bind(C.Array.placeholder((2,), "ab", name="p"), {"p": np.ones(2, np.float32)})
    assert not bound.is_placeholder
    assert not C.fill_random(C.Array.placeholder((2,), "ab", name="p"), seed=0).is_placeholder
    for fn, params in [(C.parse, ["text", "store"]), (C.evaluate, ["circuit", "inputs"]),
                       (C.save, ["circuit", "path"]), (C.load, ["path"]),
                       (C.fill_random, ["circuit", "seed"]), (C.bind, ["circuit"]),
                       (C.models.attn_only, ["weights", "tokens"]),
                       (C.models.from_huggingface, ["model", "tokens"]),
                       (C.models.gpt2, ["config", "weights", "tokens"]),
                       (C.models.opt, ["config", "weights", "tokens"]),
                       (C.models.llama, ["config", "weights", "tokens"]),
                       *((getattr(C.models, f), ["config", "weights", "tokens"]) for f in (
                           "gptj", "gpt_neo", "gemma", "qwen3", "phi3", "mixtral", "stablelm", "falcon", "bloom")),
                       (C.summary, ["circuit"]),
                       (C.importers.from_torch, ["module", "example_inputs"]),
                       (C.interp.sweep, ["circuit", "variants", "inputs"]),
                       (rewrites.simp, ["circuit"]), (rewrites.optimize, ["circuit"]),
                       (rewrites.batch_heads, ["circuit"])]:
        assert list(inspect.signature(fn).parameters)[: len(params)] == params, fn
    for fn in (C.compile, C.evaluate_batched):  # sharding (circuits.backend.lower.sharding), per-head batching
        assert {"mesh", "shard", "batch_heads"} <= set(inspect.signature(fn).parameters), fn
    assert "batch_heads" in inspect.signature(C.evaluate).parameters


def test_one_name_each():
    assert not hasattr(C.models, "describe") and "describe" not in C.models.__all__  # C.summary
    assert not hasattr(C, "diff_circuits")  # C.diff(old, new).rust_text()


def test_interp_names():
    assert set(C.interp.__all__) == {
        "ablate", "attribute", "expand_residual", "layer_norm_parts", "patch", "path_patch", "residual_terms",
        "split_heads", "sweep", "SweepResult", "scrub", "ScrubResult", "Claim", "Feature", "EXACT", "RANDOM",
        "split_heads", "SAE", "load_sae", "save_sae", "splice", "feature_site", "train_sae", "attribution_graph",
        "AttributionGraph", "induction_saes", "induction_hypothesis", "head_scores", "attention_patterns",
        "edges", "Edges", "patch_edges", "discover", "Discovery", "FoundCircuit", "faithfulness", "Faithfulness",
        # everyday analysis (DESIGN §13)
        "run_with_cache", "ActivationCache", "logit_lens", "logit_attribution", "steer", "steering_vector",
        "patch_grid", "residual_patch_grid", "head_patch_grid",
    }
    for name in C.interp.__all__:
        fn = getattr(C.interp, name)
        assert fn.__doc__ and ">>>" in (fn.__doc__ + (__import__(fn.__module__, fromlist=["x"]).__doc__ or ""))
    assert list(inspect.signature(C.interp.ablate).parameters)[:3] == ["circuit", "sites", "kind"]
    # DESIGN §13: positions= by keyword after the promised positional parameters
    for fn, first in ((C.interp.patch, ["circuit", "sites", "source"]), (C.interp.ablate, ["circuit", "sites", "kind"]),
                      (C.interp.steer, ["circuit", "site", "vector"]), (C.interp.run_with_cache, ["circuit", "inputs", "names"]),
                      (C.interp.logit_lens, ["circuit", "inputs"]), (C.interp.logit_attribution, ["circuit", "direction", "inputs"])):
        params = inspect.signature(fn).parameters
        assert list(params)[:len(first)] == first, fn
        assert all(params[k].kind is inspect.Parameter.KEYWORD_ONLY for k in list(params)[len(first):]), fn
    assert "positions" in inspect.signature(C.interp.patch).parameters
    assert inspect.signature(C.interp.logit_lens).parameters["layer_norm"].default == "freeze"
    assert list(inspect.signature(C.interp.path_patch).parameters)[:4] == ["circuit", "sender", "receivers", "source"]
    assert "unique_names" in inspect.signature(C.models.attn_only).parameters
    assert list(inspect.signature(C.interp.splice).parameters)[:3] == ["circuit", "site", "sae"]
    assert list(inspect.signature(C.interp.train_sae).parameters)[:3] == ["circuit", "site", "data"]
    assert list(inspect.signature(C.interp.load_sae).parameters) == ["path"]
    assert list(inspect.signature(C.interp.patch_edges).parameters)[:3] == ["circuit", "edges", "source"]
    assert list(inspect.signature(C.interp.discover).parameters)[:3] == ["circuit", "source", "metric"]
    assert list(inspect.signature(C.interp.save_sae).parameters) == ["sae", "path"]


def test_circuit_selection_methods():
    x = C.Array(np.ones(2, np.float32), name="x")
    c = C.Add(C.GeneralFunction("exp", x, name="e"), x, name="y")
    assert c.get("x") == [x] and c.get_unique("e").name == "e"
    assert [n.name for n in c.paths("x")[0]] == ["y", "e", "x"]
    z = c.update("x", lambda n: C.Array(np.zeros(2, np.float32), name="x"))
    np.testing.assert_allclose(C.evaluate(z), [1.0, 1.0])


def test_the_backend_and_its_cache_controls_are_attributes_in_a_fresh_process():
    """``C.backend`` (the README's ``C.backend.last_run()``, ``C.backend.tiers.pinned``) and the
    cache controls beside ``C.cache_stats`` need no import of their own."""
    import subprocess
    import sys

    script = ("import circuits as C\n"
              "assert C.backend.last_run()['tier'] is None\n"
              "assert callable(C.backend.tiers.pinned) and C.clear_cache is C.backend.clear_cache\n"
              "assert C.set_cache_size is C.backend.set_cache_size and 'max_size' in C.cache_stats()\n"
              "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.stdout.strip() == "ok", out.stderr


def test_backend_door_names():
    # circuits.backend is the backend's one door for the layers above it (tests/test_layers.py):
    # what it exports is a decision too
    import circuits.backend as backend

    assert set(backend.__all__) == {
        "evaluate", "compile", "Compiled", "make_jaxpr", "evaluate_batched", "Eager", "grad", "value_and_grad",
        "cache_stats", "clear_cache", "set_cache_size", "Program", "JIT_MAX_OPS", "last_run", "symbolic_equal",
        "symbolic_evaluate", "SymbolTable",
        "Lowered", "float_dtype", "precision", "run_variants", "variants_over_batch", "RunInfo", "has_batch_axis", "einsum_steps",
        "value_bytes", "einsum_temp_bytes", "live_bytes", "batch_heads", "gathered_minus_logsumexp", "check_mode",
        "values_and_grads_ops", "op_tier", "record", "steps_as", "ensure_persistent_cache", "compile_seconds",
    }
    for name in backend.__all__:
        assert getattr(backend, name) is not None
