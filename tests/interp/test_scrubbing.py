"""Causal scrubbing on toy circuits with known answers (after Redwood's rust_circuit tests): the
loss is ``(A + B - label)^2`` with ``A = 2 x0``, ``B = 3 x1`` and ``label = 2 x0 + 3 x1`` in the data,
so a hypothesis is right exactly when its scrubbed loss is 0.  The oracle recomputes the
scrubbed loss in numpy from the sampled rows."""

import numpy as np
import pytest

import circuits as C
from circuits.errors import CircuitError
from circuits.interp import EXACT, RANDOM, Claim, Feature, scrub
from circuits.interp.scrubbing import sample_slots
from circuits.interp.treeify import plan_slots, treeify
from circuits.select import Name

X = C.Symbol((4,), name="x")


def _col(i: int, name: str) -> C.Circuit:
    return C.Index(X, (i,), name=name)


def _scaled(node, k: float, name: str) -> C.Circuit:
    return C.Einsum.from_spec(",->", node, C.Scalar(k), name=name)


def toy(a_extra=None, b_extra=None, direct=None):
    """``loss = (A + B [+ direct] - label)^2``; ``A = 2 x0 [+ a_extra]``, ``B = 3 x1 [+ b_extra]``."""
    a = _scaled(_col(0, "x0"), 2.0, "2x0")
    b = _scaled(_col(1, "x1"), 3.0, "3x1")
    a = C.Add(a, a_extra, name="A") if a_extra is not None else C.Add(a, name="A")
    b = C.Add(b, b_extra, name="B") if b_extra is not None else C.Add(b, name="B")
    terms = [a, b] + ([direct] if direct is not None else [])
    err = C.Add(*terms, _scaled(_col(2, "label"), -1.0, "neg_label"), name="err")
    return C.Einsum.from_spec(",->", err, err, name="loss")


def data(rows=400, seed=0, x1_from_x0=False):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 5, (rows, 4)).astype(np.float32)
    if x1_from_x0:
        x[:, 1] = 2 * x[:, 0]
    x[:, 2] = 2 * x[:, 0] + 3 * x[:, 1]
    return {"x": x}


X0, X1 = Feature.tokens([0]), Feature.tokens([1])


def right_hypothesis(**kw):
    return Claim("loss", children=[Claim("A", feature=X0), Claim("B", feature=X1)], **kw)


def test_right_hypothesis_loses_nothing():
    r = scrub(toy(), right_hypothesis(), data(), samples=300, labels="label")
    assert r.original == 0.0 and r.scrubbed == 0.0
    assert r.random > 10.0
    assert r.recovered == 1.0


def test_identity_and_empty_hypotheses():
    d = data()
    ident = scrub(toy(), Claim("loss"), d, samples=200, labels="label", seed=3)
    np.testing.assert_array_equal(ident.rows["scrubbed"], ident.rows["original"])
    # Root claim with only the labels: everything else random, exactly the fully scrubbed run.
    empty = scrub(toy(), Claim("loss", children=[]), d, samples=200, labels="label", seed=3)
    np.testing.assert_array_equal(empty.rows["scrubbed"], empty.rows["original"])  # a leaf root is the identity
    only_labels = scrub(toy(), Claim("loss", children=[Claim("x0", feature=RANDOM)]), d, samples=200,
                        labels="label", seed=3)
    assert only_labels.scrubbed > 10 * max(only_labels.original, 1e-9)


def test_a_small_leak_costs_little_and_a_big_one_costs_much():
    small = scrub(toy(a_extra=_scaled(_col(1, "x1"), 0.001, "leak")), right_hypothesis(), data(), labels="label")
    assert small.scrubbed < 0.01
    big = scrub(toy(a_extra=_scaled(_col(1, "x1"), 1.0, "leak")), right_hypothesis(), data(), labels="label")
    assert big.scrubbed > 1.0


def test_cancelling_terms_are_caught():
    # A = 2 x0 + x3, B = 3 x1 - x3: the model is right, the hypothesis (A needs x0 only) is not.
    c = toy(a_extra=_col(3, "x3"), b_extra=_scaled(_col(3, "x3b"), -1.0, "minus_x3"))
    d = data()
    assert C.evaluate_batched(c, d).max() == 0.0
    assert scrub(c, right_hypothesis(), d, labels="label").scrubbed > 1.0


def test_unclaimed_path_is_random_unless_other_is_exact():
    c = toy(direct=_scaled(_col(3, "x3"), 1.0, "D"))
    # label does not contain x3: make the data's label include it so the model is right
    d = data()
    d["x"][:, 2] += d["x"][:, 3]
    hyp = right_hypothesis()
    assert scrub(c, hyp, d, labels="label").scrubbed > 1.0
    assert scrub(c, right_hypothesis(other="exact"), d, labels="label").scrubbed == 0.0


def test_correlated_data_with_an_unclaimed_path():
    # x1 = 2 x0 in the data: claiming A only (B unclaimed, random) must still fail.
    d = data(x1_from_x0=True)
    r = scrub(toy(), Claim("loss", children=[Claim("A", feature=X0)]), d, labels="label")
    assert r.scrubbed > 1.0


def test_scrubbed_loss_matches_a_numpy_oracle():
    d = data(rows=60, seed=5)
    hyp = Claim("loss", children=[Claim("A", feature=X0), Claim("B", feature=Feature.tokens([0]), name="B?")])
    root = Claim(hyp.site, children=[*hyp.children, Claim("label", name="labels")], name=hyp.name)
    plan = plan_slots(root)
    r = scrub(toy(), hyp, d, samples=500, seed=7, labels="label")
    idx = sample_slots(plan, d, 500, 7)
    x = d["x"]
    ref, a_rows, b_rows = idx[0], idx[plan.d[1]], idx[plan.d[2]]
    # the samplers keep the claimed feature of the parent's datum
    np.testing.assert_array_equal(x[a_rows, 0], x[ref, 0])
    np.testing.assert_array_equal(x[b_rows, 0], x[ref, 0])
    expected = (2 * x[a_rows, 0] + 3 * x[b_rows, 1] - x[ref, 2]) ** 2
    np.testing.assert_allclose(r.rows["scrubbed"], expected, rtol=1e-6)
    assert r.scrubbed > 1.0  # B claimed to need x0 only: wrong


def test_treeify_copies_inputs_per_owner_and_shares_the_rest():
    c = toy()
    plan = plan_slots(Claim("loss", children=[Claim("A", feature=X0), Claim("B", feature=EXACT)]))
    t = treeify(c, plan, {"x"})
    names = sorted(s.name for s in t.circuit.get("Symbol"))
    # the root's datum (0) shared by the exact claim B, the root's random slot (1) read by its
    # unclaimed path (the label), and A's draw (2)
    assert names == ["x@0", "x@1", "x@2"]
    assert plan.d[2] == plan.d[0] == 0 and plan.o[0] == 1 and plan.d[1] == 2
    ident = treeify(c, plan_slots(Claim("loss", other="exact", children=[Claim("A"), Claim("B")])), {"x"})
    assert C.count_nodes(ident.circuit) == C.count_nodes(c)


def test_samples_run_in_one_batched_program(monkeypatch):
    import circuits.backend as backend

    calls = []
    real = backend.evaluate_batched

    def counting(*a, **kw):
        calls.append(kw.get("mode"))
        return real(*a, **kw)

    monkeypatch.setattr(backend, "evaluate_batched", counting)
    scrub(toy(), right_hypothesis(), data(), samples=100, labels="label", reuse_rows=False)
    assert calls == ["jit"]
    # reusing rows: a program per group of slots for the per-row subcircuits (bounded by the
    # slots, not the samples), one for the samples
    for samples in (100, 10_000):
        calls.clear()
        r = scrub(toy(), right_hypothesis(), data(), samples=samples, labels="label", reuse_rows=True)
        assert set(calls) == {"jit"} and 2 <= len(calls) <= r.n_slots + 2


def _hypotheses():
    return [right_hypothesis(), Claim("loss"), Claim("loss", children=[Claim("A", feature=X0)]),
            Claim("loss", children=[Claim("A", feature=X1, children=[Claim("x0", feature=RANDOM)]),
                                    Claim("B", feature=X0)]),
            Claim("loss", other="exact", children=[Claim("A", feature=RANDOM)])]


@pytest.mark.parametrize("labels", [None, "label"])
def test_reusing_rows_gives_the_same_losses(labels):
    d = data(rows=30, seed=3)
    for hyp in _hypotheses():
        fresh = scrub(toy(), hyp, d, samples=200, seed=4, labels=labels, reuse_rows=False)
        reused = scrub(toy(), hyp, d, samples=200, seed=4, labels=labels, reuse_rows=True)
        auto = scrub(toy(), hyp, d, samples=200, seed=4, labels=labels)
        for k in ("original", "scrubbed", "random"):
            np.testing.assert_allclose(reused.rows[k], fresh.rows[k], rtol=1e-6, err_msg=f"{hyp.name} {k}")
            np.testing.assert_array_equal(auto.rows[k], reused.rows[k])


def test_reused_rows_are_computed_once_per_dataset_row(monkeypatch):
    import circuits.backend as backend

    sizes = []
    real = backend.evaluate_batched

    def recording(circuit, inputs, **kw):
        sizes.append(max(int(np.asarray(v).shape[0]) for v in inputs.values()))
        return real(circuit, inputs, **kw)

    monkeypatch.setattr(backend, "evaluate_batched", recording)
    d = data(rows=30, seed=3)
    scrub(toy(), right_hypothesis(), d, samples=500, seed=4, labels="label")
    # 500 samples read 3 slots; the per-row program sees each of the 30 dataset rows at most once
    assert sizes[0] <= 30 and sizes[-1] == 500


@pytest.mark.parametrize("hyp", [right_hypothesis(), Claim("loss", children=[Claim("A", feature=RANDOM)])])
def test_a_new_seed_runs_the_programs_of_the_last(hyp, monkeypatch):
    """The reused rows' tables have a size that does not depend on the draw (a bound on the
    distinct rows any draw hits), so a new seed evaluates programs of the same shapes: no new
    compilations.  Sizing them by each draw's own count gave every few seeds a new shape."""
    import circuits.backend as backend

    shapes = []
    real = backend.evaluate_batched

    def recording(circuit, inputs, **kw):
        shapes[-1].append((circuit.hash, tuple(sorted((k, np.shape(v)) for k, v in inputs.items()))))
        return real(circuit, inputs, **kw)

    monkeypatch.setattr(backend, "evaluate_batched", recording)
    d = data(rows=200, seed=3)
    for seed in range(6):
        shapes.append([])
        r = scrub(toy(), hyp, d, samples=64, seed=seed, labels="label", reuse_rows=True)
        fresh = scrub(toy(), hyp, d, samples=64, seed=seed, labels="label", reuse_rows=False)
        for k in ("original", "scrubbed", "random"):
            np.testing.assert_allclose(r.rows[k], fresh.rows[k], rtol=1e-6)
        shapes[-1] = shapes[-1][:-1]  # the reuse_rows=False call's
    assert len(shapes[0]) >= 2 and all(s == shapes[0] for s in shapes), shapes


def test_the_fully_scrubbed_run_reads_the_root_claims_random_draw():
    d = data(rows=60, seed=5)
    hyp = Claim("loss", children=[Claim("A", feature=X0)])
    r = scrub(toy(), hyp, d, samples=300, seed=2, labels="label")
    x, plan, idx = d["x"], r.plan, r.indices
    ref, other, a_rows = idx[0], idx[plan.o[0]], idx[plan.d[1]]
    # numpy oracles: B (unclaimed) reads the root's random draw, the labels the reference
    np.testing.assert_allclose(r.rows["scrubbed"], (2 * x[a_rows, 0] + 3 * x[other, 1] - x[ref, 2]) ** 2, rtol=1e-6)
    np.testing.assert_allclose(r.rows["random"], (2 * x[other, 0] + 3 * x[other, 1] - x[ref, 2]) ** 2, rtol=1e-6)
    np.testing.assert_allclose(r.rows["original"], (2 * x[ref, 0] + 3 * x[ref, 1] - x[ref, 2]) ** 2, rtol=1e-6)


def test_seeded():
    a = scrub(toy(), Claim("loss", children=[Claim("A", feature=X0)]), data(), samples=100, seed=1, labels="label")
    b = scrub(toy(), Claim("loss", children=[Claim("A", feature=X0)]), data(), samples=100, seed=1, labels="label")
    c = scrub(toy(), Claim("loss", children=[Claim("A", feature=X0)]), data(), samples=100, seed=2, labels="label")
    np.testing.assert_array_equal(a.rows["scrubbed"], b.rows["scrubbed"])
    assert not np.array_equal(a.rows["scrubbed"], c.rows["scrubbed"])


def test_hypothesis_and_result_print():
    hyp = Claim("loss", children=[Claim("A", feature=X0, children=[Claim("x0")]), Claim("B", avoid="x0")])
    assert str(hyp) == (
        "Claim 'loss' [exact] other=random\n"
        "├ Claim 'A' [tokens[0]] other=random\n"
        "│ └ Claim 'x0' [exact]\n"
        "└ Claim 'B' [exact] avoid x0"
    )
    r = scrub(toy(), right_hypothesis(), data(), samples=50, labels="label")
    text = repr(r)
    assert "original loss" in text and "recovered" in text and "100.0%" in text
    html = r._repr_html_()
    assert html.startswith("<table>") and "fully scrubbed loss" in html and "Claim &#x27;loss&#x27;" in html


# --- bad input: errors that name the claim ---------------------------------------------------------

def test_site_that_does_not_feed_its_parent():
    hyp = Claim("loss", children=[Claim("A", children=[Claim("x1")])])
    with pytest.raises(CircuitError, match=r"claim 'x1'.*child of 'A'.*does not feed its parent"):
        scrub(toy(), hyp, data(), labels="label")


def test_feature_that_does_not_match_the_inputs():
    hyp = Claim("loss", children=[Claim("A", feature=Feature.tokens([7]))])
    with pytest.raises(CircuitError, match=r"claim 'A'.*positions \[7\] are out of range.*4 positions"):
        scrub(toy(), hyp, data(), labels="label")
    bad_rows = Claim("loss", children=[Claim("A", feature=lambda d: d["x"][:3, 0])])
    with pytest.raises(CircuitError, match=r"claim 'A'.*leading axis of 400"):
        scrub(toy(), bad_rows, data(), labels="label")
    no_input = Claim("loss", children=[Claim("A", feature=Feature.tokens([0], input="y"))])
    with pytest.raises(CircuitError, match=r"claim 'A'.*no input 'y'"):
        scrub(toy(), no_input, data(), labels="label")


def test_other_bad_hypotheses():
    with pytest.raises(CircuitError, match=r"root claim 'A' must have the circuit's output"):
        scrub(toy(), Claim("A"), data())
    with pytest.raises(CircuitError, match=r"claim 'nope'.*matches no node"):
        scrub(toy(), Claim("loss", children=[Claim("nope")]), data())
    with pytest.raises(CircuitError, match=r"claims 'A', 'also A' all claim"):
        scrub(toy(), Claim("loss", children=[Claim("A"), Claim(Name("A"), name="also A")]), data())
    with pytest.raises(CircuitError, match=r"two claims are named 'A'"):
        scrub(toy(), Claim("loss", children=[Claim("A"), Claim("A", feature=X0)]), data())
    with pytest.raises(CircuitError, match=r"claim 'A'.*avoiding 'A'|claim 'x0'.*avoiding"):
        scrub(toy(), Claim("loss", children=[Claim("x0", avoid="A"), Claim("B")]), data(rows=20))
    with pytest.raises(CircuitError, match=r"no data for the circuit's inputs \['x'\]"):
        scrub(toy(), right_hypothesis(), {"y": np.zeros((3, 4))})
    with pytest.raises(CircuitError, match=r"data\['x'\] has shape \[3, 5\]"):
        scrub(toy(), right_hypothesis(), {"x": np.zeros((3, 5))})


def test_deep_circuit(low_recursion_limit):
    from tests.deep import build_deep_chain

    leaf = C.Symbol((2,), name="x")
    chain = build_deep_chain(2_000, leaf=leaf, tag="scrub")
    # the claim tree's root is the top; its only child sits near the bottom
    hyp = Claim(chain.name, children=[Claim("scrubn1")])
    t = treeify(chain, plan_slots(hyp), {"x"})
    assert [s.name for s in t.circuit.get("Symbol")] == ["x@0"]
    deep = build_deep_chain(leaf=leaf, tag="scrubdeep")
    t = treeify(deep, plan_slots(Claim(deep.name, children=[Claim("scrubdeepn1")], other="exact")), {"x"})
    assert C.count_nodes(t.circuit) == C.count_nodes(deep)


@pytest.mark.parametrize("samples, match", [
    ("abc", "give an int"),  # was a raw ValueError
    (2.5, "give an int"),
    (None, "give an int"),
    (True, "give an int"),
    (1, "at least 2"),
    (10**12, "would allocate"),  # was a raw MemoryError (or a machine brought to its knees)
    (10**30, "would allocate"),
])
def test_bad_sample_counts_are_clear_errors(samples, match):
    with pytest.raises(CircuitError, match=match):
        scrub(toy(), Claim("loss", children=[Claim("A")]), {"x": data(rows=20)}, samples=samples)
