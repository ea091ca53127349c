"""A meta-test over ``circuits.nodes.NODE_TYPES``: every node type has everything on the checklist
in ``circuits.nodes`` (its docstring) — its own hooks (payload, text, index passing, expansion
rule), a JAX lowering, payload parsing through its class (the parser holds no per-type code), a
printer round trip, a sympy form, an expansion that batches it exactly and a strategy that draws
it.  A new node type (Module, Scatter...) fails here until it has them all."""

import inspect
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import circuits as C
import circuits.nodes
from circuits.backend.lower.ops import OP_BUILDERS
from circuits.backend.lower.program import ARGUMENT_TYPES
from circuits.backend.symbolic import SYMBOLIC_RULES, symbolic_evaluate
from circuits.check import check
from circuits.expand import expand
from circuits.io.values import gather_index_bounds
from circuits.nodes import NODE_TYPES, Circuit
from circuits.shapes import symbolic_size
from circuits.testing import circuits_with_inputs, dags, store_of
from circuits.text import parser

TYPES = pytest.mark.parametrize("node_type", NODE_TYPES, ids=lambda t: t.__name__)
FEW = settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def small(node_type, **kw):
    return dags(root_types=[node_type], max_nodes=6, max_depth=3, **kw)


def evaluable(circuit):
    """The circuit itself, or for a DiscreteVar (which has no single value) a batch of three of
    its samples: how it is evaluated."""
    if any(type(n) is C.DiscreteVar for n in C.toposort(circuit)):
        return C.sample(circuit, 3, seed=0)
    return circuit


@TYPES
@FEW
@given(data=st.data())
def test_the_strategies_draw_it(node_type, data):
    assert type(data.draw(small(node_type))) is node_type


@TYPES
def test_the_backend_lowers_it(node_type):
    # Leaves are arguments of the compiled function; every other node is an op.
    assert (node_type in ARGUMENT_TYPES) != (node_type in OP_BUILDERS)


@TYPES
@FEW
@given(data=st.data())
def test_it_evaluates(node_type, data):
    circuit, inputs = data.draw(circuits_with_inputs(root_types=[node_type], max_nodes=6, max_depth=3))
    value = C.evaluate(evaluable(circuit), inputs, dtype="float64")
    assert value.shape == evaluable(circuit).shape


@TYPES
def test_its_class_reads_its_payload(node_type):
    for hook in ("parse_payload", "from_payload"):
        assert callable(getattr(node_type, hook)), f"{node_type.__name__} has no {hook}"
    assert isinstance(node_type.child_count, tuple) and len(node_type.child_count) == 2


def test_the_parser_has_no_per_type_code():
    source = inspect.getsource(parser)
    node_classes = {name for name, v in vars(parser).items() if isinstance(v, type) and issubclass(v, Circuit)}
    assert node_classes <= {"Circuit"}
    for t in NODE_TYPES:
        for quoted in (f'"{t.type_name}"', f"'{t.type_name}'"):
            assert quoted not in source, f"the parser special-cases {t.type_name}"


@TYPES
@FEW
@given(data=st.data())
def test_it_round_trips_through_the_printer(node_type, data):
    node = data.draw(small(node_type))
    text = node.to_text()
    again = C.parse(text, store=store_of(node))
    assert again == node and again.to_text() == text


@TYPES
@FEW
@given(data=st.data())
def test_it_has_a_sympy_form(node_type, data):
    assert node_type in SYMBOLIC_RULES
    # One node over leaves: sympy's expressions grow fast with depth, and the form is what counts.
    circuit, inputs = data.draw(circuits_with_inputs(shape=(2,), root_types=[node_type], max_nodes=3,
                                                     max_depth=1))
    value = symbolic_evaluate(evaluable(circuit), {k: np.asarray(v) for k, v in inputs.items()})
    assert value.shape == evaluable(circuit).shape


def test_every_node_type_is_covered():
    # The tables above are keyed by class: nothing in them names a type that is not a node.
    assert set(SYMBOLIC_RULES) == set(NODE_TYPES)
    assert set(OP_BUILDERS) | set(ARGUMENT_TYPES) == set(NODE_TYPES)


# The hooks every node class defines itself, and those a class with payload fields of its own
# defines (the checklist's items 1-4: the others inherit Circuit's defaults), read from the checklist.
CHECKLIST = circuits.nodes.__doc__.split("Adding a node type", 1)[1]
OWN_HOOKS = re.findall(r"``([a-z_]+)``\s*\(own\)", CHECKLIST)
PAYLOAD_HOOKS = re.findall(r"``([a-z_]+)``\s*\(payload\)", CHECKLIST)


def test_the_checklist_names_the_hooks():
    assert set(OWN_HOOKS) >= {"type_name", "_setup", "expanded"}
    assert set(PAYLOAD_HOOKS) >= {"_rebuild", "_payload_bytes", "payload_text", "parse_payload", "from_payload"}
    for hook in OWN_HOOKS + PAYLOAD_HOOKS:
        assert hasattr(Circuit, hook) or hook == "type_name", hook
    for words in ("NODE_TYPES", "OP_BUILDERS", "ARGUMENT_TYPES", "SYMBOLIC_RULES", "dags"):
        assert words in CHECKLIST


def own_fields(node_type) -> tuple:
    slots = vars(node_type).get("__slots__", ())
    return (slots,) if isinstance(slots, str) else tuple(slots)


@TYPES
def test_its_class_defines_its_own_hooks(node_type):
    needed = OWN_HOOKS + (PAYLOAD_HOOKS if own_fields(node_type) else [])
    missing = [hook for hook in needed if hook not in vars(node_type)]
    assert not missing, f"{node_type.__name__} does not define {missing} (the checklist in circuits.nodes)"


def test_the_payload_hooks_are_required_of_a_class_with_payload_fields():
    # The check must be able to fail: a new type with a field of its own that keeps the
    # payload-less defaults would hash and print without its field.
    class Scaled(Circuit):
        __slots__ = ("factor",)
        type_name = "Scaled"

        def _setup(self, child, factor, name=None):
            raise NotImplementedError

        def expanded(self, children, gained, size_map, replacements=None):
            raise NotImplementedError

    with pytest.raises(AssertionError, match=r"Scaled does not define \['_rebuild', '_payload_bytes'"):
        test_its_class_defines_its_own_hooks(Scaled)
    assert not own_fields(C.Add) and not own_fields(C.DiscreteVar)  # these inherit the defaults


@TYPES
def test_its_index_passing_is_the_one_source(node_type, monkeypatch):
    # fill_random's gather bounds follow passes_index (and so does the parser): flip it for this
    # type and a gather's index no longer (or now) reaches the ints through it.
    table = C.Array(np.zeros((7, 3), np.float32), name="table")
    toks = C.Array(np.zeros((4,), np.int64), name="toks")
    through = {C.Index: lambda t: C.Index(t, (slice(None),)), C.Rearrange: lambda t: C.Rearrange(t, "a -> a"),
               C.Concat: lambda t: C.Concat(t, axis=0), C.Tag: lambda t: C.Tag(t, uuid="00000000-0000-0000-0000-000000000001")}
    wrap = through.get(node_type)
    if wrap is None:  # nothing to flip: an index stops here
        assert not node_type.passes_index
        return
    assert node_type.passes_index
    gather = C.GeneralFunction("gen_index_at_0_c", table, wrap(toks))
    assert gather_index_bounds(gather) == {toks.hash: 7}
    monkeypatch.setattr(node_type, "passes_index", False)
    assert gather_index_bounds(gather) == {}


@TYPES
@FEW
@given(data=st.data())
def test_its_expansion_rule_batches_it_exactly(node_type, data):
    """Oracle: a leaf expanded into a batch of 2 gives, at entry i, the circuit with that leaf's
    i-th value (the backend's vmap over that leaf as a Symbol, float64).  Leaves are checked with a
    symbolic size resized."""
    if node_type.child_count == (0, 0):
        s0 = symbolic_size(0)
        leaf = {C.Symbol: C.Symbol((s0, 2), name="x"), C.Scalar: C.Scalar(1.5, (s0, 2)),
                C.Array: C.Array(np.ones((3, 2), np.float32))}[node_type]
        out = expand(C.Add(leaf, C.Scalar(0.0, (3, 2))) if node_type is C.Array else leaf, {}, {s0: 3})
        assert out.shape == (3, 2)
        return
    if node_type is C.DiscreteVar:  # its rule runs inside circuits.expand.sample (tests/test_expand.py)
        assert "expanded" in vars(node_type)
        return
    circuit, inputs = data.draw(circuits_with_inputs(root_types=[node_type], max_nodes=6, max_depth=3,
                                                     functions=["exp", "tanh", "softmax", "log_softmax"]))
    order = C.toposort(circuit)
    bound = {a.symbol for n in order if type(n) is C.Module for a in n.spec.arg_specs}
    free = [n for n in order if type(n) is C.Symbol and n not in bound and n in inputs]
    arrays = [n for n in order if type(n) is C.Array and n.dtype.startswith("float")]
    if not free and not arrays:
        return
    leaf = (free or arrays)[0]
    first = inputs[leaf] if leaf in inputs else np.asarray(leaf.value)
    values = np.stack([first, first * 0.5 + 0.25]).astype(np.float64)
    others = {k: v for k, v in inputs.items() if k is not leaf}
    out = expand(circuit, {leaf: C.Array(values)})  # leading axes only: every rule must follow
    got = C.evaluate(out, others, dtype="float64")
    assert got.shape == (2, *circuit.shape)
    # the oracle: the backend's own batching (vmap over a Symbol's leading axis), not expansion
    free_leaf = leaf if type(leaf) is C.Symbol else C.Symbol(leaf.shape, name="the_leaf")
    unbatched = circuit if free_leaf is leaf else C.replace(circuit, {leaf: free_leaf})
    want = C.evaluate_batched(unbatched, {free_leaf: values, **{k: np.broadcast_to(v, (2, *v.shape))
                                                                for k, v in others.items()}}, dtype="float64")
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9)


@TYPES
@FEW
@given(data=st.data())
def test_a_rebuild_over_same_shaped_children_equals_the_constructor(node_type, data):
    """``with_children`` copies the payload of a type marked ``rebuilds_by_shape`` when the new
    children have the old ones' shapes and dtypes: the node is the one the constructor builds."""
    c = data.draw(small(node_type))
    if not c.children:
        return
    kids = [C.Symbol(k.shape, name=f"rebuilt{i}", dtype=k.dtype) for i, k in enumerate(c.children)]
    fast = c.with_children(kids)
    slow = c._rebuild(tuple(kids), c.name)
    assert fast is slow or fast.hash == slow.hash
    assert (fast.shape, fast.dtype, fast.name) == (slow.shape, slow.dtype, slow.name)
    for attr in type(c).__slots__:
        assert repr(getattr(fast, attr)) == repr(getattr(slow, attr))
    check(fast)
    # renamed in the same step: the constructor's node under the new name
    named = c.with_children(kids, "renamed")
    assert named.hash == c._rebuild(tuple(kids), "renamed").hash and named.name == "renamed"
    assert c.with_children(c.children, "renamed").hash == c.rename("renamed").hash
    check(named)
