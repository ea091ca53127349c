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

from typing import Any, Collection, Sequence

from ...dtypes import is_float, is_int
from ...errors import EvaluationError
from ...expand import substitute_all_modules
from ...hashing import argument_key_part, op_key_part, pack_ints, program_body_key, program_key
from ...nodes import Array, Circuit, GeneralFunction, Module, Scalar, Symbol, Tag
from ...shapes import check_allocation, max_alloc_bytes
from ...traversal import toposort
from .ops import broadcast_scalar, build_op

# Node types lowered by substitution before the program is laid out.
_INLINED = frozenset({Module})

__all__ = ["ARGUMENT_TYPES", "Program", "Skeleton", "kernel_part", "node_key_part"]

ARGUMENT_TYPES = (Array, Scalar, Symbol)


# ---------------------------------------------------------------------------- key
def node_key_part(node: Circuit) -> bytes:
    """What of ``node`` the compiled code depends on (the recipes are in ``circuits.hashing``)."""
    t = type(node)
    if t is Array or t is Symbol or t is Scalar:
        return argument_key_part(t.type_name, node.dtype, node.shape)
    if t is Tag:
        return op_key_part("Tag", b"")  # an identity: its uuid changes nothing in the compiled code
    if t is GeneralFunction:
        # id(spec): a function re-registered under the same name must not reuse old code.
        return op_key_part("GeneralFunction", node._payload_bytes() + b"\0" + pack_ints((id(node.function),)))
    return op_key_part(node.type_name, node._payload_bytes())


def kernel_part(node: Circuit) -> tuple:
    """What an op kernel computing ``node`` depends on: its key part and the shapes of it and its
    children.  Made once per node and kept on it (``Circuit._kernel_part``); a node rebuilt over
    children of the same shapes (``Circuit.with_children``) inherits it."""
    part = node._kernel_part
    if part is None:
        part = node._kernel_part = (node_key_part(node), node.shape, tuple(c.shape for c in node.children))
    return part


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

    def run(self, args: Sequence, deltas: dict | None = None, observe=None) -> list:
        """Output values from argument values (in ``arg_slots`` order).

        ``deltas`` maps slots to values added to what is computed there (zeros that make a node's
        value a differentiable input: gradients with respect to any node).  ``observe(slot,
        value)``, if given, sees every slot's value as soon as it is there, before it is freed
        (``interp.exact_scores`` keeps values this way).
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
            if observe is not None:
                observe(i, env[i])
            for j in frees[i]:
                env[j] = None
        return [env[i] for i in self.outputs]


class Program:
    """A circuit flattened for evaluation (see the module docstring).

    ``nodes``: distinct nodes in toposort order; ``slot_of``: node hash -> slot; ``arg_slots``:
    the slots of Arrays, Scalars, Symbols (and given nodes), in order; ``outputs``: the slots of
    ``roots``; ``key``: bytes naming the computation (float dtype included).

    ``given`` (node hashes) names nodes whose values are supplied: they are arguments too (in
    ``given_slots``) and the walk does not descend below them, so the program computes only the
    frontier above values known already (a sweep's shared values, an attribution's sources).

    >>> from circuits import Add, GeneralFunction, Symbol
    >>> h = GeneralFunction('exp', Symbol((2,), name='x'))
    >>> p = Program([Add(h, h)], 'float32', given={h.hash})
    >>> [n.line() for n in p.nodes], p.arg_slots, p.given_slots
    (['GeneralFunction exp', 'Add'], (0,), frozenset({0}))
    """

    __slots__ = ("nodes", "slot_of", "child_slots", "arg_slots", "given_slots", "outputs", "float_dtype", "key",
                 "_body_key", "_skeleton", "_index_ranges", "_arg_nodes", "_free_symbols", "_size", "call_state")

    def __init__(self, roots: Sequence[Circuit], float_dtype: str, given: Collection[bytes] = ()):
        roots = list(roots)
        stop = (lambda n: n.hash in given) if given else None
        nodes = toposort(*roots, stop=stop)
        inlined = None
        if not _INLINED.isdisjoint(map(type, nodes)):
            # Modules are lowered by substitution (their bodies' Symbols are no inputs).
            inlined = {}
            roots = [substitute_all_modules(r, inlined) for r in roots]
            nodes = toposort(*roots, stop=stop)
        slot_of = {n.hash: i for i, n in enumerate(nodes)}
        if inlined:
            for old, new in inlined.items():  # an original node stands for its inlined one
                if new.hash in slot_of:
                    slot_of.setdefault(old, slot_of[new.hash])
        self.nodes = nodes
        self.slot_of = slot_of
        self._size = len(nodes)
        self.float_dtype = float_dtype
        given_slots = frozenset(i for i, n in enumerate(nodes) if n.hash in given) if given else frozenset()
        self.given_slots = given_slots
        self.child_slots = [tuple(slot_of[c.hash] for c in n.children) for n in nodes] if not given_slots else [
            () if i in given_slots else tuple(slot_of[c.hash] for c in n.children) for i, n in enumerate(nodes)]
        self.arg_slots = tuple(i for i, n in enumerate(nodes) if type(n) in ARGUMENT_TYPES or i in given_slots)
        self._skeleton = None
        self._index_ranges = None
        self.call_state = None  # the arguments bound once for calls (circuits.backend.lower.calling)
        self._arg_nodes = tuple(nodes[i] for i in self.arg_slots)
        self._free_symbols = tuple(n for i, n in zip(self.arg_slots, self._arg_nodes)
                                   if type(n) is Symbol and i not in given_slots)
        parts = [node_key_part(n) for n in nodes]
        for i in given_slots:  # a value supplied from outside: only its shape and dtype matter to the code
            parts[i] = argument_key_part("Given", nodes[i].dtype, nodes[i].shape)
        self._body_key = program_body_key(float_dtype, parts, self.child_slots)
        self._set_outputs(roots)

    def _set_outputs(self, roots):
        self.outputs = tuple(self.slot_of[r.hash] for r in roots)
        self.key = program_key(self._body_key, self.outputs)

    def with_outputs(self, roots: Sequence[Circuit]) -> "Program":
        """The same layout computing other outputs (nodes of this program), without re-walking.

        Raises ``KeyError`` for a node that is not in the program."""
        other = object.__new__(Program)
        for name in ("nodes", "slot_of", "child_slots", "arg_slots", "given_slots", "float_dtype", "_body_key",
                     "_index_ranges", "_arg_nodes", "_free_symbols", "_size"):
            setattr(other, name, getattr(self, name))
        other._skeleton = other.call_state = None
        other._set_outputs(list(roots))
        return other

    def __len__(self):
        return self._size

    def detached(self) -> "Program":
        """This program ready to run, holding only its argument nodes (leaves): no interior
        node, so a cache may keep it for as long as its circuit lives without keeping the
        circuit alive.  Its skeleton and index ranges are made now; ``nodes``, ``slot_of`` and
        ``child_slots`` are None (resolve ``also=`` items before detaching).

        >>> from circuits import Add, Symbol
        >>> x = Symbol((2,), name='x')
        >>> d = Program([Add(x, x)], 'float32').detached()
        >>> d.nodes is None, len(d), d.arg_nodes() == (x,)
        (True, 2, True)
        """
        self.skeleton()
        self.index_ranges()
        other = object.__new__(Program)
        for name in self.__slots__:
            setattr(other, name, getattr(self, name))
        other.nodes = other.slot_of = other.child_slots = other.call_state = None
        return other

    def arg_nodes(self) -> tuple[Circuit, ...]:
        """The nodes at ``arg_slots``, in order."""
        return self._arg_nodes

    def free_symbols(self) -> tuple[Symbol, ...]:
        """The Symbols among the arguments (those not given): what ``inputs`` must bind."""
        return self._free_symbols

    def index_ranges(self) -> dict:
        """Argument node hash -> ``(lo, hi, gather)`` for the int arguments whose values index
        a gather (``circuits.io.values.gather_index_ranges``); computed once."""
        if self._index_ranges is None:
            ranges = {}
            if any(is_int(self.nodes[i].dtype) for i in self.arg_slots):
                from ...io.values import gather_index_ranges

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
            fdt, nodes, args = self.float_dtype, self.nodes, set(self.arg_slots)
            budget = max_alloc_bytes()
            for n in nodes:  # refuse a tensor too large to allocate before tracing anything
                check_allocation(n.shape, fdt if is_float(n.dtype) else n.dtype, n.line, EvaluationError, budget)
            ops = [None if i in args else build_op(n, fdt) for i, n in enumerate(nodes)]
            # a given Scalar's value is already the broadcast one
            scalar_shapes = {i: nodes[i].shape for i in self.arg_slots
                             if type(nodes[i]) is Scalar and i not in self.given_slots}
            self._skeleton = Skeleton(ops, self.child_slots, self.arg_slots, scalar_shapes, self.outputs)
        return self._skeleton
