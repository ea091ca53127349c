"""The library's plots: titled, both axes labelled, a legend; the attribution graph's node labels
never overlap one another (checked on the rendered text extents)."""

import itertools

import numpy as np
import pytest

from circuits.interp import attribution_graph, induction_saes
from circuits.models import attn_only, induction_tokens, induction_weights

plt = pytest.importorskip("matplotlib.pyplot")


def _overlaps(ax):
    fig = ax.figure
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in ax.texts if t.get_text()]
    return [(a, b) for (a, ba), (b, bb) in itertools.combinations(boxes, 2) if ba.overlaps(bb)], len(boxes)


@pytest.fixture(scope="module")
def graph():
    toks = induction_tokens(1, seed=0)[0]
    logits = attn_only(induction_weights(), toks, logits=True, unique_names=True)
    return attribution_graph(logits, induction_saes(), dtype="float32")


def test_attribution_graph_labels_do_not_overlap(graph):
    import matplotlib

    matplotlib.use("Agg")
    ax = graph.plot()
    overlaps, n = _overlaps(ax)
    assert n == int(graph.node_mask.sum()) and n > 10      # every kept node labelled
    assert not overlaps, overlaps[:5]
    assert ax.get_title() and ax.get_xlabel() and ax.get_ylabel() and ax.get_legend() is not None
    plt.close(ax.figure)


def test_attribution_graph_layout_keeps_nodes_apart(graph):
    at = graph.layout()
    points = np.array(list(at.values()))
    assert len(points) == int(graph.node_mask.sum())
    gaps = [np.abs(a - b).max() for a, b in itertools.combinations(points, 2)]
    assert min(gaps) > 0.05                                  # no two nodes drawn on each other


def test_discovery_plots_have_titles_labels_and_legends():
    import matplotlib

    matplotlib.use("Agg")
    from circuits.interp import discover, faithfulness
    from circuits.models import random_weights

    w = random_weights(vocab=11, d_model=8, n_heads=2, head_size=4, n_layers=2, max_positions=16)
    loss = attn_only(w, np.array([0, 1, 2, 3, 1, 2]), unique_names=True)
    source = {"toks_int_var": np.array([0, 4, 5, 6, 1, 2])}
    scores = discover(loss, source, method="exact")
    for ax in (scores.top(4).plot(), faithfulness(loss, source, None, scores).plot()):
        assert ax.get_title() and ax.get_xlabel() and ax.get_ylabel(), ax
        assert ax.get_legend() is not None and ax.get_legend().get_texts()
        plt.close(ax.figure)
