"""circuits.expand: the Expander (rust_circuit's expand_node cases, as shapes its tests assert,
and values against numpy), sampling of DiscreteVars."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import circuits as C
from circuits import Add, Array, Concat, DiscreteVar, Einsum, GeneralFunction, Index, Rearrange, Scalar, Symbol
from circuits.expand import Expander, ExpandError, expand, sample
from circuits.shapes import symbolic_size

RNG = np.random.default_rng(0)


def arr(*shape):
    return Array(RNG.standard_normal(shape))


def sym(*shape, name="0"):
    return Symbol(shape, name=name)


def expand_children(circuit, new_children):
    """rust's expand_node: the node over new children, shapes re-derived."""
    return expand(circuit, dict(zip(circuit.children, new_children)))


@pytest.mark.parametrize("new, shape", [((5, 6), (6, 5)), ((7, 5, 6), (7, 6, 5)), ((8, 7, 5, 6), (8, 7, 6, 5))])
def test_rearrange_follows_new_sizes_and_batches(new, shape):
    a = arr(*new)
    out = expand_children(Rearrange(sym(2, 3), "a b -> b a"), [a])
    assert out.shape == shape
    np.testing.assert_allclose(C.evaluate(out, dtype="float64"), np.swapaxes(a.value, -1, -2))


@pytest.mark.parametrize("new, shape", [((5, 3), (5,)), ((7, 5, 3), (7, 5)), ((8, 7, 5, 3), (8, 7, 5))])
def test_index_follows_a_changed_axis_read_whole(new, shape):
    a = arr(*new)
    out = expand_children(Index(sym(2, 3), (slice(None), 0)), [a])
    assert out.shape == shape
    np.testing.assert_allclose(C.evaluate(out, dtype="float64"), a.value[..., 0])


def test_index_with_a_fixed_slice_of_a_changed_axis_is_refused():
    with pytest.raises(ExpandError, match="fixed entry"):
        expand_children(Index(sym(2, 3), (slice(0, 2), 0)), [arr(5, 3)])


@pytest.mark.parametrize("old, new, shape", [
    (((2, 3, 1), (2, 1, 5)), ((7, 3, 1), (7, 1, 11)), (7, 3, 11)),
    (((2, 3, 1), (2, 1, 5)), ((13, 7, 3, 1), (7, 1, 11)), (13, 7, 3, 11)),
    (((2, 3, 1), (2, 1, 5)), ((4, 13, 7, 3, 1), (7, 1, 11)), (4, 13, 7, 3, 11)),
    (((2, 3, 1), (2, 1, 5)), ((7, 3, 1), (4, 13, 7, 1, 11)), (4, 13, 7, 3, 11)),
    (((3, 1), (2, 1, 5)), ((7, 3, 1), (8, 7, 9, 3, 1)), (8, 7, 9, 3, 1)),
    (((7,), (2, 7)), ((7, 7), (7, 7, 7)), (7, 7, 7)),
    (((8, 7), (1, 1, 1, 1, 1, 7)), ((7, 8, 9), (7, 1, 1, 1, 1, 1, 1)), (7, 1, 1, 1, 1, 8, 9)),
    (((8, 7), (1, 1, 1, 1, 1, 7)), ((2, 4, 7, 8, 9), (7, 1, 1, 1, 1, 1, 1)), (2, 4, 7, 1, 1, 1, 1, 8, 9)),
])
def test_add_batches_align_apart_from_the_core_axes(old, new, shape):
    # rust_circuit's test_expand_node cases: batch axes (the leading axes a replacement adds)
    # align with batch axes, the node's own axes with its own.
    a, b = arr(*new[0]), arr(*new[1])
    out = expand_children(Add(sym(*old[0], name="0"), sym(*old[1], name="1")), [a, b])
    assert out.shape == shape
    # numpy oracle: pad each child's own axes to the output's core rank behind its batch axes
    core = len(shape) - max(len(new[0]) - len(old[0]), len(new[1]) - len(old[1]))
    vals = []
    for (o, n), v in zip(zip(old, new), (a.value, b.value)):
        nb = len(n) - len(o)
        vals.append(v.reshape(n[:nb] + (1,) * (core - len(o)) + n[nb:]))
    np.testing.assert_allclose(C.evaluate(out, dtype="float64"), vals[0] + vals[1])


@pytest.mark.parametrize("old, new", [
    (((2, 3, 1), (2, 1, 5)), ((13, 7, 3, 1), (1, 7, 1, 11))),
    (((), (2, 1, 5)), ((7, 3, 1), (1, 3, 11, 9, 4, 5))),
])
def test_batch_axes_that_do_not_match_are_refused(old, new):
    with pytest.raises(ExpandError, match="batch axes"):
        expand_children(Add(sym(*old[0], name="0"), sym(*old[1], name="1")), [sym(*new[0]), sym(*new[1], name="1")])


@pytest.mark.parametrize("new, shape", [
    (((5, 1, 2, 3), (3, 5)), (5, 1, 2, 5)),
    (((5, 1, 2, 3), (5, 1, 3, 5)), (5, 1, 2, 5)),
    (((5, 7, 2, 3), (7, 3, 5)), (5, 7, 2, 5)),
    (((5, 7, 2, 12), (7, 12, 11)), (5, 7, 2, 11)),
])
def test_einsum_batches(new, shape):
    a, b = arr(*new[0]), arr(*new[1])
    out = expand_children(Einsum.from_spec("ab,bc->ac", sym(2, 3), sym(3, 5, name="1")), [a, b])
    assert out.shape == shape
    np.testing.assert_allclose(C.evaluate(out, dtype="float64"), np.matmul(a.value, b.value), rtol=1e-10)


def test_einsum_refuses_disagreeing_sizes_and_batches():
    e = Einsum.from_spec("ab,bc->ac", sym(2, 3), sym(3, 5, name="1"))
    with pytest.raises(ExpandError):
        expand_children(e, [sym(5, 2, 2, 2), sym(5, 2, 3, 5, name="1")])
    with pytest.raises(ExpandError, match="batch axes"):
        expand_children(e, [sym(5, 3, 2, 3), sym(5, 2, 3, 5, name="1")])


@pytest.mark.parametrize("new, shape", [
    (((5, 2, 3), (5, 4, 3)), (5, 6, 3)),
    (((5, 2, 3), (4, 3)), (5, 6, 3)),
    (((2, 3), (7, 3, 4, 3)), (7, 3, 6, 3)),
    (((3, 2, 3), (7, 3, 4, 3)), (7, 3, 6, 3)),
])
def test_concat_repeats_a_child_missing_batch_axes(new, shape):
    a, b = arr(*new[0]), arr(*new[1])
    out = expand_children(Concat(sym(2, 3), sym(4, 3, name="1"), axis=0), [a, b])
    assert out.shape == shape
    av = np.broadcast_to(a.value, shape[:-2] + a.shape[-2:])
    bv = np.broadcast_to(b.value, shape[:-2] + b.shape[-2:])
    np.testing.assert_allclose(C.evaluate(out, dtype="float64"), np.concatenate([av, bv], axis=-2))


def test_concat_refuses_changing_its_axis_and_bad_batches():
    cat = Concat(sym(2, 3), sym(3, 3, name="1"), axis=0)
    with pytest.raises(ExpandError, match="batch axes"):
        expand_children(cat, [sym(2, 2, 3), sym(3, 3, 3, name="1")])
    with pytest.raises(ExpandError):
        expand_children(cat, [sym(3, 2, 2), sym(3, 3, 3, name="1")])


def test_a_gather_is_not_batched_on_its_table():
    f = GeneralFunction("gen_index_at_0_c", sym(4, 3), Symbol((2,), name="i", dtype="int64"))
    with pytest.raises(ExpandError, match="cannot be batched"):
        expand_children(f, [sym(7, 4, 3), f.children[1]])


def test_symbolic_sizes_resize_leaves_and_the_expander_selects_by_name():
    s0 = symbolic_size(0)
    circ = Add(Symbol((s0, 3), name="first"), Scalar(2.0, (s0, 3)), GeneralFunction("exp", Symbol((s0, 3), name="second")))
    x = arr(4, 3)
    out = expand(circ, {circ.children[0]: x, circ.children[2].children[0]: Array(np.zeros((4, 3)))}, {s0: 4})
    assert out.shape == (4, 3)
    np.testing.assert_allclose(C.evaluate(out, dtype="float64"), x.value + 3.0)
    batched = Expander(("first", lambda s: Symbol((6, s0, 3), name="first")))(circ)
    assert batched.shape == (6, s0, 3)


@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_expanding_a_symbol_into_a_batch_is_the_circuit_per_batch_entry(data):
    """Oracle: the expanded circuit at batch entry i = the original evaluated at input i."""
    from circuits.testing import dags

    circuit = data.draw(dags(shape=(2,), types=[Symbol, Scalar, Add, Einsum, GeneralFunction, Rearrange, Index, Tag,
                                                      C.Module],
                             functions=["exp", "tanh", "softmax", "log_softmax"], max_nodes=8, max_depth=4))
    order = C.toposort(circuit)
    bound = {a.symbol for n in order if type(n) is C.Module for a in n.spec.arg_specs}
    symbols = [n for n in order if type(n) is Symbol and n not in bound]  # the free ones: inputs
    if not symbols:
        return
    target = symbols[0]
    batch = RNG.uniform(0.5, 1.5, (3, *target.shape))
    others = {s: RNG.uniform(0.5, 1.5, s.shape) for s in symbols[1:]}
    out = expand(circuit, {target: Array(batch)})
    got = C.evaluate(out, others, dtype="float64")
    assert got.shape == (3, *circuit.shape)
    for i in range(3):
        want = C.evaluate(circuit, {target: batch[i], **others}, dtype="float64")
        np.testing.assert_allclose(got[i], want, rtol=1e-9, atol=1e-9)


Tag = C.Tag


def test_sample_draws_the_seeded_distribution():
    values = np.array([[0.0, 1.0], [10.0, 11.0], [20.0, 21.0]])
    probs = np.array([0.2, 0.3, 0.5])
    v = DiscreteVar(Array(values, name="vals"), Array(probs, name="p"), name="v")
    w = Symbol((2,), name="w")
    circ = Einsum.from_spec("a,a->a", v, w)
    s = sample(circ, 4000, seed=3)
    assert s.shape == (4000, 2)
    out = C.evaluate(s, {w: np.array([1.0, 2.0])}, dtype="float64")
    # each sample is one row of values, times w; and the rows come in the given proportions
    rows = out[:, 0]
    assert set(np.unique(rows)) <= {0.0, 10.0, 20.0}
    np.testing.assert_allclose(out[:, 1], (rows + 1.0) * 2.0)
    freq = [np.mean(rows == r) for r in (0.0, 10.0, 20.0)]
    np.testing.assert_allclose(freq, probs, atol=0.03)
    # seeded: the same seed, the same draws; another seed, others
    again = C.evaluate(sample(circ, 4000, seed=3), {w: np.array([1.0, 2.0])}, dtype="float64")
    np.testing.assert_array_equal(out, again)
    other = C.evaluate(sample(circ, 4000, seed=4), {w: np.array([1.0, 2.0])}, dtype="float64")
    assert not np.array_equal(out, other)


def test_variables_sharing_probabilities_are_drawn_jointly():
    p = Array(np.full(4, 0.25), name="p")
    a = DiscreteVar(Array(np.arange(4.0)), p, name="a")
    b = DiscreteVar(Array(np.arange(4.0) * 100), p, name="b")
    out = C.evaluate(sample(Add(a, b), 200, seed=0), dtype="float64")
    assert set(np.unique(out)) <= {0.0, 101.0, 202.0, 303.0}


def test_a_discrete_var_alone_does_not_evaluate():
    v = DiscreteVar(Array(np.zeros((2, 3))), Array(np.full(2, 0.5)))
    with pytest.raises(C.EvaluationError, match="sample"):
        C.evaluate(v)
    with pytest.raises(C.ShapeError, match="one probability per sample"):
        DiscreteVar(Array(np.zeros((2, 3))), Array(np.full(3, 0.5)))


@pytest.mark.parametrize("arg_uses_x", [True, False])
def test_expanding_a_module_keeps_it_and_puts_the_new_batch_outside_its_own(arg_uses_x):
    # a Symbol free in a module's body (and maybe in its argument) becomes a batch of 5: the
    # value is [5 (new), 3 (the module's own batch), 2]; the module is kept (rust's expand)
    m = C.fill_random(C.parse(f"""
'm' Module
  'body' Einsum i,i->i
    'x' [2] Symbol
    's' [2] Symbol
  'arg' Add ! 's'
    'r' [3,2] Array rand
    {"'x'" if arg_uses_x else "'y' [2] Scalar 0.5"}
"""), seed=2)
    x = m.get_unique("x")
    xs = Array(np.random.default_rng(0).standard_normal((5, 2)), name="xs")
    out = expand(m, {x: xs})
    xv, r = np.asarray(xs.value), np.asarray(m.get_unique("r").value, np.float64)
    arg = r[None] + (xv[:, None] if arg_uses_x else 0.5)
    want = xv[:, None] * arg
    assert out.shape == (5, 3, 2)
    np.testing.assert_allclose(C.evaluate(out, dtype="float64"), want, rtol=1e-12)
    assert any(type(n) is C.Module for n in C.traversal.toposort(out))
    np.testing.assert_allclose(C.evaluate(expand(C.substitute_all_modules(m), {x: xs}), dtype="float64"), want,
                               rtol=1e-12)
