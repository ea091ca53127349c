"""Exact symbolic evaluation with sympy, and ``symbolic_equal`` to prove two circuits equal.

Every entry of a float Array or Symbol becomes a real sympy symbol (``w[0,1]``); Arrays with the
same content share their symbols whatever their names, int Arrays keep their values (they are
gather indices), Scalars become exact rationals of their printed value (``0.00001`` is
``1/100000``).  Einsum, Add, Index, Rearrange, Concat and Tag are computed exactly on object
arrays.  A GeneralFunction is interpreted where its meaning is known — by its registered
``FunctionSpec.sympy`` (entry by entry for elementwise functions, block by block for functions
on the last axes: softmax, logsumexp...), the gen_index family by gathering — and is otherwise
an uninterpreted sympy Function of the entries it reads.  Pass
``interpret=False`` to keep every function but gen_index uninterpreted (then only equalities
that hold for *any* function are proved).

Meant for small shapes: the cost grows with the number of entries times the einsum sums.

>>> import numpy as np
>>> from circuits import Add, Einsum, Symbol
>>> x, y, w = Symbol((2,), name='x'), Symbol((2,), name='y'), Symbol((2, 2), name='w')
>>> lhs = Einsum.from_spec('ab,b->a', w, Add(x, y))
>>> rhs = Add(Einsum.from_spec('ab,b->a', w, x), Einsum.from_spec('ab,b->a', w, y))
>>> symbolic_equal(lhs, rhs)
True
>>> symbolic_equal(lhs, Einsum.from_spec('ab,b->a', w, x))
False
>>> symbolic_evaluate(Einsum.from_spec('a,a->', x, y))[()]
x[0]*y[0] + x[1]*y[1]
"""

from __future__ import annotations

import itertools
import math
from typing import NamedTuple

import numpy as np

from ..errors import EvaluationError
from ..expand import substitute_all_modules
from ..functions import GenIndex
from ..nodes import (
    Add,
    Array,
    Circuit,
    Concat,
    DiscreteVar,
    Einsum,
    GeneralFunction,
    Index,
    Module,
    Rearrange,
    Scalar,
    Scatter,
    SetSymbolicShape,
    Symbol,
    Tag,
)
from ..nodes.einsum import AXIS_LETTERS, write_diagonal
from ..nodes.leaves import format_scalar
from ..traversal import toposort

__all__ = ["SYMBOLIC_RULES", "SymbolTable", "symbolic_evaluate", "symbolic_equal"]



def _sympy():
    import sympy

    return sympy


class SymbolTable:
    """Which sympy symbols stand for which leaf entries.  Share one table between circuits so
    the same Array content or the same Symbol maps to the same symbols in both."""

    def __init__(self):
        self._by_key: dict = {}
        self._labels: set[str] = set()

    def _label(self, wanted: str) -> str:
        label, k = wanted, 1
        while label in self._labels:
            label = f"{wanted}_{k}"
            k += 1
        self._labels.add(label)
        return label

    def entries(self, key, shape, wanted_label: str) -> np.ndarray:
        """The object array of symbols for leaf ``key`` (made on first use)."""
        found = self._by_key.get(key)
        if found is None:
            sp = _sympy()
            label = self._label(wanted_label)
            found = np.empty(shape, dtype=object)
            for pos in itertools.product(*[range(n) for n in shape]):
                found[pos] = sp.Symbol(f"{label}[{','.join(map(str, pos))}]", real=True)
            self._by_key[key] = found
        return found

    def bindings(self, circuit: Circuit, inputs=None) -> dict:
        """``{sympy symbol: number}`` for the symbols this table made for ``circuit``'s float
        Arrays (their values) and Symbols (from ``inputs``, keyed by Symbol or name): substitute
        them to get numbers back.

        >>> import numpy as np
        >>> from circuits import Array, Einsum
        >>> w = Array(np.array([2.0, 3.0]), name='w')
        >>> table = SymbolTable()
        >>> expr = symbolic_evaluate(Einsum.from_spec('a->', w), table=table)[()]
        >>> expr, expr.xreplace(table.bindings(w))
        (w[0] + w[1], 5.00000000000000)
        """
        out = {}
        inputs = dict(inputs or {})
        for node in toposort(circuit):
            if isinstance(node, Array) and node.value is not None:
                found = self._by_key.get(_array_key(node))
                value = node.numpy()
            elif isinstance(node, Symbol):
                found = self._by_key.get(("symbol", node.hash))
                key = node if node in inputs else node.name
                value = np.asarray(inputs[key]) if key in inputs else None
            else:
                continue
            if found is None or value is None:
                continue
            for sym, v in zip(found.reshape(-1), np.asarray(value, dtype=np.float64).reshape(-1)):
                out[sym] = float(v)
        return out


def _array_key(node) -> tuple:
    # Content, not name: two Arrays holding the same tensor are the same variables.
    return ("array", node.content_hash[:24], node.shape, node.dtype)


# ---------------------------------------------------------------------------- leaves
def _scalar_value(value: float):
    sp = _sympy()
    if np.isnan(value):
        return sp.nan
    if np.isinf(value):
        return sp.oo if value > 0 else -sp.oo
    return sp.Rational(format_scalar(value))


def _const_array(values) -> np.ndarray:
    sp = _sympy()
    arr = np.asarray(values)
    out = np.empty(arr.shape, dtype=object)
    for pos in itertools.product(*[range(n) for n in arr.shape]):
        v = arr[pos]
        out[pos] = sp.Integer(int(v)) if arr.dtype.kind in "iub" else _scalar_value(float(v))
    return out


def _scalar(node: Scalar, args, env):
    out = np.empty(node.shape, dtype=object)
    out[...] = _scalar_value(node.value)
    return out


def _array(node: Array, args, env):
    if node.dtype in ("float16", "bfloat16", "float32", "float64"):
        return env.table.entries(_array_key(node), node.shape, node.name or f"array_{node.short_hash[:6]}")
    return _const_array(node.numpy())


def _symbol(node: Symbol, args, env):
    inputs = env.inputs
    key = node if node in inputs else node.name
    if key in inputs:
        value = np.asarray(inputs[key])
        if value.shape != node.shape:
            raise EvaluationError(f"input for {node.line()} has shape {list(value.shape)}")
        return value if value.dtype == object else _const_array(value)
    return env.table.entries(("symbol", node.hash), node.shape, node.name or "symbol")


# ---------------------------------------------------------------------------- ops
def _einsum(node: Einsum, args, env):
    sp = _sympy()
    if not args:
        return np.array(sp.Integer(1), dtype=object)
    ids: dict[int, str] = {}
    for axes in node.in_axes:
        for a in axes:
            ids.setdefault(a, AXIS_LETTERS[len(ids)])
    unique = tuple(dict.fromkeys(node.out_axes))  # an id repeated in the output writes a diagonal
    spec = ",".join("".join(ids[a] for a in axes) for axes in node.in_axes)
    spec += "->" + "".join(ids[a] for a in unique)

    def zeros(shape):
        out = np.empty(shape, dtype=object)
        out[...] = sp.Integer(0)
        return out

    if any(0 in np.shape(a) for a in args):
        return zeros(node.shape)
    shape = tuple(node.shape[node.out_axes.index(a)] for a in unique)
    out = np.asarray(np.einsum(spec, *args), dtype=object).reshape(shape)
    return write_diagonal(out, unique, node.out_axes, zeros) if len(unique) != len(node.out_axes) else out


def _add(node: Add, args, env):
    sp = _sympy()
    out = np.empty(node.shape, dtype=object)
    flat = out.reshape(-1)
    parts = [np.broadcast_to(a, node.shape).reshape(-1) for a in args]
    for k in range(flat.size):
        flat[k] = sp.Add(*[p[k] for p in parts])
    return out


def _index(node: Index, args, env):
    (x,) = args
    basic, takes, pos = [], [], 0
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
    out = x[tuple(basic)]
    for axis, arr in takes:
        out = np.take(out, arr % out.shape[axis] if out.shape[axis] else arr, axis=axis)
    return np.asarray(out, dtype=object).reshape(node.shape)


def _rearrange(node: Rearrange, args, env):
    (x,) = args
    sizes = dict(node.sizes)
    out_names = [a for g in node.out_groups for a in g]
    kept = [a for g in node.in_groups for a in g if a in set(out_names)]
    x = x.reshape([sizes[a] for a in kept])
    present = [a for a in out_names if a in set(kept)]
    x = np.transpose(x, [kept.index(a) for a in present])
    for i, a in enumerate(out_names):
        if a not in set(kept):
            x = np.expand_dims(x, i)
    x = np.broadcast_to(x, [sizes[a] for a in out_names])
    return np.array(x, dtype=object).reshape(node.shape)


def _blocks(x: np.ndarray, core: int):
    """Iterate (leading position, block of the last ``core`` axes) over an object array."""
    lead = x.shape[: x.ndim - core]
    for pos in itertools.product(*[range(n) for n in lead]):
        yield pos, np.asarray(x[pos], dtype=object)


def _block_value(node: GeneralFunction, value, out_core) -> np.ndarray:
    """``value`` (a list, an array or one expression) as an object array of shape ``out_core``."""
    many = isinstance(value, (list, tuple, np.ndarray))
    flat = list(np.asarray(value, dtype=object).reshape(-1)) if many else [value]
    if len(flat) != math.prod(out_core):
        raise EvaluationError(
            f"{node.line()}: the sympy form of {node.function.name} gave {len(flat)} entries for a "
            f"block of the result of shape {list(out_core)}; FunctionSpec.sympy must give one "
            "expression per entry of the result's last core_ndim axes"
        )
    out = np.empty(len(flat), dtype=object)
    out[:] = flat
    return out.reshape(out_core)


def _gen_index(node: GeneralFunction, g: GenIndex, args):
    sp = _sympy()
    x, idx = args
    ax = g.axis(x.ndim, idx.ndim)
    q = idx.ndim
    n = x.shape[ax]
    out = np.empty(node.shape, dtype=object)
    for opos in itertools.product(*[range(k) for k in node.shape]):
        if g.layout == "batch":
            i = idx[opos[:q]]
            rest = list(opos)
            xpos = rest[:ax] + [None] + rest[ax:]
        elif g.layout == "first":
            i = idx[opos[:q]]
            rest = list(opos[q:])
            xpos = rest[:ax] + [None] + rest[ax:]
        else:
            i = idx[opos[ax: ax + q]]
            xpos = list(opos[:ax]) + [None] + list(opos[ax + q:])
        if not isinstance(i, (int, np.integer, sp.Integer)):
            raise EvaluationError(
                f"{node.line()}: gathering needs concrete int indices, got {i}; pass "
                "inputs={symbol: int array} for the index Symbol"
            )
        i = int(i)
        if not g.checked and i < 0:
            i += n
        if not 0 <= i < n:
            out[opos] = sp.nan
            continue
        xpos[ax] = i
        out[opos] = x[tuple(xpos)]
    return out


def _function(node: GeneralFunction, args, env):
    sp = _sympy()
    interpret = env.interpret
    spec = node.function
    g = spec.gather
    if g is not None:
        return _gen_index(node, g, args)
    out = np.empty(node.shape, dtype=object)
    if spec.elementwise:
        f = spec.sympy if (interpret and spec.sympy is not None) else sp.Function(spec.name)
        bargs = np.broadcast_arrays(*args) if len(args) > 1 else args
        flat = [np.asarray(a, dtype=object).reshape(-1) for a in bargs]
        for k, vals in enumerate(zip(*flat)):
            out.reshape(-1)[k] = f(*vals)
        return out
    if len(args) == 1 and spec.core_ndim is not None and spec.core_ndim <= args[0].ndim:
        core = spec.core_ndim
        definition = spec.sympy if interpret else None
        f = sp.Function(spec.name)
        out_core = node.shape[args[0].ndim - core:]
        for pos, block in _blocks(args[0], core):
            if definition is not None:
                value = _block_value(node, definition(block), out_core)
            else:
                entries = block.reshape(-1)
                value = [f(*[sp.Integer(i) for i in p], *entries)
                         for p in itertools.product(*[range(k) for k in out_core])]
                value = _block_value(node, value, out_core)
            if out_core:
                out[pos] = value
            else:
                out[pos] = value[()]
        return out
    # Anything else: every output entry an unknown function of its position and all the inputs.
    f = sp.Function(spec.name)
    everything = [v for a in args for v in np.asarray(a, dtype=object).reshape(-1)]
    for pos in itertools.product(*[range(k) for k in node.shape]):
        out[pos] = f(*[sp.Integer(i) for i in pos], *everything)
    return out


def _concat(node: Concat, args, env):
    return np.concatenate(args, axis=node.axis)


def _tag(node: Tag, args, env):
    return args[0]


def _scatter(node, args, env):
    out = np.empty(node.shape, dtype=object)
    out[...] = _sympy().Integer(0)
    out[node.index] = args[0]
    return out


def _inlined(node, args, env):  # pragma: no cover - symbolic_evaluate inlines modules first
    raise EvaluationError(f"{node.line()}: modules are inlined before their sympy form is taken")


def _discrete_var(node, args, env):
    raise EvaluationError(f"a DiscreteVar has no single value: {node.line()}; take the sympy form of "
                          "circuits.expand.sample(circuit, num_samples, seed)")


class _Env(NamedTuple):
    table: SymbolTable
    inputs: dict
    interpret: bool


# The sympy form of every node type: ``rule(node, child values, env) -> object array``.
SYMBOLIC_RULES = {
    Array: _array, Scalar: _scalar, Symbol: _symbol, Einsum: _einsum, Add: _add,
    GeneralFunction: _function, Index: _index, Rearrange: _rearrange, Concat: _concat, Tag: _tag,
    Module: _inlined, Scatter: _scatter, SetSymbolicShape: _tag, DiscreteVar: _discrete_var,
}


def symbolic_evaluate(circuit: Circuit, inputs=None, *, table: SymbolTable | None = None,
                      interpret: bool = True) -> np.ndarray:
    """The value of ``circuit`` as an object array of sympy expressions (iterative: one step per
    distinct node).  ``inputs`` may give Symbols concrete values (int tokens for a gather) or
    object arrays of expressions (keyed by the Symbol or by its name).

    >>> from circuits import GeneralFunction, Symbol
    >>> symbolic_evaluate(GeneralFunction('exp', Symbol((2,), name='x'))).tolist()
    [exp(x[0]), exp(x[1])]
    """
    env = _Env(table if table is not None else SymbolTable(), dict(inputs or {}), interpret)
    if any(type(n) is Module for n in toposort(circuit)):
        circuit = substitute_all_modules(circuit)
    values: dict[bytes, np.ndarray] = {}
    for node in toposort(circuit):
        args = [values[c.hash] for c in node.children]
        rule = SYMBOLIC_RULES.get(type(node))
        if rule is None:
            raise EvaluationError(f"no symbolic rule for {node.line()}; add one to "
                                  "circuits.backend.symbolic.SYMBOLIC_RULES")
        out = rule(node, args, env)
        if out.shape != node.shape:  # pragma: no cover - a bug in a rule above
            raise EvaluationError(f"symbolic value of {node.line()} has shape {out.shape}, not {node.shape}")
        values[node.hash] = out
    return values[circuit.hash]


def _entries_equal(a, b) -> bool:
    sp = _sympy()
    if a == b:
        return True
    if a is sp.nan or b is sp.nan:
        return False
    diff = sp.expand(a - b)
    if diff == 0:
        return True
    return sp.simplify(diff) == 0


def symbolic_equal(a: Circuit, b: Circuit, inputs=None, *, interpret: bool = True) -> bool:
    """Whether two circuits are exactly equal as functions of their leaves (sympy proves each
    entry's difference is 0).  Same-content Arrays and the same Symbols are the same variables
    in both.  ``False`` when the shapes differ or an entry's difference does not simplify to 0.

    >>> from circuits import Einsum, Scalar, Symbol
    >>> x = Symbol((3,), name='x')
    >>> symbolic_equal(Einsum.from_spec('a,->a', x, Scalar(2.0)), Einsum.from_spec('a,,->a', x, Scalar(4.0), Scalar(0.5)))
    True
    """
    if a.shape != b.shape:
        return False
    table = SymbolTable()
    try:
        va = symbolic_evaluate(a, inputs, table=table, interpret=interpret)
        vb = symbolic_evaluate(b, inputs, table=table, interpret=interpret)
        return all(_entries_equal(x, y) for x, y in zip(va.reshape(-1), vb.reshape(-1)))
    except RecursionError:
        # Our walk is iterative, but sympy's expressions are trees that sympy walks recursively.
        raise EvaluationError(
            f"{a.line()}: the expressions are nested too deeply for sympy (its expression trees "
            "are recursive); check small circuits symbolically and deep ones numerically "
            "(circuits.evaluate with dtype='float64')"
        ) from None
