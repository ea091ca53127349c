"""The expansion walk (rust_circuit's ``Expander`` core) and the helpers the node classes'
expansion rules share.

``expand_with_map`` replaces nodes by nodes of another shape (extra leading batch axes, other
sizes) and re-derives every node above them in one toposort-ordered loop; how a node of each type
is rebuilt over its expanded children is that class's ``expanded`` method (the node-type
checklist in ``circuits.nodes``).  The public face is ``circuits.expand``; this module sits in the
nodes package so that ``Module`` (whose shape and ``substitute`` are expansions of its body)
needs nothing from above it.

>>> from circuits import Symbol, Add, Scalar
>>> x = Symbol((2,), name='x')
>>> new, done = expand_with_map(Add(x, Scalar(1.0)), {x: Symbol((5, 2), name='x')})
>>> new.shape, done[x.hash][1]
((5, 2), 1)
"""

from __future__ import annotations

from typing import Mapping

from ..errors import CircuitError, ShapeError
from ..shapes import shape_text


class ExpandError(ShapeError):
    """A node cannot follow its children's new shapes (a fixed slice of a changed axis, batch
    axes that disagree, a function that cannot be batched...)."""


def _children_first(root):
    """Each distinct node under ``root`` once, children before parents (an explicit stack:
    ``circuits.traversal.toposort`` sits above the nodes package)."""
    order, seen, stack = [], set(), [root]
    while stack:
        item = stack.pop()
        if type(item) is tuple:  # (node,): its children are done
            order.append(item[0])
            continue
        if item.hash in seen:
            continue
        seen.add(item.hash)
        if item.children:
            stack.append((item,))
            stack.extend(c for c in reversed(item.children) if c.hash not in seen)
        else:
            order.append(item)
    return order


def expand_with_map(root, replacements: Mapping, size_map: "Mapping | None" = None):
    """``root`` expanded (see ``circuits.expand.expand``), and the map it built: old node hash ->
    (new node, number of batch axes it gained)."""
    from .base import Circuit

    size_map = dict(size_map or {})
    table = {}
    for old, new in replacements.items():
        if not isinstance(old, Circuit) or not isinstance(new, Circuit):
            raise CircuitError("expand: replacements map circuit nodes to circuit nodes")
        if len(new.shape) < len(old.shape):
            raise ExpandError(f"expand: replacement {new.line()} {shape_text(new.shape)} has lower rank than "
                              f"{old.line()} {shape_text(old.shape)}; a replacement may only add leading axes")
        table[old.hash] = new
    done: dict = {}  # old hash -> (new node, number of batch axes it gained)
    for n in _children_first(root):
        h = n.hash
        r = table.get(h)
        if r is not None:
            done[h] = (r, len(r.shape) - len(n.shape))
            continue
        if not n.children:
            done[h] = (n.expanded((), (), size_map, replacements) if size_map else n, 0)
            continue
        pairs = [done[c.hash] for c in n.children]
        kids = [p[0] for p in pairs]
        if all(k is c for k, c in zip(kids, n.children)):
            done[h] = (n, 0)
            continue
        try:
            new = n.expanded(kids, [p[1] for p in pairs], size_map, replacements)
        except ExpandError:
            raise
        except CircuitError as e:
            raise ExpandError(f"expand: {n.line()} cannot follow its children's new shapes "
                              f"{', '.join(shape_text(k.shape) for k in kids)}: {e}") from None
        done[h] = (new, len(new.shape) - len(n.shape))
    return done[root.hash][0], done


def expand(root, replacements: Mapping, size_map: "Mapping | None" = None):
    """``root`` with each node of ``replacements`` replaced and every shape above re-derived
    (``circuits.expand.expand``)."""
    return expand_with_map(root, replacements, size_map)[0]


# ---------------------------------------------------------------------------- shared by the rules
def batch_of(n, kids, gained):
    """The merged batch shape of the children (right-aligned, equal where they overlap)."""
    batch: list = []
    for k, nb in zip(kids, gained):
        mine = k.shape[:nb]
        for j in range(1, nb + 1):
            if j <= len(batch):
                if batch[-j] != mine[-j]:
                    raise ExpandError(
                        f"expand: {n.line()}: the children's batch axes {shape_text(batch)} and "
                        f"{shape_text(mine)} do not broadcast (batch axes align on the right and must be equal)")
            else:
                batch.insert(0, mine[-j])
    return tuple(batch)


def fresh_names(taken, count):
    """``count`` axis names ``batch{i}`` not in ``taken``."""
    out, i = [], 0
    while len(out) < count:
        cand = f"batch{i}"
        if cand not in taken:
            out.append(cand)
        i += 1
    return out


def insert_units(node, after: int, count: int):
    """``node`` with ``count`` unit axes inserted after its first ``after`` axes."""
    from .rearrange import Rearrange

    if not count:
        return node
    names = fresh_names(set(), len(node.shape))
    ins = [(a,) for a in names]
    outs = ins[:after] + [()] * count + ins[after:]
    return Rearrange(node, (tuple(ins), tuple(outs)))


def insert_axes(node, at: int, sizes):
    """``node`` repeated along new axes of ``sizes`` inserted after its first ``at`` axes (``at=0``:
    new leading axes)."""
    from .rearrange import Rearrange

    if not sizes:
        return node
    names = fresh_names(set(), len(node.shape) + len(sizes))
    new, old = names[:len(sizes)], names[len(sizes):]
    ins = tuple((a,) for a in old)
    outs = ins[:at] + tuple((a,) for a in new) + ins[at:]
    return Rearrange(node, (ins, outs), **dict(zip(new, sizes)))


def aligned(n, kids, gained):
    """Children of a broadcasting node (Add, an elementwise function) made to broadcast batch
    against batch and core against core: unit axes between a child's batch and core axes."""
    batch = batch_of(n, kids, gained)
    core = max(len(k.shape) - nb for k, nb in zip(kids, gained))
    out = []
    for k, nb in zip(kids, gained):
        missing = core - (len(k.shape) - nb)
        out.append(insert_units(k, nb, missing) if nb and missing else k)
    return out, batch


def move_axes_behind(node, first: int, then: int):
    """``node`` with its first ``first`` axes moved behind the ``then`` axes after them."""
    from .rearrange import Rearrange

    if not first or not then:
        return node
    names = fresh_names(set(), len(node.shape))
    moved = names[first:first + then] + names[:first] + names[first + then:]
    return Rearrange(node, (tuple((a,) for a in names), tuple((a,) for a in moved)))


def fixed_entries_follow(n, entries, old_shape, new_core, verb: str):
    """Refuse an Index / Scatter whose fixed (not ``:``) entry meets an axis that changed size."""
    for axis, (e, before, after) in enumerate(zip(entries, old_shape, new_core)):
        if before != after and not (type(e) is slice and e == slice(None)):
            raise ExpandError(f"expand: {n.line()} {verb} axis {axis} with a fixed entry, but that axis "
                              f"changed size from {before} to {after}; only ':' follows a changed axis")
