"""Sites and inputs of an intervention, and the one copy operation every transform is made of.

A *site* is the node an intervention acts on.  It is given as a name (``'b1.a.head3'``), a
matcher (``Inside('b1.a.head3', 'a.k')``, ``Glob(...)``) or a node, and must name exactly one
node of the circuit: a site that matches nothing says so with the closest names, one that
matches several lists each match's path from the root (``get_unique``'s error).

An *input* is an Array or Symbol of the circuit named by a source or data mapping
(``{'toks_int_var': tokens}``); its value must have the input's shape (with a leading batch
axis for data) and the input's kind of dtype (ints for an int input, floats for a float one).

``copy_with`` is the copy every transform uses: the part of some nodes' subtrees that depends on
replaced nodes is rebuilt over the replacements, each rebuilt named node renamed ``name + suffix``;
what does not depend on them is shared, unchanged, with the original.

>>> import numpy as np
>>> from circuits import Array, Add, Einsum
>>> x = Array(np.ones(2, np.float32), name='x')
>>> c = Add(Einsum.from_spec('a,a->a', x, x, name='sq'), x, name='y')
>>> resolve_sites(c, ['sq', c])[0]
('sq', <'sq' Einsum a,a->a [2]>)
>>> x2 = Array(np.full(2, 2.0, np.float32), name='x.source')
>>> copy_with([c], {x.hash: x2}, '.source')[c.hash].line()
"'y.source' Add"
"""

from __future__ import annotations

import collections
import difflib
import heapq
import threading
import weakref
from typing import Callable, Iterable, Mapping

import numpy as np

from ..dtypes import is_float, is_int
from ..errors import CircuitError, SelectionError, ShapeError
from ..nodes import Add, Array, Circuit, Einsum, Symbol
from ..nodes.base import bulk_build
from ..select import Hook, Matcher, Name, as_matcher, get_unique
from ..select.hooks import hook_source, is_hook_name
from ..traversal import replace, toposort

__all__ = ["resolve_site", "resolve_sites", "resolve_inputs", "copy_with", "site_label", "one_root", "paired_root",
           "batched_sources", "walk", "replace_within"]


def site_label(node: Circuit, given=None) -> str:
    """The label a site's results and replacement names use: the name given, else the node's."""
    if isinstance(given, str):
        return given
    return node.name if node.name is not None else node.line()


def resolve_site(circuit: Circuit, site, what: str = "site") -> Circuit:
    """The one node of ``circuit`` that ``site`` (a name, matcher or node) names."""
    if isinstance(site, Circuit):
        if not walk(circuit).has(site):
            raise SelectionError(f"{what} {site.line()} is not a node of the circuit rooted at {circuit.line()}")
        return site
    if not isinstance(site, (str, Matcher)):
        raise SelectionError(f"{what} {site!r}: give a node name, a matcher (circuits.select) or a node")
    if isinstance(site, str):
        hits = walk(circuit).named(circuit, site)
        if len(hits) == 1:
            return hits[0]
    matcher = (Hook(site) if is_hook_name(site) else Name(site)) if isinstance(site, str) else as_matcher(site)
    try:
        return get_unique(circuit, matcher)
    except SelectionError as e:
        hint = ""
        if isinstance(site, str) and "matched 0 nodes" in str(e):
            names = {n.name for n in toposort(circuit) if n.name is not None}
            close = difflib.get_close_matches(site, sorted(names), n=3)
            hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
        raise SelectionError(f"{what} {_spell(site)}: {e}{hint}") from None


def resolve_sites(circuit: Circuit, sites, what: str = "site") -> list[tuple[str, Circuit]]:
    """``[(label, node)]`` for one site or a list of them (see ``resolve_site``).  A
    TransformerLens hook name that stands for several nodes (``'blocks.1.attn.hook_z'``: every
    head's) gives each of them, labelled by its own name.

    >>> import numpy as np
    >>> from circuits.models import attn_only, random_weights
    >>> w = random_weights(vocab=11, d_model=8, n_heads=2, head_size=4, n_layers=1, max_positions=16)
    >>> [label for label, _ in resolve_sites(attn_only(w, np.arange(6), unique_names=True), 'blocks.0.attn.hook_z')]
    ['b0.a.head0.a.comb_v', 'b0.a.head1.a.comb_v']
    """
    items = list(sites) if isinstance(sites, (list, tuple)) else [sites]
    if not items:
        raise SelectionError(f"no {what} given: pass a name, a matcher, a node, or a list of them")
    out = []
    for s in items:
        if isinstance(s, str) and is_hook_name(s) and not walk(circuit).named(circuit, s):
            src = hook_source(circuit, s)
            nodes = src.nodes if src is not None and src.selectable else []
            if len(nodes) > 1:  # labelled by their own names where those are unique, else by head
                w = walk(circuit)
                out += [(n.name if n.name is not None and len(w.names.get(n.name, ())) == 1 else f"{s}.head{i}", n)
                        for i, n in enumerate(nodes)]
                continue
        found = resolve_site(circuit, s, what)
        out.append((site_label(found, s), found))
    return out


class Walk:
    """What one walk of a circuit tells the interventions (its nodes in toposort order, by name,
    its inputs), made once per circuit and kept while the circuit lives (``walk``): patching
    every head of a model resolves 144 sites and inputs, and rebuilds 144 sets of ancestors,
    without walking the circuit 144 times.  The circuit itself is not held (it is the last node
    of its order): ``order(circuit)`` gives it back."""

    __slots__ = ("below", "position", "names", "leaves", "_readers", "__weakref__")

    def __init__(self, circuit: Circuit):
        order = toposort(circuit)
        self.below = order[:-1]  # the root is last; kept out so the walk does not keep it alive
        self.position = {n.hash: i for i, n in enumerate(order)}
        names: dict = {}
        for n in order:
            if n.name is not None:
                names.setdefault(n.name, []).append(n.hash)
        self.names = names
        self.leaves = [n for n in self.below if isinstance(n, (Array, Symbol))]
        self._readers = None

    def readers(self, circuit: Circuit) -> list[tuple]:
        """For each position, the positions of the nodes that read that node (made on first use)."""
        found = self._readers
        if found is None:
            out: list = [[] for _ in range(len(self.below) + 1)]
            position = self.position
            for i, node in enumerate(self.order(circuit)):
                for c in node.children:
                    out[position[c.hash]].append(i)
            found = self._readers = [tuple(r) for r in out]
        return found

    def order(self, circuit: Circuit) -> list[Circuit]:
        return [*self.below, circuit]

    def has(self, node: Circuit) -> bool:
        return node.hash in self.position

    def named(self, circuit: Circuit, name: str) -> list[Circuit]:
        """The nodes named ``name``."""
        order = self.below
        return [order[self.position[h]] if h != circuit.hash else circuit for h in self.names.get(name, ())]

    def inputs(self, circuit: Circuit) -> list[Circuit]:
        """The Arrays and Symbols (the root too when it is one)."""
        return self.leaves + ([circuit] if isinstance(circuit, (Array, Symbol)) else [])


_WALKS: "weakref.WeakKeyDictionary[Circuit, Walk]" = weakref.WeakKeyDictionary()
_walks_lock = threading.Lock()


def walk(circuit: Circuit) -> Walk:
    """The ``Walk`` of ``circuit`` (made on first use, kept while the circuit lives).

    >>> import numpy as np
    >>> from circuits import Array, Add
    >>> x = Array(np.ones(2, np.float32), name='x')
    >>> c = Add(x, x, name='y')
    >>> [n.name for n in walk(c).leaves], walk(c) is walk(c)
    (['x'], True)
    """
    found = _WALKS.get(circuit)
    if found is None:
        found = Walk(circuit)
        with _walks_lock:
            found = _WALKS.setdefault(circuit, found)
    return found


def replace_within(circuit: Circuit, mapping: Mapping[Circuit, Circuit | Callable[[Circuit], Circuit]]) -> Circuit:
    """``circuits.traversal.replace(circuit, mapping)`` over the circuit's kept ``walk``: only
    the nodes after the first replaced one in its order are looked at, and only those over a
    changed child are rebuilt (a patch of a late layer's head rebuilds the few nodes above it).
    A value may be a function of the node as rebuilt over the replacements below it (an
    intervention at some positions of a site keeps the rest of the site as the circuit computes
    it, other interventions included).

    >>> import numpy as np
    >>> from circuits import Array, Add
    >>> x, z = Array(np.ones(2, np.float32), name='x'), Array(np.zeros(2, np.float32), name='z')
    >>> c = Add(Add(x, x, name='xx'), x, name='y')
    >>> replace_within(c, {c.get_unique('xx'): z}).to_text() == replace(c, {c.get_unique('xx'): z}).to_text()
    True
    """
    table = {k.hash: v for k, v in mapping.items()}
    if not table:
        return circuit
    w = walk(circuit)
    position = w.position
    if any(h not in position for h in table):
        if any(callable(v) and not isinstance(v, Circuit) for v in table.values()):
            raise CircuitError("replace_within: a node to replace is not in the circuit")
        return replace(circuit, mapping)
    readers = w.readers(circuit)
    below = w.below
    changed: dict[bytes, Circuit] = {}
    late = {h: fn for h, fn in table.items() if not isinstance(fn, Circuit)}
    for h, v in table.items():
        if h not in late:
            changed[h] = v
    # The ancestors of the replaced nodes, in order (children first): from each rebuilt node up
    # to its readers, so that only those are looked at.  A node replaced by a function is
    # visited itself (its children may change first).
    heap = sorted({r for h in table if h not in late for r in readers[position[h]]} | {position[h] for h in late})
    seen = set(heap)
    get = changed.get
    with bulk_build():  # hundreds of nodes built and kept: the collector's passes would double the time
        while heap:
            i = heapq.heappop(heap)
            node = below[i] if i < len(below) else circuit
            h = node.hash
            if h not in table:
                changed[h] = node.with_children(tuple([get(k.hash, k) for k in node.children]))
            elif h in late:
                changed[h] = late[h](node.with_children(tuple([get(k.hash, k) for k in node.children])))
            for r in readers[i]:
                if r not in seen:
                    seen.add(r)
                    heapq.heappush(heap, r)
    return changed.get(circuit.hash, circuit)


def _spell(site) -> str:
    return repr(site) if isinstance(site, str) else site.describe() if isinstance(site, Matcher) else site.line()


def batched_sources(circuit: Circuit, source: Mapping) -> tuple[dict, dict]:
    """``(source, inputs)``: each source value that carries a leading batch axis (one axis more
    than its input) replaced by a Symbol ``'<input>.source'`` of the input's shape, and the batch
    bound to that Symbol in ``inputs``; other values as given.  A patched copy then reads the
    Symbol, and one program evaluates it over the whole batch.

    >>> import numpy as np
    >>> from circuits import Symbol, GeneralFunction
    >>> toks = Symbol((3,), name='toks', dtype='int64')
    >>> src, extra = batched_sources(GeneralFunction('relu', toks), {'toks': np.zeros((8, 3), int)})
    >>> [k.name for k in extra], extra[src['toks']].shape
    (['toks.source'], (8, 3))
    """
    if not isinstance(source, Mapping):
        return source, {}
    leaves = None
    out, extra = {}, {}
    for key, value in source.items():
        if not isinstance(value, Circuit) and getattr(value, "ndim", None) is not None:
            if leaves is None:
                leaves = [n for n in toposort(circuit) if isinstance(n, (Array, Symbol))]
            node = _find_input(leaves, key, "source", circuit)
            if value.ndim == len(node.shape) + 1 and tuple(value.shape[1:]) == node.shape:
                sym = Symbol(node.shape, name=f"{node.name if node.name is not None else 'input'}.source",
                             dtype=node.dtype)
                out[key] = sym
                extra[sym] = value
                continue
        out[key] = value
    return out, extra


def resolve_inputs(circuit: Circuit, values: Mapping, what: str, *, batched: bool = False
                   ) -> dict[bytes, tuple[Circuit, np.ndarray]]:
    """``{input hash: (input node, value)}`` for a mapping from inputs (Arrays or Symbols of the
    circuit, or their names) to values; each value checked against its input's shape (after a
    leading batch axis when ``batched``) and kind of dtype, and cast to the input's dtype.  A value
    may also be a node of the input's shape and dtype (a Symbol for a batch of sources)."""
    if not isinstance(values, Mapping) or not values:
        raise CircuitError(f"{what}: give a mapping from input names (Arrays or Symbols) to values, got {values!r}")
    leaves = walk(circuit).inputs(circuit)
    out: dict[bytes, tuple[Circuit, np.ndarray]] = {}
    for key, value in values.items():
        node = _find_input(leaves, key, what, circuit)
        if isinstance(value, Circuit) and not batched:
            # A node (e.g. a Symbol 'corrupt_toks') stands for the input: the patched circuit reads
            # it, so one patched circuit evaluates over a batch of sources (evaluate_batched).
            if value.shape != node.shape or value.dtype != node.dtype:
                raise ShapeError(f"{what}[{_key_text(key)}] is {value.line()} ({value.dtype}); "
                                 f"{node.line()} needs shape {list(node.shape)} and dtype {node.dtype}")
            if node.hash in out:
                raise CircuitError(f"{what}: {node.line()} is given twice")
            out[node.hash] = (node, value)
            continue
        arr = np.asarray(value)
        want = node.shape
        got = arr.shape[1:] if batched else arr.shape
        if (batched and arr.ndim == 0) or got != want:
            layout = f"[batch, {', '.join(map(str, want))}]" if batched else str(list(want))
            raise ShapeError(
                f"{what}[{_key_text(key)}] has shape {list(arr.shape)}; {node.line()} needs {layout}"
            )
        if is_int(node.dtype) and arr.dtype.kind not in "iu":
            raise CircuitError(f"{what}[{_key_text(key)}] has dtype {arr.dtype}; {node.line()} needs ints ({node.dtype})")
        if is_float(node.dtype) and arr.dtype.kind != "f":
            raise CircuitError(
                f"{what}[{_key_text(key)}] has dtype {arr.dtype}; {node.line()} needs floats ({node.dtype})"
            )
        if node.hash in out:
            raise CircuitError(f"{what}: {node.line()} is given twice")
        out[node.hash] = (node, arr.astype(np.dtype(node.dtype)))
    return out


def _key_text(key) -> str:
    return repr(key) if isinstance(key, str) else key.line() if isinstance(key, Circuit) else repr(key)


def _find_input(leaves: list[Circuit], key, what: str, circuit: Circuit) -> Circuit:
    if isinstance(key, Circuit):
        if not isinstance(key, (Array, Symbol)):
            raise CircuitError(f"{what}: {key.line()} is not an input; name an Array or a Symbol")
        if not any(n.hash == key.hash for n in leaves):
            raise SelectionError(f"{what}: {key.line()} is not an input of the circuit rooted at {circuit.line()}")
        return key
    if not isinstance(key, str):
        raise CircuitError(f"{what}: keys are input names or input nodes, got {key!r}")
    found = [n for n in leaves if n.name == key]
    if not found:
        names = sorted({n.name for n in leaves if n.name is not None})
        close = [n for n in names if key in n] + difflib.get_close_matches(key, names, n=3, cutoff=0.5)
        close = list(dict.fromkeys(close))[:3]
        listed = ", ".join(names[:12]) + (f", ... ({len(names)} in all)" if len(names) > 12 else "")
        hint = f"; did you mean {', '.join(map(repr, close))}?" if close else f"; its inputs: {listed}"
        raise SelectionError(f"{what}: the circuit has no input (Array or Symbol) named {key!r}{hint}")
    if len(found) > 1:
        lines = "\n  ".join(n.line() for n in found[:5])
        raise SelectionError(f"{what}: {len(found)} distinct inputs are named {key!r}:\n  {lines}\npass the node itself")
    return found[0]


def copy_with(roots: Iterable[Circuit], table: Mapping[bytes, Circuit], suffix: str, *,
              keep: Callable[[Circuit], bool] | None = None, within: Circuit | None = None) -> dict[bytes, Circuit]:
    """Rebuild ``roots`` over replacements (``{node hash: new node}``): every node that depends on
    a replaced node is rebuilt and, if named, renamed ``name + suffix``; the rest is returned
    as is (shared with the original).  ``keep(node)`` true stops the copy there: that node keeps
    its own value (a frozen node).  Returns ``{original hash: copy}`` for every node visited.

    ``within`` (the circuit the roots belong to; not with ``keep``) remembers the copies made
    for this table and suffix while that circuit lives, so copying site after site from one
    source (patching every head of a model) copies each node once: a later call stops at the
    nodes copied before (their subtrees are not visited again) and returns them too.

    >>> import numpy as np
    >>> from circuits import Array, Einsum
    >>> x = Array(np.ones(2, np.float32), name='x')
    >>> sq, cube = Einsum.from_spec('a,a->a', x, x, name='sq'), Einsum.from_spec('a,a,a->a', x, x, x, name='cube')
    >>> table = {x.hash: Array(np.zeros(2, np.float32), name='x.source')}
    >>> first = copy_with([sq], table, '.source', within=cube)[sq.hash]
    >>> copy_with([sq], table, '.source', within=cube)[sq.hash] is first, first.name
    (True, 'sq.source')
    """
    memo = _remembered(within, table, suffix) if within is not None and keep is None else None
    new: dict[bytes, Circuit] = {}
    if memo is None:
        stop = lambda n: n.hash in table or (keep is not None and keep(n))  # noqa: E731
    else:
        stop = lambda n: n.hash in table or n.hash in memo  # noqa: E731
    with bulk_build():
        for node in toposort(*roots, stop=stop):
            h = node.hash
            if h in table:
                new[h] = table[h]
            elif memo is not None and h in memo:
                new[h] = memo[h]
            elif not node.children or (keep is not None and keep(node)):
                new[h] = node
            else:
                kids = tuple(new[c.hash] for c in node.children)
                if all(a is b for a, b in zip(kids, node.children)):
                    new[h] = node
                else:  # rebuilt and renamed in one step
                    new[h] = node.with_children(kids, node.name + suffix if node.name is not None else None)
    if memo is not None:
        memo.update(new)
    return new


# Copies remembered per circuit (weakly: they go with it) and per (suffix, table): a few tables
# each, the most recently used kept.
_REMEMBERED: "weakref.WeakKeyDictionary[Circuit, collections.OrderedDict]" = weakref.WeakKeyDictionary()
_REMEMBERED_TABLES = 4
_remembered_lock = threading.Lock()


def _remembered(circuit: Circuit, table: Mapping[bytes, Circuit], suffix: str) -> dict:
    key = (suffix, tuple(sorted((h, v.hash) for h, v in table.items())))
    with _remembered_lock:
        tables = _REMEMBERED.get(circuit)
        if tables is None:
            tables = _REMEMBERED[circuit] = collections.OrderedDict()
        memo = tables.get(key)
        if memo is None:
            memo = tables[key] = {}
            while len(tables) > _REMEMBERED_TABLES:
                tables.popitem(last=False)
        else:
            tables.move_to_end(key)
        return memo


def one_root(nodes: list[Circuit]) -> Circuit:
    """A cheap root over several nodes (the sum of their full sums), so one program computes
    them all (``also=`` reads them back)."""
    return Add(*_full_sums(nodes))


def paired_root(nodes: list[Circuit]) -> Circuit:
    """``one_root`` with the sums added pairwise: op by op, one kernel (two scalars added) serves
    every level, where one Add over all the sums compiles a kernel per count of nodes.

    >>> import numpy as np
    >>> from circuits import Symbol, evaluate
    >>> xs = [Symbol((2,), name=n) for n in 'abc']
    >>> float(evaluate(paired_root(xs), {'a': np.ones(2), 'b': np.ones(2), 'c': np.full(2, 2.0)}))
    8.0
    """
    sums = _full_sums(nodes)
    if len(sums) == 1:
        return Add(*sums)
    while len(sums) > 1:
        sums = [Add(*sums[i:i + 2]) if i + 1 < len(sums) else sums[i] for i in range(0, len(sums), 2)]
    return sums[0]


def _full_sums(nodes: list[Circuit]) -> list[Circuit]:
    return [Einsum.from_spec(_AXES[: len(n.shape)] + "->", n) for n in nodes]


_AXES = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
