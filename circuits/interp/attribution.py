"""Attribution patching: the linear estimate of every site's patching effect at once.

For a site with clean value ``a`` and value ``a'`` when the circuit runs on the source inputs,
patching it changes the metric by about ``sum((a' - a) * d metric / d a)``, the first-order
term of the exact effect (what ``patch`` measures).  All sites take one forward pass for their
clean and source values (one program computing both) and one forward-and-backward pass of the
clean circuit for every gradient (``circuits.grad``'s machinery, one backward for all sites).

The metric is the sum of the circuit's output by default (for the seed's loss: the total loss
over positions); ``metric=`` takes an array of the output's shape (the weighted sum
``sum(metric * output)``) or a function ``circuit -> node`` built on the output (its values
summed), e.g. ``lambda c: Index(c, (-1,))`` for the loss at the last position, read as
``discover`` reads it (``circuits.interp.metric``; ``'kl'``, whose gradient at the clean run is
zero, is refused).

>>> import numpy as np
>>> from circuits import Symbol, Einsum
>>> x = Symbol((2,), name='x')
>>> c = Einsum.from_spec('a,a->', Einsum.from_spec('a,a->a', x, x, name='sq'), x)   # sum x^3
>>> attribute(c, ['sq'], {'x': np.array([2.0, 1.0])}, inputs={'x': np.array([1.0, 1.0])})
{'sq': 3.0}
"""

from __future__ import annotations

import collections
import threading
import weakref
from typing import Mapping

import numpy as np

from ..errors import CircuitError
from ..hashing import content_hash
from ..nodes import Circuit
from ..traversal import toposort
from .interventions import source_copies
from .metric import Metric, read_metric
from .positions import position_mask, row_numbers
from .sites import batched_sources, paired_root, resolve_sites

__all__ = ["attribute"]


def attribute(circuit: Circuit, sites, source: Mapping, *, metric=None, inputs: Mapping | None = None,
              positions=None, rows=None, axis: int | None = None, dtype="float32", mode: str = "auto"
              ) -> dict[str, float]:
    """``{site label: estimate}``: the attribution-patching estimate
    ``sum((a_source - a_clean) * d metric / d a)`` of each site's patching effect on the metric
    (see the module docstring).  Labels are the sites' names as given (a node or matcher site is
    labelled by its node's name).  ``source`` as for ``patch``; ``inputs`` binds the circuit's
    own Symbols; ``dtype`` and ``mode`` as for ``evaluate``.

    A dataset: ``inputs`` and ``source`` values with a leading batch axis (Symbols bound to a
    batch, e.g. ``tokens_symbol(n)``; a batched source value is read through a Symbol
    ``'<input>.source'``) give each site an array of per-row estimates, batch axis first
    (``.mean(0)`` the usual reduction).  Tiered as ``evaluate`` is: the first calls run op by
    op over the rows (the values through ``evaluate_batched``, the per-row gradients through
    ``grad``'s reverse sweep mapped over the rows, each from the kernels and values every
    evaluation shares: after a first attribution, a variant's compiles nothing), and the
    ``jit_after``-th call of one attribution compiles one program for values, gradients and
    estimates, in the background.

    ``positions`` (an int, a list of ints or a slice of each site's position axis; ``axis=``
    another) estimates patching only those entries: the sum runs over them alone; ``rows`` (a
    dataset) gives the rows not chosen an estimate of 0, as a patch of the chosen rows would
    leave them (``circuits.interp.positions``).

    >>> from circuits import Symbol, Add, GeneralFunction
    >>> x = Symbol((1,), name='x')
    >>> c = Add(GeneralFunction('exp', x, name='e'), x)
    >>> est = attribute(c, 'e', {'x': np.array([1.0])}, inputs={'x': np.array([0.0])})   # (e - 1) * 1
    >>> round(est['e'], 5)
    1.71828
    """
    from ..backend import evaluate, has_batch_axis, value_and_grad

    spec = read_metric(metric, circuit, "attribute", gradient_at_clean=True)
    if rows is not None:
        chosen_rows = row_numbers(rows)
    given = source
    source, extra = batched_sources(circuit, source)
    if extra:
        inputs = {**(inputs or {}), **extra}
    if extra or has_batch_axis(circuit, inputs):
        out = _over_rows(circuit, sites, source, given, spec, metric, inputs, extra, positions, axis, dtype, mode)
        if rows is not None:
            for label, value in out.items():
                keep = np.zeros(len(value), bool)
                keep[chosen_rows[chosen_rows < len(value)]] = True
                out[label] = np.where(keep, value, 0.0)
        return out
    if rows is not None and any(r != 0 for r in chosen_rows):
        raise CircuitError(f"attribute: rows={rows!r} but the inputs are one row (row 0), not a batch")
    labels, nodes, copies = _sites_and_copies(circuit, sites, source)
    # One program computes the clean and the source values of every site.
    bundle = nodes + [copies[n.hash] for n in nodes]
    _, values = evaluate(paired_root(bundle), inputs, dtype=dtype, also=bundle, mode=mode)
    clean = [np.asarray(values[n], np.float64) for n in nodes]
    patched = [np.asarray(values[copies[n.hash]], np.float64) for n in nodes]

    target, cotangent = _target(circuit, spec)
    present = None if target is circuit else {n.hash for n in toposort(target)}  # every site is in circuit
    wrt = [n for n in nodes if present is None or n.hash in present]
    grads = {}
    if wrt:
        _, g = value_and_grad(target, wrt, inputs, cotangent=cotangent, dtype=dtype, mode=mode)
        grads = {n.hash: np.asarray(g[n], np.float64) for n in wrt}
    out = {}
    for label, node, a, a2 in zip(labels, nodes, clean, patched):
        grad = grads.get(node.hash)
        where = _mask(node, label, positions, axis)
        out[label] = 0.0 if grad is None else float(np.sum((a2 - a) * grad * where))
    return out


def _over_rows(circuit, sites, source, given, spec, metric, inputs, extra, positions, axis, dtype, mode) -> dict:
    """A dataset's estimates (``{label: [rows]}``), tiered (``backend.op_tier``): op by op
    (``_rows_by_ops``) in ``'ops'``, and in ``'auto'`` until the program of ``_Plan`` for this
    attribution is compiled (in the background, at its ``jit_after``-th run); that program in
    ``'jit'`` and from then on."""
    from ..backend import check_mode, float_dtype, op_tier

    key = _plan_key(sites, given, source, metric, dtype)
    plans: list = []

    def plan():
        if not plans:
            plans.append(_plan_for(circuit, sites, source, spec, dtype, key))
        return plans[0]

    def whole():
        p = plan()
        return p(inputs, next(iter(extra.values())).shape[0] if extra else None, spec.weights,
                 p.masks(positions, axis))

    tier_key = None
    if key is not None:
        pos_key = None if positions is None else (repr(positions), axis)
        tier_key = ("attribute-rows", circuit.hash, key, pos_key, _layout(inputs), float_dtype(dtype))
    found = op_tier(tier_key, mode, _Size(plan),
                    lambda: _rows_by_ops(circuit, sites, source, spec, inputs, positions, axis, dtype,
                                         check_mode(mode)),
                    lambda: whole() is not None)
    return whole() if found is None else found


def _layout(inputs) -> tuple | None:
    """The names and shapes of ``inputs`` (what a compiled program over them is keyed by)."""
    if not isinstance(inputs, Mapping):
        return None
    return tuple(sorted((k if isinstance(k, str) else k.hash.hex(), tuple(np.shape(v))) for k, v in inputs.items()))


class _Size:
    """The size of ``plan()``'s program (``len``), lowered only when the tier policy asks."""

    def __init__(self, plan):
        self.plan = plan

    def __len__(self):
        return len(self.plan().lowered.program)


def _rows_by_ops(circuit, sites, source, spec, inputs, positions, axis, dtype, mode: str = "ops") -> dict:
    """A dataset's estimates op by op: the sites' clean and source values over the rows
    (``evaluate_batched``, op by op: the clean run's values are read from the value cache), the
    metric's per-row gradients at the clean sites (``value_and_grad`` over the rows, op by op),
    the estimates summed in float64 on the host; numpy computes a step where ``mode`` says so
    (``steps_as``: a first call compiles nothing)."""
    from ..backend import evaluate_batched, steps_as, value_and_grad

    labels, nodes, copies = _sites_and_copies(circuit, sites, source)
    target, cotangent = _target(circuit, spec)
    bundle = nodes + [copies[n.hash] for n in nodes]
    present = {n.hash for n in toposort(target)}
    wrt = [n for n in nodes if n.hash in present]
    grads = {}
    with steps_as(mode):
        _, values = evaluate_batched(paired_root(bundle), inputs, dtype=dtype, also=bundle, mode="ops")
        if wrt:
            _, g = value_and_grad(target, wrt, inputs, cotangent=cotangent, dtype=dtype, mode="ops")
            grads = {n.hash: np.asarray(g[n], np.float64) for n in wrt}
    out = {}
    for label, node in zip(labels, nodes):
        a = np.asarray(values[node], np.float64)
        grad = grads.get(node.hash)
        if grad is None:
            out[label] = np.zeros(len(a))
            continue
        a2 = np.asarray(values[copies[node.hash]], np.float64)
        terms = (a2 - a) * grad * _mask(node, label, positions, axis)
        out[label] = terms.reshape(len(a), -1).sum(1)
    return out


def _mask(node: Circuit, label: str, positions, axis) -> np.ndarray | float:
    """1 at the entries ``positions`` selects on ``node``'s position axis (broadcastable to it),
    0 elsewhere; 1.0 for the whole site."""
    if positions is None:
        if axis is not None:
            raise CircuitError("attribute: axis= says which axis positions= index: give positions= too")
        return 1.0
    mask, ax = position_mask(node, positions, label, axis)
    shape = [1] * len(node.shape)
    shape[ax] = node.shape[ax]
    return np.asarray(mask.value, np.float64).reshape(shape)


# ---------------------------------------------------------------------------- a dataset: one program
# A dataset's attribution is one compiled program: the clean forward and backward and the source
# values of the sites, the estimates summed in it (``[rows, sites]`` comes back).  Its plan (sites
# resolved, source copies built, the program laid out) is kept per live circuit, so a warm call
# binds the inputs and runs.
_PLANS: "collections.OrderedDict[tuple, tuple]" = collections.OrderedDict()
_PLANS_SIZE = 16
_plans_lock = threading.RLock()  # reentrant: a weak reference callback may run while it is held


def _sites_and_copies(circuit: Circuit, sites, source) -> tuple[list, list, dict]:
    """The sites' labels and nodes (each site once) and ``{node hash: its copy computed from
    source}``."""
    resolved = resolve_sites(circuit, sites)
    labels = [label for label, _ in resolved]
    if len(set(labels)) != len(labels):
        raise CircuitError(f"attribute: sites {labels} name some node twice; give each site once")
    copies = source_copies(circuit, [(f"site {label!r}", n) for label, n in resolved], source, "attribute")
    return labels, [n for _, n in resolved], copies


def _plan_key(sites, given, source, metric, dtype):
    """What a dataset's plan depends on besides the circuit (None: not kept; a matcher site, a
    metric function, a node as a source value).  ``given``: the source as the caller gave it;
    ``source``: after ``batched_sources``.  A source value with a batch axis is bound at each call
    (its shape is the key), one without is built into the plan's copies (its content is); the
    metric's weights are passed at each call (their shape is the key)."""
    items = list(sites) if isinstance(sites, (list, tuple)) else [sites]
    site_key = []
    for s in items:
        if isinstance(s, str):
            site_key.append(s)
        elif isinstance(s, Circuit):
            site_key.append(s.hash)
        else:
            return None
    if not isinstance(given, Mapping) or (metric is not None and not isinstance(metric, np.ndarray)):
        return None
    source_key = []
    for k, v in given.items():
        shape = getattr(v, "shape", None)
        if isinstance(v, Circuit) or shape is None or not isinstance(k, (str, Circuit)):
            return None
        name = k if isinstance(k, str) else k.hash
        if source[k] is v:  # no batch axis: built into the plan
            source_key.append((name, content_hash(v)))
        else:
            source_key.append((name, tuple(shape[1:]), str(v.dtype)))
    metric_key = None if metric is None else metric.shape
    return (tuple(site_key), tuple(source_key), metric_key, str(dtype))


def _plan_for(circuit: Circuit, sites, source, spec: Metric, dtype, key) -> "_Plan":
    if key is None:
        return _Plan(circuit, sites, source, spec, dtype)
    full = (id(circuit), key)
    with _plans_lock:
        found = _PLANS.get(full)
        if found is not None and found[0]() is circuit:
            _PLANS.move_to_end(full)
            return found[1]
    plan = _Plan(circuit, sites, source, spec, dtype)
    with _plans_lock:
        _PLANS[full] = (weakref.ref(circuit, lambda ref, k=full: _drop_plan(k, ref)), plan)
        while len(_PLANS) > _PLANS_SIZE:
            _PLANS.popitem(last=False)
    return plan


def _drop_plan(key, ref) -> None:
    """A circuit died: its plans go (they hold its weights)."""
    if _PLANS is None:  # interpreter shutdown
        return
    with _plans_lock:
        found = _PLANS.get(key)
        if found is not None and found[0] is ref:
            del _PLANS[key]


class _Plan:
    """``plan(inputs) -> {label: per-row estimates}`` for inputs with a leading batch axis: one
    compiled program computes the clean values, the gradients and the source values of the sites
    (a ``vmap`` over the rows) and sums each site's estimate in it.  Holds the program detached
    (its leaves, no interior node)."""

    def __init__(self, circuit: Circuit, sites, source, spec: Metric, dtype):
        from ..backend import Lowered, float_dtype

        self.fdt = float_dtype(dtype)
        labels, nodes, copies = _sites_and_copies(circuit, sites, source)
        target, cotangent = _target(circuit, spec)
        self.weighted = cotangent is not None
        present = {n.hash for n in toposort(target)}
        self.labels = labels
        self.nodes = nodes
        # Sites the metric does not read have no gradient: their estimates are zeros.
        self.live = [i for i, n in enumerate(nodes) if n.hash in present]
        live = [nodes[i] for i in self.live]
        lowered = Lowered([target, *live, *(copies[n.hash] for n in live)], self.fdt)
        program = lowered.program
        self.slots = tuple(program.slot_of[n.hash] for n in live)
        self.shapes = tuple(n.shape for n in live)
        lowered.program = program.detached()
        self.lowered = lowered

    def _make(self, axes: tuple):
        import jax
        import jax.numpy as jnp

        skeleton = self.lowered.program.skeleton()
        slots, shapes, fdt = self.slots, self.shapes, self.fdt
        k = len(slots)
        weighted = self.weighted

        def one(args, cotangent, masks):
            def metric(deltas):
                outs = skeleton.run(args, deltas=dict(zip(slots, deltas)))
                total = jnp.sum(outs[0] * cotangent) if weighted else jnp.sum(outs[0])
                return total, outs[1:]

            zeros = [jnp.zeros(shape, fdt) for shape in shapes]
            grads, values = jax.grad(metric, has_aux=True)(zeros)
            clean, patched = values[:k], values[k:]
            return jnp.stack([jnp.sum((p - c) * g * m) for c, p, g, m in zip(clean, patched, grads, masks)])

        return jax.vmap(one, in_axes=(list(axes), None, None))

    def masks(self, positions, axis) -> list:
        """Per live site, the mask ``positions`` makes (a scalar 1 for the whole site)."""
        return [np.asarray(_mask(self.nodes[i], self.labels[i], positions, axis), self.fdt) for i in self.live]

    def __call__(self, inputs, rows: int | None, weights: np.ndarray | None, masks: list) -> dict:
        """The estimates for ``inputs`` (``rows``: the batch size when only the sources carry it)
        and the metric's ``weights`` (None: the plain sum)."""
        from ..backend import precision

        args, axes = self.lowered.bind_batched(inputs)
        rows = next((a.shape[0] for a, axis in zip(args, axes) if axis is not None), rows)
        out = {label: np.zeros(rows) for label in self.labels}
        if not self.live:
            return out
        axes = tuple(axes)
        with precision(self.fdt):
            fn = self.lowered.cached(("attribution", self.slots, self.weighted, axes), lambda: self._make(axes))
            cotangent = None if weights is None else np.asarray(weights, self.fdt)
            estimates = np.asarray(fn(args, cotangent, masks), np.float64)
        for j, i in enumerate(self.live):
            out[self.labels[i]] = estimates[:, j]
        return out


def _target(circuit: Circuit, spec: Metric) -> tuple[Circuit, np.ndarray | None]:
    """The node to differentiate and the cotangent weighting its output (None: plain sum)."""
    if spec.kind == "function":
        return spec.node, None
    return circuit, spec.weights
