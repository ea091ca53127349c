"""Per-head batching: a sum of subcircuits that are the same computation on different slices of
one weight (the heads of an attention layer, as the seed prints them) becomes one computation
over a new leading axis, summed by one Einsum.

Why: the seed's circuit computes head by head: at GPT-2-small scale (12 layers x 12 heads) that
is ~1,500 small einsums that XLA compiles and runs one by one, where a hand-written model runs one
einsum over a head axis per projection (BENCHMARKS.md, "per-head batching").

How: at an ``Add`` whose children are ``k >= 2`` subcircuits, the children are walked in
lockstep (explicit stack, no recursion).  At each position the ``k`` nodes must be

- one and the same node (shared: the layer's input, the mask), or
- equal but for their names (shared too: the value is the same), or
- ``Index`` nodes of one child differing in one int entry at the first kept axis
  (``W[h, :, :]`` for ``h`` in the heads): together ``W[[h0, h1, ...], :, :]``, or ``W`` itself
  when the heads are all of its rows in order, or
- nodes of one type and payload (``Einsum`` spec, function, ...) whose children line up the same
  way: ``Einsum`` gains a head letter on the batched operands and the output, ``Add`` and a
  ``GeneralFunction`` that maps leading axes one to one (``core_ndim`` set) take the batched
  children as they are.

Anything else and the Add is left as it was.  The batched subcircuit's value at head ``i`` is the
``i``-th child's value, so the sum over the new axis is the Add's value: the lowering is
value-preserving (``tests/backend/test_head_batching.py`` checks it in float64 against the
head-by-head circuit on hypothesis-drawn ones).  When the top of the batched subcircuit is an
Einsum, the sum is folded into it (``'HsV,HdV->sd'``: no ``[heads, s, d]`` temporary).

``keep``: original nodes whose values are still wanted (``also=``); a per-head node among them is
read from its batched node as ``Index(batched, i)``, and ``keep`` maps every kept node to the
node of the new circuit with its value.

Head batching has three homes, one job each: ``circuits.backend.lower.head_batching`` (the lowering
``evaluate`` / ``compile`` apply: per-head sums batched over a head axis, the circuit untouched),
``rewrites.batch_heads`` (the same transformation as a rewrite, for a circuit to print, save or
cost) and ``circuits.interp.split_heads`` (the inverse: a fused layer split into named per-head
subcircuits, to intervene on one head).  ``batch_heads(split_heads(c, at))`` fuses the heads again.

>>> import numpy as np
>>> from circuits import Array, Einsum, Index, Add, evaluate
>>> x = Array(np.ones((3, 4), np.float32), name='x')
>>> w = Array(np.arange(24, dtype=np.float32).reshape(2, 3, 4), name='w')
>>> heads = [Einsum.from_spec('sd,cd->sc', x, Index(w, (h, slice(None), slice(None))), name=f'h{h}')
...          for h in range(2)]
>>> total = Add(*heads, name='sum')
>>> (batched,), found = batch_heads([total])
>>> batched.line(), batched.children[1].name
("'sum' Einsum sd,tcd->sc", 'w')
>>> bool(np.allclose(evaluate(batched), evaluate(total)))
True
"""

from __future__ import annotations

from typing import Collection, Sequence

import numpy as np

from ...nodes import Add, Circuit, Einsum, GeneralFunction, Index
from ...traversal import toposort

__all__ = ["batch_heads", "has_head_sums"]

_FAIL = None
_BATCHABLE = (Einsum, Add, GeneralFunction)


def has_head_sums(nodes: Sequence[Circuit]) -> bool:
    """Cheap test: is there an Add of two or more distinct children of one type and payload
    that contain an Einsum?  (What ``batch_heads`` can batch; it is tried only then.)"""
    for n in nodes:
        if type(n) is Add and len(n.children) >= 2:
            first = n.children[0]
            if type(first) is not Einsum and not any(type(c) is Einsum for c in first.children):
                continue
            t, payload = type(first), first._payload_bytes()
            if all(type(c) is t and c.hash != first.hash and c._payload_bytes() == payload for c in n.children[1:]):
                return True
    return False


def batch_heads(roots: Sequence[Circuit], keep: Collection[Circuit] = ()) -> tuple[list[Circuit], dict]:
    """``(new_roots, kept)``: ``roots`` with every batchable sum of heads batched (see the module
    docstring), and ``{original kept node hash: node of the new circuit with its value}``."""
    roots = list(roots)
    keep_hashes = {n.hash for n in keep}
    new: dict[bytes, Circuit] = {}
    member_of: dict[bytes, tuple[Circuit, int]] = {}  # original per-head node -> (batched node, head)
    for node in toposort(*roots):
        if node.children:
            rebuilt = node.with_children(tuple(new[c.hash] for c in node.children))
        else:
            rebuilt = node
        if type(node) is Add and len(node.children) >= 2:
            batched = _batch_sum(node, new, member_of, keep_hashes)
            if batched is not None:
                rebuilt = batched
        new[node.hash] = rebuilt
    kept = {}
    for n in keep:
        found = member_of.get(n.hash)
        if found is not None:
            b, i = found
            kept[n.hash] = Index(b, (i,), name=n.name)
        else:
            kept[n.hash] = new[n.hash]
    return [new[r.hash] for r in roots], kept


def _common_name(group) -> str | None:
    name = group[0].name
    return name if all(n.name == name for n in group) else None


def _batch_sum(add: Add, new: dict, member_of: dict, keep_hashes: set) -> Circuit | None:
    """The Add's value as one batched computation summed over its head axis, or None."""
    members = add.children
    if len({c.hash for c in members}) < 2:
        return None
    k = len(members)
    done: dict[tuple, tuple] = {}  # group of hashes -> ('shared', node) | ('batched', node)
    start = tuple(members)
    stack = [(start, False)]
    einsums = 0
    while stack:
        group, expanded = stack.pop()
        key = tuple(n.hash for n in group)
        if key in done:
            continue
        first = group[0]
        if all(h == key[0] for h in key):
            done[key] = ("shared", new[key[0]])
            continue
        t = type(first)
        if any(type(n) is not t for n in group):
            return None
        if t is Index:
            leaf = _batch_index(group, new)
            if leaf is None:
                return None
            done[key] = ("batched", leaf)
            continue
        payload = first._payload_bytes()
        if t not in _BATCHABLE or any(n._payload_bytes() != payload or len(n.children) != len(first.children)
                                      for n in group):
            return None
        kid_groups = [tuple(n.children[j] for n in group) for j in range(len(first.children))]
        if not expanded:
            stack.append((group, True))
            for g in kid_groups:
                if tuple(n.hash for n in g) not in done:
                    stack.append((g, False))
            continue
        kids = [done[tuple(n.hash for n in g)] for g in kid_groups]
        if all(kind == "shared" for kind, _ in kids):
            done[key] = ("shared", new[first.hash])  # equal but for names: one value
            continue
        node = _batch_node(first, kids, _common_name(group))
        if node is None:
            return None
        einsums += t is Einsum
        done[key] = ("batched", node)
    kind, top = done[tuple(n.hash for n in start)]
    if kind != "batched" or not einsums:
        return None
    assert top.shape[0] == k
    # every original node of a batched group -> (batched node, head), for also= on a head node
    for key, (kind, node) in done.items():
        if kind == "batched":
            for i, h in enumerate(key):
                member_of.setdefault(h, (node, i))
    fold = type(top) is Einsum and not any(m.hash in keep_hashes for m in members)
    if fold:
        head = top.out_axes[0]
        return Einsum.from_payload((top.in_axes, top.out_axes[1:]), top.children, name=add.name) \
            if head not in top.out_axes[1:] else None
    return Einsum.from_payload(((tuple(range(len(top.shape))),), tuple(range(1, len(top.shape)))), (top,),
                               name=add.name)


def _batch_index(group, new) -> Circuit | None:
    """``Index(W, (h_i, rest...))`` for each head -> ``W[[h_0, ...], rest...]`` (or ``W``)."""
    child = group[0].children[0]
    if any(n.children[0].hash != child.hash for n in group):
        return None
    index = group[0].index
    if not index or any(len(n.index) != len(index) or n.index[1:] != index[1:] for n in group):
        return None
    heads = [n.index[0] for n in group]
    if any(type(h) is not int for h in heads):
        return None
    rest = index[1:]
    full = all(isinstance(e, slice) and e == slice(None) for e in rest)
    w = new[child.hash]
    if full and heads == list(range(w.shape[0])):
        return w
    return Index(w, (np.array(heads, dtype=np.int64), *rest), name=None)


def _batch_node(first: Circuit, kids: list, name: str | None) -> Circuit | None:
    """``first``'s operation over children some of which carry a leading head axis."""
    nodes = [node for _, node in kids]
    batched = [kind == "batched" for kind, _ in kids]
    t = type(first)
    if t is Einsum:
        used = {a for term in first.in_axes for a in term} | set(first.out_axes)
        head = max(used, default=-1) + 1
        in_axes = tuple((head, *term) if b else term for term, b in zip(first.in_axes, batched))
        return Einsum.from_payload((in_axes, (head, *first.out_axes)), nodes, name=name)
    rank = len(first.shape)
    # broadcasting aligns on the right: a batched child must have had the result's rank
    if len(nodes) > 1 and any(b and len(c.shape) != rank for c, b in zip(first.children, batched)):
        return None
    if t is Add:
        return Add(*nodes, name=name)
    spec = first.function
    if spec.core_ndim is None or (len(nodes) > 1 and not spec.elementwise):
        return None
    return GeneralFunction(spec, *nodes, name=name)
