"""Which Symbols a node's value depends on: a structural property, filled in once per node (a
slot on the node, ``_free``), children first, so a variant pays only for its new nodes; and the
roots of an evaluation with their Modules substituted (``prepared``).

>>> import numpy as np
>>> from circuits import Add, Symbol
>>> x, y = Symbol((2,), name='x'), Symbol((2,), name='y')
>>> sorted(s.name for s in free_symbols(Add(x, x), y))
['x', 'y']
>>> has_batch_axis(x, {'x': np.zeros((5, 2))})
True
"""

from __future__ import annotations

from typing import Mapping, Sequence

from ...expand import substitute_all_modules
from ...nodes import Circuit, Module, Symbol
from ...traversal import toposort
from ..cache.bounded import BoundedCache

__all__ = ["free_symbols", "prepared", "has_batch_axis"]


_MODULES = "modules"  # marks a node with a Module below: Modules are substituted before evaluation
# tuple of Symbol hashes -> the one tuple of those Symbols (shared by nodes)
_FREE_SETS = BoundedCache("free symbol sets", "values", max_entries=65536, lru=False)


def _fill_free(roots: Sequence[Circuit]) -> None:
    """Set ``node._free`` (the Symbols below, ordered by hash; ``_MODULES`` when a Module is below)
    on every node under ``roots`` that has none yet: children first, each node once ever."""
    for node in toposort(*roots, stop=lambda n: n._free is not None):
        if node._free is not None:
            continue
        t = type(node)
        kids = node.children
        if t is Symbol:
            free = (node,)
        elif t is Module:
            free = _MODULES
        elif not kids:
            free = ()
        else:
            free = kids[0]._free
            for k in kids[1:]:
                other = k._free
                if other is free or other == ():
                    continue
                if free == () or other is _MODULES:
                    free = other
                elif free is not _MODULES:
                    free = _merge(free, other)
        node._free = free


def _merge(a: tuple, b: tuple) -> tuple:
    merged = {s.hash: s for s in a}
    merged.update((s.hash, s) for s in b)
    key = tuple(sorted(merged))
    found = _FREE_SETS.get(key)
    if found is None:
        found = _FREE_SETS.setdefault(key, tuple(merged[h] for h in key))
    return found


def free_symbols(*roots: Circuit) -> tuple:
    """The Symbols the values of ``roots`` depend on (Symbols inside Module bodies are bound by
    their Module, not free).

    >>> from circuits import Add
    >>> x, y = Symbol((2,), name='x'), Symbol((2,), name='y')
    >>> [s.name for s in free_symbols(Add(x, x), y)] == sorted(['x', 'y'], key=lambda n: {'x': x, 'y': y}[n].hash)
    True
    """
    return prepared(roots)[1]


def prepared(roots) -> tuple[list, tuple]:
    """``roots`` with their Modules substituted (when they hold any), and their free Symbols."""
    roots = list(roots)
    _fill_free(roots)
    if any(r._free is _MODULES for r in roots):
        roots = [substitute_all_modules(r) for r in roots]
        _fill_free(roots)
    out: dict = {}
    for r in roots:
        out.update((s.hash, s) for s in r._free)
    return roots, tuple(out[h] for h in sorted(out))


def has_batch_axis(circuit: Circuit, inputs) -> bool:
    """Whether some input carries one leading axis more than the Symbol it binds (a batch);
    False for no inputs (or inputs that are no mapping: binding reports those).

    >>> import numpy as np
    >>> x = Symbol((2,), name='x')
    >>> has_batch_axis(x, {'x': np.zeros(2)}), has_batch_axis(x, {'x': np.zeros((5, 2))})
    (False, True)
    """
    if not inputs or not isinstance(inputs, Mapping):
        return False
    symbols = free_symbols(circuit)
    if not symbols:
        return False
    by_name = {s.name: s for s in symbols}
    by_hash = {s.hash: s for s in symbols}
    for key, value in inputs.items():
        sym = by_hash.get(key.hash) if isinstance(key, Circuit) else by_name.get(key)
        shape = getattr(value, "shape", None)
        if sym is not None and shape is not None and len(shape) == len(sym.shape) + 1 \
                and tuple(shape[1:]) == sym.shape:
            return True
    return False


