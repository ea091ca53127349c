"""The shipped trained induction model, and the script that trains it.

Oracles: the plain-numpy model of ``numpy_attn_only`` (for the circuit, the training forward and
the attention patterns), and a numpy AdamW / schedule written here.
"""

import math

import numpy as np
import pytest

import circuits as C
from benchmarks.numpy_attn_only import forward, layer_norm, softmax
from circuits.models import attn_only, induction_tokens, induction_weights, random_weights, tokens_symbol
from circuits.models.induction import FIRST_HALF, REPEATED_HALF, SEQ_LEN

N_SEQ = 48


@pytest.fixture(scope="module")
def weights():
    return induction_weights()


@pytest.fixture(scope="module")
def batch_loss(weights):
    """Per-position loss of the shipped model on N_SEQ sequences [BOS, A, A], as a function of the weights."""
    def run(w):
        f = C.compile(attn_only(w, tokens_symbol(SEQ_LEN)))
        return np.stack([f({"toks_int_var": t}) for t in induction_tokens(N_SEQ, seed=7)])
    return run


def layer0_attention(w, tokens):
    """[heads, q, k] attention probabilities of layer 0, in plain numpy."""
    w = {k: np.asarray(v, np.float64) for k, v in w.items()}
    inp = tokens[:-2]
    n = len(inp)
    x = w["t.w.tok_embeds"][inp]
    h_in = layer_norm(x, w["a0.ln.w.scale"], w["a0.ln.w.bias"])
    qk = h_in + w["t.w.pos_embeds"][:n]
    allowed = np.tril(np.ones((n, n), dtype=bool))
    out = []
    for h in range(w["a0.w.q"].shape[0]):
        scores = (qk @ w["a0.w.q"][h].T) @ (qk @ w["a0.w.k"][h].T).T / np.sqrt(w["a0.w.q"].shape[1])
        out.append(softmax(np.where(allowed, scores, -10000.0)))
    return np.stack(out)


def previous_token_scores(w):
    """Mean attention of each layer-0 head to the previous token (positions 1.., over sequences)."""
    scores = []
    for t in induction_tokens(8, seed=3):
        probs = layer0_attention(w, t)
        n = probs.shape[-1]
        scores.append(probs[:, np.arange(1, n), np.arange(n - 1)].mean(-1))
    return np.mean(scores, axis=0)


def test_shipped_weights_load_with_the_seed_names(weights):
    expected = set(random_weights(0, vocab=64, d_model=64, n_heads=4, head_size=16, n_layers=2,
                                  max_positions=32)) | {"t.a.c.causal_mask"}
    assert set(weights) == expected
    assert weights["t.w.tok_embeds"].shape == (64, 64) and weights["a1.w.o"].shape == (4, 64, 16)
    assert all(v.dtype == np.float32 for v in weights.values())
    np.testing.assert_array_equal(weights["t.a.c.causal_mask"], np.tril(np.ones((32, 32))))
    # Fresh arrays each call: a caller's edit does not leak into the next caller's weights.
    weights2 = induction_weights()
    weights2["a0.w.q"][:] = 0
    assert np.abs(induction_weights()["a0.w.q"]).sum() > 0


def test_shipped_file_is_small():
    from circuits.models.induction import WEIGHTS_FILE

    assert WEIGHTS_FILE.stat().st_size <= 5 * 2**20


def test_circuit_matches_numpy_and_training_forward(weights):
    import jax.numpy as jnp

    from circuits.models.train_induction import loss_per_position

    toks = induction_tokens(1, seed=11)[0]
    got = C.evaluate(attn_only(weights, toks))
    np.testing.assert_allclose(got, forward(weights, toks), atol=2e-4)
    trained_forward = np.asarray(loss_per_position({k: jnp.asarray(v) for k, v in weights.items()}, toks))
    np.testing.assert_allclose(got, trained_forward, atol=2e-4)


def test_repeated_half_is_predicted_by_induction(batch_loss, weights):
    loss = batch_loss(weights)
    repeated, first = loss[:, REPEATED_HALF].mean(), loss[:, FIRST_HALF].mean()
    assert repeated < 0.3, repeated
    assert abs(first - math.log(63)) < 0.35, first


def test_a_layer0_head_attends_to_the_previous_token(weights):
    scores = previous_token_scores(weights)
    assert scores.max() > 0.5, scores
    # One head stands out: the others attend elsewhere.
    assert np.sort(scores)[-2] < scores.max() - 0.2, scores


def test_zero_ablating_the_previous_token_head_breaks_induction(batch_loss, weights):
    head = int(np.argmax(previous_token_scores(weights)))
    base = batch_loss(weights)[:, REPEATED_HALF].mean()
    w = {k: v.copy() for k, v in weights.items()}
    w["a0.w.o"][head] = 0  # the head's output is zero: zero-ablation of 'b0.a.head{head}'
    ablated = batch_loss(w)[:, REPEATED_HALF].mean()
    assert ablated > base + 1.5, (base, ablated)
    # The same ablation done on the circuit, checked against the numpy model.
    toks = induction_tokens(1, seed=5)[0]
    c = attn_only(weights, toks).update(
        f"b0.a.head{head}", lambda n: C.Array(np.zeros(n.shape, np.float32), name=n.name))
    np.testing.assert_allclose(C.evaluate(c), forward(w, toks), atol=2e-4)


def test_zero_ablating_layer1_breaks_induction(batch_loss, weights):
    w = {k: v.copy() for k, v in weights.items()}
    w["a1.w.o"][:] = 0
    assert batch_loss(w)[:, REPEATED_HALF].mean() > 2.0


def test_training_batches_hold_one_repeat_after_bos():
    import jax

    from circuits.models.train_induction import training_batch

    toks = np.asarray(training_batch(jax.random.PRNGKey(0), 256))
    assert toks.shape == (256, SEQ_LEN)
    assert (toks[:, 0] == 0).all() and (toks[:, 1:] >= 1).all() and (toks < 64).all()
    lengths = set()
    for row in toks:
        # Find a segment of length L in 4..16 followed by itself, ending by token SEQ_LEN - 2.
        found = [(s, L) for L in range(16, 3, -1) for s in range(1, SEQ_LEN - 1 - 2 * L + 1)
                 if (row[s:s + L] == row[s + L:s + 2 * L]).all()]
        assert found, row
        lengths.add(found[0][1])
    assert min(lengths) <= 5 and max(lengths) == 16


def test_learning_rate_schedule_and_adamw_match_numpy():
    import jax.numpy as jnp

    from circuits.models.train_induction import _adamw_update, learning_rate

    steps, lr, warmup = 100, 3e-3, 10
    got = [float(learning_rate(s, steps=steps, lr=lr, warmup=warmup)) for s in range(steps)]
    want = [lr * (s + 1) / warmup if s < warmup
            else 0.5 * lr * (1 + math.cos(math.pi * (s - warmup) / (steps - warmup))) for s in range(steps)]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-9)

    rng = np.random.default_rng(0)
    p = {"m": rng.standard_normal((3, 2)), "b": rng.standard_normal(3)}
    g = {k: rng.standard_normal(v.shape) for k, v in p.items()}
    m = {k: rng.standard_normal(v.shape) * 0.1 for k, v in p.items()}
    v = {k: rng.random(v.shape) * 0.1 for k, v in p.items()}
    step, rate, wd = 4, 1e-2, 0.1
    new_p, new_m, new_v = _adamw_update({k: jnp.asarray(x) for k, x in p.items()}, g, m, v,
                                        jnp.int32(step), rate, weight_decay=wd)
    for k in p:
        mk = 0.9 * m[k] + 0.1 * g[k]
        vk = 0.99 * v[k] + 0.01 * g[k] ** 2
        upd = (mk / (1 - 0.9 ** 5)) / (np.sqrt(vk / (1 - 0.99 ** 5)) + 1e-8)
        decay = wd if p[k].ndim == 2 else 0.0  # matrices decay, vectors (LN scale, bias) do not
        np.testing.assert_allclose(np.asarray(new_p[k]), p[k] - rate * (upd + decay * p[k]), rtol=1e-5)
        np.testing.assert_allclose(np.asarray(new_m[k]), mk, rtol=1e-5)
        np.testing.assert_allclose(np.asarray(new_v[k]), vk, rtol=1e-5)


@pytest.mark.slow
def test_retraining_is_deterministic():
    from circuits.models.train_induction import train

    log_a, log_b = [], []
    a = train(steps=300, seed=3, batch=16, chunk=100, progress_bar=False, log=log_a)
    b = train(steps=300, seed=3, batch=16, chunk=100, progress_bar=False, log=log_b)
    c = train(steps=300, seed=4, batch=16, chunk=100, progress_bar=False)
    assert set(a) == set(b)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
    assert log_a == log_b and log_a[-1][1] < log_a[0][1]
    assert any(not np.array_equal(a[k], c[k]) for k in a if k != "t.a.c.causal_mask")


def test_figures_in_the_docs_are_the_shipped_models(weights):
    # README and train_induction's docstring quote these measurements of the shipped file.
    from circuits.models.train_induction import induction_losses

    first, repeated = induction_losses(weights)
    assert abs(first - 4.16) < 0.01 and abs(repeated - 0.071) < 0.01, (first, repeated)
    scores = previous_token_scores(weights)
    assert int(np.argmax(scores)) == 2 and abs(scores[2] - 0.91) < 0.01, scores
