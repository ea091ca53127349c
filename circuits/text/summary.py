"""``summary(circuit)``: a collapsed view of a circuit grouped by name: layers → heads → q/k/v.

Names are dotted paths, so a circuit groups itself: ``'b1.a.head3'`` lives in ``b1.a``, which
lives in ``b1``.  Two rules make this work on names as the seed writes them, where the nodes
inside a head carry short names that every head repeats (``'a.q'``, ``'ln.y'``):

* A name is *global* when exactly one node of the circuit carries it and no name of its family
  (same first segment) is repeated; it is placed at its own path (``'a0.norm'`` → ``a0.norm``).
* Other names are *local*, and so are unnamed nodes: a local node is placed in its owner's
  group, the longest group that holds every parent of it (``'a.q'`` of head 3 of layer 1 goes
  to ``b1.a.head3``; ``'a.qk_input'``, shared by the layer's heads, to ``b1.a``; a constant shared
  by the whole model to the top).

Names written in full (``attn_only(..., unique_names=True)``: ``'b1.a.head3.a.q'``) are global
and land in the same places.  Top-level groups whose first segment ends in a number
(``a0``, ``b0``) are gathered under ``layer 0``; runs of numbered siblings that are single nodes
of one type and shape (``head0``..``head7`` of ``a0.w.q``) print as one line.

Each line shows the group's node (type, shape) when one carries the group's name, then how many
nodes the group holds and how many parameters (elements of distinct Arrays) it reaches.  Local
members print after their group, by their short names with shapes (``q [30,16]``).  The result
prints as text (``str``) and as a collapsible HTML tree in notebooks (``_repr_html_``).

>>> import numpy as np
>>> from circuits.models import attn_only, random_weights
>>> w = random_weights(0, vocab=11, d_model=8, n_heads=2, head_size=4, n_layers=2, max_positions=8)
>>> s = summary(attn_only(w, np.arange(8)))
>>> s.n_layers, s.heads_per_layer
(2, 2)
>>> print(s.group('b1.a.head1').line())
b1.a.head1  Einsum [6,8]  · 11 nodes · a.q [6,4], a.k [6,4], a.v [6,4], a.attn_probs [6,6], …
"""

from __future__ import annotations

import re

from ..errors import printable
from ..nodes.base import Circuit
from ..nodes.leaves import Array
from ..shapes import shape_text
from ..traversal import toposort
from .html import escape

__all__ = ["summary", "Summary", "Group"]

_NUMBERED = re.compile(r"^(.*?)(\d+)$")
_HEAD = re.compile(r"^head(\d+)$")
# Local members shown first in a group's line, in this order (the attention head's interesting parts).
_FIRST_LOCALS = ("q", "k", "v", "attn_probs", "comb_v", "attn_scores", "y", "var")


def _natural_key(text: str):
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


def _count_text(n: int, what: str) -> str:
    return f"{n:,} {what}"


class Group:
    """One group of the summary: the nodes under one dotted name prefix."""

    def __init__(self, path: tuple[str, ...]):
        self.path = path
        self.node: Circuit | None = None  # the node named exactly this path, if any
        self.children: dict[str, Group] = {}
        self.locals: list[tuple[str | None, Circuit]] = []  # (short name or None, node)
        self.label: str | None = None  # a display label (layers, collapsed runs)
        self.run: list[Group] | None = None  # a collapsed run of numbered siblings
        self.n_nodes = 0
        self.params = 0
        self.last = -1  # position in the circuit's toposort of the last node placed in it
        self.repeats: list[Group] | None = None  # equal numbered siblings shown as this, the first

    @property
    def name(self) -> str:
        return ".".join(self.path)

    def line(self, max_locals: int = 4) -> str:
        """The group's one-line description."""
        label = self.label or self.name or "(top)"
        if self.repeats:
            label += f" ×{len(self.repeats)}"
        parts = [label]
        if self.node is not None:
            parts.append(f" {self.node.type_name} {shape_text(self.node.shape)}")
        elif self.run:
            first = self.run[0].node
            parts.append(f" {len(self.run)} × {first.type_name} {shape_text(first.shape)}")
        stats = [("each " if self.repeats else "") + _count_text(self.n_nodes, "nodes" if self.n_nodes != 1 else "node")]
        if self.params:
            stats.append(_count_text(self.params, "params"))
        named = self.named_locals()
        if named:
            shown = [f"{n} {shape_text(c.shape)}" for n, c in named[:max_locals]]
            if len(named) > max_locals:
                shown.append("…")
            stats.append(", ".join(shown))
        return " ".join(parts) + "  · " + " · ".join(stats)

    def named_locals(self) -> list[tuple[str, Circuit]]:
        """Local members with names, interesting ones first (q, k, v, attention probabilities)."""
        seen, out = set(), []
        for short, node in self.locals:
            if short is None or short in seen:
                continue
            seen.add(short)
            out.append((short, node))

        def rank(item):
            last = item[0].rsplit(".", 1)[-1]
            return (_FIRST_LOCALS.index(last) if last in _FIRST_LOCALS else len(_FIRST_LOCALS),)
        return sorted(out, key=rank)

    def sorted_children(self) -> list["Group"]:
        """Children in the order they are completed (their last node computed): inputs first, the
        output last."""
        return sorted(self.children.values(), key=lambda g: (g.last, _natural_key(g.name)))


class Summary:
    """The grouped view returned by ``summary(circuit)``: prints as an indented tree, renders as
    collapsible HTML in notebooks; ``group(name)`` looks a group up by its dotted name."""

    def __init__(self, circuit: Circuit, root: Group, n_nodes: int, params: int, n_layers: int,
                 heads_per_layer: int, max_depth: int | None, max_lines: int = 300):
        self.circuit = circuit
        self.root = root
        self.n_nodes = n_nodes
        self.params = params
        self.n_layers = n_layers
        self.heads_per_layer = heads_per_layer
        self.max_depth = max_depth
        self.max_lines = max_lines

    def group(self, name: str) -> Group:
        """The group at dotted path ``name`` (``''`` is the top); KeyError names the groups there are."""
        path = tuple(name.split(".")) if name else ()
        stack = [self.root]
        while stack:
            g = stack.pop()
            if g.path == path and g.run is None and g.repeats is None:
                return g
            stack.extend(g.repeats or g.children.values())
        raise KeyError(f"no group {name!r} in this summary; top-level groups: "
                       f"{', '.join(g.label or g.name for g in self.root.sorted_children())}")

    def header(self) -> str:
        c = self.circuit
        who = f"{c.name!r} " if c.name is not None else ""
        parts = [f"{who}{c.type_name} {shape_text(c.shape)}", _count_text(self.n_nodes, "nodes"),
                 _count_text(self.params, "params")]
        if self.n_layers:
            layers = f"{self.n_layers} layer{'s' if self.n_layers != 1 else ''}"
            if self.heads_per_layer:
                layers += f" × {self.heads_per_layer} heads"
            parts.append(layers)
        return " · ".join(parts)

    def _walk(self):
        """(depth, group) in display order, down to max_depth; iterative."""
        stack = [(0, g) for g in reversed(self.root.sorted_children())]
        while stack:
            depth, g = stack.pop()
            yield depth, g
            if self.max_depth is None or depth + 1 < self.max_depth:
                stack.extend((depth + 1, k) for k in reversed(g.sorted_children()))

    def __str__(self) -> str:
        lines = [self.header()]
        walk = list(self._walk())
        lines += ["  " * (depth + 1) + g.line() for depth, g in walk[: self.max_lines]]
        if len(walk) > self.max_lines:
            lines.append(f"  … {len(walk) - self.max_lines} more groups (summary(circuit, max_lines=...))")
        top = self.root.named_locals()
        if top:
            lines.append("  (top) " + ", ".join(f"{n} {shape_text(c.shape)}" for n, c in top))
        return printable("\n".join(lines), keep="\n")  # names as they are, less control characters

    def __repr__(self) -> str:
        return str(self)

    def _repr_html_(self) -> str:
        out = ['<div class="circuits-summary" style="font-family:ui-monospace,Menlo,Consolas,monospace;'
               'font-size:12.5px;line-height:1.5">', f"<div><b>{escape(self.header())}</b></div>"]
        # Items: (depth, group) or a closing tag.
        stack: list = [(0, g) for g in reversed(self.root.sorted_children())]
        shown = 0
        while stack:
            item = stack.pop()
            if isinstance(item, str):
                out.append(item)
                continue
            if shown >= self.max_lines:
                continue
            shown += 1
            depth, g = item
            kids = g.sorted_children() if self.max_depth is None or depth + 1 < self.max_depth else []
            text = escape(g.line())
            if not kids:
                out.append(f'<div style="padding-left:1.1em;white-space:nowrap">{text}</div>')
                continue
            is_open = " open" if depth < 1 else ""
            out.append(f'<details{is_open}><summary style="white-space:nowrap">{text}</summary>'
                       '<div style="margin-left:1.1em;padding-left:.6em;border-left:1px solid #ccc">')
            stack.append("</div></details>")
            stack.extend((depth + 1, k) for k in reversed(kids))
        if shown >= self.max_lines:
            out.append(f"<div><i>showing the first {self.max_lines} groups (summary(circuit, max_lines=...))</i></div>")
        out.append("</div>")
        return "\n".join(out)


def _common_prefix(a: tuple, b: tuple) -> tuple:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return a[:n]


def summary(circuit: Circuit, *, max_depth: int | None = None, max_lines: int = 300,
            layers: bool = True, repeats: int | None = 8) -> Summary:
    """A collapsed view of ``circuit`` grouped by name (see the module docstring): prints as an
    indented tree of groups (layers → heads → q/k/v) with shapes, node and parameter counts, and
    renders as collapsible HTML in a notebook.  ``max_depth`` limits the levels shown, ``max_lines``
    the groups printed (the HTML view shows as many); ``layers=False``
    keeps top-level groups such as ``a0`` and ``b0`` apart instead of gathering them as ``layer 0``.
    More than ``repeats`` numbered sibling groups with equal contents (the 88 layers of a big
    model, its 96 heads) print once, ``h{0..87} ×88 ... each 55 nodes``, the first one's contents
    below; ``repeats=None`` prints every one (``group(name)`` finds each either way).

    >>> import numpy as np
    >>> from circuits import Add, Array, Einsum
    >>> x = Array(np.ones((2, 3), np.float32), name='enc.x')
    >>> y = Einsum.from_spec('ab->a', x, name='enc.sum')
    >>> print(summary(Add(y, y, name='out')))
    'out' Add [2] · 3 nodes · 6 params
      enc  · 2 nodes · 6 params
        enc.x  Array [2,3]  · 1 node · 6 params
        enc.sum  Einsum [2]  · 1 node
      out  Add [2]  · 1 node
    """
    order = toposort(circuit)
    name_count: dict[str, int] = {}
    for node in order:
        if node.name is not None:
            name_count[node.name] = name_count.get(node.name, 0) + 1
    repeated_families = {n.split(".", 1)[0] for n, k in name_count.items() if k > 1}

    def is_global(node) -> bool:
        name = node.name
        return (name is not None and name_count[name] == 1 and name.split(".", 1)[0] not in repeated_families)

    # Scope of each node (the group its local children belong to), top-down: parents first.
    parents: dict[int, list] = {}
    for node in order:
        for child in node.children:
            parents.setdefault(id(child), []).append(node)
    scope: dict[int, tuple] = {}
    place: dict[int, tuple] = {}
    for node in reversed(order):
        if is_global(node):
            own = tuple(node.name.split("."))
            scope[id(node)] = place[id(node)] = own
            continue
        owner = None
        for p in parents.get(id(node), ()):
            s = scope[id(p)]
            owner = s if owner is None else _common_prefix(owner, s)
        owner = owner if owner is not None else ()
        if node is circuit and node.name is not None:
            owner = ()
        scope[id(node)] = place[id(node)] = owner

    root = Group(())
    groups: dict[tuple, Group] = {(): root}

    def group_at(path: tuple) -> Group:
        parent = root
        for k in range(1, len(path) + 1):
            g = groups.get(path[:k])
            if g is None:
                g = groups[path[:k]] = Group(path[:k])
                parent.children[path[k - 1]] = g
            parent = g
        return parent

    for node in order:
        path = place[id(node)]
        g = group_at(path)
        if is_global(node):
            g.node = node
        else:
            short = node.name
            g.locals.append((short, node))

    # Counts: nodes placed in each group's subtree; params of distinct Arrays placed there.
    members: dict[tuple, list] = {}
    for i, node in enumerate(order):
        members.setdefault(place[id(node)], []).append(node)
        for k in range(len(place[id(node)]), -1, -1):
            g = groups[place[id(node)][:k]]
            g.last = max(g.last, i)
    for path, nodes in members.items():
        params = sum(_size(n.shape) for n in nodes if isinstance(n, Array) and n.dtype.startswith("float"))
        for k in range(len(path), -1, -1):
            g = groups[path[:k]]
            g.n_nodes += len(nodes)
            g.params += params

    heads_per_layer = _collapse_runs(groups)
    _collapse_chains(root)
    n_layers = 0
    if layers:
        n_layers = _gather_layers(root)
    if repeats is not None:
        _collapse_repeats(root, repeats)
    total_params = root.params
    return Summary(circuit, root, len(order), total_params, n_layers, heads_per_layer, max_depth, max_lines)


def _size(shape) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def _collapse_runs(groups: dict) -> int:
    """Collapse runs of numbered sibling leaves of one type and shape; return the largest number of
    ``head{h}`` groups under one parent."""
    heads = 0
    for g in list(groups.values()):
        by_stem: dict[str, list] = {}
        for key, kid in g.children.items():
            m = _NUMBERED.match(key)
            if m:
                by_stem.setdefault(m.group(1), []).append((int(m.group(2)), key, kid))
        n_heads = len(by_stem.get("head", []))
        if n_heads and any(k.node is not None and k.node.type_name == "Einsum" or k.locals
                           for _, _, k in by_stem["head"]):
            heads = max(heads, n_heads)
        for stem, kids in by_stem.items():
            if len(kids) < 3:
                continue
            kinds = {(k.node.type_name, k.node.shape) if k.node is not None and not k.children and not k.locals
                     else None for _, _, k in kids}
            if len(kinds) != 1 or None in kinds:
                continue
            kids.sort()
            run = Group(g.path + (f"{stem}{kids[0][0]}..{kids[-1][0]}",))
            run.label = ".".join(g.path + (f"{stem}{{{kids[0][0]}..{kids[-1][0]}}}",))
            run.run = [k for _, _, k in kids]
            run.last = max(k.last for k in run.run)
            run.n_nodes = sum(k.n_nodes for k in run.run)
            run.params = sum(k.params for k in run.run)
            for _, key, _ in kids:
                del g.children[key]
            g.children[run.path[-1]] = run
    return heads


def _collapse_chains(root: Group) -> None:
    """A group that is only a step on the way (no node, no local members, one child group) is
    replaced by its child: ``t.a`` → ``t.a.c`` → ``t.a.c.causal_mask`` shows as its last line."""
    stack = [root]
    while stack:
        g = stack.pop()
        for key in list(g.children):
            kid = g.children[key]
            while kid.node is None and not kid.locals and kid.run is None and len(kid.children) == 1:
                kid = next(iter(kid.children.values()))
            g.children[key] = kid
            stack.append(kid)


_DIGITS = re.compile(r"\d+")


def _signature(top: Group) -> tuple:
    """What a group holds (types, shapes, counts, the keys below it with their numbers written
    ``#``, so that ``h3`` and ``h4`` of identical layers sign the same); post-order over an
    explicit stack."""
    sig: dict[int, tuple] = {}
    stack = [(top, False)]
    while stack:
        g, done = stack.pop()
        if not done:
            stack.append((g, True))
            stack.extend((k, False) for k in [*(g.run or ()), *g.children.values()])
            continue
        node = None if g.node is None else (g.node.type_name, g.node.shape)
        sig[id(g)] = (node, g.n_nodes, g.params, len(g.run or ()),
                      tuple((short and _DIGITS.sub("#", short), c.shape) for short, c in g.locals),
                      tuple((_DIGITS.sub("#", key), sig[id(k)]) for key, k in g.children.items()))
    return sig[id(top)]


def _collapse_repeats(root: Group, more_than: int) -> None:
    """Replace each run of more than ``more_than`` numbered sibling groups with equal contents
    (``_signatures``) and some structure (subgroups or local members) by one group that shows
    the first and counts them (``Group.repeats``)."""
    stack = [root]
    while stack:
        g = stack.pop()
        by_stem: dict[str, list] = {}
        for key, kid in g.children.items():
            m = _NUMBERED.match(key)
            if m and kid.run is None and (kid.children or kid.locals):
                by_stem.setdefault(m.group(1), []).append((int(m.group(2)), key, kid))
        for stem, kids in by_stem.items():
            kids.sort(key=lambda item: item[0])
            if len(kids) <= more_than or len({_signature(k) for _, _, k in kids}) != 1:
                continue
            first = kids[0][2]
            rep = Group(first.path)
            rep.node, rep.children, rep.locals = first.node, first.children, first.locals
            rep.n_nodes, rep.params = first.n_nodes, first.params
            rep.last = max(k.last for _, _, k in kids)
            nums = [i for i, _, _ in kids]
            span = f"{nums[0]}..{nums[-1]}" if nums == list(range(nums[0], nums[-1] + 1)) else ",".join(map(str, nums))
            prefix = first.name[: len(first.name) - len(kids[0][1])] if first.name.endswith(kids[0][1]) else ""
            rep.label = f"{prefix}{stem}{{{span}}}"
            rep.repeats = [k for _, _, k in kids]
            for _, key, _ in kids:
                del g.children[key]
            g.children[kids[0][1]] = rep
        stack.extend(k for k in g.children.values() if k.repeats is None)
        stack.extend(k for k in g.children.values() if k.repeats is not None)


def _gather_layers(root: Group) -> int:
    """Gather top-level groups whose first segment ends in a layer number (``a0``, ``b0``) under
    ``layer {n}`` groups, when there are at least two; return the number of layers."""
    by_layer: dict[int, list] = {}
    for key, kid in root.children.items():
        m = _NUMBERED.match(key)
        if m and m.group(1) and kid.run is None:
            by_layer.setdefault(int(m.group(2)), []).append(key)
    stems = {_NUMBERED.match(k).group(1) for keys in by_layer.values() for k in keys}
    nested = any(root.children[k].children for keys in by_layer.values() for k in keys)
    # Numbered names alone (n1, n2, ... of a chain) are not layers: layers have parts (a0 and b0,
    # or h0 holding h0.attn).
    if len(by_layer) < 2 or not (len(stems) >= 2 or nested):
        return 0
    for layer, keys in by_layer.items():
        gathered = Group((f"layer {layer}",))
        gathered.label = f"layer {layer}"
        for key in keys:
            kid = root.children.pop(key)
            gathered.children[key] = kid
            gathered.n_nodes += kid.n_nodes
            gathered.params += kid.params
            gathered.last = max(gathered.last, kid.last)
        root.children[f"layer {layer}"] = gathered
    return len(by_layer)
