"""Lowering a circuit to a flat program of JAX operations.

``Program(roots, float_dtype)`` lays the distinct nodes out in toposort order, one *slot* each.
Arrays, Scalars and Symbols are **arguments**; every other slot is an op computed from earlier
slots.  ``Program.key`` identifies the computation independently of names, array contents and
scalar values, so a patched circuit (same structure, other arrays or scalars) maps to the same key
and reuses compiled code.  ``Program.skeleton()`` is what a compiled function closes over: ops
built from payloads only, holding no node and no tensor.

>>> import numpy as np
>>> from circuits import Array, Einsum, Scalar
>>> x = Array(np.ones((2, 3), np.float32), name='x')
>>> p = Program([Einsum.from_spec('ab,->a', x, Scalar(2.0))], 'float32')
>>> [type(n).__name__ for n in p.nodes], p.arg_slots
(['Array', 'Scalar', 'Einsum'], (0, 1))
>>> p.key == Program([Einsum.from_spec('ab,->a', x.rename('y'), Scalar(3.0))], 'float32').key
True
"""

from __future__ import annotations

import collections
import struct
from typing import Any, Callable, Sequence

import numpy as np

from .einsum import einsum_op
from ..errors import EvaluationError
from ..hashing import node_hash
from ..nodes import Add, Array, Circuit, Concat, Einsum, GeneralFunction, Index, Rearrange, Scalar, Symbol, Tag
from ..traversal import toposort
from ..shapes import check_allocation, max_alloc_bytes
from ..dtypes import is_float, is_int

ARGUMENT_TYPES = (Array, Scalar, Symbol)


def _jnp():
    import jax.numpy as jnp

    return jnp


def _lax():
    import jax.lax as lax

    return lax


def _common_dtype(values):
    first = values[0].dtype
    if all(v.dtype == first for v in values):
        return list(values)
    target = _jnp().result_type(*values)
    convert = _lax().convert_element_type
    return [v if v.dtype == target else convert(v, target) for v in values]


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
        xs = _common_dtype(xs)
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
        return _lax().concatenate(_common_dtype(xs), axis)

    return concat


def _identity(x):
    return x


def _build_tag(node: Tag, fdt: str) -> Callable:
    return _identity


OP_BUILDERS: dict[type, Callable[[Any, str], Callable]] = {
    Einsum: _build_einsum,
    Add: _build_add,
    GeneralFunction: _build_function,
    Index: _build_index,
    Rearrange: _build_rearrange,
    Concat: _build_concat,
    Tag: _build_tag,
}


# Ops depend only on payload and shapes, and a model repeats the same few (every head's
# einsums, every layer's norm): build each once.  Bounded; ops hold no tensors.
_OP_MEMO: "collections.OrderedDict[tuple, Callable]" = collections.OrderedDict()
_OP_MEMO_SIZE = 4096
_MEMOIZED = (Einsum, Index, Rearrange, Add, Concat)


def build_op(node: Circuit, fdt: str) -> Callable:
    """The JAX op computing ``node`` from its children's values."""
    t = type(node)
    builder = OP_BUILDERS.get(t)
    if builder is None:
        raise EvaluationError(
            f"no JAX lowering for node type {t.__name__}: {node.line()}; "
            "add a builder to circuits.backend.program.OP_BUILDERS"
        )
    if t not in _MEMOIZED:
        return builder(node, fdt)
    key = (t, node._payload_bytes(), node.shape, tuple(c.shape for c in node.children), fdt)
    op = _OP_MEMO.get(key)
    if op is None:
        op = builder(node, fdt)
        _OP_MEMO[key] = op
        if len(_OP_MEMO) > _OP_MEMO_SIZE:
            _OP_MEMO.popitem(last=False)
    return op


def broadcast_scalar(value, shape):
    """A Scalar's 0-d argument broadcast to the Scalar's shape."""
    return value if shape == () else _lax().broadcast(value, shape)


# ---------------------------------------------------------------------------- key
def _pack(values) -> bytes:
    return struct.pack(f"<{len(values)}q", *values)


def _key_part(node: Circuit) -> bytes:
    t = type(node)
    if t is Array or t is Symbol:
        # Value- and name-blind: only what the compiled code depends on.
        return t.type_name.encode() + node.dtype.encode() + b"|" + _pack(node.shape)
    if t is Scalar:
        return b"Scalar" + _pack(node.shape)
    if t is Tag:
        return b"Tag"  # an identity: its uuid changes nothing in the compiled code
    if t is GeneralFunction:
        # id(spec): a function re-registered under the same name must not reuse old code.
        return b"GF" + node.function.name.encode() + b"|" + _pack((id(node.function),))
    return node.type_name.encode() + b"|" + node._payload_bytes()


# ---------------------------------------------------------------------------- programs
class Skeleton:
    """The tensor-free part of a program: ops, wiring, argument slots, outputs.  ``run`` is
    traceable (jit, vmap, grad) and also runs eagerly, freeing each value after its last use."""

    __slots__ = ("ops", "child_slots", "arg_slots", "scalar_shapes", "outputs", "frees", "size")

    def __init__(self, ops, child_slots, arg_slots, scalar_shapes, outputs):
        self.ops = tuple(ops)
        self.child_slots = tuple(child_slots)
        self.arg_slots = tuple(arg_slots)
        self.scalar_shapes = dict(scalar_shapes)
        self.outputs = tuple(outputs)
        self.size = len(self.ops)
        last_use = list(range(self.size))
        for i, kids in enumerate(self.child_slots):
            for j in kids:
                last_use[j] = i
        frees: list[list[int]] = [[] for _ in range(self.size)]
        keep = set(self.outputs)
        for j, i in enumerate(last_use):
            if j not in keep:
                frees[i].append(j)
        self.frees = tuple(tuple(f) for f in frees)

    def run(self, args: Sequence, deltas: dict | None = None) -> list:
        """Output values from argument values (in ``arg_slots`` order).

        ``deltas`` maps slots to values added to what is computed there (zeros that make a node's
        value a differentiable input: gradients with respect to any node).
        """
        env: list[Any] = [None] * self.size
        scalar_shapes = self.scalar_shapes
        for slot, value in zip(self.arg_slots, args):
            shape = scalar_shapes.get(slot)
            env[slot] = value if shape is None else broadcast_scalar(value, shape)
        ops, child_slots, frees = self.ops, self.child_slots, self.frees
        for i in range(self.size):
            op = ops[i]
            if op is not None:
                env[i] = op(*[env[j] for j in child_slots[i]])
            if deltas and i in deltas:
                env[i] = env[i] + deltas[i]
            for j in frees[i]:
                env[j] = None
        return [env[i] for i in self.outputs]


class Program:
    """A circuit flattened for evaluation (see the module docstring).

    ``nodes``: distinct nodes in toposort order; ``slot_of``: node hash -> slot; ``arg_slots``:
    the slots of Arrays, Scalars and Symbols, in order; ``outputs``: the slots of ``roots``;
    ``key``: bytes naming the computation (float dtype included).
    """

    __slots__ = ("nodes", "slot_of", "child_slots", "arg_slots", "outputs", "float_dtype", "key", "_body_key",
                 "_skeleton", "_index_ranges")

    def __init__(self, roots: Sequence[Circuit], float_dtype: str):
        roots = list(roots)
        nodes = toposort(*roots)
        slot_of = {n.hash: i for i, n in enumerate(nodes)}
        self.nodes = nodes
        self.slot_of = slot_of
        self.float_dtype = float_dtype
        self.child_slots = [tuple(slot_of[c.hash] for c in n.children) for n in nodes]
        self.arg_slots = tuple(i for i, n in enumerate(nodes) if type(n) in ARGUMENT_TYPES)
        self._skeleton = None
        self._index_ranges = None
        parts = [float_dtype.encode(), b"#"]
        for node, kids in zip(nodes, self.child_slots):
            parts.append(_key_part(node))
            parts.append(b"(" + _pack(kids) + b")")
        self._body_key = node_hash(b"".join(parts))
        self._set_outputs(roots)

    def _set_outputs(self, roots):
        self.outputs = tuple(self.slot_of[r.hash] for r in roots)
        self.key = node_hash(self._body_key + b"->" + _pack(self.outputs))

    def with_outputs(self, roots: Sequence[Circuit]) -> "Program":
        """The same layout computing other outputs (nodes of this program), without re-walking.

        Raises ``KeyError`` for a node that is not in the program."""
        other = object.__new__(Program)
        for name in ("nodes", "slot_of", "child_slots", "arg_slots", "float_dtype", "_body_key", "_index_ranges"):
            setattr(other, name, getattr(self, name))
        other._skeleton = None
        other._set_outputs(list(roots))
        return other

    def __len__(self):
        return len(self.nodes)

    def arg_nodes(self) -> list[Circuit]:
        return [self.nodes[i] for i in self.arg_slots]

    def index_ranges(self) -> dict:
        """Argument node hash -> ``(lo, hi, gather)`` for the int arguments whose values index
        a gather (``circuits.io.values.gather_index_ranges``); computed once."""
        if self._index_ranges is None:
            ranges = {}
            if any(is_int(self.nodes[i].dtype) for i in self.arg_slots):
                from ..io.values import gather_index_ranges

                found = gather_index_ranges(self.nodes)
                for i in self.arg_slots:
                    r = found.get(self.nodes[i].hash)
                    if r is not None:
                        ranges[self.nodes[i].hash] = r
            self._index_ranges = ranges
        return self._index_ranges

    def skeleton(self) -> Skeleton:
        """Ops built from payloads (raises ``EvaluationError`` before anything runs if a node
        cannot be lowered)."""
        if self._skeleton is None:
            fdt = self.float_dtype
            budget = max_alloc_bytes()
            for n in self.nodes:  # refuse a tensor too large to allocate before tracing anything
                check_allocation(n.shape, fdt if is_float(n.dtype) else n.dtype,
                                 n.line, EvaluationError, budget)
            ops = [None if type(n) in ARGUMENT_TYPES else build_op(n, fdt) for n in self.nodes]
            scalar_shapes = {i: self.nodes[i].shape for i in self.arg_slots if type(self.nodes[i]) is Scalar}
            self._skeleton = Skeleton(ops, self.child_slots, self.arg_slots, scalar_shapes, self.outputs)
        return self._skeleton
