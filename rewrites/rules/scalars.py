"""Rules that merge and fold Scalars: the Scalar operands of an Einsum multiplied into one, the
Scalar terms of an Add summed into one, elementwise functions of Scalars computed.

A Scalar is a constant broadcast to its shape, so shapes matter: summing an Einsum over an axis
only a Scalar carries multiplies by that axis' length, and a Scalar that gives an Add or Einsum
its output axes keeps them.
"""

from __future__ import annotations

import math

import numpy as np

from circuits.nodes import Add, Einsum, GeneralFunction, Scalar
from circuits.shapes import broadcast_shapes

from ..engine import RuleSet, rule
from ._common import same_type

__all__ = ["merge_einsum_scalars", "fold_add_scalars", "fold_function_of_scalars", "RULES"]


@rule(on=Einsum, example=(
    "'y' Einsum ab,,b->a\n  'w' [2,3] Symbol\n  0 [] Scalar 2\n  1 [3] Scalar 3",
    "'y' Einsum ab,->a\n  'w' [2,3] Symbol\n  0 [] Scalar 6",
))
def merge_einsum_scalars(node):
    """The Scalar operands of an Einsum are multiplied into one Scalar carrying only the axes
    nothing else provides; axes summed over that only Scalars carry become a factor (their
    length).  An Einsum of Scalars alone is a Scalar."""
    kids = node.children
    scalars = [i for i, c in enumerate(kids) if type(c) is Scalar]
    if not scalars and kids:
        return None
    others = [i for i in range(len(kids)) if type(kids[i]) is not Scalar]
    if len(scalars) == 1 and others and not node.in_axes[scalars[0]]:
        return None  # already one Scalar, with no axes to drop
    covered = {a for i in others for a in node.in_axes[i]}
    out = set(node.out_axes)
    value = 1.0
    scalar_axes: list[int] = []
    for i in scalars:
        value *= kids[i].value
        for a in node.in_axes[i]:
            if a not in scalar_axes:
                scalar_axes.append(a)
    keep = [a for a in scalar_axes if a in out and a not in covered]
    sizes = node.axis_sizes() if scalar_axes else {}
    for a in scalar_axes:
        if a not in out and a not in covered:
            value *= sizes[a]  # a sum of a constant over this axis
    if not others:
        return same_type(node, Scalar(value, node.shape, name=node.name))
    if len(scalars) == 1 and tuple(keep) == node.in_axes[scalars[0]] and kids[scalars[0]].value == value:
        return None  # already one Scalar with nothing to drop
    merged = Scalar(value, tuple(sizes[a] for a in keep))
    children = [kids[i] for i in others]
    in_axes = [node.in_axes[i] for i in others]
    pos = sum(1 for i in others if i < scalars[0])
    children.insert(pos, merged)
    in_axes.insert(pos, tuple(keep))
    return same_type(node, Einsum(*children, in_axes=in_axes, out_axes=node.out_axes, name=node.name))


@rule(on=Add, example=(
    "'y' Add\n  'a' [2] Symbol\n  0 [] Scalar 1\n  1 [2] Scalar 2",
    "'y' Add\n  'a' [2] Symbol\n  0 [2] Scalar 3",
))
def fold_add_scalars(node):
    """Two or more Scalar terms of an Add are summed into one Scalar of their broadcast shape
    (placed where the first was)."""
    kids = node.children
    pos = [i for i, c in enumerate(kids) if type(c) is Scalar]
    if len(pos) < 2:
        return None
    total = math.fsum(kids[i].value for i in pos)
    merged = Scalar(total, broadcast_shapes([kids[i].shape for i in pos]))
    rest = [c for i, c in enumerate(kids) if i not in pos]
    if not rest:
        return same_type(node, Scalar(total, node.shape, name=node.name))
    rest.insert(pos[0], merged)
    return same_type(node, Add(*rest, name=node.name))


@rule(on=GeneralFunction, example=(
    "'y' GeneralFunction exp\n  0 [2] Scalar 0",
    "'y' [2] Scalar 1",
))
def fold_function_of_scalars(node):
    """An elementwise function of Scalars is the Scalar of its value (computed in float64)."""
    spec = node.function
    if not spec.elementwise or not node.children or any(type(c) is not Scalar for c in node.children):
        return None
    import jax

    with jax.enable_x64(True):
        args = [np.float64(c.value) for c in node.children]
        value = float(np.asarray(spec.jax(*[jax.numpy.asarray(a) for a in args]), dtype=np.float64))
    return same_type(node, Scalar(value, node.shape, name=node.name))


RULES = RuleSet(merge_einsum_scalars, fold_add_scalars, fold_function_of_scalars, name="scalars")
