"""The deep chain every "no recursion" test shares, and its numpy value.

``build_deep_chain()`` stacks ``DEPTH`` (50,000) nodes on a leaf, cycling through ``STEPS``:

- ``"tanh"``: ``GeneralFunction('tanh', c)`` (unnamed);
- ``"add"``: ``Add(c, one, name=f'{tag}n{i}')`` with one shared ``'one' Scalar 1`` of the leaf's
  shape (named, so selection and renaming have something to find; ``i`` is the step's 0-based
  level; of the leaf's shape because the backend's per-op broadcast would double the time);
- ``"einsum"``: ``Einsum.from_spec('a->a', c)`` (unnamed; needs a 1-d leaf).

The leaf is ``'x' [2] Array`` holding ``X`` unless ``leaf=`` gives another node.  With the default
steps the chain has ``depth + 2`` distinct nodes (the leaf and ``one``) and its top is the Add
named ``n49999``.  ``deep_chain_value`` computes the value in float64 numpy from the same recipe,
an oracle independent of the library.  ``tests/conftest.py`` builds the default chain once per
session (fixture ``deep_chain``) and lowers the recursion limit (fixture ``low_recursion_limit``).
"""

from __future__ import annotations

import numpy as np

import circuits as C
from circuits.nodes.base import bulk_build

DEPTH = 50_000
STEPS = ("tanh", "add", "einsum")
X = np.array([0.5, -0.25], np.float32)


def build_deep_chain(depth: int = DEPTH, *, steps=STEPS, tag: str = "", leaf: C.Circuit | None = None) -> C.Circuit:
    """The chain described in the module docstring (iterative; interned, so building it again
    gives the very same node)."""
    c = C.Array(X, name="x") if leaf is None else leaf
    one = C.Scalar(1.0, c.shape, name="one")
    with bulk_build():
        for i in range(depth):
            kind = steps[i % len(steps)]
            if kind == "tanh":
                c = C.GeneralFunction("tanh", c)
            elif kind == "add":
                c = C.Add(c, one, name=f"{tag}n{i}")
            elif kind == "einsum":
                c = C.Einsum.from_spec("a->a", c)
            else:
                raise ValueError(f"unknown step {kind!r}; one of {STEPS}")
    return c


def deep_chain_value(depth: int = DEPTH, *, steps=STEPS, x=X) -> np.ndarray:
    """The value of ``build_deep_chain(depth, steps=steps)`` over a leaf holding ``x`` (float64)."""
    v = np.asarray(x, np.float64)
    for i in range(depth):
        kind = steps[i % len(steps)]
        if kind == "tanh":
            v = np.tanh(v)
        elif kind == "add":
            v = v + 1.0
    return v
