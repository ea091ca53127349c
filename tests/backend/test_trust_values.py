"""Trust in values: bools are 0/1, gather indices in range, rust_circuit's gen_index layouts,
library errors (never raw ones) for huge sizes and misuse, bounded allocations."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import circuits as C
from circuits.backend.symbolic import symbolic_evaluate
from circuits.errors import CircuitError, EvaluationError, ParseError, SelectionError, ShapeError
from circuits.functions import GenIndex
from circuits.io.values import gather_index_bounds
from circuits.testing import store_of
from tests.nodes import oracle


# ---------------------------------------------------------------------------- 9: bools
def test_bool_array_with_raw_bytes_is_normalised():
    raw = np.frombuffer(bytes([2, 0, 255]), dtype=np.bool_)
    b = C.Array(raw, name="b")
    np.testing.assert_array_equal(C.evaluate(C.Add(b, C.Scalar(0.0))), [1.0, 0.0, 1.0])
    assert b is C.Array(np.array([True, False, True]), name="b")  # same truth values, same node
    assert b.value.view(np.uint8).tolist() == [1, 0, 1]


# ---------------------------------------------------------------------------- 10: index ranges
TABLE = C.Array(np.arange(15, dtype=np.float32).reshape(5, 3), name="table")


@pytest.mark.parametrize("fn, bad", [("gen_index_at_0_c", [0, 5]), ("gen_index_at_0_c", [-1, 0]),
                                     ("gen_index_at_0", [0, -6]), ("gen_index_at_0", [7])])
def test_out_of_range_index_array_is_refused_when_built(fn, bad):
    with pytest.raises(ShapeError, match="out of range"):
        C.GeneralFunction(fn, TABLE, C.Array(np.array(bad)), name="emb")


def test_out_of_range_tokens_bound_at_evaluation_are_refused():
    toks = C.Symbol((3,), name="toks", dtype="int64")
    emb = C.GeneralFunction("gen_index_at_0_c", TABLE, C.Index(toks, (slice(None),)), name="emb")
    loss = C.Einsum.from_spec("ab->", emb)
    assert C.evaluate(loss, {"toks": np.array([0, 4, 2])}) == pytest.approx(float(TABLE.value[[0, 4, 2]].sum()))
    for bad in ([0, 5, 1], [-1, 0, 0]):
        with pytest.raises(EvaluationError, match="toks.*outside \\[0, 5\\)"):
            C.evaluate(loss, {"toks": np.array(bad)})
        with pytest.raises(EvaluationError, match="toks"):
            C.compile(loss)({"toks": np.array(bad)})


def test_placeholder_index_bound_later_is_checked():
    c = C.parse("'e' GeneralFunction gen_index_at_0_c\n  'table' [5,3] Array 0a\n  'toks' [2] Array 0b")
    table_only = C.bind(c, {"table": TABLE.value})
    with pytest.raises(CircuitError, match="out of range"):  # the gather is rebuilt over the value
        C.bind(table_only, {"toks": np.array([1, 9])})
    # through an Index the value is checked when the circuit is evaluated
    via = C.GeneralFunction("gen_index_at_0_c", TABLE, C.Index(C.Array(np.array([1, 9]), name="t"), (slice(None),)))
    with pytest.raises(EvaluationError, match="Array 't'.*outside \\[0, 5\\)"):
        C.evaluate(via)


# ---------------------------------------------------------------------------- 14: rust_circuit's gen_index
@st.composite
def gen_index_cases(draw):
    layout = draw(st.sampled_from(("plain", "batch_x", "no_batch_index", "batch_x_no_batch_index")))
    checked = draw(st.booleans())
    idx_shape = tuple(draw(st.lists(st.integers(1, 3), max_size=2)))
    if layout == "batch_x":
        rest = tuple(draw(st.lists(st.integers(1, 3), min_size=1, max_size=2)))
        x_shape = idx_shape + rest
        d = draw(st.integers(-len(rest), len(rest) - 1))
        ax = len(idx_shape) + (d if d >= 0 else len(rest) + d)
    else:
        x_shape = tuple(draw(st.lists(st.integers(1, 3), min_size=1, max_size=3)))
        lo = -len(x_shape)
        hi = -1 if layout == "batch_x_no_batch_index" else len(x_shape) - 1
        d = draw(st.integers(lo, hi))
        ax = d if d >= 0 else len(x_shape) + d
    n = x_shape[ax]
    idx = np.array(draw(st.lists(st.integers(0 if checked else -n, n - 1), min_size=int(np.prod(idx_shape)),
                                 max_size=int(np.prod(idx_shape))))).reshape(idx_shape).astype(np.int64)
    x = np.arange(int(np.prod(x_shape)), dtype=np.float64).reshape(x_shape)
    suffix = {"plain": "", "batch_x": "_batch_x", "no_batch_index": "_no_batch_index",
              "batch_x_no_batch_index": "_batch_x_no_batch_index"}[layout]
    return f"gen_index_at_{d}{suffix}{'_c' if checked else ''}", x, idx


@settings(max_examples=150, deadline=None)
@given(gen_index_cases())
def test_gen_index_matches_the_numpy_oracle(case):
    name, x, idx = case
    node = C.GeneralFunction(name, C.Array(x, name="x"), C.Array(idx, name="idx"))
    expected = oracle.gen_index(name, x, idx)
    assert node.shape == expected.shape
    np.testing.assert_array_equal(C.evaluate(node, dtype="float64"), expected)
    if expected.size <= 12:  # the sympy form gathers the same entries
        sym = symbolic_evaluate(node)
        for pos in np.ndindex(*expected.shape):
            entry = sym[pos]
            if entry.free_symbols:
                (s,) = entry.free_symbols
                assert x[tuple(int(v) for v in s.name[s.name.index("[") + 1:-1].split(",") if v)] == expected[pos]
            else:
                assert float(entry) == expected[pos]
    assert C.parse(node.to_text(), store=store_of(node)) is node


def test_gen_index_plain_puts_the_index_axes_first_as_rust_circuit_does():
    # rust_circuit's test_gen_index_at_no_batch_x: x [5,7], index [1,4,2], index_dim 1 gives
    # shape [1,4,2,5] with out[i,j,k] = x[:, index[i,j,k]]
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 7))
    idx = rng.integers(0, 7, (1, 4, 2))
    for d in (1, -1):
        out = C.evaluate(C.GeneralFunction(f"gen_index_at_{d}", C.Array(x), C.Array(idx)), dtype="float64")
        assert out.shape == (1, 4, 2, 5)
        np.testing.assert_array_equal(out, np.moveaxis(np.take(x, idx, axis=1), 0, -1))
        # rust's batch_index=False variant is numpy's take
        take = C.GeneralFunction(f"gen_index_at_{d}_no_batch_index", C.Array(x), C.Array(idx))
        np.testing.assert_array_equal(C.evaluate(take, dtype="float64"), np.take(x, idx, axis=1))
    with pytest.raises(ShapeError, match="negative axis"):
        C.GeneralFunction("gen_index_at_1_batch_x_no_batch_index", C.Array(x), C.Array(idx))
    assert GenIndex.parse("gen_index_at_-2_batch_x_no_batch_index_c") == GenIndex(-2, True, False, True)


def test_rust_nll_module_parses_with_an_int_label():
    text = """'ll' GeneralFunction gen_index_at_0_batch_x_c
  'log_probs' GeneralFunction log_softmax
    'll.input' [7] Symbol b9d111e5-b793-4f63-84a0-2f8590b9f39c
  'll.label' [] Symbol 74c503b9-fe2c-4f8b-9350-7351a292c351"""
    ll = C.parse(text)
    label = ll.children[1]
    assert label.dtype == "int64" and ll.children[0].children[0].dtype == "float32"
    logits = np.linspace(-1, 1, 7)
    got = C.evaluate(ll, {"ll.input": logits, "ll.label": np.array(3)}, dtype="float64")
    assert got == pytest.approx(logits[3] - np.log(np.exp(logits).sum()))


# ---------------------------------------------------------------------------- 12: library errors
@pytest.mark.parametrize("build", [
    lambda: C.Symbol((2**64,)),
    lambda: C.Scalar(1.0, (2**63,)),
    lambda: C.Index(C.Symbol((3,)), (slice(0, 2**64),)),
    lambda: C.Einsum(C.Symbol((3,)), in_axes=((2**64,),), out_axes=(2**64,)),
    lambda: C.Rearrange(C.Symbol((3,)), "a -> a b", b=2**64),
])
def test_big_ints_are_library_errors(build):
    with pytest.raises(CircuitError):
        build()


@pytest.mark.parametrize("text", [
    "'x' [99999999999999999999] Symbol",
    "'y' [3] Index [0:99999999999999999999]\n  'x' [3] Symbol",
    "'y' Concat 99999999999999999999\n  'x' [3] Symbol",
    "'y' GeneralFunction gen_index_at_" + "9" * 5000 + "\n  'x' [3] Symbol\n  'i' [] Symbol",
    "'y' Rearrange a -> a b b=99999999999999999999\n  'x' [3] Symbol",
])
def test_big_ints_in_text_are_parse_errors(text):
    with pytest.raises(ParseError):
        C.parse(text)


def test_parser_wraps_only_library_errors(monkeypatch):
    from circuits.nodes import add

    def broken(*args, **kwargs):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(add.Add, "_setup", broken)
    with pytest.raises(ZeroDivisionError):  # a bug stays a bug, not a ParseError
        C.parse("'s' Add\n  'x' [2] Symbol")


def test_huge_allocations_are_refused_before_allocating(monkeypatch):
    with pytest.raises(CircuitError, match="budget"):
        C.fill_random(C.parse("'x' [10000000000000] Array 0a"))
    with pytest.raises(EvaluationError, match="budget"):
        C.evaluate(C.Rearrange(C.Scalar(1.0, (3,)), "a -> a b", b=10**12))
    with pytest.raises(EvaluationError, match="budget"):
        C.evaluate(C.Scalar(1.0, (10**6, 10**6)))
    monkeypatch.setenv("CIRCUITS_MAX_ALLOC_BYTES", "64")
    with pytest.raises(EvaluationError, match="CIRCUITS_MAX_ALLOC_BYTES"):
        C.evaluate(C.Scalar(1.0, (100,)))
    with pytest.raises(CircuitError, match="budget"):
        C.fill_random(C.parse("'x' [100] Array 0a"))
    assert C.fill_random(C.parse("'x' [100] Array 0a"), max_bytes=400).value.shape == (100,)


def test_einsum_over_bools_means_numpy_einsum():
    b = C.Array(np.array([[True, False], [False, False]]))
    for spec in ("ab->", "ab->a", "ab,ab->b"):
        operands = [b] * (spec.count(",") + 1)
        got = C.evaluate(C.Einsum.from_spec(spec, *operands))
        np.testing.assert_array_equal(got, np.einsum(spec, *[o.value for o in operands]))


def test_update_returning_an_array_says_what_to_return():
    c = C.Add(C.Symbol((2,), name="x"), C.Scalar(1.0, (2,), name="one"))
    with pytest.raises(SelectionError, match="wrap a value as Array"):
        c.update("one", lambda n: np.zeros(2))


# ---------------------------------------------------------------------------- 13: linear fill_random
def test_gather_bounds_walk_shared_index_chains_once(monkeypatch):
    toks = C.Array.placeholder((4,), "0b", name="toks", dtype="int64")
    chain = toks
    for _ in range(300):
        chain = C.Index(chain, (slice(None),))
    tables = [C.Array.placeholder((7 + i, 2), f"{i + 16:x}", name=f"t{i}") for i in range(300)]
    c = C.Add(*[C.GeneralFunction("gen_index_at_0_c", t, chain) for t in tables])
    steps = {"n": 0}

    class Counting:  # Index.passes_index, counting how often the walk asks it
        def __get__(self, node, cls):
            steps["n"] += 1
            return True

    monkeypatch.setattr(C.Index, "passes_index", Counting())
    bounds = gather_index_bounds(c)
    assert bounds[toks.hash] == 7
    # one step per node, not one per (gather, chain node): 300 x 300 before
    assert steps["n"] <= 2 * c.count_nodes()
    filled = C.fill_random(c, seed=0)
    assert C.evaluate(filled).shape == (4, 2)
