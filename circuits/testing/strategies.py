"""Hypothesis strategies for circuits: shapes, values, specs and whole DAGs with real sharing.

Shapes are drawn first, then a node of that shape; children come from a pool of nodes already
built in the same example, so the circuits are DAGs (``st.recursive`` alone only makes trees).
Values are kept well-conditioned for float64 comparisons: every float Array, Scalar and Symbol
input lies in ``±[0.5, 1.5]`` (or ``[0.5, 1.5]`` where positivity is needed), ``log``, ``sqrt``,
``rsqrt``, ``reciprocal`` and ``pow`` only get children proven positive (bounded below by
``POSITIVE_MIN``), ``exp`` only gets bounded children, and every node's values stay within
``±MAGNITUDE_CAP``.  Names come from a small pool, so equal names on distinct nodes happen.

Example — property-testing your own rewrite (here: ``Add(x, x) -> Einsum(x, 2)``):

>>> import numpy as np
>>> from hypothesis import given, settings
>>> import circuits as C
>>> from circuits.testing import circuits_with_inputs
>>> def double_adds(node):
...     if isinstance(node, C.Add) and len(node.children) == 2 and node.children[0] is node.children[1]:
...         x = node.children[0]
...         ids = tuple(range(x.ndim))
...         return C.Einsum(x, C.Scalar(2.0), in_axes=(ids, ()), out_axes=ids, name=node.name)
...     return None
>>> @settings(max_examples=5, deadline=None)
... @given(circuits_with_inputs(max_nodes=8))
... def test_double_adds(case):
...     circuit, inputs = case
...     circuit = C.Add(circuit, circuit)  # so that the rule surely has something to fire on
...     rewritten = C.deep_map(circuit, double_adds)
...     assert rewritten != circuit and rewritten.shape == circuit.shape
...     np.testing.assert_allclose(C.evaluate(rewritten, inputs, dtype='float64'),
...                                C.evaluate(circuit, inputs, dtype='float64'), rtol=1e-9, atol=1e-9)
>>> test_double_adds()

The spec strategies are useful on their own, e.g. for a test of your own einsum code:

>>> from hypothesis import find
>>> case = find(einsum_specs(), lambda s: len(s.input_shapes) == 2 and s.shape == ())
>>> case.spec.endswith('->')
True
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import numpy as np
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument
from hypothesis.extra import numpy as hnp

from ..nodes import NODE_TYPES, Array, Concat, Module, Scalar, Symbol
from ..nodes.einsum import format_spec
from .cases import CircuitWithInputs, describe_case

__all__ = [
    "DEFAULT_NAMES", "ALL_TYPES", "CLOSED_TYPES", "DEFAULT_FUNCTIONS", "MAGNITUDE_CAP", "POSITIVE_MIN",
    "EinsumSpec", "RearrangeSpec",
    "shapes", "names", "arrays", "int_arrays", "einsum_specs", "indices", "slices", "rearrange_specs",
    "circuits_with_inputs", "dags", "inputs_for", "CircuitWithInputs", "describe_case",
]

# A small pool so that distinct nodes often share a name (as in real circuits: 'ln.mean_subbed').
DEFAULT_NAMES = ("x", "w", "h", "out", "ln.mean", "a0.q", "it's")
# rust_circuit's node types are drawn when asked for (types=..., or root_types=... alone):
# a DiscreteVar evaluates only through circuits.expand.sample, and Module bodies hold Symbols.
RUST_TYPES = tuple(t for t in NODE_TYPES if t.type_name in ("Module", "Scatter", "SetSymbolicShape", "DiscreteVar"))
ALL_TYPES = tuple(t for t in NODE_TYPES if t not in RUST_TYPES)
# Types whose circuits evaluate without inputs.
CLOSED_TYPES = tuple(t for t in ALL_TYPES if t is not Symbol)
MAGNITUDE_CAP = 1e4
POSITIVE_MIN = 1e-3

DEFAULT_FUNCTIONS = (
    "exp", "log", "sin", "cos", "tanh", "sqrt", "abs", "rsqrt", "reciprocal", "sigmoid", "relu",
    "gelu", "gelu_new", "silu", "square", "pow", "softmax", "log_softmax", "logsumexp", "max",
    "min", "mean", "last_dim_size", "gen_index",
)


# ---------------------------------------------------------------------------- small pieces
def shapes(min_rank=0, max_rank=3, min_side=1, max_side=4):
    """Shapes as tuples of ints.

    >>> from hypothesis import find
    >>> find(shapes(min_rank=2), lambda s: True)
    (1, 1)
    """
    return st.lists(st.integers(min_side, max_side), min_size=min_rank, max_size=max_rank).map(tuple)


def names(pool=DEFAULT_NAMES, *, allow_none=True):
    """A node name from ``pool`` (or None): a small pool makes repeated names likely."""
    named = st.sampled_from(tuple(pool))
    return st.none() | named if allow_none else named


def _float_elements(dtype, positive):
    width = np.dtype(dtype).itemsize * 8
    pos = st.floats(0.5, 1.5, width=width)
    return pos if positive else pos | st.floats(-1.5, -0.5, width=width)


def arrays(shape, dtype="float32", *, positive=False):
    """Well-conditioned float arrays: every entry in ``±[0.5, 1.5]`` (``[0.5, 1.5]`` if positive).

    >>> from hypothesis import find
    >>> a = find(arrays((2, 3), 'float64'), lambda a: True)
    >>> a.shape, a.dtype.name, bool((np.abs(a) >= 0.5).all())
    ((2, 3), 'float64', True)
    """
    # Every entry drawn (no fill value): a mostly-constant array hides terms that should vary.
    return hnp.arrays(np.dtype(dtype), tuple(shape), elements=_float_elements(dtype, positive),
                      fill=st.nothing())


def int_arrays(shape, low, high, dtype="int64"):
    """Int arrays with entries in ``[low, high)`` (gather indices, tokens)."""
    return hnp.arrays(np.dtype(dtype), tuple(shape), elements=st.integers(low, high - 1))


# ---------------------------------------------------------------------------- einsum
class EinsumSpec(NamedTuple):
    """An einsum with the shapes it needs: ``Einsum.from_spec(s.spec, *children_of(s.input_shapes))``
    has shape ``s.shape``."""

    spec: str
    in_axes: tuple
    out_axes: tuple
    input_shapes: tuple
    shape: tuple


@st.composite
def einsum_specs(draw, shape=None, *, max_operands=3, max_summed=2, max_operand_rank=4, max_id=60):
    """Valid einsums producing ``shape`` (drawn when None): summed axes, repeated ids in one operand
    (diagonals), operands with no axes, zero operands (when the result is a scalar), ids past 'Z'
    (printed as Greek letters)."""
    if shape is None:
        shape = draw(shapes())
    shape = tuple(shape)
    k = len(shape)
    n_summed = draw(st.integers(0, max_summed))
    ids = draw(st.lists(st.integers(0, max_id), min_size=k + n_summed, max_size=k + n_summed, unique=True))
    out_ids, summed = ids[:k], ids[k:]
    sizes = dict(zip(out_ids, shape))
    for a in summed:
        sizes[a] = draw(st.integers(1, 3))
    needed = out_ids + summed
    n_ops = draw(st.integers(1 if needed else 0, max(max_operands, 1)))
    operands = [[] for _ in range(n_ops)]
    for a in needed:  # every id must appear in some operand
        operands[draw(st.integers(0, n_ops - 1))].append(a)
    for t in operands:
        if needed:
            room = max(0, max_operand_rank - len(t))
            t.extend(draw(st.lists(st.sampled_from(needed), max_size=min(2, room))))
    if len(operands) == 1 and not operands[0]:
        # A lone operand without axes prints as '->', which reads back as zero operands.
        operands.append([])
    in_axes = tuple(tuple(draw(st.permutations(t))) for t in operands)
    out_axes = tuple(out_ids)
    return EinsumSpec(
        spec=format_spec(in_axes, out_axes),
        in_axes=in_axes,
        out_axes=out_axes,
        input_shapes=tuple(tuple(sizes[a] for a in t) for t in in_axes),
        shape=shape,
    )


# ---------------------------------------------------------------------------- index
@functools.lru_cache(maxsize=512)
def _slice_options(n: int, length: int | None) -> tuple:
    bounds = [None, *range(-n - 2, n + 3)]
    out = []
    for step in (None, 1, 2, 3, -1, -2):
        for start in bounds:
            for stop in bounds:
                got = len(range(*slice(start, stop, step).indices(n)))
                if (got >= 1 if length is None else got == length):
                    out.append(slice(start, stop, step))
    return tuple(out)


def slices(n: int, length: int | None = None):
    """Slices of an axis of size ``n`` (negative bounds, steps, bounds past the ends) that select
    ``length`` entries (at least one when None)."""
    options = _slice_options(int(n), None if length is None else int(length))
    if not options:
        raise InvalidArgument(f"no slice of an axis of size {n} selects {length} entries")
    return st.sampled_from(options)


@st.composite
def indices(draw, shape, *, max_array_len=4):
    """A valid ``Index`` entry tuple for a child of ``shape``: ints (negative too), slices, 1-d int
    arrays (negative entries too); possibly shorter than the rank (padded with ``:``)."""
    shape = tuple(shape)
    n_entries = draw(st.integers(0, len(shape)))
    entries = []
    for n in shape[:n_entries]:
        kinds = ["slice"] if n == 0 else ["int", "slice", "array"]
        kind = draw(st.sampled_from(kinds))
        if kind == "int":
            entries.append(draw(st.integers(-n, n - 1)))
        elif kind == "slice":
            entries.append(draw(slices(n)) if n else slice(None))
        else:
            values = draw(st.lists(st.integers(-n, n - 1), min_size=1, max_size=max_array_len))
            entries.append(np.array(values, dtype=np.int64))
    return tuple(entries)


def _index_to(draw, out_shape, max_rank=5):
    """(child shape, index) such that ``Index(child, index)`` has ``out_shape``."""
    out_shape = tuple(out_shape)
    n_explicit = draw(st.integers(0, len(out_shape)))
    child, entries = [], []

    def maybe_drop_axes():
        while len(child) + len(out_shape) - n_explicit < max_rank and draw(st.integers(0, 4)) == 0:
            m = draw(st.integers(1, 4))
            entries.append(draw(st.integers(-m, m - 1)))
            child.append(m)

    for length in out_shape[:n_explicit]:
        maybe_drop_axes()
        if draw(st.booleans()) or length == 0:
            m = draw(st.integers(max(length, 1), length + 3))
            entries.append(draw(slices(m, length)))
        else:
            m = draw(st.integers(1, 4))
            values = draw(st.lists(st.integers(-m, m - 1), min_size=length, max_size=length))
            entries.append(np.array(values, dtype=np.int64))
        child.append(m)
    maybe_drop_axes()
    return tuple(child) + out_shape[n_explicit:], tuple(entries)


# ---------------------------------------------------------------------------- rearrange
class RearrangeSpec(NamedTuple):
    """``Rearrange(child, s.spec, **s.sizes)`` maps a child of ``s.input_shape`` to ``s.shape``."""

    spec: str
    sizes: dict
    input_shape: tuple
    shape: tuple


_AXIS_NAMES = tuple("abcdefghijklmnopqrstuvwxyz") + ("head", "seq", "d_model", "x1", "B")


def _group_text(g, paren_single=False):
    if not g:
        return "1"
    if len(g) == 1 and not paren_single:
        return g[0]
    return "(" + " ".join(g) + ")"


def _rearrange_plan(draw, dims, fixed_is_input):
    """Factor ``dims`` (the fixed side) into groups of atoms, then build the other side by
    permuting the shared atoms and regrouping them, with unit axes and one-sided atoms mixed in."""
    n_names = 2 * len(dims) + 2
    pool = draw(st.lists(st.sampled_from(_AXIS_NAMES), unique=True, min_size=n_names, max_size=n_names))
    size = {}
    fixed, shared = [], []
    for n in dims:
        choice = draw(st.integers(0, 9))
        if n == 1 and choice == 0:
            fixed.append(())
        elif choice == 1 and (n == 1 or not fixed_is_input):
            # Left-only atoms must have size 1 (they are dropped); right-only ones are repeats.
            a = pool.pop()
            size[a] = n
            fixed.append((a,))
        else:
            divisors = [d for d in range(1, n + 1) if n % d == 0] if n else [0]
            d = draw(st.sampled_from(divisors)) if choice >= 6 else n
            group = (pool.pop(),) if d == n else (pool.pop(), pool.pop())
            size[group[0]] = d
            if len(group) == 2:
                size[group[1]] = n // d
            fixed.append(group)
            shared.extend(group)
    order = list(draw(st.permutations(shared)))
    other, current = [], []
    for a in order:
        if current and draw(st.integers(0, 3)) == 0:
            current.append(a)
        else:
            if current:
                other.append(tuple(current))
            current = [a]
    if current:
        other.append(tuple(current))
    for _ in range(draw(st.integers(0, 2))):
        pos = draw(st.integers(0, len(other)))
        if draw(st.booleans()):
            other.insert(pos, ())
        else:
            a = pool.pop()
            size[a] = 1 if not fixed_is_input else draw(st.integers(1, 3))
            other.insert(pos, (a,))
    ins, outs = (fixed, other) if fixed_is_input else (other, fixed)
    # Give sizes for all but one atom of each left group, every right-only atom, and now and then
    # a redundant one.
    left = {a for g in ins for a in g}
    given = {}
    for g in ins:
        if len(g) > 1:
            keep_unknown = draw(st.sampled_from(g))
            given.update((a, size[a]) for a in g if a != keep_unknown)
    for g in outs:
        for a in g:
            if a not in left or draw(st.integers(0, 7)) == 0:
                given[a] = size[a]
    paren = draw(st.integers(0, 7)) == 0
    spec = " ".join(_group_text(g, paren) for g in ins) + " -> " + " ".join(_group_text(g) for g in outs)
    in_shape = tuple(math.prod(size[a] for a in g) for g in ins)
    out_shape = tuple(math.prod(size[a] for a in g) for g in outs)
    return RearrangeSpec(spec.strip(), given, in_shape, out_shape)


@st.composite
def rearrange_specs(draw, shape=None, *, output_shape=None):
    """A valid einops-style rearrangement of a child of ``shape`` (splits, merges, permutations,
    unit axes, dropped size-1 axes, repeated new axes).  Give ``output_shape`` instead to get one
    that produces that shape (the input shape is then drawn).

    >>> from hypothesis import find
    >>> r = find(rearrange_specs((6, 5)), lambda r: len(r.shape) == 3)
    >>> import circuits as C
    >>> C.Rearrange(C.Scalar(1.0, (6, 5)), r.spec, **r.sizes).shape == r.shape
    True
    """
    if (shape is None) == (output_shape is None):
        if shape is None:
            shape = draw(shapes())
        else:
            raise InvalidArgument("give shape or output_shape, not both")
    if output_shape is not None:
        return _rearrange_plan(draw, tuple(output_shape), fixed_is_input=False)
    return _rearrange_plan(draw, tuple(shape), fixed_is_input=True)


# ---------------------------------------------------------------------------- circuits
def _resolve_types(types):
    if types is None:
        return tuple(ALL_TYPES)
    from ..nodes import NODE_TYPE_BY_NAME

    out = []
    for t in types:
        cls = NODE_TYPE_BY_NAME.get(t) if isinstance(t, str) else t
        if cls not in NODE_TYPES:
            raise InvalidArgument(f"{t!r} is not a node type; use one of {[c.__name__ for c in NODE_TYPES]}")
        out.append(cls)
    return tuple(out)


def _options(shape, types, functions, max_nodes, max_depth, names_strategy, dtype, root_types):
    from ._builder import Options

    root = _resolve_types(root_types) if root_types is not None else None
    if types is None and root is not None:
        types = ALL_TYPES + tuple(t for t in root if t not in ALL_TYPES)
    types = _resolve_types(types)
    if not any(t in types for t in (Array, Scalar, Symbol)):
        raise InvalidArgument("types must include a leaf type (Array, Scalar or Symbol)")
    if root is not None and not set(root) <= set(types):
        raise InvalidArgument("root_types must be among types")
    if names_strategy is None:
        names_strategy = names()
    elif not isinstance(names_strategy, st.SearchStrategy):
        names_strategy = names(names_strategy)
    if shape is None:
        min_rank = 1 if root is not None and set(root) == {Concat} else 0
        shape_strategy = shapes(min_rank=min_rank)
    else:
        shape_strategy = st.just(tuple(int(s) for s in shape))
    return Options(
        shape=shape_strategy, types=types, functions=tuple(functions or DEFAULT_FUNCTIONS),
        max_nodes=max_nodes, max_depth=max_depth, names=names_strategy, dtype=np.dtype(dtype).name,
        root_types=root,
    )


def dags(shape=None, *, types=None, functions=None, max_nodes=20, max_depth=5, names=None,
         dtype="float32", root_types=None):
    """Circuits (DAGs with shared subtrees) of ``shape`` (drawn when None).

    - ``types``: node classes (or printed type names) that may appear; default all of them,
      Symbol included — use ``circuits_with_inputs`` (or ``inputs_for``) to evaluate, or
      ``types=CLOSED_TYPES`` for circuits without free inputs.
    - ``functions``: GeneralFunction names to draw from (default ``DEFAULT_FUNCTIONS``;
      ``'gen_index'`` stands for the gen_index family).  A function is drawn as its spec says:
      elementwise or on the last axis (``core_ndim=1``), its arguments and value kept within its
      ``FunctionSpec.bounds``; an elementwise one-argument function without bounds gets
      children within ``±4``.
    - ``max_nodes`` bounds (about) how many distinct nodes are built; ``max_depth`` the depth.
    - ``names``: a strategy for names, or a pool (sequence) of names to draw from.
    - ``dtype``: float dtype of Arrays and float Symbols.
    - ``root_types``: the root's type is one of these.

    A circuit with DiscreteVars (drawn when asked for) evaluates through
    ``circuits.sample``: none is drawn below a gather's gathered argument, which
    sampling cannot batch.

    >>> from hypothesis import Phase, find, settings
    >>> import circuits as C
    >>> def shares(c):   # some node is a child of two distinct parents
    ...     parents = {}
    ...     for n in C.toposort(c):
    ...         for k in set(n.children):
    ...             parents[k] = parents.get(k, 0) + 1
    ...     return max(parents.values(), default=0) >= 2
    >>> quick = settings(phases=[Phase.generate], database=None)   # the first match, unshrunk
    >>> c = find(dags(max_nodes=12, types=CLOSED_TYPES), shares, settings=quick)
    >>> C.evaluate(c).shape == c.shape
    True
    """
    opts = _options(shape, types, functions, max_nodes, max_depth, names, dtype, root_types)
    # A composite, not ``.map(lambda ...)``: hypothesis would print a mapped example as the
    # lambda's body (``built[0]``) instead of the circuit's text.
    return _circuit_only(opts)


def circuits_with_inputs(shape=None, *, types=None, functions=None, max_nodes=20, max_depth=5,
                         names=None, dtype="float32", root_types=None):
    """``(circuit, inputs)`` pairs (``CircuitWithInputs``): a circuit as from ``dags(...)``
    and a value for each of its Symbols (``{symbol: ndarray}``, ready for
    ``circuits.evaluate(circuit, inputs)``).  A falsifying example prints as the circuit's text
    with its inputs (see ``describe_case``)."""
    opts = _options(shape, types, functions, max_nodes, max_depth, names, dtype, root_types)
    return _circuit_and_inputs(opts)


@st.composite
def _circuit_only(draw, opts):
    from ._builder import built_circuits

    return draw(built_circuits(opts))[0]


@st.composite
def _circuit_and_inputs(draw, opts):
    from ._builder import built_circuits

    circuit = draw(built_circuits(opts))[0]
    return CircuitWithInputs(circuit, draw(inputs_for(circuit)))


@st.composite
def inputs_for(draw, circuit, *, int_high=2):
    """Values for every Symbol of ``circuit``: floats in ``±[0.5, 1.5]``; ints in range for every
    gen_index that gathers with them (else in ``[0, int_high)``)."""
    from ._builder import int_symbol_ranges

    ranges = int_symbol_ranges(circuit)
    out = {}
    from ..traversal import toposort

    nodes = toposort(circuit)
    # A Symbol a Module binds is no input: its argument gives its value.
    bound = {a.symbol.hash for n in nodes if type(n) is Module for a in n.spec.arg_specs}
    for node in nodes:
        if type(node) is not Symbol or node.hash in bound:
            continue
        if node.dtype.startswith(("int", "uint")):
            high = ranges.get(node, int_high)
            out[node] = draw(int_arrays(node.shape, 0, max(high, 1), node.dtype))
        elif node.dtype == "bool":
            out[node] = draw(hnp.arrays(np.bool_, node.shape))
        else:
            dt = "float32" if node.dtype == "bfloat16" else node.dtype
            out[node] = draw(arrays(node.shape, dt))
    return out
