"""``check(circuit)``: validate every node of a circuit (tests run it on every rewrite result).

>>> from circuits import Add, Symbol
>>> x = Symbol((2,), name='x')
>>> check(Add(x, x)) is None
True
"""

from __future__ import annotations

from circuits.dtypes import DTYPES
from circuits.errors import CircuitError
from circuits.hashing import node_hash, structure_hash
from circuits.nodes import Array, Circuit, Scalar
from circuits.traversal import toposort

_SENTINEL_NAME = "\0check"


def _problems(node: Circuit) -> list[str]:
    out = []
    name_ok = node.name is None or isinstance(node.name, str)
    if not name_ok:
        out.append(f"name {node.name!r} is not a str")
    if type(node.children) is not tuple or not all(isinstance(c, Circuit) for c in node.children):
        out.append("children are not a tuple of nodes")
        return out
    if type(node.shape) is not tuple or not all(type(s) is int and s >= 0 for s in node.shape):
        out.append(f"shape {node.shape!r} is not a tuple of non-negative ints")
    if node.dtype not in DTYPES:
        out.append(f"dtype {node.dtype!r} is not one of {DTYPES}")
    # Re-hashed through the very functions that made the hashes: the recipe is written once.
    kids = b"".join([c.hash for c in node.children])
    if name_ok and node_hash(node._hash_prefix, node._payload_bytes(), kids, node.name) != node.hash:
        out.append("its hash is not the hash of its type, payload, children and name")
    if node._blind_hash is not None and all(c._blind_hash is not None for c in node.children):
        blind = b"".join([c._blind_hash for c in node.children])
        if structure_hash(node._hash_prefix, node._structure_bytes(), blind) != node._blind_hash:
            out.append("its structure_hash is not the hash of its type, structure payload and children's")
    if node.with_children(node.children) is not node:
        out.append("with_children(children) does not return the node itself")
    if node.children:
        try:
            # Under another name the constructor builds (and validates) a fresh node rather than
            # handing back this interned one, so its shape and dtype are recomputed from scratch.
            again = node._rebuild(node.children, _SENTINEL_NAME)
        except CircuitError as e:
            out.append(f"rebuilding it fails: {e}")
        else:
            if (again.shape != node.shape or again.dtype != node.dtype
                    or again._payload_bytes() != node._payload_bytes() or again.children != node.children):
                out.append(f"rebuilding it gives another node: {again.line()} {list(again.shape)} {again.dtype}")
    elif type(node) is Array and node.value is not None:
        v = node.value
        if tuple(v.shape) != node.shape or str(v.dtype) != node.dtype:
            out.append(f"its value has shape {list(v.shape)} and dtype {v.dtype}")
    elif type(node) is Scalar and not isinstance(node.value, float):
        out.append(f"its value {node.value!r} is not a float")
    return out


def check(circuit: Circuit) -> None:
    """Raise ``CircuitError`` listing every node of ``circuit`` that breaks an invariant (hash,
    rebuild through ``with_children``, shape and dtype rules, leaf values); return None if all
    hold.  Iterative: fine on a 50,000-deep chain."""
    if not isinstance(circuit, Circuit):
        raise CircuitError(f"check(circuit): got a {type(circuit).__name__}, not a node")
    bad = []
    for node in toposort(circuit):
        problems = _problems(node)
        if problems:
            bad.append(f"  {node.line()}: " + "; ".join(problems))
            if len(bad) >= 20:
                bad.append("  ...")
                break
    if bad:
        raise CircuitError("check found broken nodes:\n" + "\n".join(bad))
