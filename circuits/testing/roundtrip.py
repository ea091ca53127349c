"""Exact text round trips in tests: a store holding the tensors and placeholders of live circuits.

Text carries everything about a circuit but its tensors (an Array prints its content hash) and
the dtypes of its placeholders.  ``parse(text)`` alone therefore gives placeholders, which print
the same but are not the valued Arrays (see ``circuits.nodes.leaves``).  The lossless round trip
is text plus its tensors, as a circuit file or a shared tensor store provide them; ``store_of``
is that store in memory, so a test can state the round trip exactly:

>>> import numpy as np
>>> from circuits import Add, Array, parse
>>> c = Add(Array(np.ones(2, np.float32), name='w'), Array.placeholder((2,), '0b', name='b', dtype='int64'))
>>> parse(c.to_text()) == c, parse(c.to_text(), store=store_of(c)) == c
(False, True)
"""

from __future__ import annotations

import bisect

from ..errors import StoreError
from ..nodes import Array, Circuit
from ..traversal import toposort


class CircuitStore:
    """The parser's store protocol (``find``, ``get``, ``placeholder``) over the Arrays of
    in-memory circuits: valued Arrays by content hash, placeholders by their printed line."""

    def __init__(self, roots):
        self.tensors: dict = {}
        self.placeholders: dict = {}
        for node in toposort(*roots):
            if isinstance(node, Array):
                if node.value is None:
                    self.placeholders[(node.short_hash, node.shape, node.name)] = node
                else:
                    self.tensors.setdefault(node.content_hash, node.value)
        self.keys = sorted(self.tensors)
        self.placeholder_digests = {k[0] for k in self.placeholders}

    def find(self, prefix: str):
        if prefix in self.placeholder_digests:
            return None  # a placeholder's printed hash, not a prefix of a tensor here
        i = bisect.bisect_left(self.keys, prefix)
        found = [k for k in self.keys[i:i + 2] if k.startswith(prefix)]
        if len(found) > 1:
            raise StoreError(f"hash prefix {prefix!r} is ambiguous: {', '.join(found)}")
        return found[0] if found else None

    def get(self, key: str):
        return self.tensors[key]

    def placeholder(self, prefix: str, shape, name):
        return self.placeholders.get((prefix, shape, name))


def store_of(*roots: Circuit) -> CircuitStore:
    """A store that gives the parser back exactly the Arrays of ``roots``: with it,
    ``parse(to_text(c), store=store_of(c)) == c``."""
    return CircuitStore(roots)
