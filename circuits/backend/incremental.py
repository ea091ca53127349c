"""Incremental evaluation: values kept across calls, and kernels compiled per operation.

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

import blake3
import numpy as np

from ..dtypes import dtype_str, is_float, is_int
from ..errors import EvaluationError
from ..expand import substitute_all_modules
from ..nodes import Add, Array, Circuit, GeneralFunction, Module, Scalar, SetSymbolicShape, Symbol, Tag
from ..progress import notice_after, shown
from ..shapes import check_allocation, check_budget, max_alloc_bytes
from ..traversal import toposort
from . import groups as _groups
from .background import WARM, wait_for
from .binding import check_index_values, check_symbol_value, leaf_value, raise_problems, symbol_values
from .bounded import BoundedCache
from .compiling import counted_jit, note_reused
from .executables import kept
from .memory import value_bytes
from .ops import build_op
from .program import kernel_part, node_key_part

__all__ = [
    "run_ops", "OverBudget", "kernel_over_rows", "sum_over_rows", "broadcast_rows", "Binding", "value_keys", "cached_values", "remember", "has_batch_axis", "kernel", "free_symbols", "VALUES",
    "value_cache_info", "set_value_budget", "kernel_info", "DEFAULT_VALUE_BYTES",
]


# ---------------------------------------------------------------------------- the value cache
DEFAULT_VALUE_BYTES = 1 << 30

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


# ---------------------------------------------------------------------------- Symbols a node depends on
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


# ---------------------------------------------------------------------------- kernels
# (operation, shapes, precision) -> its compiled kernel; the oldest made go first
_kernels = BoundedCache("kernels", "kernels", max_entries=8192, lru=False)


def _identity_op(x):
    return x


def cached_kernel(key, make):
    """The kernel cached under ``key``: ``counted_jit(make())`` on a miss (the oldest made go
    first beyond the cache's bound); of threads racing on a miss, the first stored wins."""
    fn = _kernels.get(key)
    if fn is not None:
        note_reused()
        return fn
    op = make()
    fn = kept(key, op, counted_jit(op, "kernel_compilations"))  # its executable kept on disk
    return _kernels.setdefault(key, fn)


def kernel(node: Circuit, fdt: str):
    """The compiled function computing ``node`` from its children's values: one per (operation,
    shapes, precision), shared by every circuit (a Tag or a SetSymbolicShape is the identity).
    The key's node part is kept on the node (``program.kernel_part``)."""
    t = type(node)
    if t is Tag or t is SetSymbolicShape:
        return _identity_op
    return cached_kernel((*kernel_part(node), fdt), lambda: build_op(node, fdt))


def kernel_over_rows(node: Circuit, fdt: str, axes: tuple, rows: int):
    """The kernel computing ``node`` for every row of a batch at once: the operation's kernel
    mapped (``jax.vmap``) over the leading axis of the children whose ``axes`` entry is 0 (the
    others are the same for every row).  One per (operation, shapes, precision, rows, axes),
    shared by every circuit, as ``kernel`` is for one row."""
    t = type(node)
    if t is Tag or t is SetSymbolicShape:
        return _identity_op

    def make():
        import jax

        return jax.vmap(build_op(node, fdt), in_axes=axes)

    return cached_kernel((*kernel_part(node), fdt, "rows", rows, axes), make)


def sum_over_rows(node: Circuit, values: list, batched: list, fdt: str, rows: int):
    """The value of an Add over a batch whose children (``values``) are some batched, some not
    (``batched``): summed left to right as its own kernel does, two at a time through kernels
    keyed by the two operands' shapes and which is batched (the batched one first: ``a + b`` is
    ``b + a`` to the bit), so that every such sum shares a few kernels with the clean run, wherever
    a constant term sits (a head zero-ablated at any position of a layer's sum)."""
    out = values[0]
    for value, (key, swap) in zip(values[1:], _sum_steps(node, batched, fdt, rows)):
        out = _add_kernel(key)(value, out) if swap else _add_kernel(key)(out, value)
    return out


def _sum_steps(node: Circuit, batched: list, fdt: str, rows: int) -> list:
    """``sum_over_rows``' steps: ``(kernel key, swap)`` for each child after the first."""
    shape = node.shape
    shapes = [c.shape for c in node.children]
    steps = []
    out_batched, out_shape = batched[0], shapes[0]
    for is_batched, value_shape in zip(batched[1:], shapes[1:]):
        swap = is_batched and not out_batched
        a_shape, b_shape = (value_shape, out_shape) if swap else (out_shape, value_shape)
        a_rows, b_rows = (True, False) if swap else (out_batched, is_batched)
        steps.append((("add2", a_shape, b_shape, shape, fdt, rows if a_rows else None, b_rows), swap))
        out_batched = out_batched or is_batched
        out_shape = shape
    return steps


def _add_kernel(key: tuple):
    """``a + b`` broadcast to the sum's shape, ``a`` (and ``b`` where the key says so) batched:
    the kernel ``_sum_steps``' ``key`` names."""

    def make():
        import jax
        import jax.lax as lax

        _, _, _, shape, _, a_rows, b_rows = key
        rank = len(shape)

        def add(a, b):
            if a.shape != shape:
                a = lax.broadcast_in_dim(a, shape, tuple(range(rank - a.ndim, rank)))
            if b.shape != shape:
                b = lax.broadcast_in_dim(b, shape, tuple(range(rank - b.ndim, rank)))
            return lax.add(a, b)

        if a_rows is None:
            return add
        return jax.vmap(add, in_axes=(0, 0 if b_rows else None))

    return cached_kernel(key, make)


def _kernel_keys(node: Circuit, fdt: str, keys) -> list:
    """The keys of the kernels computing ``node`` takes (as ``_run_each`` picks them)."""
    t = type(node)
    if t is Tag or t is SetSymbolicShape:
        return []
    rows = keys.rows
    if rows is not None and keys.is_batched(node):
        flags = [keys.is_batched(c) for c in node.children]
        if _sums_pairwise(node):
            return [key for key, _ in _sum_steps(node, flags, fdt, rows)]
        return [(*kernel_part(node), fdt, "rows", rows, tuple(0 if f else None for f in flags))]
    return [(*kernel_part(node), fdt)]


def new_kernels(nodes, fdt: str, keys) -> int:
    """How many distinct kernels computing ``nodes`` would make (not made yet)."""
    return len({k for n in nodes for k in _kernel_keys(n, fdt, keys) if _kernels.peek(k) is None})


def _sums_pairwise(node: Circuit) -> bool:
    """Whether ``node`` is an Add ``sum_over_rows`` computes: two children or more, of one
    non-bool dtype (its own kernel promotes mixed dtypes over all of them at once)."""
    kids = node.children
    return (type(node) is Add and len(kids) >= 2 and node.dtype != "bool"
            and all(c.dtype == node.dtype for c in kids))


def _broadcast_kernel(shape: tuple):
    import jax.lax as lax

    return cached_kernel(("broadcast", shape), lambda: lambda v: lax.broadcast(v, shape))


def broadcast_rows(value, rows: int):
    """``value`` repeated ``rows`` times along a new leading axis (a value the same for every row
    of a batch, given the batch axis), through one cached kernel per shape."""
    return _broadcast_kernel((rows,))(value)


def pick_row(array, r: int):
    """Row ``r`` of ``array`` (one kernel per shape, the row passed as data: a static slice
    would compile one per row)."""

    def make():
        import jax.lax as lax

        return lambda a, i: lax.dynamic_index_in_dim(a, i, keepdims=False)

    return cached_kernel(("pick", array.shape, dtype_str(array.dtype)), make)(array, np.int32(r))


def kernel_info() -> dict:
    """``kernels`` held, ``kernel_hits`` and ``kernel_misses`` (ops whose kernel was made)."""
    info = _kernels.info()
    return {"kernels": info["entries"], "kernel_hits": info["hits"], "kernel_misses": info["misses"]}


# ---------------------------------------------------------------------------- binding fingerprints
def fingerprint(value) -> bytes:
    """A digest of a bound value (dtype, shape and bytes): what a cached value's key holds of it."""
    arr = np.asarray(value, order="C")
    h = blake3.blake3()
    h.update(f"{arr.dtype.str}|{','.join(map(str, arr.shape))}|".encode())
    if arr.nbytes:
        h.update(memoryview(arr.reshape(-1).view(np.uint8)))
    return h.digest(16)


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
        import jax

        self.fdt = (fdt, jax.config.jax_default_matmul_precision)
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

    >>> from circuits import Add
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

    >>> from circuits import Add
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

    >>> from circuits import GeneralFunction
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


# ---------------------------------------------------------------------------- op-by-op evaluation
class OverBudget(Exception):
    """Raised by ``run_ops(max_bytes=)`` before anything is computed: the values a run over a
    batch would make take more than ``max_bytes``; ``row_bytes`` is what one row's take (the
    caller splits the batch into chunks of rows).  Never reaches a user."""

    def __init__(self, row_bytes: int):
        super().__init__(row_bytes)
        self.row_bytes = row_bytes


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
    to ``store`` for the value cache (None: not kept).  Over a batch (``keys.rows``), a node that
    depends on a batched Symbol runs its kernel mapped over the rows (``kernel_over_rows``)."""
    rows = keys.rows
    batched = keys.is_batched
    for node in nodes:
        kids = node.children
        if rows is not None and batched(node):
            flags = [batched(c) for c in kids]
            if _sums_pairwise(node):
                value = sum_over_rows(node, [env[c.hash] for c in kids], flags, fdt, rows)
            else:
                axes = tuple(0 if f else None for f in flags)
                value = kernel_over_rows(node, fdt, axes, rows)(*[env[c.hash] for c in kids])
        else:
            value = kernel(node, fdt)(*[env[c.hash] for c in kids])
        env[node.hash] = value
        if store is not None:
            _keep(node, value, keys, store)


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
            binding: Binding | None = None, batched: bool = False, max_bytes: int | None = None):
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
    op-by-op tier keeps each until the call ends) would take more."""
    if cache and not warm:
        # the warm-up after a new process's first, whole-program evaluation: wait for it rather
        # than compile the same kernels and compute the same values beside it
        wait_for(WARM)
    with _groups.foreground():
        return _run_ops(binding or Binding(roots, inputs, fdt, batched), fdt, cache, info, keep_all, groups, warm,
                        max_bytes)


def _run_ops(binding, fdt, cache, info, keep_all, groups, warm, max_bytes=None):
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
        from ..io.values import gather_index_ranges

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
                        value = _broadcast_kernel(node.shape)(value)
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
    if todo and shown():
        count = new_kernels(todo, fdt, keys)
        if count:
            notice = notice_after(NOTICE_AFTER, f"circuits: compiling {count} kernel{'s' if count > 1 else ''}…")
    try:
        _compute(todo, env, fdt, keys, cache, groups, roots, rows, again)
    finally:
        if notice is not None:
            notice.cancel()
    computed = len(todo)
    if info is not None:
        info.computed += computed
        info.reused += reused
    outs = [env[r.hash] for r in roots]
    if keep_all:
        return outs, env, order
    return outs


# A call still compiling this many seconds after it began says so (``progress.notice_after``).
NOTICE_AFTER = 1.0


def _compute(todo, env, fdt, keys, cache, groups, roots, rows, again) -> None:
    """Compute ``todo`` into ``env`` (fused groups where asked), and keep the values."""
    store: list = []  # (key, value, bytes) for the value cache, stored together at the end
    if groups and cache and rows is None and len(todo) >= _groups.MIN_MEMBERS:
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
