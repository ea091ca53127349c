"""Ablation, activation patching and exact path patching against the independent numpy model
(benchmarks/numpy_attn_only.py, with hooks), in float32 and float64."""

import numpy as np
import pytest

import circuits as C
from benchmarks.numpy_attn_only import forward
from circuits.interp import ablate, patch, path_patch
from circuits.models import attn_only, random_weights, tokens_symbol
from circuits.select import Inside, Regex

SMALL = dict(vocab=31, d_model=16, n_heads=3, head_size=8, n_layers=2, max_positions=16)
CLEAN = np.array([3, 14, 15, 9, 2, 6, 5, 3, 5, 8])
CORRUPT = np.array([3, 27, 18, 28, 1, 8, 28, 4, 5, 8])
BATCH = np.random.default_rng(1).integers(0, 31, (5, 10))
PRECISIONS = {"float32": (np.float32, dict(rtol=2e-4, atol=2e-5)), "float64": (np.float64, dict(rtol=1e-9, atol=1e-11))}


@pytest.fixture(scope="module", params=sorted(PRECISIONS))
def setup(request):
    dtype, tol = PRECISIONS[request.param]
    w = random_weights(0, dtype=dtype, **SMALL)
    return w, request.param, tol


def run(c, fdt, inputs=None):
    # eager: each variant is a new program, and compiling it would cost more than running it
    return C.evaluate(c, inputs, dtype=fdt, mode="ops")


def recorded(w, toks):
    rec = {}
    forward(w, toks, record=rec)
    return rec


def test_zero_ablation(setup):
    w, fdt, tol = setup
    c = attn_only(w, CLEAN, unique_names=True)
    sites = ["b0.a.head1", "b1.a.head2"]
    want = forward(w, CLEAN, hooks={("head", 0, 1): np.zeros_like, ("head", 1, 2): np.zeros_like})
    np.testing.assert_allclose(run(ablate(c, sites), fdt), want, **tol)
    # an attention pattern (a matcher site on the seed's own names) zeroed
    plain = attn_only(w, CLEAN)
    got = run(ablate(plain, Inside("b1.a.head0", "a.attn_probs")), fdt)
    np.testing.assert_allclose(got, forward(w, CLEAN, hooks={("probs", 1, 0): np.zeros_like}), **tol)


def test_mean_and_resample_ablation(setup):
    w, fdt, tol = setup
    c = attn_only(w, CLEAN, unique_names=True)
    rows = [recorded(w, t) for t in BATCH]
    sites = ["b0.a.head2", "b1.a.head0", "b1.a.head1.a.attn_probs"]
    keys = [("head", 0, 2), ("head", 1, 0), ("probs", 1, 1)]
    mean = ablate(c, sites, "mean", data={"toks_int_var": BATCH}, mode="ops")
    assert mean.get_unique("b1.a.head0.mean_ablated").shape == (8, 16)
    hooks = {k: (lambda v, k=k: np.mean([r[k] for r in rows], axis=0)) for k in keys}
    np.testing.assert_allclose(run(mean, fdt), forward(w, CLEAN, hooks=hooks), **tol)
    for seed in (0, 7):
        picks = np.random.default_rng(seed).integers(0, len(BATCH), len(sites))
        resampled = ablate(c, sites, "resample", data={"toks_int_var": BATCH}, seed=seed, mode="ops")
        hooks = {k: (lambda v, k=k, i=i: rows[i][k]) for k, i in zip(keys, picks)}
        np.testing.assert_allclose(run(resampled, fdt), forward(w, CLEAN, hooks=hooks), **tol)
    # a Symbol input works the same way and the result still takes the Symbol
    sym = attn_only(w, tokens_symbol(10), unique_names=True)
    got = run(ablate(sym, sites, "mean", data={"toks_int_var": BATCH}, mode="ops"), fdt, {"toks_int_var": CLEAN})
    np.testing.assert_allclose(got, run(mean, fdt), **tol)


def test_zero_mean_and_resample_share_one_compiled_program(setup):
    w, fdt, tol = setup
    c = attn_only(w, CLEAN, unique_names=True)
    kinds = [ablate(c, "b0.a.head1", kind, data=None if kind == "zero" else {"toks_int_var": BATCH})
             for kind in ("zero", "mean", "resample")]
    # only one Array's value (and name) differs, so one compiled program serves all three
    assert len({C.strip_names(k).hash for k in kinds}) == 3
    C.compile(kinds[0], dtype=fdt)()
    before = C.cache_stats()["compilations"]
    for k in kinds[1:]:
        C.compile(k, dtype=fdt)()
    assert C.cache_stats()["compilations"] == before


def test_activation_patching(setup):
    w, fdt, tol = setup
    c = attn_only(w, CLEAN, unique_names=True)
    src = recorded(w, CORRUPT)
    source = {"toks_int_var": CORRUPT}
    for site, keys in [("b1.a.head1", [("head", 1, 1)]),
                       (["b0.a.head0", "b1.a.head2.a.attn_probs"], [("head", 0, 0), ("probs", 1, 2)])]:
        hooks = {k: (lambda v, k=k: src[k]) for k in keys}
        np.testing.assert_allclose(run(patch(c, site, source), fdt), forward(w, CLEAN, hooks=hooks), **tol)
    # a role input: the k projection of head (1, 0) recomputed from the corrupted tokens
    got = run(patch(c, "b1.a.head0.a.k", source), fdt)
    want = forward(w, CLEAN, hooks={("resid_in", 1, 0, "k"): lambda v: src[("resid", 1)]})
    np.testing.assert_allclose(got, want, **tol)
    # the same with the seed's names and a matcher site
    plain = run(patch(attn_only(w, CLEAN), Inside("b1.a.head0", "a.k"), source), fdt)
    np.testing.assert_allclose(plain, want, **tol)
    # patching everything that reads tokens gives the corrupted run, measured on clean targets
    whole = patch(c, ["b1", "input_toks_int"], source)
    np.testing.assert_allclose(run(whole, fdt), forward(w, CORRUPT, targets=CLEAN), **tol)
    np.testing.assert_allclose(run(attn_only(w, CORRUPT, targets=CLEAN), fdt), run(whole, fdt), **tol)


def test_patched_circuit_names_and_sharing(setup):
    w, fdt, tol = setup
    c = attn_only(w, CLEAN, unique_names=True)
    p = patch(c, "b1.a.head1", {"toks_int_var": CORRUPT})
    names = [n.name for n in C.toposort(p) if n.name is not None]
    assert len(names) == len(set(names))  # no confusing duplicates
    assert "b1.a.head1.source" in names and "toks_int_var.source" in names and "b0.source" in names
    # weights and the clean computation are shared with the clean circuit
    assert p.get_unique("a1.w.q") is c.get_unique("a1.w.q")
    assert p.get_unique("b1.a.head0") is c.get_unique("b1.a.head0")
    # it prints, parses and saves like any circuit
    arrays = {n.name: n.value for n in C.toposort(p) if isinstance(n, C.Array)}
    assert C.bind(C.parse(p.to_text()), arrays) == p


def test_path_patching_head_to_head_each_role(setup):
    w, fdt, tol = setup
    c = attn_only(w, CLEAN, unique_names=True)
    plain = attn_only(w, CLEAN)
    clean, src = recorded(w, CLEAN), recorded(w, CORRUPT)
    source = {"toks_int_var": CORRUPT}
    for sender, receiver in [((0, 1), (1, 2)), ((0, 2), (1, 0))]:
        swap = lambda v, s=sender: v - clean[("head", *s)] + src[("head", *s)]  # noqa: E731
        for role in "qkv":
            name = f"b1.a.head{receiver[1]}.a.{role}"
            got = run(path_patch(c, f"b0.a.head{sender[1]}", name, source), fdt)
            want = forward(w, CLEAN, hooks={("resid_in", 1, receiver[1], role): swap})
            np.testing.assert_allclose(got, want, **tol)
            # the seed's names, receivers as a matcher
            got = run(path_patch(plain, f"b0.a.head{sender[1]}", Inside(f"b1.a.head{receiver[1]}", f"a.{role}"),
                                 source), fdt)
            np.testing.assert_allclose(got, want, **tol)
        # all three roles at once
        got = run(path_patch(c, f"b0.a.head{sender[1]}", [f"b1.a.head{receiver[1]}.a.{r}" for r in "qkv"], source), fdt)
        want = forward(w, CLEAN, hooks={("resid_in", 1, receiver[1], r): swap for r in "qkv"})
        np.testing.assert_allclose(got, want, **tol)


def test_path_patching_head_to_logits(setup):
    w, fdt, tol = setup
    c = attn_only(w, CLEAN, unique_names=True)
    clean, src = recorded(w, CLEAN), recorded(w, CORRUPT)
    source = {"toks_int_var": CORRUPT}
    for l, h in [(1, 0), (0, 2)]:
        direct = {("final_resid",): lambda v, l=l, h=h: v - clean[("head", l, h)] + src[("head", l, h)]}
        # direct path: layer 1's heads keep their clean values
        got = run(path_patch(c, f"b{l}.a.head{h}", "t.call", source, freeze=Regex(r"^b1\.a\.head\d$")), fdt)
        np.testing.assert_allclose(got, forward(w, CLEAN, hooks=direct), **tol)
        # every path to the logits: the sender's total effect, i.e. patching it
        total = run(path_patch(c, f"b{l}.a.head{h}", "t.call", source), fdt)
        np.testing.assert_allclose(total, forward(w, CLEAN, hooks={("head", l, h): lambda v, l=l, h=h: src[("head", l, h)]}),
                                   **tol)
    # for a layer-0 head the direct and total effects differ (the oracle sees layer 1 read it)
    assert not np.allclose(run(path_patch(c, "b0.a.head2", "t.call", source), fdt),
                           run(path_patch(c, "b0.a.head2", "t.call", source, freeze=Regex(r"^b1\.a\.head\d$")), fdt))


def test_path_patch_structure_and_errors(setup):
    w, fdt, tol = setup
    c = attn_only(w, CLEAN, unique_names=True)
    source = {"toks_int_var": CORRUPT}
    p = path_patch(c, "b0.a.head1", "b1.a.head2.a.k", source)
    names = [n.name for n in C.toposort(p) if n.name is not None]
    assert len(names) == len(set(names))
    for n in ("b0.a.head1.source", "b0.a.patched", "b0.patched", "a1.norm.patched", "a1.qk_input.patched",
              "b1.a.head2.a.k.patched"):
        assert n in names
    # the clean sender is still what everyone else reads, and the q of the same head is clean
    assert p.get_unique("b1.a.head2.a.q") is c.get_unique("b1.a.head2.a.q")
    assert p.get_unique("b0.a.head1") is c.get_unique("b0.a.head1")
    with pytest.raises(C.CircuitError, match=r"receiver 'b0.a.head0.a.k'.*does not depend on the sender"):
        path_patch(c, "b0.a.head1", "b0.a.head0.a.k", source)
    with pytest.raises(C.CircuitError, match=r"receiver 'b1.a.head0'.*except through frozen"):
        path_patch(c, "b0.a.head1", "b1.a.head0", source, freeze="a1.norm")
    with pytest.raises(C.CircuitError, match="is the sender itself"):
        path_patch(c, "b0.a.head1", "b0.a.head1", source)
    with pytest.raises(C.SelectionError, match=r"receiver 'b1.a.head2.a.kk'"):
        path_patch(c, "b0.a.head1", "b1.a.head2.a.kk", source)
    with pytest.raises(C.SelectionError, match=r"sender 'b9'"):
        path_patch(c, "b9", "b1.a.head2.a.k", source)
    with pytest.raises(C.CircuitError, match=r"sender 'b0.a.head1'.*does not depend on any input in source"):
        path_patch(c, "b0.a.head1", "b1.a.head2.a.k", {"t.w.unembed": np.zeros((31, 16), np.float32)})


def test_a_saved_intervention_loads_back(setup, tmp_path):
    w, fdt, tol = setup
    c = attn_only(w, CLEAN, unique_names=True)
    p = path_patch(c, "b0.a.head1", ["b1.a.head2.a.k", "t.call"], {"toks_int_var": CORRUPT})
    C.save(p, tmp_path / "p.circuit")
    assert C.load(tmp_path / "p.circuit") == p


def test_patch_on_a_deep_chain(deep_chain):
    x = deep_chain.get_unique("x")
    p = patch(deep_chain, deep_chain.name, {x: np.zeros(2, np.float32)})
    assert p.name == deep_chain.name + ".source" and p.get_unique("x.source").value.tolist() == [0.0, 0.0]
