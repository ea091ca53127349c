"""A meta-test over ``circuits.nodes.NODE_TYPES``: every node type has everything a node type
needs outside its own file — a JAX lowering, payload parsing through its class (the parser
holds no per-type code), a printer round trip, a sympy form and a strategy that draws it.  A new
node type (Module, Scatter...) fails here until it has them all."""

import inspect

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import circuits as C
from circuits.backend.ops import OP_BUILDERS
from circuits.backend.program import ARGUMENT_TYPES
from circuits.backend.symbolic import SYMBOLIC_RULES, symbolic_evaluate
from circuits.nodes import NODE_TYPES, Circuit
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
        assert hook in vars(node_type), f"{node_type.__name__} does not define {hook}"
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
