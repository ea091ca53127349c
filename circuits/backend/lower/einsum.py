"""Einsum lowered straight to ``jax.lax`` with a plan made once per node.

``jnp.einsum`` re-plans at every trace (parsing, an opt_einsum path, nested jit): ~0.5 ms per
einsum, which dominates tracing a large circuit.  Here the plan (diagonals, early sums, the
pairwise contraction order from opt_einsum, each ``dot_general``'s dimension numbers and the final
transpose) is computed when the op is built, so tracing one einsum is a few lax calls.

>>> import numpy as np, jax.numpy as jnp
>>> op = einsum_op(((0, 1), (1, 2)), (2, 0), [(2, 3), (3, 4)])
>>> op(jnp.ones((2, 3)), jnp.ones((3, 4))).shape
(4, 2)
"""

from __future__ import annotations

import functools
from typing import Callable, NamedTuple, Sequence

from ...errors import EvaluationError
from ..cache.bounded import FunctionCache


def _lax():
    import jax.lax as lax

    return lax


def common_dtype(values) -> list:
    """``values`` converted to their common (promoted) dtype; unchanged when they already agree.
    (``lax`` ops, unlike ``jnp``'s, do not promote.)"""
    first = values[0].dtype
    if all(v.dtype == first for v in values):
        return list(values)
    import jax.numpy as jnp

    target = jnp.result_type(*values)
    convert = _lax().convert_element_type
    return [v if v.dtype == target else convert(v, target) for v in values]


def _diagonal_step(axes: tuple):
    """(unique axes, fn) taking the diagonal over repeated ids of one operand, or None."""
    if len(set(axes)) == len(axes):
        return None
    from ...nodes.einsum import AXIS_LETTERS

    letters = {a: AXIS_LETTERS[i] for i, a in enumerate(dict.fromkeys(axes))}
    unique = tuple(dict.fromkeys(axes))
    spec = "".join(letters[a] for a in axes) + "->" + "".join(letters[a] for a in unique)

    def diagonal(x):
        import jax.numpy as jnp

        return jnp.einsum(spec, x)

    return unique, diagonal


def _sum_step(axes: tuple, keep: set):
    """(remaining axes, fn) summing the axes not in ``keep``, or None."""
    drop = tuple(i for i, a in enumerate(axes) if a not in keep)
    if not drop:
        return None
    rest = tuple(a for a in axes if a in keep)

    def total(x):
        return _lax().reduce_sum(x, drop)

    return rest, total


def _write_diagonal_step(unique: tuple, out_axes: tuple, sizes: dict):
    """fn writing a result with axes ``unique`` onto the diagonals of ``out_axes`` (an output id
    repeated: ``ab->abaa``), or None: an einsum with one identity matrix per repeat, so it
    differentiates like any einsum."""
    if len(unique) == len(out_axes):
        return None
    letters = {a: chr(ord("a") + i) for i, a in enumerate(unique)}
    fresh = len(unique)
    seen: set = set()
    out, eyes = [], []
    for a in out_axes:
        if a in seen:
            f = chr(ord("a") + fresh) if fresh < 26 else chr(ord("A") + fresh - 26)
            fresh += 1
            out.append(f)
            eyes.append((letters[a] + f, sizes[a]))
        else:
            seen.add(a)
            out.append(letters[a])
    if fresh > 52:
        raise EvaluationError(f"an einsum writing a diagonal over {fresh} axes (at most 52)")
    spec = ",".join(["".join(letters[a] for a in unique)] + [e for e, _ in eyes]) + "->" + "".join(out)

    def write(x):
        import jax.numpy as jnp

        return jnp.einsum(spec, x, *[jnp.eye(n, dtype=x.dtype) for _, n in eyes])

    return write


def _transpose_step(axes: tuple, order: tuple):
    if axes == order:
        return None
    perm = tuple(axes.index(a) for a in order)
    return lambda x: _lax().transpose(x, perm)


def _contraction_order(terms: list[tuple], out_axes: tuple, sizes: dict) -> list[tuple[int, int]]:
    """Pairwise contraction order (opt_einsum's, indices into a shrinking list)."""
    if len(terms) == 2:
        return [(0, 1)]
    import opt_einsum

    symbol = {a: opt_einsum.get_symbol(i) for i, a in enumerate(sorted(sizes))}
    spec = ",".join("".join(symbol[a] for a in t) for t in terms) + "->" + "".join(symbol[a] for a in out_axes)
    shapes = [tuple(sizes[a] for a in t) for t in terms]
    path, _ = opt_einsum.contract_path(spec, *shapes, shapes=True, optimize="auto")
    return [tuple(p) for p in path]


def _pair_step(left: tuple, right: tuple, keep: set):
    """(result axes, fn) contracting two operands; axes in ``keep`` survive."""
    shared = [a for a in left if a in right]
    batch = tuple(a for a in shared if a in keep)
    contract = tuple(a for a in shared if a not in keep)
    left_free = tuple(a for a in left if a not in right)
    right_free = tuple(a for a in right if a not in left)
    result = batch + left_free + right_free
    if not left or not right:
        # a 0-d operand: a product with broadcasting, axes of the other operand unchanged
        return (left or right), lambda x, y: _mul(x, y)
    if not contract and (set(left) <= set(right) or set(right) <= set(left)):
        # nothing summed and one side's axes among the other's (a mask, a scale, a LayerNorm's
        # per-row factor): a broadcast product in the larger side's layout.  A dot_general here
        # would put the shared axes first and need a transpose of the whole result after it.
        return _broadcast_product(left, right)
    dims = (
        (tuple(left.index(a) for a in contract), tuple(right.index(a) for a in contract)),
        (tuple(left.index(a) for a in batch), tuple(right.index(a) for a in batch)),
    )

    def dot(x, y):
        x, y = common_dtype((x, y))
        return _lax().dot_general(x, y, dims)

    return result, dot


def _pair_result(left: tuple, right: tuple, keep: set) -> tuple:
    """The axes ``_pair_step`` leaves, in its order: batch axes (in ``left``'s order), then
    ``left``'s free axes, then ``right``'s."""
    batch = tuple(a for a in left if a in right and a in keep)
    return batch + tuple(a for a in left if a not in right) + tuple(a for a in right if a not in left)


def _order_score(axes: tuple, out_axes: tuple) -> int:
    """How many leading axes of ``axes`` are already where the output wants them: the length of
    the common prefix of ``axes`` and ``axes`` sorted by output position (axes the output does
    not keep go last)."""
    rank = {a: i for i, a in enumerate(out_axes)}
    target = sorted(axes, key=lambda a: rank.get(a, len(out_axes)))
    n = 0
    for x, y in zip(axes, target):
        if x != y:
            break
        n += 1
    return n


def _swap_better(left: tuple, right: tuple, keep: set, out_axes: tuple) -> bool:
    """Contract ``right`` with ``left`` rather than ``left`` with ``right``?  ``dot_general`` puts
    batch axes first, then the left side's free axes, then the right side's: the order whose
    result starts with more axes in the output's order leaves XLA a cheaper (or no) transpose.
    A head projection ``'qd,Hcd->Hqc'`` in the given order gives ``[q, H, c]``, whose head axis
    must move to the front through a copy of the whole result; swapped it gives ``[H, c, q]``,
    whose last two axes XLA folds into the next contraction (how a hand-written
    ``einsum('sd,hcd->hsc')`` lowers).  Ties keep the given order."""
    if not left or not right or set(left) <= set(right) or set(right) <= set(left):
        return False  # a product with a 0-d side or a broadcast product: layout of the larger side
    given = _order_score(_pair_result(left, right, keep), out_axes)
    swapped = _order_score(_pair_result(right, left, keep), out_axes)
    return swapped > given


def _broadcast_product(left: tuple, right: tuple):
    """(result axes, fn): ``x * y`` where one side's axes are all among the other's."""
    big_is_left = set(right) <= set(left) and (len(left) >= len(right))
    big, small = (left, right) if big_is_left else (right, left)
    order = tuple(sorted(small, key=big.index))  # broadcast_in_dim wants increasing dimensions
    perm = tuple(small.index(a) for a in order)
    dims = tuple(big.index(a) for a in order)

    def product(x, y):
        x, y = common_dtype((x, y))
        b, s = (x, y) if big_is_left else (y, x)
        lax = _lax()
        if perm != tuple(range(len(perm))):
            s = lax.transpose(s, perm)
        if s.shape != b.shape:
            s = lax.broadcast_in_dim(s, b.shape, dims)
        return lax.mul(x, s) if big_is_left else lax.mul(s, y)

    return big, product


def _mul(x, y):
    # one operand is 0-d: broadcast it explicitly (lax.mul, unlike jnp, does not broadcast)
    x, y = common_dtype((x, y))
    lax = _lax()
    if x.shape != y.shape:
        if x.ndim == 0:
            x = lax.broadcast(x, y.shape)
        else:
            y = lax.broadcast(y, x.shape)
    return lax.mul(x, y)


class EinsumStep(NamedTuple):
    """One step of an einsum plan, by axis ids: ``kind`` is ``'diagonal'``, ``'sum'``, ``'dot'``
    (a ``dot_general``: ``operands`` are the two sides, ``contract`` the summed shared axes),
    ``'mul'`` (a broadcast product: one side's axes among the other's, nothing summed),
    ``'transpose'`` or ``'write_diagonal'`` (an output id repeated: the result placed on the
    diagonal, zero elsewhere); ``result`` the axes after it."""

    kind: str
    operands: tuple
    result: tuple
    contract: tuple = ()


def _plan(in_axes, out_axes: tuple, shapes):
    """The plan of ``einsum_op``: per-operand preparation, pairwise contractions, the final
    transpose, and the same as ``EinsumStep`` records (which ``einsum_steps`` returns)."""
    sizes: dict = {}
    for t, shape in zip(in_axes, shapes):
        sizes.update(zip(t, shape))
    if not in_axes:
        raise EvaluationError("einsum_op needs at least one operand (zero operands is the scalar 1)")
    written = out_axes
    out_axes = tuple(dict.fromkeys(out_axes))  # an id repeated in the output: its diagonal, last
    steps: list[EinsumStep] = []
    # Per operand: diagonals, then sums of axes no one else needs.
    prep: list[list[Callable]] = []
    terms: list[tuple] = []
    for k, t in enumerate(in_axes):
        fns = []
        step = _diagonal_step(t)
        if step:
            steps.append(EinsumStep("diagonal", (t,), step[0]))
            t, fn = step
            fns.append(fn)
        others = {a for j, u in enumerate(in_axes) if j != k for a in u} | set(out_axes)
        step = _sum_step(t, others)
        if step:
            steps.append(EinsumStep("sum", (t,), step[0]))
            t, fn = step
            fns.append(fn)
        prep.append(fns)
        terms.append(t)
    # Pairwise contractions in opt_einsum's order; each result goes to the end of the list.
    pairs = []
    live = list(range(len(terms)))
    axes_of = list(terms)
    if len(terms) > 1:
        for i, j in _contraction_order(terms, out_axes, sizes):
            a, b = live[i], live[j]
            rest = [live[k] for k in range(len(live)) if k not in (i, j)]
            keep = set(out_axes) | {x for r in rest for x in axes_of[r]}
            # axes only one side has and nobody needs later are summed before the product
            pre = []
            for side, other in ((a, b), (b, a)):
                step = _sum_step(axes_of[side], keep | set(axes_of[other]))
                if step:
                    steps.append(EinsumStep("sum", (axes_of[side],), step[0]))
                    axes_of[side], fn = step
                    pre.append((side, fn))
                else:
                    pre.append((side, None))
            if _swap_better(axes_of[a], axes_of[b], keep, out_axes):
                a, b = b, a
                pre.reverse()
            left, right = axes_of[a], axes_of[b]
            result, fn = _pair_step(left, right, keep)
            contract = tuple(x for x in left if x in right and x not in keep)
            broadcast = not contract and (set(left) <= set(right) or set(right) <= set(left))
            if left and right and not broadcast:
                steps.append(EinsumStep("dot", (left, right), result, contract))
            else:
                steps.append(EinsumStep("mul", (left, right), result))
            axes_of.append(result)
            new = len(axes_of) - 1
            pairs.append((a, b, new, pre, fn))
            live = rest + [new]
    final = axes_of[live[0]]
    last = _transpose_step(final, out_axes)
    if last is not None:
        steps.append(EinsumStep("transpose", (final,), tuple(out_axes)))
    write = _write_diagonal_step(out_axes, written, sizes)
    if write is not None:
        steps.append(EinsumStep("write_diagonal", (out_axes,), written))
        last = write if last is None else (lambda x, t=last: write(t(x)))
    return prep, pairs, last, live[0], tuple(steps), sizes


@functools.lru_cache(maxsize=4096)
def einsum_steps(in_axes: tuple, out_axes: tuple, shapes: tuple) -> tuple[tuple, dict]:
    """``(steps, sizes)``: the plan ``einsum_op`` follows for operands of ``shapes``, as
    ``EinsumStep`` records, and each axis id's size (for cost models: the backend runs exactly
    these steps, in this order).

    >>> steps, sizes = einsum_steps(((0, 1), (1, 2)), (2, 0), ((2, 3), (3, 4)))
    >>> [(s.kind, s.operands, s.result) for s in steps], sizes
    ([('dot', ((1, 2), (0, 1)), (2, 0))], {0: 2, 1: 3, 2: 4})

    (The operands swapped so that the product comes out in the output's order: no transpose.)
    """
    *_, steps, sizes = _plan([tuple(t) for t in in_axes], tuple(out_axes), shapes)
    return steps, sizes


FunctionCache("einsum plans", "kernels", einsum_steps)


def einsum_op(in_axes: Sequence[tuple], out_axes: tuple, shapes: Sequence[tuple]) -> Callable:
    """``op(*operands)`` computing the einsum ``in_axes -> out_axes`` for operands of ``shapes``."""
    in_axes = [tuple(t) for t in in_axes]
    out_axes = tuple(out_axes)
    prep, pairs, last, slot, _, _ = _plan(in_axes, out_axes, shapes)

    def einsum(*xs):
        values = list(xs)
        for k, fns in enumerate(prep):
            for fn in fns:
                values[k] = fn(values[k])
        for a, b, new, pre, fn in pairs:
            for side, pre_fn in pre:
                if pre_fn is not None:
                    values[side] = pre_fn(values[side])
            values.append(fn(values[a], values[b]))
            values[a] = values[b] = None
        out = values[slot]
        return out if last is None else last(out)

    return einsum
