"""``diff_circuits(new, old)``: rust_circuit's text diff of two circuits, for reading.

Users reach it as ``circuits.diff(old, new).rust_text(**options)`` (one name for diffs: the
structural ``circuits.diff``); this function keeps rust's name, argument order and options.

rust_circuit (``nb_operations/src/diff.rs``) walks the two trees together from their roots and
writes one text, indented like the circuits themselves:

- a pair of equal subtrees prints the subtree once, its first line ending ``# same N``;
- a pair of nodes equal *in themselves* (type, payload, name, shape, number of children) whose
  children differ prints that node's line ending ``# changed N``, then the children pairs below;
- any other pair prints the new subtree, then the old one (rust colours them green and red;
  without colour this library ends their first lines with ``# new`` and ``# removed``);
- a pair met again (a shared subtree) prints only `` # same N`` / `` # changed N``;
- a legend line closes the text.

``N`` counts the same/changed pairs in the order they are first met.  Subtrees print in this
library's text format (names quoted), each on its own (serials count from 0 in each).  It is a
text for people and does not parse back; ``circuits.diff(a, b)`` is the structural diff (a
list of changed nodes with their paths) to compute with.

>>> from circuits import parse
>>> old = parse('''
... 'a0' Add
...   'a1' Add
...     'sym1' [2] Symbol
...     'sym2' [2] Symbol
...   'sym2'
... ''')
>>> new = old.update('sym2', lambda _: parse("'sym3' [2] Symbol"))
>>> print(diff_circuits(new, old))
'a0' Add # changed 0
  'a1' Add # changed 1
    'sym1' [2] Symbol # same 2
    'sym3' [2] Symbol # new
    'sym2' [2] Symbol # removed
  'sym3' [2] Symbol # new
  'sym2' [2] Symbol # removed
# legend: same: Same as original, changed: Children changed, new: New, removed: Removed
"""

from __future__ import annotations

import hashlib

from ..nodes.base import Circuit

__all__ = ["diff_circuits", "self_hash"]

# rust's default colours (print.rs COLOR_CODES by name); None: no colour.
_ANSI = {"Red": "31", "Green": "32", "Yellow": "33", "Blue": "34", "Magenta": "35", "Cyan": "36",
         "White": "90"}


def self_hash(node: Circuit, *, child_count: bool = True, child_shapes: bool = False,
              name: bool = True) -> bytes:
    """A hash of ``node`` alone (rust's ``compute_self_hash``): its type, payload, shape, and on
    request its name, number of children and the children's shapes — not the children.

    >>> from circuits import Scalar
    >>> self_hash(Scalar(1.0, name='a'), name=False) == self_hash(Scalar(1.0, name='b'), name=False)
    True
    """
    m = hashlib.blake2b(digest_size=16)
    for part in (node.type_name, node.payload_text(), repr(node.shape), str(node.dtype)):
        m.update(part.encode() + b"\0")
    m.update(node._payload_bytes() + b"\1")
    m.update(((node.name or "") + "\0").encode() if name else b"\2")
    if child_count:
        m.update(f"{len(node.children)}\0".encode())
    if child_shapes:
        for c in node.children:
            m.update(repr(c.shape).encode() + b"\3")
    return m.digest()


def diff_circuits(new: Circuit, old: Circuit, *, require_child_count_same: bool = True,
                  require_child_shapes_same: bool = False, require_name_same: bool = True,
                  print_legend: bool = True, color: bool = False, same_self_color="Blue",
                  same_color=None, new_color="Green", removed_color="Red", **print_options) -> str:
    """The text diff of ``new`` against ``old`` (see the module docstring); rust_circuit's
    ``diff_circuits`` with the same keyword arguments.  ``color=True`` paints the lines with
    rust's colours (names as rust's: ``'Blue'``, ``'Green'``, ... or None) instead of the
    ``# new`` / ``# removed`` marks; ``print_options`` go to the printer of each subtree
    (``to_text``), e.g. ``shapes=True``.

    >>> from circuits import Scalar, Add
    >>> print(diff_circuits(Add(Scalar(1.0), name='s'), Add(Scalar(2.0), name='s'), print_legend=False))
    's' Add # changed 0
      0 [] Scalar 1 # new
      0 [] Scalar 2 # removed
    """
    from .printer import to_text

    if not isinstance(new, Circuit) or not isinstance(old, Circuit):
        raise TypeError(f"diff_circuits compares two circuit nodes, got {type(new).__name__} and "
                        f"{type(old).__name__}")
    for c in (same_self_color, same_color, new_color, removed_color):
        if c is not None and c not in _ANSI:
            raise ValueError(f"unknown colour {c!r}; the colours are None, {', '.join(_ANSI)}")

    def paint(text, c):
        return f"\x1b[{_ANSI[c]}m{text}\x1b[0m" if color and c is not None else text

    def keyed(node):
        return self_hash(node, child_count=require_child_count_same,
                         child_shapes=require_child_shapes_same, name=require_name_same)

    lines: list = []
    seen: dict = {}  # (new hash, old hash) -> the id text of a same/changed pair
    stack = [(new, old, 0)]
    while stack:
        n, o, depth = stack.pop()
        indent = "  " * depth
        key = (n.hash, o.hash)
        if key in seen:
            lines.append(indent + seen[key])
            continue
        pair_id = len(seen)
        if n is o or n == o:
            mark = paint(f" # same {pair_id}", same_color)
            seen[key] = mark
            sub = to_text(n, **print_options).split("\n")
            lines.append(indent + paint(sub[0], same_color) + mark)
            lines.extend(indent + paint(s, same_color) for s in sub[1:])
            continue
        if keyed(n) == keyed(o) and len(n.children) == len(o.children):
            mark = paint(f" # changed {pair_id}", same_self_color)
            seen[key] = mark
            lines.append(indent + paint(_self_line(n, print_options), same_self_color) + mark)
            for nc, oc in reversed(list(zip(n.children, o.children))):
                stack.append((nc, oc, depth + 1))
            continue
        for node, c, word in ((n, new_color, "new"), (o, removed_color, "removed")):
            sub = to_text(node, **print_options).split("\n")
            first = indent + paint(sub[0], c)
            lines.append(first if color else first + f" # {word}")
            lines.extend(indent + paint(s, c) for s in sub[1:])
    if print_legend:
        if color:
            lines.append(" ".join(paint(f"{c}: {what}", c) for c, what in (
                (same_color, "Same as original"), (same_self_color, "Children changed"),
                (new_color, "New"), (removed_color, "Removed"))))
        else:
            lines.append("# legend: same: Same as original, changed: Children changed, new: New, "
                         "removed: Removed")
    return "\n".join(lines)


def _self_line(node: Circuit, print_options) -> str:
    """The node's own line as ``to_text`` writes it, without its children: a node with no
    name would get serial 0 from the printer, which means nothing in a diff, so it has none."""
    from .printer import print_many

    text = print_many([node], **{**print_options, "depth": 0}).split("\n")[0]
    if node.name is None and text.startswith("0 "):
        text = text[2:]
    return text
