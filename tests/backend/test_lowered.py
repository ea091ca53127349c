"""``circuits.backend.Lowered``, the backend's door for the layers above it: one binder (every
check ``evaluate`` makes, given leaves included), one jit policy and compile cache (run, vmap),
against numpy."""

from __future__ import annotations

import numpy as np
import pytest

import circuits as C
from circuits.backend import Lowered, cache_stats
from circuits.errors import EvaluationError

R = np.random.default_rng(0)
W = R.standard_normal((5, 7)).astype(np.float32)
EMBED = R.standard_normal((9, 5)).astype(np.float32)


def model(tokens):
    """tanh(embed[tokens] @ W), summed over positions: a gather fed by ``tokens``."""
    e = C.GeneralFunction("gen_index_at_0", C.Array(EMBED, name="embed"), tokens, name="e")
    h = C.GeneralFunction("tanh", C.Einsum.from_spec("pd,dk->pk", e, C.Array(W, name="w")), name="h")
    return C.Einsum.from_spec("pk->k", h, name="out")


def oracle(tokens):
    return np.tanh(EMBED[np.asarray(tokens)] @ W).sum(0)


def test_run_and_vmap_equal_numpy_and_share_the_compile_cache():
    toks = C.Symbol((4,), name="toks", dtype="int64")
    low = Lowered(model(toks))
    at = low.args.index(toks)
    assert len(low) == len(low.program) == 7 and len(low.args) == 3
    batch = R.integers(0, 9, (3, 4))
    for row in batch:
        (value,) = low.run({"toks": row}, mode="ops")
        np.testing.assert_allclose(np.asarray(value), oracle(row), rtol=1e-5, atol=1e-6)
    before = cache_stats()["compilations"]
    args = low.bind({"toks": batch[0]})
    args[at] = batch  # the tokens with a leading axis, the rest shared
    fn = low.vmap([0 if i == at else None for i in range(len(args))], mode="jit")
    (values,) = fn(args)
    np.testing.assert_allclose(np.asarray(values), [oracle(row) for row in batch], rtol=1e-5, atol=1e-6)
    assert low.is_compiled() and cache_stats()["compilations"] == before + 1
    # a patched circuit of the same structure is the same program: compiled already
    other = Lowered(model(C.Symbol((4,), name="other", dtype="int64")))
    assert other.key == low.key and other.is_compiled()


def test_bind_checks_what_evaluate_checks():
    toks = C.Symbol((4,), name="toks", dtype="int64")
    low = Lowered(model(toks))
    for bad, message in [(np.array([0, 1, 2, 9]), "holds index 9, outside"),
                         (np.zeros(3, np.int64), "has shape"),
                         (np.zeros(4, np.float32), "float array cannot be used as indices")]:
        with pytest.raises(EvaluationError, match=message):
            low.bind({"toks": bad})
        with pytest.raises(EvaluationError, match=message):
            C.evaluate(model(toks), {"toks": bad})
    with pytest.raises(EvaluationError, match="unbound Symbol 'toks'"):
        low.run()


def test_given_leaves_are_range_checked_given_computed_values_are_not():
    toks = C.Symbol((4,), name="toks", dtype="int64")
    circuit = model(toks)
    h = circuit.get_unique("h")
    as_leaf = Lowered(circuit, given=[toks])
    with pytest.raises(EvaluationError, match="holds index -10, outside \\[-9, 9\\)"):
        as_leaf.bind(given={toks.hash: np.array([0, 1, 2, -10])})
    (value,) = as_leaf.run(given={toks.hash: np.array([0, 1, 2, 3])})
    np.testing.assert_allclose(np.asarray(value), oracle([0, 1, 2, 3]), rtol=1e-5, atol=1e-6)
    # a given computed node is taken as it is: the program computes only what lies above it
    above = Lowered(circuit, given=[h])
    assert above.args == (h,) and len(above) == 2
    hv = np.tanh(EMBED[[4, 5, 6, 7]] @ W)
    (value,) = above.run(given={h.hash: hv})
    np.testing.assert_allclose(np.asarray(value), hv.sum(0), rtol=1e-5, atol=1e-6)


def test_float64_and_a_bad_dtype():
    x = C.Symbol((3,), name="x")
    (value,) = Lowered(C.Einsum.from_spec("a->", x), "float64").run({"x": [1.0, 2.0, 1e-12]})
    assert value.dtype == np.float64 and float(value) == 3.000000000001
    with pytest.raises(EvaluationError, match="dtype=.int8."):
        Lowered(x, "int8")
