"""The op-by-op tier's kernels: one compiled function per (operation, shapes, float precision),
shared by every circuit (every head's einsums, every layer's norm share one), so a new variant
of a known model compiles nothing new; each kernel's executable is kept on disk across
processes (``circuits.backend.cache.executables``).

>>> import numpy as np
>>> from circuits import GeneralFunction, Symbol
>>> x = Symbol((3,), name='x')
>>> exp = kernel(GeneralFunction('exp', x), 'float32')
>>> exp is kernel(GeneralFunction('exp', Symbol((3,), name='other')), 'float32')
True
"""

from __future__ import annotations

import numpy as np

from ...dtypes import dtype_str
from ...nodes import Add, Circuit, Index, SetSymbolicShape, Tag
from ..cache.bounded import BoundedCache
from ..cache.compiling import counted_jit, note_reused
from ..cache.executables import kept
from ..lower.ops import build_op
from ..lower.program import kernel_part

__all__ = ["cached_kernel", "kernel", "int_picks", "pick_kernel", "broadcast_kernel", "pick_row", "pick_key", "kernel_info",
           "kernel_over_rows", "sum_over_rows", "sums_pairwise", "broadcast_rows", "new_kernels", "made", "kernel_keys"]


# (operation, shapes, precision) -> its compiled kernel; the oldest made go first
_kernels = BoundedCache("kernels", "kernels", max_entries=8192, lru=False)


def on_cpu() -> bool:
    """Whether JAX's default backend is the CPU."""
    import jax

    return jax.default_backend() == "cpu"


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
    shapes, precision), shared by every circuit (a Tag or a SetSymbolicShape is the identity; an
    Index picking with ints is ``pick_kernel``'s, the positions passed as data).  The key's node
    part is kept on the node (``program.kernel_part``)."""
    t = type(node)
    if t is Tag or t is SetSymbolicShape:
        return _identity_op
    if t is Index:
        found = int_picks(node)
        if found is not None:
            fn = pick_kernel(node.children[0].shape, found[0], str(node.dtype), fdt)
            return lambda x, at=found[1]: fn(x, at)
    return cached_kernel((*kernel_part(node), fdt), lambda: build_op(node, fdt))


def int_picks(node: Index):
    """``(int axes, positions as an int32 array)`` when ``node`` picks with ints only (every other
    axis whole, in order), else None: the Indexes whose kernel takes the positions as data (one
    kernel for every position: a metric at another position, another head of a stacked layer).

    >>> from circuits import Array
    >>> x = Array(np.zeros((4, 3, 2), np.float32))
    >>> axes, at = int_picks(Index(x, (2, slice(None), -1)))
    >>> axes, at.tolist(), int_picks(Index(x, (slice(1, 3),)))
    ((0, 2), [2, 1], None)
    """
    axes, positions = [], []
    for axis, (entry, n) in enumerate(zip(node.full_index(), node.children[0].shape)):
        if type(entry) is int:
            axes.append(axis)
            positions.append(entry % n)
        elif type(entry) is not slice or entry.indices(n) != (0, n, 1):
            return None
    found = (tuple(axes), np.asarray(positions, np.int32)) if axes else None
    return found


def pick_kernel(shape: tuple, axes: tuple, dtype: str, fdt: str, rows: int | None = None):
    """``(x, positions) -> x`` at ``positions`` on the int ``axes`` (those axes dropped): one
    kernel per (shape, axes, dtype, precision), whatever the positions; ``rows``: ``x`` carries a
    batch axis of ``rows`` first (the positions the same for every row)."""

    def make():
        import jax.lax as lax

        rank = len(shape)
        sizes = tuple(1 if a in axes else n for a, n in enumerate(shape))
        out = tuple(n for a, n in enumerate(shape) if a not in axes)

        def pick(x, positions):
            at = [np.int32(0)] * rank
            for j, axis in enumerate(axes):
                at[axis] = positions[j]
            return lax.dynamic_slice(x, at, sizes).reshape(out)

        if rows is None:
            return pick
        import jax

        return jax.vmap(pick, in_axes=(0, None))

    return cached_kernel(("pick-at", shape, axes, dtype, fdt, rows), make)


def kernel_over_rows(node: Circuit, fdt: str, axes: tuple, rows: int):
    """The kernel computing ``node`` for every row of a batch at once: the operation's kernel
    mapped (``jax.vmap``) over the leading axis of the children whose ``axes`` entry is 0 (the
    others are the same for every row).  One per (operation, shapes, precision, rows, axes),
    shared by every circuit, as ``kernel`` is for one row."""
    t = type(node)
    if t is Tag or t is SetSymbolicShape:
        return _identity_op
    if t is Index and axes == (0,):
        found = int_picks(node)
        if found is not None:
            fn = pick_kernel(node.children[0].shape, found[0], str(node.dtype), fdt, rows)
            return lambda x, at=found[1]: fn(x, at)

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
    batched = rows is not None and keys.is_batched(node)
    if t is Index:
        found = int_picks(node)
        if found is not None:
            return [("pick-at", node.children[0].shape, found[0], str(node.dtype), fdt, rows if batched else None)]
    if batched:
        flags = [keys.is_batched(c) for c in node.children]
        if sums_pairwise(node):
            return [key for key, _ in _sum_steps(node, flags, fdt, rows)]
        return [(*kernel_part(node), fdt, "rows", rows, tuple(0 if f else None for f in flags))]
    return [(*kernel_part(node), fdt)]


def made(key) -> bool:
    """Whether the kernel ``key`` names is made (in memory)."""
    return _kernels.peek(key) is not None


def kernel_keys(node: Circuit, fdt: str, keys) -> list:
    """The keys of the kernels computing ``node`` takes (none for a Tag or a SetSymbolicShape)."""
    return _kernel_keys(node, fdt, keys)


def new_kernels(nodes, fdt: str, keys) -> int:
    """How many distinct kernels computing ``nodes`` would make (not made yet)."""
    return len({k for n in nodes for k in _kernel_keys(n, fdt, keys) if _kernels.peek(k) is None})


def sums_pairwise(node: Circuit) -> bool:
    """Whether ``node`` is an Add ``sum_over_rows`` computes: two children or more, of one
    non-bool dtype (its own kernel promotes mixed dtypes over all of them at once)."""
    kids = node.children
    return (type(node) is Add and len(kids) >= 2 and node.dtype != "bool"
            and all(c.dtype == node.dtype for c in kids))


def broadcast_kernel(shape: tuple):
    import jax.lax as lax

    return cached_kernel(("broadcast", shape), lambda: lambda v: lax.broadcast(v, shape))


def broadcast_rows(value, rows: int):
    """``value`` repeated ``rows`` times along a new leading axis (a value the same for every row
    of a batch, given the batch axis), through one cached kernel per shape."""
    return broadcast_kernel((rows,))(value)


def pick_row(array, r: int):
    """Row ``r`` of ``array`` (one kernel per shape, the row passed as data: a static slice
    would compile one per row)."""

    def make():
        import jax.lax as lax

        return lambda a, i: lax.dynamic_index_in_dim(a, i, keepdims=False)

    return cached_kernel(pick_key(array), make)(array, np.int32(r))


def pick_key(array) -> tuple:
    """The key of ``pick_row``'s kernel for ``array``."""
    return ("pick", array.shape, dtype_str(array.dtype))


def kernel_info() -> dict:
    """``kernels`` held, ``kernel_hits`` and ``kernel_misses`` (ops whose kernel was made)."""
    info = _kernels.info()
    return {"kernels": info["entries"], "kernel_hits": info["hits"], "kernel_misses": info["misses"]}


