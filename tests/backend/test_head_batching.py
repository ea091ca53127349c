"""Per-head batching (``circuits.backend.lower.head_batching``): sums of per-head subcircuits become one
computation over a head axis, with the same value.  Oracles: the plain-numpy evaluator of
``tests/nodes/oracle.py`` and the heads evaluated one by one and summed in numpy."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

import circuits as C
from circuits.backend.lower.head_batching import batch_heads, has_head_sums
from circuits.check import check
from circuits.models import attn_only, random_weights
from circuits.testing.strategies import CLOSED_TYPES, dags
from tests.backend.numpy_oracle import numpy_evaluate

ALL = slice(None)


def _small_model(unique_names=False, n_layers=2):
    w = random_weights(3, vocab=13, d_model=8, n_heads=3, head_size=4, n_layers=n_layers, max_positions=16)
    toks = np.random.default_rng(1).integers(0, 13, 9)
    return attn_only(w, toks, unique_names=unique_names), w


def _count(circuit, t):
    return sum(type(n) is t for n in C.toposort(circuit))


def test_seed_model_heads_become_one_einsum_per_projection_with_the_same_value():
    c, _ = _small_model()
    (b,), _ = batch_heads([c])
    # per layer, 3 heads x 7 einsums -> 7 batched ones (the sum over heads folded into the last)
    assert _count(c, C.Einsum) - _count(b, C.Einsum) == 2 * (3 * 7 - 7)
    assert _count(c, C.Add) - _count(b, C.Add) == 2 * (3 * 1 + 1 - 1)  # attn_scores per head, b{l}.a
    assert not has_head_sums(C.toposort(b))
    np.testing.assert_allclose(C.evaluate(b, dtype="float64", batch_heads=False), numpy_evaluate(c),
                               rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(C.evaluate(c, dtype="float64"), numpy_evaluate(c), rtol=1e-10, atol=1e-10)


def test_compile_batches_by_default_and_not_when_asked():
    c, _ = _small_model()
    on, off = C.compile(c), C.compile(c, batch_heads=False)
    assert len(on.program) < len(off.program) * 0.6
    np.testing.assert_allclose(on(), off(), rtol=1e-5, atol=1e-5)


def test_also_on_head_nodes_still_works():
    c, _ = _small_model(unique_names=True)
    names = ["b0.a.head1", "b1.a.head2.a.attn_probs", "b1.a.head0.a.q", "b0.a"]
    got, extra = C.evaluate(c, dtype="float64", also=names)
    want, want_extra = C.evaluate(c, dtype="float64", also=names, batch_heads=False)
    assert len(C.compile(c, also=names).program) < len(C.compile(c, also=names, batch_heads=False).program)
    np.testing.assert_allclose(got, want, rtol=1e-10)
    for n in names:
        np.testing.assert_allclose(extra[n], want_extra[n], rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(extra[n], numpy_evaluate(c.get_unique(n)), rtol=1e-10, atol=1e-12)


def test_batched_evaluation_batches_heads_too():
    w = random_weights(3, vocab=13, d_model=8, n_heads=3, head_size=4, n_layers=1, max_positions=16)
    from circuits.models import tokens_symbol

    c = attn_only(w, tokens_symbol(9))
    toks = np.random.default_rng(2).integers(0, 13, (4, 9))
    got = C.evaluate_batched(c, {"toks_int_var": toks}, dtype="float64")
    for i in range(4):
        np.testing.assert_allclose(got[i], numpy_evaluate(attn_only(w, toks[i])), rtol=1e-10, atol=1e-10)


def test_a_patched_head_leaves_its_layer_head_by_head_and_stays_correct():
    c, w = _small_model(unique_names=True)
    site = c.get_unique("a0.w.q.head1")
    patched = C.traversal.replace(c, {site: C.Array(np.zeros(site.shape), name="zeros")})
    (b,), _ = batch_heads([patched])
    assert _count(b, C.Einsum) > _count(batch_heads([c])[0][0], C.Einsum)  # layer 0 kept per head
    np.testing.assert_allclose(C.evaluate(patched, dtype="float64"), numpy_evaluate(patched), rtol=1e-10)


def test_heads_not_all_rows_in_order_gather_their_rows():
    x = C.Array(np.random.default_rng(0).standard_normal((3, 4)), name="x")
    w = C.Array(np.random.default_rng(1).standard_normal((5, 2, 4)), name="w")
    heads = [C.Einsum.from_spec("sd,cd->sc", x, C.Index(w, (h, ALL, ALL))) for h in (4, 1, 1)]
    total = C.Add(*heads)
    (b,), _ = batch_heads([total])
    assert _count(b, C.Einsum) == 1
    np.testing.assert_allclose(C.evaluate(b, dtype="float64"), numpy_evaluate(total), rtol=1e-12)


def test_different_computations_are_not_batched():
    x = C.Array(np.ones((3, 4)), name="x")
    w = C.Array(np.ones((2, 4, 4)), name="w")
    a = C.Einsum.from_spec("sd,cd->sc", x, C.Index(w, (0, ALL, ALL)))
    b = C.Einsum.from_spec("sd,dc->sc", x, C.Index(w, (1, ALL, ALL)))
    total = C.Add(a, b)
    assert batch_heads([total])[0][0] is total


def _headify(template, leaves, k, rng):
    """``k`` copies of ``template``, each leaf in ``leaves`` replaced by row ``h`` of a stacked
    ``[k, *shape]`` Array (a weight sliced per head)."""
    # each head's row: the leaf's value scaled by a positive factor (signs kept, so the drawn
    # circuit's functions stay within the bounds their arguments were drawn for)
    stacks = {leaf.hash: C.Array(rng.uniform(0.5, 1.5, (k, *leaf.shape)) * np.asarray(leaf.value, np.float64),
                                 name=f"stack{i}")
              for i, leaf in enumerate(leaves)}
    heads = []
    for h in range(k):
        table = {leaf: C.Index(stacks[leaf.hash], (h,) + (ALL,) * len(leaf.shape), name=f"{leaf.name}.h{h}")
                 for leaf in leaves}
        heads.append(C.traversal.replace(template, table))
    return heads


BATCHABLE_TYPES = ("Array", "Scalar", "Einsum", "Add", "GeneralFunction")


def _check_batching(template, k, data):
    arrays = [n for n in C.toposort(template) if type(n) is C.Array and n.dtype.startswith("float")]
    assume(arrays)
    chosen = data.draw(st.lists(st.sampled_from(arrays), min_size=1, max_size=3, unique_by=lambda n: n.hash))
    heads = _headify(template, chosen, k, np.random.default_rng(data.draw(st.integers(0, 9))))
    total = C.Add(*heads, name="total")
    (b,), kept = batch_heads([total], keep=[heads[-1]])
    event("batched" if b is not total else "left as it was")
    want = sum(numpy_evaluate(h).astype(np.float64) for h in heads)
    got = C.evaluate(b, dtype="float64", batch_heads=False)
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(C.evaluate(kept[heads[-1].hash], dtype="float64"), numpy_evaluate(heads[-1]),
                               rtol=1e-9, atol=1e-9)
    check(b)
    return b is not total


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dags(max_nodes=10, types=BATCHABLE_TYPES), st.integers(2, 4), st.data())
def test_batching_is_value_preserving_on_drawn_circuits(template, k, data):
    # a per-head weight on top: an Einsum over a batched operand, so most draws do batch
    # (about 70%: the rest hold an Add that broadcasts a per-head value up a rank)
    scale = C.Array(np.linspace(0.5, 1.5, int(np.prod(template.shape, dtype=int))).reshape(template.shape),
                    name="per_head")
    letters = "".join(chr(ord("a") + i) for i in range(len(template.shape)))
    _check_batching(C.Einsum.from_spec(f"{letters},{letters}->{letters}", template, scale), k, data)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dags(max_nodes=10, types=CLOSED_TYPES), st.integers(2, 4), st.data())
def test_batching_is_value_preserving_on_drawn_circuits_of_every_node_type(template, k, data):
    _check_batching(template, k, data)


@pytest.mark.parametrize("mode", ["jit", "ops"])
def test_modes_agree(mode):
    c, _ = _small_model()
    np.testing.assert_allclose(C.evaluate(c, mode=mode, dtype="float64"), numpy_evaluate(c), rtol=1e-10)
