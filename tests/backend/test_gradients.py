"""Gradients with respect to any node: against analytic formulas and against finite differences
of the circuit with that node replaced by a perturbed constant."""

from __future__ import annotations

import numpy as np
import pytest

from circuits import Add, Array, Einsum, EvaluationError, GeneralFunction, Index, Scalar, Symbol, evaluate, replace
from circuits.backend import grad, value_and_grad

rng = np.random.default_rng(0)
XV = rng.standard_normal((2, 3))
X = Symbol((2, 3), name="x")
W = Array(rng.standard_normal((3, 4)), name="w")
PRE = Einsum.from_spec("ab,bc->ac", X, W, name="pre")
SQ = Einsum.from_spec("ac,ac->", PRE, PRE, name="sq")  # sum(pre ** 2)


def test_analytic_gradients_of_a_quadratic():
    pre = XV @ W.numpy()
    value, g = value_and_grad(SQ, ["pre", W, X], {"x": XV}, dtype="float64")
    np.testing.assert_allclose(value, (pre**2).sum(), rtol=1e-12)
    np.testing.assert_allclose(g["pre"], 2 * pre, rtol=1e-12)
    np.testing.assert_allclose(g[W], XV.T @ (2 * pre), rtol=1e-12)
    np.testing.assert_allclose(g[X], 2 * pre @ W.numpy().T, rtol=1e-12)
    # float32 by default, and one node gives one array
    g32 = grad(SQ, PRE, {"x": XV})
    assert g32.dtype == np.float32 and g32.shape == (2, 4)
    np.testing.assert_allclose(g32, 2 * pre, rtol=1e-5)


@pytest.mark.parametrize("mode", ["jit", "eager"])
def test_cotangent_weights_a_vector_output(mode):
    cot = rng.standard_normal((2, 4))
    g = grad(PRE, W, {"x": XV}, cotangent=cot, dtype="float64", mode=mode)
    np.testing.assert_allclose(g, XV.T @ cot, rtol=1e-12)
    # no cotangent: gradient of the sum
    np.testing.assert_allclose(grad(PRE, W, {"x": XV}, dtype="float64", mode=mode), XV.T @ np.ones((2, 4)), rtol=1e-12)


def test_gradient_with_respect_to_a_shared_node_counts_every_use():
    h = GeneralFunction("tanh", PRE, name="h")
    c = Einsum.from_spec("ac,ac->", h, Add(h, Scalar(1.0)))  # sum(h * (h + 1))
    hv = np.tanh(XV @ W.numpy())
    np.testing.assert_allclose(grad(c, h, {"x": XV}, dtype="float64"), 2 * hv + 1, rtol=1e-12)


def finite_difference(circuit, node, inputs, eps=1e-6):
    """d sum(circuit) / d node by central differences, the node replaced by a constant (every
    bumped circuit has one structure: one compilation serves them all)."""
    base = evaluate(circuit, inputs, dtype="float64", also=[node], mode="eager")[1][node]
    out = np.zeros_like(base)
    for pos in np.ndindex(*base.shape):
        vals = []
        for sign in (1, -1):
            bumped = base.copy()
            bumped[pos] += sign * eps
            vals.append(evaluate(replace(circuit, {node: Array(bumped)}), inputs, dtype="float64").sum())
        out[pos] = (vals[0] - vals[1]) / (2 * eps)
    return out


def test_gradient_matches_finite_differences_through_nonlinear_ops():
    tok = Array(np.array([1, 3]), name="tok")
    logits = Add(Einsum.from_spec("ab,bc->ac", GeneralFunction("gelu", X), W), Scalar(0.1), name="logits")
    logp = GeneralFunction("log_softmax", logits, name="logp")
    picked = GeneralFunction("gen_index_at_0_batch_x_c", logp, tok, name="picked")
    loss = Einsum.from_spec("a,->", picked, Scalar(-0.5), name="loss")
    inputs = {"x": XV}
    nodes = [logits, logp, W, X]
    got = grad(loss, nodes, inputs, dtype="float64")
    for node in nodes:
        np.testing.assert_allclose(got[node], finite_difference(loss, node, inputs), rtol=1e-6, atol=1e-8)


def test_gradient_errors():
    toks = Symbol((2,), name="toks", dtype="int64")
    gathered = GeneralFunction("gen_index_at_0_c", W, toks)
    s = Einsum.from_spec("ab->", gathered)
    with pytest.raises(EvaluationError, match="with respect to 'toks'.*not a float"):
        grad(s, toks, {"toks": np.array([0, 1])})
    with pytest.raises(EvaluationError, match="cannot differentiate .*int64"):
        grad(Index(Array(np.arange(4)), (slice(1, None),)), Array(np.arange(4)))
    with pytest.raises(EvaluationError, match="cotangent has shape"):
        grad(PRE, W, {"x": XV}, cotangent=np.ones(3))
    with pytest.raises(EvaluationError, match="wrt"):
        grad(PRE, [], {"x": XV})
