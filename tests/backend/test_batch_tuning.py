"""evaluate_batched's measured chunk size (``circuits.backend.tiers.batch_tuning``): the measuring
calls return the same rows as evaluating each row alone, later calls go on where the last one
stopped, and the memory plan's bound caps the sizes tried.  Measuring is the whole-program
tier's (``mode='jit'``; ``'auto'`` runs a new circuit op by op first, tests/backend/test_batched_ops.py)."""

import numpy as np
import pytest

import circuits as C
from circuits.backend import batched
from circuits.backend.tiers import batch_tuning
from circuits.backend.tiers.batch_tuning import candidates, forget_tuning, tail_sizes, tuned_chunks


@pytest.fixture
def always_tune(monkeypatch):
    monkeypatch.setattr(batch_tuning, "TUNE_FROM_BYTES", 0)
    forget_tuning()
    yield
    forget_tuning()


def _circuit():
    x = C.Symbol((16,), name="x")
    w = C.Array(np.random.default_rng(0).standard_normal((16, 8)), name="w")
    return C.GeneralFunction("softmax", C.Einsum.from_spec("a,ab->b", x, w)), w


@pytest.mark.parametrize("total", [1, 5, 16])
def test_measured_chunks_give_the_rows_values(always_tune, total):
    c, w = _circuit()
    data = np.random.default_rng(total).standard_normal((total, 16))
    want = np.stack([C.evaluate(c, {"x": row}, dtype="float64") for row in data])
    for _ in range(3):  # the first calls measure (and compile), later ones use what was measured
        got = C.evaluate_batched(c, {"x": data}, dtype="float64", mode="jit")
        np.testing.assert_allclose(got, want, rtol=1e-12)
    found = tuned_chunks()
    if total > 1:
        (sizes,) = found.values()
        assert set(sizes) <= set(candidates(total)) and 1 in sizes
    else:
        assert not found


def test_verbose_says_what_was_measured(always_tune, capsys):
    c, _ = _circuit()
    C.evaluate_batched(c, {"x": np.ones((8, 16))}, verbose=True, mode="jit")
    out = capsys.readouterr().out
    assert "rows a chunk" in out and "measured per row" in out


def test_memory_plan_caps_the_sizes(always_tune, monkeypatch):
    c, _ = _circuit()
    prog = C.backend.Program([c], "float32")
    row = batched.plan_batch(prog, 1, "float32", batched_args=[prog.arg_nodes()[0]]).row_bytes
    monkeypatch.setattr(batched, "DEFAULT_MEMORY_BUDGET", 2 * row)
    for _ in range(3):
        C.evaluate_batched(c, {"x": np.ones((16, 16))}, mode="jit")
    (sizes,) = tuned_chunks().values()
    assert max(sizes) <= 2


def test_given_batch_size_or_budget_is_not_measured(always_tune):
    c, _ = _circuit()
    C.evaluate_batched(c, {"x": np.ones((8, 16))}, batch_size=2)
    C.evaluate_batched(c, {"x": np.ones((8, 16))}, memory_budget=1 << 30)
    C.evaluate_batched(c, {"x": np.ones((8, 16))}, mode="ops")
    assert tuned_chunks() == {}


def test_small_work_runs_as_planned():
    forget_tuning()
    c, _ = _circuit()
    C.evaluate_batched(c, {"x": np.ones((8, 16))})
    assert tuned_chunks() == {}


def test_tail_sizes_cover_the_rows():
    for remaining in range(0, 20):
        for chunk in (1, 3, 4, 8):
            sizes = tail_sizes(remaining, chunk, {1, 2, 4})
            assert sum(sizes) >= remaining and sum(sizes[:-1]) < max(remaining, 1)
