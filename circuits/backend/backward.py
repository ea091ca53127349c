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

from ..dtypes import is_float
from ..nodes import Add, Circuit, Index, SetSymbolicShape, Tag
from ..traversal import toposort
from .incremental import VALUES, RunInfo, cached_kernel, prepared, run_ops
from .ops import build_op
from .program import node_key_part

__all__ = ["grads_ops", "vjp_kernel", "picked_positions"]

_PASS = (Tag, SetSymbolicShape)


def vjp_kernel(node: Circuit, fdt: str, need: tuple):
    """``(child values, cotangent) -> cotangents of the children at positions need``: the
    vector-Jacobian product of ``node``'s kernel, compiled once per (operation, shapes, precision,
    positions) like the kernels."""
    key = ("vjp", node_key_part(node), node.shape, tuple(c.shape for c in node.children), fdt, need)

    def make():
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

    return cached_kernel(key, make)


def picked_positions(node: Index):
    """``(int axes, positions)`` when ``node`` picks with ints only (every other axis whole, in
    order), else None: the Indexes whose cotangent ``_put_kernel`` adds in with the positions as
    data.

    >>> from circuits import Array
    >>> x = Array(np.zeros((4, 3, 2), np.float32))
    >>> picked_positions(Index(x, (2, slice(None), -1))), picked_positions(Index(x, (slice(1, 3),)))
    (((0, 2), (2, 1)), None)
    """
    axes, positions = [], []
    for axis, (entry, n) in enumerate(zip(node.full_index(), node.children[0].shape)):
        if type(entry) is int:
            axes.append(axis)
            positions.append(entry % n)
        elif type(entry) is not slice or entry.indices(n) != (0, n, 1):
            return None
    if not axes:
        return None
    return tuple(axes), tuple(positions)


def _put_kernel(shape: tuple, axes: tuple, dtype: str):
    """``(acc, g, positions) -> acc`` with ``g`` added at ``positions`` on ``axes``: the
    cotangent of an int pick added into its child's (``acc`` zeros for the first)."""

    def make():
        import jax.lax as lax
        import jax.numpy as jnp

        rank = len(shape)

        def put_add(acc, g, positions):
            at = [jnp.int32(0)] * rank
            for j, axis in enumerate(axes):
                at[axis] = positions[j]
            block = lax.expand_dims(g, axes)
            return lax.dynamic_update_slice(acc, lax.dynamic_slice(acc, at, block.shape) + block, at)

        return put_add

    return cached_kernel(("put", shape, axes, dtype), make)


def _unbroadcast_kernel(shape: tuple, child_shape: tuple, dtype: str):
    """``g -> g`` summed over the axes along which an Add broadcast a child of ``child_shape``
    to ``shape`` (right-aligned, size-1 axes stretched)."""

    def make():
        lead = len(shape) - len(child_shape)
        axes = tuple(range(lead)) + tuple(lead + i for i, n in enumerate(child_shape)
                                          if n == 1 and shape[lead + i] != 1)

        def unbroadcast(g):
            return g.sum(axis=axes).reshape(child_shape) if axes else g.reshape(child_shape)

        return unbroadcast

    return cached_kernel(("unbroadcast", shape, child_shape, dtype), make)


def _add_kernel(shape: tuple, dtype):
    """``a + b`` compiled once per shape (an eager ``+`` takes JAX's slow dispatch path)."""
    return cached_kernel(("add", shape, str(dtype)), lambda: lambda a, b: a + b)


def filled(value: int, shape: tuple, fdt: str):
    """A device array of ``value`` (made on the device once, then kept in the value cache)."""
    key = ("filled", value, shape, fdt)
    found = VALUES.get(key)
    if found is None:
        import jax.numpy as jnp

        found = (jnp.ones if value else jnp.zeros)(shape, fdt)
        VALUES.put(key, found)
    return found


def grads_ops(root: Circuit, wrt: Sequence[Circuit], inputs: Mapping | None, fdt: str, cotangent=None, *,
              cache: bool = True, info: RunInfo | None = None):
    """``(value of root, [d sum(cotangent * root) / d value of w for w in wrt])`` op by op: the
    forward values from the value cache where known, then one reverse sweep (see the module
    docstring) over the nodes between ``wrt`` and ``root`` only.  None when a node of ``wrt`` is
    not in the circuit as evaluated (its Modules substituted)."""
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
    values = run_ops([root, *needed.values()], inputs, fdt, cache=cache, info=info)
    env = {root.hash: values[0]}
    env.update(zip(needed, values[1:]))
    out = values[0]
    ct = {root.hash: filled(1, root.shape, fdt) if cotangent is None else jnp.asarray(cotangent, fdt)}

    def add_to(k: bytes, part) -> None:
        ct[k] = part if k not in ct else _add_kernel(part.shape, part.dtype)(ct[k], part)

    for node in reversed(order):
        h = node.hash
        g = ct.get(h)
        if g is None or not node.children or h not in on_path:
            continue
        kids = node.children
        t = type(node)
        if t in _PASS:
            if kids[0].hash in on_path:
                add_to(kids[0].hash, g)
            continue
        if t is Add:
            for c in kids:
                if c.hash in on_path:
                    add_to(c.hash, g if c.shape == node.shape else
                           _unbroadcast_kernel(node.shape, c.shape, str(g.dtype))(g))
            continue
        pick = picks.get(h)
        if pick is not None:
            k = kids[0]
            if k.hash in on_path:
                axes, positions = pick
                acc = ct[k.hash] if k.hash in ct else filled(0, k.shape, fdt)
                ct[k.hash] = _put_kernel(k.shape, axes, str(g.dtype))(acc, g, positions)
            continue
        need = tuple(i for i, c in enumerate(kids) if c.hash in on_path)
        if not need:
            continue
        parts = vjp_kernel(node, fdt, need)(tuple(env[c.hash] for c in kids), g)
        for i, part in zip(need, parts):
            add_to(kids[i].hash, part)
    grads = [ct[w.hash] if w.hash in ct else filled(0, w.shape, fdt) for w in wrt]
    return out, grads
