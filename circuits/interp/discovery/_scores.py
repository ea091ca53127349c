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
``uniform_circuit(g, source, ablation)`` is the masked circuit at the masks ``alpha * 1`` with
``alpha`` one scalar input: the program of auto-circuit's integrated gradients;
``interpolated_circuit(g, source, ablation)`` the split circuit with the embeddings interpolated
by ``alpha``: Hanna et al.'s.  ``EdgeScores.integrated`` runs their steps as one vmapped program
over a chunk of ``alpha`` values (the chunk sized from the program, ``STEPS_BYTES``).

>>> import numpy as np
>>> from circuits.models import attn_only, random_weights
>>> from circuits.interp import edges
>>> from circuits.interp.metric import metric_node
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

from ...backend import Lowered, check_mode, float_dtype, op_tier, precision, record, values_and_grads_ops
from ...errors import CircuitError
from ...nodes import Add, Circuit, Einsum, Scalar, Symbol
from ._graph import EMBEDS, Edges, fingerprint, patched_sources, rebuild

__all__ = ["EdgeScores", "MaskedValues", "interpolated_circuit", "split_circuit", "uniform_circuit"]

ALPHA_NAME = "edges.alpha"
# What the steps run at once by ``EdgeScores.integrated`` may hold (their activations, estimated
# from the program's size); the steps beyond it go to further calls.
STEPS_BYTES = 2 << 30
# The most forward-and-backward runs (steps; a batch's rows run at once, one run, where a feed's
# values carry one batch axis) the op-by-op tier takes on in one call; a call with more runs its
# compiled program at once (at GPT-2 small's shape a run takes 1.5-2.5 s
# op by op and the program compiles in 60-130 s on two cores, plus 0.1-0.3 s a run).
OP_BY_OP_MAX_RUNS = 32
# The bytes one op-by-op run over a batch may take for its new values and cotangents; more run
# in chunks of rows (as ``evaluate_batched``'s default memory budget).
BATCH_BYTES = 256 << 20


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

    circuit = rebuild(g, term_of, mapping)
    senders = {s: [mapping[m.hash] for m in members] for s, members in g._sources.items()}
    g._split = (circuit, resid, senders)
    return g._split


def uniform_circuit(g: Edges, source, ablation: str) -> tuple[Circuit, dict, dict, dict, Symbol]:
    """``(circuit, resid, senders, patched, alpha)``: ``g``'s circuit with every edge at the weight
    ``alpha`` (a scalar Symbol ``'edges.alpha'``): each destination reads ``'<destination>.resid'``
    = its residual sum ``+ alpha * (its senders patched - its senders as computed)``, which is
    ``sum(sender + alpha * (patched sender - sender))``: ``patch_edges``' masked circuit at the mask
    ``alpha * 1``, with one scalar in place of one weight per edge (so no per-edge mask terms).
    ``resid``: destination label -> that node; ``senders`` / ``patched``: source label -> member
    nodes as computed / as patched.  Made once per graph, ablation and source.

    >>> import numpy as np
    >>> from circuits import evaluate
    >>> from circuits.models import attn_only, random_weights
    >>> from circuits.interp import edges, patch_edges
    >>> w = random_weights(vocab=11, d_model=8, n_heads=2, head_size=4, n_layers=2, max_positions=16)
    >>> g = edges(attn_only(w, np.arange(6), unique_names=True))
    >>> circuit, resid, senders, patched, alpha = uniform_circuit(g, None, 'zero')
    >>> masked = patch_edges(g.circuit, None, None, ablation='zero', mask=True)
    >>> a = evaluate(circuit, {alpha: np.float32(0.3)})
    >>> bool(np.allclose(a, evaluate(masked, {'edges.mask': np.full(len(g), 0.3, np.float32)}), atol=1e-5))
    True
    """
    return _kept(g, "_uniform", (ablation, fingerprint(source)), lambda: _uniform(g, source, ablation))


def _uniform(g: Edges, source, ablation: str) -> tuple:
    alpha = Symbol((), name=ALPHA_NAME, dtype="float32")
    patched = patched_sources(g, g.sources, source, ablation, None)
    resid: dict[str, Circuit] = {}
    moved: dict[tuple, Circuit] = {}  # senders -> alpha * (patched - computed), shared by their readers

    def term_of(d, new):
        srcs = tuple(d.sources)
        step = moved.get(srcs)
        if step is None:
            computed = _add([new[m.hash] for s in srcs for m in g._sources[s]])
            minus = Einsum.from_spec(_scaled(computed.ndim), computed, Scalar(-1.0))
            diff = Add(*[p for s in srcs for p in patched[s]], minus)
            step = moved[srcs] = Einsum.from_spec(_scaled(diff.ndim), diff, alpha)
        node = resid[d.label] = Add(new[d.resid.hash], step, name=f"{d.label}.resid")
        return node

    new: dict[bytes, Circuit] = {}
    circuit = rebuild(g, term_of, new)
    senders = {s: [new[m.hash] for m in members] for s, members in g._sources.items()}
    return circuit, resid, senders, patched, alpha


def interpolated_circuit(g: Edges, source, ablation: str) -> tuple[Circuit, dict, dict, Symbol]:
    """``(circuit, resid, patched, alpha)``: Hanna et al.'s runs, ``g``'s circuit with each
    destination reading its own copy of its residual sum (as ``split_circuit``) and the embeddings
    interpolated, ``patched + alpha * (clean - patched)`` (``alpha`` the scalar Symbol
    ``'edges.alpha'``: 0 the source's embeddings, 1 the clean ones), everything else (the
    loss's targets included) clean.  ``resid``: destination label -> its sum; ``patched``: source
    label -> patched member nodes.  Made once per graph, ablation and source.

    >>> import numpy as np
    >>> from circuits import evaluate
    >>> from circuits.models import attn_only, random_weights
    >>> from circuits.interp import edges
    >>> w = random_weights(vocab=11, d_model=8, n_heads=2, head_size=4, n_layers=2, max_positions=16)
    >>> loss = attn_only(w, np.arange(6), unique_names=True)
    >>> circuit, resid, patched, alpha = interpolated_circuit(edges(loss), None, 'zero')
    >>> bool(np.allclose(evaluate(circuit, {alpha: np.float32(1)}), evaluate(loss), atol=1e-6))
    True
    """
    return _kept(g, "_interpolated", (ablation, fingerprint(source)), lambda: _interpolated(g, source, ablation))


def _interpolated(g: Edges, source, ablation: str) -> tuple:
    alpha = Symbol((), name=ALPHA_NAME, dtype="float32")
    patched = patched_sources(g, g.sources, source, ablation, None)
    resid: dict[str, Circuit] = {}

    def term_of(d, new):
        node = resid[d.label] = Add(new[d.resid.hash], name=f"{d.label}.resid")
        return node

    def between(p):
        def swap(c):
            back = Add(c, Einsum.from_spec(_scaled(p.ndim), p, Scalar(-1.0)))
            return Add(p, Einsum.from_spec(_scaled(back.ndim), back, alpha), name=f"{c.name or EMBEDS}.interpolated")
        return swap

    swap = {c.hash: between(p) for c, p in zip(g._sources[EMBEDS], patched[EMBEDS])}
    circuit = rebuild(g, term_of, {}, swap)
    return circuit, resid, patched, alpha


def _kept(g: Edges, attr: str, key, make, size: int = 4):
    """``make()``, kept on the graph ``g`` under ``attr`` and ``key`` (the last ``size`` keys)."""
    cache = g.__dict__.setdefault(attr, {})
    found = cache.get(key)
    if found is None:
        found = make()
        if len(cache) >= size:
            cache.pop(next(iter(cache)))
        cache[key] = found
    return found


def _add(nodes: list) -> Circuit:
    return nodes[0] if len(nodes) == 1 else Add(*nodes)


def _scaled(ndim: int) -> str:
    ax = "abcdefghijklm"[:ndim]
    return f"{ax},->{ax}"


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
            patched = patched_sources(g, g.sources, source, ablation, None)
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
        # what the op-by-op tier computes: the senders' values, and the metric's gradients at
        # every destination's sum (in the destinations' order)
        self.metric, self.sender_nodes = m, (*clean_nodes, *patched_nodes)
        self.resid = tuple(resid[d.label] for d in g._dests)

    @property
    def roots(self) -> tuple:
        """The program's roots, in order (the metric, then the senders): its name on disk."""
        return (self.metric, *self.sender_nodes)

    def _make(self):
        import jax
        import jax.numpy as jnp

        skeleton = self.program.skeleton()
        slots, shapes, fdt = self.slots, self.shapes, self.fdt

        def scores(args):
            def metric(deltas):
                outs = skeleton.run(args, deltas=dict(zip(slots, deltas)))
                return jnp.sum(outs[0]), outs[1:]

            zeros = [jnp.zeros(shape, fdt) for shape in shapes]
            (_, values), grads = jax.value_and_grad(metric, has_aux=True)(zeros)
            return self._combine(values, grads)

        return scores

    def _combine(self, values, grads, xp=None):
        """The scores from the senders' values (clean, then patched, in ``senders`` order) and the
        gradients at the destinations' sums: the senders' differences, then one matrix product per
        group of destinations.  ``xp``: ``jax.numpy`` (default; traceable) or ``numpy``, which the
        op-by-op tier uses on the values it copied out (thousands of small reshapes and stacks
        cost microseconds each in numpy, a dispatch each in JAX outside a trace)."""
        if xp is None:
            import jax.numpy as xp

        n_clean, n_patched = self.counts
        clean, patched = values[: sum(n_clean)], values[sum(n_clean):]
        diffs, a, b = [], 0, 0
        for nc, np_ in zip(n_clean, n_patched):
            diffs.append(sum(patched[b: b + np_]) - sum(clean[a: a + nc]))
            a, b = a + nc, b + np_
        blocks = []
        for dests, srcs, shape in self.groups:
            senders = xp.stack([xp.broadcast_to(diffs[j], shape).reshape(-1) for j in srcs])
            receivers = xp.stack([grads[i].reshape(-1) for i in dests])
            blocks.append((receivers @ senders.T).reshape(-1))
        return xp.concatenate(blocks)[self.order]

    def by_ops(self, feeds, batched: bool = False, mode: str = "ops") -> np.ndarray | None:
        """``sum(weight * scores(feed) for feed, weight in feeds)`` op by op: the senders' values
        through the cached per-operation kernels (and the value cache), the gradients at the
        destinations' sums by the op-by-op reverse sweep; nothing is compiled whole.  None where
        the circuit's nodes are not all there as evaluated (Modules substituted).  ``batched``:
        each feed's values carry a batch axis and its score is the mean of its rows', all rows
        computed at once (the kernels mapped over them), in chunks of rows where one call's
        values and cotangents would not fit ``DEFAULT_MEMORY_BUDGET``.  ``mode``: where numpy
        computes a step (``values_and_grads_ops``)."""
        total = None
        with precision(self.fdt):
            for feed, weight in feeds:
                scores = self._batched_scores(feed, mode) if batched else self._scores(feed, mode)
                if scores is None:
                    return None
                scores = scores * weight
                total = scores if total is None else total + scores
        return total

    def _scores(self, feed, mode: str = "ops") -> np.ndarray | None:
        found = values_and_grads_ops(self.sender_nodes, self.metric, self.resid, feed, self.fdt, mode=mode)
        if found is None:
            return None
        host = [np.asarray(v) for v in found[0]], [np.asarray(v) for v in found[1]]
        return np.asarray(self._combine(*host, xp=np), np.float64)

    def _batched_scores(self, feed, mode: str = "ops") -> np.ndarray | None:
        """The mean of the per-row scores of ``feed`` (its batched values rows first), op by op,
        in chunks of rows past ``BATCH_BYTES``."""
        found = values_and_grads_ops(self.sender_nodes, self.metric, self.resid, feed, self.fdt, batched=True,
                                     max_bytes=BATCH_BYTES, mode=mode)
        if found is None:
            return None
        values, grads = [np.asarray(v) for v in found[0]], [np.asarray(g) for g in found[1]]
        rows = len(values[0]) if values else len(grads[0])
        total = sum(np.asarray(self._combine([v[r] for v in values], [g[r] for g in grads], xp=np), np.float64)
                    for r in range(rows))
        return total / rows

    def rows(self, feed: dict) -> list | None:
        """``feed`` as one feed per row where its values carry a batch axis (a leading axis more
        than the Symbol they bind), else ``[feed]``; None where the rows do not agree (the
        compiled path reports that)."""
        symbols = self.program.free_symbols()
        by_name, by_hash = {x.name: x for x in symbols}, {x.hash: x for x in symbols}
        batched, plain = {}, {}
        for key, value in feed.items():
            sym = by_hash.get(key.hash) if isinstance(key, Circuit) else by_name.get(key)
            shape = np.shape(value)
            if sym is not None and len(shape) == len(sym.shape) + 1 and tuple(shape[1:]) == sym.shape:
                batched[key] = value
            else:
                plain[key] = value
        if not batched:
            return [feed]
        sizes = {len(v) for v in batched.values()}
        if len(sizes) != 1:
            return None
        return [{**plain, **{k: v[i] for k, v in batched.items()}} for i in range(sizes.pop())]

    def _tiered(self, key, mode: str, runs: int | None, feeds, whole, batched: bool = False) -> np.ndarray:
        """The scores from the op-by-op tier (``backend.op_tier``: ``'ops'``, or ``'auto'`` until
        the whole program is ready, for at most ``OP_BY_OP_MAX_RUNS`` runs, the ``runs`` feeds that
        ``feeds()`` yields one at a time, never held together; ``'auto'``'s ``JIT_AFTER``-th run
        calls ``whole()`` in the background if the program is small enough for the machine:
        ``tiers.caller_max_ops()``), else from ``whole()``, the compiled program.  The program's
        roots name it on disk (``op_tier``'s ``keep``): a later process loads it instead of
        compiling it."""
        auto = check_mode(mode) == "auto"
        if runs is not None and not (auto and runs > OP_BY_OP_MAX_RUNS):
            by_ops = lambda: self.by_ops(feeds(), batched, check_mode(mode))  # noqa: E731
        else:
            by_ops = lambda: None  # noqa: E731 - straight to the whole program
        scores = op_tier(key, mode, self.program, by_ops, lambda: whole() is not None, keep=self.roots)
        if scores is None:
            scores = whole()
            record("jit")
        return scores

    def integrated(self, symbol: Symbol, values, feed: dict, chunk: int | None = None,
                   mode: str = "auto") -> np.ndarray:
        """The mean of the scores over ``values`` of the scalar Symbol ``symbol`` (the steps of an
        integrated gradient, e.g. ``uniform_circuit``'s ``alpha``), ``feed`` binding the rest as
        for a call: one compiled program vmapped over ``chunk`` values, called once per chunk, so
        the work that does not depend on ``symbol`` (the patched senders) is done once a call and
        each matrix product of a step is one of ``chunk`` steps at once.  ``chunk``: by default as
        many steps as the program's activations (its size times the feed's rows) fit in
        ``STEPS_BYTES``; the calls are evened out, a short last one padded with steps of weight 0.
        ``mode`` as for ``evaluate``: in ``'auto'`` the first calls run step by step (a batch's
        rows at once) op by op, the ``JIT_AFTER``-th compiles the program in the background."""
        values = np.asarray(values, np.float32).reshape(-1)
        if not len(values):
            raise CircuitError("edge scores: integrated over no values; give at least one step")
        rows = self.rows(feed)
        key = (self.program.key, *self.tag, "integrated", symbol.hash, len(rows or ()), chunk)
        whole = lambda: self._integrated(symbol, values, feed, chunk)  # noqa: E731
        if rows is not None and len(rows) > 1:  # a batch: each step's rows at once, op by op
            return self._tiered(key, mode, len(values), lambda: (({**feed, symbol: v}, 1.0 / len(values))
                                                                  for v in values), whole, batched=True)
        runs = None if rows is None else len(values) * len(rows)

        def feeds():  # one run at a time: ten million steps are not ten million dicts at once
            return (({**row, symbol: v}, 1.0 / runs) for v in values for row in rows)

        return self._tiered(key, mode, runs, feeds, whole)

    def _integrated(self, symbol: Symbol, values: np.ndarray, feed: dict, chunk: int | None) -> np.ndarray:
        args, axes = self.lowered.bind_batched({**feed, symbol: values[0]})
        at = self.program.arg_slots.index(self.program.slot_of[symbol.hash])
        rows = max((np.shape(a)[0] for a, x in zip(args, axes) if x is not None), default=0)
        size = int(chunk) if chunk else self.steps_that_fit(symbol, max(rows, 1))
        calls = -(-len(values) // max(1, size))
        size = -(-len(values) // calls)
        weights = np.zeros(calls * size, self.fdt)
        weights[: len(values)] = 1.0 / len(values)
        values = np.concatenate([values, np.full(calls * size - len(values), values[-1], np.float32)])
        axes = list(axes)
        with precision(self.fdt):
            import jax

            fn = self.lowered.cached(self.tag + ("integrated", at, size, tuple(axes)),
                                     lambda: self.integrand(at, axes), self.roots)
            args = jax.device_put(args)  # once, not once a call (GPT-2's weights: half a GiB)
            out = [np.asarray(fn(values[i: i + size], weights[i: i + size], args), np.float64)
                   for i in range(0, len(values), size)]
        return np.sum(out, axis=0)

    def integrand(self, at: int, axes: list):
        """``(values [n], weights [n], args) -> sum_i weights[i] * scores(args with values[i] at
        argument ``at``)``, traceable: ``integrated``'s compiled function (``axes``: the batch
        axes of ``args``, the mean over the rows taken per step)."""
        import jax

        scores = self._make()
        rows = any(a is not None for a in axes)

        def step(value, args):
            args = list(args)
            args[at] = value
            if rows:
                return jax.vmap(scores, in_axes=(axes,))(args).mean(0)
            return scores(args)

        def total(values, weights, args):
            return weights @ jax.vmap(step, in_axes=(0, None))(values, args)

        return total

    def steps_that_fit(self, symbol: Symbol, rows: int = 1) -> int:
        """How many steps of ``integrated`` over ``symbol`` fit in ``STEPS_BYTES``: a step holds
        about what its program computes from ``symbol``, per row (the values kept for the backward
        pass; their gradients and the fused intermediates come and go: at GPT-2 width, 12 layers,
        XLA's memory analysis gives 0.2 GiB a step where this counts 0.27); what does not depend
        on it is computed once a call."""
        program = self.program
        varies = [False] * len(program.nodes)
        varies[program.slot_of[symbol.hash]] = True
        per_step = 0
        for i, (node, kids) in enumerate(zip(program.nodes, program.child_slots)):
            if kids and any(varies[j] for j in kids):
                varies[i] = True
                per_step += int(np.prod(node.shape)) * np.dtype(self.fdt).itemsize
        return max(1, STEPS_BYTES // max(rows * per_step, 1))

    def __call__(self, feed: dict, mode: str = "auto") -> np.ndarray:
        """The scores for ``feed`` (the mean over its rows where its values carry a batch axis);
        ``mode`` as for ``evaluate``: in ``'auto'`` the first calls run op by op (a batch's rows at once),
        through the kernels and values every evaluation shares, and the ``JIT_AFTER``-th compiles
        the whole program in the background (a GPT-2's takes a minute to compile; op by op the
        first call takes seconds), used once it is ready."""
        rows = self.rows(feed)
        key = (self.program.key, *self.tag, len(rows or ()))
        if rows is not None and len(rows) > 1:  # a batch: its rows at once, op by op
            return self._tiered(key, mode, 1, lambda: [(feed, 1.0)],
                                lambda: run_scorer(self.lowered, self.tag, self.fdt, self._make, feed, self.roots),
                                batched=True)
        return self._tiered(key, mode, None if rows is None else len(rows),
                            lambda: ((row, 1.0 / len(rows)) for row in rows),
                            lambda: run_scorer(self.lowered, self.tag, self.fdt, self._make, feed, self.roots))


def run_scorer(lowered: Lowered, tag: tuple, fdt: str, make, feed: dict, keep=None) -> np.ndarray:
    """The scores of the program ``make()`` builds over ``lowered``'s arguments, ``feed`` bound
    (the mean over its rows where its values carry a batch axis: one vmapped program), compiled
    once per ``tag`` and batch layout; ``keep``: the program's roots, to keep its executable on
    disk for later processes (``Lowered.cached``)."""
    args, axes = lowered.bind_batched(feed)
    with precision(fdt):
        if any(a is not None for a in axes):
            import jax

            fn = lowered.cached(tag + ("vmap", tuple(axes)),
                                lambda: lambda a: jax.vmap(make(), in_axes=(list(axes),))(a).mean(0), keep)
        else:
            fn = lowered.cached(tag, make, keep)
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
    return _kept(g, "_scorers", key, make, size=8)

