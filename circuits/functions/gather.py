"""The gather grammar: ``gen_index_at_<d>[_batch_x][_no_batch_index][_c]`` names, parsed once into
a ``GenIndex`` that the family's ``FunctionSpec`` carries (``spec.gather``), so no other module
reads the name.

>>> from circuits.functions import lookup
>>> lookup('gen_index_at_-1_c').gather
GenIndex(d=-1, batch_x=False, batch_index=True, checked=True)
"""

from __future__ import annotations

import re

import attrs

from ..dtypes import is_int
from ..errors import ShapeError
from .registry import FunctionSpec, per_element, register_family

GEN_INDEX_PATTERN = r"gen_index_at_(-?\d{1,9})(_batch_x)?(_no_batch_index)?(_c)?"
GEN_INDEX_GRAMMAR = "gen_index_at_<d>[_batch_x][_no_batch_index][_c]"
_GEN_INDEX_RE = re.compile(GEN_INDEX_PATTERN)


@attrs.frozen
class GenIndex:
    """The meaning of a ``gen_index_at_<d>[_batch_x][_no_batch_index][_c]`` name, as in
    rust_circuit (``GeneralFunction.gen_index(x, index, index_dim, batch_x, batch_index)``):

    - ``gen_index_at_<d>`` (batch_index): the index's axes come **first**:
      ``out[i..., rest...] = x[..., idx[i...], ...]`` (``d`` the axis of x), shape
      ``idx.shape + x.shape without axis d``;
    - ``_batch_x``: x's leading axes are the index's (``x.shape[:idx.ndim] == idx.shape``), ``d``
      counts within the axes after them: ``out[b, ...] = x[b, ..., idx[b], ...]``;
    - ``_no_batch_index``: the index's axes replace axis ``d`` where it is (numpy's ``take``),
      shape ``x.shape[:d] + idx.shape + x.shape[d+1:]`` (``_batch_x_no_batch_index``: the same
      values, ``d`` must be negative);
    - ``_c``: indices must lie in ``[0, size)``; without it negative indices count from the end.

    A negative ``d`` counts from the end of x (of its axes after the batch axes with
    ``_batch_x``).  At ``d = 0`` the plain and ``_no_batch_index`` forms agree.

    >>> g = GenIndex.parse('gen_index_at_1_c')
    >>> g.layout, g.axis(3, 2), g.out_shape((4, 5, 6), (2, 7))
    ('first', 1, (2, 7, 4, 6))
    >>> GenIndex.parse('gen_index_at_1_no_batch_index').out_shape((4, 5, 6), (2, 7))
    (4, 2, 7, 6)
    """

    d: int
    batch_x: bool = False
    batch_index: bool = True
    checked: bool = False

    @classmethod
    def parse(cls, name: str) -> "GenIndex | None":
        """The parts of a gen_index function name, or None for any other name."""
        m = _GEN_INDEX_RE.fullmatch(name)
        if m is None:
            return None
        return cls(int(m.group(1)), m.group(2) is not None, m.group(3) is None, m.group(4) is not None)

    @property
    def name(self) -> str:
        return (f"gen_index_at_{self.d}{'_batch_x' if self.batch_x else ''}"
                f"{'' if self.batch_index else '_no_batch_index'}{'_c' if self.checked else ''}")

    @property
    def layout(self) -> str:
        """``'batch'`` (x's leading axes are idx's, out is x without the gathered axis),
        ``'first'`` (idx's axes, then x's others) or ``'at'`` (idx's axes where axis d was)."""
        if self.batch_index:
            return "batch" if self.batch_x else "first"
        return "at"

    def axis(self, x_ndim: int, i_ndim: int) -> int:
        """The gathered axis of x (may be out of range: ``check`` says so)."""
        lead = i_ndim if self.layout == "batch" else 0
        return lead + (self.d if self.d >= 0 else x_ndim - lead + self.d)

    def moved(self, ax: int, x_ndim: int, i_ndim: int) -> "GenIndex":
        """The same gather along axis ``ax`` of an x of ``x_ndim`` axes (by an index of
        ``i_ndim`` axes), its ``d`` counted as this one's is: from the front (after the batch
        axes) when ``d >= 0``, else from the back.  The inverse of ``axis``.

        >>> g = GenIndex.parse('gen_index_at_-1_c')
        >>> g.moved(1, 3, 1).name, g.moved(1, 3, 1).axis(3, 1)
        ('gen_index_at_-2_c', 1)
        """
        lead = i_ndim if self.layout == "batch" else 0
        return attrs.evolve(self, d=ax - x_ndim if self.d < 0 else ax - lead)

    def check(self, x_shape, i_shape) -> int:
        """The gathered axis, or ShapeError (message only) when the shapes do not fit."""
        x_ndim, i_ndim = len(x_shape), len(i_shape)
        ax = self.axis(x_ndim, i_ndim)
        lead = i_ndim if self.layout == "batch" else 0
        if self.batch_x and not self.batch_index and self.d >= 0:
            raise ShapeError(f"{self.name}: _batch_x without batching the index needs a negative axis, "
                             f"e.g. gen_index_at_{self.d - x_ndim}_batch_x_no_batch_index")
        if not lead <= ax < x_ndim:
            raise ShapeError(f"axis {self.d} is out of range for x of shape {list(x_shape)}"
                             + (f" with {i_ndim} batch axes" if lead else ""))
        if lead and tuple(x_shape[:lead]) != tuple(i_shape):
            raise ShapeError(
                f"_batch_x needs x's leading axes {list(x_shape[:lead])} to equal the index "
                f"shape {list(i_shape)}"
            )
        return ax

    def out_shape(self, x_shape, i_shape) -> tuple:
        ax = self.check(x_shape, i_shape)
        x_shape, i_shape = tuple(x_shape), tuple(i_shape)
        rest = x_shape[:ax] + x_shape[ax + 1:]
        if self.layout == "batch":
            return rest
        if self.layout == "first":
            return i_shape + rest
        return x_shape[:ax] + i_shape + x_shape[ax + 1:]

    def valid_range(self, size: int) -> tuple:
        """``(lo, hi)``: the index values that select an entry of an axis of ``size``."""
        return (0, size) if self.checked else (-size, size)


def gen_index_name(d: int, batch_x: bool, checked: bool, batch_index: bool = True) -> str:
    return GenIndex(d, batch_x, batch_index, checked).name


def _gen_index_factory(m: re.Match) -> FunctionSpec:
    """``gen_index_at_<d>[_batch_x][_no_batch_index][_c]``: gather along axis d of x by an int
    tensor; see ``GenIndex`` for the layouts (rust_circuit's).  An out-of-range index gives NaN
    at evaluation (never a silently wrapped or clamped value); an index Array whose values are
    known is checked when the node is built, and int Symbols feeding a gather when they are
    bound (``circuits.evaluate`` checks its inputs before running)."""
    g = GenIndex.parse(m.group(0))
    name = g.name

    def shape_rule(shapes):
        xs, ids = shapes
        return g.out_shape(xs, ids)

    def dtype_rule(dtypes):
        if not is_int(dtypes[1]):
            raise ShapeError(f"the index argument must have an int dtype, got {dtypes[1]}")
        return dtypes[0]

    def lower(x, idx):
        import jax.numpy as jnp

        return _gather(jnp, g, x, idx)

    def lower_numpy(x, idx):
        import numpy as np

        return _gather(np, g, x, idx)

    return FunctionSpec(
        name=name, shape_rule=shape_rule, jax=lower, num_args=(2, 2), dtype_rule=dtype_rule,
        core_ndim=None, index_arg=1, gather=g, description=_gen_index_factory.__doc__,
        cost=per_element(),  # a gather: no arithmetic (circuits.cost counts the bytes it reads)
        numpy=lower_numpy,
    )


def _gather(jnp, g: GenIndex, x, idx):
    """The gather ``g`` names, written once for ``jax.numpy`` and ``numpy`` (``jnp``)."""
    ax = g.axis(x.ndim, idx.ndim)
    n = x.shape[ax]
    if g.checked:
        bad = (idx < 0) | (idx >= n)
    else:
        idx = jnp.where(idx < 0, idx + n, idx)
        bad = (idx < 0) | (idx >= n)
    safe = jnp.clip(idx, 0, max(n - 1, 0))
    q = idx.ndim
    if g.layout == "batch":
        expanded = safe.reshape(safe.shape + (1,) * (x.ndim - q))
        expanded = jnp.broadcast_to(
            expanded, tuple(x.shape[:ax]) + (1,) + tuple(x.shape[ax + 1:])
        ) if x.ndim > q else expanded
        out = jnp.take_along_axis(x, expanded, axis=ax).squeeze(ax) if x.ndim > q else x
        bad_b = bad.reshape(bad.shape + (1,) * (out.ndim - q))
    else:
        out = jnp.take(x, safe, axis=ax)
        if g.layout == "first" and ax and q:
            out = jnp.moveaxis(out, tuple(range(ax, ax + q)), tuple(range(q)))
            bad_b = bad.reshape(bad.shape + (1,) * (x.ndim - 1))
        else:
            bad_b = bad.reshape((1,) * ax + bad.shape + (1,) * (x.ndim - ax - 1))
    if jnp.issubdtype(out.dtype, jnp.floating):
        return jnp.where(bad_b, jnp.nan, out)
    return out


register_family(GEN_INDEX_PATTERN, _gen_index_factory, GEN_INDEX_GRAMMAR)
