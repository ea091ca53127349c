"""Rules for Add: flatten and nest, drop zero terms and single-term Adds, deduplicate terms,
factor a common operand out of a sum of Einsums.

Add broadcasts (numpy, right-aligned), so every rule keeps the output shape exactly: a rule that
would leave a smaller broadcast shape keeps what is needed or does not apply.
"""

from __future__ import annotations

from circuits.nodes import Add, Einsum, Scalar
from circuits.shapes import broadcast_shapes

from ..engine import Rule, RuleSet, rule
from ._common import einsum_fits, is_scalar, same_type, unwrap_identity

__all__ = [
    "flatten_add", "flatten_add_all", "nest_add", "nest_add_terms", "remove_add_zeros", "add_single_term",
    "dedupe_add_terms", "factor_add", "RULES",
]


def _splice_adds(node, named: bool):
    if not any(type(c) is Add and (named or c.name is None) for c in node.children):
        return None
    terms = []
    for c in node.children:
        if type(c) is Add and (named or c.name is None):
            terms.extend(c.children)
        else:
            terms.append(c)
    return same_type(node, Add(*terms, name=node.name))


@rule(on=Add, example=(
    "'y' Add\n  'a' [2] Symbol\n  0 Add\n    'b' [2] Symbol\n    'c' [2] Symbol",
    "'y' Add\n  'a' [2] Symbol\n  'b' [2] Symbol\n  'c' [2] Symbol",
))
def flatten_add(node):
    """An unnamed Add child of an Add is spliced into its parent (broadcasting is associative, so
    the shape is unchanged).  A named child is a result someone may select, and usually shared
    (a residual stream): it stays, see ``flatten_add_all``."""
    return _splice_adds(node, named=False)


@rule(on=Add, example=(
    "'y' Add\n  'a' [2] Symbol\n  'r' Add\n    'b' [2] Symbol\n    'c' [2] Symbol",
    "'y' Add\n  'a' [2] Symbol\n  'b' [2] Symbol\n  'c' [2] Symbol",
))
def flatten_add_all(node):
    """Every Add child of an Add, named or not, is spliced into its parent.  (On a residual
    stream, where each partial sum is also used elsewhere, this makes sums quadratic in depth.)"""
    return _splice_adds(node, named=True)


def nest_add_terms(positions, name: str | None = None) -> Rule:
    """A rule grouping the terms at ``positions`` of an Add into a sub-Add placed where the
    first of them was (the inverse of ``flatten_add`` for that group).

    >>> from circuits import Symbol
    >>> a, b, c = (Symbol((2,), name=n) for n in 'abc')
    >>> nest_add_terms((0, 2))(Add(a, b, c)).children
    (<Add [2]>, <'b' [2] Symbol>)
    """
    positions = tuple(sorted(set(int(p) for p in positions)))
    if len(positions) < 2:
        raise ValueError("nest_add_terms groups at least two terms")

    def nest(node):
        n = len(node.children)
        if positions[-1] >= n or len(positions) == n:
            return None
        group = [node.children[p] for p in positions]
        rest = [c for i, c in enumerate(node.children) if i not in positions]
        rest.insert(positions[0], Add(*group))
        return same_type(node, Add(*rest, name=node.name))

    label = name or f"nest_add_terms[{','.join(map(str, positions))}]"
    return Rule(nest, name=label, on=Add, doc=f"Group the Add terms at {list(positions)} into a sub-Add.")


@rule(on=Add, example=(
    "'y' Add\n  'a' [2] Symbol\n  'b' [2] Symbol\n  'c' [2] Symbol",
    "'y' Add\n  0 Add\n    'a' [2] Symbol\n    'b' [2] Symbol\n  'c' [2] Symbol",
))
def nest_add(node):
    """An Add of three or more terms becomes an Add of (the first two terms) and the rest: one
    step of turning a flat sum into a tree; the inverse of ``flatten_add``."""
    if len(node.children) < 3:
        return None
    a, b, *rest = node.children
    return same_type(node, Add(Add(a, b), *rest, name=node.name))


@rule(on=Add, example=(
    "'y' Add\n  'a' [2] Symbol\n  0 [] Scalar 0\n  'b' [2] Symbol",
    "'y' Add\n  'a' [2] Symbol\n  'b' [2] Symbol",
))
def remove_add_zeros(node):
    """Scalar 0 terms of an Add are dropped; if the other terms alone would broadcast to a smaller
    shape, one zero (of the zeros' broadcast shape) stays."""
    zeros = [c for c in node.children if is_scalar(c, 0.0)]
    if not zeros:
        return None
    rest = [c for c in node.children if not is_scalar(c, 0.0)]
    if not rest:
        new = Scalar(0.0, node.shape, name=node.name)
    elif broadcast_shapes([c.shape for c in rest]) == node.shape:
        new = rest[0] if len(rest) == 1 else Add(*rest, name=node.name)
    elif len(zeros) == 1:
        return None  # that zero is what gives the Add its shape
    else:
        new = Add(*rest, Scalar(0.0, broadcast_shapes([z.shape for z in zeros])), name=node.name)
    return same_type(node, new)


@rule(on=Add, example=("'y' Add\n  'a' [2] Symbol", "'a' [2] Symbol"))
def add_single_term(node):
    """An Add of one term is that term; an Add of none is Scalar 0."""
    if len(node.children) == 1:
        return same_type(node, node.children[0])
    if not node.children:
        return same_type(node, Scalar(0.0, node.shape, name=node.name))
    return None


def coefficient_form(term):
    """``(base, k)`` with ``term == k * base``: an Einsum with one shape-``()`` Scalar operand is
    ``k`` times the Einsum of its other operands (an identity Einsum of one operand being that
    operand); anything else is 1 times itself."""
    if type(term) is Einsum:
        kids = term.children
        found = [i for i, c in enumerate(kids) if type(c) is Scalar and not c.shape]
        if len(found) == 1:
            (i,) = found
            others = kids[:i] + kids[i + 1:]
            axes = term.in_axes[:i] + term.in_axes[i + 1:]
            if others:
                if len(others) == 1 and axes[0] == term.out_axes:
                    base = others[0]
                else:
                    base = Einsum(*others, in_axes=axes, out_axes=term.out_axes)
                if base.dtype == term.dtype:
                    return base, kids[i].value
    return term, 1.0


def scaled(base, k: float):
    """``k * base`` as an Einsum with a Scalar operand (just ``base`` when ``k`` is 1)."""
    if k == 1.0:
        return base
    ids = tuple(range(base.ndim))
    return Einsum(base, Scalar(k), in_axes=(ids, ()), out_axes=ids)


@rule(on=Add, example=(
    "'y' Add\n  'a' [2] Symbol\n  'a'\n  0 Einsum a,->a\n    'a'\n    1 [] Scalar 2",
    "'y' Einsum a,->a\n  'a' [2] Symbol\n  0 [] Scalar 4",
))
def dedupe_add_terms(node):
    """Terms of an Add that are multiples of the same node are summed into one:
    ``x + x + 2·x -> 4·x`` (an Einsum of ``x`` with a Scalar)."""
    kids = node.children
    if len(kids) < 2:
        return None
    if len(set(kids)) == len(kids) and not any(type(c) is Einsum for c in kids):
        return None  # fast exit: nothing repeats and no term carries a coefficient
    order: list = []
    total: dict = {}
    for c in kids:
        base, k = coefficient_form(c)
        if base in total:
            total[base] += k
        else:
            total[base] = k
            order.append(base)
    if len(order) == len(kids):
        return None
    terms = []
    for base in order:
        k = total[base]
        if k == 0.0:
            terms.append(Scalar(0.0, base.shape))
        else:
            terms.append(scaled(base, k))
    return same_type(node, terms[0] if len(terms) == 1 else Add(*terms, name=node.name))


@rule(on=Add, example=(
    "'y' Add\n  0 Einsum ab,b->a\n    'w' [2,3] Symbol\n    'u' [3] Symbol\n"
    "  1 Einsum ab,b->a\n    'w'\n    'v' [3] Symbol",
    "'y' Einsum ab,b->a\n  'w' [2,3] Symbol\n  0 Add\n    'u' [3] Symbol\n    'v' [3] Symbol",
))
def factor_add(node):
    """A sum of Einsums that all multiply the same operand ``A`` (used the same way in each)
    becomes one Einsum of ``A`` with the sum of the rest: ``A·u + A·v -> A·(u + v)``."""
    terms = node.children
    if len(terms) < 2 or any(type(t) is not Einsum or t.shape != node.shape for t in terms):
        return None
    tried = set()
    for cand in terms[0].children:
        if cand in tried or type(cand) is Scalar:
            continue
        tried.add(cand)
        if all(cand in t.children for t in terms[1:]):
            new = _factor_out(node, terms, cand)
            if new is not None:
                return same_type(node, new)
    return None


def _factor_out(node, terms, common):
    n = node.ndim
    pattern = None
    per_term = []
    for t in terms:
        k = t.children.index(common)
        a_axes = t.in_axes[k]
        out = t.out_axes
        label: dict[int, int] = {o: j for j, o in enumerate(out)}  # term axis id -> canonical id
        contracted = 0
        for ax in a_axes:
            if ax not in label:
                label[ax] = n + contracted
                contracted += 1
        pat = tuple(label[ax] for ax in a_axes)
        if pattern is None:
            pattern = pat
        elif pat != pattern:
            return None  # the common operand plays a different role in this term
        others = t.children[:k] + t.children[k + 1:]
        other_axes = t.in_axes[:k] + t.in_axes[k + 1:]
        per_term.append((t, label, others, other_axes))
    # The sum's axes: canonical ids (output or the common operand's) that the other operands use.
    r_ids = sorted({lab[a] for (_, lab, _, oax) in per_term for axes in oax for a in axes if a in lab})
    rs = []
    for t, lab, others, other_axes in per_term:
        back = {c: a for a, c in lab.items()}
        sizes = t.axis_sizes()
        r_out = tuple(back[c] for c in r_ids)
        present = {a for axes in other_axes for a in axes}
        missing = tuple(a for a in r_out if a not in present)
        if not others:
            rs.append(Scalar(1.0, tuple(sizes[a] for a in r_out)))
            continue
        ops, axes = list(others), list(other_axes)
        if missing:
            # Constant along axes the term's other operands do not use: broadcast with a 1.
            ops.append(Scalar(1.0, tuple(sizes[a] for a in missing)))
            axes.append(missing)
        if not einsum_fits(axes, r_out):
            return None
        rs.append(unwrap_identity(Einsum(*ops, in_axes=axes, out_axes=r_out)))
    total = Add(*rs)
    in_axes = (pattern, tuple(r_ids))
    out_axes = tuple(range(n))
    if not einsum_fits(in_axes, out_axes):
        return None
    return Einsum(common, total, in_axes=in_axes, out_axes=out_axes, name=node.name)


RULES = RuleSet(flatten_add, remove_add_zeros, add_single_term, dedupe_add_terms, name="add")
