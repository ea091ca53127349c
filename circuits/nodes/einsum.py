"""Einsum: a generalised einsum over int axis ids."""

from __future__ import annotations

from ..errors import CircuitError
from .base import Circuit, _pack_ints, check_children, promote, shape_error

_GREEK = "αβγδεζηθικλμνξοπρστυφχψωΑΒΓΔΕΖΗΘΙΚΛΜΝΞΟΠΡΣΤΥΦΧΨΩ"
AXIS_LETTERS = "abcdefghijklmnopqrstuvwxyz" + "ABCDEFGHIJKLMNOPQRSTUVWXYZ" + _GREEK
_LETTER_ID = {c: i for i, c in enumerate(AXIS_LETTERS)}


def axis_letter(i: int) -> str:
    """Axis id -> letter: a-z are 0-25, A-Z 26-51, then Greek."""
    if not 0 <= i < len(AXIS_LETTERS):
        raise CircuitError(f"einsum axis id {i} has no letter (ids run 0..{len(AXIS_LETTERS) - 1})")
    return AXIS_LETTERS[i]


def parse_spec(spec: str):
    """``'ab,bc->ac'`` -> (((0, 1), (1, 2)), (0, 2)).  Spaces are ignored."""
    s = "".join(spec.split())
    if s.count("->") != 1:
        raise CircuitError(f"einsum spec {spec!r} needs exactly one '->' (like 'ab,bc->ac')")
    lhs, rhs = s.split("->")
    ins = lhs.split(",") if lhs else []
    try:
        in_axes = tuple(tuple(_LETTER_ID[c] for c in term) for term in ins)
        out_axes = tuple(_LETTER_ID[c] for c in rhs)
    except KeyError as e:
        raise CircuitError(
            f"einsum spec {spec!r}: {e.args[0]!r} is not an axis letter (a-z, A-Z, then Greek)"
        ) from None
    return in_axes, out_axes


def format_spec(in_axes, out_axes) -> str:
    return ",".join("".join(map(axis_letter, t)) for t in in_axes) + "->" + "".join(map(axis_letter, out_axes))


class Einsum(Circuit):
    """Generalised einsum.  Axis ids are ints stored as given; repeated ids in one input read a
    diagonal; ids absent from the output are summed; zero operands give the scalar 1.

    >>> import numpy as np
    >>> from circuits import Array
    >>> a, b = Array(np.ones((2, 3), np.float32)), Array(np.ones((3, 4), np.float32))
    >>> Einsum.from_spec('ab,bc->ac', a, b).shape
    (2, 4)
    """

    __slots__ = ("in_axes", "out_axes")
    type_name = "Einsum"

    in_axes: tuple[tuple[int, ...], ...]
    out_axes: tuple[int, ...]

    def _setup(self, *children, in_axes, out_axes, name=None):
        children = check_children("Einsum", name, children)
        try:
            in_axes = tuple(tuple(int(i) for i in t) for t in in_axes)
            out_axes = tuple(int(i) for i in out_axes)
        except TypeError:
            raise CircuitError(f"Einsum {name!r}: in_axes must be a sequence of int sequences") from None
        self.in_axes, self.out_axes = in_axes, out_axes
        try:
            payload = format_spec(in_axes, out_axes)
        except CircuitError:
            payload = f"{in_axes}->{out_axes}"
        if len(in_axes) != len(children):
            raise shape_error(
                "Einsum", name, payload, children,
                f"spec has {len(in_axes)} operands but {len(children)} children were given",
            )
        sizes: dict[int, int] = {}
        for k, (c, axes) in enumerate(zip(children, in_axes)):
            if len(axes) != len(c.shape):
                raise shape_error(
                    "Einsum", name, payload, children,
                    f"operand {k} has {len(axes)} axes in the spec but its child has shape "
                    f"{list(c.shape)} ({len(c.shape)} axes)",
                )
            for ax, n in zip(axes, c.shape):
                if ax < 0:
                    raise shape_error("Einsum", name, payload, children, f"negative axis id {ax}")
                seen = sizes.setdefault(ax, n)
                if seen != n:
                    raise shape_error(
                        "Einsum", name, payload, children,
                        f"axis {axis_letter(ax) if ax < len(AXIS_LETTERS) else ax} has size {seen} "
                        f"in one place and {n} in operand {k}",
                    )
        if len(set(out_axes)) != len(out_axes):
            raise shape_error("Einsum", name, payload, children, "an output axis is repeated")
        missing = [a for a in out_axes if a not in sizes]
        if missing:
            raise shape_error(
                "Einsum", name, payload, children,
                f"output axis {', '.join(axis_letter(a) for a in missing)} appears in no input",
            )
        shape = tuple(sizes[a] for a in out_axes)
        self._set_common(children, shape, promote(c.dtype for c in children), name)

    @classmethod
    def from_spec(cls, spec: str, *children, name=None) -> "Einsum":
        """Build from a spec string: ``Einsum.from_spec('qc,kc,,qk->qk', q, k, s, m)``."""
        in_axes, out_axes = parse_spec(spec)
        return cls(*children, in_axes=in_axes, out_axes=out_axes, name=name)

    @property
    def spec(self) -> str:
        return format_spec(self.in_axes, self.out_axes)

    def axis_sizes(self) -> dict[int, int]:
        """Size of every axis id."""
        sizes = {}
        for c, axes in zip(self.children, self.in_axes):
            sizes.update(zip(axes, c.shape))
        return sizes

    def _payload_bytes(self):
        parts = [_pack_ints((len(t),)) + _pack_ints(t) for t in self.in_axes]
        return b"".join(parts) + b"|" + _pack_ints(self.out_axes)

    def payload_text(self):
        return self.spec

    def _rebuild(self, children):
        return Einsum(*children, in_axes=self.in_axes, out_axes=self.out_axes, name=self.name)

    def _with_name(self, name):
        return Einsum(*self.children, in_axes=self.in_axes, out_axes=self.out_axes, name=name)
