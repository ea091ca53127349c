"""``metric=``: the scalar that ``attribute``, ``discover`` and ``faithfulness`` measure, read in one place.

A metric is read from a circuit's output ``out``:

- ``None``: the sum of the output's values;
- weights of the output's shape (finite numbers): ``sum(weights * out)``, e.g. a logit difference;
- a function ``out -> node`` built on the output (its values summed), e.g.
  ``lambda out: Index(out, (-1,))`` for the last position;
- ``'kl'``: the KL divergence of the output distribution from the clean one, averaged over
  positions (ACDC's metric).  The output must be logits ``[..., vocab]``: its last axis an axis of
  a weight (the unembedding) carried up to it, not a per-position loss.  Its gradient at the clean
  run is zero (the divergence is smallest there): ``attribute``, whose estimates are that gradient
  times the activations' differences, refuses it (``discover(method='eap')`` takes it and scores
  every edge 0, as it does any metric smallest at the clean run; its other methods do not).

``read_metric`` checks a spec against an output and says which of these it is (every refusal
names the caller and the fix); ``metric_node`` builds discovery's scalar node from it.

>>> import numpy as np
>>> from circuits import Array
>>> out = Array(np.array([1.0, 2.0, 4.0], np.float32), name='out')
>>> read_metric(np.array([1.0, 0.0, -1.0]), out, 'attribute').kind
'weights'
>>> float(metric_node(out, np.array([1.0, 0.0, -1.0])).evaluate())
-3.0
>>> read_metric(np.array([1.0, np.nan, 0.0]), out, 'discover')
Traceback (most recent call last):
  ...
circuits.errors.CircuitError: discover: the metric weights hold NaN or inf (at [1]): every score would be NaN; give finite weights
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..errors import CircuitError, ShapeError
from ..nodes import Add, Array, Circuit, Einsum, GeneralFunction, Index, Rearrange, Scalar, Tag
from ..traversal import toposort

__all__ = ["Metric", "read_metric", "metric_node", "reads_a_weight_axis"]

NAMED = ("kl",)
_AXES = "abcdefghijklmnopqrstuvwxyz"


class Metric(NamedTuple):
    """A checked ``metric=``: ``kind`` is ``'sum'``, ``'weights'`` (``weights`` the array, float),
    ``'function'`` (``node`` what the function returned on the output) or ``'kl'``."""

    kind: str
    weights: np.ndarray | None = None
    node: Circuit | None = None


def read_metric(metric, out: Circuit, what: str, *, gradient_at_clean: bool = False) -> Metric:
    """``metric`` checked against the output ``out`` (see the module docstring); ``what`` (the
    caller's name) opens every error; ``gradient_at_clean``: the caller takes one gradient at the
    clean run, where ``'kl'``'s is zero (refused)."""
    if metric is None:
        return Metric("sum")
    if isinstance(metric, str):
        if metric not in NAMED:
            raise CircuitError(f"{what}: metric={metric!r}; the named metric is 'kl', otherwise give weights of the "
                               "output's shape, a function output -> node, or None (the output's sum)")
        if out.ndim < 1 or not reads_a_weight_axis(out):
            raise CircuitError(
                f"{what}: metric='kl' needs logits [..., vocab]; the output {out.line()} has shape {list(out.shape)}, "
                "whose last axis is not a vocabulary (an axis of the unembedding): give the logits circuit "
                "(e.g. attn_only(..., logits=True)), or weights or a function for another output")
        if gradient_at_clean:
            raise CircuitError(
                f"{what}: metric='kl' has a zero gradient at the clean run (the divergence is smallest there), so "
                "every first-order estimate would be 0; use discover(method='eap-ig' | 'eap-ig-mask' | 'exact' | "
                "'acdc') or patch for the KL divergence, or weights (e.g. a logit difference) here")
        return Metric("kl")
    if isinstance(metric, Circuit):
        raise CircuitError(f"{what}: metric= takes a function output -> node, weights of the output's shape, 'kl' "
                           f"or None, not a node ({metric.line()}): write lambda out: <a node built on out>")
    if callable(metric):
        node = metric(out)
        if not isinstance(node, Circuit):
            raise CircuitError(f"{what}: metric(output) returned {type(node).__name__}; return a node built on "
                               "the output it is given")
        if not any(n.hash == out.hash for n in toposort(node, stop=lambda n: n.hash == out.hash)):
            raise CircuitError(f"{what}: metric(output) returned {node.line()}, which does not read the output "
                               f"{out.line()}: build the metric on the node the function is given")
        return Metric("function", node=node)
    try:
        weights = np.asarray(metric)
    except (TypeError, ValueError):
        weights = np.asarray(None)
    if weights.dtype.kind not in "biuf":
        raise CircuitError(f"{what}: metric={_short(metric)} is not numbers; give weights of the output's shape "
                           f"{list(out.shape)}, a function output -> node, 'kl' or None")
    if weights.shape != out.shape:
        raise ShapeError(f"{what}: metric weights have shape {list(weights.shape)}; the output {out.line()} has "
                         f"shape {list(out.shape)}: give one weight per output value")
    if weights.dtype not in (np.float32, np.float64):
        weights = weights.astype(np.float32)
    bad = ~np.isfinite(weights)
    if bad.any():
        at = [int(i) for i in np.argwhere(bad)[0]]
        raise CircuitError(f"{what}: the metric weights hold NaN or inf (at {at}): every score would be NaN; "
                           "give finite weights")
    return Metric("weights", weights=weights)


def metric_node(out: Circuit, metric, *, clean=None, what: str = "discover") -> Circuit:
    """The scalar node ``m`` of the metric spec on output ``out`` (see the module docstring);
    ``clean``: what ``'kl'`` compares with: the clean logits' value, or a node (e.g. a Symbol)
    holding the clean log-probabilities."""
    spec = read_metric(metric, out, what)
    if spec.kind == "sum":
        return Einsum.from_spec(_AXES[: out.ndim] + "->", out, name="metric")
    if spec.kind == "function":
        node = spec.node
        return Einsum.from_spec(_AXES[: node.ndim] + "->", node, name="metric") if node.ndim else node
    ax = _AXES[: out.ndim]
    if spec.kind == "weights":
        return Einsum.from_spec(f"{ax},{ax}->", out, Array(spec.weights, name="metric.weights"), name="metric")
    if clean is None:
        raise CircuitError(f"{what}: metric='kl' needs the clean logits to compare with")
    if not isinstance(clean, Circuit):
        clean = np.asarray(clean)
        keep = clean.dtype if clean.dtype == np.float64 else np.float32
        clean = Array(log_softmax(clean.astype(np.float64)).astype(keep), name="metric.clean_log_probs")
    n = int(np.prod(out.shape[:-1]))
    p = GeneralFunction("exp", clean, name="metric.clean_probs")
    logp = GeneralFunction("log_softmax", out, name="metric.log_probs")
    gap = Add(clean, Einsum.from_spec(f"{ax},->{ax}", logp, Scalar(-1.0)), name="metric.log_ratio")
    return Einsum.from_spec(f"{ax},{ax},->", p, gap, Scalar(1.0 / n), name="metric.kl")


def log_softmax(x: np.ndarray) -> np.ndarray:
    """``log_softmax`` over the last axis, in numpy."""
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def reads_a_weight_axis(out: Circuit) -> bool:
    """Whether ``out``'s last axis is brought in by a weight: an Einsum of activations in which
    that axis belongs to weight operands only (Arrays, or views of one: the unembedding), carried up to ``out``
    through Einsums that keep it, Adds, Tags, Indexes and Rearranges that keep it, and functions
    that keep their argument's shape (elementwise, softmax-like).  So the vocabulary axis of
    logits is; a per-position loss's last axis (positions, after a gather of log-probabilities)
    is not, nor the positions axis, which the embeddings bring in through an Add.

    >>> import numpy as np
    >>> from circuits import Array, Symbol, Einsum, Index
    >>> x = Symbol((3, 4), name='resid')
    >>> logits = Einsum.from_spec('sd,vd->sv', x, Array(np.ones((5, 4), np.float32), name='unembed'))
    >>> reads_a_weight_axis(logits), reads_a_weight_axis(Einsum.from_spec('sv->s', logits))
    (True, False)
    >>> reads_a_weight_axis(Index(logits, (slice(None), 0)))   # one token's logit at each position
    False
    """
    stack, seen = [(out, out.ndim - 1)], set()
    while stack:
        node, axis = stack.pop()
        if (node.hash, axis) in seen:
            continue
        seen.add((node.hash, axis))
        if isinstance(node, Einsum):
            letter = node.out_axes[axis]
            readers = [(c, list(axes).index(letter)) for c, axes in zip(node.children, node.in_axes) if letter in axes]
            if readers and all(_is_weight(c) for c, _ in readers):
                # a weight's axis put on activations (not a product of constants: a mask's sign)
                if any(not _is_weight(c) and not isinstance(c, Scalar) for c in node.children):
                    return True
                continue
            stack += [(c, a) for c, a in readers if not _is_weight(c)]
        elif isinstance(node, Add):
            stack += [(c, axis - (node.ndim - c.ndim)) for c in node.children
                      if axis - (node.ndim - c.ndim) >= 0 and c.shape[axis - (node.ndim - c.ndim)] == node.shape[axis]]
        elif isinstance(node, Tag):
            stack.append((node.children[0], axis))
        elif isinstance(node, GeneralFunction):
            if node.function.core_ndim in (0, 1):
                stack += [(c, axis - (node.ndim - c.ndim)) for c in node.children
                          if c.ndim <= node.ndim and axis - (node.ndim - c.ndim) >= 0
                          and c.shape[axis - (node.ndim - c.ndim)] == node.shape[axis]]
        elif isinstance(node, Index):
            child_axis = _index_source_axis(node, axis)
            if child_axis is not None:
                stack.append((node.children[0], child_axis))
        elif isinstance(node, Rearrange):
            group = node.out_groups[axis]
            if len(group) == 1:
                at = [j for j, g in enumerate(node.in_groups) if g == group]
                if at:
                    stack.append((node.children[0], at[0]))
    return False


def _is_weight(node: Circuit) -> bool:
    """An Array, or an Index, Rearrange or Tag of one (a transposed or sliced weight)."""
    while isinstance(node, (Index, Rearrange, Tag)):
        node = node.children[0]
    return isinstance(node, Array)


def _index_source_axis(node: Index, axis: int) -> int | None:
    """The child's axis that ``node``'s output axis ``axis`` reads (None: an int index drops it)."""
    kept = [j for j, entry in enumerate(node.index) if not isinstance(entry, (int, np.integer))]
    kept += list(range(len(node.index), node.children[0].ndim))
    if axis >= len(kept):
        return None
    return kept[axis]


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
