"""A failing property test of a user's rewrite shows the shrunk circuit in the text format,
with its Arrays' and inputs' values, not ``case=(built[0], {})``."""

import numpy as np
import pytest
from hypothesis import given, settings

import circuits as C
from circuits.testing import CircuitWithInputs, circuits_with_inputs, dags


def drop_second_term(node):
    """A deliberately wrong rule: ``x + y -> x``."""
    if isinstance(node, C.Add) and len(node.children) == 2 and node.children[0].shape == node.shape:
        return node.children[0]
    return None


def _failure_report(test) -> str:
    with pytest.raises(AssertionError) as info:
        test()
    return "\n".join(getattr(info.value, "__notes__", []))


def test_a_failing_case_prints_the_circuit_and_its_inputs():
    seen = []

    @settings(max_examples=200, deadline=None, database=None, derandomize=True)
    @given(case=circuits_with_inputs(max_nodes=8, types=("Symbol", "Array", "Scalar", "Add", "Einsum")))
    def test_rule(case):
        circuit, inputs = case
        seen.append(case)
        out = C.deep_map(circuit, drop_second_term)
        np.testing.assert_allclose(C.evaluate(out, inputs, dtype="float64"),
                                   C.evaluate(circuit, inputs, dtype="float64"), rtol=1e-9, atol=1e-9)

    report = _failure_report(test_rule)
    shrunk = seen[-1]  # hypothesis replays the shrunk example last
    assert isinstance(shrunk, CircuitWithInputs)
    assert "built[0]" not in report
    assert shrunk.circuit.to_text() in report
    assert "inputs={" in report and "arrays={" in report
    for symbol, value in shrunk.inputs.items():
        label = symbol.name if symbol.name is not None else symbol.line()
        assert f"{label!r}: {np.asarray(value).tolist()}" in report


def test_a_failing_circuit_prints_as_text():
    seen = []

    @settings(max_examples=200, deadline=None, database=None, derandomize=True)
    @given(c=dags(max_nodes=8, types=("Array", "Scalar", "Add", "Einsum")))
    def test_rule(c):
        seen.append(c)
        out = C.deep_map(c, drop_second_term)
        np.testing.assert_allclose(C.evaluate(out, dtype="float64"), C.evaluate(c, dtype="float64"),
                                   rtol=1e-9, atol=1e-9)

    report = _failure_report(test_rule)
    assert "built[0]" not in report
    for line in seen[-1].to_text().split("\n"):
        assert line in report


def test_circuit_with_inputs_is_still_a_pair():
    x = C.Symbol((2,), name="x")
    case = CircuitWithInputs(x, {x: np.zeros(2)})
    circuit, inputs = case
    assert circuit is x and case == (x, inputs)
    assert "'x' [2] Symbol" in repr(case) and "'x': [0.0, 0.0]" in repr(case)
