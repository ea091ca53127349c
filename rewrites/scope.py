"""Scoped rewrites: ``apply(strategy, circuit, where=..., stop_at=...)`` rewrites one region only.

- ``stop_at`` (a matcher, see ``circuits.select``): the matching nodes are kept whole — neither
  they nor anything below them is rewritten (below a stop node a shared node keeps its original
  form even where the region rewrites it).  They are resolved once, on the circuit as given.
- ``where`` (a matcher): rules fire only at matching nodes; their ancestors are rebuilt over the
  rewritten children (same type, payload and name) but not rewritten themselves.  Name, glob,
  regex, type and predicate matchers (and ``&``, ``|``, ``~`` of them) are tested on each node as
  the rules see it; structural ones (``.below``, ``ChildOf``, ``Depth``) are resolved on the
  circuit as given, so with them a node counts only while its children are unchanged.

How: each stop node is swapped for an opaque fresh Symbol of its shape and dtype, the strategy
runs on that circuit with a ``Run`` whose ``allow`` is the ``where`` test, and the stop nodes are
put back.  Rules are value-preserving for every value of a Symbol, so the value is unchanged.

>>> from circuits import Add, Scalar, Symbol
>>> from rewrites.rules import flatten_add_all
>>> from rewrites.strategies import apply, bottom_up
>>> x = Symbol((2,), name='x')
>>> inner = Add(Add(x, x, name='keep'), x, name='inner')
>>> c = Add(inner, x, name='top')
>>> print(apply(bottom_up(flatten_add_all), c, stop_at='keep').to_text())
'top' Add
  'keep' Add
    'x' [2] Symbol
    'x'
  'x'
  'x'
"""

from __future__ import annotations

from typing import Callable

from circuits.nodes import Circuit, Symbol
from circuits.select import Matcher, as_matcher
from circuits.traversal import replace, toposort

from .engine import Run, Trace

__all__ = ["run_scoped", "node_test"]


def node_test(matcher) -> Callable[[Circuit], bool] | None:
    """A per-node test equivalent to ``matcher`` when it looks at the node alone (name, glob,
    regex, type, predicate, and ``&``/``|``/``~`` of those); None when it depends on the circuit."""
    m = as_matcher(matcher)
    kind = type(m).__name__
    if kind in ("_And", "_Or"):
        a, b = node_test(m.a), node_test(m.b)
        if a is None or b is None:
            return None
        return (lambda n: a(n) and b(n)) if kind == "_And" else (lambda n: a(n) or b(n))
    if kind == "_Not":
        a = node_test(m.a)
        return None if a is None else (lambda n: not a(n))
    if type(m).test is not Matcher.test:
        return m.test
    return None


def run_scoped(strategy, circuit: Circuit, trace: Trace | None, where, stop_at) -> Circuit:
    """Run ``strategy`` on ``circuit`` within the scope ``where`` / ``stop_at`` (module docstring)."""
    order = toposort(circuit)
    frozen: dict[Circuit, Circuit] = {}  # placeholder -> the stop node it stands for
    work = circuit
    if stop_at is not None:
        stops = as_matcher(stop_at).matches(circuit, order)
        mapping = {}
        for node in order:
            if node.hash in stops:
                ph = Symbol.new(node.shape, name=node.name, dtype=node.dtype)
                mapping[node] = ph
                frozen[ph] = node
        if mapping:
            work = replace(circuit, mapping)
    placeholders = {p.hash for p in frozen}
    if where is None:
        allow = (lambda n: n.hash not in placeholders) if placeholders else None
    else:
        m = as_matcher(where)
        test = node_test(m)
        if test is None:
            inside = m.matches(work)
            allow = lambda n: n.hash in inside and n.hash not in placeholders  # noqa: E731
        else:
            allow = lambda n: n.hash not in placeholders and test(n)  # noqa: E731
    out = strategy.run(work, Run(trace, allow))
    if not frozen:
        return out
    present = {n.hash for n in toposort(out)}
    back = {p: node for p, node in frozen.items() if p.hash in present}
    return replace(out, back) if back else out
