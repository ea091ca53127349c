"""Constructors validate and say what is wrong: the node's name, its would-be printed line, what was
expected.  They never simplify."""

import numpy as np
import pytest

import circuits as C
from circuits import CircuitError, ShapeError

x23 = C.Array(np.ones((2, 3), np.float32), name="x23")
v4 = C.Array(np.ones((4,), np.float32), name="v4")


def raises(exc, *fragments):
    """Context manager: ``exc`` is raised and its message contains every fragment."""

    class _Check:
        def __enter__(self):
            self.ctx = pytest.raises(exc)
            self.info = self.ctx.__enter__()
            return self.info

        def __exit__(self, *args):
            handled = self.ctx.__exit__(*args)
            message = str(self.info.value)
            for f in fragments:
                assert f in message, f"{f!r} not in error message:\n{message}"
            return handled

    return _Check()


# ---------------------------------------------------------------------------- shapes
def test_add_shape_mismatch_names_the_node_and_shapes():
    with raises(ShapeError, "Add 'bad'", "[2, 3]", "[4]", "do not broadcast", "'bad' Add", "'x23' [2,3] Array"):
        C.Add(x23, v4, name="bad")


def test_concat_mismatch_and_axis():
    with raises(ShapeError, "Concat 'cat'", "agree on every axis but 0"):
        C.Concat(x23, C.Array(np.ones((2, 4), np.float32)), axis=0, name="cat")
    with raises(ShapeError, "axis 2 is out of range for rank 2"):
        C.Concat(x23, x23, axis=2, name="cat")
    with raises(ShapeError, "at least one child"):
        C.Concat(axis=0)


def test_function_shape_rules_name_the_node():
    with raises(ShapeError, "GeneralFunction 'sm'", "rank >= 1", "'sm' GeneralFunction softmax"):
        C.GeneralFunction("softmax", C.Scalar(1.0), name="sm")
    with raises(ShapeError, "takes 1 argument", "got 2"):
        C.GeneralFunction("exp", x23, x23, name="e")
    with raises(ShapeError, "do not broadcast"):
        C.GeneralFunction("pow", x23, v4, name="p")


# ---------------------------------------------------------------------------- einsum
def test_malformed_einsum_specs():
    with raises(CircuitError, "'ab,bc'", "exactly one '->'"):
        C.Einsum.from_spec("ab,bc", x23, x23)
    with raises(CircuitError, "'a1->a'", "'1' is not an axis letter"):
        C.Einsum.from_spec("a1->a", x23)
    with raises(ShapeError, "Einsum 'e'", "2 operands but 1 children", "'e' Einsum ab,bc->ac"):
        C.Einsum.from_spec("ab,bc->ac", x23, name="e")
    with raises(ShapeError, "operand 0 has 3 axes", "shape [2, 3]"):
        C.Einsum.from_spec("abc->a", x23, name="e")
    with raises(ShapeError, "axis b has size 3 in one place and 4 in operand 1"):
        C.Einsum.from_spec("ab,b->a", x23, v4, name="e")
    # a repeated output axis is not malformed: it writes a diagonal (tests/nodes/test_einsum_diagonal.py)
    assert C.Einsum.from_spec("ab->aa", x23, name="e").shape == (2, 2)
    with raises(ShapeError, "output axis c appears in no input"):
        C.Einsum.from_spec("ab->c", x23, name="e")
    with raises(ShapeError, "negative axis id"):
        C.Einsum(x23, in_axes=((0, -1),), out_axes=(0,), name="e")
    with raises(CircuitError, "in_axes must be a sequence"):
        C.Einsum(x23, in_axes=(5,), out_axes=(), name="e")


def test_diagonal_needs_equal_sizes():
    with raises(ShapeError, "axis a has size 2 in one place and 3"):
        C.Einsum.from_spec("aa->a", x23, name="diag")


# ---------------------------------------------------------------------------- index
def test_out_of_range_indices():
    with raises(ShapeError, "Index 'i'", "index 2 on axis 0 is out of range for size 2", "Index [2]",
                "'x23' [2,3] Array"):
        C.Index(x23, (2,), name="i")
    with raises(ShapeError, "index -3 on axis 0"):
        C.Index(x23, (-3,), name="i")
    with raises(ShapeError, "index 5 on axis 1 is out of range for size 3"):
        C.Index(x23, (slice(None), np.array([0, 5])), name="i")
    with raises(ShapeError, "3 index entries for a child of rank 2"):
        C.Index(x23, (0, 0, 0), name="i")


def test_bad_index_entries():
    with raises(CircuitError, "Index 'i'", "float array is not an index"):
        C.Index(x23, (np.array([0.0, 1.0]),), name="i")
    with raises(CircuitError, "bool is not an index"):
        C.Index(x23, (True,), name="i")
    with raises(CircuitError, "slice step cannot be 0"):
        C.Index(x23, (slice(None, None, 0),), name="i")
    with raises(CircuitError, "must be 1-d"):
        C.Index(x23, (np.zeros((1, 1), np.int64),), name="i")
    with raises(CircuitError, "gen_index"):
        C.Index(x23, (C.Scalar(0.0),), name="i")


# ---------------------------------------------------------------------------- rearrange
def test_bad_rearranges():
    x6 = C.Array(np.ones((6, 5), np.float32), name="x6")
    with raises(CircuitError, "needs exactly one '->'"):
        C.Rearrange(x6, "a b", name="r")
    with raises(CircuitError, "nested parentheses"):
        C.Rearrange(x6, "((a b)) c -> a b c", name="r")
    with raises(CircuitError, "repeated on the left"):
        C.Rearrange(x6, "a a -> a", name="r")
    with raises(ShapeError, "Rearrange 'r'", "cannot split into (h d)", "'r' Rearrange (h d) s -> h s d h=4"):
        C.Rearrange(x6, "(h d) s -> h s d", h=4, name="r")
    with raises(ShapeError, "several unknown sizes"):
        C.Rearrange(x6, "(h d) s -> h s d", name="r")
    with raises(ShapeError, "left side has 3 axes"):
        C.Rearrange(x6, "a b c -> a b c", name="r")
    with raises(ShapeError, "new axis k needs its size"):
        C.Rearrange(x6, "a b -> a b k", name="r")
    with raises(ShapeError, "only size-1 axes can be dropped"):
        C.Rearrange(x6, "a b -> a", name="r")
    with raises(ShapeError, "which the spec does not use"):
        C.Rearrange(x6, "a b -> b a", z=3, name="r")


# ---------------------------------------------------------------------------- functions
def test_unknown_function_name_names_the_node():
    with raises(CircuitError, "GeneralFunction 'f'", "unknown GeneralFunction 'softmaxx'", "softmax"):
        C.GeneralFunction("softmaxx", x23, name="f")


def test_float_array_as_gather_index():
    with raises(ShapeError, "GeneralFunction 'emb'", "index argument must have an int dtype", "float32"):
        C.GeneralFunction("gen_index_at_0_c", x23, C.Array(np.zeros(3, np.float32)), name="emb")
    with raises(ShapeError, "axis 5 is out of range"):
        C.GeneralFunction("gen_index_at_5", x23, C.Array(np.zeros(3, np.int64)), name="emb")
    with raises(ShapeError, "_batch_x needs x's leading axes"):
        C.GeneralFunction("gen_index_at_0_batch_x", x23, C.Array(np.zeros(3, np.int64)), name="emb")


# ---------------------------------------------------------------------------- leaves and children
def test_leaves_and_children_are_checked():
    with raises(CircuitError, "Add 'a'", "child 1 is a ndarray", "Array(...)"):
        C.Add(x23, np.ones((2, 3)), name="a")
    with raises(CircuitError, "name must be a str"):
        C.Add(x23, name=3)
    with raises(CircuitError, "value must be a real number"):
        C.Scalar("one")
    with raises(CircuitError, "negative size"):
        C.Symbol((2, -1), name="s")
    with raises(CircuitError, "unsupported dtype"):
        C.Symbol((2,), name="s", dtype="complex64")
    with raises(CircuitError, "not hex digits"):
        C.Array.placeholder((2,), "xyz", name="w")


def test_constructors_never_simplify():
    zero = C.Scalar(0.0, (2, 3))
    s = C.Add(x23, zero)
    assert s.children == (x23, zero)
    one = C.Einsum.from_spec("ab->ab", x23)
    assert one.children == (x23,) and one != x23
    assert C.Add(x23).children == (x23,)
    assert C.Index(x23, ()).children == (x23,)
