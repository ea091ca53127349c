"""Circuit discovery: a score for every edge of a model's head-level graph, and the circuits they find.

``discover(circuit, source, metric, method=...)`` scores every edge of ``edges(circuit)`` by how
much patching it (its sender recomputed from ``source``, or zero / mean ablated: ``ablation=``)
changes the metric ``m``.  All methods work on one program: the masked circuit of ``patch_edges``
(``mask=True``), whose input ``'edges.mask'`` holds one weight per edge (0: clean, 1: patched).

- ``'exact'``: each edge patched alone, ``m(mask = e_i) - m(clean)``, all edges in one batched
  evaluation of the masked program;
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

``metric``: ``None`` (the output's sum), weights of the output's shape (``sum(w * output)``), a
function from the output node to a node (its values summed), or ``'kl'``: the KL divergence of
the output distribution from the clean one (the output must be logits ``[..., vocab]``), averaged
over positions: ACDC's metric.

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

from ..errors import CircuitError, ShapeError
from ..nodes import Add, Array, Circuit, Einsum, GeneralFunction, Scalar
from .edge_graph import ABLATIONS, MASK_NAME, Edges, edges, patch_edges
from .found import FoundCircuit

__all__ = ["discover", "Discovery", "METHODS", "metric_node"]

METHODS = ("eap", "eap-ig", "eap-ig-mask", "acdc", "exact")
_AXES = "abcdefghijklmnopqrstuvwxyz"


def metric_node(out: Circuit, metric, *, clean=None) -> Circuit:
    """The scalar node ``m`` of a metric spec on output ``out`` (see the module docstring);
    ``clean``: the clean output's value, which ``'kl'`` needs."""
    if metric is None:
        return Einsum.from_spec(_AXES[: out.ndim] + "->", out, name="metric")
    if isinstance(metric, str):
        if metric != "kl":
            raise CircuitError(f"metric={metric!r}: the named metric is 'kl'; otherwise give weights or a function")
        if out.ndim < 1 or clean is None:
            raise CircuitError(f"metric='kl' needs logits [..., vocab]; {out.line()} is not")
        logp_clean = _log_softmax(np.asarray(clean, np.float64))
        n = int(np.prod(out.shape[:-1]))
        p = Array((np.exp(logp_clean) / n).astype(np.float32), name="metric.clean_probs")
        logp = GeneralFunction("log_softmax", out, name="metric.log_probs")
        ax = _AXES[: out.ndim]
        cross = Einsum.from_spec(f"{ax},{ax},->", p, logp, Scalar(-1.0))
        entropy = float(np.sum(np.exp(logp_clean) * logp_clean) / n)
        return Add(cross, Scalar(entropy), name="metric.kl")
    if isinstance(metric, Circuit):
        raise CircuitError("metric= takes a function output -> node, an array of weights, 'kl' or None, not a node")
    if callable(metric):
        node = metric(out)
        if not isinstance(node, Circuit):
            raise CircuitError(f"metric(output) returned {type(node).__name__}; return a node built on the output")
        return Einsum.from_spec(_AXES[: node.ndim] + "->", node, name="metric") if node.ndim else node
    weights = np.asarray(metric)
    if weights.shape != out.shape:
        raise ShapeError(f"metric weights have shape {list(weights.shape)}; the output {out.line()} has shape "
                         f"{list(out.shape)}: give one weight per output value")
    ax = _AXES[: out.ndim]
    return Einsum.from_spec(f"{ax},{ax}->", out, Array(weights.astype(np.float32), name="metric.weights"),
                            name="metric")


def _log_softmax(x):
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


class Discovery:
    """Edge scores from ``discover``: ``result[edge name]`` is a score, ``scores`` all of them in
    ``edges`` order; it shows as a table sorted by |score|; ``top(k)`` and ``threshold(tau)``
    give a ``FoundCircuit`` (the edges kept); ``found`` is ACDC's own circuit (else None)."""

    def __init__(self, graph: Edges, scores: np.ndarray, method: str, *, source, ablation: str,
                 found: FoundCircuit | None = None, info: dict | None = None):
        self.graph, self.scores, self.method = graph, np.asarray(scores, np.float64), method
        self.source, self.ablation, self.found = source, ablation, found
        self.info = info or {}

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
        return self._found([i for i in self.ranking() if abs(self.scores[i]) >= tau])

    def _found(self, kept) -> FoundCircuit:
        return FoundCircuit(self.graph, [self.graph[i] for i in sorted(kept)], self.source, ablation=self.ablation)

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
             ablation: str = "resample", steps: int = 10, tau: float = 0.01, dtype="float32",
             batch_size: int | None = None) -> Discovery:
    """Score every edge of ``circuit``'s head-level graph (``edges``) by ``method`` (see the
    module docstring); ``circuit`` runs clean as built, ``source`` as in ``patch`` (for
    ``ablation='zero'``: None; for ``'mean'``: values with a leading batch axis); ``steps`` for
    the integrated-gradient methods, ``tau`` for ACDC; ``dtype`` as for ``evaluate``.

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
    if not isinstance(steps, (int, np.integer)) or steps < 1:
        raise CircuitError(f"discover: steps={steps!r}; give a positive number of integration steps")
    g = edges(circuit)
    masked = patch_edges(circuit, None, source, ablation=ablation, mask=True)
    clean = None
    if isinstance(metric, str):
        from ..backend import evaluate

        clean = evaluate(circuit, dtype=dtype)
    m = metric_node(masked, metric, clean=clean)
    n = len(g)
    if method == "exact":
        return Discovery(g, _exact(m, n, dtype, batch_size), method, source=source, ablation=ablation)
    if method == "eap":
        return Discovery(g, _mask_grad(m, np.zeros(n, np.float32), dtype), method, source=source, ablation=ablation)
    if method == "eap-ig-mask":
        total = np.zeros(n, np.float64)
        for k in range(steps + 1):
            total += _mask_grad(m, np.full(n, k / steps, np.float32), dtype)
        return Discovery(g, total / (steps + 1), method, source=source, ablation=ablation, info={"steps": steps})
    if method == "eap-ig":
        return Discovery(g, _eap_ig(circuit, g, source, ablation, metric, clean, steps, dtype), method,
                         source=source, ablation=ablation, info={"steps": steps})
    scores, kept = _acdc(m, g, tau, signed=isinstance(metric, str), dtype=dtype)
    found = FoundCircuit(g, kept, source, ablation=ablation)
    return Discovery(g, scores, method, source=source, ablation=ablation, found=found, info={"tau": tau})


def _exact(m: Circuit, n: int, dtype, batch_size) -> np.ndarray:
    from ..backend import evaluate_batched

    masks = np.concatenate([np.zeros((1, n), np.float32), np.eye(n, dtype=np.float32)])
    values = np.asarray(evaluate_batched(m, {MASK_NAME: masks}, dtype=dtype, batch_size=batch_size), np.float64)
    return values[1:] - values[0]


def _mask_grad(m: Circuit, at: np.ndarray, dtype) -> np.ndarray:
    from ..backend import value_and_grad

    mask = _mask_symbol(m)
    _, g = value_and_grad(m, mask, {mask: at}, dtype=dtype)
    return np.asarray(g, np.float64)


def _mask_symbol(m: Circuit):
    from ..traversal import toposort

    return next(n for n in toposort(m) if n.name == MASK_NAME and not n.children)


def _eap_ig(circuit, g: Edges, source, ablation, metric, clean, steps, dtype) -> np.ndarray:
    """Hanna et al.: gradients at runs whose embeddings go from the source's to the clean ones,
    times the fixed clean-to-source sender differences."""
    from ..backend import evaluate, value_and_grad
    from ..nodes import Symbol
    from ..traversal import replace
    from .edge_graph import EMBEDS, _masked, _patched_sources

    members = g._sources[EMBEDS]
    patched = _patched_sources(g, g.sources, source, ablation, None)
    # Sender differences (patched - clean), evaluated once.
    nodes = [m for s in g.sources for m in g._sources[s]] + [p for s in g.sources for p in patched[s]]
    from .sites import one_root

    _, vals = evaluate(one_root(nodes), dtype=dtype, also=nodes)
    diff = {}
    for s in g.sources:
        d = sum(np.asarray(vals[p], np.float64) - np.asarray(vals[c], np.float64)
                for c, p in zip(g._sources[s], patched[s]))
        diff[s] = Array(np.asarray(d, np.float32), name=f"{s}.delta")
    alpha = Symbol((), name="eap_ig.alpha", dtype="float32")
    interp_embeds = {}
    for c, p in zip(members, patched[EMBEDS]):
        ax = _AXES[: c.ndim]
        back = Add(c, Einsum.from_spec(f"{ax},->{ax}", p, Scalar(-1.0)))
        interp_embeds[c] = Add(p, Einsum.from_spec(f"{ax},->{ax}", back, alpha), name=f"{c.name}.interpolated")
    delta_form = _masked(g, list(range(len(g))), None, ablation, deltas=diff)
    run = replace(delta_form, interp_embeds)
    m = metric_node(run, metric, clean=clean)
    weights = _mask_symbol(m)
    total = np.zeros(len(g), np.float64)
    zeros = np.zeros(len(g), np.float32)
    for k in range(steps):
        _, grad = value_and_grad(m, weights, {weights: zeros, alpha: np.float32(k / steps)}, dtype=dtype)
        total += np.asarray(grad, np.float64)
    return total / steps


def _acdc(m: Circuit, g: Edges, tau: float, *, signed: bool, dtype):
    from ..backend import compile as compile_circuit

    f = compile_circuit(m, dtype=dtype)
    mask = np.zeros(len(g), np.float32)
    current = float(f({MASK_NAME: mask}))
    scores = np.zeros(len(g), np.float64)
    order = []
    for d in reversed(g._dests):
        for s in reversed(d.sources):
            order.append(g.index(f"{s} -> {d.label}"))
    for i in order:
        mask[i] = 1.0
        value = float(f({MASK_NAME: mask}))
        change = value - current
        scores[i] = change
        if (change if signed else abs(change)) < tau:
            current = value
        else:
            mask[i] = 0.0
    kept = [g[i] for i in range(len(g)) if mask[i] == 0.0]
    return scores, kept
