"""Values that depend on shapes alone are found by a variant (``tiers.values.shape_key``), and
broadcast Scalars are kept: a layer-0 ablation of the shipped model makes 57 kernel calls, not 63."""

from __future__ import annotations

import numpy as np
import pytest

import circuits as C
from circuits import Add, GeneralFunction, Scalar, Symbol
from circuits.backend import clear_cache
from circuits.backend.tiers import op_by_op
from circuits.backend.tiers.values import shape_key


@pytest.fixture(autouse=True)
def fresh():
    clear_cache()
    yield
    clear_cache()


class Calls:
    """Counts kernel calls while installed (broadcasts of Scalars included)."""

    def __init__(self, monkeypatch):
        self.n = 0
        real_kernel, real_broadcast = op_by_op.kernel, op_by_op.broadcast_kernel

        def counting(fn):
            def call(*args):
                self.n += 1
                return fn(*args)

            return call

        monkeypatch.setattr(op_by_op, "kernel", lambda node, fdt: counting(real_kernel(node, fdt)))
        monkeypatch.setattr(op_by_op, "broadcast_kernel", lambda shape: counting(real_broadcast(shape)))


def test_a_norms_divisor_is_found_by_shape_after_a_change_upstream(monkeypatch):
    x = Symbol((2, 3), name="x")

    def norm(v):  # v / last_dim_size(v), the layer norm's divisor
        size = GeneralFunction("reciprocal", GeneralFunction("last_dim_size", v))
        return C.Einsum.from_spec("ab,a->ab", v, size)

    clean, changed = norm(GeneralFunction("exp", x)), norm(GeneralFunction("sin", x))
    xv = np.arange(6.0, dtype=np.float32).reshape(2, 3)
    calls = Calls(monkeypatch)
    np.testing.assert_allclose(C.evaluate(clean, {"x": xv}, mode="ops"), np.exp(xv) / 3, rtol=1e-6)
    first = calls.n
    calls.n = 0
    np.testing.assert_allclose(C.evaluate(changed, {"x": xv}, mode="ops"), np.sin(xv) / 3, rtol=1e-6)
    assert first == 4 and calls.n == 2  # sin and the product: the divisor is known by shape
    # another shape or dtype is its own value
    y = Symbol((2, 4), name="y")
    np.testing.assert_allclose(C.evaluate(norm(GeneralFunction("sin", y)), {"y": np.ones((2, 4))}, mode="ops"),
                               np.full((2, 4), np.sin(1.0) / 4), rtol=1e-6)
    np.testing.assert_allclose(C.evaluate(changed, {"x": xv}, dtype="float64", mode="ops"),
                               np.sin(xv.astype(np.float64)) / 3, rtol=1e-12)


def test_shape_keys_are_none_where_the_value_reads_values():
    x, y = Symbol((2, 3), name="x"), Symbol((2, 3), name="y")
    assert shape_key(GeneralFunction("exp", x)) is None
    assert shape_key(Add(GeneralFunction("last_dim_size", x), GeneralFunction("last_dim_size", GeneralFunction("exp", y)), GeneralFunction("exp", Symbol((2,), name="z")))) is None
    assert shape_key(Scalar(2.0)) != shape_key(Scalar(3.0))
    a = GeneralFunction("reciprocal", GeneralFunction("last_dim_size", x))
    b = GeneralFunction("reciprocal", GeneralFunction("last_dim_size", y))
    assert shape_key(a) == shape_key(b) is not None


def test_shipped_model_ablations_make_fewer_kernel_calls_and_agree_across_tiers(monkeypatch):
    from circuits.interp import ablate
    from circuits.models import attn_only, induction_weights

    c = attn_only(induction_weights(), np.random.default_rng(0).integers(1, 64, 34), unique_names=True)
    calls = Calls(monkeypatch)
    C.evaluate(c, mode="ops")
    counts = {}
    for site in ("b0.a.head1", "b0.a.head3", "b1.a.head2"):
        a = ablate(c, site)
        calls.n = 0
        value = C.evaluate(a, mode="ops")
        counts[site] = calls.n
        np.testing.assert_allclose(value, C.evaluate(a, mode="jit", cache=False), rtol=1e-5, atol=1e-6)
    # 63 and 17 before: the norms' divisors recomputed and the Scalars broadcast again each time
    assert counts == {"b0.a.head1": 57, "b0.a.head3": 57, "b1.a.head2": 14}, counts
