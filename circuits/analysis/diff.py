"""``diff(a, b)``: the nodes that differ between two circuits, each with its path from the root and
its old and new line — not a text diff, where one changed node shifts every serial number.

The two circuits are walked together from their roots.  Children are matched by name (among
siblings whose name is unique), then the rest by position; a child of ``a`` with no partner is
*removed*, one of ``b`` *added*.  A matched pair with a different line (type, payload, name,
value) is *changed*; ancestors that differ only because something below them changed are not
reported.  A node put above an unchanged one (``c.update(site, lambda n: f(n))``) is one
*wrapped* entry, and its removal one *unwrapped* entry, rather than a cascade of changes below
it.  Each pair of nodes is visited once, so shared subtrees cost once and a change seen
through several parents is reported once, at its shortest path.  It prints as a summary when
that is shorter (``Diff``), the full list on request; ``Diff.rust_text()`` is rust_circuit's text
diff of the same two circuits, for reading.

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

A node wrapped in place is one entry, not a change at every level below it:

>>> from circuits import GeneralFunction
>>> print(diff(a, a.update('xw', lambda n: GeneralFunction('relu', n, name='r'))))
1 change
+ y > r
    + 'r' GeneralFunction relu
      above xw (unchanged)
"""

from __future__ import annotations

import collections

from ..errors import printable
from ..nodes import Circuit
from ..text.html import escape

__all__ = ["diff", "Diff", "DiffEntry"]

DiffEntry = collections.namedtuple("DiffEntry", ["kind", "path", "old", "new"])
DiffEntry.__doc__ = """One difference: ``kind`` ('changed', 'added', 'removed', 'wrapped' or
'unwrapped'), ``path`` (labels of the nodes from the root down to it: names, or ``'<Type #i>'``
for an unnamed i-th child), ``old`` / ``new`` (the nodes in ``a`` / ``b``; None for an added /
removed one).  A 'wrapped' entry's ``new`` node has ``old`` among its children, unchanged (a node
inserted above it); an 'unwrapped' entry's ``old`` node had ``new`` among its children."""

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


MAX_LISTED = 12  # changes listed in a summary before "… N more"


def _copy_suffix(entry) -> str | None:
    """For a node that changed only its name, the text the new name adds to the old one
    (``'.patched'``), ``''`` for another rename; None when the node changed in itself."""
    old, new = entry.old, entry.new
    if entry.kind != "changed" or old.name is None or new.name is None or old.name == new.name:
        return None
    if not (type(old) is type(new) and old.shape == new.shape and old.dtype == new.dtype
            and old.payload_text() == new.payload_text()):
        return None
    if not old.children and old.rename(new.name).hash != new.hash:
        return None  # a leaf whose value changed as well
    return new.name[len(old.name):] if new.name.startswith(old.name) else ""


class Diff:
    """The differences between two circuits (``diff(a, b)``): a sequence of ``DiffEntry``.

    It prints (and shows in a notebook, ``_repr_html_``) as a summary: where the change enters
    the circuit, how many nodes were copied under a new name (``'<name>.patched'``: the nodes an
    intervention rebuilt, unchanged in themselves), and every node that changed in itself (a
    value, a payload, a type), added or removed.  ``full()`` (or ``diff(a, b, full=True)``) lists
    every node, each with its path and old and new line.

    >>> from circuits import Add, Scalar
    >>> x = Scalar(1.0, name='x')
    >>> a = Add(Add(x, name='inner'), name='top')
    >>> b = Add(Add(Scalar(2.0, name='x.new'), name='inner.copy'), name='top')
    >>> d = diff(a, b)
    >>> print(d)
    2 changes, starting at top > inner (now 'inner.copy')
    1 node copied as '<name>.copy': inner
    1 node changed in itself:
    ~ top > inner.copy > x.new
        - 'x' [] Scalar 1
        + 'x.new' [] Scalar 2
    (diff(a, b, full=True) or .full() lists every node)
    >>> len(d.full()), d.copies
    (2, {'.copy': 1})
    """

    def __init__(self, entries, starts=(), *, full: bool = False, circuits=(None, None)):
        self.entries = list(entries)
        self.starts = list(starts)  # the entries whose parent is the same on both sides
        self.is_full = full
        self.a, self.b = circuits

    def __len__(self):
        return len(self.entries)

    def __bool__(self):
        return bool(self.entries)

    def __iter__(self):
        return iter(self.entries)

    def __getitem__(self, i):
        return self.entries[i]

    def full(self) -> "Diff":
        """The same diff, printing every changed, added and removed node."""
        return Diff(self.entries, self.starts, full=True, circuits=(self.a, self.b))

    def rust_text(self, **options) -> str:
        """rust_circuit's text diff of the two circuits (``diff_circuits`` in rust's
        ``nb_operations``): both trees printed together, equal subtrees once (``# same N``),
        nodes whose children differ marked ``# changed N``, other pairs as the new subtree then
        the old (``# new`` / ``# removed``).  ``options`` are rust's: ``color``,
        ``print_legend``, ``require_name_same``, ..., and print options (``shapes=True``); see
        ``circuits.text.rust_diff``.

        >>> from circuits import Add, Scalar
        >>> print(diff(Add(Scalar(2.0), name='s'), Add(Scalar(1.0), name='s')).rust_text(print_legend=False))
        's' Add # changed 0
          0 [] Scalar 1 # new
          0 [] Scalar 2 # removed
        """
        from ..text.rust_diff import diff_circuits

        return diff_circuits(self.b, self.a, **options)

    def _groups(self):
        """(copies: suffix -> entries copied under it, own: the other entries), in order."""
        copies: dict[str, list] = {}
        own = []
        for e in self.entries:
            suffix = _copy_suffix(e)
            if suffix is None:
                own.append(e)
            else:
                copies.setdefault(suffix, []).append(e)
        return copies, own

    @property
    def copies(self) -> dict:
        """How many nodes were copied under each new-name suffix (``{'.patched': 13}``; ``''``
        counts other renames): the nodes an intervention rebuilt without changing them."""
        return {k: len(v) for k, v in self._groups()[0].items()}

    @staticmethod
    def _path_text(path) -> str:
        if len(path) > MAX_PATH_SHOWN:
            path = (*path[:2], "…", *path[-(MAX_PATH_SHOWN - 3):])
        return " > ".join(path)

    @staticmethod
    def _entry_lines(e) -> list:
        marks = {"changed": "~", "added": "+", "removed": "-", "wrapped": "+", "unwrapped": "-"}
        out = [f"{marks[e.kind]} {Diff._path_text(e.path)}"]
        if e.kind == "wrapped":
            return [*out, f"    + {e.new.line()}", f"      above {_label(e.old, None)!s} (unchanged)"]
        if e.kind == "unwrapped":
            return [*out, f"    - {e.old.line()}", f"      now {_label(e.new, None)!s} directly (unchanged)"]
        if e.old is not None:
            out.append(f"    - {e.old.line()}")
        if e.new is not None:
            out.append(f"    + {e.new.line()}")
        return out

    @staticmethod
    def _start_text(e) -> str:
        if e.kind == "changed" and e.old.name is not None and e.new.name not in (None, e.old.name):
            return f"{Diff._path_text((*e.path[:-1], e.old.name))} (now {e.new.name!r})"
        return Diff._path_text(e.path)

    def _head(self) -> str:
        n = len(self.entries)
        return f"{n} change{'s' if n != 1 else ''}"

    def _summary_lines(self) -> list:
        copies, own = self._groups()
        starts = ", ".join(self._start_text(e) for e in self.starts[:3])
        more = f" and {len(self.starts) - 3} more places" if len(self.starts) > 3 else ""
        out = [f"{self._head()}, starting at {starts}{more}"]
        for suffix, group in copies.items():
            names = [e.old.name for e in group]
            shown = ", ".join(names[:4]) + (f", … ({len(names) - 4} more)" if len(names) > 4 else "")
            how = f"copied as '<name>{suffix}'" if suffix else "renamed"
            out.append(f"{len(group)} node{'s' if len(group) != 1 else ''} {how}: {shown}")
        if own:
            out.append(f"{len(own)} node{'s' if len(own) != 1 else ''} changed in itself"
                       f"{', added or removed' if any(e.kind != 'changed' for e in own) else ''}:")
            for e in own[:MAX_LISTED]:
                out.extend(self._entry_lines(e))
            if len(own) > MAX_LISTED:
                out.append(f"… {len(own) - MAX_LISTED} more")
        out.append("(diff(a, b, full=True) or .full() lists every node)")
        return out

    def _is_summarised(self) -> bool:
        # A diff with no copies and few entries is its own summary: the full list is as short.
        return not self.is_full and (bool(self._groups()[0]) or len(self.entries) > MAX_LISTED)

    def __str__(self):
        if not self.entries:
            return "no differences"
        if self._is_summarised():
            return printable("\n".join(self._summary_lines()), keep="\n")
        out = [self._head()]
        for e in self.entries:
            out.extend(self._entry_lines(e))
        return printable("\n".join(out), keep="\n")

    def __repr__(self):
        return f"<Diff: {len(self.entries)} change(s)>"

    def _rows(self, entries) -> str:
        return "".join(
            f"<tr><td>{e.kind}</td><td title='{escape(' > '.join(e.path), quote=True)}'>{escape(self._path_text(e.path))}</td>"
            f"<td><code>{escape(e.old.line()) if e.old is not None else ''}</code></td>"
            f"<td><code>{escape(e.new.line()) if e.new is not None else ''}</code></td></tr>"
            for e in entries
        )

    def _repr_html_(self):
        if not self.entries:
            return "<div><i>no differences</i></div>"
        head = ("<table class='circuits-diff'><thead><tr><th>kind</th><th>path</th><th>old</th><th>new</th>"
                "</tr></thead><tbody>")
        if not self._is_summarised():
            return f"{head}{self._rows(self.entries)}</tbody></table>"
        lines = self._summary_lines()
        copies, own = self._groups()
        text = "".join(f"<div>{escape(line)}</div>" for line in lines[: 1 + len(copies)])
        table = f"{head}{self._rows(own)}</tbody></table>" if own else ""
        return (f"<div class='circuits-diff-summary'>{text}{table}"
                f"<div><i>{escape(lines[-1])}</i></div></div>")


def diff(a: Circuit, b: Circuit, *, full: bool = False) -> Diff:
    """The changed, added and removed nodes from ``a`` to ``b`` with their paths from the root
    (see the module docstring); empty when the circuits are equal.  It prints as a summary
    (where the change starts, how many nodes were copied under a new name, what changed in
    itself) when that is shorter; ``full=True`` lists every node.

    >>> from circuits import Add, Scalar
    >>> one, two = Scalar(1.0, name='one'), Scalar(2.0, name='two')
    >>> print(diff(Add(one, name='s'), Add(one, two, name='s')))
    1 change
    + s > two
        + 'two' [] Scalar 2
    """
    entries: list[DiffEntry] = []
    starts: list[DiffEntry] = []
    seen: set[tuple[bytes, bytes]] = set()

    def materialize(link) -> tuple:
        # A path is a linked list (label, parent link): extending it is O(1), so a deep chain
        # costs its depth, not its depth squared.
        out = []
        while link is not None:
            out.append(link[0])
            link = link[1]
        return tuple(reversed(out))

    def add(entry, parent_same):
        entries.append(entry)
        if parent_same:
            starts.append(entry)

    # breadth first: shortest paths; each item carries whether its parents' lines are the same
    queue = collections.deque([(a, b, (_label(a, None), None), True)])
    while queue:
        x, y, link, parent_same = queue.popleft()
        key = (x.hash, y.hash)
        if x.hash == y.hash or key in seen:
            continue
        seen.add(key)
        if any(k.hash == x.hash for k in y.children):  # a node inserted above x
            add(DiffEntry("wrapped", materialize(link), x, y), parent_same)
            continue
        if any(k.hash == y.hash for k in x.children):  # x taken out, its child in its place
            path = materialize(link)
            add(DiffEntry("unwrapped", (*path[:-1], x.name if x.name is not None else path[-1]), x, y), parent_same)
            continue
        same = _same_line(x, y)
        if not same:
            add(DiffEntry("changed", materialize(link), x, y), parent_same)
        if not x.children or not y.children:
            continue
        pairs, only_a, only_b = _pair_children(x, y)
        for i, j in pairs:
            queue.append((x.children[i], y.children[j], (_label(y.children[j], j), link), same))
        for i in only_a:
            add(DiffEntry("removed", materialize((_label(x.children[i], i), link)), x.children[i], None), same)
        for j in only_b:
            add(DiffEntry("added", materialize((_label(y.children[j], j), link)), None, y.children[j]), same)
    return Diff(entries, starts, full=full, circuits=(a, b))
