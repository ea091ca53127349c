"""Attribution patching: the linear estimate of every site's patching effect at once.

For a site with clean value ``a`` and value ``a'`` when the circuit runs on the source inputs,
patching it changes the metric by about ``sum((a' - a) * d metric / d a)``, the first-order
term of the exact effect (what ``patch`` measures).  All sites take one forward pass for their
clean and source values (one program computing both) and one forward-and-backward pass of the
clean circuit for every gradient (``circuits.grad``'s machinery, one backward for all sites).

The metric is the sum of the circuit's output by default (for the seed's loss: the total loss
over positions); ``metric=`` takes an array of the output's shape (the weighted sum
``sum(metric * output)``) or a function ``circuit -> node`` built on the output (its values
summed), e.g. ``lambda c: Index(c, (-1,))`` for the loss at the last position.

>>> import numpy as np
>>> from circuits import Symbol, Einsum
>>> x = Symbol((2,), name='x')
>>> c = Einsum.from_spec('a,a->', Einsum.from_spec('a,a->a', x, x, name='sq'), x)   # sum x^3
>>> attribute(c, ['sq'], {'x': np.array([2.0, 1.0])}, inputs={'x': np.array([1.0, 1.0])})
{'sq': 3.0}
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from ..errors import CircuitError
from ..nodes import Circuit
from ..traversal import toposort
from .interventions import source_copies
from .sites import batched_sources, one_root, resolve_sites

__all__ = ["attribute"]


def attribute(circuit: Circuit, sites, source: Mapping, *, metric=None, inputs: Mapping | None = None,
              dtype="float32", mode: str = "auto") -> dict[str, float]:
    """``{site label: estimate}``: the attribution-patching estimate
    ``sum((a_source - a_clean) * d metric / d a)`` of each site's patching effect on the metric
    (see the module docstring).  Labels are the sites' names as given (a node or matcher site is
    labelled by its node's name).  ``source`` as for ``patch``; ``inputs`` binds the circuit's
    own Symbols; ``dtype`` and ``mode`` as for ``evaluate``.

    A dataset: ``inputs`` and ``source`` values with a leading batch axis (Symbols bound to a
    batch, e.g. ``tokens_symbol(n)``; a batched source value is read through a Symbol
    ``'<input>.source'``) give each site an array of per-row estimates, batch axis first
    (``.mean(0)`` the usual reduction), from one program for the values and one for the
    gradients.

    >>> from circuits import Symbol, Add, GeneralFunction
    >>> x = Symbol((1,), name='x')
    >>> c = Add(GeneralFunction('exp', x, name='e'), x)
    >>> est = attribute(c, 'e', {'x': np.array([1.0])}, inputs={'x': np.array([0.0])})   # (e - 1) * 1
    >>> round(est['e'], 5)
    1.71828
    """
    from ..backend import evaluate, value_and_grad

    source, extra = batched_sources(circuit, source)
    if extra:
        inputs = {**(inputs or {}), **extra}
    resolved = resolve_sites(circuit, sites)
    labels = [label for label, _ in resolved]
    if len(set(labels)) != len(labels):
        raise CircuitError(f"attribute: sites {labels} name some node twice; give each site once")
    copies = source_copies(circuit, [(f"site {label!r}", n) for label, n in resolved], source, "attribute")
    nodes = [n for _, n in resolved]
    # One program computes the clean and the source values of every site.
    bundle = nodes + [copies[n.hash] for n in nodes]
    _, values = evaluate(one_root(bundle), inputs, dtype=dtype, also=bundle, mode=mode)
    clean = [np.asarray(values[n], np.float64) for n in nodes]
    patched = [np.asarray(values[copies[n.hash]], np.float64) for n in nodes]

    target, cotangent = _metric(circuit, metric)
    present = {n.hash for n in toposort(target)}
    wrt = [n for n in nodes if n.hash in present]
    grads = {}
    if wrt:
        _, g = value_and_grad(target, wrt, inputs, cotangent=cotangent, dtype=dtype, mode=mode)
        grads = {n.hash: np.asarray(g[n], np.float64) for n in wrt}
    out = {}
    for label, node, a, a2 in zip(labels, nodes, clean, patched):
        grad = grads.get(node.hash)
        per_row = a.ndim == len(node.shape) + 1  # a batch of inputs: one estimate per row
        axes = tuple(range(1, a.ndim)) if per_row else None
        if grad is None:
            out[label] = np.zeros(a.shape[0]) if per_row else 0.0
        else:
            total = np.sum((a2 - a) * grad, axis=axes)
            out[label] = total if per_row else float(total)
    return out


def _metric(circuit: Circuit, metric) -> tuple[Circuit, np.ndarray | None]:
    """The node to differentiate and the cotangent weighting its output (None: plain sum)."""
    if metric is None:
        return circuit, None
    if isinstance(metric, Circuit):
        raise CircuitError("attribute: metric= takes a function circuit -> node or an array of weights, not a node")
    if callable(metric):
        target = metric(circuit)
        if not isinstance(target, Circuit):
            raise CircuitError(f"attribute: metric(circuit) returned {type(target).__name__}; return a node built on it")
        return target, None
    weights = np.asarray(metric)
    if weights.shape != circuit.shape:
        raise CircuitError(
            f"attribute: metric weights have shape {list(weights.shape)}; the output {circuit.line()} has "
            f"shape {list(circuit.shape)}"
        )
    return circuit, weights


