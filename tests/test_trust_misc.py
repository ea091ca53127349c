"""Trust, second round (issue 21): integer inputs beyond the int dtype they are computed in
(item 4), race-free interning of function-family members (item 8), an empty tensor whose other
axes overflow (item 17).  Third round (issue 33): finite floats beyond the float dtype an input is
computed in (item 7)."""

import re
import sys
import threading

import numpy as np
import pytest

import circuits as C
from circuits.functions import registry
from circuits.interp import ablate, patch
from circuits.models import attn_only, random_weights, tokens_symbol

BIG = [2**32 + 3, 2**40, 2**31, -(2**31) - 1]


@pytest.fixture(scope="module")
def model():
    w = random_weights(vocab=11, d_model=8, n_heads=2, head_size=4, n_layers=1, max_positions=16)
    return attn_only(w, tokens_symbol(6), unique_names=True)


def _tokens(big):
    t = np.arange(6)
    t[2] = big
    return t


@pytest.mark.parametrize("big", BIG)
def test_tokens_beyond_int32_do_not_wrap_in_evaluate(model, big):
    # 2**32 + 3 used to give exactly the loss of token 3 (the cast to int32 wrapped it first)
    with pytest.raises(C.EvaluationError, match=f"holds {big}, outside the int32"):
        C.evaluate(model, {"toks_int_var": _tokens(big)})
    assert np.isfinite(C.evaluate(model, {"toks_int_var": _tokens(3)})).all()


@pytest.mark.parametrize("big", BIG[:2])
def test_tokens_beyond_int32_do_not_wrap_in_ablation_data_or_patch(model, big):
    base = {"toks_int_var": np.arange(6)}
    with pytest.raises(C.EvaluationError, match=str(big)):
        ablate(model, "b0.a", "mean", data={"toks_int_var": _tokens(big)[None]})
    with pytest.raises(C.EvaluationError, match=str(big)):
        C.evaluate(patch(model, "b0.a", {"toks_int_var": _tokens(big)}), base)


def test_big_ints_are_exact_in_float64_evaluation():
    # with 64-bit ints nothing wraps: the value is read as given (here out of the vocabulary)
    x = C.Symbol((2,), name="i", dtype="int64")
    big = np.array([2**40, 1])
    assert C.evaluate(C.Rearrange(x, "a -> a"), {"i": big}, dtype="float64").tolist() == big.tolist()
    with pytest.raises(C.EvaluationError, match="int32"):
        C.evaluate(C.Rearrange(x, "a -> a"), {"i": big})


def test_uint64_inputs_beyond_int64_are_refused():
    x = C.Symbol((1,), name="i", dtype="int64")
    with pytest.raises(C.EvaluationError, match=str(2**63)):
        C.evaluate(C.Rearrange(x, "a -> a"), {"i": np.array([2**63], np.uint64)}, dtype="float64")


# ---------------------------------------------------------------------------- item 8
def test_a_family_member_met_by_two_threads_at_once_is_one_spec(monkeypatch):
    # Deterministic: both threads are inside the factory together, so both build a spec; the
    # registry must hand both the same one (nodes over two specs of one name would be twins).
    barrier = threading.Barrier(2, timeout=10)
    real = registry.lookup("topk_mask_1")

    def factory(m):
        barrier.wait()
        return registry.FunctionSpec(name=m.group(0), shape_rule=real.shape_rule, jax=real.jax,
                                     core_ndim=1)

    import re

    monkeypatch.setattr(registry, "_FAMILIES", registry._FAMILIES + [(re.compile(r"race_demo_(\d+)"), factory,
                                                                      "race_demo_<k>")])
    got = [None, None]

    def look(i):
        got[i] = registry.lookup("race_demo_7")

    threads = [threading.Thread(target=look, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got[0] is got[1] is registry.lookup("race_demo_7")


def test_threads_parsing_a_new_family_name_build_one_node():
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible
    try:
        for k in range(20):
            size = 70_001 + k  # a member no other test has made
            text = f"'t' GeneralFunction topk_mask_{size}\n  'x' [{size + 1}] Symbol"
            out = [None] * 8
            barrier = threading.Barrier(8, timeout=10)

            def work(i, text=text, out=out, barrier=barrier):
                barrier.wait()
                out[i] = C.parse(text)

            threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert all(o is out[0] for o in out), f"twin nodes for topk_mask_{size}"
    finally:
        sys.setswitchinterval(switch)


# ---------------------------------------------------------------------------- item 17
@pytest.mark.parametrize("make", [
    lambda: C.Scalar(1.0, (0, 2**62)),
    lambda: C.Add(C.Scalar(1.0, (0, 2**62)), C.Scalar(2.0)),
    lambda: C.parse("'a' [0,4611686018427387904] Scalar 1"),
])
def test_an_empty_tensor_whose_other_axes_overflow_is_refused_clearly(make):
    # it passed the budget (0 bytes), then numpy raised a raw ValueError ("array is too big")
    with pytest.raises(C.EvaluationError, match="empty, but its other axes"):
        C.evaluate(make())


def test_an_empty_tensor_within_range_still_evaluates():
    assert C.evaluate(C.Scalar(1.0, (0, 2**40))).shape == (0, 2**40)


# ---------------------------------------------------------------------------- issue 33 item 7
_X = C.Symbol((3,), name="x")
_DOUBLE = C.Einsum.from_spec("a,->a", _X, C.Scalar(2.0))
_OVERFLOW = [np.array([1.0, 1e300, 2.0]), np.array([-1e39, 0.0, 0.0])]


def _binders():
    compiled = C.compile(_DOUBLE)
    return {
        "evaluate": lambda v: C.evaluate(_DOUBLE, {"x": v}),
        "jit": lambda v: C.evaluate(_DOUBLE, {"x": v}, mode="jit"),
        "compile": lambda v: compiled({"x": v}),
        "batched": lambda v: C.evaluate_batched(_DOUBLE, {"x": v[None]})[0],
        "eager": lambda v: C.evaluate(_DOUBLE, {"x": v}, mode="eager"),
        "Eager": lambda v: C.Eager(_DOUBLE, {"x": v})(_DOUBLE),
    }


@pytest.mark.parametrize("path", ["evaluate", "jit", "compile", "batched", "eager", "Eager"])
@pytest.mark.parametrize("value", _OVERFLOW, ids=["1e300", "-1e39"])
def test_a_finite_float_that_overflows_the_input_dtype_is_refused(path, value):
    run = _binders()[path]
    assert run(np.array([1.0, 2.0, 3.0])).tolist() == [2.0, 4.0, 6.0]  # the signature seen once, fine
    big = float(value[np.argmax(np.abs(value))])
    with pytest.raises(C.EvaluationError, match=re.escape(f"'x' [3] Symbol holds {big!r}, beyond the largest float32")):
        run(value)


def test_inf_and_nan_given_as_such_pass_and_float64_keeps_big_values():
    out = C.evaluate(_DOUBLE, {"x": np.array([np.inf, -np.inf, np.nan])})
    assert out[0] == np.inf and out[1] == -np.inf and np.isnan(out[2])
    assert C.evaluate(_DOUBLE, {"x": np.array([1e300, 0, 0])}, dtype="float64")[0] == 2e300
    assert C.evaluate(_DOUBLE, {"x": np.array([3e38, 0, 0])})[0] == np.inf  # the computation's own overflow
    with pytest.raises(C.EvaluationError, match="holds 70000, beyond the largest float16"):
        C.evaluate(_DOUBLE, {"x": np.array([70000, 1, 2])}, dtype="float16")
