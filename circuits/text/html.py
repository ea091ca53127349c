"""The notebook view of a circuit: a collapsible HTML tree (``Circuit._repr_html_``).

Each node is its line in the text format followed by its shape and dtype; a node with children is a
``<details>`` element whose ``<summary>`` is that line, so it opens and closes with a click and no
JavaScript.  A node met again is not expanded twice: its line links (``href="#..."``) to its first
appearance.  The view is self-contained (inline CSS, nothing fetched) and cheap whatever the
circuit's size: it is built by one loop over an explicit stack (no recursion), shows at most
``max_nodes`` lines and ``max_depth`` levels, and only the top ``open_depth`` levels start open;
a note says what was left out.

>>> import numpy as np
>>> from circuits import Array, Einsum
>>> x = Array(np.ones((2, 3), np.float32), name='x')
>>> page = to_html(Einsum.from_spec('ab,ab->a', x, x, name='y'))
>>> page.count('<details'), page.count('href="#'), "'y'" in page
(1, 1, True)
"""

from __future__ import annotations

from html import escape as _escape

import numpy as np

from ..dtypes import DEFAULT_FLOAT
from ..errors import printable
from ..nodes.base import Circuit, format_line, quote_name
from ..shapes import shape_text

MAX_PAYLOAD_CHARS = 120
# A name or shape shown longer than this is cut (``…``): the view of a small text whose many
# references repeat a long name stays small (500 lines of at most a few hundred characters).
MAX_NAME_CHARS = 200


def escape(text: str, quote: bool = False) -> str:
    r"""``text`` for an HTML page: unprintable characters (terminal escapes, bells, bidi
    overrides) written as backslash escapes (``circuits.errors.printable``), then ``& < >``
    (and quotes with ``quote=True``, for an attribute) as entities.  Every notebook view
    (circuit, summary, cost, diff, sweep) escapes its text here.

    >>> escape("a<b \u202e")
    'a&lt;b \\u202e'
    """
    return _escape(printable(text, keep="\n"), quote=quote)

_STYLE = """<style>
.circuits-html{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:12.5px;line-height:1.5;overflow-x:auto;padding-left:1.2em}
.circuits-html summary,.circuits-html .leaf,.circuits-html .ref{white-space:nowrap}
.circuits-html details,.circuits-html .leaf,.circuits-html .ref,.circuits-html .more{margin-left:0}
.circuits-html .kids{margin-left:1.1em;padding-left:.6em;border-left:1px solid #ccc}
.circuits-html summary{cursor:pointer;list-style-position:outside}
.circuits-html .leaf,.circuits-html .ref,.circuits-html .more{padding-left:1.1em}
.circuits-html .name{color:#005cc5;font-weight:600}
.circuits-html .body{color:#6f42c1}
.circuits-html .shape{color:#888}
.circuits-html .ref a{color:#888;text-decoration:none;border-bottom:1px dotted #888}
.circuits-html .more,.circuits-html .note{color:#b31d28;font-style:italic}
.circuits-html :target>summary,.circuits-html .leaf:target{background:#fff5b1}
.circuits-html .target{outline:2px solid #f9c513}
.circuits-html .hit{background:#fff5b1}
.circuits-html .stats{color:#22863a;margin-left:.6em}
.circuits-html .search{margin:0 0 .4em -1.2em}
.circuits-html .crumbs{margin:0 0 .3em -1.2em;color:#666}
</style>"""

# The search box's handler (no double quotes: it sits in an attribute): marks the lines whose name
# contains the text, opens the <details> above each, and counts the matches.
_SEARCH_JS = (
    "var root=this.closest('.circuits-html'),q=this.value.toLowerCase(),n=0;"
    "root.querySelectorAll('.hit').forEach(function(e){e.classList.remove('hit')});"
    "if(q){root.querySelectorAll('.name').forEach(function(s){"
    "if(s.textContent.toLowerCase().indexOf(q)<0)return;"
    "var line=s.closest('summary,.leaf,.ref');line.classList.add('hit');n++;"
    "var d=line.parentElement.closest('details');"
    "if(line.tagName==='SUMMARY')d=d.parentElement.closest('details');"
    "while(d){d.open=true;d=d.parentElement.closest('details');}});}"
    "root.querySelector('.search-count').textContent=q?n+' match'+(n===1?'':'es'):'';"
)
_SPARK = "▁▂▃▄▅▆▇█"



def _span(part, text):
    return f'<span class="{part}">{escape(text)}</span>'


def _cut(text: str, most: int) -> str:
    return text if len(text) <= most else text[: most - 1] + "…"


def _cut_span(part, text):
    """``_span`` with the text cut: a quoted name at ``MAX_NAME_CHARS``, a line's body (shape,
    type, payload) at ``MAX_NAME_CHARS + MAX_PAYLOAD_CHARS``."""
    return _span(part, _cut(text, MAX_NAME_CHARS if part == "name" else MAX_NAME_CHARS + MAX_PAYLOAD_CHARS))


def _line(node) -> str:
    """The node's text-format line (``format_line``, its parts as spans; a long name, payload or
    shape cut), then its shape and dtype, which the text leaves implied for most node types."""
    payload = _cut(node.payload_text(), MAX_PAYLOAD_CHARS)
    text = format_line(node.type_name, node.name, payload, node.shape if node.prints_shape else None, _cut_span)
    shape = _cut(shape_text(node.shape), MAX_NAME_CHARS)
    if node.dtype != DEFAULT_FLOAT:
        shape += " " + node.dtype
    if getattr(node, "is_placeholder", False):
        shape += " (placeholder)"
    return text + " " + _span("shape", shape)


def value_stats(value) -> str:
    """``shape mean std min max`` and an 8-bin histogram of ``value``, in one line.

    >>> value_stats(np.array([0.0, 1.0, 1.0, 3.0]))
    '[4] mean 1.25 std 1.09 min 0 max 3 ▅▁█▁▁▁▁▅'
    """
    v = np.asarray(value)
    shape = shape_text(v.shape)
    if v.size == 0:
        return f"{shape} (empty)"
    if v.dtype.kind == "b":
        v = v.astype(np.int64)
    if v.dtype.kind not in "iuf":
        return f"{shape} {v.dtype}"
    v = v.astype(np.float64).ravel()
    finite = v[np.isfinite(v)]
    bad = v.size - finite.size
    note = f" ({bad} non-finite)" if bad else ""
    if finite.size == 0:
        return f"{shape} no finite values{note}"
    lo, hi = float(finite.min()), float(finite.max())
    counts, _ = np.histogram(finite, bins=8, range=(lo, hi) if hi > lo else (lo - 0.5, lo + 0.5))
    top = counts.max()
    spark = "".join(_SPARK[min(7, int(round(7 * c / top)))] if c else _SPARK[0] for c in counts)
    return (f"{shape} mean {finite.mean():.3g} std {finite.std():.3g} min {lo:.3g} max {hi:.3g} "
            f"{spark}{note}")


def _targets(circuit, open_) -> tuple[set, set]:
    """(hashes of the nodes ``open_`` names or matches, hashes of all their ancestors)."""
    from ..select import get

    items = [open_] if isinstance(open_, (str, Circuit)) or callable(open_) else list(open_)
    found = set()
    for item in items:
        if isinstance(item, Circuit):
            found.add(item.hash)
        else:
            found.update(n.hash for n in get(circuit, item))
    # Open the path the view shows each one on: the chain of first appearances above it.
    shown_under: dict[bytes, bytes | None] = {}
    stack = [(circuit, None)]
    while stack:
        node, parent = stack.pop()
        if node.hash in shown_under:
            continue
        shown_under[node.hash] = parent
        stack.extend((child, node.hash) for child in reversed(node.children))
    above = set()
    for h in found:
        up = shown_under.get(h)
        while up is not None and up not in above:
            above.add(up)
            up = shown_under[up]
    return found, above


def _values_by_node(circuit, values) -> dict:
    """hash -> value for ``values`` keyed by nodes or names (a name gives every node so named)."""
    out, by_name = {}, {}
    for key, value in values.items():
        if isinstance(key, Circuit):
            out[key.hash] = value
        else:
            by_name[key] = value
    if by_name:
        from ..traversal import toposort

        for node in toposort(circuit):
            if node.name in by_name and node.hash not in out:
                out[node.hash] = by_name[node.name]
    return out


def _ref_text(node) -> str:
    who = _cut(quote_name(node.name), MAX_NAME_CHARS) if node.name is not None else "(unnamed)"
    return f"{who} {node.type_name}"


class HTML(str):
    """A string of HTML that a notebook shows as HTML (``_repr_html_``): what ``to_html`` returns."""

    def _repr_html_(self):
        return str(self)


def _layer_node(circuit, layer: int):
    """The node of layer ``layer``: the last-computed node named a word and that number (the
    seed's ``'b1'``, GPT-2's ``'h1'``)."""
    import re

    from ..traversal import toposort

    pattern = re.compile(rf"^[A-Za-z_]+{layer}$")
    found = [n for n in toposort(circuit) if n.name is not None and pattern.match(n.name)]
    if not found:
        from ..errors import SelectionError

        raise SelectionError(f"to_html: no node named like a layer {layer} ('b{layer}', 'h{layer}') in the circuit "
                             f"rooted at {circuit.line()}; give at= a name or a matcher")
    return found[-1]


def _path_to(circuit, target) -> list:
    """A shortest root-to-``target`` path of nodes (breadth first, no recursion)."""
    from collections import deque

    parent = {circuit.hash: None}
    queue = deque([circuit])
    while queue:
        n = queue.popleft()
        if n.hash == target.hash:
            break
        for c in n.children:
            if c.hash not in parent:
                parent[c.hash] = n
                queue.append(c)
    path, n = [], target
    while n is not None:
        path.append(n)
        n = parent[n.hash]
    return path[::-1]


def to_html(circuit, max_nodes: int = 500, max_depth: int = 40, open_depth: int = 2, *,
            open=None, search: bool = False, values=None, at=None) -> str:
    """A self-contained HTML tree of ``circuit`` (see the module docstring); a notebook shows
    the returned string (an ``HTML``) as the view.

    ``max_nodes`` caps the lines shown, ``max_depth`` the levels (browsers flatten very deep
    nesting), ``open_depth`` how many levels start expanded.  ``open``: names, matchers or nodes
    (one or a list); the view opens the path to where each selected node is shown and outlines it.
    ``search=True`` adds a search box (a few lines of inline JavaScript) that highlights the
    lines whose name contains the text and opens the path to each.  ``values``: a mapping from
    nodes or names to arrays (e.g. the ``also=`` results of ``C.evaluate``); each node given a
    value shows its shape, mean, std, min, max and an 8-bin histogram.  ``at``: start the view at
    one node instead of the root — a name, a matcher, a node, or an int for that layer (the node
    named like ``'b1'`` / ``'h1'``) — under a line giving its path from the root.

    >>> import numpy as np
    >>> from circuits import Array, Einsum, GeneralFunction
    >>> x = Array(np.arange(4, dtype=np.float32), name='x')
    >>> c = GeneralFunction('exp', Einsum.from_spec('a->a', x, name='inner'), name='out')
    >>> page = to_html(c, open_depth=0, open=['x'], values={'x': x.value})
    >>> page.count(' open><summary'), 'mean 1.5' in page
    (2, True)
    >>> inner = to_html(c, at='inner')
    >>> inner.count('<details'), "'out' &gt; 'inner'" in inner
    (1, True)
    """
    if max_nodes < 1 or max_depth < 1 or open_depth < 0:
        raise ValueError("to_html needs max_nodes >= 1, max_depth >= 1 and open_depth >= 0")
    crumbs = ""
    if at is not None:
        if isinstance(at, int) and not isinstance(at, bool):
            start = _layer_node(circuit, at)
        elif isinstance(at, Circuit):
            start = at
        else:
            from ..select import get_unique

            start = get_unique(circuit, at)
        path = _path_to(circuit, start)
        crumbs = ('<div class="crumbs">' + escape(" > ".join(quote_name(n.name) if n.name is not None
                                                            else n.type_name for n in path)) + "</div>")
        circuit = start
    prefix = "c" + circuit.hash[:5].hex()
    anchors: dict[bytes, str] = {}
    targets, above = _targets(circuit, open) if open is not None else (set(), set())
    stats = _values_by_node(circuit, values) if values else {}
    out = ['<div class="circuits-html">', _STYLE]
    if crumbs:
        out.append(crumbs)
    if search:
        out.append(f'<div class="search"><input type="search" placeholder="search names" '
                   f'oninput="{_escape(_SEARCH_JS, quote=True)}"> <span class="search-count"></span></div>')
    # Items: (node, depth) to show, or a str to emit as is (closing tags, notes).
    stack: list = [(circuit, 0)]
    shown = 0
    stopped = stopped_children = False
    depth_cut = 0
    while stack:
        item = stack.pop()
        if type(item) is str:
            out.append(item)
            continue
        if stopped:
            continue
        if shown >= max_nodes:
            stopped = True
            continue
        shown += 1
        node, depth = item
        anchor = anchors.get(node.hash)
        if anchor is not None:
            out.append(
                f'<div class="ref">↑ <a href="#{anchor}" title="shown above; click to go there">'
                f"{escape(_ref_text(node))}</a></div>"
            )
            continue
        anchor = anchors[node.hash] = f"{prefix}-{len(anchors)}"
        children = node.children
        line = _line(node)
        if node.hash in stats:
            line += " " + _span("stats", value_stats(stats[node.hash]))
        mark = " target" if node.hash in targets else ""
        if not children:
            out.append(f'<div class="leaf{mark}" id="{anchor}">{line}</div>')
            continue
        if depth >= max_depth:
            depth_cut += 1
            out.append(
                f'<div class="leaf{mark}" id="{anchor}">{line} <span class="more">'
                f"… {len(children)} children below the depth limit</span></div>"
            )
            continue
        is_open = " open" if depth < open_depth or node.hash in above else ""
        cls = ' class="target"' if mark else ""
        out.append(f'<details id="{anchor}"{is_open}><summary{cls}>{line}</summary><div class="kids">')
        stack.append("</div></details>")
        # A node with more children than can be shown anyway pushes only those it can show.
        room = max_nodes - shown
        if len(children) > room:
            stopped_children = True
            stack.append(f'<div class="more">… {len(children) - room} more children not shown</div>')
            children = children[:room]
        for child in reversed(children):
            stack.append((child, depth + 1))
    notes = []
    if stopped or stopped_children:
        notes.append(f"showing the first {max_nodes} nodes; more with to_html(circuit, max_nodes=...)")
    if depth_cut:
        notes.append(f"{depth_cut} subtree(s) below depth {max_depth} not shown; more with max_depth=...")
    if notes:
        notes.append("circuit.to_text() prints everything")
        out.append(f'<div class="note">{escape("; ".join(notes))}</div>')
    out.append("</div>")
    return HTML("\n".join(out))
