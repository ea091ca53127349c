"""``interp.sweep``: every variant's value equals one-at-a-time evaluation and the numpy oracle
(float32 and float64, tokens as Arrays or as Symbols bound by ``inputs``), variants that differ
only in the values they read share one compiled program, and bad input is refused by name."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import circuits as C
from benchmarks.variants import head, path_patch_variants, zero_ablation_variants
from circuits.backend import cache_stats
from circuits.errors import CircuitError, EvaluationError
from circuits.interp import SweepResult
from circuits.interp import sweep as sweep_any_tier
from circuits.models import attn_only, random_weights
from circuits.testing import circuits_with_inputs
from circuits.traversal import replace

from .numpy_patching import path_patched_losses, zero_ablated_losses

N_HEADS, N_LAYERS, LENGTH, VOCAB = 3, 2, 10, 40
TOL = {"float32": dict(rtol=2e-4, atol=2e-5), "float64": dict(rtol=1e-9, atol=1e-10)}
# one-at-a-time evaluation in the same precision: equal up to the order of an Add's terms
SAME = {"float32": dict(rtol=2e-5, atol=2e-6), "float64": dict(rtol=1e-12, atol=1e-13)}


@pytest.fixture(scope="module")
def model():
    w = random_weights(3, vocab=VOCAB, d_model=12, n_heads=N_HEADS, head_size=4, n_layers=N_LAYERS,
                       max_positions=16)
    rng = np.random.default_rng(5)
    return w, rng.integers(0, VOCAB, LENGTH), rng.integers(0, VOCAB, LENGTH)


def circuits_for(w, toks, corrupted, symbols: bool):
    if not symbols:
        return attn_only(w, toks), attn_only(w, corrupted), None
    clean_sym = C.Symbol((LENGTH,), name="toks_int_var", dtype="int64")
    corr_sym = C.Symbol((LENGTH,), name="corrupted_toks", dtype="int64")
    return attn_only(w, clean_sym), attn_only(w, corr_sym), {"toks_int_var": toks, "corrupted_toks": corrupted}


# The grouping, chunking and compiling below are the whole-program tier's; 'auto' runs a first
# sweep op by op (test_op_by_op_sweeps_equal_the_compiled_ones).
def sweep(*args, **kwargs):
    return sweep_any_tier(*args, mode=kwargs.pop("mode", "jit"), **kwargs)


def compilations():
    return cache_stats()["compilations"]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("symbols", [False, True], ids=["arrays", "symbols"])
def test_zero_ablations_equal_the_oracle_and_evaluate_and_compile_once_per_layer(model, dtype, symbols):
    w, toks, corrupted = model
    clean, _, inputs = circuits_for(w, toks, corrupted, symbols)
    variants = zero_ablation_variants(clean, N_LAYERS, N_HEADS)
    before = compilations()
    result = sweep(clean, variants, inputs, dtype=dtype)
    # the common program, then one program per layer (which head is zero is an argument)
    assert result.info["programs"] == N_LAYERS
    assert compilations() - before <= 1 + N_LAYERS
    oracle = zero_ablated_losses(w, toks, N_LAYERS, N_HEADS)
    assert list(result) == list(variants)
    for name, value in result.items():
        assert value.dtype == np.dtype(dtype)
        np.testing.assert_allclose(value, oracle[name], **TOL[dtype], err_msg=name)
        np.testing.assert_allclose(value, C.evaluate(variants[name], inputs, dtype=dtype), **SAME[dtype])
    np.testing.assert_allclose(result.base, C.evaluate(clean, inputs, dtype=dtype), **SAME[dtype])


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("symbols", [False, True], ids=["arrays", "symbols"])
def test_exact_path_patching_equals_the_oracle_in_five_programs(model, dtype, symbols):
    w, toks, corrupted = model
    clean, corr, inputs = circuits_for(w, toks, corrupted, symbols)
    variants = path_patch_variants(clean, corr, N_HEADS)
    assert len(variants) == N_HEADS * N_HEADS * 3 + 2 * N_HEADS
    result = sweep(clean, variants, inputs, dtype=dtype, batch_size=4)
    # q, k, v receivers; layer-0 and layer-1 senders into the logits
    assert result.info["programs"] == 5
    oracle = path_patched_losses(w, toks, corrupted, N_HEADS)
    assert set(oracle) == set(result)
    for name, value in result.items():
        np.testing.assert_allclose(value, oracle[name], **TOL[dtype], err_msg=name)
    # one-at-a-time evaluation of one variant per program (each would compile on its own)
    for name in ["b0.a.head0->b1.a.head2.q", "b0.a.head2->b1.a.head1.k", "b0.a.head1->b1.a.head0.v",
                 "b0.a.head1->logits", "b1.a.head2->logits"]:
        np.testing.assert_allclose(result[name], C.evaluate(variants[name], inputs, dtype=dtype), **SAME[dtype])
    # a path patch changes the loss (the check above is not comparing a variant with the base)
    assert max(np.abs(v - result.base).max() for v in result.values()) > 1e-3


def test_chunks_are_padded_and_give_the_same_values(model):
    w, toks, corrupted = model
    clean = attn_only(w, toks)
    variants = zero_ablation_variants(clean, N_LAYERS, N_HEADS)
    whole = sweep(clean, variants)
    for batch_size in (1, 2):
        chunked = sweep(clean, variants, batch_size=batch_size)
        assert chunked.info["chunks"] == N_LAYERS * -(-N_HEADS // batch_size)
        for name in variants:
            np.testing.assert_allclose(chunked[name], whole[name], rtol=1e-6, atol=1e-7)


def test_big_variants_run_one_at_a_time_without_vmap(model, monkeypatch):
    import importlib

    sweep_module = importlib.import_module("circuits.interp.sweep")
    w, toks, _ = model
    clean = attn_only(w, toks)
    variants = zero_ablation_variants(clean, N_LAYERS, N_HEADS)
    assert sweep(clean, variants).info["chunks"] == N_LAYERS  # small model: one vmapped chunk per layer
    monkeypatch.setattr(sweep_module, "LOOP_FROM_BYTES", 1)
    looped = sweep(clean, variants)
    assert looped.info["chunks"] == N_LAYERS * N_HEADS
    assert looped.info["optimized"] == 0  # groups of N_HEADS < OPTIMIZE_FROM variants: not worth a rewrite
    monkeypatch.setattr(sweep_module, "OPTIMIZE_FROM", N_HEADS)
    optimized = sweep(clean, variants)
    assert optimized.info["optimized"] == optimized.info["programs"] == N_LAYERS  # 'auto' rewrites big groups
    for name in variants:
        np.testing.assert_allclose(optimized[name], looped[name], rtol=1e-5, atol=1e-6)
    for name, v in variants.items():
        np.testing.assert_allclose(looped[name], C.evaluate(v), rtol=1e-5, atol=1e-6)


def test_variants_that_are_common_nodes_come_from_the_common_program():
    x = C.Symbol((3,), name="x")
    y = C.GeneralFunction("exp", x, name="y")
    twice = C.Add(y, y, name="twice")
    r = sweep(twice, {"base": twice, "inner": y, "leaf": C.Scalar(2.0, (3,)), "same_a": C.Add(twice, y),
                      "same_b": C.Add(twice, y)}, {"x": np.array([0.0, 1.0, 2.0])})
    e = np.exp([0.0, 1.0, 2.0])
    np.testing.assert_allclose(r["base"], 2 * e, rtol=1e-6)
    np.testing.assert_allclose(r["inner"], e, rtol=1e-6)
    np.testing.assert_array_equal(r["leaf"], [2.0, 2.0, 2.0])
    np.testing.assert_allclose(r["same_a"], 3 * e, rtol=1e-6)
    np.testing.assert_array_equal(r["same_a"], r["same_b"])
    assert r.info["programs"] == 0


def test_constants_in_a_variant_are_arguments():
    """Variants that differ only in an Array's or a Scalar's value run as one program."""
    x = C.Array(np.arange(6, dtype=np.float32).reshape(2, 3), name="x")
    base = C.GeneralFunction("tanh", C.Einsum.from_spec("ab,->ab", x, C.Scalar(0.5)), name="out")
    scales = [0.1, -2.0, 3.5]
    shifts = [np.full((2, 3), k, np.float32) for k in (1.0, -1.0)]
    variants = {f"s{s}": C.GeneralFunction("tanh", C.Einsum.from_spec("ab,->ab", x, C.Scalar(s))) for s in scales}
    variants.update({f"a{i}": C.GeneralFunction("tanh", C.Add(x, C.Array(v))) for i, v in enumerate(shifts)})
    r = sweep(base, variants)
    assert r.info["programs"] == 2
    for s in scales:
        np.testing.assert_allclose(r[f"s{s}"], np.tanh(x.value * s), rtol=1e-6)
    for i, v in enumerate(shifts):
        np.testing.assert_allclose(r[f"a{i}"], np.tanh(x.value + v), rtol=1e-6)


def test_result_table_effects_and_notebook_view(model):
    w, toks, _ = model
    clean = attn_only(w, toks)
    variants = zero_ablation_variants(clean, 1, N_HEADS)
    r = sweep(clean, variants)
    assert isinstance(r, SweepResult) and len(r) == N_HEADS
    means = r.reduce()
    for name in variants:
        assert means[name] == pytest.approx(float(np.mean(r[name])))
        assert r.effects()[name] == pytest.approx(float(np.mean(r[name]) - np.mean(r.base)))
    assert r.stack().shape == (N_HEADS, LENGTH - 2)
    table = r.table(sort=True, limit=2)
    lines = table.splitlines()
    assert lines[0].split()[:2] == ["variant", "mean"] and lines[1].startswith("(base)")
    biggest = max(r.effects(), key=lambda k: abs(r.effects()[k]))
    assert lines[2].startswith(biggest) and lines[-1] == f"... {N_HEADS - 2} more"
    html = sweep(clean, {"<b>": variants["b0.a.head0"]})._repr_html_()
    assert "<td>&lt;b&gt;</td>" in html and "<td><b></td>" not in html


def test_progress_bar(model, capsys, monkeypatch):
    pytest.importorskip("tqdm")
    w, toks, _ = model
    clean = attn_only(w, toks)
    variants = zero_ablation_variants(clean, 1, N_HEADS)
    sweep(clean, variants, progress=True)
    assert f"{N_HEADS}/{N_HEADS}" in capsys.readouterr().err
    sweep(clean, variants)  # few variants: no bar by default
    assert capsys.readouterr().err == ""
    monkeypatch.setitem(__import__("sys").modules, "tqdm.auto", None)
    with pytest.raises(CircuitError, match="needs tqdm"):
        sweep(clean, variants, progress=True)


def test_bad_input_is_refused_by_name(model):
    w, toks, _ = model
    clean = attn_only(w, toks)
    with pytest.raises(CircuitError, match="variant 'bad' is a ndarray"):
        sweep(clean, {"ok": clean, "bad": np.zeros(3)})
    with pytest.raises(CircuitError, match="variants must be a dict"):
        sweep(clean, [clean])
    with pytest.raises(CircuitError, match="base circuit"):
        sweep("t.loss", {"a": clean})
    with pytest.raises(CircuitError, match="batch_size=0"):
        sweep(clean, {"a": clean}, batch_size=0)
    with pytest.raises(CircuitError, match="optimize='yes'"):
        sweep(clean, {"a": clean}, optimize="yes")
    extra = C.Symbol(clean.shape, name="offset")
    with pytest.raises(EvaluationError, match="unbound Symbol.*offset"):
        sweep(clean, {"shifted": C.Add(clean, extra)})
    with pytest.raises(EvaluationError, match="offset.*has shape"):
        sweep(clean, {"shifted": C.Add(clean, extra)}, {"offset": np.zeros(3)})
    h = head(clean, 0, 0)
    empty = C.Array.placeholder(h.shape, "ab" * 32, name="missing")
    with pytest.raises(EvaluationError, match="placeholder Array.*missing"):
        sweep(clean, {"p": replace(clean, {h: empty})})


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=circuits_with_inputs(max_nodes=12), data=st.data())
def test_generated_circuits_sweep_equals_one_at_a_time(case, data):
    """Variants of generated DAGs (with sharing and Symbol inputs): a node scaled by a Scalar
    (variants that differ only in that constant), or replaced by a constant Array."""
    circuit, inputs = case
    inner = [n for n in C.toposort(circuit) if n.children and n.dtype.startswith("float")]
    if not inner:
        return
    picks = data.draw(st.lists(st.sampled_from(inner), min_size=1, max_size=3, unique_by=lambda n: n.hash))
    variants = {}
    for i, node in enumerate(picks):
        for c in (1.0, 0.999):
            variants[f"scale{i}_{c}"] = replace(circuit, {node: C.Einsum.from_spec(
                f"{'abcdefgh'[:node.ndim]},->{'abcdefgh'[:node.ndim]}", node, C.Scalar(c))})
        fixed = C.evaluate(node, inputs, dtype="float64")
        variants[f"const{i}"] = replace(circuit, {node: C.Array(np.asarray(fixed, np.float64).astype(node.dtype))})
    result = sweep(circuit, variants, inputs, dtype="float64")
    for name, v in variants.items():
        np.testing.assert_allclose(result[name], C.evaluate(v, inputs, dtype="float64"),
                                   rtol=1e-9, atol=1e-9, equal_nan=True, err_msg=name)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_optimized_groups_equal_the_oracle(model, dtype):
    w, toks, corrupted = model
    clean, corr, inputs = circuits_for(w, toks, corrupted, symbols=True)
    variants = path_patch_variants(clean, corr, N_HEADS)
    variants.update(zero_ablation_variants(clean, N_LAYERS, N_HEADS))
    variants["lone"] = C.Add(clean, C.Scalar(1.0))
    result = sweep(clean, variants, inputs, dtype=dtype, optimize=True)
    assert result.info["programs"] == 5 + N_LAYERS + 1
    oracle = path_patched_losses(w, toks, corrupted, N_HEADS)
    oracle.update(zero_ablated_losses(w, toks, N_LAYERS, N_HEADS))
    for name, value in oracle.items():
        np.testing.assert_allclose(result[name], value, **TOL[dtype], err_msg=name)
    np.testing.assert_allclose(result["lone"], result.base + 1, **SAME[dtype])


@pytest.mark.unpinned
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_op_by_op_sweeps_equal_the_compiled_ones_and_compile_nothing_whole(model, dtype):
    w, toks, corrupted = model
    clean, corrupt, inputs = circuits_for(w, toks, corrupted, True)
    variants = {**zero_ablation_variants(clean, N_LAYERS, N_HEADS),
                **path_patch_variants(clean, corrupt, N_HEADS)}
    before = compilations()
    ops = sweep(clean, variants, inputs, dtype=dtype, mode="ops")
    assert compilations() == before and ops.info["tier"] == "ops"
    jit = sweep(clean, variants, inputs, dtype=dtype, mode="jit")
    assert jit.info["tier"] == "jit"
    for name in variants:
        np.testing.assert_allclose(ops[name], jit[name], **SAME[dtype])
    np.testing.assert_allclose(ops.base, jit.base, **SAME[dtype])
    # 'auto' takes the compiled programs once every group has one
    assert sweep(clean, variants, inputs, dtype=dtype, mode="auto").info["tier"] == "jit"


def test_an_op_by_op_sweep_checks_token_ranges(model):
    w, toks, corrupted = model
    clean = attn_only(w, C.Symbol((LENGTH,), name="toks_int_var", dtype="int64"))
    variants = zero_ablation_variants(clean, N_LAYERS, N_HEADS)
    bad = toks.copy()
    bad[3] = VOCAB + 5
    with pytest.raises(EvaluationError, match="outside"):
        sweep(clean, variants, {"toks_int_var": bad}, mode="ops")


def test_a_sweep_over_a_dataset_gives_values_batch_axis_first(model):
    w, toks, corrupted = model
    sym = C.Symbol((LENGTH,), name="toks_int_var", dtype="int64")
    clean = attn_only(w, sym)
    variants = zero_ablation_variants(clean, N_LAYERS, N_HEADS)
    batch = np.stack([toks, corrupted, toks[::-1]])
    result = sweep_any_tier(clean, variants, {sym: batch})
    for name, v in list(variants.items())[:2]:
        assert result[name].shape == (3, *clean.shape)
        for i in range(3):
            np.testing.assert_allclose(result[name][i], C.evaluate(v, {sym: batch[i]}), rtol=2e-5, atol=2e-6)
    assert result.base.shape == (3, *clean.shape)


@pytest.mark.unpinned  # its evaluate is the default tier: the error names the gather that tier meets first
@pytest.mark.parametrize("mode", ["jit", "ops"])
def test_a_variant_patched_from_tokens_outside_the_vocabulary_is_refused_as_evaluate_refuses_it(model, mode):
    # Regression (issue 23 item 7): the compiled sweep bound a variant's own leaves with its own copy
    # of the argument binding and skipped the index-range check, so such a variant gave NaN.
    w, toks, _ = model
    clean = attn_only(w, toks)
    tokens = clean.get_unique("toks_int_var")
    bad = toks.copy()
    bad[3] = VOCAB + 5
    as_array = replace(clean, {tokens: C.Array(bad.astype(tokens.dtype), name=tokens.name)})
    sym = C.Symbol(tokens.shape, name="bad_toks", dtype=tokens.dtype)
    as_symbol = replace(clean, {tokens: sym})
    for variant, inputs in ((as_array, None), (as_symbol, {"bad_toks": bad})):
        with pytest.raises(EvaluationError, match=f"holds index {VOCAB + 5}, outside \\[0, {VOCAB}\\)") as evaluated:
            C.evaluate(variant, inputs)
        with pytest.raises(EvaluationError, match=f"holds index {VOCAB + 5}, outside \\[0, {VOCAB}\\)") as swept:
            sweep(clean, {"ok": clean, "bad": variant}, inputs, mode=mode)
        assert str(evaluated.value).splitlines()[1:] == str(swept.value).splitlines()[1:]
