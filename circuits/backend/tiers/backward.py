"""Gradients op by op: one reverse sweep of vector-Jacobian products through cached kernels.

``grads_ops`` differentiates a circuit with respect to some of its nodes without compiling the
whole gradient program: the forward values come from the value cache where known (the clean run
is usually known), and the backward pass runs node by node, over the nodes between the nodes
differentiated and the root only.  What a first gradient compiles is what keeps it slow, so the
common structural nodes take no kernel of their own:

- a Tag or a SetSymbolicShape passes its cotangent on;
- an Add passes its cotangent to each child of its own shape, and sums it over the broadcast axes
  for the others (one kernel per pair of shapes);
- an Index that picks positions with ints (``[i]``, ``[:, j]``; every other axis whole) adds its
  cotangent into its child's at those positions, the positions passed as data: one kernel per
  child shape serves every head of a layer, where a kernel per index would compile one per head,
  and the heads' cotangents land in one array (no zero-filled array per head to add up).

Every other node runs its kernel's vector-Jacobian product (``vjp_kernel``), compiled once per
(operation, shapes, precision, children differentiated) and shared across circuits.

Heads run together.  The sweep goes level by level (a node's level is one more than its deepest
consumer's), and the nodes of one level computing one operation over the same shapes (a layer's
heads, split) run as rows of one ``vmap``-ed vector-Jacobian product: their children's values
stacked (a child every row shares passed once, its cotangent the rows' sum), their cotangents
the rows of the kernel before them where they come in order (no copy), and their picks from one
stacked value added in by one kernel.  Split-head GPT-2's backward pass makes 598 kernel calls
(2,004 head by head).

>>> import numpy as np
>>> from circuits import Array, Einsum, Index, Symbol
>>> x = Symbol((3, 2), name='x')
>>> rows = [Index(x, (i,), name=f'row{i}') for i in range(3)]
>>> y = Einsum.from_spec('a,a,a->', *rows)            # x[0] * x[1] * x[2], summed
>>> _, (g,) = grads_ops(y, [x], {'x': np.arange(1.0, 7.0).reshape(3, 2)}, 'float32')
>>> np.asarray(g).tolist()   # d/dx[0] = x[1] * x[2], ...
[[15.0, 24.0], [5.0, 12.0], [3.0, 8.0]]
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from ...dtypes import dtype_str, is_float
from ...nodes import Add, Circuit, Index, SetSymbolicShape, Tag
from ...traversal import toposort
from ..lower.ops import build_op
from ..lower.program import node_key_part
from .kernels import cached_kernel, int_picks, pick_row
from .op_by_op import OverBudget, RunInfo, run_ops
from .symbols import prepared
from .values import VALUES, Binding

__all__ = ["grads_ops", "vjp_kernel", "picked_positions"]

_PASS = (Tag, SetSymbolicShape)


def vjp_kernel(node: Circuit, fdt: str, need: tuple, rows: int | None = None, axes: tuple = ()):
    """``(child values, cotangent) -> cotangents of the children at positions need``: the
    vector-Jacobian product of ``node``'s kernel, compiled once per (operation, shapes, precision,
    positions) like the kernels.  Over a batch (``rows``): mapped over the rows, the cotangent
    and the children whose ``axes`` entry is 0 carrying them first (the others the same for every
    row), every cotangent out with the rows first: one per (operation, shapes, precision,
    positions, rows, axes), shared as ``kernels.kernel_over_rows`` is."""
    key = ("vjp", node_key_part(node), node.shape, tuple(c.shape for c in node.children), fdt, need)
    if rows is None:
        return cached_kernel(key, lambda: _pull(node, fdt, need))

    def make():
        import jax

        return jax.vmap(_pull(node, fdt, need), in_axes=(axes, 0), out_axes=0)

    return cached_kernel((*key, "rows", rows, axes), make)


def _pull(node: Circuit, fdt: str, need: tuple):
    """The plain (uncompiled) function ``vjp_kernel`` compiles."""
    op = build_op(node, fdt)

    def pull(xs, cotangent):
        import jax

        def partial_op(*picked):
            full = list(xs)
            for i, v in zip(need, picked):
                full[i] = v
            return op(*full)

        _, back = jax.vjp(partial_op, *[xs[i] for i in need])
        return back(cotangent)

    return pull


def picked_positions(node: Index):
    """``(int axes, positions)`` when ``node`` picks with ints only (every other axis whole, in
    order), else None: the Indexes whose cotangent ``_put_rows_kernel`` adds in with the positions as
    data.

    >>> from circuits import Array
    >>> x = Array(np.zeros((4, 3, 2), np.float32))
    >>> picked_positions(Index(x, (2, slice(None), -1))), picked_positions(Index(x, (slice(1, 3),)))
    (((0, 2), (2, 1)), None)
    """
    found = int_picks(node)
    return None if found is None else (found[0], tuple(int(p) for p in found[1]))


def _unbroadcast_kernel(shape: tuple, child_shape: tuple, dtype: str, rows: int | None = None):
    """``g -> g`` summed over the axes along which an Add broadcast a child of ``child_shape``
    to ``shape`` (right-aligned, size-1 axes stretched); ``rows``: ``g`` and the result carry a
    batch axis of ``rows`` first, kept."""
    if rows is None:
        return cached_kernel(("unbroadcast", shape, child_shape, dtype), lambda: _unbroadcast(shape, child_shape))
    return cached_kernel(("unbroadcast", shape, child_shape, dtype, "rows", rows),
                         lambda: _jax().vmap(_unbroadcast(shape, child_shape)))


def _unbroadcast(shape: tuple, child_shape: tuple):
    """The plain function ``_unbroadcast_kernel`` compiles."""
    lead = len(shape) - len(child_shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, n in enumerate(child_shape)
                                      if n == 1 and shape[lead + i] != 1)

    def unbroadcast(g):
        return g.sum(axis=axes).reshape(child_shape) if axes else g.reshape(child_shape)

    return unbroadcast


def _add_kernel(shape: tuple, dtype):
    """``a + b`` compiled once per shape (an eager ``+`` takes JAX's slow dispatch path)."""
    return cached_kernel(("add", shape, str(dtype)), lambda: lambda a, b: a + b)


def filled(value: int, shape: tuple, fdt: str):
    """A device array of ``value`` (made once, then kept in the value cache; made on the host and
    put on the device: ``jnp.zeros`` would compile a kernel per shape)."""
    key = ("filled", value, shape, fdt)
    found = VALUES.get(key)
    if found is None:
        import jax
        import jax.numpy as jnp

        found = jax.device_put(np.full(shape, value, jnp.dtype(fdt)))
        VALUES.put(key, found)
    return found


def grads_ops(root: Circuit, wrt: Sequence[Circuit], inputs: Mapping | None, fdt: str, cotangent=None, *,
              cache: bool = True, info: RunInfo | None = None, batched: bool = False, max_bytes: int | None = None):
    """``(value of root, [d sum(cotangent * root) / d value of w for w in wrt])`` op by op: the
    forward values from the value cache where known, then one reverse sweep (see the module
    docstring) over the nodes between ``wrt`` and ``root`` only.  None when a node of ``wrt`` is
    not in the circuit as evaluated (its Modules substituted).

    ``batched=True``: inputs may carry a leading batch axis (``values.Binding``); the value and
    every gradient then have the rows first (per-row gradients: row ``r``'s of row ``r``'s
    output), the forward values computed over the rows as ``run_ops`` computes them and the
    reverse sweep through vector-Jacobian products mapped over the rows (``vjp_kernel``'s
    ``rows``), node by node; ``cotangent`` may carry the rows too.  ``max_bytes``: raise
    ``OverBudget`` (its ``row_bytes``: one row's new forward values and cotangents) before
    anything runs when the rows' would take more."""
    import jax.numpy as jnp

    (root,), _ = prepared([root])
    order = toposort(root)
    wanted = {w.hash for w in wrt}
    present = {n.hash for n in order}
    if not wanted <= present:
        return None  # not in the circuit as evaluated (absent, or inside a substituted Module)
    on_path: set = set()
    for node in order:
        if is_float(node.dtype) and (node.hash in wanted or any(c.hash in on_path for c in node.children)):
            on_path.add(node.hash)
    # The forward values the backward pass reads: the children of the nodes whose kernels run.
    needed = {}
    picks: dict = {}
    for node in order:
        if node.hash not in on_path or not node.children:
            continue
        t = type(node)
        if t in _PASS or t is Add:
            continue  # their cotangents need no forward value
        if t is Index:
            found = picked_positions(node)
            if found is not None:
                picks[node.hash] = (found[0], np.asarray(found[1], np.int32))
                continue
        for c in node.children:
            needed.setdefault(c.hash, c)
    needed.pop(root.hash, None)
    roots = [root, *needed.values()]
    rows, keys = None, None
    if batched:
        binding = Binding(roots, inputs, fdt, batched=True)
        rows, keys = binding.rows, binding.keys
    if rows is None:
        values = run_ops(roots, inputs, fdt, cache=cache, info=info)
    else:
        spare = None
        if max_bytes is not None:  # the cotangents' bytes: one a node on the path, every one per row
            from ..lower.memory import value_bytes

            back = sum(value_bytes(n, fdt) for n in order if n.hash in on_path)
            spare = max_bytes - back * rows
            if spare < 0:
                raise OverBudget(back)
        try:
            values = run_ops(roots, None, fdt, cache=cache, info=info, binding=binding, max_bytes=spare)
        except OverBudget as over:
            raise OverBudget(over.row_bytes + back) from None
    env = {root.hash: values[0]}
    env.update(zip(needed, values[1:]))
    out = values[0]
    full = root.shape if rows is None else (rows, *root.shape)
    if cotangent is None:
        first = filled(1, full, fdt)
    elif np.shape(cotangent) != full:  # the same weights for every row: repeated on the host
        first = _on_rows(np.asarray(cotangent, fdt), rows)
    else:
        first = jnp.asarray(cotangent, fdt)
    if rows is not None and not keys.is_batched(root):
        out = _on_rows(np.asarray(out), rows)
    sweep = _Sweep(fdt, on_path, picks, env, {root.hash: first}, rows, keys)
    for level in _levels(order, on_path, root):
        sweep.run_level(level)
    grads = [sweep.plain(w.hash) if w.hash in sweep.ct else
             filled(0, w.shape if rows is None else (rows, *w.shape), fdt) for w in wrt]
    return out, grads


def values_and_grads_ops(values_of: Sequence[Circuit], root: Circuit, wrt: Sequence[Circuit],
                         inputs: Mapping | None, fdt: str, batched: bool = False, max_bytes: int | None = None):
    """``(values of values_of, [d sum(root) / d value of w for w in wrt])`` op by op (the values
    through the cached kernels and the value cache, then ``grads_ops``' reverse sweep, which reads
    the same cache): what an op-by-op tier of a gradient method computes.  None as for
    ``grads_ops``.  ``batched=True``: inputs with a leading batch axis give every value and
    gradient with the rows first (per-row gradients); where one call's new values and cotangents
    over the rows would take more than ``max_bytes``, the rows run in chunks (a power of two rows
    each, the last padded with its last row: one set of kernels), joined on the host.  Call it
    within ``precision(fdt)``."""
    if not batched:
        values = run_ops(list(values_of), inputs, fdt)
        found = grads_ops(root, wrt, inputs, fdt)
        return None if found is None else (values, found[1])
    try:
        return _values_and_grads_rows(values_of, root, wrt, inputs, fdt, max_bytes)
    except OverBudget as over:
        binding = Binding([root, *values_of], inputs, fdt, batched=True)
        total = binding.rows
        fit = max(1, min(total, max_bytes // max(1, over.row_bytes)))
        chunk = 1 << (fit.bit_length() - 1)  # a power of two
    parts = []
    for start in range(0, total, chunk):
        part = {}
        for s in binding.free:
            value = binding.values[s.hash]
            if s.hash in binding.keys.batched:
                value = np.asarray(value)[start:start + chunk]
                if len(value) < chunk:  # the last chunk padded: the chunks' kernels serve it
                    value = np.concatenate([value, np.repeat(value[-1:], chunk - len(value), axis=0)])
            part[s] = value
        found = _values_and_grads_rows(values_of, root, wrt, part, fdt, None)
        if found is None:
            return None
        real = min(chunk, total - start)
        parts.append(([np.asarray(v)[:real] for v in found[0]], [np.asarray(g)[:real] for g in found[1]]))
    return ([np.concatenate([p[0][k] for p in parts]) for k in range(len(values_of))],
            [np.concatenate([p[1][k] for p in parts]) for k in range(len(wrt))])


def _values_and_grads_rows(values_of, root, wrt, inputs, fdt, max_bytes):
    """``values_and_grads_ops`` over the rows at once (``OverBudget`` past ``max_bytes``)."""
    found = grads_ops(root, wrt, inputs, fdt, batched=True, max_bytes=max_bytes)  # checks the budget first
    binding = Binding(list(values_of), inputs, fdt, batched=True)
    values = run_ops(binding.roots, None, fdt, binding=binding)
    if binding.rows is not None:  # a value the same for every row, given the rows (a view, on the host)
        keys = binding.keys
        values = [v if keys.is_batched(n) else np.broadcast_to(np.asarray(v), (binding.rows, *n.shape))
                  for n, v in zip(binding.roots, values)]
    return None if found is None else (values, found[1])


def _on_rows(value: np.ndarray, rows: int):
    """``value`` repeated ``rows`` times along a new leading axis, made on the host and put on the
    device (a kernel would compile once per shape)."""
    import jax

    return jax.device_put(np.ascontiguousarray(np.broadcast_to(value, (rows, *value.shape))))


def _levels(order: list, on_path: set, root: Circuit) -> list:
    """The nodes the cotangent reaches, in levels: a node's level is one more than its deepest
    consumer's (the root's is 0), so every contribution to a node's cotangent is made before its
    level runs, and the nodes of one level (a layer's heads) can run together."""
    if root.hash not in on_path:
        return []
    depth = {root.hash: 0}
    levels: list = []
    for node in reversed(order):
        d = depth.get(node.hash)
        if d is None or not node.children:
            continue
        while len(levels) <= d:
            levels.append([])
        levels[d].append(node)
        for c in node.children:
            if c.hash in on_path and depth.get(c.hash, -1) < d + 1:
                depth[c.hash] = d + 1
    return levels


class _Row:
    """Row ``r`` of a value computed for several nodes at once (not sliced until read alone)."""

    __slots__ = ("array", "r")

    def __init__(self, array, r: int):
        self.array = array
        self.r = r


class _Sweep:
    """The reverse sweep's state: cotangents by node hash (a device array or a ``_Row``)."""

    def __init__(self, fdt: str, on_path: set, picks: dict, env: dict, ct: dict, rows: int | None = None,
                 keys=None):
        self.fdt, self.on_path, self.picks, self.env, self.ct = fdt, on_path, picks, env, ct
        # over a batch: every cotangent has the rows first; a forward value has them where
        # keys.is_batched says so
        self.rows, self.keys = rows, keys

    def plain(self, h: bytes):
        v = self.ct[h]
        if type(v) is _Row:
            v = self.ct[h] = pick_row(v.array, v.r)
        return v

    def add_to(self, k: bytes, part) -> None:
        ct = self.ct
        if k not in ct:
            ct[k] = part
            return
        a = self.plain(k)
        b = pick_row(part.array, part.r) if type(part) is _Row else part
        ct[k] = _add_kernel(a.shape, a.dtype)(a, b)

    def run_level(self, nodes: list) -> None:
        groups: dict = {}
        for node in nodes:
            h = node.hash
            if h not in self.ct or h not in self.on_path:
                continue
            t = type(node)
            if t in _PASS or t is Add:
                self._pass(node)
                continue
            pick = self.picks.get(h)
            if pick is not None:
                k = node.children[0]
                if k.hash in self.on_path:
                    groups.setdefault(("put", k.hash, pick[0]), []).append(node)
                continue
            need = tuple(i for i, c in enumerate(node.children) if c.hash in self.on_path)
            if need:
                if self.rows is not None:  # over a batch: node by node
                    self._vjp(node, need)
                    continue
                key = (node_key_part(node), node.shape, tuple(c.shape for c in node.children), need)
                groups.setdefault(key, []).append(node)
        for key, group in groups.items():
            if key[0] == "put":
                self._put(group)
            elif len(group) == 1:
                self._vjp(group[0], key[3])
            else:
                self._vjp_rows(group, key[3])

    def _pass(self, node: Circuit) -> None:
        g = self.ct[node.hash]
        for c in node.children[:1] if type(node) in _PASS else node.children:
            if c.hash not in self.on_path:
                continue
            if c.shape == node.shape:
                self.add_to(c.hash, g)
            else:
                g = self.plain(node.hash)
                self.add_to(c.hash, _unbroadcast_kernel(node.shape, c.shape, dtype_str(g.dtype), self.rows)(g))

    def _vjp(self, node: Circuit, need: tuple) -> None:
        env, kids = self.env, node.children
        if self.rows is None:
            fn = vjp_kernel(node, self.fdt, need)
        else:
            batched = self.keys.is_batched
            fn = vjp_kernel(node, self.fdt, need, self.rows, tuple(0 if batched(c) else None for c in kids))
        parts = fn(tuple(env[c.hash] for c in kids), self.plain(node.hash))
        for i, part in zip(need, parts):
            self.add_to(node.children[i].hash, part)

    def _vjp_rows(self, group: list, need: tuple) -> None:
        """Nodes of one operation and shapes: their vector-Jacobian products as rows of one
        ``vmap``-ed kernel; a child shared by every row is passed once."""
        env, node = self.env, group[0]
        args, axes = [], []
        for i in range(len(node.children)):
            kids = [n.children[i] for n in group]
            if all(k.hash == kids[0].hash for k in kids):
                args.append(env[kids[0].hash])
                axes.append(None)
            else:
                args.append(_stack([env[k.hash] for k in kids]))
                axes.append(0)
        g, g_axis = self._rows_of([n.hash for n in group])
        parts = _vjp_rows_kernel(node, self.fdt, need, tuple(axes), g_axis, len(group))(tuple(args), g)
        for i, part in zip(need, parts):
            if axes[i] is None:  # one child for every row: its cotangent is their sum
                self.add_to(node.children[i].hash, _sum_rows_kernel(part.shape, dtype_str(part.dtype))(part))
                continue
            for r, n in enumerate(group):
                self.add_to(n.children[i].hash, _Row(part, r))

    def _rows_of(self, hashes: list) -> tuple:
        """The cotangents of ``hashes`` as one value: ``(value, None)`` when it is one array for
        all, ``(rows, 0)`` otherwise (the rows of one earlier kernel, in order, taken as they are)."""
        vals = [self.ct[h] for h in hashes]
        v0 = vals[0]
        if type(v0) is not _Row and all(v is v0 for v in vals):
            return v0, None
        if type(v0) is _Row and v0.array.shape[0] == len(vals) and all(
                type(v) is _Row and v.array is v0.array and v.r == r for r, v in enumerate(vals)):
            return v0.array, 0
        return _stack([self.plain(h) for h in hashes]), 0

    def _put(self, group: list) -> None:
        """Int picks of one child on the same axes: their cotangents added into the child's at
        their positions (one kernel for the group)."""
        k = group[0].children[0]
        axes = self.picks[group[0].hash][0]
        rows = self.rows
        if rows is not None:  # over a batch: one pick at a time, mapped over the rows
            acc = self.plain(k.hash) if k.hash in self.ct else filled(0, (rows, *k.shape), self.fdt)
            for n in group:
                g = self.plain(n.hash)
                fn = _put_rows_kernel(k.shape, axes, dtype_str(g.dtype), 1, True, rows)
                acc = fn(acc, g, self.picks[n.hash][1][None])
            self.ct[k.hash] = acc
            return
        acc = self.plain(k.hash) if k.hash in self.ct else filled(0, k.shape, self.fdt)
        if len(group) == 1:
            g = self.plain(group[0].hash)
            fn = _put_rows_kernel(k.shape, axes, dtype_str(g.dtype), 1, True)
            self.ct[k.hash] = fn(acc, g, self.picks[group[0].hash][1][None])
            return
        rows, g_axis = self._rows_of([n.hash for n in group])
        positions = np.stack([self.picks[n.hash][1] for n in group])
        fn = _put_rows_kernel(k.shape, axes, dtype_str(rows.dtype), len(group), g_axis is None)
        self.ct[k.hash] = fn(acc, rows, positions)


def _stack(values: list):
    """``values`` (one shape) stacked on a new leading axis: one kernel per (count, shape)."""
    v = values[0]
    fn = cached_kernel(("stack", len(values), v.shape, dtype_str(v.dtype)), lambda: lambda *xs: _jnp().stack(xs))
    return fn(*values)


def _jnp():
    import jax.numpy as jnp

    return jnp


def _jax():
    import jax

    return jax


def _vjp_rows_kernel(node: Circuit, fdt: str, need: tuple, axes: tuple, g_axis, rows: int):
    """``vjp_kernel``'s function over ``rows`` rows (``vmap``: children's row axes ``axes``, the
    cotangent's ``g_axis``); every output has the rows first."""
    key = ("vjp-rows", node_key_part(node), node.shape, tuple(c.shape for c in node.children), fdt, need, axes,
           g_axis, rows)

    def make():
        import jax

        return jax.vmap(_pull(node, fdt, need), in_axes=(axes, g_axis), out_axes=0)

    return cached_kernel(key, make)


def _sum_rows_kernel(shape: tuple, dtype: str):
    return cached_kernel(("sum-rows", shape, dtype), lambda: lambda x: x.sum(0))


def _put_rows_kernel(shape: tuple, axes: tuple, dtype: str, rows: int, shared: bool, batch: int | None = None):
    """``(acc, g rows, positions [rows, len(axes)]) -> acc`` with each row added at its positions
    (in turn: positions may repeat); ``shared``: one ``g`` for every row.  ``batch``: ``acc`` and
    ``g`` carry a batch axis of ``batch`` first (the positions are the same for every row of it)."""
    if batch is not None:
        return cached_kernel(("put-rows", shape, axes, dtype, rows, shared, "batch", batch),
                             lambda: _jax().vmap(_put_rows(shape, axes, rows, shared), in_axes=(0, 0, None)))
    return cached_kernel(("put-rows", shape, axes, dtype, rows, shared), lambda: _put_rows(shape, axes, rows, shared))


def _put_rows(shape: tuple, axes: tuple, rows: int, shared: bool):
    """The plain function ``_put_rows_kernel`` compiles."""
    import jax.lax as lax
    import jax.numpy as jnp

    rank = len(shape)

    def put_rows(acc, g, positions):
        for r in range(rows):
            at = [jnp.int32(0)] * rank
            for j, axis in enumerate(axes):
                at[axis] = positions[r, j]
            block = lax.expand_dims(g if shared else g[r], axes)
            acc = lax.dynamic_update_slice(acc, lax.dynamic_slice(acc, at, block.shape) + block, at)
        return acc

    return put_rows
