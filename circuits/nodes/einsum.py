"""Einsum: a generalised einsum over int axis ids."""

from __future__ import annotations

from ..dtypes import promote
from ..errors import CircuitError, ParseError
from ..hashing import pack_ints as _pack_ints
from ..shapes import INT64_MAX, int_tuple
from .base import Circuit, check_children, dtype_of, shape_error, shape_of
from .caching import small_cache
from .expansion import batch_of

_GREEK = "αβγδεζηθικλμνξοπρστυφχψωΑΒΓΔΕΖΗΘΙΚΛΜΝΞΟΠΡΣΤΥΦΧΨΩ"
AXIS_LETTERS = "abcdefghijklmnopqrstuvwxyz" + "ABCDEFGHIJKLMNOPQRSTUVWXYZ" + _GREEK
_LETTER_ID = {c: i for i, c in enumerate(AXIS_LETTERS)}


def axis_letter(i: int) -> str:
    """Axis id -> letter: a-z are 0-25, A-Z 26-51, then Greek."""
    if not 0 <= i < len(AXIS_LETTERS):
        raise CircuitError(f"einsum axis id {i} has no letter (ids run 0..{len(AXIS_LETTERS) - 1})")
    return AXIS_LETTERS[i]


@small_cache(maxsize=4096)
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


FANCY_PREFIX = "fancy:"


@small_cache(maxsize=1024)
def parse_fancy_spec(spec: str):
    """rust_circuit's "fancy" einsum string: space-separated axis names of any length, each
    name one axis id (numbered in order of appearance).

    >>> parse_fancy_spec('fancy: first second, first third -> first')
    (((0, 1), (0, 2)), (0,))
    """
    body = spec[len(FANCY_PREFIX):] if spec.startswith(FANCY_PREFIX) else spec
    if body.count("->") != 1:
        raise CircuitError(f"einsum spec {spec!r} needs exactly one '->' (like 'fancy: a b, b c -> a c')")
    lhs, rhs = body.split("->")
    ids: dict = {}
    terms = [t.split() for t in lhs.split(",")] if lhs.strip() else []
    in_axes = tuple(tuple(ids.setdefault(w, len(ids)) for w in t) for t in terms)
    missing = [w for w in rhs.split() if w not in ids]
    if missing:
        raise CircuitError(f"einsum spec {spec!r}: output axis {missing[0]!r} is on no input")
    return in_axes, tuple(ids[w] for w in rhs.split())


def format_spec(in_axes, out_axes) -> str:
    return ",".join("".join(map(axis_letter, t)) for t in in_axes) + "->" + "".join(map(axis_letter, out_axes))


def _axis_name(i: int) -> str:
    return AXIS_LETTERS[i] if 0 <= i < len(AXIS_LETTERS) else str(i)


@small_cache(maxsize=4096)
def _einsum_payload_bytes(in_axes, out_axes) -> bytes:
    parts = [_pack_ints((len(t),)) + _pack_ints(t) for t in in_axes]
    return b"".join(parts) + b"|" + _pack_ints(out_axes)


class _SpecMismatch(Exception):
    """A spec that does not fit the children's shapes: (message, in_axes, out_axes); the node
    adds its printed line."""


def _fail(message, in_axes, out_axes, name, children):
    # The payload is only written out for an error message.
    try:
        payload = format_spec(in_axes, out_axes)
    except CircuitError:
        payload = f"{in_axes}->{out_axes}"
    return shape_error("Einsum", name, payload, children, message)


@small_cache(maxsize=4096)
def _analyse(in_axes, out_axes, shapes):
    """``(in_axes, out_axes, output shape)`` of an einsum over operands of these shapes, the axes
    as tuples of ints.  Cached: the same einsum over the same shapes recurs in every layer and
    head.  Raises TypeError for axes that are not ints, _SpecMismatch when the spec does not fit."""
    in_axes = tuple(int_tuple(t) for t in in_axes)
    out_axes = int_tuple(out_axes)

    def mismatch(message):
        return _SpecMismatch(message, in_axes, out_axes)

    if len(in_axes) != len(shapes):
        raise mismatch(f"spec has {len(in_axes)} operands but {len(shapes)} children were given")
    sizes: dict[int, int] = {}
    setdefault = sizes.setdefault
    for k, (shape, axes) in enumerate(zip(shapes, in_axes)):
        if len(axes) != len(shape):
            raise mismatch(
                f"operand {k} has {len(axes)} axes in the spec but its child has shape "
                f"{list(shape)} ({len(shape)} axes)"
            )
        for ax, n in zip(axes, shape):
            if setdefault(ax, n) != n:
                raise mismatch(f"axis {_axis_name(ax)} has size {sizes[ax]} in one place and {n} in operand {k}")
    if any(ax < 0 for ax in sizes):
        raise mismatch(f"negative axis id {min(sizes)}")
    if any(ax > INT64_MAX for ax in sizes):
        raise mismatch(f"axis id {max(sizes)} is over 2**63 - 1; use small ids (they print as letters)")
    try:
        shape = tuple([sizes[a] for a in out_axes])
    except KeyError:
        missing = [a for a in out_axes if a not in sizes]
        raise mismatch(f"output axis {', '.join(map(_axis_name, missing))} appears in no input") from None
    return in_axes, out_axes, shape


def write_diagonal(y, unique, out_axes, zeros):
    """``y`` (axes ``unique``, each id once) written on the diagonals of an array with axes
    ``out_axes`` (ids repeated: ``ab -> abaa``), zero elsewhere: what an einsum with a repeated
    output axis means (rust_circuit's).  ``zeros(shape)`` makes the array (numpy, object
    arrays...).

    >>> import numpy as np
    >>> write_diagonal(np.array([1, 2]), (0,), (0, 0), lambda s: np.zeros(s, int)).tolist()
    [[1, 0], [0, 2]]
    """
    import numpy as np

    shape = tuple(y.shape[unique.index(a)] for a in out_axes)
    out = zeros(shape)
    grids = np.indices(y.shape, sparse=True) if y.ndim else ()
    if y.ndim:
        out[tuple(grids[unique.index(a)] for a in out_axes)] = y
    else:
        out[()] = y
    return out


class Einsum(Circuit):
    """Generalised einsum.  Axis ids are ints stored as given; repeated ids in one input read a
    diagonal; ids absent from the output are summed; zero operands give the scalar 1; an id
    repeated in the output writes a diagonal (``ab->abaa``: zero off it, as rust_circuit means it).

    >>> import numpy as np
    >>> from circuits import Array
    >>> a, b = Array(np.ones((2, 3), np.float32)), Array(np.ones((3, 4), np.float32))
    >>> Einsum.from_spec('ab,bc->ac', a, b).shape
    (2, 4)
    """

    __slots__ = ("in_axes", "out_axes", "writes_diagonal")
    rebuilds_by_shape = True
    type_name = "Einsum"

    in_axes: tuple[tuple[int, ...], ...]
    out_axes: tuple[int, ...]
    # Whether an output axis id is repeated (``ab->abaa``): the result is zero off the diagonals
    # of those axes.  Rewrite rules that read ``out_axes`` as one axis per id leave such an einsum
    # alone (``rewrites.engine``).
    writes_diagonal: bool

    def _setup(self, *children, in_axes, out_axes, name=None):
        children = check_children("Einsum", name, children)
        shapes = tuple(map(shape_of, children))
        try:
            in_axes, out_axes, shape = _analyse(in_axes, out_axes, shapes)
        except TypeError:  # lists (unhashable) or ids that are not ints
            try:
                in_axes = tuple(int_tuple(t) for t in in_axes)
                out_axes = int_tuple(out_axes)
            except TypeError:
                raise CircuitError(f"Einsum {name!r}: in_axes must be a sequence of int sequences") from None
            try:
                in_axes, out_axes, shape = _analyse(in_axes, out_axes, shapes)
            except _SpecMismatch as e:
                raise _fail(e.args[0], in_axes, out_axes, name, children) from None
        except _SpecMismatch as e:
            raise _fail(e.args[0], e.args[1], e.args[2], name, children) from None
        self.in_axes, self.out_axes = in_axes, out_axes
        self.writes_diagonal = len(shape) > 1 and len(set(out_axes)) != len(out_axes)
        return self._set_common(children, shape, promote(tuple(map(dtype_of, children))), name)

    @classmethod
    def from_spec(cls, spec: str, *children, name=None) -> "Einsum":
        """Build from a spec string: ``Einsum.from_spec('qc,kc,,qk->qk', q, k, s, m)``.

        An empty left side reads as no operands, or as one 0-d operand when one child is given
        (``'->'`` is how both print).
        """
        return cls.from_payload(parse_spec(spec), children, name=name)

    @classmethod
    def parse_payload(cls, text):
        """``'qc,kc,,qk->qk'`` -> ``(in_axes, out_axes)``."""
        if text is None:
            raise ParseError("Einsum needs its spec", expected="a spec like ab,bc->ac")
        try:
            return parse_fancy_spec(text) if text.startswith(FANCY_PREFIX) else parse_spec(text)
        except CircuitError as e:
            raise ParseError(str(e), column=1, expected="a spec like qc,kc,,qk->qk") from None

    @classmethod
    def from_payload(cls, payload, children, name=None, shape=None, context=None):
        in_axes, out_axes = payload
        if not in_axes and len(children) == 1:
            in_axes = ((),)  # '->' is both no operand and one scalar operand: the children decide
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
        return _einsum_payload_bytes(self.in_axes, self.out_axes)

    def payload_text(self):
        return self.spec

    def expanded(self, children, gained, size_map, replacements=None):
        """New batch axes lead every operand that gained them and the output."""
        batch = batch_of(self, children, gained)
        b = len(batch)
        used = {a for axes in self.in_axes for a in axes} | set(self.out_axes)
        start = max(used, default=-1) + 1
        ids = tuple(range(start, start + b))
        in_axes = tuple(ids[b - nb:] + tuple(axes) for axes, nb in zip(self.in_axes, gained))
        return Einsum(*children, in_axes=in_axes, out_axes=ids + tuple(self.out_axes), name=self.name)

    def _rebuild(self, children, name):
        return Einsum(*children, in_axes=self.in_axes, out_axes=self.out_axes, name=name)
