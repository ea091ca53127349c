"""Rearrange rules: fuse a Rearrange of a Rearrange into one, drop identity Rearranges.

Two rearranges compose when, for every axis between them, the way the inner one builds it
(a product of its names, row-major) and the way the outer one splits it have a common
refinement: cutting the axis at every boundary of either gives pieces each name is a run of.
``(a b)`` with a=2, b=6 read back as ``(c d)`` with c=4, d=3 refines to pieces 2, 2, 3; a=4,
b=3 read as c=3, d=4 has none, and the rule does not apply.

>>> from circuits import Rearrange, Symbol
>>> x = Symbol((6, 5), name='x')
>>> fuse_rearrange_rearrange(Rearrange(Rearrange(x, '(h d) s -> h s d', h=2), 'h s d -> s (h d)')).payload_text()
'(a b) c -> c (a b) b=3'
"""

from __future__ import annotations

from circuits.nodes import Rearrange

from ..engine import RuleSet, rule


def _refine(left, right):
    """Common refinement of two factorisations of one axis (lists of (name, size), sizes > 1),
    as lists of piece ids per name on each side and the piece sizes; None if there is none."""
    pieces: list[int] = []
    lmap = {name: [] for name, _ in left}
    rmap = {name: [] for name, _ in right}
    i = j = 0
    lrem = left[0][1] if left else 1
    rrem = right[0][1] if right else 1
    while i < len(left) and j < len(right):
        small, big = min(lrem, rrem), max(lrem, rrem)
        if big % small:
            return None
        pieces.append(small)
        lmap[left[i][0]].append(len(pieces) - 1)
        rmap[right[j][0]].append(len(pieces) - 1)
        lrem //= small
        rrem //= small
        if lrem == 1:
            i += 1
            lrem = left[i][1] if i < len(left) else 1
        if rrem == 1:
            j += 1
            rrem = right[j][1] if j < len(right) else 1
    if i != len(left) or j != len(right):
        return None
    return lmap, rmap, pieces


def _piece_name(k: int) -> str:
    letters = "abcdefghijklmnopqrstuvwxyz"
    return letters[k] if k < 26 else f"x{k}"


@rule(on=Rearrange, example=(
    "'y' Rearrange a (b c) -> (a b) c c=2\n  'r' Rearrange a b c -> a (b c)\n    'x' [2,3,2] Symbol",
    "'y' Rearrange a b c -> (a b) c\n  'x' [2,3,2] Symbol",
))
def fuse_rearrange_rearrange(node):
    """A Rearrange of a Rearrange is one Rearrange (when the axes between them refine; names are
    renumbered a, b, c, ... in order of appearance)."""
    inner = node.children[0]
    if not isinstance(inner, Rearrange):
        return None
    s1, s2 = inner.axis_sizes(), node.axis_sizes()
    if any(v == 0 for v in (*s1.values(), *s2.values())):
        return None
    # Pieces: ids of the common refinement of every intermediate axis, plus new (repeated)
    # axes of the outer rearrange.  Each name maps to its run of pieces; size-1 names to none.
    inner_pieces: dict[str, list[int]] = {a: [] for a in s1}
    outer_pieces: dict[str, list[int]] = {a: [] for a in s2}
    sizes: list[int] = []
    for g1, g2 in zip(inner.out_groups, node.in_groups):
        left = [(a, s1[a]) for a in g1 if s1[a] != 1]
        right = [(a, s2[a]) for a in g2 if s2[a] != 1]
        found = _refine(left, right)
        if found is None:
            return None
        lmap, rmap, piece_sizes = found
        base = len(sizes)
        sizes.extend(piece_sizes)
        for a, ids in lmap.items():
            inner_pieces[a] = [base + k for k in ids]
        for a, ids in rmap.items():
            outer_pieces[a] = [base + k for k in ids]
    outer_in = {a for g in node.in_groups for a in g}
    for g in node.out_groups:
        for a in g:
            if a not in outer_in and s2[a] != 1:
                outer_pieces[a] = [len(sizes)]
                sizes.append(s2[a])
    new_ins = [[p for a in g for p in inner_pieces[a]] for g in inner.in_groups]
    new_outs = [[p for a in g for p in outer_pieces[a]] for g in node.out_groups]
    # Name pieces in order of appearance (left, then new axes on the right) and give the sizes
    # the spec cannot infer: all but one of each split group, and every new axis.
    order: dict[int, str] = {}
    for g in new_ins + new_outs:
        for p in g:
            order.setdefault(p, _piece_name(len(order)))
    given = {}
    for g in new_ins:
        for p in g[1:]:
            given[order[p]] = sizes[p]
    on_left = {p for g in new_ins for p in g}
    for g in new_outs:
        for p in g:
            if p not in on_left:
                given[order[p]] = sizes[p]
    spec = (tuple(tuple(order[p] for p in g) for g in new_ins),
            tuple(tuple(order[p] for p in g) for g in new_outs))
    return Rearrange(inner.children[0], spec, **given)


@rule(on=Rearrange, example=("'y' Rearrange a b -> a b\n  'x' [2,3] Symbol", "'x' [2,3] Symbol"))
def remove_identity_rearrange(node):
    """A Rearrange that moves no element (its shape is its child's and the non-unit axes keep
    their order, with no repeats) is its child."""
    x = node.children[0]
    if node.shape != x.shape:
        return None
    sizes = node.axis_sizes()
    left = [a for g in node.in_groups for a in g if sizes[a] != 1]
    right = [a for g in node.out_groups for a in g if sizes[a] != 1]
    return x if left == right else None


RULES = RuleSet(remove_identity_rearrange, fuse_rearrange_rearrange, name="rearrange")
