"""A ``Program`` whose walk stops at nodes with known values (``given``), those values fed in as
arguments; ``Skeleton.run``'s ``observe``; and the ``Eager`` view over the op-by-op tier."""

from __future__ import annotations

import numpy as np
import pytest

from circuits import Add, Array, Einsum, EvaluationError, GeneralFunction, Symbol, evaluate
from circuits.backend import Eager, cache_stats, clear_cache
from circuits.backend.lower.program import Program

rng = np.random.default_rng(3)
XV = rng.standard_normal((2, 3)).astype(np.float32)
X = Symbol((2, 3), name="x")
W = Array(rng.standard_normal((3, 3)).astype(np.float32), name="w")
PRE = Einsum.from_spec("ab,bc->ac", X, W, name="pre")
ACT = GeneralFunction("tanh", PRE, name="act")
OUT = Add(ACT, PRE, name="out")


def test_a_program_stops_at_given_nodes_and_takes_them_as_arguments():
    full = Program([OUT], "float32")
    frontier = Program([OUT], "float32", given={PRE.hash})
    assert [n.name for n in frontier.nodes] == ["pre", "act", "out"]  # nothing below 'pre'
    assert frontier.arg_slots == (0,) and frontier.given_slots == frozenset({0})
    assert frontier.child_slots[0] == ()
    assert frontier.key != full.key  # a supplied value is not the computation that made it
    pre = XV @ W.numpy()
    (out,) = frontier.skeleton().run([pre])
    np.testing.assert_allclose(out, np.tanh(pre) + pre, rtol=1e-6)


def test_observe_sees_every_slot_once_in_order():
    program = Program([OUT], "float32")
    seen = []
    (out,) = program.skeleton().run([XV, W.numpy()], observe=lambda slot, value: seen.append((slot, value.shape)))
    assert [s for s, _ in seen] == list(range(len(program)))
    assert all(shape == program.nodes[s].shape for s, shape in seen)
    np.testing.assert_allclose(out, evaluate(OUT, {"x": XV}), rtol=1e-6)


def test_eager_computes_each_node_once_across_requests_and_compiles_no_program():
    clear_cache("values")
    before = cache_stats()["compilations"]
    ev = Eager(OUT, {"x": XV})
    np.testing.assert_allclose(ev("pre"), XV @ W.numpy(), rtol=1e-6)
    assert ev.cache_info()["misses"] == 1  # pre (x and w are arguments)
    both = ev.values(["act", OUT])
    np.testing.assert_allclose(both[1], both[0] + XV @ W.numpy(), rtol=1e-6)
    info = ev.cache_info()
    assert info["misses"] == 3 and info["hits"] == 1  # act and out computed over the cached 'pre'
    assert cache_stats()["compilations"] == before


def test_eager_values_depend_on_its_inputs():
    """The view's values are keyed by the values bound to the Symbols below them: other inputs
    compute afresh, and an unbound Symbol is an error even where a value is known for others."""
    ev = Eager(OUT, {"x": XV})
    ev(PRE)
    later = Eager(OUT)  # no inputs: 'x' is unbound
    with pytest.raises(EvaluationError, match="unbound Symbol 'x'"):
        later(ACT)
    ev.inputs = {"x": 2 * XV}
    np.testing.assert_allclose(ev(ACT), np.tanh(2 * XV @ W.numpy()), rtol=1e-6)
