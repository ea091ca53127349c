"""Faithfulness curves: how much of the model's behaviour the top-k edges of a ranking keep.

For each size k the circuit keeps the k edges of largest |score| and patches the rest; its metric
is normalised as ``(m(circuit) - m(empty)) / (m(full) - m(empty))`` (1: the full model, 0: every
edge patched).  Every size is one row of one batched evaluation of ``patch_edges``' masked
program (one compilation for the whole curve).  The area under the curve is over the fraction
of edges kept (trapezoids), so it lies in [0, 1] for a monotone curve.

>>> import numpy as np
>>> from circuits.models import attn_only, random_weights
>>> from circuits.interp import discover
>>> w = random_weights(vocab=11, d_model=8, n_heads=1, head_size=4, n_layers=2, max_positions=16)
>>> loss = attn_only(w, np.array([0, 1, 2, 3, 1, 2]), unique_names=True)
>>> src = {'toks_int_var': np.array([0, 4, 5, 6, 1, 2])}
>>> curve = faithfulness(loss, src, None, discover(loss, src, method='exact'))
>>> curve.sizes[0], curve.sizes[-1], round(float(curve.values[-1]), 4), round(float(curve.values[0]), 4)
(0, 12, 1.0, 0.0)
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from ...errors import CircuitError, ShapeError
from ...nodes import Circuit
from ..checks import check_count
from ..metric import metric_node, read_metric
from ._discover import Discovery, Objective, batch_setup, clean_for
from ._graph import edges, patch_edges

__all__ = ["faithfulness", "Faithfulness"]


class Faithfulness:
    """A faithfulness curve: ``sizes`` (edges kept), ``values`` (normalised metric), ``raw``
    (the metric), ``full`` / ``empty`` (the metric with every edge kept / patched), ``area``."""

    def __init__(self, sizes, raw, full: float, empty: float, n_edges: int, label: str = ""):
        self.sizes = [int(s) for s in sizes]
        self.raw = np.asarray(raw, np.float64)
        self.full, self.empty, self.n_edges, self.label = float(full), float(empty), n_edges, label
        span = self.full - self.empty
        self.values = (self.raw - self.empty) / span if span != 0 else np.full_like(self.raw, np.nan)

    @property
    def area(self) -> float:
        """The area under the normalised curve against the fraction of edges kept."""
        x = np.asarray(self.sizes, np.float64) / max(self.n_edges, 1)
        y = self.values
        return float(np.sum((x[1:] - x[:-1]) * (y[1:] + y[:-1]) / 2))

    def smallest(self, fraction: float = 0.9) -> int | None:
        """The fewest edges whose circuit keeps at least ``fraction`` of the metric, or None."""
        for s, v in zip(self.sizes, self.values):
            if v >= fraction:
                return s
        return None

    def plot(self, ax=None, *, title: str | None = None, **kwargs):
        """The curve with matplotlib (x: edges kept, y: normalised metric), labelled in the legend
        by its method and area; several curves share one axes when ``ax`` is given back.  Returns
        the axes."""
        try:
            import matplotlib.pyplot as plt
        except ImportError:  # pragma: no cover - depends on the environment
            raise CircuitError("Faithfulness.plot needs matplotlib: pip install 'circuits[plot]'") from None
        if ax is None:
            _, ax = plt.subplots(figsize=(5, 3.5))
        ax.plot(self.sizes, self.values, label=kwargs.pop("label", f"{self.label} (area {self.area:.3f})"), **kwargs)
        ax.set_xlabel("edges kept")
        ax.set_ylabel("(m(circuit) - m(empty)) / (m(full) - m(empty))")
        ax.axhline(1.0, color="0.7", lw=0.8)
        ax.axhline(0.0, color="0.7", lw=0.8)
        ax.legend(fontsize=8)
        if title is not None or not ax.get_title():
            ax.set_title(title or "faithfulness: the circuit of the top k edges")
        return ax

    def __repr__(self):
        return (f"Faithfulness({self.label or 'curve'}: {len(self.sizes)} sizes, area {self.area:.4f}, "
                f"full {self.full:.5g}, empty {self.empty:.5g})")


def faithfulness(circuit: Circuit, source: Mapping | None, metric, scores, *, sizes=None,
                 ablation: str | None = None, inputs: Mapping | None = None, dtype="float32",
                 batch_size: int | None = None) -> Faithfulness:
    """The faithfulness curve of the ranking ``scores`` (a ``Discovery``, a dict edge -> score,
    or an array in ``edges(circuit)`` order) on ``circuit`` (see the module docstring); ``sizes``:
    the numbers of edges kept (default: every size up to 256 edges, else 64 sizes spread out);
    ``ablation`` defaults to the Discovery's own (else ``'resample'``); ``inputs`` a batch, as
    for ``discover`` (the metric averaged over its rows)."""
    g = edges(circuit)
    read_metric(metric, circuit, "faithfulness")
    batch_size = check_count(batch_size, "faithfulness", "batch_size", none=True, fix="rows of one call")
    n = len(g)
    label = ""
    if isinstance(scores, Discovery):
        if scores.circuit is not circuit and scores.circuit != circuit:
            alike = " (alike in name and type: they differ below, in inputs or weights)" \
                if scores.circuit.line() == circuit.line() else ""
            raise CircuitError(
                f"faithfulness: scores= is a Discovery of another circuit ({scores.circuit.line()}, "
                f"{len(scores)} edges) than circuit= ({circuit.line()}, {n} edges){alike}: give the circuit it "
                "was discovered on, or scores=result.as_dict() to rank this circuit's edges by that result's scores")
        ablation = ablation or scores.ablation
        label = scores.method
        vec = scores.scores
    elif isinstance(scores, Mapping):
        vec = np.zeros(n)
        for name, v in scores.items():
            vec[g.index(name)] = float(v)
    else:
        vec = np.asarray(scores, np.float64)
        if vec.shape != (n,):
            raise ShapeError(f"faithfulness: scores have shape {list(vec.shape)}; the circuit has {n} edges")
    ablation = ablation or "resample"
    if sizes is None:
        sizes = range(n + 1) if n <= 256 else np.unique(np.linspace(0, n, 64).round().astype(int))
    sizes = [check_count(s, "faithfulness", "sizes", minimum=0) for s in sizes]
    if any(s < 0 or s > n for s in sizes):
        raise CircuitError(f"faithfulness: sizes must lie between 0 and {n} (the number of edges)")
    order = sorted(range(n), key=lambda i: (-abs(vec[i]), i))
    rank = np.empty(n, np.int64)
    rank[order] = np.arange(n)
    # Row j patches every edge outside the top sizes[j]; plus the full and empty models.
    masks = np.stack([(rank >= s).astype(np.float32) for s in sizes]
                     + [np.zeros(n, np.float32), np.ones(n, np.float32)])
    circuit, source, feed = batch_setup(circuit, source, inputs, ablation)
    masked = patch_edges(circuit, None, source, ablation=ablation, mask=True)
    m = metric_node(masked, metric, clean=clean_for(circuit, metric, feed, dtype), what="faithfulness")
    values = Objective(m, feed, dtype, batch_size).values(masks)
    return Faithfulness(sizes, values[:-2], values[-2], values[-1], n, label)
