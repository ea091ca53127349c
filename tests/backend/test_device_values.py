"""Array and Scalar values cross to the device once: every evaluation path (evaluate, Compiled,
evaluate_batched, value_and_grad, Eager) reuses one device value per tensor and evaluation dtype,
a patched circuit uploads only what changed, and the device values die with their tensors."""

from __future__ import annotations

import gc
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from circuits import Add, Array, Eager, Einsum, GeneralFunction, Scalar, Symbol
from circuits.backend import Lowered, compile, evaluate, evaluate_batched, value_and_grad
from circuits.backend.lower import binding
from circuits.backend.lower.binding import precision
from circuits.backend.lower.program import Skeleton
from circuits.backend.tiers import configure


def weights(seed: int, shape=(4, 3)):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def model(seed: int, tag: str):
    """``exp(w1 @ x) * 2 + b`` with a gather from a token Array: Arrays of floats and ints,
    a Scalar, and a Symbol ``x``."""
    w1 = Array(weights(seed), name=f"w1_{tag}")
    b = Array(weights(seed + 1, (4,)), name=f"b_{tag}")
    table = Array(weights(seed + 2, (5, 4)), name=f"table_{tag}")
    toks = Array(np.array([0, 4, 2], np.int64), name=f"toks_{tag}")
    x = Symbol((3,), name=f"x_{tag}")
    h = GeneralFunction("exp", Einsum.from_spec("ab,b->a", w1, x))
    rows = GeneralFunction("gen_index_at_0", table, toks)  # [3, 4]
    scaled = Einsum.from_spec("a,->a", h, Scalar(2.0))
    return Einsum.from_spec("a,ta->", Add(scaled, b), rows, name=f"out_{tag}"), x


@pytest.fixture(autouse=True)
def _kernels_only():
    """These tests are about the values JAX's kernels read: no numpy first run
    (``tiers.host``), which reads the host values."""
    with configure(host=False):
        yield


@pytest.fixture
def uploads(monkeypatch):
    """Every value ``binding._upload`` sends to the device, in order."""
    seen = []
    real = binding._upload

    def counted(value):
        seen.append(np.asarray(value))
        return real(value)

    monkeypatch.setattr(binding, "_upload", counted)
    binding._small.clear()  # nothing known by content from earlier tests
    return seen


def test_the_guard_sees_a_host_array_handed_to_jit():
    # The checks below rely on JAX's transfer guard catching host arrays given to a jitted
    # function (what every call did before device values): make sure it does here.
    f = jax.jit(lambda a: a + 1)
    f(jnp.ones(3))
    with jax.transfer_guard_host_to_device("disallow_explicit"):
        with pytest.raises(Exception, match="host-to-device"):
            f(np.ones(3, np.float32))


def test_repeated_calls_send_nothing_to_the_device():
    circuit, x = model(0, "repeat")
    x_value = jax.device_put(np.ones(3, np.float32))
    x_rows = jax.device_put(np.ones((2, 3), np.float32))
    w1 = circuit.get("w1_repeat")[0]
    f = compile(circuit)
    expected = evaluate(circuit, {x: x_value})

    def every_path():
        return [
            f({x: x_value}),
            evaluate(circuit, {x: x_value}),
            evaluate_batched(circuit, {x: x_rows})[0],
            value_and_grad(circuit, w1, {x: x_value})[0],
        ]

    first = every_path()  # uploads the Arrays and Scalars once, compiles
    with jax.transfer_guard_host_to_device("disallow_explicit"):
        again = every_path()
    for value in first + again:
        np.testing.assert_allclose(value, expected, rtol=1e-6)


def test_the_uncompiled_skeleton_runs_on_the_device_values(monkeypatch):
    # The skeleton run uncompiled dispatches ops one by one (their Python constants cross to the
    # device per op, so the transfer guard does not apply): the Arrays and Scalars it is handed
    # are device values.
    circuit, x = model(5, "eager")
    seen = []
    real = Skeleton.run

    def recording(self, args, *rest, **kw):
        seen.append(list(args))
        return real(self, args, *rest, **kw)

    monkeypatch.setattr(Skeleton, "run", recording)
    inputs = {x: np.ones(3, np.float32)}
    expected = evaluate(circuit, inputs, mode="ops")  # op by op through kernels (not a Skeleton)
    np.testing.assert_allclose(Lowered(circuit).run(inputs, mode="uncompiled")[0], expected, rtol=1e-6)
    assert len(seen) == 1
    for args in seen:
        leaves = [a for a in args if not isinstance(a, np.ndarray)]  # the Symbol's value is numpy
        assert len(leaves) == len(args) - 1 == 5
        assert all(isinstance(a, jax.Array) for a in leaves)


def test_each_tensor_is_uploaded_once_across_calls_and_paths(uploads):
    circuit, x = model(10, "once")
    inputs = {x: np.ones(3, np.float32)}
    w1 = circuit.get("w1_once")[0]
    for _ in range(3):
        evaluate(circuit, inputs)
        compile(circuit)(inputs)
        evaluate_batched(circuit, {x: np.ones((2, 3), np.float32)})
        value_and_grad(circuit, w1, inputs)
        Eager(circuit, inputs)(circuit)
    arrays = [a for a in uploads if a.ndim > 0]
    assert len(arrays) == 4  # w1, b, table, toks: each once
    scalars = [a for a in uploads if a.ndim == 0]
    assert len(scalars) <= 1  # Scalar(2.0), unless another test uploaded it first


def test_a_patched_circuit_uploads_only_the_patched_array(uploads):
    circuit, x = model(20, "patch")
    inputs = {x: np.ones(3, np.float32)}
    f = compile(circuit)
    f(inputs)
    before = len(uploads)
    new_b = weights(99, (4,))
    patched = circuit.update("b_patch", lambda n: Array(new_b, name=n.name))
    g = compile(patched)
    for _ in range(2):
        got = g(inputs)
        evaluate_batched(patched, {x: np.ones((2, 3), np.float32)})
    assert len(uploads) == before + 1
    np.testing.assert_array_equal(uploads[-1], new_b)
    # the patched value is used, not the original one
    assert not np.allclose(got, f(inputs))


def test_a_renamed_array_shares_its_upload(uploads):
    w = Array(weights(30), name="w_rename")
    evaluate(GeneralFunction("exp", w))
    count = len(uploads)
    evaluate(GeneralFunction("exp", w.rename("w_other_name")))
    assert len(uploads) == count


def test_each_precision_has_its_own_device_value(uploads):
    w = Array(weights(40), name="w_precision")
    circuit = GeneralFunction("exp", w)
    single = evaluate(circuit)
    double = evaluate(circuit, dtype="float64")
    assert single.dtype == np.float32 and double.dtype == np.float64
    np.testing.assert_allclose(double, np.exp(w.value.astype(np.float64)))
    assert evaluate(circuit, dtype="float64").dtype == np.float64
    evaluate(circuit)
    assert [a.dtype for a in uploads] == [np.float32, np.float64]


def test_device_values_die_with_their_tensor():
    gc.collect()
    before = binding.device_cache_info()["arrays"]
    node = Array(weights(50), name="w_dies")
    evaluate(GeneralFunction("exp", node))
    assert binding.device_cache_info()["arrays"] == before + 1
    del node
    gc.collect()
    assert binding.device_cache_info()["arrays"] == before


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="aliasing is what the CPU backend does")
def test_on_the_cpu_the_device_value_is_the_host_value():
    # no second copy of a tensor on the CPU: the device value aliases the Array's own buffer
    node = Array(weights(60, (64, 64)), name="w_alias")
    device = binding.leaf_value(node, "float32", [])
    assert node.value.ctypes.data % 64 == 0
    assert device.unsafe_buffer_pointer() == node.value.ctypes.data


def test_threads_share_one_upload(uploads):
    node = Array(weights(80, (8, 8)), name="w_threads")
    circuit = GeneralFunction("exp", node)
    evaluate(circuit)  # compiled once; the device value is dropped below, the code stays
    binding._on_device.clear()
    binding._small.clear()  # nor by content
    del uploads[:]
    results, barrier = [], threading.Barrier(4)

    def work():
        barrier.wait()
        results.append(evaluate(circuit, cache=False))  # not the cached value: each binds the Array

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r in results:
        np.testing.assert_allclose(r, np.exp(node.value), rtol=1e-6)
    assert len(results) == 4
    assert binding.device_cache_info()["arrays"] >= 1
    value = binding.leaf_value(node, "float32", [])
    assert all(binding.leaf_value(node, "float32", []) is value for _ in range(3))


def test_small_arrays_of_equal_contents_share_one_upload(uploads):
    # what an intervention makes anew each time (a zeroed head) crosses to the device once
    first = Array(np.zeros((4, 3), np.float32), name="zero_a")
    second = Array(np.zeros((4, 3), np.float32), name="zero_b")
    other = Array(np.ones((4, 3), np.float32), name="ones")
    assert first.value is not second.value
    a = binding.leaf_value(first, "float32", [])
    assert binding.leaf_value(second, "float32", []) is a
    assert len(uploads) == 1
    b = binding.leaf_value(other, "float32", [])
    np.testing.assert_array_equal(np.asarray(b), 1.0)
    assert len(uploads) == 2
    # another precision, shape or dtype of the same bytes is its own value
    with precision("float64"):
        assert binding.leaf_value(first, "float64", []).dtype == np.float64
    flat = Array(np.zeros(12, np.float32), name="zero_flat")
    assert binding.leaf_value(flat, "float32", []).shape == (12,)
    assert len(uploads) == 4
    np.testing.assert_array_equal(evaluate(GeneralFunction("exp", second)), 1.0)
