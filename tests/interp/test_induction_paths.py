"""Known answer on the shipped induction model: path patching finds the previous-token head ->
induction heads composition through the keys (and less through the queries), not the values or
the direct path to the logits.  Heads are found by measurement; thresholds leave wide margins
(measured: repeated-half loss 0.07 clean, k 4.0, q 2.1, v 0.07, direct 0.07)."""

import numpy as np
import pytest

import circuits as C
from circuits import interp
from circuits.models import attn_only, induction_tokens, induction_weights, tokens_symbol
from circuits.models.induction import REPEATED_HALF
from circuits.select import Regex


@pytest.fixture(scope="module")
def model():
    w = induction_weights()
    toks = induction_tokens(64, seed=3)
    c = attn_only(w, tokens_symbol(toks.shape[1]), unique_names=True)
    loss = C.evaluate_batched(c, {"toks_int_var": toks})
    prev_head = int(np.argmax(interp.head_scores(c, toks)[0][0]))
    return c, toks, prev_head, float(loss[:, REPEATED_HALF].mean())


def test_path_patching_finds_the_composition_through_keys(model):
    c, toks, prev_head, clean = model
    corrupt = C.Symbol(c.get_unique("toks_int_var").shape, name="corrupt_toks", dtype="int64")
    feed = {"toks_int_var": toks, "corrupt_toks": induction_tokens(64, seed=4)}
    sender = f"b0.a.head{prev_head}"

    def effect(receivers, **kw):
        patched = interp.path_patch(c, sender, receivers, {"toks_int_var": corrupt}, **kw)
        return float(C.evaluate_batched(patched, feed)[:, REPEATED_HALF].mean()) - clean

    by_role = {role: effect([f"b1.a.head{h}.a.{role}" for h in range(4)]) for role in "qkv"}
    direct = effect("t.call", freeze=Regex(r"^b1\.a\.head\d$"))
    assert clean < 0.3
    assert by_role["k"] > 2.0, by_role            # the keys carry the composition
    assert by_role["k"] > by_role["q"] > 0.5, by_role  # the queries less
    assert abs(by_role["v"]) < 0.3 and abs(direct) < 0.3, (by_role, direct)
