"""Eager, per-node evaluation for interactive exploration of intermediate values.

An ``Eager`` evaluator computes any node op by op and keeps the values it computed in a bounded
least-recently-used cache (its own, bounded by bytes and by entries), so looking at a node's
children, then at theirs, reuses everything already computed.  No compilation: each op runs as
soon as it is reached, which also suits very deep or very large circuits.

Each request runs the same ``Skeleton`` as ``evaluate(..., mode='eager')``, over the *uncached
frontier* only: a ``Program`` whose walk stops at cached nodes, their values fed in as arguments
(``Program(..., given=cache)``); every value the skeleton computes is offered to the cache as it
appears (``Skeleton.run``'s ``observe``), and freed after its last use as usual.

>>> import numpy as np
>>> from circuits import Symbol, GeneralFunction, Add
>>> x = Symbol((2,), name='x')
>>> y = GeneralFunction('exp', x, name='y')
>>> z = Add(y, y, name='z')
>>> ev = Eager(z, {'x': np.zeros(2)})
>>> ev('z')
array([2., 2.], dtype=float32)
>>> ev(y)                      # computed on the way to z: served from the cache
array([1., 1.], dtype=float32)
>>> ev.cache_info()['hits']
1
"""

from __future__ import annotations

import collections
from typing import Mapping

import numpy as np

from ..errors import EvaluationError
from ..nodes import Circuit
from .binding import bind_arguments, float_dtype, precision
from .bounded import WeakCaches
from .lowering import resolve_nodes
from .program import Program

__all__ = ["Eager"]

_EAGERS = WeakCaches("eager", "values")  # every live evaluator's cache, in cache_stats and clear_cache


class Eager:
    """Values of nodes computed op by op, cached (LRU, at most ``max_bytes`` and ``max_entries``).

    ``circuit`` (optional) is where names given to ``ev(name)`` are looked up; any node can be
    asked for.  ``inputs`` binds Symbols as for ``evaluate``; ``dtype`` is the float precision.
    """

    def __init__(self, circuit: Circuit | None = None, inputs: Mapping | None = None, *, dtype="float32",
                 max_bytes: int = 1 << 30, max_entries: int = 100_000):
        self.circuit = circuit
        self.inputs = dict(inputs or {})
        self.float_dtype = float_dtype(dtype)
        if max_bytes < 0 or max_entries < 0:
            raise EvaluationError("max_bytes and max_entries must be non-negative")
        self.max_bytes = int(max_bytes)
        self.max_entries = int(max_entries)
        self._cache: "collections.OrderedDict[bytes, object]" = collections.OrderedDict()
        self._sizes: dict[bytes, int] = {}
        self._bytes = 0
        self._counts = collections.Counter()
        self._program = None
        _EAGERS.add(self)

    # ------------------------------------------------------------------ public
    def __call__(self, node) -> np.ndarray:
        """The value of ``node`` (a node, or a name in ``circuit``) as a numpy array."""
        return self.values([node])[0]

    def values(self, nodes) -> list:
        """Values of several nodes, computed in one pass."""
        targets = [self._resolve(n) for n in nodes]
        with precision(self.float_dtype):
            return [np.asarray(v) for v in self._compute(targets)]

    def cache_info(self) -> dict:
        """``hits``, ``misses`` (nodes computed), ``evictions``, ``entries`` and ``bytes`` held."""
        return {
            "hits": self._counts["hits"], "misses": self._counts["misses"],
            "evictions": self._counts["evictions"], "entries": len(self._cache), "bytes": self._bytes,
        }

    info = cache_info

    def clear(self):
        """Forget every cached value."""
        self._cache.clear()
        self._sizes.clear()
        self._bytes = 0

    def __repr__(self):
        info = self.cache_info()
        return f"<Eager {self.float_dtype}: {info['entries']} values, {info['bytes']} bytes cached>"

    # ------------------------------------------------------------------ internals
    def _resolve(self, node) -> Circuit:
        if isinstance(node, Circuit):
            return node
        if self.circuit is None:
            raise EvaluationError(f"Eager: cannot look up {node!r} by name without a circuit; use Eager(circuit, inputs)")
        if self._program is None:
            self._program = Program([self.circuit], self.float_dtype)
        return resolve_nodes(self._program, [node], "Eager")[0]

    def _compute(self, targets: list[Circuit]) -> list:
        cache = self._cache
        program = Program(targets, self.float_dtype, given=cache)
        # Every check and every op is prepared before anything runs.  Cached values are read
        # (pinned) now: storing new ones during the run may evict them.
        given = {}
        for slot in program.given_slots:
            h = program.nodes[slot].hash
            cache.move_to_end(h)
            given[h] = cache[h]
        args = bind_arguments(program, self.inputs, self.float_dtype, given=given)
        skeleton = program.skeleton()
        self._counts["hits"] += len(given)
        nodes, given_slots = program.nodes, program.given_slots

        def observe(slot, value):
            if slot not in given_slots:
                self._counts["misses"] += 1
                self._store(nodes[slot].hash, value)

        return skeleton.run(args, observe=observe)

    def _store(self, h: bytes, value):
        size = int(getattr(value, "nbytes", 0))
        if size > self.max_bytes or self.max_entries == 0:
            return
        self._cache[h] = value
        self._sizes[h] = size
        self._bytes += size
        while self._bytes > self.max_bytes or len(self._cache) > self.max_entries:
            old, _ = self._cache.popitem(last=False)
            self._bytes -= self._sizes.pop(old)
            self._counts["evictions"] += 1
