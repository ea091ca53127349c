"""Every edge's first-order score from one compiled program: one forward and one backward pass.

An edge ``s -> d`` enters its destination as the term ``sender + w * (patched sender - sender)``
of the residual sum ``d`` reads, so ``dm/dw = <patched s - s, dm/d(the sum d reads)>``: EAP's
score (at ``w = 0``) and, at any mask, the mask gradient that auto-circuit's integrated gradients
average.  ``EdgeScores`` compiles one program whose outputs are the metric, every sender's value
as the circuit computes it and as patched, and whose gradients are taken at every destination's
own residual sum (the nodes ``'<destination>.resid'``): one forward pass (the patched senders
included), one backward pass, then the scores of all edges as one matrix product per group of
destinations that read the same senders.  No gradient flows into the mask, and no per-edge work
is done in Python.

``split_circuit(g)`` is the circuit of ``g`` with each destination reading its own copy of its
residual sum (the value is the circuit's own, exactly): the program EAP differentiates.

>>> import numpy as np
>>> from circuits.models import attn_only, random_weights
>>> from circuits.interp import edges
>>> from circuits.interp.discovery import metric_node
>>> w = random_weights(vocab=11, d_model=8, n_heads=2, head_size=4, n_layers=2, max_positions=16)
>>> loss = attn_only(w, np.arange(6), unique_names=True)
>>> g = edges(loss)
>>> split, resid, senders = split_circuit(g)
>>> sorted(resid)[:2], len(resid) == len(g.destinations)
(['b0.a.head0.a.k', 'b0.a.head0.a.q'], True)
>>> scorer = EdgeScores(g, metric_node(split, None), resid, senders, None, 'zero', 'float32')
>>> scorer({}).shape == (len(g),)
True
"""

from __future__ import annotations

import numpy as np

from ..backend import Lowered, float_dtype, precision
from ..errors import CircuitError
from ..nodes import Add, Circuit
from .edge_graph import Edges, _patched_sources, _rebuild

__all__ = ["EdgeScores", "MaskedValues", "split_circuit"]


def split_circuit(g: Edges) -> tuple[Circuit, dict, dict]:
    """``(circuit, resid, senders)``: ``g``'s circuit with each destination reading its own
    node ``'<destination>.resid'`` (the same sum), the map destination label -> that node, and
    source label -> its member nodes in the new circuit.  Made once per graph."""
    cached = getattr(g, "_split", None)
    if cached is not None:
        return cached
    resid: dict[str, Circuit] = {}
    mapping: dict[bytes, Circuit] = {}

    def term_of(d, new):
        node = resid[d.label] = Add(new[d.resid.hash], name=f"{d.label}.resid")
        return node

    circuit = _rebuild(g, term_of, mapping)
    senders = {s: [mapping[m.hash] for m in members] for s, members in g._sources.items()}
    g._split = (circuit, resid, senders)
    return g._split


class EdgeScores:
    """``scorer(feed) -> [edges]``: for every edge ``s -> d`` of ``g``,
    ``<patched s - s, dm/d resid[d]>`` in ``m``'s circuit, from one compiled program.

    ``m``: the scalar metric node; ``resid``: destination label -> the node its edges' terms are
    summed into (``'<destination>.resid'``); ``senders``: source label -> member nodes as ``m``'s
    circuit computes them; the patched senders are made from ``source`` and ``ablation`` as
    ``patch_edges`` makes them (or given as ``patched``: label -> member nodes).  ``feed`` binds
    the circuit's Symbols; values with a leading batch axis give the mean of the per-row scores
    (one ``vmap``-ed program)."""

    def __init__(self, g: Edges, m: Circuit, resid: dict, senders: dict, source, ablation: str, dtype,
                 patched: dict | None = None):
        if m.shape != ():
            raise CircuitError(f"edge scores need a scalar metric; {m.line()} has shape {list(m.shape)}")
        self.fdt = float_dtype(dtype)
        if patched is None:
            patched = _patched_sources(g, g.sources, source, ablation, None)
        labels = g.sources
        clean_nodes = [n for s in labels for n in senders[s]]
        patched_nodes = [n for s in labels for n in patched[s]]
        self.lowered = Lowered([m, *clean_nodes, *patched_nodes], self.fdt)
        program = self.lowered.program
        missing = [d.label for d in g._dests if resid[d.label].hash not in program.slot_of]
        if missing:
            raise CircuitError(f"edge scores: the metric does not read the residual sums of {missing[:3]}")
        self.program = program
        self.slots = tuple(program.slot_of[resid[d.label].hash] for d in g._dests)
        shapes = tuple(resid[d.label].shape for d in g._dests)
        counts = (tuple(len(senders[s]) for s in labels), tuple(len(patched[s]) for s in labels))
        src_at = {s: i for i, s in enumerate(labels)}
        # Destinations that read the same senders (and have one shape) share one matrix product.
        groups: dict[tuple, list[int]] = {}
        for i, d in enumerate(g._dests):
            groups.setdefault((tuple(src_at[s] for s in d.sources), shapes[i]), []).append(i)
        self.groups = tuple((tuple(dests), srcs, shape) for (srcs, shape), dests in groups.items())
        # Edge order: destination by destination (g's order); a group's block is [dests, senders].
        start, at = {}, 0
        for dests, srcs, _ in self.groups:
            for row, i in enumerate(dests):
                start[i] = at + row * len(srcs)
            at += len(dests) * len(srcs)
        self.order = np.array([start[i] + j for i, d in enumerate(g._dests) for j in range(len(d.sources))], np.int32)
        self.counts, self.shapes = counts, shapes
        self.tag = ("edge-scores", self.slots, self.groups, counts)

    def _make(self):
        import jax
        import jax.numpy as jnp

        skeleton = self.program.skeleton()
        slots, shapes, groups, order = self.slots, self.shapes, self.groups, self.order
        n_clean, n_patched = self.counts
        fdt = self.fdt

        def scores(args):
            def metric(deltas):
                outs = skeleton.run(args, deltas=dict(zip(slots, deltas)))
                return jnp.sum(outs[0]), outs[1:]

            zeros = [jnp.zeros(shape, fdt) for shape in shapes]
            (_, values), grads = jax.value_and_grad(metric, has_aux=True)(zeros)
            clean, patched = values[: sum(n_clean)], values[sum(n_clean):]
            diffs, a, b = [], 0, 0
            for nc, np_ in zip(n_clean, n_patched):
                diffs.append(sum(patched[b: b + np_]) - sum(clean[a: a + nc]))
                a, b = a + nc, b + np_
            blocks = []
            for dests, srcs, shape in groups:
                senders = jnp.stack([jnp.broadcast_to(diffs[j], shape).reshape(-1) for j in srcs])
                receivers = jnp.stack([grads[i].reshape(-1) for i in dests])
                blocks.append((receivers @ senders.T).reshape(-1))
            return jnp.concatenate(blocks)[order]

        return scores

    def __call__(self, feed: dict) -> np.ndarray:
        args, axes = self.lowered.bind_batched(feed)
        with precision(self.fdt):
            if any(a is not None for a in axes):
                import jax

                fn = self.lowered.cached(self.tag + ("vmap", tuple(axes)),
                                         lambda: lambda a: jax.vmap(self._make(), in_axes=(list(axes),))(a).mean(0))
            else:
                fn = self.lowered.cached(self.tag, self._make)
            return np.asarray(fn(args), np.float64)


class MaskedValues:
    """``values(masks [K, edges], feed) -> [K]``: the metric ``m`` of a masked program (one
    reading the Symbol ``mask``) at each mask, the mean over ``feed``'s rows where its values
    carry a batch axis; one compiled program (``vmap`` over the masks, and over the rows) per
    chunk of masks, its layout made once."""

    def __init__(self, m: Circuit, mask: Circuit, dtype):
        self.fdt = float_dtype(dtype)
        self.lowered = Lowered([m], self.fdt)
        self.program = self.lowered.program
        self.mask = mask
        self.at = self.program.arg_slots.index(self.program.slot_of[mask.hash])

    def __call__(self, masks: np.ndarray, feed: dict, chunk: int | None = None) -> np.ndarray:
        import jax

        masks = np.asarray(masks, np.float32)
        k = len(masks)
        args, axes = self.lowered.bind_batched({**feed, self.mask: masks[0]})
        with precision(self.fdt):
            axes = list(axes)
            rows = any(a is not None for a in axes)
            skeleton, at = self.program.skeleton(), self.at

            def make():
                def one(row, args):
                    args = list(args)
                    args[at] = row
                    out = skeleton.run(args)[0]
                    return out

                def per_mask(row, args):  # the mean over the feed's rows
                    return jax.vmap(one, in_axes=(None, axes))(row, args).mean(0)

                if not rows:
                    per_mask = one
                return jax.vmap(per_mask, in_axes=(0, None))

            fn = self.lowered.cached(("masked-values", at, tuple(axes)), make)
            size = chunk or k
            padded = np.concatenate([masks, np.zeros((-k % size, masks.shape[1]), np.float32)])
            out = [np.asarray(fn(padded[i: i + size], args), np.float64) for i in range(0, len(padded), size)]
        return np.concatenate(out)[:k]


def scorer_for(g: Edges, key, make) -> EdgeScores:
    """The ``EdgeScores`` cached on ``g`` under ``key`` (a few per graph), made by ``make()``."""
    cache = g.__dict__.setdefault("_scorers", {})
    found = cache.get(key)
    if found is None:
        found = make()
        if len(cache) >= 8:
            cache.pop(next(iter(cache)))
        cache[key] = found
    return found

