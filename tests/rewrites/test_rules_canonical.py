"""Canonical forms: idempotent, value-preserving, and equal for circuits that differ only in
operand order or einsum letters."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from circuits import Add, Einsum, Scalar, Symbol
from circuits.testing import circuits_with_inputs, einsum_specs
from circuits.traversal import toposort
from rewrites import check
from rewrites.rules.canonical import canonicalize, canonicalize_einsum, renumber_axes, sort_add_terms

from .rewrite_helpers import RULE_SETTINGS, assert_same, fire, must_not_fire, operands


@given(case=circuits_with_inputs(max_nodes=12))
@RULE_SETTINGS
def test_canonicalize_is_idempotent_and_keeps_the_value(case):
    circuit, inputs = case
    once = canonicalize(circuit)
    check(once)
    assert canonicalize(once) is once
    assert once.shape == circuit.shape and once.dtype == circuit.dtype
    assert_same(circuit, once, inputs)
    for node in toposort(once):
        if isinstance(node, (Add, Einsum)):
            keys = [(c.structure_hash, c.hash) for c in node.children]
            assert keys == sorted(keys)
        if isinstance(node, Einsum):
            seen = list(dict.fromkeys(a for axes in node.in_axes for a in axes))
            assert seen == list(range(len(seen)))


@given(shape=st.tuples(st.integers(1, 3), st.integers(1, 3)), data=st.data())
@RULE_SETTINGS
def test_sort_add_terms_makes_order_irrelevant(shape, data):
    terms = [data.draw(operands(shape)) for _ in range(data.draw(st.integers(2, 4)))]
    shuffled = data.draw(st.permutations(terms))
    a, b = Add(*terms), Add(*shuffled)
    assert canonicalize(a) == canonicalize(b)
    keys = [(t.structure_hash, t.hash) for t in shuffled]
    if keys != sorted(keys):
        out = fire(sort_add_terms, b)
        assert sorted(out.children, key=lambda t: (t.structure_hash, t.hash)) == list(out.children)
    else:
        must_not_fire(sort_add_terms, b)


@given(spec=einsum_specs(max_operands=3).filter(lambda s: len(s.input_shapes) >= 1), data=st.data())
@RULE_SETTINGS
def test_canonicalize_einsum_ignores_operand_order_and_letters(spec, data):
    kids = [data.draw(operands(s)) for s in spec.input_shapes]
    node = Einsum(*kids, in_axes=spec.in_axes, out_axes=spec.out_axes)
    # The same einsum with operands shuffled and axis ids relabelled.
    perm = data.draw(st.permutations(range(len(kids))))
    ids = sorted({a for t in spec.in_axes for a in t})
    new_ids = data.draw(st.lists(st.integers(0, 51), min_size=len(ids), max_size=len(ids), unique=True))
    relabel = dict(zip(ids, new_ids))
    other = Einsum(*[kids[i] for i in perm], in_axes=[tuple(relabel[a] for a in spec.in_axes[i]) for i in perm],
                   out_axes=[relabel[a] for a in spec.out_axes])
    assert canonicalize(node) == canonicalize(other)
    keys = [(c.structure_hash, c.hash) for c in other.children]
    first_seen = list(dict.fromkeys(a for axes in other.in_axes for a in axes))
    if keys != sorted(keys) or first_seen != list(range(len(first_seen))):
        fire(canonicalize_einsum, other)
    else:
        must_not_fire(canonicalize_einsum, other)


def test_renumber_axes_and_rules_do_not_fire_on_canonical_nodes():
    assert renumber_axes(((5, 5, 2), (), (2, 9)), (9, 5)) == (((0, 0, 1), (), (1, 2)), (2, 0))
    x, y = Symbol((2, 3), name="x"), Symbol((3, 2), name="y")
    canon_sum = canonicalize(Add(x, x, Einsum.from_spec("ab->ba", y)))
    must_not_fire(sort_add_terms, canon_sum)
    canon = canonicalize(Einsum.from_spec("ab,bc->ac", x, y))
    must_not_fire(canonicalize_einsum, canon)
    # Equal structures under different names still get one order (the full hash breaks the tie),
    # and canonicalizing keeps every node's own name.
    x2 = x.rename("x2")
    assert canonicalize(Add(x, x2, name="s")) == canonicalize(Add(x2, x, name="s"))
    assert canonicalize(Add(x2, x, name="s")).name == "s"


def test_canonicalize_einsum_over_one_node_twice_is_order_independent():
    # The same operand twice ties in the sort; the axis specs still must land in one order.
    x = Scalar(1.0, (1, 1))
    a = Einsum(x, x, in_axes=((0, 1), (2, 3)), out_axes=(0, 1, 2))
    b = Einsum(x, x, in_axes=((2, 3), (0, 1)), out_axes=(0, 1, 2))
    assert canonicalize(a) == canonicalize(b)
