"""Selection: matchers, combinators, structural matchers, get/get_unique/update/paths."""

import numpy as np
import pytest

import circuits as C
from circuits.models import attn_only, random_weights
from circuits.select import (
    Below,
    ChildOf,
    Depth,
    Glob,
    Is,
    Name,
    Pred,
    Regex,
    Type,
    as_matcher,
    get,
    get_unique,
    names,
    parents,
    paths,
    update,
)
from tests.deep import DEPTH

SMALL = dict(vocab=31, d_model=16, n_heads=2, head_size=8, n_layers=2, max_positions=16)


@pytest.fixture(scope="module")
def model():
    return attn_only(random_weights(0, **SMALL), np.arange(10) % 31)


def test_name_glob_regex_type(model):
    assert {n.name for n in get(model, Name("a.q"))} == {"a.q"}
    assert len(get(model, Name("a.q"))) == 4  # 2 layers x 2 heads, distinct nodes sharing a name
    assert sorted(n.name for n in get(model, Glob("a0.w.?.head1"))) == [
        "a0.w.k.head1", "a0.w.o.head1", "a0.w.q.head1", "a0.w.v.head1"]
    assert {n.name for n in get(model, Regex(r"^b\d$"))} == {"b0", "b1"}
    arrays = get(model, Type("Array"))
    assert all(isinstance(n, C.Array) for n in arrays) and len(arrays) == 19  # 17 weights, the mask and the tokens
    assert get(model, "Array") == arrays  # a type name coerces to Type
    assert get(model, C.Array) == arrays


def test_combinators(model):
    heads = Glob("a*.w.*.head*")
    assert len(get(model, heads & Glob("a1.*"))) == 8
    assert len(get(model, heads | Name("t.w.unembed"))) == 17
    not_arrays = get(model, ~Type("Array"))
    assert len(not_arrays) + 19 == C.count_nodes(model)
    assert [n.name for n in get(model, Pred(lambda n: n.shape == (8, 31)))] == ["t.call", "log_probs"]


def test_below_and_child_of(model):
    # the 'a.q' nodes under layer 1's residual are the ones of both layers (layer 0 feeds layer 1)
    q_in_b0 = get(model, Name("a.q").below(Name("b0")))
    assert len(q_in_b0) == 2
    assert all(n.name == "a.q" for n in q_in_b0)
    probs_children = get(model, ChildOf(Name("a.attn_probs")))
    assert {n.name for n in probs_children} == {"a.attn_scores"}
    assert get(model, ChildOf("t.loss", 1))[0].name == "nll.neg"
    assert isinstance(Below(Name("b1"), Name("b0")), Below)


def test_depth(model):
    top = get(model, Depth(1))
    assert {n.name for n in top} == {"t.loss", "ll", "nll.neg"}
    assert {n.name for n in get(model, Depth(2, 2))} == {"log_probs", "true_toks_int"}


def test_get_unique_errors_name_the_matcher(model):
    with pytest.raises(C.SelectionError, match=r"Name\('a.q'\) matched 4 nodes"):
        get_unique(model, "a.q")
    with pytest.raises(C.SelectionError, match="matched nothing"):
        get(model, Glob("nope*"))
    with pytest.raises(C.SelectionError, match="unknown node type"):
        Type("Einsom")


def test_update_rebuilds_only_ancestors(model):
    unembed = get_unique(model, "t.w.unembed")
    zero = C.Array(np.zeros(unembed.shape, np.float32), name="t.w.unembed")
    new = update(model, "t.w.unembed", lambda n: zero)
    assert new != model
    assert get_unique(new, "t.w.unembed") == zero
    # untouched subtrees are the very same objects
    assert get_unique(new, "b1") is get_unique(model, "b1")
    np.testing.assert_allclose(C.evaluate(new), np.log(31), rtol=1e-5)
    with pytest.raises(C.ShapeError, match="keep the shape"):
        update(model, "t.w.unembed", lambda n: C.Array(np.zeros((2, 2), np.float32)))
    with pytest.raises(C.SelectionError):
        update(model, "does-not-exist", lambda n: n)


def test_paths_and_parents(model):
    ps = paths(model, "idxed_embeds", limit=5)
    assert len(ps) == 5
    for p in ps:
        assert p[0] is model and p[-1].name == "idxed_embeds"
        for parent, child in zip(p, p[1:]):
            assert child in parent.children
    tok = get_unique(model, "toks_int_var")
    assert {p.name for p in parents(model, tok)} == {"input_toks_int", "true_toks_int"}
    assert names(model)[0] == "final.ln.w.bias"  # first leaf in print order


def test_paths_on_exponential_ladder_is_bounded():
    x = C.Symbol((2,), name="x")
    for i in range(60):
        x = C.Add(x, x, name=f"l{i}")
    ps = paths(x, "x", limit=10)
    assert len(ps) == 10 and all(len(p) == 61 for p in ps)


def test_as_matcher_rejects_garbage():
    with pytest.raises(TypeError):
        as_matcher(3.5)
    assert isinstance(as_matcher(["a", "b"]), type(Name("a") | Name("b")))
    assert isinstance(as_matcher(C.Scalar(1.0)), Is)


def test_paths_through_a_match_to_a_match_below_it():
    x = C.Symbol((2,), name="x")
    mid = C.Add(x, name="m")
    top = C.Add(mid, C.Add(mid, name="other"), name="top")
    found = paths(top, Name("m") | Name("x"))
    assert [[n.name for n in p] for p in found] == [
        ["top", "m"], ["top", "m", "x"], ["top", "other", "m"], ["top", "other", "m", "x"]]


@pytest.mark.usefixtures("low_recursion_limit")
def test_paths_on_a_deep_chain_costs_its_depth(deep_chain):
    (p,) = paths(deep_chain, "x")
    assert len(p) == DEPTH + 1 and p[0] is deep_chain and p[-1].name == "x"
