"""Concat: concatenation along one axis."""

from __future__ import annotations

from ..dtypes import promote
from ..hashing import pack_ints as _pack_ints
from .base import Circuit, check_children, convert_payload, dtype_of, shape_error
from .expansion import batch_of, insert_axes


class Concat(Circuit):
    """Concatenation of the children along ``axis`` (stored non-negative).

    >>> import numpy as np
    >>> from circuits import Array
    >>> Concat(Array(np.ones((2, 3), np.float32)), Array(np.ones((4, 3), np.float32)), axis=0).shape
    (6, 3)
    """

    __slots__ = ("axis",)
    rebuilds_by_shape = True
    type_name = "Concat"
    passes_index = True

    axis: int

    def _setup(self, *children, axis, name=None):
        children = check_children("Concat", name, children)
        if not children:
            raise shape_error("Concat", name, str(axis), children, "needs at least one child")
        rank = len(children[0].shape)
        axis = int(axis)
        if not -rank <= axis < rank:
            raise shape_error(
                "Concat", name, str(axis), children, f"axis {axis} is out of range for rank {rank}"
            )
        axis %= rank
        self.axis = axis
        first = children[0].shape
        before, after = first[:axis], first[axis + 1:]
        for c in children:
            s = c.shape
            if len(s) != rank or s[:axis] != before or s[axis + 1:] != after:
                raise shape_error(
                    "Concat", name, str(axis), children,
                    f"children must agree on every axis but {axis}: got "
                    + ", ".join(str(list(ch.shape)) for ch in children),
                )
        shape = list(children[0].shape)
        shape[axis] = sum(c.shape[axis] for c in children)
        return self._set_common(children, tuple(shape), promote(tuple(map(dtype_of, children))), name)

    @classmethod
    def parse_payload(cls, text):
        """The axis: ``'0'`` -> ``0``."""
        return convert_payload(cls, text, int, "its axis", "an axis", "an int axis, e.g. 'Concat 0'")

    @classmethod
    def from_payload(cls, payload, children, name=None, shape=None, context=None):
        return cls(*children, axis=payload, name=name)

    def _payload_bytes(self):
        return _pack_ints((self.axis,))

    def payload_text(self):
        return str(self.axis)

    def expanded(self, children, gained, size_map, replacements=None):
        """A child missing some of the batch axes is repeated along them; the axis moves behind them."""
        batch = batch_of(self, children, gained)
        b = len(batch)
        kids = [insert_axes(k, 0, batch[: b - nb]) for k, nb in zip(children, gained)]
        return Concat(*kids, axis=self.axis + b, name=self.name)

    def _rebuild(self, children, name):
        return Concat(*children, axis=self.axis, name=name)
