"""``discover(method='exact')``: the row-sparse program (``circuits.interp.discovery._exact``) and the
masked parts it falls back to, against the independent numpy model with a hook per edge
(tests/interp/numpy_edges.py) and against one patched circuit per edge, in float64: two heads a
layer, every ablation, a batch, MLPs; and the scorer kept on the graph never answers for another
source, metric or dtype."""

import numpy as np
import pytest

import circuits as C
from circuits.interp import discover, edges, patch_edges
from circuits.interp.discovery._exact import ExactScores
from circuits.models import attn_only, random_weights
from tests.interp.numpy_edges import edge_names, forward, sources_on

SMALL = dict(vocab=13, d_model=8, n_heads=2, head_size=4, n_layers=2, max_positions=16)
CLEAN = np.array([3, 4, 5, 9, 2, 6, 5, 3])
CORRUPT = np.array([3, 11, 8, 12, 1, 8, 5, 4])
OTHER = np.array([7, 1, 8, 2, 10, 0, 5, 4])
NAMES = edge_names(2, 2)
TOL = dict(rtol=1e-8, atol=1e-10)


@pytest.fixture(scope="module")
def model():
    w = random_weights(5, dtype=np.float64, **SMALL)
    weights = np.random.default_rng(7).uniform(-1, 1, len(CLEAN) - 2)
    return w, attn_only(w, CLEAN, unique_names=True), weights


def oracle(w, weights, senders, tokens=CLEAN):
    """Each edge patched alone, minus the clean metric, from the numpy model."""
    clean = float(np.sum(weights * forward(w, tokens)[0]))
    return np.array([float(np.sum(weights * forward(w, tokens, weights_of={e: 1.0}, senders=senders)[0])) - clean
                     for e in NAMES])


def _ablations(w):
    batch = np.random.default_rng(2).integers(0, 13, (3, len(CLEAN)))
    runs = [sources_on(w, row) for row in batch]
    return {
        "resample": ({"toks_int_var": CORRUPT}, sources_on(w, CORRUPT), TOL),
        "zero": (None, {k: np.zeros_like(v) for k, v in sources_on(w, CLEAN).items()}, TOL),
        "mean": ({"toks_int_var": batch}, {k: np.mean([r[k] for r in runs], axis=0) for k in runs[0]},
                 dict(rtol=1e-5, atol=1e-6)),  # the means are computed in float32
    }


@pytest.mark.parametrize("ablation, batch_size", [
    ("resample", None), ("resample", 8), ("zero", None),
    pytest.param("mean", None, marks=pytest.mark.slow), pytest.param("zero", 8, marks=pytest.mark.slow)])
def test_row_sparse_and_parts_are_the_oracle(model, ablation, batch_size):
    """``batch_size=None``: the row-sparse program; given: the masked program part by part."""
    w, loss, weights = model
    assert list(edges(loss)) == NAMES
    source, senders, tol = _ablations(w)[ablation]
    want = oracle(w, weights, senders)
    assert np.abs(want).max() > 1e-3
    r = discover(loss, source, weights, method="exact", ablation=ablation, dtype="float64", batch_size=batch_size)
    np.testing.assert_allclose(r.scores, want, **tol)
    kept = [s for k, s in edges(loss)._scorers.items() if k[0] == "exact" and k[2] == ablation and k[5] == batch_size]
    assert len(kept) == 1 and isinstance(kept[0], ExactScores) == (batch_size is None)


def test_rows_over_the_budget_take_the_masked_parts(model, monkeypatch):
    """A circuit whose row-sparse run would hold more than ``ROWS_BYTES`` is scored part by part
    (the same scores)."""
    from circuits.interp.discovery import _exact as exact_scores

    w, loss, weights = model
    monkeypatch.setattr(exact_scores, "ROWS_BYTES", 1000)
    other = weights * 2  # a scorer not kept yet
    r = discover(loss, {"toks_int_var": CORRUPT}, other, method="exact", dtype="float64")
    np.testing.assert_allclose(r.scores, oracle(w, other, sources_on(w, CORRUPT)), **TOL)
    kept = [s for k, s in edges(loss)._scorers.items() if k[0] == "exact" and k[5] is None]
    assert any(type(s).__name__ == "_ExactParts" for s in kept)


def test_kept_scorer_answers_only_for_its_source_metric_and_dtype(model):
    """A second call with another source value (a new array, or the same array changed in place),
    other metric weights, another metric function, or another dtype gives that call's scores,
    not the kept ones."""
    w, _, weights = model
    loss = attn_only(w, CLEAN, unique_names=True)
    source = {"toks_int_var": CORRUPT.copy()}
    np.testing.assert_allclose(discover(loss, source, weights, method="exact", dtype="float64").scores,
                               oracle(w, weights, sources_on(w, CORRUPT)), **TOL)
    source["toks_int_var"][:] = OTHER  # changed in place
    np.testing.assert_allclose(discover(loss, source, weights, method="exact", dtype="float64").scores,
                               oracle(w, weights, sources_on(w, OTHER)), **TOL)
    np.testing.assert_allclose(discover(loss, {"toks_int_var": CORRUPT}, weights, method="exact",
                                        dtype="float64").scores, oracle(w, weights, sources_on(w, CORRUPT)), **TOL)
    other = weights[::-1].copy()
    np.testing.assert_allclose(discover(loss, {"toks_int_var": CORRUPT}, other, method="exact",
                                        dtype="float64").scores, oracle(w, other, sources_on(w, CORRUPT)), **TOL)
    for at in (2, 3):  # a function metric: keyed by its node (the same program: nothing compiled)
        onehot = np.eye(len(weights))[at]
        got = discover(loss, {"toks_int_var": CORRUPT}, lambda out: C.Einsum.from_spec("a,a->", out, C.Array(onehot)),
                       method="exact", dtype="float64").scores
        np.testing.assert_allclose(got, oracle(w, onehot, sources_on(w, CORRUPT)), **TOL)
    third = {"toks_int_var": np.array([2, 9, 4, 4, 11, 3, 5, 1])}  # float32 first, then float64
    low = discover(loss, third, weights, method="exact", dtype="float32").scores
    want = oracle(w, weights, sources_on(w, third["toks_int_var"]))
    np.testing.assert_allclose(low, want, rtol=1e-4, atol=1e-5)
    high = discover(loss, third, weights, method="exact", dtype="float64").scores
    np.testing.assert_allclose(high, want, **TOL)  # a float32 scorer would be off by ~1e-7


@pytest.mark.parametrize("batch_size", [None, pytest.param(16, marks=pytest.mark.slow)])
def test_a_batch_is_the_mean_of_its_rows(model, batch_size):
    w, _, weights = model
    tok = C.Symbol((len(CLEAN),), name="toks_int_var", dtype="int64")
    batch_loss = attn_only(w, tok, unique_names=True)
    clean_rows, corrupt_rows = np.stack([CLEAN, CORRUPT, OTHER]), np.stack([CORRUPT, OTHER, CLEAN])
    want = np.mean([oracle(w, weights, sources_on(w, x), tokens=c) for c, x in zip(clean_rows, corrupt_rows)], 0)
    r = discover(batch_loss, {"toks_int_var": corrupt_rows}, weights, method="exact", dtype="float64",
                 inputs={"toks_int_var": clean_rows}, batch_size=batch_size)
    np.testing.assert_allclose(r.scores, want, **TOL)


@pytest.mark.parametrize("family", ["gpt2", pytest.param("opt", marks=pytest.mark.slow),
                                    pytest.param("llama", marks=pytest.mark.slow)])
def test_mlps_and_a_function_metric_match_one_patched_circuit_per_edge(family):
    """GPT-2, OPT, Llama (grouped-query attention) with MLPs (MLP destinations, fused
    projections): each score is the metric of the circuit patched at that edge alone
    (``patch_edges``) minus the clean metric."""
    from tests.interp.test_discovery_edges import HF_CLEAN, HF_CORRUPT, _hf_models

    build, random_w, cfg = _hf_models()[family]
    c = build(cfg, random_w(cfg), HF_CLEAN, split_heads=True)
    src = {"tokens": HF_CORRUPT}
    g = edges(c)

    def metric(out):
        return C.Index(out, (slice(None), 3))

    def value(circuit):
        return float(np.asarray(C.evaluate(circuit, dtype="float64", mode="ops"))[:, 3].sum())

    clean = value(c)
    some = [i for i, e in enumerate(g) if i % 4 == 0 or e.endswith("-> h1.mlp")]  # every destination kind
    want = [value(patch_edges(c, [g[i]], src)) - clean for i in some]
    r = discover(c, src, metric, method="exact", dtype="float64")
    np.testing.assert_allclose(r.scores[some], want, rtol=1e-8, atol=1e-10)
    assert np.abs(want).max() > 1e-6


def test_row_layout_computes_each_node_only_for_the_edges_upstream(model):
    """A head of the last layer is computed for its own q, k, v edges only; the output's residual
    sum for every edge; nothing upstream of the destinations is batched."""
    from circuits.interp.discovery._scores import split_circuit
    from circuits.interp.metric import metric_node

    _, loss, weights = model
    g = edges(loss)
    split, resid, senders = split_circuit(g)
    scorer = ExactScores(g, metric_node(split, weights), resid, senders, {"toks_int_var": CORRUPT}, "resample",
                         "float64")
    rows = dict(zip((n.hash for n in scorer.program.nodes), scorer.rows))
    head = split.get_unique("b1.a.head1")  # its own edges and those of the first layer
    assert sorted(rows[head.hash]) == [i for i, e in enumerate(NAMES) if "-> b1.a.head1." in e or "-> b0." in e]
    assert sorted(rows[resid["output"].hash]) == list(range(len(NAMES)))
    assert rows[split.get_unique("b0.a.head0").hash] != ()
    assert all(rows[n.hash] == () for n in C.traversal.toposort(split.get_unique("idxed_embeds")))
    assert 0 < scorer.rows_bytes() < len(NAMES) * sum(int(np.prod(n.shape)) * 8 for n in scorer.program.nodes)
