"""train_sae: learns a planted sparse dictionary, is deterministic given its seed; the shipped
induction-model SAEs reconstruct the residual stream they were trained on."""

import numpy as np
import pytest

import circuits as C
from circuits.errors import CircuitError
from circuits.interp import induction_saes, train_sae
from circuits.interp.train_sae import train_sae_on
from circuits.models import attn_only, induction_tokens, induction_weights


def planted(n=2048, d_in=8, atoms=12, active=2, seed=0):
    rng = np.random.default_rng(seed)
    dictionary = rng.standard_normal((atoms, d_in))
    dictionary /= np.linalg.norm(dictionary, axis=1, keepdims=True)
    codes = np.zeros((n, atoms))
    for row in codes:
        row[rng.choice(atoms, active, replace=False)] = rng.uniform(0.5, 2.0, active)
    return codes @ dictionary


def fvu(sae, x):
    xh = sae.decode(sae.encode(x))
    return float(((x - xh) ** 2).sum() / ((x - x.mean(0)) ** 2).sum())


@pytest.mark.slow
def test_learns_a_planted_dictionary_and_is_deterministic():
    x = planted()
    symbol = C.Symbol((8,), name="x")
    circuit = C.Einsum.from_spec("a,ab->b", symbol, C.Array(np.eye(8), name="w"), name="y")
    a = train_sae(circuit, "y", {"x": x}, d_sae=24, k=2, steps=400, batch_size=256, lr=1e-2, progress=False)
    once, again = (train_sae_on(x, d_sae=24, k=2, steps=30, seed=3, progress=False) for _ in range(2))
    np.testing.assert_array_equal(once.W_enc, again.W_enc)
    assert a.hook_name == "y" and a.k == 2
    assert fvu(a, x.astype(np.float32)) < 0.15            # the mean alone leaves 1.0
    assert ((a.encode(x.astype(np.float32)) > 0).sum(-1) <= 2).all()
    relu = train_sae_on(x, d_sae=24, architecture="standard", l1=1e-2, steps=400, lr=1e-2, progress=False)
    assert fvu(relu, x.astype(np.float32)) < 0.3
    with pytest.raises(CircuitError, match="train 'topk' or 'standard'"):
        train_sae_on(x, d_sae=4, architecture="gated")


def test_shipped_induction_saes_reconstruct_the_residual_stream():
    w = induction_weights()
    loss = attn_only(w, induction_tokens(1, seed=99)[0], unique_names=True)
    saes = induction_saes()
    _, values = C.evaluate(loss, also=["b0", "b1"])
    for site in ("b0", "b1"):
        x = values[site]
        assert x.shape == (32, 64)
        assert fvu(saes[site], x) < 0.05
