"""Circuit discovery: a score for every edge of a model's head-level graph, and the circuits they find.

``discover(circuit, source, metric, method=...)`` scores every edge of ``edges(circuit)`` by how
much patching it (its sender recomputed from ``source``, or zero / mean ablated: ``ablation=``)
changes the metric ``m``.  All methods work on one program: the masked circuit of ``patch_edges``
(``mask=True``), whose input ``'edges.mask'`` holds one weight per edge (0: clean, 1: patched).

- ``'exact'``: each edge patched alone, ``m(mask = e_i) - m(clean)``, all edges in one call of
  one compiled program that computes each node only for the edges upstream of it
  (``_exact``);
- ``'eap'`` (Syed et al.): ``(sender patched - sender clean) · dm/d(destination input)``, which is
  exactly ``dm/d mask_i`` at the clean point: one forward and one backward pass (auto-circuit
  reports the opposite sign);
- ``'eap-ig'`` (Hanna et al.): the same products with the gradient averaged over ``steps`` runs
  whose embeddings are interpolated from the source's to the clean ones
  (``e_src + k/steps · (e_clean - e_src)``, ``k = 0 … steps-1``); the sender differences stay
  the clean-versus-source ones;
- ``'eap-ig-mask'`` (auto-circuit's integrated gradients): ``dm/d mask`` averaged over the
  masks ``alpha · 1`` for ``alpha = k/steps``, ``k = 0 … steps``: the scores add up to about
  ``m(every edge patched) - m(clean)`` (completeness), closer as ``steps`` grows;
- ``'acdc'`` (Conmy et al.): greedy pruning, destinations in reverse topological order (the
  output first), each destination's senders latest first: an edge is removed (patched from then
  on) when removing it changes the metric by less than ``tau`` (with ``metric='kl'``: when the
  KL divergence rises by less than ``tau``; otherwise by absolute value).  The score is that
  change; the result's ``found`` is the circuit kept.

``metric`` as ``circuits.interp.metric`` reads it (for ``attribute`` too): ``None`` (the
output's sum), weights of the output's shape (``sum(w * output)``), a function from the output
node to a node (its values summed), or ``'kl'``: the KL divergence of the output distribution
from the clean one (the output must be logits ``[..., vocab]``), averaged over positions: ACDC's
metric.  Its gradient at the clean run is zero (the divergence is smallest there), so ``'eap'``
scores every edge 0 for it, as for any metric smallest at the clean run; ``attribute`` refuses it.

>>> import numpy as np
>>> from circuits.models import attn_only, random_weights
>>> w = random_weights(vocab=11, d_model=8, n_heads=2, head_size=4, n_layers=2, max_positions=16)
>>> loss = attn_only(w, np.array([0, 1, 2, 3, 1, 2]), unique_names=True)
>>> result = discover(loss, {'toks_int_var': np.array([0, 4, 5, 6, 1, 2])}, method='exact')
>>> len(result), result["b1.a.head0 -> output"] == float(result.scores[-2])
(29, True)
>>> found = result.top(5)
>>> len(found.edges), found.circuit.name
(5, 't.loss')
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from ...backend import check_mode, evaluate, evaluate_batched
from ...errors import CircuitError, ShapeError
from ...nodes import Circuit, Symbol
from ...shapes import check_allocation
from ...traversal import replace, toposort
from ..checks import check_count, check_real
from ..metric import log_softmax, metric_node, read_metric
from ..sites import resolve_inputs
from ._exact import ExactScores
from ._found import FoundCircuit
from ._graph import ABLATIONS, MASK_NAME, Edges, edges, fingerprint, patch_edges, value_digest
from ._scores import EdgeScores, MaskedValues, interpolated_circuit, scorer_for, split_circuit, uniform_circuit

__all__ = ["discover", "Discovery", "METHODS"]

METHODS = ("eap", "eap-ig", "eap-ig-mask", "acdc", "exact")
CHUNK = 8  # rows of a batched call of a masked program are a multiple of this (see Objective.values)


class Discovery:
    """Edge scores from ``discover``: ``result[edge name]`` is a score, ``scores`` all of them in
    ``edges`` order (the graph's); it shows as a table sorted by |score|; ``top(k)`` and
    ``threshold(tau)`` give a ``FoundCircuit`` whose ``edges`` are by decreasing |score| (ties in
    graph order); ``found`` is ACDC's own circuit, in graph order (else None)."""

    def __init__(self, graph: Edges, scores: np.ndarray, method: str, *, source, ablation: str,
                 found: FoundCircuit | None = None, info: dict | None = None, circuit: Circuit | None = None):
        self.graph, self.scores, self.method = graph, np.asarray(scores, np.float64), method
        self.source, self.ablation, self.found = source, ablation, found
        self.info = info or {}
        # the circuit as the caller gave it to discover (graph.circuit reads Symbols for a batch)
        self.circuit = graph.circuit if circuit is None else circuit

    @property
    def edges(self) -> list[str]:
        return list(self.graph)

    def __len__(self):
        return len(self.graph)

    def __getitem__(self, name: str) -> float:
        return float(self.scores[self.graph.index(name)])

    def as_dict(self) -> dict[str, float]:
        return dict(zip(self.graph, self.scores.tolist()))

    def ranking(self) -> list[int]:
        """Edge positions by decreasing |score| (ties: graph order)."""
        return sorted(range(len(self.scores)), key=lambda i: (-abs(self.scores[i]), i))

    def top(self, k: int) -> FoundCircuit:
        """The circuit of the ``k`` edges of largest |score|."""
        if not isinstance(k, (int, np.integer)) or not 0 <= k <= len(self):
            raise CircuitError(f"top(k={k!r}): k must be an int between 0 and the number of edges ({len(self)})")
        return self._found(self.ranking()[: int(k)])

    def threshold(self, tau: float) -> FoundCircuit:
        """The circuit of the edges whose |score| is at least ``tau``."""
        tau = check_real(tau, "threshold", "tau", fix="the least |score| an edge keeps")
        return self._found([i for i in self.ranking() if abs(self.scores[i]) >= tau])

    def _found(self, kept) -> FoundCircuit:
        return FoundCircuit(self.graph, [self.graph[i] for i in kept], self.source, ablation=self.ablation,
                            scores=self.scores)

    def table(self, n: int = 20) -> str:
        rows = self.ranking()[:n]
        width = max([len(self.graph[i]) for i in rows] + [4])
        lines = [f"{'edge':<{width}}  score"]
        lines += [f"{self.graph[i]:<{width}}  {self.scores[i]:+.6g}" for i in rows]
        if len(self) > n:
            lines.append(f"... {len(self) - n} more")
        return "\n".join(lines)

    def __repr__(self):
        head = f"Discovery({self.method!r}, {len(self)} edges, ablation={self.ablation!r})"
        return head + "\n" + self.table()

    def _repr_html_(self):
        import html

        rows = "".join(f"<tr><td><code>{html.escape(self.graph[i])}</code></td><td>{self.scores[i]:+.5g}</td></tr>"
                       for i in self.ranking()[:20])
        more = f"<p>... {len(self) - 20} more</p>" if len(self) > 20 else ""
        return (f"<p><b>{html.escape(self.method)}</b>: {len(self)} edges, ablation {self.ablation}</p>"
                f"<table><tr><th>edge</th><th>score</th></tr>{rows}</table>{more}")


def discover(circuit: Circuit, source: Mapping | None, metric=None, *, method: str = "eap",
             ablation: str = "resample", steps: int = 10, tau: float = 0.01, inputs: Mapping | None = None,
             dtype="float32", batch_size: int | None = None, mode: str = "auto") -> Discovery:
    """Score every edge of ``circuit``'s head-level graph (``edges``) by ``method`` (see the
    module docstring); ``circuit`` runs clean as built, ``source`` as in ``patch`` (for
    ``ablation='zero'``: None; for ``'mean'``: values with a leading batch axis); ``steps`` for
    the integrated-gradient methods, ``tau`` for ACDC; ``dtype`` as for ``evaluate``;
    ``batch_size``: the rows of one call of the masked program (ACDC, and ``'exact'``, which then
    evaluates the masked program part by part instead of its one row-sparse program).
    ``mode`` (``'auto'``, ``'ops'``, ``'jit'``, as for ``evaluate``) tiers the gradient methods:
    in ``'auto'`` their first calls run op by op (a batch's rows at once, step by step, up to
    ``_scores.OP_BY_OP_MAX_RUNS`` runs; more compile at once) through the kernels every
    evaluation shares, and the second compiles their one program in the background if it
    has at most ``JIT_MAX_OPS`` nodes (GPT-2 small's, 9,400, stays op by op: a first EAP call of
    seconds where compiling or loading its program takes a minute); ``'jit'`` compiles at once
    (worth it for the integrated-gradient methods called many times on a large model).

    A batch: ``inputs`` maps inputs of the circuit (Arrays or Symbols, or their names) to clean
    values with a leading batch axis and ``source`` gives the corrupted values in the same layout
    (row ``i`` against row ``i``); the metric (and every gradient) is averaged over the rows.  The
    found circuits then read Symbols: the inputs by their own names, the source as
    ``'<input>.source'``.

    >>> import numpy as np
    >>> from circuits.models import attn_only, random_weights
    >>> w = random_weights(vocab=11, d_model=8, n_heads=1, head_size=4, n_layers=2, max_positions=16)
    >>> loss = attn_only(w, np.array([0, 1, 2, 3, 1, 2]), unique_names=True)
    >>> r = discover(loss, {'toks_int_var': np.array([0, 4, 5, 6, 1, 2])}, method='acdc', tau=0.05)
    >>> r.found.circuit.name, len(r.found.edges) <= len(r)
    ('t.loss', True)
    """
    if method not in METHODS:
        raise CircuitError(f"discover: method={method!r}; use one of {', '.join(map(repr, METHODS))}")
    if ablation not in ABLATIONS:
        raise CircuitError(f"discover: ablation={ablation!r}; use one of {', '.join(map(repr, ABLATIONS))}")
    steps = check_count(steps, "discover", "steps", fix="integration steps")
    tau = check_real(tau, "discover", "tau", fix="ACDC's threshold on the metric's change")
    batch_size = check_count(batch_size, "discover", "batch_size", none=True, fix="rows of one call")
    check_mode(mode)
    if method in ("eap-ig", "eap-ig-mask"):  # the steps' values and weights (10**12 steps: refused here)
        check_allocation((3, steps + 1), "float64", lambda: f"discover: steps={steps}")
    edges(circuit)  # a model without heads is an error before anything runs
    read_metric(metric, circuit, "discover")
    given = circuit
    circuit, source, feed = batch_setup(circuit, source, inputs, ablation)
    g = edges(circuit)
    clean = clean_for(circuit, metric, feed, dtype)
    result = dict(source=source, ablation=ablation, circuit=given)
    if method in ("eap", "eap-ig-mask", "eap-ig"):
        source, feed = source_symbols(circuit, source, ablation, feed)
    if method == "eap":
        scores = _eap(g, source, ablation, metric, clean, feed, dtype, mode)
        return Discovery(g, scores, method, **result)
    if method == "exact":
        scores = _exact(circuit, g, source, ablation, metric, clean, feed, dtype, batch_size)
        return Discovery(g, scores, method, **result)
    if method in ("eap-ig-mask", "eap-ig"):
        integrated = _eap_ig_mask if method == "eap-ig-mask" else _eap_ig
        scores = integrated(g, source, ablation, metric, clean, feed, steps, dtype, mode=mode)
        return Discovery(g, scores, method, info={"steps": steps}, **result)
    masked = patch_edges(circuit, None, source, ablation=ablation, mask=True)
    obj = Objective(metric_node(masked, metric, clean=clean), feed, dtype, batch_size)
    scores, kept = _acdc(obj, g, tau, signed=isinstance(metric, str))
    found = FoundCircuit(g, kept, source, ablation=ablation, unranked="ACDC keeps a set of edges, not a ranking")
    return Discovery(g, scores, method, found=found, info={"tau": tau}, **result)


def batch_setup(circuit: Circuit, source, inputs, ablation: str):
    """For a batch (``inputs`` given): the circuit over Symbols standing for the batched inputs,
    the source as Symbols ``'<input>.source'`` (resample) and the feed ``{Symbol: rows}``."""
    if inputs is None:
        return circuit, source, {}
    given = resolve_inputs(circuit, inputs, "inputs", batched=True)
    sizes = {v.shape[0] for _, v in given.values()}
    if len(sizes) != 1 or 0 in sizes:
        raise CircuitError(f"inputs: give one non-empty batch (a leading axis of the same size), got sizes {sorted(sizes)}")
    symbols = {node: node if isinstance(node, Symbol) else Symbol(node.shape, name=node.name, dtype=node.dtype)
               for node, _ in given.values()}
    feed = {symbols[node]: v for node, v in given.values()}
    circuit = replace(circuit, {k: v for k, v in symbols.items() if k is not v})
    if ablation != "resample":
        return circuit, source, feed
    if source is None:
        raise CircuitError("ablation='resample' needs source=, the corrupted values in the layout of inputs=")
    src = resolve_inputs(circuit, source, "source", batched=True)
    out = {}
    for node, v in src.values():
        if v.shape[0] not in sizes:
            raise ShapeError(f"source[{node.name!r}] has {v.shape[0]} rows; inputs= has {sizes.pop()}: give one "
                             "corrupted row per clean row")
        sym = Symbol(node.shape, name=f"{node.name}.source", dtype=node.dtype)
        out[node] = sym
        feed[sym] = v
    return circuit, out, feed


def source_symbols(circuit: Circuit, source, ablation: str, feed: dict):
    """One example's resampled source given as values: ``(the source as Symbols
    '<input>.source', a copy of feed binding them to those values)``, so that a gradient method's
    program and its layout (``EdgeScores``, kept per source *structure*) serve every new corrupted
    example of the same shapes instead of being built and lowered again for each; else ``(source,
    feed)`` as they are (a batch's source is Symbols already, ``batch_setup``)."""
    if ablation != "resample" or feed or not isinstance(source, Mapping):
        return source, feed
    resolved = resolve_inputs(circuit, source, "source")
    if not resolved or any(isinstance(v, Circuit) for _, v in resolved.values()):
        return source, feed
    symbols, feed = {}, dict(feed)
    for node, v in resolved.values():
        sym = Symbol(node.shape, name=f"{node.name}.source", dtype=node.dtype)
        symbols[node] = sym
        feed[sym] = v
    return symbols, feed


def clean_for(circuit: Circuit, metric, feed: dict, dtype):
    """What ``metric_node`` compares with for ``'kl'``: the clean logits (one example) or a
    Symbol of their log-probabilities fed per row (a batch); None for other metrics."""
    if not isinstance(metric, str):
        return None

    if not feed:
        return evaluate(circuit, dtype=dtype)
    logits = np.asarray(evaluate_batched(circuit, {k: v for k, v in feed.items() if not k.name.endswith(".source")},
                                         dtype=dtype), np.float64)
    fdt = "float64" if str(dtype) == "float64" else "float32"
    sym = Symbol(circuit.shape, name="metric.clean_log_probs", dtype=fdt)
    feed[sym] = log_softmax(logits).astype(fdt)
    return sym


_VALUES: dict = {}  # (metric node hash, dtype) -> MaskedValues: a warm discover re-lowers nothing


class Objective:
    """The mean metric over the batch (or the one example) of the masked program."""

    def __init__(self, m: Circuit, feed: dict, dtype, batch_size):
        self.m, self.feed, self.dtype, self.batch_size = m, feed, dtype, batch_size
        self.mask = _mask_symbol(m)
        self.rows = next(iter(feed.values())).shape[0] if feed else 1
        self._compiled = None

    def values(self, masks: np.ndarray, extra: dict | None = None, pad: bool = True) -> np.ndarray:
        """The metric for each mask row ``[K, edges] -> [K]``: one compiled program, run on
        chunks of masks (all masks up to 256 example rows, padded to a multiple of CHUNK, so
        that the calls of this program, e.g. a curve's sizes, share it; ``pad=False``: not
        padded, for a program always run on the same number of masks)."""
        masks = np.asarray(masks, np.float32)
        total = len(masks) * self.rows
        rows = self.batch_size or min(256, -(-total // CHUNK) * CHUNK if pad else total)
        chunk = max(1, rows // self.rows)
        return self._values()(masks, {**self.feed, **(extra or {})}, chunk)

    def value(self, mask: np.ndarray) -> float:
        return float(self._values()(np.asarray(mask, np.float32)[None], self.feed, 1)[0])

    def _values(self):
        if self._compiled is None:
            self._compiled = _VALUES.get((self.m.hash, str(self.dtype)))
            if self._compiled is None:
                self._compiled = MaskedValues(self.m, self.mask, self.dtype)
                if len(_VALUES) >= 8:
                    _VALUES.pop(next(iter(_VALUES)))
                _VALUES[(self.m.hash, str(self.dtype))] = self._compiled
        return self._compiled


_MASKS: dict = {}  # metric node hash -> its mask Symbol (a warm discover walks nothing)


def _mask_symbol(m: Circuit):
    found = _MASKS.get(m.hash)
    if found is None:
        found = next(n for n in toposort(m) if n.name == MASK_NAME and not n.children)
        if len(_MASKS) >= 64:
            _MASKS.pop(next(iter(_MASKS)))
        _MASKS[m.hash] = found
    return found


def _exact(circuit, g: Edges, source, ablation: str, metric, clean, feed: dict, dtype, batch_size) -> np.ndarray:
    """Each edge patched alone, ``m(mask = e_i) - m(clean)``: one row-sparse program over the
    split circuit (``ExactScores``: each node computed only for the edges upstream
    of it) where its rows fit ``_exact.ROWS_BYTES`` and no ``batch_size`` is asked for, else the masked
    program part by part (``_ExactParts``).  Either is kept on the graph (``scorer_for``) under
    the metric (``_metric_key``: the weights' or the clean logits' digest; a function's node
    hash), the ablation, the source's fingerprint, the dtype, ``batch_size`` and the feed's rows,
    so a warm call binds its feed and runs."""
    split, resid, senders = split_circuit(g)
    what = _metric_key(metric, clean)
    m = metric_node(split, metric, clean=clean) if what is None else None
    rows = next(iter(feed.values())).shape[0] if feed else 1
    key = ("exact", what or m.hash, ablation, fingerprint(source), str(dtype), batch_size, rows)

    def make():
        if batch_size is None:
            node = m if m is not None else metric_node(split, metric, clean=clean)
            scorer = ExactScores(g, node, resid, senders, source, ablation, dtype)
            if scorer.fits(rows):
                return scorer
        return _ExactParts(circuit, g, source, ablation, metric, clean, dtype, batch_size)

    return scorer_for(g, key, make)(feed)


def _metric_key(metric, clean) -> tuple | None:
    """What ``metric_node(out, metric, clean=clean)`` is made of, as a key without making it: the
    kind and a digest of the weights or of the clean logits (None: a function or anything else,
    keyed by its node's hash)."""
    def digest(v):
        if not isinstance(v, Circuit) and np.asarray(v).dtype.kind not in "biuf":
            raise TypeError
        return value_digest(v)

    try:
        if metric is None:
            return ("sum",)
        if isinstance(metric, str):
            return ("named", metric, None if clean is None else digest(clean))
        if callable(metric) or isinstance(metric, Circuit):
            return None
        return ("weights", digest(metric))
    except (TypeError, ValueError):
        return None


class _ExactParts:
    """``parts(feed) -> [edges]``: ``'exact'`` for a circuit whose row-sparse run is too large:
    the edges in at most 4 parts of consecutive destination groups (destinations that read the
    same senders: a layer's heads), each part one batched evaluation of the masked program
    covering only its edges (what lies upstream of the part's destinations computed once, not
    once per edge); the parts' metric nodes are made once."""

    def __init__(self, circuit, g: Edges, source, ablation: str, metric, clean, dtype, batch_size):
        groups: dict[tuple, list[int]] = {}
        at = 0
        for d in g._dests:
            groups.setdefault(tuple(d.sources), []).extend(range(at, at + len(d.sources)))
            at += len(d.sources)
        parts = list(groups.values())
        if len(parts) > 4:  # merged, in order, to about equal numbers of edges
            size, merged = -(-len(g) // 4), [[]]
            for part in parts:
                if len(merged[-1]) >= size:
                    merged.append([])
                merged[-1].extend(part)
            parts = merged
        self.n, self.dtype, self.batch_size = len(g), dtype, batch_size
        self.parts = [(part, metric_node(patch_edges(circuit, [g[i] for i in part], source, ablation=ablation,
                                                     mask=True), metric, clean=clean)) for part in parts]

    def __call__(self, feed: dict) -> np.ndarray:
        scores = np.empty(self.n, np.float64)
        for part, m in self.parts:
            k = len(part)
            obj = Objective(m, feed, self.dtype, self.batch_size)
            values = obj.values(np.concatenate([np.zeros((1, k), np.float32), np.eye(k, dtype=np.float32)]),
                                pad=False)
            scores[part] = values[1:] - values[0]
        return scores


def _eap(g: Edges, source, ablation: str, metric, clean, feed: dict, dtype, mode: str = "auto") -> np.ndarray:
    """Syed et al.: every edge's ``(patched sender - sender) . dm/d(destination input)`` from
    one compiled forward and backward pass of the circuit with each destination reading its own
    residual sum (``_scores``)."""
    split, resid, senders = split_circuit(g)
    m = metric_node(split, metric, clean=clean)
    key = ("eap", m.hash, ablation, fingerprint(source), str(dtype))
    scorer = scorer_for(g, key, lambda: EdgeScores(g, m, resid, senders, source, ablation, dtype))
    return scorer(feed, mode)


def _eap_ig_mask(g: Edges, source, ablation: str, metric, clean, feed: dict, steps: int, dtype,
                 chunk: int | None = None, mode: str = "auto") -> np.ndarray:
    """auto-circuit's integrated gradients: ``dm/d mask`` averaged over the masks ``k/steps . 1``,
    from the circuit whose every edge has the weight ``alpha`` (``_scores.uniform_circuit``):
    the gradient at every destination's sum times its senders' differences, the steps ``alpha =
    k/steps`` run by one program vmapped over ``chunk`` of them (by default as many as fit
    ``_scores.STEPS_BYTES``), the patched senders computed once a call."""
    circuit, resid, senders, patched, alpha = uniform_circuit(g, source, ablation)
    m = metric_node(circuit, metric, clean=clean)
    key = ("eap-ig-mask", m.hash, ablation, fingerprint(source), str(dtype))
    scorer = scorer_for(g, key, lambda: EdgeScores(g, m, resid, senders, None, ablation, dtype, patched=patched))
    return scorer.integrated(alpha, np.arange(steps + 1) / steps, feed, chunk, mode)


def _eap_ig(g: Edges, source, ablation: str, metric, clean, feed: dict, steps: int, dtype,
            chunk: int | None = None, mode: str = "auto") -> np.ndarray:
    """Hanna et al.: the gradients at every destination's sum in the runs whose embeddings go from
    the source's to the clean ones (``_scores.interpolated_circuit``) times the fixed
    clean-to-source sender differences (per row for a batch), the steps ``alpha = k/steps`` run by
    one program vmapped over ``chunk`` of them, the clean and patched senders computed once a call."""
    circuit, resid, patched, alpha = interpolated_circuit(g, source, ablation)
    m = metric_node(circuit, metric, clean=clean)
    key = ("eap-ig", m.hash, ablation, fingerprint(source), str(dtype))
    scorer = scorer_for(g, key, lambda: EdgeScores(g, m, resid, g._sources, None, ablation, dtype, patched=patched))
    return scorer.integrated(alpha, np.arange(steps) / steps, feed, chunk, mode)


def _acdc(obj: Objective, g: Edges, tau: float, *, signed: bool):
    mask = np.zeros(len(g), np.float32)
    current = obj.value(mask)
    if not np.isfinite(current):  # every change would be NaN, and NaN < tau keeps every edge
        raise CircuitError(f"discover: the metric is {current} on the clean run; ACDC needs a finite metric")
    scores = np.zeros(len(g), np.float64)
    order = [g.index(f"{s} -> {d.label}") for d in reversed(g._dests) for s in reversed(d.sources)]
    for i in order:
        mask[i] = 1.0
        value = obj.value(mask)
        change = value - current
        if not np.isfinite(change):
            raise CircuitError(f"discover: the metric is {value} with the edge {g[i]!r} removed (ACDC, after "
                               f"{int(mask.sum()) - 1} edges removed); ACDC needs a finite metric")
        scores[i] = change
        if (change if signed else abs(change)) < tau:
            current = value
        else:
            mask[i] = 0.0
    kept = [g[i] for i in range(len(g)) if mask[i] == 0.0]
    return scores, kept
