"""The node protocol, checked for every class in ``NODE_TYPES`` (a meta-test fails when a new node
class has no example here): rebuild through ``with_children``, identity, renaming, hashing."""

import copy
import pickle

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import circuits as C
from circuits.nodes import NODE_TYPE_BY_NAME, NODE_TYPES
from circuits.testing import dags
from circuits.traversal import strip_names, toposort

# One strategy per node class: a node of that class over generated (shared) children.
EXAMPLES = {t: dags(root_types=[t], max_nodes=8, max_depth=3) for t in NODE_TYPES}


def test_every_node_type_has_an_example_and_a_printed_name():
    assert set(EXAMPLES) == set(NODE_TYPES)
    assert NODE_TYPE_BY_NAME == {t.type_name: t for t in NODE_TYPES}
    assert len(NODE_TYPE_BY_NAME) == len(NODE_TYPES)


def any_node():
    return st.sampled_from(NODE_TYPES).flatmap(lambda t: EXAMPLES[t])


@pytest.mark.parametrize("node_type", NODE_TYPES, ids=lambda t: t.__name__)
@given(data=st.data())
def test_rebuild_round_trips(node_type, data):
    node = data.draw(EXAMPLES[node_type])
    assert type(node) is node_type
    # with_children(children) is the node itself ("no change" is free to detect) ...
    assert node.with_children(node.children) is node
    assert node.with_children(list(node.children)) is node
    # ... and a real rebuild over equal children is an equal node (interned: the same one).
    rebuilt = node._rebuild(tuple(node.children), node.name)
    assert rebuilt == node and rebuilt.hash == node.hash and hash(rebuilt) == hash(node)
    assert rebuilt is node
    assert rebuilt.shape == node.shape and rebuilt.dtype == node.dtype and rebuilt.name == node.name
    assert rebuilt.line() == node.line()


@pytest.mark.parametrize("node_type", NODE_TYPES, ids=lambda t: t.__name__)
@given(data=st.data())
def test_rename_changes_identity_only(node_type, data):
    node = data.draw(EXAMPLES[node_type])
    other_name = "renamed" if node.name != "renamed" else "renamed2"
    renamed = node.rename(other_name)
    assert type(renamed) is node_type and renamed.name == other_name
    assert renamed != node and renamed.hash != node.hash
    assert renamed.children == node.children and renamed.shape == node.shape
    assert renamed.dtype == node.dtype and renamed.payload_text() == node.payload_text()
    assert renamed.rename(node.name) is node
    assert node.rename(node.name) is node
    # name-blind identity ignores the name
    assert renamed.structure_hash == node.structure_hash


@pytest.mark.parametrize("node_type", [t for t in NODE_TYPES if t not in (C.Array, C.Scalar, C.Symbol)],
                         ids=lambda t: t.__name__)
@given(data=st.data())
def test_with_children_replaces_children_and_keeps_payload(node_type, data):
    node = data.draw(EXAMPLES[node_type].filter(lambda n: n.children))
    i = data.draw(st.integers(0, len(node.children) - 1))
    old = node.children[i]
    if not old.dtype.startswith("float"):
        return  # an int index argument: a float replacement would be (rightly) refused
    new = C.Scalar(7.25, old.shape, name="replacement")
    assert new != old
    kids = list(node.children)
    kids[i] = new
    changed = node.with_children(kids)
    assert type(changed) is node_type and changed != node
    assert changed.children[i] is new and changed.payload_text() == node.payload_text()
    assert changed.name == node.name and changed.shape == node.shape
    assert changed.with_children(node.children) is node


def test_leaves_refuse_children():
    leaf = C.Scalar(1.0)
    for node in (leaf, C.Array(np.ones(2)), C.Symbol((2,), name="s")):
        assert node.with_children(()) is node
        with pytest.raises(C.CircuitError, match="no children"):
            node.with_children((leaf,))


@given(any_node())
def test_hash_is_stable_and_equality_is_by_hash(node):
    nodes = toposort(node)
    assert len({n.hash for n in nodes}) == len(nodes)  # distinct nodes, distinct hashes
    for n in nodes:
        assert isinstance(n.hash, bytes) and len(n.hash) == 16
        assert hash(n) == int.from_bytes(n.hash[:8], "little", signed=True)
        assert n._rebuild(n.children, n.name) is n
    assert copy.copy(node) is node and copy.deepcopy(node) is node
    with pytest.raises(TypeError, match="save"):
        pickle.dumps(node)


@given(any_node())
def test_strip_names_keeps_the_structure_hash(node):
    stripped = strip_names(node)
    assert all(n.name is None for n in toposort(stripped))
    assert stripped.structure_hash == node.structure_hash
    assert stripped.shape == node.shape
    assert len(toposort(stripped)) <= len(toposort(node))  # names may have kept copies apart
    if any(n.name is not None for n in toposort(node)):
        assert stripped != node
    else:
        assert stripped is node


def test_structure_hash_sees_payloads_and_order_but_not_names():
    x, y = C.Scalar(1.0, (2,), name="x"), C.Scalar(2.0, (2,), name="y")
    assert C.Add(x, y, name="s").structure_hash == C.Add(x.rename("p"), y.rename(None)).structure_hash
    assert C.Add(x, y).structure_hash != C.Add(y, x).structure_hash
    assert C.Scalar(1.0, (2,)).structure_hash != C.Scalar(1.5, (2,)).structure_hash
    assert (C.GeneralFunction("exp", x).structure_hash
            != C.GeneralFunction("sin", x).structure_hash)


def test_interning_returns_the_live_node_and_frees_dead_ones():
    import gc
    import weakref

    from circuits.nodes import base

    a = C.Add(C.Scalar(3.0, (2,)), C.Scalar(4.0, (2,)), name="interned")
    b = C.Add(C.Scalar(3.0, (2,)), C.Scalar(4.0, (2,)), name="interned")
    assert a is b
    ref = weakref.ref(a)
    key = a.hash
    del a, b
    gc.collect()
    assert ref() is None
    assert key not in base._INTERNED  # the table forgets dead nodes
    # Having a value is part of an Array's identity: a placeholder and the valued Array it
    # stands for print alike but are different nodes, whichever was built first.
    value = np.arange(3, dtype=np.float32) + 0.5
    w = C.Array(value, name="w")
    ph_w = C.Array.placeholder(w.shape, w.content_hash, name="w", dtype="float32")
    assert ph_w.value is None and ph_w != w and ph_w.line() == w.line()
    h = C.Array(value * 3, name="w2")
    content = h.content_hash
    del h
    gc.collect()
    ph = C.Array.placeholder((3,), content, name="w2", dtype="float32")
    filled = C.Array(value * 3, name="w2")
    assert ph.value is None and filled.value is not None and ph != filled
    assert C.Array.placeholder((3,), content, name="w2", dtype="float32") is ph


def test_a_parent_over_a_valued_array_never_comes_back_over_its_placeholder():
    from circuits.backend import evaluate
    from circuits.hashing import content_hash

    value = np.arange(3, dtype=np.float32) + 11
    placeholder = C.Array.placeholder((3,), content_hash(value), name="w_ph", dtype="float32")
    s = C.Scalar(1.0)
    over_placeholder = placeholder
    for _ in range(30):
        over_placeholder = C.GeneralFunction("tanh", C.Add(over_placeholder, s))
    w = C.Array(value, name="w_ph")
    over_value = w
    for _ in range(30):
        over_value = C.GeneralFunction("tanh", C.Add(over_value, s))
    # The same text, but different circuits: one has its values, the other does not ...
    assert over_value.to_text() == over_placeholder.to_text() and over_value != over_placeholder
    expected = value.astype(np.float64)
    for _ in range(30):
        expected = np.tanh(expected + 1.0)
    # ... and the one built over the value evaluates, all the way down
    np.testing.assert_allclose(evaluate(over_value, dtype="float64"), expected, rtol=1e-12)
    # while rebuilding over the placeholder keeps the placeholder
    assert C.Add(placeholder, s).children[0] is placeholder
