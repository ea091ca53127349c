"""Per-node-type numpy ops: ``numpy_op(node, float_dtype, axes)`` returns ``op(*child_values)``
computing the node on the CPU with numpy, or None where the node has no numpy path.

The op-by-op tier computes a node whose JAX kernel is not made yet this way
(``circuits.backend.tiers.host``): no tracing and no XLA compilation, and no ``import jax`` for a
circuit whose every node has a numpy path, while the kernel is made in the background for the next
call.  Each op gives what the node's JAX kernel gives, to float rounding, in the dtype JAX
computes it in (``canonical``: floats in the evaluation precision, int64 as int32 unless x64 is
on); its result is read-only (the value cache keeps it, and a caller may hold it).

``axes`` (one entry per child: 0 where the child carries a leading batch axis, None where it is
the same for every row) computes the node for every row at once, as ``jax.vmap`` of the kernel
would (``kernel_over_rows``); None: one row.

- Einsum: contracted two operands at a time (numpy's greedy order) through ``matmul`` over the
  shared axes (BLAS, in float32 as in float64); repeated ids within an operand through
  ``np.einsum``; an output that repeats an id has no numpy path.
- Add, Index, Rearrange, Concat, Scatter, Tag: their numpy counterparts.
- GeneralFunction: the function's ``numpy`` implementation (``FunctionSpec.numpy``; the
  built-ins that have an exact counterpart), None for one registered with JAX alone.

>>> import numpy as np
>>> from circuits import Array, Einsum
>>> a = Array(np.arange(6, dtype=np.float32).reshape(2, 3), name='a')
>>> op = numpy_op(Einsum.from_spec('ab,cb->ac', a, a), 'float32')
>>> op(a.value, a.value)
array([[ 5., 14.],
       [14., 50.]], dtype=float32)
>>> numpy_op(Einsum.from_spec('ab,cb->ac', a, a), 'float32', (0, None))(np.stack([a.value] * 2), a.value).shape
(2, 2, 2)
"""

from __future__ import annotations

import math
import os
import sys
from typing import Callable, Sequence

import numpy as np

from ...dtypes import is_float
from ...nodes import (
    Add,
    Circuit,
    Concat,
    Einsum,
    GeneralFunction,
    Index,
    Rearrange,
    Scatter,
    SetSymbolicShape,
    Tag,
)
from ..cache.bounded import BoundedCache

__all__ = ["numpy_op", "raw_op", "op_key", "new_id", "with_rows", "einsum_fn", "x64_on", "PLAN_ROWS", "canonical", "jax_dtype", "host_dtypes", "HOST_FLOATS"]

#: The evaluation precisions numpy computes in (bfloat16 and float16 stay with JAX).
HOST_FLOATS = ("float32", "float64")


# ---------------------------------------------------------------------------- dtypes
_X64_WORDS = ("1", "true", "t", "yes", "y", "on")


def x64_on(fdt: str) -> bool:
    """Whether JAX computes 64-bit ints and floats now (without importing it when it is not)."""
    if fdt == "float64":
        return True
    jax = sys.modules.get("jax")
    if jax is not None and hasattr(jax, "config"):
        return bool(jax.config.jax_enable_x64)
    return os.environ.get("JAX_ENABLE_X64", "").lower() in _X64_WORDS


_NARROW = {"int64": "int32", "uint64": "uint32", "float64": "float32", "complex128": "complex64"}


def canonical(dtype: str, fdt: str) -> np.dtype:
    """The numpy dtype JAX computes a node of ``dtype`` in, at evaluation precision ``fdt``.

    >>> canonical('float64', 'float32'), canonical('int64', 'float64')
    (dtype('float32'), dtype('int64'))
    """
    name = fdt if is_float(dtype) else str(dtype)
    if not x64_on(fdt):
        name = _NARROW.get(name, name)
    return np.dtype(name)


def jax_dtype(dtype: str) -> np.dtype:
    """The numpy dtype JAX computes ``dtype`` in now (int64 as int32 unless x64 is on), without
    importing JAX."""
    name = str(np.dtype(dtype))
    return np.dtype(name if x64_on("") else _NARROW.get(name, name))


def host_dtypes(fdt: str) -> bool:
    """Whether numpy can compute in the evaluation precision ``fdt``."""
    return fdt in HOST_FLOATS


def _read_only(x):
    x = np.asarray(x)
    if x.flags.writeable:
        x.flags.writeable = False
    return x


def _finish(target: np.dtype, shape: tuple):
    """A result in ``target``, read-only, checked against the node's ``shape`` (a batch axis
    first where there is one)."""

    def finish(x):
        x = np.asarray(x)
        if x.dtype != target:
            x = x.astype(target)
        return _read_only(x)

    return finish


# ---------------------------------------------------------------------------- einsum
_LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


def _zero_strided(shape):
    """An array of ``shape`` that takes no memory (for planning the contraction order)."""
    return np.lib.stride_tricks.as_strided(np.zeros(1, np.float32), shape, (0,) * len(shape))


# A contraction of fewer multiply-adds than this runs on one BLAS thread: a 1600x64 by 64x16
# product took 10-60 ms on OpenBLAS's two threads of a loaded 2-core machine, 0.05 ms on one; a
# 32x3072 by 3072x768 one (GPT-2's MLP) 63 ms (up to 500) on two, 20 ms on one.
SMALL_PRODUCTS = 1 << 27
_blas: list = []  # [(set, get)] of the BLAS numpy loaded, or [None] where it cannot be found


def _blas_threads(n: int) -> int:
    """Set the threads of the OpenBLAS numpy loaded to ``n``; returns how many it had (0 where
    its controls cannot be found: nothing is changed)."""
    if not _blas:
        _blas.append(_find_blas())
    found = _blas[0]
    if found is None:
        return 0
    set_threads, get_threads = found
    before = get_threads()
    if before != n:
        set_threads(n)
    return before


def _find_blas():
    try:
        import ctypes

        with open("/proc/self/maps") as maps:
            paths = sorted({line.split()[-1] for line in maps if "openblas" in line.lower() and "/" in line})
        for path in paths:
            lib = ctypes.CDLL(path)
            for prefix, suffix in (("scipy_openblas", "64_"), ("openblas", "64_"), ("openblas", "")):
                setter = getattr(lib, f"{prefix}_set_num_threads{suffix}", None)
                getter = getattr(lib, f"{prefix}_get_num_threads{suffix}", None)
                if setter is not None and getter is not None:
                    setter.argtypes, getter.restype = [ctypes.c_int], ctypes.c_int
                    return setter, getter
    except (OSError, ValueError, AttributeError):
        pass
    return None


def _pair(a_ids: tuple, b_ids: tuple, keep: set):
    """``(fn(a, b), out ids)``: the contraction of two operands over the ids they share and
    ``keep`` does not hold, through one ``matmul`` over the shared ids ``keep`` holds."""
    a_sum = tuple(i for i, x in enumerate(a_ids) if x not in b_ids and x not in keep)
    b_sum = tuple(i for i, x in enumerate(b_ids) if x not in a_ids and x not in keep)
    a_left = [x for x in a_ids if x in b_ids or x in keep]
    b_left = [x for x in b_ids if x in a_ids or x in keep]
    batch = [x for x in a_left if x in b_left and x in keep]
    summed = [x for x in a_left if x in b_left and x not in keep]
    a_only = [x for x in a_left if x not in b_left]
    b_only = [x for x in b_left if x not in a_left]
    a_perm = tuple(a_left.index(x) for x in batch + a_only + summed)
    b_perm = tuple(b_left.index(x) for x in batch + summed + b_only)
    nb, na, nk = len(batch), len(a_only), len(summed)

    def contract(a, b):
        if a_sum:
            a = a.sum(axis=a_sum)
        if b_sum:
            b = b.sum(axis=b_sum)
        a = np.transpose(a, a_perm)
        b = np.transpose(b, b_perm)
        if not nk:  # nothing summed: a product, broadcast
            return a.reshape(a.shape + (1,) * (b.ndim - nb)) * b.reshape(b.shape[:nb] + (1,) * na + b.shape[nb:])
        bs, ms, ns = a.shape[:nb], a.shape[nb:nb + na], b.shape[nb + nk:]
        k = math.prod(a.shape[nb + na:])
        m, n = math.prod(ms), math.prod(ns)
        small = math.prod(bs) * m * n * k < SMALL_PRODUCTS
        if small:
            before = _blas_threads(1)
        try:
            if nb:
                out = np.matmul(a.reshape(math.prod(bs), m, k), b.reshape(math.prod(bs), k, n))
            else:
                out = np.dot(a.reshape(m, k), b.reshape(k, n))
        finally:
            if small and before:
                _blas_threads(before)
        return out.reshape(bs + ms + ns)

    return contract, tuple(batch + a_only + b_only)


def einsum_fn(in_axes: Sequence[tuple], out_axes: tuple, shapes: Sequence[tuple], target) -> Callable | None:
    """``fn(*operands)``: the einsum of operands with ids ``in_axes`` (of ``shapes``, for its
    plan) to ids ``out_axes`` in ``target``, two operands at a time through ``matmul``; None
    where the output repeats an id."""
    if len(set(out_axes)) != len(out_axes):
        return None  # an output that repeats an id (a diagonal written): JAX's kernel
    ids = sorted({x for t in in_axes for x in t} | set(out_axes))
    if len(ids) > len(_LETTERS):
        return None
    letter = {x: _LETTERS[k] for k, x in enumerate(ids)}
    spec = ",".join("".join(letter[x] for x in t) for t in in_axes) + "->" + "".join(letter[x] for x in out_axes)
    if len(in_axes) == 1 or any(len(set(t)) != len(t) for t in in_axes):
        return lambda *xs: np.einsum(spec, *[x.astype(target, copy=False) for x in xs])
    path = np.einsum_path(spec, *[_zero_strided(s) for s in shapes], optimize="greedy")[0][1:]
    steps = []
    terms = [tuple(t) for t in in_axes]
    for picked in path:
        picked = sorted(picked)
        while len(picked) > 1:
            i, j = picked[0], picked[1]
            others = [t for k, t in enumerate(terms) if k not in (i, j)]
            keep = set(out_axes).union(*others) if others else set(out_axes)
            fn, new = _pair(terms[i], terms[j], keep)
            steps.append((i, j, fn))
            terms = [t for k, t in enumerate(terms) if k not in (i, j)] + [new]
            picked = [len(terms) - 1] + [p - (p > i) - (p > j) for p in picked[2:]]
    last = terms[0]
    final = None
    if last != tuple(out_axes):
        final = "".join(letter[x] for x in last) + "->" + "".join(letter[x] for x in out_axes)

    def einsum(*xs):
        values = [x.astype(target, copy=False) for x in xs]
        for i, j, fn in steps:
            out = fn(values[i], values[j])
            values = [v for k, v in enumerate(values) if k not in (i, j)] + [out]
        out = values[0]
        return out if final is None else np.einsum(final, out)

    return einsum


def new_id(in_axes, out_axes) -> int:
    """An id no operand nor the output of an einsum uses."""
    return max([x for t in in_axes for x in t] + list(out_axes) + [-1]) + 1


def with_rows(in_axes: list, out_axes: tuple, shapes: list, axes: tuple) -> tuple:
    """``(row, in_axes, shapes)``: an einsum's ids and operand shapes with one id more, ``row``,
    first on the operands whose ``axes`` entry is 0 (``PLAN_ROWS`` rows, for the plan)."""
    row = new_id(in_axes, out_axes)
    return (row, [(row, *t) if a == 0 else t for t, a in zip(in_axes, axes)],
            [(PLAN_ROWS, *s) if a == 0 else s for s, a in zip(shapes, axes)])


def _build_einsum(node: Einsum, target, axes):
    if not node.children:
        return lambda: np.ones((), target)
    in_axes = [tuple(t) for t in node.in_axes]
    out_axes = tuple(node.out_axes)
    shapes = [tuple(c.shape) for c in node.children]
    if axes is not None:  # the batch axis: one id more, on the batched operands and the output
        row, in_axes, shapes = with_rows(in_axes, out_axes, shapes, axes)
        out_axes = (row, *out_axes)
    if node.dtype == "bool":
        op = einsum_fn(in_axes, out_axes, shapes, np.dtype(np.int32))
        return None if op is None else (lambda *xs: op(*xs) > 0)
    return einsum_fn(in_axes, out_axes, shapes, target)


# A stand-in for the number of rows when planning an einsum over a batch (the order does not
# depend on it much; the plan is kept per node shape, not per batch size).
PLAN_ROWS = 8


# ---------------------------------------------------------------------------- the others
def _aligned(x, batched: bool, rank: int):
    """A child's value shaped to broadcast against a result of ``rank`` axes (after the batch
    axis, where there is one) the way JAX broadcasts it: trailing axes aligned."""
    if batched and x.ndim - 1 < rank:
        return x.reshape((x.shape[0],) + (1,) * (rank - x.ndim + 1) + x.shape[1:])
    return x


def _build_add(node: Add, target, axes):
    shape = node.shape
    if not node.children:
        return lambda: np.zeros((), target)
    flags = [a == 0 for a in axes] if axes is not None else [False] * len(node.children)
    rank = len(shape)

    def add(*xs):
        lead = None
        out = None
        for x, batched in zip(xs, flags):
            x = _aligned(x.astype(target, copy=False), batched, rank)
            if batched:
                lead = x.shape[0]
            out = x if out is None else out + x
        full = shape if lead is None else (lead, *shape)
        return out if out.shape == full else np.broadcast_to(out, full)

    return add


def _build_index(node: Index, target, axes):
    shape = node.children[0].shape
    basic, takes = [], []
    pos = 0
    for entry, n in zip(node.full_index(), shape):
        if isinstance(entry, np.ndarray):
            basic.append(slice(None))
            takes.append((pos, np.asarray(entry % max(n, 1), dtype=np.intp)))
            pos += 1
        elif isinstance(entry, slice):
            basic.append(entry)
            pos += 1
        else:
            basic.append(int(entry))
    lead = 1 if axes is not None and axes[0] == 0 else 0
    basic = tuple([slice(None)] * lead + basic)

    def index(x):
        x = x[basic]
        for axis, arr in takes:
            x = np.take(x, arr, axis=axis + lead, mode="clip")
        return x

    return index


def _build_rearrange(node: Rearrange, target, axes):
    sizes = dict(node.sizes)
    out_names = [a for g in node.out_groups for a in g]
    kept = [a for g in node.in_groups for a in g if a in out_names]
    present = [a for a in out_names if a in kept]
    lead = 1 if axes is not None and axes[0] == 0 else 0
    perm = tuple(range(lead)) + tuple(kept.index(a) + lead for a in present)
    split = tuple(sizes[a] for a in kept)
    positions = [i for i, a in enumerate(out_names) if a in kept]
    expanded = tuple(sizes[a] for a in out_names)
    placed = tuple(sizes[a] if i in positions else 1 for i, a in enumerate(out_names))
    repeats = len(present) != len(out_names)
    out_shape = tuple(node.shape)

    def rearrange(x):
        rows = x.shape[:lead]
        x = x.reshape(rows + split)
        x = np.transpose(x, perm)
        if repeats:
            x = np.broadcast_to(x.reshape(rows + placed), rows + expanded)
        return x.reshape(rows + out_shape)

    return rearrange


def _build_concat(node: Concat, target, axes):
    axis = node.axis
    flags = [a == 0 for a in axes] if axes is not None else None

    def concat(*xs):
        xs = [x.astype(target, copy=False) for x in xs]
        if flags is None:
            return np.concatenate(xs, axis)
        rows = next(x.shape[0] for x, b in zip(xs, flags) if b)
        xs = [x if b else np.broadcast_to(x, (rows, *x.shape)) for x, b in zip(xs, flags)]
        return np.concatenate(xs, axis + 1)

    return concat


def _build_scatter(node: Scatter, target, axes):
    pads = [(start, n - start - k) for start, n, k in zip(node.starts(), node.shape, node.children[0].shape)]
    if not any(before or after for before, after in pads):
        return _identity  # nothing around the block (a 0-d one too: np.pad refuses an empty pad list)
    if axes is not None and axes[0] == 0:
        pads = [(0, 0)] + pads

    def scatter(x):
        return np.pad(x, pads)

    return scatter


def _identity(x):
    return x


def _build_tag(node, target, axes):
    return _identity


def _build_function(node: GeneralFunction, target, axes):
    fn = getattr(node.function, "numpy", None)
    if fn is None:
        return None
    if axes is None or not any(a == 0 for a in axes):
        return fn
    core = node.function.core_ndim
    flags = [a == 0 for a in axes]
    if core == 0:
        rank = len(node.shape)
        return lambda *xs: fn(*[_aligned(x, b, rank) for x, b in zip(xs, flags)])
    if core is not None and len(flags) == 1:
        return fn  # acts on the last axes: the batch axis is one more leading axis

    def by_row(*xs):  # no rule for leading axes: row by row
        rows = next(x.shape[0] for x, b in zip(xs, flags) if b)
        return np.stack([np.asarray(fn(*[x[r] if b else x for x, b in zip(xs, flags)])) for r in range(rows)])

    return by_row


_BUILDERS = {
    Einsum: _build_einsum,
    Add: _build_add,
    GeneralFunction: _build_function,
    Index: _build_index,
    Rearrange: _build_rearrange,
    Concat: _build_concat,
    Scatter: _build_scatter,
    Tag: _build_tag,
    SetSymbolicShape: _build_tag,
}

# (type, payload, shapes, precision, axes) -> its numpy op (False: none); ops hold no node
_MEMO = BoundedCache("numpy ops", "kernels", max_entries=4096, lru=False)
_NONE = False


def op_key(node: Circuit, fdt: str, axes) -> tuple:
    """What a numpy op of ``node`` depends on (the op caches keep ops by it, holding no node)."""
    t = type(node)
    return (t, node._payload_bytes() if t is not GeneralFunction else node.function.name, node.shape,
            tuple(c.shape for c in node.children), tuple(c.dtype for c in node.children), node.dtype, fdt, axes,
            x64_on(fdt))


def raw_op(node: Circuit, target, axes: tuple | None = None) -> Callable | None:
    """``numpy_op``'s computation of ``node`` in ``target`` as it is: not kept, its result not
    cast nor made read-only (``numpy_vjp`` runs a selection on float64 positions)."""
    builder = _BUILDERS.get(type(node))
    if axes is not None and not any(a == 0 for a in axes):
        axes = None
    return None if builder is None else builder(node, np.dtype(target), axes)


def numpy_op(node: Circuit, fdt: str, axes: tuple | None = None) -> Callable | None:
    """The numpy op computing ``node`` from its children's values (``axes``: which carry a
    leading batch axis; see the module docstring), or None where it has none."""
    t = type(node)
    builder = _BUILDERS.get(t)
    if builder is None or fdt not in HOST_FLOATS:
        return None
    if axes is not None and not any(a == 0 for a in axes):
        axes = None
    key = op_key(node, fdt, axes)
    op = _MEMO.get(key)
    if op is None:
        target = canonical(node.dtype, fdt)
        made = builder(node, target, axes)
        if made is None:
            op = _NONE
        else:
            finish = _finish(target, node.shape)

            def op(*xs, made=made, finish=finish):
                with np.errstate(all="ignore"):  # JAX warns of nothing: inf and nan are values
                    return finish(made(*[np.asarray(x) for x in xs]))

        op = _MEMO.setdefault(key, op)
    return None if op is _NONE else op
