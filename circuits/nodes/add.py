"""Add: a broadcasting sum."""

from __future__ import annotations

from ..dtypes import promote
from ..shapes import broadcast_shapes
from .base import Circuit, check_children, dtype_of, shape_error, shape_of
from .caching import small_cache
from .expansion import aligned


@small_cache(maxsize=4096)
def _shape_and_dtype(shapes, dtypes):
    # Cached: circuits add the same shapes over and over (residual streams, biases).
    return broadcast_shapes(shapes), promote(dtypes)


class Add(Circuit):
    """Sum of the children with numpy (right-aligned) broadcasting; no children is 0.

    >>> import numpy as np
    >>> from circuits import Array, Scalar
    >>> Add(Array(np.ones((2, 3), np.float32)), Scalar(1.0)).shape
    (2, 3)
    """

    __slots__ = ()
    rebuilds_by_shape = True
    type_name = "Add"

    def _setup(self, *children, name=None):
        children = check_children("Add", name, children)
        shape, dtype = _shape_and_dtype(tuple(map(shape_of, children)), tuple(map(dtype_of, children)))
        if shape is None:
            raise shape_error(
                "Add", name, "", children,
                "children's shapes " + ", ".join(str(list(c.shape)) for c in children)
                + " do not broadcast (numpy rules: align on the right; sizes equal or 1)",
            )
        return self._set_common(children, shape, dtype, name)

    def expanded(self, children, gained, size_map, replacements=None):
        """Over children with gained batch axes: unit axes keep batch and core axes apart."""
        kids, _ = aligned(self, children, gained)
        return Add(*kids, name=self.name)

