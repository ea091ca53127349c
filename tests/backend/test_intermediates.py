"""Values of intermediate nodes: ``also=`` in the same pass as the output, and the ``Eager`` view
for interactive exploration (the op-by-op tier over the value cache)."""

from __future__ import annotations

import numpy as np
import pytest

from circuits import (
    Add,
    Array,
    Einsum,
    EvaluationError,
    GeneralFunction,
    Scalar,
    SelectionError,
    Symbol,
    compile,
    evaluate,
)
from circuits.backend import Eager, cache_stats, clear_cache

rng = np.random.default_rng(0)
XV = rng.standard_normal((2, 3)).astype(np.float32)
X = Symbol((2, 3), name="x")
W = Array(rng.standard_normal((3, 4)).astype(np.float32), name="w")
PRE = Einsum.from_spec("ab,bc->ac", X, W, name="pre")
ACT = GeneralFunction("relu", PRE, name="act")
OUT = Add(ACT, Scalar(1.0), name="out")


def numpy_values():
    pre = XV @ W.numpy()
    act = np.maximum(pre, 0)
    return pre, act, act + 1


def test_also_returns_intermediates_from_one_pass():
    pre, act, out = numpy_values()
    before = cache_stats()["compilations"]
    value, extra = evaluate(OUT, {"x": XV}, also=[PRE, "act", X])
    assert cache_stats()["compilations"] - before <= 1
    assert set(extra) == {PRE, "act", X}
    np.testing.assert_allclose(value, out, rtol=1e-6)
    np.testing.assert_allclose(extra[PRE], pre, rtol=1e-6)
    np.testing.assert_allclose(extra["act"], act, rtol=1e-6)
    np.testing.assert_array_equal(extra[X], XV)


@pytest.mark.parametrize("mode", ["jit", "ops"])
def test_also_single_name_and_modes(mode):
    _, act, out = numpy_values()
    value, extra = evaluate(OUT, {"x": XV}, also="act", mode=mode)
    np.testing.assert_allclose(value, out, rtol=1e-6)
    np.testing.assert_allclose(extra["act"], act, rtol=1e-6)
    # the root itself can be asked for too
    value, extra = evaluate(OUT, {"x": XV}, also=[OUT], mode=mode)
    np.testing.assert_array_equal(extra[OUT], value)


def test_compiled_with_also():
    pre, _, out = numpy_values()
    f = compile(OUT, also=["pre"])
    value, extra = f({"x": XV})
    np.testing.assert_allclose(value, out, rtol=1e-6)
    np.testing.assert_allclose(extra["pre"], pre, rtol=1e-6)


def test_also_errors_name_the_problem():
    twin_a = GeneralFunction("exp", X, name="twin")
    twin_b = GeneralFunction("sin", X, name="twin")
    c = Add(twin_a, twin_b, name="sum")
    with pytest.raises(SelectionError, match=r"'twin' is ambiguous, 2 distinct nodes"):
        evaluate(c, {"x": XV}, also=["twin"])
    with pytest.raises(SelectionError, match=r"no node named 'twni'.*did you mean 'twin'"):
        evaluate(c, {"x": XV}, also=["twni"])
    with pytest.raises(SelectionError, match="is not a node of this circuit"):
        evaluate(c, {"x": XV}, also=[PRE])
    # by node, an ambiguous name is no problem
    _, extra = evaluate(c, {"x": XV}, also=[twin_b])
    np.testing.assert_allclose(extra[twin_b], np.sin(XV), rtol=1e-6)


def test_eager_values_match_and_are_read_from_the_value_cache():
    pre, act, out = numpy_values()
    clear_cache("values")
    ev = Eager(OUT, {"x": XV})
    np.testing.assert_allclose(ev(OUT), out, rtol=1e-6)
    computed = ev.cache_info()["misses"]
    assert computed == 3  # pre, act, out: each once (the leaves are arguments, not computed)
    np.testing.assert_allclose(ev("act"), act, rtol=1e-6)
    np.testing.assert_allclose(ev(PRE), pre, rtol=1e-6)
    info = ev.cache_info()
    assert info["misses"] == computed and info["hits"] == 2
    # a new node over cached ones computes only itself
    doubled = Add(ACT, ACT)
    np.testing.assert_allclose(ev(doubled), 2 * act, rtol=1e-6)
    assert ev.cache_info()["misses"] == computed + 1
    # the same values as evaluate's op-by-op tier, which reads the same cache
    other = Eager(OUT, {"x": XV})
    other(ACT)
    assert (other.cache_info()["hits"], other.cache_info()["misses"]) == (1, 0)
    ev.clear()
    assert ev.cache_info()["entries"] == 0 and ev.cache_info()["bytes"] == 0


def test_eager_runs_what_evaluate_runs_op_by_op():
    """The view is the op-by-op tier: the same bits as ``evaluate(..., mode='ops')``, computed
    afresh each time (the value cache cleared in between)."""
    clear_cache("values")
    by_view = Eager(OUT, {"x": XV}).values([OUT, "pre"])
    clear_cache("values")
    value, extra = evaluate(OUT, {"x": XV}, also=["pre"], mode="ops")
    np.testing.assert_array_equal(by_view[0], value)
    np.testing.assert_array_equal(by_view[1], extra["pre"])


def test_eager_cache_bounds_are_gone_with_a_warning():
    with pytest.warns(DeprecationWarning, match="set_cache_size"):
        few = Eager(OUT, {"x": XV}, max_entries=2)
    np.testing.assert_allclose(few("pre"), numpy_values()[0], rtol=1e-6)


def test_eager_float64_and_its_errors():
    ev = Eager(OUT, {"x": XV.astype(np.float64)}, dtype="float64")
    assert ev(OUT).dtype == np.float64
    np.testing.assert_allclose(ev(OUT), np.maximum(XV.astype(np.float64) @ W.numpy().astype(np.float64), 0) + 1,
                               rtol=1e-12)
    with pytest.raises(EvaluationError, match="without a circuit"):
        Eager()("act")
    unbound = Eager(OUT)
    with pytest.raises(EvaluationError, match="unbound Symbol 'x'"):
        unbound(OUT)
    assert unbound.cache_info()["misses"] == 0  # nothing ran before the check failed
