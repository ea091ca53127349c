"""The value cache: every value the op-by-op tier computes is offered to one bounded cache (least
recently used first out, bounded in bytes, on the device), keyed by the node's identity (its
hash: structure, names and Array contents) and by the identity of the values bound to the
Symbols it depends on (each bound value is hashed on binding, so writing into the caller's numpy
array afterwards can never make a cached value stale); a value that depends on shapes alone (a
layer norm's divisor) is also kept under a key of shapes, so a variant finds it.

>>> import numpy as np
>>> from circuits import Add, Symbol
>>> x = Symbol((2,), name='x')
>>> keys = value_keys([Add(x, x)], {'x': np.ones(2)}, 'float32')
>>> cached_values(keys) is None        # nothing computed yet
True
"""

from __future__ import annotations

import os
import sys
from typing import Mapping, Sequence

import blake3
import numpy as np

from ...nodes import Circuit, GeneralFunction, Module, Scalar
from ...shapes import check_budget
from ..cache.bounded import BoundedCache
from ..lower.binding import check_symbol_value, symbol_values
from ..lower.program import node_key_part
from .symbols import prepared

__all__ = ["VALUES", "DEFAULT_VALUE_BYTES", "value_cache_info", "set_value_budget", "fingerprint", "CacheKeys",
           "bind_symbols", "Binding", "value_keys", "cached_values", "remember", "SHAPE_ONLY", "shape_key"]


def _default_value_bytes() -> int:
    """An eighth of the machine's memory, between 1 and 8 GiB: a 12-layer model's values over a
    dataset (a clean and a corrupted run of GPT-2 small over 8 prompts: 1.7 GB) stay while an
    experiment reads them (at 1 GiB the corrupted run pushed the clean one out and every gradient
    after it computed the clean run again)."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # not on this platform
        return 1 << 30
    return int(min(max(total // 8, 1 << 30), 8 << 30))


DEFAULT_VALUE_BYTES = _default_value_bytes()

# Device values by key (``CacheKeys``), least recently used first out; a value larger than the
# whole budget is not kept.
VALUES = BoundedCache("values", "values", max_bytes=DEFAULT_VALUE_BYTES)

_VALUE_INFO = ("hits", "misses", "stores", "evictions", "entries", "bytes", "max_bytes")


def value_cache_info() -> dict:
    """Counters of the process-wide value cache (see ``circuits.backend.cache_stats``)."""
    info = VALUES.info()
    return {k: info[k] for k in _VALUE_INFO}


def set_value_budget(n) -> None:
    """Keep at most ``n`` bytes of values (0 keeps none); the oldest go at once."""
    VALUES.set_bounds(max_bytes=check_budget(n, "value cache budget"))


# ---------------------------------------------------------------------------- binding fingerprints
def fingerprint(value) -> bytes:
    """A digest of a bound value (dtype, shape and bytes): what a cached value's key holds of it."""
    arr = np.asarray(value, order="C")
    h = blake3.blake3()
    h.update(f"{arr.dtype.str}|{','.join(map(str, arr.shape))}|".encode())
    if arr.nbytes:
        h.update(memoryview(arr.reshape(-1).view(np.uint8)))
    return h.digest(16)


def matmul_precision():
    """JAX's matmul precision in force (``jax.default_matmul_precision``), without importing JAX
    where it is not imported and the environment does not set it: then it is JAX's default, None."""
    if "jax" not in sys.modules and not os.environ.get("JAX_DEFAULT_MATMUL_PRECISION"):
        return None
    import jax

    return jax.config.jax_default_matmul_precision


class CacheKeys:
    """Cache keys of nodes for one evaluation: ``(hash, precision)`` for a node that depends on
    no Symbol, else with the digest of the values bound to the Symbols below it.  The precision is
    the float dtype and JAX's matmul precision in force (``jax.default_matmul_precision``): a value
    computed in TF32 is never returned where ``'highest'`` is asked for.

    Over a batch (``rows``: how many; ``batched``: the hashes of the Symbols bound with a leading
    batch axis), a node that depends on a batched Symbol has a value with that axis first
    (``is_batched``); the digest of its bound values holds their shapes, so such a value never
    answers for one row's."""

    __slots__ = ("fdt", "fps", "combos", "rows", "batched", "by_free")

    def __init__(self, fdt: str, fps: dict, rows: int | None = None, batched: frozenset = frozenset()):
        self.fdt = (fdt, matmul_precision())
        self.fps = fps
        self.combos: dict = {}
        self.rows, self.batched = rows, batched
        self.by_free: dict = {}  # id of a free-Symbol tuple -> whether one of them is batched

    def is_batched(self, node: Circuit) -> bool:
        """Whether ``node``'s value has the batch axis (it depends on a batched Symbol)."""
        free = node._free
        if not free or self.rows is None:
            return False
        found = self.by_free.get(id(free))
        if found is None:
            batched = self.batched
            found = self.by_free[id(free)] = any(s.hash in batched for s in free)
        return found

    def by_shape(self, node: Circuit):
        """The key of ``node``'s value by shapes alone (``shape_key``), None where it has none;
        over a batch, a batched node's holds the rows."""
        key = shape_key(node)
        if key is None:
            return None
        return (key, self.fdt, self.rows) if self.is_batched(node) else (key, self.fdt)

    def __call__(self, node: Circuit):
        free = node._free
        if not free:
            return (node.hash, self.fdt)
        combo = self.combos.get(id(free))
        if combo is None:
            fps = self.fps
            combo = self.combos[id(free)] = (b"".join(fps.get(s.hash, b"?") for s in free), free)
        return (node.hash, self.fdt, combo[0])


def bind_symbols(free: tuple, inputs: Mapping | None, fdt: str, problems: list,
                 batched: bool = False) -> tuple[dict, dict, dict]:
    """The values bound to the Symbols ``free`` (checked, on the device), their fingerprints, and
    (``batched=True``: a value may carry one leading batch axis more) the rows of those that do,
    each by Symbol hash; what is wrong goes to ``problems``."""
    raw = symbol_values(free, inputs, problems)
    bound: dict = {}
    fps: dict = {}
    rows: dict = {}
    for sym in free:
        if sym.hash in raw:
            value, is_batched = check_symbol_value(sym, raw[sym.hash], fdt, problems, None if batched else False)
            if value is not None:
                bound[sym.hash] = value
                fps[sym.hash] = fingerprint(value)
                if is_batched:
                    rows[sym.hash] = int(value.shape[0])
    return bound, fps, rows


class Binding:
    """``roots`` prepared (their Modules substituted) and the values bound to their Symbols,
    checked and hashed once: for the value cache's keys (``root_keys``) and for a run of the same
    roots (``run_ops(binding=)``); what is wrong with the inputs is in ``problems``.

    ``batched=True``: a Symbol's value may carry one leading batch axis more (every such value
    the same number of ``rows``, else a problem); the run then computes every row at once, each
    node that depends on a batched Symbol through its kernel mapped over the rows.

    >>> from circuits import Add, Symbol
    >>> x, w = Symbol((2,), name='x'), Symbol((2,), name='w')
    >>> b = Binding([Add(x, w)], {'x': np.zeros((3, 2)), 'w': np.ones(2)}, 'float32', batched=True)
    >>> b.rows, [s.name for s in b.free if s.hash in b.keys.batched]
    (3, ['x'])
    """

    __slots__ = ("roots", "free", "values", "problems", "keys", "rows")

    def __init__(self, roots: Sequence[Circuit], inputs: Mapping | None, fdt: str, batched: bool = False):
        self.roots, self.free = prepared(roots)
        self.problems: list[str] = []
        self.values, fps, rows = bind_symbols(self.free, inputs, fdt, self.problems, batched)
        self.rows = None
        if rows:
            sizes = sorted(set(rows.values()))
            if len(sizes) > 1:
                by_size = {n: [s.line() for s in self.free if rows.get(s.hash) == n][:3] for n in sizes}
                self.problems.append("batched inputs disagree on the batch size: " + "; ".join(
                    f"{n} for {', '.join(names)}" for n, names in by_size.items()))
            else:
                self.rows = sizes[0]
        self.keys = CacheKeys(fdt, fps, self.rows, frozenset(rows) if self.rows is not None else frozenset())

    def root_keys(self) -> list | None:
        """The value cache's keys of the roots (None when the inputs do not bind: a miss)."""
        if self.problems or len(self.keys.fps) != len(self.free):
            return None
        return [self.keys(r) for r in self.roots]


def value_keys(roots: Sequence[Circuit], inputs: Mapping | None, fdt: str) -> list | None:
    """The value cache's keys of ``roots`` for these inputs (None when the inputs do not bind:
    a miss, not an error); for ``cached_values`` and ``remember``, hashing the inputs once."""
    return Binding(roots, inputs, fdt).root_keys()


def cached_values(keys: list | None) -> list | None:
    """The values under ``keys`` (``value_keys``) when the value cache holds every one, else
    None; nothing is computed.

    >>> from circuits import Add, Symbol
    >>> from circuits.backend.tiers.op_by_op import run_ops
    >>> x = Symbol((2,), name='x')
    >>> y = Add(x, x)
    >>> cached_values(value_keys([y], {'x': np.ones(2)}, 'float32')) is None
    True
    >>> _ = run_ops([y], {'x': np.ones(2)}, 'float32')
    >>> [float(v) for v in cached_values(value_keys([y], {'x': np.ones(2)}, 'float32'))[0]]
    [2.0, 2.0]
    """
    if keys is None:
        return None
    out = []
    for key in keys:
        value = VALUES.get(key)
        if value is None:
            return None
        out.append(value)
    return out


def remember(keys: list | None, values: Sequence) -> None:
    """Offer ``values`` (computed elsewhere: a compiled program) to the value cache under ``keys``
    (``value_keys``; nothing when None)."""
    if keys is not None:
        for key, v in zip(keys, values):
            VALUES.put(key, v)


# ---------------------------------------------------------------------------- values known by shapes
# A layer norm divides by the length of the residual's last axis: ``last_dim_size(resid)`` and
# its reciprocal depend on the residual's shape alone, yet their hashes change with every change
# upstream.  Such values are also kept under a key made of shapes, so a variant finds them.
SHAPE_ONLY = frozenset({"last_dim_size"})  # functions whose value reads only its argument's shape and dtype
# node hash -> (key, height): the key and the depth its look needed; (None, d) where no key was
# found within depth d (a deeper look may find one).
_shape_keys = BoundedCache("shape keys", "values", max_entries=65536, lru=False)
_SHAPE_DEPTH = 3


def shape_key(node: Circuit, depth: int = _SHAPE_DEPTH):
    """A key for ``node``'s value made of operations and shapes when the value depends on shapes
    alone (a ``SHAPE_ONLY`` function, Scalars, and up to ``_SHAPE_DEPTH`` operations over those),
    else None.

    >>> from circuits import GeneralFunction, Symbol
    >>> a, b = Symbol((2, 3), name='a'), Symbol((2, 3), name='b')
    >>> n = lambda x: GeneralFunction('reciprocal', GeneralFunction('last_dim_size', x))
    >>> shape_key(n(a)) == shape_key(n(b)) is not None, shape_key(GeneralFunction('exp', a))
    (True, None)
    """
    key, height = _shape_entry(node, depth)
    return key if height <= depth else None


def _not_by_shape(node: Circuit, depth: int) -> bool:
    """Whether ``node`` is known, without looking below it, to have no shape key within
    ``depth``: an Array or a Symbol, or a node already looked at that deep (a variant's new node
    is mostly over such children, and so is rejected without a walk)."""
    if not node.children:
        return type(node) is not Scalar
    found = _shape_keys.peek(node.hash)
    return found is not None and found[0] is None and found[1] >= depth


def _shape_entry(node: Circuit, depth: int) -> tuple:
    """``(key, height)`` of ``node`` looked at within ``depth`` operations (see ``_shape_keys``)."""
    found = _shape_keys.peek(node.hash)
    if found is not None and (found[0] is not None or found[1] >= depth):
        return found
    t = type(node)
    entry = (None, depth)
    if t is Scalar:
        entry = (("scalar", node.hash), 0)
    elif t is GeneralFunction and node.function.name in SHAPE_ONLY:
        entry = (("shape", node_key_part(node), tuple((c.shape, c.dtype) for c in node.children)), 0)
    elif depth and node.children and t is not Module and not any(_not_by_shape(c, depth - 1) for c in node.children):
        kids = []
        height = 0
        for c in node.children:
            k, h = _shape_entry(c, depth - 1)
            if k is None or h > depth - 1:
                break
            kids.append(k)
            height = max(height, h)
        else:
            entry = (("of", node_key_part(node), node.shape, tuple(kids)), height + 1)
    _shape_keys.put(node.hash, entry, 0)
    return entry


