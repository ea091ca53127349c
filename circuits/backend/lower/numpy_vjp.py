"""Per-node-type numpy vector-Jacobian products: ``numpy_vjp(node, fdt, need, axes)`` returns
``pull(child values, cotangent) -> cotangents of the children at positions need``, what the
backward kernel ``tiers.backward.vjp_kernel`` computes, on the CPU with numpy; None where the node
has none.

A first gradient computes a node's backward step this way while its kernel is made in the
background (``circuits.backend.tiers.host``), as a first evaluation computes its forward step with
``numpy_ops``: no tracing, no XLA compilation, and no ``import jax`` for a circuit whose every node
on the path has a numpy step.  Each gives JAX's cotangent to float rounding, in the child's dtype
as JAX computes it.

``axes`` (one entry per child: 0 where the child carries a leading batch axis, None where it is the
same for every row) says the step runs over a batch: the cotangent then carries the rows first, and
so does every cotangent out (row ``r``'s of row ``r``'s output), as ``jax.vmap`` of the kernel gives;
None: one row.

- Einsum: the contraction of the cotangent with the other operands (``numpy_ops``' einsum: pairs
  through ``matmul``), broadcast over the axes only the operand had; an operand that repeats an id
  has none.
- Index, Rearrange, Concat, Scatter and the gathers: selections.  An Index of ints and slices, a
  Rearrange that repeats nothing, a Concat and a Scatter put the cotangent back by slicing; the
  others (an Index by arrays, a repeating Rearrange, a gather) run their own numpy op on the
  child's entry positions, which says which entry each output entry reads, and add the cotangent
  back at those positions (``np.bincount``: repeated reads add up).
- GeneralFunction of one argument: its ``FunctionSpec.numpy_grad``.

Every rule's ``pull`` takes the node's own value as ``out`` (None where unknown); a function's
gradient reads it instead of computing it again, the others ignore it.

>>> import numpy as np
>>> from circuits import Array, Einsum, Index
>>> a = Array(np.arange(6, dtype=np.float32).reshape(2, 3), name='a')
>>> b = Array(np.ones(3, np.float32), name='b')
>>> pull = numpy_vjp(Einsum.from_spec('ab,b->a', a, b), 'float32', (0, 1))
>>> [g.tolist() for g in pull((a.value, b.value), np.array([1.0, 2.0], np.float32))]
[[[1.0, 1.0, 1.0], [2.0, 2.0, 2.0]], [6.0, 9.0, 12.0]]
>>> numpy_vjp(Index(a, (slice(None), [0, 0])), 'float32', (0,))((a.value,), np.ones((2, 2), np.float32))[0]
array([[2., 0., 0.],
       [2., 0., 0.]], dtype=float32)
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from ...nodes import Circuit, Concat, Einsum, GeneralFunction, Index, Rearrange, Scatter
from ..cache.bounded import BoundedCache
from .numpy_ops import HOST_FLOATS, PLAN_ROWS, canonical, einsum_fn, op_key, raw_op, with_rows

__all__ = ["numpy_vjp"]


def _einsum_vjp(node: Einsum, fdt: str, need: tuple, axes):
    in_axes = [tuple(t) for t in node.in_axes]
    out_axes = tuple(node.out_axes)
    if any(len(set(t)) != len(t) for t in in_axes) or len(set(out_axes)) != len(out_axes):
        return None  # a diagonal read or written: JAX's kernel
    shapes = [tuple(c.shape) for c in node.children]
    g_ids, g_shape = out_axes, tuple(node.shape)
    if axes is not None:  # the rows: one id more, on the cotangent, the batched operands, every result
        row, in_axes, shapes = with_rows(in_axes, out_axes, shapes, axes)
        g_ids, g_shape = (row, *out_axes), (PLAN_ROWS, *node.shape)
    steps = []
    for i in need:
        child = node.children[i]
        target = canonical(child.dtype, fdt)
        want = in_axes[i] if axes is None or axes[i] == 0 else (row, *in_axes[i])
        others = [j for j in range(len(in_axes)) if j != i]
        present = set(g_ids).union(*[in_axes[j] for j in others])
        kept = tuple(x for x in want if x in present)
        op = einsum_fn([g_ids, *[in_axes[j] for j in others]], kept, [g_shape, *[shapes[j] for j in others]],
                     np.dtype(target))
        if op is None:
            return None
        spread = None if kept == want else tuple(k for k, x in enumerate(want) if x not in present)
        steps.append((others, op, spread, target, tuple(child.shape)))

    def pull(xs, g, out=None):
        outs = []
        for others, op, spread, target, shape in steps:
            out = op(g, *[xs[j] for j in others])
            if spread is not None:  # axes only this operand had: the same cotangent along them
                full = (g.shape[0], *shape) if axes is not None else shape
                placed = tuple(1 if k in spread else n for k, n in enumerate(full))
                out = np.broadcast_to(out.reshape(placed), full)
            outs.append(out.astype(target, copy=False))
        return tuple(outs)

    return pull


def _function_vjp(node: GeneralFunction, fdt: str, need: tuple, axes):
    spec = node.function
    if spec.gather is not None:
        if need != (0,):
            return None
        if spec.gather.layout == "batch" and len(node.children[0].shape) > len(node.children[1].shape):
            return _batch_gather_vjp(node, fdt, axes)
        return _selection_vjp(node, fdt, need, axes)
    grad, forward = spec.numpy_grad, spec.numpy
    if grad is None or forward is None or len(node.children) != 1:
        return None
    target = canonical(node.children[0].dtype, fdt)

    def pull(xs, g, out=None):
        x = xs[0]
        y = np.asarray(forward(x) if out is None else out)
        return (np.asarray(grad(x, y, g)).astype(target, copy=False),)

    return pull


def _batch_gather_vjp(node: GeneralFunction, fdt: str, axes):
    """A gather of one entry per leading position (``gen_index_at_<d>_batch_x``: a loss picking
    each token's log-probability): the cotangent put back at the entries read, which no two
    output entries share (no positions for the whole of x: GPT-2's 8 x 31 x 50,257 log-probs
    took 0.7 s that way)."""
    g_index = node.function.gather
    x_node, i_node = node.children
    shape, target = tuple(x_node.shape), canonical(x_node.dtype, fdt)

    def pull(xs, g, out=None):
        lead = _lead(axes, g)
        idx = np.asarray(xs[1])
        if lead and idx.ndim == len(i_node.shape):  # the same indices for every row
            idx = np.broadcast_to(idx, lead + idx.shape)
        full = lead + shape
        q = idx.ndim
        ax = g_index.axis(len(full), q)
        n = full[ax]
        if not g_index.checked:
            idx = np.where(idx < 0, idx + n, idx)
        bad = (idx < 0) | (idx >= n)
        at = np.clip(idx, 0, max(n - 1, 0)).reshape(idx.shape + (1,) * (ax - q))
        before, after = math.prod(full[:ax]), math.prod(full[ax + 1:])
        at = np.broadcast_to(at, full[:ax]).reshape(before, 1)
        picked = np.where(bad.reshape(bad.shape + (1,) * (g.ndim - q)), 0, g)  # out of range: NaN, no gradient
        out = np.zeros((before, n, after), target)
        out[np.arange(before)[:, None], at, np.arange(after)[None, :]] = picked.reshape(before, after)
        return (out.reshape(full),)

    return pull


def _selection_vjp(node: Circuit, fdt: str, need: tuple, axes):
    """A node that reads entries of its children (the cotangent of each child: the node's
    cotangent added back at the entries read)."""
    rows_first = axes is not None and any(a == 0 for a in axes)
    forward = raw_op(node, np.float64, axes if rows_first else None)
    if forward is None:
        return None
    kids = node.children

    def pull(xs, g, out=None):
        rows = g.shape[0] if axes is not None else None
        outs = []
        for i in need:
            shape = tuple(kids[i].shape)
            size = math.prod(shape)
            batched = rows_first and axes[i] == 0
            count = size * (rows if batched else 1)
            positions = np.arange(1, count + 1, dtype=np.float64).reshape(((rows,) if batched else ()) + shape)
            args = []
            for j, x in enumerate(xs):
                if j == i:
                    args.append(positions)
                elif np.issubdtype(np.asarray(x).dtype, np.floating):
                    args.append(np.zeros(np.shape(x)))  # another child's entries: not this one's
                else:
                    args.append(np.asarray(x))  # the indices a gather reads by
            with np.errstate(all="ignore"):
                read = np.asarray(forward(*args), np.float64)
            valid = read >= 1  # NaN (an index out of range) and 0 (padding) read nothing
            source = read[valid].astype(np.int64) - 1
            total = size if rows is None else rows * size
            if rows is None or batched:
                flat, weights = source, g[valid]  # the positions count the rows already
            elif rows_first:  # the rows come from another child: row r's entries at r * size
                offsets = np.broadcast_to((np.arange(rows) * size).reshape((rows,) + (1,) * (read.ndim - 1)), read.shape)
                flat, weights = source + offsets[valid], g[valid]
            else:  # the node is the same for every row, its cotangent is not
                flat = (np.arange(rows)[:, None] * size + source[None, :]).ravel()
                weights = g.reshape(rows, -1)[:, valid.ravel()].ravel()
            summed = np.bincount(flat, weights=np.asarray(weights, np.float64), minlength=total)
            target = canonical(kids[i].dtype, fdt)
            outs.append(summed.reshape(((rows,) if rows is not None else ()) + shape).astype(target, copy=False))
        return tuple(outs)

    return pull


def _lead(axes, g) -> tuple:
    """The rows the cotangent carries first (``()``: one row)."""
    return () if axes is None else (g.shape[0],)


def _index_vjp(node: Index, fdt: str, need: tuple, axes):
    """An Index of ints and slices (numpy's basic indexing: no entry read twice): the cotangent
    written into zeros at the entries read."""
    full = node.full_index()
    if any(isinstance(e, np.ndarray) for e in full):
        return _selection_vjp(node, fdt, need, axes)
    at = tuple(e if isinstance(e, slice) else int(e) for e in full)
    shape, target = tuple(node.children[0].shape), canonical(node.children[0].dtype, fdt)

    def pull(xs, g, out=None):
        lead = _lead(axes, g)
        out = np.zeros(lead + shape, target)
        out[(slice(None),) * len(lead) + at] = g
        return (out,)

    return pull


def _rearrange_vjp(node: Rearrange, fdt: str, need: tuple, axes):
    """A Rearrange that repeats nothing: the cotangent rearranged back."""
    sizes = dict(node.sizes)
    out_names = [a for grp in node.out_groups for a in grp]
    kept = [a for grp in node.in_groups for a in grp if a in out_names]
    if len(kept) != len(out_names):
        return _selection_vjp(node, fdt, need, axes)  # repeats: entries read more than once
    back = tuple(int(i) for i in np.argsort([kept.index(a) for a in out_names]))
    placed = tuple(sizes[a] for a in out_names)
    shape, target = tuple(node.children[0].shape), canonical(node.children[0].dtype, fdt)

    def pull(xs, g, out=None):
        lead = _lead(axes, g)
        moved = np.transpose(g.reshape(lead + placed), tuple(range(len(lead))) + tuple(b + len(lead) for b in back))
        return (moved.reshape(lead + shape).astype(target, copy=False),)

    return pull


def _concat_vjp(node: Concat, fdt: str, need: tuple, axes):
    """A Concat: each child's part of the cotangent."""
    ends = np.cumsum([c.shape[node.axis] for c in node.children])
    parts = [(int(end - c.shape[node.axis]), int(end), canonical(c.dtype, fdt)) for c, end in zip(node.children, ends)]

    def pull(xs, g, out=None):
        before = (slice(None),) * (len(_lead(axes, g)) + node.axis)
        return tuple(np.array(g[before + (slice(parts[i][0], parts[i][1]),)], parts[i][2]) for i in need)

    return pull


def _scatter_vjp(node: Scatter, fdt: str, need: tuple, axes):
    """A Scatter (its child a block of zeros): the cotangent's block."""
    block = tuple(slice(s, s + k) for s, k in zip(node.starts(), node.children[0].shape))
    target = canonical(node.children[0].dtype, fdt)

    def pull(xs, g, out=None):
        return (np.array(g[(slice(None),) * len(_lead(axes, g)) + block], target),)

    return pull


_RULES = {
    Einsum: _einsum_vjp,
    GeneralFunction: _function_vjp,
    Index: _index_vjp,
    Rearrange: _rearrange_vjp,
    Concat: _concat_vjp,
    Scatter: _scatter_vjp,
}

# (type, payload, shapes, dtypes, precision, need, axes) -> its pull (False: none); pulls hold no node
_MEMO = BoundedCache("numpy vjps", "kernels", max_entries=4096, lru=False)
_NONE = False


def numpy_vjp(node: Circuit, fdt: str, need: tuple, axes: tuple | None = None) -> Callable | None:
    """``pull(child values, cotangent, out=None) -> cotangents of the children at need`` with
    numpy (see the module docstring), or None where ``node`` has no numpy step; ``out``: the
    node's own value where it is known (a function's gradient reads it instead of computing it
    again)."""
    t = type(node)
    rule = _RULES.get(t)
    if rule is None or fdt not in HOST_FLOATS or not need:
        return None
    key = (*op_key(node, fdt, axes), need)
    pull = _MEMO.get(key)
    if pull is None:
        made = rule(node, fdt, need, axes)
        if made is None:
            pull = _NONE
        else:
            def pull(xs, g, out=None, made=made):
                with np.errstate(all="ignore"):  # JAX warns of nothing: inf and nan are values
                    return made([np.asarray(x) for x in xs], np.asarray(g), out)

        pull = _MEMO.setdefault(key, pull)
    return None if pull is _NONE else pull
