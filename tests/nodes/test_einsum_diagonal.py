"""Einsums with a repeated output axis (``ab->abaa``: rust_circuit's way to write a diagonal):
shape, text, value against a loop-by-loop numpy reference, the sympy form, gradients, and the
rewrites, which leave such an einsum alone and keep every circuit's value around it."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import circuits as C
import rewrites
from circuits import Array, Einsum, parse
from circuits.backend.symbolic import symbolic_evaluate


def reference(spec, *xs):
    """The einsum by its definition: every assignment of the letters adds the product of the
    operands' entries to the output cell those letters name (so a repeated output letter only
    reaches diagonal cells)."""
    lhs, out = spec.split("->")
    terms = lhs.split(",") if lhs else []
    sizes = {}
    for t, x in zip(terms, xs):
        sizes.update(zip(t, x.shape))
    letters = sorted(sizes)
    result = np.zeros([sizes[c] for c in out])
    for values in itertools.product(*[range(sizes[c]) for c in letters]):
        env = dict(zip(letters, values))
        product = 1.0
        for t, x in zip(terms, xs):
            product *= x[tuple(env[c] for c in t)]
        result[tuple(env[c] for c in out)] += product
    return result


SPECS = [
    ("ab->abaa", [(2, 3)]),
    ("ab->aa", [(3, 2)]),
    ("a->aaa", [(3,)]),
    ("ab,bc->aca", [(2, 3), (3, 2)]),
    ("aa,bcda->aa", [(2, 2), (3, 2, 2, 2)]),  # rust's test_rust_rewrite text: aa read and written
    ("ab,b->bab", [(2, 3), (3,)]),
    ("abc->cbcb", [(2, 3, 2)]),
]


@pytest.mark.parametrize("spec,shapes", SPECS)
def test_values_match_the_definition(spec, shapes):
    rng = np.random.default_rng(len(spec))
    xs = [rng.normal(size=s) for s in shapes]
    e = Einsum.from_spec(spec, *[Array(x) for x in xs])
    want = reference(spec, *xs)
    assert e.shape == want.shape and e.writes_diagonal
    np.testing.assert_allclose(C.evaluate(e, dtype="float64"), want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(C.compile(e, dtype="float64")(), want, rtol=1e-12, atol=1e-12)
    assert parse(e.to_text(), store=C.testing.store_of(e)) == e


def test_text_hash_and_errors():
    x = C.Symbol((2, 3), name="x")
    specs = ["ab->aab", "ab->aba", "ab->ab", "ab->abb"]
    nodes = [Einsum.from_spec(s, x) for s in specs]
    assert len({n.hash for n in nodes}) == len(specs)  # the repeat's place is part of the node
    assert [n.spec for n in nodes] == specs
    assert [n.writes_diagonal for n in nodes] == [True, True, False, True]
    # a repeated axis still has one size: the children must agree on it
    with pytest.raises(C.errors.ShapeError, match="axis a has size 2 in one place and 3"):
        Einsum.from_spec("ab,a->aa", x, C.Symbol((3,)))
    c = parse("'d' Einsum fancy: row col -> row col row\n  'x' [2,3] Symbol")
    assert c.shape == (2, 3, 2) and c.spec == "ab->aba"


def test_sympy_form_writes_the_diagonal():
    x = C.Symbol((2, 3), name="x")
    sym_x = symbolic_evaluate(x)
    got = symbolic_evaluate(Einsum.from_spec("ab->aba", x))
    assert got.shape == (2, 3, 2)
    for a, b, c in itertools.product(range(2), range(3), range(2)):
        assert got[a, b, c] == (sym_x[a, b] if a == c else 0)


def test_gradient_flows_to_the_diagonal_only():
    w = np.arange(6.0).reshape(2, 3)
    weights = np.random.default_rng(1).normal(size=(2, 3, 2))
    x = Array(w, name="x")
    loss = Einsum.from_spec("abc,abc->", Einsum.from_spec("ab->aba", x), Array(weights, name="w"))
    g = C.grad(loss, x, dtype="float64")
    want = np.stack([weights[a, :, a] for a in range(2)])
    np.testing.assert_allclose(np.asarray(g), want, rtol=1e-12)


RUST_REWRITE_TEXT = """
'outer' Add
  'Ein' Einsum ab->abaa
    'zero' [3,3] Array rand
  'b' [3,3,3,3] Array rand
'idx' Index [1:,0,:,2]
  'outer'
'r' Rearrange a b c d -> (a b) c d
  'Ein'
'f' GeneralFunction sigmoid
  'Ein2' Einsum aa,bcda->aa
    'sq' [2,2] Array rand
    'cube' [3,5,5,2] Array rand
'sum' Einsum abcd,abcd->ac
  'Ein'
  'b'
"""


def test_rewrites_keep_values_around_a_diagonal_einsum():
    roots = C.parse_many(RUST_REWRITE_TEXT)
    for root in roots:
        want = C.evaluate(root, dtype="float64")
        for rewrite in (rewrites.simp, rewrites.optimize):
            got = C.evaluate(rewrite(root), dtype="float64")
            np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)


def test_rusts_printing_demo_prints_as_rust_asserts():
    # rust_circuit's demos/printing_parsing.py asserts circuit.repr() is this text
    text = """'einy' Einsum ab,bc->aa
  'scalar1' [2,3] Scalar 1
  'scalar2 rearrange' Rearrange a b -> b a
    'scalar2' [4,3] Scalar 2"""
    c = parse(text)
    assert c.to_text() == text and c.shape == (2, 2)
    np.testing.assert_allclose(C.evaluate(c), reference("ab,bc->aa", np.ones((2, 3)), np.full((3, 4), 2.0)))


PARENTS = [
    lambda d, y: Einsum.from_spec("ab,b->a", d, y),
    lambda d, y: Einsum.from_spec("ab,a->ba", d, y),
    lambda d, y: C.Add(d, y),
    lambda d, y: C.Index(d, (slice(1, None), 0)),
    lambda d, y: C.Rearrange(d, "a b -> b a"),
    lambda d, y: C.GeneralFunction("tanh", Einsum.from_spec("ab->a", d)),
    lambda d, y: C.Concat(d, Einsum.from_spec("a,b->ab", y, y), axis=0),
]


@settings(max_examples=20, deadline=None)
@given(data=st.data())
def test_rewrites_keep_the_value_of_random_circuits_around_a_diagonal(data):
    """Oracle: the circuit's own value; the diagonal einsum sits between two random circuits."""
    from circuits.testing import CLOSED_TYPES, dags

    inner = data.draw(dags(shape=(3,), types=CLOSED_TYPES, max_nodes=8, max_depth=3))
    other = data.draw(dags(shape=(3,), types=CLOSED_TYPES, max_nodes=8, max_depth=3))
    spec = data.draw(st.sampled_from(["a->aa", "a->aa", "b->bb"]))
    parent = data.draw(st.sampled_from(PARENTS))
    root = parent(Einsum.from_spec(spec, inner), other)
    want = C.evaluate(root, dtype="float64")
    for rewrite in (rewrites.simp, rewrites.optimize):
        got = C.evaluate(rewrite(root), dtype="float64")
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-9, equal_nan=True)
