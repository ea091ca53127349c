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

from ...dtypes import is_float, is_int
from ...errors import EvaluationError
from ...nodes import Array, Circuit, Scalar, Symbol
from ...shapes import check_allocation, max_alloc_bytes
from ...traversal import toposort
from ..cache.background import WARM, wait_for
from ..lower.binding import check_index_values, leaf_value, raise_problems
from . import groups as _groups
from .kernels import broadcast_kernel, kernel
from .values import VALUES, Binding, shape_key, value_cache_info  # noqa: F401 - value_cache_info: the docstring's example

__all__ = ["RunInfo", "run_ops", "check_leaf_indices"]


# ---------------------------------------------------------------------------- op-by-op evaluation
class RunInfo:
    """What one op-by-op evaluation did: ``computed`` nodes, ``reused`` cached values."""

    __slots__ = ("computed", "reused")

    def __init__(self):
        self.computed = 0
        self.reused = 0


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


def _run_each(nodes: Sequence[Circuit], env: dict, fdt: str, keys, store: list | None) -> None:
    """Compute ``nodes`` (children before parents) one kernel each into ``env``; each value goes
    to ``store`` for the value cache (None: not kept)."""
    for node in nodes:
        value = kernel(node, fdt)(*[env[c.hash] for c in node.children])
        env[node.hash] = value
        if store is not None:
            _keep(node, value, keys, store)


def _keep(node: Circuit, value, keys, store: list) -> None:
    """Add ``(key, value, bytes)`` of ``node`` to ``store``: under its key, and under its shape
    key when its value depends on shapes alone."""
    size = math.prod(node.shape) * value.dtype.itemsize
    store.append((keys(node), value, size))
    by_shape = shape_key(node)
    if by_shape is not None:
        store.append(((by_shape, keys.fdt), value, size))


def run_ops(roots: Sequence[Circuit], inputs: Mapping | None, fdt: str, *, cache: bool = True,
            info: RunInfo | None = None, keep_all: bool = False, groups: bool = False, warm: bool = False,
            binding: Binding | None = None):
    """Device values of ``roots``, computed op by op through cached kernels over the values the
    cache already holds (``cache=False``: neither read nor written).  Every input is checked
    before anything runs.  ``keep_all=True`` also returns ``{node hash: value}`` of every node
    the walk reached (the gradients read them).  ``groups=True`` runs the fused groups that are
    compiled (``circuits.backend.tiers.groups``) and queues the others' compilation.  ``warm=True``
    computes the roots again though the cache holds them, and keeps the values the cache had.
    ``binding``: the ``Binding`` of these roots and inputs, made already (they are not bound again)."""
    if cache and not warm:
        # the warm-up after a new process's first, whole-program evaluation: wait for it rather
        # than compile the same kernels and compute the same values beside it
        wait_for(WARM)
    with _groups.foreground():
        return _run_ops(binding or Binding(roots, inputs, fdt), fdt, cache, info, keep_all, groups, warm)


def _run_ops(binding, fdt, cache, info, keep_all, groups, warm):
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
                by_shape = shape_key(node)
                if by_shape is None:
                    return False
                value = get((by_shape, keys.fdt))
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
    for node in order:
        if node.hash in env:
            continue
        check_allocation(node.shape, fdt if is_float(node.dtype) else node.dtype, node.line, EvaluationError, budget)
        if not node.children and is_int(node.dtype):
            int_leaves = True
    if int_leaves:
        from ...io.values import gather_index_ranges

        check_leaf_indices([n for n in order if n.hash not in env], gather_index_ranges(order), bound, problems)
    targets: dict = {}
    put = VALUES.put
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
    store: list = []  # (key, value, bytes) for the value cache, stored together at the end
    if groups and cache and len(todo) >= _groups.MIN_MEMBERS:
        for members, ins, key in _groups.plan(todo, {r.hash for r in roots}):
            fn = None
            if key is not None:
                args = [env[c.hash] for c in ins]
                fn = _groups.group_kernel(key, keys.fdt, members, fdt, args)
            if fn is None:
                _run_each(members, env, fdt, keys, store)
            else:
                for node, value in zip(members, fn(*args)):
                    env[node.hash] = value
                    _keep(node, value, keys, store)
    else:
        _run_each(todo, env, fdt, keys, store if cache else None)
    if again:  # the roots' values the cache held stay (a call gives the same bits as before)
        store = [entry for entry in store if entry[0][0] not in again]
    if store:
        VALUES.put_many(store)
    computed = len(todo)
    if info is not None:
        info.computed += computed
        info.reused += reused
    outs = [env[r.hash] for r in roots]
    if keep_all:
        return outs, env, order
    return outs
