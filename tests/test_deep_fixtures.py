"""The shared deep-circuit fixtures (tests/conftest.py, tests/deep.py) do what the deep tests rely on."""

import sys

import numpy as np
import pytest

import circuits as C
from tests.deep import DEPTH, build_deep_chain, deep_chain_value


def _levels(node):
    # Deliberately recursive, one frame per level: what the fixture must catch.
    return 1 + (_levels(node.children[0]) if node.children else 0)


@pytest.mark.usefixtures("low_recursion_limit")
def test_low_recursion_limit_fails_a_walk_that_recurses_per_level():
    assert _levels(build_deep_chain(100)) == 101  # a bounded call depth still works
    # 400 levels fit Python's default limit of 1000 but not the lowered one.
    assert sys.getrecursionlimit() < 1000
    with pytest.raises(RecursionError):
        _levels(build_deep_chain(400))


def test_the_shared_chain_is_as_documented(deep_chain):
    assert deep_chain is build_deep_chain()  # interned: building it again costs no memory
    assert deep_chain.line() == f"'n{DEPTH - 1}' Add" and C.count_nodes(deep_chain) == DEPTH + 2
    kinds = [type(n).__name__ for n in C.toposort(build_deep_chain(6))]
    assert kinds == ["Array", "GeneralFunction", "Scalar", "Add", "Einsum", "GeneralFunction", "Add", "Einsum"]
    for depth in (0, 1, 2, 3, 7):
        np.testing.assert_allclose(C.evaluate(build_deep_chain(depth), dtype="float64"),
                                   deep_chain_value(depth), rtol=1e-12)
