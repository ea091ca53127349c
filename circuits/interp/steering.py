"""Steering: a vector added to a site, scaled, at some positions; activation addition.

``steer(circuit, site, vector, scale=, positions=)`` makes the site ``'<site>.steered'`` = site +
``scale`` * vector, the vector placed at the chosen positions (zeros elsewhere) as one Array of the
site's shape, ``'<site>.steer_vector'``, and the scale an Array ``'<site>.steer_scale'``: another
scale, vector or set of positions changes only those Arrays' values, so the steered circuit keeps
its structure and its compiled program (``C.compile(steered)`` once, then ``bind`` new values).
``steering_vector(circuit, site, plus, minus)`` is activation addition's vector: the site's value
on one input minus its value on another (``'Love'`` minus ``'Hate'``), the full site.

>>> import numpy as np
>>> from circuits import Symbol, Einsum, Scalar, evaluate
>>> x = Symbol((3, 2), name='x')
>>> r = Einsum.from_spec('ab,->ab', x, Scalar(1.0), name='resid')
>>> s = steer(r, 'resid', np.array([1.0, -1.0]), scale=2.0, positions=[0, 2])
>>> evaluate(s, {'x': np.zeros((3, 2))}).tolist()
[[2.0, -2.0], [0.0, 0.0], [2.0, -2.0]]
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from ..errors import CircuitError, ShapeError
from ..nodes import Add, Array, Circuit, Einsum
from .interventions import source_copies
from .positions import ordered_positions, position_axis, row_flag
from .sites import one_root, replace_within, resolve_site, resolve_sites, site_label

__all__ = ["steer", "steering_vector"]

_AXES = "abcdefghijklmnopqrstuvwxyz"


def _placed(node: Circuit, label: str, vector, positions, axis) -> np.ndarray:
    """The vector as a full array of ``node``'s shape: given whole (zeros off ``positions``), one
    vector for every chosen position, or one row per chosen position (in the order given)."""
    v = np.asarray(vector)
    if v.dtype.kind not in "fiu" or v.dtype == bool:
        raise CircuitError(f"steer: vector for site {label!r} has dtype {v.dtype}; give floats")
    shape = node.shape
    dtype = np.dtype(node.dtype if str(node.dtype).startswith("float") else "float32")
    if positions is None and axis is not None:
        raise CircuitError("steer: axis= says which axis positions= index: give positions= too")
    ax = position_axis(node, axis) if len(shape) else None
    if ax is None:
        if v.shape != ():
            raise ShapeError(f"steer: site {label!r} is a scalar; give a scalar vector, got shape {list(v.shape)}")
        return v.astype(dtype)
    order = ordered_positions(slice(None) if positions is None else positions, shape[ax],
                              f"site {label!r} (its axis {ax})")
    tail = shape[ax + 1:]
    full = np.zeros(shape, dtype)
    moved = np.moveaxis(full, ax, 0)  # a view: [positions, *leading, *tail]
    if v.shape == shape:
        np.moveaxis(full, ax, 0)[order] = np.moveaxis(v, ax, 0)[order]
    elif v.shape == tail:
        moved[order] = v
    elif v.shape == (order.size,) + tail:
        lead = len(shape[:ax])
        moved[order] = v.reshape((order.size,) + (1,) * lead + tail)
    else:
        raise ShapeError(
            f"steer: vector of shape {list(v.shape)} does not fit site {label!r} of shape {list(shape)}: give "
            f"{list(tail)} (added at every chosen position), [{order.size}, {', '.join(map(str, tail))}] (one row "
            f"per chosen position) or the site's whole shape")
    return full


def steer(circuit: Circuit, site, vector, *, scale: float = 1.0, positions=None, rows=None,
          axis: int | None = None) -> Circuit:
    """``circuit`` with ``scale * vector`` added to ``site`` (a name, matcher, node or
    TransformerLens hook name; a hook standing for several nodes steers each), at ``positions``
    of its position axis (an int, a list of ints or a slice, negative from the end; None: every
    position; ``axis=`` another axis) and, for a batch, in ``rows`` only.

    ``vector``: ``[d]`` (the site's axes after the position axis: the same vector at every chosen
    position), ``[len(positions), d]`` (one per chosen position, in the order given: activation
    addition of a prompt's activations), or the site's whole shape.  The site becomes
    ``'<site>.steered'``; the vector (as a full array) and the scale are Arrays
    ``'<site>.steer_vector'`` and ``'<site>.steer_scale'``, so another scale or vector changes
    values only: nothing recompiles (``C.compile`` the steered circuit once and call it with
    ``bind``-ed values, or let ``evaluate`` find the program it compiled).

    >>> import numpy as np
    >>> from circuits import Symbol, Einsum, Scalar, evaluate
    >>> r = Einsum.from_spec('ab,->ab', Symbol((2, 2), name='x'), Scalar(1.0), name='resid')
    >>> evaluate(steer(r, 'resid', [[1.0, 0.0]], scale=3.0, positions=[-1]), {'x': np.ones((2, 2))}).tolist()
    [[1.0, 1.0], [4.0, 1.0]]
    """
    if not isinstance(scale, (int, float, np.integer, np.floating)) or isinstance(scale, bool) \
            or not np.isfinite(scale):
        raise CircuitError(f"steer: scale={scale!r}: give a finite number")
    table = {}
    for label, node in resolve_sites(circuit, site):
        full = _placed(node, label, vector, positions, axis)
        dtype = full.dtype
        vec = Array(full, name=f"{label}.steer_vector")
        amount = Array(np.asarray(scale, dtype), name=f"{label}.steer_scale")
        letters = _AXES[:len(node.shape)]
        if rows is None:
            added = Einsum.from_spec(f"{letters},->{letters}", vec, amount)
        else:
            added = Einsum.from_spec(f"{letters},,->{letters}", vec, amount, row_flag(rows, label))
        table[node] = _adding(added, f"{label}.steered")
    return replace_within(circuit, table)


def _adding(added: Circuit, name: str):
    def fn(site: Circuit) -> Circuit:
        return Add(site, added, name=name)
    return fn


def steering_vector(circuit: Circuit, site, plus: Mapping, minus: Mapping, *, inputs: Mapping | None = None,
                    dtype="float32") -> np.ndarray:
    """Activation addition's vector: ``site``'s value with the inputs ``plus`` minus its value
    with ``minus`` (mappings from input names to values, as ``patch``'s ``source``), the site's
    whole shape, from one program.  ``steer(target, site, v[:k], positions=slice(0, k))`` adds
    the first ``k`` positions' difference at the target's first ``k`` positions.

    >>> import numpy as np
    >>> from circuits import Symbol, GeneralFunction
    >>> x = Symbol((2,), name='x')
    >>> sq = GeneralFunction('exp', x, name='e')
    >>> steering_vector(sq, 'e', {'x': np.zeros(2, np.float32)}, {'x': np.full(2, -100.0, np.float32)}).tolist()
    [1.0, 1.0]
    """
    from ..backend import evaluate

    node = resolve_site(circuit, site)
    label = site_label(node, site)
    up = source_copies(circuit, [(f"site {label!r}", node)], plus, "steering_vector")[node.hash]
    down = source_copies(circuit, [(f"site {label!r}", node)], minus, "steering_vector")[node.hash]
    _, values = evaluate(one_root([up, down]), inputs, dtype=dtype, also=[up, down])
    return np.asarray(values[up]) - np.asarray(values[down])
