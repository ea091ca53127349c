"""Sites: unique names from the builder, Inside (what a site dominates), ambiguity errors with
paths, & short-circuiting, and site/input errors of the interventions."""

import collections

import numpy as np
import pytest

import circuits as C
from circuits.interp import ablate, patch
from circuits.models import attn_only, random_weights
from circuits.select import Glob, Inside, Name, Pred, Regex
from tests.deep import DEPTH

SMALL = dict(vocab=31, d_model=16, n_heads=3, head_size=8, n_layers=2, max_positions=16)
TOKS = np.arange(10) * 7 % 31


@pytest.fixture(scope="module")
def weights():
    return random_weights(0, **SMALL)


def test_unique_names_name_every_node_once(weights):
    c = attn_only(weights, TOKS, unique_names=True)
    nodes = C.toposort(c)
    count = collections.Counter(n.name for n in nodes if n.name is not None)
    assert [name for name, k in count.items() if k > 1] == []
    # ... and the default circuit has shared names, which is what unique_names fixes
    default = collections.Counter(n.name for n in C.toposort(attn_only(weights, TOKS)) if n.name is not None)
    assert default["a.k"] == 6 and default["ln.y"] == 3 and default["a.qk_input"] == 2
    names = {n.name for n in nodes}
    for l in range(2):
        assert f"a{l}.qk_input" in names and f"a{l}.norm.ln.y" in names
        for h in range(3):
            for inner in ("a.q", "a.k", "a.v", "a.attn_probs", "a.comb_v", "a.c.head_size"):
                assert f"b{l}.a.head{h}.{inner}" in names
    assert "final.norm.ln.rsqrt" in names and "final.call" in names
    # same computation, only the names differ
    assert C.strip_names(c) == C.strip_names(attn_only(weights, TOKS))


def test_inside_finds_a_sites_own_node_and_not_other_layers(weights):
    plain = attn_only(weights, TOKS)
    unique = attn_only(weights, TOKS, unique_names=True)
    for l in range(2):
        for h in range(3):
            for inner in ("a.k", "a.q", "a.v", "a.attn_probs"):
                got = plain.get_unique(Inside(f"b{l}.a.head{h}", inner))
                want = unique.get_unique(f"b{l}.a.head{h}.{inner}")
                assert C.strip_names(got) == C.strip_names(want)
    # the method spelling is the same matcher
    assert plain.get(Name("a.k").inside("b1.a.head2")) == plain.get(Inside("b1.a.head2", "a.k"))
    # shared inputs are not a head's own: the layer's norm, qk input, the mask bias
    for shared in ("a1.norm", "a.qk_input", "a.score_neg_inf_bias", "b0"):
        assert plain.get(Inside("b1.a.head2", shared), require=False) == []
    # a whole layer dominates its heads and, through the residual stream, layer 0
    assert len(plain.get(Inside("b1", "a.k"))) == 6
    assert len(plain.get(Inside("b0", "a.k"))) == 3


def test_inside_is_dominance_checked_against_a_brute_force_oracle(weights):
    # Y dominates n iff removing Y disconnects n from the root: an oracle written from scratch.
    c = attn_only(weights, TOKS)
    nodes = C.toposort(c)
    for site_name in ("b1.a.head0", "b0.a", "a0.norm"):
        site = c.get_unique(site_name)
        reach, stack = set(), [c]
        while stack:  # nodes reachable from the root without passing through the site
            n = stack.pop()
            if n.hash in reach or n.hash == site.hash:
                continue
            reach.add(n.hash)
            stack.extend(n.children)
        below = {n.hash for n in C.toposort(site)}
        want = {n.hash for n in nodes if n.hash in below and n.hash not in reach}
        assert C.select.Inside(site_name, Pred(lambda n: True)).matches(c) == want


def test_ambiguity_error_shows_each_matchs_path(weights):
    c = attn_only(weights, TOKS)
    with pytest.raises(C.SelectionError) as e:
        c.get_unique("a.k")
    text = str(e.value)
    assert "matched 6 nodes" in text
    for l in range(2):
        for h in range(3):
            assert f"'b{l}.a.head{h}' > 'a.comb_v'" in text
    assert "'t.loss' > 'll'" in text and "Inside(" in text


def test_and_short_circuits(weights):
    c = attn_only(weights, TOKS)
    calls = []

    def costly(n):
        calls.append(n)
        return True

    assert c.get(Name("nope") & Pred(costly), require=False) == [] and calls == []
    assert len(c.get(Name("b0") & Pred(costly))) == 1 and calls


def test_inside_on_a_deep_chain(deep_chain):
    # iterative: the top dominates the whole chain
    assert [n.name for n in deep_chain.get(Inside(deep_chain.name, "x"))] == ["x"]
    named = len(deep_chain.get(Regex(r"^n\d+$")))
    assert named == len(range(1, DEPTH, 3)) and len(deep_chain.get(Inside(deep_chain.name, Regex(r"^n\d+$")))) == named


def test_site_errors_name_the_site(weights):
    c = attn_only(weights, TOKS, unique_names=True)
    with pytest.raises(C.SelectionError, match=r"site 'b1.a.head9'.*matched 0 nodes.*did you mean 'b1.a.head[0-2]'"):
        ablate(c, "b1.a.head9")
    with pytest.raises(C.SelectionError, match=r"site Glob\('b1.a.head\?'\).*matched 3 nodes"):
        ablate(c, Glob("b1.a.head?"))
    with pytest.raises(C.SelectionError, match="not a node of the circuit"):
        ablate(c, C.Scalar(2.0))
    with pytest.raises(C.SelectionError, match="site 3"):
        ablate(c, 3)
    with pytest.raises(C.SelectionError, match="no site given"):
        ablate(c, [])


def test_source_errors_name_the_input(weights):
    c = attn_only(weights, TOKS, unique_names=True)
    with pytest.raises(C.SelectionError, match=r"no input \(Array or Symbol\) named 'toks'.*did you mean 'toks_int_var'"):
        patch(c, "b1.a.head0", {"toks": TOKS})
    with pytest.raises(C.ShapeError, match=r"source\['toks_int_var'\] has shape \[9\].*needs \[10\]"):
        patch(c, "b1.a.head0", {"toks_int_var": TOKS[:9]})
    with pytest.raises(C.CircuitError, match=r"has dtype float64.*needs ints"):
        patch(c, "b1.a.head0", {"toks_int_var": TOKS.astype(float)})
    with pytest.raises(C.CircuitError, match=r"has dtype int64.*needs floats"):
        patch(c, "b1.a.head0", {"t.w.unembed": np.zeros((31, 16), np.int64)})
    with pytest.raises(C.CircuitError, match=r"site 'b0.a.head0'.*does not depend on any input in source"):
        patch(c, "b0.a.head0", {"t.w.unembed": np.zeros((31, 16), np.float32)})
    with pytest.raises(C.SelectionError, match="not an input"):
        patch(c, "b1.a.head0", {C.Array(np.zeros(3, np.float32), name="z"): np.zeros(3)})
    with pytest.raises(C.ShapeError, match=r"data\['toks_int_var'\].*needs \[batch, 10\]"):
        ablate(c, "b1.a.head0", "mean", data={"toks_int_var": TOKS})
    with pytest.raises(C.CircuitError, match="needs data="):
        ablate(c, "b1.a.head0", "mean")
    with pytest.raises(C.CircuitError, match="kind='max'"):
        ablate(c, "b1.a.head0", "max")
    with pytest.raises(C.CircuitError, match=r"site 'b0.a.head0'.*does not depend on any input in data"):
        ablate(c, "b0.a.head0", "mean", data={"t.w.unembed": np.zeros((2, 31, 16), np.float32)})


def test_targets_are_read_from_their_own_array(weights):
    from tests.models.numpy_attn_only import forward

    other = (TOKS * 3 + 1) % 31
    c = attn_only(weights, TOKS, targets=other)
    assert c.get_unique("targets_int_var").value.tolist() == other.tolist()
    np.testing.assert_allclose(C.evaluate(c, dtype="float64"), forward(weights, TOKS, targets=other), rtol=1e-5)
    with pytest.raises(C.CircuitError, match="targets has shape"):
        attn_only(weights, TOKS, targets=other[:5])
    with pytest.raises(C.CircuitError, match="targets must be a 1-d int array"):
        attn_only(weights, TOKS, targets=other.astype(float))


def test_many_sites_resolve_as_each_alone_and_report_the_bad_one(weights):
    from circuits.interp.sites import resolve_site, resolve_sites

    c = attn_only(weights, TOKS, unique_names=True)
    d = attn_only(weights, TOKS)  # names shared between heads
    node = C.toposort(c)[5]
    sites = [f"b{l}.a.head{h}" for l in range(2) for h in range(3)] + [node, Name("b1.a.head0")]
    assert [n for _, n in resolve_sites(c, sites)] == [resolve_site(c, s) for s in sites]
    with pytest.raises(C.SelectionError, match="'b1.a.head9'.*matched 0 nodes"):
        resolve_sites(c, ["b0.a.head0", "b1.a.head9"])
    shared = collections.Counter(n.name for n in C.toposort(d) if n.name is not None).most_common(1)[0][0]
    with pytest.raises(C.SelectionError, match="matched [2-9]"):
        resolve_sites(d, ["b0.a.head0", shared])
    with pytest.raises(C.SelectionError, match="not a node"):
        resolve_sites(c, ["b0.a.head0", C.Scalar(7.0)])
