"""Op by op, nodes of one operation over the same shapes run as rows of one kernel
(``circuits.backend.rows``): the values are those of the whole program and of a plain numpy
oracle, kept rows read back as arrays of their own, and the kernel calls are fewer."""

from __future__ import annotations

import numpy as np
import pytest

import circuits as C
from circuits import Add, Array, Einsum, GeneralFunction, Index, Symbol
from circuits.backend import clear_cache, rows, tiers, value_and_grad
from circuits.backend import incremental as inc
from circuits.backend.incremental import run_ops

RNG = np.random.default_rng(7)
W = RNG.normal(size=(4, 3, 5)).astype(np.float32)  # four heads' weights, stacked


def heads(x, w=None, name="w"):
    """Per head h: exp(x @ w[h]) summed with its own bias, then the heads added."""
    w = w if w is not None else Array(W, name=name)
    outs = []
    for h in range(4):
        pre = Einsum.from_spec("a,ab->b", x, Index(w, (h,)), name=f"h{h}.pre")
        act = GeneralFunction("exp", pre, name=f"h{h}.act")
        outs.append(Add(act, Array(np.full(5, h, np.float32), name=f"h{h}.bias"), name=f"h{h}"))
    return outs


def oracle(xv, w=W):
    return [np.exp(xv @ w[h]) + h for h in range(4)]


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    clear_cache()
    monkeypatch.setattr(tiers, "BACKGROUND", False)  # a new grouping's kernels made at once
    yield
    clear_cache()


class Calls:
    """Counts kernel calls by kind while installed (wraps the kernels already made)."""

    def __init__(self, monkeypatch):
        self.n = 0
        real = inc.cached_kernel

        def counted(key, make):
            fn = real(key, make)

            def call(*args):
                self.n += 1
                return fn(*args)

            return call

        monkeypatch.setattr(inc, "cached_kernel", counted)
        monkeypatch.setattr(rows, "cached_kernel", counted)
        inc._by_node.clear()


def test_heads_run_as_rows_and_equal_the_oracle_and_the_whole_program(monkeypatch):
    x = Symbol((3,), name="x")
    outs = heads(x)
    total = Add(*outs, name="total")
    xv = RNG.normal(size=3).astype(np.float32)
    calls = Calls(monkeypatch)
    got = run_ops([total, *outs], {"x": xv}, "float32", rows=True)
    want = oracle(xv)
    np.testing.assert_allclose(np.asarray(got[0]), sum(want), rtol=1e-6)
    for g, w in zip(got[1:], want):
        np.testing.assert_allclose(np.asarray(g), w, rtol=1e-6)
    # per head: the pick, then pre, act and the bias Add as rows (3 kernels for 4 heads), the
    # biases stacked once, the total one sum over the rows, the 4 outputs split once: far fewer
    # than the 4 * 4 + 1 kernels head by head
    assert calls.n <= 4 + 3 + 1 + 1 + 1
    np.testing.assert_allclose(C.evaluate(total, {"x": xv}, mode="jit"), sum(want), rtol=1e-6)


def test_a_variant_reading_kept_rows_in_another_order_or_partly_is_right():
    x = Symbol((3,), name="x")
    outs = heads(x)
    xv = RNG.normal(size=3).astype(np.float32)
    want = oracle(xv)
    run_ops([Add(*outs)], {"x": xv}, "float32", rows=True)
    # reversed, a subset, one head twice, and rows of the kept result fed to new rows
    cases = [
        (Add(*outs[::-1]), sum(want)),
        (Add(outs[1], outs[2]), want[1] + want[2]),
        (Add(outs[3], outs[3], outs[0]), 2 * want[3] + want[0]),
        (Add(*[GeneralFunction("sin", o) for o in outs[1:3]]), np.sin(want[1]) + np.sin(want[2])),
        (Add(*[GeneralFunction("sin", o) for o in outs[::-1]]), sum(np.sin(w) for w in want)),
    ]
    for circuit, expected in cases:
        np.testing.assert_allclose(C.evaluate(circuit, {"x": xv}, mode="eager"), expected, rtol=1e-5)


def test_rows_of_a_longer_result_are_sliced():
    x = Symbol((3,), name="x")
    w = Array(np.concatenate([W, W[::-1]]), name="w8")  # eight heads
    pre = [Einsum.from_spec("a,ab->b", x, Index(w, (h,))) for h in range(8)]
    # two groups of consumers, each reading 4 consecutive rows of the 8-row result
    first = [GeneralFunction("exp", p) for p in pre[:4]]
    second = [GeneralFunction("sin", p) for p in pre[4:]]
    xv = RNG.normal(size=3).astype(np.float32)
    got = run_ops([Add(*first), Add(*second)], {"x": xv}, "float32", rows=True)
    ws = np.concatenate([W, W[::-1]])
    np.testing.assert_allclose(np.asarray(got[0]), sum(np.exp(xv @ ws[h]) for h in range(4)), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(got[1]), sum(np.sin(xv @ ws[h]) for h in range(4, 8)), rtol=1e-5)


def test_gradients_over_kept_rows_match_the_whole_program():
    x = Symbol((3,), name="x")
    total = Add(*heads(x))
    loss = Einsum.from_spec("b->", GeneralFunction("sin", total))
    xv = RNG.normal(size=3).astype(np.float32)
    C.evaluate(loss, {"x": xv}, mode="eager")  # the clean values kept as rows
    v_ops, g_ops = value_and_grad(loss, x, {"x": xv}, mode="eager")
    clear_cache()
    v_jit, g_jit = value_and_grad(loss, x, {"x": xv}, mode="jit")
    np.testing.assert_allclose(v_ops, v_jit, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(g_ops), np.asarray(g_jit), rtol=1e-4, atol=1e-6)


def test_shipped_model_clean_and_ablations_op_by_op_equal_the_whole_program(monkeypatch):
    from circuits.interp import ablate
    from circuits.models import attn_only, induction_weights

    w = induction_weights()
    toks = np.random.default_rng(0).integers(1, 64, 34)
    c = attn_only(w, toks, unique_names=True)
    calls = Calls(monkeypatch)
    counts = {}
    for enabled in (False, True):
        monkeypatch.setattr(rows, "ENABLED", enabled)
        clear_cache()
        clean = C.evaluate(c, mode="eager")
        np.testing.assert_allclose(clean, C.evaluate(c, mode="jit", cache=False), rtol=1e-5, atol=1e-6)
        for site in ("b0.a.head1", "b0.a.head3", "b1.a.head2"):
            a = ablate(c, site)
            calls.n = 0
            value = C.evaluate(a, mode="eager")
            counts[enabled, site] = calls.n  # (the jit run below makes no kernel call)
            np.testing.assert_allclose(value, C.evaluate(a, mode="jit", cache=False), rtol=1e-5, atol=1e-6)
    # a layer-0 ablation recomputes layer 1's heads as rows (README: at most 34 kernel calls, against 57 one node at a time)
    assert counts[True, "b0.a.head1"] <= 34 and counts[False, "b0.a.head1"] >= 57, counts
    assert counts[True, "b0.a.head3"] <= 34, counts
    assert counts[True, "b1.a.head2"] <= counts[False, "b1.a.head2"], counts


def test_a_sum_of_kept_rows_leaves_out_an_infinite_row_exactly():
    # head 0 overflows to inf; zero-ablating it must give the finite sum of the others (0 * inf
    # would be NaN had the left-out row been weighted by zero)
    x = Symbol((3,), name="x")
    w = W.copy()
    w[0] = 1e3
    outs = heads(x, Array(w, name="w_big"))
    xv = np.ones(3, np.float32)
    run_ops([Add(*outs)], {"x": xv}, "float32", rows=True)
    zero = Array(np.zeros(5, np.float32), name="h0.zero")
    got = C.evaluate(Add(zero, *outs[1:]), {"x": xv}, mode="eager")
    want = sum(np.exp(xv @ w[h]) + h for h in range(1, 4))
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_nodes_differing_in_name_only_share_one_value():
    x = Symbol((3,), name="x")
    twins = [GeneralFunction("exp", x, name=f"twin{i}") for i in range(3)]
    got = run_ops([Add(*twins)], {"x": np.zeros(3, np.float32)}, "float32", rows=True)
    np.testing.assert_allclose(np.asarray(got[0]), 3.0)


def test_a_new_grouping_runs_node_by_node_while_its_kernel_is_made_aside(monkeypatch):
    monkeypatch.setattr(tiers, "BACKGROUND", True)
    x = Symbol((3,), name="x")
    outs = heads(x, name="w_aside")
    xv = RNG.normal(size=3).astype(np.float32)
    calls = Calls(monkeypatch)
    monkeypatch.setattr(rows, "ENABLED", False)
    run_ops([Add(*outs)], {"x": xv}, "float32", cache=False)
    alone = calls.n  # node by node
    monkeypatch.setattr(rows, "ENABLED", True)
    assert not rows.kernel_made(rows._rows_key(outs, "float32"))
    first = run_ops([Add(*outs)], {"x": xv}, "float32", rows=True, cache=False)
    tiers.wait_for_background()
    calls.n = 0
    second = run_ops([Add(*outs)], {"x": xv}, "float32", rows=True, cache=False)
    assert calls.n < alone  # the rows kernels were made in the background, and now run
    np.testing.assert_allclose(np.asarray(first[0]), sum(oracle(xv)), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(second[0]), np.asarray(first[0]), rtol=1e-6)


def test_kernels_made_aside_are_made_in_the_callers_precision(monkeypatch):
    import warnings

    monkeypatch.setattr(tiers, "BACKGROUND", True)
    x = Symbol((3,), name="x", dtype="float64")
    w = Array(W.astype(np.float64), name="w64")
    total = Add(*heads(x, w))
    xv = RNG.normal(size=3)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        first = C.evaluate(total, {"x": xv}, dtype="float64", mode="eager", cache=False)
        tiers.wait_for_background()  # the rows kernels, made in float64 (x64 is per thread)
        second = C.evaluate(total, {"x": xv}, dtype="float64", mode="eager", cache=False)
    assert not [w for w in seen if "truncated" in str(w.message)]
    want = sum(np.exp(xv @ W.astype(np.float64)[h]) + h for h in range(4))
    for got in (first, second):
        assert got.dtype == np.float64
        np.testing.assert_allclose(got, want, rtol=1e-12)
