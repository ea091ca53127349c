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

An Add of two or more rows of one result (an ablation's sum of a layer's heads, one replaced) is
one kernel over the whole result.  A rows kernel returns the whole result and each row as an array
of its own, from the one call: the value cache keeps plain arrays, and the next group reads the
whole result.  A one-head change meets no group and computes that head alone, as before.

>>> import numpy as np
>>> from circuits import Array, Einsum, Index, Symbol, Add
>>> x = Symbol((3,), name='x')
>>> w = Array(np.arange(12.0, dtype=np.float32).reshape(4, 3), name='w')
>>> heads = [Einsum.from_spec('a,a->', x, Index(w, (h,))) for h in range(4)]
>>> from circuits.backend.incremental import run_ops
>>> [float(v) for v in run_ops(heads, {'x': np.ones(3)}, 'float32', rows=True)]   # one kernel
[3.0, 12.0, 21.0, 30.0]
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from ..nodes import Add, Array, Circuit, Index, SetSymbolicShape, Tag
from .incremental import VALUES, cached_kernel, kernel, kernel_entry, kernel_made
from .ops import build_op
from .runtime import leaf_value, precision

__all__ = ["compute"]

_PASS = (Tag, SetSymbolicShape)
ENABLED = True  # False: every node alone (for comparison)


def compute(todo: list, env: dict, fdt: str, store: Callable | None, keys: Callable | None,
            grouped: bool = True) -> None:
    """Compute the nodes ``todo`` (in toposort order) into ``env`` (node hash -> value, holding
    every child already known): groups of rows as above, the rest node by node.  ``store(node,
    value)`` keeps a computed value; ``keys(node)`` is a node's value-cache key (None: nothing is
    kept); ``grouped=False``: every node alone."""
    if not grouped or not ENABLED:
        run = _Run(env, fdt, store, keys)
        for node in todo:
            run.one(node)
        return
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
            gkey = (lv, kernel_entry(node, fdt)[0], _sources(node, group_of))
        g = ids.get(gkey)
        if g is None:
            g = ids[gkey] = len(groups)
            groups.append((lv, []))
        groups[g][1].append(node)
        group_of[node.hash] = g
    run = _Run(env, fdt, store, keys)
    for _, rows in sorted(groups, key=lambda lg: lg[0]):
        if len(rows) == 1:
            run.one(rows[0])
        elif run.ready(rows):
            run.rows(rows)
        else:  # a grouping new to the process: node by node now, its kernels made aside
            for node in rows:
                run.one(node)
            run.warm(rows)


def _sources(node: Circuit, group_of: dict) -> tuple:
    """Where the children that may differ between rows come from: the stacked tensor a pick reads
    or the group computing them in this run (rows reading different ones are not grouped)."""
    out = []
    for c in node.children:
        if type(c) is Index and _pick(c) is not None:
            out.append(c.children[0].hash)
        else:
            out.append(group_of.get(c.hash))
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


_warming: set = set()  # rows kernels being made in the background


def _rows_key(rows: list, fdt: str) -> tuple:
    """The key of a group's rows kernel: operation, which children the rows share, row count."""
    first = rows[0]
    axes = tuple(None if all(r.children[j].hash == c.hash for r in rows) else 0
                 for j, c in enumerate(first.children))
    return "rows", kernel_entry(first, fdt)[0], axes, len(rows)


def stack_kernel(n: int, shape: tuple, dtype: str):
    """``(*values) -> values stacked on a new leading axis``: one kernel per (count, shape)."""
    def make():
        import jax.numpy as jnp

        return lambda *xs: jnp.stack(xs)

    return cached_kernel(("stack", n, shape, dtype), make)


class _Run:
    """One ``compute``: ``env`` and, for the nodes computed as rows here, where their row is
    (``at``: node hash -> (whole result, row))."""

    def __init__(self, env: dict, fdt: str, store, keys):
        self.env, self.fdt, self.store, self.keys = env, fdt, store, keys
        self.at: dict = {}

    def one(self, node: Circuit) -> None:
        env = self.env
        t = type(node)
        if t in _PASS:
            env[node.hash] = env[node.children[0].hash]
            return
        value = self._sum_of_rows(node) if t is Add else None
        if value is None:
            value = kernel(node, self.fdt)(*[env[c.hash] for c in node.children])
        env[node.hash] = value
        if self.store is not None:
            self.store(node, value)

    def _sum_of_rows(self, node: Add):
        """An Add of two or more rows of one result (any rows, any order, a row twice) and other
        values, all of the Add's shape: one kernel over the whole result, the rows'
        multiplicities passed as data."""
        whole, counts, others = None, None, []
        for c in node.children:
            if c.shape != node.shape:
                return None
            found = self.at.get(c.hash)
            if found is not None and (whole is None or found[0] is whole):
                if whole is None:
                    whole = found[0]
                    counts = [0] * whole.shape[0]
                counts[found[1]] += 1
            else:
                others.append(self.env[c.hash])
        if whole is None or sum(counts) < 2:
            return None

        def make():
            def summed(s, k, *rest):
                k = k.reshape((-1,) + (1,) * (s.ndim - 1))
                # no 0 * inf from a row left out; a product and a sum, not a matmul (no TF32)
                import jax.numpy as jnp

                total = (jnp.where(k > 0, s, 0) * k).sum(0)
                for r in rest:
                    total = total + r
                return total

            return summed

        fn = cached_kernel(("sum rows", whole.shape, str(whole.dtype), len(others)), make)
        return fn(whole, np.asarray(counts, whole.dtype), *others)

    def ready(self, rows: list) -> bool:
        """Whether the rows kernel of this group is made (without background work, it is made now)."""
        from . import tiers

        return not tiers.BACKGROUND or kernel_made(_rows_key(rows, self.fdt))

    def warm(self, rows: list) -> None:
        """Make this group's kernels in a background thread (running them once on its values),
        so that the next run takes the group as rows: a new grouping compiles aside, not in the
        call that meets it."""
        import jax

        from . import tiers

        key = _rows_key(rows, self.fdt)
        if key in _warming:
            return
        _warming.add(key)  # (tried once: a failure leaves the group node by node)
        needed = {c.hash: self.env[c.hash] for r in rows for c in r.children}
        side = _Run(needed, self.fdt, None, self.keys)
        side.at = {h: self.at[h] for h in needed if h in self.at}
        matmul = jax.config.jax_default_matmul_precision

        def make():  # in the caller's float and matmul precision (thread-local settings)
            with precision(self.fdt), jax.default_matmul_precision(matmul):
                side.rows(rows)

        tiers.in_background(make, name="circuits-rows")

    def rows(self, rows: list) -> None:
        first, env, fdt = rows[0], self.env, self.fdt
        n = len(rows)
        args, axes = [], []
        for j, c0 in enumerate(first.children):
            cs = [r.children[j] for r in rows]
            if all(c.hash == c0.hash for c in cs):
                args.append(env[c0.hash])
                axes.append(None)
            else:
                args.append(self._stacked(cs))
                axes.append(0)
        if 0 not in axes:  # the same operation on the same values (nodes differing in name only)
            value = kernel(first, fdt)(*args)
            for r in rows:
                env[r.hash] = value
                if self.store is not None:
                    self.store(r, value)
            return

        def make():
            import jax

            f = jax.vmap(build_op(first, fdt), in_axes=tuple(axes))

            def both(*xs):
                whole = f(*xs)
                return whole, tuple(whole[i] for i in range(n))

            return both

        whole, each = cached_kernel(("rows", kernel_entry(first, fdt)[0], tuple(axes), n), make)(*args)
        for i, r in enumerate(rows):
            env[r.hash] = each[i]
            self.at[r.hash] = (whole, i)
            if self.store is not None:
                self.store(r, each[i])

    def _stacked(self, cs: list):
        """The values of ``cs`` as the rows of one array."""
        n, env, at = len(cs), self.env, self.at
        found = at.get(cs[0].hash)
        if found is not None:  # rows of one result computed here, in order: it, or a slice of it
            whole, start = found
            if all((f := at.get(c.hash)) is not None and f[0] is whole and f[1] == start + i
                   for i, c in enumerate(cs)):
                if start == 0 and whole.shape[0] == n:
                    return whole

                def make_slice():
                    import jax.lax as lax

                    return lambda s, a: lax.dynamic_slice_in_dim(s, a, n)

                key = ("slice rows", whole.shape, str(whole.dtype), n)
                return cached_kernel(key, make_slice)(whole, np.int32(start))
        if type(cs[0]) is Index:  # X[0], X[1], ... X[n-1]: X
            x = cs[0].children[0]
            if x.shape[0] == n and all(type(c) is Index and c.children[0].hash == x.hash and _pick(c) == i
                                       for i, c in enumerate(cs)):
                value = env.get(x.hash)
                if value is None and type(x) is Array and x.value is not None:
                    value = leaf_value(x, self.fdt, [])
                if value is None and self.keys is not None:
                    value = VALUES.get(self.keys(x))
                if value is not None:
                    return value
        kept = None
        if self.keys is not None:  # the rows' keys name the stack: kept for the next run
            kept = ("stack", tuple(self.keys(c) for c in cs))
            value = VALUES.get(kept)
            if value is not None:
                return value
        values = [env[c.hash] for c in cs]
        value = stack_kernel(n, values[0].shape, str(values[0].dtype))(*values)
        if kept is not None:
            VALUES.put(kept, value)
        return value
