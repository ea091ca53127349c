"""Every edge patched alone, ``m(edge patched) - m(clean)``, from one compiled program that
computes each node only for the edges that change it.

Patching one edge ``s -> d`` adds ``patched s - s`` to the residual sum ``d`` reads and to no
other: only the nodes downstream of ``d`` differ from the clean run.  ``ExactScores`` runs the
split circuit (``split_circuit``: each destination reading its own copy ``'<destination>.resid'``)
once clean, then once more *row-sparse*: one row per edge, and each node is computed (its op
``vmap``-ed) only for the rows of the edges whose destination lies upstream of it, the other rows
reading its clean value.  In the shipped induction model (81 edges) a head of the second layer
is computed for 27 rows (its own 15 edges and the first layer's 12), the output for all 81, and
what lies upstream of every destination once: the work of one forward pass per edge, less what
the edge cannot change (a ninth of it there), in one call.

The rows every node holds are laid out when the scorer is made (the edges are fixed), so a call
is one compiled function of the program's arguments; ``rows_bytes`` is what the row-sparse run
holds (``discover`` takes it for circuits whose rows fit ``ROWS_BYTES``, and evaluates the
masked program part by part otherwise).

>>> import numpy as np
>>> from circuits.models import attn_only, random_weights
>>> from circuits.interp import edges, patch_edges
>>> from circuits.interp.metric import metric_node
>>> from circuits.interp.discovery._scores import split_circuit
>>> from circuits import evaluate
>>> w = random_weights(vocab=11, d_model=8, n_heads=2, head_size=4, n_layers=2, max_positions=16)
>>> loss = attn_only(w, np.arange(6), unique_names=True)
>>> g = edges(loss)
>>> split, resid, senders = split_circuit(g)
>>> scorer = ExactScores(g, metric_node(split, None), resid, senders, None, 'zero', 'float64')
>>> scores = scorer({})
>>> one = evaluate(patch_edges(loss, [g[7]], None, ablation='zero'), dtype='float64').sum()
>>> bool(np.isclose(scores[7], one - evaluate(loss, dtype='float64').sum()))
True
"""

from __future__ import annotations

import numpy as np

from ...backend import Lowered, float_dtype
from ...errors import CircuitError
from ...nodes import Circuit
from ._graph import Edges, patched_sources
from ._scores import run_scorer

__all__ = ["ExactScores", "ROWS_BYTES"]

# What the row-sparse run may hold (every node's value for its rows); ``discover`` evaluates the
# masked program in parts for a circuit whose rows need more.
ROWS_BYTES = 1 << 30


class ExactScores:
    """``scorer(feed) -> [edges]``: ``m(edge patched) - m(clean)`` for every edge of ``g``, in
    ``g``'s order, from one compiled program (see the module docstring).

    ``m``: the scalar metric node over ``split_circuit(g)``; ``resid``: destination label -> its
    node ``'<destination>.resid'``; ``senders``: source label -> member nodes as ``m``'s circuit
    computes them; the patched senders are made from ``source`` and ``ablation`` as
    ``patch_edges`` makes them.  ``feed`` binds the circuit's Symbols; values with a leading
    batch axis give the mean over the rows (one ``vmap``-ed program)."""

    def __init__(self, g: Edges, m: Circuit, resid: dict, senders: dict, source, ablation: str, dtype):
        if m.shape != ():
            raise CircuitError(f"exact scores need a scalar metric; {m.line()} has shape {list(m.shape)}")
        self.fdt = float_dtype(dtype)
        patched = patched_sources(g, g.sources, source, ablation, None)
        labels = g.sources
        clean_nodes = [n for s in labels for n in senders[s]]
        patched_nodes = [n for s in labels for n in patched[s]]
        self.lowered = Lowered([m, *clean_nodes, *patched_nodes], self.fdt)
        program = self.program = self.lowered.program
        missing = [d.label for d in g._dests if resid[d.label].hash not in program.slot_of]
        if missing:
            raise CircuitError(f"exact scores: the metric does not read the residual sums of {missing[:3]}")
        self.n_edges = len(g)
        self.counts = (tuple(len(senders[s]) for s in labels), tuple(len(patched[s]) for s in labels))
        src_at = {s: i for i, s in enumerate(labels)}
        # Each destination's edges: rows (edge positions) and their senders.
        own: dict[int, tuple[tuple, tuple]] = {}
        at = 0
        for d in g._dests:
            rows = tuple(range(at, at + len(d.sources)))
            own[program.slot_of[resid[d.label].hash]] = (rows, tuple(src_at[s] for s in d.sources))
            at += len(d.sources)
        self.own = own
        self.masks = self._layout(program, own)
        self._rows = None
        self.tag = ("exact-scores", tuple(sorted((k, v) for k, v in own.items())), self.counts)

    @staticmethod
    def _layout(program, own: dict) -> list[int]:
        """The rows of every slot as a bit mask of edge positions: its children's rows, and a
        destination's residual sum its own edges' rows (bit masks: a large graph's layout is cheap
        to size before ``rows_bytes`` turns it down)."""
        masks: list[int] = []
        for i, kids in enumerate(program.child_slots):
            m = 0
            for j in kids:
                m |= masks[j]
            if i in own:
                rows = own[i][0]
                if rows:
                    m |= ((1 << len(rows)) - 1) << rows[0]
            masks.append(m)
        return masks

    @property
    def rows(self) -> list[tuple]:
        """The rows (edge positions, in the order its batch holds them) of every slot: increasing,
        but a destination's residual sum holds the rows from upstream first, then its own."""
        if self._rows is None:
            rows = []
            for i, m in enumerate(self.masks):
                mine = self.own[i][0] if i in self.own else ()
                rows.append(_positions(m & ~sum(1 << r for r in mine)) + mine)
            self._rows = rows
        return self._rows

    def rows_bytes(self) -> int:
        """What the row-sparse run holds: every node's value for its rows."""
        size = max(np.dtype(self.fdt).itemsize, 4)
        return sum(m.bit_count() * int(np.prod(node.shape)) * size
                   for node, m in zip(self.program.nodes, self.masks) if m)

    def fits(self, rows: int = 1) -> bool:
        """Whether the row-sparse run over a feed of ``rows`` rows fits ``ROWS_BYTES``."""
        return self.rows_bytes() * rows <= ROWS_BYTES

    def _make(self):
        import jax
        import jax.numpy as jnp

        program = self.program
        skeleton = program.skeleton()
        ops, kids_of = skeleton.ops, skeleton.child_slots
        rows_of, own, n_edges = self.rows, self.own, self.n_edges
        n_clean, n_patched = self.counts
        metric_slot = program.outputs[0]
        # per slot with rows: how its op reads each child for the rows from upstream (None: the
        # clean value, unbatched; 'all': the child's batch as it is; runs: see _runs), or None for
        # a destination's sum that has no rows from upstream; made once
        plan = {}
        for i, kids in enumerate(kids_of):
            rows = rows_of[i]
            if ops[i] is None or not rows:
                continue
            up = rows[: len(rows) - len(own[i][0])] if i in own else rows
            if not up:
                plan[i] = None
                continue
            reads = []
            for j in kids:
                if not rows_of[j]:
                    reads.append((j, None))
                elif rows_of[j] == up:
                    reads.append((j, "all"))
                else:
                    where = {r: k for k, r in enumerate(rows_of[j])}
                    reads.append((j, _runs([where.get(r) for r in up])))
            plan[i] = reads

        def scores(args):
            env: list = [None] * skeleton.size  # every slot's clean value

            def keep(i, value):
                env[i] = value

            values = skeleton.run(args, observe=keep)[1:]
            cl, pa = values[: sum(n_clean)], values[sum(n_clean):]
            diffs, a, b = [], 0, 0
            for nc, np_ in zip(n_clean, n_patched):
                diffs.append(sum(pa[b: b + np_]) - sum(cl[a: a + nc]))
                a, b = a + nc, b + np_
            batch: dict = {}
            for i, reads in plan.items():
                parts = []
                if reads is not None:
                    vals, axes = [], []
                    for j, how in reads:
                        if how is None:
                            vals.append(env[j])
                            axes.append(None)
                        elif isinstance(how, str):
                            vals.append(batch[j])
                            axes.append(0)
                        else:
                            vals.append(_gathered(jnp, env[j], batch[j], how))
                            axes.append(0)
                    parts.append(jax.vmap(ops[i], in_axes=tuple(axes))(*vals))
                if i in own and own[i][0]:
                    shape = env[i].shape
                    parts.append(env[i][None] + jnp.stack([jnp.broadcast_to(diffs[s], shape) for s in own[i][1]]))
                batch[i] = parts[0] if len(parts) == 1 else jnp.concatenate(parts)
            out = jnp.zeros(n_edges, env[metric_slot].dtype)
            rows = rows_of[metric_slot]
            if rows:
                out = out.at[np.array(rows)].set(batch[metric_slot] - env[metric_slot])
            return out

        return scores

    def __call__(self, feed: dict) -> np.ndarray:
        """The scores, ``feed`` binding the circuit's Symbols (see the class docstring)."""
        return run_scorer(self.lowered, self.tag, self.fdt, self._make, feed)


def _positions(mask: int) -> tuple:
    """The set bits of ``mask``, increasing."""
    if not mask:
        return ()
    raw = np.frombuffer(mask.to_bytes((mask.bit_length() + 7) // 8, "little"), np.uint8)
    return tuple(np.flatnonzero(np.unpackbits(raw, bitorder="little")).tolist())


def _runs(where: list) -> tuple:
    """Positions in a child's rows (None: a row the child does not hold) as runs: ``(None, n)``
    (n rows of the clean value) or ``(start, n)`` (n consecutive rows of the child's batch)."""
    runs: list = []
    for w in where:
        if runs and ((w is None and runs[-1][0] is None)
                     or (w is not None and runs[-1][0] is not None and runs[-1][0] + runs[-1][1] == w)):
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((w, 1))
    return tuple(runs)


def _gathered(jnp, clean, batch, runs: tuple):
    """A child's value for a node's rows: its batch's rows where it holds them, else its clean
    value (``runs`` from ``_runs``): slices and broadcasts, no gather."""
    parts = [jnp.broadcast_to(clean, (n, *clean.shape)) if start is None else batch[start: start + n]
             for start, n in runs]
    return parts[0] if len(parts) == 1 else jnp.concatenate(parts)
