"""``describe(circuit)``: a big circuit summarised by its node names, in the spirit of a torch
module tree: names split at ``.`` form a tree, siblings that differ only by a number
(``h0`` ... ``h87``, ``head0`` ... ``head95``) and have the same contents are shown once with a
count, and each entry gives its parameters (elements of the Arrays under it, placeholders
included), its computing nodes and, for a single node, its shape.
"""

from __future__ import annotations

import math
import re

from ..errors import printable
from ..nodes import Array, Circuit
from ..traversal import toposort

_NUMBERED = re.compile(r"^(.*?)(\d+)$")


class _Entry:
    __slots__ = ("children", "params", "nodes", "shape", "kind", "_sig")

    def __init__(self):
        self.children: dict = {}
        self.params = 0
        self.nodes = 0
        self.shape = None
        self.kind = None
        self._sig = None

    def signature(self):
        if self._sig is None:
            self._sig = (self.params, self.nodes, self.shape, self.kind,
                         tuple((k, c.signature()) for k, c in self.children.items()))
        return self._sig


def _count(n: float) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.2f}{unit}"
    return str(int(n))


class Description:
    """The report ``describe`` returns: ``str()`` (or ``print``) it; ``params`` and ``nodes`` are
    the totals."""

    def __init__(self, text: str, params: int, nodes: int):
        # names shown as they are, less control characters (a name may hold a terminal escape)
        self.text, self.params, self.nodes = printable(text, keep="\n"), params, nodes

    def __str__(self):
        return self.text

    def __repr__(self):
        return self.text


def describe(circuit: Circuit, max_depth: int | None = None) -> Description:
    """A tree of ``circuit``'s node names with repeated blocks collapsed (``h{0..11} ×12``),
    parameter counts (Array elements) and computing-node counts per block (per repeat for a
    collapsed entry), shapes of single nodes; ``max_depth`` limits how deep it goes.

    >>> import numpy as np
    >>> from circuits.models import gpt2
    >>> from circuits.models.gpt2 import random_gpt2_weights
    >>> cfg = dict(n_embd=8, n_head=2, n_layer=3, vocab_size=11, n_positions=16, activation_function='gelu_new')
    >>> d = describe(gpt2(cfg, random_gpt2_weights(cfg), np.array([1, 2, 3])), max_depth=1)
    >>> [line for line in str(d).splitlines() if line.startswith(('logits', '├── h'))]
    ['logits [3,11]: 2.86K params, 140 nodes', '├── h{0..2} ×3 [3,8] Add   each 872 params, 41 nodes']
    """
    root = _Entry()
    unnamed = _Entry()
    for node in toposort(circuit):
        params = math.prod(node.shape) if isinstance(node, Array) else 0
        computes = 0 if not node.children else 1
        if node.name is None:
            unnamed.params += params
            unnamed.nodes += computes
            continue
        entry = root
        entry.params += params
        entry.nodes += computes
        for seg in node.name.split("."):
            entry = entry.children.setdefault(seg, _Entry())
            entry.params += params
            entry.nodes += computes
        if entry.kind is None:
            entry.shape, entry.kind = node.shape, node.type_name
    total_params = root.params + unnamed.params
    total_nodes = root.nodes + unnamed.nodes
    head = f"{circuit.name or '(unnamed)'} [{','.join(map(str, circuit.shape))}]"
    lines = [f"{head}: {_count(total_params)} params, {total_nodes} nodes"]
    if unnamed.params or unnamed.nodes:
        lines.append(f"  (unnamed nodes: {_count(unnamed.params)} params, {unnamed.nodes} nodes)")
    _render(root, "", 1, max_depth, lines)
    return Description("\n".join(lines), total_params, total_nodes)


def _groups(entry: _Entry):
    """Children as (label, count, representative), numbered siblings with equal contents merged."""
    by_stem: dict = {}
    order = []
    for key, child in entry.children.items():
        m = _NUMBERED.match(key)
        stem = m.group(1) if m else None
        if stem is None:
            order.append((key, [(None, key, child)]))
            continue
        if stem not in by_stem:
            by_stem[stem] = []
            order.append((stem, by_stem[stem]))
        by_stem[stem].append((int(m.group(2)), key, child))
    out = []
    for stem, members in order:
        if len(members) > 1 and len({c.signature() for _, _, c in members}) == 1:
            nums = [i for i, _, _ in members]
            span = f"{min(nums)}..{max(nums)}" if sorted(nums) == list(range(min(nums), max(nums) + 1)) else \
                ",".join(map(str, nums))
            out.append((f"{stem}{{{span}}}", len(members), members[0][2]))
        else:
            out.extend((key, 1, child) for _, key, child in members)
    return out


def _render(entry: _Entry, prefix: str, depth: int, max_depth, lines):
    groups = _groups(entry)
    for i, (label, count, child) in enumerate(groups):
        last = i == len(groups) - 1
        # a chain of single children with no node of their own prints as one dotted name
        while child.kind is None and len(child.children) == 1:
            key, nxt = next(iter(child.children.items()))
            label, child = f"{label}.{key}", nxt
        desc = label + (f" ×{count}" if count > 1 else "")
        if child.kind is not None:
            shape = f" [{','.join(map(str, child.shape))}]" if child.shape else ""
            desc += f"{shape} {child.kind}"
        stats = []
        if child.params:
            stats.append(f"{_count(child.params)} params")
        if child.nodes:
            stats.append(f"{child.nodes} nodes")
        tail = f"   {'each ' if count > 1 else ''}{', '.join(stats)}" if stats else ""
        lines.append(f"{prefix}{'└── ' if last else '├── '}{desc}{tail}")
        if child.children and (max_depth is None or depth < max_depth):
            _render(child, prefix + ("    " if last else "│   "), depth + 1, max_depth, lines)
