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


@pytest.mark.parametrize("mode", ["jit", "ops"])
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
    base = evaluate(circuit, inputs, dtype="float64", also=[node], mode="ops")[1][node]
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


def ops_match_jit(out, wrt, inputs, fdt):
    """Value and gradients op by op equal the whole program's; ``(op-by-op value, gradients,
    tolerance)``."""
    v_ops, g_ops = value_and_grad(out, wrt, inputs, dtype=fdt, mode="ops")
    v_jit, g_jit = value_and_grad(out, wrt, inputs, dtype=fdt, mode="jit")
    tol = dict(rtol=1e-10, atol=1e-12) if fdt == "float64" else dict(rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(v_ops, v_jit, **tol)
    for k in wrt:
        np.testing.assert_allclose(g_ops[k], g_jit[k], **tol, err_msg=str(k))
    return v_ops, g_ops, tol


@pytest.mark.parametrize("fdt", ["float32", "float64"])
def test_op_by_op_picks_and_broadcasting_adds_match_the_whole_program_and_numpy(fdt):
    """The reverse sweep's kernel-free cases (``circuits.backend.tiers.backward``): int picks of one
    child, the same position picked twice, negative and several int axes; Adds broadcasting a
    leading axis, a size-1 axis and a scalar; a Tag; against ``jax.grad`` of the whole program
    (``mode='jit'``) and an analytic numpy gradient."""
    from circuits import Tag

    xv = rng.standard_normal((3, 2, 4))
    x = Symbol((3, 2, 4), name="x_picks")
    rows = [Index(x, (0,)), Index(x, (-1,)), Index(x, (0,), name="again"), Index(x, (1, slice(None), 2))]
    b = Symbol((2, 1), name="b_picks")
    bv = rng.standard_normal((2, 1))
    s = Symbol((), name="s_picks")
    summed = Add(rows[0], rows[1], rows[2], b, s, Index(x, (2, -1)), name="summed")   # [2, 4]
    tagged = Tag(summed, uuid="00000000-0000-0000-0000-000000000002")
    out = Einsum.from_spec("ab,a,ab->", tagged, rows[3], tagged)        # sum_a r3[a] * sum_b summed[a,b]^2
    inputs = {x: xv, b: bv, s: np.array(0.5)}
    wrt = [x, b, s, "summed"]
    _, g_ops, tol = ops_match_jit(out, wrt, inputs, fdt)
    # numpy: d out / d summed = 2 r3[a] summed[a, b]; then through the picks and broadcasts
    sm = 2 * xv[0] + xv[-1] + bv + 0.5 + xv[2, -1][None, :]
    r3 = xv[1, :, 2]
    d_sum = 2 * r3[:, None] * sm
    gx = np.zeros_like(xv)
    gx[0] += 2 * d_sum
    gx[-1] += d_sum
    gx[2, -1] += d_sum.sum(0)
    gx[1, :, 2] += (sm ** 2).sum(1)
    np.testing.assert_allclose(g_ops["summed"], d_sum, **tol)
    np.testing.assert_allclose(g_ops[x], gx, **tol)
    np.testing.assert_allclose(g_ops[b], d_sum.sum(1, keepdims=True), **tol)
    np.testing.assert_allclose(g_ops[s], d_sum.sum(), **tol)


@pytest.mark.parametrize("fdt", ["float32", "float64"])
def test_op_by_op_heads_run_as_rows_and_match_the_whole_program(fdt):
    """Per-head nodes of one operation and shapes run as rows of one kernel in the reverse sweep
    (``circuits.backend.tiers.backward``): heads picked from one stacked value (a position picked twice),
    a weight shared by every head, per-head weights, a nonlinearity; against ``jax.grad`` of the
    whole program (``mode='jit'``) and numpy."""
    heads = 4
    xv = rng.standard_normal((heads, 3, 5))
    wv = rng.standard_normal((heads, 5, 2))
    sv = rng.standard_normal((5, 5))
    x = Symbol((heads, 3, 5), name="x_rows")
    w = Symbol((heads, 5, 2), name="w_rows")
    shared = Symbol((5, 5), name="s_rows")
    outs = []
    for h in list(range(heads)) + [1]:       # head 1 twice: its position picked twice
        name = f"h{len(outs)}"
        xh = Index(x, (h,), name=f"{name}.x")
        mixed = GeneralFunction("tanh", Einsum.from_spec("ad,de->ae", xh, shared, name=f"{name}.mix"), name=f"{name}.act")
        outs.append(Einsum.from_spec("ae,ef->af", mixed, Index(w, (h,), name=f"{name}.w"), name=name))
    total = Einsum.from_spec("af,af->", Add(*outs, name="sum"), Add(*outs, name="sum"))
    inputs = {x: xv, w: wv, shared: sv}
    wrt = [x, w, shared, "h2"]
    v_ops, g_ops, tol = ops_match_jit(total, wrt, inputs, fdt)
    # numpy: total = sum(S^2), S = sum over the picks of tanh(x_h @ s) @ w_h
    picks = list(range(heads)) + [1]
    acts = [np.tanh(xv[h] @ sv) for h in picks]
    big_s = sum(a @ wv[h] for a, h in zip(acts, picks))
    np.testing.assert_allclose(v_ops, (big_s ** 2).sum(), **tol)
    d_s = 2 * big_s
    gx, gw, gs = np.zeros_like(xv), np.zeros_like(wv), np.zeros_like(sv)
    for a, h in zip(acts, picks):
        gw[h] += a.T @ d_s
        d_pre = (d_s @ wv[h].T) * (1 - a ** 2)
        gx[h] += d_pre @ sv.T
        gs += xv[h].T @ d_pre
    np.testing.assert_allclose(g_ops[x], gx, **tol)
    np.testing.assert_allclose(g_ops[w], gw, **tol)
    np.testing.assert_allclose(g_ops[shared], gs, **tol)
    np.testing.assert_allclose(g_ops["h2"], d_s, **tol)
