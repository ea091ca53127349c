"""Per-node-type JAX ops: ``build_op(node, float_dtype)`` returns ``op(*child_values)``.

Each builder reads only the node's payload and shapes, plans once what it can (an Index's slices
and gathers, a Rearrange's reshape and transpose, an Einsum's contraction order in
``circuits.backend.lower.einsum``) and returns a function of the children's values that holds no node
and no tensor, so a compiled function closing over it keeps no array alive.  Ops depend only on
payload and shapes, so equal ones are built once (a bounded memo).

>>> import numpy as np, jax.numpy as jnp
>>> from circuits import Array, Index
>>> x = Array(np.arange(6, dtype=np.float32).reshape(2, 3))
>>> op = build_op(Index(x, (1, slice(None, None, -1))), 'float32')
>>> op(jnp.asarray(x.value))
Array([5., 4., 3.], dtype=float32)
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ...errors import EvaluationError
from ...nodes import (
    Add,
    Circuit,
    Concat,
    DiscreteVar,
    Einsum,
    GeneralFunction,
    Index,
    Module,
    Rearrange,
    Scatter,
    SetSymbolicShape,
    Tag,
)
from ..cache.bounded import BoundedCache
from .einsum import common_dtype, einsum_op

__all__ = ["OP_BUILDERS", "build_op", "broadcast_scalar"]


def _jnp():
    import jax.numpy as jnp

    return jnp


def _lax():
    import jax.lax as lax

    return lax


# ---------------------------------------------------------------------------- op builders
# Each builder reads only the node's payload and shapes and returns ``op(*child_values)``; the op
# must not hold the node (a cached compiled function would then keep its tensors alive).
def _build_einsum(node: Einsum, fdt: str) -> Callable:
    if not node.children:
        return lambda: _jnp().ones((), dtype=fdt)
    op = einsum_op(node.in_axes, node.out_axes, [c.shape for c in node.children])
    if node.dtype != "bool":
        return op

    def logical(*xs):
        # An einsum of bools means numpy's: True where any product of its terms is True (an OR
        # of ANDs).  JAX's sums refuse bools, so count in int32 and compare.
        jnp = _jnp()
        return op(*[x.astype(jnp.int32) for x in xs]) > 0

    return logical


def _build_add(node: Add, fdt: str) -> Callable:
    shape = node.shape
    rank = len(shape)
    if not node.children:
        return lambda: _jnp().zeros((), dtype=fdt)

    def add(*xs):
        # lax.add, not jnp's +: no implicit broadcasting or promotion to trace, so do both here
        lax = _lax()
        xs = common_dtype(xs)
        if xs[0].dtype == np.bool_:
            return _jnp().broadcast_to(sum(xs[1:], xs[0]), shape)
        out = None
        for x in xs:
            if x.shape != shape:
                x = lax.broadcast_in_dim(x, shape, tuple(range(rank - x.ndim, rank)))
            out = x if out is None else lax.add(out, x)
        return out

    return add


def _build_function(node: GeneralFunction, fdt: str) -> Callable:
    return node.function.jax


def _build_index(node: Index, fdt: str) -> Callable:
    # Outer-style indexing, axis by axis, planned once: ints and slices become one strided
    # lax.slice (reversed where the step is negative, int axes squeezed), then each array entry
    # gathers along its (renumbered) axis.
    shape = node.children[0].shape
    starts, limits, strides, reverse, squeeze, takes = [], [], [], [], [], []
    pos = 0
    for axis, (entry, n) in enumerate(zip(node.full_index(), shape)):
        start, limit, stride = 0, n, 1
        if isinstance(entry, np.ndarray):
            # Constructors check bounds; normalise negatives so the gather needs no wrap.
            takes.append((pos, np.asarray(entry % max(n, 1), dtype=np.int32)))
            pos += 1
        elif isinstance(entry, slice):
            r = range(*entry.indices(n))
            if not r:
                start, limit = 0, 0
            elif r.step > 0:
                start, limit, stride = r[0], r[-1] + 1, r.step
            else:
                start, limit, stride = r[-1], r[0] + 1, -r.step
                reverse.append(axis)
            pos += 1
        else:
            start, limit = entry % n, entry % n + 1
            squeeze.append(axis)
        starts.append(start)
        limits.append(limit)
        strides.append(stride)
    sliced = starts != [0] * len(shape) or limits != list(shape) or strides != [1] * len(shape)
    strides_arg = None if strides == [1] * len(shape) else tuple(strides)
    starts, limits, reverse, squeeze = tuple(starts), tuple(limits), tuple(reverse), tuple(squeeze)

    def index(x):
        lax = _lax()
        if sliced:
            x = lax.slice(x, starts, limits, strides_arg)
        if reverse:
            x = lax.rev(x, reverse)
        if squeeze:
            x = lax.squeeze(x, squeeze)
        for axis, arr in takes:
            x = _jnp().take(x, arr, axis=axis, mode="clip")
        return x

    return index


def _build_rearrange(node: Rearrange, fdt: str) -> Callable:
    sizes = dict(node.sizes)
    out_names = [a for g in node.out_groups for a in g]
    kept = [a for g in node.in_groups for a in g if a in out_names]
    present = [a for a in out_names if a in kept]
    perm = tuple(kept.index(a) for a in present)
    split_shape = tuple(sizes[a] for a in kept)
    repeats = len(present) != len(out_names)
    # Axes on the right only repeat the input: broadcast into their output positions.
    positions = tuple(i for i, a in enumerate(out_names) if a in kept)
    expanded_shape = tuple(sizes[a] for a in out_names)
    out_shape = node.shape
    identity_perm = perm == tuple(range(len(perm)))

    def rearrange(x):
        lax = _lax()
        if x.shape != split_shape:
            x = lax.reshape(x, split_shape)
        if not identity_perm:
            x = lax.transpose(x, perm)
        if repeats:
            x = lax.broadcast_in_dim(x, expanded_shape, positions)
        return x if x.shape == out_shape else lax.reshape(x, out_shape)

    return rearrange


def _build_concat(node: Concat, fdt: str) -> Callable:
    axis = node.axis

    def concat(*xs):
        return _lax().concatenate(common_dtype(xs), axis)

    return concat


def _identity(x):
    return x


def _build_tag(node: Tag, fdt: str) -> Callable:
    return _identity


def _build_scatter(node: Scatter, fdt: str) -> Callable:
    # Zeros around a block: one lax.pad (differentiable, no scatter op).
    pads = tuple((start, n - start - k, 0) for start, n, k in
                 zip(node.starts(), node.shape, node.children[0].shape))

    def scatter(x):
        return _lax().pad(x, _jnp().zeros((), x.dtype), pads)

    return scatter


def _build_module(node, fdt: str) -> Callable:  # pragma: no cover - Program inlines modules first
    raise EvaluationError(f"{node.line()}: a Module is lowered by substitution (Program inlines it)")


def _build_discrete_var(node: DiscreteVar, fdt: str) -> Callable:
    raise EvaluationError(
        f"a DiscreteVar has no single value: {node.line()}; evaluate "
        "circuits.expand.sample(circuit, num_samples, seed) instead (a batch of its samples)")


OP_BUILDERS: dict[type, Callable[[Any, str], Callable]] = {
    Einsum: _build_einsum,
    Add: _build_add,
    GeneralFunction: _build_function,
    Index: _build_index,
    Rearrange: _build_rearrange,
    Concat: _build_concat,
    Tag: _build_tag,
    Scatter: _build_scatter,
    SetSymbolicShape: _build_tag,  # the child's value, its shape only restated
    DiscreteVar: _build_discrete_var,
    Module: _build_module,  # lowered by substitution: see circuits.backend.lower.program
}


# Ops depend only on payload and shapes, and a model repeats the same few (every head's
# einsums, every layer's norm): build each once.  Bounded; ops hold no tensors.
_OP_MEMO = BoundedCache("ops", "kernels", max_entries=4096, lru=False)
_MEMOIZED = (Einsum, Index, Rearrange, Add, Concat)


def build_op(node: Circuit, fdt: str) -> Callable:
    """The JAX op computing ``node`` from its children's values."""
    t = type(node)
    builder = OP_BUILDERS.get(t)
    if builder is None:
        raise EvaluationError(
            f"no JAX lowering for node type {t.__name__}: {node.line()}; "
            "add a builder to circuits.backend.lower.ops.OP_BUILDERS"
        )
    if t not in _MEMOIZED:
        return builder(node, fdt)
    key = (t, node._payload_bytes(), node.shape, tuple(c.shape for c in node.children), fdt)
    op = _OP_MEMO.get(key)
    if op is None:
        op = _OP_MEMO.setdefault(key, builder(node, fdt))
    return op


def broadcast_scalar(value, shape):
    """A Scalar's 0-d argument broadcast to the Scalar's shape."""
    return value if shape == () else _lax().broadcast(value, shape)
