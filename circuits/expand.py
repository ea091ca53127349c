"""Expansion (rust_circuit's ``Expander``): replace nodes — Symbols above all — by nodes of
another shape, and re-derive every shape above them.

A replacement may have **extra leading axes** (a batch: every node above gains them, aligned on
the right where several meet, equal where they overlap) and **other sizes** on its own axes (a
symbolic size ``0s`` becoming concrete, or any size where the nodes above allow it: an Index
that takes a fixed slice of a changed axis refuses).  Each node type says how it is rebuilt
over expanded children (its class's ``expanded`` method); the walk (``circuits.nodes.expansion``)
is one toposort, never recursive (a Module's body is expanded again per module nesting level, no
deeper).  A Module stays a Module, its
gained axes outside its own batch axes: an argument's gained axes move into its Symbol.

This is how modules are inlined (``substitute_module``, ``substitute_all_modules``) and how a
``DiscreteVar`` is evaluated: replaced by a batch of its samples (``sample``).

>>> import numpy as np
>>> from circuits import Symbol, Einsum, Array, evaluate
>>> x = Symbol((3,), name='x')
>>> y = Einsum.from_spec('i,i->', x, x, name='sq')
>>> xs = Array(np.arange(6, dtype=np.float32).reshape(2, 3), name='xs')
>>> big = expand(y, {x: xs})
>>> big.shape, evaluate(big).tolist()
((2,), [5.0, 50.0])
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from .errors import CircuitError
from .nodes import Array, Circuit, Einsum, Index, Scalar
from .nodes.discrete_var import DiscreteVar
from .nodes.expansion import ExpandError, expand_with_map
from .nodes.module import Module
from .traversal import toposort

__all__ = ["expand", "Expander", "substitute_module", "substitute_all_modules", "sample",
           "ExpandError"]


def expand(root: Circuit, replacements: Mapping, size_map: "Mapping | None" = None) -> Circuit:
    """``root`` with each node of ``replacements`` (node -> new node) replaced and every shape
    above re-derived; ``size_map`` (symbolic size -> size) also resizes the leaves that carry a
    symbolic size.  See the module docstring.

    >>> from circuits import Symbol, Add, Scalar
    >>> from circuits.shapes import symbolic_size
    >>> x = Symbol((symbolic_size(0),), name='x')
    >>> expand(Add(x, Scalar(1.0)), {x: Symbol((4, 5), name='x')}).shape
    (4, 5)
    """
    return expand_with_map(root, replacements, size_map)[0]


# ---------------------------------------------------------------------------- Expander
class Expander:
    """rust_circuit's ``Expander``: pairs of (which nodes, how to replace one) applied by
    ``expand``.  ``which`` is a node, a name, a node type or a predicate; ``how(node)`` returns
    the replacement.

    >>> from circuits import Symbol, Add, Scalar
    >>> c = Add(Symbol((2,), name='a'), Scalar(1.0))
    >>> Expander(('a', lambda s: Symbol((7, 2), name='a'))) (c).shape
    (7, 2)
    """

    def __init__(self, *pairs):
        self.pairs = [(_predicate(which), how) for which, how in pairs]

    def __call__(self, circuit: Circuit) -> Circuit:
        replacements = {}
        for n in toposort(circuit):
            for test, how in self.pairs:
                if test(n):
                    replacements[n] = how(n)
                    break
        return expand(circuit, replacements)


def _predicate(which):
    if isinstance(which, Circuit):
        return lambda n: n == which
    if isinstance(which, str):
        return lambda n: n.name == which
    if isinstance(which, type):
        return lambda n: isinstance(n, which)
    if callable(which):
        return which
    raise TypeError(f"Expander: a pair selects with a node, a name, a type or a predicate, got {which!r}")


# ---------------------------------------------------------------------------- modules
def substitute_module(module: Module) -> Circuit:
    """``module.substitute()``: the body with the arguments in place of its Symbols (see
    ``Module.substitute``)."""
    return module.substitute()


def substitute_all_modules(circuit: Circuit, memo: "dict | None" = None) -> Circuit:
    """``circuit`` with every Module inlined (innermost first), in one bottom-up pass; ``memo``
    (a dict, filled) maps each original node's hash to its new node, across calls.

    >>> from circuits import parse
    >>> c = parse("'m' Module\\n  'b' Add\\n    'x' [2] Symbol\\n  'one' [2] Scalar 1 ! 'x'")
    >>> print(substitute_all_modules(c).to_text())
    'm' Add
      'one' [2] Scalar 1
    """
    done: dict = {} if memo is None else memo  # old hash -> new node
    for n in toposort(circuit):
        if n.hash in done:
            continue
        if n.children:
            kids = [done[c.hash] for c in n.children]
            new = n.with_children(kids)
            if type(new) is Module:
                new = new.substitute()
        else:
            new = n
        done[n.hash] = new
    return done[circuit.hash]


def has_node_type(circuit: Circuit, types) -> bool:
    return any(isinstance(n, types) for n in toposort(circuit))


# ---------------------------------------------------------------------------- sampling
def sample(circuit: Circuit, num_samples: int, seed: int = 0) -> Circuit:
    """``circuit`` with each ``DiscreteVar`` replaced by ``num_samples`` draws from it, so the
    result has a leading axis of samples (rust_circuit's random sample transform).  Variables
    that share their probabilities node are drawn jointly (the same sample indices: one draw of
    the underlying dataset row), independent ones independently; the draws are seeded.

    >>> import numpy as np
    >>> from circuits import Array, DiscreteVar, Add, evaluate
    >>> v = DiscreteVar(Array(np.array([0., 10.], np.float32)), Array(np.array([.5, .5], np.float32)))
    >>> out = evaluate(sample(Add(v, v), 1000, seed=0))
    >>> out.shape, sorted(set(out.tolist()))
    ((1000,), [0.0, 20.0])
    """
    rng = np.random.default_rng(seed)
    drawn: dict = {}  # probs hash -> sample indices
    replacements: dict = {}
    for n in toposort(circuit):
        if type(n) is not DiscreteVar:
            continue
        values, probs = n.children
        idx = drawn.get(probs.hash)
        if idx is None:
            p = np.asarray(_value_of(probs, n), dtype=np.float64)
            if p.min() < 0 or not np.isclose(p.sum(), 1.0, atol=1e-4):
                raise CircuitError(f"{n.line()}: its probabilities must be >= 0 and sum to 1, got sum {p.sum()}")
            idx = rng.choice(len(p), size=num_samples, p=p / p.sum())
            drawn[probs.hash] = idx
        name = None if n.name is None else n.name + ".samples"
        # Variables inside this one's values are sampled already: then the values carry the
        # sample axis in front, and sample s reads row idx[s] of its own slice (a one-hot einsum).
        sampled = expand(values, replacements) if replacements else values
        if len(sampled.shape) == len(values.shape):
            replacements[n] = Index(sampled, (idx.astype(np.int64),), name=name)
        else:
            onehot = np.zeros((num_samples, len(idx) and values.shape[0]), sampled.dtype if sampled.dtype != "bool" else "float32")
            onehot[np.arange(num_samples), idx] = 1
            rest = tuple(range(2, len(sampled.shape)))
            replacements[n] = Einsum(sampled, Array(onehot, name=None if name is None else name + ".onehot"),
                                     in_axes=((0, 1) + rest, (0, 1)), out_axes=(0,) + rest, name=name)
    return expand(circuit, replacements)


def _value_of(probs, var):
    if type(probs) is Array and not probs.is_placeholder:
        return probs.value
    if type(probs) is Scalar:
        return np.full(probs.shape, probs.value)
    raise CircuitError(f"{var.line()}: its probabilities must be an Array or Scalar to sample from")
