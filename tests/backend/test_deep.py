"""A 50,000-deep chain evaluates without recursion (op by op: jit of 50,000 ops would spend ~15 s
in XLA's compiler)."""

from __future__ import annotations

import numpy as np
import pytest

from circuits import Add, Array, GeneralFunction, Scalar, evaluate
from circuits.backend import JIT_MAX_OPS, Eager, cache_stats

DEPTH = 50_000


@pytest.fixture(scope="module")
def chain():
    x = Array(np.array([0.1, -0.2], np.float32), name="x")
    half = Scalar(0.5)
    nodes = [x]
    for i in range(DEPTH):
        nodes.append(GeneralFunction("sin", nodes[-1]) if i % 2 else Add(nodes[-1], half))
    return nodes


def numpy_chain(steps):
    r = np.array([0.1, -0.2])
    for i in range(steps):
        r = np.sin(r) if i % 2 else r + 0.5
    return r


def test_deep_chain_evaluates_op_by_op(chain):
    assert DEPTH > JIT_MAX_OPS
    before = cache_stats()["compilations"]
    mid = chain[DEPTH // 2]
    value, extra = evaluate(chain[-1], dtype="float64", also=[mid])
    assert cache_stats()["compilations"] == before  # 'auto' did not hand 50,000 ops to XLA
    np.testing.assert_allclose(value, numpy_chain(DEPTH), rtol=1e-12)
    np.testing.assert_allclose(extra[mid], numpy_chain(DEPTH // 2), rtol=1e-12)
    np.testing.assert_allclose(evaluate(chain[-1]), numpy_chain(DEPTH), rtol=1e-5)


def test_deep_chain_in_the_eager_explorer(chain):
    ev = Eager(chain[-1], max_entries=1000)
    np.testing.assert_allclose(ev(chain[-1]), numpy_chain(DEPTH), rtol=1e-5)
    assert ev.cache_info()["entries"] == 1000
    # the most recent values are cached: one step above them computes one node
    misses = ev.cache_info()["misses"]
    np.testing.assert_allclose(ev(Add(chain[-1], Scalar(0.5))), numpy_chain(DEPTH + 1), rtol=1e-5)
    assert ev.cache_info()["misses"] == misses + 2  # the new Scalar and the new Add
