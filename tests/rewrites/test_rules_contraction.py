"""Contraction order: an Einsum of three or more operands becomes a tree of pairwise Einsums of
the same value, in the order opt_einsum finds cheapest."""

from __future__ import annotations

import numpy as np
import opt_einsum
from hypothesis import given

from circuits import Array, Einsum, Scalar, Symbol
from circuits.backend.symbolic import symbolic_equal
from circuits.traversal import toposort
from rewrites.rules.contraction import contraction_order

from .rewrite_helpers import RULE_SETTINGS, einsums, fire, must_not_fire, value64


def new_einsums(before, after):
    old = set(toposort(before))
    return [n for n in toposort(after) if isinstance(n, Einsum) and n not in old]


@given(node=einsums(min_operands=3, max_operands=4))
@RULE_SETTINGS
def test_contraction_order_fires_and_keeps_the_value(node):
    out = fire(contraction_order, node)
    created = new_einsums(node, out)
    assert created and all(len(e.children) <= 2 for e in created)
    # Counted as a tree (equal intermediates are one node, so count uses, not nodes): one
    # pairwise step per operand but one.
    steps, stack, fresh = 0, [out], set(created)
    while stack:
        n = stack.pop()
        if n in fresh:
            steps += 1
            stack.extend(n.children)
    assert steps == len(node.children) - 1


def test_contraction_order_picks_the_cheap_order():
    # (x (w v)) costs 3*40*50 + 2*30*40... far less than ((x w) v) over the big middle axis.
    x, w, v = Symbol((2, 30), name="x"), Symbol((30, 40), name="w"), Symbol((40,), name="v")
    out = contraction_order(Einsum.from_spec("ab,bc,c->a", x, w, v))
    assert out.payload_text() == "ab,b->a" and out.children[1].payload_text() == "bc,c->b"
    # the seed's attention scores: q, k, a scalar and the mask
    q, k = Symbol((5, 3), name="q"), Symbol((5, 3), name="k")
    s, m = Scalar(0.5), Symbol((5, 5), name="mask")
    node = Einsum.from_spec("qc,kc,,qk->qk", q, k, s, m)
    out = contraction_order(node)
    assert symbolic_equal(node, out)
    _, info = opt_einsum.contract_path("qc,kc,,qk->qk", q.shape, k.shape, (), m.shape, shapes=True)
    assert len(new_einsums(node, out)) == len(info.contraction_list)


def test_contraction_order_diagonals_and_full_sums_are_exact():
    a = Array(np.arange(9.0).reshape(3, 3))
    b = Array(np.arange(6.0).reshape(3, 2))
    c = Array(np.arange(2.0) + 1)
    node = Einsum.from_spec("aa,ab,b->", a, b, c)
    out = fire(contraction_order, node)
    want = np.einsum("aa,ab,b->", a.numpy(), b.numpy(), c.numpy())
    np.testing.assert_allclose(value64(out), want)


def test_contraction_order_does_not_fire_on_pairs():
    x, w = Symbol((2, 3), name="x"), Symbol((3, 4), name="w")
    must_not_fire(contraction_order, Einsum.from_spec("ab,bc->ac", x, w))
    must_not_fire(contraction_order, Einsum.from_spec("ab->b", x))
    must_not_fire(contraction_order, Einsum.from_spec("->"))



def test_intermediates_keep_the_outputs_axis_order():
    """Attention scores ``qc,kc,,qk->qk`` (the seed's shapes): the pairwise product of queries
    and keys comes out ``[q, k]`` like the output, not ``[k, q]`` (which the backend would
    transpose back, per head: optimize made the seed slower than compile that way)."""
    from circuits import evaluate

    rng = np.random.default_rng(0)
    q, k = rng.standard_normal((300, 32)), rng.standard_normal((300, 32))
    mask = np.tril(np.ones((300, 300)))
    scores = Einsum.from_spec("qc,kc,,qk->qk", Array(q, name="q"), Array(k, name="k"), Scalar(0.125),
                              Array(mask, name="mask"), name="scores")
    nested = contraction_order.fn(scores)
    (product,) = [n for n in toposort(nested) if isinstance(n, Einsum) and n.shape == (300, 300)
                  and n is not nested and "mask" not in [c.name for c in n.children]]
    np.testing.assert_allclose(evaluate(product, dtype="float64"), 0.125 * q @ k.T, rtol=1e-12)  # not its transpose
    np.testing.assert_allclose(evaluate(nested, dtype="float64"), 0.125 * (q @ k.T) * mask, rtol=1e-12)
