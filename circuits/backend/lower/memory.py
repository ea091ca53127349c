"""How much memory evaluating a circuit takes: value sizes, temporaries, and the peak for an order.

The model is the op-by-op evaluator's (``Skeleton.run``): nodes are computed one at a time in an
order, each value is freed after its last use, and Arrays, Scalars and Symbols are *inputs*, held
by the caller, not counted as temporaries.  A Tag is its child's value (no new storage).  An
Einsum's pairwise contractions make intermediates of their own (``einsum_steps``): they count at
that node's step.  ``peak_bytes(order)`` is the largest sum of live temporaries at any step.

Under ``jax.jit`` XLA fuses and reorders ops and plans its own buffers, so the compiled peak is
usually lower; this is the estimate ``evaluate_batched`` sizes its chunks with and
``circuits.cost`` reports (with an order that lowers it).

>>> from circuits import Symbol, GeneralFunction, Einsum
>>> x = Symbol((1000,), name='x')
>>> y = Einsum.from_spec('a->', GeneralFunction('exp', x))
>>> peak_bytes(toposort_order(y), [y], 'float32')   # exp(x) (4000 bytes) + the sum (4 bytes)
4004
"""

from __future__ import annotations

from typing import Sequence

from ...dtypes import ITEMSIZE, is_float
from ...nodes import Array, Circuit, Einsum, Scalar, Symbol, Tag
from ...traversal import toposort
from .einsum import einsum_steps

__all__ = ["INPUT_TYPES", "value_bytes", "einsum_temp_bytes", "peak_bytes", "toposort_order", "live_bytes"]

INPUT_TYPES = (Array, Scalar, Symbol)


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def itemsize(node: Circuit, fdt: str) -> int:
    """Bytes per entry of ``node``'s value when float values are computed in ``fdt``."""
    return ITEMSIZE[fdt] if is_float(node.dtype) else ITEMSIZE[node.dtype]


def value_bytes(node: Circuit, fdt: str = "float32") -> int:
    """Bytes of ``node``'s value (a Scalar: one entry, broadcast lazily; a Tag: 0, its child's)."""
    t = type(node)
    if t is Tag:
        return 0
    if t is Scalar:
        return itemsize(node, fdt)
    return _numel(node.shape) * itemsize(node, fdt)


def einsum_temp_bytes(node: Einsum, fdt: str = "float32") -> int:
    """Bytes of the intermediates the backend's plan for this Einsum makes before its result
    (their sum: each is freed only when the einsum finishes, an upper bound)."""
    if not node.children:
        return 0
    steps, sizes = einsum_steps(node.in_axes, node.out_axes, tuple(c.shape for c in node.children))
    size = itemsize(node, fdt)
    total = 0
    for step in steps[:-1]:
        total += _numel([sizes[a] for a in step.result]) * size
    return total


def toposort_order(*roots: Circuit) -> list[Circuit]:
    """The backend's evaluation order: the computed nodes (inputs left out) in toposort order."""
    return [n for n in toposort(*roots) if type(n) not in INPUT_TYPES]


def live_bytes(order: Sequence[Circuit], roots: Sequence[Circuit], fdt: str = "float32", temps=None) -> list[int]:
    """Memory in use at each step of ``order`` (values live then, the new one included, plus the
    step's own temporaries); ``temps`` maps node hashes to temporary bytes (default: Einsums')."""
    owner: dict = {}  # node hash -> hash of the node whose storage holds its value (Tags alias)
    size: dict = {}
    for n in order:
        h = n.hash
        if type(n) is Tag:
            c = n.children[0]
            owner[h] = owner.get(c.hash, c.hash)
            size[h] = 0
        else:
            owner[h] = h
            size[h] = value_bytes(n, fdt)
    last = {}
    for i, n in enumerate(order):
        for c in n.children:
            o = owner.get(c.hash)
            if o is not None:
                last[o] = i
    end = len(order)
    for r in roots:
        o = owner.get(r.hash)
        if o is not None:
            last[o] = end
    frees: dict[int, list] = {}
    for h, i in last.items():
        if h in size:  # not an input (a Tag of an input aliases the caller's value)
            frees.setdefault(i, []).append(h)
    live = 0
    out = []
    for i, n in enumerate(order):
        h = n.hash
        live += size[h]
        temp = temps.get(h, 0) if temps is not None else (einsum_temp_bytes(n, fdt) if type(n) is Einsum else 0)
        out.append(live + temp)
        for o in frees.get(i, ()):
            live -= size[o]
        if h not in last and owner[h] == h:  # computed and never used (not a root): freed at once
            live -= size[h]
    return out


def peak_bytes(order: Sequence[Circuit], roots: Sequence[Circuit], fdt: str = "float32", temps=None) -> int:
    """The largest memory in use over the steps of ``order`` (``live_bytes``'s maximum)."""
    return max(live_bytes(order, roots, fdt, temps), default=0)
