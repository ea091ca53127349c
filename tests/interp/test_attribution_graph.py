"""Attribution graphs: a hand-computed case (edges, influence, pruning), every sampled edge equal to
its explicit ablation in the frozen circuit, circuit tracing's pruning example, the induction
model's known answer, transcoders in GPT-2, JSON and printing."""

import json

import numpy as np
import pytest

import circuits as C
from circuits.errors import CircuitError
from circuits.interp import SAE, attribution_graph
from circuits.interp.attribution_graph import _influence, _normalised, prune
from circuits.interp.sae_files import induction_saes
from circuits.interp.sites import one_root
from circuits.models import attn_only, induction_tokens, induction_weights, random_weights


# ---------------------------------------------------------------------------- hand case
def hand_circuit():
    """One position, no attention or norm: e = [1, 2], the MLP writes m = [0.5, 3], W_U = I."""
    emb = C.Einsum.from_spec("ab->ab", C.Array(np.array([[1.0, 2.0]]), name="tok_table"), name="emb")
    mlp = C.Einsum.from_spec("ab,bc->ac", emb, C.Array(np.array([[0.5, 3.0], [0.0, 0.0]]), name="mlp.w"), name="mlp")
    resid = C.Add(emb, mlp, name="resid")
    return C.Einsum.from_spec("ab,cb->ac", resid, C.Array(np.eye(2), name="unembed"), name="logits")


def test_hand_case():
    tc = SAE(architecture="transcoder", W_enc=np.array([[1.0], [0.0]]), W_dec=np.array([[0.0, 3.0]]),
             b_enc=np.zeros(1), b_dec=np.zeros(2), apply_b_dec_to_input=False, dtype="float64")
    g = attribution_graph(hand_circuit(), {"mlp": tc}, embeddings="emb", mode="ops")
    ids = [n["id"] for n in g.nodes]
    assert ids == ["0_0_0", "err_0_0", "E_0_0", "logit_1_0"]
    assert g.nodes[-1]["probability"] == pytest.approx(0.97069, abs=1e-5)
    want = np.zeros((4, 4))
    want[0, 2] = 1.0                          # token -> feature: w_enc . e
    want[3, :3] = [1.5, -0.25, 0.5]           # feature, error, token -> demeaned logit 1
    np.testing.assert_allclose(g.adjacency, want, atol=1e-12)
    w = g.logit_weights
    infl = _influence(_normalised(g.adjacency), w) / w[-1]
    np.testing.assert_allclose(infl[:3], [2 / 3, 1 / 9, 8 / 9], atol=1e-12)
    np.testing.assert_allclose(g.influence[[2, 0, 1]], [8 / 15, 14 / 15, 1.0], atol=1e-12)
    assert g.node_mask.tolist() == [True, False, True, True]     # the error is pruned at 0.8
    assert sorted(g.edges()) == sorted([("0_0_0", "logit_1_0", 1.5), ("E_0_0", "logit_1_0", 0.5),
                                        ("E_0_0", "0_0_0", 1.0)])


def test_circuit_tracing_pruning_example():
    """circuit-tracer's tests/test_graph.py::test_small_graph: equal weights, logit node 11."""
    adj = np.zeros((12, 12))
    for t, sources in {11: [1, 3, 6, 8], 3: [0, 1, 6], 1: [9, 10], 0: [9]}.items():
        adj[t, sources] = 1.0
    w = np.zeros(12)
    w[11] = 1.0
    infl = _influence(_normalised(adj), w)
    np.testing.assert_allclose(infl, [1 / 12, 1 / 3, 0, 1 / 4, 0, 0, 1 / 3, 0, 1 / 4, 1 / 4, 1 / 6, 0], atol=1e-12)
    kinds = ["feature"] * 11 + ["logit"]
    nodes, edges, _ = prune(adj, w, kinds, node_threshold=0.8, edge_threshold=0.98)
    assert not nodes[[2, 4, 5, 7]].any()          # no influence, no path to the logit
    assert not edges[~nodes].any() and not edges[:, ~nodes].any()


# ---------------------------------------------------------------------------- exactness
def readouts(frozen, values):
    targets = frozen["targets"]
    _, got = C.evaluate(one_root(targets), values, dtype="float64", also=targets, mode="ops")
    logits = np.asarray(got[targets[-1]])[frozen["position"]]
    return [np.asarray(got[t]) for t in targets[:-1]], logits - logits.mean()


def removed(g, values, j):
    """The leaf values with source node j set to zero."""
    n = g.nodes[j]
    out = {k: v.copy() for k, v in values.items()}
    if n["kind"] == "feature":
        out[f"{n['site']}.sae.acts"][n["pos"], n["feature"]] = 0.0
    elif n["kind"] == "error":
        out[f"{n['site']}.sae.error"][n["pos"]] = 0.0
    else:
        (key,) = [k for k in out if not k.endswith((".sae.acts", ".sae.error"))]
        out[key][n["pos"]] = 0.0
    return out


def readout(g, pres, logits, i):
    n = g.nodes[i]
    if n["kind"] == "feature":
        return pres[g.frozen["sites"].index(n["site"])][n["pos"], n["feature"]]
    return logits[n["token"]]


def check_edges_by_ablation(g, n_samples=40, seed=0):
    frozen = g.frozen
    values = frozen["values"]
    pres, logits = readouts(frozen, values)
    rng = np.random.default_rng(seed)
    targets = [i for i, n in enumerate(g.nodes) if n["kind"] in ("feature", "logit")]
    sources = [j for j, n in enumerate(g.nodes) if n["kind"] != "logit"]
    nonzero = np.argwhere(g.adjacency != 0)
    picks = [tuple(p) for p in nonzero[rng.choice(len(nonzero), min(n_samples // 2, len(nonzero)), replace=False)]]
    picks += [(int(rng.choice(targets)), int(rng.choice(sources))) for _ in range(n_samples // 2)]
    checked = 0
    for t, s in picks:
        p2, l2 = readouts(frozen, removed(g, values, s))
        change = readout(g, pres, logits, t) - readout(g, p2, l2, t)
        assert change == pytest.approx(g.adjacency[t, s], abs=1e-9, rel=1e-7), (g.nodes[s]["id"], g.nodes[t]["id"])
        checked += abs(change) > 1e-6
    assert checked >= n_samples // 4  # most sampled edges are not trivially zero


@pytest.fixture(scope="module")
def small():
    w = random_weights(vocab=13, d_model=8, n_heads=2, head_size=4, n_layers=2, max_positions=16, dtype=np.float64)
    logits = attn_only(w, np.array([0, 3, 5, 7, 3, 5, 7, 2]), logits=True, unique_names=True)
    saes = {"b0": SAE.random(8, 24, "jumprelu", seed=1, dtype="float64"),
            "b1": SAE.random(8, 24, "topk", k=5, seed=2, dtype="float64")}
    return logits, attribution_graph(logits, saes, max_logits=3, batch_size=16, mode="ops")


def test_every_edge_is_its_ablation_in_the_frozen_circuit(small):
    logits, g = small
    # the frozen circuit at the clean leaves is the original computation
    pres, _ = readouts(g.frozen, g.frozen["values"])
    _, got = C.evaluate(one_root(g.frozen["targets"]), g.frozen["values"], dtype="float64", also=g.frozen["targets"],
                        mode="ops")
    np.testing.assert_allclose(got[g.frozen["targets"][-1]], C.evaluate(logits, dtype="float64", mode="ops"), atol=1e-10)
    # edges into features only come from earlier layers; errors, tokens have no incoming edges
    kinds = np.array([n["kind"] for n in g.nodes])
    assert not g.adjacency[(kinds == "error") | (kinds == "token")].any()
    check_edges_by_ablation(g)


def _visited_by_influence(g, cap: int, step: int) -> list[str]:
    """Oracle for ``max_feature_nodes``: the features circuit tracing visits, from the full dense
    adjacency ``g.adjacency``: ``step`` at a time, the unvisited ones of highest influence
    ``w (M + M^2 + ...)``, M the row-normalised adjacency with only the logits' rows and the
    visited features' rows known."""
    kinds = np.array([n["kind"] for n in g.nodes])
    feats = [i for i, k in enumerate(kinds) if k == "feature"]
    known = set(np.flatnonzero(kinds == "logit"))
    visited: list[int] = []
    while len(visited) < cap:
        m = np.zeros_like(g.adjacency)
        rows = sorted(known)
        m[rows] = np.abs(g.adjacency[rows])
        m /= np.maximum(m.sum(axis=1, keepdims=True), 1e-10)
        power, influence = g.logit_weights.copy(), np.zeros(len(kinds))
        for _ in range(len(kinds)):
            power = power @ m
            influence += power
        todo = sorted((f for f in feats if f not in visited), key=lambda f: (-influence[f], f))
        take = todo[:min(step, cap - len(visited))]
        visited += take
        known |= set(take)
    return sorted(g.nodes[f]["id"] for f in visited)


@pytest.mark.parametrize("cap, batch", [(5, 2), (11, 1), (1000, 16)])
def test_max_feature_nodes_visits_the_most_influential_features(small, cap, batch):
    """With max_feature_nodes, only that many features' rows are computed, chosen by influence
    estimated from the rows known so far (re-estimated every 4 * batch_size), the others left
    out of the graph; the rows kept are the full graph's rows, exactly.  A cap over the active
    features gives the full graph."""
    logits, full = small
    saes = {"b0": SAE.random(8, 24, "jumprelu", seed=1, dtype="float64"),
            "b1": SAE.random(8, 24, "topk", k=5, seed=2, dtype="float64")}
    g = attribution_graph(logits, saes, max_logits=3, batch_size=batch, mode="ops", max_feature_nodes=cap)
    n_feat = sum(n["kind"] == "feature" for n in full.nodes)
    ids = [n["id"] for n in g.nodes]
    kept = [n["id"] for n in g.nodes if n["kind"] == "feature"]
    assert len(kept) == min(cap, n_feat) and n_feat > 11
    assert sorted(kept) == _visited_by_influence(full, min(cap, n_feat), 4 * batch)
    assert [i for i in ids if not i[0].isdigit()] == [n["id"] for n in full.nodes if n["kind"] != "feature"]
    at = [full.index[i] for i in ids]
    np.testing.assert_allclose(g.adjacency, full.adjacency[np.ix_(at, at)], rtol=1e-12, atol=1e-14)
    if cap >= n_feat:
        assert ids == [n["id"] for n in full.nodes]
    assert g.node_mask.shape == (len(ids),) and g.edges()  # pruned like any graph


def test_max_feature_nodes_errors():
    w = random_weights(vocab=7, d_model=8, n_heads=1, head_size=4, n_layers=1, max_positions=8)
    logits = attn_only(w, np.array([0, 3, 5, 2]), logits=True, unique_names=True)
    with pytest.raises(CircuitError, match="max_feature_nodes=-1"):
        attribution_graph(logits, {"b0": SAE.random(8, 16)}, max_feature_nodes=-1)
    # an adjacency over the allocation budget: an error naming the count and the way out, not
    # numpy's MemoryError (GPT-2 small with random transcoders at every MLP: 240,000 features)
    from circuits.shapes import MAX_ALLOC_ENV

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(MAX_ALLOC_ENV, str(100_000))  # 245 active features: 520 kB uncapped, 65 kB with 2
        with pytest.raises(CircuitError, match=r"adjacency of \d+ active features.*max_feature_nodes="):
            attribution_graph(logits, {"b0": SAE.random(8, 256)})
        g = attribution_graph(logits, {"b0": SAE.random(8, 256)}, max_feature_nodes=2)
        assert sum(n["kind"] == "feature" for n in g.nodes) == 2


@pytest.mark.slow
def test_transcoders_in_gpt2_and_a_nonlinearity_left_is_an_error():
    from circuits.models.gpt2 import gpt2, random_gpt2_weights

    cfg = dict(n_embd=8, n_head=2, n_layer=2, vocab_size=11, n_positions=16, activation_function="gelu_new")
    logits = gpt2(cfg, random_gpt2_weights(cfg, dtype=np.float64), np.array([1, 4, 2, 7, 4, 2]))
    tcs = {f"h{l}.mlp": SAE.random(8, 16, "skip_transcoder", d_out=8, seed=l, dtype="float64") for l in range(2)}
    g = attribution_graph(logits, tcs, embeddings="tok_embeds", max_logits=2, mode="ops")
    assert {n["site"] for n in g.nodes if n["kind"] == "feature"} == {"h0.mlp", "h1.mlp"}
    check_edges_by_ablation(g, n_samples=20)
    with pytest.raises(CircuitError, match="h1.mlp.act.*nonlinear.*transcoder"):
        attribution_graph(logits, {"h0.mlp": tcs["h0.mlp"]}, embeddings="tok_embeds", mode="ops")


# ---------------------------------------------------------------------------- known answer
def test_induction_graph_has_the_previous_token_to_induction_path():
    w = induction_weights()
    toks = induction_tokens(1, seed=0)[0]
    logits = attn_only(w, toks, logits=True, unique_names=True)
    g = attribution_graph(logits, induction_saes(), dtype="float32")
    q, k = 31, 16          # the last query reads A[14]; A[14] is followed by A[15] at position 16
    answer = int(toks[32])
    assert g.nodes[g.index[f"logit_{answer}_{q}"]]["probability"] > 0.5
    kept = g.edges()
    into_logit = {s for s, t, _ in kept if t == f"logit_{answer}_{q}" and s.startswith("1_") and s.endswith(f"_{q}")}
    bridge = [(s, t) for s, t, _ in kept if t in into_logit and s.startswith("0_") and s.endswith(f"_{k}")]
    assert bridge, "no kept edge from a layer-0 feature at the earlier occurrence to a layer-1 feature at the query"
    f0 = bridge[0][0]
    assert (f"E_{toks[k]}_{k}", f0, g.edge(f"E_{toks[k]}_{k}", f0)) in kept
    # Cross-position edges go through attention; measure which heads carry them.
    _, probs = C.evaluate(logits, mode="ops", also=[f"b{l}.a.head{h}.a.attn_probs" for l in range(2) for h in range(4)])
    induction = [h for h in range(4) if probs[f"b1.a.head{h}.a.attn_probs"][q, k] > 0.5]
    prev = max(range(4), key=lambda h: np.mean([probs[f"b0.a.head{h}.a.attn_probs"][p, p - 1] for p in range(1, 32)]))
    assert induction and np.mean([probs[f"b0.a.head{prev}.a.attn_probs"][p, p - 1] for p in range(1, 32)]) > 0.5
    # The layer-0 -> layer-1 edge crosses from position 16 to 31, so it is the sum of what each
    # layer-1 head carries (the head alone: the others' frozen patterns zeroed), and the heads
    # attending from 31 to 16 (induction heads) carry it.
    frozen = g.frozen
    s_idx, t_idx = g.index[f0], g.index[bridge[0][1]]
    per_head = [_edge_in(g, _only_heads(frozen, {f"b1.a.head{x}.a.attn_probs" for x in range(4) if x != h}), s_idx, t_idx)
                for h in range(4)]
    assert sum(per_head) == pytest.approx(g.adjacency[t_idx, s_idx], rel=1e-4)
    assert abs(sum(per_head[h] for h in induction)) > 0.9 * abs(g.adjacency[t_idx, s_idx])
    # The strongest token edges into the layer-0 features at 16 from other positions come from the
    # previous token (15): the previous-token head's write; zeroing its pattern removes them.
    f0s = [i for i, n in enumerate(g.nodes) if n["kind"] == "feature" and n["layer"] == 0 and n["pos"] == k]
    toks_idx = [i for i, n in enumerate(g.nodes) if n["kind"] == "token"]
    weight = np.abs(g.adjacency[np.ix_(f0s, toks_idx)]).sum(0)
    weight[k] = 0
    assert int(np.argmax(weight)) == k - 1
    no_prev = _only_heads(frozen, {f"b0.a.head{prev}.a.attn_probs"})
    tok_prev = g.index[f"E_{toks[k - 1]}_{k - 1}"]
    assert sum(abs(_edge_in(g, no_prev, tok_prev, i)) for i in f0s) < 0.3 * weight[k - 1]


def _only_heads(frozen, zeroed: set):
    """The frozen targets with the frozen patterns named in ``zeroed`` set to 0."""
    from circuits.traversal import replace, toposort

    table = {}
    for t in frozen["targets"]:
        for n in toposort(t):
            if isinstance(n, C.Array) and n.name and n.name.removesuffix(".frozen") in zeroed:
                table[n] = C.Array(np.zeros(n.shape, np.dtype(n.dtype)), name=n.name)
    root = replace(one_root(frozen["targets"]), table)
    return dict(frozen, targets=[c.children[0] for c in root.children])


def _edge_in(g, frozen, s, t):
    pres, logits = readouts(frozen, frozen["values"])
    p2, l2 = readouts(frozen, removed(g, frozen["values"], s))
    return readout(g, pres, logits, t) - readout(g, p2, l2, t)


# ---------------------------------------------------------------------------- output
def test_json_and_printing(tmp_path, small):
    logits, _ = small
    g = attribution_graph(logits, {"b0": SAE.random(8, 16, seed=3)}, targets=[5, 7], mode="ops")
    doc = g.to_json(tmp_path / "g.json", slug="demo")
    assert json.loads((tmp_path / "g.json").read_text()) == doc
    assert set(doc) == {"metadata", "qParams", "nodes", "links"} and doc["metadata"]["slug"] == "demo"
    ids = {n["node_id"] for n in doc["nodes"]}
    assert doc["links"] and all(link["source"] in ids and link["target"] in ids for link in doc["links"])
    logit_nodes = [n for n in doc["nodes"] if n["feature_type"] == "logit"]
    assert [n["feature"] for n in logit_nodes] == [5, 7] and logit_nodes[0]["is_target_logit"]
    assert logit_nodes[0]["clerp"].startswith('Output "5" (p=')
    text = str(g)
    assert "target logit_5_5" in text and "->" in text
    for s, t, weight in g.edges()[:5]:
        assert g.edge(s, t) == weight
    with pytest.raises(CircuitError, match="no node 'nope'"):
        g.edge("nope", "logit_5_5")
    with pytest.raises(CircuitError, match="no SAE spliced"):
        attribution_graph(logits)


def test_plot(small):
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    _, g = small
    ax = g.plot()
    assert len(ax.lines) == min(200, int(g.edge_mask.sum()))
    # every kept node is labelled: its feature index, 'err', its token or its logit's token
    kept = np.nonzero(g.node_mask)[0]
    texts = sorted(t.get_text() for t in ax.texts)
    want = []
    for i in kept:
        n = g.nodes[i]
        want.append({"feature": f"f{n['feature']}", "error": "err", "token": f"t{n['token']}",
                     "logit": f"→{n['token']}"}[n["kind"]])
    assert texts == sorted(want) and len(texts) == len(kept) > 0
    assert [t.get_text() for t in ax.get_yticklabels()][::len(ax.get_yticklabels()) - 1] == ["tokens", "logits"]
    assert not g.plot(labels=False).texts
