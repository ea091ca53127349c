"""Evaluation with JAX.

A circuit is lowered, in toposort order, to a flat *program* (one op per distinct node) and then
to one JAX function.  Arrays are **arguments** of that function, not baked-in constants, and the
compile cache is keyed by the program's name-blind, value-blind structure plus the shapes and
dtypes of its arrays: a patched circuit (same structure, other arrays) reuses compiled code.

>>> import numpy as np
>>> from circuits import Array, Einsum
>>> x = Array(np.arange(6, dtype=np.float32).reshape(2, 3), name='x')
>>> evaluate(Einsum.from_spec('ab->a', x))
array([ 3., 12.], dtype=float32)
"""

from __future__ import annotations

import collections
import threading
from typing import Any, Mapping

import numpy as np

from .errors import EvaluationError
from .hashing import node_hash
from .nodes import Add, Array, Circuit, Concat, Einsum, GeneralFunction, Index, Rearrange, Scalar, Symbol, Tag
from .nodes.base import is_float
from .nodes.einsum import AXIS_LETTERS
from .traversal import toposort

FLOAT_DTYPES = ("float32", "float64", "float16", "bfloat16")


# ---------------------------------------------------------------------------- lowering rules
# Each rule: (node, child_values, float_dtype) -> jax value.  Kept as a table by node type.
def _jnp():
    import jax.numpy as jnp

    return jnp


def _lower_scalar(node: Scalar, args, fdt):
    return _jnp().full(node.shape, node.value, dtype=fdt)


def _einsum_string(in_axes, out_axes) -> str:
    # jnp.einsum takes letters; our ids map onto a-z A-Z first, so renumber densely.
    ids = {}
    for t in in_axes:
        for a in t:
            ids.setdefault(a, len(ids))
    if len(ids) > 52:
        raise EvaluationError(f"an einsum with {len(ids)} distinct axes is more than jnp.einsum takes (52)")
    letter = lambda a: AXIS_LETTERS[ids[a]]  # noqa: E731
    return ",".join("".join(map(letter, t)) for t in in_axes) + "->" + "".join(map(letter, out_axes))


def _lower_einsum(node: Einsum, args, fdt):
    jnp = _jnp()
    if not args:
        return jnp.ones((), dtype=fdt)
    spec = _einsum_string(node.in_axes, node.out_axes)
    dtypes = {a.dtype for a in args}
    if len(dtypes) > 1:
        target = jnp.result_type(*args)
        args = [a.astype(target) for a in args]
    return jnp.einsum(spec, *args, optimize="auto")


def _lower_add(node: Add, args, fdt):
    jnp = _jnp()
    if not args:
        return jnp.zeros((), dtype=fdt)
    out = args[0]
    for a in args[1:]:
        out = out + a
    if out.shape != node.shape:
        out = jnp.broadcast_to(out, node.shape)
    return out


def _lower_function(node: GeneralFunction, args, fdt):
    return node.function.jax(*args)


def _lower_index(node: Index, args, fdt):
    jnp = _jnp()
    (x,) = args
    basic = []
    takes = []  # (position after basic indexing, array)
    pos = 0
    for e in node.full_index():
        if isinstance(e, np.ndarray):
            basic.append(slice(None))
            takes.append((pos, e))
            pos += 1
        elif isinstance(e, slice):
            basic.append(e)
            pos += 1
        else:
            basic.append(e)
    out = x[tuple(basic)] if basic else x
    for axis, arr in takes:
        out = jnp.take(out, jnp.asarray(arr % out.shape[axis]), axis=axis)
    return out


def _lower_rearrange(node: Rearrange, args, fdt):
    jnp = _jnp()
    (x,) = args
    sizes = dict(node.sizes)
    out_names = [a for g in node.out_groups for a in g]
    kept = [a for g in node.in_groups for a in g if a in set(out_names)]
    x = x.reshape([sizes[a] for a in kept])
    present = [a for a in out_names if a in set(kept)]
    perm = [kept.index(a) for a in present]
    if perm != list(range(len(perm))):
        x = jnp.transpose(x, perm)
    if len(present) != len(out_names):
        for i, a in enumerate(out_names):
            if a not in set(kept):
                x = jnp.expand_dims(x, i)
        x = jnp.broadcast_to(x, [sizes[a] for a in out_names])
    return x.reshape(node.shape)


def _lower_concat(node: Concat, args, fdt):
    jnp = _jnp()
    target = jnp.result_type(*args)
    return jnp.concatenate([a.astype(target) for a in args], axis=node.axis)


def _lower_tag(node: Tag, args, fdt):
    return args[0]


LOWERING = {
    Scalar: _lower_scalar,
    Einsum: _lower_einsum,
    Add: _lower_add,
    GeneralFunction: _lower_function,
    Index: _lower_index,
    Rearrange: _lower_rearrange,
    Concat: _lower_concat,
    Tag: _lower_tag,
}


# ---------------------------------------------------------------------------- programs
class Program:
    """A circuit flattened for evaluation: ``nodes`` in toposort order, which slot each child
    reads, and which nodes are arguments (``arrays``, ``symbols``).  ``key`` identifies the
    computation independently of names and array values."""

    __slots__ = ("nodes", "child_slots", "arrays", "symbols", "outputs", "key", "slot_of")

    def skeleton(self) -> "Program":
        """A copy without the argument nodes (so a cached compiled function holds no tensors)."""
        other = object.__new__(Program)
        for name in self.__slots__:
            setattr(other, name, getattr(self, name))
        nodes = list(self.nodes)
        for i in self.arrays + self.symbols:
            nodes[i] = None
        other.nodes = nodes
        other.slot_of = None
        return other

    def __init__(self, roots, float_dtype: str):
        nodes = toposort(*roots)
        slot_of = {n.hash: i for i, n in enumerate(nodes)}
        self.nodes = nodes
        self.slot_of = slot_of
        self.child_slots = [tuple(slot_of[c.hash] for c in n.children) for n in nodes]
        self.arrays = [i for i, n in enumerate(nodes) if type(n) is Array]
        self.symbols = [i for i, n in enumerate(nodes) if type(n) is Symbol]
        self.outputs = [slot_of[r.hash] for r in roots]
        parts = [float_dtype.encode()]
        for n, kids in zip(nodes, self.child_slots):
            t = type(n)
            if t is Array or t is Symbol:
                # Value- and name-blind: only what the compiled code depends on.
                parts.append(f"{t.type_name}{n.shape}{n.dtype}|".encode())
            else:
                parts.append(n.type_name.encode() + n._payload_bytes() + repr(kids).encode() + b"|")
        parts.append(repr(self.outputs).encode())
        self.key = node_hash(b"".join(parts))

    def run(self, array_values, symbol_values, float_dtype, keep=None):
        """Evaluate with jnp (traceable): returns the output values (and kept slots)."""
        env: list[Any] = [None] * len(self.nodes)
        for i, v in zip(self.arrays, array_values):
            env[i] = v
        for i, v in zip(self.symbols, symbol_values):
            env[i] = v
        nodes, child_slots = self.nodes, self.child_slots
        for i, node in enumerate(nodes):
            if node is None or env[i] is not None:
                continue
            rule = LOWERING.get(type(node))
            if rule is None:
                raise EvaluationError(f"no JAX lowering for node type {type(node).__name__}: {node.line()}")
            env[i] = rule(node, [env[j] for j in child_slots[i]], float_dtype)
        outs = [env[i] for i in self.outputs]
        if keep is not None:
            return outs, [env[i] for i in keep]
        return outs


# ---------------------------------------------------------------------------- compile cache
_CACHE_SIZE = 64
_cache: "collections.OrderedDict[tuple, Any]" = collections.OrderedDict()
_cache_lock = threading.Lock()
_stats = {"compilations": 0, "hits": 0}


def cache_stats() -> dict:
    """How many programs were traced for compilation and how many calls hit the cache."""
    return dict(_stats)


def clear_cache():
    with _cache_lock:
        _cache.clear()


def _jitted(program: Program, float_dtype: str, keep_key=()):
    import jax

    key = (program.key, keep_key)
    with _cache_lock:
        fn = _cache.get(key)
        if fn is not None:
            _cache.move_to_end(key)
            _stats["hits"] += 1
            return fn
    keep = list(keep_key) if keep_key else None
    program = program.skeleton()

    # The traced function closes over a program of the same structure; programs with equal keys
    # lower identically, so any of them serves.
    def run(array_values, symbol_values):
        _stats["compilations"] += 1
        return program.run(array_values, symbol_values, float_dtype, keep=keep)

    fn = jax.jit(run)
    with _cache_lock:
        _cache[key] = fn
        while len(_cache) > _CACHE_SIZE:
            _cache.popitem(last=False)
    return fn


# ---------------------------------------------------------------------------- inputs
def _float_dtype(dtype) -> str:
    name = np.dtype(dtype).name if dtype not in ("bfloat16",) else "bfloat16"
    if name not in FLOAT_DTYPES:
        raise EvaluationError(f"dtype={dtype!r}: evaluation precision must be one of {FLOAT_DTYPES}")
    return name


def _array_values(program: Program, fdt: str):
    jnp = _jnp()
    values = []
    missing = []
    for i in program.arrays:
        node = program.nodes[i]
        if node.value is None:
            missing.append(node)
            continue
        v = node.value
        if is_float(node.dtype) and node.dtype != fdt:
            v = jnp.asarray(v, dtype=fdt)
        values.append(v)
    if missing:
        names = ", ".join(m.line() for m in missing[:5]) + (" ..." if len(missing) > 5 else "")
        raise EvaluationError(
            f"{len(missing)} placeholder Array(s) have no value: {names}. Give values with "
            "circuits.bind(circuit, {name: array}) or circuits.fill_random(circuit, seed)"
        )
    return values


def _resolve_inputs(program: Program, inputs: Mapping | None, fdt: str, batch_axes: int = 0):
    """Symbol values in program order; checks every Symbol is bound with the right shape."""
    inputs = dict(inputs or {})
    by_node = {}
    by_name = {}
    for k, v in inputs.items():
        if isinstance(k, Circuit):
            by_node[k.hash] = v
        elif isinstance(k, str):
            by_name[k] = v
        else:
            raise EvaluationError(f"inputs keys must be Symbols or their names, got {k!r}")
    values, used = [], set()
    for i in program.symbols:
        sym = program.nodes[i]
        if sym.hash in by_node:
            v = by_node[sym.hash]
            used.add(("node", sym.hash))
        elif sym.name is not None and sym.name in by_name:
            v = by_name[sym.name]
            used.add(("name", sym.name))
        else:
            raise EvaluationError(
                f"unbound Symbol {sym.line()}: pass inputs={{symbol: value}} (or keyed by its name)"
            )
        arr = v if hasattr(v, "shape") and hasattr(v, "dtype") else np.asarray(v)
        shape = tuple(arr.shape)
        if shape[batch_axes:] != sym.shape:
            raise EvaluationError(
                f"input for Symbol {sym.line()} has shape {list(shape)}; expected {list(sym.shape)}"
                + (" after the batch axis" if batch_axes else "")
            )
        kind = np.dtype(arr.dtype).kind if str(arr.dtype) != "bfloat16" else "f"
        if is_float(sym.dtype):
            if kind not in "fiu":
                raise EvaluationError(f"input for Symbol {sym.line()} has dtype {arr.dtype}; expected a number")
            arr = _jnp().asarray(arr, dtype=fdt)
        else:
            if kind not in "iub":
                raise EvaluationError(
                    f"input for Symbol {sym.line()} has dtype {arr.dtype}; expected {sym.dtype}"
                )
            arr = _jnp().asarray(arr, dtype=sym.dtype)
        values.append(arr)
    return values


# ---------------------------------------------------------------------------- public API
class Compiled:
    """A compiled circuit: call it with ``inputs`` (a dict keyed by Symbol or name).

    >>> import numpy as np
    >>> from circuits import Symbol, GeneralFunction
    >>> x = Symbol((3,), name='x')
    >>> f = compile(GeneralFunction('exp', x))
    >>> f({'x': np.zeros(3)})
    array([1., 1., 1.], dtype=float32)
    """

    def __init__(self, circuit: Circuit, dtype="float32"):
        self.circuit = circuit
        self.float_dtype = _float_dtype(dtype)
        self.program = Program([circuit], self.float_dtype)

    def __call__(self, inputs=None):
        with _precision(self.float_dtype):
            arrays = _array_values(self.program, self.float_dtype)
            symbols = _resolve_inputs(self.program, inputs, self.float_dtype)
            fn = _jitted(self.program, self.float_dtype)
            (out,) = fn(arrays, symbols)
            return np.asarray(out)


def _precision(fdt):
    import contextlib

    import jax

    if fdt == "float64":
        return jax.enable_x64(True)
    return contextlib.nullcontext()


def compile(circuit: Circuit, *, dtype="float32") -> Compiled:  # noqa: A001 - public name
    """Lower ``circuit`` to a jitted JAX function; ``compile(c)(inputs)`` evaluates it."""
    return Compiled(circuit, dtype=dtype)


def evaluate(circuit: Circuit, inputs=None, *, dtype="float32", jit=True) -> np.ndarray:
    """Evaluate ``circuit`` (float32 by default; ``dtype='float64'`` on request) and return a numpy
    array.  ``inputs`` binds Symbols (keyed by the Symbol or by its name).

    ``jit=False`` runs op by op (eager), useful to step through errors.
    """
    fdt = _float_dtype(dtype)
    if jit:
        return compile(circuit, dtype=fdt)(inputs)
    program = Program([circuit], fdt)
    with _precision(fdt):
        arrays = _array_values(program, fdt)
        symbols = _resolve_inputs(program, inputs, fdt)
        (out,) = program.run(arrays, symbols, fdt)
        return np.asarray(out)

