"""Selecting nodes: matchers by name, regex, glob, type and predicate, combined with ``&``, ``|``,
``~`` (``&`` short-circuits: an empty left side skips the right); structural matchers (below
another match, inside a site's own computation, within a depth, children of a match); and
``get``, ``get_unique``, ``update`` and ``paths`` over a circuit.

Each selection has one implementation, here, and two spellings with the same signature and
defaults: the Circuit method (``c.get(matcher)``) and this module's function (``get(c, matcher)``).
A matcher that matches nothing is an error naming it (``SelectionError``) unless the call says
``require=False``.

>>> import numpy as np
>>> from circuits import Array, Add, Einsum
>>> x = Array(np.ones(3, np.float32), name='x')
>>> c = Add(Einsum.from_spec('a,->a', x, Array(np.float32(2.0), name='two'), name='2x'), x, name='y')
>>> [n.name for n in c.get(Glob('*x'))]
['x', '2x']
>>> c.get_unique(Name('2x') & Type('Einsum')).line()
"'2x' Einsum a,->a"
>>> c.update(Name('x'), lambda n: n.rename('x0')).children[1].name
'x0'
>>> get(c, Regex('^z'), require=False)
[]
"""

from __future__ import annotations

import fnmatch
import re
from typing import Callable, Iterable

from ..errors import SelectionError, ShapeError
from ..nodes import NODE_TYPE_BY_NAME, Circuit
from ..traversal import parents_map, toposort
from .hooks import hook_nodes, hook_source, is_hook_name


class Matcher:
    """A predicate on nodes, possibly depending on where the node sits in the circuit.

    Subclasses implement ``matches(root) -> set of node hashes`` (whole-circuit matchers) or
    ``test(node) -> bool`` (local matchers)."""

    def test(self, node: Circuit) -> bool:  # pragma: no cover - overridden
        raise NotImplementedError

    def matches(self, root: Circuit, order: list[Circuit] | None = None) -> set[bytes]:
        order = toposort(root) if order is None else order
        return {n.hash for n in order if self.test(n)}

    def __and__(self, other):
        return _And(self, as_matcher(other))

    def __or__(self, other):
        return _Or(self, as_matcher(other))

    def __invert__(self):
        return _Not(self)

    def below(self, ancestor) -> "Below":
        """Nodes matching self that have a (strict) ancestor matching ``ancestor``."""
        return Below(as_matcher(ancestor), self)

    def inside(self, site) -> "Inside":
        """Nodes matching self that belong to the computation of a node matching ``site``
        (``Inside(site, self)``: nodes ``site`` dominates)."""
        return Inside(site, self)

    def __repr__(self):
        return self.describe()

    def describe(self) -> str:
        return type(self).__name__


def as_matcher(m) -> Matcher:
    """Coerce: a Matcher; a str (exact name; a TransformerLens hook name such as
    ``'blocks.0.attn.hook_z'`` is a ``Hook``); a node type or its name ('Einsum'); a node (that
    node); a callable (predicate); a set/list (any of them)."""
    if isinstance(m, Matcher):
        return m
    if isinstance(m, str):
        if m in NODE_TYPE_BY_NAME:
            return Type(m)
        return Hook(m) if is_hook_name(m) else Name(m)
    if isinstance(m, type) and issubclass(m, Circuit):
        return Type(m)
    if isinstance(m, Circuit):
        return Is(m)
    if isinstance(m, (set, frozenset, list, tuple)):
        parts = [as_matcher(x) for x in m]
        out = parts[0] if parts else Pred(lambda n: False, "nothing")
        for p in parts[1:]:
            out = out | p
        return out
    if callable(m):
        return Pred(m)
    raise TypeError(f"cannot match with {m!r}: give a Matcher, name, type, node, predicate or list of them")


class Name(Matcher):
    """Exact name (one or several)."""

    def __init__(self, *names: str):
        self.names = frozenset(names)

    def test(self, node):
        return node.name in self.names

    def describe(self):
        return "Name(" + ", ".join(map(repr, sorted(self.names))) + ")"


class Hook(Matcher):
    """The nodes a TransformerLens hook name stands for (``circuits.select.hooks``): a node named
    exactly so wins (a circuit imported from a HookedTransformer), else the nodes the hook table
    gives for the circuit's naming convention (every head's node of the layer for a per-head
    hook such as ``'blocks.1.attn.hook_z'``).  ``as_matcher`` makes one of any string spelled like
    a hook name, so ``c.get('blocks.0.hook_resid_post')`` and ``c.update('blocks.1.attn.hook_z', fn)``
    work on every builder's circuit."""

    def __init__(self, name: str):
        self.name = name

    def matches(self, root, order=None):
        order = toposort(root) if order is None else order
        exact = {n.hash for n in order if n.name == self.name}
        if exact:
            return exact
        src = hook_source(root, self.name)
        if src is None or not src.selectable:
            return set()
        return {n.hash for n in src.nodes}

    def describe(self):
        return f"Hook({self.name!r})"


class Regex(Matcher):
    """Name matching a regular expression (``re.search``; anchor it for a full match)."""

    def __init__(self, pattern: str):
        self.pattern = re.compile(pattern)

    def test(self, node):
        return node.name is not None and self.pattern.search(node.name) is not None

    def describe(self):
        return f"Regex({self.pattern.pattern!r})"


class Glob(Matcher):
    """Name matching a shell-style pattern: ``'a*.w.q.head?'``."""

    def __init__(self, pattern: str):
        self.pattern = pattern
        self._re = re.compile(fnmatch.translate(pattern))

    def test(self, node):
        return node.name is not None and self._re.match(node.name) is not None

    def describe(self):
        return f"Glob({self.pattern!r})"


class Type(Matcher):
    """Node type(s), as classes or printed names."""

    def __init__(self, *types):
        resolved = []
        for t in types:
            if isinstance(t, str):
                if t not in NODE_TYPE_BY_NAME:
                    raise SelectionError(f"unknown node type {t!r}; one of {', '.join(NODE_TYPE_BY_NAME)}")
                t = NODE_TYPE_BY_NAME[t]
            resolved.append(t)
        self.types = tuple(resolved)

    def test(self, node):
        return isinstance(node, self.types)

    def describe(self):
        return "Type(" + ", ".join(t.type_name for t in self.types) + ")"


class Is(Matcher):
    """That very node (by identity hash)."""

    def __init__(self, *nodes: Circuit):
        self.hashes = frozenset(n.hash for n in nodes)

    def test(self, node):
        return node.hash in self.hashes

    def describe(self):
        return f"Is({len(self.hashes)} node(s))"


class Pred(Matcher):
    """Any predicate ``node -> bool``."""

    def __init__(self, fn: Callable[[Circuit], bool], description: str | None = None):
        self.fn = fn
        self.description = description or getattr(fn, "__name__", "predicate")

    def test(self, node):
        return bool(self.fn(node))

    def describe(self):
        return f"Pred({self.description})"


class _And(Matcher):
    def __init__(self, a, b):
        self.a, self.b = a, b

    def matches(self, root, order=None):
        order = toposort(root) if order is None else order
        left = self.a.matches(root, order)
        # Short-circuit: an empty left side decides; the right side (maybe costly) is not run.
        return left & self.b.matches(root, order) if left else set()

    def describe(self):
        return f"({self.a.describe()} & {self.b.describe()})"


class _Or(Matcher):
    def __init__(self, a, b):
        self.a, self.b = a, b

    def matches(self, root, order=None):
        order = toposort(root) if order is None else order
        return self.a.matches(root, order) | self.b.matches(root, order)

    def describe(self):
        return f"({self.a.describe()} | {self.b.describe()})"


class _Not(Matcher):
    def __init__(self, a):
        self.a = a

    def matches(self, root, order=None):
        order = toposort(root) if order is None else order
        return {n.hash for n in order} - self.a.matches(root, order)

    def describe(self):
        return f"~{self.a.describe()}"


class Below(Matcher):
    """Nodes matching ``inner`` with a strict ancestor matching ``ancestor`` (a chain: "a node
    matching B below one matching A")."""

    def __init__(self, ancestor: Matcher, inner: Matcher):
        self.ancestor, self.inner = ancestor, inner

    def matches(self, root, order=None):
        order = toposort(root) if order is None else order
        anc = self.ancestor.matches(root, order)
        under: set[bytes] = set()
        # Parents come after children in toposort order: walk it backwards (top-down).
        for node in reversed(order):
            if node.hash in anc or node.hash in under:
                under.update(c.hash for c in node.children)
        return self.inner.matches(root, order) & under

    def describe(self):
        return f"{self.inner.describe()}.below({self.ancestor.describe()})"


class Inside(Matcher):
    """Nodes matching ``inner`` that belong to the computation of a node matching ``site``.

    A node ``n`` belongs to site ``Y`` when ``Y`` *dominates* it within the circuit: every path
    from the root to ``n`` passes through ``Y`` (``Y`` itself included).  So the search descends
    from ``Y`` and stops at every node that something outside ``Y`` also uses: the inputs ``Y``
    shares with other sites (the residual stream, a layer's normalised input, a shared mask) and
    everything below them.  In the seed's loss, ``Inside('b1.a.head3', 'a.k')`` is layer 1 head
    3's key and not layer 0's keys, which ``b1.a.head3`` reaches only through the residual
    stream that every later node reads too.  When the root itself matches ``site``, it dominates
    everything.  ``site`` and ``inner`` are matchers or anything ``as_matcher`` takes; several
    nodes matching ``site`` each contribute what they dominate.  Also spelled
    ``Name('a.k').inside('b1.a.head3')``.

    >>> import numpy as np
    >>> from circuits import Array, Add, Einsum
    >>> x = Array(np.ones(2, np.float32), name='x')
    >>> sq = lambda v, n: Einsum.from_spec('a,a->a', v, v, name=n)
    >>> h0, h1 = Add(sq(x, 'sq'), x, name='h0'), Add(sq(sq(x, 'sq2'), 'sq'), x, name='h1')
    >>> c = Add(h0, h1, name='out')
    >>> [n.children[0].name for n in c.get(Inside('h1', 'sq'))]   # h1's own 'sq', not h0's
    ['sq2']
    >>> c.get(Inside('h1', 'x'), require=False)                  # x is shared with h0: not h1's own
    []
    """

    def __init__(self, site, inner):
        self.site, self.inner = as_matcher(site), as_matcher(inner)

    def matches(self, root, order=None):
        order = toposort(root) if order is None else order
        sites = self.site.matches(root, order)
        if not sites:
            return set()
        inner = self.inner.matches(root, order)
        if not inner:
            return set()
        parents = parents_map(root)
        top_down = order[::-1]
        owned: set[bytes] = set()
        for start, node in enumerate(top_down):
            if node.hash not in sites:
                continue
            # Dominance: a node is Y's own when it is Y or all its parents are Y's own.  Parents
            # come first top-down, so one pass from Y settles every node below it.
            mine = {node.hash}
            for n in top_down[start + 1:]:
                ps = parents.get(n.hash)
                if ps and all(p.hash in mine for p in ps):
                    mine.add(n.hash)
            owned |= mine
        return owned & inner

    def describe(self):
        return f"Inside({self.site.describe()}, {self.inner.describe()})"


class Depth(Matcher):
    """Nodes at a distance (in edges) from the root within ``[min_depth, max_depth]`` along some
    path (shortest distance is used)."""

    def __init__(self, max_depth: int, min_depth: int = 0):
        self.min_depth, self.max_depth = min_depth, max_depth

    def matches(self, root, order=None):
        order = toposort(root) if order is None else order
        dist = {root.hash: 0}
        for node in reversed(order):
            d = dist.get(node.hash)
            if d is None:
                continue
            for c in node.children:
                if dist.get(c.hash, d + 2) > d + 1:
                    dist[c.hash] = d + 1
        return {h for h, d in dist.items() if self.min_depth <= d <= self.max_depth}

    def describe(self):
        return f"Depth({self.min_depth}..{self.max_depth})"


class ChildOf(Matcher):
    """Children of nodes matching ``parent`` (optionally only child number ``index``)."""

    def __init__(self, parent, index: int | None = None):
        self.parent, self.index = as_matcher(parent), index

    def matches(self, root, order=None):
        order = toposort(root) if order is None else order
        parents = self.parent.matches(root, order)
        out = set()
        for node in order:
            if node.hash in parents:
                kids = node.children if self.index is None else node.children[self.index:self.index + 1 or None]
                out.update(c.hash for c in kids)
        return out

    def describe(self):
        return f"ChildOf({self.parent.describe()}{'' if self.index is None else f', {self.index}'})"


def get(root: Circuit, matcher, *, require: bool = True) -> list[Circuit]:
    """Distinct matching nodes in toposort order (children first).  When nothing matches:
    SelectionError naming the matcher, or ``[]`` with ``require=False``."""
    m = as_matcher(matcher)
    order = toposort(root)
    hits = m.matches(root, order)
    out = [n for n in order if n.hash in hits]
    if require and not out:
        raise _matched_nothing("get", m, root)
    return out


def get_unique(root: Circuit, matcher) -> Circuit:
    """The one matching node; SelectionError naming the matcher (and the candidates) otherwise."""
    m = as_matcher(matcher)
    order = toposort(root)
    found = m.matches(root, order)
    hits = [n for n in order if n.hash in found]
    if len(hits) != 1:
        # Matches often print alike ('a.k' in every head): tell them apart by where they sit.
        where = _shortest_paths(order, found) if hits else {}
        listing = "".join(f"\n    {n.line()}\n      at {_path_text(where[n.hash])}" for n in hits[:10])
        more = f"\n    ... and {len(hits) - 10} more" if len(hits) > 10 else ""
        raise SelectionError(
            f"{m.describe()} matched {len(hits)} nodes, expected exactly 1{listing}{more}"
            + ("" if hits else f" (in the circuit rooted at {root.line()})")
            + ("\n  narrow it, e.g. Inside(site, matcher) for the one inside a named site" if hits else "")
        )
    return hits[0]


def _shortest_paths(order: list[Circuit], targets: set[bytes]) -> dict[bytes, list[Circuit]]:
    """A shortest root-to-node path (a list of nodes) to each node of ``targets``."""
    top_down = order[::-1]
    via: dict[bytes, Circuit | None] = {top_down[0].hash: None}
    dist = {top_down[0].hash: 0}
    for node in top_down:  # parents before children: each node's distance is final when reached
        d = dist.get(node.hash)
        if d is None:
            continue
        for c in node.children:
            if dist.get(c.hash, d + 2) > d + 1:
                dist[c.hash], via[c.hash] = d + 1, node
    by_hash = {n.hash: n for n in order}
    out = {}
    for h in targets:
        path, step = [], by_hash[h]
        while step is not None:
            path.append(step)
            step = via[step.hash]
        out[h] = path[::-1]
    return out


def _path_text(path: list[Circuit]) -> str:
    """``'t.loss' > 'll' > ... > 'a.k'``: the names along a path (an unnamed node by its type)."""
    return " > ".join(repr(n.name) if n.name is not None else n.type_name for n in path)


def update(root: Circuit, matcher, fn: Callable[[Circuit], Circuit], *, require: bool = True) -> Circuit:
    """Replace every matching node ``n`` by ``fn(n)`` (bottom-up: a match inside a match sees its
    updated children) and rebuild only the affected ancestors.  ``fn`` must keep the node's
    shape (ShapeError naming the node otherwise).  When nothing matches: SelectionError naming
    the matcher, or ``root`` unchanged with ``require=False``."""
    m = as_matcher(matcher)
    order = toposort(root)
    hits = m.matches(root, order)
    if require and not hits:
        raise _matched_nothing("update", m, root)
    new: dict[bytes, Circuit] = {}
    for node in order:
        rebuilt = node.with_children(tuple(new[c.hash] for c in node.children)) if node.children else node
        if node.hash in hits:
            out = fn(rebuilt)
            if not isinstance(out, Circuit):
                raise SelectionError(
                    f"update: the function returned a {type(out).__name__} for {node.line()}, not a circuit "
                    "node; return a node of the same shape — wrap a value as Array(value, name=...) (or "
                    "Scalar(x, shape))"
                )
            if out.shape != node.shape:
                raise ShapeError(
                    f"update: the function turned {node.line()} of shape {list(node.shape)} into "
                    f"{out.line()} of shape {list(out.shape)}; a replacement must keep the shape "
                    "(its parents were built for it)"
                )
            rebuilt = out
        new[node.hash] = rebuilt
    return new[root.hash]


def paths(root: Circuit, matcher, *, require: bool = True, limit: int = 1000) -> list[list[Circuit]]:
    """Root-to-node paths (lists of nodes) to each matching node, up to ``limit`` paths (a shared
    DAG can have exponentially many).  When nothing matches: SelectionError naming the matcher,
    or ``[]`` with ``require=False``."""
    m = as_matcher(matcher)
    order = toposort(root)
    hits = m.matches(root, order)
    if require and not hits:
        raise _matched_nothing("paths", m, root)
    # Only walk into subtrees that contain a match, so every path explored ends in one.
    reaches = set(hits)
    for node in order:
        if any(c.hash in reaches for c in node.children):
            reaches.add(node.hash)
    out: list[list[Circuit]] = []
    # A path is a linked list (node, rest-of-path-to-root): extending it is O(1), so a deep
    # chain costs its depth, not its depth squared.
    stack = [(root, None)] if root.hash in reaches else []
    while stack and len(out) < limit:
        link = stack.pop()
        node = link[0]
        if node.hash in hits:
            path, step = [], link
            while step is not None:
                path.append(step[0])
                step = step[1]
            out.append(path[::-1])
        for c in reversed(node.children):
            if c.hash in reaches:
                stack.append((c, link))
    return out


def _matched_nothing(what: str, m: Matcher, root: Circuit) -> SelectionError:
    if isinstance(m, Hook):  # say why: no such hook here, or a value computed from nodes
        try:
            hook_nodes(root, m.name)
        except SelectionError as e:
            return SelectionError(f"{what}: {e} (pass require=False to allow an empty selection)")
    return SelectionError(
        f"{what}: {m.describe()} matched nothing in the circuit rooted at {root.line()} "
        "(pass require=False to allow an empty selection)"
    )


def parents(root: Circuit, node: Circuit) -> list[Circuit]:
    """The distinct parents of ``node`` within ``root``."""
    return parents_map(root).get(node.hash, [])


def names(root: Circuit) -> Iterable[str]:
    """Every name used in the circuit, in toposort order, without repeats."""
    seen = []
    seen_set = set()
    for n in toposort(root):
        if n.name is not None and n.name not in seen_set:
            seen_set.add(n.name)
            seen.append(n.name)
    return seen
