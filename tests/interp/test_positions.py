"""Positions and rows in sites: patch, ablate, path_patch, attribute and steer at some positions,
against hand-written torch hooks (``torch_hooks``) and numpy on the same weights."""

import numpy as np
import pytest
import torch

import circuits as C
from circuits.errors import CircuitError
from circuits.interp import ablate, attribute, patch, path_patch, steer, steering_vector
from circuits.models import attn_only, random_weights, tokens_symbol

from . import numpy_patching as ref
from .torch_hooks import AttnOnly, at_positions

W = random_weights(3, vocab=23, d_model=16, n_heads=3, head_size=4, n_layers=2, max_positions=16)
CLEAN = np.array([1, 5, 7, 2, 9, 4, 11, 3, 6, 8])
CORRUPT = np.array([1, 13, 7, 17, 9, 21, 11, 3, 19, 8])
P = len(CLEAN) - 2


def loss64(c, inputs=None):
    return C.evaluate(c, inputs, dtype="float64")


def torch_loss(hooks=None, tokens=CLEAN):
    return AttnOnly(W).run(tokens, hooks)[1][0].numpy()


def torch_cache(tokens):
    return AttnOnly(W).run(tokens)[2]


@pytest.mark.parametrize("unique", [True, False])
def test_patch_one_head_at_positions_matches_a_torch_hook(unique):
    clean = attn_only(W, CLEAN, unique_names=unique)
    src = torch_cache(CORRUPT)["blocks.1.attn.hook_result"]
    for positions in (3, [1, -1], slice(2, 5)):
        got = loss64(patch(clean, "b1.a.head2", {"toks_int_var": CORRUPT}, positions=positions))
        picked = np.arange(P)[positions] if isinstance(positions, slice) else positions
        want = torch_loss({"blocks.1.attn.hook_result": at_positions(src, picked, head=2)})
        np.testing.assert_allclose(got, want, atol=1e-9)
        assert not np.allclose(got, loss64(clean), atol=1e-6)  # the patch changed something


def test_a_hook_name_patches_every_head_of_the_layer_at_positions():
    clean = attn_only(W, CLEAN, unique_names=True)
    p = patch(clean, "blocks.0.attn.hook_z", {"toks_int_var": CORRUPT}, positions=[2, -2])
    assert [n.name for n in p.get(C.select.Glob("*.mixed"))] == [f"b0.a.head{h}.a.comb_v.mixed" for h in range(3)]
    src = torch_cache(CORRUPT)["blocks.0.attn.hook_z"]
    np.testing.assert_allclose(loss64(p), torch_loss({"blocks.0.attn.hook_z": at_positions(src, [2, P - 2])}),
                               atol=1e-9)


def test_residual_stream_at_a_position():
    clean = attn_only(W, CLEAN, unique_names=True)
    src = torch_cache(CORRUPT)["blocks.1.hook_resid_pre"]
    for site in ("b0", "blocks.1.hook_resid_pre"):
        got = loss64(patch(clean, site, {"toks_int_var": CORRUPT}, positions=4))
        np.testing.assert_allclose(got, torch_loss({"blocks.1.hook_resid_pre": at_positions(src, [4])}), atol=1e-9)


def test_ablations_at_positions():
    clean = attn_only(W, CLEAN, unique_names=True)
    zero = loss64(ablate(clean, "b0.a.head1", positions=[0, 5]))
    want = torch_loss({"blocks.0.attn.hook_result": at_positions(torch.zeros(1, P, 3, 16, dtype=torch.float64),
                                                                   [0, 5], head=1)})
    np.testing.assert_allclose(zero, want, atol=1e-9)
    data = np.random.default_rng(0).integers(0, 23, (6, len(CLEAN)))
    mean = np.mean([torch_cache(row)["blocks.0.attn.hook_result"][0].numpy() for row in data], axis=0)
    got = loss64(ablate(clean, "b0.a.head1", "mean", data={"toks_int_var": data}, positions=-1, dtype="float64"))
    want = torch_loss({"blocks.0.attn.hook_result": at_positions(torch.from_numpy(mean)[None], [P - 1], head=1)})
    np.testing.assert_allclose(got, want, atol=1e-9)
    row = np.random.default_rng(4).integers(0, 6, 1)[0]  # ablate's draw for one site
    got = loss64(ablate(clean, "b0.a.head1", "resample", data={"toks_int_var": data}, positions=-1, seed=4,
                        dtype="float64"))
    src = torch_cache(data[row])["blocks.0.attn.hook_result"]
    np.testing.assert_allclose(got, torch_loss({"blocks.0.attn.hook_result": at_positions(src, [P - 1], head=1)}),
                               atol=1e-9)


def test_positions_change_only_a_mask_value():
    clean = attn_only(W, CLEAN, unique_names=True)
    a = patch(clean, "b1.a.head0", {"toks_int_var": CORRUPT}, positions=2)
    b = patch(clean, "b1.a.head0", {"toks_int_var": CORRUPT}, positions=6)
    assert C.strip_names(a) != C.strip_names(b)  # other values...
    assert a.get_unique("b1.a.head0.position_mask").value.tolist() == [0, 0, 1, 0, 0, 0, 0, 0]
    assert C.compile(a).program.key == C.compile(b).program.key  # ...one structure: one compiled program


def test_path_patch_a_sender_at_positions():
    clean = attn_only(W, CLEAN, unique_names=True)
    pp = path_patch(clean, "b0.a.head2", "b1.a.head1.a.k", {"toks_int_var": CORRUPT}, positions=[3, 4])
    # oracle: head (1, 1)'s key reads a residual stream whose head (0, 2) term is the corrupt one at 3, 4
    clean_run = ref.forward(W, CLEAN)
    corrupt_run = ref.forward(W, CORRUPT)
    mixed = clean_run["head_out"][0, 2].copy()
    mixed[[3, 4]] = corrupt_run["head_out"][0, 2][[3, 4]]
    resid = clean_run["resid"][1] - clean_run["head_out"][0, 2] + mixed
    want = ref.forward(W, CLEAN, role_inputs={(1, 1, "k"): resid})["loss"]
    np.testing.assert_allclose(loss64(pp), want, atol=1e-9)


def test_attribution_at_positions_is_the_gradient_sum_over_them():
    clean = attn_only(W, CLEAN, unique_names=True)
    model = AttnOnly(W)
    src = model.run(CORRUPT)[2]["blocks.1.attn.hook_result"]
    grabbed = {}

    def keep(v):  # a leaf of its own, whose gradient torch keeps
        v = v.detach().requires_grad_(True)
        grabbed["v"] = v
        return v

    _, loss, _ = model.run(CLEAN, {"blocks.1.attn.hook_result": keep})
    loss.sum().backward()
    v = grabbed["v"]
    delta = ((src - v) * v.grad)[0, :, 0].detach().numpy()  # head 0: [pos, d]
    got = attribute(clean, ["b1.a.head0"], {"toks_int_var": CORRUPT}, positions=[1, -1], dtype="float64")
    np.testing.assert_allclose(got["b1.a.head0"], delta[[1, P - 1]].sum(), rtol=1e-8, atol=1e-10)
    whole = attribute(clean, ["b1.a.head0"], {"toks_int_var": CORRUPT}, dtype="float64")["b1.a.head0"]
    np.testing.assert_allclose(whole, delta.sum(), rtol=1e-8, atol=1e-10)


def test_rows_of_a_batch():
    toks = tokens_symbol(len(CLEAN))
    circ = attn_only(W, toks, unique_names=True)
    batch = np.stack([CLEAN, CORRUPT, CLEAN[::-1].copy()])
    ablated = ablate(circ, "b1.a.head1", positions=2, rows=[0, 2])
    got = C.evaluate(ablated, {"toks_int_var": batch, "row": np.arange(3, dtype=np.float32)}, dtype="float64")
    zero = at_positions(torch.zeros(1, P, 3, 16, dtype=torch.float64), [2], head=1)
    for r in range(3):
        hooks = {"blocks.1.attn.hook_result": zero} if r != 1 else None
        np.testing.assert_allclose(got[r], torch_loss(hooks, batch[r]), atol=1e-9)
    est = attribute(circ, ["b1.a.head1"], {"toks_int_var": np.roll(batch, 1, axis=0)}, inputs={"toks_int_var": batch},
                    rows=[1])
    assert est["b1.a.head1"][0] == 0 and est["b1.a.head1"][2] == 0 and est["b1.a.head1"][1] != 0


def test_bad_positions_and_rows_are_errors_naming_them():
    clean = attn_only(W, CLEAN, unique_names=True)
    with pytest.raises(CircuitError, match=r"positions=9: 9 is outside the 8 positions of site 'b1.a.head0' \(its axis 0\)"):
        patch(clean, "b1.a.head0", {"toks_int_var": CORRUPT}, positions=9)
    with pytest.raises(CircuitError, match="give an int, a list of ints, a slice"):
        ablate(clean, "b1.a.head0", positions=1.5)
    with pytest.raises(CircuitError, match="selects none of the 8 positions"):
        ablate(clean, "b1.a.head0", positions=slice(4, 2))
    with pytest.raises(CircuitError, match="rows count from 0"):
        ablate(clean, "b1.a.head0", rows=[-1])


def test_steer_known_answer_and_a_new_scale_compiles_nothing():
    """Adding v at the final residual stream's position p: logits there are LN(resid + s v) W_U."""
    logits = attn_only(W, CLEAN, logits=True, unique_names=True)
    v = np.random.default_rng(1).standard_normal(16).astype(np.float32)  # the site is float32: so is the vector
    w = {k: np.asarray(x, np.float64) for k, x in W.items()}
    resid = torch_cache(CLEAN)["blocks.1.hook_resid_post"][0].numpy()
    for scale in (0.5, -2.0):
        steered = steer(logits, "blocks.1.hook_resid_post", v, scale=scale, positions=[-1])
        moved = resid.copy()
        moved[-1] += scale * v
        want = ref.layer_norm(moved, w["final.ln.w.scale"], w["final.ln.w.bias"]) @ w["t.w.unembed"].T
        np.testing.assert_allclose(C.evaluate(steered, dtype="float64"), want, atol=1e-9)
    np.testing.assert_array_equal(C.evaluate(steer(logits, "b1", v, scale=0.0), dtype="float64"),
                                  C.evaluate(logits, dtype="float64"))
    # another scale, vector or position: values only, so nothing compiles again
    C.evaluate(steer(logits, "b1", v, scale=1.0, positions=[2]), mode="jit")
    before = C.cache_stats()
    for scale, pos in ((3.0, [2]), (-1.0, [5]), (0.25, [0, 7])):
        C.evaluate(steer(logits, "b1", v * scale, scale=scale, positions=pos), mode="jit")
    after = C.cache_stats()
    assert after["compilations"] == before["compilations"]


def test_steer_rows_and_activation_addition():
    logits = attn_only(W, CLEAN, logits=True, unique_names=True)
    diff = steering_vector(logits, "b0", {"toks_int_var": CORRUPT}, {"toks_int_var": CLEAN}, dtype="float64")
    cache_c, cache_x = torch_cache(CLEAN), torch_cache(CORRUPT)
    want = (cache_x["blocks.1.hook_resid_pre"] - cache_c["blocks.1.hook_resid_pre"])[0].numpy()
    np.testing.assert_allclose(diff, want, atol=1e-9)
    # adding the first 3 positions' difference at the first 3 positions is patching them
    steered = steer(logits, "b0", diff[:3], positions=slice(0, 3))
    patched = patch(logits, "b0", {"toks_int_var": CORRUPT}, positions=slice(0, 3))
    # (the vector is kept in the site's float32: equal to its rounding)
    np.testing.assert_allclose(C.evaluate(steered, dtype="float64"), C.evaluate(patched, dtype="float64"), atol=1e-6)
    batch = np.stack([CLEAN, CLEAN])
    toks_logits = attn_only(W, tokens_symbol(len(CLEAN)), logits=True, unique_names=True)
    s = steer(toks_logits, "b0", diff[3], positions=0, rows=[1])  # (diff[0] is 0: the first tokens agree)
    got = C.evaluate(s, {"toks_int_var": batch, "row": np.arange(2, dtype=np.float32)}, dtype="float64")
    np.testing.assert_allclose(got[0], C.evaluate(logits, dtype="float64"), atol=1e-9)
    assert not np.allclose(got[1], got[0], atol=1e-6)
    with pytest.raises(C.errors.ShapeError, match="does not fit site 'b0'"):
        steer(logits, "b0", np.ones(5))
