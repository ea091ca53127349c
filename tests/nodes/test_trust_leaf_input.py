"""Bad leaf and index input is a library error, never a raw Python one (issue 21 item 12)."""

import pytest

import circuits as C
from circuits.errors import CircuitError, ParseError


def test_a_scalar_beyond_float64_is_a_circuit_error():
    with pytest.raises(CircuitError, match="about 400 digits is beyond float64"):
        C.Scalar(10**400)
    with pytest.raises(CircuitError, match="beyond float64"):
        C.Scalar(-(10**309), name="s")
    assert C.Scalar(10**300).value == 1e300


@pytest.mark.parametrize("uuid", ["not-a-uuid", "12345678-1234-1234-1234-1234567890ab-ff", 3, ""])
def test_a_bad_uuid_is_a_circuit_error(uuid):
    with pytest.raises(CircuitError, match="is not a UUID"):
        C.Symbol((2,), name="s", uuid=uuid)


@pytest.mark.parametrize("index", ["[[1000000000000000000000000000000,0]]", "[[0,-1000000000000000000000000000000]]",
                                   "[[9223372036854775808]]"])
def test_an_int_list_beyond_int64_is_a_parse_error(index):
    with pytest.raises(ParseError, match="beyond a 64-bit int") as info:
        C.parse(f"'i' Index {index}\n  'x' [3] Symbol")
    assert info.value.line_number == 1


def test_int_lists_at_the_int64_edges_still_read():
    with pytest.raises(ParseError, match="out of range"):  # read, then refused for the axis
        C.parse("'i' Index [[9223372036854775807,-9223372036854775808]]\n  'x' [3] Symbol")
    assert C.parse("'i' Index [[2,0,-1]]\n  'x' [3] Symbol").shape == (3,)
