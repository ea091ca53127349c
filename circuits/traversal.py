"""The one iterative traversal every generic algorithm uses, and the maps built on it.

No function here recurses: a chain 50,000 nodes deep is walked with an explicit stack.

>>> import numpy as np
>>> from circuits import Array, Add
>>> x = Array(np.ones(3, np.float32), name='x')
>>> [n.name for n in toposort(Add(x, x, name='y'))]
['x', 'y']
"""

from __future__ import annotations

from typing import Callable, Iterable

from .hashing import structure_hash
from .nodes.base import Circuit


def toposort(*roots: Circuit, stop: Callable[[Circuit], bool] | None = None) -> list[Circuit]:
    """Every distinct node reachable from ``roots``, children before parents, children in order.

    ``stop(node)`` true means: include the node but do not descend into its children.
    """
    if len(roots) == 1 and isinstance(roots[0], (list, tuple)):
        roots = tuple(roots[0])
    order: list[Circuit] = []
    seen: set[bytes] = set()
    stack: list = []
    for r in reversed(roots):
        stack.append(r)
    append = stack.append
    pop = stack.pop
    while stack:
        item = pop()
        if type(item) is tuple:  # (node,) marker: all its children are done
            order.append(item[0])
            continue
        h = item.hash
        if h in seen:
            continue
        seen.add(h)
        children = item.children
        if not children or (stop is not None and stop(item)):
            order.append(item)
            continue
        append((item,))
        for c in reversed(children):
            if c.hash not in seen:
                append(c)
    return order


def count_nodes(*roots: Circuit) -> int:
    """Number of distinct nodes (shared subtrees count once)."""
    return len(toposort(*roots))


def deep_map(root: Circuit, fn: Callable[[Circuit], Circuit | None]) -> Circuit:
    """Rebuild ``root`` bottom-up: each distinct node once, over its already-mapped children,
    is passed to ``fn``; a ``None`` result keeps the node.

    >>> from circuits import Scalar, Add
    >>> c = Add(Scalar(1.0), Scalar(2.0))
    >>> deep_map(c, lambda n: Scalar(n.value * 10) if isinstance(n, Scalar) else None).children
    (<[] Scalar 10>, <[] Scalar 20>)
    """
    return deep_map_many([root], fn)[0]


def deep_map_many(roots: Iterable[Circuit], fn: Callable[[Circuit], Circuit | None]) -> list[Circuit]:
    """``deep_map`` over several roots sharing one memo (shared nodes map once)."""
    roots = list(roots)
    new: dict[bytes, Circuit] = {}
    for node in toposort(*roots):
        if node.children:
            kids = node.children
            mapped = tuple(new[c.hash] for c in kids)
            rebuilt = node.with_children(mapped)
        else:
            rebuilt = node
        out = fn(rebuilt)
        new[node.hash] = rebuilt if out is None else out
    return [new[r.hash] for r in roots]


def replace(root: Circuit, mapping: dict) -> Circuit:
    """Replace nodes by others (``{old: new}``), rebuilding only their ancestors; the
    replacements are not searched further.

    >>> from circuits import Scalar, Add
    >>> one, two = Scalar(1.0), Scalar(2.0)
    >>> replace(Add(one, one), {one: two}).children
    (<[] Scalar 2>, <[] Scalar 2>)
    """
    table = {k.hash: v for k, v in mapping.items()}
    if not table:
        return root
    new: dict[bytes, Circuit] = {}
    for node in toposort(root, stop=lambda n: n.hash in table):
        h = node.hash
        if h in table:
            new[h] = table[h]
        elif node.children:
            new[h] = node.with_children(tuple(new[c.hash] for c in node.children))
        else:
            new[h] = node
    return new[root.hash]


def parents_map(root: Circuit) -> dict[bytes, list[Circuit]]:
    """node hash -> the distinct parents of that node within ``root``."""
    out: dict[bytes, list[Circuit]] = {}
    for node in toposort(root):
        seen_here = set()
        for c in node.children:
            if c.hash not in seen_here:
                seen_here.add(c.hash)
                out.setdefault(c.hash, []).append(node)
    return out


def strip_names(root: Circuit) -> Circuit:
    """The same circuit with every name removed.

    >>> from circuits import Scalar
    >>> strip_names(Scalar(1.0, name='one')).name is None
    True
    """
    return deep_map(root, lambda n: n.rename(None) if n.name is not None else None)


def fill_structure_hashes(root: Circuit) -> None:
    """Compute the name-blind hash of every node under ``root`` that lacks one (bottom-up; the
    recipe is ``circuits.hashing.structure_hash``)."""
    for node in toposort(root, stop=lambda n: n._blind_hash is not None):
        if node._blind_hash is not None:
            continue
        node._blind_hash = structure_hash(
            node._hash_prefix, node._structure_bytes(), b"".join([c._blind_hash for c in node.children]))


def trampoline(visit: Callable, key: Callable, request: tuple):
    """``visit(*request)``'s result, where ``visit`` is written as a recursion but runs on an
    explicit stack: as deep as memory allows, never the Python stack.

    ``visit(*args)`` is a generator function: to get the result for other arguments it yields
    them (a tuple) and receives that result; it returns its own.  Results are memoized under
    ``key(*args)``: a request made again (a shared node, reached twice) is answered without
    running ``visit`` again.  ``rewrites.push_modules`` walks circuits this way.

    >>> def depth(n):            # the recursion depth(n) = depth(n - 1) + 1, 100,000 levels deep
    ...     if n == 0:
    ...         return 0
    ...     return (yield (n - 1,)) + 1
    >>> trampoline(depth, lambda n: n, (100_000,))
    100000
    >>> calls = []
    >>> def fib(n):              # each fib(k) computed once, memoized under k
    ...     calls.append(n)
    ...     if n < 2:
    ...         return n
    ...     return (yield (n - 1,)) + (yield (n - 2,))
    >>> trampoline(fib, lambda n: n, (90,)), len(calls)
    (2880067194370816120, 91)
    """
    memo: dict = {}
    root = key(*request)
    stack = [(root, visit(*request))]
    sent = None
    while stack:
        k, gen = stack[-1]
        try:
            request = gen.send(sent)
        except StopIteration as done:
            memo[k] = sent = done.value
            stack.pop()
            continue
        rk = key(*request)
        if rk in memo:
            sent = memo[rk]
        else:
            stack.append((rk, visit(*request)))
            sent = None
    return memo[root]
