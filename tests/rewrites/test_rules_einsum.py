"""Einsum rules: each fires on generated inputs and keeps the value (float64); targeted
must-not-fire cases; axis renumbering and broadcasting checked against numpy."""

import numpy as np
from hypothesis import example, given
from hypothesis import strategies as st

from circuits import Add, Array, Einsum, Rearrange, Scalar, Symbol
from circuits.testing import einsum_specs, shapes
from rewrites.rules import (
    distribute,
    distribute_einsum_over_add,
    drop_einsum_ones,
    einsum_identity,
    einsum_permute_to_rearrange,
    einsum_zero,
    flatten_einsum,
    flatten_einsum_all,
    nest_einsum,
    nest_einsum_operands,
    rearrange_permute_to_einsum,
)

from .rewrite_helpers import RULE_SETTINGS, broadcast_shapes_of, einsums, fire, must_not_fire, operands


def arr(*shape, seed=0):
    return Array(np.random.default_rng(seed).uniform(0.5, 1.5, shape).astype(np.float32))


# ---------------------------------------------------------------------------- flatten / nest
@st.composite
def nested_einsums(draw):
    """An Einsum with one or more operands that are Einsums themselves."""
    spec = draw(einsum_specs(max_operands=3))
    kids = []
    for s in spec.input_shapes:
        if draw(st.booleans()):
            kids.append(draw(einsums(s)))
        else:
            kids.append(draw(operands(s)))
    if spec.input_shapes and not any(type(k) is Einsum for k in kids):
        kids[0] = draw(einsums(spec.input_shapes[0]))
    return Einsum(*kids, in_axes=spec.in_axes, out_axes=spec.out_axes)


@RULE_SETTINGS
@given(nested_einsums())
def test_flatten_einsum_fires_and_keeps_value(node):
    if not node.children:
        return
    everything = fire(flatten_einsum_all, node)
    merged = [g for c in node.children for g in (c.children if type(c) is Einsum else (c,))]
    assert list(everything.children) == merged and everything.out_axes == node.out_axes
    if any(type(c) is Einsum and c.name is None for c in node.children):
        out = fire(flatten_einsum, node)
        merged = [g for c in node.children for g in (c.children if type(c) is Einsum and c.name is None else (c,))]
        assert list(out.children) == merged and out.out_axes == node.out_axes
    else:
        must_not_fire(flatten_einsum, node)  # named Einsums stay


def test_flatten_einsum_diagonal_and_renumbering():
    m, u = arr(3, 4), arr(4, seed=1)
    child = Einsum.from_spec("bc,c->b", m, u)           # child's summed axis c clashes with nothing
    inner2 = Einsum.from_spec("ab,cb->ac", arr(3, 5, seed=2), arr(3, 5, seed=3))
    node = Einsum.from_spec("a,bb->ab", child, inner2)  # reads the diagonal of inner2
    out = flatten_einsum(node)
    assert out.spec == "ac,c,bd,bd->ab"
    want = np.einsum("a,bb->ab", np.einsum("bc,c->b", m.value, u.value),
                     np.einsum("ab,cb->ac", inner2.children[0].value, inner2.children[1].value))
    np.testing.assert_allclose(out.evaluate(dtype="float64"), want, rtol=1e-6)


def test_flatten_einsum_must_not_fire_past_52_axes():
    # two children each summing 30 axes: merged, they would need 60 ids (jnp.einsum takes 52)
    wide = Einsum(Array(np.ones((1,) * 30, np.float32)), in_axes=(tuple(range(30)),), out_axes=())
    must_not_fire(flatten_einsum, Einsum(wide, wide, in_axes=((), ()), out_axes=()))
    must_not_fire(flatten_einsum_all, Einsum(wide, wide, in_axes=((), ()), out_axes=()))
    assert flatten_einsum(Einsum(wide, in_axes=((),), out_axes=())) is not None
    must_not_fire(flatten_einsum, Einsum.from_spec("ab,b->a", arr(2, 3), arr(3)))


@RULE_SETTINGS
@given(st.data())
def test_nest_einsum_fires_and_keeps_value(data):
    node = data.draw(einsums(min_operands=3, max_operands=4))
    out = fire(nest_einsum, node)
    assert out.children[0].children == node.children[:2]
    k = len(node.children)
    picks = sorted(data.draw(st.lists(st.integers(0, k - 1), min_size=2, max_size=k - 1, unique=True)))
    nested = fire(nest_einsum_operands(picks), node)
    rest = [c for i, c in enumerate(node.children) if i not in picks]
    group = nested.children[picks[0]]
    assert type(group) is Einsum and list(group.children) == [node.children[p] for p in picks]
    assert list(nested.children) == rest[:picks[0]] + [group] + rest[picks[0]:]


def test_nest_einsum_must_not_fire():
    must_not_fire(nest_einsum, Einsum.from_spec("ab,b->a", arr(2, 3), arr(3)))
    must_not_fire(nest_einsum_operands([0, 1]), Einsum.from_spec("ab,b->a", arr(2, 3), arr(3)))


# ---------------------------------------------------------------------------- zeros and ones
@st.composite
def einsums_with(draw, value):
    """An Einsum where one operand (or an extra one over existing axes) is Scalar ``value``."""
    node = draw(einsums(min_operands=1))
    ids = sorted({a for t in node.in_axes for a in t})
    axes = tuple(draw(st.lists(st.sampled_from(ids), max_size=2))) if ids else ()
    sizes = node.axis_sizes()
    pos = draw(st.integers(0, len(node.children)))
    kids = list(node.children)
    in_axes = list(node.in_axes)
    kids.insert(pos, Scalar(value, tuple(sizes[a] for a in axes)))
    in_axes.insert(pos, axes)
    return Einsum(*kids, in_axes=in_axes, out_axes=node.out_axes)


@RULE_SETTINGS
@given(einsums_with(0.0))
def test_einsum_zero_fires_and_keeps_value(node):
    out = fire(einsum_zero, node)
    assert type(out) is Scalar and out.value == 0.0 and out.shape == node.shape


def test_einsum_zero_must_not_fire():
    must_not_fire(einsum_zero, Einsum.from_spec("ab,->a", arr(2, 3), Scalar(1e-30)))
    i = Array(np.arange(3))  # float64 Einsum (int64 with float32): a float32 Scalar would change dtype
    must_not_fire(einsum_zero, Einsum.from_spec("a,->a", i, Scalar(0.0)))


@RULE_SETTINGS
@given(einsums_with(1.0))
@example(Einsum.from_spec(",abc->abc", Scalar(1.0), Einsum.from_spec("abc->abc", Scalar(1.0, (1, 1, 1)))))
def test_drop_einsum_ones_fires_and_keeps_value(node):
    out = fire(drop_einsum_ones, node)

    def ones(kids):
        return [c == Scalar(1.0, c.shape) for c in kids]

    if out in node.children:  # one operand was left and it copied its input: the Einsum is that operand
        kept = node.children.index(out)
        assert all(one for i, one in enumerate(ones(node.children)) if i != kept)
    else:
        assert type(out) is Einsum and sum(ones(out.children)) < sum(ones(node.children))


def test_drop_einsum_ones_must_not_fire():
    # the 1 carries an axis nothing else has: summing over it multiplies by 3
    must_not_fire(drop_einsum_ones, Einsum.from_spec("a,b->a", arr(2), Scalar(1.0, (3,))))
    # or an output axis
    must_not_fire(drop_einsum_ones, Einsum.from_spec("a,b->ab", arr(2), Scalar(1.0, (3,))))
    must_not_fire(drop_einsum_ones, Einsum.from_spec("a,->a", arr(2), Scalar(2.0)))


@RULE_SETTINGS
@given(shapes(max_rank=4, max_side=3).flatmap(operands))
def test_einsum_identity_fires_and_keeps_value(x):
    ids = tuple(range(x.ndim))
    out = fire(einsum_identity, Einsum(x, in_axes=(ids,), out_axes=ids))
    assert out == x  # the Einsum had no name to hand on


def test_einsum_identity_must_not_fire():
    must_not_fire(einsum_identity, Einsum.from_spec("ab->ba", arr(2, 3)))
    must_not_fire(einsum_identity, Einsum.from_spec("aa->a", arr(3, 3)))
    must_not_fire(einsum_identity, Einsum.from_spec("ab->a", arr(2, 3)))


# ---------------------------------------------------------------------------- distribute
@st.composite
def einsums_over_add(draw):
    spec = draw(einsum_specs(max_operands=3).filter(lambda s: len(s.input_shapes) >= 1))
    k = draw(st.integers(0, len(spec.input_shapes) - 1))
    kids = [draw(operands(s)) for s in spec.input_shapes]
    target = spec.input_shapes[k]
    terms = [draw(operands(target))] + [draw(operands(draw(broadcast_shapes_of(target))))
                                        for _ in range(draw(st.integers(1, 3)))]
    kids[k] = Add(*draw(st.permutations(terms)))
    return Einsum(*kids, in_axes=spec.in_axes, out_axes=spec.out_axes), k


@RULE_SETTINGS
@given(einsums_over_add(), st.data())
def test_distribute_fires_and_keeps_value(case, data):
    node, k = case
    out = fire(distribute(operand=k), node)
    assert type(out) is Add and len(out.children) == len(node.children[k].children)
    n = len(node.children[k].children)
    picks = data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=n - 1, unique=True))
    partial = fire(distribute(operand=k, terms=picks), node)
    assert len(partial.children) == len(picks) + 1


def test_distribute_einsum_over_add_broadcast_exact():
    x, y = arr(2, 3), arr(3, seed=1)
    node = Einsum.from_spec("ab->b", Add(x, y))   # y broadcasts along a, which is summed: 2·y
    out = distribute_einsum_over_add(node)
    np.testing.assert_allclose(out.evaluate(dtype="float64"), x.value.sum(0) + 2 * y.value, rtol=1e-6)
    z = arr(1, 3, seed=2)                          # a size-1 axis broadcast by the Add
    node = Einsum.from_spec("ab,ab->a", Add(x, z), arr(2, 3, seed=3))
    w = node.children[1].value
    want = np.einsum("ab,ab->a", x.value + z.value, w)
    np.testing.assert_allclose(distribute_einsum_over_add(node).evaluate(dtype="float64"), want, rtol=1e-6)


def test_distribute_must_not_fire():
    must_not_fire(distribute_einsum_over_add, Einsum.from_spec("ab,b->a", arr(2, 3), arr(3)))
    must_not_fire(distribute(operand=0), Einsum.from_spec("ab,b->a", arr(2, 3), Add(arr(3), arr(3, seed=1))))
    must_not_fire(distribute_einsum_over_add, Einsum.from_spec("a->a", Add(arr(2))))  # one term


# ---------------------------------------------------------------------------- Einsum <-> Rearrange
@RULE_SETTINGS
@given(shapes(min_rank=2, max_rank=4, max_side=3).flatmap(
    lambda s: st.tuples(operands(s), st.permutations(range(len(s))))))
def test_einsum_permute_to_rearrange_and_back(case):
    x, perm = case
    ids = tuple(range(x.ndim))
    node = Einsum(x, in_axes=(ids,), out_axes=tuple(perm))
    if tuple(perm) == ids:
        must_not_fire(einsum_permute_to_rearrange, node)
        return
    rearranged = fire(einsum_permute_to_rearrange, node)
    assert type(rearranged) is Rearrange
    back = fire(rearrange_permute_to_einsum, rearranged)
    assert back.out_axes == node.out_axes and back.children == node.children


def test_permute_rules_must_not_fire():
    must_not_fire(einsum_permute_to_rearrange, Einsum.from_spec("ab->a", arr(2, 3)))
    must_not_fire(einsum_permute_to_rearrange, Einsum.from_spec("aa->a", arr(3, 3)))
    must_not_fire(rearrange_permute_to_einsum, Rearrange(arr(6), "(a b) -> b a", a=2))
    must_not_fire(rearrange_permute_to_einsum, Rearrange(arr(2), "a -> a b", b=3))
    s = Symbol((2, 3), name="s")
    assert rearrange_permute_to_einsum(Rearrange(s, "h s -> s h")).spec == "ab->ba"
