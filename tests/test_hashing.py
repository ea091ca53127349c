"""The identity recipes of ``circuits.hashing`` are the ones nodes, ``structure_hash``, ``check``
and compiled programs use, and every byte of their input counts."""

import uuid

import numpy as np
import pytest
from hypothesis import given

import circuits as C
from circuits.backend.lower.program import Program
from circuits.check import check
from circuits.hashing import (
    argument_key_part,
    node_hash,
    op_key_part,
    program_body_key,
    program_key,
    structure_hash,
    type_prefix,
)
from circuits.testing import dags
from circuits.traversal import toposort

ODD_NAMES = ["x", "", "ab\0", "\ud800", "é", "a'b"]


@given(dags(max_nodes=15, names=ODD_NAMES))
def test_nodes_are_hashed_by_the_recipes_in_hashing(circuit):
    check(circuit)
    for node in toposort(circuit):
        prefix = type_prefix(node.type_name)
        kids = b"".join(c.hash for c in node.children)
        assert node.hash == node_hash(prefix, node._payload_bytes(), kids, node.name)
        blind = b"".join(c.structure_hash for c in node.children)
        assert node.structure_hash == structure_hash(prefix, node._structure_bytes(), blind)
    assert C.strip_names(circuit).structure_hash == circuit.structure_hash


def test_program_key_is_the_recipe_in_hashing():
    x = C.Symbol((2,), name="x")
    y = C.GeneralFunction("exp", x, name="y")
    p = Program([y], "float32")
    part_y = op_key_part("GeneralFunction", b"exp\0" + np.int64(id(y.function)).tobytes())
    body = program_body_key("float32", [argument_key_part("Symbol", "float32", (2,)), part_y], [(), (0,)])
    assert p.key == program_key(body, (1,))
    # a given node is an argument whose value is supplied: only its dtype and shape count
    given = Program([y], "float32", given={y.hash})
    body = program_body_key("float32", [argument_key_part("Given", "float32", (2,))], [()])
    assert given.key == program_key(body, (0,))


def _each_byte_changed(data: bytes):
    for i in range(len(data)):
        yield data[:i] + bytes([data[i] ^ 1]) + data[i + 1:]


def _each_input_changed(args):
    """``args`` with one byte (one character of a str) changed, for every byte of every argument."""
    for k, arg in enumerate(args):
        if isinstance(arg, str):
            variants = [arg[:i] + chr(ord(arg[i]) ^ 1) + arg[i + 1:] for i in range(len(arg))]
        else:
            variants = _each_byte_changed(arg)
        for v in variants:
            yield args[:k] + (v,) + args[k + 1:]


LEAF = node_hash(type_prefix("Symbol"), b"float32|", b"", "x")
OTHER = node_hash(type_prefix("Scalar"), b"\0" * 16, b"", None)

CASES = {
    "node_hash": (node_hash, (type_prefix("Einsum"), b"ab->b", LEAF + OTHER, "name")),
    "structure_hash": (structure_hash, (type_prefix("Einsum"), b"ab->b", LEAF + OTHER)),
    "op_key_part": (op_key_part, ("Index", b"\1\2")),
    "program_key": (program_key, (LEAF, b"")),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_changing_one_input_byte_changes_each_hash(name):
    fn, args = CASES[name]
    if name == "program_key":  # output slots are ints: change each one, and their number
        assert program_key(LEAF, (0, 1)) not in {program_key(LEAF, o) for o in [(1, 1), (0, 0), (0,), (0, 1, 1)]}
        args = (LEAF,)
        fn = lambda body: program_key(body, (0, 1))  # noqa: E731
    seen = {fn(*args)}
    for changed in _each_input_changed(args):
        out = fn(*changed)
        assert out not in seen, changed
        seen.add(out)
    if name == "node_hash":
        assert fn(*args[:3], None) not in seen  # no name is not any name, not even ''
        assert fn(*args[:3], "") != fn(*args[:3], None)


def test_changing_any_field_changes_an_argument_key_part_and_the_program_key():
    base = ("Symbol", "float32", (2, 3))
    parts = {argument_key_part(*base)}
    for other in [("Array", "float32", (2, 3)), ("Symbol", "float64", (2, 3)), ("Symbol", "float32", (2, 4)),
                  ("Symbol", "float32", (2, 3, 1)), ("Symbol", "float32", (2,))]:
        parts.add(argument_key_part(*other))
    assert len(parts) == 6
    # an argument is never an op's part
    assert argument_key_part("Tag", "float32", ()) != op_key_part("Tag", b"")
    # the layout: float dtype, each part, each child slot
    part = argument_key_part(*base)
    body = program_body_key("float32", [part, part], [(), (0,)])
    assert body != program_body_key("float64", [part, part], [(), (0,)])
    assert body != program_body_key("float32", [part, part[:-1] + b"\1"], [(), (0,)])
    assert body != program_body_key("float32", [part, part], [(), (1,)])
    assert body != program_body_key("float32", [part, part], [(), (0, 0)])


def test_a_name_cannot_pass_for_shape_entries():
    # Without the payload's length in the hash input, this Symbol's shape entry and the named
    # Symbol's name made the same bytes: building the named Symbol returned the other node.
    unnamed = C.Symbol((2, (1 << 40) + (ord("a") << 48) + (ord("b") << 56)))
    named = C.Symbol((2,), name="ab" + "\0" * 6)
    assert named is not unnamed and named != unnamed
    assert named.shape == (2,) and named.name == "ab" + "\0" * 6
    check(C.Add(named, named))


def test_a_symbols_uuid_cannot_pass_for_shape_entries():
    # A uuid's 16 bytes read as two shape entries: Symbol((2,), uuid=u) came back as Symbol((5, 7, 2)).
    u = uuid.UUID(bytes=(5).to_bytes(8, "little") + (7).to_bytes(8, "little"))
    plain, with_uuid = C.Symbol((5, 7, 2)), C.Symbol((2,), uuid=u)
    assert with_uuid is not plain and with_uuid.shape == (2,) and with_uuid.uuid == u


def test_check_accepts_every_name_a_node_accepts():
    # check() re-encoded the name on its own, strictly, and raised UnicodeEncodeError on a name
    # the node itself hashes (a lone surrogate, as a filesystem path may carry).
    check(C.Add(C.Symbol((2,), name="\ud800x"), C.Scalar(1.0, (2,)), name="s\udcff"))


def _tamper(node, slot, value):
    old = getattr(node, slot)
    setattr(node, slot, value)
    try:
        with pytest.raises(C.CircuitError, match="check found broken nodes") as info:
            check(node)
    finally:
        setattr(node, slot, old)
    return str(info.value)


def test_check_finds_a_hash_not_made_by_the_recipe():
    x = C.Symbol((2,), name="x_test_hashing_tamper")
    node = C.GeneralFunction("exp", x, name="y_test_hashing_tamper")
    assert "its hash is not the hash of" in _tamper(node, "hash", bytes(16))
    node.structure_hash  # fills the structure hashes, which check then verifies too
    check(node)
    assert "its structure_hash is not the hash of" in _tamper(node, "_blind_hash", bytes(16))
