"""``rewrites.batch_heads``: the batched circuit is a circuit like any other (checks, prints,
parses back to itself) with the value of the head-by-head one (numpy oracle, float64)."""

import numpy as np

import circuits as C
import rewrites
from circuits.models import attn_only, random_weights
from circuits.testing.roundtrip import store_of
from tests.backend.numpy_oracle import numpy_evaluate


def test_batched_seed_model_checks_round_trips_and_keeps_its_value():
    w = random_weights(5, vocab=17, d_model=8, n_heads=4, head_size=2, n_layers=2, max_positions=12)
    c = attn_only(w, np.random.default_rng(0).integers(0, 17, 10))
    b = rewrites.batch_heads(c)
    rewrites.check(b)
    assert b is not c and rewrites.batch_heads(b) is b  # nothing left to batch
    assert C.parse(b.to_text(), store=store_of(b)) == b
    np.testing.assert_allclose(C.evaluate(b, dtype="float64", batch_heads=False), numpy_evaluate(c),
                               rtol=1e-10, atol=1e-12)
    # the per-head weights' slices are gone: each layer reads its whole weights once
    assert not [n for n in C.toposort(b) if type(n) is C.Index and n.children[0].name.startswith("a0.w.")]
