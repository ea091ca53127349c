"""``diff(a, b)``: the nodes that differ between two circuits, each with its path from the root and
its old and new line — not a text diff, where one changed node shifts every serial number.

The two circuits are walked together from their roots.  Children are matched by name (among
siblings whose name is unique), then the rest by position; a child of ``a`` with no partner is
*removed*, one of ``b`` *added*.  A matched pair with a different line (type, payload, name,
value) is *changed*; ancestors that differ only because something below them changed are not
reported.  Each pair of nodes is visited once, so shared subtrees cost once and a change seen
through several parents is reported once, at its shortest path.

>>> import numpy as np
>>> from circuits import Add, Array, Einsum
>>> x, w = Array(np.ones(3, np.float32), name='x'), Array(np.ones(3, np.float32), name='w')
>>> a = Add(Einsum.from_spec('a,a->a', x, w, name='xw'), x, name='y')
>>> b = a.update('w', lambda n: Array(np.zeros(3, np.float32), name='w'))
>>> d = diff(a, b)
>>> len(d), d[0].kind, d[0].path
(1, 'changed', ('y', 'xw', 'w'))
>>> print(d)
1 change
~ y > xw > w
    - 'w' [3] Array 0fc433d41d1cf7dbbcbccc10
    + 'w' [3] Array 245f2337115cc3edbc186b71
>>> len(diff(a, a))
0
"""

from __future__ import annotations

import collections

from ..errors import printable
from ..nodes import Circuit
from ..text.html import escape

__all__ = ["diff", "Diff", "DiffEntry"]

DiffEntry = collections.namedtuple("DiffEntry", ["kind", "path", "old", "new"])
DiffEntry.__doc__ = """One difference: ``kind`` ('changed', 'added' or 'removed'), ``path`` (labels
of the nodes from the root down to it: names, or ``'<Type #i>'`` for an unnamed i-th child),
``old`` / ``new`` (the nodes in ``a`` / ``b``; None for an added / removed one)."""

MAX_PATH_SHOWN = 8


def _label(node: Circuit, position: int | None) -> str:
    if node.name is not None:
        return node.name
    return f"<{node.type_name}>" if position is None else f"<{node.type_name} #{position}>"


def _same_line(a: Circuit, b: Circuit) -> bool:
    if not a.children and not b.children:
        return a.hash == b.hash
    return (type(a) is type(b) and a.name == b.name and a.shape == b.shape and a.dtype == b.dtype
            and a.payload_text() == b.payload_text())


def _pair_children(a: Circuit, b: Circuit):
    """Pairs ``(i, j)`` of matched children (by unique name, then position), unmatched i's, unmatched j's."""
    def unique_names(kids):
        count = collections.Counter(k.name for k in kids if k.name is not None)
        return {k.name: i for i, k in enumerate(kids) if k.name is not None and count[k.name] == 1}

    na, nb = unique_names(a.children), unique_names(b.children)
    pairs = [(i, nb[name]) for name, i in na.items() if name in nb]
    used_a, used_b = {i for i, _ in pairs}, {j for _, j in pairs}
    rest_a = [i for i in range(len(a.children)) if i not in used_a]
    rest_b = [j for j in range(len(b.children)) if j not in used_b]
    n = min(len(rest_a), len(rest_b))
    pairs += list(zip(rest_a[:n], rest_b[:n]))
    return sorted(pairs), rest_a[n:], rest_b[n:]


class Diff:
    """The differences between two circuits (``diff(a, b)``): a sequence of ``DiffEntry`` that
    prints compactly and shows as a table in a notebook (``_repr_html_``)."""

    def __init__(self, entries):
        self.entries = list(entries)

    def __len__(self):
        return len(self.entries)

    def __bool__(self):
        return bool(self.entries)

    def __iter__(self):
        return iter(self.entries)

    def __getitem__(self, i):
        return self.entries[i]

    @staticmethod
    def _path_text(path) -> str:
        if len(path) > MAX_PATH_SHOWN:
            path = (*path[:2], "…", *path[-(MAX_PATH_SHOWN - 3):])
        return " > ".join(path)

    def __str__(self):
        n = len(self.entries)
        if not n:
            return "no differences"
        out = [f"{n} change{'s' if n != 1 else ''}"]
        marks = {"changed": "~", "added": "+", "removed": "-"}
        for e in self.entries:
            out.append(f"{marks[e.kind]} {self._path_text(e.path)}")
            if e.old is not None:
                out.append(f"    - {e.old.line()}")
            if e.new is not None:
                out.append(f"    + {e.new.line()}")
        return printable("\n".join(out), keep="\n")

    def __repr__(self):
        return f"<Diff: {len(self.entries)} change(s)>"

    def _repr_html_(self):
        if not self.entries:
            return "<div><i>no differences</i></div>"
        rows = "".join(
            f"<tr><td>{e.kind}</td><td title='{escape(' > '.join(e.path), quote=True)}'>{escape(self._path_text(e.path))}</td>"
            f"<td><code>{escape(e.old.line()) if e.old is not None else ''}</code></td>"
            f"<td><code>{escape(e.new.line()) if e.new is not None else ''}</code></td></tr>"
            for e in self.entries
        )
        return ("<table class='circuits-diff'><thead><tr><th>kind</th><th>path</th><th>old</th><th>new</th>"
                f"</tr></thead><tbody>{rows}</tbody></table>")


def diff(a: Circuit, b: Circuit) -> Diff:
    """The changed, added and removed nodes from ``a`` to ``b`` with their paths from the root
    (see the module docstring); empty when the circuits are equal.

    >>> from circuits import Add, Scalar
    >>> one, two = Scalar(1.0, name='one'), Scalar(2.0, name='two')
    >>> print(diff(Add(one, name='s'), Add(one, two, name='s')))
    1 change
    + s > two
        + 'two' [] Scalar 2
    """
    entries: list[DiffEntry] = []
    seen: set[tuple[bytes, bytes]] = set()

    def materialize(link) -> tuple:
        # A path is a linked list (label, parent link): extending it is O(1), so a deep chain
        # costs its depth, not its depth squared.
        out = []
        while link is not None:
            out.append(link[0])
            link = link[1]
        return tuple(reversed(out))

    queue = collections.deque([(a, b, (_label(a, None), None))])  # breadth first: shortest paths
    while queue:
        x, y, link = queue.popleft()
        key = (x.hash, y.hash)
        if x.hash == y.hash or key in seen:
            continue
        seen.add(key)
        if not _same_line(x, y):
            entries.append(DiffEntry("changed", materialize(link), x, y))
        if not x.children or not y.children:
            continue
        pairs, only_a, only_b = _pair_children(x, y)
        for i, j in pairs:
            queue.append((x.children[i], y.children[j], (_label(y.children[j], j), link)))
        for i in only_a:
            entries.append(DiffEntry("removed", materialize((_label(x.children[i], i), link)), x.children[i], None))
        for j in only_b:
            entries.append(DiffEntry("added", materialize((_label(y.children[j], j), link)), None, y.children[j]))
    return Diff(entries)
