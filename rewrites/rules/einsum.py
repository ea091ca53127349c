"""Rules for Einsum: flatten and nest, zero and one operands, identity permutations, distributing
over an Add, and the Einsum-permutation <-> Rearrange pair.

Axis ids of merged Einsums are renumbered: the parent keeps its ids, a child's output ids become
the parent's ids for that operand (a repeated parent id reads a diagonal, which substitutes
exactly), and the child's summed ids take the smallest ids not yet used.
"""

from __future__ import annotations

from circuits.nodes import Add, Einsum, Rearrange, Scalar
from circuits.nodes.einsum import axis_letter

from ..engine import Rule, RuleSet, rule
from ._common import einsum_fits, fresh_ids, is_scalar, same_type

__all__ = [
    "flatten_einsum", "flatten_einsum_all", "nest_einsum", "nest_einsum_operands", "einsum_zero",
    "drop_einsum_ones",
    "einsum_identity", "distribute_einsum_over_add", "distribute", "einsum_permute_to_rearrange",
    "rearrange_permute_to_einsum", "RULES",
]


def _merge_einsums(node, named: bool):
    kids = node.children
    if not any(type(c) is Einsum and (named or c.name is None) for c in kids):
        return None
    used = {a for t in node.in_axes for a in t} | set(node.out_axes)
    children, in_axes = [], []
    for c, axes in zip(kids, node.in_axes):
        if type(c) is not Einsum or not (named or c.name is None):
            children.append(c)
            in_axes.append(axes)
            continue
        mapping = dict(zip(c.out_axes, axes))
        summed = []
        for t in c.in_axes:
            for a in t:
                if a not in mapping and a not in summed:
                    summed.append(a)
        new_ids = fresh_ids(used, len(summed))
        used.update(new_ids)
        mapping.update(zip(summed, new_ids))
        children.extend(c.children)
        in_axes.extend(tuple(mapping[a] for a in t) for t in c.in_axes)
    if not einsum_fits(in_axes, node.out_axes):
        return None
    return same_type(node, Einsum(*children, in_axes=in_axes, out_axes=node.out_axes, name=node.name))


@rule(on=Einsum, example=(
    "'y' Einsum ab,b->a\n  'w' [2,3] Symbol\n  0 Einsum bc,c->b\n    'm' [3,4] Symbol\n    'v' [4] Symbol",
    "'y' Einsum ab,bc,c->a\n  'w' [2,3] Symbol\n  'm' [3,4] Symbol\n  'v' [4] Symbol",
))
def flatten_einsum(node):
    """Unnamed Einsum operands of an Einsum are merged into it (one Einsum over all their
    operands), the child's axis ids renumbered into the parent's.  A named child (``'a.q'``) is
    a result someone may select, and often shared: it stays, see ``flatten_einsum_all``."""
    return _merge_einsums(node, named=False)


@rule(on=Einsum, example=(
    "'y' Einsum ab,b->a\n  'w' [2,3] Symbol\n  'q' Einsum bc,c->b\n    'm' [3,4] Symbol\n    'v' [4] Symbol",
    "'y' Einsum ab,bc,c->a\n  'w' [2,3] Symbol\n  'm' [3,4] Symbol\n  'v' [4] Symbol",
))
def flatten_einsum_all(node):
    """Every Einsum operand of an Einsum, named or not, is merged into it (a shared child's
    work is then repeated in each parent that absorbs it)."""
    return _merge_einsums(node, named=True)


def _nest(node, positions):
    kids = node.children
    inside = [i for i in positions if i < len(kids)]
    if len(inside) != len(positions) or len(positions) == len(kids):
        return None
    outside_ids = set(node.out_axes)
    for i, axes in enumerate(node.in_axes):
        if i not in positions:
            outside_ids.update(axes)
    group_out = []
    for i in positions:
        for a in node.in_axes[i]:
            if a in outside_ids and a not in group_out:
                group_out.append(a)
    inner = Einsum(*[kids[i] for i in positions], in_axes=[node.in_axes[i] for i in positions],
                   out_axes=group_out)
    children, in_axes = [], []
    for i, (c, axes) in enumerate(zip(kids, node.in_axes)):
        if i == positions[0]:
            children.append(inner)
            in_axes.append(tuple(group_out))
        elif i not in positions:
            children.append(c)
            in_axes.append(axes)
    return same_type(node, Einsum(*children, in_axes=in_axes, out_axes=node.out_axes, name=node.name))


def nest_einsum_operands(positions, name: str | None = None) -> Rule:
    """A rule grouping the operands at ``positions`` into a child Einsum (the inverse of
    ``flatten_einsum``): the child outputs the axes its group shares with the rest.

    >>> from circuits import Symbol
    >>> w, m, v = Symbol((2, 3), name='w'), Symbol((3, 4), name='m'), Symbol((4,), name='v')
    >>> nest_einsum_operands((1, 2))(Einsum.from_spec('ab,bc,c->a', w, m, v)).spec
    'ab,b->a'
    """
    positions = tuple(sorted(set(int(p) for p in positions)))
    if len(positions) < 2:
        raise ValueError("nest_einsum_operands groups at least two operands")
    label = name or f"nest_einsum_operands[{','.join(map(str, positions))}]"
    return Rule(lambda node: _nest(node, positions), name=label, on=Einsum,
                doc=f"Group the Einsum operands at {list(positions)} into a child Einsum.")


@rule(on=Einsum, example=(
    "'y' Einsum ab,bc,c->a\n  'w' [2,3] Symbol\n  'm' [3,4] Symbol\n  'v' [4] Symbol",
    "'y' Einsum ac,c->a\n  0 Einsum ab,bc->ac\n    'w' [2,3] Symbol\n    'm' [3,4] Symbol\n  'v' [4] Symbol",
))
def nest_einsum(node):
    """An Einsum of three or more operands becomes an Einsum of (a child Einsum of the first two)
    and the rest: one binary contraction step; the inverse of ``flatten_einsum``."""
    if len(node.children) < 3:
        return None
    return _nest(node, (0, 1))


@rule(on=Einsum, example=(
    "'y' Einsum ab,->a\n  'w' [2,3] Symbol\n  0 [] Scalar 0",
    "'y' [2] Scalar 0",
))
def einsum_zero(node):
    """An Einsum with a Scalar 0 operand is Scalar 0 of its shape (a product with a zero factor;
    like every algebraic simplifier this takes ``0 * inf`` to be 0)."""
    if any(is_scalar(c, 0.0) for c in node.children):
        return same_type(node, Scalar(0.0, node.shape, name=node.name))
    return None


@rule(on=Einsum, example=(
    "'y' Einsum ab,,b->a\n  'w' [2,3] Symbol\n  0 [] Scalar 1\n  'u' [3] Symbol",
    "'y' Einsum ab,b->a\n  'w' [2,3] Symbol\n  'u' [3] Symbol",
))
def drop_einsum_ones(node):
    """Scalar 1 operands of an Einsum are dropped when every axis they carry is also carried by
    another operand (so no sum range or output axis depends on them)."""
    kids = node.children
    drop = []
    for i, c in enumerate(kids):
        if is_scalar(c, 1.0):
            axes = node.in_axes[i]
            elsewhere = {a for j, t in enumerate(node.in_axes) if j != i and j not in drop for a in t}
            if all(a in elsewhere for a in axes):
                drop.append(i)
    if not drop or len(drop) == len(kids) and node.out_axes:
        return None
    keep = [i for i in range(len(kids)) if i not in drop]
    if len(keep) == 1 and node.in_axes[keep[0]] == node.out_axes:
        return same_type(node, kids[keep[0]])  # what is left copies its operand
    new = Einsum(*[kids[i] for i in keep], in_axes=[node.in_axes[i] for i in keep], out_axes=node.out_axes,
                 name=node.name)
    return same_type(node, new)


@rule(on=Einsum, example=("'y' Einsum ab->ab\n  'w' [2,3] Symbol", "'w' [2,3] Symbol"))
def einsum_identity(node):
    """An Einsum of one operand whose output axes are its input axes in the same order copies
    its operand: it is that operand."""
    if len(node.children) == 1 and node.in_axes[0] == node.out_axes:
        return same_type(node, node.children[0])
    return None


def _distribute(node, operand, terms):
    kids = node.children
    if operand is None:
        operand = next((k for k, c in enumerate(kids) if type(c) is Add and len(c.children) >= 2), None)
        if operand is None:
            return None
    if operand >= len(kids) or type(kids[operand]) is not Add:
        return None
    add = kids[operand]
    axes = node.in_axes[operand]
    n = len(add.children)
    chosen = list(range(n)) if terms is None else [t for t in terms if t < n]
    if terms is not None and len(chosen) != len(terms) or n < 2 or not chosen:
        return None
    rest = [t for t in range(n) if t not in chosen]
    parts = [add.children[t] for t in chosen]
    if rest:
        parts.append(add.children[rest[0]] if len(rest) == 1 else Add(*[add.children[t] for t in rest]))
    if len(parts) < 2:
        return None
    sizes = node.axis_sizes()
    elsewhere = {a for j, t in enumerate(node.in_axes) if j != operand for a in t}
    used = {a for t in node.in_axes for a in t} | set(node.out_axes)
    out_terms = []
    for part in parts:
        offset = add.ndim - part.ndim
        part_axes, local_used = [], set(used)
        for j, size in enumerate(part.shape):
            a = axes[offset + j]
            if size == sizes[a]:
                part_axes.append(a)
            else:  # a size-1 axis broadcast by the Add: a fresh axis of size 1, summed away
                (f,) = fresh_ids(local_used, 1)
                local_used.add(f)
                part_axes.append(f)
        # Axes the part is broadcast along and no other operand carries still count (their sum
        # multiplies, or the output needs them): a Scalar 1 carries them.
        need = []
        for a in axes:
            if a not in part_axes and a not in elsewhere and a not in need:
                need.append(a)
        ops = list(kids[:operand]) + [part] + list(kids[operand + 1:])
        op_axes = list(node.in_axes[:operand]) + [tuple(part_axes)] + list(node.in_axes[operand + 1:])
        if need:
            ops.append(Scalar(1.0, tuple(sizes[a] for a in need)))
            op_axes.append(tuple(need))
        if not einsum_fits(op_axes, node.out_axes):
            return None
        out_terms.append(Einsum(*ops, in_axes=op_axes, out_axes=node.out_axes))
    return same_type(node, Add(*out_terms, name=node.name))


def distribute(operand: int | None = None, terms=None, name: str | None = None) -> Rule:
    """A rule distributing an Einsum over the Add at operand ``operand`` (default: the first Add
    operand): ``A·(u + v) -> A·u + A·v``.  With ``terms`` only those terms of the Add are split
    out and the others stay summed together: ``A·(u + v + w) -> A·u + A·(v + w)``.

    >>> from circuits import Symbol
    >>> w, u, v, x = Symbol((2, 3), name='w'), *(Symbol((3,), name=n) for n in 'uvx')
    >>> e = Einsum.from_spec('ab,b->a', w, Add(u, v, x))
    >>> [t.children[1].line() for t in distribute(terms=[0])(e).children]
    ["'u' [3] Symbol", 'Add']
    """
    terms = None if terms is None else tuple(int(t) for t in terms)
    label = name or "distribute" + (f"[operand={operand}]" if operand is not None else "") + (
        f"[terms={','.join(map(str, terms))}]" if terms is not None else "")
    return Rule(lambda node: _distribute(node, operand, terms), name=label, on=Einsum,
                doc="Distribute an Einsum over (some terms of) an Add operand.")


@rule(on=Einsum, example=(
    "'y' Einsum ab,b->a\n  'w' [2,3] Symbol\n  0 Add\n    'u' [3] Symbol\n    'v' [3] Symbol",
    "'y' Add\n  0 Einsum ab,b->a\n    'w' [2,3] Symbol\n    'u' [3] Symbol\n"
    "  1 Einsum ab,b->a\n    'w'\n    'v' [3] Symbol",
))
def distribute_einsum_over_add(node):
    """An Einsum with an Add operand becomes the Add of the Einsums of each term,
    ``A·(u + v) -> A·u + A·v``; terms the Add broadcasts keep their meaning (a Scalar 1 carries
    the axes they lack)."""
    return _distribute(node, None, None)


def _axis_name(i: int) -> str:
    return axis_letter(i) if i < 52 else f"x{i}"


@rule(on=Einsum, example=(
    "'y' Einsum ab->ba\n  'w' [2,3] Symbol",
    "'y' Rearrange a b -> b a\n  'w' [2,3] Symbol",
))
def einsum_permute_to_rearrange(node):
    """An Einsum of one operand that only permutes its axes is a Rearrange."""
    if len(node.children) != 1:
        return None
    (axes,) = node.in_axes
    if axes == node.out_axes or len(set(axes)) != len(axes) or set(axes) != set(node.out_axes):
        return None
    spec = " ".join(map(_axis_name, axes)) + " -> " + " ".join(map(_axis_name, node.out_axes))
    return same_type(node, Rearrange(node.children[0], spec, name=node.name))


@rule(on=Rearrange, example=(
    "'y' Rearrange h s -> s h\n  'w' [2,3] Symbol",
    "'y' Einsum ab->ba\n  'w' [2,3] Symbol",
))
def rearrange_permute_to_einsum(node):
    """A Rearrange that only permutes axes (no split, merge, new or unit axes) is an Einsum."""
    ins, outs = node.in_groups, node.out_groups
    if any(len(g) != 1 for g in ins) or any(len(g) != 1 for g in outs) or len(ins) != len(outs):
        return None
    ids = {g[0]: i for i, g in enumerate(ins)}
    if set(ids) != {g[0] for g in outs}:
        return None
    out_axes = tuple(ids[g[0]] for g in outs)
    in_axes = tuple(range(len(ins)))
    return same_type(node, Einsum(node.children[0], in_axes=(in_axes,), out_axes=out_axes, name=node.name))


RULES = RuleSet(flatten_einsum, einsum_zero, drop_einsum_ones, einsum_identity, name="einsum")
