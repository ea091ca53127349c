"""Attribution graphs for one prompt: exact direct effects between SAE features, errors, tokens, logits.

The computation is circuit tracing's *local replacement model*, built on the DAG:

1. SAEs (or transcoders) are spliced in (``splice``); one forward pass records every value below.
2. **Linearisation.**  Every attention pattern (each ``softmax``) and every normalisation scale
   (each ``rsqrt``: LayerNorm and RMSNorm denominators) is replaced by a constant Array of its
   clean value; the SAE latents ``'<site>.sae.acts'``, the errors ``'<site>.sae.error'`` and the
   token embeddings become the graph's *leaves*.  With those held, every remaining node between
   the leaves and the targets is affine in the leaves (this is checked: a nonlinearity left on
   such a path, e.g. an MLP without a transcoder, is an error naming it).  At the clean leaves the
   frozen circuit reproduces the original values exactly; elsewhere it is the first-order,
   pattern-and-scale-frozen model, not the network.
3. **Edges.**  A target's *readout* is its pre-activation without the encoder bias (a feature,
   ``z @ W_enc[:, i]``) or its demeaned logit (``logit_v - mean(logits)`` at ``position``).  The
   edge from source ``s`` (value ``v_s``: a feature's activation, an error vector, a token's
   embedding) to target ``t`` is ``A[t, s] = v_s . d readout_t / d v_s`` in the frozen circuit:
   exactly the change of the target when the source is removed (set to 0), since the circuit is
   affine in the leaves.  Every position is kept, the first (BOS) included (circuit tracing zeroes
   position 0's features and errors; here they are nodes like the others).  All rows come from one ``jax.vjp`` of the frozen circuit (its forward
   work done once) applied to a batch of one-hot cotangents (``batch_size`` targets per call).
4. **Pruning** (circuit tracing's rule): row-normalise ``|A|``, node influence on the logits
   ``w (Â + Â² + ...)`` (``w``: the target logits' probabilities), keep the nodes carrying
   ``node_threshold`` of the influence (tokens and logits always), then the edges carrying
   ``edge_threshold`` of the edge influence, then drop features and errors left without an
   outgoing edge (features also without an incoming one).

The result, an ``AttributionGraph``, prints its strongest edges, saves as JSON (``to_json``: the
circuit-tracer frontend's ``{metadata, qParams, nodes, links}`` schema, documented there) and
plots with matplotlib (``plot``, the ``plot`` extra).

>>> import numpy as np
>>> from circuits.models import attn_only, random_weights
>>> from circuits.interp.sae import SAE
>>> w = random_weights(vocab=11, d_model=8, n_heads=2, head_size=4, n_layers=2, max_positions=16)
>>> logits = attn_only(w, np.array([0, 3, 4, 3, 4, 5]), logits=True, unique_names=True)
>>> saes = {'b0': SAE.random(8, 16, seed=0), 'b1': SAE.random(8, 16, seed=1)}
>>> g = attribution_graph(logits, saes, max_logits=2)
>>> g.adjacency.shape[0] == len(g.nodes), sorted({n['kind'] for n in g.nodes})
(True, ['error', 'feature', 'logit', 'token'])
"""

from __future__ import annotations

import json
import numbers
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from ..errors import CircuitError
from ..nodes import Array, Circuit, Einsum, GeneralFunction, Symbol
from ..select import Name, get_unique
from ..traversal import replace, toposort
from .checks import check_count
from .sae import SAE
from .sites import one_root, resolve_site
from .splice import splice

__all__ = ["attribution_graph", "AttributionGraph", "FROZEN_FUNCTIONS"]

FROZEN_FUNCTIONS = ("softmax", "rsqrt")
"""GeneralFunctions frozen to their clean values: attention patterns and normalisation scales."""


_SHAPE_ONLY = ("last_dim_size",)  # functions whose value depends only on their argument's shape


# ---------------------------------------------------------------------------- pruning
def _normalised(adj: np.ndarray) -> np.ndarray:
    a = np.abs(adj)
    return a / np.maximum(a.sum(axis=1, keepdims=True), 1e-10)


def _influence(norm: np.ndarray, w: np.ndarray, cap: int = 1000) -> np.ndarray:
    """``w (Â + Â² + ...)`` by repeated products (the graph is a DAG, so Â is nilpotent)."""
    total = np.zeros_like(w)
    v = w.copy()
    for _ in range(cap):
        v = v @ norm
        if not np.any(v):
            return total
        total += v
    raise CircuitError("attribution graph: influence did not converge; the adjacency has a cycle")


def _threshold(scores: np.ndarray, fraction: float) -> float:
    """The smallest score among those that carry ``fraction`` of the total (sorted descending)."""
    flat = np.sort(scores.ravel())[::-1]
    total = flat.sum()
    if total <= 0:
        return 0.0
    cum = np.cumsum(flat) / total
    k = min(int(np.searchsorted(cum, fraction)), len(flat) - 1)
    return float(flat[k])


def prune(adj: np.ndarray, w: np.ndarray, kinds: Sequence[str], node_threshold: float = 0.8,
          edge_threshold: float = 0.98) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(node_mask, edge_mask, cumulative_influence)`` for an adjacency (row = target, column =
    source) and logit weights ``w`` (see the module docstring; ``kinds[i]`` is the node's kind).

    >>> adj = np.array([[0, 0, 0], [2.0, 0, 0], [1.0, 3.0, 0]])   # 0 -> 1 -> 2 (the logit), 0 -> 2
    >>> nodes, edges, _ = prune(adj, np.array([0, 0, 1.0]), ['token', 'feature', 'logit'])
    >>> nodes.tolist(), int(edges.sum())
    ([True, True, True], 3)
    """
    n = adj.shape[0]
    kinds = np.asarray(kinds)
    always = (kinds == "token") | (kinds == "logit")
    norm = _normalised(adj)
    infl = _influence(norm, w)
    order = np.argsort(-infl, kind="stable")
    total = infl.sum()
    cumulative = np.ones(n)
    if total > 0:
        cumulative[order] = np.cumsum(infl[order]) / total
    node_mask = always | (infl >= _threshold(infl, node_threshold)) & (infl > 0)
    pruned = adj * node_mask[:, None] * node_mask[None, :]
    norm_p = _normalised(pruned)
    infl_p = _influence(norm_p, w)
    scores = norm_p * (infl_p + w)[:, None]
    edge_mask = (scores >= _threshold(scores, edge_threshold)) & (scores > 0)
    prunable = ~always
    while True:
        out_ok = edge_mask.any(axis=0)
        in_ok = edge_mask.any(axis=1)
        keep = node_mask & ~(prunable & ~out_ok) & ~((kinds == "feature") & ~in_ok)
        edge_mask = edge_mask & keep[:, None] & keep[None, :]
        if (keep == node_mask).all():
            break
        node_mask = keep
    return node_mask, edge_mask, cumulative


# ---------------------------------------------------------------------------- the graph
class AttributionGraph:
    """An attribution graph for one prompt (see the module docstring).

    - ``nodes``: one dict per node, in order features (site order, position, index), errors (site,
      position), tokens (position), logits: ``{'id', 'kind', 'layer', 'site', 'pos', 'feature',
      'activation', 'token', 'probability'}`` (None where it does not apply);
    - ``adjacency`` [N, N]: ``A[target, source]``, the exact direct effects;
    - ``node_mask``, ``edge_mask``: what pruning kept; ``influence``: each node's cumulative
      influence score (small = important; circuit tracing's ``influence``);
    - ``logit_weights`` [N]: the target logits' probabilities (0 for other nodes);
    - ``frozen``: the linearised circuit, for checks: ``{'targets': [node per site (pre-activations)
      ..., logits], 'leaves': {name: Symbol}, 'values': {name: clean value}, 'sites': [...]}``.
    """

    def __init__(self, nodes, adjacency, logit_weights, node_mask, edge_mask, influence, frozen, metadata):
        self.nodes = nodes
        self.adjacency = adjacency
        self.logit_weights = logit_weights
        self.node_mask = node_mask
        self.edge_mask = edge_mask
        self.influence = influence
        self.frozen = frozen
        self.metadata = metadata
        self.index = {n["id"]: i for i, n in enumerate(nodes)}

    def edges(self, pruned: bool = True) -> list[tuple[str, str, float]]:
        """``[(source id, target id, weight)]``, strongest first (the kept edges by default)."""
        mask = self.edge_mask if pruned else self.adjacency != 0
        t, s = np.nonzero(mask)
        weights = self.adjacency[t, s]
        order = np.argsort(-np.abs(weights), kind="stable")
        return [(self.nodes[s[i]]["id"], self.nodes[t[i]]["id"], float(weights[i])) for i in order]

    def edge(self, source: str, target: str) -> float:
        """The direct effect of node ``source`` on node ``target`` (ids), pruned or not."""
        for key in (source, target):
            if key not in self.index:
                raise CircuitError(f"attribution graph: no node {key!r}; ids look like {self.nodes[0]['id']!r}")
        return float(self.adjacency[self.index[target], self.index[source]])

    def __repr__(self):
        kept = int(self.node_mask.sum())
        return (f"<AttributionGraph {len(self.nodes)} nodes ({kept} kept), "
                f"{int((self.adjacency != 0).sum())} edges ({int(self.edge_mask.sum())} kept)>")

    def __str__(self):
        lines = [repr(self)]
        for n in self.nodes:
            if n["kind"] == "logit":
                lines.append(f"  target {n['id']}: token {n['token']} p={n['probability']:.3f}")
        lines.append("  strongest kept edges (source -> target: weight):")
        for s, t, w in self.edges()[:20]:
            lines.append(f"    {s} -> {t}: {w:+.4f}")
        return "\n".join(lines)

    def to_json(self, path=None, *, slug: str = "graph") -> dict:
        """The graph in the circuit-tracer frontend's schema (written to ``path`` if given):
        ``{'metadata': {slug, scan, prompt_tokens, prompt, node_threshold, schema_version},
        'qParams': {...}, 'nodes': [...], 'links': [{source, target, weight}]}``.  Node fields:
        ``node_id`` (``'<layer>_<feature>_<pos>'`` for features, ``'E_<token>_<pos>'`` tokens,
        ``'<L+1>_<token>_<pos>'`` logits, ``'0_<layer>_<pos>'`` errors as circuit-tracer spells
        them; here an error id is prefixed ``'err_'`` so it can never equal a feature id),
        ``feature``, ``layer``, ``ctx_idx``, ``feature_type``, ``token_prob``, ``is_target_logit``,
        ``influence``, ``activation``, ``clerp``; the kept nodes and edges only."""
        types = {"feature": "cross layer transcoder", "error": "mlp reconstruction error",
                 "token": "embedding", "logit": "logit"}
        keep = self.node_mask
        first_logit = next((i for i, n in enumerate(self.nodes) if n["kind"] == "logit"), None)
        nodes = []
        for i, n in enumerate(self.nodes):
            if not keep[i]:
                continue
            nodes.append({
                "node_id": n["id"], "feature": n["feature"] if n["kind"] != "error" else -1,
                "layer": str(n["layer"]), "ctx_idx": n["pos"], "feature_type": types[n["kind"]],
                "token_prob": n["probability"] or 0.0, "is_target_logit": i == first_logit,
                "run_idx": 0, "reverse_ctx_idx": 0, "jsNodeId": n["id"],
                "clerp": (f'Output "{n["token"]}" (p={n["probability"]:.3f})' if n["kind"] == "logit" else ""),
                "influence": None if n["kind"] == "logit" else float(self.influence[i]),
                "activation": n["activation"] if n["kind"] == "feature" else None,
            })
        t, s = np.nonzero(self.edge_mask)
        links = [{"source": self.nodes[j]["id"], "target": self.nodes[i]["id"], "weight": float(self.adjacency[i, j])}
                 for i, j in zip(t, s)]
        doc = {"metadata": {"slug": slug, "scan": "circuits", "prompt_tokens": [str(x) for x in self.metadata["tokens"]],
                            "prompt": " ".join(str(x) for x in self.metadata["tokens"]),
                            "node_threshold": self.metadata["node_threshold"], "schema_version": 1},
               "qParams": {"pinnedIds": [], "supernodes": [], "linkType": "both", "clickedId": "", "sg_pos": ""},
               "nodes": nodes, "links": links}
        if path is not None:
            Path(path).write_text(json.dumps(doc))
        return doc

    def node_label(self, i: int) -> str:
        """The short label ``plot`` writes beside node ``i``: a feature's index (``f17``), ``err``,
        a token's id (``t5``) or the logit's token (``→5``)."""
        n = self.nodes[i]
        return {"feature": lambda: f"f{n['feature']}", "error": lambda: "err", "token": lambda: f"t{n['token']}",
                "logit": lambda: f"→{n['token']}"}[n["kind"]]()

    def layout(self) -> dict[int, tuple[float, float]]:
        """Where ``plot`` draws each kept node: ``{node index: (x, y)}``.  x is the column of the
        node's position among the positions that hold a kept node (empty positions take no room);
        y is its row (tokens 0, layer ``l`` at ``l + 1``, logits at the top), the nodes that share a
        (position, row) cell stacked within the row, so that no two sit on each other."""
        n_layers = self.metadata["n_layers"]
        kept = [int(i) for i in np.nonzero(self.node_mask)[0]]
        columns = {p: c for c, p in enumerate(sorted({self.nodes[i]["pos"] for i in kept}))}
        cells: dict[tuple[int, int], list[int]] = {}
        for i in kept:
            n = self.nodes[i]
            row = {"token": 0, "logit": n_layers + 1}.get(n["kind"], n["layer"] + 1)
            cells.setdefault((columns[n["pos"]], row), []).append(i)
        order = {"token": 0, "feature": 1, "error": 2, "logit": 3}
        at = {}
        for (col, row), members in cells.items():
            members.sort(key=lambda i: (order[self.nodes[i]["kind"]], self.nodes[i]["feature"] or 0,
                                        self.nodes[i]["token"] or 0))
            step = min(0.8 / len(members), 0.25)
            for j, i in enumerate(members):
                at[i] = (float(col), row + (j - (len(members) - 1) / 2) * step)
        return at

    def plot(self, ax=None, *, max_edges: int = 200, labels: bool = True, title: str | None = None):
        """Draw the kept graph with matplotlib: x the positions that hold kept nodes, y the layer
        (tokens at the bottom, logits on top), the nodes of one position and layer stacked
        (``layout``); edge width by |weight|, blue positive, red negative; each kept node labelled
        (``node_label``: ``f17`` a feature, ``err``, ``t5`` a token, ``→5`` a logit; ``labels=False``
        leaves them out), a legend of node kinds and edge signs, and a title.  Without ``ax`` the
        figure is sized so that labels do not overlap.  Returns the axes."""
        try:
            import matplotlib.pyplot as plt
            from matplotlib.lines import Line2D
        except ImportError:  # pragma: no cover - depends on the environment
            raise CircuitError("AttributionGraph.plot needs matplotlib: pip install 'circuits[plot]'") from None
        n_layers = self.metadata["n_layers"]
        at = self.layout()
        columns = sorted({self.nodes[i]["pos"] for i in at})
        if ax is None:
            tallest = max((sum(1 for j in at if at[j][0] == x and round(at[j][1]) == round(y)) for x, y in at.values()),
                          default=1)
            width = 2.5 + 0.5 * max(len(columns), 8)
            height = 1.2 + (n_layers + 2) * max(0.8, 0.17 * tallest)
            _, ax = plt.subplots(figsize=(width, height))
        t, s = np.nonzero(self.edge_mask)
        w = self.adjacency[t, s]
        order = np.argsort(-np.abs(w))[:max_edges]
        top = np.abs(w[order]).max() if len(order) else 1.0
        for k in order:
            if s[k] not in at or t[k] not in at:
                continue
            (x0, y0), (x1, y1) = at[s[k]], at[t[k]]
            ax.plot([x0, x1], [y0, y1], color="tab:blue" if w[k] > 0 else "tab:red",
                    linewidth=0.3 + 2.5 * abs(w[k]) / top, alpha=0.5, zorder=1)
        colours = {"feature": "tab:green", "error": "tab:gray", "token": "black", "logit": "tab:purple"}
        for i, (x, y) in at.items():
            kind = self.nodes[i]["kind"]
            ax.scatter([x], [y], s=14, color=colours[kind], zorder=3)
            if labels:
                ax.annotate(self.node_label(i), (x, y), xytext=(4, 0), textcoords="offset points", fontsize=7,
                            va="center", color=colours[kind], zorder=4)
        ax.set_xticks(range(len(columns)), [str(p) for p in columns])
        ax.set_xlim(-0.5, len(columns) - 0.3)
        ax.set_yticks(range(n_layers + 2), ["tokens", *(f"layer {l}" for l in range(n_layers)), "logits"])
        ax.set_ylim(-0.6, n_layers + 1.6)
        ax.set_xlabel("position (positions without a kept node left out)")
        ax.set_ylabel("layer")
        kinds = [k for k in colours if any(self.nodes[i]["kind"] == k for i in at)]
        handles = [Line2D([], [], marker="o", ls="", color=colours[k], label=k) for k in kinds]
        handles += [Line2D([], [], color="tab:blue", label="positive edge"),
                    Line2D([], [], color="tab:red", label="negative edge")]
        ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
        ax.set_title(title or f"attribution graph: {len(at)} nodes, {int(self.edge_mask.sum())} edges kept")
        if ax.figure is not None:
            ax.figure.tight_layout()
        return ax


# ---------------------------------------------------------------------------- building
def _spliced_sites(circuit: Circuit) -> list[str]:
    """Sites with an SAE spliced in, in the order the circuit computes them."""
    order = toposort(circuit)
    return [n.name[: -len(".sae.acts")] for n in order if n.name is not None and n.name.endswith(".sae.acts")]


def _check_affine(targets: Sequence[Circuit], leaves: set[bytes]) -> None:
    """Every node between the leaves and the targets must be affine in the leaves."""
    depends: set[bytes] = set(leaves)
    for node in toposort(*targets):
        kids = [c for c in node.children if c.hash in depends]
        if not kids or (isinstance(node, GeneralFunction) and node.function.name in _SHAPE_ONLY):
            continue
        depends.add(node.hash)
        if isinstance(node, Einsum) and len(kids) > 1:
            raise CircuitError(f"attribution graph: {node.line()} multiplies two values that depend on the leaves "
                               "(features, errors, tokens); freeze one of them")
        if isinstance(node, GeneralFunction) and not node.function.linear:
            raise CircuitError(
                f"attribution graph: {node.line()} is nonlinear and lies between the leaves and the targets; "
                "splice a transcoder in place of its MLP (splice(c, '<mlp>', transcoder)) or freeze it "
                f"(freeze= names functions to hold at their clean values; default {FROZEN_FUNCTIONS})")


def _jax_function(targets: Sequence[Circuit], leaves: Sequence[Symbol], values: Mapping[str, np.ndarray], fdt: str):
    """``(f, clean leaves)``: ``f(*leaf values) -> tuple of target values``, a traceable function."""
    from ..backend import Lowered

    lowered = Lowered(list(targets), fdt)
    args = lowered.bind({s.name: values[s.name] for s in leaves})
    slots = {n.hash: i for i, n in enumerate(lowered.args)}
    where = [slots[s.hash] for s in leaves]
    run = lowered.traceable()

    def f(*leaf_values):
        a = list(args)
        for i, v in zip(where, leaf_values):
            a[i] = v
        return tuple(run(a))

    return f, [args[i] for i in where]


def attribution_graph(circuit: Circuit, saes: Mapping[str, SAE] | None = None, *, embeddings="idxed_embeds",
                      position: int = -1, targets: Sequence[int] | None = None, max_logits: int = 10,
                      logit_probability: float = 0.95, freeze: Sequence[str] = FROZEN_FUNCTIONS,
                      node_threshold: float = 0.8, edge_threshold: float = 0.98, batch_size: int = 128,
                      dtype: str = "float64", inputs: Mapping | None = None, tokens=None,
                      mode: str = "auto", max_feature_nodes: int | None = None) -> AttributionGraph:
    """The attribution graph of ``circuit``'s logits ([positions, vocab]) at ``position`` (see the
    module docstring).

    ``saes`` maps sites to SAEs (or transcoders at MLP outputs) to splice in first; without it
    the circuit must have them spliced already (``splice``).  ``embeddings``: the token-embedding
    node (a site).  Target logits: ``targets`` (token ids), else the most probable tokens, at most
    ``max_logits``, up to cumulative probability ``logit_probability``.  ``freeze``: the
    functions held at their clean values.  ``batch_size`` target rows per backward pass.
    ``max_feature_nodes``: compute the rows of at most this many features, visited in order of
    their influence on the logits as estimated from the rows computed so far (the logits' first,
    then re-estimated every ``4 * batch_size`` features, as circuit tracing does); the features
    not visited are left out of the graph, their edges into the visited ones with them.  ``None``
    (default): every active feature, whose count a large model's prompt can make too many for
    the dense adjacency (an error says so and names this argument).
    ``tokens`` (for labels only) defaults to the embedding gather's index values; ``mode`` is the
    clean forward pass's (as for ``evaluate``).

    >>> import numpy as np
    >>> from circuits.models import attn_only, random_weights
    >>> w = random_weights(vocab=11, d_model=8, n_heads=2, head_size=4, n_layers=1, max_positions=16)
    >>> c = splice(attn_only(w, np.arange(6), logits=True, unique_names=True), 'b0', SAE.random(8, 16))
    >>> g = attribution_graph(c, targets=[3])
    >>> [n['id'] for n in g.nodes if n['kind'] == 'logit']
    ['logit_3_3']
    """
    from ..backend import evaluate, precision

    if saes:
        for site, sae in saes.items():
            circuit = splice(circuit, site, sae)
    sites = _spliced_sites(circuit)
    if not sites:
        raise CircuitError("attribution graph: the circuit has no SAE spliced in; pass saes={site: sae} or splice first")
    if len(circuit.shape) != 2:
        raise CircuitError(f"attribution graph: the circuit must compute logits [positions, vocab]; got {circuit.line()}")
    n_pos, vocab = circuit.shape
    pos, top, freeze = _checked(position, targets, freeze, n_pos, vocab)
    batch_size = check_count(batch_size, "attribution graph", "batch_size", fix="target rows per backward pass")
    max_logits = check_count(max_logits, "attribution graph", "max_logits")
    max_feature_nodes = check_count(max_feature_nodes, "attribution graph", "max_feature_nodes", minimum=0, none=True,
                                    fix="a count of features")
    emb = resolve_site(circuit, embeddings, "embeddings")
    acts = [get_unique(circuit, Name(f"{s}.sae.acts")) for s in sites]
    errs = [get_unique(circuit, Name(f"{s}.sae.error")) for s in sites]
    pres = [get_unique(circuit, Name(f"{s}.sae.pre")) for s in sites]
    frozen_nodes = [n for n in toposort(circuit) if isinstance(n, GeneralFunction) and n.function.name in freeze]
    leaves_old = acts + errs + [emb]
    watch = leaves_old + pres + frozen_nodes
    fdt = "float64" if dtype == "float64" else "float32"
    logits_value, clean = evaluate(circuit, inputs, dtype=fdt, also=watch, mode=mode)
    logits_value = np.asarray(logits_value, np.float64)

    # The frozen circuit: leaves as Symbols, patterns and scales as constants.
    leaf_symbols = [Symbol(n.shape, name=n.name if n.name else "embeddings", dtype=n.dtype) for n in leaves_old]
    table = {n: s for n, s in zip(leaves_old, leaf_symbols)}
    for n in frozen_nodes:
        if n.hash not in {m.hash for m in leaves_old}:
            table[n] = Array(np.asarray(clean[n]).astype(np.dtype(n.dtype)), name=(n.name or "frozen") + ".frozen")
    roots = pres + [circuit]
    combined = replace(one_root(roots), table)
    frozen_targets = [c.children[0] for c in combined.children]
    _check_affine(frozen_targets, {s.hash for s in leaf_symbols})
    values = {s.name: np.asarray(clean[n]) for s, n in zip(leaf_symbols, leaves_old)}
    f, leaf_values = _jax_function(frozen_targets, leaf_symbols, values, fdt)

    # Target logits and the graph's nodes.
    row = logits_value[pos]
    probs = np.exp(row - row.max())
    probs /= probs.sum()
    if top is None:
        top = np.argsort(-probs, kind="stable")[:max_logits]
        cum = np.cumsum(probs[top])
        top = top[: int(np.searchsorted(cum, logit_probability)) + 1]
    if tokens is None:
        tokens = _embedding_tokens(emb, n_pos)
    nodes, feature_index = [], []
    for layer, (s, a) in enumerate(zip(sites, acts)):
        value = np.asarray(clean[a])
        active = np.argwhere(value.reshape(n_pos, -1) != 0)
        for p, i in active:
            nodes.append({"id": f"{layer}_{i}_{p}", "kind": "feature", "layer": layer, "site": s, "pos": int(p),
                          "feature": int(i), "activation": float(value.reshape(n_pos, -1)[p, i]),
                          "token": None, "probability": None})
            feature_index.append((layer, int(p), int(i)))
    for layer, s in enumerate(sites):
        for p in range(n_pos):
            nodes.append({"id": f"err_{layer}_{p}", "kind": "error", "layer": layer, "site": s, "pos": p,
                          "feature": None, "activation": None, "token": None, "probability": None})
    for p in range(n_pos):
        nodes.append({"id": f"E_{tokens[p]}_{p}", "kind": "token", "layer": -1, "site": None, "pos": p,
                      "feature": int(p), "activation": None, "token": tokens[p], "probability": None})
    for v in top:
        nodes.append({"id": f"logit_{int(v)}_{pos}", "kind": "logit", "layer": len(sites), "site": None, "pos": pos,
                      "feature": int(v), "activation": None, "token": int(v), "probability": float(probs[v])})

    with precision(fdt):
        adj, kept = _edges(f, leaf_values, frozen_targets, feature_index, top, probs[top], n_sites=len(sites), n_pos=n_pos,
                           vocab=vocab, pos=pos, n_err=len(sites) * n_pos, fdt=fdt, batch_size=batch_size,
                           jit=mode not in ("ops", "eager"), max_features=max_feature_nodes)
    if kept is not None:  # the features not visited leave the graph
        n_feat = len(feature_index)
        nodes = [nodes[k] for k in kept] + nodes[n_feat:]
    kinds = [n["kind"] for n in nodes]
    w = np.array([n["probability"] if n["kind"] == "logit" else 0.0 for n in nodes])
    node_mask, edge_mask, influence = prune(adj, w, kinds, node_threshold, edge_threshold)
    frozen = {"targets": frozen_targets, "leaves": {s.name: s for s in leaf_symbols}, "values": values,
              "sites": sites, "position": pos, "target_logits": [int(v) for v in top]}
    meta = {"tokens": list(tokens), "node_threshold": node_threshold, "n_layers": len(sites), "sites": sites}
    return AttributionGraph(nodes, adj, w, node_mask, edge_mask, influence, frozen, meta)


def _checked(position, targets, freeze, n_pos: int, vocab: int) -> tuple[int, np.ndarray | None, tuple]:
    """``(position, target token ids or None, frozen function names)`` checked against the logits'
    ``[n_pos, vocab]`` before anything runs (a float position or a string target was a raw
    IndexError or ValueError after the forward pass)."""
    if isinstance(position, bool) or not isinstance(position, numbers.Integral) or not -n_pos <= position < n_pos:
        raise CircuitError(f"attribution graph: position={position!r:.60}: give an int in {-n_pos}..{n_pos - 1} "
                           "(a position of the logits; negative counts from the end)")
    top = None
    if targets is not None:
        items = list(targets) if isinstance(targets, (Sequence, np.ndarray)) and not isinstance(targets, str) else None
        bad = items is None or not items or any(isinstance(t, bool) or not isinstance(t, numbers.Integral)
                                                   or not 0 <= t < vocab for t in items)
        if bad:
            raise CircuitError(f"attribution graph: targets={targets!r:.80}: give a non-empty list of token ids in "
                               f"0..{vocab - 1}, or None (the most probable tokens)")
        top = np.asarray([int(t) for t in items])
    if isinstance(freeze, str):
        freeze = (freeze,)
    if freeze is None or not isinstance(freeze, (Sequence, set, frozenset)) or not all(
            isinstance(f, str) for f in freeze):
        raise CircuitError(f"attribution graph: freeze={freeze!r:.80}: give the names of the functions held at their "
                           f"clean values (default {FROZEN_FUNCTIONS}; () for none)")
    return int(position) % n_pos, top, tuple(freeze)


def _edges(f, leaf_values, frozen_targets, feature_index, top, logit_weights, *, n_sites, n_pos, vocab, pos, n_err,
           fdt, batch_size, jit=True, max_features=None) -> tuple[np.ndarray, list[int] | None]:
    """``(adjacency, kept)``: one linearisation of the frozen circuit, then one batched transpose
    (vmap of the vjp) per block of ``batch_size`` target rows, the logits' first.  Every feature's
    row when ``max_features`` is None or covers them (``kept`` None); else the rows of the
    ``max_features`` features visited in order of estimated influence (``_visit``), and
    ``kept`` their indices in ``feature_index`` (ascending): the adjacency's nodes are those
    features, then errors, tokens and logits."""
    import jax
    import jax.numpy as jnp

    from ..shapes import check_allocation

    n_feat = len(feature_index)
    n_top = len(top)
    out_shapes = [t.shape for t in frozen_targets]
    jnp_dtype = jnp.float64 if fdt == "float64" else jnp.float32
    leaf_arrays = [jnp.asarray(v, jnp_dtype) for v in leaf_values]
    _, vjp = jax.vjp(f, *leaf_arrays)
    feat_by_layer = [[(p, i) for (l, p, i) in feature_index if l == layer] for layer in range(n_sites)]

    def rows(cots):
        grads = jax.vmap(vjp)(cots)
        cols = []
        for layer in range(n_sites):  # feature sources: activation times gradient, at the active entries
            g = grads[layer] * leaf_arrays[layer][None]
            ps = np.array([p for p, _ in feat_by_layer[layer]], dtype=np.int64)
            fs = np.array([i for _, i in feat_by_layer[layer]], dtype=np.int64)
            cols.append(g.reshape(g.shape[0], n_pos, -1)[:, ps, fs])
        for layer in range(n_sites):  # error sources: error vector dot gradient
            g = grads[n_sites + layer] * leaf_arrays[n_sites + layer][None]
            cols.append(g.reshape(g.shape[0], n_pos, -1).sum(-1))
        g = grads[2 * n_sites] * leaf_arrays[2 * n_sites][None]
        cols.append(g.reshape(g.shape[0], n_pos, -1).sum(-1))
        return jnp.concatenate(cols, axis=1)

    if jit:
        rows = jax.jit(rows)
    n_sources = n_feat + n_err + n_pos

    def compute(block, out: np.ndarray) -> None:
        """The rows of ``block`` (``('feature', k)`` or ``('logit', v)``) into ``out`` [len(block), n_sources]."""
        for start in range(0, len(block), batch_size):
            part = block[start:start + batch_size]
            cots = [np.zeros((batch_size,) + s, np.float64) for s in out_shapes]
            for b, (kind, k) in enumerate(part):
                if kind == "feature":
                    layer, p, i = feature_index[k]
                    cots[layer].reshape(batch_size, n_pos, -1)[b, p, i] = 1.0
                else:
                    cots[-1][b, pos, :] = -1.0 / vocab
                    cots[-1][b, pos, k] += 1.0
            got = np.asarray(rows(tuple(jnp.asarray(c, jnp_dtype) for c in cots)), np.float64)
            out[start:start + len(part)] = got[:len(part)]

    capped = max_features is not None and int(max_features) < n_feat
    n_kept = int(max_features) if capped else n_feat
    n_nodes = n_kept + n_err + n_pos + n_top
    hint = "" if capped else "; pass max_feature_nodes= (e.g. 7500) to visit only the most influential features"
    check_allocation((n_nodes + (n_kept + n_top if capped else 0), max(n_nodes, n_sources)), "float64",
                     lambda: f"attribution graph: the adjacency of {n_feat} active features, {n_err} errors, {n_pos} "
                             f"tokens and {n_top} logits{hint}")
    logit_targets = [("logit", int(v)) for v in top]
    if not capped:
        adj = np.zeros((n_nodes, n_nodes))
        compute(logit_targets, adj[n_sources:, :n_sources])
        compute([("feature", k) for k in range(n_feat)], adj[:n_feat, :n_sources])
        return adj, None
    logit_rows = np.zeros((n_top, n_sources))
    compute(logit_targets, logit_rows)
    kept, feature_rows = _visit(compute, logit_rows, logit_weights, n_feat=n_feat, limit=n_kept,
                                step=4 * batch_size)
    adj = np.zeros((n_nodes, n_nodes))
    columns = np.concatenate([np.asarray(kept, np.int64), np.arange(n_feat, n_sources)])
    adj[:n_kept, :n_nodes - n_top] = feature_rows[:, columns]
    adj[n_nodes - n_top:, :n_nodes - n_top] = logit_rows[:, columns]
    return adj, kept


def _visit(compute, logit_rows: np.ndarray, weights: np.ndarray, *, n_feat: int, limit: int,
           step: int) -> tuple[list[int], np.ndarray]:
    """``(kept, rows)``: the ``limit`` features whose rows are computed, in ascending order, and
    their rows [limit, sources].  They are visited ``step`` at a time, each time the unvisited
    features of highest influence on the logits (``_source_influence``) as estimated from the
    rows computed so far: at first the logits' direct edges, then paths through the visited
    features (ties: the lower index first)."""
    rows = np.zeros((limit, logit_rows.shape[1]))
    order: list[int] = []
    visited = np.zeros(n_feat, bool)
    logit_norm = _normalised(logit_rows)
    while len(order) < limit:
        done = len(order)
        estimate = _source_influence(logit_norm, weights, _normalised(rows[:done]), order)[:n_feat]
        estimate[visited] = -np.inf
        pick = np.argsort(-estimate, kind="stable")[:min(step, limit - done)]
        compute([("feature", int(k)) for k in pick], rows[done:done + len(pick)])
        order.extend(int(k) for k in pick)
        visited[pick] = True
    kept = sorted(order)
    at = {k: r for r, k in enumerate(order)}
    return kept, rows[[at[k] for k in kept]]


def _source_influence(logit_norm: np.ndarray, weights: np.ndarray, feature_norm: np.ndarray, features,
                      cap: int = 1000) -> np.ndarray:
    """Every source's influence on the logits, ``w (Â + Â² + ...)``, where Â holds the rows of the
    logits (``logit_norm``) and of the visited ``features`` (``feature_norm``, row k the source
    column ``features[k]``) only: the other rows are not known yet."""
    v = weights @ logit_norm
    total = v.copy()
    cols = np.asarray(features, np.int64)
    for _ in range(cap):
        if not len(cols):
            return total
        v = v[cols] @ feature_norm
        if not np.any(v):
            return total
        total += v
    raise CircuitError("attribution graph: influence did not converge; the adjacency has a cycle")


def _embedding_tokens(emb: Circuit, n_pos: int) -> list:
    """The token ids an embedding gather reads, when they are a constant; else positions."""
    if isinstance(emb, GeneralFunction) and len(emb.children) == 2:
        from ..backend import evaluate

        index = emb.children[1]
        if not any(isinstance(n, Symbol) for n in toposort(index)):
            values = np.asarray(evaluate(index)).ravel()
            if len(values) == n_pos:
                return [int(v) for v in values]
    return list(range(n_pos))
