"""The op-by-op tier: a circuit evaluated node by node through the kernels cached per operation
(``kernels``), over the values already known (``values``): incremental evaluation.

Research is mostly one-off experiments: a new ablation, a new path patch, each a structure never
seen before.  Compiling each one whole with XLA costs seconds; this module evaluates such a
structure *op by op* and *incrementally*:

- **Values are kept.**  Every value computed in the process is offered to one bounded cache
  (least recently used first out, bounded in bytes, on the device), keyed by the node's identity
  (its hash: structure, names and Array contents) and by the identity of the values bound to the
  Symbols it depends on (each bound value is hashed on binding, so writing into the caller's numpy
  array afterwards can never make a cached value stale).  Evaluating a variant computes only the
  nodes whose value is not already known: ablating a layer-1 head reuses all of layer 0, a path
  patch reuses the clean run.
- **Kernels are cached across circuits.**  Each operation runs through a function compiled once
  per (operation, shapes, float precision) — every head's einsums, every layer's norm share one —
  so a new variant of a known model compiles nothing new.

Which Symbols a node depends on is a structural property: it is filled in once per node (a slot
on the node), so a variant pays only for its new nodes.

>>> import numpy as np
>>> from circuits import Symbol, GeneralFunction, Add
>>> x = Symbol((2,), name='x')
>>> y = GeneralFunction('exp', x, name='y')
>>> [float(v) for v in run_ops([Add(y, y)], {'x': np.zeros(2)}, 'float32')[0]]
[2.0, 2.0]
>>> before = value_cache_info()['hits']
>>> [float(v) for v in run_ops([Add(y, x)], {'x': np.zeros(2)}, 'float32')[0]]   # y is reused
[1.0, 1.0]
>>> value_cache_info()['hits'] - before
1
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np

from ...dtypes import is_float, is_int
from ...errors import EvaluationError
from ...nodes import Array, Circuit, Scalar, Symbol
from ...progress import notice_after, shown
from ...shapes import check_allocation, max_alloc_bytes
from ...traversal import toposort
from ..cache.background import WARM, wait_for
from ..lower.binding import check_index_values, leaf_value, raise_problems
from ..lower.memory import value_bytes
from . import groups as _groups
from . import host as _host
from .kernels import (
    broadcast_kernel,
    kernel,
    kernel_keys,
    kernel_over_rows,
    made,
    new_kernels,
    sum_over_rows,
    sums_pairwise,
)
from .values import VALUES, Binding, shape_key, value_cache_info  # noqa: F401 - value_cache_info: the docstring's example

__all__ = ["RunInfo", "run_ops", "check_leaf_indices", "OverBudget"]


# ---------------------------------------------------------------------------- op-by-op evaluation
class OverBudget(Exception):
    """Raised by ``run_ops(max_bytes=)`` before anything is computed: the values a run over a
    batch would make take more than ``max_bytes``; ``row_bytes`` is what one row's take (the
    caller splits the batch into chunks of rows).  Never reaches a user."""

    def __init__(self, row_bytes: int):
        super().__init__(row_bytes)
        self.row_bytes = row_bytes


class RunInfo:
    """What one op-by-op evaluation did: ``computed`` nodes (``numpy`` of them with numpy,
    ``circuits.backend.tiers.host``), ``reused`` cached values."""

    __slots__ = ("computed", "reused", "numpy")

    def __init__(self):
        self.computed = 0
        self.reused = 0
        self.numpy = 0


def check_leaf_indices(nodes: Sequence[Circuit], ranges: dict, bound: dict, problems: list) -> None:
    """Range-check the int leaves among ``nodes`` that reach a gather (``ranges``:
    ``io.values.gather_index_ranges``): an Array's values, or a Symbol's bound value (``bound``,
    by Symbol hash); an unbound Symbol or a placeholder Array is reported where it is bound."""
    for node in nodes:
        r = ranges.get(node.hash)
        if r is None or node.children:
            continue
        value = bound.get(node.hash) if type(node) is Symbol else None
        if value is None and (type(node) is Symbol or node.value is None):
            continue
        check_index_values(node, value, r, problems)


def _run_each(nodes: Sequence[Circuit], env: dict, fdt: str, keys, store: list | None, host: str | None = None,
              devices: dict | None = None) -> int:
    """Compute ``nodes`` (children before parents) one kernel each into ``env``; each value goes
    to ``store`` for the value cache (None: not kept).  Over a batch (``keys.rows``), a node that
    depends on a batched Symbol runs its kernel mapped over the rows (``kernel_over_rows``).
    ``host``: ``'pin'`` computes every node that has a numpy op with numpy, ``'auto'`` those whose
    kernel is not made yet (queued to be made in the background); ``devices``: the device values
    of leaves that ``env`` holds as numpy (a kernel reads those).  Returns how many nodes numpy
    computed."""
    rows = keys.rows
    batched = keys.is_batched
    by_numpy = 0
    for node in nodes:
        kids = node.children
        if host is not None:
            value = _on_host(node, env, fdt, keys, host)
            if value is not None:
                env[node.hash] = value
                by_numpy += 1
                if store is not None:
                    _keep(node, value, keys, store)
                continue
            if devices:
                for c in kids:
                    device = devices.get(c.hash)
                    if device is not None:
                        env[c.hash] = device
        if rows is not None and batched(node):
            flags = [batched(c) for c in kids]
            if sums_pairwise(node):
                value = sum_over_rows(node, [env[c.hash] for c in kids], flags, fdt, rows)
            else:
                axes = tuple(0 if f else None for f in flags)
                value = kernel_over_rows(node, fdt, axes, rows)(*[env[c.hash] for c in kids])
        else:
            value = kernel(node, fdt)(*[env[c.hash] for c in kids])
        env[node.hash] = value
        if store is not None:
            _keep(node, value, keys, store)
    return by_numpy


def _on_host(node: Circuit, env: dict, fdt: str, keys, host: str):
    """``node``'s value computed with numpy where ``host`` says so (see ``_run_each``), else None."""
    wanted = None
    if host == "auto":
        wanted = kernel_keys(node, fdt, keys)
        if not wanted or all(made(k) and not _host.being_made(k) for k in wanted):
            return None
    rows = keys.rows
    axes = None
    if rows is not None and keys.is_batched(node):
        axes = tuple(0 if keys.is_batched(c) else None for c in node.children)
    op = _host.host_op(node, fdt, axes)
    if op is None:
        return None
    args = [env[c.hash] for c in node.children]
    value = op(*args)
    if wanted is not None:
        _host.queue_kernel(node, fdt, lambda env: _run_each([node], env, fdt, keys, None), wanted,
                           [(a.shape, a.dtype) for a in args])
    return value


def _keep(node: Circuit, value, keys, store: list) -> None:
    """Add ``(key, value, bytes)`` of ``node`` to ``store``: under its key, and under its shape
    key when its value depends on shapes alone."""
    size = math.prod(value.shape) * value.dtype.itemsize
    store.append((keys(node), value, size))
    by_shape = keys.by_shape(node)
    if by_shape is not None:
        store.append((by_shape, value, size))


def run_ops(roots: Sequence[Circuit], inputs: Mapping | None, fdt: str, *, cache: bool = True,
            info: RunInfo | None = None, keep_all: bool = False, groups: bool = False, warm: bool = False,
            binding: Binding | None = None, batched: bool = False, max_bytes: int | None = None,
            host: str | None = None):
    """Device values of ``roots``, computed op by op through cached kernels over the values the
    cache already holds (``cache=False``: neither read nor written).  Every input is checked
    before anything runs.  ``keep_all=True`` also returns ``{node hash: value}`` of every node
    the walk reached (the gradients read them).  ``groups=True`` runs the fused groups that are
    compiled (``circuits.backend.groups``) and queues the others' compilation.  ``warm=True``
    computes the roots again though the cache holds them, and keeps the values the cache had.
    ``binding``: the ``Binding`` of these roots and inputs, made already (they are not bound again).
    ``batched=True``: inputs may carry a leading batch axis (``Binding``); a root that depends on
    a batched Symbol then has it first (fused groups are not used over a batch); ``max_bytes``:
    raise ``OverBudget`` before computing anything when the new values over the batch (the
    op-by-op tier keeps each until the call ends) would take more.  ``host``: which nodes numpy
    computes (``'pin'``, ``'auto'``: ``circuits.backend.tiers.host``; None: none)."""
    if cache and not warm:
        # the warm-up after a new process's first, whole-program evaluation: wait for it rather
        # than compile the same kernels and compute the same values beside it
        wait_for(WARM)
    with _groups.foreground():
        return _run_ops(binding or Binding(roots, inputs, fdt, batched), fdt, cache, info, keep_all, groups, warm,
                        max_bytes, host)


class _DeviceLeaves:
    """The device values of the leaves a run on the host holds as numpy, uploaded when a kernel
    first reads one (``leaf_value``: once per value and process)."""

    __slots__ = ("nodes", "fdt", "values", "targets")

    def __init__(self, nodes: dict, fdt: str):
        self.nodes, self.fdt, self.values, self.targets = nodes, fdt, {}, {}

    def __bool__(self):
        return bool(self.nodes)

    def get(self, h):
        node = self.nodes.get(h)
        if node is None:
            return None
        value = self.values.get(h)
        if value is None:
            if type(node) is Scalar and node.shape != ():
                return None  # its numpy value (broadcasting it on the device would compile a kernel)
            value = self.values[h] = leaf_value(node, self.fdt, [], self.targets)
        return value


def _run_ops(binding, fdt, cache, info, keep_all, groups, warm, max_bytes=None, host=None):
    roots, bound, keys = binding.roots, binding.values, binding.keys
    again = {r.hash for r in roots} if warm else ()
    problems = list(binding.problems)
    env: dict = {}
    get = VALUES.get
    if cache:
        def stop(node):
            if node.hash in again:
                return False
            value = get(keys(node))
            if value is None:
                by_shape = keys.by_shape(node)
                if by_shape is None:
                    return False
                value = get(by_shape)
                if value is None:
                    return False
            env[node.hash] = value
            return True

        order = toposort(*roots, stop=stop)
    else:
        order = toposort(*roots)
    # Checks before anything runs: allocation budget, index ranges of what is read afresh.
    budget = max_alloc_bytes()
    int_leaves = False
    rows = keys.rows
    for node in order:
        if node.hash in env:
            continue
        shape = (rows, *node.shape) if rows is not None and keys.is_batched(node) else node.shape
        check_allocation(shape, fdt if is_float(node.dtype) else node.dtype, node.line, EvaluationError, budget)
        if not node.children and is_int(node.dtype):
            int_leaves = True
    if int_leaves:
        from ...io.values import gather_index_ranges

        check_leaf_indices([n for n in order if n.hash not in env], gather_index_ranges(order), bound, problems)
    targets: dict = {}
    put = VALUES.put
    devices = None
    if host is not None:
        devices = _DeviceLeaves({}, fdt)
        for node in order:
            if not node.children and node.hash not in env:
                t = type(node)
                if t is Symbol:
                    if node.hash in bound:  # a private copy: numpy's views of it may be kept
                        value = np.array(bound[node.hash], copy=True)
                        value.flags.writeable = False
                        env[node.hash] = value
                elif t is Array or t is Scalar:
                    env[node.hash] = _host.leaf_on_host(node, fdt, problems)
                    devices.nodes[node.hash] = node
    for node in order:
        if not node.children and node.hash not in env:
            t = type(node)
            if t is Symbol:
                if node.hash in bound:  # else unbound: a problem reported below
                    env[node.hash] = bound[node.hash]
            elif t is Array or t is Scalar:
                broadcast = t is Scalar and node.shape != ()
                value = get(keys(node)) if broadcast and cache else None  # broadcast once, then kept
                if value is None:
                    value = leaf_value(node, fdt, problems, targets)
                    if broadcast:
                        value = broadcast_kernel(node.shape)(value)
                        if cache:
                            put(keys(node), value, math.prod(node.shape) * value.dtype.itemsize)
                env[node.hash] = value
    raise_problems(problems)
    todo = []
    reused = 0
    for node in order:
        if node.hash not in env:
            todo.append(node)
        elif node.children:
            reused += 1
    if max_bytes is not None and rows is not None:
        row = sum(value_bytes(n, fdt) for n in todo if keys.is_batched(n))
        if row * rows > max_bytes:
            raise OverBudget(row)
    # a call that compiles for long says so once (where progress bars are shown)
    notice = None
    if todo and shown() and host != "pin":
        count = new_kernels(todo if host is None else [n for n in todo if _host.host_op(n, fdt, _axes(n, keys)) is None],
                            fdt, keys)
        if count:
            notice = notice_after(NOTICE_AFTER, f"circuits: compiling {count} kernel{'s' if count > 1 else ''}…")
    try:
        by_numpy = _compute(todo, env, fdt, keys, cache, groups, roots, rows, again, host, devices)
    finally:
        if notice is not None:
            notice.cancel()
    computed = len(todo)
    if info is not None:
        info.computed += computed
        info.reused += reused
        info.numpy += by_numpy
    outs = [env[r.hash] for r in roots]
    if keep_all:
        return outs, env, order
    return outs


# A call still compiling this many seconds after it began says so (``progress.notice_after``).
NOTICE_AFTER = 1.0


def _axes(node: Circuit, keys):
    """Which children of ``node`` carry the batch axis (None: one row, or not batched)."""
    if keys.rows is None or not keys.is_batched(node):
        return None
    return tuple(0 if keys.is_batched(c) else None for c in node.children)


def _compute(todo, env, fdt, keys, cache, groups, roots, rows, again, host=None, devices=None) -> int:
    """Compute ``todo`` into ``env`` (fused groups where asked), and keep the values; returns
    how many nodes numpy computed."""
    store: list = []  # (key, value, bytes) for the value cache, stored together at the end
    by_numpy = 0
    if groups and cache and rows is None and len(todo) >= _groups.MIN_MEMBERS:
        for members, ins, key in _groups.plan(todo, {r.hash for r in roots}):
            fn = None
            if key is not None:
                args = [env[c.hash] for c in ins]  # numpy's leaves shape its compilation as well
                fn = _groups.group_kernel(key, keys.fdt, members, fdt, args)
                if fn is not None and devices:  # ready: the leaves' device values
                    args = [a if d is None else d for a, d in zip(args, map(devices.get, (c.hash for c in ins)))]
            if fn is None:
                by_numpy += _run_each(members, env, fdt, keys, store, host, devices)
            else:
                for node, value in zip(members, fn(*args)):
                    env[node.hash] = value
                    _keep(node, value, keys, store)
    else:
        by_numpy = _run_each(todo, env, fdt, keys, store if cache else None, host, devices)
    if again:  # the roots' values the cache held stay (a call gives the same bits as before)
        store = [entry for entry in store if entry[0][0] not in again]
    if store:
        VALUES.put_many(store)
    return by_numpy
