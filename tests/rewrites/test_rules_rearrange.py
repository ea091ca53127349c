"""Rearrange rules: fusing two Rearranges fires exactly when the axes between them refine, and
keeps the value; identity Rearranges are recognised by what they do to the elements."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from circuits import Array, Rearrange, Symbol
from circuits.backend.symbolic import symbolic_equal
from circuits.testing import rearrange_specs, shapes
from rewrites.rules.rearrange import fuse_rearrange_rearrange, remove_identity_rearrange

from .rewrite_helpers import RULE_SETTINGS, fire, must_not_fire, operands, value64


def strides(sizes) -> set[int]:
    """Row-major strides of a factorisation, plus the total: where the axis can be cut."""
    return {math.prod(sizes[i:]) for i in range(len(sizes) + 1)}


def refines(inner: Rearrange, outer: Rearrange) -> bool:
    """Whether every axis between two rearranges has a common refinement: the cut points of both
    factorisations, sorted, form a divisibility chain."""
    s1, s2 = inner.axis_sizes(), outer.axis_sizes()
    for g1, g2 in zip(inner.out_groups, outer.in_groups):
        cuts = sorted(strides([s1[a] for a in g1]) | strides([s2[a] for a in g2]))
        if any(b % a for a, b in zip(cuts, cuts[1:])):
            return False
    return True


@st.composite
def rearrange_pairs(draw):
    shape = draw(shapes(min_rank=1, max_rank=3))
    first = draw(rearrange_specs(shape))
    inner = Rearrange(draw(operands(shape)), first.spec, **first.sizes)
    second = draw(rearrange_specs(first.shape))
    return Rearrange(inner, second.spec, **second.sizes)


@given(node=rearrange_pairs())
@RULE_SETTINGS
def test_fuse_rearrange_rearrange_fires_when_the_axes_refine(node):
    if refines(node.children[0], node):
        out = fire(fuse_rearrange_rearrange, node)
        assert isinstance(out, Rearrange) and not isinstance(out.children[0], Rearrange)
    else:
        must_not_fire(fuse_rearrange_rearrange, node)


@given(shape=shapes(min_rank=1, max_rank=3), data=st.data())
@RULE_SETTINGS
def test_fuse_rearrange_rearrange_always_fires_without_splits(shape, data):
    # An outer rearrange that reads each axis whole (permute, merge, repeat) always composes.
    first = data.draw(rearrange_specs(shape))
    names = [f"n{i}" for i in range(len(first.shape))]
    order = data.draw(st.permutations(names))
    cut = data.draw(st.integers(0, len(order)))
    merged = order[:cut]
    out_groups = (["(" + " ".join(merged) + ")"] if merged else []) + order[cut:]
    node = Rearrange(Rearrange(Array(np.arange(math.prod(shape), dtype=np.float32).reshape(shape)),
                               first.spec, **first.sizes),
                     " ".join(names) + " -> " + " ".join(out_groups) + " r", r=2)
    out = fire(fuse_rearrange_rearrange, node)
    assert not isinstance(out.children[0], Rearrange)


def test_fuse_rearrange_rearrange_cases():
    x = Array(np.arange(60.0).reshape(6, 10))
    # split then merge differently: (a b) with a=2, b=6 read back as (c d) with c=4, d=3
    node = Rearrange(Rearrange(Array(np.arange(12.0)), "(a b) -> a b", a=2), "a b -> (a b)")
    out = fire(fuse_rearrange_rearrange, node)
    assert out.payload_text() == "(a b) -> (a b) b=6"
    node = Rearrange(Rearrange(x, "(h d) s -> h s d", h=2), "h s d -> s (h d)")
    assert fire(fuse_rearrange_rearrange, node).payload_text() == "(a b) c -> c (a b) b=3"
    y = Array(np.arange(12.0).reshape(2, 6))
    node = Rearrange(Rearrange(y, "a b -> (a b)"), "(c d) -> d c", c=4)
    out = fire(fuse_rearrange_rearrange, node)
    assert out.payload_text() == "a (b c) -> c (a b) c=3"
    assert symbolic_equal(node, out)


def test_fuse_rearrange_rearrange_does_not_fire_without_refinement():
    y = Symbol((4, 3), name="y")
    node = Rearrange(Rearrange(y, "a b -> (a b)"), "(c d) -> c d", c=3)
    must_not_fire(fuse_rearrange_rearrange, node)
    must_not_fire(fuse_rearrange_rearrange, Rearrange(y, "a b -> b a"))


@given(shape=shapes(min_rank=0, max_rank=3), data=st.data())
@RULE_SETTINGS
def test_remove_identity_rearrange_matches_what_it_does(shape, data):
    spec = data.draw(rearrange_specs(shape))
    labels = np.arange(math.prod(shape), dtype=np.float32).reshape(shape)
    node = Rearrange(Array(labels), spec.spec, **spec.sizes)
    moves_nothing = node.shape == labels.shape and np.array_equal(value64(node), labels)
    if moves_nothing:
        assert fire(remove_identity_rearrange, node) is node.children[0]
    else:
        must_not_fire(remove_identity_rearrange, node)
