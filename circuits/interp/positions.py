"""Positions and rows in sites: an intervention that acts on some entries of a site's sequence
axis, in some rows of a batch, and leaves the rest of the site as it was.

``positions`` (an int, a list of ints, a slice or an int array; negative counts from the end)
selects entries of the site's *position axis*: the only axis of a 1-d site (a per-position loss,
a LayerNorm's scale), else the second to last (``[pos, d_model]``, ``[pos, d_head]``, the query
axis of ``[query, key]`` patterns, and of fused ``[heads, ..., pos, d_head]`` projections).
``axis=`` names another.

``rows`` (ints from 0) selects rows of a batch: the batch lives outside the circuit (Symbols bound
to values with a leading batch axis), so a circuit built with ``rows=`` reads the float Symbol
``'row'`` (``ROW``: the number of the row being computed), and its value at row ``r`` is the
intervention's where ``r`` is chosen and the clean value elsewhere.  ``bind_rows(circuit, inputs)``
adds ``'row': arange(batch)`` to a batch's inputs (every ``interp`` function that evaluates does).

The mix is ``clean * (1 - m) + other * m`` for a 0/1 mask ``m`` (an Array ``'<site>.position_mask'``
broadcast along the position axis, times the row flag): exact, entry by entry, for finite values,
and other positions only change the mask's *value*, so a grid of (site, position) variants is one
structure, compiled once.

>>> import numpy as np
>>> from circuits import Symbol, evaluate
>>> x = Symbol((4, 2), name='x')
>>> y = mix(x, Scalar(5.0, (4, 2)), 'x', positions=[0, -1])
>>> evaluate(y, {'x': np.zeros((4, 2))})[:, 0].tolist()
[5.0, 0.0, 0.0, 5.0]
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from ..errors import CircuitError
from ..nodes import Add, Array, Circuit, Einsum, GeneralFunction, Scalar, Symbol
from ..traversal import toposort

__all__ = ["ROW", "position_axis", "chosen_positions", "ordered_positions", "position_mask", "row_numbers", "row_flag", "selection", "mix",
           "bind_rows", "reads_rows"]

ROW = Symbol((), name="row", dtype="float32")
_AXES = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


def position_axis(node: Circuit, axis: int | None = None) -> int:
    """The position axis of ``node`` (see the module docstring), as a non-negative int.

    >>> from circuits import Symbol
    >>> position_axis(Symbol((3,))), position_axis(Symbol((3, 8))), position_axis(Symbol((2, 1, 3, 4)))
    (0, 0, 2)
    """
    ndim = len(node.shape)
    if ndim == 0:
        raise CircuitError(f"positions: {node.line()} is a scalar; it has no position axis")
    if axis is None:
        return 0 if ndim == 1 else ndim - 2
    if not isinstance(axis, (int, np.integer)) or not -ndim <= axis < ndim:
        raise CircuitError(f"axis={axis!r}: {node.line()} has {ndim} axes; give an int in [{-ndim}, {ndim})")
    return int(axis) % ndim


def chosen_positions(positions, length: int, where: str = "the axis") -> np.ndarray:
    """The positions ``positions`` selects on an axis of ``length``, as sorted distinct
    non-negative ints; out of range, empty or of the wrong type is a ``CircuitError`` naming the
    argument and ``where`` (the site and axis).

    >>> chosen_positions(-1, 5).tolist(), chosen_positions([0, 2, -1], 5).tolist(), chosen_positions(slice(1, 3), 5).tolist()
    ([4], [0, 2, 4], [1, 2])
    """
    if isinstance(positions, slice):
        picked = np.arange(length)[positions]
    else:
        arr = np.asarray(positions)
        if arr.dtype == bool or arr.dtype.kind not in "iu" or arr.ndim > 1:
            raise CircuitError(f"positions={positions!r}: give an int, a list of ints, a slice or a 1-d int array")
        arr = arr.reshape(-1).astype(np.int64)
        bad = arr[(arr < -length) | (arr >= length)]
        if bad.size:
            raise CircuitError(f"positions={positions!r}: {int(bad[0])} is outside the {length} positions of {where} "
                               f"(valid: {-length}..{length - 1}, negative counting from the end)")
        picked = arr % length
    if picked.size == 0:
        raise CircuitError(f"positions={positions!r} selects none of the {length} positions of {where}")
    return np.unique(picked)


def ordered_positions(positions, length: int, where: str = "the axis") -> np.ndarray:
    """The positions ``positions`` names on an axis of ``length``, in the order given (a slice in
    its own order), each once, as non-negative ints; errors as ``chosen_positions``.

    >>> ordered_positions([3, -5, 1], 5).tolist(), ordered_positions(slice(None, None, -2), 5).tolist()
    ([3, 0, 1], [4, 2, 0])
    """
    chosen_positions(positions, length, where)  # type, range, emptiness: one set of checks
    picked = np.arange(length)[positions] if isinstance(positions, slice) else \
        np.asarray(positions).reshape(-1).astype(np.int64) % length
    if len(set(picked.tolist())) != picked.size:
        raise CircuitError(f"positions={positions!r} names a position twice (of the {length} of {where})")
    return picked


def position_mask(node: Circuit, positions, label: str, axis: int | None = None) -> tuple[Array, int]:
    """``(mask, axis)``: a 0/1 Array ``'<label>.position_mask'`` over ``node``'s position axis, 1
    at ``positions``, in ``node``'s float dtype (float32 for an int node)."""
    ax = position_axis(node, axis)
    picked = chosen_positions(positions, node.shape[ax], f"site {label!r} (its axis {ax})")
    dtype = node.dtype if str(node.dtype).startswith("float") else "float32"
    mask = np.zeros(node.shape[ax], np.dtype(dtype))
    mask[picked] = 1
    return Array(mask, name=f"{label}.position_mask"), ax


def row_numbers(rows) -> np.ndarray:
    """The rows ``rows`` names (ints from 0), sorted and distinct; anything else is a ``CircuitError``.

    >>> row_numbers([3, 1, 3]).tolist()
    [1, 3]
    """
    arr = np.asarray(rows)
    if arr.dtype == bool or arr.dtype.kind not in "iu" or arr.ndim > 1 or arr.size == 0:
        raise CircuitError(f"rows={rows!r}: give an int or a list of ints (rows of the batch, from 0)")
    arr = np.unique(arr.reshape(-1).astype(np.int64))
    if arr.min() < 0:
        raise CircuitError(f"rows={rows!r}: rows count from 0 (the batch size is not known when the circuit is "
                           "built, so a row cannot count from the end)")
    return arr


def row_flag(rows, label: str) -> Circuit:
    """A scalar node: 1.0 in the rows ``rows`` (ints from 0) of a batch, 0.0 in the others, read
    from the Symbol ``ROW`` (``sum_k relu(1 - |row - r_k|)``: exact for whole numbers).

    >>> from circuits import evaluate
    >>> flag = row_flag([1, 3], 'x')
    >>> evaluate(flag, {'row': np.arange(5, dtype=np.float32)}).tolist()
    [0.0, 1.0, 0.0, 1.0, 0.0]
    """
    arr = row_numbers(rows)
    k = arr.size
    diff = Add(ROW, Array(-arr.astype(np.float32), name=f"{label}.rows"))
    far = Einsum.from_spec("k,->k", GeneralFunction("abs", diff), Scalar(-1.0))
    hit = GeneralFunction("relu", Add(Scalar(1.0, (k,)), far))
    return Einsum.from_spec("k->", hit, name=f"{label}.row_mask")


def selection(node: Circuit, label: str, positions=None, rows=None, axis: int | None = None
              ) -> tuple[Circuit, str] | None:
    """``(mask, axes)``: the 0/1 mask of the entries of ``node`` an intervention at ``positions``
    and ``rows`` acts on, and which of ``node``'s axes (einsum letters of ``node``'s, ``'a'`` the
    first) it spans (``''``: a scalar, rows only); None when both are None (the whole site)."""
    if positions is None and rows is None:
        if axis is not None:
            raise CircuitError("axis= says which axis positions= index: give positions= too")
        return None
    mask, axes = None, ""
    if positions is not None:
        mask, ax = position_mask(node, positions, label, axis)
        axes = _AXES[ax]
    if rows is not None:
        flag = row_flag(rows, label)
        mask = flag if mask is None else Einsum.from_spec(f"{axes},->{axes}", mask, flag)
    return mask, axes


def mix(clean: Circuit, other: Circuit, label: str, positions=None, rows=None, axis: int | None = None,
        name: str | None = None, mask: tuple[Circuit, str] | None = None) -> Circuit:
    """``other`` where ``positions`` / ``rows`` select, ``clean`` elsewhere (``other`` itself when
    both are None), named ``name`` (default ``'<label>.mixed'``); ``other`` is a node of
    ``clean``'s shape, or None for zeros (an ablation: ``clean * (1 - m)``).  ``mask``: a mask
    made by the caller instead, ``(node, axes)`` as ``selection`` gives it (a patching grid's
    mask is an input, one cell per row of it)."""
    found = mask if mask is not None else selection(clean, label, positions, rows, axis)
    if found is None:
        return other if other is not None else Scalar(0.0, clean.shape)
    m, axes = found
    letters = _AXES[: len(clean.shape)]
    if type(m) is Array and m.value is not None:  # positions alone: 1 - m known now (no kernels of its own)
        keep = Array((1 - m.value).astype(m.value.dtype), name=f"{m.name}.kept" if m.name else None)
    else:
        keep = Add(Scalar(1.0, m.shape), Einsum.from_spec(f"{axes},->{axes}", m, Scalar(-1.0)))
    spec = f"{letters},{axes}->{letters}"
    kept = Einsum.from_spec(spec, clean, keep)
    if other is None:
        return kept.rename(name or f"{label}.mixed")
    if other.shape != clean.shape:
        other = Add(other, Scalar(0.0, clean.shape))
    return Add(kept, Einsum.from_spec(spec, other, m), name=name or f"{label}.mixed")


def reads_rows(circuit: Circuit) -> bool:
    """Whether ``circuit`` reads the row Symbol ``ROW`` (an intervention made with ``rows=``)."""
    return any(n is ROW for n in toposort(circuit))


def bind_rows(circuit: Circuit, inputs: Mapping | None, rows: int | None = None) -> Mapping | None:
    """``inputs`` with ``'row'`` bound to ``arange(batch)`` (``batch``: ``rows``, else the leading
    axis of a batched input) when ``circuit`` reads ``ROW`` and ``inputs`` does not bind it; a
    circuit that reads it evaluated on one input is row 0."""
    if not reads_rows(circuit) or (inputs is not None and any(
            k == "row" or (isinstance(k, Circuit) and k is ROW) for k in inputs)):
        return inputs
    if rows is None:
        from ..backend import has_batch_axis

        if has_batch_axis(circuit, inputs):
            symbols = {n.name: n for n in toposort(circuit) if isinstance(n, Symbol)}
            for key, value in inputs.items():
                sym = key if isinstance(key, Circuit) else symbols.get(key)
                if sym is not None and np.ndim(value) == len(sym.shape) + 1:
                    rows = np.shape(value)[0]
                    break
    value = np.float32(0.0) if rows is None else np.arange(rows, dtype=np.float32)
    return {**(inputs or {}), "row": value}
