"""The token-level attention view: every head's pattern over the token strings, in a notebook.

``AttentionView(patterns, tokens)`` shows attention patterns (``[layers, heads, queries, keys]``,
each row a distribution over the keys) as CircuitsVis users know them:

- an **overview**, one small heatmap per head, layers down and heads across;
- the **focused head** (click a thumbnail; layer 0 head 0 to start) as a large query × key heatmap
  with the token strings along both axes; hovering a cell shows the query token, the key token and
  the value, and outlines its row and column;
- a **token strip**: hovering a token colours every token by the attention the focused head pays
  to it from the hovered one (that token as the query).

The page is self-contained: inline CSS, an inline script that draws the heatmaps on canvases from
the values embedded in it (16-bit fixed point, base64), nothing fetched; several views can share
one page.  ``circuits.interp.attention_patterns(circuit, tokens)`` collects the patterns of a
circuit's heads and returns this view.  Its behaviour is tested in headless Chromium
(``tests/text/test_attention_view.py``).

>>> import numpy as np
>>> p = np.full((1, 2, 3, 3), 1 / 3)
>>> view = AttentionView(p, ['The', ' cat', ' sat'])
>>> view.shape, view.layers, view.heads
((1, 2, 3, 3), ['layer 0'], ['head 0', 'head 1'])
>>> page = view._repr_html_()
>>> page.count('<canvas'), ' cat' in page, 'http' in page
(3, True, False)
"""

from __future__ import annotations

import base64
import json
import uuid
from html import escape

import numpy as np

from ..errors import ShapeError

__all__ = ["AttentionView"]

SCALE = 65534  # values in [0, 1] as 16-bit fixed point; 65535 marks a missing head
_MISSING = 65535
MAX_VALUES = 1 << 22  # about 11 MB of page: 12 layers × 12 heads × 170 tokens²

_STYLE = """<style>
.circuits-attn{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;font-size:12.5px;color:#222}
.circuits-attn .attn-title{font-weight:600;margin:.2em 0 .5em}
.circuits-attn .attn-row{display:flex;gap:18px;align-items:flex-start;flex-wrap:wrap}
.circuits-attn table.attn-grid{border-collapse:collapse}
.circuits-attn table.attn-grid td,.circuits-attn table.attn-grid th{padding:2px;font-weight:normal;color:#666;font-size:11px}
.circuits-attn canvas.attn-thumb{border:1px solid #ccc;cursor:pointer;display:block}
.circuits-attn canvas.attn-thumb.selected{border:2px solid #d73a49;margin:-1px}
.circuits-attn .attn-focus-title{font-weight:600;margin-bottom:4px}
.circuits-attn .attn-tip{min-height:1.4em;font-family:ui-monospace,Menlo,Consolas,monospace;white-space:pre}
.circuits-attn .attn-tokens{margin-top:10px;line-height:1.9;font-family:ui-monospace,Menlo,Consolas,monospace;max-width:900px}
.circuits-attn .attn-tokens span{padding:1px 1px;border-radius:2px;white-space:pre;cursor:default;border:1px solid #eee}
.circuits-attn .attn-tokens span.query{outline:2px solid #d73a49}
</style>"""

# The script: decodes the values, draws thumbnails and the focused head, wires hover and click.
# ``ROOT`` is replaced by the view's element id.  No recursion, no network, no globals.
_SCRIPT = r"""
(function () {
  var root = document.getElementById('ROOT');
  if (!root || root.dataset.ready) return;
  root.dataset.ready = '1';
  var meta = JSON.parse(root.querySelector('script.attn-meta').textContent);
  var L = meta.shape[0], H = meta.shape[1], Q = meta.shape[2], K = meta.shape[3];
  var raw = atob(meta.data), view = new DataView(new ArrayBuffer(raw.length));
  for (var i = 0; i < raw.length; i++) view.setUint8(i, raw.charCodeAt(i));
  function value(l, h, q, k) {
    var v = view.getUint16(2 * (((l * H + h) * Q + q) * K + k), true);
    return v === 65535 ? NaN : v / 65534;
  }
  function colour(v) {
    if (isNaN(v)) return 'rgb(238,238,238)';
    var t = Math.max(0, Math.min(1, v));
    return 'rgb(' + Math.round(255 - t * 222) + ',' + Math.round(255 - t * 153) + ',' + Math.round(255 - t * 83) + ')';
  }
  function paint(canvas, l, h, cell, left, top) {
    var g = canvas.getContext('2d');
    g.fillStyle = '#fff'; g.fillRect(0, 0, canvas.width, canvas.height);
    for (var q = 0; q < Q; q++) for (var k = 0; k < K; k++) {
      g.fillStyle = colour(value(l, h, q, k));
      g.fillRect(left + k * cell, top + q * cell, cell, cell);
    }
  }
  var thumbs = root.querySelectorAll('canvas.attn-thumb');
  thumbs.forEach(function (c) { paint(c, +c.dataset.l, +c.dataset.h, meta.thumb, 0, 0); });
  var big = root.querySelector('canvas.attn-big'), tip = root.querySelector('.attn-tip');
  var title = root.querySelector('.attn-focus-title'), strip = root.querySelectorAll('.attn-tokens span');
  var cell = meta.cell, left = meta.left, top = meta.top, cur = [0, 0];
  function labels() {
    var g = big.getContext('2d');
    g.fillStyle = '#333'; g.font = Math.max(9, Math.min(12, cell)) + 'px monospace';
    g.textAlign = 'right'; g.textBaseline = 'middle';
    for (var q = 0; q < Q; q++) g.fillText(meta.queries[q], left - 4, top + (q + 0.5) * cell);
    for (var k = 0; k < K; k++) {
      g.save(); g.translate(left + (k + 0.5) * cell, top - 4); g.rotate(-Math.PI / 3);
      g.textAlign = 'left'; g.fillText(meta.keys[k], 0, 0); g.restore();
    }
  }
  function focus(l, h) {
    cur = [l, h];
    thumbs.forEach(function (c) { c.classList.toggle('selected', +c.dataset.l === l && +c.dataset.h === h); });
    title.textContent = meta.layers[l] + ' \u00b7 ' + meta.heads[h];
    root.dataset.focus = l + ',' + h;
    paint(big, l, h, cell, left, top); labels();
  }
  function cellAt(ev) {
    var r = big.getBoundingClientRect();
    var x = (ev.clientX - r.left) * big.width / r.width, y = (ev.clientY - r.top) * big.height / r.height;
    var k = Math.floor((x - left) / cell), q = Math.floor((y - top) / cell);
    return (q >= 0 && q < Q && k >= 0 && k < K) ? [q, k] : null;
  }
  big.addEventListener('mousemove', function (ev) {
    var at = cellAt(ev);
    paint(big, cur[0], cur[1], cell, left, top); labels();
    if (!at) { tip.textContent = ''; return; }
    var g = big.getContext('2d'), q = at[0], k = at[1], v = value(cur[0], cur[1], q, k);
    g.strokeStyle = 'rgba(215,58,73,0.8)'; g.lineWidth = 1;
    g.strokeRect(left + 0.5, top + q * cell + 0.5, K * cell - 1, cell - 1);
    g.strokeRect(left + k * cell + 0.5, top + 0.5, cell - 1, Q * cell - 1);
    tip.textContent = 'query ' + (meta.offset + q) + ' ' + JSON.stringify(meta.queries[q]) + ' \u2192 key ' + k +
      ' ' + JSON.stringify(meta.keys[k]) + ': ' + (isNaN(v) ? 'n/a' : v.toFixed(4));
  });
  big.addEventListener('mouseleave', function () { tip.textContent = ''; paint(big, cur[0], cur[1], cell, left, top); labels(); });
  thumbs.forEach(function (c) { c.addEventListener('click', function () { focus(+c.dataset.l, +c.dataset.h); }); });
  strip.forEach(function (s, k) {
    s.addEventListener('mouseenter', function () {
      var q = k - meta.offset;
      strip.forEach(function (t, j) {
        t.classList.toggle('query', j === k);
        t.style.background = q >= 0 ? colour(value(cur[0], cur[1], q, j)) : '';
        t.title = q >= 0 ? (JSON.stringify(meta.keys[j]) + ': ' + value(cur[0], cur[1], q, j).toFixed(4)) : '';
      });
    });
  });
  root.querySelector('.attn-tokens').addEventListener('mouseleave', function () {
    strip.forEach(function (t) { t.style.background = ''; t.classList.remove('query'); t.title = ''; });
  });
  focus(0, 0);
})();
"""


class AttentionView:
    """Attention patterns with their token strings, shown in a notebook (see the module docstring).

    ``patterns``: ``[layers, heads, queries, keys]`` (or ``[heads, queries, keys]``, one layer;
    NaN for a head a layer does not have); the queries are the last ``queries`` of the ``keys``
    tokens (a decode step against a cache).  ``tokens``: the ``keys`` token strings (default
    their positions); ``layers`` / ``heads``: labels (default ``layer 0``..., ``head 0``...).
    ``to_html()`` is the page; ``_repr_html_`` shows it.

    >>> import numpy as np
    >>> v = AttentionView(np.eye(2)[None], ['a', 'b'], heads=['induction'])
    >>> v.heads, v.value(0, 0, 1, 1)
    (['induction'], 1.0)
    """

    def __init__(self, patterns, tokens=None, *, layers=None, heads=None, title: str | None = None):
        p = np.asarray(patterns, dtype=np.float64)
        if p.ndim == 3:
            p = p[None]
        if p.ndim != 4:
            raise ShapeError(f"AttentionView: patterns must be [layers, heads, queries, keys] (or [heads, queries, "
                             f"keys]), got shape {p.shape}")
        n_layers, n_heads, n_q, n_k = p.shape
        if n_q > n_k:
            raise ShapeError(f"AttentionView: {n_q} queries but {n_k} keys; the queries are the last tokens of the keys")
        tokens = [str(i) for i in range(n_k)] if tokens is None else [str(t) for t in tokens]
        if len(tokens) != n_k:
            raise ShapeError(f"AttentionView: {len(tokens)} token strings for {n_k} keys; give one per key position")
        self.layers = [f"layer {i}" for i in range(n_layers)] if layers is None else [str(x) for x in layers]
        self.heads = [f"head {i}" for i in range(n_heads)] if heads is None else [str(x) for x in heads]
        if len(self.layers) != n_layers or len(self.heads) != n_heads:
            raise ShapeError(f"AttentionView: {len(self.layers)} layer and {len(self.heads)} head labels for "
                             f"patterns of {n_layers} layers × {n_heads} heads")
        self.patterns, self.tokens, self.title = p, tokens, title

    @property
    def shape(self) -> tuple:
        return self.patterns.shape

    def value(self, layer: int, head: int, query: int, key: int) -> float:
        """The pattern's value at one cell (as shown on hover, before rounding)."""
        return float(self.patterns[layer, head, query, key])

    def select(self, layers=None, heads=None) -> "AttentionView":
        """The view of some layers and heads only (indices into ``self.layers`` / ``self.heads``).

        >>> import numpy as np
        >>> AttentionView(np.full((3, 4, 2, 2), 0.5)).select(layers=[2], heads=[0, 3]).heads
        ['head 0', 'head 3']
        """
        li = list(range(len(self.layers))) if layers is None else list(layers)
        hi = list(range(len(self.heads))) if heads is None else list(heads)
        return AttentionView(self.patterns[np.ix_(li, hi)], self.tokens, layers=[self.layers[i] for i in li],
                             heads=[self.heads[i] for i in hi], title=self.title)

    def _encoded(self) -> str:
        p = self.patterns
        q = np.where(np.isnan(p), _MISSING, np.round(np.clip(np.nan_to_num(p), 0.0, 1.0) * SCALE))
        return base64.b64encode(q.astype("<u2").tobytes()).decode("ascii")

    def to_html(self, max_values: int = MAX_VALUES) -> str:
        """The self-contained page fragment (HTML, inline CSS and script); more than ``max_values``
        pattern entries is an error saying how to show fewer (a notebook would choke on the page)."""
        n_layers, n_heads, n_q, n_k = self.shape
        if self.patterns.size > max_values:
            raise ShapeError(f"AttentionView: {self.patterns.size:,} values ({n_layers} layers × {n_heads} heads × "
                             f"{n_q} × {n_k}) exceed max_values={max_values:,}; show fewer layers or heads "
                             "(view.select(layers=..., heads=...)), fewer tokens, or pass a larger max_values")
        uid = "attn-" + uuid.uuid4().hex[:12]
        thumb = max(1, min(4, 96 // max(n_k, 1)))
        cell = max(4, min(22, 560 // max(n_k, 1)))
        longest = max((len(t) for t in self.tokens), default=1)
        margin = 14 + 7 * min(longest, 16)
        queries = self.tokens[n_k - n_q:]
        meta = {"shape": [n_layers, n_heads, n_q, n_k], "data": self._encoded(), "layers": self.layers,
                "heads": self.heads, "queries": queries, "keys": self.tokens, "offset": n_k - n_q,
                "thumb": thumb, "cell": cell, "left": margin, "top": margin}
        head = self.title or (f"attention patterns · {n_layers} layer{'s' if n_layers != 1 else ''} × {n_heads} "
                              f"head{'s' if n_heads != 1 else ''} · {n_k} tokens")
        grid = ["<table class='attn-grid'><tr><th></th>"]
        grid += [f"<th>{escape(h)}</th>" for h in self.heads]
        grid.append("</tr>")
        for l, layer in enumerate(self.layers):
            grid.append(f"<tr><th>{escape(layer)}</th>")
            for h, name in enumerate(self.heads):
                grid.append(f"<td><canvas class='attn-thumb' data-l='{l}' data-h='{h}' width='{thumb * n_k}' "
                            f"height='{thumb * n_q}' title='{escape(layer, quote=True)} · {escape(name, quote=True)}'>"
                            "</canvas></td>")
            grid.append("</tr>")
        grid.append("</table>")
        strip = "".join(f"<span data-k='{k}'>{escape(t)}</span>" for k, t in enumerate(self.tokens))
        # The metadata sits in a JSON script element: '</' inside a string would end it early.
        blob = json.dumps(meta).replace("</", "<\\/")
        return (f"<div class='circuits-attn' id='{uid}'>{_STYLE}<div class='attn-title'>{escape(head)}</div>"
                f"<div class='attn-row'><div class='attn-overview'>{''.join(grid)}</div>"
                f"<div class='attn-focus'><div class='attn-focus-title'></div>"
                f"<canvas class='attn-big' width='{margin + cell * n_k + 4}' height='{margin + cell * n_q + 4}'>"
                f"</canvas><div class='attn-tip'></div></div></div>"
                f"<div class='attn-tokens'>{strip}</div>"
                f"<script type='application/json' class='attn-meta'>{blob}</script>"
                f"<script>{_SCRIPT.replace('ROOT', uid)}</script></div>")

    def _repr_html_(self) -> str:
        return self.to_html()

    def __repr__(self) -> str:
        n_layers, n_heads, n_q, n_k = self.shape
        return f"<AttentionView: {n_layers} layers × {n_heads} heads, {n_q} queries × {n_k} keys>"
