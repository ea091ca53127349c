"""``Eager``: a view for exploring intermediate values, over the op-by-op tier.

An ``Eager`` view computes any node op by op through the kernels cached per operation and over
the process-wide value cache (``circuits.backend.tiers.op_by_op``): exactly what
``evaluate(node, inputs, mode='ops')`` runs, so looking at a node's children, then at theirs,
reuses everything already computed, by this view, by ``evaluate`` or by another view.  The
values are kept by that one cache (bounded in bytes: ``set_cache_size(values_bytes=)``), not by
the view.

>>> import numpy as np
>>> from circuits import Symbol, GeneralFunction, Add
>>> x = Symbol((2,), name='x')
>>> y = GeneralFunction('exp', x, name='y')
>>> z = Add(y, y, name='z')
>>> ev = Eager(z, {'x': np.zeros(2)})
>>> ev('z')
array([2., 2.], dtype=float32)
>>> ev(y)                      # computed on the way to z: served from the value cache
array([1., 1.], dtype=float32)
>>> ev.cache_info()['hits'] >= 1
True
"""

from __future__ import annotations

import warnings
from typing import Mapping

import numpy as np

from ..errors import EvaluationError
from ..nodes import Circuit
from .cache.bounded import WeakCaches
from .lower.binding import float_dtype, precision
from .lower.lowering import resolve_nodes
from .lower.program import Program
from .tiers.op_by_op import RunInfo, run_ops
from .tiers.values import VALUES

__all__ = ["Eager"]

# the live views (cache_stats()['eager'] counts them; they hold no values of their own)
_VIEWS = WeakCaches("eager", "values")


class Eager:
    """Values of nodes computed op by op over the value cache (see the module docstring).

    ``circuit`` (optional) is where names given to ``ev(name)`` are looked up; any node can be
    asked for.  ``inputs`` binds Symbols as for ``evaluate``; ``dtype`` is the float precision.
    ``max_bytes`` and ``max_entries`` bounded a cache of the view's own before it read the value
    cache; they are accepted for one release, with a warning, and do nothing.
    """

    def __init__(self, circuit: Circuit | None = None, inputs: Mapping | None = None, *, dtype="float32",
                 max_bytes: int | None = None, max_entries: int | None = None):
        if max_bytes is not None or max_entries is not None:
            warnings.warn("Eager(max_bytes=, max_entries=) do nothing now: the values are kept by the process-wide "
                          "value cache, which every Eager view and evaluate share; bound it with "
                          "circuits.backend.set_cache_size(values_bytes=...)", DeprecationWarning, stacklevel=2)
        self.circuit = circuit
        self.inputs = dict(inputs or {})
        self.float_dtype = float_dtype(dtype)
        self._info = RunInfo()
        self._program = None
        _VIEWS.add(self)

    def __call__(self, node) -> np.ndarray:
        """The value of ``node`` (a node, or a name in ``circuit``) as a numpy array."""
        return self.values([node])[0]

    def values(self, nodes) -> list:
        """Values of several nodes, computed in one pass."""
        targets = [self._resolve(n) for n in nodes]
        with precision(self.float_dtype):
            return [np.asarray(v) for v in run_ops(targets, self.inputs, self.float_dtype, info=self._info)]

    def cache_info(self) -> dict:
        """``hits`` (values this view read from the value cache), ``misses`` (nodes it computed),
        and the value cache's own ``entries``, ``bytes`` and ``evictions``."""
        shared = VALUES.info()
        return {"hits": self._info.reused, "misses": self._info.computed, "evictions": shared["evictions"],
                "entries": shared["entries"], "bytes": shared["bytes"]}

    def info(self) -> dict:
        """What the view holds of its own: nothing (the registry of caches counts views)."""
        return {"entries": 0, "bytes": 0}

    def clear(self) -> None:
        """Forget the values: the value cache's, which every view and ``evaluate`` share."""
        VALUES.clear()

    def _resolve(self, node) -> Circuit:
        if isinstance(node, Circuit):
            return node
        if self.circuit is None:
            raise EvaluationError(f"Eager: cannot look up {node!r} by name without a circuit; use Eager(circuit, inputs)")
        if self._program is None:
            self._program = Program([self.circuit], self.float_dtype)
        return resolve_nodes(self._program, [node], "Eager")[0]

    def __repr__(self):
        return f"<Eager {self.float_dtype}: a view over the value cache>"
