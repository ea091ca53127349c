"""Attribution patching equals the exact linear term, checked by central finite differences of
the independent numpy model along (a_source - a_clean), in float32 and float64."""

import numpy as np
import pytest

import circuits as C
from benchmarks.numpy_attn_only import forward
from circuits.interp import attribute, patch
from circuits.models import attn_only, random_weights
from circuits.select import Inside

SMALL = dict(vocab=31, d_model=16, n_heads=3, head_size=8, n_layers=2, max_positions=16)
CLEAN = np.array([3, 14, 15, 9, 2, 6, 5, 3, 5, 8])
CORRUPT = np.array([3, 27, 18, 28, 1, 8, 28, 4, 5, 8])
SITES = {f"b{l}.a.head{h}": ("head", l, h) for l in range(2) for h in range(3)}
SITES["b1.a.head1.a.attn_probs"] = ("probs", 1, 1)


def linear_term(w, key, metric=np.sum, eps=1e-4):
    """d/de metric(loss with the site at clean + e (source - clean)) at e = 0, central differences."""
    clean, src = {}, {}
    forward(w, CLEAN, record=clean)
    forward(w, CORRUPT, record=src)
    delta = src[key] - clean[key]

    def at(e):
        return metric(forward(w, CLEAN, hooks={key: lambda v: clean[key] + e * delta}))

    return (at(eps) - at(-eps)) / (2 * eps)


@pytest.mark.parametrize("fdt,tol", [("float64", dict(rtol=1e-6, atol=1e-8)), ("float32", dict(rtol=2e-3, atol=2e-4))])
def test_attribution_is_the_linear_term(fdt, tol):
    w = random_weights(0, dtype=np.float64 if fdt == "float64" else np.float32, **SMALL)
    c = attn_only(w, CLEAN, unique_names=True)
    got = attribute(c, list(SITES), {"toks_int_var": CORRUPT}, dtype=fdt)
    assert list(got) == list(SITES)
    for name, key in SITES.items():
        np.testing.assert_allclose(got[name], linear_term(w, key), **tol, err_msg=name)
    # the estimates are not all zero, and not the exact patching effect (it is a linear estimate)
    exact = C.evaluate(patch(c, "b0.a.head0", {"toks_int_var": CORRUPT}), dtype=fdt, mode="ops").sum() - C.evaluate(c, dtype=fdt, mode="ops").sum()
    assert abs(got["b0.a.head0"]) > 1e-3 and abs(got["b0.a.head0"] - exact) > 1e-6


def test_attribution_metrics_and_site_spellings():
    w = random_weights(0, dtype=np.float64, **SMALL)
    c = attn_only(w, CLEAN, unique_names=True)
    plain = attn_only(w, CLEAN)
    source = {"toks_int_var": CORRUPT}
    tol = dict(rtol=1e-6, atol=1e-8)
    weights = np.linspace(-1.0, 1.0, 8)
    got = attribute(c, ["b1.a.head2"], source, metric=weights, dtype="float64")
    np.testing.assert_allclose(got["b1.a.head2"], linear_term(w, ("head", 1, 2), lambda l: (weights * l).sum()), **tol)
    last = attribute(c, ["b0.a.head1"], source, metric=lambda out: C.Index(out, (-1,)), dtype="float64")
    np.testing.assert_allclose(last["b0.a.head1"], linear_term(w, ("head", 0, 1), lambda l: l[-1]), **tol)
    # a matcher site on the seed's names is labelled by its node's name
    m = attribute(plain, [Inside("b1.a.head1", "a.attn_probs")], source, dtype="float64")
    np.testing.assert_allclose(m["a.attn_probs"], linear_term(w, ("probs", 1, 1)), **tol)
    with pytest.raises(C.CircuitError, match="metric weights have shape"):
        attribute(c, ["b1.a.head2"], source, metric=np.ones(3))
    with pytest.raises(C.CircuitError, match="name some node twice"):
        attribute(c, ["b1.a.head2", "b1.a.head2"], source)
    with pytest.raises(C.SelectionError, match="site 'b1.a.head7'"):
        attribute(c, ["b1.a.head7"], source)


def test_attribution_over_a_dataset_is_per_row_and_equals_one_prompt_at_a_time():
    import numpy as np

    from circuits.interp import attribute as attribute_
    from circuits.models import attn_only, random_weights, tokens_symbol

    w = random_weights(2, vocab=23, d_model=8, n_heads=2, head_size=4, n_layers=2, max_positions=16)
    sym = tokens_symbol(9)
    c = attn_only(w, sym, unique_names=True)
    rng = np.random.default_rng(4)
    clean, corrupt = rng.integers(0, 23, (5, 9)), rng.integers(0, 23, (5, 9))
    sites = ["b0.a.head1", "b1.a.head0"]
    est = attribute_(c, sites, {sym: corrupt}, inputs={sym: clean})
    for s in sites:
        assert est[s].shape == (5,)
    for i in range(5):
        one = attribute_(c, sites, {sym: corrupt[i]}, inputs={sym: clean[i]})
        for s in sites:
            np.testing.assert_allclose(est[s][i], one[s], rtol=1e-4, atol=1e-5)


def test_a_dataset_runs_one_kept_program_with_metrics_and_sources_alone_batched():
    """The dataset path (one compiled program, its plan kept per live circuit) against one prompt
    at a time through the single-prompt path: weighted and node metrics, a batch on the sources
    alone; a warm call compiles nothing and binds new values."""
    from circuits.backend import cache_stats
    from circuits.models import tokens_symbol

    w = random_weights(3, vocab=23, d_model=8, n_heads=2, head_size=4, n_layers=2, max_positions=16)
    sym = tokens_symbol(9)
    c = attn_only(w, sym, unique_names=True)
    rng = np.random.default_rng(7)
    clean, corrupt = rng.integers(0, 23, (4, 9)), rng.integers(0, 23, (4, 9))
    sites = ["b0.a.head0", "b1.a.head1", "b0.a.head1"]
    weights = np.linspace(-1.0, 2.0, 7)
    est = attribute(c, sites, {sym: corrupt}, inputs={sym: clean}, metric=weights)
    for i in range(4):
        one = attribute(c, sites, {sym: corrupt[i]}, inputs={sym: clean[i]}, metric=weights)
        for s in sites:
            np.testing.assert_allclose(est[s][i], one[s], rtol=1e-4, atol=1e-5, err_msg=s)
    # a metric node: the last position's loss
    last = attribute(c, sites, {sym: corrupt}, inputs={sym: clean}, metric=lambda out: C.Index(out, (-1,)))
    one = attribute(c, sites, {sym: corrupt[2]}, inputs={sym: clean[2]}, metric=lambda out: C.Index(out, (-1,)))
    for s in sites:
        np.testing.assert_allclose(last[s][2], one[s], rtol=1e-4, atol=1e-5, err_msg=s)
    # a batch of sources against one clean prompt: one estimate per source row
    fixed = attn_only(w, clean[0], unique_names=True)
    rows = attribute(fixed, sites, {"toks_int_var": corrupt})
    for i in range(4):
        one = attribute(fixed, sites, {"toks_int_var": corrupt[i]})
        for s in sites:
            assert rows[s].shape == (4,)
            np.testing.assert_allclose(rows[s][i], one[s], rtol=1e-4, atol=1e-5, err_msg=s)
    # warm: the kept plan and program; new values bound
    before = cache_stats()["compilations"]
    again = attribute(c, sites, {sym: corrupt[::-1]}, inputs={sym: clean[::-1]}, metric=weights)
    assert cache_stats()["compilations"] == before
    for s in sites:
        np.testing.assert_allclose(again[s], est[s][::-1], rtol=1e-5, atol=1e-6)


def test_a_kept_dataset_plan_follows_new_metric_weights_and_new_unbatched_sources():
    """The plan kept per circuit bakes in what it is built from: a source value without a batch
    axis (new values of the same shape are a new plan) but not the metric's weights (passed at
    each call). Before, both came back stale from the first call's plan."""
    from circuits.models import tokens_symbol

    w = random_weights(5, vocab=11, d_model=8, n_heads=2, head_size=4, n_layers=2, max_positions=16)
    sym = tokens_symbol(6)
    c = attn_only(w, sym, unique_names=True)
    rng = np.random.default_rng(0)
    clean = rng.integers(0, 11, (3, 6))
    first, second = rng.integers(0, 11, 6), rng.integers(0, 11, 6)
    m1, m2 = (rng.standard_normal(c.shape).astype(np.float32) for _ in range(2))
    sites = ["b0.a.head0", "b1.a.head1"]

    def one_at_a_time(src, metric):
        return {s: [attribute(c, [s], {sym: src}, inputs={sym: row}, metric=metric)[s] for row in clean]
                for s in sites}

    for src, metric in [(first, m1), (second, m1), (second, m2), (first, None)]:
        got = attribute(c, sites, {sym: src}, inputs={sym: clean}, metric=metric)
        want = one_at_a_time(src, metric)
        for s in sites:
            np.testing.assert_allclose(got[s], want[s], rtol=1e-4, atol=1e-5, err_msg=s)
