"""A first gradient without XLA (issue 35, item 2, backward): in ``mode='auto'`` a backward step
whose kernel is not made yet runs with numpy (``circuits.backend.lower.numpy_vjp``), its kernel
made in the background, as the forward's first run does; ``mode='numpy'`` pins it.  Against the
whole-program tier on drawn circuits, one prompt and over a batch; every built-in function's
numpy vector-Jacobian product against JAX's, ties and zeros included; the shipped model's
attribution and EAP in a fresh process with an empty compilation cache compile nothing on the
calling thread and answer as a warm process does."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import circuits as C
from circuits.backend import last_run, value_and_grad
from circuits.backend.lower.numpy_vjp import numpy_vjp
from circuits.dtypes import is_float
from circuits.functions.registry import lookup, registered_names
from circuits.testing import circuits_with_inputs

from .test_batched_grads import gradient_cases
from .test_numpy_first import LISTEN, fresh_process

FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _close(a, b, dtype):
    tol = dict(rtol=2e-4, atol=2e-5) if dtype == "float32" else dict(rtol=1e-9, atol=1e-11)
    assert np.shape(a) == np.shape(b)
    np.testing.assert_allclose(a, b, **tol, equal_nan=True)


def _stepped_by_numpy(circuit, wrt, fdt) -> bool:
    """Whether some node between ``wrt`` and the root has a numpy backward step."""
    order = C.toposort(circuit)
    on_path = {w.hash for w in wrt}
    for node in order:
        if any(c.hash in on_path for c in node.children) and is_float(node.dtype):
            on_path.add(node.hash)
            need = tuple(i for i, c in enumerate(node.children) if c.hash in on_path)
            if numpy_vjp(node, fdt, need) is not None:
                return True
    return False


@FAST
@given(case=circuits_with_inputs(max_nodes=12, max_depth=5), dtype=st.sampled_from(["float32", "float64"]),
       data=st.data())
def test_numpy_gradients_agree_with_the_whole_program_on_one_prompt(case, dtype, data):
    circuit, inputs = case
    assume(is_float(circuit.dtype))
    floats = [n for n in C.toposort(circuit) if is_float(n.dtype)]
    wrt = data.draw(st.lists(st.sampled_from(floats), min_size=1, max_size=3, unique_by=lambda n: n.hash))
    weights = data.draw(st.sampled_from([None, "drawn"]))
    if weights == "drawn":
        weights = np.random.default_rng(data.draw(st.integers(0, 99))).standard_normal(circuit.shape)
    v_jit, g_jit = value_and_grad(circuit, wrt, inputs, cotangent=weights, dtype=dtype, mode="jit")
    v, g = value_and_grad(circuit, wrt, inputs, cotangent=weights, dtype=dtype, mode="numpy", cache=False)
    assert last_run()["tier"] == "numpy"
    _close(v, v_jit, dtype)
    for node in wrt:
        _close(g[node], g_jit[node], dtype)
    if _stepped_by_numpy(circuit, wrt, dtype):
        assert last_run()["numpy"] > 0


@FAST
@given(case=gradient_cases(), dtype=st.sampled_from(["float32", "float64"]))
def test_numpy_gradients_agree_with_the_whole_program_over_a_batch(case, dtype):
    circuit, feed, wrt, cotangent = case
    v_jit, g_jit = value_and_grad(circuit, wrt, feed, cotangent=cotangent, dtype=dtype, mode="jit")
    v, g = value_and_grad(circuit, wrt, feed, cotangent=cotangent, dtype=dtype, mode="numpy", cache=False)
    _close(v, v_jit, dtype)
    for node in wrt:
        _close(g[node], g_jit[node], dtype)


def _points(spec, rng):
    """Arguments for ``spec``: its domain (positive, bounded), with zeros and ties among them."""
    positive, biggest = spec.bounds.arg(0) if spec.bounds is not None else (False, 4.0)
    biggest = min(biggest or 4.0, 4.0)
    x = rng.uniform(-biggest, biggest, (3, 5))
    x[0, :2] = 0.0  # relu's and abs's kink
    x[1, 1:3] = x[1, 0]  # a tie for max and min
    if positive:
        x = np.abs(x) + 0.05
        if spec.name == "logit":
            x = np.minimum(x, 0.9)
    return x


@pytest.mark.parametrize("name", sorted(n for n in registered_names() if lookup(n).numpy_grad is not None))
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_each_functions_numpy_gradient_is_jaxs(name, dtype):
    import jax

    spec = lookup(name)
    rng = np.random.default_rng(len(name))
    x = _points(spec, rng).astype(dtype)
    with C.backend.precision(dtype):
        y, back = jax.vjp(spec.jax, jax.numpy.asarray(x))
        g = rng.standard_normal(y.shape).astype(dtype)
        (want,) = back(jax.numpy.asarray(g))
    got = spec.numpy_grad(x, spec.numpy(x), g)
    _close(np.asarray(got, dtype), np.asarray(want), dtype)
    if spec.core_ndim == 0:  # a 0-d argument (numpy's arithmetic on it gives scalars)
        one = np.asarray(x[0, 3])
        with C.backend.precision(dtype):
            y1, back1 = jax.vjp(spec.jax, jax.numpy.asarray(one))
            (want1,) = back1(jax.numpy.asarray(np.asarray(g[0, 3])))
        _close(np.asarray(spec.numpy_grad(one, np.asarray(spec.numpy(one)), np.asarray(g[0, 3])), dtype),
               np.asarray(want1), dtype)
    rows = np.stack([g, 2 * g])  # a cotangent with a batch axis more than the argument
    got = spec.numpy_grad(x, spec.numpy(x), rows)
    _close(np.asarray(got, dtype)[1], 2 * np.asarray(want), dtype)


def test_the_selections_add_every_read_back():
    # an Index reading one entry twice, one of ints and slices, a Rearrange repeating, one
    # transposing, a Concat reading a twice, a Scatter,
    # a gather reading entries twice, one counted from the end
    from circuits.nodes.scatter import Scatter

    a = C.Array(np.arange(6, dtype=np.float32).reshape(2, 3), name="sel_a")
    twice = C.Index(a, (slice(None), np.array([0, 2, 0])))
    nodes = [
        twice,
        C.Index(a, (-1, slice(None, None, 2))),
        C.Rearrange(a, "a b -> a b r", r=2),
        C.Rearrange(a, "a b -> b a"),
        C.Concat(a, twice, axis=1),
        Scatter(a, (slice(1, 3), slice(0, 3)), (4, 3)),
        C.GeneralFunction("gen_index_at_1", a, C.Array(np.array([2, -1, 0, 2]), name="sel_at")),
        C.GeneralFunction("gen_index_at_0_batch_x_c", a, C.Array(np.array([2, 0]), name="sel_each")),
        C.GeneralFunction("gen_index_at_-1_batch_x", C.Rearrange(a, "a b -> b a"), C.Array(np.array([-1, 0, 1]), name="sel_neg")),
    ]
    for node in nodes:
        g = np.random.default_rng(0).standard_normal(node.shape).astype(np.float32)
        ids = "abcd"[: len(node.shape)]
        root = C.Einsum.from_spec(f"{ids},{ids}->", node, C.Array(g, name=f"w_{node.hash.hex()[:6]}"))
        _, want = value_and_grad(root, [a], mode="jit")
        _, got = value_and_grad(root, [a], mode="numpy", cache=False)
        assert last_run()["numpy"] > 0, node.line()
        _close(got[a], want[a], "float32")


# ------------------------------------------------------------------ a fresh process, empty cache
_SCRIPT = LISTEN + textwrap.dedent("""
    import circuits as C
    from circuits.interp import attribute, discover, edges
    from circuits.models import attn_only, induction_weights, tokens_symbol
    sym = tokens_symbol(34)
    loss = attn_only(induction_weights(), sym, unique_names=True)
    rng = np.random.default_rng(5)
    clean, corrupt = rng.integers(1, 64, (6, 34)), rng.integers(1, 64, (6, 34))
    heads = [f"b{l}.a.head{h}" for l in range(2) for h in range(4)]
    out = {}
    scores = attribute(loss, heads, {sym: corrupt}, inputs={sym: clean})
    out["attribution"] = {"run": C.backend.tiers.last_run(), "xla_here": sum(1 for t in seen if t == me),
                          "value": [float(scores[h].sum()) for h in heads]}
    before = len(seen)
    weights = np.full(loss.shape, -1.0 / loss.shape[-1], np.float32)
    eap = discover(loss, {sym: corrupt}, weights, method="eap", inputs={sym: clean})
    out["eap"] = {"xla_here": sum(1 for t in seen[before:] if t == me),
                  "value": [float(eap[e]) for e in list(edges(loss))[:60]]}
    out["jax"] = "jax" in sys.modules
    print(json.dumps(out))
""")


def _fresh(cache, how):
    return fresh_process(_SCRIPT, cache, how)


def test_a_fresh_process_computes_its_first_gradients_without_compiling(tmp_path):
    empty = _fresh(tmp_path / "cache", "count")
    for what in ("attribution", "eap"):
        assert empty[what]["xla_here"] == 0, what
    assert empty["attribution"]["run"]["kernels"]["compiled"] == 0
    warm = _fresh(tmp_path / "cache", "count")  # the same folder: what the first one kept
    for what in ("attribution", "eap"):
        assert warm[what]["xla_here"] == 0, what
        _close(np.array(empty[what]["value"]), np.array(warm[what]["value"]), "float32")
    # and as the whole programs compute them, here
    from circuits.interp import attribute, discover, edges
    from circuits.models import attn_only, induction_weights, tokens_symbol

    sym = tokens_symbol(34)
    loss = attn_only(induction_weights(), sym, unique_names=True)
    rng = np.random.default_rng(5)
    clean, corrupt = rng.integers(1, 64, (6, 34)), rng.integers(1, 64, (6, 34))
    heads = [f"b{layer}.a.head{h}" for layer in range(2) for h in range(4)]
    scores = attribute(loss, heads, {sym: corrupt}, inputs={sym: clean}, mode="jit")
    _close(np.array(empty["attribution"]["value"]), np.array([float(scores[h].sum()) for h in heads]), "float32")
    weights = np.full(loss.shape, -1.0 / loss.shape[-1], np.float32)
    eap = discover(loss, {sym: corrupt}, weights, method="eap", inputs={sym: clean}, mode="jit")
    _close(np.array(empty["eap"]["value"]), np.array([float(eap[e]) for e in list(edges(loss))[:60]]), "float32")
