"""Bad leaf and index input is a library error, never a raw Python one (issue 21 item 12)."""

import numpy as np
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
    with pytest.raises(CircuitError, match=r"Tag 't' over 's' \[2\] Symbol: uuid .* is not a UUID"):
        C.Tag(C.Symbol((2,), name="s"), uuid, name="t")  # a raw ValueError before (issue 33 item 6)


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


# ---------------------------------------------------------------------------- issue 33 item 3
# An Array keeps a value of its own: a read-only view proves nothing about the memory behind it.
def _read_only_view(a):
    v = a.view()
    v.flags.writeable = False
    return v


def _owner_set_read_only(a):
    a.flags.writeable = False
    return a  # its owner can set writeable back to True (the test does, then writes)


def _mmap_of(tmp_path):
    def make(a):
        path = tmp_path / "w.npy"
        np.save(path, a)
        return np.load(path, mmap_mode="r")
    return make


def _broadcast(a):
    return np.broadcast_to(a, a.shape)


def _write(source, view, tmp_path):
    """Write ones through another name than the view the Array was given."""
    if isinstance(view, np.memmap):
        w = np.load(tmp_path / "w.npy", mmap_mode="r+")  # the file rewritten in place
        w[...] = 1.0
        w.flush()
        return
    if view is source:
        source.flags.writeable = True
    source[...] = 1.0


@pytest.mark.parametrize("how", ["view", "owner", "broadcast", "mmap"])
def test_an_array_over_read_only_memory_written_elsewhere_keeps_its_value(how, tmp_path):
    make = {"view": _read_only_view, "owner": _owner_set_read_only, "broadcast": _broadcast,
            "mmap": _mmap_of(tmp_path)}[how]
    source = np.zeros(6)
    value = make(source)
    assert not value.flags.writeable
    node = C.Array(value, name="w")
    total = C.Einsum.from_spec("a->", node)
    assert float(C.evaluate(total)) == 0.0
    _write(source, value, tmp_path)
    assert float(np.asarray(value).sum()) == 6.0  # the memory really changed under the view
    assert float(C.evaluate(C.Einsum.from_spec("a->", C.Array(np.asarray(value), name="w")))) == 6.0
    # the node, its cached value, its hash and a new equal Array all still mean zeros
    assert float(C.evaluate(total)) == 0.0
    assert float(node.numpy().sum()) == 0.0
    from circuits.hashing import content_hash
    assert content_hash(np.asarray(node.value)) == node.content_hash
    fresh = C.Array(np.zeros(6), name="w")
    assert fresh is node and float(fresh.numpy().sum()) == 0.0


def test_an_array_cannot_be_written_through_its_value():
    node = C.Array(np.zeros(3), name="w")
    with pytest.raises(ValueError):
        node.value[0] = 1.0
    with pytest.raises(ValueError):
        node.value.flags.writeable = True


def test_arrays_the_library_reads_or_renames_are_not_copied_again(tmp_path, monkeypatch):
    """A loaded tensor (read into memory of its own), a renamed Array and a random Array of a
    parsed text keep the one value the library made: no second copy."""
    from circuits.nodes import leaves

    w = C.Array(np.arange(6.0), name="w")
    path = tmp_path / "c.circuit"
    C.save(C.Einsum.from_spec("a->", w), path)
    copies = []
    real = leaves._aligned_copy
    monkeypatch.setattr(leaves, "_aligned_copy", lambda v: copies.append(v.shape) or real(v))
    renamed = w.rename("v")
    assert renamed.value is w.value
    loaded = C.load(path)
    assert loaded.children[0] is w  # interned: the live node
    C.Array(np.ones(2), name="x")
    assert copies == [(2,)]  # the user's array, copied once
    w2 = C.Array(np.arange(7.0), name="w2")
    C.save(w2, path)
    del w2
    import gc
    gc.collect()
    assert C.load(path).numpy().tolist() == list(range(7))
    assert C.parse("'r' [3,4] Array rand").shape == (3, 4)
    assert C.fill_random(C.parse("'p' [3,4] Array 0a")).value.shape == (3, 4)
    assert copies == [(2,), (7,)]


def test_a_jax_array_is_kept_as_it_is():
    import jax.numpy as jnp

    value = jnp.arange(4.0)
    assert C.Array(value, name="j").value is value  # immutable: nothing to copy
    view = np.asarray(jnp.arange(5.0))  # a view of JAX's memory
    assert C.Array(view, name="v").value is view
    # what a JAX kernel returns is such a view (mode='ops': in 'auto' a first run may be numpy's)
    result = C.evaluate(C.Einsum.from_spec("a,a->a", C.Array(np.ones(3), name="o"), C.Array(np.ones(3), name="o")),
                        mode="ops")
    assert C.Array(result, name="r").value is result
    assert C.Array(view[::2], name="v2").value.base is view


def test_a_copy_over_the_allocation_budget_is_refused(monkeypatch):
    monkeypatch.setenv("CIRCUITS_MAX_ALLOC_BYTES", str(1 << 20))
    huge = np.broadcast_to(np.zeros(1), (1 << 20,))  # 8 MiB as a copy, 8 bytes as a view
    with pytest.raises(CircuitError, match=r"'big' \(a private copy of its value\).*over the budget"):
        C.Array(huge, name="big")
