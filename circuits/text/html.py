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

from ..dtypes import DEFAULT_FLOAT
from ..nodes.base import format_line, quote_name
from ..shapes import shape_text

MAX_PAYLOAD_CHARS = 120


def escape(text: str) -> str:
    # Only text content is escaped here (no attribute holds user text), so quotes stay readable.
    return _escape(text, quote=False)

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
</style>"""


def _span(part, text):
    return f'<span class="{part}">{escape(text)}</span>'


def _line(node) -> str:
    """The node's text-format line (``format_line``, its parts as spans), then its shape and
    dtype, which the text leaves implied for most node types."""
    payload = node.payload_text()
    if len(payload) > MAX_PAYLOAD_CHARS:
        payload = payload[: MAX_PAYLOAD_CHARS - 1] + "…"
    text = format_line(node.type_name, node.name, payload, node.shape if node.prints_shape else None, _span)
    shape = shape_text(node.shape)
    if node.dtype != DEFAULT_FLOAT:
        shape += " " + node.dtype
    if getattr(node, "is_placeholder", False):
        shape += " (placeholder)"
    return text + " " + _span("shape", shape)


def _ref_text(node) -> str:
    who = quote_name(node.name) if node.name is not None else "(unnamed)"
    return f"{who} {node.type_name}"


def to_html(circuit, max_nodes: int = 500, max_depth: int = 40, open_depth: int = 2) -> str:
    """A self-contained HTML tree of ``circuit`` (see the module docstring).

    ``max_nodes`` caps the lines shown, ``max_depth`` the levels (browsers flatten very deep
    nesting), ``open_depth`` how many levels start expanded.
    """
    if max_nodes < 1 or max_depth < 1 or open_depth < 0:
        raise ValueError("to_html needs max_nodes >= 1, max_depth >= 1 and open_depth >= 0")
    prefix = "c" + circuit.hash[:5].hex()
    anchors: dict[bytes, str] = {}
    out = ['<div class="circuits-html">', _STYLE]
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
        if not children:
            out.append(f'<div class="leaf" id="{anchor}">{_line(node)}</div>')
            continue
        if depth >= max_depth:
            depth_cut += 1
            out.append(
                f'<div class="leaf" id="{anchor}">{_line(node)} <span class="more">'
                f"… {len(children)} children below the depth limit</span></div>"
            )
            continue
        is_open = " open" if depth < open_depth else ""
        out.append(f'<details id="{anchor}"{is_open}><summary>{_line(node)}</summary><div class="kids">')
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
    return "\n".join(out)
