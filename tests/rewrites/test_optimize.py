"""``rewrites.optimize``: value-preserving on the seed's structure and on generated circuits; the
gather of a log_softmax never forms the log-probabilities; shared nodes are not pushed into."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import circuits as C
from circuits import Add, Array, Einsum, GeneralFunction, Index, Rearrange, Scalar, Symbol
from circuits.backend.symbolic import symbolic_equal
from circuits.models import attn_only, random_weights, tokens_symbol
from circuits.testing import circuits_with_inputs, int_arrays, shapes
from circuits.traversal import toposort
from rewrites import Trace, check
from rewrites.optimize import optimize
from rewrites.rules.gather import gather_of_log_softmax, push_gather_through_function

from .rewrite_helpers import RULE_SETTINGS, assert_same, must_not_fire, operands


def functions_in(circuit) -> set[str]:
    return {n.function.name for n in toposort(circuit) if isinstance(n, GeneralFunction)}


@pytest.fixture(scope="module")
def small_seed_weights():
    return random_weights(3, vocab=37, d_model=16, n_heads=2, head_size=4, n_layers=2, max_positions=16)


def test_optimize_keeps_the_seed_loss(small_seed_weights):
    toks = np.random.default_rng(0).integers(0, 37, 12)
    circuit = attn_only(small_seed_weights, toks)
    trace = Trace()
    out = optimize(circuit, trace=trace)
    check(out)
    assert out.name == "t.loss" and out.shape == circuit.shape
    assert_same(circuit, out)
    # The log-probabilities [positions, vocab] are never formed; logsumexp [positions] is.
    assert "log_softmax" in functions_in(circuit)
    assert "log_softmax" not in functions_in(out) and "logsumexp" in functions_in(out)
    assert "last_dim_size" not in functions_in(out)  # folded to Scalars
    assert {"gather_of_log_softmax", "contraction_order", "fold_last_dim_size"} <= set(trace.rules())
    assert all(len(n.children) <= 2 for n in toposort(out) if isinstance(n, Einsum))
    assert optimize(out) == out  # nothing left to do


def test_optimize_keeps_the_seed_loss_over_token_inputs(small_seed_weights):
    circuit = attn_only(small_seed_weights, tokens_symbol(10))
    out = optimize(circuit)
    for seed in range(3):
        toks = np.random.default_rng(seed).integers(0, 37, 10)
        assert_same(circuit, out, {"toks_int_var": toks})


def test_optimize_does_not_push_into_shared_nodes():
    x, w = Array(np.arange(12.0).reshape(3, 4)), Array(np.arange(20.0).reshape(4, 5))
    shared = Einsum.from_spec("ab,bc->ac", x, w)
    both = Add(Index(shared, (0,)), Einsum.from_spec("ac->c", shared))
    out = optimize(both)
    assert Index(shared, (0,)) in set(toposort(out))
    assert_same(both, out)
    alone = Index(Einsum.from_spec("ab,bc->ac", x, w), (0,))
    out = optimize(alone)
    assert out.line() == "Einsum b,bc->c" and out.children[0].line() == "[4] Index [0]"


@given(case=circuits_with_inputs(max_nodes=14))
@RULE_SETTINGS
def test_optimize_keeps_the_value_of_generated_circuits(case):
    circuit, inputs = case
    out = optimize(circuit)
    check(out)
    assert out.shape == circuit.shape and out.dtype == circuit.dtype
    assert_same(circuit, out, inputs, rtol=1e-7)


# ---------------------------------------------------------------------------- the gather rules
@st.composite
def log_prob_gathers(draw, function="log_softmax", last_axis=True):
    """``gen_index_at_*(f(z), idx)`` gathering along z's last axis, or along a leading one."""
    batch, checked = draw(st.booleans()), draw(st.booleans())
    rank = draw(st.integers(1 if last_axis else 2, 3))
    z_shape = draw(shapes(min_rank=rank, max_rank=rank))
    ax = rank - 1 if last_axis else draw(st.integers(0, rank - 2))
    x_rank = rank - 1 if function == "logsumexp" else rank  # the gathered tensor is f(z)
    if batch:
        q = draw(st.integers(0, ax))
        idx_shape = z_shape[:q]
        d = ax - q if draw(st.booleans()) else ax - x_rank
    else:
        idx_shape = draw(shapes(min_rank=0, max_rank=2))
        d = ax if draw(st.booleans()) else ax - x_rank
    n = z_shape[ax]
    idx = Array(draw(int_arrays(idx_shape, 0, n) if checked else int_arrays(idx_shape, -n, n)))
    z = draw(operands(z_shape, scalars=False))
    # plain: the index's axes first (rust_circuit's); _no_batch_index: where the gathered axis was
    at = not batch and draw(st.booleans())
    name = (f"gen_index_at_{d}{'_batch_x' if batch else ''}{'_no_batch_index' if at else ''}"
            f"{'_c' if checked else ''}")
    return GeneralFunction(name, GeneralFunction(function, z), idx)


@given(node=log_prob_gathers())
@RULE_SETTINGS
def test_gather_of_log_softmax(node):
    out = gather_of_log_softmax(node)
    assert out is not None and out.shape == node.shape
    check(out)
    assert "log_softmax" not in functions_in(out)
    assert_same(node, out)


def test_gather_of_log_softmax_is_exact():
    z = Symbol((2, 3), name="z")
    idx = Array(np.array([2, 0]))
    node = GeneralFunction("gen_index_at_0_batch_x_c", GeneralFunction("log_softmax", z), idx)
    assert symbolic_equal(node, gather_of_log_softmax(node))
    plain = GeneralFunction("gen_index_at_1", GeneralFunction("log_softmax", z), Array(np.array([[1, 2]])))
    out = gather_of_log_softmax(plain)
    assert isinstance(out.children[1].children[0], Rearrange)  # logsumexp broadcast over idx's axes
    assert symbolic_equal(plain, out)


def test_gather_of_log_softmax_does_not_fire():
    z = Symbol((3, 4), name="z")
    idx = Array(np.array([0, 2]))
    must_not_fire(gather_of_log_softmax, GeneralFunction("gen_index_at_0", GeneralFunction("log_softmax", z), idx))
    must_not_fire(gather_of_log_softmax, GeneralFunction("gen_index_at_1", GeneralFunction("softmax", z), idx))
    must_not_fire(gather_of_log_softmax, GeneralFunction("log_softmax", z))


@given(f=st.sampled_from(["softmax", "log_softmax", "logsumexp", "exp", "tanh"]), data=st.data())
@RULE_SETTINGS
def test_push_gather_through_function(f, data):
    node = data.draw(log_prob_gathers(function=f, last_axis=False))
    out = push_gather_through_function(node)
    assert isinstance(out, GeneralFunction) and out.function.name == f
    check(out)
    assert_same(node, out)


def test_push_gather_through_function_cases():
    z = Array(np.arange(20.0).reshape(4, 5) / 7)
    rows = Array(np.array([3, 0, 2]))
    node = GeneralFunction("gen_index_at_0_c", GeneralFunction("softmax", z), rows)
    out = push_gather_through_function(node)
    assert out.function.name == "softmax"
    assert_same(node, out)
    lse = GeneralFunction("gen_index_at_-1", GeneralFunction("logsumexp", z), Array(np.array([1, 1])))
    out = push_gather_through_function(lse)
    assert out.children[0].function.name == "gen_index_at_-2"
    assert_same(lse, out)
    # the softmax axis itself cannot be gathered first
    must_not_fire(push_gather_through_function,
                  GeneralFunction("gen_index_at_1", GeneralFunction("softmax", z), Array(np.array([0]))))
    # last_dim_size of a NaN row is not NaN: a checked gather must not move below it
    must_not_fire(push_gather_through_function,
                  GeneralFunction("gen_index_at_0_c", GeneralFunction("last_dim_size", z), Array(np.array([0]))))


def test_optimize_pushes_an_index_down_a_deep_chain_in_one_go():
    x = Symbol((3,), name="x")
    c = x
    for _ in range(3000):  # deeper than Python's recursion limit: everything is iterative
        c = GeneralFunction("tanh", Add(c, Scalar(1.0)))
    out = optimize(Index(c, (0,)))
    assert out.shape == () and isinstance(out, GeneralFunction)
    remaining = [n for n in toposort(out) if isinstance(n, Index)]
    assert [n.children[0] for n in remaining] == [x]


# ---------------------------------------------------------------------------- chunked logsumexp
def test_chunk_logsumexp_example_is_exact():
    from circuits.backend.symbolic import symbolic_equal
    from rewrites.engine import name_result
    from rewrites.rules.chunking import chunk_logsumexp

    before, after = chunk_logsumexp.example
    node = C.parse(before)
    assert chunk_logsumexp.fn(node) is None  # too small to chunk by default
    out = name_result(node, chunk_logsumexp.fn(node, chunks=2))
    assert out.to_text() == after
    assert symbolic_equal(node, out)


@pytest.mark.parametrize("chunks", [2, 3, 7])
def test_chunk_logsumexp_keeps_the_value(chunks):
    from rewrites.rules.chunking import chunk_logsumexp

    rng = np.random.default_rng(chunks)
    x = C.Array(rng.standard_normal((2, 5, 4)), name="x")
    w = C.Array(rng.standard_normal((4, 23)), name="w")
    lse = C.GeneralFunction("logsumexp", C.Einsum.from_spec("bsh,hv->bsv", x, w))
    out = chunk_logsumexp.fn(lse, chunks=chunks)
    assert out is not None and out.shape == lse.shape
    assert 2 <= len(out.children[0].children) <= chunks
    np.testing.assert_allclose(C.evaluate(out, dtype="float64"), C.evaluate(lse, dtype="float64"), rtol=1e-12)


def test_chunk_logsumexp_must_not_fire():
    from rewrites.rules.chunking import chunk_logsumexp

    x, w = C.Symbol((3, 4), name="x"), C.Symbol((6, 4), name="w")
    # the last axis is carried by two operands: no single operand to slice
    both = C.Einsum.from_spec("sv,vh->sv", C.Symbol((3, 6), name="y"), C.Symbol((6, 4), name="u"))
    assert chunk_logsumexp.fn(C.GeneralFunction("logsumexp", both), chunks=2) is None
    # not a logsumexp, or not of an Einsum
    assert chunk_logsumexp.fn(C.GeneralFunction("softmax", C.Einsum.from_spec("sh,vh->sv", x, w)), chunks=2) is None
    assert chunk_logsumexp.fn(C.GeneralFunction("logsumexp", x), chunks=2) is None


def _lowered_lines(circuit):
    from circuits.backend.lower.lowering import program_with_also

    program, _ = program_with_also(circuit, "float32", None, True)
    return [n.line() for n in program.nodes]


def test_optimize_leaves_chunking_to_the_backend():
    """optimize keeps a logsumexp of logits as it is (no Concat of chunks of its own); the backend
    fuses it (chunked on the CPU) where nothing else reads the logits: the same code as compile."""
    rng = np.random.default_rng(0)
    x = C.Array(rng.standard_normal((3, 4)).astype(np.float32), name="x")
    w = C.Array(rng.standard_normal((10, 4)).astype(np.float32), name="w")
    z = C.Einsum.from_spec("sh,vh->sv", x, w, name="z")
    lse = C.GeneralFunction("logsumexp", z, name="lse")
    out = optimize(lse)
    assert not any(isinstance(n, C.Concat) for n in C.toposort(out))
    assert "'lse' GeneralFunction logsumexp_of_einsum" in _lowered_lines(out)
    for dtype, tol in (("float32", 1e-5), ("float64", 1e-12)):
        np.testing.assert_allclose(C.evaluate(out, dtype=dtype), C.evaluate(lse, dtype=dtype, batch_heads=False),
                                   rtol=tol)
    # z also read elsewhere: its full value is computed anyway, so the logsumexp reads it
    shared = C.Add(lse, C.Einsum.from_spec("sv->s", z), name="both")
    lines = _lowered_lines(optimize(shared))
    assert "'lse' GeneralFunction logsumexp" in lines and not any("logsumexp_of_einsum" in x for x in lines)


# ---------------------------------------------------------------------------- gather through einsum
def test_push_gather_through_einsum_example_is_exact():
    from rewrites.engine import name_result
    from rewrites.rules.gather import push_gather_through_einsum

    before, after = push_gather_through_einsum.example
    node = C.parse(before)
    out = name_result(node, push_gather_through_einsum.fn(node))
    assert out.to_text() == after
    assert symbolic_equal(node, out, {node.children[1]: np.array([5, 0, 3])})


@pytest.mark.parametrize("fn", ["gen_index_at_0", "gen_index_at_0_c", "gen_index_at_1", "gen_index_at_-1_c",
                                "gen_index_at_1_no_batch_index", "gen_index_at_-1_no_batch_index_c",
                                "gen_index_at_0_batch_x", "gen_index_at_0_batch_x_c", "gen_index_at_1_batch_x"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_push_gather_through_einsum_keeps_the_value(fn, seed):
    from rewrites.rules.gather import push_gather_through_einsum

    rng = np.random.default_rng(seed)
    a = C.Array(rng.standard_normal((3, 4, 5)), name="a")
    b = C.Array(rng.standard_normal((5, 6)), name="b")
    z = C.Einsum.from_spec("sxh,hv->sxv", a, b, name="z")  # [3,4,6]; axis v only in b, s/x only in a
    if "batch_x" in fn:
        size = 6 if fn.endswith("at_1_batch_x") else 4
        idx = rng.integers(-size if "_c" not in fn else 0, size, (3,))
    else:
        size = {"0": 3, "1": 4, "-1": 6}[fn.split("_")[3]]
        idx = rng.integers(-size if "_c" not in fn else 0, size, (2, 2))
    g = C.GeneralFunction(fn, z, C.Array(idx, name="idx"))
    out = push_gather_through_einsum.fn(g)
    if fn in ("gen_index_at_0", "gen_index_at_0_c", "gen_index_at_1", "gen_index_at_1_no_batch_index",
              "gen_index_at_0_batch_x", "gen_index_at_0_batch_x_c", "gen_index_at_1_batch_x"):
        # s and x are carried by a only, v by b only: every one of these pushes
        assert out is not None
    if out is not None:
        assert out.shape == g.shape
        np.testing.assert_allclose(C.evaluate(out, dtype="float64"), C.evaluate(g, dtype="float64"), rtol=1e-12)


def test_push_gather_through_einsum_must_not_fire():
    from rewrites.rules.gather import push_gather_through_einsum

    x, y = C.Symbol((3, 3), name="x"), C.Symbol((3, 3), name="y")
    t = C.Symbol((2,), name="t", dtype="int64")
    # the gathered axis is carried by both operands
    z = C.Einsum.from_spec("ab,ab->ab", x, y)
    assert push_gather_through_einsum.fn(C.GeneralFunction("gen_index_at_0", z, t)) is None
    # a diagonal: the gathered axis appears twice in its operand
    assert push_gather_through_einsum.fn(C.GeneralFunction("gen_index_at_0", C.Einsum.from_spec("aa->a", x), t)) is None
    # not an Einsum
    assert push_gather_through_einsum.fn(C.GeneralFunction("gen_index_at_0", x, t)) is None


def test_optimize_pushes_a_small_gather_into_shared_logits_then_the_backend_fuses(monkeypatch):
    """The seed's shape in small: log_softmax's gather becomes one dot product per position,
    and the logsumexp then reads the logits alone, so the backend fuses (and chunks) it."""
    from circuits.backend.cache.compiled import clear_compile_cache
    from circuits.backend.lower import fusion

    monkeypatch.setattr(fusion, "CHUNK_FROM_ENTRIES", 1)
    monkeypatch.setattr(fusion, "CHUNK_ENTRIES", 64)
    clear_compile_cache()
    rng = np.random.default_rng(0)
    x = C.Array(rng.standard_normal((5, 4)).astype(np.float32), name="x")
    w = C.Array(rng.standard_normal((80, 4)).astype(np.float32), name="w")
    t = C.Array(rng.integers(0, 80, 5), name="t")
    lp = C.GeneralFunction("log_softmax", C.Einsum.from_spec("sh,vh->sv", x, w, name="logits"))
    ll = C.GeneralFunction("gen_index_at_0_batch_x_c", lp, t, name="ll")
    fast = optimize(ll)
    kinds = {n.function_name for n in C.toposort(fast) if isinstance(n, C.GeneralFunction)}
    assert "log_softmax" not in kinds and "gen_index_at_0_c" in kinds
    assert any("logsumexp_of_einsum" in line for line in _lowered_lines(fast))
    # no node of the optimized circuit holds the whole [5, 80] log-probabilities
    assert all(not (isinstance(n, C.GeneralFunction) and n.function_name == "log_softmax")
               for n in C.toposort(fast))
    np.testing.assert_allclose(C.evaluate(fast), C.evaluate(ll), rtol=1e-5)
    clear_compile_cache()


# ---------------------------------------------------------------------------- the schedule
def test_optimize_is_a_schedule_of_strategies():
    from rewrites.optimize import schedule
    from rewrites.strategies import Strategy

    s = schedule()
    assert isinstance(s, Strategy)
    assert repr(s).split(" >> ") == [
        "normalize(fold)", "fixpoint(dynamic(push_down), max_steps=20)", "normalize(cleanup + fold)",
        "bottom_up(contraction_order)",
    ]


def test_optimize_step_caps_raise_instead_of_stopping_silently(monkeypatch):
    import importlib

    opt = importlib.import_module("rewrites.optimize")  # the module, not the function rewrites.optimize
    x = Symbol((3,), name="x")
    c = x
    for _ in range(4):
        c = GeneralFunction("tanh", Add(c, Scalar(1.0)))
    node = Index(c, (0,))
    assert optimize(node, max_steps=2).shape == ()  # one pass moves the Index down, one finds no more
    # a cap on push-down passes: one pass is not enough to see that nothing more changes
    with pytest.raises(C.RewriteLoopError, match=r"max_steps=1[\s\S]*push_index_through"):
        optimize(node, max_steps=1)
    # a cap on the rewrites at one node within a pass
    monkeypatch.setattr(opt, "MAX_STEPS_AT_A_NODE", 1)
    with pytest.raises(C.RewriteLoopError, match=r"max_steps=1[\s\S]*push_index_through_function"):
        optimize(node)
