"""Canonical forms: operand order of Add and Einsum, Einsum axis ids.

Two circuits that differ only in the order of a sum's terms, of an einsum's operands, or in the
letters an einsum uses become the same circuit (same hash) after ``canonicalize``.  Children are
ordered by their name-blind structure hash (then their full hash, so the order is total), and
einsum axis ids are renumbered 0, 1, 2, ... in order of first appearance.  The forms are
idempotent: ``canonicalize(canonicalize(c)) == canonicalize(c)``.

>>> from circuits import Einsum, Symbol
>>> a, b = Symbol((2, 3), name='a'), Symbol((3, 4), name='b')
>>> canonicalize(Einsum.from_spec('xy,yz->xz', a, b)) == canonicalize(Einsum.from_spec('yz,xy->xz', b, a))
True
"""

from __future__ import annotations

import itertools
import math

from circuits.nodes import Add, Circuit, Einsum

from ..engine import RuleSet, rule
from ..strategies import apply, bottom_up


def _order_key(node: Circuit):
    return (node.structure_hash, node.hash)


def _sorted_positions(children) -> list[int]:
    return sorted(range(len(children)), key=lambda i: _order_key(children[i]))


@rule(on=Add, example=(
    "'s' Add\n  'y' [2] Symbol\n  'x' [2] Symbol",
    "'s' Add\n  'x' [2] Symbol\n  'y' [2] Symbol",
))
def sort_add_terms(node):
    """Order an Add's terms by structure hash (a sum does not depend on the order of its terms,
    broadcasting included)."""
    order = _sorted_positions(node.children)
    if order == list(range(len(order))):
        return None
    return Add(*[node.children[i] for i in order], name=node.name)


def renumber_axes(in_axes, out_axes):
    """Axis ids renumbered 0, 1, 2, ... in order of first appearance in the operands.

    >>> renumber_axes(((7, 3), (3, 9)), (7, 9))
    (((0, 1), (1, 2)), (0, 2))
    """
    ids: dict[int, int] = {}
    for axes in in_axes:
        for a in axes:
            ids.setdefault(a, len(ids))
    return tuple(tuple(ids[a] for a in axes) for axes in in_axes), tuple(ids[a] for a in out_axes)


# Operands that are the same node tie in the sort; which of their axis specs comes first still
# changes the renumbered spec.  Ties are broken by trying the orders within each tie group and
# keeping the smallest renumbered spec, up to this many candidates (beyond it, a rare Einsum of
# many copies of one node, the stable order is kept and the form may depend on the input order).
MAX_TIE_ORDERS = 720


def _einsum_order(node) -> list[int]:
    order = _sorted_positions(node.children)
    groups, start = [], 0
    for k in range(1, len(order) + 1):
        if k == len(order) or node.children[order[k]] is not node.children[order[start]]:
            if k - start > 1:
                groups.append((start, k))
            start = k
    if not groups or math.prod(math.factorial(b - a) for a, b in groups) > MAX_TIE_ORDERS:
        return order
    best = None
    for choice in itertools.product(*[itertools.permutations(order[a:b]) for a, b in groups]):
        candidate = list(order)
        for (a, b), perm in zip(groups, choice):
            candidate[a:b] = perm
        spec = renumber_axes([node.in_axes[i] for i in candidate], node.out_axes)
        if best is None or spec < best[0]:
            best = (spec, candidate)
    return best[1]


@rule(on=Einsum, example=(
    "'p' Einsum yz,xy->xz\n  'b' [3,4] Symbol\n  'a' [2,3] Symbol",
    "'p' Einsum ab,bc->ac\n  'a' [2,3] Symbol\n  'b' [3,4] Symbol",
))
def canonicalize_einsum(node):
    """Order an Einsum's operands by structure hash (their axis specs move with them), then
    renumber axis ids in order of first appearance."""
    order = _einsum_order(node)
    in_axes, out_axes = renumber_axes([node.in_axes[i] for i in order], node.out_axes)
    if order == list(range(len(order))) and in_axes == node.in_axes and out_axes == node.out_axes:
        return None
    return Einsum(*[node.children[i] for i in order], in_axes=in_axes, out_axes=out_axes, name=node.name)


RULES = RuleSet(sort_add_terms, canonicalize_einsum, name="canonical")


def canonicalize(circuit: Circuit) -> Circuit:
    """``circuit`` with every Add and Einsum in canonical form (one bottom-up pass suffices:
    a node is put in order after its children are, and reordering never changes a child).

    >>> from circuits import Add, Symbol
    >>> x, y = Symbol((2,), name='x'), Symbol((2,), name='y')
    >>> canonicalize(Add(x, y)) == canonicalize(Add(y, x))
    True
    """

    return apply(bottom_up(RULES), circuit)
