"""Discovery on the shipped induction model (slow: it compiles the model's masked program): the
top edges include the previous-token head into the induction heads' keys, and a small circuit
keeps most of the repeated half's performance."""

import numpy as np
import pytest

import circuits as C
from circuits.interp import discover, edges, faithfulness, patch_edges
from circuits.models import attn_only, induction_tokens, induction_weights
from circuits.models.induction import REPEATED_HALF

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def task():
    w = induction_weights()
    clean = induction_tokens(1, seed=0)[0]
    corrupt = clean.copy()
    corrupt[1:17] = np.random.default_rng(1).integers(1, 64, 16)  # the first occurrence replaced
    loss = attn_only(w, clean, unique_names=True)
    metric = np.zeros(loss.shape)
    metric[REPEATED_HALF] = 1.0 / (REPEATED_HALF.stop - REPEATED_HALF.start)
    return loss, {"toks_int_var": corrupt}, metric


def test_previous_token_head_into_induction_keys_on_top(task):
    loss, src, metric = task
    for method in ("exact", "eap-ig-mask"):
        top = discover(loss, src, metric, method=method).top(8).edges
        # head 2 of layer 0 attends to the previous token (README); layer 1's heads 3 and 1 induct
        assert "b0.a.head2 -> b1.a.head3.a.k" in top, (method, top)
        assert any(e.startswith("b0.a.") and e.endswith(".a.k") and e.split(" -> ")[1].startswith("b1.") for e in top)


def test_small_circuit_keeps_most_of_the_repeated_half(task):
    loss, src, metric = task
    result = discover(loss, src, metric, method="acdc", tau=0.02)
    found = result.found
    assert len(found.edges) < len(result) / 3
    full = metric @ C.evaluate(loss)
    empty = metric @ C.evaluate(patch_edges(loss, list(edges(loss)), src))
    assert (metric @ C.evaluate(found.circuit) - empty) / (full - empty) > 0.8
    # the EAP-IG ranking's faithfulness curve reaches most of it with as many edges
    curve = faithfulness(loss, src, metric, discover(loss, src, metric, method="eap-ig-mask"),
                         sizes=[0, len(found.edges), len(result)])
    assert curve.values[1] > 0.7 and curve.values[-1] == pytest.approx(1.0) and curve.values[0] == pytest.approx(0.0)
