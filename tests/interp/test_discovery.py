"""discover / faithfulness against the independent numpy model with a hook per edge
(tests/interp/numpy_edges.py), in float64: 'exact' is each edge patched alone, 'eap' the exact
first-order term (central differences of the oracle), 'eap-ig-mask' and 'eap-ig' the oracle's
integrated gradients, 'eap-ig-mask' complete, 'acdc' the oracle's greedy pruning; the result
object, found circuits, files and plots; bad input."""

import numpy as np
import pytest

import circuits as C
from circuits.errors import CircuitError, SelectionError, ShapeError, StoreError
from circuits.interp import FoundCircuit, discover, edges, faithfulness
from circuits.models import attn_only, random_weights
from tests.interp.numpy_edges import edge_names, forward, log_softmax, sources_on

SMALL = dict(vocab=13, d_model=8, n_heads=1, head_size=4, n_layers=2, max_positions=16)
CLEAN = np.array([3, 4, 5, 9, 2, 6, 5, 3])
CORRUPT = np.array([3, 11, 8, 12, 1, 8, 5, 4])
SRC = {"toks_int_var": CORRUPT}
NAMES = edge_names(2, 1)
EPS = 1e-5


@pytest.fixture(scope="module")
def model():
    w = random_weights(0, dtype=np.float64, **SMALL)
    weights = np.random.default_rng(3).uniform(-1, 1, len(CLEAN) - 2)  # a general weighted metric
    return w, attn_only(w, CLEAN, unique_names=True), weights


def oracle_metric(w, weights, **kw):
    loss, _ = forward(w, CLEAN, **kw)
    return float(np.sum(weights * loss))


def oracle_grads(w, weights, at: float, **kw):
    """d m / d w_e at every edge weight = ``at``: central differences of the oracle."""
    out = []
    for e in NAMES:
        base = {n: at for n in NAMES}
        hi, lo = dict(base), dict(base)
        hi[e] += EPS
        lo[e] -= EPS
        out.append((oracle_metric(w, weights, weights_of=hi, **kw) - oracle_metric(w, weights, weights_of=lo, **kw))
                   / (2 * EPS))
    return np.array(out)


def test_exact_is_each_edge_patched_alone(model):
    w, loss, weights = model
    r = discover(loss, SRC, weights, method="exact", dtype="float64")
    senders = sources_on(w, CORRUPT)
    clean = oracle_metric(w, weights)
    want = [oracle_metric(w, weights, weights_of={e: 1.0}, senders=senders) - clean for e in NAMES]
    np.testing.assert_allclose(r.scores, want, rtol=1e-8, atol=1e-9)
    assert r["b1.a.head0 -> output"] == pytest.approx(want[NAMES.index("b1.a.head0 -> output")])


def test_eap_is_the_exact_first_order_term(model):
    w, loss, weights = model
    r = discover(loss, SRC, weights, method="eap", dtype="float64")
    want = oracle_grads(w, weights, 0.0, senders=sources_on(w, CORRUPT))
    np.testing.assert_allclose(r.scores, want, rtol=1e-6, atol=1e-8)
    assert np.abs(want).max() > 1e-3


def test_eap_ig_mask_is_the_oracles_and_complete(model):
    w, loss, weights = model
    senders = sources_on(w, CORRUPT)
    r = discover(loss, SRC, weights, method="eap-ig-mask", steps=3, dtype="float64")
    want = np.mean([oracle_grads(w, weights, k / 3, senders=senders) for k in range(4)], axis=0)
    np.testing.assert_allclose(r.scores, want, rtol=1e-6, atol=1e-8)
    total = oracle_metric(w, weights, weights_of={e: 1.0 for e in NAMES}, senders=senders) - oracle_metric(w, weights)
    errors = [abs(discover(loss, SRC, weights, method="eap-ig-mask", steps=k, dtype="float64").scores.sum() - total)
              for k in (1, 4, 32)]
    assert errors[2] < errors[1] < errors[0]
    assert errors[2] < 0.02 * abs(total)


@pytest.mark.parametrize("budget", [None, 1])
def test_eap_ig_is_hanna_et_al(model, budget, monkeypatch):
    """All steps in one vmapped call (the default on this model), and one step a call."""
    from circuits.interp.discovery import _scores as edge_scores

    if budget is not None:
        monkeypatch.setattr(edge_scores, "STEPS_BYTES", budget)
    w, _, weights = model
    loss = attn_only(w, CLEAN, unique_names=True)  # a fresh graph: its own compiled chunk
    steps = 3
    corrupt_run, clean_run = sources_on(w, CORRUPT), sources_on(w, CLEAN)
    delta = {s: corrupt_run[s] - clean_run[s] for s in clean_run}
    want = np.zeros(len(NAMES))
    for k in range(steps):
        emb = corrupt_run["embeds"] + k / steps * (clean_run["embeds"] - corrupt_run["embeds"])
        want += oracle_grads(w, weights, 0.0, delta=delta, embeds=emb) / steps
    r = discover(loss, SRC, weights, method="eap-ig", steps=steps, dtype="float64")
    np.testing.assert_allclose(r.scores, want, rtol=1e-6, atol=1e-8)


def test_acdc_is_the_oracles_greedy_pruning(model):
    w, loss, weights = model
    senders = sources_on(w, CORRUPT)
    g = edges(loss)
    removed, current = {}, oracle_metric(w, weights)
    alone = [oracle_metric(w, weights, weights_of={e: 1.0}, senders=senders) - current for e in NAMES]
    tau = float(np.median(np.abs(alone)))
    want_scores = {}
    for d in reversed(g.destinations):
        for s in reversed([n.split(" -> ")[0] for n in NAMES if n.endswith(f" -> {d}")]):
            e = f"{s} -> {d}"
            trial = {**removed, e: 1.0}
            value = oracle_metric(w, weights, weights_of=trial, senders=senders)
            want_scores[e] = value - current
            if abs(value - current) < tau:
                removed, current = trial, value
    r = discover(loss, SRC, weights, method="acdc", tau=tau, dtype="float64")
    assert set(r.found.removed) == set(removed) and 0 < len(removed) < len(NAMES)
    np.testing.assert_allclose([r[e] for e in NAMES], [want_scores[e] for e in NAMES], rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(C.evaluate(r.found.circuit, dtype="float64", mode="ops") @ weights, current, rtol=1e-8)


def test_kl_metric(model):
    w, _, _ = model
    logits = attn_only(w, CLEAN, logits=True, unique_names=True)
    r = discover(logits, SRC, "kl", method="exact", dtype="float64")
    p_clean = log_softmax(forward(w, CLEAN, return_logits=True)[0])

    def kl(weights_of, toks=CLEAN, senders=None, ref=p_clean):
        lp = log_softmax(forward(w, toks, weights_of=weights_of, senders=senders, return_logits=True)[0])
        return float(np.mean(np.sum(np.exp(ref) * (ref - lp), axis=-1)))

    senders = sources_on(w, CORRUPT)
    np.testing.assert_allclose(r.scores, [kl({e: 1.0}, senders=senders) for e in NAMES], rtol=1e-7, atol=1e-10)


@pytest.mark.slow
def test_kl_metric_over_a_batch(model):
    w, _, _ = model

    def kl(weights_of, toks, senders, ref):
        lp = log_softmax(forward(w, toks, weights_of=weights_of, senders=senders, return_logits=True)[0])
        return float(np.mean(np.sum(np.exp(ref) * (ref - lp), axis=-1)))

    # A batch of two rows: the metric averaged over rows, each against its own clean distribution.
    tok_sym = C.Symbol((len(CLEAN),), name="toks_int_var", dtype="int64")
    batch_logits = attn_only(w, tok_sym, logits=True, unique_names=True)
    clean_rows, corrupt_rows = np.stack([CLEAN, CORRUPT]), np.stack([CORRUPT, CLEAN])
    rb = discover(batch_logits, {"toks_int_var": corrupt_rows}, "kl", method="exact", dtype="float64",
                  inputs={"toks_int_var": clean_rows})
    want = []
    for e in NAMES:
        rows = []
        for c, x in zip(clean_rows, corrupt_rows):
            ref = log_softmax(forward(w, c, return_logits=True)[0])
            rows.append(kl({e: 1.0}, toks=c, senders=sources_on(w, x), ref=ref))
        want.append(np.mean(rows))
    np.testing.assert_allclose(rb.scores, want, rtol=1e-7, atol=1e-10)
    eap = discover(batch_logits, {"toks_int_var": corrupt_rows}, "kl", method="eap", dtype="float64",
                   inputs={"toks_int_var": clean_rows})
    assert np.abs(eap.scores).max() < 1e-6  # KL is at its minimum on the clean run: no first-order term


def test_eap_and_eap_ig_mask_over_a_batch_are_the_mean_of_the_rows(model):
    """A batch (inputs=) runs one vmapped program: its scores are the mean of the rows' scores
    (each row's checked against the oracle above)."""
    w, _, weights = model
    tok_sym = C.Symbol((len(CLEAN),), name="toks_int_var", dtype="int64")
    batch_loss = attn_only(w, tok_sym, unique_names=True)
    clean_rows, corrupt_rows = np.stack([CLEAN, CORRUPT]), np.stack([CORRUPT, CLEAN])
    for method in ("eap", "eap-ig-mask"):
        rb = discover(batch_loss, {"toks_int_var": corrupt_rows}, weights, method=method, steps=2, dtype="float64",
                      inputs={"toks_int_var": clean_rows})
        rows = [discover(attn_only(w, c, unique_names=True), {"toks_int_var": x}, weights, method=method, steps=2,
                         dtype="float64").scores for c, x in zip(clean_rows, corrupt_rows)]
        np.testing.assert_allclose(rb.scores, np.mean(rows, axis=0), rtol=1e-9, atol=1e-12)
        assert np.abs(rb.scores).max() > 1e-3


def test_result_object_found_circuits_and_files(model, tmp_path):
    w, loss, weights = model
    r = discover(loss, SRC, weights, method="exact", dtype="float64")
    text = repr(r)
    assert text.startswith("Discovery('exact', 12 edges") and "more" in r.table(5)
    top = r.ranking()[0]
    assert text.splitlines()[2].startswith(NAMES[top])
    found = r.top(4)
    assert len(found.edges) == 4 and set(found.edges) == {NAMES[i] for i in r.ranking()[:4]}
    assert set(r.threshold(abs(r.scores[r.ranking()[3]])).edges) == set(found.edges)
    # the pruned model is a plain circuit: every removed edge patched
    want, _ = forward(w, CLEAN, weights_of={e: 1.0 for e in found.removed}, senders=sources_on(w, CORRUPT))
    np.testing.assert_allclose(C.evaluate(found.circuit, dtype="float64", mode="ops"), want, rtol=1e-9, atol=1e-10)
    assert "<svg" in found._repr_html_() and "<table>" in r._repr_html_()
    found.save(tmp_path / "found.json")
    back = FoundCircuit.load(tmp_path / "found.json", loss, SRC)
    # a file of names holds no scores: the edges come back in graph order
    assert back.edges == sorted(found.edges, key=NAMES.index) and back.circuit is not None
    (tmp_path / "bad.json").write_text("{1: 2")
    with pytest.raises(StoreError, match="bad.json"):
        FoundCircuit.load(tmp_path / "bad.json", loss, SRC)
    import matplotlib

    matplotlib.use("Agg")
    assert found.plot() is not None


def test_faithfulness_curve(model):
    w, loss, weights = model
    r = discover(loss, SRC, weights, method="exact", dtype="float64")
    curve = faithfulness(loss, SRC, weights, r, sizes=[0, 3, 8, 12], dtype="float64")
    senders = sources_on(w, CORRUPT)
    full, empty = oracle_metric(w, weights), oracle_metric(w, weights, weights_of=dict.fromkeys(NAMES, 1.0),
                                                           senders=senders)
    kept = {NAMES[i] for i in r.ranking()[:3]}
    three = oracle_metric(w, weights, weights_of={e: 1.0 for e in NAMES if e not in kept}, senders=senders)
    np.testing.assert_allclose(curve.values, [0.0, (three - empty) / (full - empty), curve.values[2], 1.0],
                               rtol=1e-7, atol=1e-9)
    assert curve.full == pytest.approx(full) and curve.empty == pytest.approx(empty)
    x = np.array([0, 3, 8, 12]) / 12
    assert curve.area == pytest.approx(np.sum(np.diff(x) * (curve.values[1:] + curve.values[:-1]) / 2))


def test_bad_input_is_named(model):
    w, loss, weights = model
    with pytest.raises(ShapeError, match=r"metric weights have shape \[3\]"):
        discover(loss, SRC, np.ones(3))
    with pytest.raises(CircuitError, match="method='bogus'"):
        discover(loss, SRC, method="bogus")
    with pytest.raises(ShapeError, match=r"source\['toks_int_var'\] has shape \[4\]"):
        discover(loss, {"toks_int_var": CORRUPT[:4]})
    with pytest.raises(CircuitError, match="metric='kl' needs logits"):
        discover(C.Einsum.from_spec("a->", loss), None, "kl", ablation="zero")
    r = discover(loss, SRC, weights, method="exact", dtype="float64")
    with pytest.raises(SelectionError, match="no edge 'b0.a.head0 -> outptu'"):
        r["b0.a.head0 -> outptu"]
    with pytest.raises(CircuitError, match="top"):
        r.top(100)


@pytest.mark.parametrize("method", ["eap", "eap-ig-mask", "eap-ig"])
def test_a_new_corrupted_example_reuses_the_gradient_methods_program(model, method):
    """One example's source is bound to Symbols ('<input>.source'), so a second call on new
    corrupted tokens builds no new program and compiles nothing, whole (mode='jit') or op by
    op, and its scores are the oracle's for the new tokens (a program keyed by the source's
    values was lowered and compiled again for every new example)."""
    from circuits.backend import cache_stats

    w, _, weights = model
    loss = attn_only(w, CLEAN, unique_names=True)  # a fresh graph: its own scorers
    other = np.array([7, 2, 12, 3, 10, 1, 6, 0])
    for mode in ("jit", "ops"):
        discover(loss, SRC, weights, method=method, steps=2, dtype="float64", mode=mode)
        before = cache_stats()
        r = discover(loss, {"toks_int_var": other}, weights, method=method, steps=2, dtype="float64", mode=mode)
        after = cache_stats()
        assert after["compilations"] == before["compilations"], mode
        assert after["kernel_compilations"] == before["kernel_compilations"], mode
        fresh = discover(attn_only(w, CLEAN, unique_names=True), {"toks_int_var": other}, weights, method=method,
                         steps=2, dtype="float64", mode=mode)
        np.testing.assert_allclose(r.scores, fresh.scores, rtol=1e-9, atol=1e-12)
    if method == "eap":
        want = oracle_grads(w, weights, 0.0, senders=sources_on(w, other))
        np.testing.assert_allclose(r.scores, want, rtol=1e-6, atol=1e-8)
    assert sum(key[0] == method for key in edges(loss).__dict__["_scorers"]) == 1
