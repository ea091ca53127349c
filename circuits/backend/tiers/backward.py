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
from ..lower.numpy_vjp import numpy_vjp
from ..lower.ops import build_op
from ..lower.program import node_key_part
from . import host as _host
from .groups import foreground
from .kernels import cached_kernel, int_picks, made, pick_key, pick_row
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
    key = _vjp_key(node, fdt, need, rows, axes)
    if rows is None:
        return cached_kernel(key, lambda: _pull(node, fdt, need))

    def make():
        import jax

        return jax.vmap(_pull(node, fdt, need), in_axes=(axes, 0), out_axes=0)

    return cached_kernel(key, make)


def _vjp_key(node: Circuit, fdt: str, need: tuple, rows: int | None = None, axes: tuple = ()):
    key = ("vjp", node_key_part(node), node.shape, tuple(c.shape for c in node.children), fdt, need)
    return key if rows is None else (*key, "rows", rows, axes)


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
    key = _unbroadcast_key(shape, child_shape, dtype, rows)
    if rows is None:
        return cached_kernel(key, lambda: _unbroadcast(shape, child_shape))
    return cached_kernel(key, lambda: _jax().vmap(_unbroadcast(shape, child_shape)))


def _unbroadcast_key(shape: tuple, child_shape: tuple, dtype: str, rows: int | None = None):
    key = ("unbroadcast", shape, child_shape, dtype)
    return key if rows is None else (*key, "rows", rows)


def _unbroadcast(shape: tuple, child_shape: tuple, rows: bool = False):
    """The plain function ``_unbroadcast_kernel`` compiles (``rows``: ``g`` carries a batch axis
    first, kept: what numpy runs for its ``vmap``)."""
    lead = len(shape) - len(child_shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, n in enumerate(child_shape)
                                      if n == 1 and shape[lead + i] != 1)
    if rows:
        axes = tuple(a + 1 for a in axes)

    def unbroadcast(g):
        out = g.sum(axis=axes) if axes else g
        return out.reshape((g.shape[0], *child_shape) if rows else child_shape)

    return unbroadcast


def _add_kernel(shape: tuple, dtype):
    """``a + b`` compiled once per shape (an eager ``+`` takes JAX's slow dispatch path)."""
    return cached_kernel(_add_key(shape, dtype), lambda: lambda a, b: a + b)


def _add_key(shape: tuple, dtype) -> tuple:
    return ("add", shape, str(dtype))


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
              cache: bool = True, info: RunInfo | None = None, batched: bool = False, max_bytes: int | None = None,
              host: str | None = None):
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
    anything runs when the rows' would take more.  ``host``: where numpy computes a step, forward
    and backward (``'pin'``: wherever it can; ``'auto'``: where the step's kernel is not made yet,
    queued to be made in the background; ``circuits.backend.tiers.host``)."""
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
        values = run_ops(roots, inputs, fdt, cache=cache, info=info, host=host)
    else:
        spare = None
        if max_bytes is not None:  # the cotangents' bytes: one a node on the path, every one per row
            from ..lower.memory import value_bytes

            back = sum(value_bytes(n, fdt) for n in order if n.hash in on_path)
            spare = max_bytes - back * rows
            if spare < 0:
                raise OverBudget(back)
        try:
            values = run_ops(roots, None, fdt, cache=cache, info=info, binding=binding, max_bytes=spare, host=host)
        except OverBudget as over:
            raise OverBudget(over.row_bytes + back) from None
    env = {root.hash: values[0]}
    env.update(zip(needed, values[1:]))
    out = values[0]
    full = root.shape if rows is None else (rows, *root.shape)
    on_host = host is not None
    if cotangent is None:
        first = np.full(full, 1, fdt) if on_host else filled(1, full, fdt)
    elif np.shape(cotangent) != full:  # the same weights for every row: repeated on the host
        first = _on_rows(np.asarray(cotangent, fdt), rows, on_host)
    else:
        first = np.array(cotangent, fdt) if on_host else _jnp().asarray(cotangent, fdt)
    if rows is not None and not keys.is_batched(root):
        out = _on_rows(np.asarray(out), rows, on_host)
    sweep = _Sweep(fdt, on_path, picks, env, {root.hash: first}, rows, keys, host)
    with foreground():  # kernels queued for the background wait for a pause, as for the forward
        for level in _levels(order, on_path, root):
            sweep.run_level(level)
    grads = [sweep.plain(w.hash) if w.hash in sweep.ct else
             _zeros(w.shape if rows is None else (rows, *w.shape), fdt, on_host) for w in wrt]
    if info is not None:
        info.numpy += sweep.by_numpy
    return out, grads


def _zeros(shape: tuple, fdt: str, on_host: bool):
    return np.zeros(shape, fdt) if on_host else filled(0, shape, fdt)


def values_and_grads_ops(values_of: Sequence[Circuit], root: Circuit, wrt: Sequence[Circuit],
                         inputs: Mapping | None, fdt: str, batched: bool = False, max_bytes: int | None = None,
                         mode: str = "ops"):
    """``(values of values_of, [d sum(root) / d value of w for w in wrt])`` op by op (the values
    through the cached kernels and the value cache, then ``grads_ops``' reverse sweep, which reads
    the same cache): what an op-by-op tier of a gradient method computes.  None as for
    ``grads_ops``.  ``batched=True``: inputs with a leading batch axis give every value and
    gradient with the rows first (per-row gradients); where one call's new values and cotangents
    over the rows would take more than ``max_bytes``, the rows run in chunks (a power of two rows
    each, the last padded with its last row: one set of kernels), joined on the host.  ``mode``
    (``'ops'``, ``'auto'`` or ``'numpy'``) says where numpy computes a step
    (``circuits.backend.tiers.host``).  Call it within ``precision(fdt)``."""
    host = _host.host_mode(mode, fdt, inputs)
    if not batched:
        values = run_ops(list(values_of), inputs, fdt, host=host)
        found = grads_ops(root, wrt, inputs, fdt, host=host)
        return None if found is None else (values, found[1])
    try:
        return _values_and_grads_rows(values_of, root, wrt, inputs, fdt, max_bytes, host)
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
        found = _values_and_grads_rows(values_of, root, wrt, part, fdt, None, host)
        if found is None:
            return None
        real = min(chunk, total - start)
        parts.append(([np.asarray(v)[:real] for v in found[0]], [np.asarray(g)[:real] for g in found[1]]))
    return ([np.concatenate([p[0][k] for p in parts]) for k in range(len(values_of))],
            [np.concatenate([p[1][k] for p in parts]) for k in range(len(wrt))])


def _values_and_grads_rows(values_of, root, wrt, inputs, fdt, max_bytes, host=None):
    """``values_and_grads_ops`` over the rows at once (``OverBudget`` past ``max_bytes``)."""
    found = grads_ops(root, wrt, inputs, fdt, batched=True, max_bytes=max_bytes, host=host)  # checks the budget first
    binding = Binding(list(values_of), inputs, fdt, batched=True)
    values = run_ops(binding.roots, None, fdt, binding=binding, host=host)
    if binding.rows is not None:  # a value the same for every row, given the rows (a view, on the host)
        keys = binding.keys
        values = [v if keys.is_batched(n) else np.broadcast_to(np.asarray(v), (binding.rows, *n.shape))
                  for n, v in zip(binding.roots, values)]
    return None if found is None else (values, found[1])


def _on_rows(value: np.ndarray, rows: int, on_host: bool = False):
    """``value`` repeated ``rows`` times along a new leading axis, made on the host and put on the
    device (a kernel would compile once per shape; ``on_host``: kept on the host)."""
    value = np.ascontiguousarray(np.broadcast_to(value, (rows, *value.shape)))
    return value if on_host else _jax().device_put(value)


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
    """The reverse sweep's state: cotangents by node hash (an array or a ``_Row``).  ``host``
    (``circuits.backend.tiers.host``): a step whose kernel is not made yet (``'auto'``; every
    step: ``'pin'``) runs with numpy, its kernel queued to be made in the background."""

    def __init__(self, fdt: str, on_path: set, picks: dict, env: dict, ct: dict, rows: int | None = None,
                 keys=None, host: str | None = None):
        self.fdt, self.on_path, self.picks, self.env, self.ct = fdt, on_path, picks, env, ct
        # over a batch: every cotangent has the rows first; a forward value has them where
        # keys.is_batched says so
        self.rows, self.keys, self.host = rows, keys, host
        self.by_numpy = 0  # backward steps numpy computed

    def _on_host(self, key) -> bool:
        """Whether numpy runs the step whose kernel is ``key`` (see the class docstring)."""
        host = self.host
        return host is not None and (host == "pin" or not made(key) or _host.being_made(key))

    def _queue(self, key, kernel, args) -> None:
        """Queue the making of ``kernel()`` (cached under ``key``) for arguments shaped as ``args``."""
        if self.host != "auto":
            return
        specs = _specs(args)
        _host.queue_call([key], self.fdt, lambda: kernel()(*_zeros_of(specs)))

    def _call(self, key, kernel, on_host, *args):
        """``kernel()(*args)``, or ``on_host(*args)`` where numpy runs the step."""
        if self._on_host(key):
            self._queue(key, kernel, args)
            return on_host(*args)
        return kernel()(*args)

    def plain(self, h: bytes):
        v = self.ct[h]
        if type(v) is _Row:
            v = self.ct[h] = self._pick(v)
        return v

    def _pick(self, v: "_Row"):
        a = v.array
        if self._on_host(pick_key(a)):
            return np.asarray(a)[v.r]  # a view: no kernel for it
        return pick_row(a, v.r)

    def add_to(self, k: bytes, part) -> None:
        ct = self.ct
        if k not in ct:
            ct[k] = part
            return
        a = self.plain(k)
        b = self._pick(part) if type(part) is _Row else part
        ct[k] = self._call(_add_key(a.shape, a.dtype), lambda: _add_kernel(a.shape, a.dtype), _np_add, a, b)

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
                dtype, rows = dtype_str(g.dtype), self.rows
                key = _unbroadcast_key(node.shape, c.shape, dtype, rows)
                part = self._call(key, lambda: _unbroadcast_kernel(node.shape, c.shape, dtype, rows),
                                  _unbroadcast(node.shape, c.shape, rows is not None), g)
                self.add_to(c.hash, part)

    def _vjp(self, node: Circuit, need: tuple, queue: bool = True) -> None:
        """``node``'s vector-Jacobian product (``queue``: its kernel queued where numpy runs it)."""
        env, kids = self.env, node.children
        rows, axes = self.rows, ()
        if rows is not None:
            batched = self.keys.is_batched
            axes = tuple(0 if batched(c) else None for c in kids)
        args = (tuple(env[c.hash] for c in kids), self.plain(node.hash))
        key = _vjp_key(node, self.fdt, need, rows, axes)
        pull = numpy_vjp(node, self.fdt, need, None if rows is None else axes) if self._on_host(key) else None
        if pull is not None:
            if queue:
                self._queue(key, lambda: vjp_kernel(node, self.fdt, need, rows, axes), args)
            self.by_numpy += 1
            parts = pull(*args, out=env.get(node.hash))
        else:
            parts = vjp_kernel(node, self.fdt, need, rows, axes)(*args)
        for i, part in zip(need, parts):
            self.add_to(node.children[i].hash, part)

    def _vjp_rows(self, group: list, need: tuple) -> None:
        """Nodes of one operation and shapes: their vector-Jacobian products as rows of one
        ``vmap``-ed kernel; a child shared by every row is passed once.  Where numpy runs the
        step, node by node."""
        env, node = self.env, group[0]
        shared = [all(n.children[i].hash == node.children[i].hash for n in group) for i in range(len(node.children))]
        axes = tuple(None if same else 0 for same in shared)
        hashes = [n.hash for n in group]
        vals = [self.ct[h] for h in hashes]
        g_axis = None if type(vals[0]) is not _Row and all(v is vals[0] for v in vals) else 0
        key = _vjp_rows_key(node, self.fdt, need, axes, g_axis, len(group))
        if self._on_host(key) and numpy_vjp(node, self.fdt, need) is not None:
            kids = node.children
            g_shape = node.shape if g_axis is None else (len(group), *node.shape)
            specs = (tuple(_Spec(c.shape if shared[i] else (len(group), *c.shape), _dtype_of(env[c.hash]))
                           for i, c in enumerate(kids)), _Spec(g_shape, _dtype_of(self.plain(hashes[0]))))
            self._queue(key, lambda: _vjp_rows_kernel(node, self.fdt, need, axes, g_axis, len(group)), specs)
            for n in group:
                self._vjp(n, need, queue=False)
            return
        args = []
        for i in range(len(node.children)):
            if shared[i]:
                args.append(env[node.children[i].hash])
            else:
                args.append(self._stack([env[n.children[i].hash] for n in group]))
        g, g_axis = self._rows_of(hashes)
        parts = _vjp_rows_kernel(node, self.fdt, need, axes, g_axis, len(group))(tuple(args), g)
        for i, part in zip(need, parts):
            if shared[i]:  # one child for every row: its cotangent is their sum
                dtype = dtype_str(part.dtype)
                total = self._call(_sum_rows_key(part.shape, dtype), lambda: _sum_rows_kernel(part.shape, dtype),
                                   _np_sum_rows, part)
                self.add_to(node.children[i].hash, total)
                continue
            for r, n in enumerate(group):
                self.add_to(n.children[i].hash, _Row(part, r))

    def _stack(self, values: list):
        n, shape, dtype = len(values), values[0].shape, dtype_str(values[0].dtype)
        return self._call(_stack_key(n, shape, dtype), lambda: _stack_kernel(n, shape, dtype), _np_stack, *values)

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
        return self._stack([self.plain(h) for h in hashes]), 0

    def _put(self, group: list) -> None:
        """Int picks of one child on the same axes: their cotangents added into the child's at
        their positions (one kernel for the group)."""
        k = group[0].children[0]
        axes = self.picks[group[0].hash][0]
        rows = self.rows

        def put(acc, g, positions, n, shared, batch=None):
            dtype = dtype_str(g.dtype)
            key = _put_rows_key(k.shape, axes, dtype, n, shared, batch)
            return self._call(key, lambda: _put_rows_kernel(k.shape, axes, dtype, n, shared, batch),
                              _np_put_rows(axes, n, shared, batch is not None), acc, g, positions)

        start = (rows, *k.shape) if rows is not None else k.shape
        acc = self.plain(k.hash) if k.hash in self.ct else _zeros(start, self.fdt, self.host is not None)
        if rows is not None:  # over a batch: one pick at a time, mapped over the rows
            for n in group:
                acc = put(acc, self.plain(n.hash), self.picks[n.hash][1][None], 1, True, rows)
            self.ct[k.hash] = acc
            return
        if len(group) == 1:
            self.ct[k.hash] = put(acc, self.plain(group[0].hash), self.picks[group[0].hash][1][None], 1, True)
            return
        g, g_axis = self._rows_of([n.hash for n in group])
        positions = np.stack([self.picks[n.hash][1] for n in group])
        self.ct[k.hash] = put(acc, g, positions, len(group), g_axis is None)


class _Spec:
    """The shape and dtype of an argument a queued kernel is made for (zeros of them)."""

    __slots__ = ("shape", "dtype")

    def __init__(self, shape, dtype):
        self.shape, self.dtype = tuple(shape), dtype


def _dtype_of(value):
    return np.dtype(dtype_str(value.dtype))


def _specs(args):
    """``args`` (arrays, nested in tuples) as ``_Spec``s: what a queued kernel is made for,
    without holding the arrays."""
    if isinstance(args, tuple):
        return tuple(_specs(a) for a in args)
    if type(args) is _Spec:
        return args
    return _Spec(np.shape(args), _dtype_of(args) if hasattr(args, "dtype") else np.asarray(args).dtype)


def _zeros_of(specs):
    if isinstance(specs, tuple):
        return tuple(_zeros_of(s) for s in specs)
    return np.zeros(specs.shape, specs.dtype)


def _np_add(a, b):
    return np.add(a, b)


def _np_sum_rows(x):
    return np.asarray(x).sum(0)


def _np_stack(*xs):
    return np.stack([np.asarray(x) for x in xs])


def _np_put_rows(axes: tuple, rows: int, shared: bool, batched: bool):
    """``_put_rows``' function on numpy arrays (``batched``: ``acc`` and ``g`` carry the rows
    first, the positions the same for every row)."""

    def put_rows(acc, g, positions):
        acc = np.array(acc, copy=True)
        g = np.asarray(g)
        lead = 1 if batched else 0
        for r in range(rows):
            at = [slice(None)] * (acc.ndim - lead)
            for j, axis in enumerate(axes):
                at[axis] = int(positions[r, j])
            acc[(slice(None),) * lead + tuple(at)] += g if shared else g[r]
        return acc

    return put_rows


def _stack_kernel(count: int, shape: tuple, dtype: str):
    """``values`` (``count`` of one shape) stacked on a new leading axis: one kernel per (count, shape)."""
    return cached_kernel(_stack_key(count, shape, dtype), lambda: lambda *xs: _jnp().stack(xs))


def _stack_key(count: int, shape: tuple, dtype: str) -> tuple:
    return ("stack", count, shape, dtype)


def _jnp():
    import jax.numpy as jnp

    return jnp


def _jax():
    import jax

    return jax


def _vjp_rows_kernel(node: Circuit, fdt: str, need: tuple, axes: tuple, g_axis, rows: int):
    """``vjp_kernel``'s function over ``rows`` rows (``vmap``: children's row axes ``axes``, the
    cotangent's ``g_axis``); every output has the rows first."""
    key = _vjp_rows_key(node, fdt, need, axes, g_axis, rows)

    def make():
        import jax

        return jax.vmap(_pull(node, fdt, need), in_axes=(axes, g_axis), out_axes=0)

    return cached_kernel(key, make)


def _vjp_rows_key(node: Circuit, fdt: str, need: tuple, axes: tuple, g_axis, rows: int):
    return ("vjp-rows", node_key_part(node), node.shape, tuple(c.shape for c in node.children), fdt, need, axes,
            g_axis, rows)


def _sum_rows_kernel(shape: tuple, dtype: str):
    return cached_kernel(_sum_rows_key(shape, dtype), lambda: lambda x: x.sum(0))


def _sum_rows_key(shape: tuple, dtype: str) -> tuple:
    return ("sum-rows", shape, dtype)


def _put_rows_kernel(shape: tuple, axes: tuple, dtype: str, rows: int, shared: bool, batch: int | None = None):
    """``(acc, g rows, positions [rows, len(axes)]) -> acc`` with each row added at its positions
    (in turn: positions may repeat); ``shared``: one ``g`` for every row.  ``batch``: ``acc`` and
    ``g`` carry a batch axis of ``batch`` first (the positions are the same for every row of it)."""
    key = _put_rows_key(shape, axes, dtype, rows, shared, batch)
    if batch is not None:
        return cached_kernel(key, lambda: _jax().vmap(_put_rows(shape, axes, rows, shared), in_axes=(0, 0, None)))
    return cached_kernel(key, lambda: _put_rows(shape, axes, rows, shared))


def _put_rows_key(shape: tuple, axes: tuple, dtype: str, rows: int, shared: bool, batch: int | None = None):
    key = ("put-rows", shape, axes, dtype, rows, shared)
    return key if batch is None else (*key, "batch", batch)


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
