"""``evaluate`` again on a circuit it has seen reuses the circuit's lowered program (no new walk,
key or argument table), holds no circuit alive, and still checks and binds every input anew."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

from circuits import Add, Array, Einsum, GeneralFunction, Scalar, Symbol, evaluate
from circuits.backend.lower import program as program_module
from circuits.backend.lower.lowering import cached_program, program_cache_info
from circuits.errors import EvaluationError


def small(seed=0):
    r = np.random.default_rng(seed)
    w = Array(r.standard_normal((5, 4)).astype(np.float32), name="w")
    x = Symbol((4,), name="x")
    h = GeneralFunction("tanh", Einsum.from_spec("ab,b->a", w, x), name="h")
    return Add(h, Scalar(0.25), name="out"), w.value


def reference(w, x):
    return np.tanh(w @ x) + 0.25


@pytest.fixture
def count_lowerings(monkeypatch):
    calls = []
    original = program_module.Program.__init__

    def counting(self, *args, **kwargs):
        calls.append(1)
        original(self, *args, **kwargs)

    monkeypatch.setattr(program_module.Program, "__init__", counting)
    return calls


def test_second_evaluate_does_not_lower_again_and_binds_new_inputs(count_lowerings):
    c, w = small()
    xs = [np.random.default_rng(i).standard_normal(4).astype(np.float32) for i in range(3)]
    # the whole-program tier keeps a circuit's program (op by op nothing is lowered at all)
    first = evaluate(c, {"x": xs[0]}, mode="jit")
    lowered = len(count_lowerings)
    assert lowered >= 1
    for x in xs:
        np.testing.assert_allclose(evaluate(c, {"x": x}, mode="jit"), reference(w, x), rtol=1e-5)
    assert len(count_lowerings) == lowered
    np.testing.assert_allclose(first, reference(w, xs[0]), rtol=1e-5)


def test_inputs_are_still_checked_on_a_cached_program():
    c, _ = small()
    evaluate(c, {"x": np.zeros(4)})
    with pytest.raises(EvaluationError, match="unbound Symbol"):
        evaluate(c)
    with pytest.raises(EvaluationError, match="has shape"):
        evaluate(c, {"x": np.zeros(5)})


def test_dtype_and_also_have_their_own_programs():
    c, w = small()
    x = np.linspace(-1, 1, 4)
    v32 = evaluate(c, {"x": x})
    v64, extra = evaluate(c, {"x": x}, dtype="float64", also=["h"])
    assert v32.dtype == np.float32 and v64.dtype == np.float64
    np.testing.assert_allclose(v64, reference(w.astype(np.float64), x), rtol=1e-12)
    np.testing.assert_allclose(extra["h"], np.tanh(w.astype(np.float64) @ x), rtol=1e-12)
    again, extra2 = evaluate(c, {"x": x}, dtype="float64", also=["h"])
    np.testing.assert_array_equal(again, v64)
    assert cached_program(c, "float64", ["h"])[0] is cached_program(c, "float64", ["h"])[0]
    assert cached_program(c, "float64", ["h"])[0] is not cached_program(c, "float32", ["h"])[0]


def test_a_patched_circuit_gets_its_own_values():
    c, w = small()
    x = np.ones(4, np.float32)
    evaluate(c, {"x": x})
    w2 = np.full((5, 4), 0.1, np.float32)
    patched = c.update("w", lambda n: Array(w2, name="w"))
    np.testing.assert_allclose(evaluate(patched, {"x": x}), reference(w2, x), rtol=1e-5)
    np.testing.assert_allclose(evaluate(c, {"x": x}), reference(w, x), rtol=1e-5)


def test_the_cache_keeps_no_circuit_alive():
    c, _ = small(seed=7)
    evaluate(c, {"x": np.zeros(4)}, mode="jit")
    before = program_cache_info()["roots"]
    ref = weakref.ref(c)
    program = cached_program(c, "float32", None)[0]
    assert program.nodes is None and len(program) == c.count_nodes()
    del c, program
    gc.collect()
    assert ref() is None
    assert program_cache_info()["roots"] <= before - 1  # its entry went (others may have, too)


def test_a_circuit_collected_while_the_table_is_locked_does_not_deadlock():
    """A root in a reference cycle dies when the collector runs, which can happen while the
    cache's own lock is held (any allocation may start it): its callback must still get in."""
    import threading

    from circuits.backend.lower import lowering

    c, _ = small(seed=11)
    evaluate(c, {"x": np.zeros(4)}, mode="jit")
    ref = weakref.ref(c)
    cycle = [c]
    cycle.append(cycle)
    del c

    def collect_under_lock():
        nonlocal cycle
        with lowering._programs._lock:
            cycle = None
            gc.collect()

    worker = threading.Thread(target=collect_under_lock, daemon=True)
    worker.start()
    worker.join(timeout=60)
    assert not worker.is_alive(), "the weak reference callback deadlocked on the cache's lock"
    assert ref() is None
