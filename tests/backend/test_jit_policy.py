"""One jit policy and one compile cache for every evaluation path: ``evaluate``, ``compile``,
``evaluate_batched`` and ``grad``/``value_and_grad`` all decide jit-or-eager the same way
(``tiers.maybe_jit``) and reuse compiled code for patched circuits of the same structure."""

from __future__ import annotations

import ast
import pathlib

import numpy as np
import pytest

import circuits.backend
from circuits import Add, Array, Einsum, GeneralFunction, Scalar, Symbol, evaluate
from circuits.backend import cache_stats, evaluate_batched, grad, value_and_grad

BACKEND = pathlib.Path(circuits.backend.__file__).parent


def compilations():
    return cache_stats()["compilations"]


def patched(seed: int, rows: int = 5):
    """The same structure for every seed (odd shapes only this module uses), other values."""
    r = np.random.default_rng(seed)
    w = Array(r.standard_normal((rows, 13)).astype(np.float32), name=f"w{seed}")
    x = Symbol((13,), name="x_policy")
    h = GeneralFunction("tanh", Add(Einsum.from_spec("ab,b->a", w, x), Scalar(float(seed))), name="h")
    return Einsum.from_spec("a,a->", h, h, name="out"), w


def numpy_grad(w, x, shift):
    h = np.tanh(w @ x + shift)
    return np.outer(2 * h * (1 - h**2), x)


XV = np.linspace(-1, 1, 13).astype(np.float32)


def test_repeated_grads_of_patched_circuits_compile_once():
    before = compilations()
    for seed in range(4):
        circuit, w = patched(seed)
        np.testing.assert_allclose(grad(circuit, w, {"x_policy": XV}, mode="jit"), numpy_grad(w.numpy(), XV, seed),
                                   rtol=1e-4, atol=1e-5)
    assert compilations() - before <= 1
    # value_and_grad with the same (unweighted) wrt slot is the same compiled function
    circuit, w = patched(9)
    hits = cache_stats()["hits"]
    value_and_grad(circuit, w, {"x_policy": XV}, mode="jit")
    assert compilations() - before <= 1 and cache_stats()["hits"] == hits + 1


def run_evaluate(circuit, w, mode):
    return evaluate(circuit, {"x_policy": XV}, mode=mode)


def run_batched(circuit, w, mode):
    return evaluate_batched(circuit, {"x_policy": np.stack([XV, -XV])}, mode=mode)


def run_grad(circuit, w, mode):
    return grad(circuit, w, {"x_policy": XV}, mode=mode)


PATHS = pytest.mark.parametrize("run", [run_evaluate, run_batched, run_grad], ids=["evaluate", "batched", "grad"])


# evaluate, evaluate_batched and grad tier by repetition (a new structure runs op by op whatever
# its size): tests/backend/test_incremental.py, tests/backend/test_batched_ops.py


@PATHS
def test_eager_mode_never_compiles(run):
    circuit, w = patched(30)
    before = compilations()
    run(circuit, w, "ops")
    assert compilations() == before


# ------------------------------------------------------------------ one home for each concept
def _sources():
    return {str(p.relative_to(BACKEND)): ast.parse(p.read_text()) for p in sorted(BACKEND.rglob("*.py"))}


def test_no_private_name_is_imported_across_backend_modules():
    private = [
        f"{name}: from {node.module} import {alias.name}"
        for name, tree in _sources().items()
        for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module != "__future__"
        for alias in node.names if alias.name.startswith("_")
    ]
    assert private == []


def test_jit_lives_in_compiling_and_the_jit_policy_in_tiers():
    found = {}
    for name, tree in _sources().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr == "jit" and ast.unparse(node) == "jax.jit":
                found.setdefault("jax.jit", set()).add(name)
            if isinstance(node, ast.Name) and node.id in ("JIT_MAX_OPS", "is_cached", "use_jit"):
                found.setdefault(node.id, set()).add(name)
    assert found["jax.jit"] == {"cache/compiling.py"}
    assert found["JIT_MAX_OPS"] == {"tiers/policy.py"}
    assert found["use_jit"] == {"tiers/policy.py"} and found["is_cached"] == {"cache/compiled.py", "tiers/policy.py"}
