"""A first run without XLA (issue 35, item 2): in ``mode='auto'`` a node whose JAX kernel is not
made yet is computed with numpy (``circuits.backend.tiers.host``), its kernel made in the
background; ``mode='numpy'`` pins numpy.  Against the whole-program tier on drawn circuits, one
prompt and over a batch; a fresh process with an empty compilation cache makes no XLA compilation
on its calling thread for the shipped model's first clean run and answers as a warm one does; a
function registered with JAX alone still runs through its kernel."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import circuits as C
from circuits import Add, GeneralFunction, Index, Symbol
from circuits.backend import evaluate, evaluate_batched, last_run, tiers
from circuits.backend.tiers.host import host_op, wait_for_kernels
from circuits.testing import circuits_with_inputs

from .test_batched_ops import batched_cases

FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _close(a, b, dtype):
    tol = dict(rtol=2e-4, atol=2e-5) if dtype == "float32" else dict(rtol=1e-9, atol=1e-11)
    assert np.shape(a) == np.shape(b)
    np.testing.assert_allclose(a, b, **tol, equal_nan=True)


def _has_numpy_path(circuit, fdt) -> bool:
    return any(n.children and host_op(n, fdt, None) is not None for n in C.toposort(circuit))


@FAST
@given(case=circuits_with_inputs(max_nodes=12, max_depth=5), dtype=st.sampled_from(["float32", "float64"]))
def test_numpy_agrees_with_the_whole_program_on_one_prompt(case, dtype):
    circuit, inputs = case
    whole = evaluate(circuit, inputs, mode="jit", dtype=dtype)
    got = evaluate(circuit, inputs, mode="numpy", dtype=dtype, cache=False)
    assert got.dtype == whole.dtype
    _close(got, whole, dtype)
    if _has_numpy_path(circuit, dtype):
        assert last_run()["numpy"] > 0 and last_run()["tier"] == "numpy"


@FAST
@given(case=batched_cases(), dtype=st.sampled_from(["float32", "float64"]))
def test_numpy_agrees_with_the_whole_program_over_a_batch(case, dtype):
    circuit, feed, _ = case
    whole = evaluate_batched(circuit, feed, mode="jit", dtype=dtype)
    got = evaluate_batched(circuit, feed, mode="numpy", dtype=dtype, cache=False)
    assert got.dtype == whole.dtype
    _close(got, whole, dtype)
    _close(evaluate_batched(circuit, feed, mode="numpy", dtype=dtype, batch_size=1, cache=False), whole, dtype)


@FAST
@given(case=batched_cases())
def test_auto_computes_first_with_numpy_and_later_kernels_read_its_values(case):
    circuit, feed, _ = case
    whole = evaluate_batched(circuit, feed, mode="jit")
    with tiers.configure(cold_start=False, jit_after=100):
        first = evaluate_batched(circuit, feed)
        _close(first, whole, "float32")
        wait_for_kernels()  # the kernels numpy stood in for are made now
        # a new circuit over the values numpy computed (kept in the value cache): JAX's kernels
        doubled = evaluate_batched(Add(circuit, circuit), feed)
        _close(doubled, 2 * whole, "float32")


def test_a_function_registered_with_jax_alone_runs_through_its_kernel():
    import jax.numpy as jnp

    C.register_function("cumsum_jax_only_test", lambda shapes: shapes[0], lambda x: jnp.cumsum(x, axis=-1),
                        core_ndim=1, replace=True)
    try:
        x = Symbol((3, 5), name="x_jax_only")
        y = Add(GeneralFunction("cumsum_jax_only_test", GeneralFunction("exp", x)), x)
        data = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32)
        with tiers.configure(cold_start=False):
            got = evaluate(y, {x: data})
        run = last_run()
        assert run["numpy"] == 2  # exp and the sum; the cumsum is JAX's
        assert run["computed"] == 3
        _close(got, np.cumsum(np.exp(data), axis=-1) + data, "float32")
        _close(evaluate(y, {x: data}, mode="numpy", cache=False), got, "float32")
        assert last_run()["numpy"] == 2
        rows = np.stack([data, data + 1])
        _close(evaluate(y, {x: rows}), np.cumsum(np.exp(rows), axis=-1) + rows, "float32")
    finally:
        C.unregister_function("cumsum_jax_only_test")


def test_writing_into_the_input_afterwards_changes_nothing_kept():
    x = Symbol((4,), name="x_alias_numpy")
    y = Index(x, slice(1, 3))  # numpy's slice is a view
    data = np.arange(4, dtype=np.float32)
    first = evaluate(y, {x: data}, mode="numpy")
    data[1] = 100.0
    np.testing.assert_array_equal(first, [1.0, 2.0])
    np.testing.assert_array_equal(evaluate(y, {x: data}, mode="numpy"), [100.0, 2.0])
    with pytest.raises(ValueError):
        first[0] = 5.0  # the value cache holds it: read-only


def test_pinned_numpy_and_the_mode_check():
    x = Symbol((2,), name="x_pin_numpy")
    with tiers.pinned("numpy"):
        evaluate(GeneralFunction("sin", x), {x: np.ones(2)})
        assert last_run()["tier"] == "numpy"
    with pytest.raises(C.EvaluationError, match="use one of auto, jit, ops, numpy"):
        evaluate(x, {x: np.ones(2)}, mode="numpy!")


# ------------------------------------------------------------------ a fresh process, empty cache
# The prologue of a fresh-process script: with argv[1] == "count", the XLA traces and
# compilations are recorded by thread (``seen``; ``me`` the calling thread), else JAX is left
# unimported.
LISTEN = textwrap.dedent("""
    import json, sys, threading
    import numpy as np
    listen = sys.argv[1] == "count"
    seen = []
    if listen:
        import jax
        jax.monitoring.register_event_duration_secs_listener(
            lambda event, duration, **_: seen.append(threading.get_ident())
            if event in ("/jax/core/compile/backend_compile_duration", "/jax/core/compile/jaxpr_trace_duration")
            else None)
    me = threading.get_ident()
""")

_SCRIPT = LISTEN + textwrap.dedent("""
    import circuits as C
    from circuits.models import attn_only, induction_weights, tokens_symbol
    sym = tokens_symbol(34)
    circuit = attn_only(induction_weights(), sym, unique_names=True)
    toks = np.random.default_rng(5).integers(1, 64, (6, 34))
    value = C.evaluate(circuit, {sym: toks})
    run = C.backend.tiers.last_run()
    print(json.dumps({"xla_here": sum(1 for t in seen if t == me), "run": run, "jax": "jax" in sys.modules,
                      "value": value.tolist()}))
""")


def fresh_process(script: str, cache, how: str) -> dict:
    """The JSON the last line of ``script`` prints, run in a new process with the compilation
    cache ``cache`` (``how``: ``'count'`` or ``'plain'``, see ``LISTEN``)."""
    env = dict(os.environ, CIRCUITS_COMPILATION_CACHE=str(cache), PYTHONPATH=ROOT)
    out = subprocess.run([sys.executable, "-c", script, how], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _fresh(cache, how):
    return fresh_process(_SCRIPT, cache, how)


def test_a_fresh_process_with_an_empty_cache_compiles_nothing_and_answers_as_a_warm_one(tmp_path):
    empty = _fresh(tmp_path / "cache", "count")
    assert empty["xla_here"] == 0
    assert empty["run"]["kernels"]["compiled"] == 0 and empty["run"]["numpy"] == empty["run"]["computed"] > 100
    quiet = _fresh(tmp_path / "other", "plain")  # no listener: JAX is not even imported
    assert not quiet["jax"] and quiet["run"]["numpy"] == quiet["run"]["computed"]
    np.testing.assert_array_equal(quiet["value"], empty["value"])
    warm = _fresh(tmp_path / "cache", "count")  # the same folder: what the first kept
    assert warm["xla_here"] == 0
    _close(np.array(warm["value"]), np.array(empty["value"]), "float32")
    from circuits.models import attn_only, induction_weights, tokens_symbol

    sym = tokens_symbol(34)
    toks = np.random.default_rng(5).integers(1, 64, (6, 34))
    _close(np.array(empty["value"]), evaluate(attn_only(induction_weights(), sym, unique_names=True), {sym: toks},
                                              mode="jit"), "float32")


def test_a_zero_dimensional_scatter_is_its_child():
    # np.pad refuses the empty pad list of a 0-d block (the full suite's rewrite tests met it)
    from circuits.nodes.scatter import Scatter

    s = Scatter(C.Array(np.float32(2.0), name="two"), (), ())
    assert float(evaluate(s, mode="numpy")) == float(evaluate(s, mode="jit")) == 2.0
