"""Bad input to discovery, attribution graphs and scrubbing is a clear CircuitError naming the
argument, before anything runs (issue 33: each of these was a raw IndexError, TypeError,
ValueError or MemoryError, or was silently accepted); discovery's rankings are shown in
descending |score| and a circuit whose edge names would repeat is refused (issue 36)."""

import numpy as np
import pytest

import circuits as C
from circuits.errors import CircuitError
from circuits.interp import SAE, Claim, Discovery, attribution_graph, discover, edges, faithfulness, scrub, splice
from circuits.models import attn_only, random_weights

SMALL = dict(vocab=13, d_model=8, n_heads=1, head_size=4, n_layers=2, max_positions=16)
CLEAN = np.array([3, 4, 5, 9, 2, 6, 5, 3])
SRC = {"toks_int_var": np.array([3, 11, 8, 12, 1, 8, 5, 4])}


@pytest.fixture(scope="module")
def model():
    w = random_weights(0, dtype=np.float64, **SMALL)
    loss = attn_only(w, CLEAN, unique_names=True)
    return w, loss, discover(loss, SRC, method="exact", dtype="float64")


# ---------------------------------------------------------------------------- a Discovery knows its circuit
def test_faithfulness_refuses_a_discovery_of_another_circuit_naming_both(model):
    w, loss, result = model
    wider = attn_only(random_weights(0, dtype=np.float64, **{**SMALL, "n_heads": 2}), CLEAN, unique_names=True)
    # more edges: was a raw IndexError
    with pytest.raises(CircuitError, match=r"Discovery of another circuit \('t.loss' .*12 edges\) than circuit= "
                                           r"\('t.loss' .*29 edges\)"):
        faithfulness(wider, SRC, None, result)
    # the same graph over other tokens: its ranking was used silently
    other = attn_only(w, CLEAN[::-1].copy(), unique_names=True)
    with pytest.raises(CircuitError, match="another circuit .* differ below, in inputs or weights.*as_dict"):
        faithfulness(other, SRC, None, result)
    # the fix the error names: rank this circuit's edges by that result's scores, by name
    by_name = faithfulness(other, SRC, None, result.as_dict(), sizes=[0, 12])
    assert by_name.sizes == [0, 12] and by_name.values[-1] == pytest.approx(1.0)
    assert result.circuit is loss and faithfulness(loss, SRC, None, result, sizes=[0, 3]).label == "exact"


def test_a_batched_discovery_knows_the_circuit_it_was_given(model):
    w, _, _ = model
    tokens = C.Symbol((len(CLEAN),), name="toks_int_var", dtype="int64")
    batch_loss = attn_only(w, tokens, unique_names=True)
    rows = {"toks_int_var": np.stack([CLEAN, SRC["toks_int_var"]])}
    back = {"toks_int_var": rows["toks_int_var"][::-1].copy()}
    r = discover(batch_loss, back, method="eap", inputs=rows, dtype="float64")
    assert r.circuit is batch_loss
    assert faithfulness(batch_loss, back, None, r, inputs=rows, sizes=[0, 12], dtype="float64").values[-1] == \
        pytest.approx(1.0)


# ---------------------------------------------------------------------------- arguments
@pytest.mark.parametrize("kw, text", [
    (dict(method="acdc", tau=float("nan")), r"tau=nan; give a finite number"),  # kept every edge
    (dict(method="acdc", tau=None), r"tau=None"),
    (dict(method="acdc", batch_size=0), r"batch_size=0; give a positive int or None"),  # were accepted
    (dict(method="acdc", batch_size=-3), r"batch_size=-3"),
    (dict(method="acdc", batch_size="a"), r"batch_size='a'"),
    (dict(method="acdc", batch_size=2.5), r"batch_size=2.5"),
    (dict(method="exact", batch_size=0), r"batch_size=0"),
    (dict(method="eap-ig", steps=True), r"steps=True; give a positive int"),
    (dict(method="eap-ig-mask", steps=2.5), r"steps=2.5"),
    (dict(method="eap-ig", steps=0), r"steps=0"),
])
def test_discover_refuses_bad_arguments(model, kw, text):
    _, loss, _ = model
    with pytest.raises(CircuitError, match="^discover: " + text):
        discover(loss, SRC, **kw)


def test_faithfulness_refuses_bad_arguments(model):
    _, loss, result = model
    for kw, text in [(dict(batch_size=0), "batch_size=0"), (dict(batch_size="a"), "batch_size='a'"),
                     (dict(sizes=[1, 2.5]), "sizes=2.5"), (dict(sizes=["a"]), "sizes='a'")]:
        with pytest.raises(CircuitError, match="^faithfulness: " + text):
            faithfulness(loss, SRC, None, result, **kw)


def test_threshold_takes_a_finite_number(model):
    _, _, result = model
    for tau in (None, float("nan"), "0.1"):  # None: a raw TypeError; nan kept no edge
        with pytest.raises(CircuitError, match=r"threshold: tau=.*give a finite number"):
            result.threshold(tau)
    assert len(result.threshold(0.0)) == len(result)


def test_acdc_refuses_a_metric_that_is_not_finite(model):
    # a metric NaN on the clean run made every change NaN, and NaN < tau is False: ACDC kept every edge
    _, loss, _ = model
    nan_metric = lambda out: C.GeneralFunction("log", C.Einsum.from_spec("a,->a", out, C.Scalar(-1.0)))  # noqa: E731
    with pytest.raises(CircuitError, match=r"discover: the metric is nan on the clean run; ACDC needs a finite metric"):
        discover(loss, SRC, nan_metric, method="acdc")


def test_integrated_gradient_steps_are_budgeted_before_anything_runs(model):
    # 10**12 steps: a raw MemoryError from numpy (10**7 ran for minutes holding a dict per step,
    # then died out of memory): refused first, naming the argument and the budget
    _, loss, _ = model
    for method in ("eap-ig", "eap-ig-mask"):
        with pytest.raises(CircuitError, match=r"discover: steps=1000000000000 would allocate .* over the budget"):
            discover(loss, SRC, method=method, steps=10**12)


def test_many_steps_hold_no_feed_per_step(model):
    # The op-by-op tier takes at most OP_BY_OP_MAX_RUNS runs; the feeds it would take were built
    # for every step first (a dict each: 10**7 steps, gigabytes) even when the compiled program ran.
    import tracemalloc

    _, loss, _ = model
    discover(loss, SRC, method="eap-ig", steps=2, mode="jit")  # compiled once, outside the count
    tracemalloc.start()
    try:
        discover(loss, SRC, method="eap-ig", steps=50_000, mode="jit")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, peak  # a dict per step held at once: about 15 MiB here


@pytest.fixture(scope="module")
def spliced():
    w = random_weights(vocab=11, d_model=8, n_heads=2, head_size=4, n_layers=1, max_positions=16)
    return splice(attn_only(w, np.arange(6), logits=True, unique_names=True), "b0", SAE.random(8, 16))


@pytest.mark.parametrize("kw, text", [
    (dict(targets=["a"]), r"targets=\['a'\]: give a non-empty list of token ids in 0..10"),  # raw ValueError
    (dict(targets=[]), r"targets=\[\]"),
    (dict(targets=[11]), r"targets=\[11\]"),
    (dict(targets=3), r"targets=3"),
    (dict(position=1.5), r"position=1.5: give an int in -4..3"),  # raw IndexError
    (dict(position=4), r"position=4"),
    (dict(batch_size=0), r"batch_size=0; give a positive int"),  # raw ValueError
    (dict(batch_size=2.5), r"batch_size=2.5"),
    (dict(freeze=None), r"freeze=None: give the names of the functions"),  # raw TypeError
    (dict(freeze=[1]), r"freeze=\[1\]"),
    (dict(max_logits=0), r"max_logits=0"),
])
def test_attribution_graph_refuses_bad_arguments(spliced, kw, text):
    with pytest.raises(CircuitError, match="^attribution graph: " + text):
        attribution_graph(spliced, **kw)


def test_attribution_graph_takes_one_function_name_as_freeze(spliced):
    # a string was read character by character ('softmax' in 'rsqrt' ...): it is one name
    g = attribution_graph(spliced, targets=[3], freeze=("softmax", "rsqrt"))
    assert attribution_graph(spliced, targets=[3], freeze=["rsqrt", "softmax"]).nodes == g.nodes
    with pytest.raises(CircuitError, match="freeze one of them"):
        attribution_graph(spliced, targets=[3], freeze="rsqrt")  # the softmax left unfrozen: the pattern varies


@pytest.mark.parametrize("seed", [-1, "x", 1.5, True, None])
def test_scrub_takes_a_seed(model, seed):
    w, _, _ = model
    tokens = C.Symbol((len(CLEAN),), name="toks_int_var", dtype="int64")
    data = {"toks_int_var": np.stack([CLEAN, SRC["toks_int_var"]] * 2)}
    with pytest.raises(CircuitError, match=r"^scrub: seed=.*give a seed, an int of at least 0"):
        scrub(attn_only(w, tokens, unique_names=True), Claim("t.loss"), data, samples=4, seed=seed)


# ---------------------------------------------------------------------------- rankings (issue 36)
def test_top_and_threshold_list_edges_by_descending_score_ties_in_graph_order(model):
    _, loss, result = model
    g = edges(loss)
    scores = np.zeros(len(g))
    scores[[9, 2, 5, 7]] = [0.5, -2.0, 2.0, -0.1]  # edges 2 and 5 tie; so do the zeros
    r = Discovery(g, scores, "exact", source=SRC, ablation="resample")
    assert r.top(5).edges == [g[2], g[5], g[9], g[7], g[0]]
    assert r.threshold(0.5).edges == [g[2], g[5], g[9]]
    text = repr(r.top(3))
    assert text.startswith("FoundCircuit(3 of 12 edges by |score|")
    assert [line.split()[0] for line in text.splitlines()[1:]] == [g[2].split()[0], g[5].split()[0], g[9].split()[0]]
    assert "-2" in text.splitlines()[1] and "+0.5" in text.splitlines()[3]
    assert "by |score|" in r.top(3)._repr_html_()
    # and the real scores: the first edge of top(k) is the first of the table
    assert result.top(4).edges[0] == result.table().splitlines()[1].split("  ")[0].strip()
    ranked = [abs(result[e]) for e in result.top(len(result)).edges]
    assert ranked == sorted(ranked, reverse=True)


def test_acdc_found_circuit_is_in_graph_order_and_says_so(model):
    _, loss, _ = model
    r = discover(loss, SRC, method="acdc", tau=0.05, dtype="float64")
    g = edges(loss)
    assert r.found.edges == sorted(r.found.edges, key=g.index)
    assert repr(r.found).startswith(f"FoundCircuit({len(r.found)} of 12 edges in graph order (ACDC keeps a set of "
                                    "edges, not a ranking)")


def test_a_circuit_whose_edge_names_would_repeat_is_refused(model):
    # attn_only without unique_names: every head's query input is 'a.q', and the edge
    # 'embeds -> a.q' came back once per head, silently
    w, _, _ = model
    plain = attn_only(random_weights(0, **{**SMALL, "n_heads": 2}), CLEAN)
    for call in (lambda: edges(plain), lambda: discover(plain, SRC)):
        with pytest.raises(CircuitError, match=r"destinations share names \('a.q' 4 times.*'embeds -> a.q'.*"
                                               r"unique_names=True"):
            call()
    # two distinct heads under one name would merge into one source
    twice = attn_only(w, CLEAN, unique_names=True).update("b1.a.head0", lambda n: n.rename("b0.a.head0"))
    with pytest.raises(CircuitError, match=r"sources share names \('b0.a.head0' 2 times"):
        edges(twice)
