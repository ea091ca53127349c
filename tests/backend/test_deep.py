"""A 50,000-deep chain evaluates without recursion (op by op: jit of 50,000 ops would spend ~15 s
in XLA's compiler)."""

from __future__ import annotations

import numpy as np
import pytest

from circuits import Add, Scalar, evaluate
from circuits.backend import JIT_MAX_OPS, Eager, cache_stats
from tests.deep import DEPTH, deep_chain_value

# The Add at level 25,000 (0-based) of the shared chain: its value is 25,001 steps above the leaf.
MID = "n25000"
MID_STEPS = 25_001


@pytest.mark.usefixtures("low_recursion_limit")
def test_deep_chain_evaluates_op_by_op(deep_chain):
    assert DEPTH > JIT_MAX_OPS
    before = cache_stats()["compilations"]
    mid = deep_chain.get_unique(MID)
    value, extra = evaluate(deep_chain, dtype="float64", also=[mid])
    assert cache_stats()["compilations"] == before  # 'auto' did not hand 50,000 ops to XLA
    np.testing.assert_allclose(value, deep_chain_value(DEPTH), rtol=1e-12)
    np.testing.assert_allclose(extra[mid], deep_chain_value(MID_STEPS), rtol=1e-12)
    np.testing.assert_allclose(evaluate(deep_chain), deep_chain_value(DEPTH), rtol=1e-5)


@pytest.mark.usefixtures("low_recursion_limit")
def test_deep_chain_in_the_eager_explorer(deep_chain):
    ev = Eager(deep_chain)
    np.testing.assert_allclose(ev(deep_chain), deep_chain_value(DEPTH), rtol=1e-5)
    # the chain's values are cached: one step above them computes one node
    misses = ev.cache_info()["misses"]
    np.testing.assert_allclose(ev(Add(deep_chain, Scalar(0.5))), deep_chain_value(DEPTH) + 0.5, rtol=1e-5)
    assert ev.cache_info()["misses"] == misses + 1  # the new Add (the Scalar is an argument)
