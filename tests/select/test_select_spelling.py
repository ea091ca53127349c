"""One spelling per selection: the Circuit methods and the ``circuits.select`` functions share one
implementation, one signature and one set of defaults; an empty selection is an error unless
``require=False``; ``update`` refuses a replacement of another shape with a ShapeError."""

import inspect

import numpy as np
import pytest

import circuits as C
from circuits import select

SELECTIONS = ["get", "get_unique", "update", "paths"]


@pytest.fixture
def circuit():
    x = C.Array(np.ones(2, np.float32), name="x")
    return C.Add(C.GeneralFunction("exp", x, name="e"), x, name="y")


@pytest.mark.parametrize("name", SELECTIONS)
def test_method_and_function_have_the_same_signature(name):
    method = list(inspect.signature(getattr(C.Circuit, name)).parameters.values())
    function = list(inspect.signature(getattr(select, name)).parameters.values())
    assert method[0].name == "self" and function[0].name == "root"
    assert [(p.name, p.kind, p.default) for p in method[1:]] == [
        (p.name, p.kind, p.default) for p in function[1:]]


def test_the_same_default_everywhere():
    defaults = {name: inspect.signature(getattr(select, name)).parameters["require"].default
                for name in ("get", "update", "paths")}
    assert defaults == {"get": True, "update": True, "paths": True}


def test_no_top_level_aliases():
    # Two spellings at most: the method and the circuits.select function.
    for name in ("get", "get_unique", "update", "paths", "filter_nodes"):
        assert not hasattr(C, name), name


@pytest.mark.parametrize("spelling", ["method", "function"])
def test_empty_selection_is_an_error_unless_allowed(circuit, spelling):
    def call(name, *args, **kw):
        if spelling == "method":
            return getattr(circuit, name)(*args, **kw)
        return getattr(select, name)(circuit, *args, **kw)

    keep = lambda n: n  # noqa: E731
    for name, args in [("get", ()), ("update", (keep,)), ("paths", ())]:
        with pytest.raises(C.SelectionError, match=r"^" + name + r": Name\('nope'\) matched nothing.*require=False"):
            call(name, "nope", *args)
    assert call("get", "nope", require=False) == []
    assert call("update", "nope", keep, require=False) is circuit
    assert call("paths", "nope", require=False) == []
    with pytest.raises(C.SelectionError, match=r"Name\('nope'\) matched 0 nodes"):
        call("get_unique", "nope")
    # the two spellings give the same answers
    assert call("get", "x") == select.get(circuit, "x") == circuit.get("x")
    zero = lambda n: C.Array(np.zeros(2, np.float32), name="x")  # noqa: E731
    assert call("update", "x", zero) == select.update(circuit, "x", zero) == circuit.update("x", zero)
    assert [[n.name for n in p] for p in call("paths", "x", limit=1)] == [["y", "e", "x"]]


def test_a_predicate_is_get(circuit):
    # filter_nodes is gone: get with a predicate (and require=False when nothing may match).
    assert circuit.get(lambda n: n.name in ("x", "y")) == [circuit.children[1], circuit]
    assert circuit.get(lambda n: n.ndim > 1, require=False) == []


@pytest.mark.parametrize("spelling", ["method", "function"])
def test_update_that_changes_a_shape_is_a_shape_error(circuit, spelling):
    def widen(n):
        return C.Array(np.zeros(3, np.float32), name="x")

    run = (lambda: circuit.update("x", widen)) if spelling == "method" else (lambda: select.update(circuit, "x", widen))
    with pytest.raises(C.ShapeError) as info:
        run()
    message = str(info.value)
    assert "'x' [2] Array" in message  # the node
    assert "of shape [2]" in message and "of shape [3]" in message  # old and new shape
    assert "keep the shape" in message


def test_update_that_returns_no_node_is_a_clear_error(circuit):
    with pytest.raises(C.CircuitError, match=r"returned a ndarray for 'x' \[2\] Array .*not a circuit node"):
        circuit.update("x", lambda n: np.zeros(2, np.float32))
