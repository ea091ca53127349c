"""Small helpers shared by the rule modules (not public)."""

from __future__ import annotations

from circuits.nodes import Circuit, Einsum, Scalar
from circuits.nodes.einsum import AXIS_LETTERS

# jnp.einsum takes at most 52 distinct axes, so no rule builds an Einsum with more.
MAX_EINSUM_AXES = 52


def same_type(node: Circuit, new: Circuit | None) -> Circuit | None:
    """``new`` if it can stand for ``node`` (same shape and dtype), else None (the rule does not
    apply: e.g. dropping a float32 Scalar from an int Einsum would change its dtype)."""
    if new is None or new.shape != node.shape or new.dtype != node.dtype:
        return None
    return new


def is_scalar(node: Circuit, value: float | None = None) -> bool:
    return type(node) is Scalar and (value is None or node.value == value)


def fresh_ids(used, count: int) -> list[int]:
    """``count`` smallest axis ids not in ``used``."""
    out, i = [], 0
    while len(out) < count:
        if i not in used:
            out.append(i)
        i += 1
    return out


def einsum_fits(in_axes, out_axes) -> bool:
    """Whether an Einsum with these axes stays printable and evaluable."""
    ids = {a for t in in_axes for a in t} | set(out_axes)
    return len(ids) <= MAX_EINSUM_AXES and (not ids or max(ids) < len(AXIS_LETTERS))


def sole_holder(node: Einsum, axis: int) -> int | None:
    """The position of the one operand of ``node`` that carries axis id ``axis``, once; None
    when several operands (or none) carry it, or it carries it twice (a diagonal)."""
    holders = [i for i, axes in enumerate(node.in_axes) if axis in axes]
    if len(holders) != 1 or node.in_axes[holders[0]].count(axis) != 1:
        return None
    return holders[0]


def unwrap_identity(node: Circuit) -> Circuit:
    """The child of a one-operand Einsum that only copies it (``ab->ab``), else the node."""
    if type(node) is Einsum and len(node.children) == 1:
        (axes,) = node.in_axes
        if axes == node.out_axes:
            return node.children[0]
    return node
