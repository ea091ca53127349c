"""bind and fill_random: values for (placeholder) Arrays, checked against plain numpy."""

import numpy as np
import pytest

import circuits as C
from circuits import Array, CircuitError, ShapeError
from circuits.io.values import bind, fill_random, gather_index_bounds, placeholders
from circuits.text import parse, to_text

# Three gathers: 'toks' indexes a 10-row and (through an Index) a 3-row table; 'pos' picks one of
# 5 entries per batch row.
GATHERS = """
'out' Add
  'emb' GeneralFunction gen_index_at_0_c
    'table' [10,4] Array 0a
    'toks' [6] Array 0b
  'rows' GeneralFunction gen_index_at_0_c
    'small' [3,4] Array 0c
    'shuffled' [6] Index [[0,1,0,1,5,4]]
      'toks'
  'pick' GeneralFunction gen_index_at_0_batch_x_c
    'scores' [6,5,4] Array 0e
    'pos' [6] Array 0f
"""


def _oracle(v):
    toks, pos = v["toks"], v["pos"]
    emb = v["table"][toks]
    rows = v["small"][toks[[0, 1, 0, 1, 5, 4]]]
    pick = v["scores"][np.arange(6), pos, :]
    return emb + rows + pick


def _values(circuit):
    return {a.name: np.asarray(a.value) for a in C.toposort(circuit) if isinstance(a, Array)}


@pytest.fixture(scope="module")
def gathers():
    return parse(GATHERS)


def test_parsed_placeholders_have_inferred_dtypes(gathers):
    assert {a.name: a.dtype for a in placeholders(gathers)} == {
        "table": "float32", "toks": "int64", "small": "float32", "scores": "float32", "pos": "int64",
    }


def test_bind_all_and_evaluate(gathers):
    rng = np.random.default_rng(0)
    values = {
        "table": rng.standard_normal((10, 4)).astype(np.float32),
        "small": rng.standard_normal((3, 4)).astype(np.float32),
        "scores": rng.standard_normal((6, 5, 4)).astype(np.float32),
        "toks": np.array([0, 2, 1, 2, 1, 0]),
        "pos": np.array([4, 0, 1, 2, 3, 4]),
    }
    bound = bind(gathers, values)
    assert placeholders(bound) == []
    np.testing.assert_allclose(C.evaluate(bound), _oracle(values), rtol=1e-6)
    # Binding keeps names and structure: only the Array hashes change.
    strip_hash = lambda t: [l.rsplit(" Array ", 1)[0] for l in t.split("\n")]  # noqa: E731
    assert strip_hash(to_text(bound)) == strip_hash(to_text(gathers))


def test_gather_bounds_take_the_smallest_use(gathers):
    bounds = {n.name: b for n in C.toposort(gathers) for h, b in gather_index_bounds(gathers).items()
              if n.hash == h}
    assert bounds == {"toks": 3, "pos": 5}


def test_fill_random_is_in_range_finite_and_deterministic(gathers):
    filled = fill_random(gathers, seed=3)
    v = _values(filled)
    assert placeholders(filled) == []
    assert v["toks"].dtype == np.int64 and 0 <= v["toks"].min() and v["toks"].max() < 3
    assert v["pos"].dtype == np.int64 and 0 <= v["pos"].min() and v["pos"].max() < 5
    assert v["table"].dtype == np.float32
    out = C.evaluate(filled)
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out, _oracle(v), rtol=1e-5, atol=1e-6)
    again = _values(fill_random(gathers, seed=3))
    other = _values(fill_random(gathers, seed=4))
    for name in v:
        np.testing.assert_array_equal(v[name], again[name])
    assert not np.array_equal(v["table"], other["table"])


def test_fill_random_values_belong_to_the_placeholder(gathers):
    # The same placeholder gets the same value filled alone or inside the whole circuit.
    whole = _values(fill_random(gathers, seed=1))
    table = [a for a in placeholders(gathers) if a.name == "table"][0]
    alone = fill_random(table, seed=1)
    np.testing.assert_array_equal(alone.value, whole["table"])


def test_fill_random_float_scale_and_dtypes():
    c = parse("""
's' Add
  'w' [400,100] Array 01
  'd' [100] Array 02
  'v' [] Array 03
""")
    v = _values(fill_random(c))
    assert abs(v["w"].std() - 0.1) < 0.01 and abs(v["w"].mean()) < 0.01
    assert v["v"].shape == ()
    for i, dtype in enumerate(("float64", "float16", "bfloat16", "int32", "uint8", "bool")):
        # (distinct hashes: placeholders with equal name and hash are one node)
        p = Array.placeholder((50, 4), f"0a{i}", name="p", dtype=dtype)
        value = np.asarray(fill_random(p).value)
        assert str(value.dtype) == dtype
        if dtype.startswith(("int", "uint")):
            assert value.min() >= 0 and value.max() < 8  # feeds no gather
        elif dtype == "bool":
            assert 0 < value.sum() < value.size


def test_fill_random_without_placeholders_is_identity():
    a = Array(np.ones(3, np.float32), name="a")
    assert fill_random(a) is a


def test_bind_replaces_real_arrays_and_every_array_of_that_name():
    a1 = Array(np.zeros(2, np.float32), name="a")
    a2 = Array.placeholder((2,), "0123", name="a")
    s = C.Add(a1, a2, name="s")
    new = bind(s, {"a": np.array([1.0, 2.0], np.float32)})
    assert new.children[0] is new.children[1]
    np.testing.assert_array_equal(C.evaluate(new), [2.0, 4.0])


def test_bind_errors(gathers):
    with pytest.raises(CircuitError) as info:
        bind(gathers, {"tabel": np.zeros((10, 4), np.float32)})
    message = str(info.value)
    assert "'tabel'" in message
    for name in ("'pos'", "'scores'", "'small'", "'table'", "'toks'"):
        assert name in message
    with pytest.raises(ShapeError, match=r"shape \[4, 10\]"):
        bind(gathers, {"table": np.zeros((4, 10), np.float32)})
    with pytest.raises(CircuitError, match="int64"):
        bind(gathers, {"table": np.zeros((10, 4), np.int64)})
    with pytest.raises(CircuitError, match="float32"):
        bind(gathers, {"toks": np.zeros(6, np.float32)})
