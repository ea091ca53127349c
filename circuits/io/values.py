"""Values for Arrays: bind named Arrays to tensors, or fill placeholders with random values.

A circuit parsed without its tensors holds *placeholder* Arrays (shape, dtype and hash, no value).
``bind`` gives named Arrays real values; ``fill_random`` gives every placeholder a random one that
keeps the circuit meaningful: index arrays feeding a gather (``gen_index_at_0_c``...) get ints in
range of the gathered axis, float arrays get normal values scaled by 1/sqrt(last dim), so that a
transformer's logits and loss stay finite.

>>> import numpy as np
>>> from circuits import parse, evaluate
>>> c = parse('''
... 'emb' GeneralFunction gen_index_at_0_c
...   'table' [5,3] Array 01ab
...   'toks' [4] Array 02cd
... ''')
>>> filled = fill_random(c, seed=0)
>>> evaluate(filled).shape, bool(np.isfinite(evaluate(filled)).all())
((4, 3), True)
>>> table = np.arange(15, dtype=np.float32).reshape(5, 3)
>>> bound = bind(c, {'table': table, 'toks': np.array([0, 4, 4, 1])})
>>> evaluate(bound)[:, 0]
array([ 0., 12., 12.,  3.], dtype=float32)
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from ..dtypes import FLOAT_DTYPES, INT_DTYPES
from ..errors import CircuitError, ShapeError
from ..nodes import Array, Circuit
from ..nodes.leaves import aligned_empty
from ..shapes import check_allocation
from ..traversal import replace, toposort

# Whether an int index passes through a node unchanged on its way to a gather (its values are a
# selection or copy of its children's: Index, Rearrange, Concat, Tag) is the node class's
# ``passes_index``, the one source the parser's int-index marking reads too.
# Range for random ints that feed no gather.
_DEFAULT_INT_HIGH = 8


def placeholders(circuit: Circuit) -> list:
    """The placeholder Arrays of a circuit (no value yet), in toposort order.

    >>> from circuits import parse
    >>> [a.name for a in placeholders(parse("'s' Add\\n  'w' [2] Array 0a\\n  'b' [2] Array 0b"))]
    ['w', 'b']
    """
    return [n for n in toposort(circuit) if isinstance(n, Array) and n.value is None]


def bind(circuit: Circuit, values: Mapping) -> Circuit:
    """``circuit`` with the Arrays named in ``values`` given those values (placeholders or not).

    Every Array of that name is replaced; each value must have the Array's shape and the same
    kind of dtype (int, float or bool).  A name no Array has raises ``CircuitError`` listing
    the names there are.

    >>> from circuits import parse
    >>> c = parse("'w' [2] Array 0a")
    >>> bind(c, {'w': np.array([1.0, 2.0], np.float32)}).value
    array([1., 2.], dtype=float32)
    """
    by_name: dict = {}
    for node in toposort(circuit):
        if isinstance(node, Array) and node.name is not None:
            by_name.setdefault(node.name, []).append(node)
    unknown = sorted(set(values) - set(by_name))
    if unknown:
        available = sorted(by_name)
        shown = ", ".join(map(repr, available[:50])) + (f", ... ({len(available)} in all)" if len(available) > 50 else "")
        raise CircuitError(
            f"no Array named {', '.join(map(repr, unknown))} in this circuit; "
            f"the named Arrays are: {shown or '(none)'}"
        )
    mapping = {}
    for name, value in values.items():
        for node in by_name[name]:
            mapping[node] = _value_array(node, value)
    return replace(circuit, mapping)


def _value_array(node: Array, value) -> Array:
    arr = value if hasattr(value, "shape") and hasattr(value, "dtype") else np.asarray(value)
    shape = tuple(int(s) for s in arr.shape)
    if shape != node.shape:
        raise ShapeError(
            f"value for {node.line()} has shape {list(shape)}; the Array has shape {list(node.shape)}"
        )
    kind, node_kind = _kind(str(arr.dtype)), _kind(node.dtype)
    if kind != node_kind:
        raise CircuitError(
            f"value for {node.line()} has dtype {arr.dtype} ({kind}); the Array holds "
            f"{node.dtype} ({node_kind}): convert it, e.g. value.astype('{node.dtype}')"
        )
    return Array(arr, name=node.name)


def _kind(dtype: str) -> str:
    if dtype in FLOAT_DTYPES:
        return "float"
    if dtype in INT_DTYPES:
        return "int"
    if dtype == "bool":
        return "bool"
    return dtype


def gather_index_bounds(circuit: Circuit) -> dict:
    """Array hash -> the smallest axis size any gather indexes with that Array's values.

    Follows each gather function's index argument (``FunctionSpec.index_arg``) down through
    the nodes that pass an index on (``passes_index``: Index, Rearrange, Concat, Tag) to the
    Arrays that supply the ints.

    >>> from circuits import parse
    >>> c = parse("'e' GeneralFunction gen_index_at_0_c\\n  'table' [7,3] Array 0a\\n  'toks' [4] Array 0b")
    >>> list(gather_index_bounds(c).values())
    [7]
    """
    # One pass, parents before children: each node hands the bound it must respect on to the
    # children its values come from, so shared index chains are walked once (not once per gather).
    nodes = toposort(circuit)
    demand: dict = {}
    for node in reversed(nodes):
        spec = getattr(node, "function", None)
        if spec is not None and spec.index_arg is not None and spec.index_arg < len(node.children):
            size = _gathered_size(node, spec)
            h = node.children[spec.index_arg].hash
            old = demand.get(h)
            demand[h] = size if old is None else min(old, size)
        if node.passes_index:
            size = demand.get(node.hash)
            if size is not None:
                for c in node.children:
                    old = demand.get(c.hash)
                    demand[c.hash] = size if old is None else min(old, size)
    return {n.hash: demand[n.hash] for n in nodes if isinstance(n, Array) and n.hash in demand}


def gather_index_ranges(nodes) -> dict:
    """Node hash -> ``(lo, hi, gather)``: the values a node's entries must lie in
    (``lo <= v < hi``) because they reach, through nodes that pass an index on
    (``passes_index``), the index argument of the gen_index node ``gather`` (the tightest one
    when several).  ``nodes`` is a
    circuit's toposort (children first).  An index outside its range would give NaN.

    >>> from circuits import parse
    >>> c = parse("'e' GeneralFunction gen_index_at_0\\n  'table' [7,3] Array 0a\\n  'toks' [4] Symbol")
    >>> [(lo, hi) for lo, hi, _ in gather_index_ranges(c.toposort()).values()]
    [(-7, 7)]
    """
    ranges: dict = {}

    def narrow(h, lo, hi, gather):
        old = ranges.get(h)
        if old is None or (hi - lo) < (old[1] - old[0]):
            ranges[h] = (lo, hi, gather) if old is None else (max(lo, old[0]), min(hi, old[1]), gather)
        else:
            ranges[h] = (max(lo, old[0]), min(hi, old[1]), old[2])

    for node in reversed(nodes):  # parents before children
        spec = getattr(node, "function", None)
        if spec is not None and spec.index_arg is not None and len(node.children) == 2:
            g = spec.gather
            if g is not None:
                x, idx = node.children
                lo, hi = g.valid_range(x.shape[g.axis(len(x.shape), len(idx.shape))])
                narrow(idx.hash, lo, hi, node)
        if node.passes_index:
            r = ranges.get(node.hash)
            if r is not None:
                for c in node.children:
                    narrow(c.hash, *r)
    return ranges


def _gathered_size(node, spec) -> int:
    """Size of the axis a gather indexes (the smallest axis when the function is not one of the
    gen_index family, which is in range whichever axis it is)."""
    data = [c for i, c in enumerate(node.children) if i != spec.index_arg]
    index = node.children[spec.index_arg]
    g = spec.gather
    if g is not None and data:
        x_ndim, i_ndim = len(data[0].shape), len(index.shape)
        axis = g.axis(x_ndim, i_ndim)
        if 0 <= axis < x_ndim:
            return data[0].shape[axis]
    sizes = [s for c in data for s in c.shape]
    return min(sizes) if sizes else 1


def fill_random(circuit: Circuit, seed: int = 0, *, max_bytes: int | None = None) -> Circuit:
    """``circuit`` with every placeholder Array given a random value.

    Ints feeding a gather lie in ``[0, size)`` of the gathered axis (the smallest over all its
    uses); other ints in ``[0, 8)``; floats are standard normal over sqrt(last dim); bools are
    fair coins.  Each placeholder's values depend only on ``seed`` and the placeholder itself,
    so a sub-circuit filled alone gets the same values as inside the whole.  A placeholder
    larger than ``max_bytes`` (default: the allocation budget, ``CIRCUITS_MAX_ALLOC_BYTES`` or
    4 GiB) raises ``CircuitError`` before anything is allocated.

    >>> from circuits import parse
    >>> w = fill_random(parse("'w' [2,4] Array 0a"), seed=1)
    >>> w.value.dtype, w.value.shape, w.is_placeholder
    (dtype('float32'), (2, 4), False)
    """
    holes = placeholders(circuit)
    if not holes:
        return circuit
    for node in holes:  # refuse before allocating anything
        check_allocation(node.shape, node.dtype, lambda: f"fill_random of {node.line()}", budget=max_bytes)
    bounds = gather_index_bounds(circuit)
    mapping = {}
    for node in holes:
        rng = np.random.default_rng([int(seed), int.from_bytes(node.hash[:8], "little")])
        # a value drawn here and held by nothing else: the Array keeps it rather than copying it
        mapping[node] = Array(_random_value(node, rng, bounds.get(node.hash)), name=node.name, _owned=True)
    return replace(circuit, mapping)


def _random_value(node: Array, rng, bound):
    shape, dtype = node.shape, node.dtype
    if dtype in INT_DTYPES:
        high = _DEFAULT_INT_HIGH if bound is None else max(int(bound), 1)
        high = min(high, int(np.iinfo(np.dtype(dtype)).max) + 1)
        return rng.integers(0, high, size=shape, dtype=np.dtype(dtype))
    if dtype == "bool":
        return rng.random(shape) < 0.5
    scale = 1.0 / np.sqrt(max(shape[-1], 1)) if shape else 1.0
    # drawn into memory the Array can keep as it is (64-byte aligned: see Array)
    value = rng.standard_normal(shape, dtype=np.float64 if dtype == "float64" else np.float32,
                                out=aligned_empty(shape, np.float64 if dtype == "float64" else np.float32))
    value *= value.dtype.type(scale)
    if dtype in ("float16", "bfloat16"):
        from .store import numpy_dtype

        value = value.astype(numpy_dtype(dtype))
    return value
