"""circuits.backend.symbolic: sympy values agree with numeric evaluation; ``symbolic_equal`` proves the
value-preserving rewrites exact (distribute, flatten, factor, nest, push-down-index...) and
rejects what is not equal."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import circuits
from circuits import Add, Array, Einsum, EvaluationError, GeneralFunction, Index, Rearrange, Scalar, Symbol
from circuits.backend import evaluate
from circuits.backend.symbolic import SymbolTable, symbolic_equal, symbolic_evaluate
from circuits.testing import circuits_with_inputs, einsum_specs, indices, shapes
from rewrites.rules import add as add_rules
from rewrites.rules import einsum as einsum_rules
from rewrites.rules import index as index_rules
from tests.deep import DEPTH, build_deep_chain

SETTINGS = settings(max_examples=25, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])

# Functions whose meaning symbolic evaluation knows (the others stay uninterpreted).
INTERPRETED = ("exp", "log", "sin", "cos", "tanh", "sqrt", "abs", "rsqrt", "reciprocal", "sigmoid",
               "relu", "silu", "square", "pow", "softmax", "log_softmax", "logsumexp", "max", "min",
               "mean", "last_dim_size", "gen_index")


def to_numbers(values: np.ndarray, bindings: dict) -> np.ndarray:
    import sympy

    out = np.empty(values.shape, dtype=np.float64)
    for pos in np.ndindex(values.shape):
        v = values[pos].xreplace(bindings)
        out[pos] = np.nan if v is sympy.nan else float(sympy.N(v, 20))
    return out


@given(case=circuits_with_inputs(max_nodes=8, max_depth=3, functions=INTERPRETED))
@SETTINGS
def test_symbolic_values_match_numeric_evaluation(case):
    circuit, inputs = case
    ints = {s: v for s, v in inputs.items() if s.dtype.startswith("int")}
    table = SymbolTable()
    values = symbolic_evaluate(circuit, ints, table=table)
    assert values.shape == circuit.shape
    got = to_numbers(values, table.bindings(circuit, inputs))
    want = evaluate(circuit, inputs, dtype="float64")
    np.testing.assert_allclose(got, want, rtol=1e-7, atol=1e-7)


def test_leaves_map_to_symbols_by_content_and_identity():
    v = np.arange(4.0).reshape(2, 2)
    assert symbolic_equal(Array(v, name="a"), Array(v, name="b"))
    assert not symbolic_equal(Array(v, name="a"), Array(v + 1, name="a"))
    x = Symbol((2,), name="x")
    assert symbolic_equal(x, x)
    assert not symbolic_equal(x, Symbol.new((2,), name="x"))  # another input of the same name
    assert not symbolic_equal(x, Symbol((3,), name="x"))  # shapes differ
    # Scalars are exact rationals of their printed value
    assert symbolic_evaluate(Scalar(0.00001))[()] == __import__("sympy").Rational(1, 100000)
    # int Arrays keep their values: they are indices
    assert symbolic_evaluate(Array(np.array([3, 1])))[1] == 1


def test_symbolic_equal_proves_algebra_and_rejects_near_misses():
    x, y, w = Symbol((2,), name="x"), Symbol((2,), name="y"), Symbol((2, 2), name="w")
    lhs = Einsum.from_spec("ab,b->a", w, Add(x, y))
    rhs = Add(Einsum.from_spec("ab,b->a", w, x), Einsum.from_spec("ab,b->a", w, y))
    assert symbolic_equal(lhs, rhs)
    assert not symbolic_equal(lhs, Add(Einsum.from_spec("ab,b->a", w, x), Einsum.from_spec("ba,b->a", w, y)))
    # exp(a + b) = exp(a) exp(b) needs simplification beyond expansion
    e = GeneralFunction("exp", Add(x, y))
    prod = Einsum.from_spec("a,a->a", GeneralFunction("exp", x), GeneralFunction("exp", y))
    assert symbolic_equal(e, prod)
    # log_softmax gathered = logit - logsumexp holds by definition, not for arbitrary functions
    idx = Array(np.array([1, 0]))
    z = Symbol((2, 2), name="z")
    gathered = GeneralFunction("gen_index_at_0_batch_x", GeneralFunction("log_softmax", z), idx)
    direct = Add(GeneralFunction("gen_index_at_0_batch_x", z, idx),
                 Einsum.from_spec("a,->a", GeneralFunction("logsumexp", z), Scalar(-1.0)))
    assert symbolic_equal(gathered, direct)
    assert not symbolic_equal(gathered, direct, interpret=False)


def test_uninterpreted_functions_and_gathers():
    x = Symbol((2, 3), name="x")
    gelu = symbolic_evaluate(GeneralFunction("gelu", x))  # no sympy definition registered
    assert str(gelu[0, 1]) == "gelu(x[0,1])"
    sm = GeneralFunction("softmax", x)
    assert symbolic_equal(Index(sm, (1,)), GeneralFunction("softmax", Index(x, (1,))), interpret=False)
    assert not symbolic_equal(Index(sm, (1,)), Index(sm, (0,)), interpret=False)
    toks = Symbol((2,), name="t", dtype="int64")
    gather = GeneralFunction("gen_index_at_0_c", x, toks)
    with pytest.raises(EvaluationError, match="concrete int"):
        symbolic_evaluate(gather)
    got = symbolic_evaluate(gather, {"t": np.array([1, 5])})
    assert str(got[0, 2]) == "x[1,2]" and got[1, 0] is __import__("sympy").nan


@pytest.mark.usefixtures("low_recursion_limit")
def test_public_name_and_deep_chain():
    assert circuits.symbolic_equal is symbolic_equal
    # the shared chain's Add steps only (sympy nests tanh too deeply): iterative, no recursion limit
    c = build_deep_chain(steps=("add",), leaf=Symbol((1,), name="x"))
    assert str(symbolic_evaluate(c)[0]) == f"x[0] + {DEPTH}"


# ---------------------------------------------------------------------------- proving rewrites
def symbols_of(shapes_, prefix="s"):
    return [Symbol(s, name=f"{prefix}{i}") for i, s in enumerate(shapes_)]


@st.composite
def einsum_over_adds(draw):
    """An Einsum of Symbols where some operands are Adds of Symbols (small shapes)."""
    spec = draw(einsum_specs(draw(shapes(min_rank=0, max_rank=2, max_side=2)), max_operands=3, max_summed=1))
    kids = []
    for i, s in enumerate(spec.input_shapes):
        if draw(st.booleans()):
            kids.append(Add(*symbols_of([s] * draw(st.integers(2, 3)), prefix=f"t{i}_")))
        else:
            kids.append(Symbol(s, name=f"o{i}"))
    return Einsum(*kids, in_axes=spec.in_axes, out_axes=spec.out_axes)


@given(node=einsum_over_adds())
@SETTINGS
def test_distribute_is_exact(node):
    out = einsum_rules.distribute_einsum_over_add(node)
    if any(isinstance(c, Add) for c in node.children):
        assert out is not None
        assert symbolic_equal(node, out)


@given(node=einsum_over_adds())
@SETTINGS
def test_flatten_and_nest_einsum_are_exact(node):
    nested = einsum_rules.nest_einsum(node)
    if nested is not None:
        assert symbolic_equal(node, nested)
        flat = einsum_rules.flatten_einsum(nested)
        assert flat is not None and symbolic_equal(nested, flat)


@given(shape=shapes(max_rank=2, max_side=2))
@SETTINGS
def test_flatten_factor_and_dedupe_add_are_exact(shape):
    a, u, v = symbols_of([shape, shape, shape])
    ids = tuple(range(len(shape)))
    inner = Add(Einsum(a, u, in_axes=(ids, ids), out_axes=ids), Einsum(a, v, in_axes=(ids, ids), out_axes=ids))
    factored = add_rules.factor_add(inner)
    assert factored is not None and symbolic_equal(inner, factored)
    outer = Add(inner, u, u)
    flat = add_rules.flatten_add(outer)
    assert flat is not None and symbolic_equal(outer, flat)
    deduped = add_rules.dedupe_add_terms(flat)
    assert deduped is not None and symbolic_equal(flat, deduped)


@given(data=st.data())
@SETTINGS
def test_index_push_downs_are_exact(data):
    shape = data.draw(shapes(min_rank=1, max_rank=2, max_side=3))
    x, y = symbols_of([shape, shape[1:] or shape])
    kinds = {
        "einsum": Einsum(x, in_axes=(tuple(range(len(shape))),), out_axes=tuple(reversed(range(len(shape))))),
        "add": Add(x, y),
        "function": GeneralFunction("softmax", x),
        "rearrange": Rearrange(x, " ".join(f"a{i}" for i in range(len(shape))) + " -> "
                               + " ".join(f"a{i}" for i in reversed(range(len(shape))))),
    }
    kind = data.draw(st.sampled_from(sorted(kinds)))
    inner = kinds[kind]
    entries = data.draw(indices(inner.shape))
    node = Index(inner, entries)
    fired = 0
    for r in index_rules.PUSH_RULES:
        out = r(node)
        if out is not None:
            fired += 1
            assert symbolic_equal(node, out, interpret=False)
    selects_all = all(not isinstance(e, int) and np.array_equal(np.arange(n)[e], np.arange(n))
                      for e, n in zip(entries, inner.shape))
    if kind != "function" and not selects_all:
        assert fired == 1


def test_too_deep_for_sympy_is_a_clear_error():
    import sys

    from circuits import EvaluationError, GeneralFunction, Symbol

    c = Symbol((1,), name="x")
    for _ in range(sys.getrecursionlimit() + 500):
        c = GeneralFunction("tanh", c)
    with pytest.raises(EvaluationError, match="nested too deeply for sympy"):
        symbolic_equal(c, c)
