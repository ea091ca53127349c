"""A found circuit: the edges a discovery method keeps, as a graph, a file and a plain circuit.

``FoundCircuit(graph, kept, source, ablation=...)`` holds the kept edge names of a model's
head-level graph (``edges``): ``edges`` lists them by decreasing |score| when the circuit comes
from a ranking (``Discovery.top`` and ``threshold``; ties in graph order), else in graph order
(ACDC's circuit, which has no single score per edge, a file read back), and the repr says which.
``.circuit`` is the pruned model, a plain circuit in which every
removed edge is patched (``patch_edges``), so it prints, saves and diffs like any other; ``.plot()``
draws the kept graph with matplotlib and the notebook view draws it as SVG; ``save(path)`` writes
the kept edges as a JSON list of names and ``FoundCircuit.load(path, circuit, source)`` reads
them back against the model.

>>> import numpy as np
>>> from circuits.models import attn_only, random_weights
>>> from circuits.interp import edges
>>> w = random_weights(vocab=11, d_model=8, n_heads=1, head_size=4, n_layers=2, max_positions=16)
>>> loss = attn_only(w, np.arange(6), unique_names=True)
>>> f = FoundCircuit(edges(loss), ['b0.a.head0 -> b1.a.head0.a.k', 'b1.a.head0 -> output'], None, ablation='zero')
>>> f
FoundCircuit(2 of 12 edges in graph order, ablation='zero')
  b0.a.head0 -> b1.a.head0.a.k
  b1.a.head0 -> output
>>> f.circuit.get_unique('b1.a.head0.a.k.resid').children[1].name
'b0.a.head0'
"""

from __future__ import annotations

import json
import os
from typing import Mapping

import numpy as np

from ...errors import CircuitError, StoreError
from ...nodes import Circuit
from ._graph import OUTPUT, Edges, edges, patch_edges

__all__ = ["FoundCircuit"]


class FoundCircuit:
    """The kept edges of a head-level graph, with the pruned model (``.circuit``)."""

    def __init__(self, graph: Edges, kept, source: Mapping | None, *, ablation: str = "resample", scores=None,
                 unranked: str | None = None):
        """``scores`` (one per edge of ``graph``, in its order): the ranking the edges were kept
        by, which orders ``edges`` by decreasing |score| (ties in graph order); None: graph order,
        ``unranked`` saying why in the repr (ACDC's circuit: a set of edges)."""
        idx = graph.resolve(list(kept), "kept edges")
        self.graph, self.source, self.ablation, self.unranked = graph, source, ablation, unranked
        if scores is None:
            order = sorted(idx)
            self.scores = None
        else:
            scores = np.asarray(scores, np.float64)
            order = sorted(idx, key=lambda i: (-abs(scores[i]), i))
            self.scores = {graph[i]: float(scores[i]) for i in order}
        self.edges = [graph[i] for i in order]
        self._circuit = None

    @property
    def removed(self) -> list[str]:
        kept = set(self.edges)
        return [e for e in self.graph if e not in kept]

    @property
    def circuit(self) -> Circuit:
        """The pruned model: every removed edge patched (a plain circuit)."""
        if self._circuit is None:
            self._circuit = patch_edges(self.graph.circuit, self.removed, self.source, ablation=self.ablation)
        return self._circuit

    def __len__(self):
        return len(self.edges)

    def __contains__(self, name):
        return name in set(self.edges)

    @property
    def order(self) -> str:
        """How ``edges`` is ordered: ``'by |score|'`` or ``'in graph order'``."""
        if self.scores is not None:
            return "by |score|"
        return f"in graph order ({self.unranked})" if self.unranked else "in graph order"

    SHOWN = 10  # edges the repr lists

    def __repr__(self):
        shown = self.SHOWN
        head = f"FoundCircuit({len(self.edges)} of {len(self.graph)} edges {self.order}, ablation={self.ablation!r})"
        rows = self.edges[:shown]
        width = max([len(e) for e in rows], default=0)
        lines = [f"  {e:<{width}}  {self.scores[e]:+.6g}" if self.scores is not None else f"  {e}" for e in rows]
        if len(self.edges) > shown:
            lines.append(f"  ... {len(self.edges) - shown} more")
        return "\n".join([head, *lines])

    # ------------------------------------------------------------------ files
    def save(self, path) -> None:
        """Write the kept edge names as a JSON list (atomically), in ``edges``' order; a list of
        names holds no scores, so ``load`` gives them back in graph order."""
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(self.edges, f, indent=1)
        os.replace(tmp, path)

    @classmethod
    def load(cls, path, circuit: Circuit, source: Mapping | None, *, ablation: str = "resample") -> "FoundCircuit":
        """Read a list of edge names saved by ``save`` against ``circuit`` (every name checked);
        its ``edges`` are in graph order."""
        try:
            with open(path) as f:
                names = json.load(f)
        except (OSError, ValueError) as e:
            raise StoreError(f"FoundCircuit.load: cannot read {str(path)!r} as a JSON list of edge names: {e}") from None
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise StoreError(f"FoundCircuit.load: {str(path)!r} does not hold a list of edge names")
        return cls(edges(circuit), names, source, ablation=ablation)

    # ------------------------------------------------------------------ drawing
    def layout(self) -> tuple[dict, list]:
        """Node positions ``{label: (x, y)}`` (y: layer order from the embeddings up; a head's
        q/k/v destinations drawn at the head) and the kept edges as
        ``(source, head, role)`` triples."""
        g = self.graph
        node_of = {}
        for d in g.destinations:
            node_of[d] = _owner(d, g.sources)
        levels: dict[str, int] = {"embeds": 0}
        for s in g.sources[1:]:
            levels[s] = 0
        # a node's level: one above the highest level among its kept-or-not senders
        for d in g._dests:
            owner = node_of[d.label]
            lvl = max((levels.get(s, 0) for s in d.sources), default=0) + 1
            levels[owner] = max(levels.get(owner, 0), lvl)
        rows: dict[int, list[str]] = {}
        for name, lvl in levels.items():
            rows.setdefault(lvl, []).append(name)
        pos = {}
        for lvl, names in rows.items():
            for i, name in enumerate(names):
                pos[name] = ((i + 1) / (len(names) + 1), lvl)
        kept = []
        for e in self.edges:
            s, d = e.split(" -> ", 1)
            owner = node_of[d]
            role = d[len(owner) + 1:].rsplit(".", 1)[-1] if d != owner and d.startswith(owner + ".") else ""
            kept.append((s, owner, role))
        return pos, kept

    def plot(self, ax=None, *, title: str | None = None):
        """Draw the kept graph with matplotlib (queries blue, keys green, values red, the rest
        grey; y: depth in the graph, the embeddings at 0), with a title, axis labels and a legend
        of the edge roles and node boxes.  Returns the axes."""
        try:
            import matplotlib.pyplot as plt
            from matplotlib.lines import Line2D
            from matplotlib.patches import Patch
        except ImportError:  # pragma: no cover - depends on the environment
            raise CircuitError("FoundCircuit.plot needs matplotlib: pip install 'circuits[plot]'") from None
        pos, kept = self.layout()
        depth = max(y for _, y in pos.values())
        if ax is None:
            _, ax = plt.subplots(figsize=(10, 1.4 + 1.1 * (1 + depth)))
        used = {s for s, _, _ in kept} | {d for _, d, _ in kept}
        for s, d, role in kept:
            (x0, y0), (x1, y1) = pos[s], pos[d]
            ax.annotate("", (x1, y1 - 0.12), (x0, y0 + 0.12),
                        arrowprops=dict(arrowstyle="->", color=_COLOURS.get(role, "0.4"), lw=1.2, alpha=0.8))
        for name, (x, y) in pos.items():
            ax.text(x, y, _short(name), ha="center", va="center", fontsize=7,
                    bbox=dict(boxstyle="round", fc="white" if name in used else "0.93",
                              ec="black" if name in used else "0.7"))
        ax.set_xlim(0, 1)
        ax.set_ylim(-0.5, depth + 0.9)
        ax.set_xticks([])
        ax.set_yticks(range(depth + 1))
        for side in ("top", "right", "bottom"):
            ax.spines[side].set_visible(False)
        ax.set_xlabel("the nodes of one depth, side by side")
        ax.set_ylabel("depth (embeddings: 0)")
        roles = {role for _, _, role in kept}
        handles = [Line2D([], [], color=_COLOURS[r], label={"q": "to a query", "k": "to a key", "v": "to a value"}[r])
                   for r in ("q", "k", "v") if r in roles]
        if roles - set(_COLOURS):
            handles.append(Line2D([], [], color="0.4", label="to an MLP or the output"))
        handles += [Patch(fc="white", ec="black", label="in the circuit"), Patch(fc="0.93", ec="0.7", label="left out")]
        ax.legend(handles=handles, fontsize=7, loc="upper left", framealpha=0.9)
        ax.set_title(title or f"{len(self.edges)} of {len(self.graph)} edges")
        return ax

    def _repr_html_(self):
        pos, kept = self.layout()
        top = max(y for _, y in pos.values())
        w, h = 720, 60 + 70 * top

        def xy(name):
            x, y = pos[name]
            return 20 + x * (w - 40), h - 30 - y * 70

        parts = [f'<svg width="{w}" height="{h}" xmlns="http://www.w3.org/2000/svg" font-size="9" '
                 'font-family="monospace">']
        for s, d, role in kept:
            (x0, y0), (x1, y1) = xy(s), xy(d)
            parts.append(f'<line x1="{x0:.0f}" y1="{y0 - 8:.0f}" x2="{x1:.0f}" y2="{y1 + 8:.0f}" '
                         f'stroke="{_COLOURS.get(role, "grey")}" stroke-opacity="0.7"/>')
        for name in pos:
            x, y = xy(name)
            import html

            parts.append(f'<text x="{x:.0f}" y="{y + 3:.0f}" text-anchor="middle">{html.escape(_short(name))}</text>')
        parts.append("</svg>")
        return (f"<p>{len(self.edges)} of {len(self.graph)} edges {self.order} (ablation {self.ablation})</p>"
                + "".join(parts))


_COLOURS = {"q": "tab:blue", "k": "tab:green", "v": "tab:red"}


def _owner(dest: str, sources: list[str]) -> str:
    """The graph node a destination belongs to: the head whose q/k/v input it is, the MLP, or
    ``'output'``."""
    if dest == OUTPUT or dest in sources:
        return dest
    best = ""
    for s in sources:
        if dest.startswith(s + ".") and len(s) > len(best):
            best = s
    if best:
        return best
    return dest.rsplit(".", 1)[0]  # a key-value head's k/v ('h0.attn.kv1.k' -> 'h0.attn.kv1')


def _short(name: str) -> str:
    return name.replace(".a.head", ".h").replace(".attn.head", ".h")
