"""Patching grids against hand-written torch hooks on the same weights (TransformerLens's
``patching`` functions written out as loops of hooked runs), on a batch."""

import numpy as np
import pytest

import circuits as C
from circuits.errors import CircuitError
from circuits.interp import head_patch_grid, patch, patch_grid, residual_patch_grid
from circuits.models import attn_only, gpt2, random_weights, tokens_symbol
from circuits.models.common import tokens_symbol as hf_tokens
from circuits.models.gpt2 import random_gpt2_weights

from .torch_hooks import AttnOnly, at_positions

W = random_weights(11, vocab=23, d_model=16, n_heads=3, head_size=4, n_layers=2, max_positions=16)
rng = np.random.default_rng(8)
CLEAN = rng.integers(0, 23, (3, 9))
CORRUPT = CLEAN.copy()
CORRUPT[:, 2:5] = rng.integers(0, 23, (3, 3))
P = 7
MODEL = AttnOnly(W)


def torch_grid(hook, head_axis: bool, positions=range(P), layers=range(2), heads=range(3)):
    """[rows, layers, positions(, heads)] of the summed loss with ``hook``'s value at one position
    (of one head) taken from the corrupted run, in the clean run: TransformerLens's loops."""
    source = MODEL.run(CORRUPT)[2]
    out = np.zeros((len(CLEAN), len(layers), len(positions)) + ((len(heads),) if head_axis else ()))
    for l in layers:
        name = hook.format(l=l)
        for j, p in enumerate(positions):
            for h in (heads if head_axis else [None]):
                loss = MODEL.run(CLEAN, {name: at_positions(source[name], [p], head=h)})[1]
                if head_axis:
                    out[:, l, j, h] = loss.sum(-1).numpy()
                else:
                    out[:, l, j] = loss.sum(-1).numpy()
    return out


def test_residual_grid_is_transformerlens_resid_pre_loop():
    circ = attn_only(W, tokens_symbol(9))
    got = residual_patch_grid(circ, {"toks_int_var": CORRUPT}, inputs={"toks_int_var": CLEAN}, dtype="float64")
    assert got.shape == (3, 2, P)
    np.testing.assert_allclose(got, torch_grid("blocks.{l}.hook_resid_pre", False), atol=1e-9)


@pytest.mark.parametrize("unique", [True, False])
def test_head_grid_by_position_is_transformerlens_head_out_by_pos_loop(unique):
    circ = attn_only(W, tokens_symbol(9), unique_names=unique)
    got = head_patch_grid(circ, {"toks_int_var": CORRUPT}, inputs={"toks_int_var": CLEAN}, dtype="float64")
    assert got.shape == (3, 2, P, 3)
    np.testing.assert_allclose(got, torch_grid("blocks.{l}.attn.hook_z", True), atol=1e-9)


def test_every_head_at_every_position_at_once():
    circ = attn_only(W, tokens_symbol(9), unique_names=True)
    got = head_patch_grid(circ, {"toks_int_var": CORRUPT}, by_position=False, inputs={"toks_int_var": CLEAN},
                          dtype="float64")
    source = MODEL.run(CORRUPT)[2]
    want = np.zeros((3, 2, 3))
    for l in range(2):
        for h in range(3):
            name = f"blocks.{l}.attn.hook_z"
            want[:, l, h] = MODEL.run(CLEAN, {name: at_positions(source[name], list(range(P)), head=h)})[1].sum(-1).numpy()
    np.testing.assert_allclose(got, want, atol=1e-9)


def test_pattern_grid_patches_query_rows():
    circ = attn_only(W, tokens_symbol(9), unique_names=True)
    got = head_patch_grid(circ, {"toks_int_var": CORRUPT}, activation="pattern", inputs={"toks_int_var": CLEAN},
                          positions=[1, -1], dtype="float64")
    source = MODEL.run(CORRUPT)[2]

    def query_row(src, q, h):
        def fn(value):  # [batch, head, query, key]
            out = value.clone()
            out[:, h, q] = src[:, h, q]
            return out
        return fn

    for l in range(2):
        name = f"blocks.{l}.attn.hook_pattern"
        for j, q in enumerate([1, P - 1]):
            for h in range(3):
                want = MODEL.run(CLEAN, {name: query_row(source[name], q, h)})[1].sum(-1).numpy()
                np.testing.assert_allclose(got[:, l, j, h], want, atol=1e-9)


def test_one_prompt_metrics_and_the_single_patch():
    loss = attn_only(W, CLEAN[0], unique_names=True)
    src = {"toks_int_var": CORRUPT[0]}
    last = patch_grid(loss, ["b1.a.head0", "b0"], src, metric=lambda out: C.Index(out, (-1,)), dtype="float64")
    assert last.shape == (2, P)
    for i, site in enumerate(["b1.a.head0", "b0"]):
        for p in range(P):
            want = C.evaluate(patch(loss, site, src, positions=p), dtype="float64")[-1]
            np.testing.assert_allclose(last[i, p], want, atol=1e-9)
    weights = np.linspace(-1, 1, P)
    weighted = patch_grid(loss, "b0", src, positions=slice(2, 5), metric=weights, dtype="float64")
    want = [C.evaluate(patch(loss, "b0", src, positions=p), dtype="float64") @ weights for p in (2, 3, 4)]
    np.testing.assert_allclose(weighted[0], want, atol=1e-9)
    logits = attn_only(W, CLEAN[0], logits=True, unique_names=True)
    kl = patch_grid(logits, "b0", src, positions=[3], metric="kl", dtype="float64")
    clean = C.evaluate(logits, dtype="float64")
    moved = C.evaluate(patch(logits, "b0", src, positions=3), dtype="float64")

    def logp(x):
        return x - np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True)) - x.max(-1, keepdims=True)

    want = (np.exp(logp(clean)) * (logp(clean) - logp(moved))).sum(-1).mean()
    np.testing.assert_allclose(kl[0, 0], want, atol=1e-9)


def test_a_grid_compiles_once_and_a_new_source_compiles_nothing():
    circ = attn_only(W, tokens_symbol(9), unique_names=True)
    head_patch_grid(circ, {"toks_int_var": CORRUPT}, inputs={"toks_int_var": CLEAN})
    before = C.cache_stats()["compilations"]
    head_patch_grid(circ, {"toks_int_var": CORRUPT[::-1].copy()}, inputs={"toks_int_var": CLEAN[::-1].copy()})
    assert C.cache_stats()["compilations"] == before


def test_gpt2_split_heads_grid_and_fused_heads_error():
    cfg = dict(n_embd=16, n_head=2, n_layer=2, vocab_size=31, n_positions=16, activation_function="gelu_new")
    weights = random_gpt2_weights(cfg, seed=2)
    toks = np.random.default_rng(0).integers(0, 31, (2, 5))
    circ = gpt2(cfg, weights, hf_tokens(5), loss=True, split_heads=True)
    got = head_patch_grid(circ, {"tokens": toks[::-1].copy()}, inputs={"tokens": toks}, dtype="float64")
    assert got.shape == (2, 2, 5, 2)
    one = gpt2(cfg, weights, toks[0], loss=True, split_heads=True)
    want = C.evaluate(patch(one, "h1.attn.head1.z", {"tokens": toks[1]}, positions=3), dtype="float64").sum()
    np.testing.assert_allclose(got[0, 1, 3, 1], want, atol=1e-9)
    fused = gpt2(cfg, weights, hf_tokens(5), loss=True)
    with pytest.raises(CircuitError, match="one fused node"):
        head_patch_grid(fused, {"tokens": toks}, inputs={"tokens": toks})
    resid = residual_patch_grid(fused, {"tokens": toks[::-1].copy()}, inputs={"tokens": toks}, dtype="float64")
    want = C.evaluate(patch(gpt2(cfg, weights, toks[1], loss=True), "h0", {"tokens": toks[0]}, positions=2),
                      dtype="float64").sum()
    np.testing.assert_allclose(resid[1, 1, 2], want, atol=1e-9)


def test_torch_oracle_is_not_trivially_equal():
    """The grid's cells differ from the clean loss (so the comparisons above can fail)."""
    clean = MODEL.run(CLEAN)[1].sum(-1).numpy()
    grid = torch_grid("blocks.{l}.hook_resid_pre", False, positions=[3])
    assert np.abs(grid[:, :, 0] - clean[:, None]).max() > 1e-3


def test_sweep_over_a_batch_runs_position_variants_as_one_program():
    from circuits.interp import sweep

    circ = attn_only(W, tokens_symbol(9), unique_names=True)
    source = C.Symbol((9,), name="corrupt", dtype="int64")
    variants = {(h, p): patch(circ, f"b1.a.head{h}", {"toks_int_var": source}, positions=p)
                for h in range(3) for p in range(P)}
    feed = {"toks_int_var": CLEAN, "corrupt": CORRUPT}
    ops = sweep(circ, variants, feed, dtype="float64")  # 'auto': a new sweep over a batch runs op by op
    assert ops.info["tier"] == "ops" and ops.info["batched"]
    result = sweep(circ, variants, feed, dtype="float64", mode="jit")
    assert result.info["groups"] == 3  # one structure per head: its positions differ in a mask's values
    assert sweep(circ, variants, feed, dtype="float64").info["tier"] == "jit"  # 'auto': swept whole before
    for key, value in ops.items():
        np.testing.assert_allclose(value, result[key], atol=1e-9)
    grid = head_patch_grid(circ, {"toks_int_var": CORRUPT}, inputs={"toks_int_var": CLEAN}, dtype="float64")
    for (h, p), value in result.items():
        np.testing.assert_allclose(value.sum(-1), grid[:, 1, p, h], atol=1e-9)
        if p == 3:
            np.testing.assert_allclose(value, C.evaluate(variants[h, p], feed, dtype="float64"), atol=1e-9)


GRID_PROBE = r"""
import json
import numpy as np
import circuits as C
from circuits.backend import cache_stats
from circuits.backend.cache.background import wait_for_background
from circuits.backend.cache.executables import executable_info
from circuits.interp import head_patch_grid
from circuits.models import attn_only, random_weights, tokens_symbol
w = random_weights(11, vocab=23, d_model=16, n_heads=3, head_size=4, n_layers=2, max_positions=16)
rng = np.random.default_rng(8)
clean = rng.integers(0, 23, (3, 9))
corrupt = clean.copy()
corrupt[:, 2:5] = rng.integers(0, 23, (3, 3))
circ = attn_only(w, tokens_symbol(9), unique_names=True)
before = cache_stats()['compilations']
grid = head_patch_grid(circ, {'toks_int_var': corrupt}, inputs={'toks_int_var': clean})
wait_for_background()
print(json.dumps({"grid": np.asarray(grid).tobytes().hex(), "traced": cache_stats()['compilations'] - before,
                  **executable_info()}))
"""


def test_a_new_process_loads_the_grids_programs_without_tracing_and_gets_the_same_bits(tmp_path):
    """The grid's vmapped programs are kept on disk under the target circuit's content hash: a
    second process reads them (no trace, no lowering) and computes the same grid, bit for bit."""
    import json
    import os
    import subprocess
    import sys

    env = dict(os.environ, CIRCUITS_COMPILATION_CACHE=str(tmp_path / "cache"))

    def run():
        out = subprocess.run([sys.executable, "-c", GRID_PROBE], env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout.strip().splitlines()[-1])

    first = run()
    assert first["traced"] > 0 and first["stores"] > 0 and first["loads"] == 0
    second = run()
    assert second["traced"] == 0 and second["loads"] == first["stores"] and second["rejected"] == 0
    assert second["grid"] == first["grid"]
