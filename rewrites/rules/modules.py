"""Rules for rust_circuit's node types: inline a Module, push an Index through a Scatter, drop
Scatter and SetSymbolicShape where they do nothing; and ``batch_to_concat`` /
``split_to_concat``, which compute a circuit in pieces along an axis and concatenate them
(rust_circuit's rewrites of the same names: smaller intermediate tensors, same value).

>>> from circuits import Module, ModuleSpec, ModuleArgSpec, Symbol, Add, Scalar
>>> x = Symbol((2,), name='x')
>>> m = Module(ModuleSpec(Add(x, Scalar(1.0, (2,))), [ModuleArgSpec(x)]), Symbol((2,), name='y'))
>>> inline_module(m).to_text()
"0 Add\\n  'y' [2] Symbol\\n  1 [2] Scalar 1"
"""

from __future__ import annotations

from circuits.errors import CircuitError
from circuits.nodes import Concat, Index, Module, Scalar, Scatter, SetSymbolicShape

from ..engine import RuleSet, rule
from .index import RULES as INDEX_RULES
from .index import make_index

__all__ = ["inline_module", "push_index_through_scatter", "scatter_full", "drop_set_symbolic_shape",
           "RULES", "batch_to_concat", "split_to_concat"]


@rule(on=Module, example=(
    "'m' Module\n  'b' Add\n    'x' [2] Symbol\n    'x'\n  'y' [2] Symbol ! 'x'",
    "'m' Add\n  'y' [2] Symbol\n  'y'",
))
def inline_module(node):
    """A Module = its body with the arguments in place of its Symbols (``Module.substitute``):
    batch axes and symbolic sizes followed, named like the module."""
    return node.substitute()


@rule(on=Index, example=(
    "'y' [2] Index [1:3]\n  's' [4] Scatter [2:4]\n    'x' [2] Symbol",
    "'y' [2] Scatter [1:2]\n  0 [1] Index [0:1]\n    'x' [2] Symbol",
))
def push_index_through_scatter(node):
    """Index a Scatter = Scatter of the indexed child: on each axis an int inside the written
    block reads the child there (outside it, the whole result is zero), a step-1 slice keeps
    the part of the block it overlaps.  Arrays and other steps stay as they are."""
    sc = node.children[0]
    if not isinstance(sc, Scatter):
        return None
    child_entries, out_slices, out_shape = [], [], []
    zero = False
    for e, block, n in zip(node.full_index(), sc.index, sc.shape):
        a, b, _ = block.indices(n)
        if isinstance(e, int):
            p = e % n
            if not a <= p < b:
                zero = True
            child_entries.append(p - a if a <= p < b else 0)
        elif isinstance(e, slice) and e.step in (None, 1):
            s, t, _ = e.indices(n)
            t = max(s, t)
            lo, hi = max(a, s), min(b, t)
            if hi <= lo:
                zero = True
                lo = hi = max(min(a, t), s)
            child_entries.append(slice(lo - a, hi - a))
            out_slices.append(slice(lo - s, hi - s))
            out_shape.append(t - s)
        else:
            return None
    if zero:
        zeros = Scalar(0.0, node.shape, name=node.name)
        return zeros if zeros.dtype == node.dtype else None
    return Scatter(make_index(sc.children[0], child_entries), tuple(out_slices), tuple(out_shape),
                   name=node.name)


@rule(on=Scatter, example=("'s' [2] Scatter [0:2]\n  'x' [2] Symbol", "'x' [2] Symbol"))
def scatter_full(node):
    """A Scatter whose block is the whole output = its child."""
    return node.children[0] if node.shape == node.children[0].shape else None


@rule(on=SetSymbolicShape, example=("'s' [2] SetSymbolicShape\n  'x' [2] Symbol", "'x' [2] Symbol"))
def drop_set_symbolic_shape(node):
    """A SetSymbolicShape that states the child's own shape = its child."""
    return node.children[0] if node.shape == node.children[0].shape else None


RULES = RuleSet(inline_module, push_index_through_scatter, scatter_full, drop_set_symbolic_shape, name="modules")


def split_to_concat(circuit, axis: int, sizes) -> Concat:
    """``circuit`` computed in pieces of ``sizes`` along ``axis`` and concatenated: each piece is
    an Index of the circuit pushed down towards the leaves (``rewrites.rules.index``), so each
    computes only its part.  Value-preserving.

    >>> from circuits import Symbol, GeneralFunction, evaluate
    >>> import numpy as np
    >>> x = Symbol((5, 2), name='x')
    >>> c = split_to_concat(GeneralFunction('exp', x), 0, [2, 3])
    >>> c.to_text().splitlines()[:3]
    ['0 Concat 0', '  1 GeneralFunction exp', '    2 [2,2] Index [0:2]']
    """
    from ..strategies import apply, normalize

    axis = axis % len(circuit.shape) if circuit.shape else axis
    sizes = [int(s) for s in sizes]
    if sum(sizes) != circuit.shape[axis] or any(s <= 0 for s in sizes):
        raise CircuitError(f"split_to_concat: sizes {sizes} must be positive and add up to axis {axis}'s "
                           f"size {circuit.shape[axis]} in {circuit.line()}")
    pieces, start = [], 0
    push = normalize(INDEX_RULES + push_index_through_scatter)
    for s in sizes:
        entries = (slice(None),) * axis + (slice(start, start + s),)
        pieces.append(apply(push, Index(circuit, entries)))
        start += s
    return Concat(*pieces, axis=axis, name=circuit.name)


def batch_to_concat(circuit, axis: int, batch_size: int) -> Concat:
    """``split_to_concat`` in pieces of ``batch_size`` (the last one smaller if it must be).

    >>> from circuits import Symbol, Einsum
    >>> x = Symbol((5, 3), name='x')
    >>> [c.shape for c in batch_to_concat(Einsum.from_spec('ab,ab->a', x, x), 0, 2).children]
    [(2,), (2,), (1,)]
    """
    n = circuit.shape[axis]
    if batch_size <= 0:
        raise CircuitError(f"batch_to_concat: batch_size must be positive, got {batch_size}")
    return split_to_concat(circuit, axis, [min(batch_size, n - i) for i in range(0, n, batch_size)])
