"""Variants op by op with their changed nodes as rows of one kernel (``circuits.backend.variants``,
the tier a first sweep runs in): each variant's value equals its own whole-program evaluation,
work the variants share is done once, chunks, padding and groups change nothing."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import circuits as C
from circuits import Array
from circuits.backend import evaluate, variants
from circuits.backend.incremental import RunInfo
from circuits.backend.variants import run_variants
from circuits.testing import circuits_with_inputs


def _check(base, vs, inputs=None, *, rtol=2e-5, atol=2e-6, cache=False):
    info = RunInfo()
    base_value, values = run_variants(base, vs, inputs, "float32", cache=cache, info=info)
    np.testing.assert_allclose(np.asarray(base_value), evaluate(base, inputs, mode="jit"), rtol=rtol, atol=atol)
    for v, value in zip(vs, values):
        np.testing.assert_allclose(np.asarray(value), evaluate(v, inputs, mode="jit"), rtol=rtol, atol=atol,
                                   err_msg=v.to_text()[:2000], equal_nan=True)
    return info


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=circuits_with_inputs(max_nodes=12, max_depth=5), data=st.data())
def test_variants_equal_their_own_evaluation_on_generated_circuits(case, data):
    circuit, inputs = case
    nodes = [n for n in C.toposort(circuit) if n.dtype.startswith("float") and n is not circuit]
    if not nodes:
        return
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31)))
    vs = [circuit]
    for _ in range(data.draw(st.integers(1, 5))):
        picked = data.draw(st.sampled_from(nodes))
        new = Array(rng.uniform(0.5, 1.5, picked.shape).astype(np.float32))
        vs.append(C.traversal.replace(circuit, {picked: new}))
    vs.append(vs[-1])  # the same variant twice
    _check(circuit, vs, inputs, rtol=1e-4, atol=1e-5)


@pytest.fixture(scope="module")
def shipped():
    from circuits.models import attn_only, induction_weights

    w = induction_weights()
    toks = np.random.default_rng(1).integers(1, 64, 34)
    return attn_only(w, toks, unique_names=True)


def test_ablations_and_path_patches_of_the_shipped_model(shipped):
    from circuits.interp import ablate, path_patch

    corrupt = np.random.default_rng(2).integers(1, 64, 34)
    vs = [ablate(shipped, f"b{l}.a.head{h}") for l in range(2) for h in range(4)]
    vs += [path_patch(shipped, "b0.a.head2", f"b1.a.head{h}.a.{r}", {"toks_int_var": corrupt})
           for h in range(4) for r in "qkv"]
    info = _check(shipped, vs)
    alone = RunInfo()
    for v in vs:
        C.backend.incremental.run_ops([v], None, "float32", cache=False, info=alone)
    # the clean run, and the corrupted run the path patches share, are computed once
    assert info.computed < alone.computed / 4


def test_chunks_padding_and_groups_change_nothing(shipped, monkeypatch):
    """Few rows per kernel (chunks that mix rows of several children chunks with unchanged
    values, a short last chunk padded) and tiny groups of variants give the same values."""
    from circuits.interp import ablate

    vs = [ablate(shipped, f"b{l}.a.head{h}") for l in range(2) for h in range(4)][::-1]
    monkeypatch.setattr(variants, "ROWS", 4)
    _check(shipped, vs)
    monkeypatch.setattr(variants, "GROUP_BYTES", 1)
    monkeypatch.setattr(variants, "ROWS", 2)
    _check(shipped, vs)


def test_every_head_of_a_small_gpt2_patched():
    from circuits.interp import patch
    from circuits.models import gpt2
    from circuits.models.gpt2 import random_gpt2_weights

    cfg = dict(n_embd=16, n_head=4, n_layer=3, vocab_size=31, n_positions=16, activation_function="gelu_new")
    rng = np.random.default_rng(3)
    toks, corrupt = rng.integers(0, 31, 9), rng.integers(0, 31, 9)
    c = gpt2(cfg, random_gpt2_weights(cfg), toks, loss=True, split_heads=True)
    vs = [patch(c, f"h{l}.attn.head{h}", {"tokens": corrupt}) for l in range(3) for h in range(4)]
    info = _check(c, vs, rtol=1e-4, atol=1e-5)
    assert info.computed > 0


def test_variants_whose_value_is_cached_are_not_computed_again(shipped):
    from circuits.interp import ablate

    vs = [ablate(shipped, f"b1.a.head{h}") for h in range(4)]
    first = run_variants(shipped, vs, None, "float32")[1]
    info = RunInfo()
    again = run_variants(shipped, vs, None, "float32", info=info)[1]
    assert info.computed == 0
    for a, b in zip(first, again):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_bad_inputs_are_reported_before_anything_runs():
    x = C.Symbol((3,), name="x_variants")
    y = C.GeneralFunction("exp", x)
    with pytest.raises(C.EvaluationError, match="x_variants"):
        run_variants(y, [C.Add(y, y)], {"x_variants": np.zeros(4)}, "float32")
