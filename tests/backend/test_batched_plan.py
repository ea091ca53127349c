"""evaluate_batched without batch_size: the chunk comes from the cost model and a memory budget
(the whole-program tier's, ``mode='jit'``; the op-by-op tier's chunks: tests/backend/test_batched_ops.py)."""

import logging

import numpy as np
import pytest

import circuits as C
from circuits.backend import Program
from circuits.backend.batched import DEFAULT_MEMORY_BUDGET, plan_batch


def _circuit():
    x = C.Symbol((256,), name="x")
    w = C.Array(np.random.default_rng(0).standard_normal((256, 64)).astype(np.float32), name="w")
    h = C.Einsum.from_spec("a,ab->b", x, w, name="h")          # 256 bytes a row
    return C.GeneralFunction("exp", h, name="e"), x, w         # 256 more


def test_chunk_is_what_fits_the_budget_and_results_agree(capsys, caplog):
    e, x, w = _circuit()
    data = np.random.default_rng(1).standard_normal((10, 256)).astype(np.float32)
    row = 256 + 256 + 256 * 4  # h and e live together, plus the row of x
    plan = plan_batch(Program([e], "float32"), 10, "float32", memory_budget=3 * row, batched_args=[x])
    assert (plan.chunk, plan.row_bytes, plan.budget) == (3, row, 3 * row)
    with caplog.at_level(logging.INFO, logger="circuits.backend.batched"):
        got = C.evaluate_batched(e, {"x": data}, memory_budget=3 * row, verbose=True, mode="jit")
    assert "evaluate_batched: 3 of 10 rows" in capsys.readouterr().out
    assert any("3 of 10 rows" in r.getMessage() for r in caplog.records)
    np.testing.assert_allclose(got, np.exp(data @ w.value), rtol=1e-4)


def test_default_budget_and_edges():
    e, x, _ = _circuit()
    prog = Program([e], "float32")
    assert plan_batch(prog, 10, "float32").chunk == 10                     # small rows: all at once
    assert DEFAULT_MEMORY_BUDGET == 256 << 20
    tiny = plan_batch(prog, 10, "float32", memory_budget=1)
    assert tiny.chunk == 1 and "over the budget" in tiny.reason
    assert plan_batch(prog, 10, "float32", batch_size=4).chunk == 4
    with pytest.raises(C.EvaluationError, match="memory_budget=0"):
        plan_batch(prog, 10, "float32", memory_budget=0)


def test_seed_sized_logits_run_in_small_chunks():
    # one row of the seed's loss holds [300, 50259] logits and their log_softmax: ~115 MiB
    from circuits.models import attn_only, random_weights

    toks = C.Symbol((302,), name="toks", dtype="int64")
    loss = attn_only(random_weights(seed=0), toks)
    plan = plan_batch(Program([loss], "float32"), 32, "float32", batched_args=[toks])
    assert 2 * 300 * 50259 * 4 < plan.row_bytes < 3 * 300 * 50259 * 4
    assert plan.chunk == 2


def test_a_circuit_evaluated_on_batch_after_batch_is_lowered_once(monkeypatch):
    """A masked search calls evaluate_batched on one circuit many times: it is lowered (program,
    head batching, fusion, the cost model) on the first call only, until clear_cache."""
    from circuits.backend import batched, clear_cache

    x = C.Symbol((3,), name="x_lowered_once")
    c = C.GeneralFunction("exp", C.Einsum.from_spec("a,->a", x, C.Scalar(3.0)))
    calls = []
    real = batched.program_with_also
    monkeypatch.setattr(batched, "program_with_also", lambda *a, **k: calls.append(1) or real(*a, **k))
    for k in range(3):
        out = batched.evaluate_batched(c, {x: np.full((4, 3), float(k), np.float32)}, mode="jit")
        np.testing.assert_allclose(out, np.exp(3.0 * np.full((4, 3), float(k))), rtol=1e-6)
    assert len(calls) == 1
    batched.evaluate_batched(c, {x: np.zeros((2, 3), np.float32)}, also=[c.children[0]], mode="jit")
    assert len(calls) == 2  # another output set is another program
    clear_cache("compiled")
    batched.evaluate_batched(c, {x: np.zeros((2, 3), np.float32)}, mode="jit")
    assert len(calls) == 3
