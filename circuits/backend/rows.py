"""Op by op, a layer's heads run together: nodes of one operation computed as rows of one kernel.

An op-by-op evaluation (``incremental.run_ops``) pays one kernel call per node, and what it
computes after a change upstream of a layer is mostly that layer's heads: per head the same few
operations over the same shapes.  Here the nodes to compute go level by level (a node's level is
one more than its deepest child computed in this run), and the nodes of one level that one kernel
computes (same operation, same shapes) and that read their operands from the same places run as
rows of one ``vmap``-ed kernel:

- a child every row shares is passed once;
- children that are rows of one earlier kernel's result, in order, are passed as that result
  (no copy); rows ``a`` to ``a + n`` of a longer one as one slice;
- children that pick rows ``0 .. n-1`` of one stacked tensor in order (``W[h]`` for head ``h``)
  are passed as that tensor;
- anything else is stacked by one kernel call, and kept in the value cache when the children were
  themselves kept (per-head constants stack once per process).

An Add of every row of one result, in order, is one sum over the rows.  The rows stay one array
until something needs one of them alone (``incremental.Row``): the value cache splits a result
into its rows by one kernel call when one of them is read.  A one-head change meets no group and
computes that head alone, as before.

>>> import numpy as np
>>> from circuits import Array, Einsum, Index, Symbol, Add
>>> x = Symbol((3,), name='x')
>>> w = Array(np.arange(12.0, dtype=np.float32).reshape(4, 3), name='w')
>>> heads = [Einsum.from_spec('a,a->', x, Index(w, (h,))) for h in range(4)]
>>> from circuits.backend.incremental import run_ops
>>> [float(v) for v in run_ops(heads, {'x': np.ones(3)}, 'float32')]    # one kernel, four rows
[3.0, 12.0, 21.0, 30.0]
"""

from __future__ import annotations

from typing import Callable

from ..nodes import Add, Array, Circuit, Index, SetSymbolicShape, Tag
from .incremental import VALUES, Row, Stacked, cached_kernel, kernel, kernel_entry, materialized
from .ops import build_op
from .runtime import leaf_value

__all__ = ["compute"]

_PASS = (Tag, SetSymbolicShape)
ENABLED = True  # False: every node alone (for comparison)


def compute(todo: list, env: dict, fdt: str, store: Callable | None, keys: Callable | None) -> None:
    """Compute the nodes ``todo`` (in toposort order) into ``env`` (node hash -> value, holding
    every child already known): groups of rows as above, the rest node by node.  ``store(node,
    value, nbytes)`` keeps a computed value; ``keys(node)`` is a node's value-cache key (None:
    nothing is kept)."""
    level: dict = {}
    group_of: dict = {}  # node hash -> the group computing it
    ids: dict = {}  # group key -> group number
    groups: list = []
    for node in todo:
        lv = 0
        for c in node.children:
            at = level.get(c.hash)
            if at is not None and at >= lv:
                lv = at + 1
        level[node.hash] = lv
        if type(node) in _PASS or (type(node) is Index and _pick(node) is not None):
            # a pick X[h] runs alone: rows reading X[0], X[1], ... are passed X itself
            gkey = (lv, id(node))
        else:
            gkey = (lv, kernel_entry(node, fdt)[0], _sources(node, env, group_of))
        g = ids.get(gkey)
        if g is None:
            g = ids[gkey] = len(groups)
            groups.append((lv, []))
        groups[g][1].append(node)
        group_of[node.hash] = g
    for _, rows in sorted(groups, key=lambda lg: lg[0]):
        if not ENABLED:
            for node in rows:
                _one(node, env, fdt, store)
        elif len(rows) == 1:
            _one(rows[0], env, fdt, store)
        else:
            _rows(rows, env, fdt, store, keys)


def _sources(node: Circuit, env: dict, group_of: dict) -> tuple:
    """Where the children that may differ between rows come from: the group computing them in
    this run, the result a known row belongs to, or the stacked tensor a pick reads (rows reading
    different ones are not grouped)."""
    out = []
    for c in node.children:
        if type(c) is Index and _pick(c) is not None:
            out.append(c.children[0].hash)
            continue
        g = group_of.get(c.hash)
        if g is not None:
            out.append(g)
            continue
        v = env.get(c.hash)
        out.append(id(v.stack) if type(v) is Row else None)
    return tuple(out)


def _pick(node: Index):
    """``h`` when ``node`` is ``X[h]`` (one int on the first axis, every other axis whole)."""
    entries = node.full_index()
    if not entries:
        return None
    first = entries[0]
    if type(first) is not int:
        return None
    for entry, n in zip(entries[1:], node.children[0].shape[1:]):
        if type(entry) is not slice or entry.indices(n) != (0, n, 1):
            return None
    return first % node.children[0].shape[0]


def _one(node: Circuit, env: dict, fdt: str, store) -> None:
    t = type(node)
    if t in _PASS:
        env[node.hash] = env[node.children[0].hash]
        return
    if t is Add:
        summed = _sum_of_rows(node, env)
        if summed is not None:
            env[node.hash] = summed
            if store is not None:
                store(node, summed, None)
            return
    value = kernel(node, fdt)(*[_array(env, c) for c in node.children])
    env[node.hash] = value
    if store is not None:
        store(node, value, None)


def _array(env: dict, child: Circuit):
    v = env[child.hash]
    if type(v) is Row:
        v = env[child.hash] = materialized(v)
    return v


def _sum_of_rows(node: Add, env: dict):
    """An Add of two or more rows of one result (any rows, any order, a row twice) and other
    values, all of the Add's shape: one kernel over the whole result, the rows' multiplicities
    passed as data (an ablation's sum of a layer's heads, one replaced, splits nothing)."""
    stack, counts, others = None, None, []
    for c in node.children:
        if c.shape != node.shape:
            return None
        v = env[c.hash]
        if type(v) is Row and (stack is None or v.stack is stack):
            if stack is None:
                stack = v.stack
                counts = [0] * stack.value.shape[0]
            counts[v.index] += 1
        else:
            others.append(materialized(v))
    if stack is None or sum(counts) < 2:
        return None
    import numpy as np

    value = stack.value
    key = ("sum rows", value.shape, str(value.dtype), len(others))

    def make():
        import jax.numpy as jnp

        def summed(s, k, *rest):
            k = k.reshape((-1,) + (1,) * (s.ndim - 1))
            # no 0 * inf from a row left out; a product and a sum, not a matmul (no TF32 on a GPU)
            total = (jnp.where(k > 0, s, 0) * k).sum(0)
            for r in rest:
                total = total + r
            return total

        return summed

    return cached_kernel(key, make)(value, np.asarray(counts, value.dtype), *others)


def _rows(rows: list, env: dict, fdt: str, store, keys) -> None:
    first = rows[0]
    n = len(rows)
    args, axes = [], []
    for j, c0 in enumerate(first.children):
        cs = [r.children[j] for r in rows]
        if all(c.hash == c0.hash for c in cs):
            args.append(_array(env, c0))
            axes.append(None)
            continue
        args.append(_stacked(cs, env, fdt, keys))
        axes.append(0)
    if 0 not in axes:  # the same operation on the same values (nodes differing in name only)
        value = kernel(first, fdt)(*args)
        for r in rows:
            env[r.hash] = value
            if store is not None:
                store(r, value, None)
        return
    key = ("rows", kernel_entry(first, fdt)[0], tuple(axes), n)

    def make():
        import jax

        return jax.vmap(build_op(first, fdt), in_axes=tuple(axes))

    stack = Stacked(cached_kernel(key, make)(*args))
    for i, r in enumerate(rows):
        row = env[r.hash] = Row(stack, i)
        if store is not None:
            store(r, row, stack)


def _stacked(cs: list, env: dict, fdt: str, keys):
    """The values of ``cs`` as the rows of one array."""
    n = len(cs)
    v0 = env.get(cs[0].hash)
    if type(v0) is Row:  # rows of one result (grouped by _sources), in order
        stack, start = v0.stack, v0.index
        if all(type(v := env.get(c.hash)) is Row and v.stack is stack and v.index == start + i
               for i, c in enumerate(cs)):
            if start == 0 and stack.value.shape[0] == n:
                return stack.value
            shape, dtype = stack.value.shape, str(stack.value.dtype)

            def make_slice():
                import jax.lax as lax

                return lambda s, a: lax.dynamic_slice_in_dim(s, a, n)

            import numpy as np

            return cached_kernel(("slice rows", shape, dtype, n), make_slice)(stack.value, np.int32(start))
    if type(cs[0]) is Index:
        whole = cs[0].children[0]
        if whole.shape[0] == n and all(type(c) is Index and c.children[0].hash == whole.hash and _pick(c) == i
                                       for i, c in enumerate(cs)):
            value = env.get(whole.hash)
            if value is None and type(whole) is Array and whole.value is not None:
                value = leaf_value(whole, fdt, [])
            if value is None and keys is not None:
                value = VALUES.get(keys(whole), True)
            if value is not None:
                return materialized(value)
    kept = None
    if keys is not None:  # the rows' keys name the stack: kept for the next run
        kept = ("stack", tuple(keys(c) for c in cs))
        found = VALUES.get(kept)
        if found is not None:
            return found
    values = [_array(env, c) for c in cs]
    shape, dtype = values[0].shape, str(values[0].dtype)

    def make_stack():
        import jax.numpy as jnp

        return lambda *vs: jnp.stack(vs)

    value = cached_kernel(("stack", shape, dtype, n), make_stack)(*values)
    if kept is not None:
        VALUES.put(kept, value)
    return value
