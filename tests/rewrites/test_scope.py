"""Scoped rewrites: where= and stop_at= keep the value and leave everything outside the region alone."""

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import circuits as C
import rewrites
from circuits.select import Glob, Type
from circuits.testing import CLOSED_TYPES, dags
from rewrites.engine import Trace
from rewrites.rules import flatten_add_all
from rewrites.strategies import apply, bottom_up, normalize

SETTINGS = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _descendants(root, top):
    return {n.hash for n in C.toposort(top)}


@SETTINGS
@given(dags(types=CLOSED_TYPES, max_nodes=10), st.data())
def test_stop_at_keeps_the_value_and_every_stop_node(c, data):
    order = C.toposort(c)
    stops = data.draw(st.lists(st.sampled_from(order), max_size=3, unique_by=lambda n: n.hash))
    stop_hashes = {s.hash for s in stops}
    out = rewrites.simp(c, stop_at=lambda n: n.hash in stop_hashes)
    np.testing.assert_allclose(C.evaluate(out, dtype="float64"), C.evaluate(c, dtype="float64"),
                               rtol=1e-6, atol=1e-6)
    # Everything below a surviving stop node is the original node: nothing new appears under it.
    originals = {n.hash for n in order}
    for node in C.toposort(out):
        if node.hash in stop_hashes:
            assert _descendants(out, node) <= originals


@SETTINGS
@given(dags(types=["Add", "Scalar", "Array", "Einsum"], max_nodes=10), st.data())
def test_flattening_never_crosses_a_stop_node(c, data):
    # flatten_add_all keeps every summand, so every stop node reachable without crossing another
    # stop node survives — unscoped, nested Adds would be spliced away.
    order = C.toposort(c)
    stops = data.draw(st.lists(st.sampled_from(order), max_size=3, unique_by=lambda n: n.hash))
    stop_hashes = {s.hash for s in stops}
    out = apply(normalize(flatten_add_all), c, stop_at=lambda n: n.hash in stop_hashes)
    reached = {n.hash for n in C.toposort(c, stop=lambda n: n.hash in stop_hashes) if n.hash in stop_hashes}
    assert reached <= {n.hash for n in C.toposort(out)}
    np.testing.assert_allclose(C.evaluate(out, dtype="float64"), C.evaluate(c, dtype="float64"),
                               rtol=1e-6, atol=1e-6)


@SETTINGS
@given(dags(types=CLOSED_TYPES, max_nodes=10, names=["p", "q", "r", None]))
def test_where_fires_only_at_matching_nodes(c):
    trace = Trace()
    out = rewrites.simp(c, where=Glob("p*"), trace=trace)
    assert all(e.before.name is not None and e.before.name.startswith("p") for e in trace)
    np.testing.assert_allclose(C.evaluate(out, dtype="float64"), C.evaluate(c, dtype="float64"),
                               rtol=1e-6, atol=1e-6)


def test_region_on_a_small_circuit():
    x = C.Symbol((2,), name="x")
    zero = C.Scalar(0.0)
    keep = C.Add(x, zero, name="keep")
    c = C.Add(C.Add(x, zero, name="go"), keep, name="top")
    out = rewrites.simp(c, stop_at="keep")
    assert keep in out.children and x in out.children  # 'go' simplified, 'keep' kept whole
    out = rewrites.simp(c, where=Type("Add") & ~Glob("keep"))
    assert keep in C.toposort(out)
    assert rewrites.simp(c).get(Glob("keep"), require=False) == []
    # a structural matcher is resolved on the circuit as given
    out = rewrites.simp(c, where=C.select.ChildOf("top", 0))
    assert out.children[0] is x and out.children[1] is keep


def test_stop_node_shared_with_the_region_keeps_its_original_below_it():
    x = C.Symbol((2,), name="x")
    inner = C.Add(C.Add(x, x), x)  # flattenable
    stop = C.Einsum.from_spec("a->a", inner, name="stop")
    c = C.Add(C.Add(inner, stop), name="top")
    out = apply(bottom_up(flatten_add_all), c, stop_at="stop")
    assert out.get_unique("stop") is stop
    assert inner not in out.children  # outside the stop node the shared Add was flattened
    np.testing.assert_allclose(C.evaluate(out, {"x": np.array([1.0, 2.0])}),
                               C.evaluate(c, {"x": np.array([1.0, 2.0])}))
