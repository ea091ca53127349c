"""Kernels kept compiled across processes (circuits.backend.cache.executables): a new process loads a
kernel's executable instead of tracing it and gets the same bits; a corrupt entry, or one that
loads but cannot run, is compiled afresh, never a failed evaluation; a user's function, a traced
call and other argument types take the jitted kernel."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import serialize_executable

from circuits.backend.cache import executables
from circuits.backend.cache.background import wait_for_background
from circuits.backend.cache.cachedir import make_root
from circuits.backend.cache.compiling import counted_jit
from circuits.backend.cache.executables import KeptKernel, executable_info, stable_key
from circuits.backend.cache.persistent import FOLDER

# A forward op by op and a gradient op by op (vector-Jacobian kernels), in a fresh process.
PROBE = r"""
import json, sys
import numpy as np
import circuits as C
from circuits.backend import cache_stats, value_and_grad
from circuits.backend.cache.executables import executable_info
from circuits.backend.cache.background import wait_for_background
x = C.Symbol((3, 4), name='x')
w = C.Array(np.arange(20, dtype=np.float32).reshape(4, 5) / 7, name='w')
h = C.GeneralFunction('tanh', C.Einsum.from_spec('ab,bc->ac', x, w), name='h')
y = C.Einsum.from_spec('ac,ac->', h, h, name='y')
inputs = {'x': np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)}
before = cache_stats()['kernel_compilations']
value = C.evaluate(y, inputs, mode='ops')
_, grads = value_and_grad(y, [h], inputs, mode='ops')
wait_for_background()  # kernels that JAX's cache held are kept in the background
print(json.dumps({"value": np.asarray(value).tobytes().hex(), "grad": np.asarray(grads[h]).tobytes().hex(),
                  "traced": cache_stats()['kernel_compilations'] - before, **executable_info()}))
"""


def run_probe(cache) -> dict:
    env = dict(os.environ, CIRCUITS_COMPILATION_CACHE=str(cache))
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_new_process_loads_the_kernels_traces_none_and_gets_the_same_bits(tmp_path):
    cache = tmp_path / "cache"
    first = run_probe(cache)
    assert first["traced"] > 0 and first["stores"] > 0 and first["loads"] == 0
    assert entries(cache)
    second = run_probe(cache)
    assert second["traced"] == 0 and second["loads"] == first["stores"] and second["rejected"] == 0
    assert (second["value"], second["grad"]) == (first["value"], first["grad"])


def test_corrupt_entries_are_compiled_afresh_and_rewritten(tmp_path):
    cache = tmp_path / "cache"
    first = run_probe(cache)
    found = entries(cache)
    for i, path in enumerate(found):  # garbage, truncated, empty: every kind of bad entry
        data = path.read_bytes()
        path.write_bytes([b"garbage", data[: len(data) // 2], b""][i % 3])
    second = run_probe(cache)
    assert (second["value"], second["grad"]) == (first["value"], first["grad"])
    assert second["rejected"] == len(found) and second["loads"] == 0 and second["stores"] == len(found)
    third = run_probe(cache)
    assert third["loads"] == len(found) and third["traced"] == 0 and third["value"] == first["value"]


def test_with_the_cache_switched_off_nothing_is_kept(tmp_path):
    on, off = run_probe(tmp_path / "cache"), run_probe("off")
    assert off["stores"] == off["loads"] == 0 and off["traced"] > 0
    assert (off["value"], off["grad"]) == (on["value"], on["grad"])


def entries(cache) -> list:
    """The kept executables' entries in the cache folder ``cache`` (not the loading marks' folder)."""
    return sorted(p for p in (cache / FOLDER).iterdir() if p.is_file())


def kernel(fn, tmp_path, key=("test-kernel",)):
    root = make_root(str(tmp_path / "cache"))
    return KeptKernel(fn, counted_jit(fn, "kernel_compilations"), stable_key(key), root)


def test_a_kernel_keeps_one_executable_per_argument_signature(tmp_path):
    k = kernel(lambda a, b: a * 2 + b, tmp_path)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(k(x, x), x * 3)
    got = k(np.arange(4, dtype=np.int32), np.int32(1))  # other dtypes and shapes: another executable
    assert got.dtype == np.int32 and got.tolist() == [1, 3, 5, 7]
    np.testing.assert_array_equal(k(x, 1.0), x * 2 + 1)  # a weakly typed scalar
    wait_for_background()  # one JAX's cache held is kept in the background
    assert len(entries(tmp_path / "cache")) == 3
    again = kernel(lambda a, b: a * 2 + b, tmp_path)  # another process would load all three
    loads = executable_info()["loads"]
    np.testing.assert_array_equal(again(x, x), x * 3)
    assert executable_info()["loads"] == loads + 1


def test_traced_calls_and_other_precisions_take_the_right_path(tmp_path):
    k = kernel(lambda a, b: a @ b, tmp_path)
    a = np.linspace(0, 1, 16, dtype=np.float32).reshape(4, 4)
    plain = np.asarray(k(a, a))
    # inside a trace: tracers go through the jitted kernel
    np.testing.assert_allclose(np.asarray(jax.jit(lambda v: k(v, v))(a)), plain, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(jax.vmap(lambda v: k(v, a))(a[None])[0]), plain, rtol=1e-6)
    # another matmul precision is another trace context: its own executable
    with jax.default_matmul_precision("highest"):
        np.testing.assert_allclose(np.asarray(k(a, a)), a.astype(np.float64) @ a, rtol=1e-6)
    wait_for_background()
    assert len(entries(tmp_path / "cache")) == 2


def test_an_entry_that_loads_but_cannot_run_is_removed_and_compiled_afresh(tmp_path, monkeypatch):
    k = kernel(lambda a: jnp.sin(a), tmp_path)
    x = np.linspace(0, 1, 5, dtype=np.float32)
    want = np.asarray(k(x))
    wait_for_background()
    (entry,) = entries(tmp_path / "cache")

    def broken(*args):
        raise jax.errors.JaxRuntimeError("NOT_FOUND: Function fusion not found")

    monkeypatch.setattr(serialize_executable, "deserialize_and_load", lambda *a, **k: broken)
    rejected = executable_info()["rejected"]
    fresh = kernel(lambda a: jnp.sin(a), tmp_path)
    np.testing.assert_array_equal(np.asarray(fresh(x)), want)
    np.testing.assert_array_equal(np.asarray(fresh(x)), want)  # then the jitted kernel
    assert executable_info()["rejected"] == rejected + 1 and not entry.exists()


def test_a_function_a_user_registers_is_not_kept_a_library_one_is():
    import circuits as C
    from circuits.backend.lower.program import node_key_part
    from circuits.functions import register_elementwise, unregister_function

    x = C.Symbol((3,), name='x')
    key = stable_key((node_key_part(C.GeneralFunction("tanh", x)), (3,), "float32"))
    assert key is not None and b"tanh" in key
    register_elementwise("softsign_test_exec", lambda v: v / (1 + jnp.abs(v)))
    try:
        mine = C.GeneralFunction("softsign_test_exec", x)
        assert stable_key((node_key_part(mine), (3,), "float32")) is None
    finally:
        unregister_function("softsign_test_exec")


@pytest.mark.parametrize("bad", [object(), {"a": 1}, np.zeros(2)])
def test_keys_holding_anything_but_plain_data_are_not_kept(bad):
    assert stable_key(("op", (2,), bad)) is None


# Kernels in float64 (JAX's x64 mode) and at 'highest' matmul precision: settings per thread.
PROBE_PRECISION = r"""
import json
import jax
import numpy as np
import circuits as C
from circuits.backend.cache.executables import executable_info
from circuits.backend.cache.background import wait_for_background
x = C.Symbol((3, 4), name='x')
w = C.Array(np.arange(20, dtype=np.float32).reshape(4, 5) / 7, name='w')
y = C.Add(C.Einsum.from_spec('ab,bc->ac', x, w), C.Add(), name='y')   # Add(): a kernel of no argument
inputs = {'x': np.linspace(-1, 1, 12).reshape(3, 4)}
with jax.default_matmul_precision('highest'):
    value = C.evaluate(y, inputs, dtype='float64', mode='ops', cache=False)
    zero = C.evaluate(C.Add(), dtype='float64', mode='ops', cache=False)
wait_for_background()  # kernels that JAX's cache held are kept in the background
print(json.dumps({"dtype": str(value.dtype), "zero": str(zero.dtype), "value": np.asarray(value).tobytes().hex(),
                  **executable_info()}))
"""


def test_kernels_kept_in_the_background_keep_the_callers_x64_mode_and_precision(tmp_path):
    # the first process compiles and keeps; with the kept folder gone, the second finds the
    # compilations in JAX's cache and keeps them afresh in a background thread, which must trace
    # in float64 at 'highest' as the caller did; the third loads what that thread kept
    def run():
        env = dict(os.environ, CIRCUITS_COMPILATION_CACHE=str(tmp_path / "cache"))
        out = subprocess.run([sys.executable, "-c", PROBE_PRECISION], env=env, capture_output=True, text=True,
                             timeout=300)
        assert out.returncode == 0, out.stderr
        assert "truncated" not in out.stderr, out.stderr  # nothing traced outside x64 mode
        return json.loads(out.stdout.strip().splitlines()[-1])

    first = run()
    assert first["dtype"] == "float64" and first["stores"] > 0
    for path in entries(tmp_path / "cache"):
        path.unlink()
    second = run()
    assert second["stores"] > 0  # kept afresh in the background
    third = run()
    assert third["loads"] > 0 and third["rejected"] == 0 and third["fallbacks"] == 0  # each takes float64
    assert (third["dtype"], third["zero"], third["value"]) == ("float64", "float64", first["value"])


def test_a_kept_executable_depends_on_every_source_of_the_library(monkeypatch):
    """A change to any of the library's sources (a function's lowering in ``circuits.functions``,
    not only the backend's own files) gives kept executables another key: after an upgrade or an
    edit, a stale executable computing the old lowering is never loaded.  (The digest covered
    ``circuits/backend`` alone once the cache moved into ``backend/cache``: a new
    ``log_softmax`` ran the old one's kernels from the disk cache.)"""
    import circuits

    root, files = executables.library_sources()
    assert root == os.path.dirname(os.path.abspath(circuits.__file__))
    names = {os.path.relpath(f, root) for f in files}
    for needed in ("functions/builtins.py", "functions/gather.py", "nodes/einsum.py",
                   "backend/lower/ops.py", "backend/tiers/variants.py"):
        assert needed in names
    before = executables._environment()
    real_open = open
    edited = os.path.join(root, "functions", "builtins.py")

    def open_edited(path, mode="r", *args, **kwargs):
        f = real_open(path, mode, *args, **kwargs)
        if path == edited:
            return __import__("io").BytesIO(f.read() + b"\n# edited\n")
        return f

    monkeypatch.setattr(executables, "_env", [])
    monkeypatch.setattr("builtins.open", open_edited)
    after = executables._environment()
    assert after != before


@pytest.mark.parametrize("other", ["card", "driver"])
def test_an_entry_written_for_another_card_or_driver_is_never_loaded(tmp_path, monkeypatch, other):
    """A cache folder shared between machines (a home folder on a cluster) holds entries written
    for other cards and drivers: each machine's entries live under keys of its own, so another's
    is never loaded, and one found under this machine's name (a copied folder, a planted file)
    fails its key check: removed and compiled afresh, never run."""
    fn = lambda a: jnp.cos(a) * 3  # noqa: E731
    x = np.linspace(0, 1, 7, dtype=np.float32)
    want = np.asarray(kernel(fn, tmp_path)(x))
    wait_for_background()
    (written,) = entries(tmp_path / "cache")
    identity = executables.device_identity()
    assert len(identity) == 6 and identity[2] == jax.devices()[0].device_kind
    if other == "card":
        monkeypatch.setattr(executables, "device_identity", lambda: (*identity[:2], "Another card", *identity[3:]))
    else:
        monkeypatch.setattr(executables, "_driver_version", lambda: "NVRM version: another driver 1.2.3")
    monkeypatch.setattr(executables, "_env", [])
    before = executable_info()
    np.testing.assert_array_equal(np.asarray(kernel(fn, tmp_path)(x)), want)  # compiled here, not loaded
    wait_for_background()
    after = executable_info()
    assert after["loads"] == before["loads"] and after["rejected"] == before["rejected"]
    found = entries(tmp_path / "cache")
    assert written in found and len(found) == 2  # each environment's entry under its own name
    (mine,) = [p for p in found if p != written]
    mine.write_bytes(written.read_bytes())  # the other machine's entry under this one's name
    np.testing.assert_array_equal(np.asarray(kernel(fn, tmp_path)(x)), want)
    wait_for_background()
    final = executable_info()
    assert final["rejected"] == after["rejected"] + 1 and final["loads"] == after["loads"]
    assert mine.read_bytes() != written.read_bytes()  # rewritten with this machine's own executable
