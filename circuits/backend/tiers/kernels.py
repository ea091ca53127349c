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
from ...nodes import Circuit, SetSymbolicShape, Tag
from ..cache.bounded import BoundedCache
from ..cache.compiling import counted_jit
from ..cache.executables import kept
from ..lower.ops import build_op
from ..lower.program import kernel_part

__all__ = ["cached_kernel", "kernel", "broadcast_kernel", "pick_row", "kernel_info"]


# (operation, shapes, precision) -> its compiled kernel; the oldest made go first
_kernels = BoundedCache("kernels", "kernels", max_entries=8192, lru=False)


def _identity_op(x):
    return x


def cached_kernel(key, make):
    """The kernel cached under ``key``: ``counted_jit(make())`` on a miss (the oldest made go
    first beyond the cache's bound); of threads racing on a miss, the first stored wins."""
    fn = _kernels.get(key)
    if fn is not None:
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


def broadcast_kernel(shape: tuple):
    import jax.lax as lax

    return cached_kernel(("broadcast", shape), lambda: lambda v: lax.broadcast(v, shape))


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


