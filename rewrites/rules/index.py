"""Index rules: push an Index down towards the leaves, fuse Index of Index, fold Index of Scalar.

Pushing an Index below the node it reads makes that node compute only the entries the Index
keeps (``x @ w`` then take row 0 becomes row 0 of ``x`` times ``w``).  Every push is exact.
Where only some index entries can move (the last axis of a softmax, a merged Rearrange axis),
those move and the rest stay behind in a *residual* Index above.

An index entry is an int (drops the axis), a slice (kept as written) or a 1-d int array; see
``circuits.nodes.index``.  Helpers that compose entries (``compose_entries``) and build trimmed
Index nodes (``make_index``) are public for other rules.  An Index that selects everything is
dropped by ``rewrites.rules.identities.index_select_all``.

>>> from circuits import Einsum, Index, Symbol
>>> x, w = Symbol((2, 4), name='x'), Symbol((4, 3), name='w')
>>> push_index_through_einsum(Index(Einsum.from_spec('ab,bc->ac', x, w), (0,))).payload_text()
'b,bc->c'
"""

from __future__ import annotations

import numpy as np

from circuits.nodes import Add, Concat, Einsum, GeneralFunction, Index, Rearrange, Scalar

from ..engine import RuleSet, rule

ALL = slice(None)


# ---------------------------------------------------------------------------- entry algebra
def positions(entry, n: int):
    """The positions an entry reads on an axis of size ``n``: an int, a ``range`` (slice) or an
    int array with negatives wrapped (array).

    >>> positions(slice(None, None, -2), 5), positions(-1, 5), positions(np.array([-1, 0]), 3)
    (range(4, -1, -2), 4, array([2, 0]))
    """
    if isinstance(entry, slice):
        return range(*entry.indices(n))
    if isinstance(entry, np.ndarray):
        return entry % n if n else entry.copy()
    return entry % n


def is_full(entry, n: int) -> bool:
    """Whether ``entry`` keeps an axis of size ``n`` whole and in order (a no-op).

    >>> is_full(slice(None), 3), is_full(slice(0, 3, 1), 3), is_full(np.array([0, 1, 2]), 3), is_full(0, 1)
    (True, True, True, False)
    """
    if isinstance(entry, slice):
        return range(*entry.indices(n)) == range(n)
    if isinstance(entry, np.ndarray):
        return len(entry) == n and bool(np.array_equal(positions(entry, n), np.arange(n)))
    return False


def range_to_slice(r: range, n: int) -> slice:
    """The shortest slice reading exactly the positions ``r`` of an axis of size ``n``.

    >>> range_to_slice(range(0, 5), 5), range_to_slice(range(1, 4, 2), 5), range_to_slice(range(4, -1, -1), 5)
    (slice(None, None, None), slice(1, None, 2), slice(None, None, -1))
    """
    if len(r) == 0:
        return slice(0, 0)
    start, last, step = r.start, r[-1], r.step
    # Stop at the end (None) when the next position would fall off the axis anyway.
    if step > 0:
        return slice(None if start == 0 else start, None if last + step >= n else last + 1,
                     None if step == 1 else step)
    return slice(None if start == n - 1 else start, None if last + step < 0 else last - 1, step)


def compose_entries(first, n: int, second):
    """The one entry equal to ``first`` on an axis of size ``n`` followed by ``second`` on the
    axis it leaves (``first`` is a slice or an array: an int leaves no axis).

    >>> compose_entries(slice(1, None), 5, slice(None, None, 2))
    slice(1, None, 2)
    >>> compose_entries(np.array([3, 1, 4]), 5, -1)
    4
    """
    pos = positions(first, n)
    if isinstance(second, (int, np.integer)):
        return int(pos[second])
    if isinstance(second, slice):
        picked = pos[second]
        return range_to_slice(picked, n) if isinstance(picked, range) else np.asarray(picked, np.int64)
    arr = np.asarray(pos, np.int64)
    return arr[second % len(arr)] if len(arr) else second


def make_index(child, entries):
    """``Index(child, entries)`` with trailing no-op entries dropped; ``child`` itself when every
    entry is a no-op."""
    entries = list(entries)
    while entries and is_full(entries[-1], child.shape[len(entries) - 1]):
        entries.pop()
    if not entries:
        return child
    return Index(child, tuple(entries))


def _trivial(node: Index) -> bool:
    return all(is_full(e, n) for e, n in zip(node.index, node.children[0].shape))


def _split(entries, pushable):
    """Entries to push (no-op where not pushable) and the residual index to apply afterwards."""
    pushed, residual = [], []
    for e, ok in zip(entries, pushable):
        if ok:
            pushed.append(e)
            if not isinstance(e, int):
                residual.append(ALL)
        else:
            pushed.append(ALL)
            residual.append(e)
    return pushed, residual


def _broadcast_entries(entries, out_shape, child_shape):
    """The entries to apply to one term of a broadcasting op (Add, elementwise function) so that
    it broadcasts to the indexed result: a size-1 axis of the term keeps its size (an int
    becomes 0), an axis the term lacks (it is right-aligned) takes nothing."""
    offset = len(out_shape) - len(child_shape)
    out = []
    for j, n in enumerate(child_shape):
        e = entries[j + offset]
        if n == out_shape[j + offset]:
            out.append(e)
        else:
            out.append(0 if isinstance(e, int) else ALL)
    return out


# ---------------------------------------------------------------------------- fuse and drop
@rule(on=Index, example=(
    "'y' [2] Index [1:3]\n  'x' [5] Index [1,:]\n    'z' [4,5] Symbol",
    "'y' [2] Index [1,1:3]\n  'z' [4,5] Symbol",
))
def fuse_index_index(node):
    """An Index of an Index is one Index (entries composed axis by axis)."""
    inner = node.children[0]
    if not isinstance(inner, Index):
        return None
    x = inner.children[0]
    outer = iter(node.full_index())
    fused = []
    for first, n in zip(inner.full_index(), x.shape):
        if isinstance(first, int):
            fused.append(first)
        else:
            fused.append(compose_entries(first, n, next(outer)))
    return make_index(x, fused)


@rule(on=Index, example=("'y' [2] Index [0,1:]\n  'c' [4,3] Scalar 2", "'y' [2] Scalar 2"))
def fold_index_of_scalar(node):
    """An Index of a Scalar is a Scalar of the indexed shape."""
    s = node.children[0]
    if not isinstance(s, Scalar):
        return None
    return Scalar(s.value, node.shape)


# ---------------------------------------------------------------------------- push through nodes
@rule(on=Index, example=(
    "'y' [3] Index [0]\n  'p' Einsum ab,bc->ac\n    'x' [2,4] Symbol\n    'w' [4,3] Symbol",
    "'y' Einsum b,bc->c\n  0 [4] Index [0]\n    'x' [2,4] Symbol\n  'w' [4,3] Symbol",
))
def push_index_through_einsum(node):
    """Index an Einsum's output = Einsum of its operands indexed on the same axis ids (an int
    drops the axis id; a repeated id in one operand is indexed at each place)."""
    ein = node.children[0]
    if not isinstance(ein, Einsum) or _trivial(node):
        return None
    by_id = {a: e for a, e, n in zip(ein.out_axes, node.full_index(), ein.shape) if not is_full(e, n)}
    kids = []
    for c, axes in zip(ein.children, ein.in_axes):
        kids.append(make_index(c, [by_id.get(a, ALL) for a in axes]))
    keep = lambda a: not isinstance(by_id.get(a), int)  # noqa: E731
    in_axes = [tuple(a for a in axes if keep(a)) for axes in ein.in_axes]
    out_axes = tuple(a for a in ein.out_axes if keep(a))
    return Einsum(*kids, in_axes=in_axes, out_axes=out_axes)


@rule(on=Index, example=(
    "'y' [3] Index [1]\n  's' Add\n    'x' [2,3] Symbol\n    'b' [1,3] Symbol",
    "'y' Add\n  0 [3] Index [1]\n    'x' [2,3] Symbol\n  1 [3] Index [0]\n    'b' [1,3] Symbol",
))
def push_index_through_add(node):
    """Index an Add = Add of its terms indexed, minding broadcasting: a term of size 1 on an axis
    keeps that axis (an int there becomes 0), a term without the axis is not indexed on it."""
    add = node.children[0]
    if not isinstance(add, Add) or not add.children or _trivial(node):
        return None
    entries = node.full_index()
    return Add(*[make_index(c, _broadcast_entries(entries, add.shape, c.shape)) for c in add.children])


@rule(on=Index, example=(
    "'y' [2] Index [0]\n  'p' GeneralFunction softmax\n    'x' [3,2] Symbol",
    "'y' GeneralFunction softmax\n  0 [2] Index [0]\n    'x' [3,2] Symbol",
))
def push_index_through_function(node):
    """Index an elementwise function = the function of its (broadcast-aware) indexed arguments;
    for a function acting on its last ``core_ndim`` axes (softmax) only the leading axes move,
    the core axes stay in a residual Index."""
    f = node.children[0]
    if not isinstance(f, GeneralFunction) or _trivial(node):
        return None
    spec = f.function
    entries = node.full_index()
    if spec.elementwise:
        return GeneralFunction(spec, *[make_index(c, _broadcast_entries(entries, f.shape, c.shape))
                                       for c in f.children])
    if spec.core_ndim is None or len(f.children) != 1:
        return None
    (x,) = f.children
    leading = len(x.shape) - spec.core_ndim
    if leading <= 0 or leading > len(f.shape):
        return None
    pushable = [k < leading and not is_full(e, n) for k, (e, n) in enumerate(zip(entries, f.shape))]
    if not any(pushable):
        return None
    pushed, residual = _split(entries, pushable)
    inner = GeneralFunction(spec, make_index(x, pushed[:leading]))
    return make_index(inner, residual)


@rule(on=Index, example=(
    "'y' [3] Index [1]\n  'r' Rearrange a b -> b a\n    'x' [3,2] Symbol",
    "'y' Rearrange a -> a\n  0 [3] Index [:,1]\n    'x' [3,2] Symbol",
))
def push_index_through_rearrange(node):
    """Index a Rearrange on an output axis that is one whole input axis (or a repeated axis) =
    Rearrange of the child indexed there; entries on merged or split axes stay behind."""
    r = node.children[0]
    if not isinstance(r, Rearrange) or _trivial(node):
        return None
    ins, outs = r.in_groups, r.out_groups
    in_axis = {g[0]: i for i, g in enumerate(ins) if len(g) == 1}
    in_names = {a for g in ins for a in g}
    entries = node.full_index()
    pushable = []
    for g, e, n in zip(outs, entries, r.shape):
        if is_full(e, n):
            pushable.append(False)
        elif len(g) == 1:
            pushable.append(g[0] in in_axis or g[0] not in in_names)
        else:  # a unit axis '1' can only be dropped; a merged axis cannot move
            pushable.append(not g and isinstance(e, int))
    if not any(pushable):
        return None
    pushed, residual = _split(entries, pushable)
    child_entries = [ALL] * len(ins)
    given = dict(r.given_sizes)
    drop_out = set()
    for k, (g, e) in enumerate(zip(outs, pushed)):
        if not pushable[k]:
            continue
        if isinstance(e, int):
            drop_out.add(k)
            if g:
                given.pop(g[0], None)
        else:
            m = len(positions(e, r.shape[k]))
            if g[0] in given or g[0] not in in_names:
                given[g[0]] = m
        if g and g[0] in in_axis:
            child_entries[in_axis[g[0]]] = e
    new_ins = tuple(g for i, g in enumerate(ins) if not isinstance(child_entries[i], int))
    new_outs = tuple(g for k, g in enumerate(outs) if k not in drop_out)
    inner = Rearrange(make_index(r.children[0], child_entries), (new_ins, new_outs), **given)
    return make_index(inner, residual)


@rule(on=Index, example=(
    "'y' [2] Index [3:]\n  'c' Concat 0\n    'a' [2] Symbol\n    'b' [3] Symbol",
    "'y' [2] Index [1:]\n  'b' [3] Symbol",
))
def push_index_through_concat(node):
    """Index a Concat = Concat of its children indexed: off the concat axis every child takes the
    entry; on it, the selected positions are split into runs, one per child they fall in (a
    single run needs no Concat).  An int array falling into more runs than there are children
    stays behind as a residual Index."""
    cat = node.children[0]
    if not isinstance(cat, Concat) or _trivial(node):
        return None
    ax = cat.axis
    entries = list(node.full_index())
    e, n = entries[ax], cat.shape[ax]
    others = list(entries)
    others[ax] = ALL
    new_ax = ax - sum(isinstance(x, int) for x in entries[:ax])
    if is_full(e, n):
        return Concat(*[make_index(c, others) for c in cat.children], axis=new_ax)
    sizes = [c.shape[ax] for c in cat.children]
    ends = np.cumsum(sizes)
    starts = ends - sizes
    if isinstance(e, int):
        p = e % n
        k = int(np.searchsorted(ends, p, side="right"))
        others[ax] = int(p - starts[k])
        out = make_index(cat.children[k], others)
        return out if out.dtype == node.dtype else None
    pos = positions(e, n)
    arr = np.asarray(pos, np.int64)
    owner = np.searchsorted(ends, arr, side="right")
    breaks = np.flatnonzero(np.diff(owner)) + 1
    bounds = list(zip([0, *breaks.tolist()], [*breaks.tolist(), len(arr)]))
    if not len(arr):
        bounds = []
    if isinstance(e, np.ndarray) and len(bounds) > len(cat.children):
        if all(is_full(x, m) for x, m in zip(others, cat.shape)):
            return None
        residual = [x if k == ax else (ALL if not isinstance(x, int) else None)
                    for k, x in enumerate(entries)]
        inner = Concat(*[make_index(c, others) for c in cat.children], axis=new_ax)
        return make_index(inner, [x for x in residual if x is not None])
    pieces = []
    for lo, hi in bounds:
        k = int(owner[lo])
        local = arr[lo:hi] - starts[k]
        run = list(others)
        if isinstance(pos, range):
            step = pos.step
            run[ax] = range_to_slice(range(int(local[0]), int(local[-1]) + step, step), sizes[k])
        else:
            run[ax] = local
        pieces.append(make_index(cat.children[k], run))
    if not pieces:
        run = list(others)
        run[ax] = slice(0, 0)
        out = make_index(cat.children[0], run)
        return out if out.dtype == node.dtype else None
    out = pieces[0] if len(pieces) == 1 else Concat(*pieces, axis=new_ax)
    # Fewer children can promote to another dtype (an int child alone is not a float).
    return out if out.dtype == node.dtype else None


def gen_index_parts(node):
    """``(g, axis)`` for a gen_index GeneralFunction: ``g`` the ``circuits.functions.GenIndex``
    its name means, ``axis`` the gathered axis of ``x``; else None."""
    if not isinstance(node, GeneralFunction):
        return None
    g = node.function.gather
    if g is None:
        return None
    x, idx = node.children
    return g, g.axis(len(x.shape), len(idx.shape))


@rule(on=Index, example=(
    "'y' [2,3] Index [:2]\n  'e' GeneralFunction gen_index_at_0_c\n    'w' [5,3] Symbol\n"
    "    't' [4] Symbol int64",
    "'y' GeneralFunction gen_index_at_0_c\n  'w' [5,3] Symbol\n  0 [2] Index [:2]\n"
    "    't' [4] Symbol int64",
))
def push_index_through_gen_index(node):
    """Index a gather ``gen_index_at_*(x, idx)`` = the gather of indexed arguments: axes that
    come from ``idx`` index ``idx``, batch axes (``_batch_x``) index both, the others index
    ``x``; the gathered axis is never touched, so out-of-range and negative indices mean what
    they meant."""
    g = node.children[0]
    parts = gen_index_parts(g)
    if parts is None or _trivial(node):
        return None
    gi, ax = parts
    x, idx = g.children
    xn, q = len(x.shape), len(idx.shape)
    x_entries, i_entries = [ALL] * xn, [ALL] * q
    for k, e in enumerate(node.full_index()):
        if gi.layout == "batch":
            a = k if k < ax else k + 1
            x_entries[a] = e
            if a < q:
                i_entries[a] = e
        elif gi.layout == "first":
            if k < q:
                i_entries[k] = e
            else:
                x_entries[k - q if k - q < ax else k - q + 1] = e
        elif k < ax:
            x_entries[k] = e
        elif k < ax + q:
            i_entries[k - ax] = e
        else:
            x_entries[k - q + 1] = e
    ints = lambda es: sum(isinstance(e, int) for e in es)  # noqa: E731
    new_xn, new_q = xn - ints(x_entries), q - ints(i_entries)
    new_ax = ax - ints(x_entries[:ax])
    return GeneralFunction(gi.moved(new_ax, new_xn, new_q).name, make_index(x, x_entries), make_index(idx, i_entries))


PUSH_RULES = RuleSet(
    push_index_through_einsum,
    push_index_through_add,
    push_index_through_function,
    push_index_through_rearrange,
    push_index_through_concat,
    push_index_through_gen_index,
    name="push_index",
)

#: The Index rules in the default simplification set.
RULES = RuleSet(fuse_index_index, fold_index_of_scalar, PUSH_RULES, name="index")
