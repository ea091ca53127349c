"""A patch source given as a Symbol: one patched circuit, evaluated over a batch of sources, equals
patching each source value on its own."""

import numpy as np
import pytest

import circuits as C
from circuits.errors import ShapeError
from circuits.interp import patch, path_patch
from circuits.models import attn_only, random_weights, tokens_symbol


@pytest.fixture(scope="module")
def setup():
    w = random_weights(3, vocab=13, d_model=8, n_heads=2, head_size=4, n_layers=2, max_positions=8)
    rng = np.random.default_rng(0)
    return w, rng.integers(0, 13, (3, 7)), rng.integers(0, 13, (3, 7))


def test_patch_and_path_patch_with_a_symbol_source_equal_one_patch_per_row(setup):
    w, clean, corrupt = setup
    sym = attn_only(w, tokens_symbol(7), unique_names=True)
    src = C.Symbol((7,), name="corrupt_toks", dtype="int64")
    for make in [
        lambda c, s: patch(c, "b1.a.head0", {"toks_int_var": s}),
        lambda c, s: path_patch(c, "b0.a.head1", "b1.a.head0.a.k", {"toks_int_var": s}),
    ]:
        batched = C.evaluate_batched(make(sym, src), {"toks_int_var": clean, "corrupt_toks": corrupt})
        for row in range(3):
            one = make(attn_only(w, clean[row], unique_names=True), corrupt[row])
            np.testing.assert_allclose(batched[row], C.evaluate(one), rtol=1e-5, atol=1e-5)
        # and the patch changes something (the check can fail)
        assert not np.allclose(batched, C.evaluate_batched(sym, {"toks_int_var": clean}))


def test_a_symbol_source_of_the_wrong_shape_is_an_error_naming_it(setup):
    w, _, _ = setup
    sym = attn_only(w, tokens_symbol(7), unique_names=True)
    with pytest.raises(ShapeError, match="corrupt_toks"):
        patch(sym, "b1.a.head0", {"toks_int_var": C.Symbol((6,), name="corrupt_toks", dtype="int64")})
