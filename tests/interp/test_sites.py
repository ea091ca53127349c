"""Sites: unique names from the builder, Inside (what a site dominates), ambiguity errors with
paths, & short-circuiting, and site/input errors of the interventions."""

import collections

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import circuits as C
from circuits.interp import ablate, patch
from circuits.models import attn_only, random_weights
from circuits.select import Glob, Inside, Name, Pred, Regex
from circuits.testing import dags
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
    from benchmarks.numpy_attn_only import forward

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


def test_replace_within_equals_replace(weights):
    """The ancestors-only rebuild over the kept walk gives ``traversal.replace``'s circuit: one
    site, several, nested ones (a site under another), the root itself, and a node from outside
    the circuit (the plain replace then)."""
    from circuits.interp.sites import replace_within

    c = attn_only(weights, TOKS, unique_names=True)
    zero = {n: C.Array(np.zeros(n.shape, np.float32), name=f"{n.name}.z")
            for n in (c.get_unique(s) for s in ("b0.a.head1", "b1.a.head0", "b1.a", "b0.a.head1.a.k"))}
    cases = [[k] for k in zero] + [list(zero)]
    for keys in cases:
        mapping = {k: zero[k] for k in keys}
        assert replace_within(c, mapping).hash == C.traversal.replace(c, mapping).hash
    root = C.Array(np.zeros(c.shape, np.float32), name="root.z")
    assert replace_within(c, {c: root}) is root
    outside = C.Array(np.ones(3, np.float32), name="nowhere")
    assert replace_within(c, {outside: root}) is c


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dags(max_nodes=16), st.data())
def test_replace_within_equals_replace_on_generated_dags(c, data):
    """On generated DAGs (shared subtrees, nested sites), the rebuild that walks up from the
    replaced nodes to their readers gives ``traversal.replace``'s circuit, node for node."""
    from circuits.interp.sites import replace_within

    order = C.toposort(c)
    picked = data.draw(st.lists(st.sampled_from(order), min_size=1, max_size=3, unique_by=lambda n: n.hash))
    mapping = {n: C.Array(np.full(n.shape, 0.5 if n.dtype.startswith("float") else 0, n.dtype), name=f"r{i}")
               for i, n in enumerate(picked)}  # of the node's dtype: an index stays an int
    assert replace_within(c, mapping).hash == C.traversal.replace(c, mapping).hash


def test_patches_from_remembered_copies_equal_fresh_ones(weights):
    """Copies remembered per circuit and source are reused only for that source: patching
    from A, then B, then A again gives each the very circuit a patch built with nothing
    remembered gives; the remembered copies go with the circuit."""
    import gc

    from circuits.interp import sites

    a, b = (TOKS + 3) % 31, (TOKS * 5) % 31
    c = attn_only(weights, TOKS + 0, unique_names=True)
    order = [(s, src) for src in (a, b, a) for s in ("b1.a.head0", "b0.a.head2", "b1.a.head2", "b1.a.head0.a.q")]
    got = [patch(c, s, {"toks_int_var": src}).hash for s, src in order]
    assert len(sites._REMEMBERED[c]) == 2  # one table per source
    for (s, src), h in zip(order, got):
        sites._REMEMBERED.clear()
        assert patch(c, s, {"toks_int_var": src}).hash == h
    before = len(sites._REMEMBERED)
    del c
    gc.collect()
    assert len(sites._REMEMBERED) == before - 1


def test_replace_within_a_deep_chain():
    from circuits.interp.sites import replace_within

    x = C.Array(np.ones(2, np.float32), name="x")
    node = x
    for i in range(DEPTH):
        node = C.Einsum.from_spec("a->a", node, name=f"n{i}")
    bottom = C.toposort(node)[1]
    out = replace_within(node, {bottom: C.Array(np.zeros(2, np.float32), name="zero")})
    assert out.hash == C.traversal.replace(node, {bottom: C.Array(np.zeros(2, np.float32), name="zero")}).hash
